"""A flax.nnx encoder classifier: one pre-layernorm block of ``nnx.MultiHeadAttention`` and an MLP over a
sequence of feature vectors, mean-pooled into an ``nnx.Linear`` head; trained functionally (``nnx.split`` once,
``nnx.merge`` inside the step) by optax's SGD with momentum.

``make()`` → ``(step, (params, opt_state, x, labels))``; ``params`` is the model's ``nnx.State``, so weights are
named after the attributes (``params/attn/query/kernel/value``).

Megatron splits the attention heads (q/k/v kernels ``(d_model, heads, head_dim)`` and biases, the output kernel's
input) and the MLP's hidden dim (``up``'s outputs and bias, ``down``'s inputs)::

    params/attn/key/bias/value       0
    params/attn/key/kernel/value     1
    params/attn/out/kernel/value     0
    params/attn/query/bias/value     0
    params/attn/query/kernel/value   1
    params/attn/value/bias/value     0
    params/attn/value/kernel/value   1
    params/down/kernel/value         0
    params/up/bias/value             0
    params/up/kernel/value           1

ZeRO-3 shards every parameter and its momentum, each on its largest dim::

    params/*
    opt_state/*/trace/*
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class Encoder(nnx.Module):
    def __init__(self, d_model=32, heads=4, mlp_dim=128, classes=10, *, rngs):
        self.norm1 = nnx.LayerNorm(d_model, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d_model, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d_model, rngs=rngs)
        self.up = nnx.Linear(d_model, mlp_dim, rngs=rngs)
        self.down = nnx.Linear(mlp_dim, d_model, rngs=rngs)
        self.head = nnx.Linear(d_model, classes, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.down(nnx.gelu(self.up(self.norm2(x))))
        return self.head(x.mean(axis=1))


def make(batch=8, seq=8, d_model=32):
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Encoder(d_model, rngs=nnx.Rngs(0))))
    tx = optax.sgd(0.1, momentum=0.9)

    def step(params, opt_state, x, labels):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        _, params = nnx.split(Encoder(d_model, rngs=nnx.Rngs(k1)))
        x = jax.random.normal(k2, (batch, seq, d_model))
        return params, tx.init(params), x, jax.random.randint(k3, (batch,), 0, 10, jnp.int32)

    return step, init(jax.random.key(12))
