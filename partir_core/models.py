"""Reference models in plain JAX, small enough to partition and run fast on CPU.

Each model is a :class:`Model`: ``init(key)`` gives its inputs (a tuple of pytrees: parameters, optimizer
state, data), ``step(*inputs)`` is its training step (forward, loss, ``jax.grad``, momentum-SGD update), and
``batch_inputs`` maps input paths to the dim that batch parallelism splits. Nothing here knows about
partitioning; the presets (:mod:`partir_core.presets`, by name: :mod:`partir_core.schedules`) find the rest
by analysis of the step.

- :func:`mlp`: a two-layer MLP regression step, inputs ``(params, momentum, x, y)``.
- :func:`transformer`: a decoder-only transformer LM step (token embedding by gather, learned positions,
  pre-layernorm causal multi-head attention and MLP, cross-entropy), inputs ``(params, momentum, tokens,
  targets)``.
- :func:`gnn`: a message-passing graph network (gather of sender features, ``segment_sum`` into receivers),
  inputs ``(params, momentum, nodes, senders, receivers, targets)``.
- :func:`scanned_mlp`: a residual MLP over stacked layer weights (``params/w1``: ``(layers, d, hidden)``) run
  by one ``lax.scan``, inputs ``(params, momentum, x, y)``.
- :func:`scanned_transformer`: the transformer with its layers' weights stacked (``params/layers/w1`` of shape
  ``(layers, d_model, hidden)``) and run by one ``lax.scan`` over them, as MaxText and ``flax.linen.scan``
  do; cross-entropy by ``take_along_axis``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

LR = 0.1
BETA = 0.9


@dataclass(frozen=True)
class Model:
    """A training step with example inputs. ``batch_inputs``: input path → dim split by batch parallelism."""

    name: str
    step: Callable
    init: Callable[[Any], tuple]
    batch_inputs: dict


def sgd_momentum(params, momentum, grads):
    """``m' = β·m + g``; ``p' = p − lr·m'`` on every leaf."""
    new_m = jax.tree.map(lambda m, g: BETA * m + g, momentum, grads)
    new_p = jax.tree.map(lambda p, m: p - LR * m, params, new_m)
    return new_p, new_m


def _dense(key, n_in, n_out):
    return jax.random.normal(key, (n_in, n_out), jnp.float32) / np.sqrt(n_in)


def _zeros_like(tree):
    return jax.tree.map(jnp.zeros_like, tree)


# ---------------------------------------------------------------------------------------------- MLP
def mlp_forward(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def mlp_loss(params, x, y):
    return jnp.mean((mlp_forward(params, x) - y) ** 2)


def mlp_step(params, momentum, x, y):
    loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
    params, momentum = sgd_momentum(params, momentum, grads)
    return params, momentum, loss


def mlp(batch=8, d_in=16, hidden=64, d_out=8) -> Model:
    def init(key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        params = {"w1": _dense(k1, d_in, hidden), "b1": jnp.zeros((hidden,)),
                  "w2": _dense(k2, hidden, d_out), "b2": jnp.zeros((d_out,))}
        x = jax.random.normal(k3, (batch, d_in))
        y = jax.random.normal(k4, (batch, d_out))
        return params, _zeros_like(params), x, y

    return Model("mlp", mlp_step, init, {"x": 0, "y": 0})


# -------------------------------------------------------------------------------------- transformer
def layer_norm(x, g, b, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * g + b


def attention(p, x, heads):
    B, S, D = x.shape
    dh = D // heads

    def split(t):
        return t.reshape(B, S, heads, dh)

    q, k, v = split(x @ p["wq"]), split(x @ p["wk"]), split(x @ p["wv"])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh)
    causal = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]
    scores = jnp.where(causal, scores, -1e9)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, S, D)
    return out @ p["wo"]


def transformer_logits(params, tokens, heads):
    x = params["embed"][tokens] + params["pos"][None, :, :]
    for p in params["layers"]:
        x = x + attention(p, layer_norm(x, p["ln1_g"], p["ln1_b"]), heads)
        h = jax.nn.gelu(layer_norm(x, p["ln2_g"], p["ln2_b"]) @ p["w1"] + p["b1"])
        x = x + h @ p["w2"] + p["b2"]
    x = layer_norm(x, params["lnf_g"], params["lnf_b"])
    return x @ params["unembed"]


def transformer_loss(params, tokens, targets, heads):
    logits = transformer_logits(params, tokens, heads)
    logp = jax.nn.log_softmax(logits, axis=-1)
    onehot = jax.nn.one_hot(targets, logits.shape[-1], dtype=logp.dtype)
    return -jnp.mean(jnp.sum(logp * onehot, axis=-1))


