"""AutomaticPartition: dimension groups, MCTS determinism and budgets, composition with manual tactics."""

import time

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import redist  # noqa: E402
from tests.partir_helpers import assert_same, model_and_inputs  # noqa: E402
import partir_core as pc  # noqa: E402
from partir_core import schedules  # noqa: E402
from partir_core.analysis import analyze_groups  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)", allow_module_level=True)

MESH = redist.Mesh({"batch": 2, "model": 4})
MESH3 = redist.Mesh({"batch": 2, "model": 2, "z": 2})
MP = pc.ManualPartition
AP = pc.AutomaticPartition


def bp_budget(name, mesh, fraction=0.8):
    m, ins, _ = model_and_inputs(name)
    bp = pc.jit(m.step, mesh, schedules.schedule("BP", m, ins, mesh=mesh)).lower(*ins).simulate()
    return int(fraction * bp.peak_bytes)


def auto(**kw):
    kw.setdefault("progress", False)
    return AP(**kw)


def test_groups_shrink_the_action_space_and_join_megatron_dims():
    m, ins, _ = model_and_inputs("mlp")
    low = pc.jit(m.step, MESH, []).lower(*ins)
    dg = analyze_groups(low.graph, low.rules)
    space = dg.action_space(MESH, ["batch", "model"])
    assert space["values_dims_axes"] > 10 * space["decisions_axes"] > 0
    assert space["input_dims_axes"] > space["groups_axes"] >= space["decisions_axes"]
    v = dict(zip(low.graph.in_paths, low.graph.invars))

    def gid(path, d):
        return dg.find(v[path], d).id

    # the hidden dim: w1's output dim, b1, w2's input dim (and their momenta) are one group
    hidden = gid("params/w1", 1)
    assert gid("params/b1", 0) == gid("params/w2", 0) == gid("momentum/w1", 1) == hidden
    assert gid("params/w1", 0) != hidden and gid("params/w2", 1) != hidden
    assert gid("x", 0) == gid("y", 0) != hidden  # the batch dim
    assert gid("params/w2", 1) == gid("y", 1) == gid("params/b2", 0)  # the output dim
    assert dg.groups[hidden].rep == ("params/w1", 1)  # parameters first, the largest
    assert len(dg.macro) == 4 and not dg.conflicts


def test_transformer_layer_grouping_and_conflicts():
    m, ins, _ = model_and_inputs("transformer")
    low = pc.jit(m.step, MESH, []).lower(*ins)
    dg = analyze_groups(low.graph, low.rules)
    space = dg.action_space(MESH, ["batch", "model"])
    assert space["groups_axes"] > space["decisions_axes"]  # layers merged
    sigs = {m_.signature for m_ in dg.macro}
    assert any("params/layers/*/w1:1" in s and "params/layers/*/w2:0" in s for s in sigs)  # MLP hidden
    assert any("params/layers/*/wq:1" in s and "params/layers/*/wo:0" in s for s in sigs)  # heads
    assert dg.conflicts  # the sequence dim appears twice in the attention scores
    assert "conflict" in dg.report(MESH, ["batch", "model"])


def test_mlp_result_runs_equals_and_rediscovers_megatron():
    m, ins, want = model_and_inputs("mlp")
    budget = bp_budget("mlp", MESH)
    pf = pc.jit(m.step, MESH, [auto(axes=["batch", "model"], memory_budget_bytes=budget, time_budget_s=30)])
    low = pf.lower(*ins)
    res = low.automatic
    assert res is not None and res.tactics and all(isinstance(t, MP) for t in res.tactics)
    assert res.peak_bytes <= budget and low.simulate().peak_bytes <= budget
    assert res.action_space["values_dims_axes"] > res.action_space["decisions_axes"]
    w1, w2 = low.input_type("params/w1").dims, low.input_type("params/w2").dims
    assert set(w1[1]) & set(w2[0])  # column-split w1, row-split w2 on a common axis
    assert res.text == low.after(1) and "ManualPartition(" in res.code
    assert_same(pf(*ins), want)


