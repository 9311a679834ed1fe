"""The MPI interpreter: one rank's buffer, instructions as mpi4py transfers (one rank per device).

Contracts (the entry points are :func:`redist.mpi.reshard`, which plans and agrees on the arguments first,
and :func:`run_program`, here and re-exported there):

- Rank ``r`` of the user's communicator is device ``r`` (a global device id); a program runs on the communicator
  of its mesh's ranks (:class:`~redist.backends.mpi_channels.Channel`, ranked in the order of their device ids;
  :func:`run_program`'s, the user's communicator itself, of a mesh of the devices ``0 … n-1``). A plan across
  meshes runs its stages by :mod:`~redist.backends.mpi_stages`.
- The result is always a new array; the caller's buffer is never returned, aliased or written to.
- Data travels in numpy buffers through the buffer (uppercase) methods of mpi4py, never pickled. What a rank sends
  is contiguous bytes: chunks are packed along a leading dim with numpy before a transfer (a send described by an
  MPI derived datatype is slower than packing, :data:`~redist.backends.mpi_placement.STRIDED_RUN_MIN`); an
  all-to-all comes lowered to that form (:class:`redist.program.AllToAll`) and runs out of place, straight from the
  packed (or the caller's) buffer into the next one (MPICH's in-place ``Alltoall`` is slower). What a rank receives
  lands in its final place where that place's contiguous runs are at least
  :data:`~redist.backends.mpi_placement.STRIDED_RUN_MIN` bytes, described by a derived datatype
  (:func:`~redist.backends.mpi_transfers.place`): an all-gather's chunks in each row of the result, and the rows of
  an all-to-all that a transpose unpacks (a pencil transpose) in the transpose's result, so that no unpacking copy
  remains (``bench/mpi.py`` times both against the hand-written ``Allgather`` and interleave, and ``Alltoall`` and
  unpacking: ``bench/results/mpi.json``). Shorter runs arrive packed and are merged into place by numpy. There, this
  rank's own row of an all-to-all from the caller's buffer is not copied into the result: the transpose that
  unpacks it reads it where the caller holds it (:class:`Buffer`'s deferred row), which saves ``1/k`` of the
  data's copies; and a transpose that packs an all-to-all's rows from the caller's buffer leaves that row there for
  the all-to-all to copy once (a slab transpose).
- The personalised exchanges within a group (``AllGather``, ``AllToAll``, an even ``ReduceScatter``) run as
  point-to-point transfers between the members, posted at once, :data:`WINDOW` peers at a time at most
  (:meth:`MpiBackend._exchange_rows`: faster than MPICH's step-by-step collective algorithms whenever ranks
  share cores, as no step waits for a peer to be scheduled), except an all-gather into contiguous places in a
  result smaller than :data:`~redist.backends.mpi_placement.ALLGATHER_MAX_BYTES` on a node of at most
  :data:`~redist.backends.mpi_placement.ALLGATHER_RANKS_PER_CORE` ranks per core, which is MPI's ``Iallgather``
  (MPICH passes such chunks around a ring; :meth:`MpiBackend._allgather`; a program of that one all-gather, once
  :func:`redist.mpi.reshard` has agreed on it, runs without the interpreter:
  :func:`~redist.backends.mpi_channels.direct`); the others as MPI collectives (``Alltoallv`` for an ``Exchange``,
  ``Allreduce``, ``Reduce_scatter``) or one ``Sendrecv`` (a permute).
- Memory: buffers of at most ``2 · max(src.local_bytes, dst.local_bytes)`` bytes in all are alive at once besides
  the caller's input (never written to). One of them may be the rank's *scratch* buffer, kept between calls so that
  a packing copy does not pay for fresh pages on every call (a copy into a large fresh buffer first faults in its
  pages, a copy into a reused one does not): in a program of one data-moving instruction (besides reshapes) that
  instruction's temporary lives there (the gathered rows of an ``AllGather`` along an inner dim whose chunks arrive
  packed, the received chunks of a ``ReduceScatter``), in a program of two the first one's result (the packed chunks
  of a slab transpose, the received rows of a pencil transpose that arrive packed) when the second needs no
  temporary. The scratch buffer only grows (to the largest such buffer so far: after a larger reshard it stays
  larger than a smaller one needs) and is never returned: the result is always a fresh array.
  :func:`~redist.backends.mpi_channels.held_bytes` tells its size, :func:`~redist.backends.mpi_channels.clear_cache`
  frees it.
- Transfers run on a channel, a private duplicate of the communicator and its groups' sub-communicators,
  nonblocking; with the call's verdict in flight (:func:`redist.mpi.reshard`) the first instruction's transfers are
  posted, then the verdict waited for, then the data (:mod:`~redist.backends.mpi_channels`).
- A ``ReduceScatter`` whose group size divides its dim moves the chunks as above and reduces them with numpy, in
  group order: its results are the numpy backend's, bit for bit. The other reductions use MPI's reduction order, so
  floating-point results can differ from the numpy backend in the last bits; integer-valued data and integer dtypes
  agree exactly (:mod:`~redist.backends.mpi_reductions`).
- Rank ``r`` is device id ``r``: it holds the block of its position on the mesh (``Mesh.device_ids``), and its
  groups are read through the mesh (``Mesh.groups``), so any device order runs unchanged.

This module runs the instructions (:class:`MpiBackend`, one method per instruction, driven by
:mod:`redist.backends.interpreter`); the rest of the MPI backend is in the modules beside it:
:mod:`~redist.backends.mpi_channels` (communicators, channels, the verdict, what a rank keeps between calls),
:mod:`~redist.backends.mpi_placement` (where each instruction's data lands, worked out before the program runs),
:mod:`~redist.backends.mpi_transfers` (numpy memory as MPI messages, the posting of a personalised exchange)
and :mod:`~redist.backends.mpi_reductions` (reductions as numpy computes them).
"""

