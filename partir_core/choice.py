"""Per-op sharding choice: the factor axes every equation runs with, and so every value's type.

:func:`analyze` fixes, for every equation, the factor axes it runs with (:class:`OpSharding`): the types its
operands must have and the types of its results (partial where a contracted factor is split). The propagated
state proposes one choice per op; where that choice needs communication, the op also tries the alternatives
made of the axes its operands and results carry, and those making a result in a type it is wanted in, and keeps
the one that moves the fewest bytes (operands resharded from their produced types, results resharded to the
types wanted of them, priced by redist through :mod:`partir_core.reshard`); on ties, the one that moves the
reshard to its operands. A matmul or convolution split over its contracted dims keeps them split. A pending sum
that several ops read is reduced once for all of them, so each linear reader that reduces it is charged its
share (:func:`reduction_share`).
A few passes refine what results are wanted in from what their readers asked for, so a demand travels back, op
by op, to the op that can meet it for free; the cheapest program is kept. Values then have the type their
producer gives them (inputs: the tactics' types; outputs: the state's types, :func:`output_type`).

Arrays of random keys are typed by their key data (:mod:`partir_core.keys`, :func:`value_type`): ops see key
shapes (:func:`local_shapes`), reshards move key data.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

from redist.types import ShardingType

from partir_core import keys
from partir_core.analysis import tied_outputs
from partir_core.factors import clash, decompose, dims_axes, drop_clashes, fit_use, group
from partir_core.ir import Boundary, Graph, is_enter
from partir_core.propagation import State, resolve
from partir_core.registry import Rule
from partir_core.reshard import finish_bytes, reshard_bytes, reshard_floor


@dataclass
class OpSharding:
    """How one equation runs: its ``rule`` (None: run replicated), the factor axes ``use`` (factor → (axes,
    provenance)), the types its operands need (``in_types``) and its results get (``out_types``), the
    reductions to finish with an all-reduce (``finish``: ``(kind "max"/"min", axes)``) and the axes over
    which its results become pending sums (``new_partial``)."""

    rule: Rule | None
    use: dict
    in_types: list
    out_types: list
    finish: list
    new_partial: tuple


class Unsupported(NamedTuple):
    """An op run replicated for lack of a factor rule: equation ``eqn``, its ``primitive``, and ``why``. It runs
    whole on every device: its operands are gathered to replicated first, its results are replicated."""

    eqn: int
    primitive: str
    why: str

    def __str__(self):
        return f"eqn {self.eqn} ({self.primitive}): {self.why}; it runs whole on every device, its results replicated"


@dataclass
class Analysis:
    """The choice for a whole program: one :class:`OpSharding` per equation, every value's type as its
    producer gives it, the ops run replicated for lack of a rule, and the state the choices were made from."""

    ops: list[OpSharding]
    types: dict[int, ShardingType]  # every value's type as produced
    unsupported: list[Unsupported]
    state: State | None = None  # the propagated state the choices were made from


def value_type(graph: Graph, v: int, mesh, dims, partial=()) -> ShardingType:
    """Value ``v``'s type with its dims split as ``dims``: a key array is typed by its key data, with the
    key-data dims replicated after ``dims`` (:func:`partir_core.keys.sharding_type`)."""
    return keys.sharding_type(mesh, graph.shape(v), graph.dtype(v), dims, partial)


def replicated(graph: Graph, v: int, mesh) -> ShardingType:
    """Value ``v``'s type with every dim whole."""
    return value_type(graph, v, mesh, ((),) * len(graph.shape(v)))


def local_shapes(graph: Graph, values, types) -> list[tuple[int, ...]]:
    """The local shapes of ``values`` of the given types, as their ops see them: a key array's without its
    key-data dims."""
    return [t.local_shape[: len(graph.shape(v))] for v, t in zip(values, types)]


