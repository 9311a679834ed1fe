"""Random valid inputs for testing redist: meshes, layouts and (source, destination) pairs, drawn once for the
tests, the proofs and the benchmarks.

The generator is written against a small *draw interface* (:class:`Draw`), so that one description of a
valid input serves two kinds of randomness:

- :class:`SeededDraw` over a seeded :class:`random.Random`: a reproducible sample, a function of the seed
  alone (the proofs, the published benchmark figures, every MPI rank drawing the same cases);
- :class:`HypothesisDraw` over the ``draw`` of a ``@hypothesis.strategies.composite`` strategy
  (``tests/redist/strategies.py``): Hypothesis explores the same space and shrinks a failing pair to a small one.
  Hypothesis is imported only when such an adapter is made, so that importing this module needs no
  Hypothesis.

Probabilities (``sub_axes=0.25``, ``uneven=0.35``) are sampling weights of the seeded adapter; under
Hypothesis they say only which outcomes are possible (anything above 0 and below 1 is "either"), and
Hypothesis shrinks toward the simpler one (no sub-axes, an axis left out, an even pair).

    draw = SeededDraw(random.Random(0))
    mesh = draw_mesh(draw, max_devices=16, device_order=0.2)
    src, dst = draw_pair(draw, mesh, partial=0.4, sub_axes=0.25, uneven=0.3, reductions=REDUCTIONS, reorder=0.2)

Options that are off by default (``device_order``, ``reorder``, a ``reductions`` list of one kind) draw nothing
when off, so that turning them on adds choices without shifting the seeded samples of callers that do not.

Buffers for such pairs (random values, summands of a partial type, poisoned padding) are in
:mod:`redist.data`.
"""

from __future__ import annotations

import math
import random
from typing import Protocol, Sequence, TypeVar

from redist.bounds import check_pair
from redist.errors import ShardingError, shown
from redist.axes import Axis
from redist.mesh import Mesh
from redist.types import DTYPES, REDUCTIONS, ShardingType

T = TypeVar("T")

AXIS_SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
"""Mesh axis sizes drawn by default: size 1, primes 2, 3, 5, 7, and composites that split into sub-axes."""


# ----------------------------------------------------------------------------------------- draw interface
class Draw(Protocol):
    """Where a generator gets its random choices from: each method but :meth:`accept` makes one choice."""

    def integers(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``, both ends included."""

    def choice(self, options: Sequence[T]) -> T:
        """One element of ``options`` (a non-empty sequence; an element listed twice is twice as likely)."""

    def permutation(self, items: Sequence[T]) -> list[T]:
        """The elements of ``items`` in a random order."""

    def boolean(self, p: float) -> bool:
        """True with probability ``p``; ``p <= 0`` is always False and ``p >= 1`` always True, drawing
        nothing, so that turning an option fully on or off does not shift the rest of a seeded sample."""

    def pick(self, weights: Sequence[float]) -> int:
        """Outcome ``i`` with probability ``weights[i]`` (weights summing to at most 1), or
        ``len(weights)`` with the probability that remains: a categorical choice in one draw."""

    def accept(self, ok: bool) -> bool:
        """Whether the generator keeps what it drew (``ok``); if not, it draws again. Hypothesis drops the
        whole example instead (``hypothesis.assume``), so that this never returns False there."""


class SeededDraw:
    """The draw interface over a :class:`random.Random` (made from ``rng`` if it is a seed): ``integers``,
    ``choice`` and ``permutation`` are its ``randint``, ``choice`` and ``sample``; ``boolean(p)`` is
    ``random() < p`` and ``pick`` compares one ``random()`` with the running sums of the weights. The same
    seed gives the same sample, on any machine and Python version that keeps :mod:`random`'s sequences."""

    def __init__(self, rng: random.Random | int | str):
        self.rng = rng if isinstance(rng, random.Random) else random.Random(rng)

    def integers(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Sequence[T]) -> T:
        return self.rng.choice(options)

    def permutation(self, items: Sequence[T]) -> list[T]:
        return self.rng.sample(list(items), len(items))

    def boolean(self, p: float) -> bool:
        if p <= 0 or p >= 1:
            return p >= 1
        return self.rng.random() < p

    def pick(self, weights: Sequence[float]) -> int:
        u, total = self.rng.random(), 0.0
        for i, w in enumerate(weights):
            total += w
            if u < total:
                return i
        return len(weights)

    def accept(self, ok: bool) -> bool:
        return ok


class HypothesisDraw:
    """The draw interface over Hypothesis: ``draw`` is the first argument of a ``@st.composite`` function
    (or ``data.draw``). Integers and choices shrink toward ``lo`` and the first option, a permutation toward
    the given order, a boolean toward False and a pick toward the remaining outcome ``len(weights)``."""

    def __init__(self, draw):
        import hypothesis  # here, not at import: only tests need Hypothesis

        self.draw, self.st, self.assume = draw, hypothesis.strategies, hypothesis.assume

    def integers(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))

    def choice(self, options: Sequence[T]) -> T:
        return self.draw(self.st.sampled_from(options))

    def permutation(self, items: Sequence[T]) -> list[T]:
        return list(self.draw(self.st.permutations(list(items))))

    def boolean(self, p: float) -> bool:
        if p <= 0 or p >= 1:
            return p >= 1
        return self.draw(self.st.booleans())

    def pick(self, weights: Sequence[float]) -> int:
        rest = len(weights) if sum(weights) < 1 else None
        possible = [i for i, w in enumerate(weights) if w > 0][::-1]
        return self.draw(self.st.sampled_from(([rest] if rest is not None else []) + possible))

    def accept(self, ok: bool) -> bool:
        return self.assume(ok)


