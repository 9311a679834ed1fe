"""A plain-JAX mixture-of-experts layer in the GShard/Switch style: a router's softmax picks each token's top-2
experts (``argmax``, then ``argmax`` again with the first masked), tokens go to their experts' buffers up to a
capacity (positions counted by a prefix sum, written as a lower-triangular matmul), are dispatched and combined
by einsums with one-hot tensors, with a residual and the load-balancing loss; trained by optax's Adam.

``make()`` → ``(step, (params, opt_state, x, y))``: ``x`` is ``(batch, seq, d_model)``, a regression target ``y``.

Megatron splits every expert's hidden dim (``w_in``'s outputs and bias, ``w_out``'s inputs; the expert dim is
expert parallelism's, which Megatron does not use)::

    params/b_in   1
    params/w_in   2
    params/w_out  1

ZeRO-3 shards every parameter and both of Adam's moments, each on its largest dim::

    params/*
    opt_state/0/mu/*
    opt_state/0/nu/*
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax


def moe_layer(params, x, capacity):
    b, s, d = x.shape
    tokens = x.reshape(b * s, d)
    experts = params["router"].shape[1]
    gates = jax.nn.softmax(tokens @ params["router"])                               # (T, E)
    first = jax.nn.one_hot(jnp.argmax(gates, axis=-1), experts)
    second = jax.nn.one_hot(jnp.argmax(gates * (1 - first), axis=-1), experts)
    prefix = jnp.tril(jnp.ones((b * s, b * s)))                                      # position in the expert's buffer
    pos1 = (prefix @ first - 1).astype(jnp.int32)
    pos2 = (prefix @ second - 1 + jnp.sum(first, axis=0, keepdims=True)).astype(jnp.int32)
    dispatch = (first[..., None] * jax.nn.one_hot(pos1, capacity) +
                second[..., None] * jax.nn.one_hot(pos2, capacity))                  # (T, E, C), over capacity: 0
    combine = dispatch * gates[..., None]
    expert_in = jnp.einsum("tec,td->ecd", dispatch, tokens)
    h = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", expert_in, params["w_in"]) + params["b_in"][:, None, :])
    expert_out = jnp.einsum("ecf,efd->ecd", h, params["w_out"])
    out = jnp.einsum("tec,ecd->td", combine, expert_out).reshape(b, s, d)
    balance = experts * jnp.sum(jnp.mean(first, axis=0) * jnp.mean(gates, axis=0))
    return x + out, balance


def make(batch=4, seq=8, d_model=16, experts=4, hidden=32, capacity=8):
    tx = optax.adam(1e-3)

    def step(params, opt_state, x, y):
        def loss_fn(p):
            out, balance = moe_layer(p, x, capacity)
            return jnp.mean((out - y) ** 2) + 0.01 * balance

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(19)

    def normal(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    params = {"router": normal(d_model, experts, scale=d_model ** -0.5),
              "w_in": normal(experts, d_model, hidden, scale=d_model ** -0.5),
              "b_in": np.zeros((experts, hidden), np.float32),
              "w_out": normal(experts, hidden, d_model, scale=hidden ** -0.5)}
    return step, (params, tx.init(params), normal(batch, seq, d_model), normal(batch, seq, d_model))
