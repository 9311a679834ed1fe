"""Pipeline parallelism (``partir_core.Pipeline``): a layer scan pipelined over a mesh axis, alone and beside
batch parallelism, Megatron and ZeRO on the other axes, equal to the unpipelined step on plain-JAX (``lax.scan``),
flax.linen (``nn.scan``), flax.nnx (``nnx.scan``) and equinox models; the simulated bubble against its formula;
the stacked layers' bytes per device; the picture; the automatic search's pipelines; the user's errors."""

import numpy as np
import pytest

import jax
flax = pytest.importorskip("flax")
optax = pytest.importorskip("optax")
eqx = pytest.importorskip("equinox")
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import redist  # noqa: E402
import partir_core as pc  # noqa: E402
from partir_core import models, schedules  # noqa: E402
from partir_core.automatic import MemoryBudgetError  # noqa: E402
from partir_core.pipeline_schedule import Schedule  # noqa: E402
from redist import cost  # noqa: E402
from tests.partir_core.helpers import assert_same  # noqa: E402


MESH3 = redist.Mesh({"stage": 2, "batch": 2, "model": 2})
MESH4 = redist.Mesh({"stage": 4, "batch": 2})
MP = pc.ManualPartition
slow = pytest.mark.slow


# ------------------------------------------------------------------------------------------ the models
def jax_lm():
    """The plain-JAX LM scanning its stacked layer weights with ``lax.scan``."""
    m = models.scanned_transformer(vocab=32, d_model=16, layers=8, heads=2, seq=8, batch=8)
    ins = m.init(jax.random.key(0))
    batch = {"tokens": 0, "targets": 0}
    mp = schedules.schedule("MP", m, ins, mesh=MESH3)
    z3 = schedules.schedule("Z3", m, ins, mesh=MESH3)
    return m.step, ins, "params/layers/*", batch, mp, z3


class Block(nn.Module):
    """A pre-layernorm MLP block; ``nn.scan`` stacks its parameters over the layers."""

    @nn.compact
    def __call__(self, x, _):
        h = nn.gelu(nn.Dense(32, name="w1")(nn.LayerNorm()(x)))
        return x + nn.Dense(x.shape[-1], name="w2")(h), None


class FlaxLM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(32, 16, name="embed")(tokens)
        scanned = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=8)
        x, _ = scanned(name="layers")(x, None)
        return nn.Dense(32, name="unembed")(nn.LayerNorm()(x))


def flax_lm():
    """A flax.linen LM whose blocks run under ``nn.scan``, trained with optax's momentum SGD."""
    model, opt = FlaxLM(), optax.sgd(0.1, momentum=0.9)

    def step(params, opt_state, tokens, targets):
        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, tokens), targets).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    k = jax.random.split(jax.random.key(1), 2)
    tokens = jax.random.randint(k[0], (8, 8), 0, 32)
    params = model.init(k[1], tokens)
    layers = "params/params/layers"
    mp = [MP({f"{layers}/w1/kernel": 2, f"{layers}/w1/bias": 1, f"{layers}/w2/kernel": 1}, axis="model")]
    return step, (params, opt.init(params), tokens, jnp.roll(tokens, -1, 1)), f"{layers}/*", \
        {"tokens": 0, "targets": 0}, mp, []


class EqxLayer(eqx.Module):
    w1: jax.Array
    w2: jax.Array

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.w1 = jax.random.normal(k1, (16, 32)) / 4
        self.w2 = jax.random.normal(k2, (32, 16)) / 8

    def __call__(self, x):
        return x + jnp.tanh(x @ self.w1) @ self.w2


