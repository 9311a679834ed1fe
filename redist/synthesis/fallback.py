"""The fallback plan, and the figures from atoms that prune the searches against it.

When no search finds a plan within its budget, or none exists in normal form, the plan is :func:`fallback`:
reduce the pending sums that the destination does not keep, then one ``exchange`` ("Budget and fallback" in
:mod:`redist.synthesis`). What it receives, :func:`fallback_cost`, caps the searches by bytes ("Pruning" in
:mod:`redist.synthesis.search`). :func:`bound` (the lower bound) and :func:`reduction_bound` (the least that
reducing costs a plan of the normal form) decide whether the plan over named atoms is kept without a search
over prime ones. All three figures are computed from the atoms, without enumerating devices, × the mesh size
(the search's unit).
"""

from __future__ import annotations

from fractions import Fraction

from redist import steps as S
from redist.axes import Axis, difference, remove_axes
from redist.plan import Plan
from redist.synthesis.space import Space, mask
from redist.types import ShardingType


def fallback(src: ShardingType, dst: ShardingType) -> Plan:
    """The plan when the searches give up (even types): reduce the pending sums that ``dst`` does not keep,
    then one ``exchange`` to ``dst``, which receives exactly the elements each device lacks.

    Each reduced axis is reduce-scattered onto the first dim whose local size it divides, and those that fit
    nowhere are all-reduced after them: reduce-scatters over a group of ``k`` devices receive
    ``(k−1)/k · L_src`` in all, half of what an all-reduce receives, and leave a smaller buffer. Peak:
    ``max(src.local_bytes, dst.local_bytes)``. Bytes: the lower bound without a reduction, else at most
    ``2(k−1)/k · L_src + L_dst``. Correct for any valid pair without created sums. It is also the exchange
    candidate of ``_fewest_bytes`` and, with a topology, of :func:`~redist.synthesis.synthesize` (both in
    :mod:`redist.synthesis.cases`).
    """
    return Plan.from_steps(src, (*_fallback_reductions(src, dst), S.Exchange(dst.dims)))


def _fallback_reductions(src: ShardingType, dst: ShardingType) -> list:
    """The reductions :func:`fallback` runs before its exchange, in order."""
    placed: list[tuple[int, tuple[Axis, ...]]] = []  # (dim, axes) of each reduce_scatter
    unplaced = []
    local = list(src.local_shape)
    for axis in remove_axes(src.partial, dst.partial):
        k = axis.size
        dim = next((i for i, n in enumerate(local) if n % k == 0), None)
        if dim is None:
            unplaced.append(axis)
            continue
        local[dim] //= k
        if placed and placed[-1][0] == dim:  # onto the same dim again: one reduce_scatter over both
            placed[-1] = (dim, placed[-1][1] + (axis,))
        else:
            placed.append((dim, (axis,)))
    steps = [S.ReduceScatter(dim, axes, src.reduction) for dim, axes in placed]
    if unplaced:
        steps.append(S.AllReduce(tuple(unplaced), src.reduction))
    return steps


def fallback_cost(src: ShardingType, dst: ShardingType) -> Fraction:
    """What :func:`fallback`'s plan receives, × the mesh size (the search's unit), without enumerating devices
    or building the plan: its reductions' bytes (the same on every device), then the exchange's, the lower bound
    from the type after them."""
    t, reductions = src, Fraction(0)
    for step in _fallback_reductions(src, dst):
        reductions += step.bytes_received(t)
        t = step.apply(t)
    return reductions * src.mesh.size + bound(t, dst)


def bound(src: ShardingType, dst: ShardingType) -> int:
    """:func:`redist.lower_bound_bytes` of even types, × the mesh size (the search's unit), from the atoms."""
    space = Space.of(src, dst, refine=False)
    return space.missing_bytes(*space.start[:2]) * space.scale


def reduction_bound(src: ShardingType, dst: ShardingType) -> int:
    """A lower bound on the bytes that every plan of the normal form receives from even ``src`` to ``dst`` when
    it reduces pending sums (those ``dst`` does not keep), × the mesh size (the search's unit); 0 when it reduces
    none. :func:`redist.lower_bound_bytes` counts a reduction as the destination block only; this counts what
    reducing costs.

    Read the local size as a potential. An ``all_slice`` lowers it at no cost; a ``reduce_scatter`` receives
    exactly what it lowers it by, an ``all_gather`` exactly what it raises it by; an ``all_reduce`` over atoms
    of product ``g`` at size ``X`` receives ``2 (1 - 1/g) X`` and keeps it, as all-to-alls (which receive
    something) and a permute (at least nothing) do. The sizes of a normal-form plan fall from the source's
    ``L`` to a bottom ``B``, then rise to the destination's ``D``: its gathers receive ``D - B``, its
    reduce-scatters ``L - B`` less what its slices lowered. The slices push free atoms the destination places,
    of product at most ``S``, and lower the size most when they come first: by ``L - L/σ`` at most (``σ`` the
    product sliced). The atoms reduced (of product ``K``) are reduce-scattered (product ``r``, so ``B = L/(σ
    r)``) or all-reduced at once (product ``K/r``) at a size of at least ``B``. Adding up, every plan receives
    at least ``D + L/σ - 2 L/(σ K) >= D + (L/S)(1 - 2/K)`` (``K >= 2``): the all-reduce of a replicated
    ``partial{model}`` (``2 L (1 - 1/K)``), a reduce-scatter (``D = L/K``), a reduction then a gather of what
    the destination does not split, all meet it.

    Plans outside the normal form can receive less, slicing an atom the destination replicates before reducing
    and gathering it back after: on a mesh ``batch=16, model=64``, ``f32[1024,16] partial{model} ->
    f32[1024,16]`` in 69,504 B per device (all-slice on ``batch``, reduce-scatter on ``model``, all-gather of
    both), against the all-reduce's 129,024 B.

    The search over prime atoms is skipped where the plan over named atoms meets this bound (``_final`` in
    :mod:`redist.synthesis.cases`): on meshes of a thousand devices it would run its whole budget of states
    on such reductions and find nothing better. ``tests/redist/test_synthesis_scale.py`` checks the bound
    against searches run to the end on random pairs, and that plans are the same with and without the second
    search."""
    if not difference(src.partial, dst.partial):  # nothing to reduce: no atoms to work out
        return 0
    space = Space.of(src, dst, refine=False)
    dims, partial = space.start[:2]
    k = space.product(space.reducible)
    if k < 2:
        return 0
    s = space.product(space.wanted & ~mask(a for d in dims for a in d) & ~partial)
    # (L/S)(1 - 2/K) == L/(S K) (K - 2), L/(S K) a whole number of units: the atoms of src's dims, the free
    # ones sliced and the reduced ones are distinct, so their product divides the mesh size
    return space.local_bytes(space.goal[0]) * space.scale + space.local_bytes(dims) * space.scale // (s * k) * (k - 2)
