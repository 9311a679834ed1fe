"""The MPI interpreter: one rank's buffer, instructions as mpi4py collectives (one rank per device).

Contracts (the entry points are :func:`redist.mpi.reshard`, which plans and agrees on the arguments first,
and :func:`run_program`, here and re-exported there):

- Rank ``r`` of the communicator is device ``r`` of the program's mesh.
- The result is always a new array; the caller's buffer is never returned, aliased or written to.
- Data travels in numpy buffers through the buffer (uppercase) methods of mpi4py, never pickled, always
  as contiguous bytes: chunks are packed along a leading dim with numpy before a collective and merged
  into place after it (MPICH's derived datatypes for strided chunks measured 2-3x slower here); an
  all-to-all comes lowered to that form (:class:`redist.program.AllToAll`). At most two buffers of the
  larger local size are alive at once: extra memory per rank stays within
  ``2 · max(src.local_bytes, dst.local_bytes)`` (the input buffer is never written to).
- Collectives run on a private duplicate of ``comm`` and on sub-communicators split from it, one per
  (mesh, axes) group; both are created once per communicator and cached on it (an MPI attribute), so
  repeated reshards reuse them. :func:`clear_cache` frees them.
- Reductions (``ReduceScatter``, ``AllReduce``) use MPI's reduction order, so floating-point results can
  differ from the numpy backend in the last bits; integer-valued data and integer dtypes agree exactly. Sums
  and products run as MPI's ``SUM`` and ``PROD`` (complex dtypes included), maxima and minima of integers as
  ``MAX`` and ``MIN``; of ``bool``, sum and max as ``LOR``, min and prod as ``LAND``. Maxima and minima of
  floats, and every reduction of ``f16`` and ``bf16``, are user operations on whole elements computed by
  numpy: MPI's ``MAX`` of a NaN and a number depends on their order, numpy's propagates the NaN, as the
  other backends do.
- Rank ``r`` is device id ``r``: it holds the block of its position on the mesh (``Mesh.device_ids``), and
  its groups are read through the mesh (``Mesh.groups``), so any device order runs unchanged.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from redist import program as P
from redist.backends import interpreter
from redist.buffers import describe, local_buffer
from redist.errors import ShardingError
from redist.extras import missing_extra
from redist.mesh import Mesh
from redist.types import REDUCERS

try:
    from mpi4py import MPI
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.mpi", "mpi") from e

__all__ = ["run_program", "run", "communicator", "clear_cache", "MpiBackend"]

_TAG = 0x5EED  # point-to-point tag for CollectivePermute, on the private duplicate communicator


# ---------------------------------------------------------------------------------------------- entry points
def run_program(program: P.Program, local, comm=None) -> np.ndarray:
    """Execute a buffer program on this rank's buffer; collective over ``comm`` (default
    ``MPI.COMM_WORLD``), whose ``comm.size`` must be the program's mesh size.

    The low-level entry: it does not make the ranks agree on their arguments first, so a wrong local shape
    or dtype raises on this rank only. ``local`` is converted to the program's dtype only without loss
    (:mod:`redist.buffers`). The input buffer is never written to; the result is a new array. Raises
    :class:`ShardingError` for a ``program`` that is not a well-formed :class:`~redist.program.Program`, a
    ``comm`` that is no intracommunicator, or a ``local`` that does not fit the program.
    """
    comm = communicator(comm)
    interpreter.check_program(program, "run_program")
    x = local_buffer(local, program.shapes[0], program.dtype, f"rank {comm.Get_rank()}: the local buffer")
    return run(program, x, local, comm)


def communicator(comm):
    """``comm``, or ``MPI.COMM_WORLD`` for None; raise unless it is a usable intracommunicator."""
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise ShardingError(f"comm must be an MPI intracommunicator such as MPI.COMM_WORLD (one rank per device), "
                            f"got {describe(comm)}")
    return comm


def run(program: P.Program, x: np.ndarray, local, comm) -> np.ndarray:
    """Run the checked ``program`` on ``x``, this rank's checked C-contiguous buffer made from the caller's
    ``local`` (:func:`redist.buffers.local_buffer`), collectively over ``comm``; returns a new array.

    ``x`` is overwritten or dropped as soon as it is no longer needed when it is an array of its own, and
    never written to when it is (a view of) the caller's memory; the result is copied if it still is."""
    ctx = _context(comm, program.mesh)
    buf = interpreter.run(program, MpiBackend(ctx), _Buffer(x, _owned(x, local)))
    return buf.take() if buf.owned else buf.take().copy()


