"""Lower bounds on the bytes any redistribution must receive."""

from __future__ import annotations

import math

from redist.errors import ShardingError, shown
from redist.types import ShardingType, check_factorization, remove_axes


def lower_bound_bytes(src: ShardingType, dst: ShardingType) -> int:
    """``max_d (|T_d| − |T_d ∩ S_d|) · itemsize``: what some device lacks and must receive.

    ``S_d`` and ``T_d`` are the elements device ``d`` holds before and after (padding is not an element).
    For partial types an element is an (index, summand) pair, and a device keeps its own summand coordinates:
    with the same partial axes on both sides the formula is unchanged. When partial axes are reduced (over a
    group of two or more devices), every element a device ends with needs at least one value from another
    device, so the bound is ``max_d |T_d| · itemsize``. No plan can receive less.
    """
    check_pair(src, dst)
    mesh = src.mesh
    reduced = remove_axes(mesh, src.partial, dst.partial)
    if mesh.group_size(reduced) > 1:
        return max(_size(dst.local_box(d)) for d in range(mesh.size)) * dst.itemsize
    return max(missing_elements(src, dst, d) for d in range(mesh.size)) * dst.itemsize


def missing_elements(src: ShardingType, dst: ShardingType, device: int) -> int:
    """How many of the elements ``device`` holds under ``dst`` it does not hold under ``src`` (padding is not
    an element)."""
    overlap = 1
    for s, t in zip(src.local_box(device), dst.local_box(device)):
        overlap *= max(0, min(s.stop, t.stop) - max(s.start, t.start))
    return _size(dst.local_box(device)) - overlap


def _size(box) -> int:
    return math.prod(s.stop - s.start for s in box)


def check_pair(src: ShardingType, dst: ShardingType, topology=None) -> None:
    """Raise :class:`ShardingError` unless ``dst`` is a possible redistribution target of ``src`` and
    ``topology`` a valid ``topology=`` argument on their mesh (:func:`redist.cost.as_topology`)."""
    for what, t in (("source", src), ("destination", dst)):
        if not isinstance(t, ShardingType):
            raise ShardingError(f"the {what} must be a redist.ShardingType (e.g. ShardingType.parse('f32[8{{x}}]', "
                                f"mesh)), got {type(t).__name__} {shown(t)}")
    if src.mesh != dst.mesh:
        raise ShardingError(f"source and destination are on different meshes ({src.mesh} and {dst.mesh})")
    if src.shape != dst.shape:
        raise ShardingError(f"source shape {list(src.shape)} differs from destination shape {list(dst.shape)}")
    if src.dtype != dst.dtype:
        raise ShardingError(f"source dtype {src.dtype} differs from destination dtype {dst.dtype}")
    tokens = {}
    for t in (src, dst):
        for tok in [a for d in t.dims for a in d] + list(t.partial):
            tokens.setdefault(src.mesh.sub_axis(tok)[0], []).append(tok)
    for name, toks in tokens.items():
        try:
            check_factorization(src.mesh, name, toks)
        except ShardingError as e:
            raise ShardingError(f"source {src} and destination {dst}: {e}") from None
    if remove_axes(src.mesh, src.partial, dst.partial) is None:
        extra = [a for a in dst.partial if remove_axes(src.mesh, src.partial, (a,)) is None]
        raise ShardingError(
            f"destination {dst} is partial over {{{','.join(extra)}}} but the source {src} is not: "
            "a redistribution can only reduce pending sums, not create them"
        )
    if topology is not None:
        from redist.cost import as_topology  # not at the top: cost imports steps, which imports this module

        as_topology(topology, src.mesh)
