"""The model zoo: training steps written the way users write them (a flax.linen LM scanning its layers with
``nn.scan``, with ``nn.Embed``, dropout and an optax optimizer; a flax.nnx model; an equinox model passed
through ``eqx.partition``; a plain-JAX LM scanning stacked weights with ``lax.scan``), each partitioned under
BP, MP (Megatron on the layer weights, inside the scan), BP+MP, BP+MP+Z3 and EMB where it has embeddings, and
equal to its unpartitioned step. Nothing is kept replicated, and inside a scan the Megatron reductions run in
the loop body. Variants marked ``slow`` repeat what the others already cover (``-m "not slow"`` skips them)."""

import fnmatch

import numpy as np
import pytest

jax = pytest.importorskip("jax")
flax = pytest.importorskip("flax")
optax = pytest.importorskip("optax")
eqx = pytest.importorskip("equinox")
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import redist  # noqa: E402
import partir_core as pc  # noqa: E402
from partir_core import ir, models, schedules  # noqa: E402
from partir_core.program import ControlFlow, Reshard, walk  # noqa: E402
from tests.partir_helpers import assert_same  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)", allow_module_level=True)

MESH = redist.Mesh({"batch": 2, "model": 4})
MP = pc.ManualPartition
slow = pytest.mark.slow


# ------------------------------------------------------------------------------------------ the models
class Block(nn.Module):
    """A pre-layernorm decoder block with dropout; ``nn.scan`` stacks its parameters over the layers."""

    heads: int = 4
    hidden: int = 128

    @nn.compact
    def __call__(self, x, _):
        b, s, d = x.shape
        h = nn.LayerNorm()(x)
        q, k, v = (nn.Dense(d, use_bias=False, name=n)(h).reshape(b, s, self.heads, d // self.heads)
                   for n in ("wq", "wk", "wv"))
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // self.heads)
        att = jnp.where(jnp.tril(jnp.ones((s, s), bool)), att, -1e9)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, -1), v).reshape(b, s, d)
        x = x + nn.Dropout(0.1, deterministic=False)(nn.Dense(d, name="wo")(o))
        h = nn.gelu(nn.Dense(self.hidden, name="w1")(nn.LayerNorm()(x)))
        return x + nn.Dropout(0.1, deterministic=False)(nn.Dense(d, name="w2")(h)), None


class FlaxLM(nn.Module):
    vocab: int = 128
    d_model: int = 32
    layers: int = 2

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d_model, name="embed")(tokens)
        scanned = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                          length=self.layers)
        x, _ = scanned(name="layers")(x, None)
        return nn.Dense(self.vocab, name="unembed")(nn.LayerNorm()(x))


