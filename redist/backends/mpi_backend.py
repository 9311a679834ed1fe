"""The MPI interpreter: one rank's buffer, instructions as mpi4py transfers (one rank per device).

Contracts (the entry points are :func:`redist.mpi.reshard`, which plans and agrees on the arguments first,
and :func:`run_program`, here and re-exported there):

- Rank ``r`` of the communicator is device ``r`` of the program's mesh.
- The result is always a new array; the caller's buffer is never returned, aliased or written to.
- Data travels in numpy buffers through the buffer (uppercase) methods of mpi4py, never pickled. What a rank
  sends is contiguous bytes: chunks are packed along a leading dim with numpy before a transfer (a send
  described by an MPI derived datatype measured up to 3.9x slower here, :data:`STRIDED_RUN_MIN`); an
  all-to-all comes lowered to that form (:class:`redist.program.AllToAll`) and runs out of place, straight
  from the packed (or the caller's) buffer into the next one (MPICH's in-place ``Alltoall`` measured 1.4-3.7x
  slower at 16-64 MiB per rank, -n 2 and 4).
  What a rank receives lands in its final place where that place's contiguous runs are at least
  :data:`STRIDED_RUN_MIN` bytes, described by a derived datatype (:func:`_place`): an all-gather's chunks in
  each row of the result, and the rows of an all-to-all that a transpose unpacks (a pencil transpose) in the
  transpose's result, so that no unpacking copy remains (at -n 2 and 4, 16-64 MiB per rank: a gather along
  an inner dim 0.8x the time of the hand-written ``Allgather`` and interleave, a pencil transpose 0.5-0.75x the
  hand-written ``Alltoall`` and unpacking). Shorter runs arrive packed and are merged into place by numpy.
  There, this rank's own row of an all-to-all from the caller's buffer is not copied into the result: the
  transpose that unpacks it reads it where the caller holds it (:class:`_Buffer`'s deferred row), which saves
  ``1/k`` of the data's copies; and a transpose that packs an all-to-all's rows from the caller's buffer leaves
  that row there for the all-to-all to copy once (a slab transpose: about 1.0x the hand-written program before,
  0.79-0.91x after).
- The personalised exchanges within a group (``AllGather``, ``AllToAll``, an even ``ReduceScatter``) run as
  point-to-point transfers between the members, posted at once, :data:`WINDOW` peers at a time at most
  (:meth:`MpiBackend._exchange_rows`: faster here than MPICH's step-by-step collective algorithms whenever
  ranks share cores), except an all-gather into contiguous places in a result smaller than
  :data:`ALLGATHER_MAX_BYTES` on a node of at most :data:`ALLGATHER_RANKS_PER_CORE` ranks per core, which is
  MPI's ``Iallgather`` (MPICH passes such chunks around a ring; :meth:`MpiBackend._allgather`; a program of
  that one all-gather, once :func:`redist.mpi.reshard` has agreed on it, runs without the interpreter:
  :func:`_direct`); the others as MPI
  collectives (``Alltoallv`` for an ``Exchange``, ``Allreduce``, ``Reduce_scatter``) or one ``Sendrecv`` (a
  permute).
- Memory: buffers of at most ``2 · max(src.local_bytes, dst.local_bytes)`` bytes in all are alive at once
  besides the caller's input (never written to). One of them may be the rank's *scratch* buffer, kept
  between calls so that a packing copy does not pay for fresh pages on every call (a copy into a fresh
  buffer of 64-256 MiB measured 1.8-2.6x slower here than into a reused one): in a program of one
  data-moving instruction (besides reshapes) that instruction's temporary lives there (the gathered rows of
  an ``AllGather`` along an inner dim whose chunks arrive packed, the received chunks of a ``ReduceScatter``),
  in a program of two the first one's result (the packed chunks of a slab transpose, the received rows of a
  pencil transpose that arrive packed) when the second needs no temporary. The scratch buffer only grows (to
  the largest such buffer so far: after a larger reshard it stays larger than a smaller one needs) and is
  never returned: the result is always a fresh array. :func:`held_bytes` tells its size, :func:`clear_cache` frees it.
- Transfers run on a :class:`Channel`: a private duplicate of ``comm`` and sub-communicators split from
  it, one per (mesh, axes) group. :func:`run_program` uses the communicator's default channel;
  :func:`redist.mpi.reshard` gives each agreed argument combination a channel of its own, its groups split
  when it is made. They are cached on ``comm`` (an MPI attribute), so repeated calls reuse them;
  :func:`clear_cache` frees them. Every transfer is nonblocking; when the call's verdict is in flight
  (:func:`redist.mpi.reshard`), the first instruction's transfers are posted, then the verdict waited for (all
  progress together), then the data. A verdict against the call raises :class:`Disagreement`, leaving the
  unfinished requests, and the buffers they hold, alive.
- A ``ReduceScatter`` whose group size divides its dim moves the chunks as above and reduces them with
  numpy, in group order: its results are the numpy backend's, bit for bit. The other reductions (an
  ``AllReduce``, an uneven ``ReduceScatter``) use MPI's reduction order, so floating-point results can
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
import os
from collections import OrderedDict

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

__all__ = ["run_program", "run", "communicator", "context", "clear_cache", "held_bytes", "Channel", "Verdict",
           "Disagreement", "MpiBackend"]

_TAG = 0x5EED  # point-to-point tag of every transfer, on the channel's private communicators
# The most shifts of a personalised exchange in flight at once (:meth:`MpiBackend._exchange_rows`): a rank of a
# group of thousands then has at most 2 x 32 transfers posted, not thousands (32 is also MPICH's throttle for
# its scattered all-to-all, MPIR_CVAR_ALLTOALL_THROTTLE).
WINDOW = 32
# A receive whose place in its destination is strided (an all-gather's chunk in each row of the result, a pencil
# transpose's received row in the unpacked result) lands there directly, described by an MPI derived datatype,
# where the place's contiguous runs hold at least this many bytes; shorter runs arrive packed and numpy moves them.
# Measured here (bench/mpi_datatypes.py, 16 MiB per rank, -n 2 and 4, three runs, bench/results/mpi_datatypes_n*):
# the direct receive took 0.64-0.92x the packed receive's time at runs of 1-16 KiB, 0.84-1.64x at 512 bytes and
# 1.4-3x at 32-128 bytes. Sends stay packed: a send described by a datatype (a slab transpose's rows, 1-4 KiB
# runs) took 0.97-3.9x the packed send's time, and 2.4x at 64 MiB per rank.
STRIDED_RUN_MIN = 1024
# An all-gather whose chunks' places in the result are contiguous is MPI's ``Iallgather`` (for large
# messages MPICH passes the chunks around a ring: k - 1 steps, each sending the chunk received last to the next
# member) where the node runs at most ALLGATHER_RANKS_PER_CORE ranks per core and the result is smaller than
# ALLGATHER_MAX_BYTES; elsewhere it posts every transfer at once (:func:`_post_rows`). glibc maps an allocation of
# 32 MiB or more afresh from the system, so such a result's pages are new on every call, and receiving every
# chunk at once overlaps their faults; a smaller result reuses mapped pages. Measured here (2 cores, 16-64 MiB
# per rank, medians of paired rounds against ``Allgather``): with the result's pages mapped, a ring took
# 1.00-1.02x the ``Allgather``'s time at -n 2 and 4 and posting at once 1.03-1.23x; with fresh pages, the ring
# 1.00-1.01x and posting at once 0.69-0.87x; at -n 8 (4 ranks per core), where each step of the ring waits for a
# neighbour to be scheduled, the ring 1.01x and posting at once 0.86-0.90x with mapped pages, 0.50-0.64x with
# fresh ones. The ring was first stepped from Python, each step's transfers posted and completed in turn; MPI's
# blocking ``Allgather`` after the verdict, in one call, measured 3-5% faster than that (whole ``reshard`` calls,
# 16 MiB results, paired medians against the hand-written ``Allgather``: -n 4 1.04-1.09x against 1.07-1.11x,
# -n 2 1.06x against 1.09-1.10x), as the ranks sharing a core no longer come back to Python between steps; and
# ``Iallgather`` posted before the verdict is waited for, so that the two travel together, as fast as that at
# -n 2 and 0.3-7% faster in five paired comparisons at -n 4 (medians of 200-300 rounds: 1.05-1.09x against
# 1.07-1.17x), where ranks sharing a core made the verdict one more point at which all must be scheduled.
ALLGATHER_RANKS_PER_CORE = 2
ALLGATHER_MAX_BYTES = 32 * 2**20


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
    return run(program, x, local, context(comm))


def communicator(comm):
    """``comm``, or ``MPI.COMM_WORLD`` for None; raise unless it is a usable intracommunicator."""
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise ShardingError(f"comm must be an MPI intracommunicator such as MPI.COMM_WORLD (one rank per device), "
                            f"got {describe(comm)}")
    return comm


def run(program: P.Program, x: np.ndarray, local, ctx: "_Context", channel: "Channel | None" = None,
        verdict: "Verdict | None" = None) -> np.ndarray:
    """Run the checked ``program`` on ``x``, this rank's checked C-contiguous buffer made from the caller's
    ``local`` (:func:`redist.buffers.local_buffer`), collectively over the communicator of ``ctx``
    (:func:`context`); returns a new array.

    The transfers run on ``channel`` (made for this program by :meth:`_Context.open`), else on the
    communicator's default channel. With a ``verdict`` in flight, the first instruction's transfers are
    posted, then the verdict waited for, then the data; a verdict that goes against the call raises
    :class:`Disagreement` (module docstring).
    ``x`` is overwritten or dropped as soon as it is no longer needed when it is an array of its own, and
    never written to when it is (a view of) the caller's memory; the result is copied if it still is, or if
    it is the scratch buffer (a rank on which the second instruction moved nothing)."""
    if channel is not None and channel.direct is not None and channel.program is program:
        return channel.direct(x, verdict)
    if channel is None:
        channel = ctx.default
        channel.mesh = program.mesh
    backend = MpiBackend(ctx, channel, program, verdict)
    buf = interpreter.run(program, backend, _Buffer(x, _owned(x, local)))
    backend.settle([])
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
class Channel:
    """A private duplicate of a communicator and the sub-communicators split from it, one per (mesh, axes)
    group. A channel made for a program (``program`` given) splits every group the program uses at once,
    collectively, so that running the program calls no blocking collective besides its data movement, and
    remembers the program's :func:`_roles` and this rank's layout of its exchanges; the default channel (no
    program) splits groups on first use and remembers nothing."""

    def __init__(self, comm, mesh: Mesh | None = None, program: P.Program | None = None):
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.mesh = mesh
        self.program = program
        self.groups: dict = {}
        self.layouts: dict = {}
        self.roles = None if program is None else _roles(program)
        self.direct = None  # set by _Context.open (:func:`_direct`)
        for ins in () if program is None else program.instructions:
            if isinstance(ins, (P.AllGather, P.AllToAll, P.ReduceScatter, P.AllReduce)):
                self.group(ins.axes)

    def group(self, axes) -> tuple:
        """``(sub-communicator, k)`` for this rank's group over ``axes``; created collectively, once."""
        key = (self.mesh, tuple(axes))
        if key not in self.groups:
            color = next(group[0] for group in self.mesh.groups(tuple(axes)) if self.rank in group)
            self.groups[key] = self.comm.Split(color, self.mesh.group_index(self.rank, axes))
        return self.groups[key], self.groups[key].Get_size()

    def layout(self, ins, shape, compute):
        """``compute()``, this rank's layout of the exchange ``ins`` from a buffer of ``shape``; remembered where
        the channel is made for a program (``ins`` is one of its instructions, alive as long as the channel)."""
        if self.program is None:
            return compute()
        key = (id(ins), tuple(shape))
        if key not in self.layouts:
            self.layouts[key] = compute()
        return self.layouts[key]

    def free(self) -> None:
        for sub in self.groups.values():
            sub.Free()
        self.comm.Free()


