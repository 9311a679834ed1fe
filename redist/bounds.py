"""Lower bounds on the bytes any redistribution must receive."""

from __future__ import annotations

import math

from redist.axes import check_factorization, difference, remove_axes
from redist.blocks import box_size, local_box, max_missing_elements
from redist.errors import ShardingError, shown
from redist.types import ShardingType


def lower_bound_bytes(src: ShardingType, dst: ShardingType) -> int:
    """``max_d (|T_d| − |T_d ∩ S_d|) · itemsize``: what some device lacks and must receive.

    ``S_d`` and ``T_d`` are the elements device ``d`` holds before and after (padding is not an element).
    For partial types an element is an (index, summand) pair, and a device keeps its own summand coordinates:
    with the same partial axes on both sides the formula is unchanged. When partial axes are reduced (over a
    group of two or more devices), every element a device ends with needs at least one value from another
    device, so the bound is ``max_d |T_d| · itemsize``: the device holding block 0 of every dim, whose box is
    ``Π min(N, L)``. When the destination creates pending sums, :func:`_creating_bound`. No plan can receive
    less (between two device orders a device may have to take another summand, so a plan may not reach the
    bound there, but it still holds). Computed from the block structure
    (:func:`redist.blocks.max_missing_elements`), in time independent of the device count on one device order;
    the creating bound visits each summand group of the destination once.
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
    worst = 0
    for group in dst.mesh.groups(dst.partial):
        block = local_box(dst, group[0])  # the members differ only in partial coordinates: one block
        need = box_size(block)
        if not reduces:  # blocks of one layout are equal or disjoint: count each distinct one once
            held = {tuple((s.start, s.stop) for s in local_box(src, d)) for d in group}
            need -= sum(math.prod(max(0, min(hi, b.stop) - max(lo, b.start)) for (lo, hi), b in zip(box, block))
                        for box in held)
        worst = max(worst, -(-need // len(group)))
    return worst * dst.itemsize


def check_pair(src: ShardingType, dst: ShardingType) -> None:
    """Raise :class:`ShardingError` unless ``dst`` is a possible redistribution target of ``src``: the same mesh
    axes (the device orders may differ), shape and dtype, sub-axes that fit one factorization of each axis,
    and the same reduction kind where both are partial. Pending values may be reduced, kept or created
    (SPEC 3); creating them needs the identity of the reduction (zeros for a sum), so a destination that
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
    by_axis = {}
    for t in (src, dst):
        for a in [a for d in t.dims for a in d] + list(t.partial):
            by_axis.setdefault(a.name, []).append(a)
    for name, axes in by_axis.items():
        try:
            check_factorization(name, axes)
        except ShardingError as e:
            raise ShardingError(f"source {src} and destination {dst}: {e}") from None
    if src.partial and dst.partial and src.reduction != dst.reduction:
        raise ShardingError(f"source {src} is a pending {src.reduction} but destination {dst} a pending "
                            f"{dst.reduction}: a redistribution cannot convert between reduction kinds")
    if difference(dst.partial, src.partial) and dst.reduction != "sum":
        raise ShardingError(f"destination {dst} creates a pending {dst.reduction} over "
                            f"{{{','.join(difference(dst.partial, src.partial))}}}, which the source {src} does not "
                            "have: only pending sums can be created (their summands are zeros but one)")
