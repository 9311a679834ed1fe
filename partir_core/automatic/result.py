"""What the automatic search reports: its result (:class:`AutoResult`: the chosen set, its runners-up
(:func:`candidates`) and how the search went (:class:`SearchStats`)), or why no set fit the memory budget
(:class:`MemoryBudgetError`, whose message :func:`peak_report` ends: the smallest peak found and the buffers that
dominate it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import jax

from redist.picture import format_bytes

from partir_core.analysis import DimGroups
from partir_core.automatic.evaluation import Evaluation, Evaluator
from partir_core.automatic.ranking import ranked
from partir_core.choice import Analysis, analyze
from partir_core.ir import key_name
from partir_core.lowering import lower
from partir_core.pipeline import Pipeline
from partir_core.propagation import State
from partir_core.simulator import simulate
from partir_core.tactics import PartitionError


RUNNERS_UP = 4  # the sets AutoResult.summary shows beside the chosen one that fit the budget
FASTER_OVER_BUDGET = 2  # and those faster than it that do not


@dataclass
class SearchStats:
    """How an automatic search went (``AutoResult.stats``).

    ``evaluations``: action sets simulated; ``evals_per_s`` over the search's wall time, ``evals_per_cpu_s`` over
    its process time; ``scoring_ms``: mean milliseconds per evaluation; ``cache_hits``: sets asked for again;
    ``same_state_hits``: new sets whose propagated state was one scored before; ``op_choice_hits``,
    ``op_choice_shared``, ``op_choice_misses``: per-op choices remembered for the op, shared with another op of
    its signature, or made; ``iterations`` of the tree search and its ``nodes``; ``templates`` (goal sets seeded)
    and their ``refinements``; ``seconds`` of wall time; ``stopped``: why the tree search stopped (``"time
    budget"``, ``"max_evals"``, ``"patience"``, ``"exhausted"``); ``local``: the local pass, ``{"evaluations",
    "moves", "starts", "stopped"}``; ``best_reward``; ``history``: the improvements, ``(seconds, step time or None
    while over budget, evaluations)``; ``max_depth`` and ``patience`` as used; ``pipelines``: the pipelines
    tried around the search (:mod:`partir_core.automatic.pipelines`), ``(pipeline, simulated step time, peak
    bytes)`` each, and ``spmd``: ``(step time, peak bytes)`` of the search's own result beside them (empty and
    None where none was tried); ``pipelines_left``: the pipelines left untried when the time budget ran out."""

    evaluations: int
    evals_per_s: float
    evals_per_cpu_s: float
    scoring_ms: float
    cache_hits: int
    same_state_hits: int
    op_choice_hits: int
    op_choice_shared: int
    op_choice_misses: int
    iterations: int
    nodes: int
    seconds: float
    templates: int
    refinements: int
    stopped: str
    local: dict
    best_reward: float
    history: list
    max_depth: int
    patience: int
    pipelines: list = field(default_factory=list)
    spmd: tuple | None = None
    pipelines_left: int = 0


@dataclass(frozen=True)
class Candidate:
    """One action set the search evaluated: its ``actions`` (canonical order), simulated ``step_time_s`` and
    ``peak_bytes``, and whether it ``fits`` the memory budget; ``pipeline``: the :class:`~partir_core.Pipeline`
    the actions are composed with, for a pipeline tried around the search (:mod:`partir_core.automatic.pipelines`),
    else None."""

    actions: tuple
    step_time_s: float
    peak_bytes: int
    fits: bool
    pipeline: Pipeline | None = None

    @property
    def tactics(self) -> list:
        """Its tactics in the order they apply: its pipeline if any, then its actions as manual tactics."""
        return [self.pipeline] * (self.pipeline is not None) + [a.tactic for a in self.actions]


@dataclass
class AutoResult:
    """What an :class:`~partir_core.AutomaticPartition` found (``Partitioned.automatic``).

    ``tactics``: the chosen actions as manual tactics, in the order they apply (paste them into a schedule
    in place of the ``AutomaticPartition``); ``code``: the same as Python source; ``text``: the program after
    them, rendered when first read (by ``render``); ``step_time_s`` and ``peak_bytes``: their simulated step
    time and per-device peak, against ``start_time_s`` and ``start_peak_bytes`` before them; ``candidates``: the
    chosen set first, then the runners-up (:class:`Candidate`: the best others that fit the memory budget, then
    the fastest that do not and are faster), which :meth:`summary` compares; ``action_space``: sizes before and
    after grouping; ``groups``: the dimension groups; ``stats``: how the search went (:class:`SearchStats`)."""

    tactics: list
    actions: list
    step_time_s: float
    peak_bytes: int
    memory_budget_bytes: int | None
    action_space: dict
    groups: DimGroups
    stats: SearchStats
    start_time_s: float
    start_peak_bytes: int
    candidates: list = field(default_factory=list)
    state: State | None = field(default=None, repr=False)  # the state after the chosen set, until jit takes it
    analysis: Analysis | None = field(default=None, repr=False)  # that state's per-op choice, until jit takes it
    render: Callable[[], str] | None = field(default=None, repr=False, compare=False)  # gives text

    @functools.cached_property
    def text(self) -> str:
        return self.render() if self.render is not None else ""

    @property
    def code(self) -> str:
        return "[\n" + "".join(f"    {t},\n" for t in self.tactics) + "]"

    def summary(self) -> str:
        """The chosen strategy and why it won: its simulated step time and peak against the start's, its
        tactics, then each runner-up with its step time and peak, why it lost (slower; as fast with more
        actions or a larger peak; over the memory budget) and how it differs from the chosen set."""
        budget = self.memory_budget_bytes
        st = self.stats
        lines = [f"chosen: {len(self.tactics)} tactic{'s' * (len(self.tactics) != 1)}, simulated step "
                 f"{_ms(self.step_time_s)}, peak {format_bytes(self.peak_bytes)}"
                 + (f" (budget {format_bytes(budget)})" if budget else "")
                 + f"; before them {_ms(self.start_time_s)}, peak {format_bytes(self.start_peak_bytes)}"
                 + (" (over the budget)" if budget and self.start_peak_bytes > budget else "")]
        lines += [f"  {t}" for t in self.tactics]
        others = self.candidates[1:]
        lines.append(f"runners-up ({len(others) or 'none'} of {st.evaluations} sets evaluated in {st.seconds:.1f} s; "
                     f"search stopped by {st.stopped}, local pass by {st.local['stopped']}):")
        chosen = set(self.actions)
        pipeline = self.candidates[0].pipeline if self.candidates else None
        for n, c in enumerate(others, start=1):
            lines.append(f"  {n}. {_ms(c.step_time_s)}, peak {format_bytes(c.peak_bytes)}: {self._lost(c)}")
            if c.pipeline != pipeline:
                lines += [f"     + {_short(c.pipeline)}"] * (c.pipeline is not None)
                lines += [f"     - {_short(pipeline)}"] * (pipeline is not None)
            lines += [f"     + {_short(a)}" for a in c.actions if a not in chosen]
            lines += [f"     - {_short(a)}" for a in self.actions if a not in set(c.actions)]
        return "\n".join(lines)

    def _lost(self, c: Candidate) -> str:
        """Why ``c`` lost to the chosen set (the order of :func:`partir_core.automatic.ranking.better`)."""
        if not c.fits:
            faster = " (faster, but" if c.step_time_s < self.step_time_s else " ("
            return (f"over the memory budget{faster} peak {format_bytes(c.peak_bytes)} > "
                    f"{format_bytes(self.memory_budget_bytes)})")
        if c.step_time_s > self.step_time_s:
            return f"slower by {100 * (c.step_time_s / self.step_time_s - 1):.1f}%"
        if len(c.actions) > len(self.actions):
            return "as fast, with more actions"
        return "as fast, with a larger peak"

    def __str__(self):
        st = self.stats
        return (f"AutomaticPartition: {len(self.tactics)} tactic(s), simulated step "
                f"{self.step_time_s * 1e3:.4f} ms, peak {self.peak_bytes} B"
                + (f" (budget {self.memory_budget_bytes} B)" if self.memory_budget_bytes else "")
                + f"; from {self.start_time_s * 1e3:.4f} ms / {self.start_peak_bytes} B; "
                f"{st.evaluations} evaluations in {st.seconds:.1f} s ({st.stopped}); "
                f"action space {self.action_space['values_dims_axes']} → {self.action_space['decisions_axes']}\n"
                + self.code)


def candidates(ev: Evaluator, key: tuple) -> list[Candidate]:
    """The chosen set ``key`` and its runners-up among the sets ``ev`` evaluated: the best :data:`RUNNERS_UP`
    others that fit the budget (:func:`~partir_core.automatic.ranking.ranked`), then the :data:`FASTER_OVER_BUDGET`
    fastest that do not and are faster than it; a set that reaches the program of one before it is left out."""
    best = ev.evals[key]
    shown = {id(best)}
    # the best few, with room for sets that reach a program shown before (ranked reads peaks only among these)
    fits = [k for k in ranked(ev, list(ev.evals), 8 * (RUNNERS_UP + 1)) if ev.evals[k].feasible]
    over = sorted((k for k, e in ev.evals.items() if e is not None and not e.feasible and e.error is None
                   and e.step_time_s < best.step_time_s), key=lambda k: (ev.evals[k].step_time_s, ev.rank_of(k)))
    out = [key, *_distinct(ev, fits, shown, RUNNERS_UP), *_distinct(ev, over, shown, FASTER_OVER_BUDGET)]
    return [Candidate(k, ev.evals[k].step_time_s, ev.evals[k].peak_bytes, ev.evals[k].feasible) for k in out]


def _distinct(ev: Evaluator, keys: list, shown: set, n: int) -> list:
    """The first ``n`` of ``keys`` whose evaluations (one per program) are not in ``shown``, which gains them."""
    out = []
    for k in keys:
        if len(out) == n:
            break
        if id(ev.evals[k]) not in shown:
            shown.add(id(ev.evals[k]))
            out.append(k)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def _short(tactic, width: int = 110) -> str:
    """A tactic (or an action, as its tactic) as text, cut at ``width`` characters."""
    text = str(tactic)
    return text if len(text) <= width else text[:width - 1] + "…"


class MemoryBudgetError(PartitionError):
    """No set the automatic search evaluated fits its memory budget; ``result``: the search's :class:`AutoResult`
    for the set of the smallest peak found, with its ``candidates`` and :meth:`~AutoResult.summary` (what a
    pipeline may be composed with, :mod:`partir_core.automatic.pipelines`)."""

    def __init__(self, message: str, result: AutoResult):
        super().__init__(message)
        self.result = result


def peak_report(ev: Evaluator, key: tuple, best: Evaluation, top: int = 4) -> str:
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
