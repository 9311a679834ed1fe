"""partir_core with jax.random: typed and legacy keys flow through partitioning, and every partitioned step
draws exactly the random bits of the unpartitioned one (a threefry draw split like its readers, any other
drawn whole and sliced, and per key along the keys' own batch dims)."""

import numpy as np
import pytest

import jax
import jax.extend.random as jrandom
import jax.numpy as jnp
from jax import lax

import redist
import partir_core as pc
from partir_core import models, schedules
from partir_core.program import Reshard
from partir_core.simulator import materialized


MESH = redist.Mesh({"batch": 2, "model": 4})
MP = pc.ManualPartition
B, D, H, O = 8, 16, 32, 8
KEEP = 0.75


def t(text, mesh=MESH):
    return redist.ShardingType.parse(text, mesh)


# ------------------------------------------------------------------------------ dropout training steps
def _forward(params, x, key):
    """Two-layer MLP with dropout on the hidden layer; returns the output and the keep mask."""
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    keep = jax.random.bernoulli(key, KEEP, h.shape)
    h = jnp.where(keep, h / KEEP, 0.0)
    return h @ params["w2"] + params["b2"], keep


def _sgd(params, key, x, y):
    def loss(p):
        out, keep = _forward(p, x, key)
        return jnp.mean((out - y) ** 2), keep

    (value, keep), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value, keep


def step_typed_key(params, key, x, y):
    """A typed key (``jax.random.key``) as input, split inside; the next key is returned."""
    key, sub = jax.random.split(key)
    new, loss, keep = _sgd(params, sub, x, y)
    return new, loss, keep, key


def step_legacy_seed(params, seed, x, y):
    """A legacy ``PRNGKey`` made inside from an int seed; split, fold_in, noise and dropout from it."""
    key = jax.random.PRNGKey(seed)
    k_drop, k_noise = jax.random.split(key)
    k_drop = jax.random.fold_in(k_drop, 7)
    noise = 0.01 * jax.random.normal(k_noise, x.shape)
    new, loss, keep = _sgd(params, k_drop, x + noise, y)
    return new, loss, keep, noise, jax.random.split(k_noise)


def step_per_example_keys(params, seed, x, y):
    """A typed key made inside, split into one key per example; each example draws its own dropout mask."""
    keys = jax.random.split(jax.random.key(seed), x.shape[0])

    def loss(p):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        keep = jax.vmap(lambda k: jax.random.bernoulli(k, KEEP, (h.shape[1],)))(keys)
        out = jnp.where(keep, h / KEEP, 0.0) @ p["w2"] + p["b2"]
        return jnp.mean((out - y) ** 2), keep

    (value, keep), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value, keep


def _params():
    k = jax.random.split(jax.random.key(0), 4)
    return {"w1": jax.random.normal(k[0], (D, H)) / 4, "b1": jnp.zeros(H),
            "w2": jax.random.normal(k[1], (H, O)) / 6, "b2": jnp.zeros(O)}


def _data():
    k = jax.random.split(jax.random.key(1), 2)
    return jax.random.normal(k[0], (B, D)), jax.random.normal(k[1], (B, O))


def _model(step, key):
    """A :class:`partir_core.models.Model` (so the preset schedules apply) and its example inputs."""
    m = models.Model(step.__name__, step, lambda _: None, {"x": 0, "y": 0})
    return m, (_params(), key, *_data())


MODELS = {
    "typed": lambda: _model(step_typed_key, jax.random.key(42)),
    "legacy": lambda: _model(step_legacy_seed, jnp.int32(42)),
    "per_example": lambda: _model(step_per_example_keys, jnp.int32(42)),
}


