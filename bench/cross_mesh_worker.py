"""The MPI jobs of ``bench/cross_mesh.py`` (method there), run under ``mpiexec``:

    mpiexec -n 8 python bench/cross_mesh_worker.py cases CASES.json OUT.json [--rounds 15] [--seed 0]
    mpiexec -n 4 python bench/cross_mesh_worker.py permute MIB,MIB,... OUT.json [--rounds 20] [--seed 0]

``cases``: every case of ``CASES.json`` (a list of ``{"name", "src", "src_mesh", "dst", "dst_mesh"}``, the types'
texts and their meshes' texts) by ``redist.mpi.reshard`` and by hand-written mpi4py; ``permute``: a block swap
``[R{x}, C{y}] -> [R{y}, C{x}]`` on ``x=2,y=2`` of each size (MiB per rank) by ``redist.mpi.reshard`` and by a
hand-written ``Sendrecv`` or ``Isend``/``Irecv``. Rank 0 writes every round's times to ``OUT.json``. The job uses
only ``redist``'s public API, so that it measures any checkout on ``PYTHONPATH``.
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

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
TAG = 77


# ---------------------------------------------------------------------------------------------- data
def values(shape, box) -> np.ndarray:
    """The global array's entries in ``box`` (slices of ``shape``): the flat index mod a prime, exact in f32."""
    idx = np.zeros((), np.int64)
    for n, s in zip(shape, box):
        idx = (idx[..., None] * n + np.arange(s.start, s.stop)) % 65521
    return idx.astype(np.float32)


def valid(box) -> tuple:
    """The part of a local buffer that ``box`` (its data, padding excluded) fills."""
    return tuple(slice(0, s.stop - s.start) for s in box)


def local_input(src: redist.ShardingType) -> np.ndarray | None:
    """This rank's buffer of ``src`` (None where it is no device of its mesh): its block, zeros in the padding;
    of a pending sum, the block on the ranks at partial coordinate 0 and zeros elsewhere."""
    if not src.mesh.has_device(RANK):
        return None
    out = np.zeros(src.local_shape, np.float32)
    coords = src.mesh.coords(RANK)
    if not any(src.mesh.axis_coord(coords, a) for a in src.partial):
        box = src.replace(partial=()).local_box(RANK)
        out[valid(box)] = values(src.shape, box)
    return out


# ---------------------------------------------------------------------------------------------- hand-written
def hand_written(src: redist.ShardingType, dst: redist.ShardingType):
    """What a competent mpi4py user writes to move ``src``'s blocks to ``dst``'s (no pending values, or a pending
    sum reduced first by ``Reduce_scatter_block`` on the source's ranks onto its first dim): each destination rank
    receives, straight into a fresh result where the piece is contiguous there, the intersection of its block with
    each source block (from the rank itself where it holds it, else from the block's first holder); sends are
    contiguous slices or packed ones; all posted at once, then ``Waitall``."""
    reduce = None
    if src.partial:
        reduced = src.replace(partial=(), dims=((tuple(src.partial),) + tuple(src.dims[1:])))
        sub = COMM.Split(0 if src.mesh.has_device(RANK) else MPI.UNDEFINED, RANK)
        reduce, src = sub, reduced
    holders: dict = {}
    for d in src.mesh.devices:
        holders.setdefault(_key(src.local_box(d)), []).append(d)
    recvs, sends, local = [], [], []
    for d in dst.mesh.devices:
        want = dst.local_box(d)
        for blocks, ds in holders.items():
            s = d if d in ds else ds[0]
            have = src.local_box(s)
            lo = [max(w.start, h.start) for w, h in zip(want, have)]
            hi = [min(w.stop, h.stop) for w, h in zip(want, have)]
            if any(b <= a for a, b in zip(lo, hi)):
                continue
            at_src = tuple(slice(a - h.start, b - h.start) for a, b, h in zip(lo, hi, have)) + (...,)
            at_dst = tuple(slice(a - w.start, b - w.start) for a, b, w in zip(lo, hi, want)) + (...,)
            if d == s == RANK:
                local.append((at_src, at_dst))
            elif d == RANK:
                recvs.append((s, at_dst))
            elif s == RANK:
                sends.append((d, at_src))
    zero = not dst.is_even()  # padding: zeros where no piece lands

    def run(x):
        if reduce is not None and x is not None:
            chunk = np.empty(src.local_shape, np.float32)
            reduce.Reduce_scatter_block(x, chunk, op=MPI.SUM)
            x = chunk
        out = None
        if dst.mesh.has_device(RANK):
            out = np.zeros(dst.local_shape, np.float32) if zero else np.empty(dst.local_shape, np.float32)
        requests, staged, packed = [], [], []
        for s, at in recvs:
            view = out[at]
            if view.flags.c_contiguous:
                requests.append(COMM.Irecv(view, s, TAG))
            else:
                tmp = np.empty(view.shape, np.float32)
                staged.append((view, tmp))
                requests.append(COMM.Irecv(tmp, s, TAG))
        for d, at in sends:
            piece = np.ascontiguousarray(x[at])
            packed.append(piece)
            requests.append(COMM.Isend(piece, d, TAG))
        MPI.Request.Waitall(requests)
        for view, tmp in staged:
            view[...] = tmp
        for a, b in local:
            out[b] = x[a]
        return out
    return run