from __future__ import annotations

import math

import numpy as np

from redist import program as P
from redist.backends import interpreter
from redist.backends.mpi_channels import Channel, Context, Verdict, communicator, context, wait
from redist.backends.mpi_placement import (exchange_layout, gathers_in_place, gathers_with_allgather, offsets,
                                           permuted, roles)
from redist.backends.mpi_reductions import reduce_op, reduce_rows, reduce_spec
from redist.backends.mpi_transfers import TAG, message, place, post_rows, raw
from redist.buffers import local_buffer
from redist.extras import missing_extra

try:
    from mpi4py import MPI
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.mpi", "mpi") from e

__all__ = ["run_program", "run", "owned", "Buffer", "MpiBackend", "WINDOW"]

# The most shifts of a personalised exchange in flight at once (:meth:`MpiBackend._exchange_rows`): a rank of a
# group of thousands then has at most 2 x 32 transfers posted, not thousands (32 is also MPICH's throttle for
# its scattered all-to-all, MPIR_CVAR_ALLTOALL_THROTTLE).
WINDOW = 32


# ---------------------------------------------------------------------------------------------- entry points
def run_program(program: P.Program, local, comm=None) -> np.ndarray:
    """Execute a buffer program on this rank's buffer; collective over ``comm`` (default ``MPI.COMM_WORLD``), whose
    ``comm.size`` must be the program's mesh size.

    The low-level entry: it does not make the ranks agree on their arguments first, so a wrong local shape or dtype
    raises on this rank only. ``local`` is converted to the program's dtype only without loss
    (:mod:`redist.buffers`). The input buffer is never written to; the result is a new array. Raises
    :class:`~redist.errors.ShardingError` for a ``program`` that is not a well-formed
    :class:`~redist.program.Program` or holds buffers of more dims than numpy has or runs on a mesh whose device
    ids are not ``0 … size−1``, a ``comm`` that is no intracommunicator, or a ``local`` that does not fit the
    program.
    """
    comm = communicator(comm)
    interpreter.check_program(program, "run_program")
    interpreter.check_numpy_rank(program, "run_program")
    interpreter.check_numbered_from_zero(program, "run_program")
    x = local_buffer(local, program.shapes[0], program.dtype, f"rank {comm.Get_rank()}: the local buffer")
    return run(program, x, local, context(comm))


