"""redist.testing: one generator of valid meshes and pairs behind two adapters (seeded, Hypothesis), and the
test-data helpers of redist.data."""

from __future__ import annotations

import hashlib
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

import redist
from bench.random_pairs import random_pair as bench_pair
from redist.bounds import check_pair
from redist.data import poisoned_source, random_array, summands, unshard
from redist.testing import AXIS_SIZES, SeededDraw, draw_layout, draw_mesh, draw_pair
from tests.redist.strategies import meshes, type_pairs
from tests import ROOT



def sample(seed, n, mesh_options=(), **options):
    draw = SeededDraw(seed)
    return [draw_pair(draw, draw_mesh(draw, **dict(mesh_options)), **options) for _ in range(n)]


def tokens(t):
    return [a for d in t.dims for a in d] + list(t.partial)


# ------------------------------------------------------------------------------------------ the seeded adapter
def test_the_same_seed_draws_the_same_sample():
    options = {"sub_axes": 0.3, "uneven": 0.3, "dtype": ("f32", "i32", "bool")}
    a = sample(3, 200, {"min_devices": 2}, **options)
    assert a == sample(3, 200, {"min_devices": 2}, **options)
    assert a != sample(4, 200, {"min_devices": 2}, **options)


def test_certain_outcomes_draw_nothing():
    """Turning an option fully on or off does not shift the rest of a seeded sample."""
    rng = random.Random(0)
    state = rng.getstate()
    draw = SeededDraw(rng)
    assert draw.boolean(1.0) is True and draw.boolean(0) is False and draw.boolean(True) and not draw.boolean(False)
    assert rng.getstate() == state


def test_the_benchmark_sample_is_the_published_one():
    """bench/synthesis_speed.py's 800 even and 400 uneven pairs (seed 0), and bench/redistribution.py's pairs
    on its fixed meshes, are those drawn by bench/random_pairs.py before the generator was shared (digests of
    their text taken from that generator)."""
    rng = random.Random(0)
    pairs = [bench_pair(rng) for _ in range(800)] + [bench_pair(rng, uneven=True) for _ in range(400)]
    text = "\n".join(f"{s.mesh} | {s} | {d}" for s, d in pairs)
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "f95def62af1d2d25890e14f95676dd7392e2f85dc91ae8a991c4a3ba0d4fe786")
    rng = random.Random(0)
    pairs = [bench_pair(rng, mesh=redist.Mesh.parse(m), max_rank=4, partial=False)
             for m in ("x=8", "x=2,y=4", "x=4,y=2", "x=2,y=2,z=2") for _ in range(50)]
    text = "\n".join(f"{s} | {d}" for s, d in pairs)
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "618addf6465590c8f8262b03eef31f5b859562100c8967d135893da40cf6047d")


# ------------------------------------------------------------------------------------------ what is drawn
def test_pairs_are_valid_and_follow_their_options():
    dtypes = ("f32", "bf16", "i8", "bool")
    pairs = sample(0, 600, {"max_devices": 32}, max_rank=3, partial=0.5, sub_axes=0.4, dtype=dtypes)
    for src, dst in pairs:
        check_pair(src, dst)  # one shape and dtype; the destination reduces only pending sums of the source
        assert src.rank <= 3 and src.dtype in dtypes and src.is_even() and dst.is_even()
        for n, a, b in zip(src.shape, src.dims, dst.dims):
            lcm = math.lcm(src.mesh.group_size(a), src.mesh.group_size(b))
            assert n // lcm in (1, 2, 3) and n % lcm == 0
    seen = {"partial source": 0, "partial destination": 0, "sub-axes": 0, "scalar": 0}
    for src, dst in pairs:
        seen["partial source"] += bool(src.partial)
        seen["partial destination"] += bool(dst.partial)
        seen["sub-axes"] += any(":" in a for t in (src, dst) for a in tokens(t))
        seen["scalar"] += src.rank == 0
    assert all(n >= 20 for n in seen.values()), seen
    assert {src.dtype for src, _ in pairs} == set(dtypes)


def test_uneven_pairs_have_padding_unless_told_otherwise():
    padded = sample(1, 300, {"min_devices": 2}, uneven=1.0)
    assert all(not (s.is_even() and d.is_even()) for s, d in padded)
    assert any(0 in s.shape for s, _ in padded)
    some = sample(1, 300, {"min_devices": 2}, uneven=0.5, padded=False, empty_dims=False)
    assert all(0 not in s.shape for s, _ in some)
    assert any(s.is_even() and d.is_even() and s.rank for s, d in some)
    assert any(not s.is_even() for s, _ in some)


def test_meshes_follow_their_options():
    draw = SeededDraw(5)
    capped = [draw_mesh(draw, max_axes=3, max_devices=12, min_devices=4) for _ in range(300)]
    assert all(1 <= len(m.axes) <= 3 and 4 <= m.size <= 12 and set(m.shape) <= set(AXIS_SIZES) for m in capped)
    assert {1, 3, 5, 6, 7} <= {s for m in capped for s in m.shape}
    exact = {draw_mesh(draw, max_axes=3, devices=12, axis_sizes=(1, 2, 3, 4, 6)).shape for _ in range(2000)}
    every = {s for k in (1, 2, 3) for s in np.ndindex(*(7,) * k)
             if all(x in (1, 2, 3, 4, 6) for x in s) and math.prod(s) == 12}
    assert exact == every  # each ordered factorization is drawn


