"""Mutation testing of ``Partitioned.verify``: mutants of lowered programs, and of the registry, are never proved
unless they are equivalent.

Programs (:data:`PROGRAMS`): reference models (:mod:`partir_core.models`) under presets on a 2x2 mesh (two axes
of one size, so that a slice or a reduction over the wrong axis still fits its buffers), the transformer with
its vocabulary split (``EMB``: a max reduction finished over a mesh axis), a scanned transformer pipelined
over 4 stages (GPipe and circular, beside batch parallelism on a 4x2 mesh), a lookup and a scatter-add of
clamped indices into a table split on its rows (run on indices out of range), the weight gradients of two
convolutions under batch and Megatron parallelism, and a product of two pending sums.
Operators on the lowered program:

- ``drop reduction``: a reshard that reduces a pending sum runs the plan of the same move from a source that
  is not pending (no reduction);
- ``reduce wrong axis``: it runs the plan that reduces over the other mesh axis;
- ``gather wrong dim`` / ``slice wrong offset``: a reshard that gathers (slices) a dim runs the plan that
  gathers another dim (slices over the other axis);
- ``swap operands``: a local op of two operands of one shape reads them swapped;
- ``drop finish`` / ``wrong finish``: a max/min reduction is not finished, or finished with the other kind.

Operators on the registry (:mod:`partir_core.registry`), the program lowered again (each on the programs with
an equation it changes): ``wrong local rule`` (a local form that doubles its result; of ``dot_general``, and of a
convolution), ``sum reduced as max`` (``reduce_sum``'s factor marked a max reduction; a convolution's input
channels likewise), ``mul linear in both`` (pending sums passed through a product
of two of them), ``transpose not permuted`` (the result's factors in the operand's order), ``permute to the
wrong stage`` (the static permutation's local form moving every row one permutation further: a pipeline's
state rotated by two stages, its circular layer order permuted twice), ``clamped index dropped`` (a
scatter-add into a split table dropping an index out of range that ``clip`` mode clamps), ``lookup bound off
by one`` (a gather from a split table comparing indices with a bound one less: a constant of what the device
runs, which its jaxpr's text does not show).

Each mutant is verified, and run on the program's inputs against the unmutated program. It is killed when it is
refuted (the verdict's witness: random inputs on which it differs from the function it was traced from,
confirmed by running the mutant and the unmutated program on them: a refutation that does not hold is a failure)
or fails to lower. A mutant proved whose outputs differ (or that fails to run) is a failure, the one that matters:
a wrong proof. One proved or undecided whose outputs agree is an equivalent survivor, confirmed by that run.
One undecided whose outputs differ is a survivor the verifier did not refute: the run fails too, for
mutation is 100% only when every non-equivalent mutant is killed.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import redist  # noqa: E402
import partir_core as pc  # noqa: E402
from partir_core import models, registry, reshard, schedules  # noqa: E402
from partir_core.program import Compute, ControlFlow, Finish, Reshard, walk  # noqa: E402
from partir_core.proof.reference import random_inputs, witness_inputs  # noqa: E402
from proofs.common import progress  # noqa: E402

MESH = redist.Mesh({"batch": 2, "model": 2})
STAGES = redist.Mesh({"stage": 4, "batch": 2})
PER_OPERATOR = 3  # mutants per operator and program


def preset(name: str, schedule: str):
    """The program of reference model ``name`` under ``schedule`` on :data:`MESH`, on random inputs."""
    def make():
        m = models.MODELS[name]()
        ins = m.init(jax.random.key(0))
        low = pc.jit(m.step, MESH, schedules.schedule(schedule, m, ins, mesh=MESH)).lower(*ins)
        return low, random_inputs(low.graph)

    return make


def pipelined(schedule: str, repeats: int):
    """A scanned transformer (8 layers) pipelined over the 4 stages of :data:`STAGES` (4 microbatches), batch
    parallel on its other axis, on random inputs."""
    def make():
        m = models.scanned_transformer(vocab=32, d_model=16, layers=8, heads=2, seq=8, batch=8)
        ins = m.init(jax.random.key(0))
        batch = {"tokens": 0, "targets": 0}
        pipe = pc.Pipeline(layers="params/layers/*", axis="stage", microbatches=4, schedule=schedule,
                           repeats=repeats, batch=batch)
        low = pc.jit(m.step, STAGES, [pipe, pc.ManualPartition(batch, axis="batch")]).lower(*ins)
        return low, random_inputs(low.graph)

    return make


def conv_net():
    """The weight gradients of two convolutions (NCHW, OIHW), batch parallel over ``batch`` and Megatron-style
    over ``model`` (the first's output channels split, the second's input channels: a pending sum), on random
    inputs: forward convolutions and their gradients (convolutions of reversed kernels)."""
    def grads(x, w1, w2):
        def loss(w1, w2):
            h = jnp.tanh(lax.conv_general_dilated(x, w1, (1, 1), "SAME"))
            return jnp.sum(lax.conv_general_dilated(h, w2, (1, 1), "SAME") ** 2)

        return jax.grad(loss, argnums=(0, 1))(w1, w2)

    shapes = (4, 4, 6, 6), (8, 4, 3, 3), (4, 8, 3, 3)
    low = pc.jit(grads, MESH, [pc.ManualPartition({"x": 0}, axis="batch"),
                               pc.ManualPartition({"w1": 0, "w2": 1}, axis="model")]).lower(
        *(np.ones(s, np.float32) for s in shapes))
    return low, random_inputs(low.graph)


def split_tables():
    """A lookup (``jnp.take``, fill mode) and a scatter-add of clamped indices (``.at[ids].add``, clip mode)
    with the table split on its rows over ``model``, on indices past both ends of the table and at its last
    row."""
    def f(table, ids, updates):
        return jnp.take(table, ids, axis=0, mode="fill"), table.at[ids].add(updates, mode="clip")

    table, ids = np.arange(64, dtype=np.float32).reshape(16, 4), np.array([3, 40, -30, 15, 0, 9])
    updates = np.ones((6, 4), np.float32)
    low = pc.jit(f, MESH, [pc.ManualPartition({"table": 0}, axis="model")]).lower(table, ids, updates)
    return low, [table, ids, updates]


def pending_product():
    """``(x @ w1) * (x @ w2)``, the contraction split over ``model``: two pending sums that must be reduced
    before their product, on random inputs."""
    def f(x, w1, w2):
        return (x @ w1) * (x @ w2)

    low = pc.jit(f, MESH, [pc.ManualPartition({"x": 1, "w1": 0, "w2": 0}, axis="model")]).lower(
        *(np.ones((4, 8), np.float32), np.ones((8, 4), np.float32), np.ones((8, 4), np.float32)))
    return low, random_inputs(low.graph)


PROGRAMS = {"mlp BP+MP": preset("mlp", "BP+MP"), "scanned_mlp BP+MP+Z3": preset("scanned_mlp", "BP+MP+Z3"),
            "transformer BP+MP": preset("transformer", "BP+MP"), "transformer EMB": preset("transformer", "EMB"),
            "pipelined GPipe": pipelined("gpipe", 1), "pipelined circular": pipelined("circular", 2),
            "conv net BP+MP": conv_net, "split tables": split_tables, "product of pending sums": pending_product}


def replaced(instructions: list, target, new: list) -> list:
    """``instructions`` (nested bodies included) with the instruction ``target`` replaced by ``new``."""
    out = []
    for ins in instructions:
        if ins is target:
            out.extend(new)
        elif isinstance(ins, ControlFlow):
            out.append(dataclasses.replace(ins, bodies=[replaced(b, target, new) for b in ins.bodies]))
        else:
            out.append(ins)
    return out


def with_program(low, instructions=None, analysis=None):
    mutant = copy.copy(low)
    mutant.program = dataclasses.replace(low.program, instructions=instructions or low.program.instructions,
                                         analysis=analysis or low.program.analysis)
    return mutant


def _other(axis: str) -> str:
    return "model" if axis == "batch" else "batch"


class _Rewired(redist.Plan):
    """A plan whose program is another plan's (its steps and types stay the original's claim)."""

    def __init__(self, plan, program):
        super().__init__(plan.steps, plan.types)
        object.__setattr__(self, "_program", program)

    @property
    def program(self):
        return self._program


def _run_as(ins: Reshard, src, dst):
    """``ins`` running the program of the move ``src`` → ``dst`` (which must have ``ins``'s buffer shapes),
    while its plan still claims its own source and destination."""
    plan = _Rewired(ins.move.plan, reshard.move(src, dst).plan.program)
    return dataclasses.replace(ins, move=reshard.Move(plan))


def program_mutants(low):
    """``(operator, mutant Partitioned)`` for each operator of the lowered program, a few sites each."""
    found: dict = {}

    def add(op, make):
        if len(found.setdefault(op, [])) < PER_OPERATOR:
            try:
                found[op].append(make())
            except Exception:  # noqa: BLE001 - a site where the operator makes no valid mutant
                pass

    g = low.graph
    for ins in walk(low.program.instructions):
        if isinstance(ins, Reshard):
            s, d = ins.src, ins.dst
            if s.partial and not d.partial:
                add("drop reduction", lambda ins=ins, s=s, d=d: _swap(low, ins, _run_as(ins, s.replace(partial=()), d)))
                other = tuple(_other(a) for a in s.partial)
                add("reduce wrong axis", lambda ins=ins, s=s, d=d, o=other: _swap(low, ins, _run_as(
                    ins, s.replace(partial=o), d)))
            for k, (a, b) in enumerate(zip(s.dims, d.dims)):
                j = next((j for j, n in enumerate(s.shape) if j != k and n == s.shape[k] and not s.dims[j]), None)
                if a and not b and j is not None:
                    dims = list(s.dims)
                    dims[k], dims[j] = (), a
                    add("gather wrong dim", lambda ins=ins, s=s, d=d, dims=dims: _swap(low, ins, _run_as(
                        ins, s.replace(dims=tuple(dims)), d)))
                if b and not a and len(b) == 1:
                    dims = list(d.dims)
                    dims[k] = (_other(b[0]),)
                    add("slice wrong offset", lambda ins=ins, s=s, d=d, dims=dims: _swap(low, ins, _run_as(
                        ins, s, d.replace(dims=tuple(dims)))))
        elif isinstance(ins, Compute) and len(ins.reads) == 2 and ins.reads[0] != ins.reads[1]:
            e = g.eqns[ins.eqn_index]
            if g.shape(e.invars[0]) == g.shape(e.invars[1]) and g.dtype(e.invars[0]) == g.dtype(e.invars[1]):
                add("swap operands", lambda ins=ins: _swap(low, ins, dataclasses.replace(ins, reads=ins.reads[::-1])))
        elif isinstance(ins, Finish):
            add("drop finish", lambda ins=ins: with_program(low, replaced(low.program.instructions, ins, [])))
            kind = "min" if ins.kind == "max" else "max"
            add("wrong finish", lambda ins=ins, k=kind: _swap(low, ins, dataclasses.replace(ins, kind=k)))
    return [(op, m) for op, ms in found.items() for m in ms]


def _swap(low, ins, new):
    return with_program(low, replaced(low.program.instructions, ins, [new]))


def _doubling(make):
    def rule(eqn, shapes, out_shapes):
        r = make(eqn, shapes, out_shapes)
        if r is None:
            return None
        local = r.local

        def doubled(ctx, *xs):
            out = local(ctx, *xs) if local else registry.bind(ctx, *xs)
            return [y * 2 for y in out]

        return dataclasses.replace(r, local=doubled)
    return rule


def _reduce_as_max(make):
    def rule(eqn, shapes, out_shapes):
        r = make(eqn, shapes, out_shapes)
        return dataclasses.replace(r, reduce={f: "max" for f in r.reduce}, linear=None)
    return rule


def _mul_linear_all(make):
    def rule(eqn, shapes, out_shapes):
        r = make(eqn, shapes, out_shapes)
        return r if r is None or eqn.name != "mul" else dataclasses.replace(r, linear="all")
    return rule


def _not_permuted(make):
    def rule(eqn, shapes, out_shapes):
        r = make(eqn, shapes, out_shapes)
        return dataclasses.replace(r, results=[list(r.operands[0])])
    return rule


def _wrong_stage(make):
    def rule(eqn, shapes, out_shapes):
        r = make(eqn, shapes, out_shapes)

        def local(ctx, x):
            perm = ctx.eqn.params["perm"]
            further = dataclasses.replace(ctx.eqn, params={**ctx.eqn.params, "perm": tuple(perm[p] for p in perm)})
            return r.local(dataclasses.replace(ctx, eqn=further), x)

        return dataclasses.replace(r, local=local)
    return rule


def _clamped_dropped(make):
    def rule(eqn, shapes, out_shapes):
        r = make(eqn, shapes, out_shapes)
        if r is None or eqn.params["mode"] != lax.GatherScatterMode.CLIP:
            return r
        dropping = copy.copy(eqn)
        dropping.params = {**eqn.params, "mode": lax.GatherScatterMode.FILL_OR_DROP}
        return dataclasses.replace(r, local=make(dropping, shapes, out_shapes).local)
    return rule


def _bound_off_by_one(make):
    def rule(eqn, shapes, out_shapes):
        saved = registry._index_bounds  # the constant a split table's masked lookup compares indices with
        registry._index_bounds = lambda *args: saved(*args) - 1
        try:
            return make(eqn, shapes, out_shapes)
        finally:
            registry._index_bounds = saved
    return rule


def _split_table(low, i: int) -> bool:
    """Whether equation ``i`` of ``low`` (a gather or a scatter-add) reads a table split on a dim it indexes."""
    e, t = low.graph.eqns[i], low.program.analysis.ops[i].in_types[0]
    dn = e.params["dimension_numbers"]
    indexed = dn.start_index_map if e.name == "gather" else dn.scatter_dims_to_operand_dims
    return any(t.dims[d] for d in indexed)


def _clamped_into_split_table(low, i: int) -> bool:
    return _split_table(low, i) and low.graph.eqns[i].params["mode"] == lax.GatherScatterMode.CLIP


REGISTRY_MUTANTS = {  # operator -> (primitive, mutation of its rule, the equations of a program it changes)
    "wrong local rule": ("dot_general", _doubling, None),
    "wrong local rule of a convolution": ("conv_general_dilated", _doubling, None),
    "sum reduced as max": ("reduce_sum", _reduce_as_max, None),
    "convolution's sum reduced as max": ("conv_general_dilated", _reduce_as_max, None),
    "mul linear in both": ("mul", _mul_linear_all, None),
    "transpose not permuted": ("transpose", _not_permuted, None),
    "permute to the wrong stage": ("permute_dim", _wrong_stage, None),
    "clamped index dropped": ("scatter-add", _clamped_dropped, _clamped_into_split_table),
    "lookup bound off by one": ("gather", _bound_off_by_one, _split_table),
}


def registry_mutants(make, low):
    """``(operator, mutant Partitioned or the error lowering it raised)``: the program lowered again by
    ``make`` with one registry rule mutated, for each mutation that changes an equation of ``low`` (the
    unmutated program; all of its primitive's where the mutation names none)."""
    out = []
    for op, (prim, mutate, changes) in REGISTRY_MUTANTS.items():
        if not any(e.name == prim and (changes is None or changes(low, i)) for i, e in enumerate(low.graph.eqns)):
            continue
        saved = registry.RULES[prim]
        registry.RULES[prim] = mutate(saved)
        try:
            out.append((op, make()[0]))
        except Exception as e:  # noqa: BLE001 - a mutant that does not lower is killed by lowering
            out.append((op, e))
        finally:
            registry.RULES[prim] = saved
    return out


def _outputs(low, leaves):
    try:
        return [np.asarray(x) for x in low.program.run(*leaves)]
    except Exception as e:  # noqa: BLE001 - a mutant that fails to run is not equivalent
        return e


def _equal(a, b) -> bool:
    if isinstance(a, Exception) or isinstance(b, Exception) or len(a) != len(b):
        return False
    return all(x.shape == y.shape and np.allclose(x, y, rtol=1e-3, atol=1e-4, equal_nan=True) for x, y in zip(a, b))


def _confirmed(verdict, mutant, low) -> bool:
    """Whether a refutation's witness holds: on the inputs it names, ``mutant`` and the unmutated program
    ``low`` give different outputs."""
    k = verdict.counterexample["inputs"]
    leaves = next(itertools.islice(witness_inputs(mutant.graph), k, None))
    return not _equal(_outputs(mutant, leaves), _outputs(low, leaves))


def run() -> dict:
    t0 = time.perf_counter()
    rows, failures, unrefuted, survivors, by_op = [], [], [], [], {}
    for name, make in PROGRAMS.items():
        low, leaves = make()
        want = _outputs(low, leaves)
        assert low.verify().ok, f"{name}: the unmutated program is not proved"
        mutants = program_mutants(low) + registry_mutants(make, low)
        for op, mutant in progress(mutants, desc=f"mutants of {name}", unit="mutant"):
            if isinstance(mutant, Exception):
                status, equivalent = "not lowered", False
            else:
                verdict = mutant.verify(timeout_s=60)
                status = verdict.status
                equivalent = _equal(_outputs(mutant, leaves), want)
                if status == "refuted" and not _confirmed(verdict, mutant, low):
                    failures.append(f"{name}: {op}: refuted, but on its witness's inputs it computes what the "
                                    "unmutated program does")
            stats = by_op.setdefault(op, dict.fromkeys(STATUSES + ("mutants", "equivalent survivors"), 0))
            stats["mutants"] += 1
            stats[status] += 1
            if equivalent and status in ("proved", "undecided"):
                stats["equivalent survivors"] += 1
                survivors.append(f"{name}: {op} ({status})")
            elif status == "proved":
                failures.append(f"{name}: {op}: proved, but its outputs differ")
            elif status == "undecided":
                unrefuted.append(f"{name}: {op}: undecided, and its outputs differ")
            rows.append((name, op, status, equivalent))
    return {"by_operator": by_op, "failures": failures, "unrefuted": unrefuted, "survivors": survivors,
            "mutants": len(rows), "seconds": time.perf_counter() - t0, "ok": not failures and not unrefuted}


STATUSES = ("refuted", "not lowered", "undecided", "proved")


def killed(res: dict) -> int:
    """The mutants of :func:`run`'s result ``res`` that were refuted or failed to lower."""
    return sum(s["refuted"] + s["not lowered"] for s in res["by_operator"].values())


if __name__ == "__main__":
    res = run()
    print(f"{'operator':<24}{'mutants':>8}" + "".join(f"{s:>13}" for s in STATUSES) + f"{'equivalent':>12}")
    for op, s in res["by_operator"].items():
        print(f"{op:<24}{s['mutants']:>8}" + "".join(f"{s[k]:>13}" for k in STATUSES)
              + f"{s['equivalent survivors']:>12}")
    for f in res["failures"]:
        print("FAILED", f)
    for f in res["unrefuted"]:
        print("NOT KILLED", f)
    print(f"{res['mutants']} mutants: {killed(res)} killed, {len(res['survivors'])} equivalent survivors, "
          f"{len(res['unrefuted'])} not killed, {len(res['failures'])} wrong proofs; {res['seconds']:.0f}s")
    raise SystemExit(0 if res["ok"] else 1)