class Verdict:
    """The ranks' votes on a call of :func:`redist.mpi.reshard`, reduced (``MAX``) by a nonblocking
    ``Allreduce`` in flight (``request``): per rank its arguments' digest and the digest negated (the two
    maxima are each other's negation exactly when every rank had the same digest), whether it needs the full
    agreement (a combination new to it, or ``check=True``), whether its buffer is wrong. Read them once the
    request has completed."""

    def __init__(self, comm, digest: int, unknown: bool, bad_local: bool):
        self.votes = np.array([digest, -digest, unknown, bad_local], dtype=np.int64)
        self.request = comm.Iallreduce(MPI.IN_PLACE, self.votes, op=MPI.MAX)

    def ok(self) -> bool:
        """Whether the call stands: one digest, an agreed combination and a good buffer on every rank."""
        v = self.votes
        return v[0] == -v[1] and not v[2] and not v[3]

    def disagreed(self) -> bool:
        """Whether some ranks' digests differ or some rank's buffer is wrong."""
        v = self.votes
        return v[0] != -v[1] or bool(v[3])

    def settle(self, ctx: "_Context", pending=()) -> None:
        """Wait for the verdict; raise :class:`Disagreement` if it goes against the call, leaving the
        ``pending`` requests (which may never complete, and the buffers they hold) to ``ctx``."""
        self.request.Wait()
        if not self.ok():
            ctx.abandoned += [r for r in pending if r]
            raise Disagreement


