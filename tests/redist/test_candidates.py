"""Candidate plans around the search: reduce-scatters with uneven counts, and one
exchange on even dims where the collectives miss the lower bound; the exchange priced as the rounds it runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from proofs.common import oracle
from redist import cost
from redist import program as P
from redist import steps as S
from redist.blocks import remote_copies
from redist.bounds import lower_bound_bytes
from redist.data import poisoned_source, unshard
from redist.execute import execute
from redist.lowering import lower_step
from redist.mesh import Mesh
from redist.plan import Plan
from redist.synthesis import synthesize
from redist.synthesis.cases import searched_plan
from redist.types import ShardingType
from redist.verify import verify
from tests.redist.strategies import meshes, type_pairs


def T(text, mesh):
    return ShardingType.parse(text, mesh)


# ---------------------------------------------------------------------------------- uneven reduce-scatter
# (mesh, src, dst, bytes without an uneven reduce-scatter (all_reduce + exchange, or reduce-scatter on the
# padded view + exchange), bytes of the plan)
UNEVEN_REDUCTIONS = [
    ("x=4", "f32[13, 3] partial{x}", "f32[13{x}, 3]", 234, 144),     # counts (4, 4, 4, 1) rows
    ("x=4", "f32[5, 3] partial{x}", "f32[5{x}, 3]", 90, 72),
    ("x=4", "f32[3, 2] partial{x}", "f32[3{x}, 2]", 36, 24),          # fewer rows than devices
    ("x=2,y=4", "f32[9, 3] partial{y}", "f32[9{y}, 3]", 162, 108),
    ("x=2,y=2", "f32[7, 8] partial{x,y}", "f32[7{x}, 8{y}]", 232, 192),
    ("x=2,y=4", "f32[11, 5] partial{x,y}", "f32[11{x,y}, 5]", 385, 280),
    ("x=2,y=4", "f32[11, 6] partial{x,y}", "f32[11{y}, 6] partial{x}", 396, 216),
    ("x=6", "f32[13, 4] partial{x}", "f32[13{x}, 4]", 346.6666666666667, 240),
]


@pytest.mark.parametrize("mesh,src,dst,before,after", UNEVEN_REDUCTIONS)
def test_uneven_reduce_scatter_receives_fewer_bytes(mesh, src, dst, before, after):
    m = Mesh.parse(mesh)
    s, d = T(src, m), T(dst, m)
    plan = synthesize(s, d)
    kinds = [step.kind for step in plan.steps]
    assert "reduce_scatter" in kinds and "exchange" not in kinds and "all_reduce" not in kinds, kinds
    assert plan.bytes_received == after < before
    assert plan.peak_bytes <= max(s.local_bytes, d.local_bytes)
    v = verify(plan)
    assert v.ok, (v.reason, v.counterexample)
    ok, why = oracle(plan.program, s, d, seed=2)
    assert ok, why


def test_uneven_reduce_scatter_chunks_follow_the_padding_rule():
    """13 rows on 4 devices: rows [0,4), [4,8), [8,12), [12,13) of the sum, each at the start of a buffer of 4
    rows whose rest is zero; the step is typed only onto a dim that no axis split before."""
    m = Mesh.parse("x=4")
    src = T("f32[13, 3] partial{x}", m)
    step = S.ReduceScatter(0, ("x",))
    assert step.apply(src) == T("f32[13{x}, 3]", m)
    assert step.bytes_received(src) == 3 * 4 * 3 * 4  # (k-1) * L_out
    value, shards = poisoned_source(src, np.random.default_rng(0))
    plan = synthesize(src, step.apply(src))
    out = execute(plan, shards)
    for r, buf in enumerate(out):
        rows = value[4 * r: 4 * r + 4]
        np.testing.assert_array_equal(buf[: len(rows)], rows)
        assert not buf[len(rows):].any()
    np.testing.assert_array_equal(unshard(plan.dst, out), value)


@pytest.mark.parametrize("kind", ["max", "min", "prod"])
def test_uneven_reduce_scatter_takes_the_reduction_kind(kind):
    """The kind is threaded through the uneven reduce-scatter: the plan is the same, by the source's kind,
    proved, and the numpy and JAX backends agree with the value."""
    m = Mesh.parse("x=4")
    src, dst = T(f"f32[13, 3] partial({kind}){{x}}", m), T("f32[13{x}, 3]", m)
    plan = synthesize(src, dst)
    assert [(s.kind, s.reduction) for s in plan.steps] == [("reduce_scatter", kind)]
    assert plan.bytes_received == 144
    v = verify(plan)
    assert v.ok, (v.reason, v.counterexample)
    ok, why = oracle(plan.program, src, dst, seed=5)
    assert ok, why
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)")
    value, shards = poisoned_source(src, np.random.default_rng(6))
    got = execute(plan, shards, backend="jax")
    np.testing.assert_array_equal(unshard(dst, got), value)


def test_uneven_reduce_scatter_on_jax():
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)")
    rng = np.random.default_rng(1)
    for mesh, a, b, _, _ in UNEVEN_REDUCTIONS:
        m = Mesh.parse(mesh)
        if m.size > 8:
            continue
        src, dst = T(a, m), T(b, m)
        plan = synthesize(src, dst)
        assert any(isinstance(i, P.ReduceScatter) for i in plan.program.instructions)
        value, shards = poisoned_source(src, rng)
        want = execute(plan, shards)
        with jax.transfer_guard("disallow"):
            got = execute(plan, shards, backend="jax")
        for w, g in zip(want, got):
            assert np.array_equal(g, w, equal_nan=True), (a, b, plan.program)
        np.testing.assert_array_equal(unshard(dst, got), value)


# ---------------------------------------------------------------------------------- exchange on even dims
def test_exchange_is_chosen_where_the_collectives_miss_the_bound():
    """Putting y under x in dim 0 costs the collectives a whole permuted buffer; one exchange receives only
    the missing pieces: the lower bound."""
    m = Mesh({"x": 2, "y": 4})
    src, dst = T("f32[8{x}, 16{y}]", m), T("f32[8{y}, 16{x}]", m)
    # The best plan of collectives (the search stops at the bound, and takes the exchange itself).
    collectives = Plan.from_steps(src, (S.AllToAll(1, 0, ("y:(2)2",)), S.Permute((("y",), ("x",)))))
    plan = synthesize(src, dst)
    assert [s.kind for s in plan.steps] == ["exchange"]
    assert plan.bytes_received == lower_bound_bytes(src, dst) < collectives.bytes_received
    assert plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)
    assert verify(plan).ok


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(meshes(max_axes=3, max_devices=16).flatmap(lambda m: type_pairs(mesh=m, max_rank=3, sub_axes=0.2)))
def test_never_more_bytes_than_the_search_and_memory_bounded(pair):
    """Even pairs: the chosen plan receives no more than the search's own plan, at most what the exchange
    candidate would, and stays within max(src, dst) local bytes."""
    src, dst = pair
    plan = synthesize(src, dst)
    core = searched_plan(src, dst)  # same types: unit axes aside, the search's plan
    assert plan.bytes_received <= core.bytes_received
    assert plan.bytes_received >= lower_bound_bytes(src, dst)
    assert plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)


def test_exchange_is_priced_one_latency_per_round():
    """An exchange runs as rounds of ppermute (program.Exchange.rounds): the cost model charges each round its
    latency and its slab, not one latency in total."""
    m = Mesh({"x": 2, "y": 4})
    topo = cost.topology("2x8-nodes", m)
    src, dst = T("f32[8{x}, 16{y}]", m), T("f32[8{y}, 16{x}]", m)
    step = S.Exchange(dst.dims)
    (ins,) = lower_step(step, src)
    rounds = ins.rounds(m)
    assert len(rounds) > 1
    want = 0.0
    for _, moves in rounds:
        slab = math.prod(max(c.size[i] for _, _, c in moves) for i in range(src.rank)) * src.itemsize
        want += cost.collective_time(m.varying_axes((a, b) for a, b, _ in moves), slab, topo)
    got = cost.step_time(step, src, topo)
    assert math.isclose(got, want)
    slowest = max(topo.link(a).alpha for a in m.names)
    assert got >= len(rounds) * min(topo.link(a).alpha for a in m.names)
    assert got > slowest  # more than one collective's latency


@given(type_pairs(max_rank=3, sub_axes=0.3, uneven=True))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_exchange_round_stats_are_those_of_its_rounds(pair):
    """The cost model reads an exchange's rounds from numpy over all devices (Exchange.round_stats): each
    round's slab and the axes its moves vary along are what the rounds the JAX backend runs give."""
    src, dst = pair
    step = S.Exchange(dst.dims)
    (ins,) = lower_step(step, src.replace(partial=dst.partial))
    m = src.mesh
    want = tuple((tuple(max(c.size[i] for _, _, c in moves) for i in range(src.rank)),
                  m.varying_axes((s, d) for s, d, _ in moves)) for _, moves in ins.rounds(m))
    assert ins.round_stats(m) == want