def _analyze_once(graph: Graph, rules: list, state: State, mesh, choose: bool, targets) -> Analysis:
    """Fix every op's factor axes, in program order.

    The propagated state proposes one choice per op (:func:`resolve`, earliest decision wins a conflict).
    With ``choose``, an op whose proposed choice needs communication (an operand resharded, or a result
    that is not already what the state wants for it) also tries the alternatives made of the axes its
    operands and results carry (in the state or as actually produced), prefixes of those, and none, and those
    making a result in a type it is wanted in (:func:`_aligned`), and keeps the one that moves the fewest bytes:
    operands resharded from their produced types, plus results resharded to the types they are wanted in (a
    pending sum reduced there). Ties keep the proposal, unless another splitting the work over as many devices
    moves fewer bytes at the results (the reshard moved to the operands, where their producers see it in the
    next pass).
    This is the local, cost-based choice XLA's partitioner makes per op (gather a small activation rather
    than a large weight, keep a contraction local, ...). ``targets``: None prices every result against the
    state's type for it; a dict prices result ``v`` against the types ``targets[v]`` (none: free);
    :data:`FOLLOW` prices no result, so each op takes the layout its operands arrive in where that is
    cheapest (a layout chosen at one op then carries along the values computed from it)."""
    types: dict[int, ShardingType] = {}
    for v in graph.invars:
        types[v] = value_type(graph, v, mesh, tuple(state.dims[v]))
    for v in graph.consts:
        types[v] = replicated(graph, v, mesh)
    ops, unsupported = [], []
    for i, (eqn, rule) in enumerate(zip(graph.eqns, rules)):
        if rule is None:
            unsupported.append(Unsupported(i, eqn.name, "no factor rule: kept replicated"))
        op = choose_op(graph, rules, i, state, types, mesh, choose, targets)
        ops.append(op)
        for v, t in zip(eqn.outvars, op.out_types):
            types[v] = t
    return Analysis(ops, types, unsupported, state)


def choose_op(graph: Graph, rules: list, i: int, state: State, types: dict, mesh, choose: bool = True,
              targets=None) -> OpSharding:
    """How equation ``i`` runs (one step of :func:`_analyze_once`): its operands produced as ``types`` gives
    them, its results priced against ``targets``: the cheapest of :func:`op_candidates`
    (:func:`cheapest`). Reads nothing but ``state``'s dims and provenance of the equation's operands and
    results, ``types`` of its operands and ``targets`` of its results, so a caller may reuse the result
    wherever those are the same. A region's enter or exit is not chosen: it runs as
    :func:`_boundary_sharding` fixes from ``targets`` (those of an exit's operands too), ``choose`` or not."""
    eqn = graph.eqns[i]
    if isinstance(eqn.prim, Boundary):
        return _boundary_sharding(graph, rules[i], eqn, types, state, mesh, targets)
    proposal, alternatives = op_candidates(graph, rules, i, state, types, mesh)
    if not choose or rules[i] is None:
        return proposal
    return cheapest(graph, eqn, proposal, alternatives, types, state, mesh, targets)


def op_candidates(graph: Graph, rules: list, i: int, state: State, types: dict, mesh, made: dict | None = None,
                  slots: list | None = None, shardable: tuple | None = None):
    """``(proposal, alternatives)`` for equation ``i``, not a region's enter or exit (see :func:`choose_op`):
    the choice the state proposes (the earliest decision wins a conflict; replicated for an op without a
    rule) and a function giving the alternatives that :func:`_alternatives` makes of the axes its operands
    and results carry (called only if the proposal needs communication). Both depend on ``state``'s dims and
    provenance of the equation's values and on ``types`` of its operands (as they are when this is called),
    not on what its results are priced against. ``made``: None, or a dict that a caller choosing equation
    ``i`` many times keeps for it: each :class:`OpSharding` is remembered there by what makes it (the axes of
    each factor and the pending sums of the operands, :func:`_sharding_key`) and given again where those are
    the same, its ``use`` carrying the provenances of the first (which no one reads). An op reading a pending sum
    that other ops read too reads it reduced in every candidate (:func:`reads_shared_sum`). ``slots`` and
    ``shardable``: the op's :func:`~partir_core.propagation.op_slots` and
    :func:`~partir_core.propagation.shardable_factors`, when the caller keeps them."""
    eqn, rule = graph.eqns[i], rules[i]
    if rule is None:
        return OpSharding(None, {}, [replicated(graph, v, mesh) for v in eqn.invars],
                          [replicated(graph, v, mesh) for v in eqn.outvars], [], ()), tuple
    use, _, _ = resolve(graph, rule, eqn, state, mesh, i, slots=slots, shardable=shardable)
    use = fit_use(mesh, rule, drop_clashes(use))
    # all that the alternatives read of ``types`` and ``state``, as they are now
    operands = {v: types[v] for v in eqn.invars}
    keeps = not reads_shared_sum(graph, eqn, operands)

    def sharding(use, keep=True):
        keep = keep and keeps
        if made is None:
            return _op_sharding(graph, rule, eqn, use, operands, mesh, keep)
        key = _sharding_key(eqn, use, operands, keep)
        op = made.get(key)
        if op is None:
            op = made[key] = _op_sharding(graph, rule, eqn, use, operands, mesh, keep)
        return op

    proposal = sharding(use)
    dims = State({v: list(state.dims[v]) for v in (*eqn.invars, *eqn.outvars) if v in state.dims}, {})

    def alternatives():
        uses = _alternatives(graph, rule, eqn, dims, operands, mesh, use)
        made = list(map(sharding, uses))
        # then each that keeps a pending sum through the op, with that sum reduced first instead
        return made + [sharding(u, False) for u, op in zip(uses, made) if _keeps_pending(op)]

    return proposal, alternatives


