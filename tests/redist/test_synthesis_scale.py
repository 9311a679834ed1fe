"""The search cannot blow up: pairs with large search spaces, and the bounds that prune the search.

Work is counted in states generated (deterministic, as the budget is), not seconds: on each pair below a search
that neither meets at a permute nor stops at the fallback's cost runs for seconds to minutes, or gives up."""

import signal

import pytest
from hypothesis import given, settings

import redist
from redist import Mesh, ShardingType, cost, lower_bound_bytes, synthesize
from redist import steps as S
from redist import testing as RT
from redist.synthesis import cases
from redist.synthesis.cases import without_unit_axes
from redist.synthesis.fallback import bound, fallback, fallback_cost, reduction_bound
from redist.synthesis.search import search
from redist.verify import program_bytes
from tests.redist.strategies import type_pairs


def _twos(n: int) -> Mesh:
    return Mesh({f"a{i}": 2 for i in range(n)})


class _Counting:
    """Counts the states that the searches of ``synthesize`` (:func:`redist.synthesis.search.search`) generate
    while installed (``with _Counting() as c``)."""

    def __enter__(self):
        self.inner, self.states = cases.search, 0
        cases.search = self
        cases.searched_plan.cache_clear()
        return self

    def __call__(self, *args, **kw):
        found = self.inner(*args, **kw)
        self.states += found.states
        return found

    def __exit__(self, *exc):
        cases.search = self.inner
        cases.searched_plan.cache_clear()


LARGE_SEARCH_PAIRS = [
    # (mesh, src, dst, step kinds of the plan, most states the searches may generate)
    # Slice the minor half of z, then one permute, at the bound.
    (Mesh({"x": 8, "y": 8, "z": 16}), "f32[128{x,y}]", "f32[128{y,z}]", ["all_slice", "permute"], 1_000),
    # A 2-step plan at the bound, where a search that misses it receives 3x the bound.
    (Mesh({"x": 4, "y": 8, "z": 8}), "f32[64{x,y}]", "f32[64{y,z}]", ["all_slice", "permute"], 1_000),
    # Rank 8 on 16 axes (65,536 devices): no plan of collectives meets the bound, the exchange does.
    (_twos(16), "f32[8{a0,a1},8{a2,a3},8{a4,a5},8{a6,a7},8{a8,a9},8{a10,a11},8{a12,a13},8{a14,a15}]",
     "f32[8{a15,a0,a2},8{a1,a4},8{a3,a5},8{a6},8{a7,a8,a10},8{a9,a12},8{a11},8{a13,a14}]", ["exchange"], 10_000),
    # A rotation of rank 8 on 8 axes: one permute, without a search.
    (_twos(8), "f32[2{a0},2{a1},2{a2},2{a3},2{a4},2{a5},2{a6},2{a7}]",
     "f32[2{a7},2{a0},2{a1},2{a2},2{a3},2{a4},2{a5},2{a6}]", ["permute"], 0),
    # 4,096 devices: slice tp under dp, then one permute, at the bound.
    (Mesh({"dp": 16, "fsdp": 16, "tp": 16}), "f32[256{dp}, 256{fsdp}, 32]", "f32[256{fsdp}, 256{dp,tp}, 32]",
     ["all_slice", "permute"], 1_000),
]


@pytest.mark.parametrize("mesh, a, b, kinds, most", LARGE_SEARCH_PAIRS)
def test_pairs_with_large_search_spaces_get_plans_at_the_bound_from_a_small_search(mesh, a, b, kinds, most):
    src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
    with _Counting() as counted:
        plan = synthesize(src, dst)
    assert plan.src == src and plan.dst == dst
    assert plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)
    assert counted.states <= most, counted.states
    assert [s.kind for s in plan.steps] == kinds, str(plan)
    if mesh.size <= 4096:  # the device-by-device figures
        assert plan.bytes_received == lower_bound_bytes(src, dst), str(plan)
    if mesh.size <= 256:
        assert redist.verify(plan).ok


@given(type_pairs(max_rank=3, uneven=False))
@settings(max_examples=80, deadline=None)
def test_bounds_from_atoms_are_the_device_by_device_figures(pair):
    """The search prunes with two figures it computes from atoms, never enumerating devices: the lower bound
    (:func:`redist.lower_bound_bytes`) and what the fallback plan receives; both × the mesh size."""
    src, dst = (without_unit_axes(t, pair[1].partial) for t in pair)
    scale = src.mesh.size
    if set(src.partial) == set(dst.partial):
        assert bound(src, dst) == lower_bound_bytes(src, dst) * scale
    exact = program_bytes(fallback(src, dst).program)  # device by device, exact (no float rounding)
    assert fallback_cost(src, dst) == exact * scale


