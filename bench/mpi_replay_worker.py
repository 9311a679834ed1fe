"""MPI part of bench/redistribution.py: ours vs XLA's collectives replayed vs gather-then-slice, per case.

    .venv/bin/mpiexec -n 8 .venv/bin/python bench/mpi_replay_worker.py CASES.json OUT.json [--repeats 9]

``CASES.json`` is a list of ``{"name", "family", "mesh", "src", "dst", "xla"}``: ``xla`` is the list of XLA's
collectives parsed from its compiled HLO (``redist.hlo.Collective.to_dict()``), or null for partial
sources. Every rank runs the cases whose mesh has ``comm.size`` devices, and rank 0 writes ``OUT.json``.

Contenders, per case (rank r is device r):

- ours: ``redist.mpi.reshard(local, src, dst)`` (the public API, including its one small argument-agreement
  ``Allgather``); ``ours_program``: the same plan through ``redist.mpi.run_program`` (no agreement).
- xla: XLA's collective sequence replayed with mpi4py with the same message sizes, the same groups (one
  sub-communicator per replica-group set, ranked in group order) and the same permute pairs: all-gather →
  ``Allgather``, all-to-all → ``Alltoall``, reduce-scatter → ``Reduce_scatter_block``, all-reduce →
  ``Allreduce``, collective-permute → ``Isend``/``Irecv`` per pair (self pairs copy locally), dynamic-slice →
  a local copy of the result's size, and ``copy`` (the local fusions, copies and transposes of XLA's entry
  computation, e.g. the packing and unpacking around an all-to-all; listed by ``bench/mpi.py``, not by
  ``bench/redistribution.py``) → a contiguous copy of the result's size. A contiguous copy is cheaper than
  a transposing one, so the replay is slightly favoured.
- baseline: non-partial sources, gather-then-slice (``Allgather`` of every rank's shard, assemble the global
  array, copy out this rank's destination block); partial sources, ``Allreduce`` over the partial axes'
  groups, then copy out the destination block.

Correctness: ours's result is compared exactly with the destination shard of the seeded integer-valued
global array (partial sources: the summand of a device is the block on the devices whose partial
coordinates are all 0, zeros elsewhere).

Timing: two warm-up calls of each contender, then ``--repeats`` rounds; in each round the contenders run in
a rotating order, each as ``Barrier``; ``t0``; call; ``t = elapsed``; and the round's time of a contender
is the maximum of ``t`` over ranks (``allreduce MAX``). Medians over rounds are reported.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import numpy as np
from mpi4py import MPI

import redist
import redist.mpi
from redist.data import random_array

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
_SUBCOMMS: dict = {}


def subcomm(groups: tuple[tuple[int, ...], ...]):
    """This rank's sub-communicator for a set of replica groups (ranked in group order); created once."""
    if groups not in _SUBCOMMS:
        color, key = MPI.UNDEFINED, 0
        for i, g in enumerate(groups):
            if RANK in g:
                color, key = i, g.index(RANK)
        _SUBCOMMS[groups] = COMM.Split(color, key)
    return _SUBCOMMS[groups]


