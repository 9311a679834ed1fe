"""Where an MPI rank's data lands: what the MPI backend works out about a buffer program before running it.

Pure functions of the program (no MPI), so that a channel made for a program works them out once
(:class:`redist.backends.mpi_channels.Channel`) and :class:`redist.backends.mpi_backend.MpiBackend` reads them:

- the scratch buffer (:func:`scratch_use`): in a program of one data-moving instruction (besides reshapes)
  that instruction's temporary lives there, in a program of two the first one's result when the second
  needs no temporary (memory: :mod:`redist.backends.mpi_backend`);
- all-to-all rows: a ``Transpose`` right before an ``AllToAll`` packs its rows (:func:`packings`: the row this
  rank keeps is left where the caller holds it), one right after unpacks them (:func:`unpackings`: the rows
  arrive straight in their places in the transpose's result where those places' contiguous runs hold at
  least :data:`STRIDED_RUN_MIN` bytes);
- all-gathers: whether the chunks arrive straight in their places in the result (:func:`gathers_in_place`),
  and whether by MPI's ``Allgather`` (:func:`gathers_with_allgather`, :data:`ALLGATHER_RANKS_PER_CORE`,
  :data:`ALLGATHER_MAX_BYTES`);
- an ``Exchange``: what this rank sends and receives, and where in its buffers (:func:`exchange_layout`); a
  ``Transfer`` between meshes likewise (:func:`transfer_layout`);
- array geometry shared with the transfers: a view as contiguous runs (:func:`runs`), C strides
  (:func:`c_strides`), a permuted shape (:func:`permuted`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from redist import program as P
from redist.mesh import Mesh

__all__ = ["STRIDED_RUN_MIN", "ALLGATHER_RANKS_PER_CORE", "ALLGATHER_MAX_BYTES", "roles", "scratch_use", "packings",
           "unpackings", "gathers_in_place", "gathers_with_allgather", "exchange_layout", "TransferLayout",
           "transfer_layout", "offsets", "runs", "c_strides", "permuted"]

# A receive whose place in its destination is strided (an all-gather's chunk in each row of the result, a pencil
# transpose's received row in the unpacked result) lands there directly, described by an MPI derived datatype,
# where the place's contiguous runs hold at least this many bytes; shorter runs arrive packed and numpy moves them:
# a receive described by a datatype saves the unpacking copy, but for short runs costs more than that copy. Sends
# stay packed: a send described by a datatype is no faster than packing at any run length, and mostly slower.
# bench/mpi_datatypes.py measures both (bench/results/mpi_datatypes_n*.json).
STRIDED_RUN_MIN = 1024
# An all-gather whose chunks' places in the result are contiguous is MPI's ``Iallgather`` (for large messages MPICH
# passes the chunks around a ring: k - 1 steps, each sending the chunk received last to the next member) where the
# node runs at most ALLGATHER_RANKS_PER_CORE ranks per core and the result is smaller than ALLGATHER_MAX_BYTES;
# elsewhere it posts every transfer at once (mpi_transfers.post_rows). glibc maps an allocation of 32 MiB or more
# afresh from the system, so such a result's pages are new on every call, and receiving every chunk at once overlaps
# their faults; a smaller result reuses mapped pages, and there the ring is the faster.
# With more ranks per core, each step of the ring waits for a neighbour to be scheduled, and posting at once is
# faster. The ring runs inside MPI, in one call, so that ranks sharing a core do not come back to Python between its
# steps; and ``Iallgather`` is posted before the verdict is waited for, so that the two travel together rather than
# the verdict being one more point at which all ranks must be scheduled. bench/mpi.py's ``gather`` case times it
# against the hand-written ``Allgather`` (bench/results/mpi.json).
ALLGATHER_RANKS_PER_CORE = 2
ALLGATHER_MAX_BYTES = 32 * 2**20


def roles(program: P.Program) -> tuple:
    """``(scratch use, packings, unpackings)`` of ``program`` (:func:`scratch_use`, :func:`packings`,
    :func:`unpackings`): what :class:`~redist.backends.mpi_backend.MpiBackend` works out about a program before
    running it."""
    return scratch_use(program), packings(program), unpackings(program)


def scratch_use(program: P.Program):
    """``(instruction, role)``: which instruction may use the scratch buffer in ``program``, and for what
    (``"temp"``: its temporary, ``"result"``: its result), or None (module docstring, memory)."""
    moving = [t for t, ins in enumerate(program.instructions) if not isinstance(ins, P.Reshape)]
    if len(moving) == 1:
        return program.instructions[moving[0]], "temp"
    if len(moving) == 2 and not _needs_temp(program, moving[1]):
        return program.instructions[moving[0]], "result"
    return None


def packings(program: P.Program) -> dict:
    """``{id(transpose): axes}`` for every ``Transpose`` that ``program`` runs right before an ``AllToAll`` over
    ``axes``: it packs that all-to-all's rows, and the row this rank keeps need not be packed
    (:meth:`~redist.backends.mpi_backend.MpiBackend.transpose`)."""
    ins = program.instructions
    return {id(a): b.axes for a, b in zip(ins, ins[1:]) if isinstance(a, P.Transpose) and isinstance(b, P.AllToAll)}


def unpackings(program: P.Program) -> dict:
    """``{id(all_to_all): transpose}`` for every ``AllToAll`` (listed once in ``program``) that ``program`` runs
    right before a ``Transpose`` (which unpacks its rows), where the places of the received rows in the
    transpose's result are runs of at least :data:`STRIDED_RUN_MIN` bytes: the rows arrive there directly
    (:meth:`~redist.backends.mpi_backend.MpiBackend.all_to_all`)."""
    ins, itemsize = program.instructions, np.dtype(program.dtype).itemsize
    fused = {}
    for t, (a, b) in enumerate(zip(ins, ins[1:])):
        if not (isinstance(a, P.AllToAll) and isinstance(b, P.Transpose)) or sum(i is a for i in ins) > 1:
            continue
        shape = program.shapes[t]
        strides = c_strides(permuted(shape, b.perm), itemsize)
        row = [strides[b.perm.index(d)] for d in range(1, len(shape))]  # the strides of a row's place
        if math.prod(shape) and runs(shape[1:], row, itemsize)[0] >= STRIDED_RUN_MIN:
            fused[id(a)] = b
    return fused


def gathers_in_place(shape, dim: int, itemsize: int) -> bool:
    """Whether an all-gather along ``dim`` of buffers of ``shape`` receives each member's chunk straight into its
    place in the result (:meth:`~redist.backends.mpi_backend.MpiBackend.all_gather`): where the dims before
    ``dim`` hold one element (the places are contiguous), or where each row of a chunk is a run of at least
    :data:`STRIDED_RUN_MIN` bytes."""
    return (math.prod(shape[:dim]) == 1
            or math.prod(shape) > 0 and math.prod(shape[dim:]) * itemsize >= STRIDED_RUN_MIN)


def gathers_with_allgather(ranks_per_core: float, pre: int, nbytes: int) -> bool:
    """Whether an all-gather whose chunks arrive in place, ``pre`` elements before its dim, into a result of
    ``nbytes`` on a node of ``ranks_per_core`` ranks per core (:class:`~redist.backends.mpi_channels.Context`)
    is MPI's ``Allgather`` (:meth:`~redist.backends.mpi_backend.MpiBackend._allgather`): contiguous places
    (``pre`` 1), a result under :data:`ALLGATHER_MAX_BYTES`, a node of at most :data:`ALLGATHER_RANKS_PER_CORE`
    ranks per core."""
    return pre == 1 and nbytes < ALLGATHER_MAX_BYTES and ranks_per_core <= ALLGATHER_RANKS_PER_CORE


def _needs_temp(program: P.Program, t: int) -> bool:
    """Whether instruction ``t`` of ``program`` allocates a temporary besides its result."""
    ins, shape = program.instructions[t], program.shapes[t]
    if isinstance(ins, P.Exchange):
        return True
    if isinstance(ins, P.AllGather):  # the gathered chunks, unless they arrive in place
        return not gathers_in_place(shape, ins.dim, np.dtype(program.dtype).itemsize)
    return isinstance(ins, P.ReduceScatter)  # the received chunks


def permuted(shape, perm) -> tuple:
    return tuple(shape[p] for p in perm)


def c_strides(shape, itemsize: int) -> list[int]:
    """The byte strides of a C-contiguous array of ``shape``."""
    return [itemsize * math.prod(shape[d + 1:]) for d in range(len(shape))]


def runs(shape, strides, itemsize: int) -> tuple[int, list[tuple[int, int]]]:
    """A view of ``shape`` and byte ``strides`` as runs: the length in bytes of its contiguous runs (the trailing
    dims whose strides continue one another, dims of size 1 skipped) and ``(count, stride)`` of each dim outside
    them, outermost first."""
    run, dims = itemsize, [(n, s) for n, s in zip(shape, strides) if n != 1]
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    return run, dims


def exchange_layout(ins: P.Exchange, mesh: Mesh, me: int, shape) -> tuple:
    """What device ``me`` sends and receives in ``ins`` from its buffer of ``shape``: its own copies; the copies
    it sends and receives, by rank in the mesh's communicator (the order of the device ids,
    :class:`~redist.backends.mpi_channels.Channel`); their element counts; and where each rank's run starts in
    the input and in the output (:func:`_run_offset`; None where the boxes are no contiguous run)."""
    mine = ins.copies(mesh, me)
    devices = mesh.devices
    outgoing = [[] for _ in devices]
    for d, c in ins.copies_from(mesh, me):
        outgoing[devices.index(d)].append(c)
    incoming = [[c for c in mine if c.source == s] if s != me else [] for s in devices]
    return (mine, outgoing, incoming, [sum(math.prod(c.size) for c in cs) for cs in outgoing],
            [sum(math.prod(c.size) for c in cs) for cs in incoming],
            [_run_offset(cs, shape, "src_start") for cs in outgoing],
            [_run_offset(cs, ins.shape, "dst_start") for cs in incoming])


@dataclass(frozen=True)
class TransferLayout:
    """One rank's part of a :class:`~redist.program.Transfer` (:func:`transfer_layout`). ``shape``: its new
    buffer's, None where the rank is no device of the destination's mesh; ``zero``: whether some of that buffer
    is written by no copy (padding, or pending sums created), and starts as zeros. ``receives``: ``(source, box,
    staged)`` for each copy from another device, in the order of its copies (a source's copies arrive in the
    order it sends them), ``box`` its place in the new buffer, ``staged`` where that place's contiguous runs are
    shorter than :data:`STRIDED_RUN_MIN` bytes (the piece arrives packed and is copied into place; else straight
    into place, :func:`~redist.backends.mpi_transfers.place`); ``sends``: ``(receiver, box)`` for each copy from
    this rank to another, by receiver, each receiver's in the order of its copies; ``local``: ``(box in the old
    buffer, box in the new)`` for each copy within the rank."""

    shape: tuple[int, ...] | None
    zero: bool
    receives: tuple[tuple[int, tuple[slice, ...], bool], ...]
    sends: tuple[tuple[int, tuple[slice, ...]], ...]
    local: tuple[tuple[tuple[slice, ...], tuple[slice, ...]], ...]


def transfer_layout(stage: P.Transfer, me: int, itemsize: int) -> TransferLayout:
    """Device ``me``'s part of the transfer ``stage`` (buffers of ``itemsize`` bytes an element): what it receives,
    sends and copies within itself (:class:`TransferLayout`), from the copy table (a pass over it: made once
    per agreed plan)."""
    table = stage.copies.copies
    mine = [c for c in table[me] if math.prod(c.size)] if stage.mesh.has_device(me) else []
    strides = c_strides(stage.shape, itemsize)
    receives = tuple((c.source, _view(c.dst_box), _short_runs(c.size, strides, itemsize)) for c in mine
                     if c.source != me)
    sends = tuple((d, _view(c.src_box)) for d in stage.mesh.devices if d != me for c in table[d]
                  if c.source == me and math.prod(c.size))
    covered = sum(math.prod(c.size) for c in mine)
    return TransferLayout(tuple(stage.shape) if stage.mesh.has_device(me) else None,
                          covered != math.prod(stage.shape), receives, sends,
                          tuple((_view(c.src_box), _view(c.dst_box)) for c in mine if c.source == me))


def _view(box: tuple) -> tuple:
    """An index of the box that makes a view, also of a buffer of rank 0 (where ``()`` would read its scalar)."""
    return box + (Ellipsis,)


def _short_runs(size, strides, itemsize: int) -> bool:
    """Whether a box of ``size`` in a C-contiguous array of byte ``strides`` is a strided place whose contiguous
    runs are shorter than :data:`STRIDED_RUN_MIN` bytes (a contiguous box never is)."""
    run, dims = runs(size, strides, itemsize)
    return bool(dims) and run < STRIDED_RUN_MIN


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
        offset = _flat_index(getattr(c, start), shape)
        if at is not None and offset != at:
            return None
        first = offset if first is None else first
        at = offset + math.prod(c.size)
    return 0 if first is None else first


def _flat_index(index, shape) -> int:
    """The row-major flat index of ``index`` in an array of ``shape`` (``np.ravel_multi_index``, which takes
    fewer dims than numpy's largest rank)."""
    flat = 0
    for i, n in zip(index, shape):
        flat = flat * n + i
    return flat


def offsets(counts) -> list[int]:
    """Displacements of blocks of ``counts`` packed one after the other."""
    return [0] + list(itertools.accumulate(counts))[:-1]
