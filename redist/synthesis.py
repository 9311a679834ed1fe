"""Plan synthesis: the cheapest memory-bounded sequence of collectives from one sharding type to another.

Search space. A state is a sharding of the array over *atoms*: the mesh axes, or the pieces of them that
the source or destination name as sub-axes. Steps act at the minor end of a dim's atom list (a stack):
``all_slice`` and ``reduce_scatter`` push, ``all_gather`` pops, ``all_to_all`` moves a suffix from one dim
to another (or two such moves at once, from two dims), ``all_reduce`` drops partial atoms, and
a ``permute`` swaps two atoms (within a dim, across dims with equal sizes, or with an unused atom of the
same size), several swaps in a row forming one permute.

Invariant (memory-efficient normal form). Along every plan the local size never rises and then falls
again: once a step has grown the buffer (an ``all_gather``), no ``all_slice`` or ``reduce_scatter`` follows.
The local sizes are therefore valley-shaped, and ``peak_bytes == max(src.local_bytes, dst.local_bytes)``.
Only the atoms the destination places in dims are sliced, and only atoms it does not place are gathered;
any other slice would have to be gathered again and can only cost more.

Choice. When source and destination have the same block count in every dim and the same partial axes,
the plan is one ``permute``, with no search: it receives exactly the lower bound, in one step. Otherwise
A* over these states, minimising (bytes received, number of steps). Costs are exact integers in
units of ``1 / mesh.size`` bytes (every ``k`` divides the mesh size). The heuristic ``max(0, L_dst − L)``
is admissible: buffers grow only through all-gathers, which receive exactly what they add. Sizes of axes are
arbitrary integers. When the plan over the named atoms does not meet the lower bound or takes three steps or
more (for a plan without reductions, where the bound is tight enough to tell), or no plan exists over
them (an axis must be swapped for a part of another of a different size), the search is run again with every
atom split into prime factors (Shardy's sub-axes) and the better plan is kept.

Budget and fallback. The searches of one ``synthesize`` call generate at most ``_MAX_STATES`` (200,000)
states in all, fewer for ranks above 8 (a state is a tuple per dim), and twice that with a topology (its
own searches by modeled time get a second budget). This bounds the searches of a call to about 2 seconds
and 250 MB (measured on a shared 2-core machine, up to rank 128 on 16 axes). The budget counts states,
not seconds, so that every MPI rank, synthesizing on its own, gets the same plan. In the benchmark's
sample (1,200 pairs up to rank 4, on up to 4 axes) no search needs more than about 75,000 states. When no
search finds a plan within the budget, or none exists in normal form (a cycle of atoms longer than
``_MAX_SWAPS`` swaps, say), ``synthesize`` still returns a plan, and never raises for a valid pair: the
pending sums that the destination does not keep are reduced (reduce-scattered onto dims they divide, else
all-reduced), then one ``exchange`` receives exactly what each device lacks. It is memory-bounded like
every plan and, without a reduction, at the lower bound in bytes, but it is point-to-point traffic rather
than collectives; with a reduction it can receive more than a searched plan would.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from redist import steps as S
from redist.axes import Axis, canonical_axes, remove_axes
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

    Raises :class:`ShardingError` if the types are on different meshes, have different shapes or dtypes, or if
    the destination is partial over an axis the source is not.
    """
    check_pair(src, dst, topology)
    if not (src.is_even() and dst.is_even()):
        return _synthesize_uneven(src, dst, topology)
    core_src, core_dst = _without_unit_axes(src, dst.partial), _without_unit_axes(dst, dst.partial)
    if topology is None:
        core = _synthesize(core_src, core_dst)
    else:
        from redist import cost

        topo = cost.as_topology(topology, src.mesh)
        candidates = [_synthesize(core_src, core_dst)]
        states = _state_budget(core_src)
        for refine in (False, True):
            found, used = _search(core_src, core_dst, refine, topo, states,
                                  max_expansions=_MAX_REFINED_EXPANSIONS if refine else None)
            states -= used
            if found is not None:
                candidates.append(found)
        core = min(candidates, key=lambda p: (cost.plan_time(p, topo), p.bytes_received, len(p.steps)))
    return _with_unit_axes(src, dst, core)