def reads_shared_sum(graph: Graph, eqn, types: dict) -> bool:
    """Whether ``eqn`` reads a pending sum (as ``types`` has it) that other ops read too. Such a sum is reduced
    once, before its first reader, and every reader reads it reduced (:func:`op_candidates` offers no candidate
    that keeps it pending): the readers share one reduction (each is charged its share,
    :func:`reduction_share`) and everything computed from the sum is whole, as XLA reduces an activation's
    gradient before a layer norm's backward reads it three ways. Kept pending by some readers, the sum would be
    reduced again further on, once per reader (a layer norm's scale and bias gradients all-reduced at the end
    of the step, with the statistics its backward reads)."""
    readers = graph.readers()
    return any(types[v].partial and len(readers.get(v, ())) > 1 for v in eqn.invars)


def _sharding_key(eqn, use: dict, types: dict, keep: bool) -> tuple:
    """All that :func:`_op_sharding` reads of ``use``, ``types`` and ``keep`` for ``eqn``: each factor's axes,
    the pending sums of its operands, and whether they may stay pending."""
    return tuple([(f, a) for f, (a, _) in use.items()]), tuple([types[v].partial for v in eqn.invars]), keep


# The ops that carry a step's FLOPs, and the scatter-add that makes an embedding's gradient (a contraction of the
# tokens' gradients with their one-hot ids): one the state splits over its contracted dims keeps its devices
# (cheapest), so data parallelism scatters each device's own tokens and all-reduces the table's gradient.
CONTRACTIONS = frozenset({"dot_general", "conv_general_dilated", "scatter-add"})


def cheapest(graph: Graph, eqn, proposal: OpSharding, alternatives, types, state, mesh, targets,
             price=reshard_bytes, known=None) -> OpSharding:
    """The proposal, unless it needs communication and one of ``alternatives()`` (tried in order) moves
    fewer bytes (:func:`_op_cost` against ``targets``): then the first of the cheapest. A contraction
    (:data:`CONTRACTIONS`) that the proposal splits over its contracted dims (its result a pending sum) only
    takes a candidate that splits its work over as many devices (:func:`_devices`): the choice picks how its
    operands and results move, not whether the parallelism the tactics gave its FLOPs is kept (gathering a
    batch-split activation to make a weight's gradient whole on every device moves fewer bytes than reducing
    the gradient, and repeats the matmul on every device).
    Where results are priced (``targets`` not :data:`FOLLOW`), the candidates of :func:`_aligned` are tried
    after ``alternatives()``, and of candidates moving as many bytes and splitting the op's work over as many
    devices, the one moving fewer at its results wins (the first such): a reshard is moved towards the
    producers, whose choice in the next pass may meet the demand for free (a weight's gradient made in the
    weight's layout rather than all-to-all'd for each Adam moment). Otherwise ties keep the proposal.
    ``price``: :func:`~partir_core.reshard.reshard_bytes`, or a function that gives what it gives (a cache of
    it); ``known``: None, or a function giving ``price(src, dst)`` where that is at hand (planned before), else
    None: an alternative is then first bounded from below without planning a reshard (:func:`_op_cost`)."""
    op, cost = proposal, _op_cost(graph, eqn, proposal, types, state, mesh, targets, price)
    if cost > 0:
        priced = targets is not FOLLOW  # results priced: ties move reshards towards the producers
        late = None  # the bytes op's results are resharded with, once a tie asks
        candidates = alternatives()
        if priced:
            wanted = [_wanted(graph, v, state, mesh, targets) for v in eqn.outvars]
            candidates = itertools.chain(candidates, _aligned(graph, eqn, proposal, types, mesh, wanted))
        if eqn.name in CONTRACTIONS and proposal.new_partial:
            least = _devices(mesh, proposal)
            candidates = (c for c in candidates if _devices(mesh, c) >= least)
        for cand in candidates:
            c = _op_cost(graph, eqn, cand, types, state, mesh, targets, price, bound=cost, known=known)
            if c < cost:
                op, cost, late = cand, c, None
                if c == 0:
                    break
            elif priced and c == cost and _devices(mesh, cand) >= _devices(mesh, op) \
                    and _op_cost(graph, eqn, cand, types, state, mesh, targets, price) == cost:
                if late is None:
                    late = _result_cost(graph, eqn, op, types, state, mesh, targets, price)
                c_late = _result_cost(graph, eqn, cand, types, state, mesh, targets, price)
                if c_late < late:
                    op, late = cand, c_late
    return op


