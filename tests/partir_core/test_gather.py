"""partir_core on every gather / scatter-add form of embedding lookups and their gradients: the table split on
its vocabulary (a masked local lookup plus a pending sum), the indices split on their batch, and both."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import redist
import partir_core as pc
from tests.partir_core.helpers import assert_same


MESH = redist.Mesh({"batch": 2, "model": 4})
MP = pc.ManualPartition
V, D = 64, 8
TABLE = jax.random.normal(jax.random.key(0), (V, D))
IDS = jnp.array([[1, 2, 33, 63], [4, 50, 6, 0]])
SPLITS = {
    "vocab": [MP({"table": 0}, axis="model")],
    "batch": [MP({"ids": 0}, axis="batch")],
    "both": [MP({"table": 0}, axis="model"), MP({"ids": 0}, axis="batch")],
}


def _flax_embed(table, ids):
    nn = pytest.importorskip("flax.linen")
    return nn.Embed(V, D).apply({"params": {"embedding": table}}, ids)


LOOKUPS = {
    "take": lambda table, ids: jnp.take(table, ids, axis=0),                 # gather, fill mode (NaN)
    "take_clip": lambda table, ids: jnp.take(table, ids, axis=0, mode="clip"),
    "getitem": lambda table, ids: table[ids],                                # gather, promise_in_bounds
    "flax_embed": _flax_embed,
    "one_hot_matmul": lambda table, ids: jax.nn.one_hot(ids, V) @ table,
}


def _gathers(low):
    return [low.types[e.outvars[0]] for e in low.graph.eqns if e.name in ("gather", "scatter-add")]


@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("form", sorted(LOOKUPS))
def test_lookup_and_its_gradient_in_a_training_step(form, split):
    """A lookup, its scatter-add gradient and the SGD update of the table: exact under every split; with the
    vocabulary split, the lookup is local to each device's rows and its result a pending sum over them, and
    the gradient is scattered into each device's own rows (the table is never gathered)."""
    lookup = LOOKUPS[form]

    def step(table, ids):
        loss, g = jax.value_and_grad(lambda tb: jnp.sum(jnp.tanh(lookup(tb, ids)) ** 2))(table)
        return table - 0.1 * g, loss

    pf = pc.jit(step, MESH, SPLITS[split])
    low = pf.lower(TABLE, IDS)
    assert_same(pf(TABLE, IDS), step(TABLE, IDS))
    assert not low.unsupported and not low.fallbacks
    if "vocab" in split or split == "both":
        assert low.input_type("table") == redist.ShardingType.parse("f32[64{model}, 8]", MESH)
        assert not [c for c in low.collectives if "model" in c.axes and c.kind in ("all_gather", "exchange")]
        if form != "one_hot_matmul":
            lookup_type, grad_type = _gathers(low)
            assert lookup_type.partial == ("model",)
            assert grad_type.dims[0] == ("model",)


def test_take_along_axis_on_split_logits_and_its_gradient():
    """``take_along_axis`` (a gather with batching dims, as in a cross-entropy over integer labels) on logits
    split on the vocabulary and the batch: a masked local lookup per batch row."""
    logits = jax.random.normal(jax.random.key(1), (2, V))

    def step(logits, ids):
        loss, g = jax.value_and_grad(lambda x: jnp.sum(jnp.take_along_axis(x, ids, axis=1) ** 2))(logits)
        return logits - 0.1 * g, loss

    pf = pc.jit(step, MESH, [MP({"logits": 1}, axis="model"), MP({"logits": 0}, axis="batch")])
    low = pf.lower(logits, IDS)
    assert_same(pf(logits, IDS), step(logits, IDS))
    lookup_type, grad_type = _gathers(low)
    assert lookup_type == redist.ShardingType.parse("f32[2{batch}, 4] partial{model}", MESH)
    assert grad_type.dims == (("batch",), ("model",))
    assert not low.unsupported and not [c for c in low.collectives if c.kind == "all_gather"]


