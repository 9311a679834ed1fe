"""A plain-JAX decoder-only language model in the MaxText style: every block's weights stacked layer first and
run by one ``lax.scan``, RMS norms, causal multi-head attention, a SwiGLU MLP, a tied embedding (the logits are
the final states times the token table, transposed), trained by optax's Adam.

``make()`` → ``(step, (weights, opt_state, tokens, targets))``. The names are this file's own (``weights/tok``,
``weights/stack/Wq``, ...): the presets read the program, not the names.

Megatron splits the heads (``Wq``, ``Wk``, ``Wv`` ``(layers, d_model, d_model)`` on their outputs, ``Wo`` on its
inputs) and the MLP's hidden dim (``W_gate``, ``W_up`` on their outputs, ``W_down`` on its inputs), inside every
layer::

    weights/stack/W_down  1
    weights/stack/W_gate  2
    weights/stack/W_up    2
    weights/stack/Wk      2
    weights/stack/Wo      1
    weights/stack/Wq      2
    weights/stack/Wv      2

ZeRO-3 shards every weight and both of Adam's moments, each on its largest dim but never a layer dim::

    weights/*
    opt_state/0/mu/*
    opt_state/0/nu/*

Stacked layer dims (dim 0, never split)::

    */stack/*

Sharded embeddings: the tied table is the unembedding too, so it is split on its vocabulary (Megatron's
vocabulary-parallel embedding)::

    weights/tok  0
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def block(x, w, heads):
    b, s, d = x.shape
    h = rms_norm(x, w["norm_attn"])
    q, k, v = ((h @ w[n]).reshape(b, s, heads, d // heads) for n in ("Wq", "Wk", "Wv"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // heads)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v).reshape(b, s, d) @ w["Wo"]
    h = rms_norm(x, w["norm_mlp"])
    return x + (jax.nn.silu(h @ w["W_gate"]) * (h @ w["W_up"])) @ w["W_down"]


def logits(weights, tokens, heads):
    x = jnp.take(weights["tok"], tokens, axis=0)
    if isinstance(weights["stack"], list):  # unrolled: one dict of weights per layer
        for w in weights["stack"]:
            x = block(x, w, heads)
    else:
        x, _ = jax.lax.scan(lambda x, w: (block(x, w, heads), None), x, weights["stack"])
    return rms_norm(x, weights["norm_out"]) @ weights["tok"].T


def make(batch=8, seq=8, vocab=64, d_model=32, heads=4, hidden=64, layers=2, unrolled=False):
    """The step and its inputs; ``unrolled``: the layers' weights a list of one dict per layer
    (``weights/stack/0/Wq``, ...), run by a Python loop: the program holds ``layers`` blocks instead of one scan."""
    tx = optax.adam(1e-3)

    def step(weights, opt_state, tokens, targets):
        def loss_fn(w):
            return optax.softmax_cross_entropy_with_integer_labels(logits(w, tokens, heads), targets).mean()

        loss, grads = jax.value_and_grad(loss_fn)(weights)
        updates, opt_state = tx.update(grads, opt_state, weights)
        return optax.apply_updates(weights, updates), opt_state, loss

    rng = np.random.default_rng(16)

    def dense(*shape):
        return (rng.standard_normal((layers, *shape)) / np.sqrt(shape[0])).astype(np.float32)

    def ones(*shape):
        return np.ones(shape, np.float32)

    weights = {"tok": (0.1 * rng.standard_normal((vocab, d_model))).astype(np.float32),
               "stack": {"norm_attn": ones(layers, d_model), "Wq": dense(d_model, d_model),
                         "Wk": dense(d_model, d_model), "Wv": dense(d_model, d_model), "Wo": dense(d_model, d_model),
                         "norm_mlp": ones(layers, d_model), "W_gate": dense(d_model, hidden),
                         "W_up": dense(d_model, hidden), "W_down": dense(hidden, d_model)},
               "norm_out": ones(d_model)}
    if unrolled:
        weights["stack"] = [{k: w[i] for k, w in weights["stack"].items()} for i in range(layers)]
    tokens = rng.integers(0, vocab, (batch, seq), dtype=np.int32)
    return step, (weights, tx.init(weights), tokens, np.roll(tokens, -1, axis=1))