def assert_same_step(got, want):
    """Bits, masks, keys and integers exactly; float math up to rounding (rtol 1e-5)."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        if jnp.issubdtype(a.dtype, jnp.floating):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", ["BP", "MP", "BP+MP"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_dropout_step_equals_unpartitioned(model, name):
    m, ins = MODELS[model]()
    pf = pc.jit(m.step, MESH, schedules.schedule(name, m, ins, mesh=MESH))
    want = m.step(*ins)
    assert_same_step(pf(*ins), want)
    assert_same_step(jax.jit(pf)(*ins), want)
    low = pf.lower(*ins)
    assert not low.fallbacks
    assert all(u[1] not in ("random_bits", "random_split", "random_seed", "random_fold_in", "random_wrap",
                            "random_unwrap", "bitcast_convert_type") for u in low.unsupported)
    # the mask follows the hidden activations' sharding
    hidden = {"BP": "8{batch}, 32", "MP": "8, 32{model}", "BP+MP": "8{batch}, 32{model}"}[name]
    assert low.out_types[2] == t(f"bool[{hidden}]")
    sim = low.simulate()
    assert sim.step_time_s > 0 and sim.peak_bytes > 0 and sim.flops > 0


def test_typed_key_input_is_typed_by_its_key_data():
    """A key array's type is its key data's: the key dims as decided, the key-data dim replicated; the
    simulator counts its bytes."""
    m, ins = MODELS["typed"]()
    low = pc.jit(m.step, MESH, schedules.schedule("BP", m, ins, mesh=MESH)).lower(*ins)
    assert low.input_type("key") == t("u32[2]")
    assert low.out_types[3] == t("u32[2]")
    sim = low.simulate()
    leaves = jax.tree.leaves(low.in_types, is_leaf=lambda x: isinstance(x, redist.ShardingType))
    assert sim.argument_bytes == sum(x.local_bytes for x in leaves)
    assert 8 in [x.local_bytes for x in leaves]  # the key: two uint32 words


def test_a_threefry_draw_is_split_like_its_readers():
    """A threefry draw is counter-based: each device hashes only its own block's positions, so the mask is
    drawn split like the hidden layer it multiplies, nothing is drawn whole or moved, and the program is
    proved."""
    m, ins = MODELS["typed"]()
    pf = pc.jit(m.step, MESH, schedules.schedule("BP+MP", m, ins, mesh=MESH))
    low = pf.lower(*ins)
    (bits,) = [e for e in low.graph.eqns if e.name == "random_bits"]
    assert low.types[bits.outvars[0]] == t("u32[8{batch}, 32{model}]")
    assert "blocked" not in str(low.rules[low.graph.eqns.index(bits)])
    moves = [ins for ins in low.program.instructions if isinstance(ins, Reshard)]
    assert not any(ins.src.dtype in ("u32", "bool") for ins in moves)
    assert_same_step(pf(*ins), m.step(*ins))
    assert low.verify().status == "proved"


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_uneven_split_draws_of_every_width_equal_the_whole_draw(bits):
    """Draws split unevenly on their new dims (10 over 4 devices), of one key and of a batch of keys, give
    exactly the bits the whole draw gives at each position, and are proved."""
    dtype = np.dtype(f"uint{bits}")

    def f(key, keys, a, b):
        return (jax.random.bits(key, (6, 10), dtype) ^ a,
                jax.vmap(lambda k: jax.random.bits(k, (5, 10), dtype))(keys) ^ b)

    key, keys = jax.random.key(3), jax.random.split(jax.random.key(4), 6)
    a, b = jnp.zeros((6, 10), dtype), jnp.zeros((6, 5, 10), dtype)
    pf = pc.jit(f, MESH, [MP({"a": 1, "b": 2}, axis="model"), MP({"keys": 0, "b": 0}, axis="batch")])
    low = pf.lower(key, keys, a, b)
    assert list(low.out_types) == [t(f"u{bits}[6, 10{{model}}]"), t(f"u{bits}[6{{batch}}, 5, 10{{model}}]")]
    assert not low.collectives
    assert_same_step(pf(key, keys, a, b), f(key, keys, a, b))
    assert low.verify().status == "proved"


def test_a_draw_that_is_not_counter_based_is_drawn_whole_then_sliced():
    """An rbg key's draw is not counter-based: its new dims are blocked, every device draws the mask whole
    and a reader that wants it split slices it locally, moving nothing; the bits are the unpartitioned
    ones."""
    def f(key, x):
        return _mask(key, x) * 2.0

    key, x = jax.random.key(0, impl="rbg"), jnp.ones((B, H))
    pf = pc.jit(f, MESH, [MP({"x": 0}, axis="batch"), MP({"x": 1}, axis="model")])
    low = pf.lower(key, x)
    (bits,) = [e for e in low.graph.eqns if e.name == "random_bits"]
    assert "blocked" in str(low.rules[low.graph.eqns.index(bits)])
    assert low.types[bits.outvars[0]].dims == ((), ())
    assert low.out_types == t("f32[8{batch}, 32{model}]") and not low.collectives
    assert_same_step(pf(key, x), f(key, x))


def test_per_example_keys_generate_sharded_along_batch():
    """Keys split per example are sharded along the batch like the examples, so each device draws only its
    examples' bits; JAX defines batched ``random_bits`` per key, so those are the unpartitioned bits."""
    m, ins = MODELS["per_example"]()
    pf = pc.jit(m.step, MESH, schedules.schedule("BP", m, ins, mesh=MESH))
    low = pf.lower(*ins)
    (bits,) = [e for e in low.graph.eqns if e.name == "random_bits"]
    i = low.graph.eqns.index(bits)
    assert low.program.analysis.ops[i].in_types[0] == t("u32[8{batch}, 2]")
    assert low.types[bits.outvars[0]] == t("u32[8{batch}, 32]")
    assert_same_step(pf(*ins), m.step(*ins))


