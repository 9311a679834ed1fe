"""Partitioned.verify: a scanned reference model's training step under batch and Megatron parallelism (a loop
body proved once) and a pipelined one (the stage rotation proved by running it on element ids) are proved; a
rotation to the wrong stage is refuted; a reference that differs by one op is refuted, naming that op by its
source line, with an output that differs on random inputs; one that differs only in form (``y * 2`` against
``y + y``) is undecided, never refuted; a program the walk cannot prove (a wrong local form) is refuted where a
run differs from its function, naming the op where the walk stopped; ``jit(verify=True)`` refuses what it cannot
prove. Every zoo, bench and pipeline program under every schedule: ``bench/verify_programs.py``; mutants of
lowered programs: ``./dev proofs partitioned``."""

import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import redist
import partir_core as pc
from partir_core import models, permutation, registry, schedules
from partir_core.proof import reference

MESH = redist.Mesh({"batch": 2, "model": 4})
STAGES = redist.Mesh({"stage": 4, "batch": 2})


def test_a_scanned_model_under_batch_and_megatron_parallelism_is_proved():
    m = models.scanned_mlp()
    ins = m.init(jax.random.key(0))
    low = pc.jit(m.step, MESH, schedules.schedule("BP+MP", m, ins, mesh=MESH)).lower(*ins)
    v = low.verify(timeout_s=60)
    assert v.status == "proved", v.reason
    assert v.details["local ops"] > 0 and v.details["plans verified"] > 0
    assert v.details["loops"] == 2  # the forward and backward scans, each body once


def layered(act=jnp.tanh):
    """A training step of a residual MLP whose 8 stacked layers run in one ``lax.scan``."""
    def step(w, x):
        def loss(w):
            h, _ = jax.lax.scan(lambda h, wi: (h + act(h @ wi), None), x, w)
            return jnp.mean(h * h)

        value, g = jax.value_and_grad(loss)(w)
        return w - 0.1 * g, value

    return step


def lower_pipelined(schedule="gpipe", repeats=1):
    pipe = pc.Pipeline(layers="w", axis="stage", microbatches=4, schedule=schedule, repeats=repeats, batch="x")
    pf = pc.jit(layered(), STAGES, [pipe, pc.ManualPartition({"x": 0}, axis="batch")])
    x = jax.random.normal(jax.random.key(0), (16, 8))
    return pf.lower(jax.random.normal(jax.random.key(1), (8, 8, 8)) / 8, x)


@pytest.fixture(scope="module")
def gpipe():
    return lower_pipelined()


@pytest.mark.parametrize("schedule,repeats,loops", [("gpipe", 1, 4), ("circular", 2, 2)])
def test_pipelined_programs_are_proved(gpipe, schedule, repeats, loops):
    """GPipe: 2 layers per stage, scanned inside each tick; circular: 1 layer per stage and repeat."""
    low = gpipe if schedule == "gpipe" else lower_pipelined(schedule, repeats)
    v = low.verify(timeout_s=60)
    assert v.status == "proved", v.reason
    assert "permutation" in v.details["lemmas"]
    assert v.details["loops"] == loops  # forward and backward: the tick loop (and the stage's layer scan)


def test_a_pipelined_program_is_checked_against_a_reference_pipelined_alike(gpipe):
    """The reference is traced with its layer scan pipelined as the program's: the same step aligns, one with
    another activation in its layers is refuted in the layer's body."""
    assert gpipe.verify(reference=layered()).status == "proved"
    v = gpipe.verify(reference=layered(jax.nn.relu))
    assert v.status == "refuted", v.reason
    assert "test_verify.py" in v.counterexample["source"] and "<lambda>" in v.counterexample["source"]


def test_a_rotation_to_the_wrong_stage_is_refuted_where_the_walk_stops(monkeypatch):
    """The permutation's local form made to move every row one rotation further (two stages)."""
    original = registry.RULES["permute_dim"]

    def twice(eqn, shapes, out_shapes):
        rule = original(eqn, shapes, out_shapes)

        def local(ctx, x):
            perm = ctx.eqn.params["perm"]
            again = dataclasses.replace(ctx.eqn, params={**ctx.eqn.params, "perm": tuple(perm[p] for p in perm)})
            return permutation.local(dataclasses.replace(ctx, eqn=again), x)

        return dataclasses.replace(rule, local=local)

    monkeypatch.setitem(registry.RULES, "permute_dim", twice)
    v = lower_pipelined().verify(timeout_s=60)
    assert v.status == "refuted" and "permutation" in v.reason, v.reason
    cx = v.counterexample
    assert "(permute_dim" in cx["op"] and cx["program"] != pytest.approx(cx["reference"])