def _aligned(graph, eqn, proposal: OpSharding, types, mesh, wanted: list):
    """More candidates where results are priced: for each type ``wanted`` of a result of ``eqn`` (per result,
    the types it is priced against; a pending sum's are left out), ``eqn`` run so that the result comes out in
    that type (its factors split as the type's dims are; the proposal's other factors kept where they clash with
    none of those). A reader's demand thus reaches the producer even where no operand or state carries that
    layout (a gradient wanted in its weight's layout, refinement after refinement back to the matmul making it)."""
    rule, made = proposal.rule, set()
    for fs_list, wants in zip(rule.results, wanted):
        for want in wants:
            if want.partial:
                continue
            use = {}
            for axes, fs in zip(want.dims, fs_list):
                parts = decompose(mesh, axes, fs, rule.sizes) if axes else ()
                if parts is None or any(a and not rule.shardable(f) for f, a in zip(fs, parts)):
                    use = None
                    break
                use.update((f, (tuple(a), 0)) for f, a in zip(fs, parts) if a)
            if not use:
                continue
            taken = [a for axes, _ in use.values() for a in axes]
            for f, (axes, _) in proposal.use.items():
                if f not in use and not any(f in fs for fs in fs_list) and not clash(mesh, axes, taken):
                    use[f] = (axes, 0)
                    taken += axes
            use = fit_use(mesh, rule, use)
            key = tuple(sorted((f, a) for f, (a, _) in use.items()))
            if key not in made:
                made.add(key)
                yield _op_sharding(graph, rule, eqn, use, types, mesh)


def _devices(mesh, op: OpSharding) -> int:
    """Over how many devices ``op``'s work is split (the product of its factors' group sizes)."""
    n = 1
    for axes, _ in op.use.values():
        n *= group(mesh, axes)
    return n


def _result_cost(graph, eqn, op: OpSharding, types, state, mesh, targets, price) -> float:
    """The bytes of the reshards of ``op``'s results to what ``targets`` wants of them (part of :func:`_op_cost`)."""
    groups = _op_terms(graph, eqn, op, types, state, mesh, targets)[len(eqn.invars):]
    return sum(share * price(src, dst) for pairs in groups for src, dst, share in pairs)


FOLLOW = "follow"  # ``targets`` of a pass that prices no result (see :func:`_analyze_once`)


# passes of :func:`analyze` from each start: the first, then refinements; a demand travels one op back towards
# its producer per refinement (a gradient wanted in its weight's layout: through the optimizer's elementwise
# ops and a transpose to the matmul that makes it)
PASSES = 5


