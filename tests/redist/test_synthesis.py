"""Plan synthesis and the numpy backend: correctness, the memory bound, bytes against the lower bound."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import redist
from redist import Mesh, ShardingError, ShardingType, lower_bound_bytes, synthesize
from redist.blocks import permute_groups
from redist.program import CoordinateMap
from redist.steps import AllGather, AllSlice, AllToAll, Permute
from redist.data import poison_padding, poisoned_source, random_array, summands
from tests.redist.strategies import layouts, type_pairs


def _run_and_check(src, dst, seed=0):
    plan = synthesize(src, dst)
    value = random_array(np.random.default_rng(seed), src.shape, src.np_dtype, -50, 50)
    shards = summands(src, value, np.random.default_rng(seed + 1))
    assert np.array_equal(redist.unshard(src, shards), value)
    out = redist.execute(plan, shards)
    if dst.partial:
        assert np.array_equal(redist.unshard(dst, out), value)
        for d, (x, shape) in enumerate(zip(out, [dst.local_shape] * len(out))):
            assert x.shape == shape, d
    else:
        expected = redist.shard(dst, value)
        for d in range(src.mesh.size):
            assert np.array_equal(out[d], expected[d]), f"device {d} of {plan}"
    return plan


@given(type_pairs(), st.integers(0, 2**16))
@settings(max_examples=300, deadline=None)
def test_plans_are_correct_and_memory_bounded(pair, seed):
    src, dst = pair
    plan = _run_and_check(src, dst, seed)
    assert plan.types[0] == src and plan.types[-1] == dst
    assert len(plan.types) == len(plan.steps) + 1
    assert plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)
    assert plan.bytes_received >= lower_bound_bytes(src, dst)
    for step, t, t_next in zip(plan.steps, plan.types, plan.types[1:]):
        assert step.apply(t) == t_next


@given(type_pairs(partial=False))
@settings(max_examples=200, deadline=None)
def test_normal_form_sizes_fall_then_rise(pair):
    sizes = [t.local_bytes for t in synthesize(*pair).types]
    low = sizes.index(min(sizes))
    assert all(a >= b for a, b in zip(sizes[:low], sizes[1:low + 1]))
    assert all(a <= b for a, b in zip(sizes[low:], sizes[low + 1:]))


MESH = Mesh({"x": 2, "y": 4})
M3 = Mesh({"x": 2, "y": 2, "z": 2})
M_ODD = Mesh({"x": 3, "y": 5})

CLASSIC = [
    # (mesh, src, dst, expected step kinds)
    (MESH, "f32[16{x}, 16]", "f32[16, 16{x}]", ["all_to_all"]),
    (MESH, "f32[16{x,y}, 16]", "f32[16, 16{x,y}]", ["all_to_all"]),
    (MESH, "f32[16{y}, 16{x}]", "f32[16, 16{x,y}]", ["all_to_all"]),
    (MESH, "f32[16{x}, 16{y}]", "f32[16, 16]", ["all_gather", "all_gather"]),
    (MESH, "f32[16{x,y}, 16]", "f32[16, 16]", ["all_gather"]),
    (MESH, "f32[16, 16]", "f32[16{y}, 16{x}]", ["all_slice", "all_slice"]),
    (MESH, "f32[16{x,y}]", "f32[16{y,x}]", ["permute"]),
    (M3, "f32[8{x,y,z}]", "f32[8{z,y,x}]", ["permute"]),
    (M3, "f32[8{x}, 8{y}, 8{z}]", "f32[8{z}, 8{x}, 8{y}]", None),
    (M_ODD, "f32[15{x}, 15]", "f32[15, 15{x}]", ["all_to_all"]),
    (M_ODD, "f32[15{x,y}, 4]", "f32[15, 4]", ["all_gather"]),
    (M_ODD, "f32[15, 15]", "f32[15{y}, 15{x}]", ["all_slice", "all_slice"]),
    (Mesh({"x": 6}), "f32[12{x}, 6]", "f32[12, 6{x}]", ["all_to_all"]),
    (MESH, "f32[16, 16] partial{x}", "f32[16{x}, 16]", ["reduce_scatter"]),
    (MESH, "f32[16, 16] partial{x}", "f32[16, 16]", ["all_reduce"]),
    (MESH, "f32[8{y}, 4{x}, 8, 4]", "f32[8, 4, 8{x}, 4{y}]", ["all_to_all"]),  # two moves at once
    # runs of moves on one dim are one step
    (MESH, "f32[16, 16]", "f32[16{x,y}, 16]", ["all_slice"]),
    (MESH, "f32[16, 16] partial{x,y}", "f32[16{x,y}, 16]", ["reduce_scatter"]),
    (M3, "f32[8{x,y}, 8{z}]", "f32[8, 8]", ["all_gather", "all_gather"]),
]


@pytest.mark.parametrize("mesh, a, b, kinds", CLASSIC)
def test_classic_cases_meet_the_lower_bound(mesh, a, b, kinds):
    src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
    plan = _run_and_check(src, dst)
    if kinds is not None:
        assert [s.kind for s in plan.steps] == kinds, str(plan)
    if not src.partial:
        assert plan.bytes_received == lower_bound_bytes(src, dst), str(plan)


@given(st.data())
@settings(max_examples=100, deadline=None)
def test_single_moves_meet_the_lower_bound(data):
    """Moving a sharded dim to another dim, gathering, slicing and reordering within a dim: each is one
    step whose bytes equal the lower bound."""
    src, _ = data.draw(type_pairs(partial=False))
    mesh = src.mesh
    rank = src.rank
    moves = []
    for i, d in enumerate(src.dims):
        for m in range(1, len(d) + 1):
            moves.append(AllGather(i, d[len(d) - m:]))
            moves += [AllToAll(i, j, d[len(d) - m:]) for j in range(rank) if j != i]
        if len(d) >= 2:
            moves.append(Permute(src.dims[:i] + (tuple(reversed(d)),) + src.dims[i + 1:]))
    unused = [a for a in mesh.names if a not in src.used_axes]
    moves += [AllSlice(i, (a,)) for i in range(rank) for a in unused]
    fitting = []
    for move in moves:
        try:
            fitting.append((move, move.apply(src)))
        except ShardingError:
            pass
    if not fitting:
        return
    move, dst = data.draw(st.sampled_from(fitting))
    plan = synthesize(src, dst)
    assert plan.bytes_received == lower_bound_bytes(src, dst), f"{move}: {plan}"


@given(type_pairs())
@settings(max_examples=300, deadline=None)
def test_plans_that_reduce_and_create_nothing_receive_exactly_the_lower_bound(pair):
    """Between even types on one device order with the same pending axes, the plan receives exactly the lower
    bound: the search's plan where it reaches it, else the one exchange (partir_core prices such pairs at the
    bound without planning them). The destination keeps the source's pending axes (out of its dims)."""
    src, dst = pair
    kept = src.partial
    dst = dst.replace(dims=tuple(tuple(a for a in d if not any(a.overlaps(p) for p in kept)) for d in dst.dims),
                      partial=kept)
    assert src.is_even() and dst.is_even()
    assert synthesize(src, dst).bytes_received == lower_bound_bytes(src, dst), (src, dst)


