"""MPI runtime: run a plan's buffer program with mpi4py, one rank per device.

    from mpi4py import MPI
    import redist, redist.mpi

    with redist.mpi.abort_on_error():                 # a failing rank takes the job down, never a hang
        out = redist.mpi.reshard(local, src, dst)     # on every rank of COMM_WORLD; rank == device id

Contracts:

- :func:`reshard` is collective over ``comm``: every rank calls it with its own shard of ``src`` and the same
  ``src`` and ``dst``. Rank ``r`` is device ``r`` of ``src.mesh`` (row-major ids, see :class:`redist.Mesh`).
- Before any data moves, the ranks agree on their arguments with one small ``Allgather``; a wrong
  ``comm.size``, arguments that differ between ranks, or a local buffer whose shape does not fit ``src`` or
  whose data does not convert to its dtype without loss (:mod:`redist.buffers`) on any rank make *every*
  rank raise :class:`redist.ShardingError` (and nothing else happens).
- The result is always a new array; the caller's buffer is never returned, aliased or written to.
- Data travels in numpy buffers through the buffer (uppercase) methods of mpi4py, never pickled, always
  as contiguous bytes: chunks are packed along a leading dim with numpy before a collective and merged
  into place after it (MPICH's derived datatypes for strided chunks measured 2-3x slower here). At most
  two buffers of the larger local size are alive at once: extra memory per rank stays within
  ``2 · max(src.local_bytes, dst.local_bytes)`` (the input buffer is never written to).
- Collectives run on a private duplicate of ``comm`` and on sub-communicators split from it, one per
  (mesh, axes) group; both are created once per communicator and cached on it (an MPI attribute), so
  repeated reshards reuse them. :func:`clear_cache` frees them.
- A failure on one rank in the middle of a plan (an exception, not an agreement error) leaves the other
  ranks blocked in a collective: wrap SPMD code in :func:`abort_on_error` so that such a rank aborts the job.
- Sums (``ReduceScatter``, ``AllReduce``) use MPI's reduction order, so floating-point results can differ
  from the numpy backend in the last bits; integer-valued data and integer dtypes agree exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
import sys
import traceback
from typing import NoReturn

import numpy as np

from redist.extras import missing_extra

try:
    from mpi4py import MPI
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.mpi", "mpi") from e

from redist import program as P
from redist.buffers import as_array, describe
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.synthesis import synthesize
from redist.types import ShardingType

__all__ = ["reshard", "run_program", "abort_on_error", "clear_cache"]

_TAG = 0x5EED  # point-to-point tag for CollectivePermute, on the private duplicate communicator


# ---------------------------------------------------------------------------------------------- entry point
def reshard(local, src: ShardingType, dst: ShardingType, comm=None) -> np.ndarray:
    """This rank's shard of type ``dst``, given its shard ``local`` of type ``src``.

    Collective over ``comm`` (default ``MPI.COMM_WORLD``); rank ``r`` is device ``r`` and ``comm.size`` must
    equal ``src.mesh.size``. The result is always a new C-contiguous array, never ``local`` or a view of it
    (not even for an empty plan, ``src == dst``, or a rank whose buffer stays put). ``local`` is converted to
    ``src``'s dtype only without loss (:mod:`redist.buffers`, as :func:`redist.execute` takes shards).
    Raises :class:`ShardingError` if ``comm`` is no MPI intracommunicator (on the ranks that passed it), and on
    every rank, before moving any data, if the ranks' arguments disagree, if ``comm.size`` is wrong, if some
    rank's ``local`` does not have ``src.local_shape`` or does not convert to ``src``'s dtype, or if no plan
    exists from ``src`` to ``dst``.
    """
    comm = _communicator(comm)
    x = _agree(comm, local, src, dst)
    plan = synthesize(src, dst)  # deterministic: every rank gets the same plan or the same error
    return _run(plan.program, x, _owned(x, local), comm)


def run_program(program: P.Program, local, comm=None) -> np.ndarray:
    """Execute a buffer program on this rank's buffer; collective over ``comm`` like :func:`reshard`.

    The low-level entry: it does not make the ranks agree on their arguments first, so a wrong local shape
    or dtype raises on this rank only. The input buffer is never written to; the result is a new array."""
    comm = _communicator(comm)
    if not isinstance(program, P.Program):
        raise ShardingError(f"run_program needs a redist.program.Program (plan.program), got {describe(program)}")
    x = np.asarray(as_array(local, program.dtype, f"rank {comm.Get_rank()}: the local buffer"), order="C")
    if x.shape != tuple(program.shapes[0]):
        raise ShardingError(f"rank {comm.Get_rank()}: local buffer has shape {x.shape}, "
                            f"the program expects {tuple(program.shapes[0])}")
    return _run(program, x, _owned(x, local), comm)


def _communicator(comm):
    """``comm``, or ``MPI.COMM_WORLD`` for None; raise unless it is a usable intracommunicator."""
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise ShardingError(f"comm must be an MPI intracommunicator such as MPI.COMM_WORLD (one rank per device), "
                            f"got {describe(comm)}")
    return comm


def _owned(x: np.ndarray, local) -> bool:
    """Whether ``x``, the caller's ``local`` converted, is a new array that the program may overwrite and
    return: never when it is (a view of) the caller's memory, e.g. ``local`` itself or a JAX buffer."""
    if not x.flags.writeable:
        return False
    if isinstance(local, (np.ndarray, np.generic)) or hasattr(local, "__array__"):
        return not np.may_share_memory(x, np.asarray(local))
    return True  # Python numbers: converting them made x


