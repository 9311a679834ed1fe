"""The plumbing that makes the search's evaluations cheap changes no figure: frozen states, the lowering memo, the
collector paused during a search, what a state carries over to the states chosen from it."""

import dataclasses
import gc
import weakref

import pytest

import jax

import redist
from tests.partir_core.helpers import model_and_inputs
from tests.partir_core.test_estimate import MESHES, PRESETS, preset, random_sets, schedule_state
import partir_core as pc
from partir_core.automatic import search
from partir_core.automatic.actions import build_actions
from partir_core.automatic.evaluation import STEP, Evaluator
from partir_core.analysis import analyze_groups
from partir_core.choice import FOLLOW, _analyze_once, _demands, analyze
from partir_core.lowering import lower
from partir_core.program import Compute, Finish, Reshard, walk
from partir_core.estimate import (Estimator, Structure, _Chooser, _columns, _distance, _OpMemo,
                                  state_diff)
from partir_core.simulator import simulate


MESH = MESHES["2x4"]


def start(name):
    m, ins, _ = model_and_inputs(name)
    return m, ins, pc.jit(m.step, MESH, []).lower(*ins)


@pytest.mark.parametrize("name", ["transformer", "scanned_transformer"])
def test_evaluator_states_are_frozen_and_equal_full_propagation(name):
    """Every state the evaluator keeps equals the state the same tactics give when applied and propagated in
    full (dims, provenance, pins, conflicts); it is read-only (tuples), and holds the very dims of its prefix's
    state for every value the last action did not change."""
    m, ins, low = start(name)
    graph, rules = low.graph, low.rules
    actions = build_actions(analyze_groups(graph, rules), graph, MESH, list(MESH.names))
    ev = Evaluator(graph, rules, MESH, low.states[0].copy(), 1, actions, None, None)
    checked = shared = 0
    for chain in random_sets(graph, rules, MESH, seed=3, n=6, depth=3):
        key = ev.key(dict.fromkeys(chain))
        for j in range(1, len(key) + 1):
            state = ev.state(key[:j])
            if state is None:
                break
            full = schedule_state(graph, rules, MESH, [])
            for k, a in enumerate(key[:j]):
                a.tactic.apply(graph, full, MESH, 1 + STEP * k)
                pc.propagation.propagate(graph, rules, full, MESH, 1 + STEP * k)
            assert state.dims == {v: tuple(d) for v, d in full.dims.items()}
            assert state.prov == {v: tuple(p) for v, p in full.prov.items()}
            assert state.pinned == full.pinned and [str(c) for c in state.conflicts] == [str(c) for c in full.conflicts]
            assert all(type(d) is tuple for d in state.dims.values())
            parent = ev.state(key[:j - 1])
            same = [v for v in state.dims if state.dims[v] == parent.dims[v] and state.prov[v] == parent.prov[v]]
            assert all(state.dims[v] is parent.dims[v] for v in same)
            checked, shared = checked + 1, shared + len(same)
    assert checked >= 8 and shared > 0
    # equal dims or provenances are one tuple in every state it holds, whichever path made them (interned)
    one: dict = {}
    for state in [ev.base, *ev.states.values()]:
        for t in (*state.dims.values(), *state.prov.values()):
            assert one.setdefault(t, t) is t


def test_the_result_state_takes_the_tactics_after_the_search():
    """The state an AutomaticPartition hands on is one the tactics after it may change (the evaluator's own
    states are read-only)."""
    m, ins, _ = model_and_inputs("mlp")
    auto = pc.AutomaticPartition(axes=["batch"], max_evals=10, progress=False)
    pf = pc.jit(m.step, MESH, [auto, pc.ManualPartition({"params/w1": 1}, axis="model")])
    low = pf.lower(*ins)
    assert low.input_type("params/w1").dims[1] == ("model",)