# ----------------------------------------------------------------------------------------- meshes
def draw_mesh(draw: Draw, *, max_axes: int = 4, max_devices: int = 16, min_devices: int = 1,
              devices: int | None = None, axis_sizes: Sequence[int] = AXIS_SIZES, device_order: float = 0.0) -> Mesh:
    """A mesh of 1 to ``max_axes`` axes named ``a0, a1, …`` with sizes from ``axis_sizes`` (a size listed
    twice is drawn twice as often); with probability ``device_order`` its devices in a random order
    (``device_ids``, docs/spec.md §1), else in the default order.

    With ``devices``: exactly that many devices, every ordered way of writing it as a product of at most
    ``max_axes`` sizes from ``axis_sizes`` equally likely. Otherwise the number of axes and each size are
    drawn, then, while the mesh has more than ``max_devices`` devices, a random axis is cut to size 1 or 2;
    a mesh of fewer than ``min_devices`` devices is drawn again. Raises :class:`ShardingError` for options
    that admit no mesh.
    """
    sizes = sorted(set(axis_sizes))
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ShardingError(f"axis_sizes must be integers >= 1, got {shown(axis_sizes)}")
    if max_axes < 1:
        raise ShardingError(f"max_axes must be at least 1, got {shown(max_axes)}")
    if devices is not None:
        shapes = [s for s in _ordered_products(devices, sizes, max_axes) if s]
        if not shapes:
            raise ShardingError(f"no mesh of at most {max_axes} axes with sizes from {sizes} has {devices} devices")
        return draw_device_order(draw, _mesh(draw.choice(shapes)), device_order)
    if not 1 <= min_devices <= max_devices or min_devices > max(sizes) ** max_axes:
        raise ShardingError(f"no mesh of at most {max_axes} axes with sizes from {sizes} has between "
                            f"{min_devices} and {max_devices} devices")
    while True:
        n = draw.integers(1, max_axes)
        shape = [draw.choice(axis_sizes) for _ in range(n)]
        while math.prod(shape) > max_devices:
            shape[draw.integers(0, n - 1)] = draw.choice((1, 2))
        if draw.accept(math.prod(shape) >= min_devices):
            return draw_device_order(draw, _mesh(shape), device_order)


def _mesh(shape) -> Mesh:
    return Mesh({f"a{i}": s for i, s in enumerate(shape)})


def draw_device_order(draw: Draw, mesh: Mesh, p: float = 1.0) -> Mesh:
    """``mesh``'s axes with the devices in a random order (``device_ids``, a uniform permutation) with
    probability ``p``, else ``mesh`` itself (nothing drawn if ``p`` is 0 or the mesh has one device)."""
    if mesh.size > 1 and draw.boolean(p):
        return mesh.reordered(draw.permutation(range(mesh.size)))
    return mesh