def analyze(graph: Graph, rules: list, state: State, mesh, choose: bool = True, passes: int = PASSES) -> Analysis:
    """Fix every op's factor axes (see :func:`_analyze_once`). With ``choose``, two starting passes are
    refined: one pricing results against the types the state gives them, one pricing no result
    (:data:`FOLLOW`: values keep the layout an op chose for them, so a per-op choice that differs from the
    state, e.g. a matmul keeping a sharded weight local, is not undone by a reshard at every reader). Each
    further pass prices results against the types their readers asked for in the pass before (and the
    outputs' types). Of all passes, the one whose program moves the fewest bytes is kept (the first one on
    ties, so the state-priced start wins unless another is strictly cheaper)."""
    first = _analyze_once(graph, rules, state, mesh, choose, None)
    if not choose:
        return first
    best, best_cost = first, received_bytes(graph, first, state, mesh)
    for start in (first, _analyze_once(graph, rules, state, mesh, True, FOLLOW)):
        cur = start
        c = received_bytes(graph, cur, state, mesh)
        if c < best_cost:
            best, best_cost = cur, c
        for _ in range(passes - 1):
            nxt = _analyze_once(graph, rules, state, mesh, True, _demands(graph, cur, state, mesh))
            c = received_bytes(graph, nxt, state, mesh)
            if c < best_cost:
                best, best_cost = nxt, c
            if nxt.types == cur.types:
                break
            cur = nxt
    return best


def output_type(graph, analysis, state, v, mesh) -> ShardingType:
    """The type output ``v`` is returned in. A training step's new parameters and optimizer state
    (:func:`~partir_core.analysis.tied_outputs`) come out in the types of the inputs they replace, so that the
    step's results are its next call's arguments as they are (ZeRO-1 and -2 gather the updated parameters back
    whole); any other output in the type propagation gives it (an input returned as it came, or a value the
    state does not know: its producer's type with pending sums reduced)."""
    if state is not None:
        u = tied_outputs(graph).get(v)
        if u is not None and u in state.dims:
            return state_type(graph, state, u, mesh)
        if v in state.dims and v not in graph.invars:
            return state_type(graph, state, v, mesh)
    return analysis.types[v].replace(partial=())


def _demands(graph, analysis, state, mesh, trips: dict | None = None) -> dict:
    """Per value: the distinct types its readers (and the outputs) want it in. With ``trips`` (a dict), also
    records per value how often per call its readers read it (inside a loop body: the loop's trips)."""
    want: dict = {}
    for i, (eqn, op) in enumerate(zip(graph.eqns, analysis.ops)):
        for v, t in zip(eqn.invars, op.in_types):
            if v not in graph.consts:
                want.setdefault(v, set()).add(t)
                if trips is not None:
                    trips[v] = max(trips.get(v, 1), graph.read_trips(i))
    for v in graph.outvars:
        if v not in graph.consts:
            want.setdefault(v, set()).add(output_type(graph, analysis, state, v, mesh))
    return {v: sorted(ts, key=str) for v, ts in want.items()}


def received_bytes(graph, analysis, state, mesh) -> float:
    """Bytes a device receives per call of the program lowered from ``analysis`` (each distinct reshard once
    where it is made, as often as the loops around it run)."""
    total = 0.0
    trips: dict = {}
    for v, ts in _demands(graph, analysis, state, mesh, trips).items():
        total += trips.get(v, 1) * sum(reshard_bytes(analysis.types[v], t) for t in ts)
    for i, op in enumerate(analysis.ops):
        for _, axes in op.finish:
            total += graph.read_trips(i) * finish_bytes(axes, op.out_types)
    return total


