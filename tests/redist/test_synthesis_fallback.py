"""Every valid pair gets a plan: the single permute, the search budget, and the fallback when the search
gives up (reduce the sums the destination drops, then one exchange).

Each plan here must be memory-bounded, exact on the numpy backend on every device, and proved by
``redist.verify``. The first pairs below raised ``RuntimeError`` before (no plan within the search budget)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import redist
from redist import Mesh, ShardingType, lower_bound_bytes, synthesize
from redist.data import summands
from redist.synthesis import cases
from redist.synthesis.fallback import fallback
from redist.synthesis.search import MAX_EXACT_STATES, MAX_STATES, search, state_budget
from tests.redist.strategies import type_pairs


def _mesh_of_twos(n: int) -> Mesh:
    return Mesh({f"a{i}": 2 for i in range(n)})


def _check(plan, seed=0):
    """The plan is memory-bounded, ends at its destination and holds the destination's blocks on every
    device (or summands that sum to the value, for a partial destination)."""
    src, dst = plan.src, plan.dst
    assert plan.peak_bytes == max(src.local_bytes, dst.local_bytes), str(plan)
    rng = np.random.default_rng(seed)
    value = rng.integers(-50, 50, size=src.shape).astype(src.np_dtype)
    out = redist.execute(plan, summands(src, value, rng))
    assert all(x.shape == dst.local_shape for x in out)
    if dst.partial:
        assert np.array_equal(redist.unshard(dst, out), value), str(plan)
    else:
        want = redist.shard(dst, value)
        for d in range(src.mesh.size):
            assert np.array_equal(out[d], want[d]), f"device {d} of {plan}"


HARD = [
    # (mesh, src, dst, the plan's step kinds)
    # One permute, but of four swaps, one more than a permute of the search may chain.
    (_mesh_of_twos(5), "f32[4{a0,a1}, 4{a2,a3}, 2{a4}]", "f32[4{a1,a2}, 4{a3,a4}, 2{a0}]", ["permute"]),
    (_mesh_of_twos(5), "f32[2{a0}, 2{a1}, 2{a2}, 2{a3}, 2{a4}]", "f32[2{a4}, 2{a0}, 2{a1}, 2{a2}, 2{a3}]",
     ["permute"]),
    (_mesh_of_twos(7), "f32[16{a1,a5,a6,a2}]", "f32[16{a5,a0,a2,a1}]", ["permute"]),
    # Sub-axes of different factorizations on each side; found by a random search over such pairs.
    (Mesh({"a0": 4, "a1": 6, "a2": 12}), "f32[12{a1,a0:(1)2}]", "f32[12{a0:(1)2,a2:(1)2,a2:(4)3}]", ["permute"]),
    # No plan of collectives meets the lower bound (the best receives 160 B in 4 steps), and a search for one
    # would run out of its budget; the search stops at the bound, and the exchange receives 128 B.
    (_mesh_of_twos(5), "f32[4, 4, 4{a1}, 4{a4,a3}, 2{a2}]", "f32[4{a3}, 4{a1}, 4{a2}, 4{a0}, 2]", ["exchange"]),
    # 176 B, where the fallback (two reduce-scatters and an exchange) receives 224 B.
    (_mesh_of_twos(5), "f32[4{a4}, 2, 1, 4{a2}, 2, 2] partial{a0,a3}", "f32[4{a0}, 2, 1, 4, 2, 2{a1}]",
     ["all_slice", "reduce_scatter", "all_to_all", "reduce_scatter", "all_gather", "all_gather"]),
    # The exchange receives 192 B, the lower bound; the best plan of collectives 352 B.
    (Mesh({"a0": 12, "a1": 8}), "f32[8{a1:(1)2}, 12{a1:(4)2}, 2{a1:(2)2}, 6{a0:(2)3}, 4{a0:(1)2}]",
     "f32[8{a0:(1)2,a1:(1)2}, 12{a0:(6)2,a1:(4)2,a0:(2)3}, 2{a1:(2)2}, 6, 4]", ["exchange"]),
]


@pytest.mark.parametrize("mesh, a, b, kinds", HARD)
def test_hard_pairs_get_a_plan_that_is_bounded_exact_and_proved(mesh, a, b, kinds):
    src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
    plan = synthesize(src, dst)
    assert [s.kind for s in plan.steps] == kinds, str(plan)
    assert plan.src == src and plan.dst == dst
    _check(plan)
    assert redist.verify(plan).ok
    if not src.partial:
        assert plan.bytes_received == lower_bound_bytes(src, dst), str(plan)


def test_five_axis_shift_is_one_permute_at_the_lower_bound():
    """Each dim's axes move on by one: one permute at the bound, where a four-step plan receives 2.5x the
    bound."""
    mesh = Mesh({"dp": 2, "fsdp": 2, "tp": 2, "sp": 2, "ep": 2})
    a, b = "bf16[{}{{dp,fsdp}}, {}{{tp,sp}}, {}{{ep}}]", "bf16[{}{{fsdp,tp}}, {}{{sp,ep}}, {}{{dp}}]"
    src, dst = ShardingType.parse(a.format(4096, 1024, 128), mesh), ShardingType.parse(b.format(4096, 1024, 128), mesh)
    plan = synthesize(src, dst)
    assert plan.bytes_received <= lower_bound_bytes(src, dst) == src.local_bytes, str(plan)
    assert [s.kind for s in plan.steps] == ["permute"]
    small = synthesize(ShardingType.parse(a.format(8, 8, 4), mesh), ShardingType.parse(b.format(8, 8, 4), mesh))
    assert [str(s) for s in small.steps] == [str(s) for s in plan.steps]
    _check(small)
    assert redist.verify(small).ok


@st.composite
def same_block_pairs(draw):
    """Pairs on meshes of size-2 axes with the same number of axes in every dim and the same partial axes:
    the axes are dealt out again, and may swap with unused ones."""
    mesh = _mesh_of_twos(draw(st.integers(1, 6)))
    rank = draw(st.integers(1, 4))
    names = list(draw(st.permutations(mesh.names)))
    partial = tuple(names[:draw(st.integers(0, 1))])
    rest = names[len(partial):]
    counts = [0] * rank
    for _ in range(draw(st.integers(0, len(rest)))):
        counts[draw(st.integers(0, rank - 1))] += 1

    def deal(axes):
        out, i = [], 0
        for c in counts:
            out.append(tuple(axes[i:i + c]))
            i += c
        return tuple(out)

    shape = tuple(2 ** c * draw(st.sampled_from([1, 3])) for c in counts)
    src = ShardingType(mesh, shape, "f32", deal(rest), partial)
    dst = ShardingType(mesh, shape, "f32", deal(draw(st.permutations(rest))), partial)
    return src, dst


@given(same_block_pairs())
@settings(max_examples=80, deadline=None)
def test_same_block_counts_take_one_permute_at_the_lower_bound(pair):
    src, dst = pair
    plan = synthesize(src, dst)
    assert len(plan.steps) == (src != dst) and all(s.kind == "permute" for s in plan.steps), str(plan)
    assert plan.bytes_received == lower_bound_bytes(src, dst), str(plan)
    _check(plan)


@given(type_pairs(max_rank=3), st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_fallback_is_bounded_exact_and_proved_on_any_pair(pair, seed):
    """The plan for when the search gives up, on every kind of pair (odd axis sizes, partial sums kept,
    reduced or scattered): correct by construction, and the exchange receives what each device lacks."""
    src, dst = pair
    plan = fallback(src, dst)
    assert plan.src == src and plan.dst == dst
    _check(plan, seed)
    assert redist.verify(plan).ok, str(plan)
    if set(src.partial) == set(dst.partial):
        assert plan.bytes_received == lower_bound_bytes(src, dst), str(plan)


@st.composite
def pairs_on_many_axes(draw):
    """Pairs on 3-6 axes of size 2, ranks up to 6, dims of 1-3 elements per block."""
    return draw(type_pairs(mesh=_mesh_of_twos(draw(st.integers(3, 6))), max_rank=6))


@given(pairs_on_many_axes(), st.integers(0, 2**16))
@settings(max_examples=30, deadline=None)
def test_synthesize_never_raises_on_many_axes(pair, seed):
    src, dst = pair
    plan = synthesize(src, dst)
    assert plan.src == src and plan.dst == dst
    assert plan.bytes_received >= lower_bound_bytes(src, dst)
    _check(plan, seed)


def test_search_stops_at_its_state_budget():
    """A search gives up after generating its budget of states (and synthesize falls back); a search that
    finds a plan sooner uses less."""
    mesh = _mesh_of_twos(5)
    src = ShardingType.parse("f32[4, 4, 4{a1}, 4{a4,a3}, 2{a2}]", mesh)
    dst = ShardingType.parse("f32[4{a3}, 4{a1}, 4{a2}, 4{a0}, 2]", mesh)
    for states in (0, 1, 1000, 5000):
        found = search(src, dst, refine=False, max_states=states)
        assert found.plan is None and found.states == states
    one_move = src.replace(dims=(("a3",), (), ("a1",), ("a4",), ("a2",)))  # an all_to_all of a3 to dim 0
    found = search(src, one_move, refine=False, max_states=1000)
    assert [s.kind for s in found.plan.steps] == ["all_to_all"] and 0 < found.states <= 1000


@pytest.mark.parametrize("extra_dims, rank_budget", [(0, MAX_STATES), (10, MAX_STATES // 2)])
def test_budget_is_shared_by_the_searches_of_one_call(extra_dims, rank_budget):
    """Both searches of a call together generate at most the budget: the sub-axis search gets what the
    first left, so a call that falls back costs one budget, not two. Above rank 8 the budget shrinks in
    proportion to the rank (here 16: half); without sums to reduce (this pair) it is at most
    ``MAX_EXACT_STATES``, since the searches can only tie with the fallback's exchange."""
    mesh = Mesh({"x": 4, "y": 8, "z": 8})
    pad = ", 2" * extra_dims
    src = ShardingType.parse(f"f32[4{{x:(1)2}}, 2, 2, 8, 2{{x:(2)2}}, 8{pad}]", mesh)
    dst = ShardingType.parse(f"f32[4{{z:(4)2}}, 2, 2{{z:(2)2}}, 8{{y}}, 2, 8{{x}}{pad}]", mesh)
    used = []

    def counting(*args, **kw):
        found = search(*args, **kw)
        used.append(found.states)
        return found

    cases.searched_plan.cache_clear()
    try:
        cases.search = counting
        plan = synthesize(src, dst)
    finally:
        cases.search = search
        cases.searched_plan.cache_clear()
    assert [s.kind for s in plan.steps] == ["exchange"]
    assert state_budget(src) == rank_budget
    assert sum(used) == min(rank_budget, MAX_EXACT_STATES) and len(used) == 2, used


@pytest.mark.parametrize("a, b, steps, reduce_bytes", [
    # x is reduced, z kept: reduce-scatter x onto dim 0 (4 rows per device) receives half a buffer.
    ("f32[12{y}, 4] partial{x,z}", "f32[12{x}, 4{y}] partial{z}",
     ["reduce_scatter(dim 0, {x})", "exchange(to [{x}, {y}])"], 16 * 4 // 2),
    # no dim divides into the x group: all_reduce, which receives the whole buffer (2 (k - 1) / k of it).
    ("f32[3{y}, 1] partial{x,z}", "f32[3, 1] partial{z}", ["all_reduce({x})", "exchange(to [{}, {}])"], 4),
])
def test_fallback_reduces_only_what_the_destination_drops(a, b, steps, reduce_bytes):
    mesh = Mesh({"x": 2, "y": 3, "z": 2})
    src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
    plan = fallback(src, dst)
    assert [str(s) for s in plan.steps] == steps
    assert plan.bytes_received == reduce_bytes + lower_bound_bytes(plan.types[1], dst)
    _check(plan)
    assert redist.verify(plan).ok
