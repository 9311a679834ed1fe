"""The JAX runtime (redist.jax): reshard equals its input, agrees with the numpy backend, and never uses the host."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import redist
from redist import program as P
from redist.backends import numpy_backend

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as PS  # noqa: E402

import redist.jax as rj  # noqa: E402
from redist.data import poisoned_source, random_array, summands  # noqa: E402
from tests.redist.strategies import meshes, type_pairs  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)", allow_module_level=True)


def jmesh(shape, names, devices=None, **kw):
    devs = np.array(devices if devices is not None else jax.devices()[: math.prod(shape)])
    return jax.sharding.Mesh(devs.reshape(shape), names, **kw)


def placed(a, mesh, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def shards_by_position(y, mesh):
    """Local buffers in redist device order: position in the JAX mesh's device array."""
    by_dev = {s.device: np.asarray(s.data) for s in y.addressable_shards}
    return [by_dev[d] for d in mesh.devices.flat]


def global_array(shape, dtype=np.float32, seed=0):
    return random_array(np.random.default_rng(seed), shape, dtype, -100, 100)


# ---------------------------------------------------------------------- classic cases
CLASSIC = [
    # (mesh shape, names, array shape, src spec, dst spec)
    ((8,), ("x",), (16, 8), PS("x"), PS(None, "x")),                       # 1 axis: transpose of a sharded dim
    ((8,), ("x",), (16,), PS("x"), PS()),                                   # gather
    ((8,), ("x",), (16, 8), PS(), PS(None, "x")),                            # slice
    ((2, 4), ("x", "y"), (8, 8), PS("x", "y"), PS("y", "x")),               # swap two axes across dims
    ((2, 4), ("x", "y"), (16,), PS(("x", "y")), PS(("y", "x"))),            # reorder axes within a dim
    ((2, 4), ("x", "y"), (4,), PS("x"), PS("y")),                           # needs sub-axes
    ((2, 4), ("x", "y"), (8, 4), PS(("x", "y")), PS(None, "y")),            # gather + all-to-all
    ((4, 2), ("x", "y"), (4, 8, 4), PS("y", None, "x"), PS(None, ("x", "y"), None)),  # jax-ml/jax#21562
    ((2, 2, 2), ("x", "y", "z"), (8, 4, 2), PS("x", "y", "z"), PS(("z", "y", "x"))),
    ((2, 2, 2), ("x", "y", "z"), (4, 4), PS(("x", "z"), "y"), PS("y", ("z", "x"))),
    ((2, 2, 2), ("a", "b", "c"), (8,), PS(("a", "b", "c")), PS(("c", "b", "a"))),
    ((2, 2, 2), ("x", "y", "z"), (), PS(), PS()),                            # scalar
    ((1, 8), ("u", "v"), (8, 2), PS("v", "u"), PS(("u", "v"))),              # size-1 axis
    ((2, 4), ("x", "y"), (8, 4, 8, 4), PS("y", "x"), PS(None, None, "x", "y")),  # two moves, one all-to-all
]


@pytest.mark.parametrize("mesh_shape,names,shape,src,dst", CLASSIC)
def test_classic_cases(mesh_shape, names, shape, src, dst):
    mesh = jmesh(mesh_shape, names)
    a = global_array(shape, seed=len(shape))
    x = placed(a, mesh, src)
    target = NamedSharding(mesh, dst)
    with jax.transfer_guard("disallow"):
        y = rj.reshard(x, target)
    assert y.sharding == target
    np.testing.assert_array_equal(np.asarray(y), a)
    # Every device holds exactly its block of the destination.
    t = rj.sharding_type(shape, a.dtype, target)
    for want, got in zip(redist.shard(t, a), shards_by_position(y, mesh)):
        np.testing.assert_array_equal(got, want)


