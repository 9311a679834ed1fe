"""Automatic partitioning: Monte Carlo tree search over "shard dimension group g on mesh axis a".

:func:`search` runs an :class:`~partir_core.AutomaticPartition` and returns an :class:`AutoResult`
(``Partitioned.automatic``): the actions it chose as manual tactics, which reproduce the program when pasted
in its place. An *action* shards one decision of the program's dimension groups (dims that must share a
sharding, :mod:`partir_core.analysis`) on one mesh axis, or is a composite ZeRO action; a search state is a
*set* of actions, applied in a canonical order (:mod:`partir_core.automatic.actions`). A set is scored by the
simulated step time and peak memory of its program, without JAX, incrementally from a set scored before
(:mod:`partir_core.automatic.evaluation`); the search keeps the best set it evaluates
(:mod:`partir_core.automatic.ranking`).

The search, in three phases:

1. *Goals* (:mod:`partir_core.automatic.goals`): data parallelism over every subset of the axes, alone and with
   one ZeRO action, and their Megatron-style refinements, as experts compose strategies. With ``sub_axes``, all
   this is done first for the goals on the axes asked for, refined on those axes, then for those that use a
   half: a search stopped early has refined the goals of whole axes as one without the halves has. All become
   children of the tree's root.
2. *Tree* (:mod:`partir_core.automatic.tree`, until ``MCTS_SHARE`` of the time budget and of ``max_evals``):
   UCT over the sets, with progressive widening, each expansion evaluated directly; it stops early when
   ``patience`` evaluations in a row did not improve the best, or the tree is exhausted.
3. *Local improvement* (:mod:`partir_core.automatic.local`): best-improvement moves over single group moves
   to a local optimum, from the best set found, then from the most promising sets evaluated (step time scaled
   by how far the peak is over the budget), then from the next best sets.

Ties are broken by a ``random.Random(seed)``. With a budget of evaluations (``max_evals``) the search is
deterministic for a seed: the same sets are evaluated in the same order and the same result is returned.
With a wall-time budget, the order is the same but where it stops depends on the machine's speed; it stops
when the next evaluation, if it took as long as the slowest of the last ``RECENT`` (an evaluation whose state
and base must be rebuilt takes several times the mean, and the first ones, which plan most reshards afresh,
far longer: on a mesh of a thousand devices, as long as half the budget), would end past its share of the
time: ``time_budget_s`` bounds the whole lowering (:func:`partir_core.jit` counts it from the lowering's start,
tracing included, and keeps a share for the pipelines it tries around the search,
:data:`partir_core.automatic.pipelines.PIPELINE_SHARE`), and the evaluations end :data:`FINISH_SHARE` of the
search's time early, for the runners-up, the chosen state's per-op choice and the lowering of its program.

When no set fits the budget, the error (:class:`MemoryBudgetError`) names the smallest peak found and the
buffers that dominate it (:mod:`partir_core.automatic.result`).

Pipelines (:mod:`partir_core.automatic.pipelines`) change the traced program, so they are tried around this
search, composed with its result, by :func:`partir_core.jit`.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import replace

from partir_core.analysis import analyze_groups
from partir_core.automatic.actions import build_actions, megatron_actions, search_axes, weight_actions, weight_pairs
from partir_core.automatic.evaluation import Evaluation, Evaluator
from partir_core.automatic.goals import LOCAL_STARTS, goal_phase, templates
from partir_core.automatic.local import improve
from partir_core.automatic.ranking import Found, by_promise, ranked
from partir_core.automatic.result import AutoResult, Candidate, MemoryBudgetError, SearchStats, candidates, peak_report
from partir_core.automatic.tree import Tree, priors, stop_reason
from partir_core.collector import collector_paused
from partir_core.propagation import State
from partir_core.tactics import AutomaticPartition

__all__ = ["search", "AutoResult", "Candidate", "SearchStats", "MemoryBudgetError"]

MCTS_SHARE = 0.6  # of the time budget and of max_evals, for the goals and the tree; the local pass gets the rest

# of the time left, kept for what follows the evaluations: the runners-up's peaks, the chosen state's per-op choice
# and the lowering of its program
FINISH_SHARE = 0.05


def search(graph, rules, state: State, mesh, index: int, tactic: AutomaticPartition, log=None,
           deadline: float | None = None) -> AutoResult:
    """Run the search for ``tactic`` from ``state`` (after the tactics before it, ``index`` its place in the
    schedule); returns the :class:`AutoResult`, whose ``state`` is the propagated state after the chosen
    tactics and ``analysis`` that state's per-op choice, as :func:`partir_core.choice.analyze` makes it, taken
    from the passes the search made (no op is chosen again). Does not modify ``state``. ``log(iterations,
    evaluations, best)`` is called after each iteration that evaluated a new set. ``deadline``: the
    ``time.perf_counter()`` by which the search and what follows it are to end (:func:`partir_core.jit` counts
    the budget from the start of the lowering, tracing included), by default the search's start plus
    ``tactic.time_budget_s``; its evaluations end :data:`FINISH_SHARE` of that time early. Raises
    :class:`MemoryBudgetError` if no state found fits the budget, naming the smallest peak found and the tensors
    that dominate it (its result has no ``analysis``).

    Python's cyclic garbage collector is paused while it runs (:func:`~partir_core.collector.collector_paused`):
    a search makes no reference cycles (a whole search on the reference transformer leaves none to collect), and
    the collector's full passes over every object alive took a third of its time."""
    with collector_paused():
        return _search(graph, rules, state, mesh, index, tactic, log, deadline)


