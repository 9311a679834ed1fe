"""Evaluation of the automatic search's action sets: their states, simulated step times and peaks, rewards.

No JAX: the program is traced once. The state of a set is made from its canonical prefix's by one action and
incremental propagation, and scored by :class:`partir_core.estimate.Estimator` relative to a set scored before,
the one of those it holds whose state differs least from it among the few closest in actions (the set it was
reached from, its prefix, ...: :meth:`Evaluator.base_for`; only the ops whose values changed are chosen again),
with the same figures as ``pf.lower(...).simulate()``; results are cached per action set and per resulting
sharding. A state that cannot be lowered (a ``ShardingError``) is never chosen.

The reward of a state is ``0.5 + 0.5·t0/(t0 + t)`` (``t`` its simulated step time, ``t0`` that of the starting
state) when its simulated peak memory fits ``memory_budget_bytes``, and ``0.45·budget/peak`` (always lower)
when it does not. Without a memory budget, a state's peak only breaks ties between equally fast sets of as many
actions and is reported for the result: it is simulated when first read (:attr:`Evaluation.peak_bytes`), not
with every candidate.
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from redist.errors import ShardingError

from partir_core.choice import Analysis
from partir_core.estimate import Estimator, propagate_changes, ranked
from partir_core.propagation import State

STEP = 1e-3  # provenance step between the actions of one AutomaticPartition
# held sets (the closest in actions) whose states are compared to pick the base a set is scored from: a few
# closest ones find a near base; comparing with every held set costs more than it saves
BASE_TRIES = 8
RECENT = 32  # evaluations (cache hits aside) whose slowest the deadline allows for: Evaluator.expected_s


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

    def analysis(self, key: tuple) -> Analysis:
        """The per-op choice of set ``key``'s state, as :func:`partir_core.choice.analyze` makes it: from the
        passes the estimator holds of that very state where it still holds them (nothing is chosen again), else
        from the nearest set it holds (:meth:`base_for`)."""
        s = self.state(key)
        base = key if key in self.estimator.bases else self.base_for(key, s, None)
        return self.estimator.analysis(key, s, base)

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
