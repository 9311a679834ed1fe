"""Hypothesis strategies that build valid meshes, sharding types and (source, destination) pairs."""

from __future__ import annotations

import math

from hypothesis import strategies as st

import redist

AXIS_SIZES = [1, 2, 3, 4, 5, 6, 8]


@st.composite
def meshes(draw, max_axes=4, max_devices=64):
    n = draw(st.integers(1, max_axes))
    sizes = []
    for _ in range(n):
        budget = max_devices // max(1, math.prod(sizes))
        sizes.append(draw(st.sampled_from([s for s in AXIS_SIZES if s <= budget] or [1])))
    return redist.Mesh({f"a{i}": s for i, s in enumerate(sizes)})


@st.composite
def layouts(draw, mesh, rank, partial=True):
    """Per-dim axis lists and partial axes: every axis goes to one dim, to partial, or nowhere."""
    dims = [[] for _ in range(rank)]
    part = []
    order = draw(st.permutations(mesh.names))
    for a in order:
        choice = draw(st.integers(0, rank + 1))
        if choice < rank:
            dims[choice].append(a)
        elif choice == rank and partial:
            part.append(a)
    return tuple(map(tuple, dims)), tuple(part)


@st.composite
def type_pairs(draw, mesh=None, max_rank=4, partial=True, dtype="f32", uneven=False):
    """A (source, destination) pair on one mesh with a common shape; the destination's partial axes are a
    subset of the source's. Dims divide evenly on both sides, unless ``uneven``: then every dim has any
    size from 0 to twice the larger block count plus one, mostly not a multiple of either."""
    mesh = mesh or draw(meshes())
    rank = draw(st.integers(0, max_rank))
    d1, p1 = draw(layouts(mesh, rank, partial))
    d2, _ = draw(layouts(mesh, rank, partial=False))
    free = [a for a in p1 if all(a not in d for d in d2)]
    p2 = tuple(a for a in free if draw(st.booleans()))
    shape = []
    for i in range(rank):
        if uneven:
            shape.append(draw(st.integers(0, 2 * max(mesh.group_size(d1[i]), mesh.group_size(d2[i])) + 1)))
            continue
        k = math.lcm(mesh.group_size(d1[i]), mesh.group_size(d2[i]))
        shape.append(k * draw(st.sampled_from([1, 1, 2, 3])))
    src = redist.ShardingType(mesh, tuple(shape), dtype, d1, p1)
    dst = redist.ShardingType(mesh, tuple(shape), dtype, d2, p2)
    return src, dst
