"""Seeded random (source, destination) sharding-type pairs, shared by the benchmarks."""

from __future__ import annotations

import math
import random

import redist

AXIS_SIZES = [1, 2, 2, 3, 4, 5, 6, 8]


def random_mesh(rng: random.Random, max_axes: int = 4, max_devices: int = 64) -> redist.Mesh:
    n = rng.randint(1, max_axes)
    sizes = [rng.choice(AXIS_SIZES) for _ in range(n)]
    while math.prod(sizes) > max_devices:
        sizes[rng.randrange(n)] = rng.choice([1, 2])
    return redist.Mesh({f"a{i}": s for i, s in enumerate(sizes)})


def _layout(rng, mesh, rank, partial):
    dims = [[] for _ in range(rank)]
    part = []
    for a in rng.sample(mesh.names, len(mesh.names)):
        r = rng.random()
        if r < 0.55 and rank:
            dims[rng.randrange(rank)].append(a)
        elif r < 0.7 and partial:
            part.append(a)
    return tuple(map(tuple, dims)), tuple(part)


def random_pair(rng: random.Random, mesh: redist.Mesh | None = None, max_rank: int = 4, partial: bool = True,
                dtype: str = "f32", uneven: bool = False):
    """A valid pair on one mesh: same shape and dtype; the destination's partial axes are a subset of the
    source's. Each dim's size is a small multiple of what both layouts need, or with ``uneven`` any size
    from 1 to twice the larger block count plus one (mostly dims that do not divide)."""
    mesh = mesh or random_mesh(rng)
    rank = rng.randint(0, max_rank)
    d1, p1 = _layout(rng, mesh, rank, partial)
    d2, _ = _layout(rng, mesh, rank, False)
    p2 = tuple(a for a in p1 if rng.random() < 0.3 and all(a not in d for d in d2))
    ks = [(mesh.group_size(d1[i]), mesh.group_size(d2[i])) for i in range(rank)]
    if uneven:
        shape = tuple(rng.randint(1, 2 * max(k) + 1) for k in ks)
    else:
        shape = tuple(math.lcm(*k) * rng.choice([1, 1, 2, 3]) for k in ks)
    return (redist.ShardingType(mesh, shape, dtype, d1, p1), redist.ShardingType(mesh, shape, dtype, d2, p2))
