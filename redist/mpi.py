"""The MPI entry point: reshard with mpi4py, one rank per device (SPEC section 5).

    from mpi4py import MPI
    import redist, redist.mpi

    with redist.mpi.abort_on_error():                 # a failing rank takes the job down, never a hang
        out = redist.mpi.reshard(local, src, dst)     # on every rank of COMM_WORLD; rank == device id

Contracts:

- :func:`reshard` is collective over ``comm``: every rank calls it with its own shard of ``src`` and the same
  ``src`` and ``dst``. Rank ``r`` is device id ``r``: under ``src`` it holds the block of its position on
  ``src.mesh``, and it gets the block of its position on ``dst.mesh`` (the device orders, ``device_ids``,
  of :class:`redist.Mesh`; the two may differ, and then the plan moves blocks between the orders).
- Before any data moves, the ranks agree on their arguments. The first call of an argument combination
  (``src``, ``dst``) on a communicator runs the full agreement, one small ``Allgather`` of a digest of the
  arguments and of each rank's local-buffer check; later calls with an agreed combination send only a
  fixed 32-byte verdict through one ``Allreduce`` (the largest and smallest digest, whether some rank needs
  the full agreement, whether some rank's buffer is wrong). Every rank takes the same branch from that
  verdict, so a wrong ``comm.size``, arguments that differ between ranks (agreed or not), or a local buffer
  whose shape does not fit ``src`` or whose data does not convert to its dtype without loss
  (:mod:`redist.buffers`) on any rank make *every* rank raise :class:`redist.ShardingError` (and nothing
  else happens). ``check=True`` forces the full agreement. The agreed combinations are cached on ``comm``
  (at most 256, oldest first out); a rank whose cache differs from the others' merely runs the full
  agreement again, together with them.
- The result is always a new array; the caller's buffer is never returned, aliased or written to. Extra
  memory per rank stays within ``2 · max(src.local_bytes, dst.local_bytes)``, counting the one scratch buffer
  a rank keeps between calls (its size: :func:`held_bytes`; it only grows, so after a larger reshard it
  stays at that one's size until :func:`clear_cache`). Communicators, agreements (with their plans)
  and the scratch buffer are cached on ``comm``; :func:`clear_cache` frees them. How data travels:
  :mod:`redist.backends.mpi_backend`.
- A failure on one rank in the middle of a plan (an exception, not an agreement error) leaves the other
  ranks blocked in a collective: wrap SPMD code in :func:`abort_on_error` so that such a rank aborts the job.
- Reductions (sum, max, min, prod) use MPI's reduction order, so floating-point results can differ from the
  numpy backend in the last bits; integer-valued data and integer dtypes agree exactly.

:func:`reshard` agrees on the arguments, plans (:func:`redist.synthesize`, once per agreed combination) and
runs the plan's program with the MPI interpreter, :mod:`redist.backends.mpi_backend`, whose
:func:`run_program`, :func:`clear_cache` and :func:`held_bytes` this module re-exports.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import traceback
from typing import NoReturn

import numpy as np

from redist.backends.mpi_backend import MPI, clear_cache, communicator, context, held_bytes, run, run_program
from redist.buffers import describe, local_buffer
from redist.errors import ShardingError
from redist.synthesis import synthesize
from redist.types import ShardingType

__all__ = ["reshard", "run_program", "abort_on_error", "clear_cache", "held_bytes"]


# ---------------------------------------------------------------------------------------------- entry point
def reshard(local, src: ShardingType, dst: ShardingType, comm=None, *, check: bool = False) -> np.ndarray:
    """This rank's shard of type ``dst``, given its shard ``local`` of type ``src``.

    Collective over ``comm`` (default ``MPI.COMM_WORLD``); rank ``r`` is device ``r`` and ``comm.size`` must
    equal ``src.mesh.size``. The result is always a new C-contiguous array, never ``local`` or a view of it
    (not even for an empty plan, ``src == dst``, or a rank whose buffer stays put). ``local`` is converted to
    ``src``'s dtype only without loss (:mod:`redist.buffers`, as :func:`redist.execute` takes shards).
    ``check=True`` runs the full argument agreement even for a combination the ranks agreed on before.
    Raises :class:`ShardingError` if ``comm`` is no MPI intracommunicator (on the ranks that passed it), and on
    every rank, before moving any data, if the ranks' arguments disagree, if ``comm.size`` is wrong, if some
    rank's ``local`` does not have ``src.local_shape`` or does not convert to ``src``'s dtype, or if no plan
    exists from ``src`` to ``dst``.
    """
    comm = communicator(comm)
    x, program = _agree(context(comm), local, src, dst, check)
    return run(program, x, local, comm)


# ---------------------------------------------------------------------------------------------- agreement
def _agree(ctx, local, src, dst, check: bool) -> tuple[np.ndarray, object]:
    """Agree on the arguments over ``ctx.comm`` (the private duplicate): one 32-byte ``Allreduce`` of the
    verdict, then, only if some rank asks for it or the verdict shows a disagreement, :func:`_agree_fully`
    and the plan (:func:`redist.synthesize` is deterministic: every rank gets the same plan or the same
    error), both remembered for the combination. Returns ``local`` as a C-contiguous array of ``src``'s dtype
    (the caller's own where it already is one) and the plan's program."""
    typed = isinstance(src, ShardingType) and isinstance(dst, ShardingType)
    key = (src, dst) if typed else None
    digest, program = ctx.agreed.get(key, (None, None)) if typed and not check else (None, None)
    known = digest is not None
    if not known:
        digest = _digest(src, dst, typed)
    x, problem = _local(local, src) if typed else (None, "src is no ShardingType")
    verdict = np.array([digest, -digest, not known, bool(problem)], dtype=np.int64)
    ctx.comm.Allreduce(MPI.IN_PLACE, verdict, op=MPI.MAX)
    if verdict[0] == -verdict[1] and not verdict[2] and not verdict[3]:
        return x, program
    _agree_fully(ctx.comm, src, dst, typed, digest, problem)
    program = synthesize(src, dst).program
    ctx.remember(key, (digest, program))
    return x, program


def _digest(src, dst, typed: bool) -> int:
    """A 63-bit digest of the arguments that is the same on every rank (Python's ``hash`` is not); never
    negative, so that its negation is exact in the verdict."""
    # Untyped arguments are compared by type only: their reprs may hold addresses that differ between ranks.
    text = f"{src.mesh}|{src}|{dst.mesh}|{dst}" if typed else f"{type(src).__qualname__}|{type(dst).__qualname__}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _local(local, src: ShardingType) -> tuple[np.ndarray | None, str]:
    """``(buffer, "")`` for a ``local`` that fits ``src``, else ``(None, what is wrong with it)``."""
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
    if size != src.mesh.size:
        raise ShardingError(f"redist.mpi.reshard: the communicator has {size} ranks but mesh {src.mesh} has "
                            f"{src.mesh.size} devices; run with one rank per device")
    bad = [r for r in range(size) if not every[r, 1]]
    if bad:
        here = f"; on this rank (rank {rank}) {problem}" if problem else ""
        raise ShardingError(
            f"redist.mpi.reshard: the local buffer on rank(s) {bad} does not match src {src} "
            f"(expected shape {src.local_shape}, dtype {src.np_dtype.name}){here}")


# ---------------------------------------------------------------------------------------------- failures
@contextlib.contextmanager
def abort_on_error(comm=None, errorcode: int = 1):
    """Wrap SPMD code so that an exception on any rank aborts the whole job instead of leaving the others
    blocked in a collective: the traceback is printed to stderr (prefixed with the rank), then
    ``comm.Abort(errorcode)`` ends every process of ``comm`` (``mpiexec`` exits non-zero).
    ``SystemExit`` with status 0 passes through.

    Nothing after the block runs on the failing rank: MPICH's ``MPI_Abort`` may return (or take a while)
    before the process manager kills the job, so the rank then ends itself with ``os._exit(errorcode)``
    (after flushing stdout and stderr; no ``finally`` blocks, ``atexit`` handlers or code after the block)."""
    comm = communicator(comm)
    try:
        yield
    except SystemExit as e:
        if e.code in (None, 0):
            raise
        _abort(comm, errorcode)
    except BaseException:
        _abort(comm, errorcode)


def _abort(comm, errorcode: int) -> NoReturn:
    rank = comm.Get_rank()
    text = traceback.format_exc()
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.rstrip().splitlines()))
    sys.stderr.write(f"[rank {rank}] redist.mpi.abort_on_error: aborting all {comm.Get_size()} ranks\n")
    sys.stderr.flush()
    sys.stdout.flush()
    try:
        comm.Abort(errorcode)
    finally:
        os._exit(errorcode)
