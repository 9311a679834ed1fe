"""proofs/differential.py: its oracle sees every kind of failure, and a small seeded run passes on all backends."""

from __future__ import annotations

import os

import numpy as np
import pytest

import redist
from proofs import differential
from redist.data import poisoned_source
from tests.redist.mpi_launch import MPIEXEC

MESH = redist.Mesh.parse("x=2,y=2")


def right_answer(src_text: str, dst_text: str):
    src, dst = redist.ShardingType.parse(src_text, MESH), redist.ShardingType.parse(dst_text, MESH)
    value, bufs = poisoned_source(src, np.random.default_rng(0))
    return dst, value, redist.execute(redist.synthesize(src, dst), bufs)


@pytest.mark.parametrize("src,dst", [("f64[5{x}, 3]", "f64[5{y}, 3]"),
                                     ("f64[4, 3] partial{x}", "f64[4{y}, 3] partial{x}")])
def test_judge_finds_each_kind_of_failure(src, dst):
    dst, value, out = right_answer(src, dst)
    assert differential.judge(dst, value, out) == []
    assert differential.judge(dst, value, [o.astype(np.float32) for o in out]) == ["dtype changes"]
    assert differential.judge(dst, value, [o[..., :1] for o in out]) == ["shape changes"]
    wrong = [o.copy() for o in out]
    wrong[3][dst.data_box(3)] += 1
    assert differential.judge(dst, value, wrong) == ["wrong values"]
    assert differential.judge(dst, value, [o.astype(np.float32) for o in wrong]) == ["dtype changes", "wrong values"]


def test_judge_ignores_padding():
    dst, value, out = right_answer("f64[5{x}, 3]", "f64[5{y}, 3]")
    assert not dst.is_even()
    padded = [o.copy() for o in out]
    for d, o in enumerate(padded):
        keep = o[dst.data_box(d)].copy()
        o[...] = np.nan
        o[dst.data_box(d)] = keep
    assert differential.judge(dst, value, padded) == []


def test_cases_depend_only_on_seed_backend_and_index():
    a = [differential.draw_case(7, "mpi", i, devices=6) for i in range(20)]
    assert a == [differential.draw_case(7, "mpi", i, devices=6) for i in range(20)]
    assert all(src.mesh.size == 6 for src, _ in a)
    assert a != [differential.draw_case(8, "mpi", i, devices=6) for i in range(20)]


def test_a_small_run_passes_on_numpy_and_jax(capsys):
    assert differential.main(["--numpy", "60", "--jax", "4", "--seed", "11"]) == 0
    out = capsys.readouterr().out
    assert "numpy: 60 cases, 60 passed, 0 wrong values, 0 dtype changes" in out
    assert "jax: 4 cases, 4 passed" in out


@pytest.mark.mpi
@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec in this environment ({MPIEXEC})")
def test_a_small_run_passes_under_mpi(capsys):
    assert differential.main(["--mpi", "3", "--seed", "11"]) == 0
    assert "mpi: 3 cases, 3 passed, 0 wrong values" in capsys.readouterr().out
