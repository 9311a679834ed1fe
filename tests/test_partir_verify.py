"""Partitioned.verify: the partitioned programs of the reference models and of zoo models under the presets are
proved (a loop body once, reshards by redist.verify); a reference that differs by one op is refuted, naming
that op by its source line, with an output that differs on random inputs; one that differs only in form
(``y * 2`` against ``y + y``) is undecided, never refuted; ``jit(verify=True)`` refuses what it cannot prove.
Every model under every preset: ``bench/verify_programs.py``; mutants of lowered programs: ``./dev proofs``."""

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import redist  # noqa: E402
import partir_core as pc  # noqa: E402
from partir_core import schedules  # noqa: E402
from tests.partir_helpers import model_and_inputs  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)", allow_module_level=True)

MESH = redist.Mesh({"batch": 2, "model": 4})


@pytest.mark.parametrize("name,schedule", [("mlp", "BP"), ("mlp", "MP"), ("mlp", "BP+MP"), ("mlp", "Z3"),
                                           ("scanned_mlp", "BP+MP+Z3")])
def test_model_programs_are_proved(name, schedule):
    m, ins, _ = model_and_inputs(name)
    low = pc.jit(m.step, MESH, schedules.schedule(schedule, m, ins, mesh=MESH)).lower(*ins)
    v = low.verify(timeout_s=60)
    assert v.status == "proved", v.reason
    assert v.details["local ops"] > 0 and v.details["plans verified"] > 0
    if name == "scanned_mlp":
        assert v.details["loops"] == 2  # the forward and backward scans, each body once


def test_zoo_program_is_proved():
    zoo = pytest.importorskip("examples.zoo")
    step, ins = zoo.module("eqx_mlp").make()
    low = pc.jit(step, MESH, schedules.schedule("BP+MP", step, ins, mesh=MESH)).lower(*ins)
    assert low.verify(timeout_s=60).status == "proved"


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
    assert f"({op} at " in cx["op"] and "test_partir_verify.py" in cx["source"] and "loss)" in cx["source"]
    assert cx["program"] != pytest.approx(cx["reference"])


def test_a_reference_equal_in_value_but_not_in_form_is_undecided(lowered):
    v = lowered.verify(reference=block(doubled=True))
    assert v.status == "undecided" and "agree on random inputs" in v.reason


def test_jit_verify_runs_what_it_proves_and_refuses_the_rest():
    rows = [pc.ManualPartition({"x": 0}, axis="batch")]
    x = jnp.arange(32.0).reshape(8, 4)
    assert jnp.allclose(pc.jit(lambda x: jnp.tanh(x) * 2, MESH, rows, verify=True)(x), jnp.tanh(x) * 2)
    concat = pc.jit(lambda x: jnp.concatenate([x, x], axis=1), MESH, rows, verify=True)
    with pytest.raises(pc.PartitionError, match=r"refuses to run .* undecided: not proved: eqn \d+ \(concatenate"):
        concat(x)
