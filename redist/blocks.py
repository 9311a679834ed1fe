"""Device geometry: which device holds which block of an array, and the copies that move blocks between layouts.

A sharding type ``t`` (:mod:`redist.types`) splits dim ``i`` of size ``N`` into ``k`` blocks of ``L = ceil(N / k)``
elements; device ``d`` holds block ``b = block_index(t, i, d)`` (its rank over the dim's axes), that is the
elements ``[min(N, b·L), min(N, (b+1)·L))`` of the dim, at the start of its local buffer. Per device these
ranges make a *box* of global indices (:func:`local_box`), stored in the box ``data_box`` of its buffer; the
rest of the buffer is padding. Everything here is a pure function of types (and device ids); the plan steps
(:mod:`redist.steps`), their lowering (:mod:`redist.program`), the cost model and the bounds read it:

- :func:`missing_elements`: how many elements of its new box a device lacks (what a point-to-point step
  receives, and what :func:`redist.lower_bound_bytes` counts);
- :func:`permute_sources`: for a permute (same block counts), the device whose whole buffer each device takes;
- :func:`exchange_copies`: for an exchange (any two layouts with the same partial axes), the boxes each device
  copies from which device (:class:`Copy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types calls this module: a runtime import would be a cycle
    from redist.types import ShardingType


# ---------------------------------------------------------------------- blocks and boxes
def block_index(t: ShardingType, dim: int, device: int) -> int:
    """The block of dim ``dim`` of ``t`` that ``device`` holds: its rank in its group over ``t.dims[dim]``."""
    return t.mesh.group_index(device, t.dims[dim])


def local_box(t: ShardingType, device: int) -> tuple[slice, ...]:
    """The global index box of the elements ``device`` holds under ``t`` (padding is not an element: for an
    uneven dim the box can be shorter than the local buffer, or empty)."""
    box = []
    for i, (n, L) in enumerate(zip(t.shape, t.local_shape)):
        b = block_index(t, i, device)
        box.append(slice(min(n, b * L), min(n, (b + 1) * L)))
    return tuple(box)


def data_box(t: ShardingType, device: int) -> tuple[slice, ...]:
    """The box of ``device``'s local buffer that holds its elements (at the start; the rest is padding)."""
    return tuple(slice(0, s.stop - s.start) for s in local_box(t, device))


def box_size(box) -> int:
    """The number of indices in a box of slices (with steps of 1)."""
    return math.prod(s.stop - s.start for s in box)


def missing_elements(src: ShardingType, dst: ShardingType, device: int) -> int:
    """How many of the elements ``device`` holds under ``dst`` it does not hold under ``src`` (padding is not
    an element)."""
    have, want = local_box(src, device), local_box(dst, device)
    overlap = 1
    for s, t in zip(have, want):
        overlap *= max(0, min(s.stop, t.stop) - max(s.start, t.start))
    return box_size(want) - overlap


# ---------------------------------------------------------------------- moving blocks
@lru_cache(maxsize=4096)
def permute_sources(t_in: ShardingType, t_out: ShardingType) -> tuple[int, ...]:
    """For each device, the device whose buffer under ``t_in`` it must hold under ``t_out``.

    Both types must have the same block count in every dim and the same partial axes. A device that already
    holds its target block is its own source; the others are paired with the remaining holders of their
    block (same partial coordinates too) in device order, so the result is a permutation.
    """
    mesh = t_in.mesh

    def key(t: ShardingType, d: int):
        return (tuple(block_index(t, i, d) for i in range(t.rank)),
                tuple(mesh.group_index(d, (a,)) for a in t.partial))

    k_in = [key(t_in, d) for d in range(mesh.size)]
    k_out = [key(t_out, d) for d in range(mesh.size)]
    spare: dict = {}
    for d in range(mesh.size):
        if k_in[d] != k_out[d]:
            spare.setdefault(k_in[d], []).append(d)
    sources = []
    for d in range(mesh.size):
        sources.append(d if k_in[d] == k_out[d] else spare[k_out[d]].pop(0))
    return tuple(sources)


@dataclass(frozen=True)
class Copy:
    """``dst[dst_start : dst_start + size] = buffer of device source[src_start : src_start + size]``, per dim."""

    source: int
    src_start: tuple[int, ...]
    dst_start: tuple[int, ...]
    size: tuple[int, ...]

    @property
    def src_box(self) -> tuple[slice, ...]:
        """The copied box of the source device's buffer."""
        return tuple(slice(a, a + n) for a, n in zip(self.src_start, self.size))

    @property
    def dst_box(self) -> tuple[slice, ...]:
        """The box of the destination buffer it fills."""
        return tuple(slice(a, a + n) for a, n in zip(self.dst_start, self.size))


@lru_cache(maxsize=1024)
def exchange_copies(t_in: ShardingType, t_out: ShardingType) -> tuple[tuple[Copy, ...], ...]:
    """For each device, the copies that assemble its buffer under ``t_out`` from buffers under ``t_in``.

    Both types have the same partial axes, and a device takes summands only from devices with its partial
    coordinates, whose choice depends only on its other coordinates: the devices of one destination partial
    group read from the devices of one source partial group. Each source block (the elements some devices
    hold) that meets the device's destination block is copied once: from the device itself if it holds the
    block, else from the holder that shares the most mesh coordinates with it (then the lowest id).
    """
    mesh = t_in.mesh
    n = mesh.size
    coords = [tuple(mesh.coords(d).values()) for d in range(n)]

    layer = [tuple(mesh.group_index(d, (a,)) for a in t_in.partial) for d in range(n)]
    holders: dict = {}
    for d in range(n):
        holders.setdefault((layer[d], tuple((s.start, s.stop) for s in local_box(t_in, d))), []).append(d)
    out = []
    for d in range(n):
        want = local_box(t_out, d)
        copies = []
        for (lay, box), devs in holders.items():
            if lay != layer[d]:
                continue
            lo = [max(a, w.start) for (a, _), w in zip(box, want)]
            hi = [min(b, w.stop) for (_, b), w in zip(box, want)]
            if any(h <= l for l, h in zip(lo, hi)):
                continue
            s = d if d in devs else min(devs, key=lambda e: (-sum(x == y for x, y in zip(coords[e], coords[d])), e))
            copies.append(Copy(s, tuple(l - a for l, (a, _) in zip(lo, box)),
                               tuple(l - w.start for l, w in zip(lo, want)), tuple(h - l for l, h in zip(lo, hi))))
        out.append(tuple(sorted(copies, key=lambda c: c.source != d)))
    return tuple(out)
