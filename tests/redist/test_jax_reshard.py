"""redist.jax.reshard as a drop-in for jax.device_put: pytrees, PartitionSpec under jax.set_mesh (Auto and
Explicit axes, sub-axis plans eager and jitted), numpy and scalar leaves, donation, one cached program per
call signature, the route between redist's plan and XLA's resharding, logging, grad, and errors."""

import contextlib
import logging
import math
import re

import numpy as np
import pytest

import redist

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import redist.jax as rj  # noqa: E402
from redist import jax_programs, xla_baseline  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)", allow_module_level=True)

AUTO, EXPLICIT = AxisType.Auto, AxisType.Explicit


def jmesh(shape, names, kind=AUTO):
    return jax.sharding.Mesh(np.array(jax.devices()[: math.prod(shape)]).reshape(shape), names,
                             axis_types=(kind,) * len(shape))


def values(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).integers(-50, 50, size=shape).astype(dtype)


@pytest.fixture(autouse=True)
def fresh_cache():
    rj.clear_cache()
    yield
    rj.clear_cache()


@contextlib.contextmanager
def compiles(measuring=False):
    """The names of the functions XLA compiles inside the block (``jax.log_compiles`` messages), leaving out
    the route's measurements of XLA's resharding (``_xla_resharding``) unless ``measuring``."""
    seen = []

    class Handler(logging.Handler):
        def emit(self, record):
            m = re.match(r"Finished XLA compilation of jit\((\w+)\)", record.getMessage())
            if m and (measuring or m.group(1) != "_xla_resharding"):
                seen.append(m.group(1))

    handler = Handler()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            yield seen
    finally:
        logger.removeHandler(handler)


def assert_placed(y, want, sharding):
    assert y.sharding.is_equivalent_to(sharding, y.ndim), (y.sharding, sharding)
    assert y.dtype == want.dtype, (y.dtype, want.dtype)
    np.testing.assert_array_equal(np.asarray(y), want)


# ---------------------------------------------------------------------- pytrees
def layer(mesh):
    """A parameter tree with mixed source layouts and a matching tree of targets (all-to-alls, gathers,
    slices, a scalar, a sub-axis pair), and the host values."""
    host = {"w": values((16, 8)), "b": values((8,), seed=1), "emb": [values((8, 16), jnp.bfloat16, seed=2),
            values((4,), np.int32, seed=3)], "step": values((), np.int32, seed=4)}
    src = {"w": P(("x", "y")), "b": P("y"), "emb": [P(None, "x"), P("x")], "step": P()}
    dst = {"w": P(None, "y"), "b": P(), "emb": [P("y", "x"), P("y")], "step": P()}
    x = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), host, src)
    return host, x, jax.tree.map(lambda s: NamedSharding(mesh, s), dst)


def test_pytree_of_shardings_moves_every_leaf_in_one_program():
    mesh = jmesh((2, 4), ("x", "y"))
    host, x, dst = layer(mesh)
    with jax.transfer_guard("disallow"), compiles() as seen:
        y = rj.reshard(x, dst)
    assert seen == ["moved"], seen  # one program, one dispatch, for every leaf
    jax.tree.map(assert_placed, y, host, dst)
    assert jax.tree.structure(y) == jax.tree.structure(x)
    # A second call on new arrays of the same types compiles nothing.
    _, x2, _ = layer(mesh)
    with jax.transfer_guard("disallow"), compiles(measuring=True) as seen:
        jax.block_until_ready(rj.reshard(x2, dst))
    assert seen == []


def test_one_sharding_or_a_prefix_is_broadcast_over_the_tree():
    mesh = jmesh((2, 4), ("x", "y"))
    host = {"a": values((8, 8)), "b": (values((16,), seed=1), values((8, 4), seed=2))}
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    one = NamedSharding(mesh, P("y"))
    with jax.transfer_guard("disallow"):
        y = rj.reshard(x, one)
        z = rj.reshard(x, {"a": NamedSharding(mesh, P(None, "x")), "b": one})  # a prefix of x
    jax.tree.map(lambda a, h: assert_placed(a, h, one), y, host)
    assert_placed(z["a"], host["a"], NamedSharding(mesh, P(None, "x")))
    jax.tree.map(lambda a, h: assert_placed(a, h, one), z["b"], host["b"])


def test_none_in_the_sharding_tree_leaves_its_leaves_as_device_put_does():
    mesh = jmesh((2, 4), ("x", "y"))
    x = {"a": jax.device_put(values((8,)), NamedSharding(mesh, P("x"))),
         "b": jax.device_put(values((8,)), NamedSharding(mesh, P("y")))}
    y = rj.reshard(x, {"a": NamedSharding(mesh, P("y")), "b": None})
    assert y["b"] is x["b"]
    assert_placed(y["a"], np.asarray(x["a"]), NamedSharding(mesh, P("y")))


def test_the_same_array_at_two_leaves_is_one_input():
    mesh = jmesh((8,), ("x",))
    a = jax.device_put(values((16,)), NamedSharding(mesh, P("x")))
    y = rj.reshard([a, a], [NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))], donate=True)
    assert a.is_deleted()
    assert_placed(y[0], values((16,)), NamedSharding(mesh, P()))
    assert_placed(y[1], values((16,)), NamedSharding(mesh, P("x")))


def test_an_array_already_laid_out_as_the_target_is_returned_as_it_is():
    mesh = jmesh((2, 4), ("x", "y"))
    x = jax.device_put(values((8, 4)), NamedSharding(mesh, P("x")))
    with compiles(measuring=True) as seen:
        assert rj.reshard(x, NamedSharding(mesh, P("x"))) is x
    assert seen == []