def test_jax_issue_21562_beats_full_rematerialization():
    """P('y', None, 'x') -> P(None, ('x', 'y'), None) on a 4x2 mesh: XLA gathers the whole array twice."""
    mesh = Mesh({"x": 4, "y": 2})
    src = ShardingType.parse("f32[16{y}, 16, 16{x}]", mesh)
    dst = ShardingType.parse("f32[16, 16{x,y}, 16]", mesh)
    plan = _run_and_check(src, dst)
    full = src.global_bytes
    assert plan.peak_bytes == src.local_bytes
    assert plan.bytes_received < full / 4
    # One all-to-all moves x from dim 2 and y from dim 0 into dim 1 at once: exactly the lower bound.
    assert [s.kind for s in plan.steps] == ["all_to_all"]
    assert plan.bytes_received == lower_bound_bytes(src, dst)


def test_sub_axes_make_impossible_swaps_possible():
    """x=2, y=4, f32[4{x}] -> f32[4{y}]: without splitting y the middle type would not divide."""
    src = ShardingType.parse("f32[4{x}]", MESH)
    dst = ShardingType.parse("f32[4{y}]", MESH)
    plan = _run_and_check(src, dst)
    assert any(":" in str(s) for s in plan.steps), str(plan)
    assert plan.peak_bytes == src.local_bytes
    assert plan.bytes_received == lower_bound_bytes(src, dst)


