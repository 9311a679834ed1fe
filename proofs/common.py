"""Shared helpers for the proof scripts and tests: meshes, sharding types (random and exhaustive), and a
numpy oracle that runs a program on concrete data. The oracle uses the library's own data helpers
(``shard``/``unshard``) and the numpy backend: it is an independent *witness*, not the verifier."""

from __future__ import annotations

import itertools
import math
import random
import sys

import numpy as np

from redist.backends import numpy_backend
from redist.bounds import check_pair
from redist.data import poison_padding, summands
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.types import ShardingType

AXIS_SIZES = [1, 2, 3, 4, 5, 6, 8]


def progress(iterable=None, *, desc: str, total: int | None = None, unit: str = "it"):
    """A tqdm progress bar on stderr: redrawn in place on a terminal, a line every 30 s into a log file."""
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5 if sys.stderr.isatty() else 30)


# ----------------------------------------------------------------------------- meshes
def all_meshes(max_devices: int = 8, min_size: int = 2, max_axes: int = 3) -> list[Mesh]:
    """Every mesh (ordered axis sizes >= min_size) with at most ``max_devices`` devices."""
    out = []

    def rec(shape):
        if shape:
            out.append(Mesh({n: s for n, s in zip("xyzw", shape)}))
        if len(shape) == max_axes:
            return
        for s in range(min_size, max_devices + 1):
            if math.prod(shape) * s <= max_devices:
                rec(shape + (s,))

    rec(())
    return out


def random_mesh(rng: random.Random, max_axes: int = 4, max_devices: int = 16, min_devices: int = 1) -> Mesh:
    while True:
        n = rng.randint(1, max_axes)
        sizes = []
        for _ in range(n):
            budget = max_devices // max(1, math.prod(sizes))
            sizes.append(rng.choice([s for s in AXIS_SIZES if s <= budget] or [1]))
        if math.prod(sizes) >= min_devices:
            return Mesh({f"a{i}": s for i, s in enumerate(sizes)})


