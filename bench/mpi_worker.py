"""The MPI job of ``bench/mpi.py`` (method and contenders there), run under ``mpiexec -n N``:

    mpiexec -n N python bench/mpi_worker.py CASES.json OUT.json [--repeats 7] [--seed 0]

Every rank runs the cases of ``CASES.json`` (those for ``N`` ranks); rank 0 prints one progress line per
case and writes the rows, with every round's times, to ``OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np
from mpi4py import MPI

import redist
import redist.mpi
from bench.mpi_replay_worker import Replay, allreduce_then_slice, gather_then_slice, valid

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
MODULUS = 65521  # entries are the flat index mod this prime: exact in f32, and no two neighbours alike
GATHER_SLICE_BUDGET = 6 * 2**30  # bytes of global arrays all ranks together may hold for gather-then-slice


# ---------------------------------------------------------------------------------------------- data
def values(shape, box) -> np.ndarray:
    """The global array's entries in ``box`` (a tuple of slices of ``shape``), as f32."""
    idx = np.zeros((), np.int64)
    for n, s in zip(shape, box):
        idx = (idx[..., None] * n + np.arange(s.start, s.stop)) % MODULUS
    return idx.astype(np.float32)


def local_input(src: redist.ShardingType) -> np.ndarray:
    """This rank's buffer of ``src``: its block (zeros in the padding); for a partial source the block on the
    ranks at partial coordinate 0 and zeros elsewhere, so that the pending sum is the global array."""
    out = np.zeros(src.local_shape, np.float32)
    coords = src.mesh.coords(RANK)
    if not any(src.mesh.axis_coord(coords, a) for a in src.partial):
        box = src.replace(partial=()).local_box(RANK)
        out[valid(box)] = values(src.shape, box)
    return out