def _owned(x: np.ndarray, local) -> bool:
    """Whether ``x``, the caller's ``local`` converted, is a new array that the program may overwrite and
    return: never when it is (a view of) the caller's memory, e.g. ``local`` itself or a JAX buffer."""
    if not x.flags.writeable:
        return False
    if isinstance(local, (np.ndarray, np.generic)) or hasattr(local, "__array__"):
        return not np.may_share_memory(x, np.asarray(local))
    return True  # Python numbers: converting them made x


# ---------------------------------------------------------------------------------------------- communicators
class _Context:
    """A private duplicate of the user's communicator and its cached sub-communicators."""

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.groups: dict = {}
        self.mesh: Mesh | None = None

    def group(self, axes) -> tuple:
        """``(sub-communicator, k)`` for this rank's group over ``axes``; created collectively, once."""
        key = (self.mesh, tuple(axes))
        if key not in self.groups:
            color = next(group[0] for group in self.mesh.groups(tuple(axes)) if self.rank in group)
            self.groups[key] = self.comm.Split(color, self.mesh.group_index(self.rank, axes))
        return self.groups[key], self.groups[key].Get_size()


_KEYVAL = None


def _context(comm, mesh: Mesh) -> _Context:
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval()
    ctx = comm.Get_attr(_KEYVAL)
    if ctx is None:
        ctx = _Context(comm)  # collective (Dup): every rank reaches it on its first reshard over comm
        comm.Set_attr(_KEYVAL, ctx)
    ctx.mesh = mesh
    return ctx


