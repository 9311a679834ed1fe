"""Complex dtypes c64 and c128 (docs/spec.md §2 and §4): plans with pending complex sums on the numpy and
JAX backends, proved by the verifier; the lossless rule for complex data. The MPI counterparts run under
mpiexec in tests/redist/test_mpi_backend.py (its worker draws c64 and c128)."""

from __future__ import annotations

import numpy as np
import pytest

import redist
from redist import Mesh, ShardingError, ShardingType, synthesize, verify
from redist.data import summands, unshard
from redist.testing import SeededDraw, draw_mesh, draw_pair

MESH = Mesh({"x": 2, "y": 4})


def _complex_value(shape, dtype, rng) -> np.ndarray:
    """Small integers in both parts: exact in either dtype, and sums of them too."""
    return (rng.integers(-4, 5, size=shape) + 1j * rng.integers(-4, 5, size=shape)).astype(dtype)


def _pairs(n: int, seed: int):
    draw = SeededDraw(f"complex:{seed}")
    return [draw_pair(draw, draw_mesh(draw, max_devices=8, min_devices=2), partial=0.6, sub_axes=0.25,
                      dtype=("c64", "c128"), reductions=("sum", "prod"), uneven=0.2) for _ in range(n)]


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_complex_reshards_with_pending_sums_and_products(backend):
    if backend == "jax":
        pytest.importorskip("jax")
    partial = 0
    for i, (src, dst) in enumerate(_pairs(30 if backend == "numpy" else 12, 0)):
        plan = synthesize(src, dst)
        rng = np.random.default_rng(i)
        value = _complex_value(src.shape, src.np_dtype, rng)
        out = redist.execute(plan, summands(src, value, rng), backend=backend)
        assert all(o.dtype == src.np_dtype for o in out)
        np.testing.assert_array_equal(unshard(dst, out), value, err_msg=f"{src} -> {dst}")
        if backend == "numpy":
            assert verify(plan).ok, (str(src), str(dst))
        partial += bool(src.partial)
    assert partial >= 3


def test_summands_of_a_complex_sum_have_imaginary_parts():
    t = ShardingType.parse("c64[8{x}, 4] partial{y}", MESH)
    rng = np.random.default_rng(0)
    value = _complex_value((8, 4), np.complex64, rng)
    shards = summands(t, value, rng)
    assert any(np.any(s.imag != value[:4].imag) for s in shards[:4])
    np.testing.assert_array_equal(unshard(t, shards), value)


@pytest.mark.parametrize("given, want, ok", [("c64", "c128", True), ("f32", "c64", True), ("i16", "c64", True),
                                             ("f64", "c128", True), ("f64", "c64", False), ("c128", "c64", False),
                                             ("c64", "f32", False), ("c64", "f64", False)])
def test_lossless_rule_for_complex(given, want, ok):
    t = ShardingType.parse(f"{want}[8{{x}}]", MESH)
    data = np.arange(8).astype(ShardingType.parse(f"{given}[8]", MESH).np_dtype)
    if ok:
        shards = redist.shard(t, data)
        assert shards[0].dtype == t.np_dtype and np.array_equal(unshard(t, shards), data.astype(t.np_dtype))
    else:
        with pytest.raises(ShardingError, match=f"not every .* value is a {t.np_dtype.name} value"):
            redist.shard(t, data)


def test_max_and_min_of_complex_are_refused():
    for kind in ("max", "min"):
        with pytest.raises(ShardingError, match="c128"):
            ShardingType.parse(f"c128[8{{x}}] partial({kind}){{y}}", MESH)