def test_empty_arrays_and_scalars_in_a_tree():
    mesh = jmesh((2, 4), ("x", "y"))
    tree = {"empty": jax.device_put(np.zeros((0, 4), np.float32), NamedSharding(mesh, P("x"))),
            "scalar": jax.device_put(np.float32(3), NamedSharding(mesh, P())),
            "full": jax.device_put(values((8, 4)), NamedSharding(mesh, P("x")))}
    y = rj.reshard(tree, {"empty": NamedSharding(mesh, P(None, "y")), "scalar": NamedSharding(mesh, P()),
                          "full": NamedSharding(mesh, P(None, "y"))})
    assert y["empty"].shape == (0, 4) and y["empty"].sharding == NamedSharding(mesh, P(None, "y"))
    assert y["scalar"] is tree["scalar"]
    assert_placed(y["full"], values((8, 4)), NamedSharding(mesh, P(None, "y")))


# ---------------------------------------------------------------------- host data and scalars
def test_numpy_arrays_and_scalars_are_placed_like_device_put_places_them():
    mesh = jmesh((2, 4), ("x", "y"))
    target = NamedSharding(mesh, P("y"))
    host = {"f32": values((8, 4)), "i8": values((8,), np.int8), "bf16": values((4, 2), jnp.bfloat16),
            "py_float": 2.5, "py_int": 7, "np_scalar": np.float32(1.5)}
    y = rj.reshard(host, {"f32": target, "i8": target, "bf16": target, "py_float": NamedSharding(mesh, P()),
                          "py_int": NamedSharding(mesh, P()), "np_scalar": NamedSharding(mesh, P())})
    want = jax.device_put(host, {"f32": target, "i8": target, "bf16": target, "py_float": NamedSharding(mesh, P()),
                                 "py_int": NamedSharding(mesh, P()), "np_scalar": NamedSharding(mesh, P())})
    for k in host:
        assert y[k].dtype == want[k].dtype and y[k].weak_type == want[k].weak_type, k
        assert y[k].sharding == want[k].sharding, k
        np.testing.assert_array_equal(np.asarray(y[k]), np.asarray(want[k]))


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("dtype,narrow", [(np.float64, np.float32), (np.int64, np.int32), (np.uint64, np.uint32),
                                          (np.complex128, np.complex64)])
def test_a_64_bit_numpy_array_is_canonicalized_as_device_put_does(dtype, narrow, x64):
    """With x64 off a host array of a 64-bit dtype is placed in the 32-bit one, as jax.device_put places it;
    with x64 on it keeps its dtype."""
    mesh = jmesh((2, 4), ("x", "y"))
    a = np.arange(8).astype(dtype) * 3
    target = NamedSharding(mesh, P("x"))
    targets = {"a": target, "scalar": NamedSharding(mesh, P())}
    assert not jax.config.jax_enable_x64
    with jax.enable_x64(x64):
        y, want = rj.reshard({"a": a, "scalar": a[1]}, targets), jax.device_put({"a": a, "scalar": a[1]}, targets)
        assert y["a"].dtype == want["a"].dtype == (dtype if x64 else narrow)
        assert y["scalar"].dtype == want["scalar"].dtype
        np.testing.assert_array_equal(np.asarray(y["a"]), a.astype(y["a"].dtype))
        assert y["a"].sharding == target
    assert not jax.config.jax_enable_x64


def test_a_64_bit_jax_array_keeps_its_dtype_with_x64_off():
    mesh = jmesh((2, 4), ("x", "y"))
    with jax.enable_x64(True):
        a = jax.device_put(np.full((8,), 2**40 + 1, np.int64), jax.devices()[0])
    y = rj.reshard(a, NamedSharding(mesh, P("x")))
    assert y.dtype == np.int64 and int(np.asarray(y)[0]) == 2**40 + 1


def test_a_single_device_array_is_placed_on_the_mesh():
    mesh = jmesh((2, 4), ("x", "y"))
    a = jnp.arange(16, dtype=jnp.float32)  # on the default device, uncommitted
    y = rj.reshard(a, NamedSharding(mesh, P(("x", "y"))))
    assert_placed(y, np.arange(16, dtype=np.float32), NamedSharding(mesh, P(("x", "y"))))


# ---------------------------------------------------------------------- PartitionSpec and jax.set_mesh
@pytest.mark.parametrize("kind", [AUTO, EXPLICIT])
def test_partition_specs_under_set_mesh_eager_and_jitted(kind):
    mesh = jmesh((4, 2), ("x", "y"), kind)
    a = values((8, 16, 8))
    x = jax.device_put(a, NamedSharding(mesh, P("y", None, "x")))
    target = NamedSharding(mesh, P(None, ("x", "y"), None))
    src = None if kind == EXPLICIT else P("y", None, "x")  # Auto axes: the layout of a tracer is not known
    with jax.set_mesh(mesh), jax.transfer_guard("disallow"):
        eager = rj.reshard(x, P(None, ("x", "y"), None))
        f = jax.jit(lambda v: rj.reshard(v, P(None, ("x", "y"), None), src=src))
        jitted = f(x)
        hlo = f.lower(x).compile().as_text()
    for y in (eager, jitted):
        assert_placed(y, a, target)
    assert "all-to-all" in hlo and "all-gather" not in hlo  # redist's plan, not XLA's gather-everything