def clear_cache(comm=None) -> None:
    """Free the communicators cached on ``comm`` (collective over ``comm``)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if _KEYVAL is None or comm.Get_attr(_KEYVAL) is None:
        return
    ctx = comm.Get_attr(_KEYVAL)
    comm.Delete_attr(_KEYVAL)
    for sub in ctx.groups.values():
        sub.Free()
    ctx.comm.Free()


# ---------------------------------------------------------------------------------------------- buffers
class _Buffer:
    """The current buffer; ``owned`` when it is ours to overwrite or drop (not the caller's input)."""

    def __init__(self, x: np.ndarray, owned: bool):
        self.x, self.owned = x, owned

    def take(self) -> np.ndarray:
        """Hand over the array and drop this reference, so an owned buffer dies as soon as its user is done."""
        x, self.x = self.x, None
        return x


def _raw(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array's memory as bytes (any dtype, bf16 and bool included)."""
    return a.reshape(-1).view(np.uint8)


# ---------------------------------------------------------------------------------------------- reductions
_NATIVE = {
    np.dtype(np.int8): MPI.INT8_T, np.dtype(np.int16): MPI.INT16_T, np.dtype(np.int32): MPI.INT32_T,
    np.dtype(np.int64): MPI.INT64_T, np.dtype(np.uint8): MPI.UINT8_T, np.dtype(np.uint32): MPI.UINT32_T,
    np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
    np.dtype(np.complex64): MPI.C_FLOAT_COMPLEX, np.dtype(np.complex128): MPI.C_DOUBLE_COMPLEX,
}
_NATIVE_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}
_BOOL_OPS = {"sum": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND, "prod": MPI.LAND}
_USER_OPS: dict = {}


def _reduce_op(dtype: np.dtype, reduction: str):
    """``(element datatype, op)`` that reduces like numpy does (see the module docstring)."""
    if dtype == np.dtype(np.bool_):
        return MPI.C_BOOL, _BOOL_OPS[reduction]
    if dtype in _NATIVE and (dtype.kind in "iuc" or reduction in ("sum", "prod")):
        return _NATIVE[dtype], _NATIVE_OPS[reduction]
    key = (dtype, reduction)
    if key not in _USER_OPS:  # numpy's ufunc on whole elements
        def apply(inbuf, inoutbuf, _datatype, dtype=dtype, ufunc=REDUCERS[reduction]):
            acc = np.frombuffer(inoutbuf, dtype=dtype)
            acc[...] = ufunc(np.frombuffer(inbuf, dtype=dtype), acc)

        element = MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()
        _USER_OPS[key] = (element, MPI.Op.Create(apply, commute=True))
    return _USER_OPS[key]


def _reduce_spec(a: np.ndarray, element):
    """``a``'s memory as elements of ``element`` (the count follows from the byte length)."""
    return [_raw(a), element]


# ---------------------------------------------------------------------------------------------- instructions
class MpiBackend(interpreter.Backend):
    """The state is this rank's :class:`_Buffer`; each method takes its array (so that an owned input dies
    as soon as it is used) and returns the next buffer. Every buffer is C-contiguous."""

    def __init__(self, ctx: _Context):
        self.ctx = ctx

    def reshape(self, ins: P.Reshape, buf):
        """A view with the new shape (the buffer is C-contiguous)."""
        owned = buf.owned
        return _Buffer(buf.take().reshape(ins.shape), owned)

    def transpose(self, ins: P.Transpose, buf):
        """A C-contiguous copy of the transposed buffer; an owned input is dropped once the copy exists. Where
        the transpose only moves dims of size 1 numpy makes no copy, and the view is owned as its input was."""
        owned, x = buf.owned, buf.take()
        y = np.ascontiguousarray(np.transpose(x, ins.perm))
        return _Buffer(y, owned or not np.may_share_memory(x, y))

    def slice(self, ins: P.Slice, buf):
        """Keep chunk ``r`` of ``k`` along ``dim`` (local; a copy, so the result is contiguous and owned)."""
        x = buf.take()
        k, r = self.ctx.mesh.group_size(ins.axes), self.ctx.mesh.group_index(self.ctx.rank, ins.axes)
        n = x.shape[ins.dim] // k
        index = [slice(None)] * x.ndim
        index[ins.dim] = slice(r * n, (r + 1) * n)
        return _Buffer(x[tuple(index)].copy(), True)

    def all_gather(self, ins: P.AllGather, buf):
        """``Allgather`` into a buffer with a leading member dim (rank ``j``'s buffer is row ``j``), then the
        member dim becomes the major part of ``dim`` (a view for dim 0, else one copy)."""
        x = buf.take()
        sub, k = self.ctx.group(ins.axes)
        got = np.empty((k,) + x.shape, dtype=x.dtype)
        sub.Allgather([_raw(x), MPI.BYTE], [_raw(got), MPI.BYTE])
        del x
        shape = list(got.shape[1:])
        shape[ins.dim] *= k
        return _Buffer(np.ascontiguousarray(np.moveaxis(got, 0, ins.dim)).reshape(shape), True)

    def all_to_all(self, ins: P.AllToAll, buf):
        """In-place ``Alltoall`` of the leading dim's rows: row ``j`` goes to rank ``j``, and row ``j`` of the
        result comes from rank ``j``. Every rank exchanges in place (MPI needs ``IN_PLACE`` on all ranks or
        none), on a copy where the buffer is the caller's."""
        owned, x = buf.owned, buf.take()
        if not owned:
            x = x.copy()
        sub, _ = self.ctx.group(ins.axes)
        sub.Alltoall(MPI.IN_PLACE, [_raw(x), MPI.BYTE])
        return _Buffer(x, True)

    def reduce_scatter(self, ins: P.ReduceScatter, buf):
        """``Reduce_scatter_block`` (by the instruction's reduction) after bringing the ``k`` chunks along
        ``dim`` to the front (a copy unless ``dim`` is outermost; an owned input is dropped as soon as the copy
        exists). Where ``k`` does not divide the dim: :meth:`_reduce_scatter_counts`."""
        if buf.x.shape[ins.dim] % self.ctx.mesh.group_size(ins.axes):
            return self._reduce_scatter_counts(ins, buf)
        x = buf.take()
        sub, k = self.ctx.group(ins.axes)
        out_shape = list(x.shape)
        out_shape[ins.dim] //= k
        pre = math.prod(x.shape[: ins.dim])
        send = x if pre == 1 else np.ascontiguousarray(x.reshape(pre, k, -1).swapaxes(0, 1))
        del x
        out = np.empty(out_shape, dtype=send.dtype)
        element, op = _reduce_op(send.dtype, ins.reduction)
        sub.Reduce_scatter_block(_reduce_spec(send, element), _reduce_spec(out, element), op)
        return _Buffer(out, True)

    def _reduce_scatter_counts(self, ins: P.ReduceScatter, buf):
        """``Reduce_scatter`` with counts, for chunks by the padding rule (``L = ceil(n/k)`` rows of the dim
        from ``min(n, r·L)``, fewer at the end): the dim is brought to the front so that each chunk is
        contiguous, no padding is sent, and the rows a rank receives go to the start of its zero result."""
        x = buf.take()
        sub, k = self.ctx.group(ins.axes)
        n = x.shape[ins.dim]
        size = -(-n // k)
        rest = x.size // n if n else 0
        counts = [(min(n, (r + 1) * size) - min(n, r * size)) * rest for r in range(k)]
        send = np.ascontiguousarray(np.moveaxis(x, ins.dim, 0))
        del x
        mine = np.empty((counts[sub.Get_rank()] // rest if rest else 0,) + send.shape[1:], dtype=send.dtype)
        element, op = _reduce_op(send.dtype, ins.reduction)
        sub.Reduce_scatter(_reduce_spec(send, element), _reduce_spec(mine, element), counts, op)
        del send
        out = np.zeros((size,) + mine.shape[1:], dtype=mine.dtype)
        out[: len(mine)] = mine
        return _Buffer(np.ascontiguousarray(np.moveaxis(out, 0, ins.dim)), True)

    def keep_root(self, ins: P.KeepRoot, buf):
        """Local: rank 0 of the group keeps the buffer, the others make a zero buffer of its shape."""
        if self.ctx.mesh.group_index(self.ctx.rank, ins.axes) == 0:
            return buf
        x = buf.take()
        return _Buffer(np.zeros_like(x), True)

    def embed_chunk(self, ins: P.EmbedChunk, buf):
        """Local: a zero buffer ``k`` times longer along ``dim``, with this buffer as chunk ``r`` (its rank)."""
        x = buf.take()
        k, r = self.ctx.mesh.group_size(ins.axes), self.ctx.mesh.group_index(self.ctx.rank, ins.axes)
        n = x.shape[ins.dim]
        shape = list(x.shape)
        shape[ins.dim] *= k
        out = np.zeros(shape, dtype=x.dtype)
        out[(slice(None),) * ins.dim + (slice(r * n, (r + 1) * n),)] = x
        return _Buffer(out, True)

    def all_reduce(self, ins: P.AllReduce, buf):
        """``Allreduce`` (by the instruction's reduction), in place when the buffer is ours."""
        owned, x = buf.owned, buf.take()
        sub, _ = self.ctx.group(ins.axes)
        element, op = _reduce_op(x.dtype, ins.reduction)
        if owned:
            sub.Allreduce(MPI.IN_PLACE, _reduce_spec(x, element), op)
            return _Buffer(x, True)
        out = np.empty_like(x)
        sub.Allreduce(_reduce_spec(x, element), _reduce_spec(out, element), op)
        return _Buffer(out, True)

    def collective_permute(self, ins: P.CollectivePermute, buf):
        """One ``Sendrecv``: receive from this rank's source, send to the rank whose source is this one (each
        computed for this rank alone)."""
        me, mesh = self.ctx.rank, self.ctx.mesh
        source = ins.source_of(mesh, me)
        if source == me:
            return buf
        x = buf.take()
        out = np.empty_like(x)
        self.ctx.comm.Sendrecv([_raw(x), MPI.BYTE], ins.target_of(mesh, me), _TAG, [_raw(out), MPI.BYTE], source,
                               _TAG)
        return _Buffer(out, True)

    def exchange(self, ins: P.Exchange, buf):
        """One ``Alltoallv`` of contiguous bytes over the private communicator, then copies within the rank.

        The data for rank ``d`` is the boxes of ``d``'s copies whose source is this rank, packed one after the
        other in ``d``'s copy order; the receiver unpacks its own copies from each source in the same order,
        so both sides agree on the layout without further messages. Each rank computes only its own copies
        and the copies it sends (:meth:`~redist.program.Exchange.copies_from`), never the whole table. Copies
        from the rank itself are done directly. Positions no copy writes are zero. Besides the input, the send
        and receive buffers are alive together, then the receive buffer and the output (the send buffer is
        freed before the output exists, an owned input right after the local copies)."""
        x = buf.take()
        me, mesh = self.ctx.rank, self.ctx.mesh
        itemsize = x.dtype.itemsize
        mine = ins.copies(mesh, me)
        outgoing = ins.copies_from(mesh, me)
        incoming = [c for c in mine if c.source != me]
        send_counts, recv_counts = [0] * mesh.size, [0] * mesh.size
        for d, c in outgoing:
            send_counts[d] += math.prod(c.size) * itemsize
        for c in incoming:
            recv_counts[c.source] += math.prod(c.size) * itemsize
        send = np.empty(sum(send_counts), np.uint8)
        at = 0
        for _, c in outgoing:
            nbytes = math.prod(c.size) * itemsize
            send[at: at + nbytes].view(x.dtype).reshape(c.size)[...] = x[c.src_box]
            at += nbytes
        recv = np.empty(sum(recv_counts), np.uint8)
        self.ctx.comm.Alltoallv([send, (send_counts, _offsets(send_counts)), MPI.BYTE],
                                [recv, (recv_counts, _offsets(recv_counts)), MPI.BYTE])
        del send
        out = np.zeros(ins.shape, dtype=x.dtype)
        for c in mine:
            if c.source == me:
                out[c.dst_box] = x[c.src_box]
        del x
        at = _offsets(recv_counts)
        for c in incoming:
            nbytes = math.prod(c.size) * itemsize
            out[c.dst_box] = recv[at[c.source]: at[c.source] + nbytes].view(out.dtype).reshape(c.size)
            at[c.source] += nbytes
        return _Buffer(out, True)


def _offsets(counts) -> list[int]:
    """Displacements of blocks of ``counts`` packed one after the other."""
    return [0] + list(itertools.accumulate(counts))[:-1]