def test_lowering_with_a_memo_gives_the_same_programs():
    """Lowering the presets' analyses one after another through one memo (each op's entry made for another
    choice before) gives, for each, the instructions and the simulation that lowering it afresh gives; lowering
    an analysis again reads every entry it made."""
    m, ins, low = start("transformer")
    graph, rules = low.graph, low.rules
    memo = {}
    for name in PRESETS["2x4"][:6]:
        analysis = analyze(graph, rules, schedule_state(graph, rules, MESH, preset(name, m, ins, MESH)), MESH)
        fresh = lower(graph, analysis, MESH)
        for _ in range(2):
            entries = held(memo)
            got = lower(graph, analysis, MESH, memo=memo)
            for x, y in zip(walk(fresh.instructions), walk(got.instructions), strict=True):
                assert type(x) is type(y)
                if isinstance(x, (Compute, Finish)):
                    assert x == y
            assert got.buf_bytes == fresh.buf_bytes
            assert simulate(got) == simulate(fresh)
        assert held(memo) == entries  # the second lowering made nothing


@pytest.mark.parametrize("name", ["transformer", "scanned_transformer"])
def test_lowering_from_a_base_program_gives_the_program_lowering_afresh_gives(name):
    """Lowering an analysis from another's program (the automatic search lowers a candidate from its base's)
    gives what lowering it afresh gives: the same instructions in the same order (moves numbered alike), bytes,
    outputs, fallbacks, segments and simulation, on chains of random actions each lowered from the one before.
    Without control flow, only the equations that run otherwise than in the base are lowered (about half
    of them here); with it (a scanned model), the program is lowered in full."""
    m, ins, low = start(name)
    graph, rules = low.graph, low.rules
    est = Estimator(graph, rules, MESH)  # its analyses share the objects of the choices they share
    base, before, lowered, total = None, None, 0, 0
    for chain in random_sets(graph, rules, MESH, seed=5, n=5, depth=3):
        for j in range(len(chain) + 1):
            state = schedule_state(graph, rules, MESH, [a.tactic for a in chain[:j]])
            analysis = est.analysis(tuple(chain[:j]), state, before)
            before = tuple(chain[:j])
            try:
                fresh = lower(graph, analysis, MESH)
            except redist.ShardingError:
                continue
            got = lower(graph, analysis, MESH, memo=est.lowering, base=base)
            assert len(got.instructions) == len(fresh.instructions)
            for x, y in zip(walk(got.instructions), walk(fresh.instructions), strict=True):
                assert type(x) is type(y)
                if isinstance(x, Reshard):
                    assert (x.src_buf, x.dst_buf, x.move.plan, x.collectives) == \
                        (y.src_buf, y.dst_buf, y.move.plan, y.collectives)
                elif isinstance(x, (Compute, Finish)):
                    assert x == y
            assert (got.buf_bytes, got.out_bufs, got.out_types, got.fallbacks) == \
                (fresh.buf_bytes, fresh.out_bufs, fresh.out_types, fresh.fallbacks)
            assert simulate(got) == simulate(fresh)
            if graph.regions:
                assert got.segments is None
            else:
                assert (got.segments.starts, got.segments.moving) == (fresh.segments.starts, fresh.segments.moving)
                assert fresh.segments.lowered == len(graph.eqns)
                if base is not None:
                    lowered, total = lowered + got.segments.lowered, total + len(graph.eqns)
            base = got
    assert bool(graph.regions) or 0 < lowered < 3 * total / 4


def held(memo: dict) -> set:
    """What a lowering memo holds: ``(op, key, the entry's identity)`` for every entry of every op's table."""
    return {(i, k, id(e)) for i, table in memo.items() for k, e in table.items()}


