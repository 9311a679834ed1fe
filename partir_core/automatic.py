"""Automatic partitioning: Monte Carlo tree search over "shard dimension group g on mesh axis a".

The decision space comes from :mod:`partir_core.analysis`: dims that must share a sharding form groups
(union-find over the registry's factors, backward pass included), groups are reached through an input dim
(a parameter if the group has one), and groups that differ only by layer index form one decision. An
*action* is ``(decision, axis)``; it is applied as the :class:`~partir_core.ManualPartition` that names the
decision's representative input dims (``ManualPartition({"params/layers/*/w1": 1}, axis="model")``),
followed by propagation, exactly as a hand-written tactic would be. So the search result *is* a list of
manual tactics, and pasting them into a schedule reproduces the program. A dim need not divide by the axis
(it is then split by the padding rule). Two *composite* actions per axis reach what no single group does, as
ZeRO shards weights (:func:`zero_actions`, read off the inputs' kinds): ZeRO-3 (every parameter and
optimizer-state input on its largest dim) and ZeRO-2 (the optimizer state so, the parameters pinned).

Search state: a *set* of actions, applied in a canonical order (decisions that reach data inputs first, as
batch parallelism is composed first by hand; then the others in program order; the composite ones last;
axes in the order given). Provenance keeps that order: the j-th action gets tactic index ``k + j/1000``
(``k``: the ``AutomaticPartition``'s place in the schedule), so earlier actions win conflicts, as earlier
tactics do. An action that changes nothing where it is applied (its input dim already split on that axis,
the axis taken by another dim of the input, a pinned input) is not a move.

Evaluation (no JAX: the program is traced once): the state of a set is made from its canonical prefix's by
one action and incremental propagation, and scored by :class:`partir_core.estimate.Estimator` relative to
a set scored before, the one of those it holds whose state differs least from it among the few closest in
actions (the set it was reached from, its prefix, ...: :meth:`Evaluator.base_for`; only the ops whose values
changed are chosen again), with the same figures as ``pf.lower(...).simulate()``; results are cached per
action set and per resulting sharding. A state that cannot be lowered (a ``ShardingError``) is never chosen.
The reward of a state is ``0.5 + 0.5·t0/(t0 + t)`` (``t`` its simulated step time, ``t0`` that of the starting
state) when its simulated peak memory fits ``memory_budget_bytes``, and ``0.45·budget/peak`` (always lower)
when it does not. Without a memory budget, a state's peak only breaks ties between equally fast sets of as many
actions and is reported for the result: it is simulated when first read (:attr:`Evaluation.peak_bytes`), not
with every candidate.

The search, in three phases:

1. *Goals* (:func:`_templates`): data parallelism over every subset of the axes, alone and with one ZeRO
   action (PartIR's goal-directed composite search: the strategies experts compose), and their
   Megatron-style refinements (:func:`_goal_refinements`): the most promising goals, the fastest goal (over
   the budget or not: weight splits save memory) and the start, in turn, most promising first
   (:meth:`Evaluator.promise`), each with one pair of weight decisions on an axis it leaves free, or one
   weight decision on several. In this order: data parallelism alone; then in turn one with ZeRO (the most
   promising data parallelism first) and one refinement of the start, the fastest or the most promising data
   parallelism, as many of those as of these; then the refinements of the most promising goals. So a search
   stopped early has tried both ZeRO and Megatron-style splits (three axes give many ZeRO templates, goals
   many refinements) and refined the goals with ZeRO. With ``sub_axes``, all this is done first for the goals
   on the axes asked for, then for those that use a half: a search stopped early has refined the goals of
   whole axes as one without the halves has. All become children of the tree's root (macro moves the tree
   refines one group at a time).
2. *Tree* (until ``MCTS_SHARE`` of the time budget and of ``max_evals``): UCT over the sets (a node per set,
   shared between the orders that reach it: transpositions), with each node's value the best reward found
   below it (the problem is deterministic: the best leaf matters, not the mean), normalised among siblings;
   progressive widening (a node with ``n`` visits has at most ``⌈2√n⌉`` children), children tried in order
   of their action's all-moves-as-first value (the best reward of any evaluated set containing it; actions
   never evaluated first), then of a heuristic prior (:func:`_priors`: batch parallelism, then heavy
   groups). Every expansion is evaluated directly (no random rollouts: every state is a complete strategy).
   It stops early when ``patience`` evaluations in a row did not improve the best, or the tree is exhausted.
3. *Local improvement* (:func:`_improve`): best-improvement moves over single group moves (drop an action,
   move a decision to another axis, add an action, add two weight decisions on one axis as Megatron splits
   two groups at once: :func:`_neighbours`) to a local optimum, from the best set found, then from the most
   promising goals (step time scaled by how far their peak is over the budget, :meth:`Evaluator.promise`:
   a fast goal that does not fit may fit after a move), then from the next best sets.

Ties are broken by a ``random.Random(seed)``. With a budget of evaluations (``max_evals``) the search is
deterministic for a seed: the same sets are evaluated in the same order and the same result is returned.
With a wall-time budget, the order is the same but where it stops depends on the machine's speed; it stops
when the next evaluation, if it took as long as the slowest of the last ``RECENT`` (an evaluation whose state
and base must be rebuilt takes several times the mean, and the first ones, which plan most reshards afresh,
far longer: on a mesh of a thousand devices, as long as half the budget), would end past ``time_budget_s``.

Pieces: :class:`Evaluator` (states and scores of action sets), :class:`_Tree` (one iteration is
:meth:`_Tree.descend`, selection then expansion, and :meth:`_Tree.backup`), :func:`_seed`, :func:`_improve`,
:func:`_stop_reason`, and :func:`search`, which ties them together and keeps the best set found
(:class:`_Found`). When no set fits the budget, the error names the smallest peak found and the buffers that
dominate it (:func:`_peak_report`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import gc
import itertools
import math
import random
import sys
import time
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import Callable

import jax

from redist.errors import ShardingError
from redist.mesh import prime_factors

from partir_core.analysis import DimGroups, analyze_groups, input_kind
from partir_core.choice import analyze
from partir_core.estimate import Estimator, propagate_changes, ranked
from partir_core.ir import key_name
from partir_core.lowering import lower
from partir_core.propagation import State
from partir_core.simulator import simulate
from partir_core.tactics import AutomaticPartition, ManualPartition, PartitionError

STEP = 1e-3  # provenance step between the actions of one AutomaticPartition
MCTS_SHARE = 0.6  # of the time budget and of max_evals, for the goals and the tree; the local pass gets the rest
LOCAL_STARTS = 3  # the local pass starts from this many of the best sets found and of the fastest goals
# held sets (the closest in actions) whose states are compared to pick the base a set is scored from: on the
# transformer at 2x4 (one sitting, a shared 2-core host), 8 gave 92 evaluations/s, 2 and 4 gave 90, 16 gave 89,
# all 64 held 77 (comparing states costs more than it saves)
BASE_TRIES = 8
RECENT = 32  # evaluations (cache hits aside) whose slowest the deadline allows for: Evaluator.expected_s


@dataclass(frozen=True)
class Action:
    """Shard decision ``decision`` (a :class:`~partir_core.analysis.MacroGroup`) on mesh axis ``axis``."""

    decision: int
    axis: str
    dims: tuple  # ((path pattern, dim), ...) of the ManualPartition

    def __hash__(self):  # sets of actions key the search's caches: hashed often, told apart by these two
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.decision, self.axis))
        return h

    def __getstate__(self) -> dict:  # the hash is not pickled: string hashes differ between processes
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def tactic(self) -> ManualPartition:
        return ManualPartition(dict(self.dims), axis=self.axis)

    def __str__(self):
        return str(self.tactic)


@dataclass
class Evaluation:
    """A simulated state: step time and peak bytes (``inf`` and a huge peak when it cannot be lowered, then
    ``error`` says why), whether it fits the memory budget, and its reward. The peak is ``known_peak``, or, where
    that is None (a search without a memory budget scores step times only), what ``measure()`` gives when
    :attr:`peak_bytes` is first read."""

    step_time_s: float
    known_peak: int | None
    feasible: bool
    reward: float
    error: str | None = None
    measure: Callable[[], int] | None = field(default=None, repr=False, compare=False)

    @property
    def peak_bytes(self) -> int:
        if self.known_peak is None:
            self.known_peak = self.measure()
        return self.known_peak


@dataclass
class AutoResult:
    """What an :class:`~partir_core.AutomaticPartition` found (``Partitioned.automatic``).

    ``tactics``: the chosen actions as manual tactics, in the order they apply (paste them into a schedule
    in place of the ``AutomaticPartition``); ``code``: the same as Python source; ``text``: the program after
    them; ``action_space``: sizes before and after grouping; ``groups``: the analysis; ``stats``: search
    statistics (evaluations, ``evals_per_s`` over the search's wall time and ``evals_per_cpu_s`` over its
    process time, ``scoring_ms`` per evaluation, cache hits, per-op choices remembered for the op
    (``op_choice_hits``), shared with another op of its signature (``op_choice_shared``) or made
    (``op_choice_misses``), templates, iterations, the local pass, seconds,
    why it stopped, best over time)."""

    tactics: list
    actions: list
    step_time_s: float
    peak_bytes: int
    memory_budget_bytes: int | None
    action_space: dict
    groups: DimGroups
    stats: dict
    start_time_s: float
    start_peak_bytes: int
    text: str = ""
    state: State | None = field(default=None, repr=False)

    @property
    def code(self) -> str:
        return "[\n" + "".join(f"    {t},\n" for t in self.tactics) + "]"

    def __str__(self):
        st = self.stats
        return (f"AutomaticPartition: {len(self.tactics)} tactic(s), simulated step "
                f"{self.step_time_s * 1e3:.4f} ms, peak {self.peak_bytes} B"
                + (f" (budget {self.memory_budget_bytes} B)" if self.memory_budget_bytes else "")
                + f"; from {self.start_time_s * 1e3:.4f} ms / {self.start_peak_bytes} B; "
                f"{st['evaluations']} evaluations in {st['seconds']:.1f} s ({st['stopped']}); "
                f"action space {self.action_space['values_dims_axes']} → {self.action_space['decisions_axes']}\n"
                + self.code)


# ----------------------------------------------------------------------------------- actions
def compress(pairs, in_paths) -> tuple:
    """``((pattern, dim), ...)`` naming exactly the input dims ``pairs`` (``(path, dim)``): paths that differ
    only in all-digit components are joined by a ``*`` wildcard when it matches nothing else."""
    by: dict = {}
    for p, d in pairs:
        parts = p.split("/")
        key = (tuple("*" if c.isdigit() else c for c in parts), d)
        by.setdefault(key, []).append(p)
    out = []
    for (parts, d), paths in by.items():
        pattern = "/".join(parts)
        hits = [q for q in in_paths if fnmatch.fnmatchcase(q, pattern)]
        if len(paths) > 1 and sorted(hits) == sorted(paths):
            out.append((pattern, d))
        else:
            out.extend((p, d) for p in paths)
    return tuple(out)


def search_axes(tactic: AutomaticPartition, mesh) -> list[str]:
    """The axes the search shards on: the tactic's ``axes`` (mesh axes or sub-axes; none given: every mesh
    axis), and with ``tactic.sub_axes`` also the two halves of each whole axis among them of size >= 4
    (``model:(1)2`` and ``model:(2)2`` on ``model=4``; ``model:(1)2`` and ``model:(2)4`` on ``model=8``: the
    axis split at its smallest prime factor), so that the search can compose, say, data parallelism on one half
    of an axis with Megatron on the other. A half and its whole axis overlap: where both reach one value or
    one op, the earlier action keeps it (:mod:`partir_core.propagation`), so a set holding both is a set
    holding the earlier one."""
    axes = [str(mesh.axis(a)) for a in tactic.axes] or list(mesh.names)
    halves = []
    for a in map(mesh.axis, axes if tactic.sub_axes else ()):
        p = prime_factors(a.size)[0]
        if a.is_whole and a.size >= 4 and p < a.size:
            halves += [f"{a.name}:(1){p}", f"{a.name}:({p}){a.size // p}"]
    return list(dict.fromkeys(axes + halves))


def build_actions(groups: DimGroups, graph, mesh, axes) -> list[Action]:
    """The legal actions in canonical order (see the module docstring): every decision on every axis of size
    > 1 that is no larger than each of its input dims (a dim need not divide by the axis: a vocabulary of
    50 on 4 devices, a batch of 5 on 2 are split by the padding rule, as experts split them), then the
    composite actions (:func:`zero_actions`)."""
    sizes = {a: mesh.axis_size(a) for a in axes}

    def data_first(m):
        has_data = any(input_kind(p) == "data" for g in m.groups for p, _ in g.inputs)
        return (0 if has_data else 1, m.id)

    out = []
    for m in sorted(groups.macro, key=data_first):
        dims = compress(m.reps, graph.in_paths)
        for a in axes:
            fits = all(graph.shape(graph.invars[graph.in_paths.index(p)])[d] >= sizes[a] for p, d in m.reps)
            if fits and sizes[a] > 1:
                out.append(Action(m.id, a, dims))
    return out + zero_actions(len(groups.macro), graph, mesh, axes)


def zero_actions(first_id: int, graph, mesh, axes) -> list[Action]:
    """Composite actions that no single group reaches, as ZeRO shards weights (Automap's inductive tactics,
    read off the inputs' kinds, not their names): per axis, *ZeRO-3* (decision ``first_id``: every
    parameter and optimizer-state input split on its largest dim that divides by the axis) and *ZeRO-2*
    (decision ``first_id + 1``: the optimizer state split so, the parameters pinned as they are). They come
    last in canonical order, as ZeRO is composed last by hand (``BP+MP+Z2``)."""
    sizes = {a: mesh.axis_size(a) for a in axes}
    leaves = [(p, graph.shape(v)) for p, v in zip(graph.in_paths, graph.invars) if input_kind(p) != "data"]
    out = []
    for a in axes:
        if sizes[a] <= 1:
            continue
        largest = {}
        for p, shape in leaves:
            ok = [d for d, n in enumerate(shape) if n % sizes[a] == 0 and n >= sizes[a]]
            if ok:
                largest[p] = max(ok, key=lambda d: shape[d])
        state = {p: d for p, d in largest.items() if input_kind(p) == "state"}
        if largest:
            out.append(Action(first_id, a, compress(list(largest.items()), graph.in_paths)))
        if state:
            pins = [(p, None) for p, _ in leaves if input_kind(p) == "param"]
            out.append(Action(first_id + 1, a, compress(pins + list(state.items()), graph.in_paths)))
    return out


# ---------------------------------------------------------------------------------- evaluation
class Evaluator:
    """States and simulations of action sets, cached (see the module docstring). A state is made from its
    canonical prefix's by one action and :func:`~partir_core.estimate.propagate_changes`, and scored by an
    :class:`~partir_core.estimate.Estimator` from that prefix's scoring. The states it keeps are frozen
    (:func:`_frozen`): read-only, each sharing with its prefix's the dims and provenance of the values the
    action did not change, so that hundreds of them hold few objects of their own (Python's cyclic collector
    walks every container alive, and took a third of the search's time when each state held two lists per
    value)."""

    def __init__(self, graph, rules, mesh, base: State, index: int, actions: list, hardware, budget,
                 max_states: int = 512):
        self.graph, self.rules, self.mesh = graph, rules, mesh
        self.interned: dict = {}  # the dims and provenance tuples of its states (_frozen)
        self.steps: dict = {}  # propagation's steps at each op, by what they read (propagate_changes)
        self.weak = weakref.proxy(self)  # what its evaluations measure their peaks with: they make no cycle
        self.base, self.index, self.actions = _frozen(base, base, base.dims, self.interned), index, actions
        self.rank = {a: i for i, a in enumerate(actions)}
        self.budget = budget
        self.estimator = Estimator(graph, rules, mesh, hardware)
        self.tactics = {a: a.tactic for a in actions}
        self.matches = {a: [v for _, v, _ in self.tactics[a].matches(graph)] for a in actions}
        self.states: OrderedDict = OrderedDict()
        self.max_states = max_states
        self.noop: set = set()
        self.evals: dict = {}
        self.by_fingerprint: dict = {}
        self.n_sim = self.n_hits = self.n_fp_hits = 0
        self.sim_s = 0.0
        self.recent: deque = deque(maxlen=RECENT)  # seconds of the last evaluations that were no cache hit
        self.t0 = None

    def key(self, acts) -> tuple:
        return tuple(sorted(acts, key=self.rank.__getitem__))

    def promise(self, e: Evaluation) -> float:
        """A set's step time, scaled by how far its peak is over the budget (what fitting may cost): which
        sets a local search should start from."""
        over = e.peak_bytes / self.budget if self.budget is not None else 1.0
        return e.step_time_s * max(1.0, over)

    def rank_of(self, key: tuple) -> tuple:
        """A set's place in a fixed order (ties between equal scores are broken by it)."""
        return tuple(self.rank[a] for a in key)

    def state(self, key: tuple) -> State | None:
        """The propagated state after ``key`` (canonical order), or None if some action is not a move."""
        if key in self.noop:
            return None
        if not key:
            return self.base
        if key in self.states:
            self.states.move_to_end(key)
            return self.states[key]
        parent = self.state(key[:-1])
        if parent is None:
            self.noop.add(key)
            return None
        a = key[-1]
        s = parent.copy_of_frozen()
        before = [tuple(s.dims[v]) for v in self.matches[a]]
        k = self.index + STEP * (len(key) - 1)
        n_conf = len(s.conflicts)
        self.tactics[a].apply(self.graph, s, self.mesh, k)
        changed = {v for v, b in zip(self.matches[a], before) if tuple(s.dims[v]) != b}
        if not changed:
            del s.conflicts[n_conf:]
            self.noop.add(key)
            return None
        touched = propagate_changes(self.estimator.structure, s, self.mesh, k, changed, steps=self.steps)
        s = _frozen(s, parent, touched, self.interned)
        self.states[key] = s
        if len(self.states) > self.max_states:
            self.states.popitem(last=False)
        return s

    def fingerprint(self, s: State) -> tuple:
        """What scoring reads of a frozen state: every value's dims, their provenances by order, the pins."""
        return self.estimator.read(s.dims), ranked(self.estimator.read(s.prov)), frozenset(s.pinned)

    def evaluate(self, key: tuple, near: tuple | None = None) -> Evaluation | None:
        """The evaluation of set ``key`` (None if some action is not a move), scored from a set the estimator
        holds (:meth:`base_for`; ``near``: an evaluated set it differs little from, the node it was reached
        from)."""
        if key in self.evals:
            self.n_hits += 1
            return self.evals[key]
        t_start = time.perf_counter()
        try:
            return self._evaluate(key, near)
        finally:
            self.recent.append(time.perf_counter() - t_start)

    def _evaluate(self, key: tuple, near: tuple | None) -> Evaluation | None:
        s = self.state(key)
        if s is None:
            return None
        fp = self.fingerprint(s)
        ev = self.by_fingerprint.get(fp)
        if ev is not None:
            self.n_fp_hits += 1
        else:
            t_start = time.perf_counter()
            try:  # the peak where the reward reads it (see the module docstring)
                sim = self.estimator.score(key, s, self.base_for(key, s, near), memory=self.budget is not None)
                t, peak, err = sim.step_time_s, sim.peak_bytes, None
            except ShardingError as e:  # a state that cannot be lowered (no reshard reaches a type) is never chosen
                t, peak, err = math.inf, 1 << 62, f"{type(e).__name__}: {e}"
            self.sim_s += time.perf_counter() - t_start
            self.n_sim += 1
            if self.t0 is None:
                self.t0 = t if math.isfinite(t) and t > 0 else 1.0
            ev = Evaluation(t, peak, err is None and (self.budget is None or peak <= self.budget),
                            self.reward(t, peak, err), err, functools.partial(Evaluator.peak, self.weak, key))
            self.by_fingerprint[fp] = ev
        self.evals[key] = ev
        return ev

    def peak(self, key: tuple) -> int:
        """The simulated peak of set ``key``'s state (its program simulated with its memory, lowered again from
        the nearest set held where the estimator no longer holds it)."""
        s = self.state(key)
        return self.estimator.peak(key, s, self.base_for(key, s, None))

    def base_for(self, key: tuple, state: State, near: tuple | None) -> tuple | None:
        """The set that set ``key`` (of state ``state``) is scored from: the figures are the same from any, the
        work is not (the ops touching a value whose dims or provenance differ are chosen again). Of the sets the
        estimator holds, the :data:`BASE_TRIES` that differ from ``key`` in the fewest actions (``near``, then
        ``key``'s canonical prefix, first among equals), the one whose state differs from ``state`` in the
        fewest values (:meth:`~partir_core.estimate.Estimator.nearest`); None if it holds none."""
        acts, held = set(key), self.estimator.bases
        sets = [b for b in dict.fromkeys((near, key[:-1], *held)) if b is not None and b != key and b in held]
        sets.sort(key=lambda b: len(acts.symmetric_difference(b)))
        return self.estimator.nearest(state, sets[:BASE_TRIES])

    def expected_s(self) -> float:
        """How long the next evaluation may take: as long as the slowest of the last :data:`RECENT` that were
        no cache hit (one whose state and base must be rebuilt takes several times the mean; the first ones,
        which plan most reshards afresh, are left behind once the search is under way); the search stops
        when it would end past its deadline."""
        return max(self.recent, default=0.0)

    def reward(self, t, peak, err) -> float:
        if err is not None:
            return 0.0
        if self.budget is not None and peak > self.budget:
            return 0.45 * self.budget / peak
        return 0.5 + 0.5 * self.t0 / (self.t0 + t)