@pytest.mark.parametrize("kind", [AUTO, EXPLICIT])
def test_sub_axis_plans_under_set_mesh_eager_and_jitted(kind, monkeypatch):
    """P('x') -> P('y') on 2x4 needs sub-axes of y: the shard_map runs on a refined mesh, which must not clash
    with the context mesh of jax.set_mesh ("The context mesh ... should match the mesh passed to
    shard_map"), eagerly and under jit. XLA moves this pair as well as the plan (a permute), so the route is
    pinned to redist's plan here to run the plan itself."""
    mesh = jmesh((2, 4), ("x", "y"), kind)
    a = values((4,))
    x = jax.device_put(a, NamedSharding(mesh, P("x")))
    target = NamedSharding(mesh, P("y"))
    m = jax_programs.move(a.shape, a.dtype, x.sharding, target)
    assert any(":" in tok for tok in m.plan.program.axis_tokens()), m.plan
    assert m.route == "xla"
    monkeypatch.setattr(jax_programs, "route", lambda m: "redist")
    src = None if kind == EXPLICIT else P("x")
    with jax.set_mesh(mesh), jax.transfer_guard("disallow"):
        eager = rj.reshard(x, P("y"))
        assert "sdy.manual_computation" in rj.lower(x, P("y")).as_text()
        jitted = jax.jit(lambda v: rj.reshard(v, P("y"), src=src))(x)
        named = jax.jit(lambda v: rj.reshard(v, target, src=src))(x)
    for y in (eager, jitted, named):
        assert_placed(y, a, target)


def test_a_partition_spec_needs_a_context_mesh():
    mesh = jmesh((2, 4), ("x", "y"))
    x = jax.device_put(values((8,)), NamedSharding(mesh, P("x")))
    with pytest.raises(redist.ShardingError, match=r"PartitionSpec but no mesh is set: .*jax.set_mesh"):
        rj.reshard(x, P("y"))


# ---------------------------------------------------------------------- under jit and grad
def test_a_pytree_under_jit_moves_in_one_shard_map():
    mesh = jmesh((4, 2), ("x", "y"))
    host = {"a": values((8, 16, 8)), "b": values((16, 8), seed=1)}
    src = {"a": P("y", None, "x"), "b": P(("x", "y"))}
    x = jax.tree.map(lambda h, s: jax.device_put(h, NamedSharding(mesh, s)), host, src)
    dst = {"a": NamedSharding(mesh, P(None, ("x", "y"), None)), "b": NamedSharding(mesh, P(None, "x"))}
    f = jax.jit(lambda t: rj.reshard(t, dst, src=src))
    with jax.transfer_guard("disallow"):
        y = f(x)
    jax.tree.map(assert_placed, y, host, dst)
    assert f.lower(x).as_text().count("sdy.manual_computation") == 1


SAME_TYPE_PAIRS = [  # (mesh shape, names, shape, dtype, src, dst): a plan of each kind of instruction
    ((4, 2), ("x", "y"), (8, 16, 8), np.float32, P("y", None, "x"), P(None, ("x", "y"), None)),  # all-to-all
    ((2, 4), ("x", "y"), (16, 8), np.int32, P(("x", "y")), P(None, "y")),      # all-to-all, all-gather
    ((2, 4), ("x", "y"), (16, 8), jnp.bfloat16, P("x", "y"), P("y", "x")),     # exchange
    ((2, 4), ("x", "y"), (16,), np.float32, P("x"), P("y")),                   # slice and permute on sub-axes
    ((2, 4), ("x", "y"), (8, 16), np.float32, P(None, "y"), P("x", "y")),      # slice
]


@pytest.mark.parametrize("mesh_shape,names,shape,dtype,src,dst", SAME_TYPE_PAIRS)
@pytest.mark.parametrize("traced", [False, True])
def test_arrays_of_one_type_move_together_by_one_collective_per_step(mesh_shape, names, shape, dtype, src, dst,
                                                                     traced, monkeypatch):
    """Three arrays of one type (and one of another) by redist's plan (the route pinned to it, to run every
    kind of instruction): the three are stacked and each collective of the plan runs once for all of them
    (jax.vmap batches it), with the values of three separate moves, eagerly and under jit."""
    monkeypatch.setattr(jax_programs, "route", lambda m: "redist")
    mesh = jmesh(mesh_shape, names)
    host = {"a": [values(shape, dtype, seed=s) for s in range(3)], "other": values((8, 8), seed=3)}
    source = {"a": NamedSharding(mesh, src), "other": NamedSharding(mesh, P("x"))}
    x = {k: jax.device_put(h, source[k]) for k, h in host.items()}
    target = {"a": NamedSharding(mesh, dst), "other": NamedSharding(mesh, P(None, "x"))}
    move = jax.jit(lambda t: rj.reshard(t, target, src=source)) if traced else lambda t: rj.reshard(t, target)
    with jax.transfer_guard("disallow"):
        y = move(x)
    jax.tree.map(assert_placed, y, host, {"a": [target["a"]] * 3, "other": target["other"]})
    def lowered(t):
        return (jax.jit(move).lower(t) if traced else rj.lower(t, target)).as_text()

    three, one = lowered(x), lowered({"a": x["a"][:1], "other": x["other"]})
    for kind in ("all_gather", "all_to_all", "collective_permute"):
        assert three.count(f"stablehlo.{kind}") == one.count(f"stablehlo.{kind}"), kind


def test_grad_through_a_pytree_reshard():
    mesh = jmesh((2, 4), ("x", "y"), EXPLICIT)
    host, x, dst = layer(mesh)
    floats = {k: v for k, v in x.items() if k in ("w", "b")}
    weights = {"w": values((16, 8), seed=7), "b": values((8,), seed=8)}

    def loss(t):
        moved = rj.reshard(t, {k: dst[k] for k in t})
        return sum((moved[k] * weights[k]).sum() for k in moved)

    with jax.set_mesh(mesh):
        for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
            g = grad(floats)
            for k in floats:
                np.testing.assert_array_equal(np.asarray(g[k]), weights[k])


