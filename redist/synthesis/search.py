"""The search: a bidirectional search over normal-form plans, its objective, its budget, and the plan it builds.

Search (bidirectional, meeting at the permute). Plans in normal form are ``prefix, permute, suffix``, each
part possibly empty. A forward A* runs the moves 1-5 (:mod:`redist.synthesis.moves`) from the source. A
backward Dijkstra runs them read backwards from the goal (the ``_untry_…`` generators), lazily: only as far
as the forward queue needs. Its suffixes are indexed by what a permute keeps (each dim's block count and the
partial atoms), so a forward state joins the cheapest settled suffix of its key with one permute, whatever
arrangement of atoms that permute makes. The forward queue holds states, pending joins (priced with the
cheapest suffix not yet settled) and found joins; the search ends when a goal state or a found join is the
cheapest entry, or when both queues are empty (no normal-form plan over these atoms). Ties (equal cost and
steps) go to the permute placed later and moving fewer atoms. Heuristic: what some device lacks of its
destination block (:meth:`Space.missing_bytes <redist.synthesis.space.Space.missing_bytes>`, the lower bound
of :mod:`redist.bounds` from that state): a device receives at least what it lacks, so it is admissible. With
a topology, the objective is modeled time (a run pays its latency once), and the heuristic and the least cost
of a permute are priced over the fastest link. Symmetry: atoms of one size (with a topology, one size and
link) that the destination places in no dim are interchangeable for the backward search, which gathers only
the first free one of each class.

Pruning. The searches by bytes look only for plans that receive no more than the fallback
(:func:`redist.synthesis.fallback.fallback`; its cost is computed from the atoms,
:func:`~redist.synthesis.fallback.fallback_cost`): without reductions its exchange receives exactly the lower
bound, so a plan that misses the bound would lose to it anyway. The forward search stops once its cheapest
entry costs more; the backward search drops a state whose suffix, plus what some device lacks of that
state's blocks at the source (a lower bound on any prefix and permute to it), costs more. Ties keep the
collectives. On pairs where no plan of collectives meets the bound, the search ends after a few thousand
states and the exchange is taken, instead of running the budget out.

:func:`search` runs one search under a budget of states (:func:`state_budget` for one ``synthesize`` call)
and returns what it :class:`Found`.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

from redist.plan import Plan
from redist.synthesis.moves import TRY_STEPS, UNTRY_STEPS, PermuteMove, run_tag
from redist.synthesis.space import Node, Run, Space, mask
from redist.types import ShardingType


# The search budget of one synthesize() call (see "Budget and fallback" in :mod:`redist.synthesis`): the states
# its searches may generate in all, twice that with a topology. Generated states, not expanded ones: an
# expansion of a high-rank state over many atoms generates tens of thousands, and each costs time and memory.
# A state holds a tuple per dim, so above rank _BUDGET_RANK the budget shrinks in proportion.
MAX_STATES = 50_000
_BUDGET_RANK = 8
# The search over sub-axes refines a plan that usually exists already; it gives up sooner.
MAX_REFINED_EXPANSIONS = 8_000
# Without sums to reduce, the fallback's exchange receives the lower bound and a search can only tie with it
# (collectives rather than point-to-point traffic): its searches get a smaller budget.
MAX_EXACT_STATES = 15_000


def state_budget(t: ShardingType) -> int:
    """The states the searches of one call may generate for types of ``t``'s rank (see ``MAX_STATES``)."""
    return MAX_STATES * _BUDGET_RANK // max(_BUDGET_RANK, t.rank)


def _key(space: Space, dims, partial: int) -> tuple:
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

    def __init__(self, space: Space, price, classes, budget: _Budget, cutoff=None):
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
            for untry in UNTRY_STEPS:
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

    def join(self, node: Node):
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


# The forward queue holds three kinds of entries, ordered by (cost + heuristic, steps, −cost): a state; a
# pending join from a state (its priority: the cost to it, a permute, and the least that an unsettled suffix
# can cost); and a join found (a state, a permute, a settled suffix: its whole cost).
_STATE, _PENDING, _JOINED = 0, 1, 2


class Found(NamedTuple):
    """A search's outcome: its ``plan`` (None if there is none or the search gave up), the plan's ``cost``
    (bytes received × the mesh size, or with a topology modeled seconds) and the ``states`` it generated."""

    plan: Plan | None
    cost: int | float | None
    states: int