def test_scalars_and_identity():
    for text in ["f32[]", "f32[] partial{x}", "f32[8{x}, 4{y}]"]:
        t = ShardingType.parse(text, MESH)
        plan = synthesize(t, t)
        assert plan.steps == () and plan.bytes_received == 0
    plan = _run_and_check(ShardingType.parse("f32[] partial{x,y}", MESH), ShardingType.parse("f32[]", MESH))
    assert [s.kind for s in plan.steps] == ["all_reduce"]


def test_permute_sources_is_a_permutation():
    src = ShardingType.parse("f32[8{x}, 8] partial{y}", MESH)
    for dims in [((), ("x",)), (("x",), ())]:
        dst = src.replace(dims=dims)
        if dst.local_shape != src.local_shape:
            continue
        sources = CoordinateMap(permute_groups(src, dst)).sources(MESH, np.arange(MESH.size)).tolist()
        assert sorted(sources) == list(range(MESH.size))
        for d, s in enumerate(sources):
            # partial coordinates never change hands
            assert MESH.coords(d)["y"] == MESH.coords(s)["y"]


@pytest.mark.parametrize(
    "a, b, match",
    [
        ("f32[8{x}]", "f32[4{x}]", "shape"),
        ("f32[8{x}]", "i32[8{x}]", "dtype"),
        ("f32[6{z:(1)2}]", "f32[6{z:(1)3}]", "incompatible ways"),
    ],
)
def test_mismatched_pairs_raise(a, b, match):
    mesh = Mesh({"x": 2, "y": 4, "z": 6})
    with pytest.raises(ShardingError, match=match):
        synthesize(ShardingType.parse(a, mesh), ShardingType.parse(b, mesh))
    with pytest.raises(ShardingError, match=match):
        lower_bound_bytes(ShardingType.parse(a, mesh), ShardingType.parse(b, mesh))


def test_other_meshes_plan_by_a_transfer_and_a_non_type_raises():
    """Types on meshes of other axes are a valid pair (docs/spec.md §3: a transfer moves the array); what is no
    type is refused."""
    a = ShardingType.parse("f32[8{x}]", MESH)
    b = ShardingType.parse("f32[8{x}]", Mesh({"x": 2, "y": 2}))
    assert [s.kind for s in synthesize(a, b).steps] == ["transfer"]
    with pytest.raises(ShardingError, match="ShardingType"):
        synthesize(a, "f32[8]")


@pytest.mark.parametrize(
    "step, text, match",
    [
        (AllGather(0, ("x",)), "f32[8{x,y}]", "not the minor end of dim 0"),
        (AllGather(1, ("x",)), "f32[8{x}]", "has no dim 1"),
        (AllSlice(0, ("x",)), "f32[8{x}]", "used twice"),
        (AllSlice(0, ("y",)), "f32[2{x}]", "does not divide"),
        (AllToAll(0, 0, ("x",)), "f32[8{x}]", "within one dim"),
        (Permute(((), ("x",))), "f32[8{x}, 4]", "changes the local shape"),
    ],
)
def test_ill_typed_steps_name_the_step_and_the_type(step, text, match):
    t = ShardingType.parse(text, MESH)
    with pytest.raises(ShardingError, match=match) as info:
        step.apply(t)
    assert str(step) in str(info.value) or "dim" in str(info.value)