def test_grad_with_src_on_auto_axes():
    mesh = jmesh((4, 2), ("x", "y"))
    a = values((8, 16, 8))
    x = {"a": jax.device_put(a, NamedSharding(mesh, P("y", None, "x")))}
    w = values((8, 16, 8), seed=3)
    target = NamedSharding(mesh, P(None, ("x", "y"), None))
    g = jax.jit(jax.grad(lambda t: (rj.reshard(t, target, src=P("y", None, "x"))["a"] * w).sum()))(x)
    np.testing.assert_array_equal(np.asarray(g["a"]), w)


def test_under_jit_on_auto_axes_without_src_the_error_says_what_to_pass():
    mesh = jmesh((2, 4), ("x", "y"))
    x = [jax.device_put(values((8,)), NamedSharding(mesh, P("x")))]
    with pytest.raises(redist.ShardingError,
                       match=r"leaf x\[0\]: under jax.jit .* pass it as reshard\(x, sharding, src="):
        jax.jit(lambda v: rj.reshard(v, NamedSharding(mesh, P("y"))))(x)


# ---------------------------------------------------------------------- donation
def test_donate_deletes_every_input_array():
    mesh = jmesh((2, 4), ("x", "y"))
    host, x, dst = layer(mesh)
    x["same"] = jax.device_put(values((8,)), NamedSharding(mesh, P("x")))       # already the target
    x["empty"] = jax.device_put(np.zeros((0,), np.float32), NamedSharding(mesh, P("x")))
    x["single"] = jax.device_put(values((8,)), jax.devices()[0])                 # on one device
    dst.update(same=NamedSharding(mesh, P("x")), empty=NamedSharding(mesh, P("y")), single=NamedSharding(mesh, P("y")))
    inputs = jax.tree.leaves(x)
    y = rj.reshard(x, dst, donate=True)
    assert all(a.is_deleted() for a in inputs)
    jax.tree.map(assert_placed, {k: y[k] for k in host}, host, {k: dst[k] for k in host})
    assert_placed(y["same"], values((8,)), dst["same"])
    assert_placed(y["single"], values((8,)), dst["single"])
    assert not any(a.is_deleted() for a in jax.tree.leaves(y))


def test_a_donated_array_cannot_be_used_again():
    mesh = jmesh((8,), ("x",))
    x = jax.device_put(values((16,)), NamedSharding(mesh, P("x")))
    rj.reshard({"a": x}, NamedSharding(mesh, P()), donate=True)
    with pytest.raises(redist.ShardingError, match=r"leaf x\['a'\]: the array has been deleted"):
        rj.reshard({"a": x}, NamedSharding(mesh, P()))


def test_a_donated_array_cannot_be_used_again_from_the_cache():
    """The cached program of a donating call is found again for the deleted array, which is refused."""
    mesh = jmesh((8,), ("x",))
    x = jax.device_put(values((16,)), NamedSharding(mesh, P("x")))
    rj.reshard(x, NamedSharding(mesh, P()), donate=True)
    assert x.is_deleted()
    with pytest.raises(redist.ShardingError, match=r"^the array has been deleted"):
        rj.reshard(x, NamedSharding(mesh, P()), donate=True)


def test_a_deleted_array_already_laid_out_as_the_target_is_refused():
    """Regression (found by the adversarial probe, proofs/probe): an array whose sharding already is the target was returned
    as it is even where it had been deleted, so the caller met JAX's error only on reading it."""
    mesh = jmesh((8,), ("x",))
    x = jax.device_put(values((16,)), NamedSharding(mesh, P("x")))
    x.delete()
    with pytest.raises(redist.ShardingError, match=r"^the array has been deleted"):
        rj.reshard(x, NamedSharding(mesh, P("x")))
    with pytest.raises(redist.ShardingError, match=r"^leaf x\['a'\]: the array has been deleted"):
        rj.reshard({"a": x}, NamedSharding(mesh, P("x")))


def test_nothing_is_deleted_when_a_leaf_is_refused():
    mesh = jmesh((2, 4), ("x", "y"))
    good = jax.device_put(values((8, 8)), NamedSharding(mesh, P("x")))
    bad = jax.device_put(values((8, 6)), NamedSharding(mesh, P("x")))
    with pytest.raises(redist.ShardingError, match=r"leaf x\[1\]: the target sharding: dim 1 \(size 6\)"):
        rj.reshard([good, bad], NamedSharding(mesh, P(None, "y")), donate=True)
    assert not good.is_deleted() and not bad.is_deleted()


def held(compiled) -> int:
    """Bytes a device holds during the call (memory_analysis): arguments, outputs and temporaries, less
    the outputs that live in donated arguments."""
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def test_donation_lets_xla_reuse_the_input_and_redist_keeps_its_memory_advantage():
    """jax-ml/jax#21562: XLA's own program gathers the whole array; ours holds far less, donated or not. A
    permute keeps the local shape: donated, its output lives in the input's buffer."""
    mesh = jmesh((4, 2), ("x", "y"))
    x = jax.device_put(values((16, 16, 16)), NamedSharding(mesh, P("y", None, "x")))
    target = NamedSharding(mesh, P(None, ("x", "y"), None))
    xla = jax.jit(lambda a: a, out_shardings=target).lower(x).compile()
    ours, ours_donated = rj.lower(x, target).compile(), rj.lower(x, target, donate=True).compile()
    local = 16 ** 3 * 4 // 8
    assert held(ours_donated) <= held(ours) < held(xla)
    assert held(xla) >= 16 ** 3 * 4  # the whole array, on every device
    assert held(ours) <= 4 * local
    perm = jax.device_put(values((64,)), NamedSharding(mesh, P(("x", "y"))))
    donated = rj.lower(perm, NamedSharding(mesh, P(("y", "x"))), donate=True).compile()
    assert donated.memory_analysis().alias_size_in_bytes == 64 * 4 // 8


