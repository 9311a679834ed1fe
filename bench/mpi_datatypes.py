"""Receiving into strided places with MPI derived datatypes against receiving packed, by run length.

    mpiexec -n N python bench/mpi_datatypes.py [--mib 16] [--runs 32 128 512 1024 2048 4096 16384]
        [--repeats 20] [--out bench/results/mpi_datatypes.json]

``redist.mpi`` receives an all-gather's chunks, and the rows of an all-to-all that a transpose unpacks, straight
into their strided places in the result (one derived datatype per place) where the places' contiguous runs hold
at least ``mpi_placement.STRIDED_RUN_MIN`` bytes, and packed (then merged into place by numpy) where they are
shorter. This script measures that choice, running the library itself both ways (the threshold set to 1 byte:
"in_place", or beyond every run: "packed") through ``redist.mpi.run_program``, on:

- ``gather_inner``: ``f32[R, C{x}] -> f32[R, C]`` with ``mib`` MiB per rank after the gather, for each run length
  (``C / n`` elements of a chunk's row, in bytes);
- ``pencil``: the pencil transpose of ``bench/mpi.py`` (256 KiB runs) at ``mib`` MiB per rank.

And the send side, which the library keeps packed: ``slab`` (``bench/mpi.py``'s slab transpose, ``C / n`` f32 per
run), the library's program against its rows sent straight from the input, each described by a derived datatype
(``send_datatype``: point-to-point transfers posted as the library posts them).

Method: per case, two warm-up calls of each contender, then ``--repeats`` rounds in a random order per round (the
same on every rank); a call is timed as ``Barrier``; time; call; the maximum over ranks. Rank 0 prints and saves
the min and median time of each contender and the median of the per-round ratio to ``packed`` (a paired
comparison: the two ran within moments of each other, under the same load). Results are checked equal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redist  # noqa: E402
import redist.mpi  # noqa: E402
from bench.mpi import case_types  # noqa: E402
from redist.backends import mpi_placement, mpi_transfers  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def library(program, local, run_min: int):
    """``run_program`` with every strided receive place of at least ``run_min`` bytes received in place."""
    def call():
        mpi_placement.STRIDED_RUN_MIN = run_min
        return redist.mpi.run_program(program, local)
    return call


def send_datatype(src: redist.ShardingType, local: np.ndarray):
    """The slab transpose with each destination's columns sent straight from ``local`` (a derived datatype per
    send), received contiguous into the result, this rank's own columns copied by numpy."""
    a, m = src.local_shape
    cols, comm = m // SIZE, COMM.Dup()
    rows = local.reshape(a, SIZE, cols)

    def call():
        out = np.empty((SIZE, a, cols), local.dtype)
        requests = mpi_transfers.post_rows(comm, RANK, SIZE, range(1, SIZE),
                                lambda j: mpi_transfers.place(local, rows[:, j]), lambda j: out[j])
        MPI.Request.Waitall(requests)
        np.copyto(out[RANK], rows[:, RANK])
        return out.reshape(SIZE * a, cols)
    return call


def cases(mib: float, runs) -> list[tuple[str, int, str, str, str]]:
    """``(case, run bytes, mesh, src, dst)`` of every case measured."""
    e = int(mib * 2**20) // 4
    out = []
    for run in runs:
        c = run // 4 * SIZE
        out.append(("gather_inner", run, f"x={SIZE}", f"f32[{e // c}, {c}{{x}}]", f"f32[{e // c}, {c}]"))
    out.append(("pencil", 256 * 256 * 4, *case_types("pencil", SIZE, mib)))
    for run in (1024, 4096):
        c = run // 4 * SIZE
        out.append(("slab", run, f"x={SIZE}", f"f32[{e // c * SIZE}{{x}}, {c}]", f"f32[{e // c * SIZE}, {c}{{x}}]"))
    return out


def measure(contenders: dict, repeats: int) -> dict:
    """Per contender, its times (seconds, the maximum over ranks) of ``repeats`` rounds in a random order."""
    order, times = random.Random(0), {name: [] for name in contenders}
    for _ in range(repeats):
        names = list(contenders)
        order.shuffle(names)
        for name in names:
            COMM.Barrier()
            t = time.perf_counter()
            contenders[name]()
            times[name].append(COMM.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=float, default=16)
    parser.add_argument("--runs", type=int, nargs="+", default=[32, 128, 512, 1024, 2048, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    default_min, rows = mpi_placement.STRIDED_RUN_MIN, []
    for case, run, mesh_text, a, b in cases(args.mib, args.runs):
        mesh = redist.Mesh.parse(mesh_text)
        src, dst = redist.ShardingType.parse(a, mesh), redist.ShardingType.parse(b, mesh)
        program = redist.synthesize(src, dst).program
        local = np.random.default_rng(RANK).random(src.local_shape, dtype=np.float32)
        contenders = {"packed": library(program, local, 2**62)}
        if case == "slab":
            contenders["send_datatype"] = send_datatype(src, local)
        else:
            contenders["in_place"] = library(program, local, 1)
        expected = contenders["packed"]()
        for name, call in contenders.items():
            call()
            assert np.array_equal(call(), expected), f"{case}: {name} differs from packed"
        times = measure(contenders, args.repeats)
        row = {"case": case, "run_bytes": run, "src": a, "dst": b, "ranks": SIZE, "mib": args.mib,
               "load": os.getloadavg()[0],
               **{name: {"min_s": min(t), "median_s": statistics.median(t),
                         "over_packed": statistics.median(x / p for x, p in zip(t, times["packed"]))}
                  for name, t in times.items()}}
        rows.append(row)
        if RANK == 0:
            print(f"-n {SIZE} {case:12s} runs {run:6d} B  load {row['load']:.1f}  " + "  ".join(
                f"{name} min {1e3 * row[name]['min_s']:7.2f} ms med {1e3 * row[name]['median_s']:7.2f} ms "
                f"({row[name]['over_packed']:.2f}x packed)" for name in contenders), flush=True)
    mpi_placement.STRIDED_RUN_MIN = default_min
    if RANK == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"method": __doc__, "strided_run_min": default_min, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