class Disagreement(Exception):
    """Raised on every rank when a verdict goes against a call that ran on ahead of it (internal: the entry
    point catches it, resets the context and agrees in full)."""


class _Context:
    """What a rank keeps per user communicator: a private duplicate of it (for agreement traffic and for
    making channels), the default channel, one channel per agreed argument combination with its program
    (:func:`redist.mpi.reshard`'s business: a bounded map, oldest first out), the scratch buffer, and what
    a disagreement left behind (requests that will never complete, with the buffers and channels they
    hold, kept alive so that MPI never writes into freed memory)."""

    AGREED_MAX = 64  # each channel holds a duplicate and its groups: MPI has a few thousand contexts

    def __init__(self, comm):
        self.comm = comm.Dup()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        # on this rank's node (the cores the system has, whatever a rank's binding: ALLGATHER_RANKS_PER_CORE)
        self.ranks_per_core = node.Get_size() / (os.cpu_count() or 1)
        node.Free()
        self.default = Channel(self.comm)
        self.agreed: dict = {}
        self.last: tuple = (None, None, None)  # (src, dst, Agreement or None) of the last lookup (recall)
        self.scratch: np.ndarray | None = None
        self.abandoned: list = []

    def scratch_array(self, shape, dtype) -> np.ndarray:
        """The scratch buffer's first bytes as a C-contiguous array of ``shape`` and ``dtype`` (grown first,
        the old one freed before the new one exists, when it is too small)."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if self.scratch is None or self.scratch.size < nbytes:
            self.scratch = None
            self.scratch = np.empty(nbytes, np.uint8)
        return self.scratch[:nbytes].view(dtype).reshape(shape)

    def recall(self, src, dst) -> "Agreement | None":
        """The agreement on the combination ``(src, dst)``, or None. The last combination looked up is
        recognised by identity, without hashing the types (immutable values): a program that reshards the same
        arrays over and over finds its agreement in a few comparisons."""
        last_src, last_dst, known = self.last
        if src is not last_src or dst is not last_dst:
            known = self.agreed.get((src, dst))
            self.last = (src, dst, known)
        return known

    def open(self, key, digest: int, program: P.Program) -> "Agreement":
        """Record an agreed combination: its :class:`Agreement`, with a new channel for ``program``
        (collective: every rank opens it together, after the full agreement), dropping the oldest beyond
        :attr:`AGREED_MAX`. A channel it replaces (``check=True``) is set aside, not freed."""
        self._set_aside(self.agreed.pop(key, None))
        channel = Channel(self.comm, program.mesh, program)
        channel.direct = _direct(self, channel, program)
        self.agreed[key] = Agreement(digest, channel, program)
        self.last = (None, None, None)
        while len(self.agreed) > self.AGREED_MAX:
            self.agreed.pop(next(iter(self.agreed))).channel.free()
        return self.agreed[key]

    def drop(self, key) -> None:
        """After a verdict against a call that ran on ahead: set aside the combination's channel and the
        scratch buffer, which requests that will never complete may still target; never used again."""
        self._set_aside(self.agreed.pop(key, None), self.scratch)
        self.scratch, self.last = None, (None, None, None)

    def reset(self) -> None:
        """After a disagreement (the same on every rank): forget every agreement, setting their channels
        aside as :meth:`drop` does."""
        self._set_aside(*self.agreed.values())
        self.agreed, self.last = {}, (None, None, None)

    def _set_aside(self, *things) -> None:
        self.abandoned += [t for t in things if t is not None]


class Agreement:
    """An argument combination ``(src, dst)`` the ranks agreed on (:func:`redist.mpi.reshard`): the arguments'
    ``digest``, the ``program`` planned for them and the ``channel`` it runs on, and the shape and dtype of the
    buffer the program reads (:func:`redist.buffers.is_local_buffer`)."""

    __slots__ = ("digest", "channel", "program", "shape", "dtype")

    def __init__(self, digest: int, channel: Channel, program: P.Program):
        self.digest, self.channel, self.program = digest, channel, program
        self.shape, self.dtype = tuple(program.shapes[0]), np.dtype(program.dtype)


_KEYVAL = None
_LAST_CONTEXT: tuple = (None, None)  # (comm, its _Context) of the last lookup (context)


def context(comm) -> _Context:
    """The :class:`_Context` cached on the intracommunicator ``comm`` (an MPI attribute; the last one looked
    up is recognised by identity); made on first use, collectively (``comm.Dup``): every rank reaches it on its
    first call over ``comm``."""
    global _KEYVAL, _LAST_CONTEXT
    if comm is _LAST_CONTEXT[0]:
        return _LAST_CONTEXT[1]
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval()
    ctx = comm.Get_attr(_KEYVAL)
    if ctx is None:
        ctx = _Context(comm)
        comm.Set_attr(_KEYVAL, ctx)
    _LAST_CONTEXT = (comm, ctx)
    return ctx


def clear_cache(comm=None) -> None:
    """Free the communicators, the scratch buffer and the agreements cached on ``comm`` (collective over
    ``comm``)."""
    global _LAST_CONTEXT
    comm = MPI.COMM_WORLD if comm is None else comm
    if _KEYVAL is None or comm.Get_attr(_KEYVAL) is None:
        return
    ctx = comm.Get_attr(_KEYVAL)
    comm.Delete_attr(_KEYVAL)
    _LAST_CONTEXT = (None, None)
    for agreement in ctx.agreed.values():
        agreement.channel.free()
    ctx.default.free()
    ctx.comm.Free()
    ctx.agreed, ctx.scratch = {}, None


def held_bytes(comm=None) -> int:
    """Bytes of data this rank keeps between calls over ``comm``: the scratch buffer (0 when none)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    ctx = None if _KEYVAL is None else comm.Get_attr(_KEYVAL)
    return 0 if ctx is None or ctx.scratch is None else ctx.scratch.nbytes