# ---------------------------------------------------------------------- the route
GATHERS_AND_SLICES = [
    ((8,), ("x",), (64,), P("x"), P()),
    ((2, 4), ("x", "y"), (8, 16), P("x", "y"), P(None, "y")),
    ((2, 4), ("x", "y"), (8, 16), P(("x", "y")), P()),
    ((8,), ("x",), (16, 8), P(), P(None, "x")),
    ((2, 4), ("x", "y"), (8, 16), P(None, "y"), P("x", "y")),
    ((2, 2, 2), ("x", "y", "z"), (8, 8), P("x"), P(("x", "z"), "y")),
]


@pytest.mark.parametrize("mesh_shape,names,shape,src,dst", GATHERS_AND_SLICES)
def test_gathers_and_slices_take_xla_s_resharding_which_is_as_good(mesh_shape, names, shape, src, dst):
    """The rule of redist.jax_programs.route: a plan of slices alone or gathers alone runs as XLA's own
    resharding, because XLA receives the same bytes and holds the same memory for it (checked here on its
    compiled HLO)."""
    mesh = jmesh(mesh_shape, names)
    m = jax_programs.move(shape, np.float32, NamedSharding(mesh, src), NamedSharding(mesh, dst))
    assert m.route == "xla", m.plan
    xla = xla_baseline.compile_xla(m.src, m.dst)
    assert xla.bytes_received == m.plan.bytes_received
    assert xla.memory.temp_plus_output <= max(m.src.local_bytes, m.dst.local_bytes)
    x = jax.device_put(values(shape), NamedSharding(mesh, src))
    assert "shard_map" not in rj.lower(x, NamedSharding(mesh, dst)).as_text()
    assert_placed(rj.reshard(x, NamedSharding(mesh, dst)), values(shape), NamedSharding(mesh, dst))


@pytest.mark.parametrize("mesh_shape,names,shape,src,dst,dtype", [
    ((8,), ("x",), (16, 8), P("x"), P(None, "x"), np.float32),                 # all-to-all
    ((2, 2), ("x", "y"), (8, 8), P("x", "y"), P("y", "x"), np.float32),         # a swap of equal axes: permute
    ((2, 4), ("x", "y"), (64,), P(("x", "y")), P(("y", "x")), np.float32),      # a reorder within a dim: permute
    ((2, 4), ("x", "y"), (16,), P("x"), P("y"), np.float32),                    # a slice, a permute on sub-axes
    ((2, 4), ("x", "y"), (16, 8), P(None, "y"), P("y", None), jnp.bfloat16),    # XLA's CPU backend: bf16 as f32
])
def test_pairs_xla_moves_with_no_more_bytes_take_xla_s_resharding(mesh_shape, names, shape, src, dst, dtype):
    """The measured half of the rule: XLA finds the plan's all-to-all or permute itself, receiving the same
    bytes, so the pair runs as XLA's resharding (no shard_map). A call of one such array compiles once: the
    measured program is the one it runs."""
    mesh = jmesh(mesh_shape, names)
    x = jax.device_put(values(shape, dtype), NamedSharding(mesh, src))
    with compiles(measuring=True) as seen:
        y = rj.reshard(x, NamedSharding(mesh, dst))
    assert seen in ([], ["_xla_resharding"]), seen  # [] where JAX's own cache has the program from a test before
    assert_placed(y, values(shape, dtype), NamedSharding(mesh, dst))
    m = jax_programs.move(shape, dtype, NamedSharding(mesh, src), NamedSharding(mesh, dst))
    assert {s.kind for s in m.plan.steps} - {"all_slice", "all_gather"}, m.plan  # not known without compiling
    assert jax_programs.xla_bytes_received(m) == m.plan.bytes_received
    assert m.route == "xla", m.plan
    x = jax.device_put(values(shape, dtype), NamedSharding(mesh, src))
    assert "sdy.manual_computation" not in rj.lower(x, NamedSharding(mesh, dst)).as_text()
    assert_placed(rj.reshard(x, NamedSharding(mesh, dst)), values(shape, dtype), NamedSharding(mesh, dst))