def test_sharded_key_array_input():
    """A key array passed in, one key per example, sharded on the batch axis by a tactic (its key dim 0)."""
    def f(keys, x):
        noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys)
        return x + noise, jax.vmap(jax.random.split)(keys)

    keys = jax.random.split(jax.random.key(5), B)
    x = jnp.ones((B, D))
    pf = pc.jit(f, MESH, [MP({"keys": 0, "x": 0}, axis="batch"), MP({"x": 1}, axis="model")])
    low = pf.lower(keys, x)
    assert low.input_type("keys") == t("u32[8{batch}, 2]")
    assert low.out_types[1] == t("u32[8{batch}, 2, 2]")
    assert not low.collectives
    assert_same_step(pf(keys, x), f(keys, x))
    assert_same_step(jax.jit(pf)(keys, x), f(keys, x))


def test_uneven_key_array():
    """Six keys on a batch axis of 4: the key data is padded like any uneven dim (padding draws bits that are
    never read); one key's draw for six uneven rows is generated whole and sliced unevenly."""
    mesh = redist.Mesh({"batch": 4, "model": 2})

    def f(keys, x):
        per_row = jax.vmap(lambda k: jax.random.uniform(k, (3,)))(keys)
        return per_row, keys, x * jax.random.uniform(keys[0], x.shape)

    keys, x = jax.random.split(jax.random.key(9), 6), jnp.ones((6, 3))
    pf = pc.jit(f, mesh, [MP({"keys": 0, "x": 0}, axis="batch")])
    low = pf.lower(keys, x)
    assert low.input_type("keys") == t("u32[6{batch}, 2]", mesh)
    assert low.out_types[0] == low.out_types[2] == t("f32[6{batch}, 3]", mesh)
    assert_same_step(pf(keys, x), f(keys, x))


def test_structural_ops_on_key_arrays():
    """Broadcast, reshape and fold_in act on the local keys (local shapes are key shapes, not key data's)."""
    def f(key, x):
        keys = jnp.broadcast_to(key, (x.shape[0],))
        keys = jax.vmap(jax.random.fold_in)(keys, jnp.arange(x.shape[0], dtype=jnp.uint32))
        keys = keys.reshape(2, -1).reshape(-1)
        return x + jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys), keys

    key, x = jax.random.key(8), jnp.ones((B, D))
    pf = pc.jit(f, MESH, [MP({"x": 0}, axis="batch")])
    low = pf.lower(key, x)
    assert low.out_types[1] == t("u32[8{batch}, 2]") and not low.collectives
    assert_same_step(pf(key, x), f(key, x))


def test_legacy_key_data_computed_and_used_twice():
    """Legacy key data computed inside the step and wrapped twice: the simulator's fusion decisions read key
    dtypes."""
    def f(data, x):
        data = data ^ jnp.uint32(1)
        return x * jax.random.uniform(data, x.shape) + jax.random.normal(data, x.shape)

    data, x = jax.random.PRNGKey(2), jnp.ones((B, D))
    pf = pc.jit(f, MESH, [MP({"x": 0}, axis="batch")])
    sim = pf.lower(data, x).simulate()
    assert sim.peak_bytes > 0 and sim.flops > 0
    assert_same_step(pf(data, x), f(data, x))