# ---------------------------------------------------------------------------------------------- buffers
class _Buffer:
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


def _roles(program: P.Program) -> tuple:
    """``(scratch use, packings, unpackings)`` of ``program`` (:func:`_scratch_use`, :func:`_packings`,
    :func:`_unpackings`): what :class:`MpiBackend` works out about a program before running it."""
    return _scratch_use(program), _packings(program), _unpackings(program)


def _direct(ctx: _Context, channel: Channel, program: P.Program):
    """A runner ``f(x, verdict) -> result`` of ``program`` on ``channel`` that bypasses the interpreter, where
    the program's one data-moving instruction (reshapes aside) is an all-gather by MPI's ``Iallgather``
    (:func:`_gathers_with_allgather`); else None. Per call it makes the result array, posts the
    ``Iallgather``, settles the verdict and waits for the data, as :meth:`MpiBackend.all_gather` would, and
    nothing else. Such a gather takes about 1 ms at 16 MiB and -n 2 here, and the Python before its data runs
    with caches the data has just flushed, 5-10x slower than warm: the interpreter's set-up and dispatch cost
    about 10 us of it."""
    moving = [t for t, ins in enumerate(program.instructions) if not isinstance(ins, P.Reshape)]
    if len(moving) != 1 or not isinstance(program.instructions[moving[0]], P.AllGather):
        return None
    (t,), dtype, shape = moving, np.dtype(program.dtype), tuple(program.shapes[-1])
    ins = program.instructions[t]
    if not (math.prod(shape) and _gathers_with_allgather(
            ctx, math.prod(program.shapes[t][: ins.dim]), math.prod(shape) * dtype.itemsize)):
        return None
    sub, _ = channel.group(ins.axes)

    def gather(x: np.ndarray, verdict: Verdict | None) -> np.ndarray:
        out = np.empty(shape, dtype)  # a reshape of the all-gather's result: the same bytes in the same order
        _wait(ctx, verdict, [sub.Iallgather(_message(x), _message(out))])
        return out
    return gather


def _wait(ctx: _Context, verdict: Verdict | None, requests: list) -> None:
    """Wait for ``requests``, transfers already posted; with a ``verdict`` in flight, for the verdict first
    (:meth:`Verdict.settle`, which raises :class:`Disagreement` leaving ``requests`` to ``ctx``), the data
    progressing meanwhile. (All of them together: on an oversubscribed host MPICH waits for *all* of several
    requests as fast as for one, for *any* of them 3-4x slower.)"""
    if verdict is not None:
        verdict.settle(ctx, requests)
    MPI.Request.Waitall(requests)


def _scratch_use(program: P.Program):
    """``(instruction, role)``: which instruction may use the scratch buffer in ``program``, and for what
    (``"temp"``: its temporary, ``"result"``: its result), or None (module docstring, memory)."""
    moving = [t for t, ins in enumerate(program.instructions) if not isinstance(ins, P.Reshape)]
    if len(moving) == 1:
        return program.instructions[moving[0]], "temp"
    if len(moving) == 2 and not _needs_temp(program, moving[1]):
        return program.instructions[moving[0]], "result"
    return None


def _packings(program: P.Program) -> dict:
    """``{id(transpose): axes}`` for every ``Transpose`` that ``program`` runs right before an ``AllToAll`` over
    ``axes``: it packs that all-to-all's rows, and the row this rank keeps need not be packed
    (:meth:`MpiBackend.transpose`)."""
    ins = program.instructions
    return {id(a): b.axes for a, b in zip(ins, ins[1:]) if isinstance(a, P.Transpose) and isinstance(b, P.AllToAll)}


