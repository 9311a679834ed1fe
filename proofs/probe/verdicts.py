"""Verify's verdicts against numpy, on plans and claims no synthesizer made:

- ``sequences``: plans of random step sequences through the typing rules (:mod:`proofs.step_sequences`, each
  with a mutant of its program or claim): verify proves those that numpy runs right and refutes the others.
- ``claims``: random claims about random plans (:func:`random_claim`). Numpy confirms on random data each
  claim that verify proves, and refutes each one that verify refutes, but where values cannot tell
  (:func:`_judge`).
"""

from __future__ import annotations

import math
import random

from proofs.probe.plan_files import random_plan
from proofs.probe.tally import Tally, case_rng, unexpected
from redist.errors import ShardingError
from redist.plan import Plan
from redist.testing import SeededDraw, draw_layout
from redist.types import REDUCTIONS, ShardingType

CONFIRMING_TRIALS = 30  # draws of random data behind numpy's word that a claim holds (after a first 3)


def probe_sequences(seed: int, quick: bool) -> Tally:
    from proofs.step_sequences import check, random_plan as random_steps

    tally = Tally("sequences")
    for i in range(60 if quick else 1000):
        rng = case_rng(seed, "sequences", i)
        plan = random_steps(rng)
        reproduce = f"Plan.from_json({plan.to_json()!r})"
        try:
            status, failures = check(plan, seed=rng.randrange(2**31), n_mutants=1)
        except Exception as e:  # noqa: BLE001 - what the probe looks for
            tally.add("other error", f"{reproduce}: {unexpected(e)}")
            continue
        tally.add(status if not failures else "wrong", None if not failures else
                  "; ".join(failures) + f" ({reproduce})")
    return tally


def random_claim(rng: random.Random, plan: Plan) -> ShardingType:
    """A claim about ``plan``: half the time a near miss of its destination (another dtype, shape, mesh, device
    order or reduction kind: :func:`proofs.mutation.claim_mutants`), else a random layout of its shape and
    dtype on its destination's mesh or another device order of it, partial of any kind."""
    from proofs.mutation import claim_mutants

    dst = plan.dst
    if rng.random() < 0.5:
        near = [claim for _, _, claim in claim_mutants(dst, rng, max_per_op=1) if claim is not None]
        if near:
            return rng.choice(near)
    draw = SeededDraw(rng)
    while True:
        mesh = dst.mesh
        if rng.random() < 0.2:
            mesh = mesh.reordered(rng.sample(range(mesh.size), mesh.size))
        dims, partial = draw_layout(draw, mesh, dst.rank, sub_axes=0.3, to_partial=0.2)
        try:
            return ShardingType(mesh, dst.shape, dst.dtype, dims, partial, rng.choice(REDUCTIONS) if partial else "sum")
        except ShardingError:
            continue


def probe_claims(seed: int, quick: bool) -> Tally:
    from proofs.common import oracle
    from redist.verify import verify

    tally = Tally("claims")
    for i in range(300 if quick else 4000):
        rng = case_rng(seed, "claims", i)
        plan = random_plan(rng)
        claim = random_claim(rng, plan)
        call = f"verify(Plan.from_json({plan.to_json()!r}), {claim!r})"
        try:
            verdict = verify(plan, claim, timeout_s=120)
        except Exception as e:  # noqa: BLE001 - what the probe looks for
            tally.add("other error", f"{call} {unexpected(e)}")
            continue
        data_seed = rng.randrange(2**31)
        outcome, problem = _judge(verdict.status, verdict.reason, plan, claim,
                                  lambda trials: oracle(plan.program, plan.src, claim, seed=data_seed, trials=trials))
        tally.add(outcome, None if problem is None else f"{call} {problem}")
    return tally


def _judge(status: str, reason: str, plan: Plan, claim: ShardingType, numpy) -> tuple[str, str | None]:
    """The outcome of verify's verdict (``status``, ``reason``) on ``claim`` about ``plan``, and what is wrong
    with it (None: nothing), from ``numpy(trials)``: whether the numpy backend runs the plan's program to
    ``claim`` on that many draws of random data, and why not.

    A proof of a claim that numpy refutes is wrong. A refutation of a claim that numpy confirms on
    :data:`CONFIRMING_TRIALS` draws is wrong too, unless values cannot tell: the claim is no possible target of
    the source (a pending max made of replicated data, say: :func:`redist.bounds.check_pair`, docs/spec.md §3),
    numpy's data cannot show a difference (:func:`_indistinct`), or the claim is a pending max or min over
    other axes or of another kind than the plan's destination (a max or min of copies is the copy, so such
    values can be right while the type is not, and verify compares types: its docstring)."""
    from redist.bounds import check_pair

    true, why = numpy(3)
    if status == "proved":
        if true:
            true, why = numpy(CONFIRMING_TRIALS)
        return ("proved, numpy agrees", None) if true else ("wrong", f"proved a false claim (numpy: {why})")
    if status != "refuted":
        return status, None
    if not true or not numpy(CONFIRMING_TRIALS)[0]:
        return "refuted, numpy agrees", None
    dst = plan.dst
    try:
        check_pair(plan.src, claim)
    except ShardingError:
        return "refuted, no target of the source", None
    if _indistinct(plan.src, claim):
        return "refuted, values numpy cannot tell apart", None
    if claim.partial and claim.reduction in ("max", "min") and (
            claim.reduction != dst.reduction or set(claim.partial) != set(dst.partial)):
        return "refuted, a pending max or min of another type than the result", None
    return "wrong", f"refuted a claim that numpy confirms on random data: {reason}"


def _indistinct(src: ShardingType, claim: ShardingType) -> bool:
    """Whether numpy's random data (:func:`proofs.common.source_buffers`) cannot show that a claim is wrong: an
    array of no elements; ``bool`` values (never all distinct); a source of pending maxima of unsigned integers,
    whose summands are nearly all the value itself (the values are ``1 … N``, and each summand at most the
    value), so that a program that drops some of them gives the value all the same."""
    return (math.prod(claim.shape) == 0 or claim.dtype == "bool"
            or bool(src.partial) and src.reduction == "max" and src.np_dtype.kind == "u")