@given(type_pairs(max_rank=3, uneven=False))
@settings(max_examples=60, deadline=None)
def test_plans_receive_no_more_than_the_fallback(pair):
    """The searches stop at the fallback's cost: a searched plan never receives more than the exchange plan
    (without reductions: the lower bound, so every plan is at the bound or the exchange)."""
    src, dst = pair
    plan = synthesize(src, dst)
    core_src, core_dst = (without_unit_axes(t, dst.partial) for t in pair)
    assert plan.bytes_received <= fallback(core_src, core_dst).bytes_received
    if set(src.partial) == set(dst.partial):
        assert plan.bytes_received == lower_bound_bytes(src, dst), str(plan)


def _reducing(pair) -> tuple:
    """The pair as the search sees it (unit axes dropped), with the destination keeping no pending axis the
    source lacks, so that it reduces and creates nothing (those are the pairs the search plans)."""
    src, dst = pair
    dst = dst.replace(partial=tuple(a for a in dst.partial if a in src.partial))
    return tuple(without_unit_axes(t, dst.partial) for t in (src, dst))


@given(type_pairs(max_rank=3, uneven=False))
@settings(max_examples=150, deadline=None)
def test_the_reduction_bound_is_below_every_plan_of_the_normal_form(pair):
    """What reducing costs every plan of the normal form (``reduction_bound``) is no more than the cheapest
    plan the searches find when run to the end, over named atoms and over prime ones, nor than the fallback;
    0 where nothing is reduced."""
    src, dst = _reducing(pair)
    bound = reduction_bound(src, dst)
    found = [search(src, dst, refine, max_states=2_000_000) for refine in (False, True)]
    costs = [f.cost for f in found if f.plan is not None]
    assert all(bound <= c for c in costs), (src, dst, bound, costs)
    assert bound <= fallback_cost(src, dst)
    if set(src.partial) == set(dst.partial):
        assert bound == 0


def test_the_reduction_bound_is_met_on_most_reducing_pairs():
    """The bound is tight where it matters: on random reducing pairs, the searches run to the end meet it on
    most of them (so the search over prime atoms is skipped there)."""
    draw, met, reducing = RT.SeededDraw(7), 0, 0
    while reducing < 300:
        mesh = RT.draw_mesh(draw, max_axes=3, max_devices=64)
        src, dst = _reducing(RT.draw_pair(draw, mesh, max_rank=3, partial=1.0))
        if not (src.is_even() and dst.is_even()) or set(src.partial) == set(dst.partial):
            continue
        reducing += 1
        best = min((f.cost for f in (search(src, dst, r, max_states=2_000_000) for r in (False, True))
                    if f.plan is not None), default=None)
        met += best == reduction_bound(src, dst)
    assert met >= 225, met


@given(type_pairs(max_rank=3, uneven=False))
@settings(max_examples=150, deadline=None)
def test_skipping_the_search_over_prime_atoms_at_the_reduction_bound_changes_no_plan(pair):
    """Where the plan over named atoms meets the reduction bound, the search over prime atoms is skipped; run
    anyway (the bound taken as 0), it never gives another plan."""
    src, dst = _reducing(pair)
    cases.searched_plan.cache_clear()
    try:
        plan = cases.searched_plan(src, dst)
        cases.reduction_bound = lambda s, d: 0
        cases.searched_plan.cache_clear()
        assert cases.searched_plan(src, dst).steps == plan.steps
    finally:
        cases.reduction_bound = reduction_bound
        cases.searched_plan.cache_clear()


REDUCING_PAIRS = [
    # (mesh, src, dst, step kinds of the plan): without the reduction bound, the search over prime atoms spends
    # its whole budget of states on each and finds nothing better than the plan over named atoms (and
    # AutomaticPartition prices such pairs on these meshes over and over)
    (Mesh({"batch": 16, "model": 64}), "f32[8,16] partial{model}", "f32[8,16]", ["all_reduce"]),
    (Mesh({"batch": 16, "model": 64}), "f32[8,16] partial{batch,model}", "f32[8,16]", ["all_reduce"]),
    (Mesh({"batch": 16, "model": 64}), "f32[1,1,32] partial{batch,model}", "f32[1,1,32{batch}]",
     ["reduce_scatter", "all_reduce"]),
    (Mesh({"batch": 16, "model": 64}), "f32[8,16,128] partial{batch}", "f32[8,16,128{model}]",
     ["all_slice", "all_reduce"]),
    (Mesh({"dp": 32, "tp": 128}), "bf16[4096,1024] partial{tp}", "bf16[4096{dp},1024]", ["all_slice", "all_reduce"]),
    # a reduction, then a gather of what the destination does not split
    (Mesh({"dp": 8, "fsdp": 16, "tp": 8}), "f32[64{dp,tp},32,8,32] partial{fsdp}", "f32[64{dp},32,8,32]",
     ["all_reduce", "all_gather"]),
]