def _run(program: P.Program, x: np.ndarray, owned: bool, comm) -> np.ndarray:
    """Run ``program`` on the checked C-contiguous buffer ``x``; a buffer that is not ``owned`` is never written
    to, and the result is copied if it still is that buffer (or a view of it) at the end."""
    if x.size == 0:  # every buffer of the program is empty on every rank
        return np.empty(program.shapes[-1], dtype=program.dtype)
    ctx = _context(comm, program.mesh)
    buf = _Buffer(x, owned)
    del x
    for ins in program.instructions:
        y, owned = _RUN[type(ins)](ctx, ins, buf)
        buf = _Buffer(y, owned)
        del y
    return buf.take() if buf.owned else buf.take().copy()


# ---------------------------------------------------------------------------------------------- agreement
def _agree(comm, local, src, dst) -> np.ndarray:
    """One ``Allgather`` of (digest of the arguments, local-buffer check) per rank; raise on every rank.
    Returns ``local`` as a C-contiguous array of ``src``'s dtype (the caller's own where it already is one)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    typed = isinstance(src, ShardingType) and isinstance(dst, ShardingType)
    # Untyped arguments are compared by type only: their reprs may hold addresses that differ between ranks.
    text = f"{src.mesh}|{src}|{dst.mesh}|{dst}" if typed else f"{type(src).__qualname__}|{type(dst).__qualname__}"
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)
    x, problem = None, "src is no ShardingType"
    if typed:
        try:
            x = np.asarray(as_array(local, src.np_dtype, "it"), order="C")
            problem = "" if x.shape == src.local_shape else f"it has shape {x.shape}"
        except ShardingError as e:
            problem = str(e)
    mine = np.array([digest, int(not problem)], dtype=np.int64)
    every = np.empty((size, 2), dtype=np.int64)
    comm.Allgather(mine, every)

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
    return x


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
            sub = self.comm.Split(color, self.mesh.group_index(self.rank, axes))
            assert sub.Get_size() == self.mesh.group_size(tuple(axes))
            self.groups[key] = sub
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


def _out_shape(shape, dim: int, mul: int = 1, div: int = 1) -> tuple[int, ...]:
    s = list(shape)
    s[dim] = s[dim] * mul // div
    return tuple(s)


# ---------------------------------------------------------------------------------------------- sums
_NATIVE = {
    np.dtype(np.int8): MPI.INT8_T, np.dtype(np.int16): MPI.INT16_T, np.dtype(np.int32): MPI.INT32_T,
    np.dtype(np.int64): MPI.INT64_T, np.dtype(np.uint8): MPI.UINT8_T, np.dtype(np.uint32): MPI.UINT32_T,
    np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
}
_USER_OPS: dict = {}


def _sum_op(dtype: np.dtype):
    """``(element datatype, op)`` that sums like numpy does (bool: logical or)."""
    if dtype in _NATIVE:
        return _NATIVE[dtype], MPI.SUM
    if dtype == np.dtype(np.bool_):
        return MPI.C_BOOL, MPI.LOR
    if dtype not in _USER_OPS:  # f16, bf16: a user op on whole elements, adding in numpy
        def add(inbuf, inoutbuf, _datatype, dtype=dtype):
            acc = np.frombuffer(inoutbuf, dtype=dtype)
            acc[...] = np.frombuffer(inbuf, dtype=dtype) + acc

        element = MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()
        _USER_OPS[dtype] = (element, MPI.Op.Create(add, commute=True))
    return _USER_OPS[dtype]


def _sum_spec(a: np.ndarray, element):
    """``a``'s memory as elements of ``element`` (the count follows from the byte length)."""
    return [_raw(a), element]


