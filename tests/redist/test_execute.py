"""Data entering redist (redist.buffers) and leaving it (redist.execute): no value is converted with loss, no
result is the caller's array, no dtype is narrowed by JAX, and every misuse is a ShardingError in the user's
terms. The MPI counterparts run under mpiexec in tests/redist/test_mpi_backend.py."""

from __future__ import annotations

import contextlib
import itertools
import logging
import warnings
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import redist
from redist import ShardingError, ShardingType
from redist.backends import numpy_backend
from redist.buffers import as_array, lossless
from redist.types import DTYPES

jax = pytest.importorskip("jax")
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as PS  # noqa: E402

import redist.jax as rj  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)", allow_module_level=True)

BACKENDS = ["numpy", "jax"]
MESH = redist.Mesh.parse("x=2,y=2")


def T(text: str, mesh: redist.Mesh = MESH) -> ShardingType:
    return ShardingType.parse(text, mesh)


def plan_of(src: str, dst: str, mesh: redist.Mesh = MESH) -> redist.Plan:
    return redist.synthesize(T(src, mesh), T(dst, mesh))


# ---------------------------------------------------------------------- the lossless rule
def probes(dtype: np.dtype) -> np.ndarray:
    """The values of a dtype where conversions lose something first: the ends of its range, its smallest
    and most precise values, infinities and NaN."""
    if dtype.kind == "b":
        return np.array([False, True])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([info.min, info.max, 0, 1], dtype=dtype)
    if dtype.kind == "c":  # those of the real part, then the same as imaginary parts
        part = probes(np.empty((), dtype).real.dtype)
        out = np.zeros(2 * len(part), dtype)
        out.real[: len(part)], out.imag[len(part):] = part, part
        return out
    info = ml_dtypes.finfo(dtype)
    one = np.array(1, dtype)
    values = [info.max, -info.max, info.smallest_subnormal, info.tiny, one + info.eps, np.inf, -np.inf, np.nan]
    return np.array(values, dtype=dtype)


