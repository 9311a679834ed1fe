"""A decoder-only language model written with flax.linen, as a model the automatic partitioner was not tuned on.

:func:`flax_lm` returns a :class:`partir_core.models.Model` whose step is a training step (cross-entropy,
``jax.grad``, momentum SGD) over the flax module's parameter tree, so its input paths are flax's own
(``params/params/Block_0/MultiHeadDotProductAttention_0/query/kernel``, ...). :func:`megatron` gives the
expert strategy written for those names (the reference presets of :mod:`partir_core.schedules` name the
plain-JAX models' weights) and :func:`is_megatron` checks a partitioned program for it.

Layers: token and position embeddings (``nn.Embed``, a learned table), pre-layernorm blocks of causal
``nn.MultiHeadDotProductAttention`` (q/k/v kernels ``(D, heads, dh)``, output kernel ``(heads, dh, D)``) and a
GELU MLP, a final layernorm and an unembedding ``Dense``. The MLP is written ``nn.Dense(D)(gelu(nn.Dense(F)(h)))``
as flax's examples write it: flax names a submodule when it is made, and the outer ``nn.Dense(D)`` is made
before its argument is evaluated, so the second matmul is ``Dense_0`` ``(F, D)`` and the first ``Dense_1``
``(D, F)``.
"""

from __future__ import annotations

import fnmatch

import jax
import jax.numpy as jnp

from partir_core.models import Model, sgd_momentum
from partir_core.tactics import ManualPartition

try:  # flax is a test dependency; the module imports without it, flax_lm() then raises
    import flax.linen as nn
except ImportError:  # pragma: no cover - depends on the environment
    nn = None

ATTENTION = "params/params/Block_*/MultiHeadDotProductAttention_0"
MLP = "params/params/Block_*/Dense_{}/kernel"


def _modules(vocab, d_model, layers, heads, mlp_ratio):
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
            x = x + nn.MultiHeadDotProductAttention(num_heads=heads)(h, h, mask=mask)
            h = nn.LayerNorm()(x)
            h = nn.Dense(d_model)(nn.gelu(nn.Dense(mlp_ratio * d_model)(h)))
            return x + h

    class LM(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(vocab, d_model)(tokens)
            pos = self.param("pos", nn.initializers.normal(0.1), (tokens.shape[1], d_model))
            x = x + pos[None]
            for _ in range(layers):
                x = Block()(x)
            return nn.Dense(vocab, use_bias=False)(nn.LayerNorm()(x))

    return LM()


def flax_lm(vocab=64, d_model=32, layers=2, heads=4, seq=16, batch=8, mlp_ratio=4) -> Model:
    """The model and its step; inputs ``(params, momentum, tokens, targets)`` with ``params`` flax's variable
    dict (``{"params": {...}}``). Raises ImportError without flax."""
    if nn is None:
        raise ImportError("flax_lm needs flax (pip install flax)")
    lm = _modules(vocab, d_model, layers, heads, mlp_ratio)

    def loss(params, tokens, targets):
        logp = jax.nn.log_softmax(lm.apply(params, tokens), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    def step(params, momentum, tokens, targets):
        value, grads = jax.value_and_grad(loss)(params, tokens, targets)
        params, momentum = sgd_momentum(params, momentum, grads)
        return params, momentum, value

    def init(key):
        k1, k2 = jax.random.split(key)
        tokens = jax.random.randint(k1, (batch, seq), 0, vocab, jnp.int32)
        params = lm.init(k2, tokens)
        return params, jax.tree.map(jnp.zeros_like, params), tokens, jnp.roll(tokens, -1, axis=1)

    return Model("flax_lm", step, init, {"tokens": 0, "targets": 0})


def megatron(model_axis="model") -> list:
    """Megatron on the flax LM: attention heads (dim 1 of the q/k/v kernels and their biases' dim 0, dim 0 of
    the output kernel) and the MLP's hidden dim (the first matmul, ``Dense_1``, column-split with its bias; the
    second, ``Dense_0``, row-split)."""
    dims = {f"{ATTENTION}/{p}/kernel": 1 for p in ("query", "key", "value")}
    dims.update({f"{ATTENTION}/{p}/bias": 0 for p in ("query", "key", "value")})
    dims[f"{ATTENTION}/out/kernel"] = 0
    dims[MLP.format(1)] = 1
    dims["params/params/Block_*/Dense_1/bias"] = 0
    dims[MLP.format(0)] = 0
    return [ManualPartition(dims, axis=model_axis)]


def is_megatron(low) -> tuple[bool, bool]:
    """``(mlp, attention)``: whether every block's MLP is split Megatron-style (the first matmul, ``Dense_1``, on
    its output dim and the second, ``Dense_0``, on its input dim over a common mesh axis), and every block's
    attention (the heads dim of the query kernel and of the output kernel over a common axis), in the
    partitioned program ``low``."""
    paths = low.graph.in_paths

    def common(pattern_a, dim_a, pattern_b, dim_b):
        a = sorted(p for p in paths if fnmatch.fnmatchcase(p, pattern_a))
        b = sorted(p for p in paths if fnmatch.fnmatchcase(p, pattern_b))
        return bool(a) and len(a) == len(b) and all(
            set(low.input_type(x).dims[dim_a]) & set(low.input_type(y).dims[dim_b]) for x, y in zip(a, b))

    return (common(MLP.format(1), 1, MLP.format(0), 0),
            common(f"{ATTENTION}/query/kernel", 1, f"{ATTENTION}/out/kernel", 0))