def test_the_search_pauses_the_cyclic_collector_and_restores_it():
    """While a search runs, Python's cyclic collector is off; after it, as it was before: on or off, after a
    result or an error."""
    m, ins, low = start("mlp")
    seen = []

    def log(*_):
        seen.append(gc.isenabled())

    def run(**kw):
        return search(low.graph, low.rules, low.states[0], MESH, 1,
                      pc.AutomaticPartition(max_evals=60, progress=False, **kw), log)

    assert gc.isenabled()
    run()
    assert seen and not any(seen) and gc.isenabled()
    with pytest.raises(pc.PartitionError):
        run(memory_budget_bytes=100)
    assert gc.isenabled()
    gc.disable()
    try:
        run()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_search_leaves_no_cycle_for_the_collector(monkeypatch):
    """The search's evaluator (its states, programs and tables) is freed by reference counting as the search
    returns, with the cyclic collector off: nothing it made refers back to it (its evaluations measure their
    peaks through a weak reference), without a memory budget and with one."""
    m, ins, low = start("mlp")
    made = []
    init = Evaluator.__init__

    def tracked(self, *args, **kw):
        init(self, *args, **kw)
        made.append(weakref.ref(self))

    monkeypatch.setattr(Evaluator, "__init__", tracked)
    enabled = gc.isenabled()
    gc.disable()
    try:
        for budget in (None, 10 ** 12):
            res = search(low.graph, low.rules, low.states[0], MESH, 1,
                         pc.AutomaticPartition(max_evals=40, progress=False, memory_budget_bytes=budget))
            assert res.peak_bytes > 0 and made[-1]() is None
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("name", ["scanned_mlp", "scanned_transformer"])
def test_refinements_made_from_the_state_priced_start_equal_the_plain_passes(name, mesh_name):
    """The first refinement is made from the state-priced start of the same state, F1 from it: on states of
    random action sets of the scanned models (where a region's enter and exit run differently under targets
    than under the state's types), each pass's choices and types are those of the plain pass, and scoring
    from scratch and from the previous state gives the simulation of the lowered program."""
    mesh = MESHES[mesh_name]
    m, ins, _ = model_and_inputs(name)
    low = pc.jit(m.step, mesh, []).lower(*ins)
    graph, rules = low.graph, low.rules
    est, memo, previous, scored = Estimator(graph, rules, mesh), _OpMemo(), None, 0
    for j, chain in enumerate(random_sets(graph, rules, mesh, seed=5, n=12, depth=3)):
        state = schedule_state(graph, rules, mesh, [a.tactic for a in chain])
        ch = _Chooser(Structure(graph, rules), state, mesh, memo)
        p0, f0 = ch.run(None, None, set(), set()), ch.run(FOLLOW, None, set(), set())
        p1 = ch.run(p0.demands, p0, set(), set())
        f1 = ch.run(f0.demands, p1, set(), set())
        plain_p0, plain_f0 = (_analyze_once(graph, rules, state, mesh, True, t) for t in (None, FOLLOW))
        for fast, start in ((p1, plain_p0), (f1, plain_f0)):
            plain = _analyze_once(graph, rules, state, mesh, True, _demands(graph, start, state, mesh))
            assert fast.types == plain.types
            assert [(o.in_types, o.out_types) for o in fast.ops] == [(o.in_types, o.out_types) for o in plain.ops]
        try:
            want = simulate(lower(graph, analyze(graph, rules, state, mesh), mesh))
        except redist.ShardingError:
            continue
        for got in (Estimator(graph, rules, mesh).score(j, state), est.score(j, state, previous)):
            assert (got.step_time_s, got.peak_bytes, got.comm_bytes) == \
                (want.step_time_s, want.peak_bytes, want.comm_bytes)
        previous, scored = j, scored + 1
    assert scored >= 6


@pytest.mark.parametrize("name", ["transformer", "scanned_transformer"])
def test_what_a_state_hands_on_equals_what_it_computes_afresh(name):
    """A state chosen from its parent's carries over the parent's state keys of the ops none of whose values
    changed, and works out from the parent's which values' demands in its state-priced pass are not just their
    state type, and which pending sums are demanded in another type than their own: on chains of random actions,
    scored each from the one before, every key and those sets are what a chooser on the state computes afresh."""
    m, ins, low = start(name)
    graph, rules = low.graph, low.rules
    est = Estimator(graph, rules, MESH)
    est.analysis((), low.states[0])
    keys = unlike = 0
    for chain in random_sets(graph, rules, MESH, seed=13, n=6, depth=3):
        for j in range(1, len(chain) + 1):
            state = schedule_state(graph, rules, MESH, [a.tactic for a in chain[:j]])
            est.analysis(tuple(chain[:j]), state, tuple(chain[:j - 1]))
            starts = est.bases[tuple(chain[:j])][0]
            fresh = _Chooser(est.structure, state, MESH, est.memo)
            for i, sk in enumerate(starts.state_keys):
                if sk is not None:
                    assert sk == est.memo.intern(fresh._state_key(i))
                    keys += 1
            p0 = starts.passes["P0"]
            assert p0.unlike == fresh._unlike_state(p0.demands)
            assert p0.shared is None or p0.shared == fresh._shared(p0.demands, p0.types)
            unlike += len(p0.unlike)
    assert keys > 1000 and unlike > 0