@pytest.mark.parametrize("mesh, a, b, kinds", REDUCING_PAIRS)
def test_reductions_on_large_meshes_take_a_small_search(mesh, a, b, kinds):
    src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
    with _Counting() as counted:
        plan = synthesize(src, dst)
    assert [s.kind for s in plan.steps] == kinds, str(plan)
    assert counted.states <= 1_000, counted.states  # the budget is 50,000
    core = tuple(without_unit_axes(t, dst.partial) for t in (src, dst))
    assert plan.bytes_received * mesh.size == reduction_bound(*core)


@pytest.mark.parametrize("preset", ["2x8-nodes", "nvlink-8", "tpu-v4"])
@pytest.mark.parametrize("axes, a, b", [
    ({"a0": 1, "a1": 2, "a2": 1, "a3": 8}, "f32[16{a3,a1}, 2{a0}]", "f32[16, 2{a1}]"),
    ({"a0": 3, "a1": 6}, "f32[3{a0}, 1, 12{a1}, 1]", "f32[3, 1, 12{a0}, 1]"),
    ({"a0": 5, "a1": 6, "a2": 2}, "f32[90{a1}, 36{a2}]", "f32[90{a0}, 36{a1,a2}]"),
])
def test_searches_by_modeled_time_end(preset, axes, a, b):
    """A join waiting for suffixes asks for those up to the cost it was queued with, not for its priority
    minus the cost before it: in modeled seconds that difference rounds below the cost, nothing new was
    settled, and the search queued the same join again forever (these pairs hung)."""
    mesh = Mesh(axes)
    src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
    signal.signal(signal.SIGALRM, _hung)
    signal.alarm(60)
    try:
        plan = synthesize(src, dst, topology=preset)
    finally:
        signal.alarm(0)
    assert plan.dst == dst and plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)
    assert cost.plan_time(plan, preset) <= cost.plan_time(synthesize(src, dst), preset)


def _hung(signum, frame):
    raise AssertionError("synthesize(..., topology=) ran for a minute")


def test_gathers_of_size_one_axes_do_not_hide_a_latency():
    """A run of gathers whose first move (read backwards) is a size-1 axis pays its latency: otherwise the search
    by modeled time takes a permute over the slow node axis and a gather (two latencies of it) for one latency,
    where gathering first and then an all-to-all over the fast axis is faster."""
    mesh = Mesh({"a0": 3, "a1": 3, "a2": 1, "a3": 2})
    src, dst = ShardingType.parse("f32[6{a1}, 3{a0}, 2]", mesh), ShardingType.parse("f32[6{a2}, 3{a1}, 2]", mesh)
    topo = cost.topology("2x8-nodes", mesh)
    collectives = redist.Plan.from_steps(src, (S.AllGather(1, ("a0",)), S.AllToAll(0, 1, ("a1",)), S.Permute(dst.dims)))
    assert collectives.dst == dst
    assert cost.plan_time(synthesize(src, dst, topology=topo), topo) <= cost.plan_time(collectives, topo)


@pytest.mark.parametrize("a, b", [
    ("f32[4096{y,x}]", "f32[4096]"),  # the exchange candidate has 4,095 rounds
    ("f32[4096{y,x}, 2, 1, 16]", "f32[4096, 2{y:(1)2}, 1, 16{y:(16)2,y:(2)8}]"),  # the plan without a topology
])                                                                                # is that exchange
def test_exchanges_of_thousands_of_rounds_are_not_listed_to_be_priced(monkeypatch, a, b):
    """With a topology on 64x64, an exchange in which every device receives from thousands of others is priced
    round by round only where its lower bound says it may be the fastest (cost.fastest); the collectives'
    plans beat it here, so it never is, and the plan returned is at least as fast as its lower bound."""
    mesh = Mesh({"x": 64, "y": 64})
    src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
    listed, exchange_time = [], cost.exchange_time

    def listing(step, t, topo):
        listed.append(step)
        return exchange_time(step, t, topo)
    monkeypatch.setattr(cost, "exchange_time", listing)
    topo = cost.topology("tpu-v4", mesh)
    plan = synthesize(src, dst, topology=topo)
    assert plan.dst == dst and plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)
    assert not listed
    exchange = S.Exchange(dst.dims)
    assert cost.plan_time(plan, topo) <= cost.exchange_time_lower_bound(exchange, src, topo)
