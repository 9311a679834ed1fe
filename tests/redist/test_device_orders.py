"""Device orders (docs/spec.md §1): ``Mesh(axes, device_ids)``, reshards between meshes that differ only in
their device order (planned, run on numpy and JAX, proved), claims on another device order refuted. The MPI
counterparts run under mpiexec in tests/redist/test_mpi_backend.py (its worker draws device orders on both sides)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import redist
from redist import Mesh, ShardingError, ShardingType, synthesize, verify
from redist.data import summands, unshard
from redist.testing import SeededDraw, draw_mesh, draw_pair
from redist.types import REDUCTIONS

MESH = Mesh({"x": 2, "y": 2})
REVERSED = MESH.reordered([3, 2, 1, 0])


def test_text_repr_equality_and_hash():
    assert str(REVERSED) == "x=2,y=2,device_ids=[3,2,1,0]"
    assert Mesh.parse(str(REVERSED)) == REVERSED
    assert Mesh.parse(" x = 2 , y = 2 , device_ids = [ 3, 2, 1, 0 ] ") == REVERSED
    assert eval(repr(REVERSED), {"Mesh": Mesh}) == REVERSED
    assert str(MESH.reordered([0, 1, 2, 3])) == "x=2,y=2" and MESH.reordered(None) == MESH
    assert REVERSED != MESH and len({REVERSED, MESH, Mesh.parse("x=2,y=2,device_ids=[3,2,1,0]")}) == 2
    assert REVERSED.device({"x": 0, "y": 0}) == 3 and REVERSED.coords(3) == {"x": 0, "y": 0}


@pytest.mark.parametrize("ids, words", [([0, 1, 2], "4"), ([0, 1, 1, 3], "twice"), ([0, 1, 2, -1], "0 to 2147483646"),
                                        ([0, 1, 2, 2**31 - 1], "out of range"), ("0123", "str"),
                                        ([0, 1, 2, 3.5], "3.5")])
def test_bad_device_ids_raise(ids, words):
    with pytest.raises(ShardingError, match=words):
        Mesh({"x": 2, "y": 2}, device_ids=ids)


def test_other_devices_and_axes_are_other_meshes_not_device_orders():
    """Device ids are any distinct numbers (docs/spec.md §1): ``x=2,y=2`` on devices 0, 1, 2, 4 is a mesh, and
    no device order of the default one; a pair between it and ``x=4`` plans (a transfer, tests/redist/test_cross_mesh.py)
    and only a pair of other shapes is refused."""
    other = MESH.reordered([0, 1, 2, 4])
    assert other.same_axes(MESH) and not other.same_devices(MESH) and not other.is_reordering_of(MESH)
    assert REVERSED.is_reordering_of(MESH)
    assert synthesize(ShardingType.parse("f32[8{x}]", MESH), ShardingType.parse("f32[8{x}]", Mesh({"x": 4}))).dst.mesh \
        == Mesh({"x": 4})
    with pytest.raises(ShardingError, match="shape"):
        synthesize(ShardingType.parse("f32[8{x}]", MESH), ShardingType.parse("f32[4{x}]", Mesh({"x": 4})))


def test_a_change_of_device_order_alone_is_one_permute():
    src = ShardingType.parse("f32[8{x}, 4{y}]", MESH)
    plan = synthesize(src, src.replace(mesh=REVERSED))
    assert [s.kind for s in plan.steps] == ["permute"] and plan.dst.mesh == REVERSED
    assert plan.bytes_received == src.local_bytes  # each device takes the block of another position
    assert verify(plan).ok
    data = json.loads(plan.to_json())
    assert data["mesh"] == "x=2,y=2" and data["dst_mesh"] == str(REVERSED)


def test_a_partial_group_on_the_same_devices_keeps_its_buffers():
    """A destination group made of the devices of a source group (in another rank order) keeps its own buffers,
    rather than taking another group's (128 bytes received for a reversed f32[8, 4] partial{x,y}): any order of
    a group's summands reduces to its value, so nothing moves."""
    src = ShardingType.parse("f32[8, 4] partial{x,y}", MESH)
    for ids in ([3, 2, 1, 0], [1, 0, 3, 2], [2, 3, 0, 1]):
        plan = synthesize(src, src.replace(mesh=MESH.reordered(ids)))
        assert plan.bytes_received == 0 and verify(plan).ok


