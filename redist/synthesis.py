"""Plan synthesis: the cheapest memory-bounded sequence of collectives from one sharding type to another.

Search space. A state is a sharding of the array over *atoms*: the mesh axes, or the pieces of them that
the source or destination name as sub-axes. Each dim holds a stack of atoms (major to minor), and the
steps act at its minor end. A state also holds its partial atoms, whether a gather has grown the buffer,
and the run of moves in progress (so that a run merges into one step).

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
6. ``permute`` (:class:`SwapMove`): swap two atoms (within a dim, across dims with equal sizes, or with a
   free atom of the same size that the destination places); a run of up to ``_MAX_SWAPS`` swaps is one
   permute.

Invariant (memory-efficient normal form). Along every plan the local size never rises and then falls
again: moves 1 and 2 are tried only until a gather has grown the buffer. The local sizes are therefore
valley-shaped, and ``peak_bytes == max(src.local_bytes, dst.local_bytes)``. Only the atoms the
destination places in dims are sliced, and only atoms it does not place are gathered: any other slice
would have to be gathered again, and can only cost more.

Choice. When source and destination have the same block count in every dim and the same partial axes, the
plan is one ``permute``, with no search: it receives exactly the lower bound, in one step. Otherwise A*
over these states, minimising (bytes received, number of steps): a move is charged what its step receives
(the moves of a run together what their one step receives; a run of swaps, one whole buffer), and a run
counts as one step. Costs are exact integers in units of ``1 / mesh.size`` bytes (every ``k`` divides the
mesh size). The heuristic ``max(0, L_dst − L)`` is admissible: buffers grow only through all-gathers,
which receive exactly what they add. The search ends when it takes a goal state (the destination's dims
and partial atoms) off the queue, or when the queue is empty (no normal-form plan over these atoms). Sizes
of axes are arbitrary integers. When the plan over the named atoms does not meet the lower bound or takes
three steps or more (for a plan without reductions, where the bound is tight enough to tell), or no plan
exists over them (an axis must be swapped for a part of another of a different size), the search is run
again with every atom split into prime factors (Shardy's sub-axes) and the better plan is kept. With a
topology, the objective is modeled time (a run pays its latency once) and the heuristic is the missing
growth over the fastest link.

Reductions. The reduction kind of a pending value (sum, max, min, prod) is the same on both sides
(:func:`redist.bounds.check_pair`); every ``reduce_scatter`` and ``all_reduce`` of a plan takes the source's,
and the search is the same for every kind.

Device orders. Between the same axes on two device orders (SPEC 1), the plan is the plan on one order and a
``permute`` to the other, either after all its steps or before them (the plan from the source moved to the
destination's order); where that end of the plan is a ``permute`` or an ``exchange`` already, that step moves
the blocks to the other order too, at no extra cost. The fewer bytes (with a topology: the faster) of the
two is returned. Every collective of the plan thus runs on one device order.

Budget and fallback. The searches of one ``synthesize`` call generate at most ``_MAX_STATES`` (200,000)
states in all, fewer for ranks above 8 (a state is a tuple per dim), and twice that with a topology (its
own searches by modeled time get a second budget); a search over sub-axes also stops after
``_MAX_REFINED_EXPANSIONS`` expansions, except when the search over whole axes found no plan by bytes.
This bounds the searches of a call to about 2 seconds and 250 MB (measured on a shared 2-core machine, up
to rank 128 on 16 axes). The budget counts states, not seconds, so that every MPI rank, synthesizing on
its own, gets the same plan. In the benchmark's sample (1,200 pairs up to rank 4, on up to 4 axes) no
search needs more than about 75,000 states. When no search finds a plan within the budget, or none exists
in normal form (a cycle of atoms longer than ``_MAX_SWAPS`` swaps, say), ``synthesize`` still returns a
plan, and never raises for a valid pair: the pending sums that the destination does not keep are reduced
(reduce-scattered onto dims they divide, else all-reduced), then one ``exchange`` receives exactly what
each device lacks. It is memory-bounded like every plan and, without a reduction, at the lower bound in
bytes, but it is point-to-point traffic rather than collectives; with a reduction it can receive more than
a searched plan would.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

from redist import cost
from redist import steps as S
from redist.axes import Axis, canonical_axes, difference, remove_axes
from redist.bounds import check_pair, lower_bound_bytes
from redist.errors import ShardingError
from redist.mesh import Mesh, prime_factors
from redist.plan import Plan
from redist.types import ShardingType

# Several swaps in a row merge into one permute; a permute needs at most rank + 1 swaps in the cases that
# matter (reorder a dim, bring atoms in from elsewhere). Bounding the chain keeps the search small.
_MAX_SWAPS = 3
# The search budget of one synthesize() call (see "Budget and fallback" above): the states its searches may
# generate in all, twice that with a topology. Generated states, not expanded ones: an expansion of a
# high-rank state over many atoms generates tens of thousands, and each costs time and memory. A state
# holds a tuple per dim, so above rank _BUDGET_RANK the budget shrinks in proportion.
_MAX_STATES = 200_000
_BUDGET_RANK = 8
# The search over sub-axes refines a plan that usually exists already; it gives up sooner.
_MAX_REFINED_EXPANSIONS = 8_000


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


def _cut_points(mesh: Mesh, types, refine: bool) -> dict[str, list[int]]:
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


def synthesize(src: ShardingType, dst: ShardingType, topology=None) -> Plan:
    """The cheapest memory-bounded plan from ``src`` to ``dst``.

    ``plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)`` always holds, and every valid pair gets a
    plan (see "Budget and fallback" in the module header). Without a topology the plan receives the fewest
    bytes (then has the fewest steps) that the search finds within its budget. With ``topology`` (a
    :class:`redist.cost.Topology` or a preset name of :mod:`redist.cost`, laid over the source's mesh) the
    candidates (the fewest-bytes plans and the plans found by searching on modeled time, over whole axes
    and over sub-axes) are priced with :func:`redist.cost.plan_time` and the fastest is returned (ties:
    fewer bytes, then fewer steps).

    The types may lie on two device orders of the same mesh axes ("Device orders" in the module header). A
    destination partial over axes the source is not (creating pending sums) gets the plan of
    :func:`_synthesize_creating`; uneven dims, :func:`_synthesize_uneven`. Between even types the search's
    plan is compared, where no pending sum is reduced, with one ``exchange``, which receives exactly the lower
    bound: the exchange is taken where it receives fewer bytes (with ``topology``: where it is faster, its
    rounds priced by :func:`redist.cost.plan_time`).

    Raises :class:`ShardingError` if the types are on different mesh axes, have different shapes or dtypes,
    pending reductions of different kinds, or a destination that creates a pending reduction other than a
    sum, or split a mesh axis into sub-axes of two different decompositions.
    """
    check_pair(src, dst)
    topo = None if topology is None else cost.as_topology(topology, src.mesh)  # refused before any path runs
    if src.mesh != dst.mesh:
        return _across_device_orders(src, dst, topology)
    if difference(dst.partial, src.partial):
        return _synthesize_creating(src, dst, topology)
    if not (src.is_even() and dst.is_even()):
        return _synthesize_uneven(src, dst, topology)
    core_src, core_dst = _without_unit_axes(src, dst.partial), _without_unit_axes(dst, dst.partial)
    if topo is None:
        core = _fewest_bytes(core_src, core_dst)
    else:
        candidates = [_fewest_bytes(core_src, core_dst)]
        states = _state_budget(core_src)
        for refine in (False, True):
            found, used = _search(core_src, core_dst, refine, topo, states,
                                  max_expansions=_MAX_REFINED_EXPANSIONS if refine else None)
            states -= used
            if found is not None:
                candidates.append(found)
        if set(core_src.partial) == set(core_dst.partial):  # the exchange candidate, as in _fewest_bytes
            candidates.append(_fallback(core_src, core_dst))
        core = min(candidates, key=lambda p: (cost.plan_time(p, topo), p.bytes_received, len(p.steps)))
    return _with_unit_axes(src, dst, core)


def _fewest_bytes(src: ShardingType, dst: ShardingType) -> Plan:
    """The search's plan (:func:`_synthesize`), or the exchange plan of :func:`_fallback` where that receives
    strictly fewer bytes (even types without pending sums to reduce; ties keep the collectives).

    The collectives cannot put an axis under one already in a dim without moving whole buffers, where one
    point-to-point exchange moves only the pieces each device lacks (the redistribution paper's all-permute):
    it receives exactly the lower bound, so it is tried only when the search's plan misses it. With sums to
    reduce, reduce-scatters then an exchange can receive fewer bytes too, but proving such a plan on large
    meshes takes the verifier seconds (``python -m proofs``'s 64-device timing), so it is not offered there."""
    plan = _synthesize(src, dst)
    if set(src.partial) != set(dst.partial) or plan.bytes_received == lower_bound_bytes(src, dst):
        return plan
    exchange = _fallback(src, dst)
    return exchange if exchange.bytes_received < plan.bytes_received else plan


def _synthesize_creating(src: ShardingType, dst: ShardingType, topology) -> Plan:
    """A plan to a destination partial over axes ``C`` that the source is not (SPEC 3: pending sums created).

    Creating a sum moves no data: the plan runs to ``dst`` with ``C`` placed in dims or replicated (a type
    no larger than ``dst``, partial over the rest of ``dst``'s axes), then makes ``C`` partial:
    ``replicate_to_partial`` for the replicated ones, ``shard_to_partial`` for those at the minor end of a dim
    (each member's block becomes its zero-padded summand, where a gather would receive the others'). The
    candidates place ``C`` (see :func:`_creation_placements`) and each synthesizes the plan to that type;
    the fewest bytes (with ``topology``: the fastest), then the fewest steps, is returned. Peak: the plan
    before the creation stays within ``max(src, type before)``, and the creation only grows the buffer to
    ``dst``'s.
    """
    created = difference(dst.partial, src.partial)
    kept = difference(dst.partial, created)
    candidates = []
    for placed in _creation_placements(src, dst, created):
        before = _type_or_none(dst, tuple(d + placed.get(i, ()) for i, d in enumerate(dst.dims)), kept)
        if before is None:
            continue
        steps = [S.ShardToPartial(i, axes) for i, axes in sorted(placed.items())]
        replicated = difference(created, tuple(a for axes in placed.values() for a in axes))
        if replicated:
            steps.insert(0, S.ReplicateToPartial(replicated))
        try:
            Plan.from_steps(before, steps)
        except ShardingError:  # a dim that the created axes would leave uneven: their blocks do not nest
            continue
        candidates.append(Plan.from_steps(src, synthesize(src, before, topology).steps + tuple(steps)))
    return _cheapest(candidates, topology, src.mesh)


def _creation_placements(src: ShardingType, dst: ShardingType, created) -> list[dict[int, tuple[Axis, ...]]]:
    """Where to put the created axes before they become partial: ``{dim: axes appended to dst's dim}``, the
    rest replicated. First each axis in the dim where the source has it (then it becomes a summand without
    moving), else replicated; then none placed; then, for each dim, each axis where the source has it, else
    in that dim (the reduction before the creation then moves a smaller buffer). Duplicates are dropped."""
    def home(a: Axis) -> int | None:
        return next((i for i, d in enumerate(src.dims) for b in d if a.overlaps(b)), None)

    options: list[dict[int, tuple[Axis, ...]]] = []
    for fallback in (None, "replicated", *range(dst.rank)):
        placed: dict[int, tuple[Axis, ...]] = {}
        if fallback != "replicated":
            for a in created:
                i = home(a)
                i = fallback if i is None else i
                if i is not None:
                    placed[i] = placed.get(i, ()) + (a,)
        if placed not in options:
            options.append(placed)
    return options


def _across_device_orders(src: ShardingType, dst: ShardingType, topology) -> Plan:
    """A plan between two device orders of the same axes ("Device orders" in the module header)."""
    ids = dst.mesh.device_ids
    after = synthesize(src, dst.replace(mesh=src.mesh), topology)
    steps = list(after.steps)
    if steps and isinstance(steps[-1], (S.Permute, S.Exchange)):
        steps[-1] = replace(steps[-1], device_ids=ids)
    else:
        steps.append(S.Permute(dst.dims, ids))
    before = synthesize(src.replace(mesh=dst.mesh), dst, topology)
    first = [S.Permute(src.dims, ids)] + list(before.steps)
    if before.steps and isinstance(before.steps[0], (S.Permute, S.Exchange)):
        first = [replace(before.steps[0], device_ids=ids)] + list(before.steps[1:])
    candidates = [Plan.from_steps(src, steps), Plan.from_steps(src, first)]
    return _cheapest(candidates, topology, src.mesh)


def _cheapest(candidates, topology, mesh: Mesh) -> Plan:
    """The fewest-bytes candidate (ties: fewest steps, then the first), or with ``topology`` the fastest (ties:
    fewest bytes, then steps)."""
    if topology is None:
        return min(candidates, key=lambda p: (p.bytes_received, len(p.steps)))

    topo = cost.as_topology(topology, mesh)
    return min(candidates, key=lambda p: (cost.plan_time(p, topo), p.bytes_received, len(p.steps)))


def _synthesize_uneven(src: ShardingType, dst: ShardingType, topology) -> Plan:
    """A plan between types with uneven dims (see "Uneven dims" in :mod:`redist.steps`).

    With equal padded shapes: the plan between the padded views, between a ``pad`` and an ``unpad`` (views:
    the buffers are those of the collectives' plan, and its peak and bytes are theirs). Otherwise the plan
    ends with an ``exchange``, which receives exactly what each device lacks. Without pending sums to reduce
    that is the whole plan, at the lower bound. With them, the fewest-bytes (with ``topology``: the fastest)
    of: an ``all_reduce`` before or after the exchange (after: if the destination does not place a reduced
    axis in a dim), a plan on the padded view that reduce-scatters the reduced axes onto one dim whose
    padded size they keep, then the exchange, and the plans that reduce-scatter onto whole dims that the
    scatter leaves uneven (:func:`_uneven_reduce_scatters`). Peak: at most ``max(src, dst)`` local bytes in
    every case.
    """
    if src == dst:
        return Plan.from_steps(src, ())
    if src.padded_shape == dst.padded_shape:
        return _between_padded_views(src, dst, topology)
    reduced = remove_axes(src.partial, dst.partial)
    exchange = S.Exchange(dst.dims)
    if not reduced:
        return Plan.from_steps(src, (exchange,))
    candidates = [Plan.from_steps(src, (S.AllReduce(reduced, src.reduction), exchange))]
    if _type_or_none(src, dst.dims, src.partial) is not None:
        candidates.append(Plan.from_steps(src, (exchange, S.AllReduce(reduced, src.reduction))))
    bound = max(src.local_bytes, dst.local_bytes)
    for d in range(src.rank):
        mid = _type_or_none(src, src.dims[:d] + (src.dims[d] + reduced,) + src.dims[d + 1:], dst.partial)
        if mid is not None and mid.padded_shape == src.padded_shape and mid.local_bytes <= bound:
            first = _between_padded_views(src, mid, topology)
            candidates.append(Plan.from_steps(src, first.steps + (exchange,)))
    candidates += _uneven_reduce_scatters(src, dst, reduced, topology)
    return _cheapest(candidates, topology, src.mesh)


def _uneven_reduce_scatters(src: ShardingType, dst: ShardingType, reduced, topology) -> list[Plan]:
    """Plans that begin with reduce-scatters onto dims that no axis splits in ``src``, which may leave them
    uneven (the padding rule; no padding is reduced in MPI's ``Reduce_scatter`` with counts), then go on to
    ``dst`` (:func:`synthesize`, whatever sums are left). One plan per choice: each such dim takes the
    ``reduced`` axes that ``dst`` places in it, in ``dst``'s order; or one such dim takes them all."""
    whole = [i for i, d in enumerate(src.dims) if not d]
    choices = [{i: tuple(a for a in dst.dims[i] if remove_axes(reduced, (a,)) is not None) for i in whole}]
    choices += [{i: reduced} for i in whole]
    plans = []
    for choice in choices:
        choice = {i: axes for i, axes in choice.items() if axes}
        placed = tuple(a for axes in choice.values() for a in axes)
        rest = remove_axes(src.partial, placed) if placed else None
        if rest is None:
            continue
        steps = [S.ReduceScatter(i, axes, src.reduction) for i, axes in sorted(choice.items())]
        try:
            mid = Plan.from_steps(src, steps)
        except ShardingError:  # a sub-axis order the type cannot hold
            continue
        plans.append(Plan.from_steps(src, mid.steps + synthesize(mid.dst, dst, topology).steps))
    return plans


def _between_padded_views(src: ShardingType, dst: ShardingType, topology) -> Plan:
    """``pad``, the plan between the even padded views, ``unpad`` (src and dst have one padded shape)."""
    core = synthesize(src.padded(), dst.padded(), topology)
    if src.is_even() and dst.is_even():
        return core
    return Plan.from_steps(src, (S.Pad(),) + core.steps + (S.Unpad(src.shape),))


def _type_or_none(t: ShardingType, dims, partial) -> ShardingType | None:
    """``t`` with ``dims`` and ``partial``, or None if that is not a valid type (an axis used twice)."""
    try:
        return t.replace(dims=dims, partial=partial)
    except ShardingError:
        return None


def _without_unit_axes(t: ShardingType, keep_partial) -> ShardingType:
    """``t`` without its mesh axes of size 1 (they split nothing): out of the dims, and out of the partial
    axes unless ``keep_partial`` names them."""
    unit = {n for n, size in t.mesh.axes if size == 1}
    return t.replace(dims=tuple(tuple(a for a in d if a not in unit) for d in t.dims),
                     partial=tuple(a for a in t.partial if a not in unit or a in keep_partial))


def _with_unit_axes(src: ShardingType, dst: ShardingType, core: Plan) -> Plan:
    """``core`` (between the types without size-1 axes) with the steps that drop and place those axes: they
    move no data, so an ``all_reduce`` or ``permute`` over them receives nothing."""
    steps, t = [], src
    reduced = tuple(a for a in src.partial if a not in core.src.partial)
    if reduced:
        steps.append(S.AllReduce(reduced, src.reduction))
        t = steps[-1].apply(t)
    if t != core.src:
        steps.append(S.Permute(core.src.dims))
    steps += core.steps
    if core.dst != dst:
        if steps and isinstance(steps[-1], S.Permute):  # two permutes in a row are one
            steps.pop()
        steps.append(S.Permute(dst.dims))
    if tuple(steps) == core.steps:
        return core
    return Plan.from_steps(src, steps)


@lru_cache(maxsize=1024)
def _synthesize(src: ShardingType, dst: ShardingType) -> Plan:
    """The fewest-bytes plan (ties: fewest steps); :func:`_fallback` if the searches give up."""
    direct = _single_permute(src, dst)
    if direct is not None:
        return direct
    budget = _state_budget(src)
    plan, used = _search(src, dst, refine=False, max_states=budget)
    reduces = set(src.partial) != set(dst.partial)
    if plan is not None:
        if reduces or (plan.bytes_received == lower_bound_bytes(src, dst) and len(plan.steps) < 3):
            return plan
    # Sub-axes can help (or be needed): search again over prime-sized atoms, keep the better plan. A plan at
    # the bound may still shrink: slice, permute, gather of a whole axis is often slice, permute of a part.
    # When no plan exists over whole axes, the search over sub-axes is the only way and may expand any number
    # of states within the budget.
    finer, _ = _search(src, dst, refine=True, max_states=budget - used,
                       max_expansions=None if plan is None else _MAX_REFINED_EXPANSIONS)
    candidates = [p for p in (plan, finer) if p is not None]
    if not candidates:
        return _fallback(src, dst)
    return min(candidates, key=lambda p: (p.bytes_received, len(p.steps)))


def _state_budget(t: ShardingType) -> int:
    """The states the searches of one call may generate for types of ``t``'s rank (see ``_MAX_STATES``)."""
    return _MAX_STATES * _BUDGET_RANK // max(_BUDGET_RANK, t.rank)


def _single_permute(src: ShardingType, dst: ShardingType) -> Plan | None:
    """One ``permute`` from ``src`` to ``dst`` (no step if they are equal), or None unless both have the same
    block count in every dim and the same partial axes (even types).

    It receives exactly the lower bound: blocks of one dim with the same count are equal or disjoint, so a
    device whose block changes holds none of its new block and receives its buffer, and the others receive
    nothing. No plan receives less, and none has fewer steps.
    """
    if src.partial != dst.partial or any(src.blocks(i) != dst.blocks(i) for i in range(src.rank)):
        return None
    return Plan.from_steps(src, () if src == dst else (S.Permute(dst.dims),))


def _fallback(src: ShardingType, dst: ShardingType) -> Plan:
    """The plan when the searches give up (even types): reduce the pending sums that ``dst`` does not keep,
    then one ``exchange`` to ``dst``, which receives exactly the elements each device lacks.

    Each reduced axis is reduce-scattered onto the first dim whose local size it divides, and those that fit
    nowhere are all-reduced after them: reduce-scatters over a group of ``k`` devices receive
    ``(k−1)/k · L_src`` in all, half of what an all-reduce receives, and leave a smaller buffer. Peak:
    ``max(src.local_bytes, dst.local_bytes)``. Bytes: the lower bound without a reduction, else at most
    ``2(k−1)/k · L_src + L_dst``. Correct for any valid pair without created sums. It is also the exchange
    candidate of :func:`_fewest_bytes` and, with a topology, of :func:`synthesize`.
    """
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
    return Plan.from_steps(src, (*steps, S.Exchange(dst.dims)))


# ---------------------------------------------------------------------------------------------------- the search
# A state is ``(dims, partial, grown, run)``: the atoms of each dim (major to minor), the bit mask of the
# partial atoms, whether a gather has grown the buffer, and the run in progress: ``(SliceMove, dim)`` after a
# slice onto ``dim`` (the same for reduce-scatters and gathers), ``(SwapMove, n)`` after ``n`` swaps in a row,
# else None. A move that continues the run merges into the run's step. States are plain tuples: a search
# hashes and compares hundreds of thousands of them.


def _mask(ids) -> int:
    """The bit mask of the atoms ``ids``."""
    m = 0
    for i in ids:
        m |= 1 << i
    return m


class _Space(NamedTuple):
    """The constants of one search: the ``atoms`` and their ``sizes``, the array's ``shape`` and
    ``global_bytes``, ``scale`` (bytes are counted in units of ``1 / scale``, the mesh size), the masks of the
    atoms the destination places in dims (``wanted``) and of the partial atoms it does not keep
    (``reducible``), the ``start`` state and the ``goal`` ``(dims, partial)``."""

    atoms: _Atoms
    sizes: tuple[int, ...]
    shape: tuple[int, ...]
    global_bytes: int
    scale: int
    wanted: int
    reducible: int
    start: tuple
    goal: tuple

    @classmethod
    def of(cls, src: ShardingType, dst: ShardingType, refine: bool) -> _Space:
        """The search from ``src`` to ``dst`` over their atoms, split into prime factors if ``refine``."""
        mesh = src.mesh
        atoms = _atoms(mesh, _cut_points(mesh, (src, dst), refine))
        src_dims, dst_dims = (tuple(atoms.expand(d) for d in t.dims) for t in (src, dst))
        src_partial, dst_partial = (_mask(atoms.expand(t.partial)) for t in (src, dst))
        return cls(atoms, atoms.sizes, src.shape, src.global_bytes, mesh.size,
                   wanted=_mask(a for d in dst_dims for a in d), reducible=src_partial & ~dst_partial,
                   start=(src_dims, src_partial, False, None), goal=(dst_dims, dst_partial))

    def blocks(self, ids) -> int:
        k = 1
        for a in ids:
            k *= self.sizes[a]
        return k

    def local_bytes(self, dims) -> int:
        k = 1
        for d in dims:
            k *= self.blocks(d)
        return self.global_bytes // k

    def node(self, state, local_bytes: int) -> _Node:
        """``state`` (of ``local_bytes``) with what the moves out of it read."""
        dims, partial, grown, run = state
        used = _mask(a for d in dims for a in d)
        return _Node(dims, partial, grown, run, local_bytes, local_bytes * self.scale,
                     tuple(n // self.blocks(d) for n, d in zip(self.shape, dims)),
                     ((1 << len(self.sizes)) - 1) & ~used & ~partial)


class _Node(NamedTuple):
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


class _Run(NamedTuple):
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


# Each try-step yields, for every move of its kind out of a node, ``(record class, its fields, next state, the
# next state's local bytes, bytes received × scale, mask of the group's atoms, new step?)``. The search makes the
# record only when the move becomes the best way into its next state (about a quarter of the states generated):
# making one for every generated state costs a tenth of the search's time.


class SliceMove(NamedTuple):
    """1. ``all_slice``: push the free atom ``atom`` onto the minor end of ``dim``."""

    dim: int
    atom: int

    def step(self, run: _Run) -> S.AllSlice:
        return S.AllSlice(self.dim, run.pushed(self.dim))


def _try_slices(space: _Space, node: _Node):
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

    def step(self, run: _Run) -> S.ReduceScatter:
        return S.ReduceScatter(self.dim, run.pushed(self.dim), run.before.reduction)


def _try_reduce_scatters(space: _Space, node: _Node):
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

    def step(self, run: _Run) -> S.AllToAll | S.MultiAllToAll:
        before = run.dims_before
        parts = [(i, j, run.tokens(before[i][len(before[i]) - m:])) for i, j, m in self.moves]
        return S.AllToAll(*parts[0]) if len(parts) == 1 else S.MultiAllToAll(tuple(parts))


def _try_all_to_alls(space: _Space, node: _Node):
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
                           (k - 1) * scaled // k, _mask(suffix), True)
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
                   (k - 1) * scaled // k, _mask(suffix1 + suffix2), True)


class GatherMove(NamedTuple):
    """4. ``all_gather``: pop the last ``count`` atoms of ``dim``."""

    dim: int
    count: int

    def step(self, run: _Run) -> S.AllGather:
        return S.AllGather(self.dim, run.popped(self.dim))


def _try_gathers(space: _Space, node: _Node):
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
            moved = _mask(suffix)
            if moved & wanted:
                break  # the destination places that atom in a dim; longer suffixes hold it too
            k = space.blocks(suffix)
            yield (GatherMove, (i, m), (dims[:i] + (di[: len(di) - m],) + dims[i + 1:], partial, True, tag),
                   local_bytes * k, (k - 1) * scaled, moved, run != tag)


class AllReduceMove(NamedTuple):
    """5. ``all_reduce``: sum over every partial atom the destination does not keep."""

    def step(self, run: _Run) -> S.AllReduce:
        return S.AllReduce(remove_axes(run.before.partial, run.dst.partial), run.before.reduction)


def _try_all_reduce(space: _Space, node: _Node):
    """One move, if some partial atom is one the destination does not keep."""
    dims, partial, grown, run, local_bytes, scaled, local, free = node
    reduced = partial & space.reducible
    if reduced:
        k = space.blocks(a for a in range(len(space.sizes)) if reduced >> a & 1)
        yield (AllReduceMove, (), (dims, partial & ~space.reducible, grown, None), local_bytes,
               2 * (k - 1) * scaled // k, reduced, True)


class SwapMove(NamedTuple):
    """6. ``permute``: a swap of two atoms, after which the dims hold ``dims``. A run of swaps is one permute
    to the dims after its last swap."""

    dims: tuple[tuple[int, ...], ...]

    def step(self, run: _Run) -> S.Permute:
        return S.Permute(tuple(run.tokens(d) for d in run.dims_after))


def _try_swaps(space: _Space, node: _Node):
    """Each swap of :func:`_swaps`, while the run has fewer than ``_MAX_SWAPS`` swaps."""
    dims, partial, grown, run, local_bytes, scaled, local, free = node
    chain = run[1] if run and run[0] is SwapMove else 0
    if chain == _MAX_SWAPS:
        return
    tag, received = (SwapMove, chain + 1), 0 if chain else scaled  # a run pays its whole buffer once
    for nd in _swaps(dims, space.sizes, free & space.wanted):
        moved = _mask(a for d, e in zip(dims, nd) for a, b in zip(d, e) if a != b)
        yield SwapMove, (nd,), (nd, partial, grown, tag), local_bytes, received, moved, not chain


def _swaps(dims, sizes, swappable_free):
    """Dims after one swap of two atom slots, or of a slot with an unused atom of the same size."""
    slots = [(i, p) for i, d in enumerate(dims) for p in range(len(d))]
    for x, (i, p) in enumerate(slots):
        a = dims[i][p]
        for j, q in slots[x + 1:]:
            b = dims[j][q]
            if i != j and sizes[a] != sizes[b]:
                continue
            nd = [list(d) for d in dims]
            nd[i][p], nd[j][q] = b, a
            yield tuple(tuple(d) for d in nd)
        c = 0
        free = swappable_free
        while free:
            if free & 1 and sizes[c] == sizes[a]:
                nd = [list(d) for d in dims]
                nd[i][p] = c
                yield tuple(tuple(d) for d in nd)
            free >>= 1
            c += 1


# The try-steps, in the order of the module header's list (the order breaks ties between equally cheap plans).
_TRY_STEPS = (_try_slices, _try_reduce_scatters, _try_all_to_alls, _try_gathers, _try_all_reduce, _try_swaps)


def _search(src: ShardingType, dst: ShardingType, refine: bool, topo=None, max_states: int = _MAX_STATES,
            max_expansions: int | None = None) -> tuple[Plan | None, int]:
    """A* over normal-form plans on the atoms of ``refine``; objective: bytes received, or with ``topo``
    modeled time. Returns the plan, or None if there is none or the search gives up (after ``max_states``
    generated states or ``max_expansions`` expanded ones), and the number of states it generated."""
    space = _Space.of(src, dst, refine)
    price, h = _objective(space, topo)
    best = {space.start: (0, 0)}  # the cheapest (cost, steps) found to each state
    parent: dict = {space.start: None}  # state -> (state before, move, new step?) on that cheapest path
    start_bytes = space.local_bytes(space.start[0])
    heap = [(h(start_bytes), 0, 0, 0, space.start, start_bytes)]
    tie = expansions = generated = 0
    while heap:
        _, g, nsteps, _, state, local_bytes = heapq.heappop(heap)
        if best[state] != (g, nsteps):
            continue  # a cheaper path to it was found after this entry was queued
        if state[:2] == space.goal:
            return _build(src, dst, space, parent, state), generated
        expansions += 1
        if max_expansions is not None and expansions > max_expansions:
            return None, generated
        node = space.node(state, local_bytes)
        for try_step in _TRY_STEPS:
            for kind, fields, nstate, nbytes, received, group, new_step in try_step(space, node):
                if generated == max_states:
                    return None, generated
                generated += 1
                ng, ns = g + price(received, group, new_step), nsteps + new_step
                old = best.get(nstate)
                if old is None or (ng, ns) < old:
                    best[nstate] = (ng, ns)
                    parent[nstate] = (state, kind(*fields), new_step)
                    tie += 1
                    heapq.heappush(heap, (ng + h(nbytes), ng, ns, tie, nstate, nbytes))
    return None, generated


def _objective(space: _Space, topo):
    """``(price, h)``: the cost of a move from its bytes received (× scale), its group's atoms and whether it
    starts a step; and the heuristic, a lower bound on the cost from a state's dims to the goal. In bytes
    received, or with ``topo`` in modeled seconds: alpha-beta over the slowest link of the group, a merged
    move paying no latency, and the missing growth over the fastest link."""
    scale, dst_local = space.scale, space.local_bytes(space.goal[0])
    if topo is None:
        def price(received, group, new_step):
            return received

        def h(local_bytes):
            return max(0, dst_local - local_bytes) * scale
        return price, h
    links = [topo.link(a.name) for a in space.atoms.axes]
    fastest = max(link.beta for link in links)

    def price(received, group, new_step):
        if not received:
            return 0.0
        members = [link for a, link in enumerate(links) if group >> a & 1] or links
        alpha = max(link.alpha for link in members) if new_step else 0.0
        return alpha + received / scale / min(link.beta for link in members)

    def h(local_bytes):
        return max(0, dst_local - local_bytes) / fastest
    return price, h


def _build(src: ShardingType, dst: ShardingType, space: _Space, parent: dict, state) -> Plan:
    """The plan of the search path to ``state``: each run of moves (a move that starts no new step joins the
    run before it) becomes one step, made by its last move from the dims before and after the run."""
    path = []
    while parent[state] is not None:
        before, move, new_step = parent[state]
        path.append((before[0], move, new_step, state[0]))
        state = before
    runs: list[list] = []  # [dims before the run, dims after it, its last move]
    for before, move, new_step, after in reversed(path):
        if new_step:
            runs.append([before, after, move])
        else:
            runs[-1][1:] = [after, move]
    steps, t = [], src
    for before, after, move in runs:
        steps.append(move.step(_Run(t, before, after, dst, space.atoms)))
        t = steps[-1].apply(t)
    plan = Plan.from_steps(src, steps)
    if plan.dst != dst:
        raise AssertionError(f"synthesized plan ends at {plan.dst}, not {dst}")
    return plan