@pytest.mark.parametrize("mesh_shape,names,shape,src,dst", [
    ((4, 2), ("x", "y"), (8, 16, 8), P("y", None, "x"), P(None, ("x", "y"), None)),  # jax-ml/jax#21562
    ((2, 4), ("x", "y"), (16, 8), P(("x", "y")), P(None, "y")),                      # FSDP -> Megatron
    ((2, 4), ("x", "y"), (8, 8), P(None, "x"), P("y")),                              # a slice and a gather
])
def test_pairs_xla_gathers_whole_take_redist_s_plan(mesh_shape, names, shape, src, dst):
    """Where XLA gathers the whole array and slices it (every device receives all it lacks), the plan, which
    receives fewer bytes, runs."""
    mesh = jmesh(mesh_shape, names)
    m = jax_programs.move(shape, np.float32, NamedSharding(mesh, src), NamedSharding(mesh, dst))
    assert m.route == "redist", m.plan
    xla = jax_programs.xla_bytes_received(m)
    assert xla >= m.src.global_bytes - m.src.local_bytes > m.plan.bytes_received
    assert m.plan.bytes_received < xla_baseline.compile_xla(m.src, m.dst).bytes_received
    x = jax.device_put(values(shape), NamedSharding(mesh, src))
    assert "sdy.manual_computation" in rj.lower(x, NamedSharding(mesh, dst)).as_text()
    assert_placed(rj.reshard(x, NamedSharding(mesh, dst)), values(shape), NamedSharding(mesh, dst))


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_an_exchange_xla_does_directly_takes_xla_s_resharding(dtype):
    """A swap of two unequal axes: the plan is one exchange, receiving 2/3 of XLA's bytes, but XLA has a
    direct program for it (it does not gather the whole array), and that runs: the JAX backend's exchange
    (rounds of ppermute, each with a gather and a scatter) holds more and runs slower (bench/jax_reshard.py,
    pairs swap and all-to-all-bf16)."""
    mesh = jmesh((2, 4), ("x", "y"))
    shape, src, dst = (16, 16), NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P("y", "x"))
    m = jax_programs.move(shape, dtype, src, dst)
    assert [s.kind for s in m.plan.steps] == ["exchange"], m.plan
    xla = jax_programs.xla_bytes_received(m)
    assert m.plan.bytes_received < xla < m.src.global_bytes - m.src.local_bytes
    assert m.route == "xla"
    x = jax.device_put(values(shape, dtype), src)
    assert "sdy.manual_computation" not in rj.lower(x, dst).as_text()
    assert_placed(rj.reshard(x, dst), values(shape, dtype), dst)


@pytest.mark.parametrize("kind", [AUTO, EXPLICIT])
def test_an_array_of_no_elements_takes_xla_s_resharding_without_measuring_it(kind):
    """Neither program moves a byte of an array of no elements, so XLA receives nothing, known without
    compiling its resharding (which XLA before JAX 0.9.1 fails to compile on Auto axes: "Unexpected XLA
    sharding override"), even where the plan's steps alone do not tell."""
    mesh = jmesh((2, 4), ("x", "y"), kind)
    m = jax_programs.move((0, 4), np.float32, NamedSharding(mesh, P("x")), NamedSharding(mesh, P(None, "y")))
    assert {s.kind for s in m.plan.steps} == {"all_slice", "all_gather"}, m.plan
    assert jax_programs.xla_bytes_received(m) == 0.0
    assert m.route == "xla"
    assert jax_programs._xla_resharding_jit.cache_info().currsize == 0  # nothing lowered, nothing compiled


# ---------------------------------------------------------------------- device orders, reduction kinds, complex
def test_a_pytree_across_two_device_orders_with_donation_eagerly_and_refused_under_jit():
    """A leaf whose target mesh holds its devices in another order moves eagerly by the plan between the
    two orders, next to a leaf moved within one mesh; donated, both inputs go. Under jax.jit the reordered
    leaf is refused, by name (JAX compiles a computation for one device order)."""
    # Explicit axes (make_mesh's default from JAX 0.9, Auto before): a tracer's layout is known without src=
    made = jax.make_mesh((2, 4), ("x", "y"), axis_types=(EXPLICIT, EXPLICIT), devices=jax.devices()[:8])
    flipped = jax.sharding.Mesh(np.array(list(made.devices.flat)[::-1]).reshape(2, 4), ("x", "y"))
    host = {"same": values((8, 12)), "flipped": values((8, 12), seed=1)}
    dst = {"same": NamedSharding(made, P("y", "x")), "flipped": NamedSharding(flipped, P("y", "x"))}
    x = jax.device_put(host, NamedSharding(made, P("x", "y")))
    with pytest.raises(redist.ShardingError, match=r"leaf x\['flipped'\]: under jax.jit.*order the devices"):
        jax.jit(lambda: rj.reshard(x, dst))()  # x closed over: a concrete array, its mesh known
    with pytest.raises(redist.ShardingError, match=r"leaf x\['flipped'\]: .*device orders"):
        jax.jit(lambda v: rj.reshard(v, dst))(x)  # a tracer: only its abstract mesh is known
    inputs = jax.tree.leaves(x)
    y = rj.reshard(x, dst, donate=True)
    assert all(a.is_deleted() for a in inputs)
    jax.tree.map(assert_placed, y, host, dst)
    for s in y["flipped"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(s.data), host["flipped"][s.index])


def test_a_move_between_two_device_orders_under_set_mesh():
    """Regression (found by the adversarial probe, proofs/probe): under ``jax.set_mesh`` a reshard to another device order
    raised JAX's ValueError, as the eager program of the move ran against the caller's context mesh."""
    made = jax.make_mesh((2, 4), ("x", "y"), devices=jax.devices()[:8])
    flipped = jax.sharding.Mesh(np.array(list(made.devices.flat)[::-1]).reshape(2, 4), ("x", "y"))
    host = values((8, 12))
    x = jax.device_put(host, NamedSharding(made, P("x")))
    for target in (NamedSharding(flipped, P()), NamedSharding(flipped, P("y", "x"))):
        with jax.set_mesh(made):
            y = rj.reshard(x, target)
        assert_placed(y, host, target)