def _ordered_products(n: int, factors: Sequence[int], max_len: int):
    """Every tuple of at most ``max_len`` elements of ``factors`` (ascending) whose product is ``n``, in
    lexicographic order; the empty tuple is one of them for ``n == 1``."""
    if n == 1:
        yield ()
    if max_len == 0:
        return
    for f in factors:
        if n % f == 0:
            for rest in _ordered_products(n // f, factors, max_len - 1):
                yield (f, *rest)


# ----------------------------------------------------------------------------------------- layouts
def draw_layout(draw: Draw, mesh: Mesh, rank: int, *, partial: bool = True, sub_axes: float = 0.0,
                to_dim: float = 0.55, to_partial: float = 0.15) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """The axes of a sharding type of rank ``rank`` on ``mesh``: ``(dims, partial)``, per-dim axis lists
    (major to minor) and partial axes, as :class:`redist.types.ShardingType` takes them.

    Each mesh axis is taken whole, or with probability ``sub_axes`` (where its size is not prime) split into
    sub-axes along an ordered factorization of its size drawn uniformly (``y=4`` into ``y:(1)2, y:(2)2``).
    In a random order, each of these goes with probability ``to_dim`` to the minor end of a dim drawn
    uniformly, with probability ``to_partial`` to the partial axes (if ``partial``), and else nowhere (the
    type is replicated over it). A scalar has no dims: there the share ``to_dim`` goes to partial too.
    """
    tokens = []
    for name, size in mesh.axes:
        splits = [f for f in _ordered_products(size, range(2, size + 1), size) if len(f) > 1] if sub_axes > 0 else []
        if splits and draw.boolean(sub_axes):
            tokens += _sub_axes(name, size, draw.choice(splits))
        else:
            tokens.append(name)
    dims: list[list[str]] = [[] for _ in range(rank)]
    part = []
    for a in draw.permutation(tokens):
        where = draw.pick((to_dim, to_partial))  # 0: a dim, 1: partial, 2: nowhere
        if where == 0 and rank:
            dims[draw.integers(0, rank - 1)].append(a)
        elif where <= 1 and partial:
            part.append(a)
    return tuple(map(tuple, dims)), tuple(part)


def _sub_axes(name: str, size: int, factors: Sequence[int]) -> list[str]:
    """The sub-axis tokens that split axis ``name`` of ``size`` into ``factors``, major to minor."""
    out, pre = [], 1
    for f in factors:
        out.append(Axis(name, pre, f, size))
        pre *= f
    return out


# ----------------------------------------------------------------------------------------- pairs
def draw_pair(draw: Draw, mesh: Mesh, *, max_rank: int = 3, partial: float = 0.3, dst_partial: float = 0.5,
              sub_axes: float = 0.0, dtype: str | Sequence[str] = "f32", multipliers: Sequence[int] = (1, 1, 2, 3),
              uneven: float = 0.0, padded: bool = True, empty_dims: bool = True, reductions: Sequence[str] = ("sum",),
              reorder: float = 0.0, create: float = 0.0) -> tuple[ShardingType, ShardingType]:
    """A valid (source, destination) pair on ``mesh`` (``redist.bounds.check_pair`` accepts it): one shape
    and dtype, one reduction kind; the destination's partial axes those of the source it keeps, and with
    ``create`` new ones.

    - rank from 0 to ``max_rank``; dtype ``dtype``, or drawn from it if it is a sequence of dtype names;
    - the reduction kind of a partial source drawn from ``reductions`` (among those the dtype has: no max or
      min of complex numbers);
    - with probability ``reorder`` the destination on ``mesh``'s axes with the devices in a random order
      (docs/spec.md §1), else on ``mesh``;
    - layouts from :func:`draw_layout` (with ``sub_axes``); the source may hold partial axes with probability
      ``partial``, and each of them stays pending in the destination with probability ``dst_partial`` unless
      the destination puts it in a dim;
    - with probability ``create`` the destination's layout may also make pending sums of axes that the source
      leaves out of its partial axes (docs/spec.md §3: creating them; replicated or split axes of the source alike; only
      sums are created, so a draw that creates next to another kind is drawn again):
      those that :func:`draw_layout` draws to the destination's partial axes (``create=0``, the default,
      draws nothing for it, so that the samples drawn before it existed stay the same);
    - each dim a multiple of the block counts of both sides (``multipliers`` times their lcm), except that
      with probability ``uneven`` every dim gets any size from 0 (from 1 without ``empty_dims``) to twice
      the larger of its two block counts plus one (XLA's padding rule, docs/spec.md §2). With ``padded`` such a draw
      is redrawn until one side has padding (the mesh must then have two devices or more).

    Pairs that ``check_pair`` refuses (sub-axes of one axis factored differently on the two sides) are drawn
    again. Raises :class:`ShardingError` for options that admit no pair.
    """
    if uneven > 0 and padded and mesh.size < 2:
        raise ShardingError(f"uneven pairs with padding need a mesh of two devices or more, got {mesh}")
    if max_rank < 0:
        raise ShardingError(f"max_rank must be at least 0, got {shown(max_rank)}")
    reductions = tuple(reductions)
    if not reductions or any(k not in REDUCTIONS for k in reductions):
        raise ShardingError(f"reductions must be reduction kinds of {REDUCTIONS}, got {shown(reductions)}")
    dtypes = (dtype,) if isinstance(dtype, str) else tuple(dtype)
    complex_only = all(d in DTYPES and DTYPES[d].kind == "c" for d in dtypes)
    if partial > 0 and complex_only and set(reductions) <= {"max", "min"}:
        raise ShardingError(f"no reduction kind of {reductions} fits complex dtypes {dtypes}")
    dst_mesh = mesh
    while True:
        ragged = draw.boolean(uneven)
        dtype_name = dtype if isinstance(dtype, str) else draw.choice(dtype)
        rank = draw.integers(0, max_rank)
        d1, p1 = draw_layout(draw, mesh, rank, partial=draw.boolean(partial), sub_axes=sub_axes)
        d2, new = draw_layout(draw, mesh, rank, partial=draw.boolean(create), sub_axes=sub_axes)
        p2 = tuple(a for a in p1 if draw.boolean(dst_partial) and not _overlaps(mesh, a, d2))
        p2 += tuple(a for a in new if not _overlaps(mesh, a, (p1,)))
        kind = "sum"
        if p1 and len(reductions) > 1:
            kind = draw.choice(reductions)
        elif p1:
            kind = reductions[0]
        if reorder > 0:
            dst_mesh = draw_device_order(draw, mesh, reorder)
        shape = []
        for a, b in zip(d1, d2):
            k1, k2 = mesh.group_size(a), mesh.group_size(b)
            if ragged:
                shape.append(draw.integers(0 if empty_dims else 1, 2 * max(k1, k2) + 1))
            else:
                shape.append(math.lcm(k1, k2) * draw.choice(multipliers))
        try:
            src = ShardingType(mesh, tuple(shape), dtype_name, d1, p1, kind)
            dst = ShardingType(dst_mesh, tuple(shape), dtype_name, d2, p2, kind)
            check_pair(src, dst)
            valid = not (ragged and padded and src.is_even() and dst.is_even())
        except ShardingError:
            valid = False
        if draw.accept(valid):
            return src, dst


# ----------------------------------------------------------------------------------------- across meshes
MESH_RELATIONS = ("same devices", "disjoint", "overlapping", "other sizes")
"""How the two meshes of :func:`draw_mesh_pair` relate: the same devices in another arrangement (``x=8`` and
``a=2,b=4``); as many other devices (a pipeline's next stage); some devices of both (a stage that shares
devices, a resized job that keeps some); another number of devices, sharing some or none."""


def draw_mesh_pair(draw: Draw, *, max_axes: int = 3, max_devices: int = 8, min_devices: int = 1,
                   relations: Sequence[str] = MESH_RELATIONS) -> tuple[Mesh, Mesh]:
    """Two meshes of :func:`draw_mesh` (at most ``max_axes`` axes and ``max_devices`` devices each), the second
    on other devices or axes than the first (never merely a device order of it), related as one of
    ``relations`` (:data:`MESH_RELATIONS`, drawn uniformly) says. The first mesh's devices are ``0 … n−1`` or,
    half the time, other numbers; device ids in both are in random orders."""
    relations = tuple(relations)
    if not relations or any(r not in MESH_RELATIONS for r in relations):
        raise ShardingError(f"relations must be some of {MESH_RELATIONS}, got {shown(relations)}")
    while True:
        relation = draw.choice(relations)
        first = draw_mesh(draw, max_axes=max_axes, max_devices=max_devices, min_devices=min_devices)
        n = first.size
        offset = draw.choice((0, n))
        ids = draw.permutation(range(offset, offset + n))
        first = first.reordered(ids)
        if relation == "same devices":
            second = draw_mesh(draw, max_axes=max_axes, devices=n)
            pool = ids
        else:
            m = n if relation in ("disjoint", "overlapping") else draw_mesh(
                draw, max_axes=1, max_devices=max_devices, min_devices=min_devices).size
            lo, hi = (0, 0) if relation == "disjoint" else (1, min(n, m) - 1) if relation == "overlapping" else \
                (0, min(n, m))
            if not draw.accept(lo <= hi):
                continue
            second = draw_mesh(draw, max_axes=max_axes, devices=m)
            shared = draw.integers(lo, hi)
            fresh = [d for d in range(offset + n + m) if not offset <= d < offset + n][:m - shared]
            pool = draw.permutation(ids)[:shared] + fresh
        second = second.reordered(draw.permutation(pool))
        if draw.accept(not first.is_reordering_of(second)):
            return first, second


def draw_cross_mesh_pair(draw: Draw, meshes: tuple[Mesh, Mesh], *, max_rank: int = 3, partial: float = 0.3,
                         dst_partial: float = 0.2, dtype: str = "f32", reductions: Sequence[str] = ("sum",),
                         uneven: float = 0.0, multipliers: Sequence[int] = (1, 1, 2, 3)) -> tuple[ShardingType,
                                                                                                  ShardingType]:
    """A valid (source, destination) pair on the two ``meshes`` (``redist.bounds.check_pair`` accepts it): one
    shape and dtype; layouts from :func:`draw_layout` on each mesh, the source partial with probability
    ``partial`` (its kind drawn from ``reductions``), the destination with probability ``dst_partial`` (a
    pending sum created, or the source's kind where its summand groups have the source's size); each dim a
    multiple of both sides' block counts (``multipliers`` times their lcm) or, with probability ``uneven``,
    any size from 0 to twice the larger count plus one."""
    src_mesh, dst_mesh = meshes
    while True:
        rank = draw.integers(0, max_rank)
        d1, p1 = draw_layout(draw, src_mesh, rank, partial=draw.boolean(partial))
        d2, p2 = draw_layout(draw, dst_mesh, rank, partial=draw.boolean(dst_partial))
        kind = draw.choice(tuple(reductions)) if p1 else "sum"
        if p2 and p1 and src_mesh.group_size(p1) == dst_mesh.group_size(p2):
            kind2 = kind
        else:
            kind2 = "sum"
        ragged = draw.boolean(uneven)
        shape = []
        for a, b in zip(d1, d2):
            k1, k2 = src_mesh.group_size(a), dst_mesh.group_size(b)
            shape.append(draw.integers(0, 2 * max(k1, k2) + 1) if ragged
                         else math.lcm(k1, k2) * draw.choice(multipliers))
        try:
            src = ShardingType(src_mesh, tuple(shape), dtype, d1, p1, kind)
            dst = ShardingType(dst_mesh, tuple(shape), dtype, d2, p2, kind2)
            check_pair(src, dst)
            valid = True
        except ShardingError:
            valid = False
        if draw.accept(valid):
            return src, dst


def _overlaps(mesh: Mesh, token: str, dims) -> bool:
    """Whether axis or sub-axis ``token`` is one of the axes in ``dims`` or shares a factor with one (a
    sub-axis ``(pre)size`` spans the factors from ``pre`` to ``pre * size`` of its axis)."""
    axis = mesh.axis(token)
    return any(axis.overlaps(mesh.axis(other)) for d in dims for other in d)
