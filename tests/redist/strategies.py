"""Hypothesis strategies for valid meshes, layouts and (source, destination) pairs: :mod:`redist.testing`'s
generator driven by Hypothesis (:class:`redist.testing.HypothesisDraw`), so that a failing pair shrinks to a
small one. The options are :mod:`redist.testing`'s; a probability strictly between 0 and 1 means "either"."""

from __future__ import annotations

from hypothesis import strategies as st

from redist.testing import HypothesisDraw, draw_cross_mesh_pair, draw_layout, draw_mesh, draw_mesh_pair, draw_pair


@st.composite
def meshes(draw, max_axes=4, max_devices=64, **options):
    """Meshes of :func:`redist.testing.draw_mesh`, at most 64 devices unless told."""
    return draw_mesh(HypothesisDraw(draw), max_axes=max_axes, max_devices=max_devices, **options)


@st.composite
def layouts(draw, mesh, rank, **options):
    """``(dims, partial)`` of :func:`redist.testing.draw_layout`."""
    return draw_layout(HypothesisDraw(draw), mesh, rank, **options)


@st.composite
def type_pairs(draw, mesh=None, max_rank=4, partial=True, padded=False, **options):
    """Pairs of :func:`redist.testing.draw_pair` on ``mesh`` (drawn from :func:`meshes` if None), ranks up
    to 4 unless told; ``partial=False``: no pending sums; ``uneven=True``: dims of any size, mostly not a
    multiple of their block counts. Draws that divide evenly all the same are kept unless ``padded``: redrawing
    them would make Hypothesis discard most of the examples it starts from."""
    mesh = mesh or draw(meshes())
    return draw_pair(HypothesisDraw(draw), mesh, max_rank=max_rank, partial=partial, padded=padded, **options)


@st.composite
def cross_mesh_pairs(draw, max_devices=8, **options):
    """Pairs of :func:`redist.testing.draw_cross_mesh_pair` on two meshes of
    :func:`redist.testing.draw_mesh_pair` (other devices or other axes)."""
    hd = HypothesisDraw(draw)
    return draw_cross_mesh_pair(hd, draw_mesh_pair(hd, max_devices=max_devices), **options)
