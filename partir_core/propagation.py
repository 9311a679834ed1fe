"""Sharding propagation through the tile-mapping registry, to a fixed point.

The state (:class:`State`) gives every non-constant value, per dim, the mesh axes it is split over (major →
minor) and the *provenance* of that decision: the index of the tactic that made it (directly, or through
propagation). Propagation works op by op: the axes of each factor of the op's rule are read off the dims that
carry it (:func:`resolve`), then written to every dim carrying it that is still undecided or whose axes are a
prefix of the factor's (a refinement). It never overrides a decision.

A *conflict* is two incompatible demands at one op: two dims of one factor with different axes (neither a
prefix of the other), or one mesh axis demanded by two factors of one op. The earliest decision (lowest
provenance) is what the op will use when lowered, but propagation stops there for that factor, and the
conflict is recorded (:class:`Conflict`). Axes may be sub-axes (``model:(2)2``): a prefix is then one by the
factors it covers, and two axes clash where they overlap (:mod:`partir_core.factors`), so one op may split two
factors on the two halves of an axis, but not one on the axis and one on a half; nor is an axis written to a
dim of a value whose other dims hold an axis it overlaps. Values that a tactic pinned
(``ManualPartition({path: None})``) are never changed by propagation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from partir_core.factors import Axes, clash, compose, decompose, group, overlap, refines, same_axes
from partir_core.ir import Graph
from partir_core.registry import Rule


@dataclass(frozen=True)
class Conflict:
    """Incompatible demands, found while applying tactic ``tactic``: at equation ``eqn`` (its ``primitive``) on
    its ``factor``, or, where ``eqn`` is -1, at an input a tactic asks to split (``primitive`` ``"input
    PATH"``, ``factor`` ``"dim D"``). ``demands``: ``(value, dim, axes, tactic)`` per dim involved (``tactic``:
    the provenance of the demand, None where undecided); ``kept``: the axes that stay; ``reason``: why.
    :meth:`partir_core.Partitioned.explain` says the same with paths, tactics' texts and costs."""

    tactic: int
    eqn: int
    primitive: str
    factor: str
    demands: tuple
    kept: tuple
    reason: str

    def __str__(self):
        if self.eqn < 0:
            axes = ",".join(a for _, _, ax, _ in self.demands for a in ax)
            return (f"tactic {self.tactic:g}: {self.primitive} {self.factor} not split on {{{axes}}}: {self.reason}; "
                    "the input is left as it is")
        asks = "; ".join(f"%{v} dim {d} on {{{','.join(a)}}} (from tactic {'none' if t is None else f'{t:g}'})"
                         for v, d, a, t in self.demands)
        return (f"tactic {self.tactic:g}: conflict at eqn {self.eqn} ({self.primitive}), factor {self.factor}: {asks} "
                f"not honoured: {self.reason}; the op keeps {{{','.join(self.kept)}}} (earlier tactics win)")


@dataclass
class State:
    """Per value: ``dims[v][d]`` axes, ``prov[v][d]`` the tactic that decided them (None: undecided)."""

    dims: dict[int, list[Axes]]
    prov: dict[int, list[int | None]]
    pinned: set[int] = field(default_factory=set)
    conflicts: list[Conflict] = field(default_factory=list)

    @classmethod
    def empty(cls, graph: Graph) -> "State":
        vals = set(graph.invars) | {v for e in graph.eqns for v in e.outvars}
        return cls({v: [()] * len(graph.shape(v)) for v in vals},
                   {v: [None] * len(graph.shape(v)) for v in vals})

    def copy(self) -> "State":
        return State({v: list(d) for v, d in self.dims.items()}, {v: list(p) for v, p in self.prov.items()},
                     set(self.pinned), list(self.conflicts))

    def copy_of_frozen(self) -> "State":
        """:meth:`copy` of a frozen state (every value's dims and provenance a tuple, as the automatic search keeps
        its states), sharing those tuples: a writer makes a value's own lists first (:meth:`set_dim`)."""
        return State(dict(self.dims), dict(self.prov), set(self.pinned), list(self.conflicts))

    def set_dim(self, v: int, d: int, axes: Axes, prov: int) -> None:
        """Split dim ``d`` of value ``v`` over ``axes``, decided by ``prov`` unless it was decided before; the
        value's dims and provenance become lists of its own first where they are tuples
        (:meth:`copy_of_frozen`)."""
        dims, provs = self.dims[v], self.prov[v]
        if type(dims) is tuple:
            dims = self.dims[v] = list(dims)
        if type(provs) is tuple:
            provs = self.prov[v] = list(provs)
        dims[d] = axes
        if provs[d] is None:
            provs[d] = prov


