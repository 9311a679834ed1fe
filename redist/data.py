"""Moving between a global array and per-device shards of a sharding type; and, for tests, random data in
such shards (random values, summands of a pending sum, poisoned padding)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from redist.buffers import as_array, mesh_buffers
from redist.errors import ShardingError, shown
from redist.types import REDUCERS, ShardingType


def shard(t: ShardingType, global_array) -> list[np.ndarray | None]:
    """The local buffer of every device (index = device id) for ``global_array`` laid out as ``t``: new
    arrays of ``t.local_shape`` and ``t``'s dtype, padding (uneven dims) zero, in a list of
    ``t.mesh.id_bound`` entries (one past the largest device id; ``t.mesh.size`` where the ids are
    ``0 … size−1``), ``None`` at the numbers that are no device of ``t.mesh``.

    ``global_array`` is converted to ``t``'s dtype only without loss (:mod:`redist.buffers`): an array of that
    dtype or of one whose every value it holds (``i8`` data for ``i32``), or Python numbers that it holds
    exactly. Raises :class:`ShardingError` for a partial ``t``, a shape other than ``t.shape``, or data that
    does not fit (complex or ``f64`` data for ``f32``, NaN or 3.7 for ``i32``, 300 for ``u8``).
    """
    _check_type(t, "shard")
    if t.partial:
        raise ShardingError(f"cannot shard a global array as the partial type {t}: summands are not determined")
    x = as_array(global_array, t.np_dtype, f"the global array for {t}")
    if x.shape != t.shape:
        raise ShardingError(f"array of shape {x.shape} does not match the type {t}")
    out: list[np.ndarray | None] = [None] * t.mesh.id_bound
    for d in t.mesh.devices:
        local = np.zeros(t.local_shape, t.np_dtype)  # padding (uneven dims) is zero
        local[t.data_box(d)] = x[t.local_box(d)]
        out[d] = local
    return out


def _check_type(t, where: str) -> None:
    if not isinstance(t, ShardingType):
        raise ShardingError(f"{where}() takes a redist.ShardingType first, got {type(t).__name__} {shown(t)}")


def summands(t: ShardingType, value, rng: np.random.Generator, low: int = -4, high: int = 5) -> list[np.ndarray]:
    """Per-device buffers of ``t`` whose partial-group reductions (``t.reduction``) are ``value``'s blocks
    (``shard`` for a type without partial axes).

    Test data that catches a plan which drops, doubles or mixes summands (any summands whose group reductions
    are right must give the right result): every group of devices that differ only in the partial axes gets
    its own random summands, exact in the dtype (padding too):

    - sum: random integers in ``[low, high)`` (narrowed for floats so that a group sum is exact in any order:
      :func:`_exact_sum_range`), the first member the remainder; for
      ``bool``, whose sum is a logical or, random bits where the value is true (the first member's set
      wherever no other member's is) and false elsewhere;
    - max (min): random integers in ``[low, high)`` no larger (smaller) than the value, and at each element
      a random member holds the value itself (for ``bool``: random bits under the value);
    - prod: the other members random units (``±1``; ``1`` for unsigned integers; ``±1, ±1j`` for complex),
      real and complex floats times a power of two with the powers cancelling out (``2`` on one member,
      ``0.5`` on another), and the first member the quotient, exact; for ``bool`` (logical and) as min.
    """
    whole = shard(t.replace(partial=()), value)
    if not t.partial:
        return whole
    kind = "min" if t.dtype == "bool" and t.reduction == "prod" else t.reduction
    if kind == "sum":
        low, high = _exact_sum_range(t, value, low, high)
    bufs = [None if x is None else random_array(rng, x.shape, x.dtype, low, high) for x in whole]
    for group in t.mesh.groups(t.partial):
        members = _GROUP_SUMMANDS[kind]([bufs[d] for d in group], whole[group[0]], rng)
        for d, b in zip(group, members):
            bufs[d] = np.asarray(b).astype(t.np_dtype)
    return bufs


def _exact_sum_range(t: ShardingType, value, low: int, high: int) -> tuple[int, int]:
    """``[low, high)`` narrowed so that a group sum of float summands is exact in any order: with ``k``
    members drawn within ``s`` of zero, the remainder member is at most ``|value| + (k-1)·s`` and every
    partial sum at most ``|value| + 2(k-1)·s``, which must stay within the integers the dtype holds exactly
    (256 for bf16, 2048 for f16): a backend that sums in another order than the caller must get the same
    value. Where even ``s = 0`` does not fit, the members other than the first are zero."""
    value = np.asarray(value)
    k = t.mesh.group_size(t.partial)
    if k < 2 or value.dtype.kind in "iub":  # integers sum exactly; bf16 is kind "V" (ml_dtypes), a float
        return low, high
    limit = 2 ** (ml_dtypes.finfo(value.real.dtype).nmant + 1)
    room = limit - int(np.abs(value.real).max(initial=0))
    spread = max(0, room // (2 * (k - 1)))
    return max(low, -spread), min(high, spread + 1)


def _sum_summands(members, value, rng):
    """Summands of ``value`` by addition (see :func:`summands`), from the random ``members``."""
    if value.dtype == np.bool_:
        members = [members[0]] + [m & value for m in members[1:]]
        rest = np.logical_or.reduce(members[1:]) if members[1:] else np.zeros_like(value)
        return [value & (~rest | members[0])] + members[1:]
    rest = sum(members[1:], np.zeros_like(value))
    return [value - rest] + members[1:]


def _extreme_summands(bound, members, value, rng):
    """Members bounded by ``value`` through ``bound`` (``np.minimum`` for a max, ``np.maximum`` for a min),
    and at each element a random member equal to ``value``."""
    holder = rng.integers(0, len(members), size=value.shape)
    return [np.where(holder == r, value, bound(m, value)) for r, m in enumerate(members)]


def _prod_summands(members, value, rng):
    """Members whose product is ``value``: random units (and cancelling powers of two for floats) on all but
    the first, the quotient on the first."""
    kind = value.dtype.kind if value.dtype.kind in "biufc" else "f"  # bf16 (ml_dtypes) is a float of kind "V"
    units = ([1, -1, 1j, -1j] if kind == "c" else [1] if kind == "u" else [1, -1])
    others = [rng.choice(units, size=value.shape) for _ in members[1:]]
    if kind in "fc":  # a power of two on some member, its inverse on another: the product stays a unit
        scales = np.ones(len(others))
        pairs = rng.permutation(len(others))
        scales[pairs[: len(others) // 2 * 2: 2]], scales[pairs[1: len(others) // 2 * 2: 2]] = 2.0, 0.5
        others = [o * s for o, s in zip(others, scales)]
    product = np.prod(others, axis=0) if others else np.ones(value.shape)
    first = value.astype(np.complex128 if kind == "c" else np.float64) / product if kind in "fc" else \
        value * product.astype(value.dtype)
    return [first] + [o.real if kind != "c" else o for o in others]


_GROUP_SUMMANDS = {
    "sum": _sum_summands,
    "max": lambda members, value, rng: _extreme_summands(np.minimum, members, value, rng),
    "min": lambda members, value, rng: _extreme_summands(np.maximum, members, value, rng),
    "prod": _prod_summands,
}


def unshard(t: ShardingType, shards) -> np.ndarray:
    """The global array that per-device ``shards`` of type ``t`` represent; partial axes are reduced by
    ``t.reduction`` (:data:`redist.types.REDUCERS`).

    Only the data part of each buffer is read (padding is not). Each group of devices that differ only in the
    partial axes contributes the reduction of its buffers (in rank order) to its block. Replicas must agree:
    if two groups that hold the same block disagree, this raises :class:`ShardingError` rather than pick
    one. The shards are taken as :func:`redist.buffers.device_buffers` takes them (a list of
    ``t.mesh.id_bound`` entries indexed by device id: a buffer of ``t.local_shape`` in ``t``'s dtype, or one
    that converts without loss, per device of ``t.mesh``, ``None`` at every other number), else
    :class:`ShardingError`.
    """
    _check_type(t, "unshard")
    mesh = t.mesh
    shards = mesh_buffers(shards, mesh, t.local_shape, t.np_dtype)
    out = np.zeros(t.shape, dtype=t.np_dtype)
    seen: dict = {}
    reduce = REDUCERS[t.reduction]
    for group in mesh.groups(t.partial):
        total = shards[group[0]]
        for d in group[1:]:
            total = reduce(total, shards[d]).astype(t.np_dtype)
        box = t.local_box(group[0])
        total = total[t.data_box(group[0])]
        key = tuple((s.start, s.stop) for s in box)
        if key in seen:
            if not np.array_equal(seen[key], total, equal_nan=total.dtype.kind in "fc"):
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
    out = mesh_buffers(bufs, t.mesh, t.local_shape, t.np_dtype, copy=True)
    for d in t.mesh.devices:
        data = np.zeros(out[d].shape, bool)
        data[t.data_box(d)] = True
        out[d][~data] = fill
    return out


def random_array(rng: np.random.Generator, shape, dtype, low: int = -20, high: int = 20,
                 distinct: bool = False) -> np.ndarray:
    """For tests: a random array of ``shape`` and ``dtype`` that the dtype holds exactly, so that sums of it
    are exact: random bits for ``bool``; else integers in ``[low, high)``, or with ``distinct`` the integers
    ``1 … N`` in random order (every element different wherever the dtype holds ``N`` exactly, so that a
    misplaced element shows). Complex arrays have such integers as their real part and random integers in
    ``[low, high)`` as their imaginary part."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    if distinct:
        real = (rng.permutation(math.prod(shape)) + 1).reshape(shape)
    else:
        real = np.asarray(rng.integers(low, high, size=shape))
    if dtype.kind == "c":
        return (real + 1j * rng.integers(low, high, size=shape)).astype(dtype)
    return real.astype(dtype)


def poisoned_source(t: ShardingType, rng: np.random.Generator, low: int = -20, high: int = 20,
                    distinct: bool = False):
    """For tests: a random value of ``t``'s shape and dtype (:func:`random_array` with ``low``, ``high`` and
    ``distinct``) and per-device buffers of ``t`` that hold it (:func:`summands`) with their padding poisoned
    (:func:`poison_padding`). Returns ``(value, buffers)``."""
    value = random_array(rng, t.shape, t.np_dtype, low, high, distinct)
    return value, poison_padding(t, summands(t, value, rng))
