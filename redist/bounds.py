"""Lower bounds on the bytes any redistribution must receive."""

from __future__ import annotations

import math

from redist.axes import difference, remove_axes
from redist.blocks import box_size, check_factors, local_box, max_missing_elements, needed_by_group
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
    bound there, but it still holds). Between two meshes of other devices or axes: ``max_G ceil(m_G / |G|) ·
    itemsize`` over the destination's summand groups ``G`` (one device each without partial axes), ``m_G`` the
    elements of ``G``'s block that no source summand group lying wholly inside ``G`` holds.
    Computed from the block structure
    (:func:`redist.blocks.max_missing_elements`), in time independent of the device count on one device order;
    the creating bound visits each summand group of the destination once. Where that takes more classes of
    devices than :data:`redist.blocks.MAX_LISTED`, :class:`ShardingError` says so.
    """
    check_pair(src, dst)
    if not src.mesh.is_reordering_of(dst.mesh):
        return _bound_across_meshes(src, dst)
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
    return -(-int(needed_by_group(src, dst, dst.partial).max(initial=0)) // members) * dst.itemsize


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


def _bound_across_meshes(src: ShardingType, dst: ShardingType) -> int:
    """The bound between meshes that differ in their devices or axes: ``max_G ceil(m_G / |G|) · itemsize`` over
    the destination's summand groups ``G`` (one device each without partial axes), device by device (a mesh of
    other devices is a table of them).

    ``m_G`` is the number of elements of ``G``'s block ``B`` of which no source summand group lying wholly
    inside ``G`` holds a summand (one device each without partial axes; a device in both meshes is a member of
    both). Each such element's value depends on a summand held outside ``G``, so at least one value enters
    ``G`` for it, and some member receives ``1/|G|`` of them. Without partial axes on either side this is
    ``max_d (|T_d| − |T_d ∩ S_d|)``: what a device lacks, which a transfer receives exactly; a partial source
    and a destination without partial axes give ``max_d |T_d|`` (a device can hold one summand of its
    elements, not their reduction)."""
    src_group = {d: tuple(g) for g in src.mesh.groups(src.partial) for d in g}
    worst = 0
    for group in dst.mesh.groups(dst.partial):
        block = local_box(dst, group[0])
        members = set(group)
        held = {tuple((s.start, s.stop) for s in local_box(src, d)) for d in group
                if d in src_group and members.issuperset(src_group[d])}
        need = box_size(block) - sum(math.prod(max(0, min(hi, b.stop) - max(lo, b.start))
                                               for (lo, hi), b in zip(box, block)) for box in held)
        worst = max(worst, -(-need // len(group)))
    return worst * dst.itemsize


def check_pair(src: ShardingType, dst: ShardingType) -> None:
    """Raise :class:`ShardingError` unless ``dst`` is a possible redistribution target of ``src``: the same shape
    and dtype, the same reduction kind where both are partial, and, on one mesh or two device orders of it,
    sub-axes that fit one factorization of each axis (any two meshes are a pair: across meshes of other
    devices or axes, :func:`_check_pair_across_meshes`). Pending values may be reduced, kept or created
    (docs/spec.md §3); creating them needs the identity of the reduction (zeros for a sum), so a destination that
    creates a pending max, min or product is refused: this is the one place that decides it."""
    for what, t in (("source", src), ("destination", dst)):
        if not isinstance(t, ShardingType):
            raise ShardingError(f"the {what} must be a redist.ShardingType (e.g. ShardingType.parse('f32[8{{x}}]', "
                                f"mesh)), got {type(t).__name__} {shown(t)}")
    if src.shape != dst.shape:
        raise ShardingError(f"source shape {list(src.shape)} differs from destination shape {list(dst.shape)}")
    if src.dtype != dst.dtype:
        raise ShardingError(f"source dtype {src.dtype} differs from destination dtype {dst.dtype}")
    if not src.mesh.is_reordering_of(dst.mesh):
        return _check_pair_across_meshes(src, dst)
    check_factors(src, dst, f"source {src} and destination {dst}")
    if src.partial and dst.partial and src.reduction != dst.reduction:
        raise ShardingError(f"source {src} is a pending {src.reduction} but destination {dst} a pending "
                            f"{dst.reduction}: a redistribution cannot convert between reduction kinds")
    if difference(dst.partial, src.partial) and dst.reduction != "sum":
        raise ShardingError(f"destination {dst} creates a pending {dst.reduction} over "
                            f"{{{','.join(difference(dst.partial, src.partial))}}}, which the source {src} does not "
                            "have: only pending sums can be created (their summands are zeros but one)")


def _check_pair_across_meshes(src: ShardingType, dst: ShardingType) -> None:
    """:func:`check_pair` between meshes of other devices or axes (shape and dtype checked): pending values are
    kept (moved summand group to summand group, groups of one size and one reduction kind), reduced, or
    created; only sums are created."""
    if not dst.partial:
        return
    kept = src.partial and src.mesh.group_size(src.partial) == dst.mesh.group_size(dst.partial)
    if src.partial and src.reduction != dst.reduction:
        raise ShardingError(f"source {src} is a pending {src.reduction} but destination {dst} a pending "
                            f"{dst.reduction}: a redistribution cannot convert between reduction kinds")
    if dst.reduction != "sum" and not kept:
        raise ShardingError(f"destination {dst} on mesh {dst.mesh} holds a pending {dst.reduction} that the source "
                            f"{src} on mesh {src.mesh} cannot hand over (its summand groups have "
                            f"{src.mesh.group_size(src.partial)} devices, the destination's "
                            f"{dst.mesh.group_size(dst.partial)}): only pending sums can be created")
