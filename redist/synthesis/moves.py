"""The moves of the search: one generator per kind of step, forward (try-steps) and read backwards (untry-steps).

Moves. From every state the search tries these moves, one generator (``_try_…``) per kind, in this order
(as Shardy's ``CollectiveInserter`` tries its collectives; here the order only breaks ties between
equally cheap plans). Each move is a small record that makes its typed step (:mod:`redist.steps`):

1. ``all_slice`` (:class:`SliceMove`): push a free atom that the destination places in dims onto a dim
   whose local size it divides. A run of slices on one dim is one ``all_slice``; slices on different
   dims commute, so a run of them takes the dims in order.
2. ``reduce_scatter`` (:class:`ReduceScatterMove`): push a partial atom that the destination does not
   keep onto a dim whose local size it divides. A run on one dim is one ``reduce_scatter``.
3. ``all_to_all`` (:class:`AllToAllMove`): move a suffix of one dim's atoms to the minor end of another
   dim whose local size its blocks divide, or two such moves from two dims in one all-to-all over both
   groups (as XLA does).
4. ``all_gather`` (:class:`GatherMove`): pop a suffix of a dim's atoms that the destination places in no
   dim. A run on one dim is one ``all_gather``; gathers on different dims commute, so a run of them takes
   minor dims first, while the buffer is small.
5. ``all_reduce`` (:class:`AllReduceMove`): drop every partial atom that the destination does not keep.
6. ``permute`` (:class:`PermuteMove`): any rearrangement of the atoms that keeps each dim's block count
   and the partial atoms, in one step that receives one whole buffer. It is not a move of the forward
   search (enumerating the arrangements, or chains of swaps, is what blew up): a plan has at most one
   permute, the join of a forward path and a backward suffix (see "Search" in :mod:`redist.synthesis.search`).

Invariant (memory-efficient normal form). Along every plan the local size never rises and then falls
again: moves 1 and 2 are tried only until a gather has grown the buffer. The local sizes are therefore
valley-shaped, and ``peak_bytes == max(src.local_bytes, dst.local_bytes)``. Only the atoms the
destination places in dims are sliced, and only atoms it does not place are gathered: any other slice
would have to be gathered again, and can only cost more.

:data:`TRY_STEPS` and :data:`UNTRY_STEPS` are the generators in this order; :func:`run_tag` says which moves
merge into one step.
"""

from __future__ import annotations

from typing import NamedTuple

from redist import steps as S
from redist.axes import remove_axes
from redist.synthesis.space import Back, Node, Run, Space, mask


# Each try-step yields, for every move of its kind out of a node, ``(record class, its fields, next state, the
# next state's local bytes, bytes received × scale, mask of the group's atoms, new step?)``. The search makes the
# record only when the move becomes the best way into its next state (about a quarter of the states generated):
# making one for every generated state costs a tenth of the search's time.


class SliceMove(NamedTuple):
    """1. ``all_slice``: push the free atom ``atom`` onto the minor end of ``dim``."""

    dim: int
    atom: int

    def step(self, run: Run) -> S.AllSlice:
        return S.AllSlice(self.dim, run.pushed(self.dim))


def _try_slices(space: Space, node: Node):
    """Before any gather: each free atom that the destination places in dims, onto each dim whose local size
    it divides (after a slice onto dim ``d``, onto dims ``d`` and later only)."""
    dims, partial, grown, run, local_bytes, scaled, local, free = node
    if grown:
        return
    sizes = space.sizes
    first = run[1] if run and run[0] is SliceMove else 0  # slices on different dims commute: in dim order
    slicing = free & space.wanted
    for a in range(len(sizes)):
        if not slicing >> a & 1:
            continue
        after = local_bytes // sizes[a]
        for i in range(first, len(dims)):
            if local[i] % sizes[a] == 0:
                tag = (SliceMove, i)
                yield (SliceMove, (i, a), (dims[:i] + (dims[i] + (a,),) + dims[i + 1:], partial, False, tag), after,
                       0, 0, run != tag)


class ReduceScatterMove(NamedTuple):
    """2. ``reduce_scatter``: sum over the partial atom ``atom`` and push it onto the minor end of ``dim``."""

    dim: int
    atom: int

    def step(self, run: Run) -> S.ReduceScatter:
        return S.ReduceScatter(self.dim, run.pushed(self.dim), run.before.reduction)