@given(type_pairs(max_rank=3, sub_axes=0.3, uneven=True))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_an_exchange_is_priced_no_lower_than_its_lower_bound(pair):
    """blocks.remote_copies counts, per dim, the copies a device gets from others (what listing them gives),
    and cost.exchange_time_lower_bound, built on it, never exceeds the time of the rounds it runs."""
    src, dst = pair
    src = src.replace(partial=dst.partial)
    step = S.Exchange(dst.dims)
    (ins,) = lower_step(step, src)
    m = src.mesh
    for d in range(m.size):
        want = sum(1 for c in ins.copies(m, d) if c.source != d and math.prod(c.size))
        assert remote_copies(src, step.apply(src), d) == want
    for preset in ("2x8-nodes", "tpu-v4"):
        topo = cost.topology(preset, m)
        assert cost.exchange_time_lower_bound(step, src, topo) <= cost.exchange_time(step, src, topo) * (1 + 1e-12)


@given(type_pairs(max_rank=3, sub_axes=0.3))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_fastest_candidate_is_the_one_with_the_least_time(pair):
    """cost.fastest prices only the candidates whose lower bound may beat the best, and returns what pricing
    all of them would: the least (time, bytes, steps), the first of equals."""
    src, dst = pair
    if src.partial != dst.partial:
        return
    topo = cost.topology("2x8-nodes", src.mesh)
    candidates = [synthesize(src, dst), Plan.from_steps(src, [S.Exchange(dst.dims)]), synthesize(src, dst, topo)]
    want = min(range(3), key=lambda i: (cost.plan_time(candidates[i], topo), candidates[i].bytes_received,
                                        len(candidates[i].steps), i))
    got, seconds = cost.fastest(candidates, topo)
    assert got is candidates[want] and seconds == cost.plan_time(got, topo)