def test_a_wrong_local_form_is_refuted_naming_its_op_and_a_right_one_is_proved(monkeypatch):
    """A matmul whose local form doubles its block: the walk stops there, and a run on random inputs differs
    from the traced function's."""
    original = registry.RULES["dot_general"]

    def doubling(eqn, shapes, out_shapes):
        rule = original(eqn, shapes, out_shapes)
        if rule is None:
            return None
        local = rule.local or registry.bind
        return dataclasses.replace(rule, local=lambda ctx, *xs: [2 * y for y in local(ctx, *xs)])

    def lower():
        pf = pc.jit(block(), MESH, [pc.ManualPartition({"w1": 1}, axis="model")])
        return pf.lower(jnp.ones((16, 16)), jnp.ones((16, 16)), jnp.ones((16, 16)))

    assert lower().verify().status == "proved"
    monkeypatch.setitem(registry.RULES, "dot_general", doubling)
    v = lower().verify()
    assert v.status == "refuted", v.reason
    cx = v.counterexample
    assert "(dot_general at " in cx["op"] and "test_verify.py" in cx["source"] and cx["inputs"] == 0
    assert cx["program"] != pytest.approx(cx["reference"])


def lower_transposing_reshape(dim, axis):
    """``lax.reshape`` with ``dimensions``: its operand transposed first, then regrouped (8, 16) -> (16, 2, 4);
    the operand split on ``dim`` over ``axis``."""
    def f(x):
        return jnp.tanh(lax.reshape(x * 2, (16, 2, 4), dimensions=(1, 0)))

    pf = pc.jit(f, MESH, [pc.ManualPartition({"x": dim}, axis=axis)])
    return pf.lower(jnp.arange(128.0).reshape(8, 16))


@pytest.mark.parametrize("dim,axis", [(0, "batch"), (1, "model")])
def test_a_reshape_that_transposes_first_is_proved_and_one_that_skips_the_transpose_refuted(monkeypatch, dim, axis):
    """Each device reshapes its block, transposed by ``dimensions`` as the global op is; a local form that
    reshapes the block untransposed is refuted there."""
    low = lower_transposing_reshape(dim, axis)
    reshape = next(i for i, e in enumerate(low.graph.eqns) if e.name == "reshape")
    assert low.program.analysis.ops[reshape].use  # split, not gathered first
    v = low.verify()
    assert v.status == "proved" and "reshape" in v.details["lemmas"], v.reason
    original = registry.RULES["reshape"]

    def untransposed(eqn, shapes, out_shapes):
        rule = original(eqn, shapes, out_shapes)
        return dataclasses.replace(rule, local=lambda ctx, x: registry.bind(
            ctx, x, new_sizes=tuple(ctx.out_shapes[0]), dimensions=None, sharding=None))

    monkeypatch.setitem(registry.RULES, "reshape", untransposed)
    v = lower_transposing_reshape(dim, axis).verify()
    assert v.status == "refuted" and "(reshape at " in v.counterexample["op"], v.reason


def lower_conv():
    """A convolution (NCHW, OIHW) split on its batch and on its input channels: a pending sum over ``model``."""
    def conv(x, w):
        return jnp.tanh(lax.conv_general_dilated(x, w, (1, 1), "SAME"))

    pf = pc.jit(conv, MESH, [pc.ManualPartition({"x": 0}, axis="batch"),
                             pc.ManualPartition({"x": 1, "w": 1}, axis="model")])
    x, w = jax.random.normal(jax.random.key(0), (4, 8, 6, 6)), jax.random.normal(jax.random.key(1), (6, 8, 3, 3))
    return pf.lower(x, w)


def test_a_convolution_split_on_batch_and_channels_is_proved_and_its_sum_reduced_as_a_max_is_refuted(monkeypatch):
    v = lower_conv().verify()
    assert v.status == "proved" and v.details["plans verified"] >= 1, v.reason
    original = registry.RULES["conv_general_dilated"]

    def as_max(*args):
        rule = original(*args)
        return dataclasses.replace(rule, reduce=dict.fromkeys(rule.reduce, "max"))

    monkeypatch.setitem(registry.RULES, "conv_general_dilated", as_max)
    v = lower_conv().verify()
    assert v.status == "refuted" and "(conv_general_dilated at " in v.counterexample["op"], v.reason


def test_a_witness_is_a_difference_beyond_the_references_own_rounding(monkeypatch):
    """The reference ``(x + c) - c`` with ``c = 1e5`` rounds ``x`` to float32's grid at 1e5 (steps of 1/128); a
    program that rounds it to the grid at 2e5 (steps of 1/64) differs from it by more than RTOL and ATOL, but not
    beyond :data:`NOISE_FACTOR` times the reference's own rounding (its float32 run against its float64 one), so
    that is no witness; a program off by 2 is one."""
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    leaves = [x, np.float32(1e5)]
    coarser = (x + np.float32(2e5)) - np.float32(2e5)

    def run_reference(leaves):
        return [jax.jit(lambda x, c: (x + c) - c)(*leaves)]

    assert not np.allclose(run_reference(leaves)[0], coarser, rtol=reference.RTOL, atol=reference.ATOL)
    assert reference.witness(lambda leaves: [coarser], run_reference, [leaves]) is None
    found = reference.witness(lambda leaves: [x + 2], run_reference, [leaves])
    assert found["output"] == 0 and found["inputs"] == 0
    assert abs(found["program"] - found["reference"]) > 1.9
    monkeypatch.setattr(reference, "NOISE_FACTOR", 0)  # rounding counted as a difference: a witness
    assert reference.witness(lambda leaves: [coarser], run_reference, [leaves]) is not None