def test_execute_rejects_bad_shards_and_backends():
    t = ShardingType.parse("f32[8{x}]", MESH)
    plan = synthesize(t, ShardingType.parse("f32[8]", MESH))
    with pytest.raises(ShardingError, match="expected 8 shards"):
        redist.execute(plan, [np.zeros(4, np.float32)] * 3)
    with pytest.raises(ShardingError, match="has shape"):
        redist.execute(plan, [np.zeros(3, np.float32)] * 8)
    with pytest.raises(ShardingError, match="unknown backend"):
        redist.execute(plan, redist.shard(t, np.zeros(8, np.float32)), backend="tpu")
    with pytest.raises(ShardingError, match="partial"):
        redist.shard(ShardingType.parse("f32[8] partial{x}", MESH), np.zeros(8))


def test_unshard_rejects_disagreeing_replicas():
    t = ShardingType.parse("f32[8{x}]", MESH)
    shards = redist.shard(t, np.arange(8, dtype=np.float32))
    shards[1] = shards[1] + 1  # device 1 is a replica of device 0's block
    with pytest.raises(ShardingError, match="disagree"):
        redist.unshard(t, shards)


def test_plan_text_and_json():
    src = ShardingType.parse("f32[16{x}, 16]", MESH)
    plan = synthesize(src, ShardingType.parse("f32[16, 16{x}]", MESH))
    text = str(plan)
    assert "all_to_all(dim 0 -> dim 1, {x})" in text and "f32[16, 16{x}]" in text
    import json

    data = json.loads(plan.to_json())
    assert data["steps"][0]["kind"] == "all_to_all"
    assert data["bytes_received"] == plan.bytes_received == math.prod((8, 16)) * 4 // 2


# ---------------------------------------------------------------------------- uneven dims (XLA's padding rule)
# The class of bug to catch (PyTorch DTensor, uneven nested shards): a plan that treats the blocks of an
# uneven dim as if they nested, so that a device ends up with another device's elements or with padding
# where data belongs, while every shape looks right. The properties below poison every padding position
# of the source, then demand the exact destination block on every device (not just a global array that
# unshards right), the memory bound in padded bytes, and bytes at the lower bound for point-to-point plans.


def _run_uneven(src, dst, seed=0):
    plan = synthesize(src, dst)
    value, bufs = poisoned_source(src, np.random.default_rng(seed), low=-50, high=50)
    out = redist.execute(plan, bufs)
    assert all(x.shape == dst.local_shape for x in out)
    if dst.partial:
        assert np.array_equal(redist.unshard(dst, out), value), str(plan)
    else:
        want = redist.shard(dst, value)
        for d in range(src.mesh.size):
            box = dst.data_box(d)
            assert np.array_equal(out[d][box], want[d][box]), f"device {d} of {plan}"
    return plan


@given(type_pairs(uneven=True, max_rank=3), st.integers(0, 2**16))
@settings(max_examples=300, deadline=None)
def test_uneven_plans_put_every_element_where_the_type_says(pair, seed):
    src, dst = pair
    plan = _run_uneven(src, dst, seed)
    assert plan.types[0] == src and plan.types[-1] == dst
    assert plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)
    bound = lower_bound_bytes(src, dst)
    assert plan.bytes_received >= bound
    if any(s.kind == "exchange" for s in plan.steps) and set(src.partial) == set(dst.partial):
        assert plan.bytes_received == bound, str(plan)


@given(st.data())
@settings(max_examples=100, deadline=None)
def test_uneven_plans_compose(data):
    """src -> mid -> dst in two plans holds the same blocks as src -> dst in one: no hop may leave a
    layout that only looks like its type."""
    src, mid = data.draw(type_pairs(max_rank=2, partial=False, uneven=True))
    dst = src.replace(dims=data.draw(layouts(src.mesh, src.rank, partial=False))[0])
    value = np.arange(math.prod(src.shape), dtype=np.float32).reshape(src.shape)
    bufs = poison_padding(src, redist.shard(src, value))
    two = redist.execute(synthesize(mid, dst), redist.execute(synthesize(src, mid), bufs))
    one = redist.execute(synthesize(src, dst), bufs)
    for d in range(src.mesh.size):
        box = dst.data_box(d)
        assert np.array_equal(two[d][box], one[d][box])
        assert np.array_equal(one[d][box], redist.shard(dst, value)[d][box])