def _key(box) -> tuple:
    return tuple((s.start, s.stop) for s in box)


def swap(mib: float):
    """The block swap of ``permute`` with ``mib`` MiB per rank: ``(src, dst, local, sendrecv, isend)``."""
    mesh = redist.Mesh.parse("x=2,y=2")
    cols = 2048
    rows = int(mib * 2**20) // 4 // cols
    src = redist.ShardingType.parse(f"f32[{2 * rows}{{x}}, {2 * cols}{{y}}]", mesh)
    dst = redist.ShardingType.parse(f"f32[{2 * rows}{{y}}, {2 * cols}{{x}}]", mesh)
    local = local_input(src)
    coords = mesh.coords(RANK)
    peer = mesh.device({"x": coords["y"], "y": coords["x"]})  # the rank holding the block this one wants

    def sendrecv(x):
        out = np.empty_like(x)
        if peer == RANK:
            np.copyto(out, x)
        else:
            COMM.Sendrecv(x, peer, TAG, out, peer, TAG)
        return out

    def isend(x):
        out = np.empty_like(x)
        if peer == RANK:
            np.copyto(out, x)
        else:
            MPI.Request.Waitall([COMM.Irecv(out, peer, TAG), COMM.Isend(x, peer, TAG)])
        return out
    return src, dst, local, sendrecv, isend


# ---------------------------------------------------------------------------------------------- timing
def timed_once(fn) -> float:
    COMM.Barrier()
    t0 = time.perf_counter()
    fn()
    return COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def timed(fns: dict, rounds: int, seed: int) -> dict[str, list[float]]:
    """Two warm-up calls of each, then ``rounds`` rounds, each in a random order (the same on every rank); per
    call the maximum over ranks."""
    names = list(fns)
    for _ in range(2):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    order = random.Random(seed)
    for _ in range(rounds):
        order.shuffle(names)
        for name in names:
            times[name].append(timed_once(fns[name]))
    return times


def correct(out, dst: redist.ShardingType) -> bool:
    """Whether every rank's result is its block of ``dst`` (None outside its mesh)."""
    if not dst.mesh.has_device(RANK):
        ok = out is None
    else:
        box = dst.local_box(RANK)
        ok = out is not None and np.array_equal(out[valid(box)], values(dst.shape, box))
    return bool(COMM.allreduce(int(ok), op=MPI.MIN))


def run_cases(path: str, rounds: int, seed: int) -> list[dict]:
    with open(path) as f:
        cases = json.load(f)
    rows = []
    for i, case in enumerate(cases):
        src = redist.ShardingType.parse(case["src"], redist.Mesh.parse(case["src_mesh"]))
        dst = redist.ShardingType.parse(case["dst"], redist.Mesh.parse(case["dst_mesh"]))
        local = local_input(src)
        redist.mpi.clear_cache(COMM)
        first = timed_once(lambda: redist.mpi.reshard(local, src, dst))
        hand = hand_written(src, dst)
        fns = {"redist": lambda: redist.mpi.reshard(local, src, dst), "hand": lambda: hand(local)}
        ok = {name: correct(fn(), dst) for name, fn in fns.items()}
        rows.append({"name": case["name"], "correct": ok, "first_call_s": first, "times_s": timed(fns, rounds, seed)})
        if RANK == 0:
            t = {k: min(v) for k, v in rows[-1]["times_s"].items()}
            print(f"[cross_mesh mpi -n {SIZE}] {i + 1}/{len(cases)} {case['name']}: redist {t['redist'] * 1e3:.2f} ms, "
                  f"hand {t['hand'] * 1e3:.2f} ms, correct {all(ok.values())}", flush=True)
    return rows


def run_permute(sizes: str, rounds: int, seed: int) -> list[dict]:
    rows = []
    for mib in (float(s) for s in sizes.split(",")):
        src, dst, local, sendrecv, isend = swap(mib)
        redist.mpi.clear_cache(COMM)
        fns = {"redist": lambda: redist.mpi.reshard(local, src, dst), "sendrecv": lambda: sendrecv(local),
               "isend": lambda: isend(local)}
        ok = {name: correct(fn(), dst) for name, fn in fns.items()}
        rows.append({"name": "block swap", "mib": mib, "src": str(src), "dst": str(dst), "mesh": str(src.mesh),
                     "correct": ok, "times_s": timed(fns, rounds, seed)})
        if RANK == 0:
            t = {k: min(v) for k, v in rows[-1]["times_s"].items()}
            print(f"[permute mpi -n {SIZE}] {mib:g} MiB: redist {t['redist'] * 1e3:.2f} ms, Sendrecv "
                  f"{t['sendrecv'] * 1e3:.2f} ms, Isend/Irecv {t['isend'] * 1e3:.2f} ms, correct {all(ok.values())}",
                  flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("cases", "permute"))
    ap.add_argument("what", help="cases: the cases' JSON; permute: MiB per rank, comma-separated")
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0, help="of the rounds' random orders")
    args = ap.parse_args()
    with redist.mpi.abort_on_error():
        rows = (run_cases if args.mode == "cases" else run_permute)(args.what, args.rounds, args.seed)
    if RANK == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