def test_a_value_whose_dims_changed_is_looked_at_again_though_its_demands_did_not():
    """Which values a state-priced pass demands in other types than their state's is worked out from its base
    pass's answer; a value whose demands are the base's very list but whose dims changed (and its state type
    with them) is looked at again. A base pass with batch parallelism's choices and demands but the answer
    the unpartitioned state gives for them: the pass made from it on batch parallelism's state (nothing is
    chosen differently) gives a fresh chooser's answer."""
    m, ins, low = start("transformer")
    graph, rules = low.graph, low.rules
    structure, memo = Structure(graph, rules), _OpMemo()
    plain = low.states[0]
    bp = schedule_state(graph, rules, MESH, preset("BP", m, ins, MESH))
    ch = _Chooser(structure, bp, MESH, memo)
    p0 = ch.run(None, None, set(), set())
    stale = _Chooser(structure, plain, MESH, memo)._unlike_state(p0.demands)
    dirty = state_diff(plain, bp)
    made = ch.run(None, dataclasses.replace(p0, unlike=stale), dirty,
                  {i for v in dirty for i in structure.touching.get(v, ())})
    assert made.ops == p0.ops and made.demands == p0.demands
    assert made.unlike == ch._unlike_state(made.demands) != stale


def test_the_nearest_held_set_is_the_one_whose_state_differs_least():
    """Of the sets it is asked about, the estimator names the held one whose state differs from a given state in
    the fewest values (the first of those on ties), passing over those it does not hold (the search scores a set
    from it: the figures are the same from any base)."""
    m, ins, low = start("transformer")
    graph, rules = low.graph, low.rules
    est = Estimator(graph, rules, MESH)
    states = {name: schedule_state(graph, rules, MESH, preset(name, m, ins, MESH) if name else [])
              for name in ("", "BP", "MP", "BP+MP")}
    for name in ("", "BP", "MP"):
        est.analysis(name, states[name])
    assert est.nearest(states["BP+MP"], ["", "MP", "BP"]) == "BP"
    # MP's values keep another provenance in BP+MP: it differs in as many values as the start, the first wins
    assert est.nearest(states["BP+MP"], ["MP", ""]) == "MP" and est.nearest(states["BP+MP"], ["", "MP"]) == ""
    assert est.nearest(states[""], ["BP", "", "BP+MP"]) == ""
    assert est.nearest(states["BP"], ["BP+MP"]) is None
    for a in states.values():  # what it counts is state_diff's count
        for b in states.values():
            assert _distance(_columns(a, est.read), _columns(b, est.read)) == len(state_diff(a, b))


@pytest.mark.parametrize("name", ["transformer", "scanned_transformer", "gnn"])
def test_a_simulation_without_memory_gives_every_other_figure(name):
    """``simulate(program, memory=False)`` (what the search scores candidates with when it has no memory budget)
    gives the step time, FLOPs, bytes and kernels ``simulate`` gives, and no memory figures; on every preset,
    control flow included."""
    m, ins, low = start(name)
    for mesh_name, mesh in MESHES.items():
        for p in PRESETS[mesh_name]:
            tactics = preset(p, m, ins, mesh)
            if tactics is None:  # not one of this model's presets
                continue
            program = pc.jit(m.step, mesh, tactics).lower(*ins).program
            full, timed = simulate(program), simulate(program, memory=False)
            assert (timed.peak_bytes, timed.argument_bytes, timed.output_bytes, timed.temp_bytes) == (None,) * 4
            assert dataclasses.replace(timed, peak_bytes=full.peak_bytes, argument_bytes=full.argument_bytes,
                                       output_bytes=full.output_bytes, temp_bytes=full.temp_bytes) == full
            assert full.peak_bytes > 0