# ---------------------------------------------------------------------------------------------- hand-written
def hand_written(name: str, src: redist.ShardingType, dst: redist.ShardingType):
    """The mpi4py program a competent user writes for the case's pattern (``bench/mpi.py``)."""
    n = SIZE
    if name == "slab":
        a, m = src.local_shape
        pack = np.empty((n, a, m // n), np.float32)

        def slab(local):
            np.copyto(pack, local.reshape(a, n, m // n).transpose(1, 0, 2))
            out = np.empty((n * a, m // n), np.float32)
            COMM.Alltoall(pack, out)
            return out
        return slab
    if name == "pencil":
        x, y, z = src.local_shape
        q = src.mesh.shape[1]
        sub = COMM.Split(RANK % q, RANK // q)  # the x group: same y coordinate, ranked by x
        recv = np.empty((2, x // 2, y, z), np.float32)

        def pencil(local):
            sub.Alltoall(local, recv)
            out = np.empty((x // 2, 2, y, z), np.float32)
            np.copyto(out, recv.transpose(1, 0, 2, 3))
            return out.reshape(x // 2, 2 * y, z)
        return pencil
    if name == "gather":
        def gather(local):
            out = np.empty(dst.local_shape, np.float32)
            COMM.Allgather(local, out)
            return out
        return gather
    if name == "gather_inner":
        rows, cols = src.local_shape
        recv = np.empty((n, rows, cols), np.float32)

        def gather_inner(local):
            COMM.Allgather(local, recv)
            out = np.empty((rows, n, cols), np.float32)
            np.copyto(out, recv.transpose(1, 0, 2))
            return out.reshape(rows, n * cols)
        return gather_inner
    if name == "pending_sum":
        def pending_sum(local):
            out = np.empty(dst.local_shape, np.float32)
            COMM.Reduce_scatter_block(local, out, op=MPI.SUM)
            return out
        return pending_sum
    if name == "uneven":
        return uneven(src, dst)
    raise ValueError(name)


def uneven(src: redist.ShardingType, dst: redist.ShardingType):
    """``[N{x}, M] -> [N, M{x}]`` with padding: pack each destination's columns of the valid rows, one
    ``Alltoallv``; the rows from each source arrive in order, straight into the result where its columns
    are not padded."""
    n = SIZE
    rows = [src.local_box(r)[0] for r in range(n)]
    cols = [dst.local_box(r)[1] for r in range(n)]
    mine, width = rows[RANK].stop - rows[RANK].start, cols[RANK].stop - cols[RANK].start
    send_counts = [mine * (c.stop - c.start) for c in cols]
    recv_counts = [(r.stop - r.start) * width for r in rows]
    send = np.empty(sum(send_counts), np.float32)
    send_at, recv_at = np.cumsum([0] + send_counts[:-1]), np.cumsum([0] + recv_counts[:-1])

    def run(local):
        for d, c in enumerate(cols):
            send[send_at[d]: send_at[d] + send_counts[d]].reshape(mine, -1)[...] = local[:mine, c]
        out = np.empty(dst.local_shape, np.float32)
        recv = out if width == out.shape[1] else np.empty((src.shape[0], width), np.float32)
        COMM.Alltoallv([send, (send_counts, send_at)], [recv, (recv_counts, recv_at)])
        if recv is not out:
            out[:, :width] = recv
            out[:, width:] = 0
        return out
    return run


# ---------------------------------------------------------------------------------------------- timing
def timed_once(fn) -> float:
    COMM.Barrier()
    t0 = time.perf_counter()
    fn()
    return COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def timed(fns: dict, repeats: int, seed: int = 0) -> dict[str, list[float]]:
    """Two warm-up calls of each, then ``repeats`` rounds, each in a random order, the same on every rank
    (``random.Random(seed)``); per call the max over ranks. Random, not rotating: in a rotation each contender
    always follows the same one and pays for what that one leaves behind (pages a large buffer gave back to
    the system, evicted caches): in a rotation ``reshard`` always runs after the XLA replay or
    gather-then-slice and pays for them."""
    names = list(fns)
    for _ in range(2):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    order = random.Random(seed)
    for _ in range(repeats):
        order.shuffle(names)
        for name in names:
            times[name].append(timed_once(fns[name]))
    return times


def run_case(case: dict, repeats: int, seed: int) -> dict:
    mesh = redist.Mesh.parse(case["mesh"])
    src, dst = (redist.ShardingType.parse(case[k], mesh) for k in ("src", "dst"))
    local = local_input(src)
    box = dst.local_box(RANK)
    expect = values(dst.shape, box)
    redist.mpi.clear_cache(COMM)
    first = timed_once(lambda: redist.mpi.reshard(local, src, dst))
    plan = redist.synthesize(src, dst)
    fns = {"redist": lambda: redist.mpi.reshard(local, src, dst),
           "program": lambda: redist.mpi.run_program(plan.program, local),
           "hand": (lambda f: lambda: f(local))(hand_written(case["name"], src, dst))}
    if src.partial:
        fns["gather_slice"] = (lambda f: lambda: f(local))(allreduce_then_slice(src, dst))
    elif 2 * SIZE * src.global_bytes <= GATHER_SLICE_BUDGET:
        fns["gather_slice"] = (lambda f: lambda: f(local))(gather_then_slice(src, dst))
    correct = {name: bool(COMM.allreduce(int(np.array_equal(fn()[valid(box)], expect)), op=MPI.MIN))
               for name, fn in fns.items()}
    if case["xla"] is not None:
        fns["xla"] = Replay(case["xla"], fresh_result=True)
    times = timed(fns, repeats * max(1, 256 // case["mib"]), seed)  # smaller cases: more rounds (bench/mpi.py)
    return {**{k: case[k] for k in ("name", "ranks", "mib", "mesh", "src", "dst")},
            "steps": [type(i).__name__ for i in plan.program.instructions], "correct": correct,
            "times_s": times, "first_call_s": first}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("out")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0, help="of the rounds' random orders")
    args = ap.parse_args()
    with open(args.cases) as f:
        cases = [c for c in json.load(f) if c["ranks"] == SIZE]
    rows = []
    with redist.mpi.abort_on_error():
        for i, case in enumerate(cases):
            row = run_case(case, args.repeats, args.seed)
            rows.append(row)
            if RANK == 0:
                t = {name: min(ts) for name, ts in row["times_s"].items()}
                xla = f"{t['xla'] * 1e3:.2f}" if "xla" in t else "-"
                print(f"[mpi -n {SIZE}] {i + 1}/{len(cases)} {case['name']} {case['mib']} MiB: redist "
                      f"{t['redist'] * 1e3:.2f} ms, hand {t['hand'] * 1e3:.2f} ms, xla replay {xla} ms, first call "
                      f"+{(row['first_call_s'] - t['redist']) * 1e3:.1f} ms, correct {all(row['correct'].values())}",
                      flush=True)
    if RANK == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
