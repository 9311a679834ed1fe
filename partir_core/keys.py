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

Which random bits a device draws is the registry's (:mod:`partir_core.registry`): ``random_bits`` and
``random_split`` are generated whole per key, so their new dims are replicated and sliced locally afterwards;
along the key dims they run on the local keys, which JAX defines to give each key's own bits.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

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