def run(program: P.Program, x: np.ndarray, local, ctx: "Context", channel: "Channel | None" = None,
        verdict: "Verdict | None" = None) -> np.ndarray:
    """Run the checked ``program`` on ``x``, this rank's checked C-contiguous buffer made from the caller's
    ``local`` (:func:`redist.buffers.local_buffer`), collectively over the communicator of ``ctx``
    (:func:`~redist.backends.mpi_channels.context`); returns a new array.

    The transfers run on ``channel`` (made for this program by :meth:`~redist.backends.mpi_channels.Context.open`),
    else on the communicator's default channel. With a ``verdict`` in flight, the first instruction's transfers are
    posted, then the verdict waited for, then the data; a verdict that goes against the call raises
    :class:`~redist.backends.mpi_channels.Disagreement` (module docstring). ``x`` is overwritten or dropped as soon
    as it is no longer needed when it is an array of its own, and never written to when it is (a view of) the
    caller's memory; the result is copied if it still is, or if it is the scratch buffer (a rank on which the second
    instruction moved nothing). The verdict, if still in flight, is waited for once the result is made: a rank
    whose buffer stays put copies it while the verdict travels, rather than after (the verdict cannot complete
    before the other ranks have posted theirs, and their data transfers run meanwhile)."""
    if channel is not None and channel.direct is not None and channel.program is program:
        return channel.direct(x, verdict)
    if channel is None:
        channel = ctx.default
        channel.mesh = program.mesh
    backend = MpiBackend(ctx, channel, program, verdict)
    return result(interpreter.run(program, backend, Buffer(x, owned(x, local))), ctx, backend.verdict)


def result(buf: "Buffer | None", ctx: Context, verdict: "Verdict | None") -> np.ndarray | None:
    """The array to return from the final buffer ``buf`` (None for a rank that holds none): the buffer itself
    where it is ours, else a copy (the caller's memory, the scratch buffer); then the ``verdict``, if still in
    flight, settled (:func:`run`)."""
    out = None if buf is None else buf.take() if buf.owned else buf.take().copy()
    if verdict is not None:
        verdict.settle(ctx, [])
    return out


def owned(x: np.ndarray, local) -> bool:
    """Whether ``x``, the caller's ``local`` converted, is a new array that the program may overwrite and
    return: never when it is (a view of) the caller's memory, e.g. ``local`` itself or a JAX buffer."""
    if not x.flags.writeable:
        return False
    if isinstance(local, (np.ndarray, np.generic)) or hasattr(local, "__array__"):
        return not np.may_share_memory(x, np.asarray(local))
    return True  # Python numbers: converting them made x


# ---------------------------------------------------------------------------------------------- buffers
class Buffer:
    """The current buffer; ``owned`` when it is ours to overwrite, drop or return (not the caller's input),
    ``scratch`` when it lives in the scratch buffer (ours to overwrite, never to return). ``row``, when set,
    is ``(j, a)``: row ``j`` of the leading dim is the array ``a`` (a view of the caller's memory), not yet copied
    in: an all-to-all's own row, left where the caller holds it for a transpose to read it from there (or for
    the all-to-all to copy once, when a transpose packs its rows)."""

    def __init__(self, x: np.ndarray, owned: bool, scratch: bool = False, row: tuple | None = None):
        self.x, self.owned, self.scratch, self.row = x, owned, scratch, row

    @property
    def writable(self) -> bool:
        return self.owned or self.scratch

    def take(self) -> np.ndarray:
        """Hand over the array (its deferred row copied in) and drop this reference, so an owned buffer dies as
        soon as its user is done."""
        x, row = self.take_parts()
        if row is not None:
            np.copyto(x[row[0]], row[1])
        return x

    def take_parts(self) -> tuple[np.ndarray, tuple | None]:
        """Hand over the array and its deferred ``row`` (or None) as they are."""
        x, row, self.x, self.row = self.x, self.row, None, None
        return x, row