def test_sub_axis_case_uses_sub_axes():
    mesh = jmesh((2, 4), ("x", "y"))
    a = np.arange(4, dtype=np.float32)
    src = rj.sharding_type(a.shape, a.dtype, NamedSharding(mesh, PS("x")))
    dst = rj.sharding_type(a.shape, a.dtype, NamedSharding(mesh, PS("y")))
    tokens = redist.synthesize(src, dst).program.axis_tokens()
    assert any(":" in t for t in tokens), tokens
    refined, names = rj.refine_mesh(mesh, tokens)
    assert refined.devices.flatten().tolist() == mesh.devices.flatten().tolist()
    assert names["y"] == tuple(a for a in refined.axis_names if a.startswith("y"))
    y = rj.reshard(placed(a, mesh, PS("x")), NamedSharding(mesh, PS("y")))
    np.testing.assert_array_equal(np.asarray(y), a)


def test_dtypes_and_unconstrained_and_short_specs():
    mesh = jmesh((2, 4), ("x", "y"))
    for dtype in (np.int32, np.bool_, jnp.bfloat16, np.int8):
        a = global_array((8, 4), dtype)
        y = rj.reshard(placed(a, mesh, PS("y")), NamedSharding(mesh, PS(PS.UNCONSTRAINED, "x")))
        assert y.dtype == a.dtype
        np.testing.assert_array_equal(np.asarray(y), a)
        assert y.sharding == NamedSharding(mesh, PS(None, "x"))  # unconstrained comes back replicated
    y = rj.reshard(placed(a, mesh, PS(("y", "x"))), NamedSharding(mesh, PS(None)))  # short spec: rest replicated
    assert y.sharding == NamedSharding(mesh, PS(None))
    np.testing.assert_array_equal(np.asarray(y), a)


def test_device_order_of_the_mesh_is_respected():
    # The redist mesh of a JAX mesh has its device order: the device at position p is the JAX device
    # devices.flat[p], redist device id = its JAX id here (docs/spec.md §1); a device holds the block of its position.
    devices = list(reversed(jax.devices()[:8]))
    devices[2], devices[5] = devices[5], devices[2]
    mesh = jmesh((2, 4), ("x", "y"), devices=devices)
    a = global_array((8, 4))
    for src, dst in [(PS("x", "y"), PS("y", "x")), (PS("x"), PS(("y", "x"))), (PS(None, "x"), PS("y"))]:
        y = rj.reshard(placed(a, mesh, src), NamedSharding(mesh, dst))
        np.testing.assert_array_equal(np.asarray(y), a)
        t = rj.sharding_type(a.shape, a.dtype, NamedSharding(mesh, dst))
        assert t.mesh.device_ids == tuple(d.id for d in devices)
        by_id = redist.shard(t, a)
        for p, got in enumerate(shards_by_position(y, mesh)):
            np.testing.assert_array_equal(got, by_id[t.mesh.device_ids[p]])


# ---------------------------------------------------------------------- jit, host transfers
def test_execute_under_the_callers_context_mesh():
    """Regression (found by the adversarial probe, proofs/probe): ``execute(plan, shards, backend="jax")`` under the caller's
    ``jax.set_mesh`` raised JAX's ValueError (its shard_map's mesh is not the context mesh)."""
    mesh = redist.Mesh({"x": 2, "y": 4})
    src, dst = redist.ShardingType.parse("f32[8{x}, 8]", mesh), redist.ShardingType.parse("f32[8, 8{y}]", mesh)
    value = global_array((8, 8))
    with jax.set_mesh(jax.make_mesh((2, 4), ("x", "y"), devices=jax.devices()[:8])):
        out = redist.execute(redist.synthesize(src, dst), redist.shard(src, value), backend="jax")
    np.testing.assert_array_equal(redist.unshard(dst, out), value)


def test_traceable_by_jit_with_src():
    mesh = jmesh((4, 2), ("x", "y"))
    a = global_array((4, 8, 4))
    x = placed(a, mesh, PS("y", None, "x"))
    target = NamedSharding(mesh, PS(None, ("x", "y"), None))
    f = jax.jit(lambda v: rj.reshard(v, target, src=PS("y", None, "x")) * 2)
    with jax.transfer_guard("disallow"):
        y = f(x)
    assert y.sharding.is_equivalent_to(target, a.ndim)
    np.testing.assert_array_equal(np.asarray(y), 2 * a)
    # The plan's collectives are what runs: two all-to-alls, no all-gather of the whole array.
    hlo = f.lower(x).compile().as_text()
    assert "all-to-all" in hlo and "all-gather" not in hlo


