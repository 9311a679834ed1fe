"""The search space: the atoms a search places, its states, and what the moves out of a state read.

Search space. A state is a sharding of the array over *atoms*: the mesh axes, or the pieces of them that
the source or destination name as sub-axes. Each dim holds a stack of atoms (major to minor), and the
steps act at its minor end. A state also holds its partial atoms, whether a gather has grown the buffer,
and the run of moves in progress (so that a run merges into one step).

States. As a tuple, a state is ``(dims, partial, grown, run)``: the atoms of each dim (major to minor), the bit mask of
the partial atoms, whether a gather has grown the buffer, and the run in progress: ``(SliceMove, dim)`` after
a slice onto ``dim`` (the same for reduce-scatters and gathers), else None. A move that continues the run
merges into the run's step. A backward state (of the search from the goal, :mod:`redist.synthesis.search`)
is ``(dims, partial, sliced, first)``: the state before a suffix of moves, whether that suffix slices or
reduce-scatters (then it must not follow a gather: normal form), and the run tag of its first move (a move
before it that continues the run adds no step). States are plain tuples: a search hashes and compares
hundreds of thousands of them. :meth:`Space.node` and :meth:`Space.back` add to a state what the moves out
of it read (:mod:`redist.synthesis.moves`), and a :class:`Run` holds what names the axes of the step that a
run of moves makes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from redist.axes import Axis, canonical_axes
from redist.mesh import Mesh, prime_factors
from redist.types import ShardingType


@dataclass(frozen=True)
class _Atoms:
    """The search alphabet: atom ``i`` is the sub-axis ``axes[i]`` of the mesh; ``sizes[i]`` its size.
    ``index[(name, pre)]`` is the atom of mesh axis ``name`` that starts at factor ``pre``."""

    axes: tuple[Axis, ...]
    sizes: tuple[int, ...]
    index: dict[tuple[str, int], int]

    def expand(self, axes) -> tuple[int, ...]:
        """The atoms that make up ``axes`` (axes of the mesh, each a run of atoms), major to minor."""
        out = []
        for a in axes:
            i = self.index[(a.name, a.pre)]
            while True:
                out.append(i)
                if self.axes[i].stop >= a.stop:
                    break
                i += 1
        return tuple(out)

    def compress(self, run) -> tuple[Axis, ...]:
        """Canonical axes for a run of atoms (adjacent pieces of one axis, in order, merge)."""
        return canonical_axes(tuple(self.axes[i] for i in run))


def cut_points(mesh: Mesh, types, refine: bool) -> dict[str, list[int]]:
    """The atoms' boundaries per axis: those the types' axes use, each gap split into primes if ``refine``."""
    cuts = mesh.cut_points([a for t in types for d in t.dims for a in d] + [a for t in types for a in t.partial])
    out = {}
    for n, pts in cuts.items():
        if refine:
            fine = [1]
            for lo, hi in zip(pts, pts[1:]):
                for p in prime_factors(hi // lo):
                    fine.append(fine[-1] * p)
            pts = fine
        out[n] = pts
    return out


def _atoms(mesh: Mesh, cuts) -> _Atoms:
    axes = []
    for n, size in mesh.axes:
        pts = cuts[n]
        if len(pts) == 1:  # an axis of size 1 is one atom of size 1 (placing it moves no data)
            pts = [1, 1]
        axes += [Axis(n, lo, hi // lo, size) for lo, hi in zip(pts, pts[1:])]
    return _Atoms(tuple(axes), tuple(a.size for a in axes), {(a.name, a.pre): i for i, a in enumerate(axes)})


def mask(ids) -> int:
    """The bit mask of the atoms ``ids``."""
    m = 0
    for i in ids:
        m |= 1 << i
    return m


class Space(NamedTuple):
    """The constants of one search: the ``atoms`` and their ``sizes``, the array's ``shape`` and
    ``global_bytes``, ``scale`` (bytes are counted in units of ``1 / scale``, the mesh size), the masks of the
    atoms the destination places in dims (``wanted``) and of the partial atoms it does not keep
    (``reducible``), the ``start`` state, the ``goal`` ``(dims, partial)`` and the goal's local buffer in bytes
    (``goal_bytes``: the heuristic reads it at every state)."""

    atoms: _Atoms
    sizes: tuple[int, ...]
    shape: tuple[int, ...]
    global_bytes: int
    scale: int
    wanted: int
    reducible: int
    start: tuple
    goal: tuple
    goal_bytes: int

    @classmethod
    def of(cls, src: ShardingType, dst: ShardingType, refine: bool) -> Space:
        """The search from ``src`` to ``dst`` over their atoms, split into prime factors if ``refine``."""
        mesh = src.mesh
        atoms = _atoms(mesh, cut_points(mesh, (src, dst), refine))
        src_dims, dst_dims = (tuple(atoms.expand(d) for d in t.dims) for t in (src, dst))
        src_partial, dst_partial = (mask(atoms.expand(t.partial)) for t in (src, dst))
        space = cls(atoms, atoms.sizes, src.shape, src.global_bytes, mesh.size,
                    wanted=mask(a for d in dst_dims for a in d), reducible=src_partial & ~dst_partial,
                    start=(src_dims, src_partial, False, None), goal=(dst_dims, dst_partial), goal_bytes=0)
        return space._replace(goal_bytes=space.local_bytes(dst_dims))

    def blocks(self, ids) -> int:
        k = 1
        for a in ids:
            k *= self.sizes[a]
        return k

    def product(self, mask: int) -> int:
        """The product of the sizes of the atoms of a bit mask (:func:`mask`)."""
        return self.blocks(a for a in range(len(self.sizes)) if mask >> a & 1)

    def local_bytes(self, dims) -> int:
        k = 1
        for d in dims:
            k *= self.blocks(d)
        return self.global_bytes // k

    def missing_bytes(self, dims, partial: int) -> int:
        """The lower bound from a state of ``dims`` and ``partial`` atoms to the goal (what some device lacks)."""
        return self.lacking(dims, partial, *self.goal, full=self.goal_bytes)

    def lacking(self, dims, partial: int, to_dims, to_partial: int, full: int | None = None) -> int:
        """What some device lacks of its block of ``(to_dims, to_partial)`` when it holds its block of ``(dims,
        partial)``: a lower bound on the bytes any plan between them receives (:func:`redist.lower_bound_bytes`).
        In each dim the blocks nest where one stack of atoms is a prefix of the other, and some device's blocks
        are disjoint where they differ (the device at the start of one atom and the end of the other); a
        reduction leaves each device lacking its whole block. ``full``: the local bytes of ``to_dims``, where
        the caller has them."""
        if full is None:
            full = self.local_bytes(to_dims)
        if partial & ~to_partial:
            return full
        kept = self.global_bytes
        for s, g in zip(dims, to_dims):
            p = 0
            while p < len(s) and p < len(g) and s[p] == g[p]:
                p += 1
            if p < len(s) and p < len(g):
                return full
            kept //= self.blocks(s if p == len(g) else g)
        return full - kept

    def back(self, state) -> Back:
        """The backward ``state`` with what the untry-steps read."""
        dims, partial, sliced, first = state
        used = mask(a for d in dims for a in d)
        return Back(dims, partial, sliced, first, self.local_bytes(dims) * self.scale,
                     tuple(n // self.blocks(d) for n, d in zip(self.shape, dims)),
                     ((1 << len(self.sizes)) - 1) & ~used & ~partial)

    def node(self, state, local_bytes: int) -> Node:
        """``state`` (of ``local_bytes``) with what the moves out of it read."""
        dims, partial, grown, run = state
        used = mask(a for d in dims for a in d)
        return Node(dims, partial, grown, run, local_bytes, local_bytes * self.scale,
                     tuple(n // self.blocks(d) for n, d in zip(self.shape, dims)),
                     ((1 << len(self.sizes)) - 1) & ~used & ~partial)


class Node(NamedTuple):
    """A state being expanded: its four parts, its local buffer in bytes (``local_bytes``, and times the scale:
    ``scaled``), each dim's local size, and the mask of the atoms that are free (in no dim, not partial)."""

    dims: tuple[tuple[int, ...], ...]
    partial: int
    grown: bool
    run: tuple | None
    local_bytes: int
    scaled: int
    local: tuple[int, ...]
    free: int


class Back(NamedTuple):
    """A backward state being expanded, with what the untry-steps read (as :class:`Node`)."""

    dims: tuple[tuple[int, ...], ...]
    partial: int
    sliced: bool
    first: tuple | None
    scaled: int
    local: tuple[int, ...]
    free: int


class Run(NamedTuple):
    """Moves of a search path that form one step: the type ``before`` them, the atoms of each dim before and
    after them, the destination, and the atoms, to name the step's axes."""

    before: ShardingType
    dims_before: tuple[tuple[int, ...], ...]
    dims_after: tuple[tuple[int, ...], ...]
    dst: ShardingType
    atoms: _Atoms

    def tokens(self, ids) -> tuple[Axis, ...]:
        return self.atoms.compress(ids)

    def pushed(self, dim: int) -> tuple[Axis, ...]:
        """The axes the run appended to ``dim``."""
        return self.tokens(self.dims_after[dim][len(self.dims_before[dim]):])

    def popped(self, dim: int) -> tuple[Axis, ...]:
        """The axes the run removed from the minor end of ``dim``."""
        return self.tokens(self.dims_before[dim][len(self.dims_after[dim]):])