def _frozen(state: State, parent: State, changed, interned: dict) -> State:
    """``state`` (made from ``parent`` by changing the dims or provenance of the values ``changed``) with every
    value's dims and provenance as tuples, those of the values not ``changed`` the very tuples ``parent`` holds
    (``parent`` is frozen, or is ``state`` itself), the others interned in ``interned`` (a tuple equal to one
    met before is that very tuple: states reached by other paths share them too, and the estimator compares
    and remembers them by identity first). Read-only: :meth:`State.copy` gives a state to change."""
    if len(interned) >= _INTERNED:
        interned.clear()
    dims, prov = dict(parent.dims), dict(parent.prov)
    setdefault = interned.setdefault
    for v in changed:
        d, p = tuple(state.dims[v]), tuple(state.prov[v])
        dims[v], prov[v] = setdefault(d, d), setdefault(p, p)
    return State(dims, prov, state.pinned, state.conflicts)


_INTERNED = 1 << 16  # tuples an Evaluator interns (_frozen) before it forgets them all


# ---------------------------------------------------------------------------------------- MCTS
class _Node:
    """A node of the search tree: the set of actions ``key`` (canonical order), its visit count ``n``, the
    ``best`` reward found at or below it, the keys of its ``children``, the actions ``tried`` from it (moves
    or not), and whether nothing below it is left to try (``exhausted``)."""

    __slots__ = ("key", "n", "best", "children", "tried", "exhausted")

    def __init__(self, key, reward):
        self.key = key
        self.n = 0
        self.best = reward
        self.children: list = []
        self.tried: set = set()
        self.exhausted = False


