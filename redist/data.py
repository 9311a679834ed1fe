"""Moving between a global array and per-device shards of a sharding type."""

from __future__ import annotations

import numpy as np

from redist.errors import ShardingError
from redist.types import ShardingType


def shard(t: ShardingType, global_array) -> list[np.ndarray]:
    """The local buffer of every device (index = device id) for ``global_array`` laid out as ``t``."""
    if t.partial:
        raise ShardingError(f"cannot shard a global array as the partial type {t}: summands are not determined")
    x = np.asarray(global_array)
    if x.shape != t.shape:
        raise ShardingError(f"array of shape {x.shape} does not match the type {t}")
    x = x.astype(t.np_dtype, copy=False)
    return [np.ascontiguousarray(x[t.local_box(d)]) for d in range(t.mesh.size)]


def unshard(t: ShardingType, shards) -> np.ndarray:
    """The global array that per-device ``shards`` of type ``t`` represent; partial axes are summed.

    Replicas must agree: if two devices that should hold the same block (and summand) hold different
    values, this raises :class:`ShardingError` rather than pick one.
    """
    mesh = t.mesh
    if len(shards) != mesh.size:
        raise ShardingError(f"expected {mesh.size} shards (one per device), got {len(shards)}")
    out = np.zeros(t.shape, dtype=t.np_dtype)
    seen: dict = {}
    for d in range(mesh.size):
        x = np.asarray(shards[d])
        if x.shape != t.local_shape:
            raise ShardingError(f"shard of device {d} has shape {x.shape}, expected {t.local_shape} for {t}")
        box = t.local_box(d)
        summand = tuple(mesh.group_index(d, (a,)) for a in t.partial)
        key = (tuple((s.start, s.stop) for s in box), summand)
        if key in seen:
            if not np.array_equal(seen[key], x, equal_nan=x.dtype.kind == "f"):
                raise ShardingError(f"devices disagree on replicated block {box} of {t} (device {d})")
            continue
        seen[key] = x
        out[box] = x if not t.partial else out[box] + x
    return out