def test_pending_values_of_any_reduction_kind_take_redist_s_plan():
    """XLA's resharding of a NamedSharding cannot express pending values: a move with a partial(max) source
    runs redist's plan (its identity would leave every device's own buffer), which takes the maximum."""
    mesh = jmesh((8,), ("x",))
    rmesh = rj.redist_mesh(mesh)
    src = redist.ShardingType.parse("f32[8, 4] partial(max){x}", rmesh)
    dst = redist.ShardingType.parse("f32[8{x}, 4]", rmesh)
    m = jax_programs.Move(src, dst, mesh, NamedSharding(mesh, P("x")), NamedSharding(mesh, P()))
    assert m.route == "redist"
    parts = [values((8, 4), seed=d) for d in range(8)]
    x = jax.make_array_from_single_device_arrays((8, 4), NamedSharding(mesh, P()),
                                                 [jax.device_put(parts[p], d) for p, d in enumerate(mesh.devices.flat)])
    y = jax.jit(lambda a: jax_programs.apply((m,), [a])[0])(x)
    np.testing.assert_array_equal(np.asarray(y), np.max(parts, axis=0))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("src,dst,route", [
    (P("x"), P(None, "x"), "xla"),                                  # an all-to-all XLA finds too
    (P("y", None, "x"), P(None, ("x", "y"), None), "redist"),       # jax-ml/jax#21562: XLA gathers whole
])
def test_complex_arrays_take_both_routes_and_keep_their_dtype(dtype, src, dst, route):
    mesh = jmesh((4, 2), ("x", "y"))
    shape = (8, 16, 8)
    a = values(shape, dtype) + 1j * values(shape, dtype, seed=1)
    with rj.in_dtype(dtype):
        x = jax.device_put(a, NamedSharding(mesh, src))
    m = jax_programs.move(shape, dtype, NamedSharding(mesh, src), NamedSharding(mesh, dst))
    assert m.route == route, m.plan
    assert_placed(rj.reshard(x, NamedSharding(mesh, dst)), a, NamedSharding(mesh, dst))


# ---------------------------------------------------------------------- the cache and the log
def test_the_log_says_which_plan_and_whether_it_came_from_the_cache(caplog):
    mesh = jmesh((4, 2), ("x", "y"))
    x = jax.device_put(values((8, 16, 8)), NamedSharding(mesh, P("y", None, "x")))
    target = NamedSharding(mesh, P(None, ("x", "y"), None))
    with caplog.at_level(logging.DEBUG, logger="redist"):
        rj.reshard(x, target)
        rj.reshard(x, target)
    messages = [r.getMessage() for r in caplog.records if r.name == "redist"]
    assert len(messages) == 2, messages
    assert "new: synthesized and compiled now" in messages[0] and "from the cache" in messages[1]
    for msg in messages:
        assert "f32[8{y}, 16, 8{x}] -> f32[8, 16{x,y}, 8]: redist's plan [all_to_all(" in msg
        assert "receives 448 B per device, peak 512 B" in msg


class FullPath(Exception):
    """Raised in place of redist.jax's full path of a call (flatten, check, build), to see which calls the
    cache answers alone."""


def refuse_the_full_path(*args, **kwargs):
    raise FullPath


@pytest.mark.parametrize("pair", ["jax#21562", "all-to-all"])
def test_the_cache_answers_only_its_own_call_signature(monkeypatch, pair):
    """A second call of one array on new data of the same type and layout runs the cached program with no
    other work (the full path is refused here), redist's plan or XLA's; a call that differs in shape,
    dtype, layout, mesh, target or donation never gets that program: it takes the full path, whose result
    is right."""
    mesh, explicit = jmesh((4, 2), ("x", "y")), jmesh((4, 2), ("x", "y"), EXPLICIT)
    shape, src, dst = {"jax#21562": ((8, 16, 8), P("y", None, "x"), P(None, ("x", "y"), None)),
                       "all-to-all": ((16, 8, 8), P("x"), P(None, "x"))}[pair]
    target = NamedSharding(mesh, dst)
    rj.reshard(jax.device_put(values(shape), NamedSharding(mesh, src)), target)
    calls = {  # name: (host values, source sharding, target, donate)
        "shape": (values((2 * shape[0],) + shape[1:]), NamedSharding(mesh, src), target, False),
        "dtype": (values(shape, np.int32), NamedSharding(mesh, src), target, False),
        "bf16": (values(shape, jnp.bfloat16), NamedSharding(mesh, src), target, False),
        "layout": (values(shape), NamedSharding(mesh, P(None, "y")), target, False),
        "mesh": (values(shape), NamedSharding(explicit, src), NamedSharding(explicit, dst), False),
        "target": (values(shape), NamedSharding(mesh, src), NamedSharding(mesh, P("x", "y")), False),
        "donate": (values(shape), NamedSharding(mesh, src), target, True),
    }
    inputs = {k: jax.device_put(h, s) for k, (h, s, _, _) in calls.items()}
    x = jax.device_put(values(shape, seed=1), NamedSharding(mesh, src))
    monkeypatch.setattr(rj, "_Call", refuse_the_full_path)
    assert_placed(rj.reshard(x, target), values(shape, seed=1), target)
    for k, (_, _, t, donate) in calls.items():
        with pytest.raises(FullPath):
            rj.reshard(inputs[k], t, donate=donate)
    monkeypatch.undo()
    for k, (h, _, t, donate) in calls.items():
        assert_placed(rj.reshard(inputs[k], t, donate=donate), h, t)


def test_the_cache_is_bounded_and_clearable(monkeypatch):
    monkeypatch.setattr(jax_programs, "_PROGRAMS", jax_programs._Cache(2))
    mesh = jmesh((2, 4), ("x", "y"))  # FSDP -> Megatron: redist's plan, a program of its own per shape
    xs = [jax.device_put(values((16 * (i + 1), 8)), NamedSharding(mesh, P(("x", "y")))) for i in range(3)]
    target = NamedSharding(mesh, P(None, "y"))
    for x in xs:
        rj.reshard(x, target)
    assert len(jax_programs._PROGRAMS) == 2
    with compiles() as seen:
        rj.reshard(xs[2], target)  # still cached
        rj.reshard(xs[0], target)  # evicted: compiled again
    assert len(seen) == 1
    rj.clear_cache()
    assert len(jax_programs._PROGRAMS) == 0


