"""Where redist.mpi.reshard's time goes, against the hand-written program, interleaved in one MPI job.

    mpiexec -n N python bench/mpi_trace.py [--cases gather pending_sum] [--mib 16 64] [--repeats 40]

For each case of ``bench/mpi.py`` (``case_types``) and size, every rank runs these contenders in rounds, in a
rotating order (A/B alternation), each call as ``Barrier``; time; call; time is the maximum over ranks:

- ``hand``: the hand-written program of ``bench/mpi_worker.py``;
- ``hand_nb``: the same with its collective nonblocking (``Iallgather`` ... then ``Wait``);
  ``hand_verdict``: that, after starting a 32-byte verdict on another communicator as redist's is
  (``redist.backends.mpi_channels.Ballot``), waited for before the data; ``hand_first``: the verdict completed
  before the blocking collective is called (these isolate what redist's way of posting costs);
- ``redist``: ``redist.mpi.reshard`` (agreed combination: the verdict travels while the plan runs);
- ``program``: ``redist.mpi.run_program`` (no agreement);
- ``collectives``: ``reshard`` with MPI's ``Iallgather``, ``Ialltoall`` and ``Ireduce_scatter_block`` where
  redist posts point-to-point transfers and reduces with numpy (:class:`CollectiveBackend`), to compare the two
  transports in one run;
- ``phases``: the steps of ``reshard`` one after the other, each timed on this rank (plan lookup, input
  validation, verdict start, then per instruction of the program the wait for its transfers and the rest of
  it (allocation, packing, posting, unpacking), then the result's hand-over).

Rank 0 prints per contender the min and median time, and the median and quartiles of its per-round ratio to
``hand`` (a paired comparison: the two ran within moments of each other, under the same load), and the
median of each phase (max over ranks). Not part of ``./dev bench``: a diagnostic of the MPI backend's overhead,
to run at the lowest load available (the load average is printed with each case).
"""

from __future__ import annotations

import argparse
import math
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
from bench.mpi import CASES, case_types  # noqa: E402
import bench.mpi_worker as W  # noqa: E402
from bench.mpi_worker import hand_written, local_input  # noqa: E402
from redist import mpi as M  # noqa: E402
from redist.backends import interpreter  # noqa: E402
from redist.backends import mpi_backend as B  # noqa: E402
from redist.backends import mpi_channels, mpi_reductions, mpi_transfers  # noqa: E402

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()


class Posting:
    """``COMM`` for the hand-written programs, whose data collectives run blocking (``mode`` "block"),
    nonblocking ("nb"), nonblocking after a verdict was started, waited for before the data ("verdict"), or
    blocking after a verdict completed ("first")."""

    NONBLOCKING = {"Allgather": "Iallgather", "Alltoall": "Ialltoall", "Alltoallv": "Ialltoallv",
                   "Reduce_scatter_block": "Ireduce_scatter_block"}

    def __init__(self, comm):
        self.comm, self.ballot, self.mode = comm, mpi_channels.Ballot(comm.Dup()), "block"

    def __getattr__(self, name):
        if name not in self.NONBLOCKING or self.mode == "block":
            return getattr(self.comm, name)

        if self.mode == "first":
            def first(*args, **kwargs):
                self.ballot.cast((0, 0, 0, 0))[0].Wait()
                getattr(self.comm, name)(*args, **kwargs)
            return first

        def post(*args, **kwargs):
            verdict = None
            if self.mode == "verdict":
                verdict, _ = self.ballot.cast((0, 0, 0, 0))
            request = getattr(self.comm, self.NONBLOCKING[name])(*args, **kwargs)
            if verdict is not None:
                verdict.Wait()
            request.Wait()
        return post


POSTING = Posting(COMM)
W.COMM = POSTING


def with_mode(mode: str, fn):
    def call():
        POSTING.mode = mode
        try:
            return fn()
        finally:
            POSTING.mode = "block"
    return call


