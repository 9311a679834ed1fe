"""An equinox MLP (``eqx.nn.MLP`` of depth 3: four ``eqx.nn.Linear`` layers, weights stored ``(out, in)``),
passed to the step as its arrays (``eqx.partition(model, eqx.is_array)``) and recombined there; optax's AdamW.

``make()`` → ``(step, (params, opt_state, x, y))``, a regression step.

Megatron shards two column-then-row pairs, in equinox's ``(out, in)`` layout: layer 0's outputs (its weight's
dim 0, its bias) with layer 1's inputs (dim 1), and layer 2's outputs with layer 3's inputs::

    params/layers/0/bias    0
    params/layers/0/weight  0
    params/layers/1/weight  1
    params/layers/2/bias    0
    params/layers/2/weight  0
    params/layers/3/weight  1

ZeRO-3 shards every parameter and both of Adam's moments, each on its largest dim::

    params/*
    opt_state/0/mu/*
    opt_state/0/nu/*
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


def make(batch=8, d_in=16, width=64, d_out=8):
    tx = optax.adamw(1e-3)

    @eqx.filter_jit
    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        model = eqx.nn.MLP(d_in, d_out, width, depth=3, key=k1)
        return model, tx.init(eqx.filter(model, eqx.is_array)), jax.random.normal(k2, (batch, d_in)), \
            jax.random.normal(k3, (batch, d_out))

    model, opt_state, x, y = init(jax.random.key(14))
    params, static = eqx.partition(model, eqx.is_array)

    def step(params, opt_state, x, y):
        def loss_fn(p):
            return jnp.mean((jax.vmap(eqx.combine(p, static))(x) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return step, (params, opt_state, x, y)
