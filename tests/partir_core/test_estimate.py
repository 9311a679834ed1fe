"""The search's fast scoring (partir_core.estimate) gives exactly what lowering and simulating gives."""

import random

import pytest

import jax

import redist
from tests.partir_core.helpers import model_and_inputs
import partir_core as pc
from partir_core import schedules
from partir_core.analysis import analyze_groups
from partir_core.automatic.actions import build_actions
from partir_core.choice import analyze
from partir_core.estimate import Estimator, Structure, propagate_changes
from partir_core.lowering import lower
from partir_core.propagation import State, propagate
from partir_core.simulator import simulate


MESHES = {"2x4": redist.Mesh({"batch": 2, "model": 4}), "2x2x2": redist.Mesh({"batch": 2, "model": 2, "z": 2})}
PRESETS = {"2x4": ["BP", "MP", "Z2", "Z3", "EMB", "BP+MP", "BP+Z2", "BP+Z3", "BP+MP+Z2", "BP+MP+Z3", "BP+MP+Z3+EMB"],
           "2x2x2": ["BP", "MP", "Z2", "Z3", "EMB", "BP+MP+Z3"]}


def flax_or_skip():
    pytest.importorskip("flax")
    from bench.flax_lm import flax_lm

    m = flax_lm()
    return m, m.init(jax.random.key(0))


def model(name):
    if name == "flax_lm":
        return flax_or_skip()
    m, ins, _ = model_and_inputs(name)
    return m, ins


def preset(name, m, ins, mesh):
    """The preset's tactics; for the flax LM, MP is its own Megatron (the presets name plain-JAX weights)."""
    if m.name == "flax_lm":
        if "EMB" in name:
            return None
        from bench.flax_lm import megatron

        out = []
        for part in name.split("+"):
            out += megatron() if part == "MP" else schedules.schedule(part, m, ins, mesh=mesh)
        return out
    try:
        return schedules.schedule(name, m, ins, mesh=mesh)
    except pc.PartitionError:  # EMB on a model without embeddings
        return None


def schedule_state(graph, rules, mesh, tactics) -> State:
    """The state after ``tactics``, each applied and propagated as ``partir_core.jit`` does."""
    state = State.empty(graph)
    for k, t in enumerate(tactics, start=1):
        t.apply(graph, state, mesh, k)
        propagate(graph, rules, state, mesh, k)
    return state


def assert_scores_are_simulations(step, ins, mesh, named_tactics: dict) -> int:
    """Each ``name: tactics`` (None: left out) scored by the estimator (from scratch, from the schedule scored
    before, from the unpartitioned start) equals ``pf.lower(...).simulate()``: step time, peak and bytes
    received. Returns how many were checked."""
    start = pc.jit(step, mesh, []).lower(*ins)
    graph, rules = start.graph, start.rules
    est, scratch = Estimator(graph, rules, mesh), Estimator(graph, rules, mesh)
    est.score((), start.states[0])
    previous, checked = (), 0
    for p, tactics in named_tactics.items():
        if tactics is None:
            continue
        want = pc.jit(step, mesh, tactics).lower(*ins).simulate()
        state = schedule_state(graph, rules, mesh, tactics)
        for got in (scratch.score(p, state), est.score(p, state, previous), est.score(p + "/start", state, ())):
            assert (got.step_time_s, got.peak_bytes, got.comm_bytes) == (
                want.step_time_s, want.peak_bytes, want.comm_bytes), p
        previous, checked = p, checked + 1
    return checked


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("name", ["mlp", "transformer", "gnn", "flax_lm", "scanned_mlp", "scanned_transformer"])
def test_estimate_equals_the_simulation_of_every_preset(name, mesh_name):
    """On every preset of every model (and compositions of them), the estimator's step time, peak and bytes
    received equal ``pf.lower(...).simulate()``'s exactly: scored from scratch, from the unpartitioned start,
    and from the preset scored before (a state that differs from it almost everywhere). The scanned models
    check loops: a region's enter and exit run as fixed, and bytes moved inside a body count once per trip
    when the passes are compared."""
    mesh = MESHES[mesh_name]
    m, ins = model(name)
    named = {p: preset(p, m, ins, mesh) for p in PRESETS[mesh_name]}
    checked = assert_scores_are_simulations(m.step, ins, mesh, named)
    assert checked >= len(PRESETS[mesh_name]) - 2  # EMB (and its compositions) need an embedding


@pytest.mark.parametrize("name", ["flax_mlp", "eqx_mlp", "nnx_encoder"])
def test_estimate_equals_the_simulation_on_steps_written_by_users(name):
    """As above, on the zoo's steps (flax.linen, equinox, flax.nnx with optax) under their presets: ReLU
    gradients whose zeros are fills (choice.fills), layer norms whose pending gradient several ops read."""
    pytest.importorskip("flax")
    pytest.importorskip("equinox")
    from examples import zoo
    mesh = MESHES["2x4"]
    step, ins = zoo.module(name).make()
    presets = ["BP", "MP", "Z2", "Z3", "BP+MP", "BP+MP+Z3"]
    assert assert_scores_are_simulations(
        step, ins, mesh, {p: schedules.schedule(p, step, ins, mesh=mesh) for p in presets}) == len(presets)