def test_jit_with_sub_axes():
    mesh = jmesh((2, 4), ("x", "y"))
    a = np.arange(4, dtype=np.float32)
    target = NamedSharding(mesh, PS("y"))
    y = jax.jit(lambda v: rj.reshard(v, target, src=NamedSharding(mesh, PS("x"))))(placed(a, mesh, PS("x")))
    assert y.sharding.is_equivalent_to(target, a.ndim)
    np.testing.assert_array_equal(np.asarray(y), a)


def test_jit_without_src_on_auto_mesh_raises():
    mesh = jmesh((2, 4), ("x", "y"))
    x = placed(np.zeros((8,), np.float32), mesh, PS("x"))
    with pytest.raises(redist.ShardingError, match="src="):
        jax.jit(lambda v: rj.reshard(v, NamedSharding(mesh, PS("y"))))(x)


def test_explicit_axes_eager_and_jit():
    mesh = jmesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    a = global_array((8, 4))
    target = NamedSharding(mesh, PS("y", "x"))
    x = placed(a, mesh, PS("x", "y"))
    with jax.transfer_guard("disallow"):
        y1 = rj.reshard(x, target)
        y2 = jax.jit(lambda v: rj.reshard(v, target))(x)  # the source layout comes from jax.typeof
    for y in (y1, y2):
        assert y.sharding.is_equivalent_to(target, a.ndim)
        np.testing.assert_array_equal(np.asarray(y), a)
    # A plan with sub-axes: the array is restated on the refined mesh and back, with no data moved.
    b = np.arange(4, dtype=np.float32)
    target = NamedSharding(mesh, PS("y"))
    xb = placed(b, mesh, PS("x"))
    with jax.transfer_guard("disallow"):
        for y in (rj.reshard(xb, target), jax.jit(lambda v: rj.reshard(v, target))(xb)):
            assert y.sharding.is_equivalent_to(target, 1)
            np.testing.assert_array_equal(np.asarray(y), b)