def _search(graph, rules, state: State, mesh, index: int, tactic: AutomaticPartition, log,
            deadline: float | None) -> AutoResult:
    """:func:`search`, with the collector as it is."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    # the evaluations' share of the time left
    time_s = (float(tactic.time_budget_s) if deadline is None else deadline - t_start) * (1 - FINISH_SHARE)
    axes = search_axes(tactic, mesh)
    groups = analyze_groups(graph, rules)
    actions = build_actions(groups, graph, mesh, axes)
    space = groups.action_space(mesh, axes)
    space["actions"] = len(actions)
    ev = Evaluator(graph, rules, mesh, state.copy(), index, actions, tactic.hardware, tactic.memory_budget_bytes)
    max_depth = tactic.max_depth if tactic.max_depth is not None else 2 * len(axes) + 2
    patience = tactic.patience if tactic.patience is not None else 40 + 4 * len(actions)
    # the tree gets the first MCTS_SHARE of the time and of the evaluations, the local pass the rest
    tree_limits = (t_start + MCTS_SHARE * time_s,
                   None if tactic.max_evals is None else max(1, math.ceil(MCTS_SHARE * tactic.max_evals)))

    root_eval = ev.evaluate(())
    tree = Tree(ev, actions, random.Random(tactic.seed), max_depth, tactic.exploration, root_eval.reward,
                priors(actions, groups, axes))
    found = Found((), root_eval, t_start)
    progress = _Progress(tactic, t_start)
    pairs, weights = weight_pairs(actions, groups), weight_actions(actions, groups)
    megatron = megatron_actions(actions, groups, graph)
    # the goals on the axes asked for first, refined on those axes, then (sub_axes) those that use a half: a
    # search stopped early has refined the goals of whole axes, as one without the halves has
    asked = set(search_axes(replace(tactic, sub_axes=False), mesh))
    goal_templates = templates(actions, groups)
    phases = [([t for t in goal_templates if all(a.axis in asked for a in t)],
               ({a: m for a, m in megatron.items() if a in asked}, [p for p in pairs if p[0].axis in asked],
                [w for w in weights if w.axis in asked])),
              ([t for t in goal_templates if not all(a.axis in asked for a in t)], (megatron, pairs, weights))]
    seeded = refined = 0
    for phase, moves in (p for p in phases if p[0]):
        tried, refinements = goal_phase(ev, tree, found, phase, len(groups.macro), moves, tree_limits, progress)
        seeded, refined = seeded + tried, refined + refinements
    since_improved = iterations = 0
    while True:
        stopped = stop_reason(ev, tree, tree_limits, since_improved, patience)
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
    # local improvement from the best set found, then from the most promising sets evaluated (goals or sets the tree
    # found), whether they fit or not (moves that save memory may make them fit), then from the next best sets
    best_sets = ranked(ev, list(ev.evals), LOCAL_STARTS)
    promising = [k for k in by_promise(ev, ev.evals) if k not in best_sets][:LOCAL_STARTS]
    local = improve(ev, actions, found, max_depth, (t_start + time_s, tactic.max_evals), progress, pairs,
                    best_sets[:1] + promising + best_sets[1:])
    progress.close()
    seconds, cpu_s = time.perf_counter() - t_start, time.process_time() - cpu_start
    best_key, best = found.key, found.best
    stats = SearchStats(
        evaluations=ev.n_sim, evals_per_s=ev.n_sim / seconds if seconds > 0 else 0.0,
        evals_per_cpu_s=ev.n_sim / cpu_s if cpu_s > 0 else 0.0, scoring_ms=1e3 * ev.sim_s / max(ev.n_sim, 1),
        cache_hits=ev.n_hits, same_state_hits=ev.n_fp_hits, op_choice_hits=ev.estimator.memo.hits,
        op_choice_shared=ev.estimator.memo.shared, op_choice_misses=ev.estimator.memo.misses,
        iterations=iterations, nodes=len(tree.nodes), seconds=seconds, templates=seeded, refinements=refined,
        stopped=stopped, local=local, best_reward=best.reward, history=found.history, max_depth=max_depth,
        patience=patience)
    result = AutoResult([a.tactic for a in best_key], list(best_key), best.step_time_s, best.peak_bytes,
                        tactic.memory_budget_bytes, space, groups, stats, root_eval.step_time_s, root_eval.peak_bytes,
                        candidates(ev, best_key), state=ev.state(best_key).copy(),
                        analysis=ev.analysis(best_key) if best.feasible else None)
    if not best.feasible:
        raise MemoryBudgetError(
            f"AutomaticPartition: no sharding found within memory_budget_bytes={tactic.memory_budget_bytes} after "
            f"{ev.n_sim} evaluations ({seconds:.1f} s, {stopped}){peak_report(ev, best_key, best)}; raise the "
            f"budget, add mesh axes to axes={axes}, or give more time_budget_s", result)
    return result


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