# ---------------------------------------------------------------------------------------------- instructions
class MpiBackend(interpreter.Backend):
    """The state is this rank's :class:`Buffer`; each method takes its array (so that an owned input dies as soon
    as it is used) and returns the next buffer. Every buffer is C-contiguous, except an all-to-all's result that a
    transpose unpacks (:func:`~redist.backends.mpi_placement.unpackings`): that transpose makes it C-contiguous
    without a copy. Collectives run on ``channel``, nonblocking, completed by :meth:`_complete` (which first settles
    the ``verdict``, if one is in flight). The scratch buffer is handed out once per run of ``program``, to the
    instruction and for the role :func:`~redist.backends.mpi_placement.scratch_use` names; the transposes that pack
    an all-to-all are :func:`~redist.backends.mpi_placement.packings`."""

    def __init__(self, ctx: Context, channel: Channel, program: P.Program, verdict: Verdict | None = None):
        self.ctx, self.ch = ctx, channel
        self.scratch_use, self.packings, self.unpackings = (
            channel.roles if channel.program is program else roles(program))
        self.verdict = verdict

    def _complete(self, *requests) -> None:
        """Wait for ``requests``, the transfers of one instruction, already posted
        (:func:`~redist.backends.mpi_channels.wait`, with the verdict if one is still in flight)."""
        verdict, self.verdict = self.verdict, None
        wait(self.ctx, verdict, list(requests))

    def _allgather(self, sub, x: np.ndarray, out: np.ndarray) -> None:
        """MPI's ``Iallgather`` of ``x`` into ``out``, member ``j``'s buffer chunk ``j`` (contiguous arrays), over
        ``sub``, completed by :meth:`_complete`."""
        self._complete(sub.Iallgather(message(x), message(out)))

    def _exchange_rows(self, sub, k: int, send, recv) -> None:
        """A personalised exchange among the ``k`` members of ``sub``
        (:func:`~redist.backends.mpi_transfers.post_rows`): ``send(j)`` to, and ``recv(j)`` from, every other member
        ``j``, in windows of at most :data:`WINDOW` shifts, each completed (:meth:`_complete`) before the next is
        posted."""
        me = sub.Get_rank()
        for lo in range(1, k, WINDOW):
            self._complete(*post_rows(sub, me, k, range(lo, min(lo + WINDOW, k)), send, recv))

    def settle(self, pending: list) -> None:
        """Wait for the verdict, if one is in flight; raise :class:`~redist.backends.mpi_channels.Disagreement` if
        it goes against the call, leaving the ``pending`` requests (which may never complete, and the buffers they
        hold) to the context."""
        verdict, self.verdict = self.verdict, None
        if verdict is not None:
            verdict.settle(self.ctx, pending)

    def _array(self, ins, role: str, shape, dtype) -> tuple[np.ndarray, bool]:
        """An uninitialised C-contiguous array for ``ins``'s ``role`` (``"result"`` or ``"temp"``), and whether
        it is the scratch buffer (where ``ins`` may use it for that role) rather than a fresh array."""
        if self.scratch_use is not None and self.scratch_use[0] is ins and self.scratch_use[1] == role:
            self.scratch_use = None
            return self.ctx.scratch_array(shape, dtype), True
        return np.empty(shape, dtype), False

    def reshape(self, ins: P.Reshape, buf):
        """A view with the new shape (the buffer is C-contiguous)."""
        return Buffer(buf.take().reshape(ins.shape), buf.owned, buf.scratch)

    def transpose(self, ins: P.Transpose, buf):
        """A C-contiguous copy of the transposed buffer; an owned input is dropped once the copy exists. Where the
        transpose only moves dims of size 1 the view is the result, held as its input was. Deferred rows
        (:class:`Buffer`), each saving ``1/k`` of the copy: an input's deferred row is copied from where it is
        straight to its place in the result (the rows before it, it, and the rows after it, in three copies);
        packing an all-to-all's rows from the caller's buffer (:func:`~redist.backends.mpi_placement.packings`), the
        row this rank keeps is left where the caller holds it, deferred in the result, for the all-to-all to copy
        once."""
        caller = not buf.writable
        x, row = buf.take_parts()
        view = np.transpose(x, ins.perm)
        if view.flags.c_contiguous:
            if row is not None:
                np.copyto(x[row[0]], row[1])
            return Buffer(view, buf.owned, buf.scratch)
        y, scratch = self._array(ins, "result", view.shape, x.dtype)
        packing = self.packings.get(id(ins))
        if row is not None:
            j, a = row
            at = (slice(None),) * ins.perm.index(0)  # where the leading dim goes
            np.copyto(y[at + (slice(0, j),)], view[at + (slice(0, j),)])
            np.copyto(y[at + (j,)], np.transpose(a[None], ins.perm)[at + (0,)])
            np.copyto(y[at + (slice(j + 1, None),)], view[at + (slice(j + 1, None),)])
        elif packing is not None and caller:
            me = self.ch.mesh.group_index(self.ch.device, packing)
            np.copyto(y[:me], view[:me])
            np.copyto(y[me + 1:], view[me + 1:])
            return Buffer(y, not scratch, scratch, row=(me, view[me]))
        else:
            np.copyto(y, view)
        return Buffer(y, not scratch, scratch)

    def slice(self, ins: P.Slice, buf):
        """Keep chunk ``r`` of ``k`` along ``dim`` (local; a copy, so the result is contiguous and ours)."""
        x = buf.take()
        k, r = self.ch.mesh.group_size(ins.axes), self.ch.mesh.group_index(self.ch.device, ins.axes)
        n = x.shape[ins.dim] // k
        chunk = x[(slice(None),) * ins.dim + (slice(r * n, (r + 1) * n),)]
        y, scratch = self._array(ins, "result", chunk.shape, x.dtype)
        np.copyto(y, chunk)
        return Buffer(y, not scratch, scratch)

    def all_gather(self, ins: P.AllGather, buf):
        """An all-gather (:func:`~redist.backends.mpi_transfers.post_rows`): member ``j``'s buffer becomes chunk
        ``j`` along ``dim``. Where the chunks' places in the result can take them
        (:func:`~redist.backends.mpi_placement.gathers_in_place`: contiguous places, or strided ones of long enough
        runs) they arrive there (:func:`~redist.backends.mpi_transfers.place`), contiguous ones by MPI's
        ``Allgather`` where :data:`~redist.backends.mpi_placement.ALLGATHER_RANKS_PER_CORE` and
        :data:`~redist.backends.mpi_placement.ALLGATHER_MAX_BYTES` say so (:meth:`_allgather`); else the other
        members' arrive as rows of a temporary with a leading member dim, which one copy per member interleaves into
        the result. This rank's own chunk is copied from its buffer (by MPI, in an ``Allgather``)."""
        x = buf.take()
        sub, k = self.ch.group(ins.axes)
        me = sub.Get_rank()
        shape = x.shape[: ins.dim] + (k * x.shape[ins.dim],) + x.shape[ins.dim + 1:]
        pre, chunk = math.prod(x.shape[: ins.dim]), math.prod(x.shape[ins.dim:])
        if gathers_in_place(x.shape, ins.dim, x.dtype.itemsize):
            out, scratch = self._array(ins, "result", shape, x.dtype)
            if gathers_with_allgather(self.ctx.ranks_per_core, pre, out.nbytes):
                self._allgather(sub, x, out)
            else:
                members = out.reshape(pre, k, chunk)
                self._exchange_rows(sub, k, lambda j: x, lambda j: place(out, members[:, j]))
                np.copyto(members[:, me], x.reshape(pre, chunk))
            return Buffer(out, not scratch, scratch)
        got, _ = self._array(ins, "temp", (k - 1,) + x.shape, x.dtype)
        self._exchange_rows(sub, k, lambda j: x, lambda j: got[j - (j > me)])
        out, scratch = self._array(ins, "result", shape, x.dtype)
        members, rows = out.reshape(pre, k, chunk), got.reshape(k - 1, pre, chunk)
        np.copyto(members[:, :me], rows[:me].swapaxes(0, 1))  # the members before this rank, in one pass
        np.copyto(members[:, me], x.reshape(pre, chunk))
        np.copyto(members[:, me + 1:], rows[me:].swapaxes(0, 1))
        return Buffer(out, not scratch, scratch)

    def all_to_all(self, ins: P.AllToAll, buf):
        """An all-to-all of the leading dim's rows (:func:`~redist.backends.mpi_transfers.post_rows`), out of place:
        row ``j`` goes to member ``j``, and row ``j`` of the result comes from member ``j``. Where a transpose
        unpacks the result (:func:`~redist.backends.mpi_placement.unpackings`: a pencil transpose), the rows arrive
        straight in their strided places in the transpose's result (:func:`~redist.backends.mpi_transfers.place`),
        and the result is that array seen before the transpose, so that the transpose has nothing left to copy.
        Otherwise this rank's own row is copied once the others are in; or, where it is in the caller's memory
        (alive anyway: the input is the caller's buffer, or a packing left the row there), not yet: the result
        defers it (:class:`Buffer`), so that a transpose after it reads it from there, one copy of ``1/k`` of the
        data fewer; anything else copies it in when it takes the buffer."""
        caller = not buf.writable
        x, row = buf.take_parts()
        sub, k = self.ch.group(ins.axes)
        me = sub.Get_rank()
        if row is not None and row[0] != me:  # deferred for another group: in place first
            np.copyto(x[row[0]], row[1])
            row = None
        own = row[1] if row is not None else x[me]
        unpacking = self.unpackings.get(id(ins))
        if unpacking is not None:
            y, scratch = self._array(unpacking, "result", permuted(x.shape, unpacking.perm), x.dtype)
            places = np.transpose(y, np.argsort(unpacking.perm))  # y as the rows' array before the transpose
            self._exchange_rows(sub, k, lambda j: x[j], lambda j: place(y, places[j]))
            np.copyto(places[me], own)
            return Buffer(places, not scratch, scratch)
        out, scratch = self._array(ins, "result", x.shape, x.dtype)
        self._exchange_rows(sub, k, lambda j: x[j], lambda j: out[j])
        if caller or row is not None:
            return Buffer(out, not scratch, scratch, row=(me, own))
        np.copyto(out[me], own)
        return Buffer(out, not scratch, scratch)

    def reduce_scatter(self, ins: P.ReduceScatter, buf):
        """Group member ``j`` gets chunk ``j`` along ``dim`` of every other member's buffer
        (:func:`~redist.backends.mpi_transfers.post_rows`) and reduces the ``k`` chunks it then holds with numpy, in
        group order, straight into its result: the reduction numpy's backend computes, bit for bit. (MPICH's
        ``Reduce_scatter_block`` is slower: it reduces through a temporary it allocates per call, where the received
        chunks land in the scratch buffer; ``bench/mpi.py``'s ``pending_sum`` case times the two.) The chunks go from
        the input itself where the dims before ``dim`` hold one element, else from a copy that brings them to the
        front (an owned input is dropped as soon as the copy exists). Where ``k`` does not divide the dim:
        :meth:`_reduce_scatter_counts`.
        """
        if buf.x.shape[ins.dim] % self.ch.mesh.group_size(ins.axes):
            return self._reduce_scatter_counts(ins, buf)
        x = buf.take()
        sub, k = self.ch.group(ins.axes)
        me = sub.Get_rank()
        out_shape = x.shape[: ins.dim] + (x.shape[ins.dim] // k,) + x.shape[ins.dim + 1:]
        pre, chunk = math.prod(x.shape[: ins.dim]), x.size // k
        send = x.reshape(k, chunk)
        if pre > 1:
            send, _ = self._array(ins, "temp", (k, chunk), x.dtype)
            np.copyto(send.reshape(k, pre, -1), x.reshape(pre, k, -1).swapaxes(0, 1))
        del x
        got, _ = self._array(ins, "temp", (k - 1, chunk), send.dtype)
        self._exchange_rows(sub, k, lambda j: send[j], lambda j: got[j - (j > me)])
        rows = [send[me] if j == me else got[j - (j > me)] for j in range(k)]
        out, scratch = self._array(ins, "result", out_shape, send.dtype)
        reduce_rows(rows, ins.reduction, out.reshape(-1))
        return Buffer(out, not scratch, scratch)

    def _reduce_scatter_counts(self, ins: P.ReduceScatter, buf):
        """``Reduce_scatter`` with counts, for chunks by the padding rule (``L = ceil(n/k)`` rows of the dim
        from ``min(n, r·L)``, fewer at the end): the dim is brought to the front so that each chunk is
        contiguous, no padding is sent, and the rows a rank receives go to the start of its zero result."""
        x = buf.take()
        sub, k = self.ch.group(ins.axes)
        n = x.shape[ins.dim]
        size = -(-n // k)
        rest = x.size // n if n else 0
        counts = [(min(n, (r + 1) * size) - min(n, r * size)) * rest for r in range(k)]
        send = np.ascontiguousarray(np.moveaxis(x, ins.dim, 0))
        del x
        mine = np.empty((counts[sub.Get_rank()] // rest if rest else 0,) + send.shape[1:], dtype=send.dtype)
        element, op = reduce_op(send.dtype, ins.reduction)
        self._complete(sub.Ireduce_scatter(reduce_spec(send, element), reduce_spec(mine, element), counts, op))
        del send
        out = np.zeros((size,) + mine.shape[1:], dtype=mine.dtype)
        out[: len(mine)] = mine
        return Buffer(np.ascontiguousarray(np.moveaxis(out, 0, ins.dim)), True)

    def keep_root(self, ins: P.KeepRoot, buf):
        """Local: rank 0 of the group keeps the buffer, the others make a zero buffer of its shape."""
        if self.ch.mesh.group_index(self.ch.device, ins.axes) == 0:
            return buf
        x = buf.take()
        return Buffer(np.zeros_like(x), True)

    def embed_chunk(self, ins: P.EmbedChunk, buf):
        """Local: a zero buffer ``k`` times longer along ``dim``, with this buffer as chunk ``r`` (its rank)."""
        x = buf.take()
        k, r = self.ch.mesh.group_size(ins.axes), self.ch.mesh.group_index(self.ch.device, ins.axes)
        n = x.shape[ins.dim]
        shape = list(x.shape)
        shape[ins.dim] *= k
        out = np.zeros(shape, dtype=x.dtype)
        out[(slice(None),) * ins.dim + (slice(r * n, (r + 1) * n),)] = x
        return Buffer(out, True)

    def all_reduce(self, ins: P.AllReduce, buf):
        """``Allreduce`` (by the instruction's reduction), in place when the buffer is ours."""
        x = buf.take()
        sub, _ = self.ch.group(ins.axes)
        element, op = reduce_op(x.dtype, ins.reduction)
        if buf.writable:
            self._complete(sub.Iallreduce(MPI.IN_PLACE, reduce_spec(x, element), op))
            return Buffer(x, buf.owned, buf.scratch)
        out, scratch = self._array(ins, "result", x.shape, x.dtype)
        self._complete(sub.Iallreduce(reduce_spec(x, element), reduce_spec(out, element), op))
        return Buffer(out, not scratch, scratch)

    def collective_permute(self, ins: P.CollectivePermute, buf):
        """One ``Sendrecv``: receive from this rank's source, send to the rank whose source is this one (both
        worked out for this rank alone, once per channel made for the program), straight from the buffer into a
        new one. A rank whose buffer stays keeps it (copied only when the program ends, while its verdict
        travels: :func:`run`)."""
        ch, me = self.ch, self.ch.device
        source, target = ch.layout(ins, (), lambda: (ins.source_of(ch.mesh, me), ins.target_of(ch.mesh, me)))
        if source == me:
            return buf
        x = buf.take()
        out, scratch = self._array(ins, "result", x.shape, x.dtype)
        self._complete(ch.comm.Isendrecv(message(x), ch.peer(target), TAG, message(out), ch.peer(source), TAG))
        return Buffer(out, not scratch, scratch)

    def exchange(self, ins: P.Exchange, buf):
        """One ``Alltoallv`` over the private communicator, then copies within the rank.

        The data for rank ``d`` is the boxes of ``d``'s copies whose source is this rank, one after the other in
        ``d``'s copy order; the receiver takes its own copies from each source in the same order, so both sides
        agree on the layout without further messages. Each rank computes only its own copies and the copies it
        sends (:meth:`~redist.program.Exchange.copies_from`), never the whole table. Where each rank's boxes
        form one contiguous run of the buffer, in that order (whole rows of a C-contiguous buffer: rows split
        unevenly, say), the data goes straight from the input or straight into the output; otherwise it is
        packed into a send buffer (the scratch buffer where this is the program's only instruction) or
        received into a receive buffer and copied into place. Copies from the rank itself are done directly.
        Positions no copy writes are zero. Besides the input, at most the send and receive buffers are alive
        together, then the receive buffer and the output (the send buffer is dropped before the output
        exists, an owned input right after the local copies)."""
        x = buf.take()
        me = self.ch.device
        mine, outgoing, incoming, send_counts, recv_counts, send_at, recv_at = self.ch.layout(
            ins, x.shape, lambda: exchange_layout(ins, self.ch.mesh, me, x.shape))
        if None in send_at:
            send, _ = self._array(ins, "temp", (sum(send_counts),), x.dtype)
            send_at = offsets(send_counts)
            for cs, at in zip(outgoing, send_at):
                for c in cs:
                    send[at: at + math.prod(c.size)].reshape(c.size)[...] = x[c.src_box]
                    at += math.prod(c.size)
        else:
            send = x
        out = np.zeros(ins.shape, dtype=x.dtype)
        if None in recv_at:
            recv, recv_at = np.empty(sum(recv_counts), x.dtype), offsets(recv_counts)
        else:
            recv = out
        size = x.dtype.itemsize
        self._complete(self.ch.comm.Ialltoallv(
            [raw(send), ([k * size for k in send_counts], [a * size for a in send_at]), MPI.BYTE],
            [raw(recv), ([k * size for k in recv_counts], [a * size for a in recv_at]), MPI.BYTE]))
        del send
        for c in mine:
            if c.source == me:
                out[c.dst_box] = x[c.src_box]
        del x
        if recv is not out:
            for cs, at in zip(incoming, recv_at):
                for c in cs:
                    out[c.dst_box] = recv[at: at + math.prod(c.size)].reshape(c.size)
                    at += math.prod(c.size)
        return Buffer(out, True)