def test_layouts_place_every_axis_at_most_once():
    draw = SeededDraw(2)
    mesh = redist.Mesh.parse("a=4,b=6,c=1,d=8")
    for _ in range(300):
        dims, partial = draw_layout(draw, mesh, draw.integers(0, 3), sub_axes=0.5)
        t = redist.ShardingType(mesh, tuple(0 for _ in dims), "f32", dims, partial)  # raises if one is twice
        assert all(len(d) == len(set(d)) for d in t.dims)
    scalar = [draw_layout(draw, mesh, 0, partial=False) for _ in range(20)]
    assert all(layout == ((), ()) for layout in scalar)


@pytest.mark.parametrize("call,match", [
    (lambda d: draw_mesh(d, devices=11), "11 devices"),
    (lambda d: draw_mesh(d, min_devices=20, max_devices=16), "between 20 and 16"),
    (lambda d: draw_mesh(d, axis_sizes=(0, 2)), "axis_sizes"),
    (lambda d: draw_mesh(d, max_axes=0), "max_axes"),
    (lambda d: draw_pair(d, redist.Mesh.parse("x=1"), uneven=0.5), "two devices or more"),
    (lambda d: draw_pair(d, redist.Mesh.parse("x=2"), max_rank=-1), "max_rank"),
])
def test_options_that_admit_nothing_are_refused(call, match):
    with pytest.raises(redist.ShardingError, match=match):
        call(SeededDraw(0))


def test_importing_redist_testing_needs_no_hypothesis():
    code = "import sys, redist.testing; assert 'hypothesis' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


# ------------------------------------------------------------------------------------------ the Hypothesis adapter
@given(type_pairs(mesh=redist.Mesh.parse("x=2,y=3"), max_rank=2, sub_axes=0.5, uneven=0.5))
@settings(max_examples=100, deadline=None)
def test_hypothesis_draws_valid_pairs(pair):
    check_pair(*pair)


def test_hypothesis_shrinks_a_pair_to_a_small_one():
    src, dst = find(type_pairs(), lambda p: bool(p[0].partial) and any(p[1].dims),
                    settings=settings(max_examples=2000, database=None))
    assert src.mesh.size <= 2 and src.rank == 1 and src.shape[0] <= 2, (src, dst)
    mesh = find(meshes(), lambda m: m.size > 8, settings=settings(max_examples=2000, database=None))
    assert mesh.size <= 12 and len(mesh.axes) <= 2, mesh


# ------------------------------------------------------------------------------------------ test data
@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8", "u8", "bool"])
def test_random_arrays_are_exact_in_their_dtype(dtype):
    t = redist.ShardingType.parse(f"{dtype}[6, 7]", redist.Mesh.parse("x=1"))
    rng = np.random.default_rng(0)
    a = random_array(rng, t.shape, t.np_dtype, -20, 20)
    assert a.shape == (6, 7) and a.dtype == t.np_dtype
    if dtype == "bool":
        assert a.any() and not a.all()
    else:
        wide = a.astype(np.int64)
        assert np.array_equal(wide.astype(t.np_dtype), a) and len(np.unique(wide)) > 10
    if dtype in ("f32", "bf16"):
        assert -20 <= wide.min() and wide.max() < 20
        distinct = random_array(rng, t.shape, t.np_dtype, distinct=True).astype(np.int64)
        assert sorted(distinct.flat) == list(range(1, 43))


@given(type_pairs(max_rank=3, uneven=0.5, dtype=("f32", "i32", "bool")), st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_poisoned_sources_hold_their_value(pair, seed):
    src, _ = pair
    value, bufs = poisoned_source(src, np.random.default_rng(seed), distinct=src.dtype != "bool")
    assert value.shape == src.shape and value.dtype == src.np_dtype
    assert np.array_equal(unshard(src, bufs), value)
    assert np.array_equal(unshard(src, summands(src, value, np.random.default_rng(seed))), value)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "c64"])
def test_float_summands_sum_exactly_in_any_order(dtype):
    """A backend may sum a group in another order than the caller: the summands keep every partial sum within
    the integers the dtype holds exactly (bf16: up to 256), even when asked for a wide range."""
    mesh = redist.Mesh({"x": 8})
    t = redist.ShardingType.parse(f"{dtype}[200] partial{{x}}", mesh)
    value = random_array(np.random.default_rng(0), t.shape, t.np_dtype, distinct=True)
    bufs = summands(t, value, np.random.default_rng(1), low=-50, high=51)
    for order in (range(8), range(7, -1, -1)):
        total = bufs[order[0]]
        for d in order[1:]:
            total = total + bufs[d]
        assert np.array_equal(total, value), order
