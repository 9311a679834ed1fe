"""Goal-directed seeding of the tree: the automatic search's first phase.

The goals (:func:`templates`): data parallelism over every subset of the axes, alone and with one ZeRO action
(PartIR's goal-directed composite search: the strategies experts compose), and their Megatron-style refinements
(:func:`refinements`): the most promising goals, the fastest goal (over the budget or not: weight splits save
memory) and the start, in turn, most promising first
(:meth:`~partir_core.automatic.evaluation.Evaluator.promise`), each with Megatron's splits on the axes it leaves
free (on one or on several at once), one pair of weight decisions on one of them, or one weight decision on
several. In this order (:func:`goal_phase`): data parallelism alone; then in turn one with ZeRO (the most
promising data parallelism first) and one refinement of the start, the fastest or the most promising data
parallelism, as many of those as of these; then the refinements of the most promising goals. So a search
stopped early has tried both ZeRO and Megatron-style splits (three axes give many ZeRO templates, goals many
refinements) and refined the goals with ZeRO. All become children of the tree's root (macro moves the tree
refines one group at a time: :mod:`partir_core.automatic.tree`).
"""

from __future__ import annotations

import itertools
import math

from partir_core.analysis import DimGroups
from partir_core.automatic.evaluation import Evaluator
from partir_core.automatic.ranking import Found, by_promise
from partir_core.automatic.tree import Tree, stop_reason

# the goals whose refinements are tried (the most promising), and the local pass's starts: this many of the best
# sets found and of the most promising sets evaluated
LOCAL_STARTS = 3


def templates(actions: list, groups: DimGroups) -> list[tuple]:
    """Goal-directed starting sets, as experts compose strategies (the goals of PartIR's composite search:
    data parallelism, then weight sharding): data parallelism (a decision that reaches the leading dim of a
    data input, on each axis of a subset of the axes), for every such decision and subset, each alone and
    with one ZeRO action (:func:`~partir_core.automatic.actions.zero_actions`) on one axis. Read off the
    inputs' kinds and the analysis, not off names."""
    batch_ids = [m.id for m in groups.macro
                 if any(groups.kinds[p] == "data" and d == 0 for g in m.groups for p, d in g.inputs)]
    axes = list(dict.fromkeys(a.axis for a in actions))
    zero = [b for b in actions if b.decision >= len(groups.macro)]
    out = []
    for r in range(len(axes) + 1):
        for subset in itertools.combinations(axes, r):
            # distinct, in the order of batch_ids: a set's order would follow the hashes of axis names, which
            # differ between processes (PYTHONHASHSEED), and the search would not be a function of its seed
            for dp in dict.fromkeys(tuple(b for b in actions if b.decision == i and b.axis in subset) for i in batch_ids):
                for z in [None] + zero:
                    key = dp + ((z,) if z is not None else ())
                    if key and key not in out:
                        out.append(key)
    return out


def _promise(ev: Evaluator, key: tuple) -> float:
    """:meth:`Evaluator.promise` of set ``key``; infinite if it was not evaluated or is no move."""
    e = ev.evals.get(key)
    return math.inf if e is None else ev.promise(e)


def _goal_refinements(ev: Evaluator, goals: list, moves: tuple, top: int = LOCAL_STARTS) -> dict:
    """The :func:`refinements` of the ``top`` most promising of ``goals`` (evaluated sets, most promising
    first), of the fastest of them (fitting or not: weight splits save memory) and of the start."""
    fastest = min(goals, key=lambda k: (ev.evals[k].step_time_s, ev.rank_of(k)), default=())
    return refinements(ev, by_promise(ev, {(), fastest, *goals[:top]}), *moves)


