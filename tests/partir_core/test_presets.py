"""The presets (``partir_core.presets``) read the step's program, not its names: the inputs' kinds from what the
step updates, Megatron's pairs from its matmuls, ZeRO's shards from its parameters and optimizer state, the
embeddings from its gathers; they return tactics to print and paste, compose with ``+`` over one trace, and say
so where they find nothing. The automatic search reads the same kinds. (The zoo, ``tests/partir_core/test_zoo.py``,
runs them on models written with flax, equinox and optax.)"""

import numpy as np
import pytest

import jax
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

import redist  # noqa: E402
import partir_core as pc  # noqa: E402
from partir_core import ir, presets, schedules  # noqa: E402
from partir_core.analysis import analyze_groups, input_kinds  # noqa: E402
from partir_core.automatic.actions import build_actions, weight_actions  # noqa: E402
from tests.partir_core.helpers import assert_same, model_and_inputs  # noqa: E402

MESH = redist.Mesh({"batch": 2, "model": 4})
MP = pc.ManualPartition
RNG = np.random.default_rng(0)


def normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32) / np.sqrt(shape[0])


def sgd_step(forward):
    """A training step ``(w, s, batch_x, batch_y) → (w, s, loss)`` over ``forward(w, x)``: names that say nothing,
    momentum SGD by hand (``s`` the momenta)."""
    def step(w, s, batch_x, batch_y):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((forward(w, batch_x) - batch_y) ** 2))(w)
        s = jax.tree.map(lambda m, d: 0.9 * m + d, s, g)
        return jax.tree.map(lambda p, m: p - 0.1 * m, w, s), s, loss

    return step


def chain(w, x):
    """Three matmuls: two candidate pairs that share the middle weight."""
    return jnp.tanh(jnp.tanh(x @ w["a"]) @ w["b"]) @ w["c"]


def normed(w, x):
    """An MLP with a layer norm over its hidden dim."""
    h = x @ w["up"] + w["bias"]
    h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
    return jax.nn.relu(h) @ w["down"]


def linear(w, x):
    return x @ w["k"]


def inputs(w, batch=8, d_in=16, d_out=8):
    zeros = jax.tree.map(np.zeros_like, w)
    return w, zeros, normal(batch, d_in), normal(batch, d_out)


CHAIN = inputs({"a": normal(16, 32), "b": normal(32, 32), "c": normal(32, 8)})
ADAM = optax.adam(1e-2)


def adam_step(net, opt, inp, out):
    """Adam over :func:`chain`, its arguments named to say nothing."""
    loss, g = jax.value_and_grad(lambda n: jnp.mean((chain(n, inp) - out) ** 2))(net)
    updates, opt = ADAM.update(g, opt, net)
    return optax.apply_updates(net, updates), opt, loss
NORMED = inputs({"up": normal(16, 64), "bias": np.zeros(64, np.float32), "down": normal(64, 8)})


# ------------------------------------------------------------------------------------------------ input kinds
def types_of(tree) -> list:
    return jax.tree.leaves(tree, is_leaf=lambda t: isinstance(t, redist.ShardingType))


def test_kinds_come_from_what_the_step_updates():
    """Parameters: updated and reaching the loss; optimizer state: updated, not reaching it (Adam's moments and
    its step count); data: not updated. Names play no part."""
    net, _, x, y = CHAIN
    kinds = input_kinds(ir.trace(adam_step, (net, ADAM.init(net), x, y)))
    assert {p: k for p, k in kinds.items() if p.startswith("net/")} == {f"net/{n}": "param" for n in "abc"}
    assert {k for p, k in kinds.items() if p.startswith("opt/")} == {"state"}
    assert "opt/0/count" in kinds and kinds["inp"] == kinds["out"] == "data"