def _boundary_sharding(graph, rule, eqn, types, state, mesh, targets=None) -> OpSharding:
    """How a region's enter or exit runs (fixed, not chosen per op: a loop-carried type is one type).

    Enter: every body parameter gets the type propagation gives it (never partial: pending sums are reduced
    before the region), and its outer operand is moved to that type (a stacked ``xs`` with its leading dim
    whole) before the region, once. Given ``targets`` (the passes that let values keep the layout an op chose
    for them), a loop invariant or a stacked ``xs`` enters in the layout its operand was produced in instead
    (its pending sums reduced; a stacked dim must be whole), so that, e.g., the residuals a forward scan saved
    in the layout its body chose are read by the backward scan as they are; a carry keeps the propagated type,
    its fixed point. Exit: a carry's body result is moved to the carry's type, the one its
    parameter got, at the end of the body (inside the loop), and the loop's result has that type; a scan's
    ``ys`` keep the layout the body produced them in, with the stacked dim whole: a pending sum stays pending
    (it is reduced after the loop, at its readers, once), unless a reader in the body asked for it reduced in
    the pass before (``targets``, a dict): the ``ys`` then take that type, whose reduction the body makes
    anyway (the lowering moves a buffer to one type once). A cond's results get the type propagation gives
    them, every branch's moved there inside the branch. Operands in no tie (index, predicate) are replicated."""
    reg = graph.regions[eqn.params["region"]]
    ins = [replicated(graph, v, mesh) for v in eqn.invars]
    if is_enter(eqn):
        outs = [state_type(graph, state, p, mesh) for p in eqn.outvars]
        carried = set(reg.carry)
        for i, o, stacked in eqn.params["ties"]:
            p, src = eqn.outvars[o], types[eqn.invars[i]]
            if targets is not None and p not in carried and not (stacked and src.dims[0]):
                outs[o] = value_type(graph, p, mesh, src.dims[int(stacked):int(stacked) + len(graph.shape(p))])
            dims = outs[o].dims[:len(graph.shape(eqn.outvars[o]))]
            ins[i] = value_type(graph, eqn.invars[i], mesh, (((),) if stacked else ()) + dims)
        return OpSharding(rule, {}, ins, outs, [], ())
    outs = [None] * len(eqn.outvars)
    for o, members, stacked in eqn.params["ties"]:
        v = eqn.outvars[o]
        if stacked:
            y = eqn.invars[members[0]]
            t = types[y]
            if t.partial and type(targets) is dict:
                t = next((w for w in targets.get(y, ()) if not w.partial), t)
            ins[members[0]] = t
            outs[o] = value_type(graph, v, mesh, ((),) + t.dims[:len(graph.shape(v)) - 1], t.partial)
            continue
        t = state_type(graph, state, v, mesh) if reg.kind == "cond" else types[eqn.invars[members[-1]]]
        for i in members:
            ins[i] = t
        outs[o] = t
    return OpSharding(rule, {}, ins, outs, [], ())


def _op_sharding(graph, rule, eqn, use, types, mesh, keep_pending: bool = True) -> OpSharding:
    """``eqn`` run with the factor axes ``use`` on operands produced as ``types``: a pending sum passes through a
    linear op where its rule lets it (with ``keep_pending``; without, every operand is reduced first)."""
    used = {a for axes, _ in use.values() for a in axes}
    new_partial = tuple(a for f, k in rule.reduce.items() if k == "sum" and f in use for a in use[f][0])
    finish = [(k, use[f][0]) for f, k in rule.reduce.items() if k in ("max", "min") and f in use]
    partials = [types[v].partial for v in eqn.invars]
    keep = _kept(mesh, rule, partials, used) if keep_pending else [()] * len(partials)
    passed = next((p for p in keep if p), ())
    ins = [value_type(graph, v, mesh, dims_axes(mesh, rule, use, dims), keep[k])
           for k, (v, dims) in enumerate(zip(eqn.invars, rule.operands))]
    outs = [value_type(graph, v, mesh, dims_axes(mesh, rule, use, dims),
                       tuple(passed) + new_partial)
            for v, dims in zip(eqn.outvars, rule.results)]
    return OpSharding(rule, use, ins, outs, finish, new_partial)


def _kept(mesh, rule, partials: list, used: set) -> list:
    """Per operand, the pending sum (axes) that passes through a linear op (``()`` where none): all operands'
    for ``linear == "all"`` when they are pending over the same axes, the one pending operand's for ``"one"``;
    none whose axes the op's factors use."""
    keep = [()] * len(partials)
    if rule.linear == "all" and partials and partials[0] and all(p == partials[0] for p in partials) \
            and not clash(mesh, partials[0], used):
        keep = list(partials)
    elif rule.linear == "one" and sum(bool(p) for p in partials) == 1:
        j = next(k for k, p in enumerate(partials) if p)
        if not clash(mesh, partials[j], used):
            keep[j] = partials[j]
    return keep


def _keeps_pending(op: OpSharding) -> bool:
    """Whether ``op`` reads an operand as a pending sum (keeps it pending through the op)."""
    return any(t.partial for t in op.in_types)


def state_type(graph, state, v, mesh) -> ShardingType:
    """The (non-partial) type propagation gives value ``v``."""
    return value_type(graph, v, mesh, tuple(state.dims[v]))