@pytest.mark.parametrize("mode", ["fill", "clip"])
def test_indices_out_of_range_behave_as_unpartitioned(mode):
    """An index outside the vocabulary gets the fill value (NaN, counted once in the pending sum) or is
    clamped, exactly as without partitioning."""
    def f(table, ids):
        return jnp.take(table, ids, axis=0, mode=mode) * 2.0

    ids = IDS.at[0, 0].set(V + 6).at[1, 1].set(-70)
    pf = pc.jit(f, MESH, SPLITS["both"])
    got, want = pf(TABLE, ids), f(TABLE, ids)
    assert_same(got, want)
    assert np.isnan(np.asarray(got)).any() == (mode == "fill")


def test_scatter_add_into_a_split_table():
    """``table.at[ids].add(updates)`` with the table split on its rows: each device adds the updates of its own
    rows (an index outside the table is dropped, as unpartitioned)."""
    def f(table, ids, updates):
        return table.at[ids].add(updates)

    ids = IDS.at[0, 1].set(V + 3)
    updates = jnp.ones(ids.shape + (D,))
    pf = pc.jit(f, MESH, [MP({"table": 0}, axis="model"), MP({"ids": 0, "updates": 0}, axis="batch")])
    low = pf.lower(TABLE, ids, updates)
    assert_same(pf(TABLE, ids, updates), f(TABLE, ids, updates))
    (scatter,) = _gathers(low)
    assert scatter.dims[0] == ("model",) and not low.unsupported


def test_scatter_add_of_clamped_indices_into_a_split_table():
    """``table.at[ids].add(updates, mode="clip")`` with the table split on its rows: an index past either end is
    added at the row it is clamped to (the last or the first), on the one device whose block holds it, as
    unpartitioned; the program is proved."""
    def f(table, ids, updates):
        return table.at[ids].add(updates, mode="clip")

    ids = IDS.at[0, 1].set(V + 3).at[1, 2].set(-V - 9)
    updates = jnp.ones(ids.shape + (D,))
    pf = pc.jit(f, MESH, [MP({"table": 0}, axis="model"), MP({"ids": 0, "updates": 0}, axis="batch")])
    got, want = pf(TABLE, ids, updates), f(TABLE, ids, updates)
    assert_same(got, want)
    dropped = TABLE.at[ids].add(updates, mode="drop")
    assert not np.allclose(np.asarray(want), np.asarray(dropped))  # the clamped updates count
    assert pf.lower(TABLE, ids, updates).verify().status == "proved"


def test_uneven_vocabulary_split():
    """61 rows over model=4 (blocks of 16, the last with 13 rows and 3 of padding)."""
    table, ids = TABLE[:61], IDS % 61

    def step(table, ids):
        loss, g = jax.value_and_grad(lambda tb: jnp.sum(jnp.take(tb, ids, axis=0) ** 2))(table)
        return table - 0.1 * g, loss

    pf = pc.jit(step, MESH, SPLITS["both"])
    low = pf.lower(table, ids)
    assert low.input_type("table").local_shape == (16, 8)
    assert _gathers(low)[0].partial == ("model",)
    assert_same(pf(table, ids), step(table, ids))


def test_a_lookup_is_split_where_propagation_puts_it_not_by_the_per_op_choice():
    """ZeRO-3 splits the transformer's table rows on the batch axis, which BP already gives the tokens: at the
    lookup, the earlier tactic (the tokens' batch) wins, and the per-op choice does not split the lookup on
    its own (its pending-sum result would be priced only where it is reduced). The step keeps the bytes it had
    before lookups could be split (141,828 B; XLA's partitioner: 227,268 B)."""
    from partir_core import schedules
    from tests.partir_core.helpers import model_and_inputs

    m, ins, _ = model_and_inputs("transformer")
    low = pc.jit(m.step, MESH, schedules.schedule("BP+MP+Z3", m, ins, mesh=MESH)).lower(*ins)
    assert low.input_type("params/embed").dims[0] == ("batch",)
    lookup, _ = _gathers(low)
    assert lookup.partial == () and lookup.dims[0] == ("batch",)
    assert sum(c.bytes for c in low.collectives) <= 141828