def survives(values: np.ndarray, dtype: np.dtype) -> bool:
    """Whether every value is the same number after conversion to ``dtype`` (compared as Python numbers,
    which compare ints and floats exactly; NaN stays NaN)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)  # the lost imaginary part is the point
        converted = values.astype(dtype)
    return all(a.item() == b.item() or a.item() != a.item() and b.item() != b.item()
               for a, b in zip(values, converted))


@pytest.mark.parametrize("given,want", list(itertools.product(DTYPES, repeat=2)))
def test_lossless_is_exactly_when_every_value_survives(given, want):
    """``lossless(a, b)`` holds exactly when the extreme values of ``a`` survive ``a -> b -> a``; in
    particular numpy's "safe" ``i64 -> f64`` is not lossless, and ``i8 -> i32``, ``u8 -> bf16`` are."""
    a, b = DTYPES[given], DTYPES[want]
    assert lossless(a, b) == survives(probes(a), b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("given", [np.complex64, np.int64, np.float64, np.int32])
def test_execute_refuses_shards_of_a_lossy_dtype(backend, given):
    plan = plan_of("f32[8{x}, 4]", "f32[8, 4{x}]")
    shards = [np.ones(plan.src.local_shape, np.float32) for _ in range(4)]
    shards[2] = shards[2].astype(given)
    name = np.dtype(given).name
    with pytest.raises(ShardingError, match=f"shard of device 2 has dtype {name}, expected float32"):
        redist.execute(plan, shards, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_execute_accepts_lossless_shards_and_returns_the_plans_dtype(backend):
    plan = plan_of("i32[8{x}, 4]", "i32[8, 4{x}]")
    value = np.arange(32).reshape(8, 4) - 16
    shards = [s.astype(np.int8) for s in redist.shard(plan.src, value.astype(np.int32))]
    shards[1] = shards[1].tolist()  # Python ints, all in range
    out = redist.execute(plan, shards, backend=backend)
    assert all(o.dtype == np.int32 for o in out)
    assert np.array_equal(redist.unshard(plan.dst, out), value)


@pytest.mark.parametrize("data,dtype,match", [
    (np.array([1 + 2j, 3]), "f32", "has dtype complex128, expected float32"),
    (np.array([1.0, np.nan]), "i32", "has dtype float64, expected int32"),
    ([1.0, float("nan")], "i32", "holds nan, which int32 cannot hold exactly"),
    ([3.7, 1.0], "i32", "holds 3.7, which int32 cannot hold exactly"),
    ([300, 1], "u8", "holds 300, which uint8 cannot hold exactly"),
    ([2**24 + 1, 0], "f32", "holds 16777217, which float32 cannot hold exactly"),
    ([0.1, 0.5], "f32", "holds 0.1, which float32 cannot hold exactly"),
    ([1 + 2j, 0], "f32", r"holds \(1\+2j\), which float32 cannot hold exactly"),
    (np.array([1 + 2**-40, 1]), "f32", "has dtype float64, expected float32"),
    (np.array([2**40 + 1, 1]), "i32", "has dtype int64, expected int32"),
    (np.array([2**53 + 1, 1]), "f64", "has dtype int64, expected float64"),
    (["a", "b"], "f32", "not numbers"),
    ([Fraction(1, 3), 1], "f32", r"holds Fraction\(1, 3\), which float32 cannot hold exactly \(it would become 0.33"),
    ("ab", "f32", "is str 'ab', not an array of numbers"),
    (None, "f32", "is NoneType None"),
])
def test_shard_refuses_data_that_does_not_fit(data, dtype, match):
    t = T(f"{dtype}[2{{x}}]")
    with pytest.raises(ShardingError, match=match):
        redist.shard(t, data)


@pytest.mark.parametrize("data,dtype", [
    ([1, -2], "i32"), ([0.5, 0.25], "bf16"), ([float("nan"), float("inf")], "f16"), (np.array([1, 2], np.int8), "i32"),
    (np.array([1, 2], np.uint8), "bf16"), (np.array([1.5, 2], np.float32), "f64"), ([True, False], "u8"),
])
def test_shard_accepts_lossless_data(data, dtype):
    t = T(f"{dtype}[2{{x}}]")
    out = redist.shard(t, data)
    assert all(o.dtype == t.np_dtype for o in out)
    np.testing.assert_array_equal(redist.unshard(t, out).astype(np.float64), np.asarray(data, dtype=np.float64))


def test_unshard_refuses_shards_of_a_lossy_dtype():
    t = T("f32[8{x}]")
    shards = redist.shard(t, np.arange(8, dtype=np.float32))
    shards[3] = shards[3].astype(np.float64) + 2**-40
    with pytest.raises(ShardingError, match="shard of device 3 has dtype float64, expected float32"):
        redist.unshard(t, shards)


def test_as_array_copies_only_when_asked():
    x = np.arange(4, dtype=np.float32)
    assert as_array(x, np.float32, "x") is x
    y = as_array(x, np.float32, "x", copy=True)
    assert not np.shares_memory(x, y) and np.array_equal(x, y)


# ---------------------------------------------------------------------- fresh results
FRESH = [
    ("f32[8{x}, 4]", "f32[8{x}, 4]", []),                              # identity: no step at all
    ("f32[8{x,y}]", "f32[8{y,x}]", ["permute"]),                      # devices 0 and 3 keep their buffer
    ("f32[7{x,y}]", "f32[7{y,x}]", ["pad", "permute", "unpad"]),      # views that change no buffer
    ("f32[8{x}, 4]", "f32[8, 4{x}]", ["all_to_all"]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("src,dst,kinds", FRESH)
def test_execute_returns_new_arrays(backend, src, dst, kinds):
    """Writing into a result never changes the input, and writing into the input never changes a result."""
    plan = plan_of(src, dst)
    assert [s.kind for s in plan.steps] == kinds
    value = np.arange(np.prod(plan.src.shape), dtype=np.float32).reshape(plan.src.shape)
    shards = redist.shard(plan.src, value)
    kept = [s.copy() for s in shards]
    out = redist.execute(plan, shards, backend=backend)
    for d, o in enumerate(out):
        assert not any(np.shares_memory(o, s) for s in shards), f"device {d}'s result is an input's memory"
        assert o.flags.writeable
        o[...] = -1
    for s, k in zip(shards, kept):
        np.testing.assert_array_equal(s, k)


def high_rank(dims: dict[int, str], rank: int) -> str:
    """An f32 type of ``rank`` dims of size 1 but those of ``dims`` (position: text)."""
    return "f32[" + ", ".join(dims.get(i, "1") for i in range(rank)) + "]"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank", [33, 64])  # 64: numpy's largest rank
@pytest.mark.parametrize("src,dst", [
    ({0: "2{x}", 1: "2{y}", 2: "2"}, {0: "2", 1: "2", 2: "2{x,y}"}),  # an all-to-all
    ({0: "2{x}", 5: "2{y}"}, {0: "2", 5: "2"}),                        # all-gathers
])
def test_execute_runs_plans_up_to_numpys_largest_rank(backend, rank, src, dst):
    plan = plan_of(high_rank(src, rank), high_rank(dst, rank))
    value = np.arange(np.prod(plan.src.shape), dtype=np.float32).reshape(plan.src.shape)
    out = redist.execute(plan, redist.shard(plan.src, value), backend=backend)
    np.testing.assert_array_equal(redist.unshard(plan.dst, out), value)


def test_a_program_past_numpys_largest_rank_is_refused_by_numpy_and_run_by_jax():
    """A plan on sub-axes splits a dim: at rank 64 its program holds buffers of 65 dims, which numpy has not."""
    plan = plan_of(high_rank({0: "8{x:(1)2}", 1: "2{y}"}, 64), high_rank({0: "8", 1: "2{x}"}, 64))
    value = np.arange(np.prod(plan.src.shape), dtype=np.float32).reshape(plan.src.shape)
    with pytest.raises(ShardingError, match=r"^the numpy backend: the program holds buffers of 65 dims \(it splits "
                                            r"dims of the rank-64 array\), more than numpy's 64; the JAX backend"):
        redist.execute(plan, redist.shard(plan.src, value))
    out = redist.execute(plan, redist.shard(plan.src, value), backend="jax")
    np.testing.assert_array_equal(redist.unshard(plan.dst, out), value)


# ---------------------------------------------------------------------- JAX keeps 64-bit dtypes
WIDE = {"f64": 1 + 2**-40, "i64": 2**40 + 1}  # 1.0 and 1 in 32 bits


@pytest.mark.parametrize("dtype", sorted(WIDE))
@pytest.mark.parametrize("src,dst", [
    ("{}[8{{x}}, 4]", "{}[8, 4{{x,y}}]"),
    ("{}[8, 4] partial{{x}}", "{}[8{{x}}, 4]"),
    ("{}[5{{x}}, 3]", "{}[5{{y}}, 3{{x}}]"),  # uneven: an exchange
])
def test_jax_backend_runs_in_the_plans_dtype_with_x64_off(dtype, src, dst):
    assert not jax.config.jax_enable_x64
    plan = plan_of(src.format(dtype), dst.format(dtype))
    value = np.full(plan.src.shape, WIDE[dtype], dtype=plan.src.np_dtype)
    shards = redist.data.summands(plan.src, value, np.random.default_rng(0))
    out = redist.execute(plan, shards, backend="jax")
    assert all(o.dtype == plan.dst.np_dtype for o in out)
    assert np.array_equal(redist.unshard(plan.dst, out), value)
    assert not jax.config.jax_enable_x64  # switched on for the call only


def jmesh(shape, names):
    return jax.sharding.Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


@pytest.mark.parametrize("dtype", sorted(WIDE))
@pytest.mark.parametrize("shape,src,dst", [
    ((8, 4), PS("x", "y"), PS("y", "x")),
    ((4,), PS("x"), PS("y")),                 # sub-axes
    ((0, 4), PS("x"), PS(None, "y")),         # nothing to move
])
def test_jax_reshard_keeps_a_64_bit_array_with_x64_off(dtype, shape, src, dst):
    mesh = jmesh((2, 4), ("x", "y"))
    a = np.full(shape, WIDE[dtype], dtype=DTYPES[dtype])
    with jax.enable_x64(True):
        x = jax.device_put(a, NamedSharding(mesh, src))
    assert x.dtype == a.dtype and not jax.config.jax_enable_x64
    target = NamedSharding(mesh, dst)
    eager = rj.reshard(x, target)
    traced = jax.jit(lambda v: rj.reshard(v, target, src=src))(x)
    for y in (eager, traced):
        assert y.dtype == a.dtype
        assert np.array_equal(np.asarray(y), a)
    assert eager.sharding == target
    assert all(s.data.shape == target.shard_shape(shape) for s in eager.addressable_shards)


# ---------------------------------------------------------------------- JAX compiles a plan once
@contextlib.contextmanager
def xla_compiles():
    """The names of the functions XLA compiles inside the block (``jax.log_compiles`` messages)."""
    seen = []

    class Handler(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Finished XLA compilation"):
                seen.append(record.getMessage())

    handler, logger = Handler(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            yield seen
    finally:
        logger.removeHandler(handler)


def test_jax_backend_compiles_a_plan_once_per_device_placement_and_keeps_it():
    """A later call of a plan (or of an equal plan synthesized anew) on the same devices finds the compiled
    program in the cache and compiles nothing; other devices compile their own; redist.jax.clear_cache
    empties the cache."""
    from redist.backends.jax_backend import jax_mesh_of, on_devices

    rj.clear_cache()
    plan = plan_of("f32[6{x}, 5{y}]", "f32[6{y}, 5{x}]")  # uneven: an exchange, which reshard cannot take
    value = np.arange(30, dtype=np.float32).reshape(6, 5)
    redist.execute(plan, redist.shard(plan.src, value), backend="jax")
    compiled = on_devices(plan.program, jax_mesh_of(plan.program.mesh))
    before = on_devices.cache_info()
    with xla_compiles() as seen:
        again = plan_of("f32[6{x}, 5{y}]", "f32[6{y}, 5{x}]")
        out = redist.execute(again, redist.shard(again.src, value + 1), backend="jax")
    assert seen == [] and on_devices.cache_info().hits == before.hits + 1
    assert on_devices.cache_info().misses == before.misses
    assert on_devices(plan.program, jax_mesh_of(plan.program.mesh)) is compiled
    np.testing.assert_array_equal(redist.unshard(plan.dst, out), value + 1)
    elsewhere = jax_mesh_of(plan.program.mesh, jax.devices()[4:8])
    with xla_compiles() as seen:
        rj.run_on_buffers(plan.program, redist.shard(plan.src, value), elsewhere)
    assert seen and on_devices.cache_info().misses == before.misses + 1
    rj.clear_cache()
    assert on_devices.cache_info().currsize == 0


# ---------------------------------------------------------------------- misuse
def _generator(plan):
    return (np.zeros(plan.src.local_shape, np.float32) for _ in range(4))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shards,match", [
    (None, "shards must be a list of 4 arrays, one per device id; got NoneType None"),
    (_generator, "shards must be a list of 4 arrays, one per device id; got generator"),
    ("abcd", "shards must be a list of 4 arrays, one per device id; got str 'abcd'"),
    ({0: 1}, "shards must be a list of 4 arrays, one per device id; got dict"),
    (["a", "b", "c", "d"], "shard of device 0 is str 'a', not an array of numbers"),
    ([object()] * 4, "shard of device 0 .* holds values that are not numbers"),
    ([[[1.0], [2.0, 3.0]]] * 4, "shard of device 0 .* cannot be read as an array"),
    ([None] * 4, "shard of device 0 is NoneType None"),
])
def test_execute_refuses_what_is_not_shards(backend, shards, match):
    plan = plan_of("f32[8{x}, 4]", "f32[8, 4{x}]")
    if callable(shards):
        shards = shards(plan)
    with pytest.raises(ShardingError, match=match):
        redist.execute(plan, shards, backend=backend)


def test_masked_arrays_are_refused_wherever_data_enters():
    """A masked array would lose its mask in the conversion: shard, unshard, execute on both backends and
    jax.reshard refuse it with one message (redist.mpi.reshard too: tests/redist/test_mpi_backend.py)."""
    plan = plan_of("f32[8{x}, 4]", "f32[8, 4{x}]")
    value = np.ma.masked_array(np.ones((8, 4), np.float32), mask=np.eye(8, 4, dtype=bool))
    shards = [np.ma.masked_array(np.ones(plan.src.local_shape, np.float32))] * 4
    refused = ("is a masked array: masked arrays are not supported (the mask would be lost); pass x.filled(value), "
               "or the data and the mask as two arrays")
    calls = [lambda: redist.shard(plan.src, value), lambda: redist.unshard(plan.src, shards),
             lambda: rj.reshard({"w": value}, NamedSharding(jmesh((2, 4), ("x", "y")), PS("x")))]
    calls += [lambda b=b: redist.execute(plan, shards, backend=b) for b in BACKENDS]
    for call in calls:
        with pytest.raises(ShardingError) as info:
            call()
        assert refused in str(info.value) and "\n" not in str(info.value)


def test_messages_that_quote_the_data_or_another_librarys_error_are_one_line():
    """An array's text and JAX's errors span lines: a message quotes them on one line (the first of an error)."""
    t = T("f32[8{x}]")
    seen = []

    def traced(v):
        with pytest.raises(ShardingError) as info:  # caught inside: JAX adds a note to what leaves jax.jit
            redist.shard(t, v)
        seen.append(str(info.value))
        return v

    jax.jit(traced)(np.zeros(8, np.float32))
    with pytest.raises(ShardingError) as info:
        rj.reshard(np.ones((7, 8)), NamedSharding(jmesh((2, 4), ("x", "y")), PS("x")))
    seen.append(str(info.value))
    assert "cannot be read as an array: The numpy.ndarray conversion method" in seen[0]
    assert seen[1].startswith("ndarray [[1. 1. 1. 1. 1. 1. 1. 1.] [1. 1.") and "cannot be placed as" in seen[1]
    assert all("\n" not in m for m in seen), seen


def test_both_backends_refuse_the_same_shards_with_the_same_message():
    plan = plan_of("i32[8{x}, 4]", "i32[8, 4{x}]")
    bad = [np.zeros(plan.src.local_shape, np.int32)] * 3 + [np.zeros(plan.src.local_shape, np.uint32)]
    messages = set()
    for backend in BACKENDS:
        with pytest.raises(ShardingError) as info:
            redist.execute(plan, bad, backend=backend)
        messages.add(str(info.value))
    assert messages == {"shard of device 3 has dtype uint32, expected int32: not every uint32 value is a int32 "
                        "value, so redist does not convert it (to round on purpose, pass x.astype(int32))"}


@pytest.mark.parametrize("plan", ["plan", None, 42])
def test_execute_refuses_what_is_not_a_plan(plan):
    with pytest.raises(ShardingError, match="execute needs a redist.Plan"):
        redist.execute(plan, [np.zeros(2, np.float32)] * 4)


@pytest.mark.parametrize("backend", ["bogus", None, "mpi", 42])
def test_execute_refuses_unknown_backends(backend):
    plan = plan_of("f32[8{x}, 4]", "f32[8, 4{x}]")
    with pytest.raises(ShardingError, match=r"unknown backend .*execute\(\) runs numpy, jax .*redist.mpi.reshard"):
        redist.execute(plan, redist.shard(plan.src, np.zeros((8, 4), np.float32)), backend=backend)


def test_jax_backend_says_when_the_mesh_has_more_devices_than_jax():
    n = len(jax.devices())
    mesh = redist.Mesh({"x": 2 * n})
    plan = plan_of(f"f32[{2 * n}{{x}}]", f"f32[{2 * n}]", mesh)
    shards = redist.shard(plan.src, np.zeros(2 * n, np.float32))
    with pytest.raises(ShardingError, match=f"the plan's mesh has {2 * n} devices, JAX has {n} "):
        redist.execute(plan, shards, backend="jax")


def test_jax_run_on_buffers_refuses_a_jax_mesh_of_other_axes():
    plan = plan_of("f32[8{x}, 4]", "f32[8, 4{x}]")
    with pytest.raises(ShardingError, match=r"jax_mesh has axes \{'x': 4\}, the program runs on mesh x=2,y=2"):
        rj.run_on_buffers(plan.program, redist.shard(plan.src, np.zeros((8, 4), np.float32)),
                          jmesh((4,), ("x",)))


def test_jax_reshard_refuses_what_is_not_an_array():
    """Host arrays are placed as jax.device_put places them (tests/redist/test_jax_reshard.py); other leaves are
    refused in the user's terms."""
    mesh = jmesh((2, 4), ("x", "y"))
    with pytest.raises(ShardingError, match="str 'abc' cannot be placed as NamedSharding"):
        rj.reshard("abc", NamedSharding(mesh, PS("y")))


def test_jax_run_program_keeps_a_64_bit_buffer_in_an_exchange_with_x64_off():
    """run_program inside the caller's own shard_map: the exchange's output buffer has the input's dtype
    (jnp.zeros(shape, float64) would be float32 while x64 is off)."""
    mesh = jmesh((4,), ("x",))
    program = plan_of("f64[13{x}, 6]", "f64[13, 6{x}]", rj.redist_mesh(mesh)).program
    assert [type(i).__name__ for i in program.instructions] == ["Exchange"]
    f = jax.jit(jax.shard_map(lambda b: rj.run_program(program, b[0])[None], mesh=mesh, in_specs=PS("x"),
                              out_specs=PS("x"), check_vma=False))
    bufs = np.full((4,) + program.shapes[0], 1 + 2**-40)
    with jax.enable_x64(True):
        x = jax.device_put(bufs, NamedSharding(mesh, PS("x")))
    y = f(x)
    assert y.dtype == np.float64
    want = numpy_backend.run(program, list(bufs))
    assert np.array_equal(np.asarray(y), np.stack(want))