def eqx_mlp():
    """An equinox residual MLP whose layers are stacked by ``eqx.filter_vmap`` and scanned with ``lax.scan``."""
    params, static = eqx.partition(eqx.filter_vmap(EqxLayer)(jax.random.split(jax.random.key(2), 8)), eqx.is_array)

    def step(params, x, y):
        def loss(p):
            h, _ = jax.lax.scan(lambda h, layer: (eqx.combine(layer, static)(h), None), x, p)
            return jnp.mean((h - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    k = jax.random.split(jax.random.key(3), 2)
    mp = [MP({"params/w1": 2, "params/w2": 1}, axis="model")]
    return step, (params, jax.random.normal(k[0], (16, 16)), jax.random.normal(k[1], (16, 16))), "params/*", \
        {"x": 0, "y": 0}, mp, []


class NnxBlock(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(16, 16, rngs=rngs)

    def __call__(self, x):
        return x + jnp.tanh(self.lin(x))


def nnx_mlp():
    """A flax.nnx model of blocks made by ``nnx.vmap`` and run by ``nnx.scan`` (which returns the blocks'
    state as its per-layer outputs)."""
    @nnx.split_rngs(splits=8)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return NnxBlock(rngs)

    graphdef, params = nnx.split(make(nnx.Rngs(0)))

    def step(params, x, y):
        def loss(p):
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def run(h, block):
                return block(h)

            return jnp.mean((run(x, nnx.merge(graphdef, p)) - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    k = jax.random.split(jax.random.key(4), 2)
    mp = [MP({"params/lin/kernel/value": 2, "params/lin/bias/value": 1}, axis="model")]
    return step, (params, jax.random.normal(k[0], (16, 16)), jax.random.normal(k[1], (16, 16))), "params/*", \
        {"x": 0, "y": 0}, mp, []


ZOO = {"jax_lm": jax_lm, "flax_lm": flax_lm, "eqx_mlp": eqx_mlp, "nnx_mlp": nnx_mlp}
_BUILT: dict = {}


def built(name):
    """``(step, inputs, layers pattern, batch dims, Megatron, ZeRO-3, unpartitioned result)``, once per session."""
    if name not in _BUILT:
        step, ins, layers, batch, mp, z3 = ZOO[name]()
        _BUILT[name] = (step, ins, layers, batch, mp, z3, jax.jit(step)(*ins))
    return _BUILT[name]


def pipeline(name, **kw):
    _, _, layers, batch, *_ = built(name)
    return pc.Pipeline(layers=layers, batch=batch, **kw)


# ------------------------------------------------------------------------------------------ equality
GPIPE = {"axis": "stage", "microbatches": 4}
CIRCULAR = {"axis": "stage", "microbatches": 2, "schedule": "circular", "repeats": 2}
CASES = [
    ("jax_lm", MESH4, GPIPE, ""), pytest.param("jax_lm", MESH3, CIRCULAR, "", marks=slow),
    pytest.param("jax_lm", MESH3, GPIPE, "BP+MP", marks=slow), ("jax_lm", MESH3, CIRCULAR, "BP+MP"),
    pytest.param("jax_lm", MESH3, GPIPE, "BP+MP+Z3", marks=slow),
    pytest.param("jax_lm", MESH3, {**GPIPE, "remat": True}, "BP", marks=slow),
    ("flax_lm", MESH3, GPIPE, "BP+MP"), pytest.param("flax_lm", MESH3, CIRCULAR, "", marks=slow),
    pytest.param("eqx_mlp", MESH4, GPIPE, "", marks=slow), ("eqx_mlp", MESH3, CIRCULAR, "BP+MP"),
    ("nnx_mlp", MESH3, GPIPE, "BP"), pytest.param("nnx_mlp", MESH3, CIRCULAR, "BP", marks=slow),
]


@pytest.mark.parametrize("name,mesh,kw,composed", CASES)
def test_pipelined_step_equals_the_unpartitioned_step(name, mesh, kw, composed):
    """Loss and updated parameters equal the unpartitioned step's; the stacked layers are split over the stage
    axis (and so is their optimizer state), every rotation is a collective permute over it, and nothing else
    is gathered over it."""
    step, ins, _, batch, mp, z3, want = built(name)
    schedule = [pipeline(name, **kw)]
    if "BP" in composed:
        schedule.append(MP(batch, axis="batch"))
    if "MP" in composed:
        schedule += mp
    if "Z3" in composed:
        schedule += z3
    pf = pc.jit(step, mesh, schedule)
    low = pf.lower(*ins)
    assert not low.unsupported and not low.fallbacks
    assert "Z3" in composed or not low.conflicts  # ZeRO-3 splits weights on the batch axis, which their readers meet
    stacked = [p for p, _ in low.graph.inputs_matching(schedule[0].layers)]
    assert stacked and all(low.input_type(p).dims[0] == ("stage",) for p in stacked)
    on_stage = [c for c in low.collectives if "stage" in c.axes]
    assert {c.kind for c in on_stage} <= {"permute", "all_reduce"}
    rotations = [c for c in on_stage if c.kind == "permute" and c.trips > 1]
    ticks = kw["microbatches"] * kw.get("repeats", 1) + mesh.axis_size("stage") - 1
    assert len(rotations) == 2 and all(c.trips == ticks for c in rotations)  # forward and backward loops
    assert_same(pf(*ins), want)


# ------------------------------------------------------------------------------------------ simulation
@pytest.mark.parametrize("mesh,kw", [
    (MESH4, {"microbatches": 1}), (MESH4, {"microbatches": 4}), (MESH4, {"microbatches": 8}),
    (MESH3, {"microbatches": 2, "schedule": "circular", "repeats": 2}),
    (MESH3, {"microbatches": 4, "schedule": "circular", "repeats": 2}),
])
def test_simulated_bubble_matches_the_formula(mesh, kw):
    """The simulator's bubble (the ticks each stage idles, over the pipelined loops' time) is (S - 1) /
    (M·R + S - 1) within 2 percentage points, and the simulation carries the schedule it pictures."""
    step, ins, *_ = built("jax_lm")
    sim = pc.jit(step, mesh, [pipeline("jax_lm", axis="stage", **kw)]).lower(*ins).simulate()
    S, M, R = mesh.axis_size("stage"), kw["microbatches"], kw.get("repeats", 1)
    assert sim.pipeline == Schedule(kw.get("schedule", "gpipe"), S, M, R, 8, "stage")
    assert sim.bubble_fraction == pytest.approx((S - 1) / (M * R + S - 1), abs=0.02)
    assert 0 < sim.bubble_time_s < sim.pipeline_time_s < sim.step_time_s


def test_more_microbatches_shrink_the_bubble_and_circular_shrinks_it_more():
    step, ins, *_ = built("jax_lm")
    sims = {(s, m): pc.jit(step, MESH4, [pipeline("jax_lm", axis="stage", microbatches=m, schedule=s,
                                                   repeats=2 if s == "circular" else 1)]).lower(*ins).simulate()
            for s, m in (("gpipe", 4), ("gpipe", 8), ("circular", 4))}
    assert sims["gpipe", 8].bubble_fraction < sims["gpipe", 4].bubble_fraction
    assert sims["circular", 4].bubble_fraction < sims["gpipe", 4].bubble_fraction
    assert sims["circular", 4].bubble_time_s < sims["gpipe", 4].bubble_time_s


def test_stacked_layers_take_one_stage_share_of_batch_parallelism_bytes():
    """Per device, every stacked input (weights and optimizer state) holds 1/S of what batch parallelism
    holds (it keeps them whole), and the simulated peak counts the microbatch activations kept for the
    backward pass: the forward loop's stacked residuals."""
    step, ins, _, batch, *_ = built("jax_lm")
    bp = pc.jit(step, MESH4, [MP(batch, axis="batch")]).lower(*ins)
    pp = pc.jit(step, MESH4, [pipeline("jax_lm", axis="stage", microbatches=4), MP(batch, axis="batch")]).lower(*ins)
    stacked = [p for p in pp.graph.in_paths if "/layers/" in p]
    assert stacked
    for p in stacked:
        assert pp.input_type(p).local_bytes * 4 == bp.input_type(p).local_bytes
    forward = next(r for r in pp.graph.regions if r.parent is None and r.trips == 7 and not r.params["reverse"])
    exit_ = pp.graph.eqns[forward.exit]
    residuals = sum(pp.program.buf_bytes[exit_.outvars[o]] for o, _, stacked in exit_.params["ties"] if stacked)
    sim = pp.simulate()
    assert residuals > 0 and sim.temp_bytes + sim.output_bytes >= residuals


def test_schedule_picture():
    step, ins, *_ = built("jax_lm")
    sim = pc.jit(step, MESH4, [pipeline("jax_lm", axis="stage", microbatches=4)]).lower(*ins).simulate()
    lines = sim.schedule_picture().splitlines()
    assert lines[0].startswith("GPipe pipeline over stage: 4 stages, 4 microbatches, 8 layers; 7 ticks")
    assert lines[2].split() == ["stage", "0", "(layers", "0-1)", "0", "1", "2", "3", ".", ".", "."]
    assert lines[5].split()[-7:] == [".", ".", ".", "0", "1", "2", "3"]
    circular = Schedule("circular", 4, 4, 2, 8, "stage").picture().splitlines()
    assert circular[2].split() == ["stage", "0", "(layers", "0,", "4)", "0a", "1a", "2a", "3a", "0b", "1b", "2b",
                                   "3b", ".", ".", "."]
    with pytest.raises(redist.ShardingError, match="no pipeline"):
        pc.jit(step, MESH4, []).lower(*ins).simulate().schedule_picture()


# ------------------------------------------------------------------------------------------ composition
def test_automatic_partition_inside_the_stages():
    """A search scheduled after a Pipeline partitions every stage on the other axes; its scores are the
    lowered program's."""
    step, ins, _, _, _, _, want = built("eqx_mlp")
    pf = pc.jit(step, MESH3, [pipeline("eqx_mlp", axis="stage", microbatches=4),
                              pc.AutomaticPartition(axes=["batch", "model"], max_evals=20, progress=False)])
    low = pf.lower(*ins)
    sim = low.simulate()
    assert (low.automatic.step_time_s, low.automatic.peak_bytes) == (sim.step_time_s, sim.peak_bytes)
    assert sim.pipeline is not None
    assert_same(pf(*ins), want)


SLOW_NETWORK = pc.Hardware("slow network", peak_flops=1e10, hbm_bw=1e11, network=cost.Link(1e-4, 1e8),
                           op_overhead_s=1e-6)


@pytest.mark.parametrize("hardware", [SLOW_NETWORK, None])
def test_automatic_partition_pipelines_where_the_simulator_ranks_a_pipeline_best(hardware):
    """The search tries pipelines (stage axis, microbatches, schedule) beside its SPMD result: its result is a
    pipeline exactly when one simulates faster. Over a network slow against the compute (Megatron's and batch
    parallelism's collectives cost more than a bubble) it is, and the result runs and equals the step; on the
    host's own profile Megatron is faster."""
    m = models.scanned_transformer(vocab=32, d_model=64, layers=8, seq=8, batch=8)
    ins = m.init(jax.random.key(0))
    mesh = redist.Mesh({"batch": 2, "model": 4})
    pf = pc.jit(m.step, mesh, [pc.AutomaticPartition(axes=["model"], max_evals=15, progress=False,
                                                     hardware=hardware)])
    low = pf.lower(*ins)
    res = low.automatic
    fastest = min(t for _, t, _ in res.stats.pipelines)
    pipelined = isinstance(res.tactics[0], pc.Pipeline)
    assert pipelined == (fastest < res.stats.spmd[0])
    assert res.step_time_s == low.simulate(hardware).step_time_s == min(fastest, res.stats.spmd[0])
    assert pipelined == (hardware is SLOW_NETWORK)
    if pipelined:
        assert res.code.splitlines()[1].strip().startswith("Pipeline(layers='params/layers/*'")
        assert res.candidates[0].pipeline == res.tactics[0] and res.candidates[0].tactics == res.tactics
        assert "     - Pipeline(layers='params/layers/*'" in res.summary().split("runners-up")[1]
        assert_same(pf(*ins), jax.jit(m.step)(*ins))


def test_pipelines_are_tried_within_the_time_budget(monkeypatch):
    """The time budget counts from the start of the lowering: where it has run out when the search ends, no
    pipeline is tried, the result says how many were left, and the search's own result is lowered."""
    import time
    from types import SimpleNamespace

    from partir_core import partition

    m = models.scanned_mlp(batch=8, d=16, hidden=32, layers=2)
    ins = m.init(jax.random.key(0))
    monkeypatch.setattr(partition, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() - 100.0))
    pf = pc.jit(m.step, redist.Mesh({"batch": 4, "model": 2}),
                [pc.AutomaticPartition(axes=["model"], time_budget_s=10, progress=False)])
    res = pf.lower(*ins).automatic
    assert res.stats.pipelines == [] and res.stats.pipelines_left > 0
    assert not any(isinstance(t, pc.Pipeline) for t in res.tactics)


def test_memory_budget_error_carries_the_search_result():
    """Over the budget, the error carries the search's result of the smallest peak, with its candidates and
    summary, as a result that fits has them."""
    m = models.mlp()
    ins = m.init(jax.random.key(0))
    with pytest.raises(MemoryBudgetError) as info:
        pc.jit(m.step, MESH3, [pc.AutomaticPartition(memory_budget_bytes=100, max_evals=10,
                                                     progress=False)]).lower(*ins)
    res = info.value.result
    assert res.peak_bytes > 100 and res.candidates[0].actions == tuple(res.actions) and not res.candidates[0].fits
    assert res.summary().startswith(f"chosen: {len(res.tactics)} tactic")


def test_automatic_partition_is_unchanged_without_a_layer_scan():
    m = models.mlp()
    ins = m.init(jax.random.key(0))
    res = pc.jit(m.step, MESH3, [pc.AutomaticPartition(max_evals=10, progress=False)]).lower(*ins).automatic
    assert res.stats.pipelines == [] and res.stats.spmd is None
    assert not any(isinstance(t, pc.Pipeline) for t in res.tactics)


# ------------------------------------------------------------------------------------------ errors
def unrolled():
    m = models.transformer(vocab=32, d_model=16, layers=2, heads=2, seq=8, batch=8)
    return m.step, m.init(jax.random.key(0))


@pytest.mark.parametrize("make,kw,match", [
    ("jax_lm", {"axis": "stage", "microbatches": 2, "schedule": "circular", "repeats": 4},
     r"the layer scan over params/layers/\S+, .* has 8 layers, not divisible by 4 stages \(axis 'stage'\) x 4 "
     r"repeats"),
    ("jax_lm", {"axis": "stage", "microbatches": 3}, r"the batch of 8 examples \(dim 0 of input 'tokens'\) is not "
                                                      r"divisible by 3 microbatches"),
    ("jax_lm", {"axis": "stage", "microbatches": 2, "schedule": "circular", "repeats": 2},
     r"a circular schedule needs at least as many microbatches as stages: 2 microbatches, 4 stages"),
    ("jax_lm", {"axis": "stage", "layers": "params/blocks/*"}, r"layers='params/blocks/\*' matches no input"),
    ("jax_lm", {"axis": "stage", "layers": "params/*"}, r"matches params/embed, .*which the layer scan does not "
                                                        r"iterate over"),
    ("unrolled", {"axis": "stage"}, r"no layer scan: no jax.lax.scan iterates over params/layers/0/\S+.*unrolled by "
                                    r"a Python loop are not supported"),
])
def test_errors_name_the_numbers_and_paths(make, kw, match):
    if make == "unrolled":
        step, ins = unrolled()
        kw = {"layers": "params/layers/*", "batch": {"tokens": 0}, **kw}
    else:
        step, ins, layers, batch, *_ = built(make)
        kw = {"layers": layers, "batch": batch, **kw}
    with pytest.raises(pc.PartitionError, match=match):
        pc.jit(step, MESH4, [pc.Pipeline(**kw)]).lower(*ins)


@pytest.mark.parametrize("kw,match", [
    ({"layers": 3, "axis": "stage"}, r"layers must be a path pattern"),
    ({"layers": "p/*", "axis": "stage", "microbatches": 0}, r"microbatches must be an int >= 1, got 0"),
    ({"layers": "p/*", "axis": "stage", "schedule": "1f1b"}, r"schedule must be 'gpipe' or 'circular', got '1f1b'"),
    ({"layers": "p/*", "axis": "stage", "repeats": 2}, r"repeats must be 1 for schedule='gpipe'"),
    ({"layers": "p/*", "axis": "stage", "microbatches": 2}, r"batch must be the inputs to split into microbatches"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(pc.PartitionError, match=match):
        pc.Pipeline(**kw)


def test_a_schedule_pipelines_one_layer_scan_on_a_mesh_axis():
    step, ins, layers, batch, *_ = built("eqx_mlp")
    with pytest.raises(pc.PartitionError, match=r"Pipeline: unknown mesh axis 'pipe'"):
        pc.jit(step, MESH4, [pc.Pipeline(layers=layers, axis="pipe")])
    two = [pc.Pipeline(layers=layers, axis="stage"), pc.Pipeline(layers=layers, axis="batch")]
    with pytest.raises(pc.PartitionError, match=r"a schedule pipelines one layer scan: it has 2 Pipeline tactics"):
        pc.jit(step, MESH4, two).lower(*ins)


def test_a_layer_scan_with_per_layer_outputs_is_refused():
    def step(w, x):
        h, ys = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), jnp.sum(h)), x, w)
        return h.sum() + ys.sum()

    w, x = jnp.ones((4, 8, 8)) / 8, jnp.ones((8, 8))
    with pytest.raises(pc.PartitionError, match=r"returns per-layer outputs \(ys\) computed by its body"):
        pc.jit(step, MESH4, [pc.Pipeline(layers="w", axis="stage", microbatches=2, batch="x")]).lower(w, x)
