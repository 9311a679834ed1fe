"""Lower bounds on the bytes any redistribution must receive."""

from __future__ import annotations

from redist.axes import check_factorization, remove_axes
from redist.blocks import box_size, local_box, missing_elements
from redist.errors import ShardingError, shown
from redist.types import ShardingType


def lower_bound_bytes(src: ShardingType, dst: ShardingType) -> int:
    """``max_d (|T_d| − |T_d ∩ S_d|) · itemsize``: what some device lacks and must receive.

    ``S_d`` and ``T_d`` are the elements device ``d`` holds before and after (padding is not an element).
    For partial types an element is an (index, summand) pair, and a device keeps its own summand coordinates:
    with the same partial axes on both sides the formula is unchanged (between two device orders a device may
    have to take another summand, so a plan may not reach the bound there, but it still holds). When partial
    axes are reduced (over a group of two or more devices), every element a device ends with needs at least
    one value from another device, so the bound is ``max_d |T_d| · itemsize``. No plan can receive less.
    """
    check_pair(src, dst)
    mesh = src.mesh
    reduced = remove_axes(src.partial, dst.partial)
    if mesh.group_size(reduced) > 1:
        return max(box_size(local_box(dst, d)) for d in range(mesh.size)) * dst.itemsize
    return max(missing_elements(src, dst, d) for d in range(mesh.size)) * dst.itemsize


def check_pair(src: ShardingType, dst: ShardingType) -> None:
    """Raise :class:`ShardingError` unless ``dst`` is a possible redistribution target of ``src``: the same mesh
    axes (the device orders may differ), shape and dtype, sub-axes that fit one factorization of each axis,
    the same reduction kind where both are partial, and pending axes that the source has too."""
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
    if remove_axes(src.partial, dst.partial) is None:
        extra = [a for a in dst.partial if remove_axes(src.partial, (a,)) is None]
        raise ShardingError(
            f"destination {dst} is partial over {{{','.join(extra)}}} but the source {src} is not: "
            "a redistribution can only reduce pending sums, not create them"
        )