def _try_reduce_scatters(space: Space, node: Node):
    """Before any gather: each partial atom that the destination does not keep, onto each dim whose local size
    it divides."""
    dims, partial, grown, run, local_bytes, scaled, local, free = node
    if grown:
        return
    sizes = space.sizes
    reducing = partial & space.reducible
    for a in range(len(sizes)):
        if not reducing >> a & 1:
            continue
        k = sizes[a]
        after, received = local_bytes // k, (k - 1) * scaled // k
        for i in range(len(dims)):
            if local[i] % k == 0:
                tag = (ReduceScatterMove, i)
                yield (ReduceScatterMove, (i, a), (dims[:i] + (dims[i] + (a,),) + dims[i + 1:], partial & ~(1 << a),
                       False, tag), after, received, 1 << a, run != tag)


class AllToAllMove(NamedTuple):
    """3. ``all_to_all``: for each ``(i, j, m)`` of ``moves`` (one or two, from distinct dims that are not
    destinations), move the last ``m`` atoms of dim ``i`` to the minor end of dim ``j``."""

    moves: tuple[tuple[int, int, int], ...]

    def step(self, run: Run) -> S.AllToAll | S.MultiAllToAll:
        before = run.dims_before
        parts = [(i, j, run.tokens(before[i][len(before[i]) - m:])) for i, j, m in self.moves]
        return S.AllToAll(*parts[0]) if len(parts) == 1 else S.MultiAllToAll(tuple(parts))