def refinements(ev: Evaluator, starts: list, megatron: dict, pairs: list, weights: list) -> dict:
    """Megatron-style refinements of the goals ``starts`` (evaluated sets, most promising first), on the axes
    each leaves free: Megatron's splits (``megatron``, :func:`~partir_core.automatic.actions.megatron_actions`:
    every layer's MLP hidden dim and attention heads) on one free axis, as beside batch parallelism
    (``BP+MP``, ``BP+MP+Z2``), or on several at once (``MP+MP@z``); one pair of ``pairs`` on one axis (two
    weight decisions, :func:`~partir_core.automatic.actions.weight_pairs`: part of Megatron's splits, or
    others); and one decision of the ``weights`` (:func:`~partir_core.automatic.actions.weight_actions`) on
    two or more axes at once. ``{refinement: its start}``, taken in turn from each start (so that a search
    stopped early has tried the first few of every start), each start's Megatron splits first, then its
    pairs, then its decisions; sets already evaluated and single actions (the tree's moves) left out."""
    per_start = []
    for start in starts:
        used = {a.axis for a in start}
        free = list(dict.fromkeys(a.axis for a in weights if a.axis not in used))
        splits = [a for a in free if a in megatron]
        adds = [sum((megatron[a] for a in axes), ()) for r in range(1, len(splits) + 1)
                for axes in itertools.combinations(splits, r)]
        adds += [(b, c) for b, c in pairs if b.axis in free]
        for r in range(2, len(free) + 1):
            for axes in itertools.combinations(free, r):
                adds += [tuple(a for a in weights if a.decision == d and a.axis in axes)
                         for d in dict.fromkeys(a.decision for a in weights)]
        per_start.append([(ev.key(start + add), start) for add in adds if len(add) > 1])  # one action: a tree move
    out: dict = {}
    for key, start in (x for turn in itertools.zip_longest(*per_start) for x in turn if x is not None):
        if key not in ev.evals:
            out.setdefault(key, start)
    return out


def goal_phase(ev: Evaluator, tree: Tree, found: Found, templates: list, decisions: int, moves: tuple, limits,
               progress) -> tuple[int, int]:
    """Seed the tree with the goals ``templates`` (:func:`templates`) and their refinements: data parallelism
    alone; then, in turn, data parallelism with ZeRO (the most promising data parallelism first) and as many
    refinements of the start, the fastest and the most promising data parallelism; then the refinements of the
    most promising goals (the start's left over among them): a search stopped early has tried both ZeRO and
    Megatron-style splits. ``decisions``: the number of macro decisions (a larger one is a ZeRO action);
    ``moves``: the refinements' ``(megatron, pairs, weights)`` (:func:`refinements`). Returns ``(goals
    evaluated, refinements evaluated)``."""
    dp = {ev.key(t): ev.key(tuple(a for a in t if a.decision < decisions)) for t in templates}
    plain = [k for k in dp if dp[k] == k]
    seeded = _seed(ev, tree, found, plain, limits, progress)
    with_zero = sorted((k for k in dp if dp[k] != k), key=lambda k: (_promise(ev, dp[k]), ev.rank_of(k)))
    first = dict(itertools.islice(_goal_refinements(ev, by_promise(ev, plain), moves, 1).items(),
                                  len(with_zero)))
    turns = [k for turn in itertools.zip_longest(with_zero, first) for k in turn if k is not None]
    n = _seed(ev, tree, found, turns, limits, progress, {**{k: dp[k] for k in with_zero}, **first})
    refined = sum(ev.evals.get(k) is not None for k in first)
    seeded += n - refined
    goals = by_promise(ev, dict.fromkeys(ev.key(t) for t in templates))
    then = _goal_refinements(ev, goals, moves)
    refined += _seed(ev, tree, found, list(then), limits, progress, then)
    return seeded, refined


def _seed(ev: Evaluator, tree: Tree, found: Found, templates: list, limits, progress,
          near: dict | None = None) -> int:
    """Evaluate the ``templates`` (within the tree's ``limits``; each scored from the set ``near`` gives it, if
    any) and make each a child of the root (a macro move: the tree then refines the promising ones, one group
    at a time); each action's all-moves-as-first value learns from them. Returns how many were evaluated."""
    n = 0
    root = tree.nodes[()]
    for key in templates:
        if stop_reason(ev, tree, limits, 0, 1) is not None:
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