# ---------------------------------------------------------------------- errors
def test_errors():
    mesh = jmesh((2, 4), ("x", "y"))
    other = jmesh((4, 2), ("x", "y"))
    x = placed(np.zeros((8, 4), np.float32), mesh, PS("x"))
    E = redist.ShardingError
    with pytest.raises(E, match="NamedSharding"):
        rj.reshard(x, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    with pytest.raises(E, match="NamedSharding"):
        rj.reshard(x, PS("y"))
    with pytest.raises(E, match="under jax.jit.*other devices or axes"):  # eagerly it moves (test_cross_mesh_runtimes)
        jax.jit(lambda: rj.reshard(x, NamedSharding(other, PS("y"))))()
    with pytest.raises(E, match="dim 1"):
        rj.reshard(x, NamedSharding(mesh, PS(None, ("x", "y"))))  # 4 does not divide into 8
    with pytest.raises(E, match="entries"):
        rj.reshard(x, NamedSharding(mesh, PS(None, None, "y")))  # too many spec entries
    with pytest.raises(E):
        rj.reshard(x, NamedSharding(mesh, PS("y")), src=jax.sharding.SingleDeviceSharding(jax.devices()[0]))


# ---------------------------------------------------------------------- agreement with the numpy backend
MESH_SHAPES = [(8,), (2, 4), (4, 2), (2, 4), (4, 2), (1, 8), (2, 2, 2), (2, 1, 4), (4, 2, 1)]


@st.composite
def cases(draw):
    shape_m = draw(st.sampled_from(MESH_SHAPES))
    names = ("x", "y", "z")[: len(shape_m)]
    mesh = redist.Mesh(dict(zip(names, shape_m)))
    rank = draw(st.sampled_from([0, 1, 1, 2, 2, 2, 3, 3]))

    def layout():
        dims = [[] for _ in range(rank)]
        for n in draw(st.permutations(names)):
            if rank and draw(st.booleans()):
                dims[draw(st.integers(0, rank - 1))].append(n)
        return dims

    src_dims, dst_dims = layout(), layout()
    shape = []
    for sd, dd in zip(src_dims, dst_dims):
        k = math.lcm(mesh.group_size(tuple(sd)), mesh.group_size(tuple(dd)))
        shape.append(k * draw(st.sampled_from([1, 1, 2])))  # tight sizes make sub-axes needed
    dtype = draw(st.sampled_from(["f32", "i32", "bool", "bf16"]))
    src = redist.ShardingType(mesh, tuple(shape), dtype, tuple(map(tuple, src_dims)))
    dst = redist.ShardingType(mesh, tuple(shape), dtype, tuple(map(tuple, dst_dims)))
    return src, dst, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_agrees_with_numpy_backend(case):
    src, dst, seed = case
    mesh = jmesh(src.mesh.shape, src.mesh.names)
    a = global_array(src.shape, src.np_dtype, seed)
    x = placed(a, mesh, src.partition_spec())
    target = NamedSharding(mesh, dst.partition_spec())
    with jax.transfer_guard("disallow"):
        y = rj.reshard(x, target)
    assert y.sharding == target
    want = redist.execute(redist.synthesize(src, dst), redist.shard(src, a))
    got = [np.asarray(s.data) for s in sorted(y.addressable_shards, key=lambda s: s.device.id)]
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(np.asarray(y), a)


# ---------------------------------------------------------------------- run_program on arbitrary buffers
def test_partial_summands():
    mesh = jmesh((2, 2, 2), ("x", "y", "z"))
    rm = rj.redist_mesh(mesh)
    rng = np.random.default_rng(1)
    for s, d in [("f32[8, 4{y}] partial{x,z}", "f32[8{x}, 4{y}] partial{z}"),
                 ("f32[8, 4{y}] partial{x,z}", "f32[8{z,x}, 4]"),
                 ("i32[4{z}, 8] partial{x}", "i32[4, 8{x,z}]"),
                 ("f32[4{x}, 8] partial{y}", "f32[4{y}, 8{x}]")]:
        src, dst = redist.ShardingType.parse(s, rm), redist.ShardingType.parse(d, rm)
        program = redist.synthesize(src, dst).program
        assert any(isinstance(i, (P.ReduceScatter, P.AllReduce)) for i in program.instructions), program
        shards = [random_array(rng, src.local_shape, src.np_dtype, -50, 50) for _ in range(8)]
        want = numpy_backend.run(program, shards)
        got = rj.run_on_buffers(program, shards, mesh)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)