def transformer(vocab=64, d_model=32, layers=2, heads=4, seq=16, batch=8, mlp_ratio=4) -> Model:
    def step(params, momentum, tokens, targets):
        loss, grads = jax.value_and_grad(transformer_loss)(params, tokens, targets, heads)
        params, momentum = sgd_momentum(params, momentum, grads)
        return params, momentum, loss

    def init(key):
        keys = iter(jax.random.split(key, 8 + 8 * layers))
        hid = mlp_ratio * d_model
        params = {
            "embed": jax.random.normal(next(keys), (vocab, d_model)) * 0.1,
            "pos": jax.random.normal(next(keys), (seq, d_model)) * 0.1,
            "layers": [
                {"ln1_g": jnp.ones((d_model,)), "ln1_b": jnp.zeros((d_model,)),
                 "wq": _dense(next(keys), d_model, d_model), "wk": _dense(next(keys), d_model, d_model),
                 "wv": _dense(next(keys), d_model, d_model), "wo": _dense(next(keys), d_model, d_model),
                 "ln2_g": jnp.ones((d_model,)), "ln2_b": jnp.zeros((d_model,)),
                 "w1": _dense(next(keys), d_model, hid), "b1": jnp.zeros((hid,)),
                 "w2": _dense(next(keys), hid, d_model), "b2": jnp.zeros((d_model,))}
                for _ in range(layers)
            ],
            "lnf_g": jnp.ones((d_model,)), "lnf_b": jnp.zeros((d_model,)),
            "unembed": _dense(next(keys), d_model, vocab),
        }
        tokens = jax.random.randint(next(keys), (batch, seq), 0, vocab, jnp.int32)
        targets = jnp.roll(tokens, -1, axis=1)
        return params, _zeros_like(params), tokens, targets

    return Model("transformer", step, init, {"tokens": 0, "targets": 0})


# ------------------------------------------------------------------------------------- MLP, scanned
def scanned_mlp_loss(params, x, y):
    def layer(h, p):
        return h + jnp.tanh(h @ p["w1"] + p["b1"]) @ p["w2"], None

    h, _ = jax.lax.scan(layer, x, params)
    return jnp.mean((h - y) ** 2)


def scanned_mlp(batch=32, d=64, hidden=256, layers=4) -> Model:
    def step(params, momentum, x, y):
        loss, grads = jax.value_and_grad(scanned_mlp_loss)(params, x, y)
        params, momentum = sgd_momentum(params, momentum, grads)
        return params, momentum, loss

    def init(key):
        k = jax.random.split(key, 4)
        params = {"w1": jax.random.normal(k[0], (layers, d, hidden)) / np.sqrt(d),
                  "b1": jnp.zeros((layers, hidden)),
                  "w2": jax.random.normal(k[1], (layers, hidden, d)) / np.sqrt(hidden) / layers}
        return params, _zeros_like(params), jax.random.normal(k[2], (batch, d)), jax.random.normal(k[3], (batch, d))

    return Model("scanned_mlp", step, init, {"x": 0, "y": 0})


# ------------------------------------------------------------------------------ transformer, scanned
def scanned_transformer_loss(params, tokens, targets, heads):
    def layer(x, p):
        x = x + attention(p, layer_norm(x, p["ln1_g"], p["ln1_b"]), heads)
        h = jax.nn.gelu(layer_norm(x, p["ln2_g"], p["ln2_b"]) @ p["w1"] + p["b1"])
        return x + h @ p["w2"] + p["b2"], None

    x = params["embed"][tokens] + params["pos"][None, :, :]
    x, _ = jax.lax.scan(layer, x, params["layers"])
    logits = layer_norm(x, params["lnf_g"], params["lnf_b"]) @ params["unembed"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def scanned_transformer(vocab=64, d_model=32, layers=2, heads=4, seq=16, batch=8, mlp_ratio=4) -> Model:
    base = transformer(vocab, d_model, layers, heads, seq, batch, mlp_ratio)

    def step(params, momentum, tokens, targets):
        loss, grads = jax.value_and_grad(scanned_transformer_loss)(params, tokens, targets, heads)
        params, momentum = sgd_momentum(params, momentum, grads)
        return params, momentum, loss

    def init(key):
        params, _, tokens, targets = base.init(key)
        params = dict(params, layers=jax.tree.map(lambda *ws: jnp.stack(ws), *params["layers"]))
        return params, _zeros_like(params), tokens, targets

    return Model("scanned_transformer", step, init, {"tokens": 0, "targets": 0})


# ---------------------------------------------------------------------------------------------- GNN
def gnn_loss(params, nodes, senders, receivers, targets):
    h = nodes
    for p in params["layers"]:
        msg = jnp.tanh(h[senders] @ p["w1"] + p["b1"])               # gather: one message per edge
        agg = jax.ops.segment_sum(msg, receivers, num_segments=h.shape[0])   # scatter-add into receivers
        h = h + agg @ p["w2"]
    return jnp.mean((h - targets) ** 2)


def gnn_step(params, momentum, nodes, senders, receivers, targets):
    loss, grads = jax.value_and_grad(gnn_loss)(params, nodes, senders, receivers, targets)
    params, momentum = sgd_momentum(params, momentum, grads)
    return params, momentum, loss


def gnn(n_nodes=16, n_edges=32, features=8, hidden=32, layers=2) -> Model:
    def init(key):
        keys = iter(jax.random.split(key, 4 + 2 * layers))
        params = {"layers": [{"w1": _dense(next(keys), features, hidden), "b1": jnp.zeros((hidden,)),
                              "w2": _dense(next(keys), hidden, features)} for _ in range(layers)]}
        nodes = jax.random.normal(next(keys), (n_nodes, features))
        senders = jax.random.randint(next(keys), (n_edges,), 0, n_nodes, jnp.int32)
        receivers = jax.random.randint(next(keys), (n_edges,), 0, n_nodes, jnp.int32)
        targets = jax.random.normal(next(keys), (n_nodes, features))
        return params, _zeros_like(params), nodes, senders, receivers, targets

    return Model("gnn", gnn_step, init, {"senders": 0, "receivers": 0})


MODELS = {"mlp": mlp, "transformer": transformer, "gnn": gnn, "scanned_mlp": scanned_mlp,
          "scanned_transformer": scanned_transformer}