def _op_cost(graph, eqn, op: OpSharding, types, state, mesh, targets=None, price=reshard_bytes,
             bound: float = float("inf"), known=None) -> float:
    """Bytes received running ``eqn`` as ``op``: its operands resharded from ``types``, its results to what
    ``targets`` wants (see :func:`_analyze_once`), its reductions finished; each reshard priced by ``price``
    (see :func:`cheapest`). Below ``bound``, that cost exactly (summed in one fixed order and grouping).
    Otherwise, once the cost is known to reach ``bound``, a value at least ``bound`` is returned without
    pricing the rest, so a candidate that cannot beat ``bound`` plans as few new reshards as may be: when a
    partial sum in the fixed order reaches it (the terms are not negative, and rounded addition is
    monotonic), or, with ``known``, before the first reshard not at hand is planned, when the partial sum,
    the rest at hand and the lower bounds of the others (:func:`~partir_core.reshard.reshard_floor`) add up
    to more than ``bound`` by more than any rounding of the two sums."""
    groups = _op_terms(graph, eqn, op, types, state, mesh, targets)
    finishes = [finish_bytes(axes, op.out_types) for _, axes in op.finish]
    floored = known is None or bound >= _PRUNE_BELOW  # no lower bound to try
    cost = 0
    for g, pairs in enumerate(groups):
        part = 0
        for k, (src, dst, share) in enumerate(pairs):
            b = None if known is None else known(src, dst)
            if b is None:
                if not floored:
                    floored = True
                    rest = [*pairs[k:], *(pair for later in groups[g + 1:] for pair in later)]
                    floor = cost + part + _floor(rest, known) + sum(finishes)
                    terms = sum(map(len, groups)) + len(finishes)
                    if floor > bound * (1 + terms * _ROUNDING):
                        return floor
                b = price(src, dst)
            part += share * b
            if cost + part >= bound:
                return cost + part
        cost += part
    for b in finishes:
        cost += b
    return cost


def _floor(pairs, known) -> float:
    """A lower bound of the bytes of the reshards ``pairs``: those ``known`` gives, the others'
    :func:`~partir_core.reshard.reshard_floor`."""
    total = 0.0
    for src, dst, share in pairs:
        b = known(src, dst)
        total += share * (reshard_floor(src, dst) if b is None else b)
    return total


# A rounded sum of n non-negative floats is within a relative (n - 1) * 2**-53 of the exact sum, so n terms whose
# sum in one order exceeds ``bound * (1 + n * _ROUNDING)`` reach ``bound`` in any other (_op_cost, with room to
# spare); bounds below _PRUNE_BELOW keep that product finite.
_ROUNDING = 2.0 ** -50
_PRUNE_BELOW = 1e300


def _op_terms(graph, eqn, op: OpSharding, types, state, mesh, targets) -> list:
    """The reshards :func:`_op_cost` prices, as groups of ``(src, dst, share)`` in order (``share``: of the
    reshard's bytes charged to the op, :func:`reduction_share`): one group per operand, one per result priced
    (the types ``targets`` wants of it: their bytes are summed, then added). A pending
    sum that several ops read, read by a linear op in a type its readers asked for (``targets``, a dict), is
    priced nothing: that reshard is made for them anyway and shared (:func:`partir_core.lowering.lower` moves a
    buffer to one type once), so the op may read the sum reduced rather than keep it pending
    (:func:`shared_reduction`). Where ``targets`` is a dict, a fill (:func:`fills`) is read in any layout for
    nothing: its producer, priced against this op's demand in the next pass, makes it there at no cost."""
    readers = graph.readers()
    filled = fills(graph) if type(targets) is dict else ()
    groups = []
    for v, t in zip(eqn.invars, op.in_types):
        n = len(readers.get(v, ()))
        if shared_reduction(op, v, t, types, targets, n) or (
                v in filled and not types[v].partial and not t.partial):
            groups.append(())
        else:
            groups.append(((types[v], t, reduction_share(op, types[v], t, n)),))
    if targets is FOLLOW:
        return groups
    for v, t in zip(eqn.outvars, op.out_types):
        wanted = _wanted(graph, v, state, mesh, targets)
        if wanted:
            groups.append(tuple((t, want, 1.0) for want in wanted))
    return groups


