"""Lower bounds on the bytes any redistribution must receive."""

from __future__ import annotations

import math

import numpy as np

from redist.axes import difference, remove_axes
from redist.blocks import (DeviceClasses, box_overlaps_on, box_size, check_factors, device_id, local_box,
                           max_missing_elements, rank)
from redist.errors import ShardingError, shown
from redist.types import ShardingType


def lower_bound_bytes(src: ShardingType, dst: ShardingType) -> int:
    """``max_d (|T_d| − |T_d ∩ S_d|) · itemsize``: what some device lacks and must receive.

    ``S_d`` and ``T_d`` are the elements device ``d`` holds before and after (padding is not an element).
    For partial types an element is an (index, summand) pair, and a device keeps its own summand coordinates:
    with the same partial axes on both sides the formula is unchanged. When partial axes are reduced (over a
    group of two or more devices), every element a device ends with needs at least one value from another
    device, so the bound is ``max_d |T_d| · itemsize``: the device holding block 0 of every dim, whose box is
    ``Π min(N, L)``. When the destination creates pending sums, ``max_G ceil(m_G / |G|) · itemsize`` over its
    summand groups ``G`` (``m_G``: the elements of ``G``'s block that must reach it from outside). No plan can
    receive less (between two device orders a device may have to take another summand, so a plan may not reach the
    bound there, but it still holds). Computed from the block structure
    (:func:`redist.blocks.max_missing_elements`), in time independent of the device count on one device order;
    the creating bound visits each summand group of the destination once. Where that takes more classes of
    devices than :data:`redist.blocks.MAX_LISTED`, :class:`ShardingError` says so.
    """
    check_pair(src, dst)
    if difference(dst.partial, src.partial):
        return _creating_bound(src, dst)
    reduced = remove_axes(src.partial, dst.partial)
    if src.mesh.group_size(reduced) > 1:
        return math.prod(min(n, L) for n, L in zip(dst.shape, dst.local_shape)) * dst.itemsize
    return max_missing_elements(src, dst) * dst.itemsize