def _pairs(n: int, seed: int):
    """Random pairs, sources on meshes in random device orders and destinations on other orders."""
    draw = SeededDraw(f"device orders:{seed}")
    out = []
    while len(out) < n:
        mesh = draw_mesh(draw, max_devices=8, min_devices=2, device_order=0.5)
        src, dst = draw_pair(draw, mesh, partial=0.4, sub_axes=0.25, reductions=REDUCTIONS, reorder=1.0, uneven=0.2)
        if src.mesh != dst.mesh:
            out.append((src, dst))
    return out


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_reshards_between_device_orders_run_and_are_proved(backend):
    if backend == "jax":
        pytest.importorskip("jax")
    for i, (src, dst) in enumerate(_pairs(30 if backend == "numpy" else 10, 0)):
        plan = synthesize(src, dst)
        rng = np.random.default_rng(i)
        value = rng.integers(-4, 5, size=src.shape).astype(src.np_dtype)
        out = redist.execute(plan, summands(src, value, rng), backend=backend)
        np.testing.assert_array_equal(unshard(dst, out), value, err_msg=f"{src} -> {dst}")
        if backend == "numpy":
            assert verify(plan).ok, (str(src), str(dst))


def test_claim_on_another_device_order_is_refuted_with_a_real_counterexample():
    src = ShardingType.parse("f32[8{x}, 4{y}]", MESH)
    plan = synthesize(src, src)
    claim = src.replace(mesh=REVERSED)
    v = verify(plan, claim)
    assert v.status == "refuted" and "device" in v.reason
    cx = v.counterexample
    d = cx["device"]
    # The device sits at another position on the claim's mesh: it holds another block than the claim says.
    assert cx["holds"]["coords"] == MESH.coords(d) and cx["expected"]["coords"] == REVERSED.coords(d)
    assert MESH.coords(d) != REVERSED.coords(d)


def test_jax_reshard_between_two_device_orders_of_one_jax_mesh():
    """``redist.jax.reshard`` from an array on ``jax.make_mesh``'s order to a hand-made mesh of the same
    devices reversed: every device ends with the block of its position on the target mesh; under
    ``jax.jit`` it raises (JAX compiles for one device order)."""
    jax = pytest.importorskip("jax")
    from jax.sharding import NamedSharding, PartitionSpec as PS

    import redist.jax as rj

    a = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    made = jax.make_mesh((2, 4), ("x", "y"), devices=jax.devices()[:8])
    flipped = jax.sharding.Mesh(np.array(list(made.devices.flat)[::-1]).reshape(2, 4), ("x", "y"))
    x = jax.device_put(a, NamedSharding(made, PS("x", "y")))
    target = NamedSharding(flipped, PS("y", "x"))
    y = rj.reshard(x, target)
    assert y.sharding == target
    np.testing.assert_array_equal(np.asarray(y), a)
    for s in y.addressable_shards:
        np.testing.assert_array_equal(np.asarray(s.data), a[s.index])
    with pytest.raises(ShardingError, match="device order"):  # src= given: make_mesh's axes are Auto on JAX 0.8
        jax.jit(lambda v: rj.reshard(v, target, src=x.sharding))(x)


def test_a_device_order_hashes_once_and_pickles_without_its_hash():
    """A reordered mesh is hashed on every lookup of a type (redist.mpi.reshard's per call): its order keeps its
    hash, equal to a plain tuple's, and a pickled mesh carries only the ids; the copy equals the mesh and
    hashes alike."""
    import pickle

    ids = list(range(64))[::-1]
    mesh = Mesh({"x": 8, "y": 8}, device_ids=ids)
    assert hash(mesh._device_ids) == hash(tuple(ids)) and mesh._device_ids == tuple(ids)
    hash(mesh)
    copy = pickle.loads(pickle.dumps(mesh))
    assert copy._device_ids.__dict__ == {}
    assert copy == mesh and hash(copy) == hash(mesh) and type(copy._device_ids) is type(mesh._device_ids)
    assert Mesh({"x": 8, "y": 8}, device_ids=range(64))._device_ids is None  # the default order holds no table