def op_slots(rule: Rule, eqn) -> list:
    """``(value, dim, factors)`` for every dim of every operand and result."""
    return [(v, d, fs) for v, dims in list(zip(eqn.invars, rule.operands)) + list(zip(eqn.outvars, rule.results))
            for d, fs in enumerate(dims)]


def shardable_factors(rule: Rule) -> tuple:
    """The factors of ``rule`` that may be split, in the order of :meth:`Rule.factors`."""
    return tuple(f for f in rule.factors() if rule.shardable(f))


def resolve(graph: Graph, rule: Rule, eqn, state: State, mesh, eqn_index: int = -1, tactic: int = -1,
            slots: list | None = None, shardable: tuple | None = None):
    """Factor axes at one op: ``(use, spread, conflicts)``.

    ``use[f] = (axes, provenance)`` is what lowering uses (the earliest decision wins a conflict);
    ``spread`` is the subset that propagation may write (conflicted factors excluded). ``slots`` and
    ``shardable``: the op's :func:`op_slots` and :func:`shardable_factors`, when the caller keeps them."""
    cands: dict[str, list] = {}
    dims, prov = state.dims, state.prov
    for v, d, fs in op_slots(rule, eqn) if slots is None else slots:
        if not fs or v in graph.consts:
            continue
        axes = dims[v][d]
        if not axes:
            continue
        parts = [tuple(axes)] if len(fs) == 1 else decompose(mesh, axes, fs, rule.sizes)
        if parts is None:
            continue
        for f, a in zip(fs, parts):
            if a:
                cands.setdefault(f, []).append((v, d, a, prov[v][d]))
    use, spread, conflicts = {}, {}, []
    if not cands:
        return use, spread, conflicts

    def pv(p):
        return 1 << 30 if p is None else p

    for f in shardable_factors(rule) if shardable is None else shardable:
        cs = cands.get(f)
        if not cs:
            continue
        if len(cs) == 1:  # one dim carries it: its axes, which refine themselves
            use[f] = spread[f] = (cs[0][2], pv(cs[0][3]))
            continue
        longest = max((c[2] for c in cs), key=lambda a: (group(mesh, a), len(a)))
        prov = min(pv(c[3]) for c in cs)
        if all(refines(mesh, longest, c[2]) for c in cs):
            use[f] = spread[f] = (longest, prov)
        else:
            win = min(cs, key=lambda c: pv(c[3]))
            use[f] = (win[2], pv(win[3]))
            conflicts.append(Conflict(tactic, eqn_index, eqn.name, f,
                                      tuple((c[0], c[1], c[2], c[3]) for c in cs), win[2],
                                      "dims of one factor demand different axes"))
    # one mesh axis per op (per value, for a rule of independent ties): earlier decisions keep it
    taken: dict[str, list[str]] = {}
    for f in sorted(use, key=lambda f: use[f][1]):
        axes, _ = use[f]
        clashes = [(a, b, g) for a in axes for b, gs in taken.items() if overlap(mesh, a, b) for g in gs
                   if rule.exclusive(f, g)]
        if clashes:
            a, b, other = clashes[0]
            why = "" if a == b else f" overlaps {b!r}, which"
            conflicts.append(Conflict(tactic, eqn_index, eqn.name, f,
                                      tuple((c[0], c[1], c[2], c[3]) for c in cands.get(f, [])),
                                      use[other][0],
                                      f"mesh axis {a!r}{why} already splits factor {other} of this op"))
            del use[f]
            spread.pop(f, None)
            continue
        for a in axes:
            taken.setdefault(a, []).append(f)
    return use, spread, conflicts