def fills(graph: Graph) -> frozenset:
    """The values made by broadcasting a scalar (``broadcast_in_dim`` of a rank-0 operand: the zeros of a ReLU's
    gradient, a constant bias). Any layout of a fill is made locally, from its scalar, at no cost, so a refinement
    pass does not price reading one in the layout a reader wants (:func:`_op_terms`): otherwise the fill's layout,
    fixed by propagation, and its reader's, fixed by the fill's, hold each other in place, one reshard apart from
    a cheaper program (a gradient's zeros split one way, the gradient another, an all-to-all between)."""
    def make(graph):
        return frozenset(v for e in graph.eqns if e.name == "broadcast_in_dim" and not graph.shape(e.invars[0])
                         for v in e.outvars)
    return graph.memo("fills", make)


def reduction_share(op: OpSharding, src, dst, readers: int) -> float:
    """The share of a reshard of an operand from ``src`` to ``dst`` that ``op`` is charged: a linear op (one
    that could keep the sum pending) reading a pending sum that ``readers`` ops read, reduced (``dst`` pending
    over fewer axes), pays ``1 / readers`` of it: all its readers read it reduced (:func:`reads_shared_sum`),
    and where they read it alike they share one reduction (:func:`partir_core.lowering.lower` moves a buffer
    to one type once). Whole otherwise."""
    if readers > 1 and op.rule.linear is not None and src.partial and set(dst.partial) < set(src.partial):
        return 1.0 / readers
    return 1.0


def _wanted(graph, v, state, mesh, targets) -> tuple:
    """The types result ``v`` is priced against (``targets`` not :data:`FOLLOW`): those ``targets`` wants (a
    dict naming ``v``), else the state's type for it (none for a value the state does not know)."""
    if targets is not None and v in targets:
        return tuple(targets[v])
    return (state_type(graph, state, v, mesh),) if v in state.dims else ()


def shared_reduction(op: OpSharding, v, t, types: dict, targets, readers: int) -> bool:
    """Whether ``op`` reads its operand ``v``, a pending sum as ``types`` has it that ``readers`` ops read, in a
    type ``t`` that its readers asked for in the pass before (``targets``, a dict: the readers' demands), being a
    linear op (one that could keep it pending): several readers needing one sum reduced then share one
    reduction. A sum only ``op`` reads is not (its own demand of the pass before would make the reduction look
    free)."""
    return readers > 1 and type(targets) is dict and op.rule.linear is not None and bool(types[v].partial) \
        and t in targets.get(v, ())


def _alternatives(graph, rule, eqn, state, types, mesh, base, limit: int = 96):
    """Factor choices to compare with ``base``: per shardable factor, the axes its dims carry (in the
    state, or as operands are produced), their prefixes, or none (a ``proposed`` factor: as in ``base``);
    combinations with an axis used twice or blocks that do not compose are dropped (at most ``limit`` are
    returned)."""
    opts: dict[str, set] = {}
    slots = [(types[v].dims, fs_list) for v, fs_list in zip(eqn.invars, rule.operands)]
    slots += [(tuple(state.dims[v]), fs_list) for v, fs_list in zip(eqn.invars, rule.operands)
              if v in state.dims]
    slots += [(tuple(state.dims[v]), fs_list) for v, fs_list in zip(eqn.outvars, rule.results)
              if v in state.dims]
    for dims, fs_list in slots:
        for axes, fs in zip(dims, fs_list):
            if not axes or not fs:
                continue
            parts = decompose(mesh, axes, fs, rule.sizes)
            if parts is None:
                continue
            for f, a in zip(fs, parts):
                if a and rule.shardable(f):
                    for j in range(1, len(a) + 1):
                        opts.setdefault(f, set()).add(tuple(a[:j]))
    for f, (a, _) in base.items():
        opts.setdefault(f, set()).add(tuple(a))
    factors = sorted(opts)
    choices = [[base[f][0]] if f in rule.proposed and f in base else [None] if f in rule.proposed
               else [None] + sorted(opts[f]) for f in factors]
    out, seen = [], set()
    for combo in itertools.product(*choices):
        axes = [a for c in combo if c for a in c]
        if any(clash(mesh, axes[:j], (a,)) for j, a in enumerate(axes)):
            continue
        use = {f: (c, 0) for f, c in zip(factors, combo) if c}
        use = fit_use(mesh, rule, use)
        key = tuple(sorted((f, u[0]) for f, u in use.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(use)
        if len(out) >= limit:
            break
    return out
