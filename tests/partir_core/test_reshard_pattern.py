"""partir_core.reshard plans a pair through its shape-free pattern (``_synthesized``): the plan must be exactly
the one redist.synthesize makes for the pair itself."""

import math

import pytest

import redist
from redist import testing as RT
from partir_core import reshard


def _pairs(seed: int, count: int, max_devices: int):
    """Random pairs that have a pattern other than themselves (even, one device order, no created sums)."""
    draw, found = RT.SeededDraw(seed), 0
    while found < count:
        mesh = RT.draw_mesh(draw, max_devices=max_devices)
        src, dst = RT.draw_pair(draw, mesh, max_rank=4, sub_axes=0.3, multipliers=(1, 2, 3, 5, 6, 12),
                                empty_dims=False, reorder=0.2, create=0.1)
        if reshard._pattern(src, dst) is not None:
            found += 1
            yield src, dst


@pytest.mark.parametrize("seed,count,max_devices", [(1, 600, 16), (2, 300, 64)])
def test_a_pairs_plan_from_its_pattern_is_the_synthesizers(seed, count, max_devices):
    for src, dst in _pairs(seed, count, max_devices):
        pattern = reshard._pattern(src, dst)
        assert pattern[0].shape == tuple(math.gcd(d, src.mesh.size) for d in src.shape) != src.shape
        got, want = reshard._synthesized(src, dst), redist.synthesize(src, dst)
        assert (got.steps, got.types) == (want.steps, want.types), (src, dst)
        assert (got.bytes_received, got.peak_bytes) == (want.bytes_received, want.peak_bytes), (src, dst)


@pytest.mark.parametrize("seed,count,max_devices", [(3, 800, 16), (4, 300, 64)])
def test_pairs_at_the_bound_are_priced_as_the_move_lowering_runs(seed, count, max_devices):
    """reshard_bytes prices a pair at the lower bound without planning it (``_at_bound``: even, one device
    order, the same pending axes), and a pair with a pattern from the pattern's plan, scaled (pending sums
    reduced); that is the bytes of the move lowering runs, on random pairs of every kind (sub-axes, unit axes,
    pending sums kept or reduced, device orders, uneven and empty dims); the other pairs are priced by their
    move."""
    draw, at_bound, other, patterned = RT.SeededDraw(seed), 0, 0, 0
    while at_bound < count:
        mesh = RT.draw_mesh(draw, max_devices=max_devices, axis_sizes=(1, 2, 2, 3, 4))
        src, dst = RT.draw_pair(draw, mesh, max_rank=4, partial=0.5, sub_axes=0.3, reorder=0.1, uneven=0.1,
                                padded=False, multipliers=(1, 2, 3, 5))
        priced = reshard.reshard_bytes(src, dst)
        if src != dst:
            assert priced == reshard.move(src, dst).bytes, (src, dst)
            if reshard._at_bound(src, dst):
                at_bound += 1
            else:
                other += 1
                patterned += reshard._pattern(src, dst) is not None  # priced from the pattern's plan, scaled
    assert other > count // 4 and patterned > count // 20


def test_pairs_without_a_pattern_are_planned_as_they_are():
    mesh = redist.Mesh({"x": 2, "y": 4})
    t = lambda text: redist.ShardingType.parse(text, mesh)  # noqa: E731
    reordered = redist.Mesh({"x": 2, "y": 4}, device_ids=[7, 6, 5, 4, 3, 2, 1, 0])
    for src, dst in [(t("f32[8{x}, 4]"), t("f32[8, 4{y}]")),                 # already its own pattern
                     (t("f32[6{y}, 24]"), t("f32[6, 24{y}]")),               # uneven
                     (t("f32[0, 24{y}]"), t("f32[0{x}, 24]")),               # empty
                     (t("f32[16, 24{y}]"), t("f32[16, 24] partial{x}")),     # creates a pending sum
                     (t("f32[16{x}, 24]"), redist.ShardingType.parse("f32[16, 24{x}]", reordered))]:
        assert reshard._pattern(src, dst) is None, (src, dst)
    assert reshard._pattern(t("f32[16{x}, 24]"), t("f32[16, 24{y}]"))[0].shape == (8, 8)