def search(src: ShardingType, dst: ShardingType, refine: bool, topo=None, max_states: int = MAX_STATES,
            max_expansions: int | None = None, cutoff=None) -> Found:
    """A* over normal-form plans on the atoms of ``refine``; objective: bytes received, or with ``topo``
    modeled time. Gives up after ``max_states`` generated states (in both directions) or ``max_expansions``
    expanded ones, and, given a ``cutoff`` (in the objective's unit), once every plan left costs more."""
    space = Space.of(src, dst, refine)
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
            return Found(None, None, max_states - budget.left)
        if kind == _JOINED:
            return Found(_build(src, dst, space, parent, state, extra, suffixes.after), f, max_states - budget.left)
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
            return Found(_build(src, dst, space, parent, state, None, suffixes.after), g, max_states - budget.left)
        expansions += 1
        if max_expansions is not None and expansions > max_expansions:
            return Found(None, None, max_states - budget.left)
        node = space.node(state, extra)
        lowest = permute(node.scaled)
        heapq.heappush(heap, (g + lowest, nsteps + 1, -g, 0, tie := tie + 1, _PENDING, state,
                              (node, lowest, nsteps + 1, (0, 0))))
        for try_step in TRY_STEPS:
            for move, fields, nstate, nbytes, received, group, new_step in try_step(space, node):
                if not budget.take():
                    return Found(None, None, max_states)
                ng, ns = g + price(received, group, new_step), nsteps + new_step
                old = best.get(nstate)
                if old is None or (ng, ns) < old:
                    best[nstate] = (ng, ns)
                    parent[nstate] = (state, move(*fields), new_step)
                    heapq.heappush(heap, (ng + h(nstate), ns, -ng, 0, tie := tie + 1, _STATE, nstate, nbytes))
    return Found(None, None, max_states - budget.left)


def _moved(dims, other) -> int:
    """The mask of the atoms whose place differs between two arrangements of dims."""
    here = {(i, p, a) for i, d in enumerate(dims) for p, a in enumerate(d)}
    there = {(i, p, a) for i, d in enumerate(other) for p, a in enumerate(d)}
    return mask(a for _, _, a in here ^ there)


def _permute_price(space: Space, topo):
    """The least a permute of a buffer of ``scaled`` (bytes × scale) costs: the buffer, or with ``topo`` the
    cheapest link's latency and the buffer over the fastest link."""
    if topo is None:
        return lambda scaled: scaled
    links = [topo.link(a.name) for a in space.atoms.axes]
    alpha, beta = min(link.alpha for link in links), max(link.beta for link in links)
    return lambda scaled: alpha + scaled / space.scale / beta


def _classes(space: Space, topo) -> tuple:
    """Each atom's symmetry class: atoms of one class play the same role once the destination does not place
    them (same size, and with ``topo`` the same link)."""
    if topo is None:
        return space.sizes
    return tuple((size, topo.link(a.name)) for size, a in zip(space.sizes, space.atoms.axes))


def _objective(space: Space, topo):
    """``(price, h)``: the cost of a move from its bytes received (× scale), its group's atoms and whether it
    starts a step; and the heuristic, a lower bound on the cost from a state to the goal: what some device
    lacks (:meth:`Space.missing_bytes <redist.synthesis.space.Space.missing_bytes>`), in bytes, or with
    ``topo`` in modeled seconds over the fastest link. With ``topo``, a move costs alpha-beta over the slowest
    link of its group, and a merged move pays no latency."""
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


def _build(src: ShardingType, dst: ShardingType, space: Space, parent: dict, state, suffix, after: dict) -> Plan:
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
            path.append((suffix[0], move, run_tag(move) is None or run_tag(move) != tag, nxt[0]))
            tag, suffix = run_tag(move), nxt
    runs: list[list] = []  # [dims before the run, dims after it, its last move]
    for before, move, new_step, after_dims in path:
        if new_step:
            runs.append([before, after_dims, move])
        else:
            runs[-1][1:] = [after_dims, move]
    steps, t = [], src
    for before, after_dims, move in runs:
        steps.append(move.step(Run(t, before, after_dims, dst, space.atoms)))
        t = steps[-1].apply(t)
    plan = Plan.from_steps(src, steps)
    if plan.dst != dst:
        raise AssertionError(f"synthesized plan ends at {plan.dst}, not {dst}")
    return plan