class _Tree:
    """The search tree over action sets (see the module docstring): one node per set, shared between the
    orders that reach it; :meth:`descend` selects and expands, :meth:`backup` records a result."""

    def __init__(self, ev: Evaluator, actions: list, rng: random.Random, max_depth: int, exploration: float,
                 root_reward: float, priors: dict):
        self.ev, self.actions, self.rng, self.priors = ev, actions, rng, priors
        self.max_depth, self.exploration = max_depth, exploration
        self.nodes: dict = {(): _Node((), root_reward)}
        self.amaf: dict = {}  # action -> best reward of an evaluated set containing it

    @property
    def exhausted(self) -> bool:
        return self.nodes[()].exhausted

    def descend(self) -> tuple[list, tuple | None]:
        """From the root, select children (UCT) until a node may widen, then expand it: ``(path, key of the
        new node)``, or ``(path, None)`` when the path ends in a node found exhausted."""
        node = self.nodes[()]
        path = [node]
        while True:
            legal = [a for a in self.actions if a not in node.tried and a not in node.key]
            width = max(2, math.ceil(2 * math.sqrt(node.n + 1)))  # progressive widening
            live = [self.nodes[c] for c in node.children if not self.nodes[c].exhausted]
            if len(node.key) < self.max_depth and legal and (len(node.children) < width or not live):
                child = self._expand(node, legal)
                if child is None:
                    continue  # not a move here, or a shared node already exhausted: try the next action
                path.append(child)
                return path, child.key
            if not live:  # no legal action left and every child exhausted
                node.exhausted = True
                return path, None
            node = self._select(live, node.n)
            path.append(node)

    def _expand(self, node: _Node, legal: list) -> _Node | None:
        """Try the untried action with the best all-moves-as-first value (never evaluated first, by prior): the
        child it leads to, or None if it is no move from ``node`` or leads to an exhausted node."""
        legal.sort(key=lambda a: (-self.amaf.get(a, 2.0), -self.priors[a], self.ev.rank[a], self.rng.random()))
        a = legal[0]
        node.tried.add(a)
        k = self.ev.key(node.key + (a,))
        e = self.ev.evaluate(k, node.key)
        if e is None:
            return None
        if k in self.nodes:  # reached by another order: share it
            if k not in node.children:
                node.children.append(k)
            child = self.nodes[k]
            return None if child.exhausted else child
        return self.adopt(node, k, e.reward)

    def adopt(self, node: _Node, key: tuple, reward: float) -> _Node:
        """A new node for the evaluated set ``key`` (of ``reward``), a child of ``node``; its actions' all-moves-
        as-first values learn from it."""
        child = _Node(key, reward)
        self.nodes[key] = child
        node.children.append(key)
        node.best = max(node.best, reward)
        for a in key:
            self.amaf[a] = max(self.amaf.get(a, 0.0), reward)
        return child

    def _select(self, live: list, visits: int) -> _Node:
        """UCT over the live children of a node visited ``visits`` times, their best rewards normalised."""
        lo = min(c.best for c in live)
        hi = max(c.best for c in live)
        span = (hi - lo) or 1.0
        ln = math.log(visits + 1)
        return max(live, key=lambda c: ((c.best - lo) / span + self.exploration * math.sqrt(ln / (c.n + 1)),
                                        self.rng.random()))

    def visit(self, path: list) -> None:
        for p in path:
            p.n += 1

    def backup(self, path: list, key: tuple, reward: float) -> None:
        """Record ``reward`` of the new node ``key`` at the end of ``path``."""
        for p in path:
            p.n += 1
            p.best = max(p.best, reward)
        for a in key:
            self.amaf[a] = max(self.amaf.get(a, 0.0), reward)


