"""Fast, exact scoring of candidate shardings for the automatic search: only what changed is redone.

Scoring a state the plain way (:func:`partir_core.propagation.propagate`, :func:`partir_core.choice.analyze`,
:func:`partir_core.lowering.lower`, :func:`partir_core.simulator.simulate`) walks every op of the program
several times for every candidate; on the reference transformer that is a third of a second. The search's
candidates differ from a state it has already scored (its parent: one more group action) in a part of the
program only, so an :class:`Estimator` scores a state *relative to a scored base*, giving the same figures as
the plain way (``tests/partir_core/test_estimate.py`` checks equality on every preset of every model and on
random action sets):

1. Propagation (:func:`propagate_changes`): the same sweeps as :func:`~partir_core.propagation.propagate`
   (forward, backward, ... to a fixed point), but an op is visited only when one of its operands or results
   changed since it was last visited. The base is at a fixed point, so an op none of whose values changed
   would resolve as it did there, write nothing and record no new conflict: skipping it changes nothing. Nor
   is an op visited again for what it wrote itself: a visit right after its own changes nothing
   (:func:`~partir_core.propagation.visit`), so only the other ops touching a written value are. A step is
   remembered by what it reads, and shared by the ops of one signature (:func:`signature`, see below).
2. Per-op choice (:class:`_Pass`): :func:`~partir_core.choice.analyze` runs up to ``2 * PASSES`` passes of per-op
   choices (:func:`~partir_core.choice.choose_op`), each priced against targets (the state's types, none,
   or the types the readers asked for in the pass before). Each starting pass is redone from the base's pass
   of the same kind of targets; each refinement from a pass of the same state: the first from the
   state-priced start (which prices every result as targets that are just the state's type do: most of them
   are), the others from the refinement before (the first for F1). An op is chosen again only if the state of
   one of its values, the produced type of one of its operands or the pricing of one of its results differ
   from that pass's (:func:`choose_op` reads nothing else); its result's type, if it changed, makes its
   readers dirty in turn. The received bytes of a pass (which pass wins) are kept per value and updated for
   the values whose type or demands changed. What is read of the state is carried over from the base too
   (:class:`_Starts`): each op's state key (what its choice reads of the state), worked out again only for the
   ops that touch a changed value, and which values the state-priced pass demands in other types than their
   state's (what the first refinement chooses again), looked at again only for the values whose demands or
   dims changed.
   Choices are remembered across candidates (:class:`_OpMemo`) and shared between ops of one signature
   (:func:`signature`: the layers of a transformer, the optimizer's updates of weights of one shape): an op
   chosen under the same dims, provenance order, operand types and targets as another of its signature is
   chosen alike. An op's candidates, which do not depend on the targets, are shared by the passes that price
   them against different targets (:func:`~partir_core.choice.op_candidates`,
   :func:`~partir_core.choice.cheapest`), and each candidate :class:`~partir_core.choice.OpSharding` is made
   once per op and the factor axes and operands' pending sums that make it (``op_candidates``' ``made``
   table): another key of the op mostly proposes the same ones again. Reshards are priced by their types'
   identities (:meth:`_OpMemo.reshard_bytes`), and a candidate that cannot beat the best one so far is
   dropped before its reshards not priced yet are planned (:func:`~partir_core.choice._op_cost`: redist's
   lower bound of their bytes, :func:`~partir_core.reshard.reshard_floor`); planning them is a third of
   choosing.
3. Lowering and simulation: the winning choice is lowered and simulated as ``pf.lower(...).simulate()``
   does (:func:`partir_core.lowering.lower`, :func:`partir_core.simulator.simulate`); nothing runs on JAX.
   A program without control flow is lowered from the base's program: only the equations whose choice or
   operands' types are other objects than there, or that moved an operand there, are lowered again (about a
   quarter of them on the reference transformer); the simulation walks the whole program.

Control flow. ``scan``, ``while`` and ``cond`` are inlined (:mod:`partir_core.ir`): a body's ops are ops of
the program, between its region's enter and exit, and are propagated and chosen as any op is. An enter or exit
is not chosen (:func:`~partir_core.choice.choose_op` fixes it from its own values' state and its operands'
types), so the incremental parts need nothing more. The passes are compared by bytes received per call: a
value read inside a body counts once per trip (:attr:`Structure.trips`), as
:func:`~partir_core.choice.received_bytes` counts it; the simulator this module calls prices a loop as its
trips times its body.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, replace
from itertools import compress
from operator import is_not, ne

from partir_core.analysis import tied_outputs
from partir_core.choice import (FOLLOW, PASSES, Analysis, OpSharding, Unsupported, cheapest, choose_op, fills,
                                 op_candidates, output_type, state_type, value_type)
from partir_core.ir import Boundary, Graph, column
from partir_core.lowering import lower
from partir_core.propagation import State, op_slots, shardable_factors, step, take_step
from partir_core.reshard import finish_bytes, reshard_bytes
from partir_core.simulator import Simulation, simulate


# ------------------------------------------------------------------------------------------ structure
class Structure:
    """What never changes between candidates of one program: its ``values`` (those a
    :class:`~partir_core.propagation.State` names); for every value, the ops that name it
    (``touching``: propagation and choice read its state there), its readers (``readers``: ``(eqn, operand
    position)``: their demands price it; ``reader_ops``: those ops, once each; ``linear_readers``: those whose
    rule is linear, which price a pending sum by its readers' demands,
    :func:`~partir_core.choice.shared_reduction`) and its ``producer``; how often
    per call its readers read it (``trips``: inside a loop body, the loop's trips; 1 elsewhere) and how often
    each op runs its reductions (``op_trips``); the outputs, those a training step returns in place of its
    inputs (``tied``: output → input, returned in the input's state type) and the others that are no input
    (``state_outputs``: returned in their state type; :func:`~partir_core.choice.output_type`); the ops run
    replicated; the regions' enters and exits (``boundary``); each op's operands and results (``invars``,
    ``outvars``: tuples), its dims by factor and its shardable factors (``op_slots``, ``shardable``: what
    propagation visits), and its ``signature`` (:func:`signature`: ops of one signature are chosen alike, so
    their choices are shared)."""

    def __init__(self, graph: Graph, rules: list):
        self.graph, self.rules = graph, rules
        self.values = set(graph.invars).union(*(e.outvars for e in graph.eqns))  # those a state names
        self.touching: dict[int, list[int]] = {}
        self.readers: dict[int, list[tuple[int, int]]] = {}
        for i, eqn in enumerate(graph.eqns):
            for v in dict.fromkeys(list(eqn.invars) + list(eqn.outvars)):
                if v not in graph.consts:
                    self.touching.setdefault(v, []).append(i)
            for k, v in enumerate(eqn.invars):
                if v not in graph.consts:
                    self.readers.setdefault(v, []).append((i, k))
        self.slots = [[v for v in dict.fromkeys(list(e.invars) + list(e.outvars)) if v not in graph.consts]
                      for e in graph.eqns]
        self.slot_columns = [column(slots) for slots in self.slots]  # an op's values' entries of a state's dict
        self.invars = [tuple(e.invars) for e in graph.eqns]
        self.outvars = [tuple(e.outvars) for e in graph.eqns]
        self.reader_ops = {v: tuple(dict.fromkeys(i for i, _ in rs)) for v, rs in self.readers.items()}
        self.linear = [r is not None and r.linear is not None for r in rules]
        self.linear_readers = {v: tuple(i for i in ops if self.linear[i]) for v, ops in self.reader_ops.items()}
        self.producer = {v: i for i, eqn in enumerate(graph.eqns) for v in eqn.outvars}
        self.outputs = {v for v in graph.outvars if v not in graph.consts}
        self.tied = tied_outputs(graph)
        self.state_outputs = {v for v in self.outputs if v not in graph.invars and v not in self.tied}
        self.op_trips = [graph.read_trips(i) for i in range(len(graph.eqns))]
        self.boundary = [isinstance(e.prim, Boundary) for e in graph.eqns]
        self.boundaries = {i for i, b in enumerate(self.boundary) if b}
        self.trips = {v: max([1] + [self.op_trips[i] for i, _ in rs]) for v, rs in self.readers.items()}
        # each op's (value, dim, factors), which propagation visits
        self.op_slots = [None if r is None else op_slots(r, e) for e, r in zip(graph.eqns, rules)]
        self.shardable = [None if r is None else shardable_factors(r) for r in rules]
        self.unsupported = [Unsupported(i, e.name, "no factor rule: kept replicated")
                            for i, (e, r) in enumerate(zip(graph.eqns, rules)) if r is None]
        names: dict = {}
        self.signature = [names.setdefault(signature(graph, e, r), len(names)) for e, r in zip(graph.eqns, rules)]


def signature(graph: Graph, eqn, rule) -> tuple:
    """What :func:`~partir_core.choice.choose_op` reads of an op besides the state and types of its values:
    its primitive, its factor rule (all but ``local``, which only running the op reads), its operands' and
    results' shapes and dtypes, which of them are constants, which name one value twice, how many ops read
    each operand (:func:`~partir_core.choice.shared_reduction`, :func:`~partir_core.choice.reduction_share` and
    :func:`~partir_core.choice.reads_shared_sum` read that) and which operands are fills
    (:func:`~partir_core.choice.fills`). Two ops of one signature whose values have the same dims, provenance
    order and operand types are chosen alike, up to their rule object (the transformer's layers, the
    optimizer's updates of weights of one shape)."""
    values = list(eqn.invars) + list(eqn.outvars)
    first = {v: k for k, v in reversed(list(enumerate(values)))}
    avals = tuple((graph.shape(v), str(graph.dtype(v)), v in graph.consts, first[v]) for v in values)
    readers = graph.readers()
    filled = fills(graph)
    avals += (tuple(len(readers.get(v, ())) for v in eqn.invars), tuple(v in filled for v in eqn.invars))
    if rule is None:
        return (eqn.name, None, avals)
    return (eqn.name, avals, repr(rule.operands), repr(rule.results), tuple(sorted(rule.sizes.items())),
            tuple(sorted(rule.reduce.items())), tuple(sorted(rule.blocked)), rule.linear, rule.independent,
            tuple(sorted(rule.proposed)))


# --------------------------------------------------------------------------------------- propagation
def propagate_changes(structure: Structure, state: State, mesh, tactic: int, changed, max_rounds: int = 100,
                      steps: dict | None = None) -> set:
    """Propagate ``state`` to a fixed point in place, as :func:`~partir_core.propagation.propagate` does, when
    it was at a fixed point before the values ``changed`` were changed (by a tactic's ``apply``). Returns the
    values whose dims or provenance propagation changed (``changed`` included). A value an op writes queues the
    other ops that touch it, later in this sweep or in the next; not the op itself (see the module docstring).
    ``steps``: None, or a dict a caller propagating many states of the program keeps: each op's
    :func:`~partir_core.propagation.step` is remembered there by all it reads (:func:`_step_key`) and taken
    again where that is the same (the automatic search's states meet the same situations at most ops), also at
    the other ops of its signature (:func:`_shared_step`)."""
    graph, rules = structure.graph, structure.rules
    seen = {(c.eqn, c.factor) for c in state.conflicts}
    if steps is not None and len(steps) >= _STEPS:
        steps.clear()
    touched = set(changed)
    pending = {i for v in changed for i in structure.touching.get(v, ())}
    for rnd in range(max_rounds):
        if not pending:
            break
        forward = rnd % 2 == 0
        heap = [i if forward else -i for i in pending]
        heapq.heapify(heap)
        pending, queued = set(), set(pending)
        while heap:
            i = heapq.heappop(heap)
            i = i if forward else -i
            queued.discard(i)
            if rules[i] is None:
                continue
            if steps is None:
                made = step(graph, rules[i], i, state, mesh, tactic, structure.op_slots[i], structure.shardable[i])
            else:
                key = _step_key(structure, state, i, tactic)
                made = steps.get(key)
                if made is None:
                    made = steps[key] = _shared_step(structure, state, mesh, i, tactic, key, steps)
            for v in take_step(state, i, *made, seen):
                touched.add(v)
                for j in structure.touching.get(v, ()):
                    if (j > i if forward else j < i) and j not in queued:
                        queued.add(j)
                        heapq.heappush(heap, j if forward else -j)
                    elif (j < i if forward else j > i):
                        pending.add(j)
    return touched


_STEPS = 1 << 16  # entries of a propagation's memo of steps (propagate_changes), forgotten in full when full
_SHARED = "signature"  # the first item of a memo key of steps shared by the ops of one signature (_shared_step)


def _shared_step(structure: Structure, state: State, mesh, i: int, tactic: int, key: tuple, steps: dict) -> tuple:
    """Op ``i``'s :func:`~partir_core.propagation.step` (``key``: its :func:`_step_key`), as taken at any op of its
    :func:`signature` in the same situation: the dims, provenances and pins of its values, position by position,
    and ``tactic``. A step reads nothing else of the op (its rule but ``local``, which of its values are
    constants or named twice, their shapes: all in the signature), so it is the same up to the op's values and
    index: remembered in ``steps`` with those replaced by the values' positions among the op's
    (``Structure.slots``), and made this op's again (the layers of a transformer meet the same situations)."""
    shared = (_SHARED, structure.signature[i]) + key[1:]
    relative = steps.get(shared)
    values = structure.slots[i]
    if relative is None:
        made = step(structure.graph, structure.rules[i], i, state, mesh, tactic, structure.op_slots[i],
                    structure.shardable[i])
        steps[shared] = _renamed(made, {v: k for k, v in enumerate(values)}, -1)
        return made
    return _renamed(relative, values, i)


def _renamed(made: tuple, name, eqn: int) -> tuple:
    """A step ``(conflicts, writes)`` with each value ``v`` it names replaced by ``name[v]`` and its conflicts'
    equation by ``eqn``."""
    conflicts, writes = made
    return ([replace(c, eqn=eqn, demands=tuple([(name[v], d, a, p) for v, d, a, p in c.demands]))
             for c in conflicts],
            [(name[v], d, axes, prov) for v, d, axes, prov in writes])


def _step_key(structure: Structure, state: State, i: int, tactic: int) -> tuple:
    """All that op ``i``'s :func:`~partir_core.propagation.step` reads of ``state`` and its arguments: the op,
    ``tactic``, its values' dims and provenances, and which of them are pinned (most states pin none)."""
    read, values, pinned = structure.slot_columns[i], structure.slots[i], state.pinned
    pins = () if pinned.isdisjoint(values) else tuple(v in pinned for v in values)
    return i, tactic, tuple(map(tuple, read(state.dims))), tuple(map(tuple, read(state.prov))), pins


def state_diff(a: State, b: State) -> set:
    """The values whose dims or provenance differ between two states of one program (those two states share,
    as the search's frozen states do, are the same)."""
    values = list(b.dims)
    read = column(values)
    return _differing(values, _columns(a, read), _columns(b, read))


def ranked(provs) -> tuple:
    """``provs`` (one sequence of provenances per value) as tuples, each provenance replaced by its rank among
    all of them (None stays None): all that propagation and choice read of provenances, which they only compare
    (:meth:`_Chooser.choose_op`)."""
    provs = list(map(tuple, provs))
    distinct = set(provs)  # few: the search's states share their tuples, and name few provenances
    seen = set().union(*distinct)
    seen.discard(None)
    rank = {p: r for r, p in enumerate(sorted(seen))}
    rank[None] = None
    table = {p: tuple(map(rank.__getitem__, p)) for p in distinct}
    return tuple(map(table.__getitem__, provs))


def _columns(state: State, read) -> tuple:
    """``(dims, provenances)`` of ``state``'s values as ``read`` (a :func:`~partir_core.ir.column`) reads them."""
    return read(state.dims), read(state.prov)


def _differing(values, a: tuple, b: tuple) -> set:
    """The ``values`` whose dims or provenance differ between the :func:`_columns` ``a`` and ``b``, found in C
    (each value's ``(dims, provenance)`` pair compared, their items by identity first: the search's states share
    most tuples, and intern the others, see :func:`partir_core.automatic.evaluation._frozen`)."""
    (da, pa), (db, pb) = a, b
    return set(compress(values, map(ne, zip(da, pa), zip(db, pb))))


def _distance(a: tuple, b: tuple) -> int:
    """``len(_differing(values, a, b))``, counted without naming them (the search asks it of every base it might
    score from)."""
    (da, pa), (db, pb) = a, b
    return sum(map(ne, zip(da, pa), zip(db, pb)))


# ------------------------------------------------------------------------------------------ analysis
@dataclass
class _Pass:
    """One pass of :func:`~partir_core.choice.analyze` (one :func:`~partir_core.choice._analyze_once`):
    the ``targets`` it priced results against (None, :data:`FOLLOW` or ``{value: [types]}``), its ``ops`` and
    produced ``types``, the ``demands`` on every value (the distinct types its readers and the outputs want,
    sorted by text as :func:`~partir_core.choice._demands` sorts them), the bytes received per value
    (``received``) and per finished reduction (``finished``), and their total ``cost``
    (:func:`~partir_core.choice.received_bytes`). For a state-priced pass, ``unlike``: the values whose
    demands are not just their state type (:meth:`_Chooser._unlike_state` of ``demands``), and ``shared``: the
    pending sums demanded in another type (:meth:`_Chooser._shared`), once known."""

    targets: object
    ops: list
    types: dict
    demands: dict
    received: dict
    finished: dict
    cost: float
    unlike: set | None = None
    shared: set | None = None


class _Chooser:
    """Passes of per-op choice on one state, each made from scratch or from a base pass (see the module
    docstring). ``state_keys``: each op's :meth:`_state_key`, interned, None where not known yet (a list this
    chooser fills in): those of a state that differs from this one only in values other than the op's may be
    given (:func:`choose` carries them over from the base)."""

    def __init__(self, structure: Structure, state: State, mesh, memo: "_OpMemo", state_keys: list | None = None):
        self.s, self.state, self.mesh, self.memo = structure, state, mesh, memo
        self.graph = structure.graph
        self.state_keys = [None] * len(self.graph.eqns) if state_keys is None else state_keys

    def choose_op(self, i: int, types: dict, targets):
        """:func:`~partir_core.choice.choose_op`, remembered (:class:`_OpMemo`) by everything it depends on: the
        op's signature (:func:`signature`), its values' dims and the order of their provenances, its operands'
        types and the targets of its results (and of its pending operands, for a linear op:
        :func:`~partir_core.choice.shared_reduction`). Provenance enters by its order among the op's values only:
        :func:`~partir_core.propagation.resolve` and :func:`~partir_core.factors.drop_clashes` compare
        provenances and nothing else, and what a choice keeps of them (``OpSharding.use``'s second elements)
        is read by no one (lowering reads ``use``'s factors only). Three levels, each looked up only when the
        one before misses: this op's choice (one probe where it was made before, as it mostly was); the choice
        made for any op of its signature, given this op's rule; the candidates of that key
        (:func:`~partir_core.choice.op_candidates`, which do not depend on the targets), shared by the passes
        that price them against different targets."""
        s, memo = self.s, self.memo
        if s.boundary[i]:  # fixed, not chosen, and cheap: not remembered
            return choose_op(self.graph, s.rules, i, self.state, types, self.mesh, True, targets)
        sk = self.state_keys[i]
        if sk is None:  # the same in every pass
            sk = self.state_keys[i] = self._interned_state_key(i)
        operands = tuple(map(id, map(types.__getitem__, s.invars[i])))
        pending = ()
        if type(targets) is dict:
            get = targets.get
            wanted = tuple([tuple(map(id, get(v, ()))) for v in s.outvars[i]])
            if s.linear[i]:
                pending = [v for v in s.invars[i] if types[v].partial]
                if pending:  # shared_reduction prices them by their readers' demands
                    wanted = (wanted, tuple([tuple(map(id, get(v, ()))) for v in pending]))
        else:
            wanted = targets
        key = (sk, operands, wanted)
        chosen = memo.chosen[i]
        op = chosen.get(key)
        if op is not None:
            memo.hits += 1
            return op
        memo.keep([types[v] for v in s.invars[i]])
        if type(targets) is dict:
            for v in (*s.outvars[i], *pending):
                memo.keep(targets.get(v, ()))
        op = self._shared_choice(i, (s.signature[i], sk, operands), wanted, types, targets)
        rule = s.rules[i]
        if op.rule is not rule:  # chosen for another op of this signature: the same choice, this op's rule
            op = OpSharding(rule, op.use, op.in_types, op.out_types, op.finish, op.new_partial)
        if len(chosen) >= memo.per_op:
            chosen.clear()
        chosen[key] = op
        return op

    def _shared_choice(self, i: int, key: tuple, wanted, types: dict, targets):
        """Op ``i``'s choice as made for any op of its signature with the same key (see :meth:`choose_op`)."""
        memo, eqn = self.memo, self.graph.eqns[i]
        op = memo.get((key, wanted))
        if op is not None:
            memo.shared += 1
            return op
        memo.misses += 1
        cands = memo.get(key)
        if cands is None:
            made = memo.shardings[i]
            if len(made) >= memo.per_op:
                made.clear()
            cands = _Candidates(*op_candidates(self.graph, self.s.rules, i, self.state, types, self.mesh, made,
                                               self.s.op_slots[i], self.s.shardable[i]))
            memo.put(key, cands)
        if self.s.rules[i] is None:
            op = cands.proposal
        else:
            op = cheapest(self.graph, eqn, cands.proposal, cands.alternatives, types, self.state, self.mesh,
                          targets, memo.reshard_bytes, memo.known_bytes)
        memo.put((key, wanted), op)
        return op

    def _state_key(self, i: int) -> tuple:
        """What op ``i``'s candidates read of the state: its values' dims, and their provenances by order."""
        read = self.s.slot_columns[i]
        return tuple(map(tuple, read(self.state.dims))), ranked(read(self.state.prov))

    def _interned_state_key(self, i: int) -> int:
        """:meth:`_state_key` of op ``i``, interned (:meth:`_OpMemo.intern`); remembered by the identities of its
        values' dims and provenance tuples where they are all tuples (a frozen state shares those of the values
        its action left alone with its parent's and interns the others, so most ops of a new state find their
        key without building it). The entry keeps the tuples alive, so no other object takes their ids."""
        read, memo = self.s.slot_columns[i], self.memo
        dims, provs = read(self.state.dims), read(self.state.prov)
        ident = (tuple(map(id, dims)), tuple(map(id, provs)))
        hit = memo.state_keys.get(ident)
        if hit is not None:
            return hit[0]
        sk = memo.intern(self._state_key(i))
        if all(type(x) is tuple for x in dims) and all(type(x) is tuple for x in provs):
            if len(memo.state_keys) >= memo.size:
                memo.state_keys.clear()
            memo.state_keys[ident] = (sk, dims, provs)
        return sk

    def run(self, targets, base: _Pass | None, dirty_values: set, dirty_ops: set) -> _Pass:
        """The pass pricing results against ``targets``; from ``base`` when given: a pass of the same kind of
        targets, or of state-priced results (None) for ``targets`` a dict, on a state that differs from this one
        in ``dirty_values``, which ``dirty_ops`` touch."""
        g, state, mesh = self.graph, self.state, self.mesh
        if base is None:
            types = {v: value_type(g, v, mesh, tuple(state.dims[v])) for v in g.invars}
            for v in g.consts:
                types[v] = value_type(g, v, mesh, ((),) * len(g.shape(v)))
            ops = []
            for i, eqn in enumerate(g.eqns):
                op = self.choose_op(i, types, targets)
                ops.append(op)
                types.update(zip(eqn.outvars, op.out_types))
            return self._priced(targets, ops, types, None, None)
        ops, types = list(base.ops), dict(base.types)
        dirty_ops = set(dirty_ops)
        if isinstance(targets, dict) and base.targets is None:
            # choose_op prices a result that targets omit against its state type, as base priced them all; a
            # region's enter and exit follow their operands' layouts under targets, not under None
            if targets is base.demands:  # the refinement of a state-priced pass: known once for both
                if base.unlike is None:
                    base.unlike = self._unlike_state(targets)
                if base.shared is None:
                    base.shared = self._shared(targets, base.types)
                changed, shared = base.unlike, base.shared
            else:
                changed, shared = self._unlike_state(targets), self._shared(targets, types)
            dirty_ops |= {self.s.producer[v] for v in changed if v in self.s.producer} | self.s.boundaries
            dirty_ops.update(i for v in shared for i in self.s.linear_readers.get(v, ()))
        elif isinstance(targets, dict):
            was = base.targets
            changed = {v for v, ts in targets.items() if ts is not was.get(v) and ts != was.get(v)}
            changed.update(was.keys() - targets.keys())
            dirty_ops |= {self.s.producer[v] for v in changed if v in self.s.producer}
            # the linear readers of a pending sum price it by its targets (shared_reduction)
            dirty_ops.update(i for v in changed if types[v].partial for i in self.s.linear_readers.get(v, ()))
        retyped, redemanded = set(), set()
        for v in g.invars:
            if v in dirty_values:
                t = value_type(g, v, mesh, tuple(state.dims[v]))
                if t is not types[v] and t != types[v]:
                    types[v] = t
                    retyped.add(v)
                    dirty_ops.update(i for i, _ in self.s.readers.get(v, ()))
        # every op queued once, and chosen once: when it is the first one queued in program order
        heap = list(dirty_ops)
        heapq.heapify(heap)
        queued, rechosen = set(dirty_ops), []
        invars, outvars, readers = self.s.invars, self.s.outvars, self.s.reader_ops
        choose_op, pop, push = self.choose_op, heapq.heappop, heapq.heappush
        while heap:
            i = pop(heap)
            op = choose_op(i, types, targets)
            old = ops[i]
            if op is old:
                continue
            ops[i] = op
            rechosen.append(i)
            # an operand's demand that changed, or may have (an equal type, another object: its demands are
            # worked out again, to what they were)
            redemanded.update(compress(invars[i], map(is_not, op.in_types, old.in_types)))
            for v, t in zip(outvars[i], op.out_types):
                was = types[v]
                if t is not was and t != was:
                    types[v] = t
                    retyped.add(v)
                    for j in readers.get(v, ()):
                        if j not in queued:
                            queued.add(j)
                            push(heap, j)
        redemanded |= retyped | (dirty_values & self.s.outputs)
        redemanded.update(v for v, u in self.s.tied.items() if u in dirty_values)  # wanted in u's state type
        made = self._priced(targets, ops, types, base, (redemanded, rechosen))
        if targets is None and base.unlike is not None:
            # a value's entry depends on its demands and its state type alone (its type too, for shared): only
            # those of the values whose demands _priced made again or whose dims changed may differ from the base's
            again = redemanded | dirty_values
            demands = made.demands
            made.unlike = {v for v in base.unlike if v not in again} | \
                self._unlike_state({v: demands[v] for v in again if v in demands})
            if base.shared is not None:
                made.shared = {v for v in base.shared if v not in again} | \
                    self._shared({v: demands[v] for v in again if v in demands}, types)
        return made

    @staticmethod
    def _shared(targets: dict, types: dict) -> set:
        """The pending sums whose ``targets`` name a type other than their own: where the refinement of a
        state-priced pass may price a linear reader's operand otherwise
        (:func:`~partir_core.choice.shared_reduction`)."""
        return {v for v, ts in targets.items() if types[v].partial and any(t is not types[v] and t != types[v]
                                                                             for t in ts)}

    def _unlike_state(self, targets: dict) -> set:
        """The values whose ``targets`` are not just their state type (:func:`~partir_core.choice.state_type`):
        those whose pricing differs from the state-priced pass's."""
        out = set()
        for v, ts in targets.items():
            if len(ts) != 1:
                out.add(v)
                continue
            st = self._state_type(v)
            if ts[0] is not st and ts[0] != st:
                out.add(v)
        return out

    def _state_type(self, v: int):
        """:func:`~partir_core.choice.state_type` of ``v``, remembered by the identity of its dims where they
        are a tuple (a frozen state shares the tuples of the values its action left alone with its parent's);
        the entry keeps the tuple alive, so no other object takes its id."""
        known, d = self.memo.state_types, self.state.dims[v]
        hit = known.get((v, id(d)))
        if hit is not None:
            return hit[1]
        st = state_type(self.graph, self.state, v, self.mesh)
        if type(d) is tuple:
            if len(known) >= self.memo.size:
                known.clear()
            known[(v, id(d))] = (d, st)
        return st

    def _priced(self, targets, ops, types, base: _Pass | None, change) -> _Pass:
        """The pass with its demands and received bytes: all of them, or those of ``base`` updated for the
        values and ops that ``change`` (``(values, ops)``) names. A value's demands equal to the base's are the
        base's very list (the next pass, priced against them, then finds them unchanged by identity)."""
        g = self.graph
        if base is None:
            values = [v for v in self.s.readers.keys() | self.s.outputs]
            demands, received, finished = {}, {}, {}
            op_ids = range(len(ops))
        else:
            values, op_ids = change
            demands, received, finished = dict(base.demands), dict(base.received), dict(base.finished)
        moved, known, text = self.memo.reshard_bytes, self.memo.moves, self.memo.text
        readers, outputs, trips, op_trips = self.s.readers, self.s.outputs, self.s.trips, self.s.op_trips
        from_state, tied = self.s.state_outputs, self.s.tied
        for v in values:
            want = [ops[i].in_types[k] for i, k in readers.get(v, ())]
            if v in outputs:  # output_type, with the state types it takes remembered
                if v in tied:
                    want.append(self._state_type(tied[v]))
                elif v in from_state and v in self.state.dims:
                    want.append(self._state_type(v))
                else:
                    want.append(output_type(g, _Types(types), self.state, v, self.mesh))
            if want:
                if len(want) > 1:
                    first = want[0]
                    if all(t is first for t in want):  # readers of one (shared) type
                        want = want[:1]
                    else:
                        want = set(want)
                        want = list(want) if len(want) == 1 else sorted(want, key=text)
                was = demands.get(v)
                demands[v] = was if was is not None and was == want else want
                src = types[v]
                if want[0] is src and len(want) == 1:  # read as it is made (most are): nothing moves
                    received[v] = 0.0
                    continue
                b = [known.get((id(src), id(t))) for t in want]  # moved's own memo, read directly
                if None in b:
                    b = [moved(src, t) for t in want]
                received[v] = trips.get(v, 1) * sum(b)
            else:
                demands.pop(v, None)
                received.pop(v, None)
        for i in op_ids:
            op = ops[i]
            finished[i] = op_trips[i] * sum([finish_bytes(axes, op.out_types) for _, axes in op.finish]) \
                if op.finish else 0
        return _Pass(targets, ops, types, demands, received, finished,
                     sum(received.values()) + sum(finished.values()))


class _Candidates:
    """One op's :func:`~partir_core.choice.op_candidates`: the ``proposal``, and its alternatives made once,
    when first asked for."""

    __slots__ = ("proposal", "_make", "_made")

    def __init__(self, proposal, make):
        self.proposal, self._make, self._made = proposal, make, None

    def alternatives(self):
        if self._made is None:
            self._made = list(self._make())
        return self._made


class _OpMemo:
    """Each op's choices by their keys, in a table of its own (``chosen``, at most ``per_op`` keys each), and
    its candidate shardings as :func:`~partir_core.choice.op_candidates` remembers them (``shardings``, as
    many), the candidates (:class:`_Candidates`) and choices of each signature by their keys (see
    :meth:`_Chooser.choose_op`), and the bytes of reshards by their two types, for at most ``size`` keys (a
    table is forgotten in full when full: one probe per lookup, no bookkeeping of recency). Keys name sharding
    types by identity (:meth:`keep`: hashing a type hashes all its fields, and the partitioner's types are
    shared objects, :func:`partir_core.keys.sharding_type`); every type so named is kept alive, so that no
    other object takes its id. An equal type that is another object only misses. States' keys of ops
    (:meth:`_Chooser._state_key`) are named by small numbers (:meth:`intern`), so a key hashes fast."""

    def __init__(self, size: int = 1 << 17, per_op: int = 1 << 12):
        self.chosen: defaultdict = defaultdict(dict)  # op -> {key: its choice}
        self.shardings: defaultdict = defaultdict(dict)  # op -> op_candidates' table of its OpShardings
        self.entries: dict = {}
        self.size, self.per_op = size, per_op
        self.hits = self.shared = self.misses = 0
        self.alive: dict = {}
        self.interned: dict = {}
        self.moves: dict = {}
        self.state_types: dict = {}  # (value, id of its dims tuple) -> (that tuple, its state type)
        self.state_keys: dict = {}  # ids of an op's values' dims and provenance tuples -> (its key, those tuples)
        self.texts: dict = {}  # id of a type -> (that type, its text)

    def keep(self, types) -> None:
        """Keep ``types`` alive: keys name them by their ids (a key is probed with the ids of the types at hand,
        which are alive: an id found in a key is the object that key was made for)."""
        for t in types:
            self.alive[id(t)] = t

    def intern(self, key: tuple) -> int:
        return self.interned.setdefault(key, len(self.interned))

    def get(self, key):
        return self.entries.get(key)

    def put(self, key, value) -> None:
        if len(self.entries) >= self.size:
            self.entries.clear()
        self.entries[key] = value

    def text(self, t) -> str:
        """``str(t)`` (demands are sorted by it), by the identity of ``t``; the entry keeps ``t`` alive."""
        hit = self.texts.get(id(t))
        if hit is None:
            if len(self.texts) >= self.size:
                self.texts.clear()
            hit = self.texts[id(t)] = (t, str(t))
        return hit[1]

    def reshard_bytes(self, src, dst) -> float:
        """:func:`partir_core.reshard.reshard_bytes`, by the types' identities."""
        key = (id(src), id(dst))
        b = self.moves.get(key)
        if b is None:
            if len(self.moves) >= self.size:
                self.moves.clear()
            self.keep((src, dst))
            b = self.moves[key] = reshard_bytes(src, dst)
        return b

    def known_bytes(self, src, dst) -> float | None:
        """:meth:`reshard_bytes` where it is remembered (or ``src`` is ``dst``), else None."""
        if src is dst:
            return 0.0
        return self.moves.get((id(src), id(dst)))


class _Types:
    """An object with the ``types`` attribute that :func:`~partir_core.choice.output_type` reads."""

    __slots__ = ("types",)

    def __init__(self, types):
        self.types = types


# the starting passes of choice.analyze, by name: P0 (state-priced), F0 (FOLLOW); each is refined by passes
# priced against the demands of the pass before (P1, P2, ...; F1, ...)
_STARTS = (("P", None), ("F", FOLLOW))


@dataclass
class _Starts:
    """What :func:`choose` keeps of a state for the states chosen from it later: its starting ``passes``
    (``{"P0": ..., "F0": ...}``) and its ops' ``state_keys`` (:class:`_Chooser`)."""

    passes: dict
    state_keys: list


def choose(structure: Structure, state: State, mesh, base: _Starts | None, dirty_values: set, memo: _OpMemo,
           passes: int = PASSES) -> tuple[Analysis, _Starts]:
    """:func:`partir_core.choice.analyze` of ``state`` (the same passes, the same winner), and what later calls
    start from (:class:`_Starts`), made from ``base`` (that of a state that differs from this one in
    ``dirty_values``) when given; the refinements from passes of this state. An op none of whose values is
    dirty has the base's state key."""
    dirty_ops = {i for v in dirty_values for i in structure.touching.get(v, ())}
    keys = None
    if base is not None:
        keys = list(base.state_keys)
        for i in dirty_ops:
            keys[i] = None
    ch = _Chooser(structure, state, mesh, memo, keys)
    made: dict = {}

    def run(pos, targets):
        if base is None:
            made[pos] = ch.run(targets, None, set(), set())
        else:
            made[pos] = ch.run(targets, base.passes[pos], dirty_values, dirty_ops)
        return made[pos]

    first = run("P0", None)
    best, refined = first, None
    for name, targets in _STARTS:
        cur = first if name == "P" else run("F0", targets)
        if cur.cost < best.cost:
            best = cur
        for j in range(1, passes):
            # a refinement is made on this state: the first from P0 (which priced every result against its state
            # type, as most demands are), the others from the refinement before (P1 for F1): only the ops whose
            # targets changed, and those their new types reach, are chosen again
            nxt = ch.run(cur.demands, cur if j > 1 else refined or first, set(), set())
            refined = refined or nxt
            if nxt.cost < best.cost:
                best = nxt
            if nxt.types == cur.types:
                break
            cur = nxt
    return Analysis(best.ops, best.types, list(structure.unsupported), state), _Starts(made, ch.state_keys)


# ------------------------------------------------------------------------------------------- scoring
class Estimator:
    """Scores states of one program (see the module docstring): :meth:`score` gives the
    :class:`~partir_core.simulator.Simulation` that ``simulate(lower(analyze(...)))`` gives, computed from a
    base state scored before. Keeps the passes and the lowered program of the first state scored (the search's
    start) and of the ``max_bases`` states scored last."""

    def __init__(self, graph: Graph, rules: list, mesh, hardware=None, max_bases: int = 64):
        self.structure = Structure(graph, rules)
        self.graph, self.rules, self.mesh, self.hardware = graph, rules, mesh, hardware
        # key -> [its state's _Starts, its state's _columns, its program once lowered (a base to lower from)]
        self.bases: OrderedDict = OrderedDict()
        self.values = sorted(self.structure.values)
        self.read = column(self.values)  # a state's dims or provenances, in value order
        self.memo = _OpMemo()
        self.lowering: dict = {}  # lower's memo of per-op parts
        self.max_bases = max_bases
        self.first = None

    def analysis(self, key, state: State, base_key=None) -> Analysis:
        """The per-op choice of ``state`` (remembered under ``key``), from the state remembered under
        ``base_key`` when there is one."""
        base = self.bases.get(base_key) if base_key is not None else None
        columns = _columns(state, self.read)
        if base is not None:
            self.bases.move_to_end(base_key)
            dirty = _differing(self.values, base[1], columns)
            analysis, starts = choose(self.structure, state, self.mesh, base[0], dirty, self.memo)
        else:
            analysis, starts = choose(self.structure, state, self.mesh, None, set(), self.memo)
        self.bases[key] = [starts, columns, None]
        if self.first is None:
            self.first = key
        if len(self.bases) > self.max_bases:
            old = next(iter(self.bases))
            if old == self.first:
                self.bases.move_to_end(old)
                old = next(iter(self.bases))
            del self.bases[old]
        return analysis

    def nearest(self, state: State, keys) -> object | None:
        """Of ``keys``, the one held whose state differs from ``state`` in the fewest values (the first on ties):
        scored from it, the fewest ops are chosen again. None if none is held."""
        best, fewest, columns = None, None, None
        for k in keys:
            held = self.bases.get(k)
            if held is not None:
                columns = columns or _columns(state, self.read)
                d = _distance(held[1], columns)
                if fewest is None or d < fewest:
                    best, fewest = k, d
        return best

    def score(self, key, state: State, base_key=None, memory: bool = True) -> Simulation:
        """The simulation of ``state`` as lowered (see :meth:`analysis`; lowered from the program of the state
        under ``base_key`` when it holds one: :func:`~partir_core.lowering.lower`'s ``base``), with its memory
        figures or not (:func:`~partir_core.simulator.simulate`'s ``memory``). Raises
        :class:`redist.ShardingError` if the state cannot be lowered."""
        held = self.bases.get(base_key) if base_key is not None else None
        base = None if held is None else held[2]
        program = lower(self.graph, self.analysis(key, state, base_key), self.mesh, memo=self.lowering, base=base)
        self.bases[key][2] = program
        return simulate(program, self.hardware, memory)

    def peak(self, key, state: State, base_key=None) -> int:
        """The simulated peak bytes of ``state``, remembered under ``key``: its program's if held, else
        :meth:`score`'s."""
        held = self.bases.get(key)
        if held is not None and held[2] is not None:
            return simulate(held[2], self.hardware).peak_bytes
        return self.score(key, state, base_key).peak_bytes
