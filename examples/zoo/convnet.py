"""A flax.linen convolutional classifier in the style of flax's MNIST example: two ``nn.Conv`` layers with ReLU,
global average pooling and a two-layer ``nn.Dense`` head; trained by optax's SGD with momentum.

``make()`` → ``(step, (params, opt_state, images, labels))``, images ``(batch, height, width, channels)``.

Megatron pairs Conv_0's output channels (its kernel's last dim and its bias) with Conv_1's input channels, as a
column-then-row matmul pair, and splits the head's hidden dim (Dense_0's outputs and bias, Dense_1's inputs).
Conv_1's output channels pair with Dense_0's inputs too, but that pair shares Conv_1's kernel with the first::

    params/params/Conv_0/bias     0
    params/params/Conv_0/kernel   3
    params/params/Conv_1/kernel   2
    params/params/Dense_0/bias    0
    params/params/Dense_0/kernel  1
    params/params/Dense_1/kernel  0

ZeRO-3 shards every parameter and its momentum, each on its largest dim (a conv kernel ``(3, 3, in, out)`` on
its output channels)::

    params/*
    opt_state/*/trace/*
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(features=16, kernel_size=(3, 3))(x))
        x = nn.relu(nn.Conv(features=32, kernel_size=(3, 3))(x))
        x = x.mean(axis=(1, 2))
        x = nn.relu(nn.Dense(features=64)(x))
        return nn.Dense(features=10)(x)


def make(batch=8, size=8):
    model, tx = CNN(), optax.sgd(0.05, momentum=0.9)

    def step(params, opt_state, images, labels):
        def loss_fn(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, images), labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        images = jax.random.normal(k1, (batch, size, size, 1))
        params = model.init(k3, images)
        return params, tx.init(params), images, jax.random.randint(k2, (batch,), 0, 10, jnp.int32)

    return step, init(jax.random.key(18))