def _creating_bound(src: ShardingType, dst: ShardingType) -> int:
    """The bound when ``dst`` is partial over axes ``src`` is not: ``max_G ceil(m_G / |G|) · itemsize`` over
    the groups ``G`` of devices that differ only in ``dst``'s partial coordinates (a summand group of the
    destination), each holding one block ``B`` of the value between them.

    ``m_G`` is how many elements of ``B`` must reach the group from outside: every element of ``B`` if
    pending sums are reduced (the other summands of a source group are on devices outside ``G``, which differ
    from it in a reduced coordinate), else the elements of ``B`` that no member holds under ``src`` (a
    member that holds an element can keep it as the group's summand, the others contribute zeros). At least
    one value per such element enters the group, and some member receives ``1/|G|`` of them.
    """
    reduces = src.mesh.group_size(difference(src.partial, dst.partial)) > 1
    members = dst.mesh.group_size(dst.partial)
    if reduces:  # every element of B is needed; block 0 of every dim is the largest B
        return -(-math.prod(min(n, L) for n, L in zip(dst.shape, dst.local_shape)) // members) * dst.itemsize
    if src.mesh != dst.mesh:  # two device orders: the groups' members, device by device
        return _creating_bound_by_device(src, dst)
    return -(-int(_needed_by_group(src, dst).max(initial=0)) // members) * dst.itemsize


def _needed_by_group(src: ShardingType, dst: ShardingType) -> np.ndarray:
    """Per summand group of ``dst`` (without reductions, on one device order): the elements of its block that no
    member holds under ``src``. Computed per class of the axes the layouts and ``dst``'s partial axes use
    (:class:`redist.blocks.DeviceClasses`), not per device: a group is the classes that agree outside the
    partial pieces, and its members' source blocks are the distinct source-block ranks among them (blocks of
    one layout are equal or disjoint)."""
    mesh = src.mesh
    partial = mesh.axes_of(dst.partial)
    classes = DeviceClasses(mesh, [a for t in (src, dst) for d in t.dims for a in d] + list(partial))
    c = classes.coords
    lt, o = box_overlaps_on(src, dst, range(src.rank), c)
    lt, o = np.broadcast_to(lt, (classes.size,)), np.broadcast_to(o, (classes.size,))
    key = {name: c[name].copy() for name in mesh.names}  # the class's coordinates with partial pieces zeroed
    for name, lo, hi in classes.pieces:
        if any(a.name == name and a.pre <= lo and hi <= a.stop for a in partial):
            stride = mesh.axis_size(name) // hi
            key[name] -= key[name] // stride % (hi // lo) * stride
    group = np.asarray(device_id(mesh, key), np.int64)
    blocks = np.stack([group] + [np.broadcast_to(rank(c, d), (classes.size,)) for d in src.dims])
    _, first = np.unique(blocks, axis=1, return_index=True)  # one class per (group, source block)
    groups, at = np.unique(group, return_inverse=True)
    held = np.zeros(groups.size, o.dtype)
    np.add.at(held, at[first], o[first])
    need = np.zeros(groups.size, lt.dtype)
    need[at] = lt  # the members share one block
    return need - held


def _creating_bound_by_device(src: ShardingType, dst: ShardingType) -> int:
    """:func:`_creating_bound` without reductions between two device orders, group by group."""
    worst = 0
    for group in dst.mesh.groups(dst.partial):
        block = local_box(dst, group[0])  # the members differ only in partial coordinates: one block
        held = {tuple((s.start, s.stop) for s in local_box(src, d)) for d in group}
        need = box_size(block) - sum(math.prod(max(0, min(hi, b.stop) - max(lo, b.start))
                                               for (lo, hi), b in zip(box, block)) for box in held)
        worst = max(worst, -(-need // len(group)))
    return worst * dst.itemsize


def check_pair(src: ShardingType, dst: ShardingType) -> None:
    """Raise :class:`ShardingError` unless ``dst`` is a possible redistribution target of ``src``: the same mesh
    axes (the device orders may differ), shape and dtype, sub-axes that fit one factorization of each axis,
    and the same reduction kind where both are partial. Pending values may be reduced, kept or created
    (docs/spec.md §3); creating them needs the identity of the reduction (zeros for a sum), so a destination that
    creates a pending max, min or product is refused: this is the one place that decides it."""
    for what, t in (("source", src), ("destination", dst)):
        if not isinstance(t, ShardingType):
            raise ShardingError(f"the {what} must be a redist.ShardingType (e.g. ShardingType.parse('f32[8{{x}}]', "
                                f"mesh)), got {type(t).__name__} {shown(t)}")
    if not src.mesh.same_axes(dst.mesh):
        raise ShardingError(f"source and destination are on different meshes ({src.mesh} and {dst.mesh}); only "
                            "the device order may differ")
    if src.shape != dst.shape:
        raise ShardingError(f"source shape {list(src.shape)} differs from destination shape {list(dst.shape)}")
    if src.dtype != dst.dtype:
        raise ShardingError(f"source dtype {src.dtype} differs from destination dtype {dst.dtype}")
    check_factors(src, dst, f"source {src} and destination {dst}")
    if src.partial and dst.partial and src.reduction != dst.reduction:
        raise ShardingError(f"source {src} is a pending {src.reduction} but destination {dst} a pending "
                            f"{dst.reduction}: a redistribution cannot convert between reduction kinds")
    if difference(dst.partial, src.partial) and dst.reduction != "sum":
        raise ShardingError(f"destination {dst} creates a pending {dst.reduction} over "
                            f"{{{','.join(difference(dst.partial, src.partial))}}}, which the source {src} does not "
                            "have: only pending sums can be created (their summands are zeros but one)")