def visit(graph: Graph, rule, i: int, state: State, mesh, tactic: int, seen: set,
          slots: list | None = None, shardable: tuple | None = None) -> list:
    """One op's step of :func:`propagate`: resolve op ``i``'s factors (``rule``, None for an op without one),
    record its new conflicts (``seen`` holds the (op, factor) pairs already recorded) and extend the dims of
    its values with the axes its factors spread, in place (:func:`step`, then :func:`take_step`). Returns the
    values whose dims it changed, once per dim written. ``slots`` and ``shardable``: the op's :func:`op_slots`
    and :func:`shardable_factors`, when the caller keeps them. A second visit right after this one
    changes nothing (what it wrote is what it resolved; resolving again reads it back), which
    :func:`partir_core.estimate.propagate_changes` relies on and ``tests/partir_core/test_estimate_incremental.py``
    checks on every visit of full propagation from random states."""
    if rule is None:
        return []
    return take_step(state, i, *step(graph, rule, i, state, mesh, tactic, slots, shardable), seen)


def step(graph: Graph, rule, i: int, state: State, mesh, tactic: int, slots: list | None = None,
         shardable: tuple | None = None) -> tuple[list, list]:
    """What :func:`visit` does at op ``i`` (with a rule), without doing it: ``(conflicts, writes)``, the conflicts
    resolving its factors finds (recorded or not) and the dims it writes, ``(value, dim, axes, provenance)`` in
    order. Reads of ``state`` nothing but the dims and provenance of the op's values and which of them are
    pinned (so a caller may reuse the answer wherever those, the op and ``tactic`` are the same)."""
    eqn = graph.eqns[i]
    if slots is None:
        slots = op_slots(rule, eqn)
    _, spread, conflicts = resolve(graph, rule, eqn, state, mesh, i, tactic, slots, shardable)
    if not spread:
        return conflicts, []
    writes = []
    written: dict = {}  # value -> its dims with this step's writes, for the slots after a write
    for v, d, fs in slots:
        if v in graph.consts or v in state.pinned or not fs:
            continue
        if len(fs) == 1:  # a dim of one factor takes its axes (what compose gives for one factor)
            if fs[0] not in spread:
                continue
            target = tuple(spread[fs[0]][0])
        elif not any(f in spread for f in fs):
            continue
        else:
            target = compose(mesh, [spread.get(f, ((), 0))[0] for f in fs], fs, rule.sizes)
        dims = written.get(v) or state.dims[v]
        cur = dims[d]
        if not target or same_axes(mesh, target, cur) or not refines(mesh, target, cur):
            continue
        others = {a for j, ax in enumerate(dims) if j != d for a in ax}
        if clash(mesh, others, target) or (len(fs) > 1 and graph.shape(v)[d] % group(mesh, target)):
            continue
        provs = [spread[f][1] for f in fs if f in spread]
        writes.append((v, d, target, min(provs) if provs else tactic))
        dims = written[v] = list(dims)
        dims[d] = target
    return conflicts, writes


def take_step(state: State, i: int, conflicts: list, writes: list, seen: set) -> list:
    """Do op ``i``'s :func:`step` ``(conflicts, writes)`` to ``state``: record the conflicts not ``seen`` yet (and
    add them there), write the dims. Returns the values written, once per dim written."""
    for c in conflicts:
        if (i, c.factor) not in seen:
            seen.add((i, c.factor))
            state.conflicts.append(c)
    for v, d, axes, prov in writes:
        state.set_dim(v, d, axes, prov)
    return [w[0] for w in writes]


def propagate(graph: Graph, rules: list, state: State, mesh, tactic: int, max_rounds: int = 100) -> State:
    """Propagate ``state`` to a fixed point (forward and backward sweeps); records conflicts, in place."""
    seen = {(c.eqn, c.factor) for c in state.conflicts}
    order = list(range(len(graph.eqns)))
    for rnd in range(max_rounds):
        changed = False
        for i in (order if rnd % 2 == 0 else order[::-1]):
            if visit(graph, rules[i], i, state, mesh, tactic, seen):
                changed = True
        if not changed:
            break
    return state
