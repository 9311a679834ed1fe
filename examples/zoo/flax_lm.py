"""A flax.linen decoder-only language model: ``nn.Embed``, pre-layernorm blocks of causal
``nn.MultiHeadDotProductAttention`` (without biases, as most LMs) and an MLP, scanned over the layers by
``nn.scan``, with dropout, a separate unembedding ``nn.Dense``, and optax's Adam.

``make()`` → ``(step, (params, opt_state, tokens, targets, key))``: ``key`` draws the dropout masks. ``nn.scan``
stacks the blocks' weights, layer first (``params/params/layers/...``: the q/k/v kernels are ``(layers, d_model,
heads, head_dim)``, the output kernel ``(layers, heads, head_dim, d_model)``).

Megatron splits the attention heads (the q/k/v kernels' head dim, the output kernel's input) and the MLP's
hidden dim (Dense_0's outputs and bias, Dense_1's inputs), inside every layer, one dim after the layer dim::

    params/params/layers/Dense_0/bias                                 1
    params/params/layers/Dense_0/kernel                               2
    params/params/layers/Dense_1/kernel                               1
    params/params/layers/MultiHeadDotProductAttention_0/key/kernel    2
    params/params/layers/MultiHeadDotProductAttention_0/out/kernel    1
    params/params/layers/MultiHeadDotProductAttention_0/query/kernel  2
    params/params/layers/MultiHeadDotProductAttention_0/value/kernel  2

ZeRO-3 shards every parameter and both of Adam's moments, each on its largest dim but never a layer dim::

    params/*
    opt_state/0/mu/*
    opt_state/0/nu/*

Stacked layer dims (dim 0, never split)::

    */layers/*

Sharded embeddings: the table on its feature dim, the unembedding (kernel and bias) on the vocabulary::

    params/params/embed/embedding  1
    params/params/unembed/bias     0
    params/params/unembed/kernel   1
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


class Block(nn.Module):
    heads: int = 4
    mlp_dim: int = 128
    dropout: float = 0.1

    @nn.compact
    def __call__(self, x, _):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        attention = nn.MultiHeadDotProductAttention(num_heads=self.heads, use_bias=False, deterministic=True)
        h = attention(nn.LayerNorm()(x), mask=mask)
        x = x + nn.Dropout(self.dropout, deterministic=False)(h)
        h = nn.Dense(self.mlp_dim)(nn.LayerNorm()(x))
        h = nn.Dense(x.shape[-1])(nn.gelu(h))
        return x + nn.Dropout(self.dropout, deterministic=False)(h), None


class LM(nn.Module):
    vocab: int = 128
    d_model: int = 32
    layers: int = 2

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d_model, name="embed")(tokens)
        stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        length=self.layers)
        x, _ = stack(name="layers")(x, None)
        return nn.Dense(self.vocab, name="unembed")(nn.LayerNorm()(x))


def make(batch=8, seq=8):
    model, tx = LM(), optax.adam(1e-3)

    def step(params, opt_state, tokens, targets, key):
        def loss_fn(p):
            logits = model.apply(p, tokens, rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def init(key):
        k = jax.random.split(key, 4)
        tokens = jax.random.randint(k[0], (batch, seq), 0, model.vocab)
        params = model.init({"params": k[1], "dropout": k[2]}, tokens)
        return params, tx.init(params), tokens, jnp.roll(tokens, -1, axis=1), k[3]

    return step, init(jax.random.key(11))