# ---------------------------------------------------------------------- errors, in the user's terms
def test_errors_name_the_argument_and_the_leaf():
    mesh = jmesh((2, 4), ("x", "y"))
    x = {"a": jax.device_put(values((8, 4)), NamedSharding(mesh, P("x"))), "b": "text"}
    E = redist.ShardingError
    with pytest.raises(E, match=r"sharding must be one NamedSharding or PartitionSpec, or a pytree prefix"):
        rj.reshard(x, [NamedSharding(mesh, P())])
    with pytest.raises(E, match=r"sharding: reshard takes a NamedSharding or a PartitionSpec .* got str 'y'"):
        rj.reshard(x, "y")
    with pytest.raises(E, match=r"leaf x\['b'\]: str 'text' cannot be placed"):
        rj.reshard(x, NamedSharding(mesh, P()))
    with pytest.raises(E, match=r"leaf x\['a'\]: src= says the array is laid out as .* but it is laid out as"):
        rj.reshard({"a": x["a"]}, NamedSharding(mesh, P()), src=P("y"))
    with pytest.raises(E, match="donate must be True or False, got str 'yes'"):
        rj.reshard(x, NamedSharding(mesh, P()), donate="yes")
    with pytest.raises(E, match="no array of x needs a program"):
        rj.lower(x["a"], x["a"].sharding)


def test_host_data_and_single_device_arrays_under_a_spec_longer_than_their_rank_are_refused():
    """Regression (found by the adversarial probe, proofs/probe): ``jax.device_put`` fails an assertion (AssertionError) on a
    spec of more entries than the leaf has dims; reshard leaked it."""
    mesh = jmesh((2, 4), ("x", "y"))
    for leaf, rank in ((3, 0), (np.float32(3), 0), (values((8,)), 1), (jnp.asarray(3.0), 0)):
        with pytest.raises(redist.ShardingError, match=rf"^leaf x\['a'\]: partition spec P\('x', 'y'\) has 2 "
                                                       rf"entries for a rank-{rank} array"):
            rj.reshard({"a": leaf}, NamedSharding(mesh, P("x", "y")))


def test_a_sharding_tree_that_is_no_prefix_of_x_is_refused_in_one_line_naming_where_they_differ():
    mesh = jmesh((2, 4), ("x", "y"))
    a = jax.device_put(values((8, 4)), NamedSharding(mesh, P("x")))
    x = {"a": a, "b": [a, a]}
    start = r"^sharding must be one NamedSharding or PartitionSpec, or a pytree prefix of x of them: "
    for sharding, difference in [
            ({"a": None}, r"x\['b'\] has no entry in sharding$"),
            ({"a": None, "c": None}, r"x\['b'\] has no entry in sharding, and sharding\['c'\] is not in x$"),
            ({"a": None, "b": [None]}, r"x\['b'\]\[1\] has no entry in sharding$"),
            ({"a": None, "b": [None, None, None]}, r"sharding\['b'\]\[2\] is not in x$"),
            ({"a": None, "b": (None, None)}, r"x\['b'\] is a list where sharding has a tuple$"),
            ({"a": {"q": None}, "b": None}, r"x\['a'\] is a leaf where sharding has dict \{'q': None\}$")]:
        with pytest.raises(redist.ShardingError, match=start + difference):
            rj.reshard(x, sharding)
    with pytest.raises(redist.ShardingError, match=r"^src must be .*: x\['b'\] has no entry in src$"):
        rj.reshard(x, None, src={"a": None})
    # a prefix whose None stands for a whole subtree still broadcasts
    y = rj.reshard(x, {"a": None, "b": NamedSharding(mesh, P("y"))})
    assert y["a"] is a and all(b.sharding == NamedSharding(mesh, P("y")) for b in y["b"])


def test_a_spec_that_does_not_fit_the_mesh_is_refused_naming_the_spec_and_the_mesh_axes():
    mesh = jmesh((2, 4), ("x", "y"))
    a = jax.device_put(values((8, 4)), NamedSharding(mesh, P("x")))
    unknown = r"the target P\('z',\) names axis 'z', which the mesh lacks; the mesh's axes are 'x', 'y'$"
    twice = r"the target P\('x', 'x'\) uses axis 'x' twice .*; the mesh's axes are 'x', 'y'$"
    E = redist.ShardingError
    with jax.set_mesh(mesh):
        for x in (a, values((8, 4)), {"w": a, "v": [a]}):  # a mesh array, host data, a pytree
            with pytest.raises(E, match=unknown):
                rj.reshard(x, P("z"))
            with pytest.raises(E, match=twice):
                rj.reshard(x, P("x", "x"))
        with pytest.raises(E, match=unknown):
            rj.reshard({"w": a, "v": [a]}, {"w": None, "v": P("z")})
        with pytest.raises(E, match=unknown[:-1]):  # under jit JAX appends a note on its traceback filtering
            jax.jit(lambda v: rj.reshard(v, P("z"), src=P("x")))(a)
        with pytest.raises(E, match=r"leaf x\['w'\]: src P\('z',\) names axis 'z', which the mesh lacks"):
            rj.reshard({"w": a}, P("y"), src=P("z"))
        with pytest.raises(E, match=r"^src P\(\('y', 'y'\),\) uses axis 'y' twice"):
            jax.jit(lambda v: rj.reshard(v, P("y"), src=P(("y", "y"))))(a)