# ----------------------------------------------------------------------------- layouts
def _factorizations(n: int) -> list[list[int]]:
    """Ordered factorizations of n into factors >= 2 (for splitting an axis into sub-axes)."""
    if n == 1:
        return [[]]
    out = []
    for f in range(2, n + 1):
        if n % f == 0:
            out += [[f] + rest for rest in _factorizations(n // f)]
    return out


def _tokens_of(mesh: Mesh, name: str, factors: list[int]) -> list[str]:
    full = mesh.axis_size(name)
    if len(factors) <= 1:
        return [name]
    toks, pre = [], 1
    for f in factors:
        toks.append(f"{name}:({pre}){f}")
        pre *= f
    return toks


def random_layout(rng: random.Random, mesh: Mesh, rank: int, partial=True, sub_axes: float = 0.0,
                  forbid_partial=()):
    """Per-dim token lists and partial tokens: every axis (or sub-axis) goes to a dim, partial or nowhere."""
    tokens = []
    for name, size in mesh.axes:
        facts = _factorizations(size)
        split = [f for f in facts if len(f) > 1]
        if split and rng.random() < sub_axes:
            tokens += _tokens_of(mesh, name, rng.choice(split))
        else:
            tokens.append(name)
    rng.shuffle(tokens)
    dims = [[] for _ in range(rank)]
    part = []
    for a in tokens:
        choice = rng.randint(0, rank + 1)
        if choice < rank:
            dims[choice].append(a)
        elif choice == rank and partial and a not in forbid_partial:
            part.append(a)
    return tuple(map(tuple, dims)), tuple(part)


def random_pair(rng: random.Random, mesh: Mesh, max_rank: int = 3, partial: float = 0.3, sub_axes: float = 0.2,
                dtype: str = "f32", multipliers=(1, 1, 2, 3), uneven: float = 0.0):
    """A (source, destination) pair with a common shape; dst.partial is a subset of src.partial. Sub-axes of
    one axis on the two sides always come from one factorization of it (others are rejected by redist).

    Each dim is a multiple of the block counts of both sides (``multipliers`` times their lcm), except that
    with probability ``uneven`` the pair is *uneven*: every dim gets any size from 0 to twice the larger of
    its two block counts plus one, and draws in which both types still divide evenly are rejected, so an
    uneven pair has padding on at least one side (XLA's padding rule, SPEC 2). The mesh must then have two
    devices or more. The default (``uneven=0``) draws exactly what it did before uneven dims existed."""
    while True:
        want_uneven = uneven > 0 and rng.random() < uneven
        try:
            src, dst = _random_pair(rng, mesh, max_rank, partial, sub_axes, dtype, multipliers, want_uneven)
            check_pair(src, dst)
        except ShardingError:
            continue
        if want_uneven and src.is_even() and dst.is_even():
            continue
        return src, dst


def _random_pair(rng, mesh, max_rank, partial, sub_axes, dtype, multipliers, uneven=False):
    rank = rng.randint(0, max_rank)
    d1, p1 = random_layout(rng, mesh, rank, partial=rng.random() < partial, sub_axes=sub_axes)
    d2, _ = random_layout(rng, mesh, rank, partial=False, sub_axes=sub_axes)
    used2 = _pieces_used(mesh, d2)
    p1 = ShardingType(mesh, (), dtype, (), p1).partial  # canonical tokens (adjacent sub-axes merge)
    free = [a for a in p1 if not (_pieces_used(mesh, ((a,),)) & used2)]
    p2 = tuple(a for a in free if rng.random() < 0.5)
    shape = []
    for i in range(rank):
        k1, k2 = mesh.group_size(d1[i]), mesh.group_size(d2[i])
        shape.append(rng.randint(0, 2 * max(k1, k2) + 1) if uneven else math.lcm(k1, k2) * rng.choice(multipliers))
    src = ShardingType(mesh, tuple(shape), dtype, d1, p1)
    dst = ShardingType(mesh, tuple(shape), dtype, d2, p2)
    return src, dst


def _pieces_used(mesh: Mesh, dims) -> set:
    """Unit factor positions (axis, position) covered by tokens, for overlap tests."""
    out = set()
    for d in dims:
        for tok in d:
            name, pre, size = mesh.sub_axis(tok)
            out |= {(name, p) for p in range(pre, pre * size)}
    return out


def all_layouts(mesh: Mesh, rank: int, partial: bool = True):
    """Every assignment of the mesh's whole axes to (ordered) dims, partial, or nowhere."""
    names = mesh.names
    slots = list(range(rank + (2 if partial else 1)))  # dims..., rank = unused, rank+1 = partial
    for assign in itertools.product(slots, repeat=len(names)):
        groups = {s: [a for a, g in zip(names, assign) if g == s] for s in slots}
        orders = [itertools.permutations(groups[i]) for i in range(rank)]
        part = tuple(groups.get(rank + 1, ())) if partial else ()
        for dims in itertools.product(*orders):
            yield tuple(tuple(d) for d in dims), part


def all_pairs(mesh: Mesh, rank: int, dtype: str = "f32", multiplier: int = 1):
    """Every (src, dst) pair of whole-axis layouts with dst.partial a subset of src.partial, each dim the
    smallest size both sides divide (``multiplier`` times that)."""
    layouts = list(all_layouts(mesh, rank))
    for d1, p1 in layouts:
        for d2, p2 in layouts:
            if not set(p2) <= set(p1):
                continue
            shape = tuple(math.lcm(mesh.group_size(a), mesh.group_size(b)) * multiplier for a, b in zip(d1, d2))
            yield (ShardingType(mesh, shape, dtype, d1, p1), ShardingType(mesh, shape, dtype, d2, p2))


# ----------------------------------------------------------------------------- numpy oracle
def source_buffers(src: ShardingType, rng: np.random.Generator):
    """Per-device buffers of ``src`` and the global value. Elements are distinct integers (so a misplaced
    element shows); for a partial type every partial group gets its own random summands (SPEC 4: any summands
    whose group sums are right), so dropping, doubling or mixing summands shows too. Every padding position
    of every buffer (uneven dims, SPEC 2) is poisoned (:func:`redist.data.poison_padding`: NaN, or the largest
    integer), so a program that reads padding as data gives a wrong datum."""
    n = math.prod(src.shape)
    value = (rng.permutation(n) + 1).reshape(src.shape).astype(src.np_dtype)
    bufs = summands(src, value, rng, low=-50, high=51)
    return (bufs if src.is_even() else poison_padding(src, bufs)), value


def oracle(program, src: ShardingType, dst: ShardingType, seed: int = 0, trials: int = 2) -> tuple[bool, str]:
    """Run ``program`` with the numpy backend on random data of type ``src`` (padding filled by
    :func:`source_buffers`); True iff the result is the same value laid out as ``dst`` (group sums for
    partial ``dst``; replicas must agree), compared at the data positions of ``dst`` only: ``unshard`` reads
    no padding, which may hold anything. A program that raises at run time, or gives the wrong local shape,
    is wrong. So is a result whose dtype is not ``dst``'s, and a ``dst`` on another mesh than the program's
    (SPEC 1: another mesh is another type, even where the data happen to sit on the same devices); ``dst``'s
    layout is read on its own mesh, so a misplaced block shows as wrong values first."""
    from redist.data import unshard

    rng = np.random.default_rng(seed)
    for _ in range(trials):
        bufs, value = source_buffers(src, rng)
        try:
            out = numpy_backend.run(program, bufs)
            if any(tuple(x.shape) != dst.local_shape for x in out):
                return False, "wrong local shape"
            if any(x.dtype != dst.np_dtype for x in out):
                return False, f"the result is {out[0].dtype}, not {dst.dtype}"
            got = unshard(dst, out)
        except Exception as e:  # noqa: BLE001 - a program that raises at run time is wrong
            return False, f"raised {type(e).__name__}: {e}"
        if not np.array_equal(got, value):
            return False, "wrong values"
    if dst.mesh != program.mesh:
        return False, f"the result is on mesh {program.mesh!r}, not {dst.mesh!r}"
    return True, "equal"