def test_a_witness_draws_indices_past_every_block_and_keeps_arithmetic_inputs_small():
    """Integer inputs read only as indices range over the dims and past both ends in the witness's later draws;
    one that feeds arithmetic (a step count in a power) does not, nor does any where an op promises its indices
    in bounds."""
    def step(table, ids, count):
        return jnp.take(table, ids + 1, axis=0, mode="fill"), 0.9 ** count

    graph = pc.jit(step, MESH, []).lower(jnp.ones((16, 4)), jnp.zeros(6, jnp.int32), jnp.int32(3)).graph
    assert reference.index_inputs(graph) == [graph.invars[1]]
    draws = list(reference.witness_inputs(graph))
    assert len(draws) == 1 + reference.WIDE_SEEDS
    ids = np.concatenate([d[1] for d in draws[1:]])
    assert ids.min() < 0 and ids.max() >= 16 and all(0 <= d[2] < 3 for d in draws)
    def histogram(t, i, u):
        return t.at[i].add(u, mode="drop").astype(jnp.float32) * 0.5

    scatter = pc.jit(histogram, MESH, []).lower(jnp.zeros(16, jnp.int32), jnp.zeros(6, jnp.int32),
                                                jnp.ones(6, jnp.int32)).graph
    assert reference.index_inputs(scatter) == [scatter.invars[1]]  # the updates are values, not indices
    promised = pc.jit(lambda t, i: t[i], MESH, []).lower(jnp.ones((16, 4)), jnp.zeros(6, jnp.int32)).graph
    assert len(list(reference.witness_inputs(promised))) == 1


def block(transposed=False, residual=True, axis=1, scale=0.5, act=jnp.tanh, doubled=False):
    """A residual block's loss, or the same with one op changed."""
    def loss(w1, w2, x):
        h = act(x @ (w1.T if transposed else w1))
        y = h @ w2
        y = x + y if residual else y
        y = y + y if doubled else y * 2
        return scale * jnp.sum(y * y, axis=axis)

    return loss


@pytest.fixture(scope="module")
def lowered():
    pf = pc.jit(block(), MESH, [pc.ManualPartition({"x": 0}, axis="batch"),
                                pc.ManualPartition({"w1": 1, "w2": 0}, axis="model")])
    return pf.lower(jnp.ones((16, 16)), jnp.ones((16, 16)), jnp.ones((16, 16)))


def test_the_traced_function_and_an_equal_reference_are_proved(lowered):
    assert lowered.verify().status == "proved"
    v = lowered.verify(reference=block())
    assert v.status == "proved" and "aligns" in v.reason


@pytest.mark.parametrize("change,op", [({"transposed": True}, "transpose"), ({"residual": False}, "mul"),
                                       ({"axis": 0}, "reduce_sum"), ({"scale": 0.25}, "mul"),
                                       ({"act": jax.nn.relu}, "max")])
def test_a_reference_one_op_away_is_refuted_naming_it(lowered, change, op):
    v = lowered.verify(reference=block(**change))
    assert v.status == "refuted", v.reason
    cx = v.counterexample
    assert f"({op} at " in cx["op"] and "test_verify.py" in cx["source"] and "loss)" in cx["source"]
    assert cx["program"] != pytest.approx(cx["reference"])


def test_a_bad_timeout_or_reference_is_refused_naming_it(lowered):
    with pytest.raises(redist.ShardingError, match=r"verify: timeout_s must be a number of seconds > 0.*got int -1"):
        lowered.verify(timeout_s=-1)
    with pytest.raises(pc.PartitionError, match=r"verify: the reference '<lambda>' cannot be traced on the step's "
                                                r"arguments: .*takes 1 positional argument but 3 were given"):
        lowered.verify(reference=lambda w1: w1)


def test_a_reference_equal_in_value_but_not_in_form_is_undecided(lowered):
    v = lowered.verify(reference=block(doubled=True))
    assert v.status == "undecided" and "agree on random inputs" in v.reason


def test_jit_verify_runs_what_it_proves_and_refuses_the_rest():
    rows = [pc.ManualPartition({"x": 0}, axis="batch")]
    x = jnp.arange(32.0).reshape(8, 4)
    assert jnp.allclose(pc.jit(lambda x: jnp.tanh(x) * 2, MESH, rows, verify=True)(x), jnp.tanh(x) * 2)
    sort = pc.jit(lambda x: jnp.sort(x, axis=1), MESH, rows, verify=True)
    with pytest.raises(pc.PartitionError, match=r"refuses to run .* undecided: not proved: eqn \d+ \(sort"):
        sort(x)
