"""The benchmarks' seeded sample of (source, destination) pairs: :mod:`redist.testing`'s generator with the
options the published figures were drawn with (same seed, same pairs)."""

from __future__ import annotations

import random

import redist
from redist.testing import SeededDraw, draw_mesh, draw_pair

MESHES = {"max_axes": 4, "max_devices": 64, "axis_sizes": (1, 2, 2, 3, 4, 5, 6, 8)}
"""Meshes of 1-4 axes, at most 64 devices, axes of size 2 twice as likely as the others."""


def random_pair(rng: random.Random, mesh: redist.Mesh | None = None, max_rank: int = 4, partial: bool = True,
                dtype: str = "f32", uneven: bool = False) -> tuple[redist.ShardingType, redist.ShardingType]:
    """A valid f32 pair on ``mesh`` (drawn from :data:`MESHES` if None), ranks 0 to ``max_rank``, the source
    partial over some axes if ``partial``. Each dim's size is a small multiple of what both layouts need, or
    with ``uneven`` any size from 1 to twice the larger block count plus one (mostly dims that do not
    divide; the draw is kept even where it divides)."""
    draw = SeededDraw(rng)
    mesh = mesh or draw_mesh(draw, **MESHES)
    return draw_pair(draw, mesh, max_rank=max_rank, partial=partial, dst_partial=0.3, dtype=dtype,
                     uneven=uneven, padded=False, empty_dims=False)