def _mask(key, x):
    return jnp.where(jax.random.bernoulli(key, KEEP, x.shape), x, 0.0)


def test_simulator_fuses_the_bit_arithmetic_of_a_draw():
    """As in XLA's compiled mask (the threefry loop, then one fusion from its words to the output), the shifts,
    bitcast and float arithmetic that turn random bits into a mask are fused: only the bits and the output
    are materialized."""
    low = pc.jit(_mask, MESH, []).lower(jax.random.key(0), jnp.ones((64, 1024)))
    mat = materialized(low.program)
    assert sorted(e.name for e in low.graph.eqns if e.outvars[0] in mat) == ["random_bits", "select_n"]


@pytest.mark.parametrize("batch_split", [False, True])
def test_simulated_memory_of_random_bits_matches_xla(batch_split):
    """The simulator counts the threefry loop's scratch: a dropout mask's simulated peak is XLA's, whether
    the bits are drawn whole for the unpartitioned mask or drawn whole and sliced for a batch-split one."""
    key, x = jax.random.key(0), jnp.ones((64, 1024))
    pf = pc.jit(_mask, MESH, [MP({"x": 0}, axis="batch")] if batch_split else [])
    low = pf.lower(key, x)
    mem = low.program.executable().lower(key, x).compile().memory_analysis()
    xla = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
           - mem.alias_size_in_bytes)
    assert low.simulate().peak_bytes == pytest.approx(xla, rel=0.01)


def test_keys_through_scan_and_closed_over_key():
    """Keys flow through a partitioned scan (as its stacked operand); a key closed over by the function is a
    constant."""
    outer = jax.random.key(11)

    def f(key, x):
        def body(c, k):
            return c + jax.random.normal(k, c.shape), jax.random.bits(k, (2,))

        out, bits = lax.scan(body, x, jax.random.split(key, 3))
        return out * jax.random.uniform(outer, x.shape), bits

    key, x = jax.random.key(3), jnp.ones((B, D))
    pf = pc.jit(f, MESH, [MP({"x": 0}, axis="batch")])
    low = pf.lower(key, x)
    assert not low.unsupported and [r.kind for r in low.graph.regions] == ["scan"]
    assert low.out_types[0].dims[0] == ("batch",)
    assert "random_bits const" in str(low)  # the closed-over key
    assert_same_step(pf(key, x), f(key, x))


def test_threefry2x32_is_elementwise():
    """The raw threefry hash (the primitive under ``jax.extend.random.threefry_2x32``) hashes each pair of
    counts alone: it follows its operands' sharding."""
    def f(key_data, hi, lo):
        return jrandom.threefry2x32_p.bind(key_data[0], key_data[1], hi, lo)

    key_data = jax.random.key_data(jax.random.key(4))
    hi, lo = jnp.zeros(64, jnp.uint32), jnp.arange(64, dtype=jnp.uint32)
    pf = pc.jit(f, MESH, [MP({"lo": 0}, axis="model")])
    low = pf.lower(key_data, hi, lo)
    assert not low.unsupported and low.out_types == [t("u32[64{model}]")] * 2 and not low.collectives
    assert_same_step(pf(key_data, hi, lo), f(key_data, hi, lo))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_automatic_partition_with_keys(model):
    """Under a memory budget the search must shard the step with keys (a state it could not lower would
    never fit), and the program it finds draws the unpartitioned bits."""
    m, ins = MODELS[model]()
    budget = int(0.7 * pc.jit(m.step, MESH, []).lower(*ins).simulate().peak_bytes)
    pf = pc.jit(m.step, MESH, [pc.AutomaticPartition(axes=["batch", "model"], memory_budget_bytes=budget,
                                                     time_budget_s=30, max_evals=12, progress=False)])
    auto = pf.lower(*ins).automatic
    assert auto.tactics and auto.peak_bytes <= budget
    assert_same_step(pf(*ins), m.step(*ins))