def test_deterministic_for_a_seed():
    m, ins, _ = model_and_inputs("gnn")
    budget = bp_budget("gnn", MESH3)

    def run(seed):
        t = auto(axes=["batch", "model", "z"], memory_budget_bytes=budget, seed=seed, max_evals=25,
                 patience=1000, time_budget_s=60)
        res = pc.jit(m.step, MESH3, [t]).lower(*ins).automatic
        return [str(x) for x in res.tactics], res.step_time_s, res.stats["evaluations"], \
            [h[1:] for h in res.stats["history"]]

    a, b = run(0), run(0)
    assert a == b and a[2] == 25


def test_respects_a_small_time_budget():
    m, ins, _ = model_and_inputs("transformer")
    t0 = time.perf_counter()
    low = pc.jit(m.step, MESH, [auto(axes=["batch", "model"], time_budget_s=2.0, patience=10 ** 6)]).lower(*ins)
    elapsed = time.perf_counter() - t0
    st = low.automatic.stats
    assert st["stopped"] == "time budget" and st["seconds"] < 2.0 + 1.5
    assert elapsed < 10


def test_manual_bp_before_stays_intact():
    m, ins, want = model_and_inputs("gnn")
    budget = bp_budget("gnn", MESH)
    bp = schedules.schedule("BP", m, ins, mesh=MESH)
    pf = pc.jit(m.step, MESH, bp + [auto(axes=["model"], memory_budget_bytes=budget, time_budget_s=30)])
    low = pf.lower(*ins)
    before, after = low.states[1], low.states[2]
    for v, dims in before.dims.items():
        for d, axes in enumerate(dims):
            if axes:  # every decision of the manual tactic is kept (refined at most, never overridden)
                assert tuple(after.dims[v][d][: len(axes)]) == tuple(axes)
                assert after.prov[v][d] == before.prov[v][d]
    assert low.input_type("senders").dims == (("batch",),) and low.input_type("receivers").dims == (("batch",),)
    assert all("batch" not in str(t) for t in low.automatic.tactics)
    assert low.simulate().peak_bytes <= budget
    assert_same(pf(*ins), want)


def test_pasted_tactics_reproduce_the_program():
    m, ins, want = model_and_inputs("gnn")
    budget = bp_budget("gnn", MESH3)
    bp = schedules.schedule("BP", m, ins, mesh=MESH3)
    low = pc.jit(m.step, MESH3, bp + [auto(axes=["model", "z"], memory_budget_bytes=budget,
                                           time_budget_s=30)]).lower(*ins)
    res = low.automatic
    pasted = pc.jit(m.step, MESH3, bp + [eval(str(t), {"ManualPartition": MP}) for t in res.tactics])
    low2 = pasted.lower(*ins)
    assert low2.in_types == low.in_types and low2.out_types == low.out_types
    assert low2.collectives == low.collectives
    assert low2.simulate() == low.simulate()
    assert low2.after(len(low2.states) - 1) == low.after(2) == res.text
    assert low.simulate().step_time_s == pytest.approx(res.step_time_s)
    assert_same(pasted(*ins), want)


def test_tight_budget_fits_or_raises():
    m, ins, want = model_and_inputs("mlp")
    budget = bp_budget("mlp", MESH, fraction=0.25)
    pf = pc.jit(m.step, MESH, [auto(axes=["batch", "model"], memory_budget_bytes=budget, time_budget_s=30)])
    low = pf.lower(*ins)
    assert low.simulate().peak_bytes <= budget < low.automatic.start_peak_bytes
    assert_same(pf(*ins), want)
    with pytest.raises(pc.PartitionError, match="no sharding found within memory_budget_bytes=100"):
        pc.jit(m.step, MESH, [auto(axes=["batch", "model"], memory_budget_bytes=100, time_budget_s=30,
                                   patience=30)]).lower(*ins)


def test_errors_and_no_budget():
    m, ins, _ = model_and_inputs("mlp")
    with pytest.raises(redist.ShardingError, match="'nope'"):
        pc.jit(m.step, MESH, [AP(axes=["nope"])])
    with pytest.raises(pc.PartitionError, match="memory_budget_bytes"):
        pc.jit(m.step, MESH, [AP(memory_budget_bytes=-1)]).lower(*ins)
    # no budget: only time matters; default axes: all of the mesh
    res = pc.jit(m.step, MESH, [auto(time_budget_s=30)]).lower(*ins).automatic
    assert res.step_time_s <= res.start_time_s
