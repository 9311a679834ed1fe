"""Plans built from random sequences of steps through their typing rules, not by the synthesizer, against the
numpy backend: ``verify`` proves every plan whose program the numpy backend runs right, and never one it runs
wrong; mutants of those programs and claims (:mod:`proofs.mutation`) are never proved where the numpy backend
shows a difference.

A plan starts from a random source type (a mesh of up to 8 devices, some in another device order; whole axes
and sub-axes; dims of any size, even or not; partial axes of any reduction kind; integer or ``bool`` dtypes, so
that every reduction is exact in any order) and applies random steps: each candidate step's typing rule decides
whether it fits (:meth:`redist.Plan.from_steps`), and one that does not is skipped. The candidates: all_slice,
all_gather, all_to_all (one move or several), permute and exchange (to a random layout, some to another device
order), reduce_scatter and all_reduce (of the type's kind), replicate_to_partial and shard_to_partial, pad and
unpad. A plan whose last type has another shape than its source ends with the unpad back, or is drawn again.

``python -m proofs.step_sequences [N] [SEED]`` checks N plans (default 500) and prints the counts.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections import Counter

from redist import steps as S
from redist.axes import Axis
from redist.errors import ShardingError
from redist.plan import Plan
from redist.testing import SeededDraw, draw_layout, draw_mesh
from redist.types import REDUCTIONS, ShardingType

DTYPES = ("i32", "i64", "u8", "bool")
MAX_STEPS = 5


def random_plan(rng: random.Random) -> Plan:
    """A plan of one to ``MAX_STEPS`` random steps that fit, from a random source type (module header)."""
    while True:
        src = _source(rng)
        types, steps = [src], []
        for _ in range(rng.randint(1, MAX_STEPS)):
            step = _fitting_step(rng, types[-1])
            if step is not None:
                steps.append(step)
                types.append(step.apply(types[-1]))
        if types[-1].shape != src.shape:
            steps.append(S.Unpad(src.shape))
        try:
            return Plan.from_steps(src, steps)
        except ShardingError:
            continue


def _source(rng: random.Random) -> ShardingType:
    draw = SeededDraw(rng)
    mesh = draw_mesh(draw, max_axes=3, max_devices=8, min_devices=2, device_order=0.2)
    while True:
        rank = rng.randint(0, 3)
        dims, partial = draw_layout(draw, mesh, rank, sub_axes=0.3, to_partial=0.25)
        dtype = rng.choice(DTYPES)
        kind = rng.choice(REDUCTIONS) if partial else "sum"
        shape = []
        for axes in dims:
            k = mesh.group_size(axes) if axes else 1
            shape.append(rng.randint(0, 2 * k + 1) if rng.random() < 0.5 else k * rng.choice((1, 2)))
        try:
            return ShardingType(mesh, tuple(shape), dtype, dims, partial, kind)
        except ShardingError:
            continue


def _tokens(mesh) -> list[Axis]:
    """Every axis and sub-axis of ``mesh``."""
    out = []
    for name, size in mesh.axes:
        for pre in range(1, size + 1):
            for sub in range(1, size // pre + 1):
                if size % (pre * sub) == 0 and (sub >= 2 or (pre, sub) == (1, size)):
                    out.append(Axis(name, pre, sub, size))
    return out


def _fitting_step(rng: random.Random, t: ShardingType, tries: int = 30):
    """A random step whose typing rule fits ``t`` (None if none of ``tries`` candidates does)."""
    for _ in range(tries):
        step = _candidate(rng, t)
        if step is None:
            continue
        try:
            step.apply(t)
        except ShardingError:
            continue
        return step
    return None


def _suffix(rng: random.Random, axes) -> tuple:
    return tuple(axes[-rng.randint(1, len(axes)):]) if axes else ()


def _candidate(rng: random.Random, t: ShardingType):
    """One random step for ``t``, which may not fit it."""
    mesh, rank = t.mesh, t.rank
    used = [a for d in t.dims for a in d] + list(t.partial)
    free = [a for a in _tokens(mesh) if not any(mesh.axis(a).overlaps(mesh.axis(u)) for u in used)]
    split = [d for d in range(rank) if t.dims[d]]
    kind = rng.choice(("all_slice", "all_gather", "all_to_all", "multi_all_to_all", "permute", "exchange",
                       "reduce_scatter", "all_reduce", "replicate_to_partial", "shard_to_partial", "pad", "unpad"))
    if kind == "all_slice" and rank and free:
        return S.AllSlice(rng.randrange(rank), (rng.choice(free),))
    if kind == "all_gather" and split:
        d = rng.choice(split)
        return S.AllGather(d, _suffix(rng, t.dims[d]))
    if kind == "all_to_all" and split and rank > 1:
        d = rng.choice(split)
        return S.AllToAll(d, rng.choice([e for e in range(rank) if e != d]), _suffix(rng, t.dims[d]))
    if kind == "multi_all_to_all" and len(split) >= 2 and rank > 2:
        sources = rng.sample(split, 2)
        targets = [e for e in range(rank) if e not in sources]
        return S.MultiAllToAll(tuple((d, rng.choice(targets), _suffix(rng, t.dims[d])) for d in sources))
    if kind in ("permute", "exchange"):
        device_ids = None
        if rng.random() < 0.2:
            device_ids = tuple(rng.sample(range(mesh.size), mesh.size))
        if kind == "permute":
            dims = [list(d) for d in t.dims]
            rng.shuffle(dims)
            return S.Permute(tuple(map(tuple, dims)), device_ids)
        dims, _ = draw_layout(SeededDraw(rng), mesh, rank, partial=False, sub_axes=0.3)
        dims = tuple(tuple(a for a in d if not any(mesh.axis(a).overlaps(mesh.axis(p)) for p in t.partial))
                     for d in dims)
        return S.Exchange(dims, device_ids)
    if kind in ("reduce_scatter", "all_reduce") and t.partial:
        axes = tuple(rng.sample(list(t.partial), rng.randint(1, len(t.partial))))
        if kind == "all_reduce":
            return S.AllReduce(axes, t.reduction)
        return S.ReduceScatter(rng.randrange(rank), axes, t.reduction) if rank else None
    if kind == "replicate_to_partial" and free:
        return S.ReplicateToPartial((rng.choice(free),))
    if kind == "shard_to_partial" and split:
        d = rng.choice(split)
        return S.ShardToPartial(d, _suffix(rng, t.dims[d]))
    if kind == "pad" and not t.is_even():
        return S.Pad()
    return None


def check(plan: Plan, seed: int, n_mutants: int = 0) -> tuple[str, list[str]]:
    """Verify ``plan`` and run it on numpy; then up to ``n_mutants`` mutants of its program and claim. Returns
    the plan's outcome (``"proved"`` where numpy agrees, ``"refuted"`` where it does not) and the failures:
    a verdict other than those, or a mutant proved that numpy runs wrong."""
    from proofs.common import oracle
    from proofs.mutation import claim_mutants, derive_shapes, mutants
    from redist.verify import verify, verify_program

    rng = random.Random(seed)
    ok, why = oracle(plan.program, plan.src, plan.dst, seed=seed)
    v = verify(plan)
    failures = []
    if v.status != ("proved" if ok else "refuted"):
        failures.append(f"{plan.src} | {'; '.join(map(str, plan.steps))}: numpy {why}, verify {v.status}: "
                        f"{v.reason}")
    if n_mutants:
        prog = plan.program
        cases = []
        for _, desc, new in mutants(prog, rng, max_per_op=1):
            shapes = derive_shapes(prog, new)
            if shapes is not None:
                cases.append((desc, dataclasses.replace(prog, instructions=new, shapes=shapes), plan.dst))
        cases += [(f"claim {claim}: {desc}", prog, claim) for _, desc, claim in claim_mutants(plan.dst, rng, 1)]
        for desc, program, claim in rng.sample(cases, min(n_mutants, len(cases))):
            if verify_program(program, plan.src, claim).status == "proved":
                good, why = oracle(program, plan.src, claim, seed=seed)
                if not good:
                    failures.append(f"{plan.src} | {'; '.join(map(str, plan.steps))}: mutant {desc} proved, numpy "
                                    f"{why}")
    return v.status, failures


def run(n: int = 500, seed: int = 0, n_mutants: int = 2) -> dict:
    """Check ``n`` random plans (seeded by ``seed``), each with ``n_mutants`` mutants."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    outcomes, steps, features, failures = Counter(), Counter(), Counter(), []
    for i in range(n):
        plan = random_plan(rng)
        steps.update(s.kind for s in plan.steps)
        features.update(_features(plan))
        status, bad = check(plan, seed=seed * 1_000_003 + i, n_mutants=n_mutants)
        outcomes[status] += 1
        failures += bad
    return {"plans": n, "outcomes": dict(outcomes), "steps": dict(steps), "features": dict(features),
            "failures": failures, "seconds": time.perf_counter() - t0}


def _features(plan: Plan) -> list[str]:
    """What of the module header's variety a plan has, for the counts of :func:`run`."""
    types = plan.types
    out = [f"source {plan.src.reduction}" if plan.src.partial else "source not partial"]
    out += ["uneven"] * any(not t.is_even() for t in types)
    out += ["sub-axes"] * any(":" in a for t in types for a in (*(x for d in t.dims for x in d), *t.partial))
    out += ["device order"] * any(t.mesh.device_ids != tuple(range(t.mesh.size)) for t in types)
    reductions = {s.reduction for s in plan.steps if s.kind in ("reduce_scatter", "all_reduce")}
    out += ["two kinds"] * bool(plan.src.partial and plan.src.reduction != "sum" and (
        "sum" in reductions or plan.dst.partial and plan.dst.reduction == "sum"))
    return out


if __name__ == "__main__":
    res = run(int(sys.argv[1]) if len(sys.argv) > 1 else 500, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(f"{res['plans']} plans in {res['seconds']:.0f} s: {res['outcomes']}; steps {res['steps']}; "
          f"features {res['features']}")
    for line in res["failures"]:
        print(line)
    sys.exit(1 if res["failures"] else 0)