def _synthesize_uneven(src: ShardingType, dst: ShardingType, topology) -> Plan:
    """A plan between types with uneven dims (see "Uneven dims" in :mod:`redist.steps`).

    With equal padded shapes: the plan between the padded views, between a ``pad`` and an ``unpad`` (views:
    the buffers are those of the collectives' plan, and its peak and bytes are theirs). Otherwise the plan
    ends with an ``exchange``, which receives exactly what each device lacks. Without pending sums to reduce
    that is the whole plan, at the lower bound. With them, the fewest-bytes (with ``topology``: the fastest)
    of: an ``all_reduce`` before or after the exchange (after: if the destination does not place a reduced
    axis in a dim), and a plan on the padded view that reduce-scatters the reduced axes onto one dim whose
    padded size they keep, then the exchange. Peak: at most ``max(src, dst)`` local bytes in every case.
    """
    if src == dst:
        return Plan((), (src,))
    if src.padded_shape == dst.padded_shape:
        return _between_padded_views(src, dst, topology)
    reduced = remove_axes(src.partial, dst.partial)
    exchange = S.Exchange(dst.dims)
    if not reduced:
        return _typed_plan(src, (exchange,))
    candidates = [_typed_plan(src, (S.AllReduce(reduced), exchange))]
    if _type_or_none(src, dst.dims, src.partial) is not None:
        candidates.append(_typed_plan(src, (exchange, S.AllReduce(reduced))))
    bound = max(src.local_bytes, dst.local_bytes)
    for d in range(src.rank):
        mid = _type_or_none(src, src.dims[:d] + (src.dims[d] + reduced,) + src.dims[d + 1:], dst.partial)
        if mid is not None and mid.padded_shape == src.padded_shape and mid.local_bytes <= bound:
            first = _between_padded_views(src, mid, topology)
            candidates.append(_typed_plan(src, first.steps + (exchange,)))
    if topology is None:
        return min(candidates, key=lambda p: (p.bytes_received, len(p.steps)))
    from redist import cost

    topo = cost.as_topology(topology, src.mesh)
    return min(candidates, key=lambda p: (cost.plan_time(p, topo), p.bytes_received, len(p.steps)))


def _between_padded_views(src: ShardingType, dst: ShardingType, topology) -> Plan:
    """``pad``, the plan between the even padded views, ``unpad`` (src and dst have one padded shape)."""
    core = synthesize(src.padded(), dst.padded(), topology)
    if src.is_even() and dst.is_even():
        return core
    return _typed_plan(src, (S.Pad(),) + core.steps + (S.Unpad(src.shape),))


def _typed_plan(src: ShardingType, steps) -> Plan:
    types = [src]
    for step in steps:
        types.append(step.apply(types[-1]))
    return Plan(tuple(steps), tuple(types))


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
        steps.append(S.AllReduce(reduced))
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
    types = [src]
    for step in steps:
        types.append(step.apply(types[-1]))
    return Plan(tuple(steps), tuple(types))


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
    return _typed_plan(src, () if src == dst else (S.Permute(dst.dims),))