UNEVEN = [
    # (mesh, src, dst, expected step kinds)
    (MESH, "f32[50257{y}, 6]", "f32[50257, 6{y}]", ["exchange"]),  # a vocabulary over 4 devices
    (MESH, "f32[13{x,y}]", "f32[13{y,x}]", ["pad", "permute", "unpad"]),  # same padded shape: collectives
    (MESH, "f32[7{x}, 8{y}]", "f32[7{x}, 8]", ["pad", "all_gather", "unpad"]),  # the even dim moves
    (MESH, "f32[5]", "f32[5{x}]", ["exchange"]),  # receives nothing: the device keeps its block
    (MESH, "f32[5{x}]", "f32[5]", ["exchange"]),
    (MESH, "f32[5{x}]", "f32[5{x,y}]", ["exchange"]),  # the nested split that does not nest
    (MESH, "f32[5{x,y}]", "f32[5{x}]", ["exchange"]),
    (MESH, "f32[9, 3] partial{x}", "f32[9{y}, 3]", ["exchange", "all_reduce"]),  # reduce the smaller buffer
    # y must be reduced first: a reduce-scatter onto the whole dim 0, uneven after it (3, 3, 3, 0 rows),
    # receives 3 x 36 = 108 B, where all_reduce + exchange takes 162 B
    (MESH, "f32[9, 3] partial{y}", "f32[9{y}, 3]", ["reduce_scatter"]),
    (MESH, "f32[9{y}, 3] partial{x}", "f32[9, 3{y}] partial{x}", ["exchange"]),
    # reduce-scatter x onto the whole dim 0 (uneven: 4 and 3 rows), then y onto dim 1: 128 + 64 = 192 B,
    # where reduce-scatter onto the even dim + exchange takes 232 B and all_reduce + exchange 336 B
    (Mesh({"x": 2, "y": 2}), "f32[7, 8] partial{x,y}", "f32[7{x}, 8{y}]", ["reduce_scatter", "reduce_scatter"]),
    # an uneven reduce-scatter: counts (4, 4, 4, 1) rows; 144 B, where all_reduce + exchange takes 234 B
    (Mesh({"x": 4}), "f32[13, 3] partial{x}", "f32[13{x}, 3]", ["reduce_scatter"]),
]


@pytest.mark.parametrize("mesh, a, b, kinds", UNEVEN)
def test_uneven_named_cases(mesh, a, b, kinds):
    src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
    plan = _run_uneven(src, dst)
    assert [s.kind for s in plan.steps] == kinds, str(plan)
    if "exchange" in kinds and set(src.partial) == set(dst.partial):
        assert plan.bytes_received == lower_bound_bytes(src, dst)
    assert redist.verify(plan).ok


@pytest.mark.parametrize(
    "step, text",
    [
        (AllSlice(0, ("y",)), "f32[5{x}]"),  # 5{x} blocks [0,3) [3,5); 5{x,y} blocks do not split them
        (AllGather(0, ("y",)), "f32[5{x,y}]"),
        (AllToAll(0, 1, ("x",)), "f32[5{x}, 4]"),
        (AllToAll(1, 0, ("x",)), "f32[5, 4{x}]"),
    ],
)
def test_collectives_refuse_uneven_blocks(step, text):
    with pytest.raises(ShardingError, match="uneven blocks do not nest"):
        step.apply(ShardingType.parse(text, MESH))


def test_uneven_plans_with_a_topology_are_the_fastest_candidate():
    from redist import cost

    m = Mesh({"x": 2, "y": 2})
    src, dst = ShardingType.parse("f32[7, 8] partial{x,y}", m), ShardingType.parse("f32[7{x}, 8{y}]", m)
    by_bytes = synthesize(src, dst)
    for preset in ("tpu-v4", "cpu-host"):
        plan = synthesize(src, dst, topology=preset)
        topo = cost.topology(preset, m)
        assert cost.plan_time(plan, topo) <= cost.plan_time(by_bytes, topo)
        assert plan.peak_bytes <= max(src.local_bytes, dst.local_bytes) and redist.verify(plan).ok