def _unpackings(program: P.Program) -> dict:
    """``{id(all_to_all): transpose}`` for every ``AllToAll`` (listed once in ``program``) that ``program`` runs
    right before a ``Transpose`` (which unpacks its rows), where the places of the received rows in the
    transpose's result are runs of at least :data:`STRIDED_RUN_MIN` bytes: the rows arrive there directly
    (:meth:`MpiBackend.all_to_all`)."""
    ins, itemsize = program.instructions, np.dtype(program.dtype).itemsize
    fused = {}
    for t, (a, b) in enumerate(zip(ins, ins[1:])):
        if not (isinstance(a, P.AllToAll) and isinstance(b, P.Transpose)) or sum(i is a for i in ins) > 1:
            continue
        shape = program.shapes[t]
        strides = _c_strides(_permuted(shape, b.perm), itemsize)
        row = [strides[b.perm.index(d)] for d in range(1, len(shape))]  # the strides of a row's place
        if math.prod(shape) and _runs(shape[1:], row, itemsize)[0] >= STRIDED_RUN_MIN:
            fused[id(a)] = b
    return fused


def _gathers_in_place(shape, dim: int, itemsize: int) -> bool:
    """Whether an all-gather along ``dim`` of buffers of ``shape`` receives each member's chunk straight into its
    place in the result (:meth:`MpiBackend.all_gather`): where the dims before ``dim`` hold one element (the
    places are contiguous), or where each row of a chunk is a run of at least :data:`STRIDED_RUN_MIN` bytes."""
    return (math.prod(shape[:dim]) == 1
            or math.prod(shape) > 0 and math.prod(shape[dim:]) * itemsize >= STRIDED_RUN_MIN)


def _gathers_with_allgather(ctx: _Context, pre: int, nbytes: int) -> bool:
    """Whether an all-gather whose chunks arrive in place, ``pre`` elements before its dim, into a result of
    ``nbytes`` is MPI's ``Allgather`` (:meth:`MpiBackend._allgather`): contiguous places (``pre`` 1), a result
    under :data:`ALLGATHER_MAX_BYTES`, a node of at most :data:`ALLGATHER_RANKS_PER_CORE` ranks per core."""
    return pre == 1 and nbytes < ALLGATHER_MAX_BYTES and ctx.ranks_per_core <= ALLGATHER_RANKS_PER_CORE


def _needs_temp(program: P.Program, t: int) -> bool:
    """Whether instruction ``t`` of ``program`` allocates a temporary besides its result."""
    ins, shape = program.instructions[t], program.shapes[t]
    if isinstance(ins, P.Exchange):
        return True
    if isinstance(ins, P.AllGather):  # the gathered chunks, unless they arrive in place
        return not _gathers_in_place(shape, ins.dim, np.dtype(program.dtype).itemsize)
    return isinstance(ins, P.ReduceScatter)  # the received chunks