def _fallback(src: ShardingType, dst: ShardingType) -> Plan:
    """The plan when the searches give up (even types): reduce the pending sums that ``dst`` does not keep,
    then one ``exchange`` to ``dst``, which receives exactly the elements each device lacks.

    Each reduced axis is reduce-scattered onto the first dim whose local size it divides, and those that fit
    nowhere are all-reduced after them: reduce-scatters over a group of ``k`` devices receive
    ``(k−1)/k · L_src`` in all, half of what an all-reduce receives, and leave a smaller buffer. Peak:
    ``max(src.local_bytes, dst.local_bytes)``. Bytes: the lower bound without a reduction, else at most
    ``2(k−1)/k · L_src + L_dst``. Correct for any valid pair.
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
    steps = [S.ReduceScatter(dim, axes) for dim, axes in placed]
    if unplaced:
        steps.append(S.AllReduce(tuple(unplaced)))
    return _typed_plan(src, (*steps, S.Exchange(dst.dims)))


def _mask(ids) -> int:
    """The bit mask of the atoms ``ids``."""
    m = 0
    for i in ids:
        m |= 1 << i
    return m


@dataclass(frozen=True)
class _Moves:
    """The moves of one search, over atoms of sizes ``sizes``. A state is ``(dims, partial, grown, last)``: the
    atoms of each dim (major to minor), the mask of partial atoms, whether a gather has grown the buffer, and
    the tag of the last move, which lets consecutive slices / gathers / reduce-scatters on one dim, or
    consecutive swaps, merge into one step and be charged once. ``wanted`` masks the atoms the destination
    places in dims, ``reducible`` the partial atoms it does not keep. Bytes are in units of ``1 / scale``."""

    sizes: tuple[int, ...]
    shape: tuple[int, ...]
    global_bytes: int
    scale: int
    wanted: int
    reducible: int

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

    def successors(self, state):
        """Every move out of ``state``: ``(dims, partial, grown, tag, bytes, atoms moved, new step?, move)``."""
        dims, partial, grown, last = state
        sz, shape, scale, wanted, reducible, blocks = \
            self.sizes, self.shape, self.scale, self.wanted, self.reducible, self.blocks
        rank, n_atoms = len(shape), len(sz)
        L = self.local_bytes(dims)
        used = _mask(a for d in dims for a in d)
        free = ((1 << n_atoms) - 1) & ~used & ~partial
        local = [shape[i] // blocks(dims[i]) for i in range(rank)]
        if not grown:
            for a in range(n_atoms):
                if free >> a & 1 and wanted >> a & 1:
                    for i in range(rank):
                        # Slices on different dims commute: take them in dim order.
                        if last and last[0] == "slice" and last[1] > i:
                            continue
                        if local[i] % sz[a]:
                            continue
                        nd = dims[:i] + (dims[i] + (a,),) + dims[i + 1:]
                        yield nd, partial, False, ("slice", i), 0, 0, last != ("slice", i), ("slice", i, a)
                if reducible >> a & 1 and partial >> a & 1:
                    for i in range(rank):
                        if local[i] % sz[a]:
                            continue
                        nd = dims[:i] + (dims[i] + (a,),) + dims[i + 1:]
                        cost = (sz[a] - 1) * L * scale // sz[a]
                        yield (nd, partial & ~(1 << a), False, ("rs", i), cost, 1 << a, last != ("rs", i),
                               ("rs", i, a))
        singles = []
        for i in range(rank):
            di = dims[i]
            for m in range(1, len(di) + 1):
                suffix = di[len(di) - m:]
                k = blocks(suffix)
                for j in range(rank):
                    if j == i or local[j] % k:
                        continue
                    singles.append((i, j, m, suffix, k))
                    nd = list(dims)
                    nd[i] = di[: len(di) - m]
                    nd[j] = dims[j] + suffix
                    yield (tuple(nd), partial, grown, None, (k - 1) * L * scale // k, _mask(suffix), True,
                           ("a2a", ((i, j, m),)))
                # Gathers on different dims commute: take minor dims first, while the buffer is small (a
                # gather along a minor dim interleaves and needs a transpose; along dim 0 it appends).
                if not (_mask(suffix) & wanted) and not (last and last[0] == "gather" and last[1] < i):
                    nd = dims[:i] + (di[: len(di) - m],) + dims[i + 1:]
                    yield (nd, partial, True, ("gather", i), (k - 1) * L * scale, _mask(suffix),
                           last != ("gather", i), ("gather", i, m))
        # Two moves in one all-to-all over both groups (XLA does the same): from two dims into two others, or
        # into one (appended in move order, so both orders are tried).
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
                yield (tuple(nd), partial, grown, None, (k - 1) * L * scale // k, _mask(suffix1 + suffix2),
                       True, ("a2a", ((i1, j1, m1), (i2, j2, m2))))
        if partial & reducible:
            k = blocks(a for a in range(n_atoms) if (partial & reducible) >> a & 1)
            yield (dims, partial & ~reducible, grown, None, 2 * (k - 1) * L * scale // k, partial & reducible, True,
                   ("ar",))
        chain = last[1] if last and last[0] == "swap" else 0
        if chain < _MAX_SWAPS:
            tag = ("swap", chain + 1)
            cost = 0 if chain else L * scale
            for nd in _swaps(dims, sz, free & wanted):
                moved = _mask(a for d, e in zip(dims, nd) for a, b in zip(d, e) if a != b)
                yield nd, partial, grown, tag, cost, moved, not chain, ("swap", nd)


def _search(src: ShardingType, dst: ShardingType, refine: bool, topo=None, max_states: int = _MAX_STATES,
            max_expansions: int | None = None) -> tuple[Plan | None, int]:
    """A* over normal-form plans on the atoms of ``refine``; objective: bytes received, or with ``topo``
    modeled time (a merged step pays its latency once). Returns the plan, or None if there is none or the
    search gives up (after ``max_states`` generated states or ``max_expansions`` expanded ones), and the
    number of states it generated."""
    mesh = src.mesh
    atoms = _atoms(mesh, _cut_points(mesh, (src, dst), refine))
    src_dims, dst_dims = (tuple(atoms.expand(d) for d in t.dims) for t in (src, dst))
    src_partial = _mask(atoms.expand(src.partial))
    dst_partial = _mask(atoms.expand(dst.partial))
    space = _Moves(atoms.sizes, src.shape, src.global_bytes, mesh.size,
                   wanted=_mask(a for d in dst_dims for a in d), reducible=src_partial & ~dst_partial)
    scale = mesh.size
    dst_local = space.local_bytes(dst_dims)
    if topo is None:
        def price(nbytes_scaled, axes, new_step):
            return nbytes_scaled

        def h(dims):
            return max(0, dst_local - space.local_bytes(dims)) * scale
    else:
        links = [topo.link(a.name) for a in atoms.axes]
        fastest = max(link.beta for link in links)

        def price(nbytes_scaled, axes, new_step):
            if not nbytes_scaled:
                return 0.0
            group = [link for a, link in enumerate(links) if axes >> a & 1] or links
            alpha = max(link.alpha for link in group) if new_step else 0.0
            return alpha + nbytes_scaled / scale / min(link.beta for link in group)

        def h(dims):
            return max(0, dst_local - space.local_bytes(dims)) / fastest

    start = (src_dims, src_partial, False, None)
    goal = (dst_dims, dst_partial)
    best = {start: (0, 0)}
    parent: dict = {start: None}
    heap = [(h(src_dims), 0, 0, 0, start)]
    tie = expansions = generated = 0
    while heap:
        f, g, nsteps, _, state = heapq.heappop(heap)
        if best.get(state) != (g, nsteps):
            continue
        if state[:2] == goal:
            return _build(src, dst, atoms, parent, state), generated
        expansions += 1
        if max_expansions is not None and expansions > max_expansions:
            return None, generated
        for nd, npartial, ngrown, ntag, nbytes, axes, new_step, move in space.successors(state):
            if generated == max_states:
                return None, generated
            generated += 1
            nstate = (nd, npartial, ngrown, ntag)
            ng, ns = g + price(nbytes, axes, new_step), nsteps + (1 if new_step else 0)
            old = best.get(nstate)
            if old is None or (ng, ns) < old:
                best[nstate] = (ng, ns)
                parent[nstate] = (state, move)
                tie += 1
                heapq.heappush(heap, (ng + h(nd), ng, ns, tie, nstate))
    return None, generated


def _swaps(dims, sz, swappable_free):
    """Dims after one swap of two atom slots, or of a slot with an unused atom of the same size."""
    slots = [(i, p) for i, d in enumerate(dims) for p in range(len(d))]
    for x, (i, p) in enumerate(slots):
        a = dims[i][p]
        for j, q in slots[x + 1:]:
            b = dims[j][q]
            if i != j and sz[a] != sz[b]:
                continue
            nd = [list(d) for d in dims]
            nd[i][p], nd[j][q] = b, a
            yield tuple(tuple(d) for d in nd)
        c = 0
        free = swappable_free
        while free:
            if free & 1 and sz[c] == sz[a]:
                nd = [list(d) for d in dims]
                nd[i][p] = c
                yield tuple(tuple(d) for d in nd)
            free >>= 1
            c += 1


def _build(src, dst, atoms, parent, state) -> Plan:
    """Turn the search path into typed steps; runs of mergeable moves become one step."""
    moves = []
    while parent[state] is not None:
        state, move = parent[state]
        moves.append((move, state))
    moves.reverse()
    steps = []
    t = src
    tok = atoms.compress
    for move, before in moves:
        dims = before[0]
        kind = move[0]
        if kind in ("slice", "rs"):
            _, i, a = move
            step_cls = S.AllSlice if kind == "slice" else S.ReduceScatter
            if steps and isinstance(steps[-1], step_cls) and steps[-1].dim == i:
                steps.pop()
                t = _undo(steps, src)
                full = dims[i] + (a,)
                old = atoms.expand(t.dims[i])
                step = step_cls(i, tok(full[len(old):]))
            else:
                step = step_cls(i, tok((a,)))
        elif kind == "gather":
            _, i, m = move
            if steps and isinstance(steps[-1], S.AllGather) and steps[-1].dim == i:
                steps.pop()
                t = _undo(steps, src)
                old = atoms.expand(t.dims[i])
                keep = dims[i][: len(dims[i]) - m]
                step = S.AllGather(i, tok(old[len(keep):]))
            else:
                step = S.AllGather(i, tok(dims[i][len(dims[i]) - m:]))
        elif kind == "a2a":
            parts = [(i, j, tok(dims[i][len(dims[i]) - m:])) for i, j, m in move[1]]
            step = S.AllToAll(*parts[0]) if len(parts) == 1 else S.MultiAllToAll(tuple(parts))
        elif kind == "ar":
            step = S.AllReduce(remove_axes(t.partial, dst.partial))
        elif kind == "swap":
            nd = tuple(tok(d) for d in move[1])
            if steps and isinstance(steps[-1], S.Permute):
                steps.pop()
                t = _undo(steps, src)
            step = S.Permute(nd)
        else:
            raise AssertionError(kind)
        steps.append(step)
        t = step.apply(t)
    types = [src]
    for s in steps:
        types.append(s.apply(types[-1]))
    if types[-1] != dst:
        raise AssertionError(f"synthesized plan ends at {types[-1]}, not {dst}")
    return Plan(tuple(steps), tuple(types))


def _undo(steps, src):
    t = src
    for s in steps:
        t = s.apply(t)
    return t
