"""Random keys: how arrays of PRNG keys (dtype ``key<impl>``, from ``jax.random.key`` or made inside a step)
are typed, moved and priced.

A key array of shape ``S`` is stored as its *key data* (``jax.random.key_data``): a ``uint32`` array of shape
``S + K``, with ``K`` fixed by the key's implementation (``(2,)`` for threefry, ``(4,)`` for rbg). A legacy
``PRNGKey`` is such key data already, an ordinary ``uint32`` array. partir_core treats a key array as follows.

- IR, rules, propagation and tactics see the key shape ``S`` and the key dtype (:attr:`ir.Graph.avals`), so a
  key array's dims are named and split like any array's (``ManualPartition({"keys": 0}, axis="batch")``).
- Its :class:`redist.ShardingType` is its key data's (:func:`sharding_type`): the dims of ``S`` as decided,
  the trailing key-data dims always replicated (one key is never split across devices). Byte counts, reshard
  plans and the simulator therefore count key data: 8 bytes per threefry key.
- The local program holds key arrays and runs the ops on them unchanged. A reshard moves the key data
  (:func:`to_data`, the ``redist`` plan, :func:`from_data`); the ``shard_map`` program takes and returns key
  data at its boundary.

Which random bits a device draws is the registry's (:mod:`partir_core.registry`). Along the key dims,
``random_bits`` and ``random_split`` run on the local keys, which JAX defines to give each key's own values.
Along the new dims, a threefry draw under ``jax_threefry_partitionable`` (JAX's default) is *counter-based*:
the value at each position hashes the key with that position's row-major index in the draw, so a device
draws its own block of any layout (:func:`draw_block`), as XLA's SPMD partitioner does. Any other draw
(``random_split``, rbg keys, the flag off) is generated whole per key and sliced locally afterwards.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.extend.random as jrandom
import numpy as np
from jax import lax

from redist.types import ShardingType


def is_key(dtype) -> bool:
    """Whether ``dtype`` is a JAX key dtype (``key<fry>``, ``key<rbg>``, ...)."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


@functools.lru_cache(maxsize=None)
def data_shape(dtype) -> tuple[int, ...]:
    """The trailing key-data dims ``K`` of one key of ``dtype`` (``(2,)`` for threefry)."""
    return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype)).shape


@functools.lru_cache(maxsize=1 << 16)
def sharding_type(mesh, shape, dtype, dims, partial=()) -> ShardingType:
    """The type of an array of ``shape`` and ``dtype`` with ``dims`` split as given: for a key array, the type of
    its key data (``uint32[shape + K]``, the key-data dims replicated). Cached (types are immutable; choosing
    a program builds the same few thousand over and over): the arguments must be hashable (tuples)."""
    if not is_key(dtype):
        return ShardingType(mesh, tuple(shape), dtype, tuple(dims), tuple(partial))
    k = data_shape(dtype)
    return ShardingType(mesh, tuple(shape) + k, np.uint32, tuple(dims) + ((),) * len(k), tuple(partial))


def to_data(x):
    """``x``'s key data if ``x`` is a key array, else ``x``."""
    return jax.random.key_data(x) if is_key(x.dtype) else x


def from_data(x, dtype):
    """The key array of ``dtype`` whose key data is ``x`` if ``dtype`` is a key dtype, else ``x``."""
    return jax.random.wrap_key_data(x, impl=_impl(dtype)) if is_key(dtype) else x


@functools.lru_cache(maxsize=None)
def _impl(dtype):
    """The PRNG implementation of key dtype ``dtype``, read off an abstract key of it: ``wrap_key_data`` takes
    an implementation on every JAX (its ``dtype=`` exists only from 0.10.1)."""
    found = []
    jax.eval_shape(lambda k: found.append(jax.random.key_impl(k)), jax.ShapeDtypeStruct((), dtype))
    return found[0]


def counter_based(dtype, shape) -> bool:
    """Whether ``random_bits`` of a key of ``dtype`` draws the value at each position of a ``shape`` draw from
    that position's row-major index alone, so that a device may draw any block of it (:func:`draw_block`):
    threefry keys under ``jax_threefry_partitionable``. A draw of ``2**32`` values or more per key is not
    counted as such (its indices need two words; it is drawn whole)."""
    return (is_key(dtype) and str(dtype) == f"key<{jrandom.threefry_prng_impl.tag}>"
            and bool(jax.config.jax_threefry_partitionable) and math.prod(shape) < 2 ** 32)


def draw_block(keys, bit_width: int, shape, block, starts):
    """The block of extents ``block`` starting at ``starts`` (traced or ints) of ``random_bits(keys, bit_width,
    shape)`` along its new dims, for threefry keys of any shape ``S`` (values ``S + block``); see
    :func:`counter_based`. Each value hashes its key with its row-major index in ``shape`` (high word 0), the
    two hash words xor-ed into ``bit_width`` bits, exactly as JAX's partitionable threefry draws it whole. A
    position past ``shape``'s end (a block's padding) draws bits nobody reads."""
    S = keys.shape
    out = tuple(S) + tuple(block)
    index, stride = None, 1
    for d in reversed(range(len(shape))):
        i = (lax.iota(np.uint32, block[d]) + lax.convert_element_type(starts[d], np.uint32)) * np.uint32(stride)
        i = lax.broadcast_in_dim(i, out, (len(S) + d,))
        index, stride = i if index is None else index + i, stride * shape[d]
    if index is None:
        index = lax.full(out, 0, np.uint32)
    data = jax.random.key_data(keys)
    # One key's two words stay scalars, as JAX's own draw passes them: the hash's loop then carries no
    # key-sized arrays.
    k1, k2 = (data[..., w] if not S else lax.broadcast_in_dim(data[..., w], out, tuple(range(len(S))))
              for w in (0, 1))
    bits1, bits2 = jrandom.threefry2x32_p.bind(k1, k2, lax.full(out, 0, np.uint32), index)
    if bit_width == 64:
        return lax.shift_left(bits1.astype(np.uint64), np.uint64(32)) | bits2.astype(np.uint64)
    bits = bits1 ^ bits2
    return bits if bit_width == 32 else bits.astype(np.dtype(f"uint{bit_width}"))