def test_multi_axis_groups_are_row_major_in_the_listed_order():
    """JAX ranks members of a multi-axis collective row-major over the axis tuple as given (not mesh order),
    which is Mesh.group_index; checked on every instruction kind, with axes listed against mesh order and
    with sub-axes."""
    rng = np.random.default_rng(2)
    cases = [
        ((2, 2, 2), ("x", "y", "z"), (4, 8), [
            P.AllGather(0, ("z", "x")),                 # (16, 8)
            P.Slice(0, ("y", "x", "z")),                # (2, 8)
            P.Reshape((2, 4, 2)),                       # (2, 4, 2)
            P.Transpose((1, 0, 2)),                     # (4, 2, 2)
            P.AllToAll(("z", "x")),                     # (4, 2, 2)
            P.Reshape((8, 2)),                          # (8, 2)
            P.ReduceScatter(0, ("z", "y")),             # (2, 2)
            P.AllReduce(("z", "x")),                    # (2, 2)
            P.CollectivePermute((3, 0, 1, 2, 4, 6, 5, 7)),
        ]),
        ((2, 4), ("x", "y"), (8, 8), [
            P.AllGather(1, ("y:(2)2", "x", "y:(1)2")),  # (8, 64)
            P.Slice(0, ("y:(2)2", "x")),                # (2, 64)
            P.Reshape((2, 4, 16)),                      # (2, 4, 16)
            P.Transpose((1, 0, 2)),                     # (4, 2, 16)
            P.AllToAll(("y:(1)2", "x")),                # (4, 2, 16)
            P.Reshape((8, 16)),                         # (8, 16)
            P.ReduceScatter(1, ("y:(2)2", "y:(1)2")),   # (8, 4)
            P.AllReduce(("x", "y:(2)2")),               # (8, 4)
        ]),
    ]
    for mesh_shape, names, shape0, instructions in cases:
        mesh = jmesh(mesh_shape, names)
        rm = rj.redist_mesh(mesh)
        shapes = [shape0]
        for ins in instructions:
            shapes.append(P.shape_after(ins, shapes[-1], rm))
        program = P.Program(rm, np.dtype(np.int32), tuple(instructions), tuple(shapes))
        shards = [random_array(rng, shape0, np.int32, -50, 50) for _ in range(rm.size)]
        want = numpy_backend.run(program, shards)
        got = rj.run_on_buffers(program, shards, mesh)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(0, 2**16))
def test_execute_on_jax_devices_agrees_with_numpy_for_partial_sources(data, seed):
    src, dst = data.draw(type_pairs(mesh=data.draw(meshes(max_axes=3, max_devices=8)), max_rank=3))
    plan = redist.synthesize(src, dst)
    value = random_array(np.random.default_rng(seed), src.shape, src.np_dtype)
    shards = summands(src, value, np.random.default_rng(seed + 1))
    want = redist.execute(plan, shards)
    got = redist.execute(plan, shards, backend="jax")
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------------- uneven dims: the Exchange instruction

def check_uneven(src, dst, seed):
    """Run the plan on poisoned buffers (integer summands for a partial source) with JAX collectives, under a
    transfer guard: every buffer equals the numpy backend's (NaN padding included), the result unshards to
    the value. Returns the plan."""
    plan = redist.synthesize(src, dst)
    rng = np.random.default_rng(seed)
    value, shards = poisoned_source(src, rng)
    want = redist.execute(plan, shards)
    with jax.transfer_guard("disallow"):
        got = redist.execute(plan, shards, backend="jax")
    for d, (w, g) in enumerate(zip(want, got)):
        assert g.shape == dst.local_shape and g.dtype == dst.np_dtype
        # np.testing does not see bf16 NaNs as equal; array_equal does (and works for ints and bool too)
        assert np.array_equal(g, w, equal_nan=True), f"device {d}: jax {g} != numpy {w}\n{plan.program}"
    np.testing.assert_array_equal(redist.unshard(dst, got), value)
    return plan


UNEVEN = [
    # (mesh, src, dst, whether the program has an Exchange)
    ("x=4", "f32[13{x}, 6]", "f32[13, 6{x}]", True),
    ("x=2,y=2", "f32[7{x,y}]", "f32[7{y,x}]", False),          # same padded shape: a permute of padded blocks
    ("x=4", "f32[5]", "f32[5{x}]", True),
    ("x=4", "f32[5{x}]", "f32[5]", True),
    ("x=2,y=2", "f32[5{x}, 3]", "f32[5{y}, 3{x}]", True),
    ("x=2,y=4", "f32[5{x}, 3] partial{y}", "f32[5{y}, 3{x}]", True),   # a reduced axis
    ("x=2,y=4", "f32[3{x}, 6] partial{y}", "f32[3, 6]", True),
    ("x=2,y=2,z=2", "i32[3{x}, 5{y,z}]", "i32[3{z}, 5{x}]", True),
    ("x=2,y=4", "bool[5{x}, 7{y}]", "bool[5{y}, 7]", True),
    ("x=2,y=4", "bf16[5{x}, 7{y}]", "bf16[5{y,x}, 7]", True),
    ("x=8", "f32[0{x}, 3]", "f32[0, 3{x}]", True),                        # an empty dim
]


