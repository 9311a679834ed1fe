"""Mutation testing of the verifier: mutate synthesized programs and count how many mutants it kills.

Operators (each mutant is a modified :class:`redist.program.Program`; its buffer shapes are re-derived from
its instructions so that it is a well-formed program wherever the mutation allows — a mutant whose shapes
cannot be derived, e.g. a split that no longer divides, is ill-formed: it keeps the original shapes and the
verifier must still refute it; the numpy backend raises on it):

- ``reverse_axes``: an instruction's axes tuple reversed (swaps the group members' order);
- ``wrong_dim``: an instruction's dim (or split / concat dim) moved to another dim;
- ``swap_a2a_dims``: an all-to-all's split and concat dims exchanged;
- ``wrong_axis``: one axis token replaced by another mesh axis or sub-axis not already named there;
- ``drop``: one instruction removed;
- ``duplicate``: one instruction repeated;
- ``swap_permute_pair``: two entries of a collective permute's source table exchanged;
- ``reduce_kind``: a reduce-scatter turned into an all-reduce or back (with a slice);
- ``swap_transpose``: two entries of a local transpose's permutation exchanged (the transposes around a
  two-move all-to-all).

Not covered: an off-by-one slice bound. The instruction set cannot express it (a ``Slice`` always keeps
chunk ``r`` of ``k`` equal chunks), and a mutant-only subclass would be executed by the numpy backend as
the plain ``Slice`` it subclasses, so the backend could not witness it; the operator is skipped.

A mutant the verifier proves correct (a survivor) must be equivalent: the numpy backend, run on random
data (distinct elements, random summands per partial group), must give the correct result. A mutant the
verifier refutes while the backend finds it correct is a false alarm. Both are failures of this script.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time

from redist import program as P
from redist.synthesis import synthesize
from redist.verify import verify_program


def derive_shapes(prog: P.Program, instructions) -> tuple | None:
    mesh = prog.mesh
    shapes = [tuple(prog.shapes[0])]
    for ins in instructions:
        x = list(shapes[-1])
        try:
            if isinstance(ins, P.CollectivePermute):
                pass
            elif isinstance(ins, P.Reshape):
                if math.prod(ins.shape) != math.prod(x):
                    return None
                x = list(ins.shape)
            elif isinstance(ins, P.Transpose):
                if sorted(ins.perm) != list(range(len(x))):
                    return None
                x = [x[p] for p in ins.perm]
            else:
                k = mesh.group_size(ins.axes)
                if isinstance(ins, (P.Slice, P.ReduceScatter)):
                    if x[ins.dim] % k:
                        return None
                    x[ins.dim] //= k
                elif isinstance(ins, P.AllGather):
                    x[ins.dim] *= k
                elif isinstance(ins, P.AllToAll):
                    if x[ins.split_dim] % k:
                        return None
                    x[ins.split_dim] //= k
                    x[ins.concat_dim] *= k
        except (IndexError, ValueError):
            return None
        shapes.append(tuple(x))
    return tuple(shapes)


def _tokens(mesh):
    out = list(mesh.names)
    for name, size in mesh.axes:
        for pre in range(1, size + 1):
            for s in range(2, size + 1):
                if size % (pre * s) == 0 and (pre, s) != (1, size) and size // (pre * s) >= 1:
                    out.append(f"{name}:({pre}){s}")
    return out


def mutants(prog: P.Program, rng: random.Random, max_per_op: int = 3):
    """Yield (operator, description, instructions) for mutants of ``prog``."""
    ins = list(prog.instructions)
    rank = len(prog.shapes[0])
    mesh = prog.mesh
    found: dict[str, list] = {}

    def add(op, desc, new):
        found.setdefault(op, []).append((op, desc, tuple(new)))

    for t, x in enumerate(ins):
        axes = getattr(x, "axes", None)
        if axes and len(axes) >= 2:
            add("reverse_axes", f"{t}: axes {axes} reversed", ins[:t] + [dataclasses.replace(x, axes=axes[::-1])] + ins[t + 1:])
        for field in ("dim", "split_dim", "concat_dim"):
            if hasattr(x, field):
                for d in range(rank):
                    if d != getattr(x, field):
                        add("wrong_dim", f"{t}: {field} {getattr(x, field)} -> {d}",
                            ins[:t] + [dataclasses.replace(x, **{field: d})] + ins[t + 1:])
        if isinstance(x, P.AllToAll):
            add("swap_a2a_dims", f"{t}: split/concat exchanged",
                ins[:t] + [P.AllToAll(x.concat_dim, x.split_dim, x.axes)] + ins[t + 1:])
        if axes:
            for j in range(len(axes)):
                for tok in _tokens(mesh):
                    if tok not in axes:
                        new_axes = axes[:j] + (tok,) + axes[j + 1:]
                        add("wrong_axis", f"{t}: axis {axes[j]} -> {tok}",
                            ins[:t] + [dataclasses.replace(x, axes=new_axes)] + ins[t + 1:])
        add("drop", f"{t}: {x} dropped", ins[:t] + ins[t + 1:])
        add("duplicate", f"{t}: {x} duplicated", ins[:t + 1] + ins[t:])
        if isinstance(x, P.CollectivePermute):
            src = list(x.sources)
            for a in range(len(src)):
                for b in range(a + 1, len(src)):
                    if src[a] != src[b] and (src[a] != a or src[b] != b):
                        s2 = list(src)
                        s2[a], s2[b] = s2[b], s2[a]
                        add("swap_permute_pair", f"{t}: sources[{a}] <-> sources[{b}]",
                            ins[:t] + [P.CollectivePermute(tuple(s2))] + ins[t + 1:])
        if isinstance(x, P.Transpose):
            perm = list(x.perm)
            for a in range(len(perm)):
                for b in range(a + 1, len(perm)):
                    p2 = list(perm)
                    p2[a], p2[b] = p2[b], p2[a]
                    add("swap_transpose", f"{t}: perm entries {a} <-> {b}",
                        ins[:t] + [P.Transpose(tuple(p2))] + ins[t + 1:])
        if isinstance(x, P.ReduceScatter):
            add("reduce_kind", f"{t}: reduce_scatter -> all_reduce", ins[:t] + [P.AllReduce(x.axes)] + ins[t + 1:])
        if isinstance(x, P.AllReduce) and rank:
            add("reduce_kind", f"{t}: all_reduce -> reduce_scatter + all_gather",
                ins[:t] + [P.ReduceScatter(0, x.axes), P.AllGather(0, x.axes[::-1])] + ins[t + 1:])
    for op, lst in found.items():
        rng.shuffle(lst)
        yield from lst[:max_per_op]


# Pairs whose plans use every instruction kind, the two-move all-to-all (local reshapes and transposes
# around one AllToAll) and sub-axes among them; mutated before the random plans.
FIXED_PAIRS = [
    ("x=2,y=4", "f32[8{y}, 4{x}, 8, 4]", "f32[8, 4, 8{x}, 4{y}]"),
    ("x=2,y=2,z=2", "f32[4{x}, 4{z}, 4, 4{y}]", "f32[4, 4{y}, 4{x}, 4{z}]"),
    ("x=2,y=4", "f32[4{x}]", "f32[4{y}]"),
    ("x=4,y=2", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]"),
]


def run(n_plans: int = 300, seed: int = 0, max_per_op: int = 3, verbose: bool = False) -> dict:
    from proofs.common import random_mesh, random_pair
    from redist import Mesh, ShardingType

    rng = random.Random(seed)
    t0 = time.perf_counter()
    stats = {"plans": 0, "mutants": 0, "ill_formed": 0, "killed_by_verify": 0, "survivors": 0,
             "equivalent_survivors": 0, "unsound": [], "false_alarms": [], "by_op": {}}
    for mesh_text, a, b in FIXED_PAIRS:
        mesh = Mesh.parse(mesh_text)
        src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
        _mutate(synthesize(src, dst), src, dst, rng, max_per_op, stats)
    while stats["plans"] < n_plans:
        mesh = random_mesh(rng, max_axes=3, max_devices=8, min_devices=2)
        src, dst = random_pair(rng, mesh, max_rank=3, partial=0.4, sub_axes=0.25)
        plan = synthesize(src, dst)
        if plan.steps:
            _mutate(plan, src, dst, rng, max_per_op, stats)
    non_equiv = stats["mutants"] - stats["equivalent_survivors"]
    stats["non_equivalent"] = non_equiv
    stats["kill_rate"] = stats["killed_by_verify"] / non_equiv if non_equiv else 1.0
    stats["seconds"] = time.perf_counter() - t0
    stats["ok"] = not stats["unsound"] and not stats["false_alarms"]
    return stats


def _mutate(plan, src, dst, rng, max_per_op, stats) -> None:
    """Mutate one plan's program; count every mutant into ``stats``."""
    from proofs.common import oracle

    stats["plans"] += 1
    prog = plan.program
    for op, desc, new in mutants(prog, rng, max_per_op):
        shapes = derive_shapes(prog, new)
        row = stats["by_op"].setdefault(op, {"mutants": 0, "killed": 0, "equivalent": 0})
        row["mutants"] += 1
        stats["mutants"] += 1
        if shapes is None:
            # Ill-formed (a split that does not divide, a dim that does not exist): hand the verifier the
            # program with the original shapes, padded; it must refute it. The backend raises on it.
            stats["ill_formed"] += 1
            shapes = (tuple(prog.shapes) + (prog.shapes[-1],) * len(new))[: len(new) + 1]
        mut = P.Program(prog.mesh, prog.dtype, new, shapes)
        v = verify_program(mut, src, dst)
        ok, why = oracle(mut, src, dst, seed=stats["mutants"])
        if v.ok:
            stats["survivors"] += 1
            if ok:
                stats["equivalent_survivors"] += 1
                row["equivalent"] += 1
            else:
                stats["unsound"].append(f"{src} -> {dst}: {desc}: verify proved it, numpy: {why}")
        else:
            stats["killed_by_verify"] += 1
            row["killed"] += 1
            if ok:
                # Killed but the backend finds no difference on random data: recheck with more trials.
                ok2, _ = oracle(mut, src, dst, seed=stats["mutants"] + 10**6, trials=6)
                if ok2:
                    stats["false_alarms"].append(f"{src} -> {dst}: {desc}: verify: {v.reason}")


if __name__ == "__main__":
    s = run(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
    for k, v in s.items():
        if k not in ("unsound", "false_alarms", "by_op"):
            print(f"{k}: {v}")
    for op, row in s["by_op"].items():
        print(f"  {op:<18} {row}")
    for line in s["unsound"] + s["false_alarms"]:
        print(line)
    sys.exit(0 if s["ok"] else 1)