class TimedBackend(B.MpiBackend):
    """The MPI backend with the wait for each instruction's transfers (``_complete``) and the rest of its method
    timed."""

    def __init__(self, *args, phases: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.phases = phases
        self.step = None

    def _complete(self, *requests) -> None:
        t0 = time.perf_counter()
        super()._complete(*requests)
        self.phases[f"{self.step} transfers"] = time.perf_counter() - t0

    def __getattribute__(self, name):
        method = super().__getattribute__(name)
        if name not in interpreter.METHODS.values():
            return method

        def timed(ins, buf):
            self.step = f"{name}"
            t0 = time.perf_counter()
            out = method(ins, buf)
            total = time.perf_counter() - t0
            self.phases[f"{name} local"] = total - self.phases.get(f"{name} transfers", 0.0)
            return out
        return timed


class CollectiveBackend(B.MpiBackend):
    """The MPI backend with MPI's collectives moving the data of ``AllGather``, ``AllToAll`` and an even
    ``ReduceScatter``: one nonblocking MPI collective each."""

    def _collective(self, request) -> None:
        if self.verdict is not None:
            self.settle([request])
        request.Wait()

    def all_gather(self, ins, buf):
        x = buf.take()
        sub, k = self.ch.group(ins.axes)
        shape = x.shape[: ins.dim] + (k * x.shape[ins.dim],) + x.shape[ins.dim + 1:]
        if math.prod(x.shape[: ins.dim]) == 1:
            out, scratch = self._array(ins, "result", shape, x.dtype)
            self._collective(sub.Iallgather([mpi_transfers.raw(x), MPI.BYTE], [mpi_transfers.raw(out), MPI.BYTE]))
            return B.Buffer(out, not scratch, scratch)
        got, _ = self._array(ins, "temp", (k,) + x.shape, x.dtype)
        self._collective(sub.Iallgather([mpi_transfers.raw(x), MPI.BYTE], [mpi_transfers.raw(got), MPI.BYTE]))
        del x
        out, scratch = self._array(ins, "result", shape, got.dtype)
        np.copyto(out.reshape(got.shape[1: ins.dim + 1] + (k,) + got.shape[ins.dim + 1:]),
                  np.moveaxis(got, 0, ins.dim))
        return B.Buffer(out, not scratch, scratch)

    def all_to_all(self, ins, buf):
        x = buf.take()
        sub, _ = self.ch.group(ins.axes)
        out, scratch = self._array(ins, "result", x.shape, x.dtype)
        self._collective(sub.Ialltoall([mpi_transfers.raw(x), MPI.BYTE], [mpi_transfers.raw(out), MPI.BYTE]))
        return B.Buffer(out, not scratch, scratch)

    def reduce_scatter(self, ins, buf):
        if buf.x.shape[ins.dim] % self.ch.mesh.group_size(ins.axes):
            return self._reduce_scatter_counts(ins, buf)
        x = buf.take()
        sub, k = self.ch.group(ins.axes)
        out_shape = x.shape[: ins.dim] + (x.shape[ins.dim] // k,) + x.shape[ins.dim + 1:]
        pre = math.prod(x.shape[: ins.dim])
        send = x
        if pre > 1:
            send, _ = self._array(ins, "temp", (k, pre, x.size // (pre * k)), x.dtype)
            np.copyto(send, x.reshape(pre, k, -1).swapaxes(0, 1))
        del x
        out, scratch = self._array(ins, "result", out_shape, send.dtype)
        element, op = mpi_reductions.reduce_op(send.dtype, ins.reduction)
        self._collective(sub.Ireduce_scatter_block(mpi_reductions.reduce_spec(send, element),
                                                   mpi_reductions.reduce_spec(out, element), op))
        return B.Buffer(out, not scratch, scratch)


def with_collectives(local, src, dst) -> np.ndarray:
    """``reshard`` on an agreed combination as :func:`redist.mpi.reshard` runs it, on :class:`CollectiveBackend`."""
    ctx = mpi_channels.context(COMM)
    agreement = ctx.agreed[(src, dst)]
    x, problem = M._local(local, src, ctx.rank)
    verdict = mpi_channels.Verdict(ctx.ballot, agreement.digest, False, bool(problem))
    program = agreement.stages[0]
    backend = CollectiveBackend(ctx, agreement.channels[0], program, verdict)
    buf = interpreter.run(program, backend, B.Buffer(x, B.owned(x, local)))
    backend.settle([])
    return buf.take() if buf.owned else buf.take().copy()


def phased(local, src, dst, phases: dict) -> np.ndarray:
    """``reshard`` on an agreed combination, step by step (the same calls as :func:`redist.mpi.reshard`)."""
    t = time.perf_counter()
    comm = mpi_channels.communicator(None)
    ctx = mpi_channels.context(comm)
    agreement = ctx.agreed[(src, dst)]
    channel, program = agreement.channels[0], agreement.stages[0]
    t, phases["lookup"] = time.perf_counter(), time.perf_counter() - t
    x, problem = M._local(local, src, ctx.rank)
    t, phases["validate"] = time.perf_counter(), time.perf_counter() - t
    verdict = mpi_channels.Verdict(ctx.ballot, agreement.digest, False, bool(problem))
    t, phases["verdict start"] = time.perf_counter(), time.perf_counter() - t
    backend = TimedBackend(ctx, channel, program, verdict, phases=phases)
    buf = interpreter.run(program, backend, B.Buffer(x, B.owned(x, local)))
    backend.settle([])
    t = time.perf_counter()
    out = buf.take() if buf.owned else buf.take().copy()
    phases["hand-over"] = time.perf_counter() - t
    return out


def quartiles(xs) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def trace(name: str, mib: int, repeats: int, contenders) -> None:
    mesh_text, a, b = case_types(name, COMM.Get_size(), mib)
    mesh = redist.Mesh.parse(mesh_text)
    src, dst = (redist.ShardingType.parse(t, mesh) for t in (a, b))
    local = local_input(src)
    redist.mpi.clear_cache(COMM)
    redist.mpi.reshard(local, src, dst)
    plan = redist.synthesize(src, dst)
    phases: dict = {}
    hand = (lambda f: lambda: f(local))(hand_written(name, src, dst))
    fns = {"hand": hand, "hand_nb": with_mode("nb", hand), "hand_verdict": with_mode("verdict", hand),
           "hand_first": with_mode("first", hand),
           "redist": lambda: redist.mpi.reshard(local, src, dst),
           "program": lambda: redist.mpi.run_program(plan.program, local),
           "collectives": lambda: with_collectives(local, src, dst),
           "phases": lambda: phased(local, src, dst, phases)}
    fns = {k: f for k, f in fns.items() if k == "hand" or k in contenders}
    expect = fns["hand"]()
    for f in fns.values():
        assert np.array_equal(f(), expect)
    times = {k: [] for k in fns}
    per_phase: dict = {}
    names, order = list(fns), random.Random(0)
    for _ in range(repeats):
        order.shuffle(names)  # the same on every rank; random, so no contender always follows the same one
        for k in names:
            COMM.Barrier()
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX))
            if k == "phases":
                for p, v in phases.items():
                    per_phase.setdefault(p, []).append(COMM.allreduce(v, op=MPI.MAX))
    if RANK == 0:
        hand = min(times["hand"])
        steps = [type(i).__name__ for i in plan.program.instructions]
        print(f"\n{name} {mib} MiB -n {COMM.Get_size()}  steps {steps}  load {os.getloadavg()[0]:.1f}")
        for k, v in times.items():
            paired = quartiles([t / h for t, h in zip(v, times["hand"])])
            print(f"  {k:<12} min {min(v) * 1e3:8.2f} ms ({min(v) / hand:5.2f}x)  median "
                  f"{statistics.median(v) * 1e3:8.2f} ms  per-round ratio to hand: median {paired[1]:5.2f} "
                  f"(quartiles {paired[0]:5.2f} {paired[2]:5.2f})")
        for p, v in per_phase.items():
            print(f"    {p:<28} median {statistics.median(v) * 1e3:8.3f} ms  min {min(v) * 1e3:8.3f} ms")
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--mib", type=float, nargs="+", default=[16, 64])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--contenders", nargs="+", default=["hand_nb", "hand_verdict", "hand_first", "redist", "program",
                                                         "collectives", "phases"])
    args = ap.parse_args()
    with redist.mpi.abort_on_error():
        for mib in args.mib:
            for name in args.cases:
                trace(name, mib, args.repeats, args.contenders)


if __name__ == "__main__":
    main()