def _raw(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array's memory as bytes (any dtype, bf16 and bool included)."""
    return a.reshape(-1).view(np.uint8)


def _permuted(shape, perm) -> tuple:
    return tuple(shape[p] for p in perm)


def _c_strides(shape, itemsize: int) -> list[int]:
    """The byte strides of a C-contiguous array of ``shape``."""
    return [itemsize * math.prod(shape[d + 1:]) for d in range(len(shape))]


def _runs(shape, strides, itemsize: int) -> tuple[int, list[tuple[int, int]]]:
    """A view of ``shape`` and byte ``strides`` as runs: the length in bytes of its contiguous runs (the trailing
    dims whose strides continue one another, dims of size 1 skipped) and ``(count, stride)`` of each dim outside
    them, outermost first."""
    run, dims = itemsize, [(n, s) for n, s in zip(shape, strides) if n != 1]
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    return run, dims


_DATATYPES: OrderedDict = OrderedDict()  # (shape, strides) -> committed datatype, most recently used last
_DATATYPES_MAX = 256


def _place(base: np.ndarray, view: np.ndarray) -> list:
    """The mpi4py buffer of ``view``, a (strided) view into the C-contiguous ``base``: ``base``'s bytes from the
    view's first element, one element of a derived datatype (nested byte vectors, remembered by the view's
    shape and strides) that picks out the view's runs; a C-contiguous view's bytes as they are."""
    if view.flags.c_contiguous:
        return _message(view)
    key = (view.shape, view.strides)
    datatype = _DATATYPES.pop(key, None)
    if datatype is None:
        run, dims = _runs(view.shape, view.strides, view.itemsize)
        datatype = MPI.BYTE.Create_contiguous(run)
        for count, stride in reversed(dims):
            inner, datatype = datatype, datatype.Create_hvector(count, 1, stride)
            inner.Free()
        datatype.Commit()
        while len(_DATATYPES) >= _DATATYPES_MAX:  # a datatype freed while a transfer uses it stays valid for it
            _DATATYPES.popitem(last=False)[1].Free()
    _DATATYPES[key] = datatype
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return [_raw(base)[offset:], 1, datatype]


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


def _reduce_rows(rows, reduction: str, out: np.ndarray) -> None:
    """``out`` = the reduction of the equal-shaped ``rows``, in their order, in their dtype (as numpy's backend
    reduces: one elementwise ufunc pass per further row)."""
    op = REDUCERS[reduction]
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on NaN in a max or min, which propagates it, as wanted
        if len(rows) == 1:
            np.copyto(out, rows[0])
        else:
            op(rows[0], rows[1], out=out)
        for row in rows[2:]:
            op(out, row, out=out)


def _reduce_spec(a: np.ndarray, element):
    """``a``'s memory as elements of ``element`` (the count follows from the byte length)."""
    return [_raw(a), element]


# ---------------------------------------------------------------------------------------------- instructions
class MpiBackend(interpreter.Backend):
    """The state is this rank's :class:`_Buffer`; each method takes its array (so that an owned input dies
    as soon as it is used) and returns the next buffer. Every buffer is C-contiguous, except an all-to-all's
    result that a transpose unpacks (:func:`_unpackings`): that transpose makes it C-contiguous without a copy.
    Collectives run on ``channel``, nonblocking, completed by :meth:`_complete` (which first settles the
    ``verdict``, if one is in flight). The scratch buffer is handed out once per run of ``program``, to the
    instruction and for the role :func:`_scratch_use` names; the transposes that pack an all-to-all are
    :func:`_packings`."""

    def __init__(self, ctx: _Context, channel: Channel, program: P.Program, verdict: Verdict | None = None):
        self.ctx, self.ch = ctx, channel
        self.scratch_use, self.packings, self.unpackings = (
            channel.roles if channel.program is program else _roles(program))
        self.verdict = verdict

    def _complete(self, *requests) -> None:
        """Wait for ``requests``, the transfers of one instruction, already posted (:func:`_wait`, with the
        verdict if one is still in flight)."""
        verdict, self.verdict = self.verdict, None
        _wait(self.ctx, verdict, list(requests))

    def _allgather(self, sub, x: np.ndarray, out: np.ndarray) -> None:
        """MPI's ``Iallgather`` of ``x`` into ``out``, member ``j``'s buffer chunk ``j`` (contiguous arrays), over
        ``sub``, completed by :meth:`_complete`."""
        self._complete(sub.Iallgather(_message(x), _message(out)))

    def _exchange_rows(self, sub, k: int, send, recv) -> None:
        """A personalised exchange among the ``k`` members of ``sub`` (:func:`_post_rows`): ``send(j)`` to, and
        ``recv(j)`` from, every other member ``j``, in windows of at most :data:`WINDOW` shifts, each completed
        (:meth:`_complete`) before the next is posted."""
        me = sub.Get_rank()
        for lo in range(1, k, WINDOW):
            self._complete(*_post_rows(sub, me, k, range(lo, min(lo + WINDOW, k)), send, recv))

    def settle(self, pending: list) -> None:
        """Wait for the verdict, if one is in flight; raise :class:`Disagreement` if it goes against the call,
        leaving the ``pending`` requests (which may never complete, and the buffers they hold) to the
        context."""
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
        return _Buffer(buf.take().reshape(ins.shape), buf.owned, buf.scratch)

    def transpose(self, ins: P.Transpose, buf):
        """A C-contiguous copy of the transposed buffer; an owned input is dropped once the copy exists. Where
        the transpose only moves dims of size 1 the view is the result, held as its input was. Deferred rows
        (:class:`_Buffer`), each saving ``1/k`` of the copy: an input's deferred row is copied from where it is
        straight to its place in the result (the rows before it, it, and the rows after it, in three copies);
        packing an all-to-all's rows from the caller's buffer (:func:`_packings`), the row this rank keeps is
        left where the caller holds it, deferred in the result, for the all-to-all to copy once."""
        caller = not buf.writable
        x, row = buf.take_parts()
        view = np.transpose(x, ins.perm)
        if view.flags.c_contiguous:
            if row is not None:
                np.copyto(x[row[0]], row[1])
            return _Buffer(view, buf.owned, buf.scratch)
        y, scratch = self._array(ins, "result", view.shape, x.dtype)
        packing = self.packings.get(id(ins))
        if row is not None:
            j, a = row
            at = (slice(None),) * ins.perm.index(0)  # where the leading dim goes
            np.copyto(y[at + (slice(0, j),)], view[at + (slice(0, j),)])
            np.copyto(y[at + (j,)], np.transpose(a[None], ins.perm)[at + (0,)])
            np.copyto(y[at + (slice(j + 1, None),)], view[at + (slice(j + 1, None),)])
        elif packing is not None and caller:
            me = self.ch.mesh.group_index(self.ch.rank, packing)
            np.copyto(y[:me], view[:me])
            np.copyto(y[me + 1:], view[me + 1:])
            return _Buffer(y, not scratch, scratch, row=(me, view[me]))
        else:
            np.copyto(y, view)
        return _Buffer(y, not scratch, scratch)

    def slice(self, ins: P.Slice, buf):
        """Keep chunk ``r`` of ``k`` along ``dim`` (local; a copy, so the result is contiguous and ours)."""
        x = buf.take()
        k, r = self.ch.mesh.group_size(ins.axes), self.ch.mesh.group_index(self.ch.rank, ins.axes)
        n = x.shape[ins.dim] // k
        chunk = x[(slice(None),) * ins.dim + (slice(r * n, (r + 1) * n),)]
        y, scratch = self._array(ins, "result", chunk.shape, x.dtype)
        np.copyto(y, chunk)
        return _Buffer(y, not scratch, scratch)

    def all_gather(self, ins: P.AllGather, buf):
        """An all-gather (:func:`_post_rows`): member ``j``'s buffer becomes chunk ``j`` along ``dim``. Where the
        chunks' places in the result can take them (:func:`_gathers_in_place`: contiguous places, or strided
        ones of long enough runs) they arrive there (:func:`_place`), contiguous ones by MPI's ``Allgather``
        where :data:`ALLGATHER_RANKS_PER_CORE` and :data:`ALLGATHER_MAX_BYTES` say so (:meth:`_allgather`);
        else the other members' arrive as rows of a temporary with a leading member dim, which one copy per
        member interleaves into the result. This rank's own chunk is copied from its buffer (by MPI, in an
        ``Allgather``)."""
        x = buf.take()
        sub, k = self.ch.group(ins.axes)
        me = sub.Get_rank()
        shape = x.shape[: ins.dim] + (k * x.shape[ins.dim],) + x.shape[ins.dim + 1:]
        pre, chunk = math.prod(x.shape[: ins.dim]), math.prod(x.shape[ins.dim:])
        if _gathers_in_place(x.shape, ins.dim, x.dtype.itemsize):
            out, scratch = self._array(ins, "result", shape, x.dtype)
            if _gathers_with_allgather(self.ctx, pre, out.nbytes):
                self._allgather(sub, x, out)
            else:
                members = out.reshape(pre, k, chunk)
                self._exchange_rows(sub, k, lambda j: x, lambda j: _place(out, members[:, j]))
                np.copyto(members[:, me], x.reshape(pre, chunk))
            return _Buffer(out, not scratch, scratch)
        got, _ = self._array(ins, "temp", (k - 1,) + x.shape, x.dtype)
        self._exchange_rows(sub, k, lambda j: x, lambda j: got[j - (j > me)])
        out, scratch = self._array(ins, "result", shape, x.dtype)
        members, rows = out.reshape(pre, k, chunk), got.reshape(k - 1, pre, chunk)
        np.copyto(members[:, :me], rows[:me].swapaxes(0, 1))  # the members before this rank, in one pass
        np.copyto(members[:, me], x.reshape(pre, chunk))
        np.copyto(members[:, me + 1:], rows[me:].swapaxes(0, 1))
        return _Buffer(out, not scratch, scratch)

    def all_to_all(self, ins: P.AllToAll, buf):
        """An all-to-all of the leading dim's rows (:func:`_post_rows`), out of place: row ``j`` goes to member
        ``j``, and row ``j`` of the result comes from member ``j``. Where a transpose unpacks the result
        (:func:`_unpackings`: a pencil transpose), the rows arrive straight in their strided places in the
        transpose's result (:func:`_place`), and the result is that array seen before the transpose, so that
        the transpose has nothing left to copy. Otherwise this rank's own row is copied once the others are
        in; or, where it is in the caller's memory (alive anyway: the input is the caller's buffer, or a
        packing left the row there), not yet: the result defers it (:class:`_Buffer`), so that a transpose
        after it reads it from there, one copy of ``1/k`` of the data fewer; anything else copies it in when it
        takes the buffer."""
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
            y, scratch = self._array(unpacking, "result", _permuted(x.shape, unpacking.perm), x.dtype)
            places = np.transpose(y, np.argsort(unpacking.perm))  # y as the rows' array before the transpose
            self._exchange_rows(sub, k, lambda j: x[j], lambda j: _place(y, places[j]))
            np.copyto(places[me], own)
            return _Buffer(places, not scratch, scratch)
        out, scratch = self._array(ins, "result", x.shape, x.dtype)
        self._exchange_rows(sub, k, lambda j: x[j], lambda j: out[j])
        if caller or row is not None:
            return _Buffer(out, not scratch, scratch, row=(me, own))
        np.copyto(out[me], own)
        return _Buffer(out, not scratch, scratch)

    def reduce_scatter(self, ins: P.ReduceScatter, buf):
        """Group member ``j`` gets chunk ``j`` along ``dim`` of every other member's buffer (:func:`_post_rows`)
        and reduces the ``k`` chunks it then holds with numpy, in group order, straight into its result: the
        reduction numpy's backend computes, bit for bit. (MPICH's ``Reduce_scatter_block`` measured 1.1-4x
        slower here, 16-256 MiB per rank at -n 2 and 4: it reduces through a temporary it allocates per call,
        where the received chunks land in the scratch buffer.) The chunks go from the input itself where the
        dims before ``dim`` hold one element, else from a copy that brings them to the front (an owned input is
        dropped as soon as the copy exists). Where ``k`` does not divide the dim: :meth:`_reduce_scatter_counts`.
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
        _reduce_rows(rows, ins.reduction, out.reshape(-1))
        return _Buffer(out, not scratch, scratch)

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
        element, op = _reduce_op(send.dtype, ins.reduction)
        self._complete(sub.Ireduce_scatter(_reduce_spec(send, element), _reduce_spec(mine, element), counts, op))
        del send
        out = np.zeros((size,) + mine.shape[1:], dtype=mine.dtype)
        out[: len(mine)] = mine
        return _Buffer(np.ascontiguousarray(np.moveaxis(out, 0, ins.dim)), True)

    def keep_root(self, ins: P.KeepRoot, buf):
        """Local: rank 0 of the group keeps the buffer, the others make a zero buffer of its shape."""
        if self.ch.mesh.group_index(self.ch.rank, ins.axes) == 0:
            return buf
        x = buf.take()
        return _Buffer(np.zeros_like(x), True)

    def embed_chunk(self, ins: P.EmbedChunk, buf):
        """Local: a zero buffer ``k`` times longer along ``dim``, with this buffer as chunk ``r`` (its rank)."""
        x = buf.take()
        k, r = self.ch.mesh.group_size(ins.axes), self.ch.mesh.group_index(self.ch.rank, ins.axes)
        n = x.shape[ins.dim]
        shape = list(x.shape)
        shape[ins.dim] *= k
        out = np.zeros(shape, dtype=x.dtype)
        out[(slice(None),) * ins.dim + (slice(r * n, (r + 1) * n),)] = x
        return _Buffer(out, True)

    def all_reduce(self, ins: P.AllReduce, buf):
        """``Allreduce`` (by the instruction's reduction), in place when the buffer is ours."""
        x = buf.take()
        sub, _ = self.ch.group(ins.axes)
        element, op = _reduce_op(x.dtype, ins.reduction)
        if buf.writable:
            self._complete(sub.Iallreduce(MPI.IN_PLACE, _reduce_spec(x, element), op))
            return _Buffer(x, buf.owned, buf.scratch)
        out, scratch = self._array(ins, "result", x.shape, x.dtype)
        self._complete(sub.Iallreduce(_reduce_spec(x, element), _reduce_spec(out, element), op))
        return _Buffer(out, not scratch, scratch)

    def collective_permute(self, ins: P.CollectivePermute, buf):
        """One ``Sendrecv``: receive from this rank's source, send to the rank whose source is this one (each
        computed for this rank alone)."""
        me, mesh = self.ch.rank, self.ch.mesh
        source = ins.source_of(mesh, me)
        if source == me:
            return buf
        x = buf.take()
        out, scratch = self._array(ins, "result", x.shape, x.dtype)
        self._complete(self.ch.comm.Isendrecv(_message(x), ins.target_of(mesh, me), _TAG,
                                              _message(out), source, _TAG))
        return _Buffer(out, not scratch, scratch)

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
        me = self.ch.rank
        mine, outgoing, incoming, send_counts, recv_counts, send_at, recv_at = self.ch.layout(
            ins, x.shape, lambda: _exchange_layout(ins, self.ch.mesh, me, x.shape))
        if None in send_at:
            send, _ = self._array(ins, "temp", (sum(send_counts),), x.dtype)
            send_at = _offsets(send_counts)
            for cs, at in zip(outgoing, send_at):
                for c in cs:
                    send[at: at + math.prod(c.size)].reshape(c.size)[...] = x[c.src_box]
                    at += math.prod(c.size)
        else:
            send = x
        out = np.zeros(ins.shape, dtype=x.dtype)
        if None in recv_at:
            recv, recv_at = np.empty(sum(recv_counts), x.dtype), _offsets(recv_counts)
        else:
            recv = out
        size = x.dtype.itemsize
        self._complete(self.ch.comm.Ialltoallv(
            [_raw(send), ([k * size for k in send_counts], [a * size for a in send_at]), MPI.BYTE],
            [_raw(recv), ([k * size for k in recv_counts], [a * size for a in recv_at]), MPI.BYTE]))
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
        return _Buffer(out, True)


def _post_rows(sub, me: int, k: int, shifts, send, recv) -> list:
    """Post the transfers of a personalised exchange among the ``k`` members of ``sub`` (this rank is member
    ``me``) at the given ``shifts``: for each shift ``s``, a receive into ``recv(j)`` from member ``j = me − s``
    and a send of ``send(j)`` to member ``j = me + s`` (mod ``k``; arrays or buffers, :func:`_message`), all at
    once; returns the requests. Every member posting the same shifts makes each send meet its receive among
    them. (MPICH's ``Ialltoall`` and ``Iallgather`` pass the data in k - 1 dependent steps, each waiting for a
    peer to be scheduled: measured here, interleaved, at 16-64 MiB per rank, they took 1.2-1.8x as long as
    this at -n 4 and 2.8x at -n 8, and the same at -n 2.) A caller does its local copies after the transfers
    complete, not between posting and waiting: a rank busy copying answers no handshake, and measured at -n 2
    that cost up to 15% at 16 MiB."""
    return ([sub.Irecv(_message(recv((me - s) % k)), (me - s) % k, _TAG) for s in shifts]
            + [sub.Isend(_message(send((me + s) % k)), (me + s) % k, _TAG) for s in shifts])


def _message(a) -> list:
    """The mpi4py buffer of ``a``: a C-contiguous array as bytes (mpi4py reads the memory of any dtype given
    ``MPI.BYTE``, bf16 and bool included), or ``a`` itself if it is one already (:func:`_place`)."""
    return a if isinstance(a, list) else [a, MPI.BYTE]


def _exchange_layout(ins: P.Exchange, mesh: Mesh, me: int, shape) -> tuple:
    """What rank ``me`` sends and receives in ``ins`` from its buffer of ``shape``: its own copies; the copies
    it sends and receives, by rank; their element counts; and where each rank's run starts in the input and
    in the output (:func:`_run_offset`; None where the boxes are no contiguous run)."""
    mine = ins.copies(mesh, me)
    outgoing = [[] for _ in range(mesh.size)]
    for d, c in ins.copies_from(mesh, me):
        outgoing[d].append(c)
    incoming = [[c for c in mine if c.source == s] if s != me else [] for s in range(mesh.size)]
    return (mine, outgoing, incoming, [sum(math.prod(c.size) for c in cs) for cs in outgoing],
            [sum(math.prod(c.size) for c in cs) for cs in incoming],
            [_run_offset(cs, shape, "src_start") for cs in outgoing],
            [_run_offset(cs, ins.shape, "dst_start") for cs in incoming])


def _run_offset(copies, shape, start: str) -> int | None:
    """The flat index at which the boxes of ``copies`` (from their ``start`` field, ``"src_start"`` or
    ``"dst_start"``, and their ``size``) lie one after the other, in order, as one contiguous run of a
    C-contiguous array of ``shape``; None where they do not (0 for no elements)."""
    first = at = None
    for c in copies:
        if math.prod(c.size) == 0:
            continue
        outer = next((d for d, size in enumerate(c.size) if size != 1), len(shape))
        if tuple(c.size[outer + 1:]) != tuple(shape[outer + 1:]):
            return None  # not whole rows of the dims after the outermost one it spans
        offset = int(np.ravel_multi_index(getattr(c, start), shape))
        if at is not None and offset != at:
            return None
        first = offset if first is None else first
        at = offset + math.prod(c.size)
    return 0 if first is None else first


def _offsets(counts) -> list[int]:
    """Displacements of blocks of ``counts`` packed one after the other."""
    return [0] + list(itertools.accumulate(counts))[:-1]
