"""Local improvement: the automatic search's third phase.

Best-improvement moves over single group moves (drop an action, move a decision to another axis, add an action,
add two weight decisions on one axis as Megatron splits two groups at once: :func:`neighbours`) to a local
optimum (:func:`improve`), from the best set found, then from the most promising sets evaluated, goals or sets the
tree found (step time scaled by how far their peak is over the budget,
:meth:`~partir_core.automatic.evaluation.Evaluator.promise`: a fast set that does not fit may fit after a move,
data and Megatron parallelism with ZeRO added, say), then from the next best sets.
"""

from __future__ import annotations

import time

from partir_core.automatic.evaluation import Evaluator
from partir_core.automatic.ranking import Found, better


def neighbours(key: tuple, actions: list, max_depth: int, pairs: list = ()):
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


def improve(ev: Evaluator, actions: list, found: Found, max_depth: int, limits, progress, pairs: list,
            starts: list) -> dict:
    """Local improvement over single group moves (:func:`neighbours`) from each of ``starts`` (sets already
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
            for k in neighbours(start, actions, max_depth, pairs):
                if time.perf_counter() + ev.expected_s() >= deadline:
                    return report("time budget")
                if max_evals is not None and ev.n_sim >= max_evals:
                    return report("max_evals")
                k = ev.key(k)
                e = ev.evaluate(k, start)
                if e is not None:
                    found.offer(k, e, ev.n_sim)
                    progress.tick(ev.n_sim, found.best)
                    if better(e, k, cur_e, cur):
                        cur_e, cur = e, k
            if cur == start:
                break
            moves += 1
        done.append(cur)
    return report("local optimum")
