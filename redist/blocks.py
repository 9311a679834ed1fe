"""Device geometry: which device holds which block of an array, and the copies that move blocks between layouts.

A sharding type ``t`` (:mod:`redist.types`) splits dim ``i`` of size ``N`` into ``k`` blocks of ``L = ceil(N / k)``
elements; device ``d`` holds block ``b = block_index(t, i, d)`` (its rank over the dim's axes), that is the
elements ``[min(N, b·L), min(N, (b+1)·L))`` of the dim, at the start of its local buffer. Per device these
ranges make a *box* of global indices (:func:`local_box`), stored in the box ``data_box`` of its buffer; the
rest of the buffer is padding. A device is named by its id; its block is that of its position on the type's
mesh (:class:`redist.Mesh`: the device order), so the two types of a permute or exchange may lie on meshes
with the same axes and different device orders. Everything here is a pure function of types (and device ids);
the plan steps
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
def _blocks(t: ShardingType, device: int) -> tuple[int, ...]:
    """The block of every dim of ``t`` that ``device`` holds."""
    return tuple(block_index(t, i, device) for i in range(t.rank))


@lru_cache(maxsize=4096)
def permute_sources(t_in: ShardingType, t_out: ShardingType) -> tuple[int, ...]:
    """For each device, the device whose buffer under ``t_in`` it must hold under ``t_out``.

    Both types have the same block count in every dim and the same partial axes; their meshes have the same
    axes and may differ in device order. Summands move as whole partial groups (the devices that differ only
    on the partial axes): every group of ``t_out`` takes the buffers of one group of ``t_in`` that holds its
    blocks (:func:`_members`), so that its reduction is the value. A destination group that is a source group
    (the same devices) holding its blocks keeps its buffers; each other takes, among the remaining source
    groups of its blocks, the one that shares the most devices with it, else the first (both in order of
    lowest device id), so the result is a permutation. Without partial axes every group is one device: a
    device that already holds its block keeps it, the others take the remaining holders of their block in
    device order.
    """
    groups_in = [tuple(g) for g in t_in.mesh.groups(t_in.partial)]
    groups_out = [tuple(g) for g in t_out.mesh.groups(t_out.partial)]
    group_of = {d: g for g in groups_in for d in g}
    sets_in = {frozenset(g) for g in groups_in}
    kept = {frozenset(g) for g in groups_out
            if frozenset(g) in sets_in and _blocks(t_in, g[0]) == _blocks(t_out, g[0])}
    spare: dict = {}  # blocks -> {source group: None}, in order of lowest device id
    for g in groups_in:
        if frozenset(g) not in kept:
            spare.setdefault(_blocks(t_in, g[0]), {})[g] = None
    sources = list(range(t_in.mesh.size))
    for g in groups_out:
        if frozenset(g) in kept:
            continue
        free = spare[_blocks(t_out, g[0])]
        shared = {}
        for d in g:
            if group_of[d] in free:
                shared[group_of[d]] = shared.get(group_of[d], 0) + 1
        src = max(shared, key=lambda h: (shared[h], -h[0])) if shared else next(iter(free))
        del free[src]
        for d, s in _members(g, src):
            sources[d] = s
    return tuple(sources)


def _members(dst_group, src_group) -> list[tuple[int, int]]:
    """``(device, source)`` pairs that give each member of ``dst_group`` one summand of ``src_group`` (groups of
    one size; reductions are commutative, so any pairing gives the group's value): a device in both keeps its
    own, the others pair in rank order."""
    common = set(dst_group) & set(src_group)
    rest = iter([s for s in src_group if s not in common])
    return [(d, d if d in common else next(rest)) for d in dst_group]


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

    Both types have the same partial axes; their meshes have the same axes and may differ in device order.
    Summands move as whole partial groups (the devices that differ only on the partial axes; one device each
    without partial axes): for each source block (the elements a source group holds) that meets a destination
    group's block, one source group holding it is chosen, and the member of rank ``r`` of the destination
    group copies from the member of rank ``r`` of that source group, so that every group sum adds each
    summand of one source group once (a device in both groups takes its own: :func:`_members`). The chosen
    group is the holder that shares the most devices with the destination group (itself, where the
    destination group is a source group holding the block: its members copy from themselves), then the one
    whose first member shares the most mesh coordinates (on ``t_in``'s mesh) with the destination group's
    first member, then the one of lowest device id.
    """
    mesh = t_in.mesh
    coords = [tuple(mesh.coords(d).values()) for d in range(mesh.size)]
    holders: dict = {}  # source box -> the source groups that hold it, in order of lowest device id
    for g in mesh.groups(t_in.partial):
        holders.setdefault(tuple((s.start, s.stop) for s in local_box(t_in, g[0])), []).append(tuple(g))
    out: list = [()] * mesh.size
    for group in t_out.mesh.groups(t_out.partial):
        group = tuple(group)
        want = local_box(t_out, group[0])
        first = coords[group[0]]
        copies: list[list[Copy]] = [[] for _ in group]
        for box, groups in holders.items():
            lo = [max(a, w.start) for (a, _), w in zip(box, want)]
            hi = [min(b, w.stop) for (_, b), w in zip(box, want)]
            if any(h <= l for l, h in zip(lo, hi)):
                continue
            members = set(group)
            src = min(groups, key=lambda g: (-len(members.intersection(g)),
                                             -sum(x == y for x, y in zip(coords[g[0]], first)), g[0]))
            src_start = tuple(l - a for l, (a, _) in zip(lo, box))
            dst_start = tuple(l - w.start for l, w in zip(lo, want))
            size = tuple(h - l for l, h in zip(lo, hi))
            for r, (_, s) in enumerate(_members(group, src)):
                copies[r].append(Copy(s, src_start, dst_start, size))
        for d, cs in zip(group, copies):
            out[d] = tuple(sorted(cs, key=lambda c: c.source != d))
    return tuple(out)
