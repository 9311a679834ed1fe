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
6. ``permute`` (:class:`PermuteMove`): any rearrangement of the atoms that keeps each dim's block count
   and the partial atoms, in one step that receives one whole buffer. It is not a move of the forward
   search (enumerating the arrangements, or chains of swaps, is what blew up): a plan has at most one
   permute, the join of a forward path and a backward suffix (see "Search" below).

Invariant (memory-efficient normal form). Along every plan the local size never rises and then falls
again: moves 1 and 2 are tried only until a gather has grown the buffer. The local sizes are therefore
valley-shaped, and ``peak_bytes == max(src.local_bytes, dst.local_bytes)``. Only the atoms the
destination places in dims are sliced, and only atoms it does not place are gathered: any other slice
would have to be gathered again, and can only cost more.

Choice. When source and destination have the same block count in every dim and the same partial axes, the
plan is one ``permute``, with no search: it receives exactly the lower bound, in one step. Otherwise the
search below minimises (bytes received, number of steps): a move is charged what its step receives (the
moves of a run together what their one step receives), and a run counts as one step. Costs are exact
integers in units of ``1 / mesh.size`` bytes (every ``k`` divides the mesh size). Sizes of axes are
arbitrary integers. When splitting the atoms into prime factors (Shardy's sub-axes) gives other atoms, and
the plan over the named atoms misses the lower bound or takes three steps or more (with sums to reduce:
misses the least that reducing costs the normal form's plans, :func:`_reduction_bound`), or does not exist (an
axis must be swapped for a part of another of a different size), the search is run again over the prime
atoms and the better plan is kept.

Search (bidirectional, meeting at the permute). Plans in normal form are ``prefix, permute, suffix``, each
part possibly empty. A forward A* runs the moves 1-5 from the source. A backward Dijkstra runs them read
backwards from the goal (the ``_untry_…`` generators), lazily: only as far as the forward queue needs. Its
suffixes are indexed by what a permute keeps (each dim's block count and the partial atoms), so a forward
state joins the cheapest settled suffix of its key with one permute, whatever arrangement of atoms that
permute makes. The forward queue holds states, pending joins (priced with the cheapest suffix not yet
settled) and found joins; the search ends when a goal state or a found join is the cheapest entry, or when
both queues are empty (no normal-form plan over these atoms). Ties (equal cost and steps) go to the
permute placed later and moving fewer atoms. Heuristic: what some device lacks of its destination block
(:meth:`_Space.missing_bytes`, the lower bound of :mod:`redist.bounds` from that state): a device receives
at least what it lacks, so it is admissible. With a topology, the objective is modeled time (a run pays
its latency once), and the heuristic and the least cost of a permute are priced over the fastest link.
Symmetry: atoms of one size (with a topology, one size and link) that the destination places in no dim
are interchangeable for the backward search, which gathers only the first free one of each class.

Pruning. The searches by bytes look only for plans that receive no more than the fallback below (its cost is
computed from the atoms, :func:`_fallback_cost`): without reductions its exchange receives exactly the lower
bound, so a plan that misses the bound would lose to it anyway. The forward search stops once its cheapest
entry costs more; the backward search drops a state whose suffix, plus what some device lacks of that
state's blocks at the source (a lower bound on any prefix and permute to it), costs more. Ties keep the
collectives. On pairs where no plan of collectives meets the bound, the search ends after a few thousand
states and the exchange is taken, instead of running the budget out.

Reductions. The reduction kind of a pending value (sum, max, min, prod) is the same on both sides
(:func:`redist.bounds.check_pair`); every ``reduce_scatter`` and ``all_reduce`` of a plan takes the source's,
and the search is the same for every kind.

Device orders. Between the same axes on two device orders (SPEC 1), the plan is the plan on one order and a
``permute`` to the other, either after all its steps or before them (the plan from the source moved to the
destination's order); where that end of the plan is a ``permute`` or an ``exchange`` already, that step moves
the blocks to the other order too, at no extra cost. The fewer bytes (with a topology: the faster) of the
two is returned. Every collective of the plan thus runs on one device order.

Budget and fallback. The searches of one ``synthesize`` call generate at most ``_MAX_STATES`` (50,000)
states in all, counted in both directions, fewer for ranks above 8 (a state is a tuple per dim), at most
``_MAX_EXACT_STATES`` (15,000) where no pending sum is reduced (the fallback's exchange then receives the
lower bound, and a search can only tie with it), and twice that with a topology: its own searches by modeled
time get a second budget, and stop once every plan left costs more, in their modeled time, than the faster
of the fewest-bytes plan and the exchange by :func:`redist.cost.plan_time` (of those of them that are cheap
to price, :func:`redist.cost.cheap_to_price`: an exchange in which every device receives from thousands of
others runs thousands of rounds, and listing them would take longer than the search); the candidates are
then compared by :func:`redist.cost.fastest`, which prices exactly only those whose lower bound may win. A
search over sub-axes also
stops after ``_MAX_REFINED_EXPANSIONS`` expansions, except when the search over whole axes found no plan by
bytes and the pair reduces (the fallback then misses the bound). The budget counts states, not seconds, so
that every MPI rank, synthesizing on its own, gets the same plan. It bounds the searches of a call to about
1 s of CPU and 250 MB (``bench/search_scale.py``, on meshes of up to 65,536 devices, rank 8 on 16 axes,
measured on a shared 2-core machine). In the samples (the 1,200 pairs of ``bench/synthesis_speed.py`` and
the pairs of the tests) no call that finds a plan of collectives generates more than about 13,000 states.
When no search finds a plan within the budget, or none exists in normal form, ``synthesize``
still returns a plan, and never raises for a valid pair: the pending sums that the destination does not
keep are reduced (reduce-scattered onto dims they divide, else all-reduced), then one ``exchange``
receives exactly what each device lacks. It is memory-bounded like every plan and, without a reduction,
at the lower bound in bytes, but it is point-to-point traffic rather than collectives; with a reduction it
can receive more than a searched plan would.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from fractions import Fraction
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

# The search budget of one synthesize() call (see "Budget and fallback" above): the states its searches may
# generate in all, twice that with a topology. Generated states, not expanded ones: an expansion of a
# high-rank state over many atoms generates tens of thousands, and each costs time and memory. A state
# holds a tuple per dim, so above rank _BUDGET_RANK the budget shrinks in proportion.
_MAX_STATES = 50_000
_BUDGET_RANK = 8
# The search over sub-axes refines a plan that usually exists already; it gives up sooner.
_MAX_REFINED_EXPANSIONS = 8_000
# Without sums to reduce, the fallback's exchange receives the lower bound and a search can only tie with it
# (collectives rather than point-to-point traffic): its searches get a smaller budget.
_MAX_EXACT_STATES = 15_000


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
    and over sub-axes) are compared by :func:`redist.cost.plan_time` and the fastest is returned (ties:
    fewer bytes, then fewer steps; :func:`redist.cost.fastest`).

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
        fewest = _fewest_bytes(core_src, core_dst)
        exchange = [_fallback(core_src, core_dst)] if set(core_src.partial) == set(core_dst.partial) else []
        exchange = [p for p in exchange if p.steps != fewest.steps]
        times: dict = {}  # the searches stop where they cannot beat a candidate priced cheaply (no cutoff if none)
        cheap = [p for p in [fewest, *exchange] if cost.cheap_to_price(p)]
        cutoff = cost.fastest(cheap, topo, times)[1] if cheap else None
        searched, states = [], _state_budget(core_src)
        for refine in (False, True):  # searches by modeled time, stopped where they cannot beat a candidate
            found = _search(core_src, core_dst, refine, topo, states, cutoff=cutoff,
                            max_expansions=_MAX_REFINED_EXPANSIONS if refine else None)
            states -= found.states
            if found.plan is not None:
                searched.append(found.plan)
                t = times.setdefault(id(found.plan), cost.plan_time(found.plan, topo))
                cutoff = t if cutoff is None else min(cutoff, t)
        core, _ = cost.fastest([fewest, *searched, *exchange], topo, times)
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
    in that dim (the reduction before the creation then moves a smaller buffer); then, for each dim, every
    axis in that dim (where the source's dim of an axis cannot take it, another dim can: ``[4096{x}, 4096{y}]
    -> [4096{y}, 4096] partial{x}`` on 256x256 goes through ``[4096{y}, 4096{x}]``, one permute of the source's
    blocks, instead of gathering a 256 times larger buffer). Duplicates are dropped."""
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
    return _cheapest(candidates, topology, src.mesh)


def _cheapest(candidates, topology, mesh: Mesh) -> Plan:
    """The fewest-bytes candidate (ties: fewest steps, then the first), or with ``topology`` the fastest (ties:
    fewest bytes, then steps)."""
    if topology is None:
        return min(candidates, key=lambda p: (p.bytes_received, len(p.steps)))

    return cost.fastest(candidates, cost.as_topology(topology, mesh))[0]


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
    """The fewest-bytes plan (ties: fewest steps, then collectives rather than the fallback's exchange).

    The searches look only for plans that receive no more than :func:`_fallback`'s plan: without reductions
    its exchange receives exactly the lower bound, so a search stops as soon as no plan at the bound is left
    (a plan that misses the bound would lose to the exchange anyway)."""
    direct = _single_permute(src, dst)
    if direct is not None:
        return direct
    budget, cutoff = _state_budget(src), _fallback_cost(src, dst)
    exact = set(src.partial) == set(dst.partial)  # then the fallback receives exactly the lower bound
    if exact:  # a search can only tie with the fallback's exchange (in steps, not bytes): it gets less time
        budget = min(budget, _MAX_EXACT_STATES)
    whole = _search(src, dst, refine=False, max_states=budget, cutoff=cutoff)
    if whole.plan is not None and (not _splits(src, dst) or _final(whole, src, dst)):
        return whole.plan
    # Sub-axes can help (or be needed): search again over prime-sized atoms, keep the better plan. A plan at
    # the bound may still shrink: slice, permute, gather of a whole axis is often slice, permute of a part.
    # When no plan exists over whole axes and the fallback misses the bound (it reduces), the search over
    # sub-axes is the only way to it and may expand any number of states within the budget.
    finer = _search(src, dst, refine=True, max_states=budget - whole.states, cutoff=cutoff,
                    max_expansions=_MAX_REFINED_EXPANSIONS if whole.plan is not None or exact else None)
    found = [f for f in (whole, finer) if f.plan is not None]
    if not found:
        return _fallback(src, dst)
    return min(found, key=lambda f: (f.cost, len(f.plan.steps))).plan


def _final(whole: _Found, src: ShardingType, dst: ShardingType) -> bool:
    """Whether the plan ``whole`` found over named atoms is kept without searching over prime ones: it meets
    the lower bound in fewer than three steps (a longer plan at the bound may still shrink: slice, permute,
    gather of a whole axis is often slice, permute of a part), or it reduces and meets
    :func:`_reduction_bound`. Of 3,100 random reducing pairs whose plan met that bound in three steps or more,
    the search over prime atoms found none in fewer steps, and on meshes of a thousand devices it runs its
    whole budget of states (0.1-0.8 s) for nothing."""
    reducing = _reduction_bound(src, dst)
    if reducing:
        return whole.cost == reducing
    return len(whole.plan.steps) < 3 and whole.cost == _bound(src, dst)


def _splits(src: ShardingType, dst: ShardingType) -> bool:
    """Whether splitting the atoms into prime factors gives other atoms (a search over them can differ)."""
    types = (src, dst)
    return _cut_points(src.mesh, types, refine=True) != _cut_points(src.mesh, types, refine=False)


def _bound(src: ShardingType, dst: ShardingType) -> int:
    """:func:`redist.lower_bound_bytes` of even types, × the mesh size (the search's unit), from the atoms."""
    space = _Space.of(src, dst, refine=False)
    return space.missing_bytes(*space.start[:2]) * space.scale


def _reduction_bound(src: ShardingType, dst: ShardingType) -> int:
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

    The search over prime atoms is skipped where the plan over named atoms meets this bound (:func:`_final`):
    on meshes of a thousand devices it ran its whole budget of states (0.1-0.8 s) on such reductions and found
    nothing better. ``tests/test_synthesis_scale.py`` checks the bound against searches run to the end on
    random pairs, and that plans are the same with and without the second search."""
    if not difference(src.partial, dst.partial):  # nothing to reduce: no atoms to work out
        return 0
    space = _Space.of(src, dst, refine=False)
    dims, partial = space.start[:2]
    k = space.product(space.reducible)
    if k < 2:
        return 0
    s = space.product(space.wanted & ~_mask(a for d in dims for a in d) & ~partial)
    # (L/S)(1 - 2/K) == L/(S K) (K - 2), L/(S K) a whole number of units: the atoms of src's dims, the free
    # ones sliced and the reduced ones are distinct, so their product divides the mesh size
    return space.local_bytes(space.goal[0]) * space.scale + space.local_bytes(dims) * space.scale // (s * k) * (k - 2)


def _fallback_cost(src: ShardingType, dst: ShardingType) -> Fraction:
    """What :func:`_fallback`'s plan receives, × the mesh size (the search's unit), without enumerating devices
    or building the plan: its reductions' bytes (the same on every device), then the exchange's, the lower bound
    from the type after them."""
    t, reductions = src, Fraction(0)
    for step in _fallback_reductions(src, dst):
        reductions += step.bytes_received(t)
        t = step.apply(t)
    return reductions * src.mesh.size + _bound(t, dst)


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
    return Plan.from_steps(src, (*_fallback_reductions(src, dst), S.Exchange(dst.dims)))


def _fallback_reductions(src: ShardingType, dst: ShardingType) -> list:
    """The reductions :func:`_fallback` runs before its exchange, in order."""
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


# ---------------------------------------------------------------------------------------------------- the search
# A state is ``(dims, partial, grown, run)``: the atoms of each dim (major to minor), the bit mask of the
# partial atoms, whether a gather has grown the buffer, and the run in progress: ``(SliceMove, dim)`` after a
# slice onto ``dim`` (the same for reduce-scatters and gathers), else None. A move that continues the run merges
# into the run's step. States are plain tuples: a search hashes and compares hundreds of thousands of them.


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
    def of(cls, src: ShardingType, dst: ShardingType, refine: bool) -> _Space:
        """The search from ``src`` to ``dst`` over their atoms, split into prime factors if ``refine``."""
        mesh = src.mesh
        atoms = _atoms(mesh, _cut_points(mesh, (src, dst), refine))
        src_dims, dst_dims = (tuple(atoms.expand(d) for d in t.dims) for t in (src, dst))
        src_partial, dst_partial = (_mask(atoms.expand(t.partial)) for t in (src, dst))
        space = cls(atoms, atoms.sizes, src.shape, src.global_bytes, mesh.size,
                    wanted=_mask(a for d in dst_dims for a in d), reducible=src_partial & ~dst_partial,
                    start=(src_dims, src_partial, False, None), goal=(dst_dims, dst_partial), goal_bytes=0)
        return space._replace(goal_bytes=space.local_bytes(dst_dims))

    def blocks(self, ids) -> int:
        k = 1
        for a in ids:
            k *= self.sizes[a]
        return k

    def product(self, mask: int) -> int:
        """The product of the sizes of the atoms of a bit mask (:func:`_mask`)."""
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

    def back(self, state) -> _Back:
        """The backward ``state`` with what the untry-steps read."""
        dims, partial, sliced, first = state
        used = _mask(a for d in dims for a in d)
        return _Back(dims, partial, sliced, first, self.local_bytes(dims) * self.scale,
                     tuple(n // self.blocks(d) for n, d in zip(self.shape, dims)),
                     ((1 << len(self.sizes)) - 1) & ~used & ~partial)

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
        k = space.product(reduced)
        yield (AllReduceMove, (), (dims, partial & ~space.reducible, grown, None), local_bytes,
               2 * (k - 1) * scaled // k, reduced, True)


class PermuteMove(NamedTuple):
    """6. ``permute``: send whole buffers so that the dims hold ``dims`` (the same block count in every dim,
    the same partial atoms). Made by the search only to join a forward path to a backward suffix
    (:meth:`_Suffixes.join`)."""

    dims: tuple[tuple[int, ...], ...]

    def step(self, run: _Run) -> S.Permute:
        return S.Permute(tuple(run.tokens(d) for d in run.dims_after))


# The try-steps, in the order of the module header's list (the order breaks ties between equally cheap plans).
_TRY_STEPS = (_try_slices, _try_reduce_scatters, _try_all_to_alls, _try_gathers, _try_all_reduce)


def _run_tag(move) -> tuple | None:
    """The run a move continues when it follows a move of the same tag (one dim's slices, reduce-scatters or
    gathers), else None."""
    return (type(move), move.dim) if type(move) in (SliceMove, ReduceScatterMove, GatherMove) else None


# ------------------------------------------------------------------------------------------- the suffixes
# The backward search runs from the goal over the same moves read backwards: each *untry-step* yields, for
# every move of its kind INTO a state, the state before it. A backward state is ``(dims, partial, sliced,
# first)``: the state before a suffix of moves, whether that suffix slices or reduce-scatters (then it must
# not follow a gather: normal form), and the run tag of its first move (a move before it that continues the
# run adds no step). Each untry-step yields ``(record, state before, bytes received × scale, mask of the
# group's atoms, run tag)``; the record is the forward move, as the try-steps make it.


class _Back(NamedTuple):
    """A backward state being expanded, with what the untry-steps read (as :class:`_Node`)."""

    dims: tuple[tuple[int, ...], ...]
    partial: int
    sliced: bool
    first: tuple | None
    scaled: int
    local: tuple[int, ...]
    free: int


def _untry_slices(space: _Space, back: _Back, classes):
    """A slice of the dim's last atom, if the destination places it (before a slice onto dim ``e``: onto dims
    up to ``e``, the forward order)."""
    dims, partial, sliced, first, scaled, local, free = back
    last = first[1] if first and first[0] is SliceMove else len(dims) - 1
    for i in range(last + 1):
        d = dims[i]
        if d and space.wanted >> d[-1] & 1:
            yield (SliceMove(i, d[-1]), (dims[:i] + (d[:-1],) + dims[i + 1:], partial, True, (SliceMove, i)), 0, 0,
                   (SliceMove, i))


def _untry_reduce_scatters(space: _Space, back: _Back, classes):
    """A reduce-scatter of the dim's last atom, if it is a partial atom of the source that the destination does
    not keep."""
    dims, partial, sliced, first, scaled, local, free = back
    for i, d in enumerate(dims):
        if d and space.reducible >> d[-1] & 1:
            a = d[-1]
            yield (ReduceScatterMove(i, a), (dims[:i] + (d[:-1],) + dims[i + 1:], partial | 1 << a, True,
                   (ReduceScatterMove, i)), (space.sizes[a] - 1) * scaled, 1 << a, (ReduceScatterMove, i))


def _untry_all_to_alls(space: _Space, back: _Back, classes):
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
                           _mask(suffix), None)
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


def _double(space: _Space, dims, partial, sliced, scaled, move1, move2, k):
    """The untry of one all-to-all of two moves ``(i, j, m, suffix)``: each suffix back from dim j to dim i."""
    (i1, j1, m1, suffix1), (i2, j2, m2, suffix2) = move1, move2
    nd = list(dims)
    nd[j2] = nd[j2][: len(nd[j2]) - m2]
    nd[j1] = nd[j1][: len(nd[j1]) - m1]
    nd[i1] = dims[i1] + suffix1
    nd[i2] = dims[i2] + suffix2
    return (AllToAllMove(((i1, j1, m1), (i2, j2, m2))), (tuple(nd), partial, sliced, None), (k - 1) * scaled // k,
            _mask(suffix1 + suffix2), None)


def _untry_gathers(space: _Space, back: _Back, classes):
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


def _untry_all_reduce(space: _Space, back: _Back, classes):
    """If no partial atom is left to reduce: an all-reduce of each set of free atoms that the source holds
    partial and the destination does not keep."""
    dims, partial, sliced, first, scaled, local, free = back
    if partial & space.reducible:
        return
    pool = [a for a in range(len(space.sizes)) if (free & space.reducible) >> a & 1]
    for r in range(1, 1 << len(pool)):
        reduced = _mask(a for n, a in enumerate(pool) if r >> n & 1)
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


_UNTRY_STEPS = (_untry_slices, _untry_reduce_scatters, _untry_all_to_alls, _untry_gathers, _untry_all_reduce)


def _key(space: _Space, dims, partial: int) -> tuple:
    """What a permute keeps: each dim's block count, and the partial atoms."""
    return tuple(space.blocks(d) for d in dims), partial


class _Budget:
    """The states that the searches of one call may still generate (shared, so that it bounds them all)."""

    def __init__(self, states: int):
        self.left = states

    def take(self) -> bool:
        """Count one generated state; False once the budget is spent."""
        if self.left <= 0:
            return False
        self.left -= 1
        return True


class _Suffixes:
    """The backward search: Dijkstra from the goal over the untry-steps, run lazily (:meth:`reach`) as far as
    the forward search needs. Its states are settled in (cost, steps) order, so the first settled state of a
    key is the cheapest suffix from that key; ``table[(key, sliced)]`` keeps the first two (a state's own
    suffix needs no permute, and the forward search follows it by itself), and ``after[state]`` is
    ``(state after, move)`` on its suffix (None for the goal)."""

    def __init__(self, space: _Space, price, classes, budget: _Budget, cutoff=None):
        self.space, self.price, self.classes, self.budget, self.cutoff = space, price, classes, budget, cutoff
        goal = (*space.goal, False, None)
        self.best = {goal: (0, 0)}
        self.after: dict = {goal: None}
        self.table: dict = {}
        self.heap = [(0, 0, 0, goal)]
        self.tie = 0

    @property
    def radius(self):
        """``(cost, steps)`` below which every suffix is settled (None once the search is over)."""
        return self.heap[0][:2] if self.heap else None

    def reach(self, cost, steps) -> None:
        """Settle every state whose suffix costs at most ``(cost, steps)`` (or stop when the budget is spent).
        Steps count too: where many suffixes cost the same (nothing, for an empty array), the suffixes of
        fewer steps are settled first, and only as far as the forward search needs."""
        space = self.space
        while self.heap and self.heap[0][:2] <= (cost, steps):
            cost, steps, _, state = heapq.heappop(self.heap)
            if self.best[state] != (cost, steps):
                continue
            dims, partial, sliced, first = state
            entries = self.table.setdefault((_key(space, dims, partial), sliced), [])
            if len(entries) < 2:
                entries.append((cost, steps, state))
            back = space.back(state)
            for untry in _UNTRY_STEPS:
                for move, before, received, group, tag in untry(space, back, self.classes):
                    if not self.budget.take():
                        self.heap.clear()
                        return
                    new_step = tag is None or tag != first
                    nc, ns = cost + self.price(received, group, new_step), steps + new_step
                    if self.cutoff is not None and nc + self.lacking(before) > self.cutoff:
                        continue  # every plan through ``before`` costs more than the cutoff
                    old = self.best.get(before)
                    if old is None or (nc, ns) < old:
                        self.best[before] = (nc, ns)
                        self.after[before] = (state, move)
                        self.tie += 1
                        heapq.heappush(self.heap, (nc, ns, self.tie, before))

    def lacking(self, state) -> int:
        """A lower bound on the cost from the source to the backward ``state`` (bytes × scale)."""
        space = self.space
        dims, partial = space.start[:2]
        return space.lacking(dims, partial, state[0], state[1]) * space.scale

    def join(self, node: _Node):
        """The cheapest settled suffix that a permute from ``node`` reaches: ``(cost, steps, state)`` or None.
        A permute keeps the key, and cannot precede a slice once a gather has grown the buffer."""
        key = _key(self.space, node.dims, node.partial)
        found = None
        for sliced in (False,) if node.grown else (False, True):
            for entry in self.table.get((key, sliced), ()):
                if entry[2][:2] != (node.dims, node.partial) and (found is None or entry[:2] < found[:2]):
                    found = entry
                    break
        return found


# ------------------------------------------------------------------------------------------- the search
# The forward queue holds three kinds of entries, ordered by (cost + heuristic, steps, −cost): a state; a
# pending join from a state (its priority: the cost to it, a permute, and the least that an unsettled suffix
# can cost); and a join found (a state, a permute, a settled suffix: its whole cost).
_STATE, _PENDING, _JOINED = 0, 1, 2


class _Found(NamedTuple):
    """A search's outcome: its ``plan`` (None if there is none or the search gave up), the plan's ``cost``
    (bytes received × the mesh size, or with a topology modeled seconds) and the ``states`` it generated."""

    plan: Plan | None
    cost: int | float | None
    states: int


def _search(src: ShardingType, dst: ShardingType, refine: bool, topo=None, max_states: int = _MAX_STATES,
            max_expansions: int | None = None, cutoff=None) -> _Found:
    """A* over normal-form plans on the atoms of ``refine``; objective: bytes received, or with ``topo``
    modeled time. Gives up after ``max_states`` generated states (in both directions) or ``max_expansions``
    expanded ones, and, given a ``cutoff`` (in the objective's unit), once every plan left costs more."""
    space = _Space.of(src, dst, refine)
    price, h = _objective(space, topo)
    budget = _Budget(max_states)
    suffixes = _Suffixes(space, price, _classes(space, topo), budget, cutoff)
    permute = _permute_price(space, topo)
    best = {space.start: (0, 0)}  # the cheapest (cost, steps) found to each state
    parent: dict = {space.start: None}  # state -> (state before, move, new step?) on that cheapest path
    heap = [(h(space.start), 0, 0, 0, 0, _STATE, space.start, space.local_bytes(space.start[0]))]
    tie = expansions = 0
    while heap:
        f, nsteps, g, _, _, kind, state, extra = heapq.heappop(heap)
        g = -g
        if cutoff is not None and f > cutoff:  # f bounds the cost of every plan through the entries left
            return _Found(None, None, max_states - budget.left)
        if kind == _JOINED:
            return _Found(_build(src, dst, space, parent, state, extra, suffixes.after), f, max_states - budget.left)
        if kind == _PENDING:  # settle the suffixes up to what this join may cost, then take the best
            node, lowest, base, radius = extra  # base: the steps to the state and the permute
            suffixes.reach(*radius)  # not f - g - lowest: modeled seconds would not round-trip
            found = suffixes.join(node)
            if found is not None:
                cost, steps, suffix = found
                moved = _moved(node.dims, suffix[0])
                total = g + price(node.scaled, moved, True) + cost
                heapq.heappush(heap, (total, base + steps, -g, moved.bit_count(), tie := tie + 1, _JOINED, state,
                                      suffix))
            elif suffixes.radius is not None:
                cost, steps = radius = suffixes.radius
                heapq.heappush(heap, (g + lowest + cost, base + steps, -g, 0, tie := tie + 1, _PENDING, state,
                                      (node, lowest, base, radius)))
            continue
        if best[state] != (g, nsteps):
            continue  # a cheaper path to it was found after this entry was queued
        if state[:2] == space.goal:
            return _Found(_build(src, dst, space, parent, state, None, suffixes.after), g, max_states - budget.left)
        expansions += 1
        if max_expansions is not None and expansions > max_expansions:
            return _Found(None, None, max_states - budget.left)
        node = space.node(state, extra)
        lowest = permute(node.scaled)
        heapq.heappush(heap, (g + lowest, nsteps + 1, -g, 0, tie := tie + 1, _PENDING, state,
                              (node, lowest, nsteps + 1, (0, 0))))
        for try_step in _TRY_STEPS:
            for move, fields, nstate, nbytes, received, group, new_step in try_step(space, node):
                if not budget.take():
                    return _Found(None, None, max_states)
                ng, ns = g + price(received, group, new_step), nsteps + new_step
                old = best.get(nstate)
                if old is None or (ng, ns) < old:
                    best[nstate] = (ng, ns)
                    parent[nstate] = (state, move(*fields), new_step)
                    heapq.heappush(heap, (ng + h(nstate), ns, -ng, 0, tie := tie + 1, _STATE, nstate, nbytes))
    return _Found(None, None, max_states - budget.left)


def _moved(dims, other) -> int:
    """The mask of the atoms whose place differs between two arrangements of dims."""
    here = {(i, p, a) for i, d in enumerate(dims) for p, a in enumerate(d)}
    there = {(i, p, a) for i, d in enumerate(other) for p, a in enumerate(d)}
    return _mask(a for _, _, a in here ^ there)


def _permute_price(space: _Space, topo):
    """The least a permute of a buffer of ``scaled`` (bytes × scale) costs: the buffer, or with ``topo`` the
    cheapest link's latency and the buffer over the fastest link."""
    if topo is None:
        return lambda scaled: scaled
    links = [topo.link(a.name) for a in space.atoms.axes]
    alpha, beta = min(link.alpha for link in links), max(link.beta for link in links)
    return lambda scaled: alpha + scaled / space.scale / beta


def _classes(space: _Space, topo) -> tuple:
    """Each atom's symmetry class: atoms of one class play the same role once the destination does not place
    them (same size, and with ``topo`` the same link)."""
    if topo is None:
        return space.sizes
    return tuple((size, topo.link(a.name)) for size, a in zip(space.sizes, space.atoms.axes))


def _objective(space: _Space, topo):
    """``(price, h)``: the cost of a move from its bytes received (× scale), its group's atoms and whether it
    starts a step; and the heuristic, a lower bound on the cost from a state to the goal: what some device
    lacks (:meth:`_Space.missing_bytes`), in bytes, or with ``topo`` in modeled seconds over the fastest
    link. With ``topo``, a move costs alpha-beta over the slowest link of its group, and a merged move pays
    no latency."""
    scale = space.scale
    if topo is None:
        def price(received, group, new_step):
            return received

        def h(state):
            return space.missing_bytes(state[0], state[1]) * scale
        return price, h
    links = [topo.link(a.name) for a in space.atoms.axes]
    fastest = max(link.beta for link in links)

    def price(received, group, new_step):
        if not received:
            return 0.0
        members = [link for a, link in enumerate(links) if group >> a & 1] or links
        alpha = max(link.alpha for link in members) if new_step else 0.0
        return alpha + received / scale / min(link.beta for link in members)

    def h(state):
        return space.missing_bytes(state[0], state[1]) / fastest
    return price, h


def _build(src: ShardingType, dst: ShardingType, space: _Space, parent: dict, state, suffix, after: dict) -> Plan:
    """The plan of the search path to ``state``, then (if ``suffix`` is a backward state) a permute to it and
    its suffix of moves: each run of moves (a move that starts no new step joins the run before it) becomes
    one step, made by its last move from the dims before and after the run."""
    path = []
    while parent[state] is not None:
        before, move, new_step = parent[state]
        path.append((before[0], move, new_step, state[0]))
        state = before
    path.reverse()
    if suffix is not None:
        path.append((path[-1][3] if path else space.start[0], PermuteMove(suffix[0]), True, suffix[0]))
        tag = None
        while after[suffix] is not None:
            nxt, move = after[suffix]
            path.append((suffix[0], move, _run_tag(move) is None or _run_tag(move) != tag, nxt[0]))
            tag, suffix = _run_tag(move), nxt
    runs: list[list] = []  # [dims before the run, dims after it, its last move]
    for before, move, new_step, after_dims in path:
        if new_step:
            runs.append([before, after_dims, move])
        else:
            runs[-1][1:] = [after_dims, move]
    steps, t = [], src
    for before, after_dims, move in runs:
        steps.append(move.step(_Run(t, before, after_dims, dst, space.atoms)))
        t = steps[-1].apply(t)
    plan = Plan.from_steps(src, steps)
    if plan.dst != dst:
        raise AssertionError(f"synthesized plan ends at {plan.dst}, not {dst}")
    return plan