def test_a_mixed_precision_step_updates_its_working_copy_where_it_took_it():
    """bf16 parameters trained through float32 master weights: no chain of the bf16 weights' shape leads to their
    new value (a cast of the updated master), but the step returns it where it took them, so they are the
    parameters (they reach the loss), the master weights and momenta optimizer state, and Megatron pairs the
    bf16 weights and returns them in their types."""
    tx = optax.sgd(0.05, momentum=0.9, nesterov=True)

    def step(params, master, opt_state, x, y):
        def loss_fn(p):
            h = jax.nn.relu(x.astype(jnp.bfloat16) @ p["a"])
            return jnp.mean(((h @ p["b"]).astype(jnp.float32) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(jax.tree.map(lambda g: g.astype(jnp.float32), grads), opt_state, master)
        master = optax.apply_updates(master, updates)
        return jax.tree.map(lambda m: m.astype(jnp.bfloat16), master), master, opt_state, loss

    master = {"a": normal(16, 32), "b": normal(32, 8)}
    args = (jax.tree.map(lambda m: m.astype(jnp.bfloat16), master), master, tx.init(master), CHAIN[2], CHAIN[3])
    kinds = input_kinds(ir.trace(step, args))
    assert {p: k for p, k in kinds.items() if not p.startswith("opt_state/")} == {
        "params/a": "param", "params/b": "param", "master/a": "state", "master/b": "state",
        "x": "data", "y": "data"}
    (mp,) = schedules.schedule("MP", step, args, mesh=MESH)
    assert mp == MP({"params/a": 1, "params/b": 0}, axis="model")
    low = pc.jit(step, MESH, [mp]).lower(*args)
    assert types_of(low.out_types[:3]) == types_of(low.in_types[:3])


def test_a_program_that_updates_nothing_has_kinds_by_name():
    """A forward pass gives no evidence (``x @ w`` is symmetric): parameters by the conventional names."""
    def forward(params, x):
        return chain(params, x)

    kinds = input_kinds(ir.trace(forward, (CHAIN[0], CHAIN[2])))
    assert kinds == {"params/a": "param", "params/b": "param", "params/c": "param", "x": "data"}


@pytest.mark.parametrize("name", ["Z1", "Z2", "Z3", "BP+MP+Z3"])
def test_a_step_returns_what_it_updates_in_the_types_it_took_them_in(name):
    """The new parameters and optimizer state come out in their inputs' types, whatever the tactics shard in
    between (ZeRO-1 and -2 update whole parameters from sharded state: they are gathered back), so the results
    feed the next call as they are: a loop compiles once and its steps equal the unpartitioned ones."""
    net, _, x, y = CHAIN
    args = (net, ADAM.init(net), x, y)
    pf = pc.jit(adam_step, MESH, schedules.schedule(name, adam_step, args, mesh=MESH))
    low = pf.lower(*args)
    assert types_of(low.out_types[:2]) == types_of(low.in_types[:2])
    assert any(t.dims != ((),) * t.rank for t in types_of(low.in_types[1]))  # the state is sharded
    (net_p, opt_p, x_p, y_p), _ = pf.place(*args)
    want = args
    for _ in range(3):
        net_p, opt_p, loss = pf(net_p, opt_p, x_p, y_p)
        *want, want_loss = jax.jit(adam_step)(*want)
        want = (*want, x, y)
    assert pf._dispatch._cache_size() == 1
    assert_same((net_p, opt_p, loss), (want[0], want[1], want_loss))


def test_a_function_that_updates_nothing_returns_what_propagation_gives():
    """No parameter, no tie: ``x @ w`` with a square ``w`` has an output of ``x``'s shape and dtype, returned split
    as the column-parallel ``w`` makes it, not in ``x``'s type."""
    def f(x, w):
        return x @ w

    x, w = normal(8, 16), normal(16, 16)
    low = pc.jit(f, MESH, [MP({"w": 1}, axis="model")]).lower(x, w)
    assert str(low.out_types) == "f32[8, 16{model}]"


def test_the_automatic_search_reads_the_kinds_of_a_step_named_otherwise():
    """The weight decisions (what the search's Megatron-style moves pair) and the ZeRO actions come from the
    program's kinds: on ``(w, s, batch_x, batch_y)`` the search has them as it has on ``(params, momentum, x,
    y)``."""
    low = pc.jit(sgd_step(normed), MESH, []).lower(*NORMED)
    groups = analyze_groups(low.graph, low.rules)
    assert {k for p, k in groups.kinds.items() if p.startswith("w/")} == {"param"}
    assert {k for p, k in groups.kinds.items() if p.startswith("s/")} == {"state"}
    actions = build_actions(groups, low.graph, MESH, ["batch", "model"])
    assert {a.dims for a in weight_actions(actions, groups)} == {(("w/up", 1),)}  # the hidden dim
    zero = [a for a in actions if a.decision >= len(groups.macro)]
    assert any(dict(a.dims).get("w/up") is None and "s/up" in dict(a.dims) for a in zero)  # ZeRO-2: w pinned


# ------------------------------------------------------------------------------------------------ the presets
def test_batch_parallel_splits_the_data_or_the_inputs_named():
    step = sgd_step(chain)
    assert presets.batch_parallel()(step, *CHAIN) == [MP({"batch_x": 0, "batch_y": 0}, axis="batch")]
    assert presets.batch_parallel("model", inputs="batch_x")(step, *CHAIN) == [MP({"batch_x": 0}, axis="model")]
    assert presets.batch_parallel(inputs=[3])(step, *CHAIN) == [MP({"batch_y": 0}, axis="batch")]
    assert presets.batch_parallel(inputs={"batch_*": 0})(step, *CHAIN) == [MP({"batch_*": 0}, axis="batch")]
    with pytest.raises(pc.PartitionError, match=r"inputs must be path patterns or argument numbers \(0 to 3\)"):
        presets.batch_parallel(inputs=[7])(step, *CHAIN)

    def fit(w):  # no data: every input is updated
        loss, g = jax.value_and_grad(lambda w: jnp.sum(w ** 2))(w)
        return w - g, loss

    with pytest.raises(pc.PartitionError, match=r"batch_parallel found no data input with a leading dim in fit"):
        presets.batch_parallel()(fit, normal(8, 4))


def test_megatron_takes_the_first_pair_of_a_chain_and_a_normed_hidden_dim():
    assert presets.megatron()(sgd_step(chain), *CHAIN) == [MP({"w/a": 1, "w/b": 0}, axis="model")]
    assert presets.megatron()(sgd_step(normed), *NORMED) == [MP({"w/bias": 0, "w/down": 0, "w/up": 1},
                                                                axis="model")]
    with pytest.raises(pc.PartitionError, match=r"megatron found no column-then-row matmul pair on parameters "
                                                r"in step"):
        presets.megatron()(sgd_step(linear), *inputs({"k": normal(16, 8)}))


def test_megatron_leaves_a_dim_the_axis_does_not_divide():
    """Hidden 6 on a model axis of 4: nothing of it is split (the axis size comes from the mesh)."""
    w = inputs({"up": normal(16, 6), "bias": np.zeros(6, np.float32), "down": normal(6, 8)})
    assert presets.megatron()(sgd_step(normed), *w, mesh=MESH) == [MP({}, axis="model")]
    assert presets.megatron()(sgd_step(normed), *w, mesh=redist.Mesh({"batch": 4, "model": 2})) == \
        [MP({"w/bias": 0, "w/down": 0, "w/up": 1}, axis="model")]


def test_zero_stages_and_stacked_layer_dims():
    """Stages 1 and 2 give the same tactics (the parameters pinned, the state split); stage 3 splits both,
    never on a scanned weight's layer dim (the built-in scanned MLP: every leaf ``(layers, ...)``)."""
    step = sgd_step(chain)
    z1, z2 = presets.zero(1)(step, *CHAIN), presets.zero(2)(step, *CHAIN)
    assert z1 == z2 == [MP({"w/a": None, "w/b": None, "w/c": None, "s/a": 1, "s/b": 0, "s/c": 0}, axis="batch")]
    assert presets.zero(3, "model")(step, *CHAIN, mesh=MESH) == \
        [MP({"w/a": 1, "w/b": 0, "w/c": 0, "s/a": 1, "s/b": 0, "s/c": 0}, axis="model")]
    m, ins, _ = model_and_inputs("scanned_mlp")
    (z3,) = presets.zero(3)(m.step, *ins)
    assert z3.dims and all(d > 0 for d in z3.dims.values())
    with pytest.raises(pc.PartitionError, match=r"zero: stage must be 1, 2 or 3, got 4"):
        presets.zero(4)


def lm_step(tied):
    """A one-layer LM step: the table read by ``jnp.take``; logits by the table itself (tied) or by ``out``."""
    def step(w, s, tokens, targets):
        def loss(w):
            x = jnp.take(w["table"], tokens, axis=0)
            x = x + jax.nn.gelu(x @ w["up"]) @ w["down"]
            x = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
            logits = x @ w["table"].T if tied else x @ w["out"] + w["out_bias"]
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        value, g = jax.value_and_grad(loss)(w)
        s = jax.tree.map(lambda m, d: 0.9 * m + d, s, g)
        return jax.tree.map(lambda p, m: p - 0.1 * m, w, s), s, value

    w = {"table": normal(64, 16), "up": normal(16, 32), "down": normal(32, 16)}
    if not tied:
        w.update(out=normal(16, 64), out_bias=np.zeros(64, np.float32))
    tokens = RNG.integers(0, 64, (4, 8), dtype=np.int32)
    return step, (w, jax.tree.map(np.zeros_like, w), tokens, np.roll(tokens, -1, 1))


def test_embedding_finds_the_table_and_the_unembedding():
    step, ins = lm_step(tied=False)
    assert presets.embedding()(step, *ins) == [MP({"w/out": 1, "w/out_bias": 0, "w/table": 1}, axis="model")]
    step, ins = lm_step(tied=True)
    assert presets.embedding()(step, *ins) == [MP({"w/table": 0}, axis="model")]  # tied: vocabulary-parallel
    assert presets.megatron()(step, *ins) == [MP({"w/down": 0, "w/up": 1}, axis="model")]
    with pytest.raises(pc.PartitionError, match=r"embedding found no embedding table"):
        presets.embedding()(sgd_step(chain), *CHAIN)


# ------------------------------------------------------------------------------------------------ composing
def test_presets_compose_over_one_trace_and_paste_back(monkeypatch):
    traces = []
    trace = ir.trace
    monkeypatch.setattr(ir, "trace", lambda *a, **k: traces.append(1) or trace(*a, **k))
    step, ins = lm_step(tied=False)
    combined = presets.batch_parallel() + presets.megatron() + presets.zero(3) + presets.embedding()
    assert str(combined) == ("batch_parallel(axis='batch') + megatron(axis='model') + zero(3, axis='batch') + "
                             "embedding(axis='model')")
    tactics = combined(step, *ins, mesh=MESH)
    assert len(traces) == 1 and len(tactics) == 4
    assert tactics == [t for p in (presets.batch_parallel(), presets.megatron(), presets.zero(3),
                                   presets.embedding()) for t in p(step, *ins, mesh=MESH)]
    assert [eval(str(t), {"ManualPartition": MP}) for t in tactics] == tactics  # printed, they paste back
    assert tactics == schedules.schedule("BP+MP+Z3+EMB", step, ins, mesh=MESH)
    pf = pc.jit(step, MESH, tactics)
    assert_same(pf(*ins), jax.jit(step)(*ins))


def test_schedule_keeps_the_models_batch_inputs_and_names():
    """A :class:`partir_core.models.Model` keeps its ``batch_inputs`` for ``BP``; the rest is found as for any
    step, and gives the tactics the names gave (the built-in MLP's)."""
    m, ins, _ = model_and_inputs("gnn")
    assert schedules.schedule("BP", m, ins) == [MP({"senders": 0, "receivers": 0}, axis="batch")]
    assert schedules.schedule("BP", m.step, ins)[0].dims == {"nodes": 0, "senders": 0, "receivers": 0, "targets": 0}
    m, ins, _ = model_and_inputs("mlp")
    assert [str(t) for t in schedules.schedule("MP", m, ins, mesh=MESH)] == \
        ["ManualPartition({'params/b1': 0, 'params/w1': 1, 'params/w2': 0}, axis='model')"]
    assert schedules.PRESETS["Z1"](m, ins) == schedules.schedule("Z2", m, ins)


def test_presets_and_schedules_take_the_jax_mesh_jit_takes():
    """``mesh=jax.make_mesh(...)``, as :func:`partir_core.jit` takes it: the same tactics as on the
    :class:`redist.Mesh` of its axes, and an unknown axis named with the mesh's axes."""
    step, ins = lm_step(tied=False)
    jax_mesh = jax.make_mesh((2, 4), ("batch", "model"))
    assert schedules.schedule("BP+MP+Z3+EMB", step, ins, mesh=jax_mesh) == \
        schedules.schedule("BP+MP+Z3+EMB", step, ins, mesh=MESH)
    with pytest.raises(pc.PartitionError, match=r"megatron: unknown mesh axis 'tensor'; the mesh has axes batch, "
                                                r"model"):
        presets.megatron("tensor")(sgd_step(chain), *CHAIN, mesh=jax_mesh)


def test_axes_are_checked_on_the_mesh():
    with pytest.raises(pc.PartitionError, match=r"megatron: unknown mesh axis 'tensor'; the mesh has axes batch, "
                                                r"model"):
        presets.megatron("tensor")(sgd_step(chain), *CHAIN, mesh=MESH)
    with pytest.raises(pc.PartitionError, match=r"a preset needs the step function, got dict"):
        presets.megatron()({"not": "a step"}, *CHAIN)