def _try_all_to_alls(space: Space, node: Node):
    """Each suffix of each dim, to each other dim whose local size its blocks divide; then each two such moves
    from two dims, into two others or into one."""
    dims, partial, grown, run, local_bytes, scaled, local, free = node
    singles = []  # (i, j, m, suffix, k): the last m atoms of dim i, of k blocks, can move to dim j
    for i, di in enumerate(dims):
        for m in range(1, len(di) + 1):
            suffix = di[len(di) - m:]
            k = space.blocks(suffix)
            for j in range(len(dims)):
                if j != i and local[j] % k == 0:
                    singles.append((i, j, m, suffix, k))
                    nd = list(dims)
                    nd[i], nd[j] = di[: len(di) - m], dims[j] + suffix
                    yield (AllToAllMove, (((i, j, m),),), (tuple(nd), partial, grown, None), local_bytes,
                           (k - 1) * scaled // k, mask(suffix), True)
    # Two moves from two dims: into two others, or into one (appended in move order, so both orders are tried).
    for x, (i1, j1, m1, suffix1, k1) in enumerate(singles):
        for y, (i2, j2, m2, suffix2, k2) in enumerate(singles):
            if i1 == i2 or {i1, i2} & {j1, j2} or (j1 != j2 and y <= x):
                continue
            k = k1 * k2
            if j1 == j2 and local[j1] % k:
                continue
            nd = list(dims)
            nd[i1], nd[i2] = dims[i1][: len(dims[i1]) - m1], dims[i2][: len(dims[i2]) - m2]
            nd[j1] = dims[j1] + suffix1
            nd[j2] = nd[j2] + suffix2
            yield (AllToAllMove, (((i1, j1, m1), (i2, j2, m2)),), (tuple(nd), partial, grown, None), local_bytes,
                   (k - 1) * scaled // k, mask(suffix1 + suffix2), True)


class GatherMove(NamedTuple):
    """4. ``all_gather``: pop the last ``count`` atoms of ``dim``."""

    dim: int
    count: int

    def step(self, run: Run) -> S.AllGather:
        return S.AllGather(self.dim, run.popped(self.dim))


def _try_gathers(space: Space, node: Node):
    """Each suffix of each dim that holds no atom the destination places in dims (after a gather from dim
    ``d``, from dims up to ``d`` only)."""
    dims, partial, grown, run, local_bytes, scaled, local, free = node
    wanted = space.wanted
    # Gathers on different dims commute: minor dims first, while the buffer is small (a gather along a minor
    # dim interleaves and needs a transpose; along dim 0 it appends).
    stop = run[1] + 1 if run and run[0] is GatherMove else len(dims)
    for i in range(stop):
        di, tag = dims[i], (GatherMove, i)
        for m in range(1, len(di) + 1):
            suffix = di[len(di) - m:]
            moved = mask(suffix)
            if moved & wanted:
                break  # the destination places that atom in a dim; longer suffixes hold it too
            k = space.blocks(suffix)
            yield (GatherMove, (i, m), (dims[:i] + (di[: len(di) - m],) + dims[i + 1:], partial, True, tag),
                   local_bytes * k, (k - 1) * scaled, moved, run != tag)


class AllReduceMove(NamedTuple):
    """5. ``all_reduce``: sum over every partial atom the destination does not keep."""

    def step(self, run: Run) -> S.AllReduce:
        return S.AllReduce(remove_axes(run.before.partial, run.dst.partial), run.before.reduction)


def _try_all_reduce(space: Space, node: Node):
    """One move, if some partial atom is one the destination does not keep."""
    dims, partial, grown, run, local_bytes, scaled, local, free = node
    reduced = partial & space.reducible
    if reduced:
        k = space.product(reduced)
        yield (AllReduceMove, (), (dims, partial & ~space.reducible, grown, None), local_bytes,
               2 * (k - 1) * scaled // k, reduced, True)


class PermuteMove(NamedTuple):
    """6. ``permute``: send whole buffers so that the dims hold ``dims`` (the same block count in every dim,
    the same partial atoms). Made by the search only to join a forward path to a backward suffix
    (``_Suffixes.join`` in :mod:`redist.synthesis.search`)."""

    dims: tuple[tuple[int, ...], ...]

    def step(self, run: Run) -> S.Permute:
        return S.Permute(tuple(run.tokens(d) for d in run.dims_after))


# The try-steps, in the order of the module header's list (the order breaks ties between equally cheap plans).
TRY_STEPS = (_try_slices, _try_reduce_scatters, _try_all_to_alls, _try_gathers, _try_all_reduce)


def run_tag(move) -> tuple | None:
    """The run a move continues when it follows a move of the same tag (one dim's slices, reduce-scatters or
    gathers), else None."""
    return (type(move), move.dim) if type(move) in (SliceMove, ReduceScatterMove, GatherMove) else None


# The backward search runs from the goal over the same moves read backwards: each *untry-step* yields, for
# every move of its kind INTO a backward state (:mod:`redist.synthesis.space`), the state before it. Each
# untry-step yields ``(record, state before, bytes received × scale, mask of the group's atoms, run tag)``; the
# record is the forward move, as the try-steps make it.


def _untry_slices(space: Space, back: Back, classes):
    """A slice of the dim's last atom, if the destination places it (before a slice onto dim ``e``: onto dims
    up to ``e``, the forward order)."""
    dims, partial, sliced, first, scaled, local, free = back
    last = first[1] if first and first[0] is SliceMove else len(dims) - 1
    for i in range(last + 1):
        d = dims[i]
        if d and space.wanted >> d[-1] & 1:
            yield (SliceMove(i, d[-1]), (dims[:i] + (d[:-1],) + dims[i + 1:], partial, True, (SliceMove, i)), 0, 0,
                   (SliceMove, i))


def _untry_reduce_scatters(space: Space, back: Back, classes):
    """A reduce-scatter of the dim's last atom, if it is a partial atom of the source that the destination does
    not keep."""
    dims, partial, sliced, first, scaled, local, free = back
    for i, d in enumerate(dims):
        if d and space.reducible >> d[-1] & 1:
            a = d[-1]
            yield (ReduceScatterMove(i, a), (dims[:i] + (d[:-1],) + dims[i + 1:], partial | 1 << a, True,
                   (ReduceScatterMove, i)), (space.sizes[a] - 1) * scaled, 1 << a, (ReduceScatterMove, i))


def _untry_all_to_alls(space: Space, back: Back, classes):
    """Each suffix of each dim, back to each other dim whose local size its blocks divide; then two such moves
    at once (from two dims, or two suffixes of one dim)."""
    dims, partial, sliced, first, scaled, local, free = back
    singles = []  # (i, j, m, suffix, k): the last m atoms of dim j came from dim i
    for j, dj in enumerate(dims):
        for m in range(1, len(dj) + 1):
            suffix = dj[len(dj) - m:]
            k = space.blocks(suffix)
            for i in range(len(dims)):
                if i != j and local[i] % k == 0:
                    singles.append((i, j, m, suffix, k))
                    nd = list(dims)
                    nd[i], nd[j] = dims[i] + suffix, dj[: len(dj) - m]
                    yield (AllToAllMove(((i, j, m),)), (tuple(nd), partial, sliced, None), (k - 1) * scaled // k,
                           mask(suffix), None)
    for x, (i1, j1, m1, suffix1, k1) in enumerate(singles):
        for i2, j2, m2, suffix2, k2 in singles[x + 1:]:
            if i1 == i2 or {i1, i2} & {j1, j2} or j1 == j2:
                continue
            yield _double(space, dims, partial, sliced, scaled, (i1, j1, m1, suffix1), (i2, j2, m2, suffix2), k1 * k2)
    # Two moves into one dim j: its tail is the first move's atoms, then the second's.
    for j, dj in enumerate(dims):
        for m2 in range(1, len(dj)):
            suffix2 = dj[len(dj) - m2:]
            k2 = space.blocks(suffix2)
            for m1 in range(1, len(dj) - m2 + 1):
                suffix1 = dj[len(dj) - m2 - m1: len(dj) - m2]
                k1 = space.blocks(suffix1)
                for i1 in range(len(dims)):
                    if i1 == j or local[i1] % k1:
                        continue
                    for i2 in range(len(dims)):
                        if i2 not in (i1, j) and local[i2] % k2 == 0:
                            yield _double(space, dims, partial, sliced, scaled, (i1, j, m1, suffix1),
                                          (i2, j, m2, suffix2), k1 * k2)


def _double(space: Space, dims, partial, sliced, scaled, move1, move2, k):
    """The untry of one all-to-all of two moves ``(i, j, m, suffix)``: each suffix back from dim j to dim i."""
    (i1, j1, m1, suffix1), (i2, j2, m2, suffix2) = move1, move2
    nd = list(dims)
    nd[j2] = nd[j2][: len(nd[j2]) - m2]
    nd[j1] = nd[j1][: len(nd[j1]) - m1]
    nd[i1] = dims[i1] + suffix1
    nd[i2] = dims[i2] + suffix2
    return (AllToAllMove(((i1, j1, m1), (i2, j2, m2))), (tuple(nd), partial, sliced, None), (k - 1) * scaled // k,
            mask(suffix1 + suffix2), None)


def _untry_gathers(space: Space, back: Back, classes):
    """Before any slice: a gather of an atom that the destination places in no dim, pushed onto a dim whose
    local size it divides (after a gather from dim ``e``: onto dims from ``e`` on, the forward order). Atoms of
    one class are interchangeable here, so each class offers its first free atom only."""
    dims, partial, sliced, first, scaled, local, free = back
    if sliced:
        return
    start = first[1] if first and first[0] is GatherMove else 0
    for a in _representatives(free & ~space.wanted, classes):
        k = space.sizes[a]
        if k == 1:  # an atom of a size-1 axis: gathering it moves nothing, and would hide a run's latency
            continue
        for i in range(start, len(dims)):
            if local[i] % k == 0:
                yield (GatherMove(i, 1), (dims[:i] + (dims[i] + (a,),) + dims[i + 1:], partial, False, (GatherMove, i)),
                       (k - 1) * scaled // k, 1 << a, (GatherMove, i))


def _untry_all_reduce(space: Space, back: Back, classes):
    """If no partial atom is left to reduce: an all-reduce of each set of free atoms that the source holds
    partial and the destination does not keep."""
    dims, partial, sliced, first, scaled, local, free = back
    if partial & space.reducible:
        return
    pool = [a for a in range(len(space.sizes)) if (free & space.reducible) >> a & 1]
    for r in range(1, 1 << len(pool)):
        reduced = mask(a for n, a in enumerate(pool) if r >> n & 1)
        k = space.blocks(a for n, a in enumerate(pool) if r >> n & 1)
        yield AllReduceMove(), (dims, partial | reduced, sliced, None), 2 * (k - 1) * scaled // k, reduced, None


def _representatives(mask: int, classes) -> list[int]:
    """The first atom of each class among the atoms of ``mask``."""
    seen, out = set(), []
    a = 0
    while mask:
        if mask & 1 and classes[a] not in seen:
            seen.add(classes[a])
            out.append(a)
        mask >>= 1
        a += 1
    return out


# The untry-steps, in the same order.
UNTRY_STEPS = (_untry_slices, _untry_reduce_scatters, _untry_all_to_alls, _untry_gathers, _untry_all_reduce)
