"""A plan's stages on MPI ranks: each program on the ranks of its mesh's devices, each transfer between meshes as
point-to-point messages (one rank per device: rank ``r`` of the communicator is device ``r``).

A plan across meshes (docs/spec.md §3: steps on the source's mesh, a transfer, steps on the destination's mesh)
lowers to stages (:attr:`redist.Plan.stages`). Every rank of the communicator runs :func:`run_stages` with the
channels its agreement made (:meth:`~redist.backends.mpi_channels.Context.channels`):

- a program runs with the MPI interpreter (:class:`~redist.backends.mpi_backend.MpiBackend`) on the
  communicator of its mesh's ranks; a rank that is no device of its mesh skips it, and so does every rank for a
  program of no instructions (the source's or destination's side of a plan that is one transfer), which has no
  channel;
- a transfer (:func:`transfer`) posts, all at once, a receive for every piece this rank's new buffer takes from
  another device (straight into its place in a new buffer, or packed where that place's runs are short) and a
  send of every piece it holds for another device (straight from its buffer where the piece is contiguous, else
  packed first), like a personalised exchange (:func:`~redist.backends.mpi_transfers.post_rows`); then it copies
  the pieces it keeps, and waits for the messages all together. Pieces between two ranks go in the order of the
  receiver's copies, so that MPI's ordering of messages between two ranks pairs each send with its receive. No
  collective: ranks that take no part in a transfer do not wait for it.

The pieces a rank keeps are copied between posting and waiting, not after: the wait is for the verdict as well
as the data, and the verdict completes only once every rank has cast its votes, so that the copy fills time the
rank would otherwise spend waiting; and a large piece travels by a single copy that the receiver makes from the
sender's memory (MPICH's CMA), which needs nothing of a sender that is busy copying. (bench/cross_mesh.py times
the transfers against hand-written ``Isend``/``Irecv``, which copies after waiting.)

The verdict of the call (:func:`redist.mpi.reshard`), if still in flight, is waited for before the data of the
first stage this rank takes part in, and at the latest once its result is made: a rank in neither mesh only
waits for it, and returns None, as does every rank that is no device of the last stage's mesh.
"""

from __future__ import annotations

import numpy as np

from redist import program as P
from redist.backends import interpreter
from redist.backends.mpi_backend import Buffer, MpiBackend, owned, result, run
from redist.backends.mpi_channels import Context, TransferChannel, Verdict, wait
from redist.backends.mpi_transfers import TAG, message, place

__all__ = ["run_stages", "transfer"]


def run_stages(stages: tuple, channels: tuple, x: np.ndarray | None, local, ctx: Context,
               verdict: Verdict | None = None) -> np.ndarray | None:
    """Run a plan's checked ``stages`` on ``channels`` (one per stage, None where this rank is no device of a
    program's mesh or the program has no instructions) from ``x``, this rank's checked buffer made from the
    caller's ``local`` (None where the rank is no device of the first mesh); returns a new array, or None where
    the rank is no device of the last mesh. With a ``verdict`` in flight, a verdict against the call raises
    :class:`~redist.backends.mpi_channels.Disagreement` on every rank. A plan of one stage runs as
    :func:`~redist.backends.mpi_backend.run` runs it."""
    if len(stages) == 1 and channels[0] is not None:
        return run(stages[0], x, local, ctx, channels[0], verdict)
    buf = None if x is None else Buffer(x, owned(x, local))
    for stage, channel in zip(stages, channels):
        if isinstance(stage, P.Transfer):
            buf, verdict = transfer(channel, buf, ctx, verdict)
        elif channel is not None:
            backend = MpiBackend(ctx, channel, stage, verdict)
            buf = interpreter.run(stage, backend, buf)
            verdict = backend.verdict
    return result(buf, ctx, verdict)


def transfer(channel: TransferChannel, buf: Buffer | None, ctx: Context,
             verdict: Verdict | None) -> tuple[Buffer | None, Verdict | None]:
    """This rank's part of a transfer, as its ``channel`` lays it out (module docstring), from its buffer ``buf``
    (None where it is no device of the source's mesh): the new buffer (None where it is no device of the
    destination's mesh), and the verdict if still in flight (a rank with no messages leaves it for later). The
    old buffer is dropped once the messages are done (where it is ours)."""
    plan = channel.layout
    x = None if buf is None else buf.take()
    out = None if plan.shape is None else (np.zeros if plan.zero else np.empty)(plan.shape, channel.dtype)
    requests, staged = [], []
    for source, box, short in plan.receives:
        view = out[box]
        if short:
            packed = np.empty(view.shape, view.dtype)
            staged.append((view, packed))
            requests.append(channel.comm.Irecv(message(packed), source, TAG))
        else:
            requests.append(channel.comm.Irecv(place(out, view), source, TAG))
    held = []  # packed pieces, alive until sent
    for receiver, box in plan.sends:
        piece = x[box]
        if not piece.flags.c_contiguous:
            piece = np.ascontiguousarray(piece)
            held.append(piece)
        requests.append(channel.comm.Isend(message(piece), receiver, TAG))
    for old, new in plan.local:
        np.copyto(out[new], x[old])
    if requests:
        wait(ctx, verdict, requests)
        verdict = None
    del held
    for view, packed in staged:
        np.copyto(view, packed)
    return (None if out is None else Buffer(out, True)), verdict
