"""The order of the automatic search's evaluated action sets: which is better, which to start from.

:func:`better` is the order of the result: the sets that fit the memory budget first, the faster, then those of
fewer actions, then the smaller; then the others, the smaller, the faster, those of fewer actions.
:func:`ranked` sorts sets by it, and :class:`Found` keeps the best found so far. :func:`by_promise` orders sets
by :meth:`~partir_core.automatic.evaluation.Evaluator.promise` (step time scaled by how far the peak is over the
budget: a fast set that does not fit may fit after a move): which goals are refined and which sets the local
pass starts from.
"""

from __future__ import annotations

import itertools
import time

from partir_core.automatic.evaluation import Evaluation, Evaluator


def better(e: Evaluation, k: tuple, than_e: Evaluation, than_k: tuple) -> bool:
    """Whether ``e`` (of set ``k``) beats ``than_e``: feasible first, then the faster, the fewer actions, the
    smaller; among infeasible ones, the smaller, the faster, the fewer actions."""
    if e.feasible != than_e.feasible:
        return e.feasible
    if e.feasible:  # the peaks read only on a tie (without a memory budget, reading one simulates it)
        if (e.step_time_s, len(k)) != (than_e.step_time_s, len(than_k)):
            return (e.step_time_s, len(k)) < (than_e.step_time_s, len(than_k))
        return e.peak_bytes < than_e.peak_bytes
    return (e.peak_bytes, e.step_time_s, len(k)) < (than_e.peak_bytes, than_e.step_time_s, len(than_k))


def ranked(ev: Evaluator, keys, top: int | None = None) -> list:
    """The evaluated sets among ``keys``, best first (:func:`better`, sets it ties in the order of ``keys``):
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


def by_promise(ev: Evaluator, keys) -> list:
    """The evaluated sets among ``keys``, the most promising first (:meth:`Evaluator.promise`)."""
    return sorted((k for k in keys if ev.evals.get(k) is not None),
                  key=lambda k: (ev.promise(ev.evals[k]), ev.rank_of(k)))


class Found:
    """The best set found so far (:func:`better`) and the history of improvements ``(seconds, step time or
    None while over budget, evaluations)``."""

    def __init__(self, key: tuple, e: Evaluation, t_start: float):
        self.key, self.best, self.t_start = key, e, t_start
        self.history = [(0.0, e.step_time_s if e.feasible else None, 1)]

    def offer(self, key: tuple, e: Evaluation, evaluations: int) -> bool:
        """Keep ``key`` if it is better; whether it was."""
        if not better(e, key, self.best, self.key):
            return False
        self.key, self.best = key, e
        self.history.append((time.perf_counter() - self.t_start, e.step_time_s if e.feasible else None, evaluations))
        return True