def test_an_op_reading_a_fill_has_a_signature_of_its_own():
    """Two selects of one shape, one reading a fill (free to read in any layout in a refinement pass) and one
    reading a computed value: the estimator shares no choice between them."""
    import jax.numpy as jnp

    def f(h, g):
        return jnp.where(h > 0, g, 0.0), jnp.where(h > 0, g, 2 * h)

    x = jnp.ones((8, 16))
    low = pc.jit(f, MESHES["2x4"], []).lower(x, x)
    structure = Structure(low.graph, low.rules)
    selects = [i for i, e in enumerate(low.graph.eqns) if e.name == "select_n"]
    assert len(selects) == 2
    assert structure.signature[selects[0]] != structure.signature[selects[1]]


def random_sets(graph, rules, mesh, seed, n, depth):
    """``n`` seeded random chains of up to ``depth`` actions: ``[(actions so far, action)]`` per chain."""
    actions = build_actions(analyze_groups(graph, rules), graph, mesh, list(mesh.names))
    rng = random.Random(seed)
    return [[rng.choice(actions) for _ in range(depth)] for _ in range(n)]


@pytest.mark.parametrize("name", ["transformer", "gnn", "scanned_transformer"])
def test_random_action_chains_propagate_and_score_exactly(name):
    """Chains of random group actions, each applied to its parent's state: incremental propagation reaches
    the same state (dims, provenance, conflicts) as full propagation, and the estimator, scoring each state
    from its parent's, gives the simulation of the lowered program."""
    mesh = MESHES["2x4"]
    m, ins = model(name)
    start = pc.jit(m.step, mesh, []).lower(*ins)
    graph, rules = start.graph, start.rules
    est = Estimator(graph, rules, mesh)
    est.score((), start.states[0])
    scored = 0
    for chain in random_sets(graph, rules, mesh, seed=7, n=6, depth=3):
        key, state = (), start.states[0]
        for j, action in enumerate(chain):
            tactic = action.tactic
            fast, full = state.copy(), state.copy()
            before = {v: list(fast.dims[v]) for _, v, _ in tactic.matches(graph)}
            for s in (fast, full):
                tactic.apply(graph, s, mesh, 1 + j / 1000)
            changed = {v for v, dims in before.items() if fast.dims[v] != dims}
            propagate(graph, rules, full, mesh, 1 + j / 1000)
            propagate_changes(est.structure, fast, mesh, 1 + j / 1000, changed)
            assert fast.dims == full.dims and fast.prov == full.prov
            assert [str(c) for c in fast.conflicts] == [str(c) for c in full.conflicts]
            try:
                want = simulate(lower(graph, analyze(graph, rules, full, mesh), mesh))
            except redist.ShardingError:
                with pytest.raises(redist.ShardingError):
                    est.score(key + (action,), fast, key)
                break
            got = est.score(key + (action,), fast, key)
            assert (got.step_time_s, got.peak_bytes, got.comm_bytes) == \
                (want.step_time_s, want.peak_bytes, want.comm_bytes)
            key, state, scored = key + (action,), fast, scored + 1
    assert scored >= 10
    assert est.memo.hits > 0  # the passes share op candidates


def test_ops_of_one_layer_shape_share_a_signature_and_their_choices():
    """The transformer's two layers run the same ops on values of the same shapes: each op of layer 1's MLP has
    the signature of its layer-0 counterpart (and an op of another shape does not), and scoring a state made
    by batch parallelism from scratch reuses choices made for another op of one signature, with the figures of
    the lowered program."""
    mesh = MESHES["2x4"]
    m, ins = model("transformer")
    start = pc.jit(m.step, mesh, []).lower(*ins)
    graph, rules = start.graph, start.rules
    structure = Structure(graph, rules)
    w1 = [graph.invars[graph.in_paths.index(f"params/layers/{k}/w1")] for k in (0, 1)]
    readers = [[i for i, _ in structure.readers[v]] for v in w1]
    assert len(readers[0]) == len(readers[1]) > 0
    assert [structure.signature[i] for i in readers[0]] == [structure.signature[i] for i in readers[1]]
    w2 = graph.invars[graph.in_paths.index("params/layers/0/w2")]  # (4d, d), w1 is (d, 4d)
    assert {structure.signature[i] for i, _ in structure.readers[w2]}.isdisjoint(
        structure.signature[i] for i in readers[0])
    state = schedule_state(graph, rules, mesh, schedules.schedule("BP", m, ins, mesh=mesh))
    est = Estimator(graph, rules, mesh)
    got = est.score("BP", state)
    want = pc.jit(m.step, mesh, schedules.schedule("BP", m, ins, mesh=mesh)).lower(*ins).simulate()
    assert (got.step_time_s, got.peak_bytes, got.comm_bytes) == (want.step_time_s, want.peak_bytes, want.comm_bytes)
    assert est.memo.shared > 0
    ops = est.analysis("BP again", state, "BP").ops
    assert all(op.rule is rules[i] for i, op in enumerate(ops))  # a shared choice carries its own op's rule