def _better(e: Evaluation, k: tuple, than_e: Evaluation, than_k: tuple) -> bool:
    """Whether ``e`` (of set ``k``) beats ``than_e``: feasible first, then the faster, the fewer actions, the
    smaller; among infeasible ones, the smaller, the faster, the fewer actions."""
    if e.feasible != than_e.feasible:
        return e.feasible
    if e.feasible:  # the peaks read only on a tie (without a memory budget, reading one simulates it)
        if (e.step_time_s, len(k)) != (than_e.step_time_s, len(than_k)):
            return (e.step_time_s, len(k)) < (than_e.step_time_s, len(than_k))
        return e.peak_bytes < than_e.peak_bytes
    return (e.peak_bytes, e.step_time_s, len(k)) < (than_e.peak_bytes, than_e.step_time_s, len(than_k))


class _Progress:
    """A tqdm bar on stderr over the time budget, updated at most twice a second (or nothing)."""

    def __init__(self, tactic: AutomaticPartition, t_start: float):
        self.bar = None
        self.last = t_start
        self.t_start = t_start
        show = tactic.progress if tactic.progress is not None else sys.stderr.isatty()
        if show:
            from tqdm import tqdm

            self.bar = tqdm(total=round(float(tactic.time_budget_s), 1), unit="s", file=sys.stderr, leave=False,
                            desc="AutomaticPartition", bar_format="{desc}: {percentage:3.0f}%|{bar}| "
                            "{n:.0f}/{total:.0f}s {postfix}")

    def tick(self, evaluations: int, best: Evaluation) -> None:
        now = time.perf_counter()
        if self.bar is None or now - self.last < 0.5:
            return
        self.bar.n = round(min(now - self.t_start, self.bar.total), 1)
        self.bar.set_postfix_str(f"evals={evaluations} best={best.step_time_s * 1e3:.4f}ms "
                                 f"peak={best.peak_bytes}{'' if best.feasible else ' (over budget)'}")
        self.last = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def search(graph, rules, state: State, mesh, index: int, tactic: AutomaticPartition, log=None) -> AutoResult:
    """Run the search for ``tactic`` from ``state`` (after the tactics before it, ``index`` its place in the
    schedule); returns the :class:`AutoResult`, whose ``state`` is the propagated state after the chosen
    tactics. Does not modify ``state``. ``log(iterations, evaluations, best)`` is called after each
    iteration that evaluated a new set. Raises :class:`PartitionError` if no state found fits the budget,
    naming the smallest peak found and the tensors that dominate it.

    Python's cyclic garbage collector is paused while it runs (:func:`_collector_paused`): a search makes no
    reference cycles (a whole search on the reference transformer leaves none to collect), and the collector's
    full passes over every object alive took a third of its time."""
    with _collector_paused():
        return _search(graph, rules, state, mesh, index, tactic, log)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off inside, and as it was before after (the objects that reference
    counting frees are freed as ever)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _search(graph, rules, state: State, mesh, index: int, tactic: AutomaticPartition, log) -> AutoResult:
    """:func:`search`, with the collector as it is."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    axes = search_axes(tactic, mesh)
    groups = analyze_groups(graph, rules)
    actions = build_actions(groups, graph, mesh, axes)
    space = groups.action_space(mesh, axes)
    space["actions"] = len(actions)
    ev = Evaluator(graph, rules, mesh, state.copy(), index, actions, tactic.hardware, tactic.memory_budget_bytes)
    max_depth = tactic.max_depth if tactic.max_depth is not None else 2 * len(axes) + 2
    patience = tactic.patience if tactic.patience is not None else 40 + 4 * len(actions)
    deadline = t_start + float(tactic.time_budget_s)
    # the tree gets the first MCTS_SHARE of the time and of the evaluations, the local pass the rest
    tree_limits = (t_start + MCTS_SHARE * float(tactic.time_budget_s),
                   None if tactic.max_evals is None else max(1, math.ceil(MCTS_SHARE * tactic.max_evals)))

    root_eval = ev.evaluate(())
    tree = _Tree(ev, actions, random.Random(tactic.seed), max_depth, tactic.exploration, root_eval.reward,
                 _priors(actions, groups, axes))
    found = _Found((), root_eval, t_start)
    progress = _Progress(tactic, t_start)
    pairs, weights = weight_pairs(actions, groups), weight_actions(actions, groups)
    # the goals on the axes asked for first, then (sub_axes) those that use a half: a search stopped early has
    # refined the goals of whole axes, as one without the halves has
    asked = set(search_axes(replace(tactic, sub_axes=False), mesh))
    templates = _templates(actions, groups)
    phases = [[t for t in templates if all(a.axis in asked for a in t)],
              [t for t in templates if not all(a.axis in asked for a in t)]]
    seeded = refined = 0
    goals: list = []
    for phase in filter(None, phases):
        tried, refinements, its_goals = _goal_phase(ev, tree, found, phase, len(groups.macro), pairs, weights,
                                                    tree_limits, progress)
        seeded, refined, goals = seeded + tried, refined + refinements, goals + its_goals
    goals = _by_promise(ev, goals)
    since_improved = iterations = 0
    while True:
        stopped = _stop_reason(ev, tree, tree_limits, since_improved, patience)
        if stopped:
            break
        iterations += 1
        path, key = tree.descend()
        if key is None:
            tree.visit(path)
            continue
        e = ev.evals[key]
        tree.backup(path, key, e.reward)
        since_improved = 0 if found.offer(key, e, ev.n_sim) else since_improved + 1
        progress.tick(ev.n_sim, found.best)
        if log is not None:
            log(iterations, ev.n_sim, found.best)
    # local improvement from the best set found, then from the most promising goals whether they fit or not
    # (moves that save memory may make them fit), then from the next best sets
    best_sets = _ranked(ev, list(ev.evals), LOCAL_STARTS)
    goals = [k for k in goals if k not in best_sets][:LOCAL_STARTS]
    local = _improve(ev, actions, found, max_depth, (deadline, tactic.max_evals), progress, pairs,
                     best_sets[:1] + goals + best_sets[1:])
    progress.close()
    seconds, cpu_s = time.perf_counter() - t_start, time.process_time() - cpu_start
    best_key, best = found.key, found.best
    stats = {"evaluations": ev.n_sim, "evals_per_s": ev.n_sim / seconds if seconds > 0 else 0.0,
             "evals_per_cpu_s": ev.n_sim / cpu_s if cpu_s > 0 else 0.0,
             "scoring_ms": 1e3 * ev.sim_s / max(ev.n_sim, 1), "cache_hits": ev.n_hits,
             "same_state_hits": ev.n_fp_hits, "op_choice_hits": ev.estimator.memo.hits,
             "op_choice_shared": ev.estimator.memo.shared, "op_choice_misses": ev.estimator.memo.misses,
             "iterations": iterations, "nodes": len(tree.nodes),
             "seconds": seconds, "templates": seeded, "refinements": refined, "stopped": stopped, "local": local,
             "best_reward": best.reward,
             "history": found.history, "max_depth": max_depth, "patience": patience}
    if not best.feasible:
        raise PartitionError(
            f"AutomaticPartition: no sharding found within memory_budget_bytes={tactic.memory_budget_bytes} after "
            f"{ev.n_sim} evaluations ({seconds:.1f} s, {stopped}){_peak_report(ev, best_key, best)}; raise the "
            f"budget, add mesh axes to axes={axes}, or give more time_budget_s")
    return AutoResult([a.tactic for a in best_key], list(best_key), best.step_time_s, best.peak_bytes,
                      tactic.memory_budget_bytes, space, groups, stats, root_eval.step_time_s, root_eval.peak_bytes,
                      state=ev.state(best_key).copy())


class _Found:
    """The best set found so far (:func:`_better`) and the history of improvements ``(seconds, step time or
    None while over budget, evaluations)``."""

    def __init__(self, key: tuple, e: Evaluation, t_start: float):
        self.key, self.best, self.t_start = key, e, t_start
        self.history = [(0.0, e.step_time_s if e.feasible else None, 1)]

    def offer(self, key: tuple, e: Evaluation, evaluations: int) -> bool:
        """Keep ``key`` if it is better; whether it was."""
        if not _better(e, key, self.best, self.key):
            return False
        self.key, self.best = key, e
        self.history.append((time.perf_counter() - self.t_start, e.step_time_s if e.feasible else None, evaluations))
        return True


def _neighbours(key: tuple, actions: list, max_depth: int, pairs: list = ()):
    """The sets one group move away from ``key``: one action dropped, one decision moved to another axis, one
    action added, or one pair of ``pairs`` added (two weight decisions on one axis, as Megatron splits two
    groups at once); in this order, each in canonical action order."""
    for a in key:
        yield tuple(b for b in key if b is not a)
    for a in key:
        for b in actions:
            if b.decision == a.decision and b.axis != a.axis:
                yield tuple(b if c is a else c for c in key)
    if len(key) < max_depth:
        for b in actions:
            if b not in key:
                yield key + (b,)
    if len(key) + 1 < max_depth:
        for b, c in pairs:
            if b not in key and c not in key:
                yield key + (b, c)


def weight_actions(actions: list, groups: DimGroups) -> list[Action]:
    """The actions over decisions that reach parameters and no data input (weight dims), in canonical order."""
    weights = {m.id for m in groups.macro if m.kind == "param" and not any(
        input_kind(p) == "data" for g in m.groups for p, _ in g.inputs)}
    return [a for a in actions if a.decision in weights]


def weight_pairs(actions: list, groups: DimGroups) -> list[tuple]:
    """Pairs of :func:`weight_actions` on one axis over two decisions with no input in common (one axis splits
    one dim of an input: of two decisions that meet in a weight, as ``w1``'s input and hidden dims do, the
    second would be no move there; Megatron's pairs, the MLP's hidden dim and the attention heads, meet in
    none)."""
    inputs = {m.id: {p for g in m.groups for p, _ in g.inputs} for m in groups.macro}
    return [(a, b) for a, b in itertools.combinations(weight_actions(actions, groups), 2)
            if a.axis == b.axis and not inputs[a.decision] & inputs[b.decision]]


def _improve(ev: Evaluator, actions: list, found: _Found, max_depth: int, limits, progress, pairs: list,
             starts: list) -> dict:
    """Local improvement over single group moves (:func:`_neighbours`) from each of ``starts`` (sets already
    evaluated) in turn: evaluate every neighbour of the current set, move to the best if it beats the current
    set, repeat until none does (a local optimum) or the limits ``(deadline, max_evals)`` are reached.
    ``found`` keeps the best of everything evaluated. Returns ``{"evaluations", "moves", "starts",
    "stopped"}``."""
    deadline, max_evals = limits
    n0, moves, done = ev.n_sim, 0, []

    def report(why):
        return {"evaluations": ev.n_sim - n0, "moves": moves, "starts": len(done), "stopped": why}

    for cur in starts:
        cur_e = ev.evals[cur]
        while True:
            start = cur
            for k in _neighbours(start, actions, max_depth, pairs):
                if time.perf_counter() + ev.expected_s() >= deadline:
                    return report("time budget")
                if max_evals is not None and ev.n_sim >= max_evals:
                    return report("max_evals")
                k = ev.key(k)
                e = ev.evaluate(k, start)
                if e is not None:
                    found.offer(k, e, ev.n_sim)
                    progress.tick(ev.n_sim, found.best)
                    if _better(e, k, cur_e, cur):
                        cur_e, cur = e, k
            if cur == start:
                break
            moves += 1
        done.append(cur)
    return report("local optimum")


def _ranked(ev: Evaluator, keys, top: int | None = None) -> list:
    """The evaluated sets among ``keys``, best first (:func:`_better`, sets it ties in the order of ``keys``):
    those that fit by step time, then actions, then peak; then the others by peak, step time, actions. With
    ``top``, the first ``top`` only, and a peak is read only where it orders sets among them: without a memory
    budget, reading the peak of a set the estimator no longer holds scores it again, and many sets tie (on
    2x2x2 a full ranking read 252 such peaks, a quarter of the search's time)."""
    evaluated = [(ev.evals[k], k) for k in keys if ev.evals.get(k) is not None]

    def time_and_size(x):
        return x[0].step_time_s, len(x[1])

    out: list = []
    for _, tied in itertools.groupby(sorted((x for x in evaluated if x[0].feasible), key=time_and_size),
                                     key=time_and_size):
        if top is not None and len(out) >= top:
            break
        tied = list(tied)
        out += sorted(tied, key=lambda x: x[0].peak_bytes) if len(tied) > 1 else tied
    if top is None or len(out) < top:
        out += sorted((x for x in evaluated if not x[0].feasible),
                      key=lambda x: (x[0].peak_bytes, x[0].step_time_s, len(x[1])))
    return [k for _, k in out[:top]]


def _templates(actions: list, groups: DimGroups) -> list[tuple]:
    """Goal-directed starting sets, as experts compose strategies (the goals of PartIR's composite search:
    data parallelism, then weight sharding): data parallelism (a decision that reaches the leading dim of a
    data input, on each axis of a subset of the axes), for every such decision and subset, each alone and
    with one ZeRO action (:func:`zero_actions`) on one axis. Read off the inputs' kinds and the analysis,
    not off names."""
    batch_ids = [m.id for m in groups.macro
                 if any(input_kind(p) == "data" and d == 0 for g in m.groups for p, d in g.inputs)]
    axes = list(dict.fromkeys(a.axis for a in actions))
    zero = [b for b in actions if b.decision >= len(groups.macro)]
    out = []
    for r in range(len(axes) + 1):
        for subset in itertools.combinations(axes, r):
            for dp in {tuple(b for b in actions if b.decision == i and b.axis in subset) for i in batch_ids}:
                for z in [None] + zero:
                    key = dp + ((z,) if z is not None else ())
                    if key and key not in out:
                        out.append(key)
    return out


def _promise(ev: Evaluator, key: tuple) -> float:
    """:meth:`Evaluator.promise` of set ``key``; infinite if it was not evaluated or is no move."""
    e = ev.evals.get(key)
    return math.inf if e is None else ev.promise(e)


def _by_promise(ev: Evaluator, keys) -> list:
    """The evaluated sets among ``keys``, the most promising first (:meth:`Evaluator.promise`)."""
    return sorted((k for k in keys if ev.evals.get(k) is not None),
                  key=lambda k: (ev.promise(ev.evals[k]), ev.rank_of(k)))


def _goal_refinements(ev: Evaluator, goals: list, pairs: list, weights: list, top: int = LOCAL_STARTS) -> dict:
    """The :func:`_refinements` of the ``top`` most promising of ``goals`` (evaluated sets, most promising
    first), of the fastest of them (fitting or not: weight splits save memory) and of the start."""
    fastest = min(goals, key=lambda k: (ev.evals[k].step_time_s, ev.rank_of(k)), default=())
    return _refinements(ev, _by_promise(ev, {(), fastest, *goals[:top]}), pairs, weights)


def _refinements(ev: Evaluator, starts: list, pairs: list, weights: list) -> dict:
    """Megatron-style refinements of the goals ``starts`` (evaluated sets, most promising first), on the axes
    each leaves free: one pair of ``pairs`` on one axis (two weight decisions, :func:`weight_pairs`), as
    Megatron splits the MLP's hidden dim and the attention heads on the model axis beside batch parallelism
    (``BP+MP``, ``BP+MP+Z2``); and one decision of the ``weights`` (:func:`weight_actions`) on two or more of
    them at once, as Megatron is composed over two axes (``MP+MP@z``). ``{refinement: its start}``, taken in
    turn from each start (so that a search stopped early has tried the first few of every start), each
    start's pairs before its decisions; sets already evaluated left out."""
    per_start = []
    for start in starts:
        used = {a.axis for a in start}
        free = list(dict.fromkeys(a.axis for a in weights if a.axis not in used))
        adds = [(b, c) for b, c in pairs if b.axis in free]
        for r in range(2, len(free) + 1):
            for axes in itertools.combinations(free, r):
                adds += [tuple(a for a in weights if a.decision == d and a.axis in axes)
                         for d in dict.fromkeys(a.decision for a in weights)]
        per_start.append([(ev.key(start + add), start) for add in adds if len(add) > 1])
    out: dict = {}
    for key, start in (x for turn in itertools.zip_longest(*per_start) for x in turn if x is not None):
        if key not in ev.evals:
            out.setdefault(key, start)
    return out


def _goal_phase(ev: Evaluator, tree: _Tree, found: _Found, templates: list, decisions: int, pairs: list,
                weights: list, limits, progress) -> tuple[int, int, list]:
    """Seed the tree with the goals ``templates`` (:func:`_templates`) and their refinements: data parallelism
    alone; then, in turn, data parallelism with ZeRO (the most promising data parallelism first) and as many
    refinements of the start, the fastest and the most promising data parallelism; then the refinements of the
    most promising goals (the start's left over among them): a search stopped early has tried both ZeRO and
    Megatron-style splits. ``decisions``: the number of macro decisions (a larger one is a ZeRO action). Returns
    ``(goals evaluated, refinements evaluated, the goals)``."""
    dp = {ev.key(t): ev.key(tuple(a for a in t if a.decision < decisions)) for t in templates}
    plain = [k for k in dp if dp[k] == k]
    seeded = _seed(ev, tree, found, plain, limits, progress)
    with_zero = sorted((k for k in dp if dp[k] != k), key=lambda k: (_promise(ev, dp[k]), ev.rank_of(k)))
    first = dict(itertools.islice(_goal_refinements(ev, _by_promise(ev, plain), pairs, weights, 1).items(),
                                  len(with_zero)))
    turns = [k for turn in itertools.zip_longest(with_zero, first) for k in turn if k is not None]
    n = _seed(ev, tree, found, turns, limits, progress, {**{k: dp[k] for k in with_zero}, **first})
    refined = sum(ev.evals.get(k) is not None for k in first)
    seeded += n - refined
    goals = _by_promise(ev, dict.fromkeys(ev.key(t) for t in templates))
    then = _goal_refinements(ev, goals, pairs, weights)
    refined += _seed(ev, tree, found, list(then), limits, progress, then)
    return seeded, refined, goals


def _seed(ev: Evaluator, tree: _Tree, found: _Found, templates: list, limits, progress,
          near: dict | None = None) -> int:
    """Evaluate the ``templates`` (within the tree's ``limits``; each scored from the set ``near`` gives it, if
    any) and make each a child of the root (a macro move: the tree then refines the promising ones, one group
    at a time); each action's all-moves-as-first value learns from them. Returns how many were evaluated."""
    n = 0
    root = tree.nodes[()]
    for key in templates:
        if _stop_reason(ev, tree, limits, 0, 1) is not None:
            break
        key = ev.key(key)
        e = ev.evaluate(key, (near or {}).get(key))
        if e is None:
            continue
        n += 1
        found.offer(key, e, ev.n_sim)
        tree.adopt(root, key, e.reward)
        progress.tick(ev.n_sim, found.best)
    return n


def _priors(actions: list, groups: DimGroups, axes: list) -> dict:
    """A prior per action, in [0, 1] (Automap-like heuristics: which decisions an expert makes first): the
    decisions that reach data inputs (batch parallelism), then the others by the bytes of the values they
    touch (large weights and activations first; ZeRO as heavy as the heaviest); the axes in the order
    given."""
    heavy = max((m.bytes for m in groups.macro), default=1) or 1
    kind = {m.id: m for m in groups.macro}
    out = {}
    for a in actions:
        m = kind.get(a.decision)
        if m is None:  # a composite (ZeRO) action: after batch parallelism, with the heaviest groups
            out[a] = 0.4 + 0.1 * (1 - axes.index(a.axis) / len(axes))
            continue
        data = any(input_kind(p) == "data" for g in m.groups for p, _ in g.inputs)
        out[a] = (0.5 if data else 0.0) + 0.4 * m.bytes / heavy + 0.1 * (1 - axes.index(a.axis) / len(axes))
    return out


def _peak_report(ev: Evaluator, key: tuple, best: Evaluation, top: int = 4) -> str:
    """``"; the smallest peak found is ... with [...]: arguments ..., outputs ..., temporaries ...; largest: ..."``
    for the set ``key`` (empty when it could not be lowered at all)."""
    if best.error is not None:
        return f"; no state could be lowered ({best.error})"
    program = lower(ev.graph, analyze(ev.graph, ev.rules, ev.state(key), ev.mesh), ev.mesh)
    sim = simulate(program, ev.estimator.hardware)
    g = program.graph
    named = [(f"input {p}", program.buf_bytes[v]) for p, v in zip(g.in_paths, g.invars)]
    named += [(f"output {name}", program.buf_bytes[b])
              for name, b in zip(_output_names(g), program.out_bufs) if b not in g.invars]
    named.sort(key=lambda nb: -nb[1])
    largest = ", ".join(f"{n} {b} B" for n, b in named[:top])
    return (f"; the smallest peak found is {sim.peak_bytes} B with {[str(a) for a in key]} (arguments "
            f"{sim.argument_bytes} B, outputs {sim.output_bytes} B, temporaries {sim.temp_bytes} B; largest "
            f"buffers per device: {largest})")


def _output_names(graph) -> list[str]:
    """The outputs' pytree paths joined by ``/`` (``0/layers/0/w1`` for the first element of a returned tuple)."""
    tree = jax.tree_util.tree_unflatten(graph.out_tree, list(range(len(graph.outvars))))
    return ["/".join(key_name(k) for k in path) or str(j)
            for j, (path, _) in enumerate(jax.tree_util.tree_flatten_with_path(tree)[0])]


def _stop_reason(ev: Evaluator, tree: _Tree, limits, since_improved: int, patience: int) -> str | None:
    """Why the tree search stops now (see the module docstring), or None to go on; ``limits``: its
    ``(deadline, max_evals)``."""
    deadline, max_evals = limits
    if time.perf_counter() + ev.expected_s() >= deadline:
        return "time budget"
    if max_evals is not None and ev.n_sim >= max_evals:
        return "max_evals"
    if since_improved >= patience:
        return "converged"
    if tree.exhausted:
        return "exhausted"
    return None