# ---------------------------------------------------------------------------------------------- XLA replay
class Replay:
    """XLA's collectives as prepared mpi4py calls with preallocated buffers of the HLO's sizes. With
    ``fresh_result`` the last operation writes into a buffer allocated on each call, as XLA's CPU runtime
    returns a new buffer per execution (its temporaries stay preallocated here, which favours the replay)."""

    def __init__(self, collectives: list[dict], fresh_result: bool = False):
        self.ops = []
        self.fresh_result = fresh_result and bool(collectives)
        # Local copies share one pair of buffers: only their time is replayed, not XLA's memory.
        largest = max((sum(math.prod(s) for s in c["result_shapes"]) for c in collectives if c["kind"] == "copy"),
                      default=0)
        copy_from, copy_to = np.ones(largest, np.float32), np.empty(largest, np.float32)
        for c in collectives:
            nbytes = sum(math.prod(s) for s in c["result_shapes"]) * 4  # f32 cases
            n = nbytes // 4
            kind = c["kind"]
            if kind == "collective_permute":
                pairs = [tuple(p) for p in c["pairs"]]
                self.ops.append((kind, pairs, np.ones(n, np.float32), np.empty(n, np.float32)))
                continue
            if kind == "dynamic_slice":
                self.ops.append((kind, None, np.ones(4 * n, np.float32), np.empty(n, np.float32)))
                continue
            if kind == "copy":
                self.ops.append((kind, None, copy_from[:n], copy_to[:n]))
                continue
            groups = tuple(tuple(g) for g in c["groups"])
            sub = subcomm(groups)
            k = len(groups[0])
            if kind == "all_gather":
                send, recv = np.ones(n // k, np.float32), np.empty(n, np.float32)
            elif kind == "reduce_scatter":
                send, recv = np.ones(n * k, np.float32), np.empty(n, np.float32)
            else:  # all_to_all, all_reduce
                send, recv = np.ones(n, np.float32), np.empty(n, np.float32)
            self.ops.append((kind, sub, send, recv))

    def __call__(self):
        last = len(self.ops) - 1
        for i, (kind, how, send, recv) in enumerate(self.ops):
            if i == last and self.fresh_result:
                recv = np.empty_like(recv)
            if kind == "all_gather":
                how.Allgather(send, recv)
            elif kind == "all_to_all":
                how.Alltoall(send, recv)
            elif kind == "reduce_scatter":
                how.Reduce_scatter_block(send, recv, op=MPI.SUM)
            elif kind == "all_reduce":
                how.Allreduce(send, recv, op=MPI.SUM)
            elif kind in ("dynamic_slice", "copy"):
                np.copyto(recv, send[: recv.size])
            elif kind == "collective_permute":
                reqs = []
                for s, t in how:
                    if s == t == RANK:
                        np.copyto(recv, send)
                    elif t == RANK:
                        reqs.append(COMM.Irecv(recv, source=s, tag=77))
                    elif s == RANK:
                        reqs.append(COMM.Isend(send, dest=t, tag=77))
                MPI.Request.Waitall(reqs)


# ---------------------------------------------------------------------------------------------- baselines
def valid(box) -> tuple[slice, ...]:
    """The part of a (padded) local buffer that ``box`` fills."""
    return tuple(slice(0, s.stop - s.start) for s in box)


def gather_then_slice(src: redist.ShardingType, dst: redist.ShardingType):
    """``Allgather`` of every shard, the global array assembled, this rank's destination block copied out (its
    padding, where the dims are uneven, zero)."""
    blocks = np.empty((SIZE,) + src.local_shape, src.np_dtype)
    full = np.empty(src.shape, src.np_dtype)
    boxes = [src.local_box(d) for d in range(SIZE)]
    mine = dst.local_box(RANK)

    def run(local):
        COMM.Allgather(np.ascontiguousarray(local), blocks)
        for d, box in enumerate(boxes):
            full[box] = blocks[d][valid(box)]
        out = np.zeros(dst.local_shape, dst.np_dtype)
        out[valid(mine)] = full[mine]
        return out
    return run


def allreduce_then_slice(src: redist.ShardingType, dst: redist.ShardingType):
    mesh = src.mesh
    groups = tuple(tuple(g) for g in mesh.groups(tuple(a for a in src.partial if a not in dst.partial)))
    sub = subcomm(groups)
    summed = np.empty(src.local_shape, src.np_dtype)
    # dst's block, in the coordinates of the source's local buffer (src splits a subset of what dst splits)
    s_box, d_box = src.local_box(RANK), dst.local_box(RANK)
    rel = tuple(slice(d.start - s.start, d.stop - s.start) for s, d in zip(s_box, d_box))

    def run(local):
        sub.Allreduce(np.ascontiguousarray(local), summed, op=MPI.SUM)
        return np.ascontiguousarray(summed[rel])
    return run


# ---------------------------------------------------------------------------------------------- one case
def local_input(src: redist.ShardingType, seed: int):
    full = random_array(np.random.default_rng(seed), src.shape, src.np_dtype, -50, 50)
    plain = src.replace(partial=())
    block = full[plain.local_box(RANK)]
    if src.partial:
        coords = src.mesh.coords(RANK)
        if any(src.mesh.axis_coord(coords, a) for a in src.partial):
            block = np.zeros_like(block)
    return np.ascontiguousarray(block), full


def timed(fns: dict, repeats: int) -> dict:
    names = list(fns)
    for _ in range(2):
        for n in names:
            fns[n]()
    acc = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            COMM.Barrier()
            t0 = time.perf_counter()
            fns[n]()
            t = time.perf_counter() - t0
            acc[n].append(COMM.allreduce(t, op=MPI.MAX))
    return {n: statistics.median(v) for n, v in acc.items()}


def run_case(case: dict, repeats: int, seed: int) -> dict | None:
    mesh = redist.Mesh.parse(case["mesh"])
    if mesh.size != SIZE:
        return None
    src = redist.ShardingType.parse(case["src"], mesh)
    dst = redist.ShardingType.parse(case["dst"], mesh)
    local, full = local_input(src, seed)
    plan = redist.synthesize(src, dst)
    out = redist.mpi.reshard(local, src, dst)
    expect = full[dst.replace(partial=()).local_box(RANK)]
    correct = bool(COMM.allreduce(int(np.array_equal(out, expect)), op=MPI.MIN))
    fns = {"ours": lambda: redist.mpi.reshard(local, src, dst),
           "ours_program": lambda: redist.mpi.run_program(plan.program, local, COMM)}
    base = allreduce_then_slice(src, dst) if src.partial else gather_then_slice(src, dst)
    fns["baseline"] = lambda: base(local)
    if case.get("xla") is not None:
        fns["xla"] = Replay(case["xla"])
    t = timed(fns, repeats)
    return {"name": case["name"], "family": case["family"], "mesh": case["mesh"], "src": case["src"],
            "dst": case["dst"], "correct": correct, "ours_s": t["ours"], "ours_program_s": t["ours_program"],
            "baseline_s": t["baseline"], "xla_s": t.get("xla"),
            "baseline": "allreduce-then-slice" if src.partial else "gather-then-slice"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("out")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with open(args.cases) as f:
        cases = json.load(f)
    rows = []
    t0 = time.perf_counter()
    with redist.mpi.abort_on_error():
        for i, case in enumerate(cases):
            row = run_case(case, args.repeats, args.seed + i)
            if row is not None:
                rows.append(row)
                if RANK == 0:
                    xla = "-" if row["xla_s"] is None else f"{row['xla_s'] * 1e3:.2f} ms"
                    print(f"[mpi n={SIZE}] {i + 1}/{len(cases)} {row['name']}: ours {row['ours_s'] * 1e3:.2f} ms, "
                          f"xla replay {xla}, {row['baseline']} {row['baseline_s'] * 1e3:.2f} ms", flush=True)
    if RANK == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": SIZE, "repeats": args.repeats, "seconds": time.perf_counter() - t0,
                       "cases": rows}, f, indent=1)


if __name__ == "__main__":
    main()
