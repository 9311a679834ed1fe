"""A plain-JAX message-passing graph network in the style of jraph's examples: node features encoded, then
message-passing layers (messages from the sender's state through an MLP, summed into receivers by
``jax.ops.segment_sum``, a residual update), decoded per node; trained by optax's SGD.

``make()`` → ``(step, (params, opt_state, nodes, senders, receivers, targets))``; ``senders`` and ``receivers``
are integer edge lists (gathers and segment sums over them).

Megatron splits each layer's message MLP: its hidden dim (``msg``'s outputs and bias, ``update``'s inputs).
The node state (``encode``'s outputs, every layer's ``msg`` inputs and ``update`` outputs, ``decode``'s inputs)
is a stream (each layer reads it and adds to it), which Megatron leaves whole::

    params/layers/0/msg/b     0
    params/layers/0/msg/w     1
    params/layers/0/update/w  0
    params/layers/1/msg/b     0
    params/layers/1/msg/w     1
    params/layers/1/update/w  0

ZeRO-3 shards every parameter (plain SGD keeps no optimizer state), each on its largest dim::

    params/*
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax


def forward(params, nodes, senders, receivers):
    h = nodes @ params["encode"]
    for layer in params["layers"]:
        messages = jax.nn.relu(h[senders] @ layer["msg"]["w"] + layer["msg"]["b"])
        h = h + jax.ops.segment_sum(messages, receivers, num_segments=h.shape[0]) @ layer["update"]["w"]
    return h @ params["decode"]


def make(n_nodes=16, n_edges=32, features=8, state=32, hidden=64, layers=2, out=4):
    tx = optax.sgd(1e-2)

    def step(params, opt_state, nodes, senders, receivers, targets):
        def loss_fn(p):
            return jnp.mean((forward(p, nodes, senders, receivers) - targets) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(17)

    def dense(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    params = {"encode": dense(features, state), "decode": dense(state, out),
              "layers": [{"msg": {"w": dense(state, hidden), "b": np.zeros(hidden, np.float32)},
                          "update": {"w": dense(hidden, state) / layers}} for _ in range(layers)]}
    nodes = rng.standard_normal((n_nodes, features)).astype(np.float32)
    senders, receivers = rng.integers(0, n_nodes, (2, n_edges), dtype=np.int32)
    targets = rng.standard_normal((n_nodes, out)).astype(np.float32)
    return step, (params, tx.init(params), nodes, senders, receivers, targets)