def flax_lm():
    """The flax.linen LM's step ``(params, opt_state, tokens, targets, key)``: Adam, dropout drawn from ``key``,
    cross-entropy over integer labels."""
    model, opt = FlaxLM(), optax.adam(1e-2)

    def step(params, opt_state, tokens, targets, key):
        def loss(p):
            logits = model.apply(p, tokens, rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    k = jax.random.split(jax.random.key(0), 4)
    tokens = jax.random.randint(k[0], (4, 8), 0, model.vocab)
    params = model.init({"params": k[1], "dropout": k[2]}, tokens)
    return step, (params, opt.init(params), tokens, jnp.roll(tokens, -1, 1), k[3])


class NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.w1 = nnx.Linear(16, 64, rngs=rngs)
        self.norm = nnx.LayerNorm(64, rngs=rngs)
        self.w2 = nnx.Linear(64, 8, rngs=rngs)

    def __call__(self, x):
        return self.w2(jax.nn.relu(self.norm(self.w1(x))))


def nnx_mlp():
    """A flax.nnx model trained functionally: ``nnx.split`` once, ``nnx.merge`` inside the step; SGD with
    momentum from optax."""
    graphdef, params = nnx.split(NnxMLP(nnx.Rngs(0)))
    opt = optax.sgd(0.1, momentum=0.9)

    def step(params, opt_state, x, y):
        def loss(p):
            return jnp.mean((nnx.merge(graphdef, p)(x) - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, value

    k = jax.random.split(jax.random.key(1), 2)
    return step, (params, opt.init(params), jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (8, 8)))


def eqx_mlp():
    """An equinox MLP, passed as its arrays (``eqx.partition(model, eqx.is_array)``) and recombined in the step;
    Adam from optax."""
    model = eqx.nn.MLP(16, 8, 64, depth=2, key=jax.random.key(2))
    params, static = eqx.partition(model, eqx.is_array)
    opt = optax.adam(1e-2)

    def step(params, opt_state, x, y):
        def loss(p):
            return jnp.mean((jax.vmap(eqx.combine(p, static))(x) - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, value

    k = jax.random.split(jax.random.key(3), 2)
    return step, (params, opt.init(params), jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (8, 8)))


def jax_lm():
    """The plain-JAX LM scanning stacked layer weights (``partir_core.models.scanned_transformer``)."""
    m = models.scanned_transformer()
    return m.step, m.init(jax.random.key(4))


# ------------------------------------------------------------------------------------------ the schedules
def zero3(step, inputs, prefixes, stacked=()):
    """ZeRO-3 on the batch axis: every parameter and optimizer-state leaf under ``prefixes`` split on its
    largest dim that 2 divides (never a stacked layer dim, the leading dim of paths matching ``stacked``)."""
    paths, leaves, _ = ir.input_paths(step, inputs)
    dims = {}
    for p, x in zip(paths, leaves):
        first = int(any(fnmatch.fnmatchcase(p, s) for s in stacked))
        ok = [d for d in range(first, np.ndim(x)) if np.shape(x)[d] % 2 == 0]
        if p.split("/")[0] in prefixes and ok:
            dims[p] = max(ok, key=lambda d: np.shape(x)[d])
    return [MP(dims, axis="batch")]


def flax_schedules(step, inputs):
    layers = "params/params/layers"
    bp = [MP({"tokens": 0, "targets": 0}, axis="batch")]
    mp = [MP({f"{layers}/w[qkv]/kernel": 2, f"{layers}/w1/kernel": 2, f"{layers}/w1/bias": 1,
              f"{layers}/w[o2]/kernel": 1}, axis="model")]
    vocab = [MP({"params/params/embed/embedding": 0, "params/params/unembed/kernel": 1,
                 "params/params/unembed/bias": 0}, axis="model")]
    z3 = zero3(step, inputs, ("params", "opt_state"), stacked=("*/layers/*",))
    return {"BP": bp, "MP": mp, "BP+MP": bp + mp, "BP+MP+Z3": bp + mp + z3, "EMB": bp + vocab}


def mlp_schedules(step, inputs, column, row):
    bp = [MP({"x": 0, "y": 0}, axis="batch")]
    mp = [MP({**column, **row}, axis="model")]
    z3 = zero3(step, inputs, ("params", "opt_state"))
    return {"BP": bp, "MP": mp, "BP+MP": bp + mp, "BP+MP+Z3": bp + mp + z3}


def jax_lm_schedules(step, inputs):
    m = models.scanned_transformer()
    return {name: schedules.schedule(name, m, inputs, mesh=MESH) for name in ("BP", "MP", "BP+MP", "BP+MP+Z3", "EMB")}


ZOO = {
    "flax_lm": (flax_lm, flax_schedules),
    "nnx_mlp": (nnx_mlp, lambda s, i: mlp_schedules(s, i, {"params/w1/kernel/value": 1, "params/w1/bias/value": 0},
                                                    {"params/w2/kernel/value": 0})),
    "eqx_mlp": (eqx_mlp, lambda s, i: mlp_schedules(s, i, {"params/layers/0/weight": 0, "params/layers/0/bias": 0},
                                                    {"params/layers/1/weight": 1})),
    "jax_lm": (jax_lm, jax_lm_schedules),
}
CASES = [
    pytest.param("flax_lm", "BP", marks=slow), pytest.param("flax_lm", "MP", marks=slow), ("flax_lm", "BP+MP"),
    pytest.param("flax_lm", "BP+MP+Z3", marks=slow), ("flax_lm", "EMB"),
    *[(m, s) for m in ("nnx_mlp", "eqx_mlp") for s in ("BP", "MP", "BP+MP", "BP+MP+Z3")],
    pytest.param("jax_lm", "BP", marks=slow), pytest.param("jax_lm", "MP", marks=slow), ("jax_lm", "BP+MP"),
    ("jax_lm", "BP+MP+Z3"), ("jax_lm", "EMB"),
]
_BUILT: dict = {}


def built(name):
    """``(step, inputs, unpartitioned result, schedules)`` of a zoo model, built once per session."""
    if name not in _BUILT:
        make, plans = ZOO[name]
        step, inputs = make()
        _BUILT[name] = (step, inputs, jax.jit(step)(*inputs), plans(step, inputs))
    return _BUILT[name]


@pytest.mark.parametrize("name,schedule", CASES)
def test_zoo_model_partitioned_equals_unpartitioned(name, schedule):
    step, inputs, want, plans = built(name)
    pf = pc.jit(step, MESH, plans[schedule])
    low = pf.lower(*inputs)
    assert not low.unsupported and not low.fallbacks and not low.carry_reshards
    assert_same(pf(*inputs), want)
    if low.graph.regions and "MP" in schedule:
        # Megatron inside the scan: the layers' model-axis collectives run in the loop bodies, every iteration
        # (a pending sum reduced there); nothing split on the model axis is gathered around the loops
        loops = [i for i in walk(low.program.instructions) if isinstance(i, ControlFlow)]
        inside = [c for loop in loops for body in loop.bodies for ins in body if isinstance(ins, Reshard)
                  for c in ins.collectives if "model" in c.axes]
        assert any(c.kind in ("all_reduce", "reduce_scatter") for c in inside)
        assert all(c.trips == 2 for c in inside)
        assert not [c for c in low.collectives if "model" in c.axes and c.kind in ("all_gather", "exchange")
                    and c.trips == 1 and c.where.endswith("(scan)")]


def test_a_module_with_non_array_leaves_is_a_clear_error():
    """An equinox module passed whole has functions among its leaves: a PartitionError naming the leaf and
    saying to pass the arrays (``eqx.partition``), from ``jit`` and from the preset schedules alike."""
    model = eqx.nn.MLP(4, 2, 8, 1, key=jax.random.key(0))

    def step(params, x):
        return jax.vmap(params)(x)

    x = jnp.ones((4, 4))
    with pytest.raises(pc.PartitionError, match=r"params/activation.*eqx\.partition"):
        pc.jit(step, MESH, [MP({"x": 0}, axis="batch")])(model, x)
    as_model = models.Model("eqx", step, None, {"x": 0})
    for preset in ("MP", "BP+MP+Z3"):
        with pytest.raises(pc.PartitionError, match=r"params/activation.*eqx\.partition"):
            schedules.schedule(preset, as_model, (model, x), mesh=MESH)