@pytest.mark.parametrize("mesh,src,dst,exchange", UNEVEN)
def test_uneven_named_cases(mesh, src, dst, exchange):
    m = redist.Mesh.parse(mesh)
    plan = check_uneven(redist.ShardingType.parse(src, m), redist.ShardingType.parse(dst, m), seed=3)
    assert any(isinstance(i, P.Exchange) for i in plan.program.instructions) == exchange, plan.program


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(["f32", "f32", "i32", "bf16", "bool"]), st.integers(0, 2**16))
def test_uneven_pairs_agree_with_numpy_backend(data, dtype, seed):
    mesh = data.draw(meshes(max_axes=3, max_devices=8))
    src, dst = data.draw(type_pairs(mesh=mesh, max_rank=3, dtype=dtype, uneven=True))
    check_uneven(src, dst, seed)


def test_exchange_programs_by_hand():
    """Exchange instructions that synthesis does not produce: a scalar one (every device copies its own
    element), and one with two copies between one pair, a copy of no elements, a local copy and unwritten
    positions; run under jax.jit (run_on_buffers) and compared with the numpy backend."""
    G = redist.blocks.Segment
    m4 = redist.Mesh.parse("x=4")
    scalar = P.Exchange((), ())
    m2 = redist.Mesh.parse("x=2")
    rows = P.ExchangeDim(("x",), ("x",), (G(0, 1, 0, 0, 2), G(0, 1, 2, 3, 2), G(0, 0, 3, 2, 1),
                                          G(1, 0, 1, 4, 0), G(1, 1, 0, 0, 4)))
    boxes = P.Exchange((5, 4), (rows, P.ExchangeDim((), (), (G(0, 0, 0, 0, 3),))))
    rng = np.random.default_rng(5)
    for mesh, ins, shape0 in [(m4, scalar, ()), (m2, boxes, (4, 3))]:
        program = P.Program(mesh, np.dtype(np.float32), (ins,), (shape0, ins.shape))
        shards = [random_array(rng, shape0, np.float32, 1, 50) for _ in range(mesh.size)]
        want = numpy_backend.run(program, shards)
        with jax.transfer_guard("disallow"):
            got = rj.run_on_buffers(program, shards, jmesh(mesh.shape, mesh.names))
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)
    assert (want[0][:, 3] == 0).all() and (want[0][:, :3] != 0).all()  # positions no copy writes are zero
    np.testing.assert_array_equal(want[0][:, :3], np.concatenate([shards[1][:2], shards[0][3:], shards[1][2:]]))


def test_exchange_runs_as_collective_permutes():
    """f32[13{x}, 6] -> f32[13, 6{x}] on x=4: the compiled program moves pieces point to point (collective
    permutes), with no all-gather or all-to-all."""
    mesh = jmesh((4,), ("x",))
    rm = rj.redist_mesh(mesh)
    program = redist.synthesize(redist.ShardingType.parse("f32[13{x}, 6]", rm),
                                redist.ShardingType.parse("f32[13, 6{x}]", rm)).program
    assert [type(i) for i in program.instructions] == [P.Exchange]
    f = jax.jit(jax.shard_map(lambda b: rj.run_program(program, b[0])[None], mesh=mesh, in_specs=PS("x"),
                              out_specs=PS("x"), check_vma=False))
    hlo = f.lower(jax.ShapeDtypeStruct((4,) + program.shapes[0], jnp.float32)).compile().as_text()
    assert "collective-permute" in hlo and "all-gather" not in hlo and "all-to-all" not in hlo


def test_reshard_rejects_uneven_dims():
    mesh = jmesh((2, 4), ("x", "y"))
    x = placed(np.zeros((8, 6), np.float32), mesh, PS("x"))
    with pytest.raises(redist.ShardingError, match=r"dim 1 \(size 6\) does not divide into its 4 blocks over \{y\}"):
        rj.reshard(x, NamedSharding(mesh, PS(None, "y")))
