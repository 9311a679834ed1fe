"""The MPI entry point: reshard with mpi4py, one rank per device (docs/spec.md §5).

    from mpi4py import MPI
    import redist, redist.mpi

    with redist.mpi.abort_on_error():                 # a failing rank takes the job down, never a hang
        out = redist.mpi.reshard(local, src, dst)     # on every rank of COMM_WORLD; rank == device id

Contracts:

- :func:`reshard` is collective over ``comm``: every rank calls it with its own shard of ``src`` and the same
  ``src`` and ``dst``. Rank ``r`` is device id ``r`` (a global device number, :class:`redist.Mesh`): under
  ``src`` it holds the block of its position on ``src.mesh``, and it gets the block of its position on
  ``dst.mesh``. The two meshes may be any two: one mesh, two device orders of it, or meshes of other devices
  or axes (a pipeline's stages on ranks 0-3 and 4-7, a job resized from 8 ranks to 6); ``comm`` has a rank for
  every device id of both. A rank that is no device of ``src.mesh`` passes None, and one that is no device of
  ``dst.mesh`` gets None (a rank in neither takes part only in the agreement). The plan's steps on each mesh run
  on the ranks of its devices, its transfers point to point (:mod:`redist.backends.mpi_stages`).
- The ranks agree on their arguments, so that a wrong ``comm.size``, arguments that differ between ranks, or
  a local buffer whose shape does not fit ``src`` or whose data does not convert to its dtype without loss
  (:mod:`redist.buffers`) on any rank make *every* rank raise :class:`redist.ShardingError` (none hangs, and
  the caller's buffer is untouched). The first call of an argument combination (``src``, ``dst``) on a
  communicator, or any call with ``check=True``, runs the full agreement: one small ``Allgather`` of a
  digest of the arguments and of each rank's buffer check, before any data moves; then the plan is made and
  given a *channel* of its own (a duplicate communicator with the sub-communicators of its groups, split
  there and then). Every call starts a 32-byte verdict, the maximum over the ranks of (digest, negated digest,
  "this rank needs the full agreement", "this rank's buffer is wrong"), passed in one round from every rank to
  every other on a communicator of at most 32 ranks (a nonblocking neighbourhood all-gather), so that no rank's
  verdict waits for another rank to be done with its own transfers, and by a nonblocking ``Allreduce`` on a
  larger one (:class:`~redist.backends.mpi_channels.Ballot`). A rank with an
  agreed combination and a good buffer does not wait for it: it runs the plan on the combination's channel
  at once, its transfers nonblocking, and waits for the verdict only once its first transfers are under
  way (both progress together), before waiting for the data. Ranks that run different plans run them on
  different channels, where no transfer can be confused with another, and every rank waits for the
  verdict, which always completes; a verdict against the call makes every rank drop what it
  was doing (the requests left behind, and their buffers, are kept alive, never reused) and forget every
  agreement, and then all run the full agreement, which raises naming the ranks (or, where some rank only
  asked for it, agrees and runs the plan). The agreed combinations are cached on ``comm`` (at most 64, each
  with its channel, oldest first out). The verdict costs no extra synchronisation on the way of the data: it
  completes while the first transfers move.
- The result is always a new array (None on a rank that is no device of ``dst.mesh``); the caller's buffer is
  never returned, aliased or written to. Extra
  memory per rank stays within ``2 · max(src.local_bytes, dst.local_bytes)``, counting the one scratch buffer
  a rank keeps between calls (its size: :func:`held_bytes`; it only grows, so after a larger reshard it
  stays at that one's size until :func:`clear_cache`). Communicators, agreements (with their plans)
  and the scratch buffer are cached on ``comm``; :func:`clear_cache` frees them. How data travels:
  :mod:`redist.backends.mpi_backend`.
- A failure on one rank in the middle of a plan (an exception, not an agreement error) leaves the other
  ranks blocked in a collective: wrap SPMD code in :func:`abort_on_error` so that such a rank aborts the job.
- Reductions (sum, max, min, prod) of a pending sum scattered evenly over its group are computed by numpy in
  group order, as the numpy backend computes them; the others (an all-reduce, an uneven scatter) use MPI's
  reduction order, so floating-point results can differ from the numpy backend in the last bits;
  integer-valued data and integer dtypes agree exactly.

:func:`reshard` agrees on the arguments, plans (:func:`redist.synthesize`, once per agreed combination) and
runs the plan's stages (:mod:`redist.backends.mpi_stages`: each program with the MPI interpreter,
:mod:`redist.backends.mpi_backend`, whose :func:`run_program` this module re-exports, and the transfers between
meshes point to point), with :func:`clear_cache` and :func:`held_bytes` of the communicators and buffers it
keeps (:mod:`redist.backends.mpi_channels`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
import traceback
from typing import NoReturn

import numpy as np

from redist import program as P
from redist.backends.interpreter import check_numpy_rank
from redist.backends.mpi_backend import run_program
from redist.backends.mpi_channels import Disagreement, Verdict, clear_cache, communicator, context, held_bytes
from redist.backends.mpi_stages import run_stages
from redist.buffers import describe, is_local_buffer, local_buffer
from redist.errors import ShardingError
from redist.synthesis import synthesize
from redist.types import ShardingType

__all__ = ["reshard", "run_program", "abort_on_error", "clear_cache", "held_bytes"]


# ---------------------------------------------------------------------------------------------- entry point
def reshard(local, src: ShardingType, dst: ShardingType, comm=None, *, check: bool = False) -> np.ndarray | None:
    """This rank's shard of type ``dst``, given its shard ``local`` of type ``src``.

    Collective over ``comm`` (default ``MPI.COMM_WORLD``): every rank calls it. Rank ``r`` is device ``r``, and
    ``comm`` has a rank for every device id of ``src.mesh`` and ``dst.mesh`` (``comm.size`` at least their
    :attr:`~redist.Mesh.id_bound`); the two meshes may hold other devices (module docstring). A rank that is no
    device of ``src.mesh`` passes None as ``local``; one that is no device of ``dst.mesh`` gets None. The result
    is otherwise always a new C-contiguous array, never ``local`` or a view of it (not even for an empty plan,
    ``src == dst``, or a rank whose buffer stays put). ``local`` is converted to ``src``'s dtype only without
    loss (:mod:`redist.buffers`, as :func:`redist.execute` takes shards). ``check=True`` runs the full argument
    agreement even for a combination the ranks agreed on before. Raises :class:`ShardingError` if ``comm`` is no
    MPI intracommunicator (on the ranks that passed it), and on every rank if the ranks' arguments disagree, if
    ``comm`` has too few ranks, if some rank's ``local`` does not have ``src.local_shape`` or does not convert to
    ``src``'s dtype (or is not None on a rank that is no device of ``src.mesh``), or if no plan exists from ``src`` to
    ``dst`` or its program holds buffers of more dims than numpy has (before any data moves where the
    combination is new to some rank; else as soon as the verdict arrives, with nothing returned and ``local``
    untouched).
    """
    comm = communicator(comm)
    ctx = context(comm)
    typed = isinstance(src, ShardingType) and isinstance(dst, ShardingType)
    key = (src, dst) if typed else None
    known = ctx.recall(src, dst) if typed and not check else None
    digest = known.digest if known else _digest(src, dst, typed)
    if known and (local is None if known.shape is None else is_local_buffer(local, known.shape, known.dtype)):
        x, problem = local, ""  # the common case, in a few comparisons
    else:
        x, problem = _local(local, src, ctx.rank) if typed else (None, "src is no ShardingType")
    verdict = Verdict(ctx.ballot, digest, not known, bool(problem))
    if known and not problem:
        try:  # run on while the verdict travels: a verdict against the call raises on every rank
            return run_stages(known.stages, known.channels, x, local, ctx, verdict)
        except Disagreement:
            ctx.drop(key)
    else:
        verdict.wait()
    if verdict.disagreed():
        ctx.reset()  # the same on every rank: whatever ran, ran on the wrong assumptions
    _agree_fully(ctx.comm, src, dst, typed, digest, problem)
    stages = synthesize(src, dst).stages  # the same on every rank, and so is what it raises
    for stage in stages:
        if isinstance(stage, P.Program):
            check_numpy_rank(stage, "redist.mpi.reshard")
    agreement = ctx.open(key, digest, stages)
    return run_stages(agreement.stages, agreement.channels, x, local, ctx)


# ---------------------------------------------------------------------------------------------- agreement
def _digest(src, dst, typed: bool) -> int:
    """A 63-bit digest of the arguments that is the same on every rank (Python's ``hash`` is not); never
    negative, so that its negation is exact in the verdict."""
    # Untyped arguments are compared by type only: their reprs may hold addresses that differ between ranks.
    text = f"{src.mesh}|{src}|{dst.mesh}|{dst}" if typed else f"{type(src).__qualname__}|{type(dst).__qualname__}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _local(local, src: ShardingType, rank: int) -> tuple[np.ndarray | None, str]:
    """``(buffer, "")`` for a ``local`` that fits ``src`` on ``rank`` (None on a rank that is no device of its
    mesh), else ``(None, what is wrong with it)``."""
    if not src.mesh.has_device(rank):
        return None, "" if local is None else (f"rank {rank} is no device of mesh {src.mesh} and passes None, got "
                                               f"{describe(local)}")
    try:
        return local_buffer(local, src.local_shape, src.np_dtype, "it"), ""
    except ShardingError as e:
        return None, str(e)


def _agree_fully(comm, src, dst, typed: bool, digest: int, problem: str) -> None:
    """One ``Allgather`` of (digest, local-buffer check) per rank; raise on every rank if any disagrees or
    fails, naming the ranks."""
    rank, size = comm.Get_rank(), comm.Get_size()
    every = np.empty((size, 2), dtype=np.int64)
    comm.Allgather(np.array([digest, int(not problem)], dtype=np.int64), every)
    if len(set(every[:, 0].tolist())) > 1:
        groups: dict[int, list[int]] = {}
        for r, h in enumerate(every[:, 0].tolist()):
            groups.setdefault(h, []).append(r)
        raise ShardingError(
            "redist.mpi.reshard was called with different arguments on different ranks (rank groups "
            f"{sorted(groups.values())}); on rank {rank}: src={src}, dst={dst}")
    if not typed:
        raise ShardingError(f"redist.mpi.reshard needs ShardingType src and dst, got {describe(src)} and "
                            f"{describe(dst)}")
    short = next((m for m in (src.mesh, dst.mesh) if m.id_bound > size), None)
    if short is not None:
        has = f"{short.size} devices" if short.id_bound == short.size else f"device ids up to {short.id_bound - 1}"
        raise ShardingError(f"redist.mpi.reshard: the communicator has {size} ranks but mesh {short} has {has}; "
                            "run with a rank per device id (rank r is device r)")
    bad = [r for r in range(size) if not every[r, 1]]
    if bad:
        here = f"; on this rank (rank {rank}) {problem}" if problem else ""
        outside = "" if src.mesh.devices == range(size) else "; None on the ranks that are no device of its mesh"
        raise ShardingError(
            f"redist.mpi.reshard: the local buffer on rank(s) {bad} does not match src {src} "
            f"(expected shape {src.local_shape}, dtype {src.np_dtype.name}{outside}){here}")


# ---------------------------------------------------------------------------------------------- failures
@contextlib.contextmanager
def abort_on_error(comm=None, errorcode: int = 1):
    """Wrap SPMD code so that an exception on any rank aborts the whole job instead of leaving the others
    blocked in a collective: the traceback is printed to stderr (prefixed with the rank), then, after
    :data:`ABORT_GRACE_S` for the process manager to forward it, ``comm.Abort(errorcode)`` ends every process
    of ``comm`` (``mpiexec`` exits non-zero). A rank that leaves the block by ``sys.exit`` aborts the job too,
    whatever the status (0 included), saying so: the other ranks would wait for it forever.

    Nothing after the block runs on the failing rank: MPICH's ``MPI_Abort`` may return (or take a while)
    before the process manager kills the job, so the rank then ends itself with ``os._exit(errorcode)``
    (after flushing stdout and stderr; no ``finally`` blocks, ``atexit`` handlers or code after the block)."""
    comm = communicator(comm)
    try:
        yield
    except BaseException as e:
        _abort(comm, errorcode, e)


# MPICH's process manager may end the job on MPI_Abort before it has forwarded what the aborting rank just
# wrote, and the traceback is then lost (the more likely, the busier the cores). The rank waits this long after
# flushing, so that the output is read from its pipes first.
ABORT_GRACE_S = 0.2


def _abort(comm, errorcode: int, error: BaseException) -> NoReturn:
    rank = comm.Get_rank()
    text = traceback.format_exc()
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.rstrip().splitlines()))
    why = ""
    if isinstance(error, SystemExit):
        status = 0 if error.code is None else error.code if isinstance(error.code, int) else 1
        why = f"rank {rank} left the block by sys.exit with status {status}, and the other ranks would wait for it: "
    sys.stderr.write(f"[rank {rank}] redist.mpi.abort_on_error: {why}aborting all {comm.Get_size()} ranks\n")
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(ABORT_GRACE_S)
    try:
        comm.Abort(errorcode)
    finally:
        os._exit(errorcode)
