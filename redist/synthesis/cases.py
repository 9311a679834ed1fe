"""The cases of :func:`synthesize`: which plan each kind of pair gets.

Types on two meshes of other devices or axes get steps on each mesh and a ``transfer`` between them ("Across
meshes" below); types on two device orders get the plan on one order and a ``permute`` ("Device orders"); a
destination partial over axes the source is not (pending sums created), the plan to a type before the
creation, then the steps that create them (:func:`_synthesize_creating`); uneven dims, a plan between padded
views or ending in an ``exchange`` (:func:`_synthesize_uneven`). Between even types the mesh axes of size 1
are set aside (:func:`without_unit_axes`) and the plan is :func:`searched_plan`: one ``permute`` where that
is the whole plan (:func:`_single_permute`), else the searches' plan (:mod:`redist.synthesis.search`), else
the fallback (:mod:`redist.synthesis.fallback`); it is compared with one ``exchange`` and, with a topology,
with the plans of the searches by modeled time ("Choice" and "Budget and fallback" in
:mod:`redist.synthesis`).

Device orders. Between the same axes on two device orders (docs/spec.md §1), the plan is the plan on one order and a
``permute`` to the other, either after all its steps or before them (the plan from the source moved to the
destination's order); where that end of the plan is a ``permute`` or an ``exchange`` already, that step moves
the blocks to the other order too, at no extra cost. The fewer bytes (with a topology: the faster) of the
two is returned, or, where both miss the lower bound, one ``exchange`` between the orders if it receives fewer
bytes than both (without pending sums it receives exactly what each device lacks: ``f32[16{x}, 16] -> f32[16,
16{x}]`` onto the reversed order of ``x=4`` receives 192 B per device, not the all-to-all's and the permute's
448 B). Every collective of the plan thus runs on one device order.

Across meshes. Between meshes of other devices or other axes (docs/spec.md §3), the plan is steps on the
source's mesh, one ``transfer`` (:class:`redist.steps.Transfer`), steps on the destination's mesh. The
candidates pair the types the source may be brought to on its own mesh (:func:`_source_ends`: itself, or its
pending values reduced there) with the types the destination may be reached from on its mesh
(:func:`_destination_starts`: itself, a share of it to be gathered there, or its values as pending sums to be
reduced there), wherever a transfer can join them; a destination with pending sums also gets the plans that
create them after the transfer (:func:`_synthesize_creating`). The fewest bytes (with a topology: the
fastest), then the fewest steps, wins. Without pending values on either side the one transfer receives exactly
what each device lacks, the lower bound, in one step. Each end is at most its mesh's bound (the source's local
size on the source's mesh, the destination's on its), so a device never holds more than the larger of what it
holds at the two ends, and nothing where it is in neither mesh.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import lru_cache

from redist import cost
from redist import steps as S
from redist.axes import Axis, difference, remove_axes
from redist.bounds import check_pair, lower_bound_bytes
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.plan import Plan
from redist.synthesis.fallback import bound, fallback, fallback_cost, reduction_bound
from redist.synthesis.search import MAX_EXACT_STATES, MAX_REFINED_EXPANSIONS, Found, search, state_budget
from redist.synthesis.space import cut_points
from redist.types import ShardingType


def synthesize(src: ShardingType, dst: ShardingType, topology=None) -> Plan:
    """The cheapest memory-bounded plan from ``src`` to ``dst``.

    ``plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)`` always holds (per device: at most the larger of
    its bytes at the two ends, where the types are on meshes of other devices), and every valid pair gets a
    plan (see "Budget and fallback" in :mod:`redist.synthesis`). Without a topology the plan receives the fewest
    bytes (then has the fewest steps) that the search finds within its budget. With ``topology`` (a
    :class:`redist.cost.Topology` or a preset name of :mod:`redist.cost`, laid over the meshes) the
    candidates (the fewest-bytes plans and the plans found by searching on modeled time, over whole axes
    and over sub-axes) are compared by :func:`redist.cost.plan_time` and the fastest is returned (ties:
    fewer bytes, then fewer steps; :func:`redist.cost.fastest`).

    The types may lie on two device orders of the same mesh axes ("Device orders" in the module header), or on
    any two meshes, of other devices or other axes ("Across meshes"). A
    destination partial over axes the source is not (creating pending sums) gets a plan that reduces what it
    must first, then creates the summands; uneven dims, a plan between padded views or ending in an
    ``exchange`` (both in the module header). Between even types the search's
    plan is compared, where no pending sum is reduced, with one ``exchange``, which receives exactly the lower
    bound: the exchange is taken where it receives fewer bytes (with ``topology``: where it is faster, its
    rounds priced by :func:`redist.cost.plan_time`).

    Raises :class:`ShardingError` if the types have different shapes or dtypes, pending reductions of
    different kinds, or a destination that creates a pending reduction other than a sum, or split a mesh axis
    into sub-axes of two different decompositions.
    """
    check_pair(src, dst)
    topo = None if topology is None else cost.as_topology(topology, src.mesh, dst.mesh)  # refused before any path
    if not src.mesh.is_reordering_of(dst.mesh):
        return _across_meshes(src, dst, topology)
    if src.mesh != dst.mesh:
        return _across_device_orders(src, dst, topology)
    if difference(dst.partial, src.partial):
        return _synthesize_creating(src, dst, topology, difference(dst.partial, src.partial))
    if not (src.is_even() and dst.is_even()):
        return _synthesize_uneven(src, dst, topology)
    core_src, core_dst = without_unit_axes(src, dst.partial), without_unit_axes(dst, dst.partial)
    if topo is None:
        core = _fewest_bytes(core_src, core_dst)
    else:
        fewest = _fewest_bytes(core_src, core_dst)
        exchange = [fallback(core_src, core_dst)] if set(core_src.partial) == set(core_dst.partial) else []
        exchange = [p for p in exchange if p.steps != fewest.steps]
        times: dict = {}  # the searches stop where they cannot beat a candidate priced cheaply (no cutoff if none)
        cheap = [p for p in [fewest, *exchange] if cost.cheap_to_price(p)]
        cutoff = cost.fastest(cheap, topo, times)[1] if cheap else None
        searched, states = [], state_budget(core_src)
        for refine in (False, True):  # searches by modeled time, stopped where they cannot beat a candidate
            found = search(core_src, core_dst, refine, topo, states, cutoff=cutoff,
                            max_expansions=MAX_REFINED_EXPANSIONS if refine else None)
            states -= found.states
            if found.plan is not None:
                searched.append(found.plan)
                t = times.setdefault(id(found.plan), cost.plan_time(found.plan, topo))
                cutoff = t if cutoff is None else min(cutoff, t)
        core, _ = cost.fastest([fewest, *searched, *exchange], topo, times)
    return _with_unit_axes(src, dst, core)


def _fewest_bytes(src: ShardingType, dst: ShardingType) -> Plan:
    """The search's plan (:func:`searched_plan`), or the exchange plan of
    :func:`~redist.synthesis.fallback.fallback` where that receives strictly fewer bytes (even types without
    pending sums to reduce; ties keep the collectives).

    The collectives cannot put an axis under one already in a dim without moving whole buffers, where one
    point-to-point exchange moves only the pieces each device lacks (the redistribution paper's all-permute):
    it receives exactly the lower bound, so it is tried only when the search's plan misses it. With sums to
    reduce, reduce-scatters then an exchange can receive fewer bytes too, but proving such a plan on large
    meshes takes the verifier seconds (``python -m proofs``'s 64-device timing), so it is not offered there."""
    plan = searched_plan(src, dst)
    if set(src.partial) != set(dst.partial) or plan.bytes_received == lower_bound_bytes(src, dst):
        return plan
    exchange = fallback(src, dst)
    return exchange if exchange.bytes_received < plan.bytes_received else plan


def _synthesize_creating(src: ShardingType, dst: ShardingType, topology, created) -> Plan:
    """A plan to a destination partial over axes ``created`` that the source is not (docs/spec.md §3: pending
    sums created; across meshes every partial axis of the destination that is not handed over).

    Creating a sum moves no data: the plan runs to ``dst`` with ``C`` placed in dims or replicated (a type
    no larger than ``dst``, partial over the rest of ``dst``'s axes), then makes ``C`` partial:
    ``replicate_to_partial`` for the replicated ones, ``shard_to_partial`` for those at the minor end of a dim
    (each member's block becomes its zero-padded summand, where a gather would receive the others'). The
    candidates place ``C`` (see :func:`_creation_placements`) and each synthesizes the plan to that type;
    the fewest bytes (with ``topology``: the fastest), then the fewest steps, is returned. Where every one of
    them receives bytes, one ``select_to_partial`` from the source, which receives none, is taken if it fits
    (on one mesh, nothing reduced: the members of each group over ``C`` hold the group's block between them; the
    placements cannot say which member keeps which part). Peak: the plan before the creation stays within
    ``max(src, type before)``, and the creation only grows the buffer to ``dst``'s.
    """
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
    if src.mesh == dst.mesh and not difference(src.partial, dst.partial) and all(map(_receives, candidates)):
        try:
            candidates = [Plan.from_steps(src, (S.SelectToPartial(dst.dims, created),))]
        except ShardingError:  # some group holds its block on no device
            pass
    return _cheapest(candidates, topology, src.mesh, dst.mesh)


def _receives(plan: Plan) -> bool:
    """Whether ``plan`` receives bytes (or they cannot be counted: :data:`redist.blocks.MAX_LISTED`)."""
    try:
        return plan.bytes_received > 0
    except ShardingError:
        return True


def _creation_placements(src: ShardingType, dst: ShardingType, created) -> list[dict[int, tuple[Axis, ...]]]:
    """Where to put the created axes before they become partial: ``{dim: axes appended to dst's dim}``, the
    rest replicated. First each axis in the dim where the source has it (then it becomes a summand without
    moving), else replicated; then none placed; then, for each dim, each axis where the source has it, else
    in that dim (the reduction before the creation then moves a smaller buffer); then, for each dim, every
    axis in that dim (where the source's dim of an axis cannot take it, another dim can: ``[4096{x}, 4096{y}]
    -> [4096{y}, 4096] partial{x}`` on 256x256 goes through ``[4096{y}, 4096{x}]``, one permute of the source's
    blocks, instead of gathering a 256 times larger buffer). Duplicates are dropped. The source's dims are read
    only on a mesh with the destination's axes."""
    def home(a: Axis) -> int | None:
        if not src.mesh.same_axes(dst.mesh):
            return None
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
    for dim in range(dst.rank):
        placed = {dim: tuple(created)}
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
    if set(src.partial) == set(dst.partial) and _all_miss_bound(candidates, src, dst):
        exchange = Plan.from_steps(src, (S.Exchange(dst.dims, ids),))  # one exchange between the orders
        try:
            if exchange.bytes_received < min(p.bytes_received for p in candidates):
                candidates.append(exchange)
        except ShardingError:  # its copies cannot be counted (redist.blocks.MAX_LISTED)
            pass
    return _cheapest(candidates, topology, src.mesh)


def _all_miss_bound(plans, src: ShardingType, dst: ShardingType) -> bool:
    """Whether every one of ``plans`` is known to receive more than the lower bound from ``src`` to ``dst``:
    only then is an exchange between device orders, whose copy tables are built device by device, worth
    building (False where bytes cannot be counted: :data:`redist.blocks.MAX_LISTED`)."""
    try:
        bound = lower_bound_bytes(src, dst)
        return all(p.bytes_received > bound for p in plans)
    except ShardingError:
        return False


def _cheapest(candidates, topology, *meshes: Mesh) -> Plan:
    """The fewest-bytes candidate (ties: fewest steps, then the first), or with ``topology`` (laid over
    ``meshes``) the fastest (ties: fewest bytes, then steps). A candidate whose bytes cannot be counted (or time
    priced, :func:`redist.cost.fastest`) without listing more than :data:`redist.blocks.MAX_LISTED` entries is
    passed over; if none can be, that :class:`ShardingError` is raised."""
    if topology is None:
        counted, refused = [], None
        for p in candidates:
            try:
                counted.append(((p.bytes_received, len(p.steps)), p))
            except ShardingError as e:
                refused = refused or e
        if not counted:
            raise refused
        return min(counted, key=lambda c: c[0])[1]

    return cost.fastest(candidates, cost.as_topology(topology, *meshes))[0]


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


def without_unit_axes(t: ShardingType, keep_partial) -> ShardingType:
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
def searched_plan(src: ShardingType, dst: ShardingType) -> Plan:
    """The fewest-bytes plan (ties: fewest steps, then collectives rather than the fallback's exchange).

    The searches look only for plans that receive no more than :func:`~redist.synthesis.fallback.fallback`'s
    plan: without reductions its exchange receives exactly the lower bound, so a search stops as soon as no
    plan at the bound is left (a plan that misses the bound would lose to the exchange anyway)."""
    direct = _single_permute(src, dst)
    if direct is not None:
        return direct
    budget, cutoff = state_budget(src), fallback_cost(src, dst)
    exact = set(src.partial) == set(dst.partial)  # then the fallback receives exactly the lower bound
    if exact:  # a search can only tie with the fallback's exchange (in steps, not bytes): it gets less time
        budget = min(budget, MAX_EXACT_STATES)
    whole = search(src, dst, refine=False, max_states=budget, cutoff=cutoff)
    if whole.plan is not None and (not _splits(src, dst) or _final(whole, src, dst)):
        return whole.plan
    # Sub-axes can help (or be needed): search again over prime-sized atoms, keep the better plan. A plan at
    # the bound may still shrink: slice, permute, gather of a whole axis is often slice, permute of a part.
    # When no plan exists over whole axes and the fallback misses the bound (it reduces), the search over
    # sub-axes is the only way to it and may expand any number of states within the budget.
    finer = search(src, dst, refine=True, max_states=budget - whole.states, cutoff=cutoff,
                    max_expansions=MAX_REFINED_EXPANSIONS if whole.plan is not None or exact else None)
    found = [f for f in (whole, finer) if f.plan is not None]
    if not found:
        return fallback(src, dst)
    return min(found, key=lambda f: (f.cost, len(f.plan.steps))).plan


def _final(whole: Found, src: ShardingType, dst: ShardingType) -> bool:
    """Whether the plan ``whole`` found over named atoms is kept without searching over prime ones: it meets
    the lower bound in fewer than three steps (a longer plan at the bound may still shrink: slice, permute,
    gather of a whole axis is often slice, permute of a part), or it reduces and meets
    :func:`~redist.synthesis.fallback.reduction_bound`. Of 3,100 random reducing pairs whose plan met that
    bound in three steps or more, the search over prime atoms found none in fewer steps, and on meshes of a
    thousand devices it runs its whole budget of states (0.1-0.8 s) for nothing."""
    reducing = reduction_bound(src, dst)
    if reducing:
        return whole.cost == reducing
    return len(whole.plan.steps) < 3 and whole.cost == bound(src, dst)


def _splits(src: ShardingType, dst: ShardingType) -> bool:
    """Whether splitting the atoms into prime factors gives other atoms (a search over them can differ)."""
    types = (src, dst)
    return cut_points(src.mesh, types, refine=True) != cut_points(src.mesh, types, refine=False)


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


# ---------------------------------------------------------------------- across meshes
def _across_meshes(src: ShardingType, dst: ShardingType, topology) -> Plan:
    """A plan between meshes of other devices or other axes ("Across meshes" in the module header)."""
    before = {a: _steps_between(src, a, topology) for a in _source_ends(src, dst)}
    candidates = []
    for b in _destination_starts(src, dst):
        after = _steps_between(b, dst, topology)
        for a, first in before.items():
            if _joins(a, b):
                candidates.append(Plan.from_steps(src, first + (_transfer_to(b),) + after))
    if dst.partial and dst.reduction == "sum":
        candidates.append(_synthesize_creating(src, dst, topology, dst.partial))
    return _cheapest(candidates, topology, src.mesh, dst.mesh)


def _steps_between(src: ShardingType, dst: ShardingType, topology) -> tuple:
    """The steps of the plan from ``src`` to ``dst`` on one mesh: none where they are equal."""
    return () if src == dst else synthesize(src, dst, topology).steps


def _transfer_to(t: ShardingType) -> S.Transfer:
    return S.Transfer(t.mesh, t.dims, t.partial)


def _joins(a: ShardingType, b: ShardingType) -> bool:
    """Whether one transfer turns ``a`` into ``b`` (its typing rule: summand groups of one size and one
    reduction kind, or sums created from values without pending ones)."""
    try:
        return _transfer_to(b).apply(a) == b
    except ShardingError:
        return False


def _source_ends(src: ShardingType, dst: ShardingType) -> list[ShardingType]:
    """The types on the source's mesh that a plan to ``dst`` may transfer from: the source itself; with pending
    values, the source with its partial axes appended to one dim (reduce-scattered onto it), the source reduced
    (every device its whole block: all-reduced), and ``dst``'s layout on the source's mesh where the two meshes
    have the same axes (reduced into it). Each is at most the source's size, so the source's devices stay
    within their bound."""
    out = [src]
    if src.partial:
        for i in range(src.rank):
            out.append(_type_or_none(src, src.dims[:i] + (src.dims[i] + src.partial,) + src.dims[i + 1:], ()))
        out.append(src.replace(partial=()))
        if src.mesh.same_axes(dst.mesh):
            out.append(_type_or_none(src, dst.dims, ()))
    return [t for t in dict.fromkeys(out) if t is not None and t.local_bytes <= src.local_bytes]


def _destination_starts(src: ShardingType, dst: ShardingType) -> list[ShardingType]:
    """The types on ``dst``'s mesh that a plan may transfer to: ``dst`` itself; for a ``dst`` without pending
    values also ``dst`` with the mesh axes it replicates over appended to one dim that stays even (the transfer
    then sends each device a share, and an all-gather on the destination's mesh completes the blocks, as Alpa's
    local all-gather does: no fewer bytes received, but the gather may run on faster links); and, for a partial
    source, ``dst`` partial over replicated axes whose group has the source's summand count (the summands
    handed over and reduced on the destination's mesh). Each is at most ``dst``'s size."""
    out = [dst]
    if dst.partial:
        return out
    used = {a.name for d in dst.dims for a in d}
    replicated = tuple(n for n, size in dst.mesh.axes if size > 1 and n not in used)
    for i in range(dst.rank):
        t = _type_or_none(dst, dst.dims[:i] + (dst.dims[i] + replicated,) + dst.dims[i + 1:], ())
        if replicated and t is not None and t.is_even(i) and dst.is_even(i):
            out.append(t)
    k = src.mesh.group_size(src.partial)
    if k > 1:
        for r in range(1, len(replicated) + 1):
            for axes in itertools.combinations(replicated, r):
                if dst.mesh.group_size(axes) == k:
                    out.append(ShardingType(dst.mesh, dst.shape, dst.dtype, dst.dims, axes, src.reduction))
    return list(dict.fromkeys(out))
