"""Monte Carlo tree search over action sets: the automatic search's second phase.

UCT over the sets (a node per set, shared between the orders that reach it: transpositions), with each node's
value the best reward found below it (the problem is deterministic: the best leaf matters, not the mean),
normalised among siblings; progressive widening (a node with ``n`` visits has at most ``⌈2√n⌉`` children),
children tried in order of their action's all-moves-as-first value (the best reward of any evaluated set
containing it; actions never evaluated first), then of a heuristic prior (:func:`priors`: batch parallelism,
then heavy groups). Every expansion is evaluated directly (no random rollouts: every state is a complete
strategy). The goals (:mod:`partir_core.automatic.goals`) are the root's first children.

One iteration is :meth:`Tree.descend`, selection then expansion, and :meth:`Tree.backup`. The tree search stops
(:func:`stop_reason`) when the next evaluation would end past its deadline (see :mod:`partir_core.automatic`),
at its share of ``max_evals``, when ``patience`` evaluations in a row did not improve the best, or when the tree
is exhausted.
"""

from __future__ import annotations

import math
import random
import time

from partir_core.analysis import DimGroups
from partir_core.automatic.evaluation import Evaluator


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


class Tree:
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


def priors(actions: list, groups: DimGroups, axes: list) -> dict:
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
        data = any(groups.kinds[p] == "data" for g in m.groups for p, _ in g.inputs)
        out[a] = (0.5 if data else 0.0) + 0.4 * m.bytes / heavy + 0.1 * (1 - axes.index(a.axis) / len(axes))
    return out


def stop_reason(ev: Evaluator, tree: Tree, limits, since_improved: int, patience: int) -> str | None:
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
