"""A flax.linen MLP classifier (four ``nn.Dense`` layers), trained by optax's AdamW.

``make()`` → ``(step, (params, opt_state, images, labels))``; ``step`` returns the new parameters, optimizer state
and the loss. ``params`` is flax's variable dict, so weights are named ``params/params/Dense_<i>/kernel``.

Megatron shards two column-then-row pairs: Dense_0's outputs (and its bias) with Dense_1's inputs, and Dense_2's
outputs with Dense_3's inputs (Dense_1's outputs and Dense_2's inputs would pair too, but Dense_1 is taken)::

    params/params/Dense_0/bias    0
    params/params/Dense_0/kernel  1
    params/params/Dense_1/kernel  0
    params/params/Dense_2/bias    0
    params/params/Dense_2/kernel  1
    params/params/Dense_3/kernel  0

ZeRO-3 shards every parameter and both of Adam's moments, each on its largest dim (the step count stays
whole)::

    params/*
    opt_state/0/mu/*
    opt_state/0/nu/*
"""

import flax.linen as nn
import jax
import optax


class MLP(nn.Module):
    features: tuple = (64, 64, 64, 10)

    @nn.compact
    def __call__(self, x):
        for f in self.features[:-1]:
            x = nn.relu(nn.Dense(f)(x))
        return nn.Dense(self.features[-1])(x)


def make(batch=8, pixels=16):
    model = MLP()
    tx = optax.adamw(1e-3, weight_decay=1e-4)

    def step(params, opt_state, images, labels):
        def loss_fn(p):
            logits = model.apply(p, images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        images = jax.random.normal(k1, (batch, pixels))
        params = model.init(k3, images)
        return params, tx.init(params), images, jax.random.randint(k2, (batch,), 0, model.features[-1])

    return step, init(jax.random.key(10))