# ---------------------------------------------------------------------------------------------- instructions
# Each takes (context, instruction, buffer) and returns (new array, whether it is owned).
def _slice(ctx, ins: P.Slice, buf):
    """Keep chunk ``r`` of ``k`` along ``dim`` (local; a copy, so the result is contiguous and owned)."""
    x = buf.take()
    k, r = ctx.mesh.group_size(ins.axes), ctx.mesh.group_index(ctx.rank, ins.axes)
    n = x.shape[ins.dim] // k
    index = [slice(None)] * x.ndim
    index[ins.dim] = slice(r * n, (r + 1) * n)
    return x[tuple(index)].copy(), True


def _all_gather(ctx, ins: P.AllGather, buf):
    """``Allgather`` into a buffer with a leading member dim (rank ``j``'s buffer is row ``j``), then the member
    dim becomes the major part of ``dim`` (a view for dim 0, else one copy)."""
    x = buf.take()
    sub, k = ctx.group(ins.axes)
    got = np.empty((k,) + x.shape, dtype=x.dtype)
    sub.Allgather([_raw(x), MPI.BYTE], [_raw(got), MPI.BYTE])
    del x
    return _merge_leading(got, ins.dim), True


def _all_to_all(ctx, ins: P.AllToAll, buf):
    """In-place contiguous ``Alltoall`` on chunks packed along a leading dim: chunk ``j`` of ``split_dim`` goes
    to rank ``j``; afterwards the leading dim indexes the sender and becomes the major part of ``concat_dim``.
    (Packing with numpy and sending contiguous bytes is several times faster here than MPI derived
    datatypes describing the strided chunks.)"""
    x = buf.take()
    sub, k = ctx.group(ins.axes)
    shape = list(x.shape)
    chunks = x.reshape(shape[: ins.split_dim] + [k, shape[ins.split_dim] // k] + shape[ins.split_dim + 1:])
    # Always a fresh copy, so that every rank exchanges in place (MPI needs IN_PLACE on all ranks or none).
    packed = np.array(np.moveaxis(chunks, ins.split_dim, 0), order="C", copy=True)
    del x, chunks
    sub.Alltoall(MPI.IN_PLACE, [_raw(packed), MPI.BYTE])
    return _merge_leading(packed, ins.concat_dim), True


def _merge_leading(x: np.ndarray, dim: int) -> np.ndarray:
    """``x`` of shape ``(k, n_0, …)`` with its leading dim merged into dim ``dim`` as the major part."""
    shape = list(x.shape[1:])
    shape[dim] *= x.shape[0]
    return np.ascontiguousarray(np.moveaxis(x, 0, dim)).reshape(shape)


def _reduce_scatter(ctx, ins: P.ReduceScatter, buf):
    """``Reduce_scatter_block`` after bringing the ``k`` chunks along ``dim`` to the front (a copy unless
    ``dim`` is outermost; an owned input is dropped as soon as the copy exists)."""
    x = buf.take()
    sub, k = ctx.group(ins.axes)
    out_shape = _out_shape(x.shape, ins.dim, div=k)
    pre = math.prod(x.shape[: ins.dim])
    send = x if pre == 1 else np.ascontiguousarray(x.reshape(pre, k, -1).swapaxes(0, 1))
    del x
    out = np.empty(out_shape, dtype=send.dtype)
    element, op = _sum_op(send.dtype)
    sub.Reduce_scatter_block(_sum_spec(send, element), _sum_spec(out, element), op)
    return out, True


def _all_reduce(ctx, ins: P.AllReduce, buf):
    """``Allreduce``, in place when the buffer is ours."""
    owned, x = buf.owned, buf.take()
    sub, _ = ctx.group(ins.axes)
    element, op = _sum_op(x.dtype)
    if owned:
        sub.Allreduce(MPI.IN_PLACE, _sum_spec(x, element), op)
        return x, True
    out = np.empty_like(x)
    sub.Allreduce(_sum_spec(x, element), _sum_spec(out, element), op)
    return out, True


def _collective_permute(ctx, ins: P.CollectivePermute, buf):
    """One ``Sendrecv``: receive from ``sources[rank]``, send to the rank whose source is this one."""
    owned, x = buf.owned, buf.take()
    me = ctx.rank
    source = ins.sources[me]
    if source == me:
        return x, owned
    out = np.empty_like(x)
    ctx.comm.Sendrecv([_raw(x), MPI.BYTE], ins.sources.index(me), _TAG, [_raw(out), MPI.BYTE], source, _TAG)
    return out, True


def _exchange(ctx, ins: P.Exchange, buf):
    """One ``Alltoallv`` of contiguous bytes over the private communicator, then copies within the rank.

    The data for rank ``d`` is the boxes of ``ins.copies[d]`` whose source is this rank, packed one after the
    other in copy order; the receiver unpacks its own ``ins.copies[rank]`` from each source in the same order,
    so both sides agree on the layout without further messages. Copies from the rank itself are done
    directly. Positions no copy writes are zero. Besides the input, the send and receive buffers are alive
    together, then the receive buffer and the output (the send buffer is freed before the output exists,
    an owned input right after the local copies)."""
    x = buf.take()
    me, n = ctx.rank, ctx.mesh.size
    itemsize = x.dtype.itemsize
    outgoing = [[c for c in ins.copies[d] if c.source == me] if d != me else [] for d in range(n)]
    incoming = [c for c in ins.copies[me] if c.source != me]
    send_counts = [sum(math.prod(c.size) for c in cs) * itemsize for cs in outgoing]
    recv_counts = [0] * n
    for c in incoming:
        recv_counts[c.source] += math.prod(c.size) * itemsize
    send = np.empty(sum(send_counts), np.uint8)
    at = 0
    for cs in outgoing:
        for c in cs:
            nbytes = math.prod(c.size) * itemsize
            send[at: at + nbytes].view(x.dtype).reshape(c.size)[...] = x[c.src_box]
            at += nbytes
    recv = np.empty(sum(recv_counts), np.uint8)
    ctx.comm.Alltoallv([send, (send_counts, _offsets(send_counts)), MPI.BYTE],
                       [recv, (recv_counts, _offsets(recv_counts)), MPI.BYTE])
    del send
    out = np.zeros(ins.shape, dtype=x.dtype)
    for c in ins.copies[me]:
        if c.source == me:
            out[c.dst_box] = x[c.src_box]
    del x
    at = _offsets(recv_counts)
    for c in incoming:
        nbytes = math.prod(c.size) * itemsize
        out[c.dst_box] = recv[at[c.source]: at[c.source] + nbytes].view(out.dtype).reshape(c.size)
        at[c.source] += nbytes
    return out, True


def _offsets(counts) -> list[int]:
    """Displacements of blocks of ``counts`` packed one after the other."""
    return [0] + list(itertools.accumulate(counts))[:-1]


def _reshape(ctx, ins: P.Reshape, buf):
    """A view with the new shape (the buffer is C-contiguous)."""
    owned, x = buf.owned, buf.take()
    return x.reshape(ins.shape), owned


def _transpose(ctx, ins: P.Transpose, buf):
    """A C-contiguous copy of the transposed buffer; an owned input is dropped once the copy exists."""
    x = buf.take()
    return np.ascontiguousarray(np.transpose(x, ins.perm)), True


_RUN = {
    P.Reshape: _reshape,
    P.Transpose: _transpose,
    P.Slice: _slice,
    P.AllGather: _all_gather,
    P.AllToAll: _all_to_all,
    P.ReduceScatter: _reduce_scatter,
    P.AllReduce: _all_reduce,
    P.CollectivePermute: _collective_permute,
    P.Exchange: _exchange,
}


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
    comm = _communicator(comm)
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
