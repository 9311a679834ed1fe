"""The cost model (redist.cost), the reading of XLA's HLO (redist.hlo) and the XLA baseline (redist.xla_baseline)."""

import math

import pytest

import redist
from redist import cost
from redist import steps as S
from redist import hlo

MESH42 = redist.Mesh({"x": 4, "y": 2})


# ---------------------------------------------------------------------------------------------- replica groups
@pytest.mark.parametrize("attrs, groups", [
    ("channel_id=1, replica_groups={{0,2,4,6},{1,3,5,7}}, dimensions={0}", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("replica_groups={{0,1},{2,3},{4,5},{6,7}}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("replica_groups={}, to_apply=%add", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    ("replica_groups=[2,4]<=[4,2]T(1,0), dimensions={1}", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("replica_groups=[4,2]<=[8], dimensions={1}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("replica_groups=[2,4]<=[2,2,2]T(1,0,2)", ((0, 1, 4, 5), (2, 3, 6, 7))),
    # XLA's mesh-axes form, as JAX 0.10.2 prints it for jax-ml/jax#21562's first all-gather
    ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_2'}, "
     "dimensions={2}", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_0'}",
     ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("replica_groups=mesh['a'=2,'b'=4] {'b'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("replica_groups=mesh['a'=2,'b'=4] {'b':(2)2}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("replica_groups=mesh['a'=2,'b'=4] {'b':(1)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
    ("replica_groups=mesh['a'=2,'b'=4] {'b', 'a'}", ((0, 4, 1, 5, 2, 6, 3, 7),)),
])
def test_replica_group_forms(attrs, groups):
    assert hlo.parse_replica_groups(attrs, 8) == groups


def test_iota_and_explicit_forms_agree():
    explicit = "replica_groups={{0,1,4,5},{2,3,6,7}}"
    iota = "replica_groups=[2,4]<=[2,2,2]T(1,0,2)"
    assert hlo.parse_replica_groups(explicit, 8) == hlo.parse_replica_groups(iota, 8)


@pytest.mark.parametrize("groups, axes", [
    (((0, 2, 4, 6), (1, 3, 5, 7)), ("x",)),
    (((0, 1), (2, 3), (4, 5), (6, 7)), ("y",)),
    ((tuple(range(8)),), ("x", "y")),
    (((0, 2, 4, 6, 1, 3, 5, 7),), ("y", "x")),          # rank order decides the axis order
    (((0, 2), (1, 3), (4, 6), (5, 7)), ("x:(2)2",)),   # a sub-axis: the minor half of x
    (((0, 4), (1, 5), (2, 6), (3, 7)), ("x:(1)2",)),
    (((0, 1, 4, 5), (2, 3, 6, 7)), ("x:(1)2", "y")),
    (((0, 3), (1, 2), (4, 7), (5, 6)), None),           # not a mesh-axis pattern
    (((0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,)), ()),
])
def test_groups_to_axes(groups, axes):
    assert hlo.groups_to_axes(MESH42, groups) == axes


# ---------------------------------------------------------------------------------------------- HLO snippets
HLO_21562 = """\
HloModule jit__lambda, is_scheduled=true, entry_computation_layout={(f32[8,16,4]{2,1,0})->f32[16,2,16]{2,1,0}}, num_partitions=8

%fused_computation (param_0: f32[16,16,16], param_1.1: u32[]) -> f32[16,2,16] {
  %param_0 = f32[16,16,16]{2,1,0} parameter(0)
  %param_1.1 = u32[] parameter(1)
  %constant.7 = s32[] constant(0)
  %multiply.2 = s32[] multiply(%constant.7, %constant.7)
  ROOT %dynamic-slice.2 = f32[16,2,16]{2,1,0} dynamic-slice(%param_0, %constant.7, %multiply.2, %constant.7), dynamic_slice_sizes={16,2,16}
}

ENTRY %main.0_spmd (param: f32[8,16,4]) -> f32[16,2,16] {
  %param = f32[8,16,4]{2,1,0} parameter(0), sharding={devices=[2,1,4]<=[4,2]T(1,0)}, metadata={op_name="a"}
  %wrapped_copy = f32[8,16,4]{1,0,2} copy(%param)
  %all-gather = f32[8,16,16]{1,0,2} all-gather(%wrapped_copy), channel_id=1, replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_2'}, dimensions={2}, use_global_device_ids=true
  %wrapped_copy.1 = f32[8,16,16]{2,1,0} copy(%all-gather)
  %all-gather.1 = f32[16,16,16]{2,1,0} all-gather(%wrapped_copy.1), channel_id=2, replica_groups=[4,2]<=[8], dimensions={0}, use_global_device_ids=true
  %partition-id = u32[] partition-id()
  ROOT %multiply_dynamic-slice_fusion = f32[16,2,16]{2,1,0} fusion(%all-gather.1, %partition-id), kind=kLoop, calls=%fused_computation
}
"""

HLO_A2A = """\
HloModule jit__lambda, is_scheduled=true, num_partitions=8

ENTRY %main.0_spmd (param: f32[4,8]) -> f32[8,4] {
  %param = f32[4,8]{1,0} parameter(0), sharding={devices=[4,2]<=[8]}
  %a = f32[4,1,4]{2,1,0} slice(%param), slice={[0:4], [0:1], [0:4]}
  %b = f32[4,1,4]{2,1,0} slice(%param), slice={[0:4], [1:2], [0:4]}
  %all-to-all.1 = (f32[4,1,4]{2,1,0}, f32[4,1,4]{2,1,0}) all-to-all(%a, %b), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}
  %gte = f32[4,1,4]{2,1,0} get-tuple-element(%all-to-all.1), index=0
  %rs = f32[2,4]{1,0} reduce-scatter(%param), channel_id=3, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, to_apply=%add
  %ar = f32[4,8]{1,0} all-reduce(%param), channel_id=4, replica_groups={}, to_apply=%add
  ROOT %collective-permute = f32[8,4]{1,0} collective-permute(%gte), channel_id=2, source_target_pairs={{0,0},{2,4},{1,2},{3,6},{4,1},{6,5},{5,3},{7,7}}
}
"""


def test_parse_21562_snippet():
    cs = hlo.parse_hlo(HLO_21562, MESH42)
    assert [c.kind for c in cs] == ["all_gather", "all_gather", "dynamic_slice"]
    assert [c.axes for c in cs] == [("x",), ("y",), None]
    # all-gather over x (k=4) to f32[8,16,16]; over y (k=2) to the full f32[16,16,16]
    assert cs[0].bytes_received == 3 / 4 * 8 * 16 * 16 * 4
    assert cs[1].bytes_received == 1 / 2 * 16 ** 3 * 4
    assert cs[1].result_shape == (16, 16, 16)
    assert cs[2].bytes_received == 0 and cs[2].result_shape == (16, 2, 16)


def test_parse_all_to_all_snippet():
    cs = hlo.parse_hlo(HLO_A2A, MESH42)
    assert [c.kind for c in cs] == ["all_to_all", "reduce_scatter", "all_reduce", "collective_permute"]
    a2a, rs, ar, cp = cs
    assert a2a.axes == ("y",) and a2a.bytes_received == 1 / 2 * 2 * 16 * 4  # tuple: L is the sum
    assert a2a.result_shapes == ((4, 1, 4), (4, 1, 4))
    assert rs.axes == ("x",) and rs.bytes_received == 3 * 8 * 4           # (k-1)/k * L_in = (k-1) * L_out
    assert ar.axes == ("x", "y") and ar.bytes_received == 2 * 7 / 8 * 32 * 4
    assert cp.axes is None and cp.span == ("x", "y") and cp.bytes_received == 32 * 4
    assert cp.device_bytes == (0, 128, 128, 128, 128, 128, 128, 0)       # 0 and 7 only keep their own


def test_bad_replica_groups_raise():
    with pytest.raises(redist.ShardingError, match="replica groups"):
        hlo.parse_replica_groups("replica_groups=mesh[garbage", 8)


# ---------------------------------------------------------------------------------------------- cost model
def test_presets_and_errors():
    mesh = redist.Mesh({"x": 2, "y": 4})
    for name in cost.preset_names():
        topo = cost.topology(name, mesh)
        assert [n for n, _ in topo.links] == ["x", "y"]
    two = cost.topology("2x8-nodes", mesh)
    assert two.link("x").beta < two.link("y").beta and two.link("x").alpha > two.link("y").alpha
    assert two.link("x:(1)2") == two.link("x")  # sub-axes use their axis's link
    with pytest.raises(redist.ShardingError, match="unknown topology preset 'dgx'.*tpu-v4"):
        cost.topology("dgx", mesh)
    with pytest.raises(ValueError):
        cost.topology("nvlink-8", "x=2")
    with pytest.raises(redist.ShardingError, match="no link for mesh axis 'z'"):
        two.link("z")
    with pytest.raises(redist.ShardingError, match="beta"):
        cost.Link(1e-6, 0.0)


def test_more_bytes_cost_more():
    mesh = redist.Mesh({"x": 8})
    topo = cost.topology("nvlink-8", mesh)
    times = [cost.collective_time(("x",), b, topo) for b in (1, 1e3, 1e6, 1e9)]
    assert times == sorted(times) and len(set(times)) == 4
    assert cost.collective_time(("x",), 0, topo) == 0.0
    small = redist.synthesize(redist.ShardingType.parse("f32[64{x}]", mesh), redist.ShardingType.parse("f32[64]", mesh))
    big = redist.synthesize(redist.ShardingType.parse("f32[6400{x}]", mesh),
                            redist.ShardingType.parse("f32[6400]", mesh))
    assert cost.plan_time(big, topo) > cost.plan_time(small, topo) > 0


def test_slower_cross_node_axis_costs_more():
    mesh = redist.Mesh({"x": 2, "y": 4})
    topo = cost.topology("2x8-nodes", mesh)
    t = redist.ShardingType.parse("f32[1024{x}, 1024{y}]", mesh)
    over_x = redist.synthesize(t, redist.ShardingType.parse("f32[1024, 1024{y}]", mesh))
    over_y = redist.synthesize(t, redist.ShardingType.parse("f32[1024{x}, 1024]", mesh))
    # gathering y moves 3x the bytes of gathering x, yet the one over the node axis x costs more
    assert over_y.bytes_received > over_x.bytes_received
    assert cost.plan_time(over_x, topo) > cost.plan_time(over_y, topo)
    uniform = cost.topology("nvlink-8", mesh)
    assert cost.plan_time(over_x, uniform) < cost.plan_time(over_y, uniform)


def test_step_time_matches_formula_and_permute_axes():
    mesh = redist.Mesh({"x": 2, "y": 4})
    topo = cost.topology("2x8-nodes", mesh)
    t = redist.ShardingType.parse("f32[64{x}, 64]", mesh)
    step = S.AllToAll(0, 1, ("x",))
    L = t.local_bytes
    link = topo.link("x")
    assert math.isclose(cost.step_time(step, t, topo), link.alpha + 0.5 * L / link.beta)
    assert cost.step_time(S.AllSlice(1, ("y",)), t, topo) == 0.0
    # swapping x and y:(1)2 in dim 0 moves data along both x and y: priced at the slower link (x)
    p = redist.ShardingType.parse("f32[64{y:(1)2}, 64]", mesh)
    perm = S.Permute((("x",), ()))
    assert cost.step_axes(perm, p) == ("x", "y")
    assert math.isclose(cost.step_time(perm, p, topo), link.alpha + p.local_bytes / link.beta)


def test_records_priced_like_plans():
    """An XLA record with the same kind, axes and bytes as a plan step costs the same."""
    mesh = redist.Mesh({"x": 8})
    topo = cost.topology("tpu-v4", mesh)
    src, dst = redist.ShardingType.parse("f32[64{x}, 8]", mesh), redist.ShardingType.parse("f32[64, 8]", mesh)
    plan = redist.synthesize(src, dst)
    rec = hlo.Collective("all_gather", ("x",), ("x",), float(plan.bytes_received), ((64, 8),), "f32")
    assert math.isclose(cost.records_time([rec], topo), cost.plan_time(plan, topo))


# ---------------------------------------------------------------------------------------------- compiled (JAX)
def _jax8():
    """:mod:`redist.xla_baseline`, which needs JAX; the test is skipped without JAX or 8 JAX devices."""
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)")
    from redist import xla_baseline

    return xla_baseline


def test_xla_21562_falls_back_to_gather_then_slice():
    xb = _jax8()
    src = redist.ShardingType.parse("f32[16{y}, 16, 16{x}]", MESH42)
    dst = redist.ShardingType.parse("f32[16, 16{x,y}, 16]", MESH42)
    xla = xb.compile_xla(src, dst)
    kinds = [c.kind for c in xla.collectives]
    assert kinds.count("all_gather") == 2 and kinds[-1] == "dynamic_slice"
    assert [c.result_shape for c in xla.collectives if c.kind == "all_gather"][-1] == (16, 16, 16)
    assert {c.axes for c in xla.collectives if c.kind == "all_gather"} == {("x",), ("y",)}
    assert xla.bytes_received == (4096 - 512) * 4  # everything but its own shard, as in the research note
    ours = xb.compile_redist(src, dst)
    plan = redist.synthesize(src, dst)
    assert ours.bytes_received == plan.bytes_received < xla.bytes_received
    assert ours.memory.temp_plus_output < xla.memory.temp_plus_output


def test_xla_simple_all_to_all():
    xb = _jax8()
    mesh = redist.Mesh({"x": 8})
    src, dst = redist.ShardingType.parse("f32[64{x}, 16]", mesh), redist.ShardingType.parse("f32[64, 16{x}]", mesh)
    xla = xb.compile_xla(src, dst)
    comm = xla.communicating
    assert [(c.kind, c.axes) for c in comm] == [("all_to_all", ("x",))]
    assert xla.bytes_received == 7 / 8 * src.local_bytes == redist.synthesize(src, dst).bytes_received
    assert xla.memory.argument == src.local_bytes
