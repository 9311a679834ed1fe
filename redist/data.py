"""Moving between a global array and per-device shards of a sharding type."""

from __future__ import annotations

import numpy as np

from redist.errors import ShardingError, shown
from redist.types import ShardingType


def shard(t: ShardingType, global_array) -> list[np.ndarray]:
    """The local buffer of every device (index = device id) for ``global_array`` laid out as ``t``."""
    _check_type(t, "shard")
    if t.partial:
        raise ShardingError(f"cannot shard a global array as the partial type {t}: summands are not determined")
    x = np.asarray(global_array)
    if x.shape != t.shape:
        raise ShardingError(f"array of shape {x.shape} does not match the type {t}")
    x = x.astype(t.np_dtype, copy=False)
    out = []
    for d in range(t.mesh.size):
        local = np.zeros(t.local_shape, t.np_dtype)  # padding (uneven dims) is zero
        local[t.data_box(d)] = x[t.local_box(d)]
        out.append(local)
    return out


def _check_type(t, where: str) -> None:
    if not isinstance(t, ShardingType):
        raise ShardingError(f"{where}() takes a redist.ShardingType first, got {type(t).__name__} {shown(t)}")


def summands(t: ShardingType, value, rng: np.random.Generator, low: int = -4, high: int = 5) -> list[np.ndarray]:
    """Per-device buffers of ``t`` whose partial-group sums are ``value``'s blocks (``shard`` for a type
    without partial axes).

    Every group of devices that differ only in the partial axes gets its own random integer summands in
    ``[low, high)`` (padding too), and its first member the remainder, so float sums of integer values are
    exact; test data that catches a plan which drops, doubles or mixes summands (any summands whose group sums
    are right must give the right result). For ``bool``, whose sum is a logical or, the summands are random
    bits where the value is true (the first member's set wherever no other member's is) and false elsewhere.
    """
    whole = shard(t.replace(partial=()), value)
    if not t.partial:
        return whole
    if t.dtype == "bool":
        bufs = [np.asarray(rng.random(x.shape) < 0.5) for x in whole]
        for group in t.mesh.groups(t.partial):
            value_bits = whole[group[0]]
            for d in group[1:]:
                bufs[d] = bufs[d] & value_bits
            rest = np.logical_or.reduce([bufs[d] for d in group[1:]]) if group[1:] else np.zeros_like(value_bits)
            bufs[group[0]] = value_bits & (~rest | bufs[group[0]])
        return [np.asarray(b) for b in bufs]
    bufs = [np.asarray(rng.integers(low, high, size=x.shape)).astype(x.dtype) for x in whole]
    for group in t.mesh.groups(t.partial):
        rest = sum((bufs[d] for d in group[1:]), np.zeros_like(whole[group[0]]))
        bufs[group[0]] = np.asarray(whole[group[0]] - rest).astype(whole[group[0]].dtype)
    return bufs


def unshard(t: ShardingType, shards) -> np.ndarray:
    """The global array that per-device ``shards`` of type ``t`` represent; partial axes are summed.

    Only the data part of each buffer is read (padding is not). Each group of devices that differ only in the
    partial axes contributes the sum of its buffers to its block. Replicas must agree: if two groups that hold
    the same block disagree, this raises :class:`ShardingError` rather than pick one.
    """
    _check_type(t, "unshard")
    mesh = t.mesh
    if len(shards) != mesh.size:
        raise ShardingError(f"expected {mesh.size} shards (one per device), got {len(shards)}")
    for d, x in enumerate(shards):
        if np.shape(x) != t.local_shape:
            raise ShardingError(f"shard of device {d} has shape {np.shape(x)}, expected {t.local_shape} for {t}")
    out = np.zeros(t.shape, dtype=t.np_dtype)
    seen: dict = {}
    for group in mesh.groups(t.partial):
        total = np.asarray(shards[group[0]], dtype=t.np_dtype)
        for d in group[1:]:
            total = (total + np.asarray(shards[d], dtype=t.np_dtype)).astype(t.np_dtype)
        box = t.local_box(group[0])
        total = total[t.data_box(group[0])]
        key = tuple((s.start, s.stop) for s in box)
        if key in seen:
            if not np.array_equal(seen[key], total, equal_nan=total.dtype.kind == "f"):
                raise ShardingError(f"devices disagree on replicated block {box} of {t} (device {group[0]})")
            continue
        seen[key] = total
        out[box] = total
    return out


def poison_padding(t: ShardingType, bufs) -> list[np.ndarray]:
    """Copies of per-device buffers of ``t`` with every padding position (outside :meth:`ShardingType.data_box`)
    set to NaN (floats; it spreads through sums and equals nothing), the largest integer (integer dtypes) or
    True (bool, which has no value that cannot be data). For tests: a program that reads padding as data then
    gives a wrong value."""
    kind = t.np_dtype.kind
    fill = np.iinfo(t.np_dtype).max if kind in "iu" else True if kind == "b" else np.nan
    out = []
    for d, b in enumerate(bufs):
        b = np.array(b, dtype=t.np_dtype, order="C")
        data = np.zeros(b.shape, bool)
        data[t.data_box(d)] = True
        b[~data] = fill
        out.append(b)
    return out


def poisoned_source(t: ShardingType, rng: np.random.Generator, low: int = -20, high: int = 20):
    """For tests: a random value of ``t``'s shape and dtype (random bits for bool, integers in ``[low, high)``
    otherwise) and per-device buffers of ``t`` that hold it (:func:`summands`) with their padding poisoned
    (:func:`poison_padding`). Returns ``(value, buffers)``."""
    if t.dtype == "bool":
        value = rng.random(t.shape) < 0.5
    else:
        value = rng.integers(low, high, size=t.shape).astype(t.np_dtype)
    return value, poison_padding(t, summands(t, value, rng))
