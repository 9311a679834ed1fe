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
- an ``Exchange``: what this rank sends and receives, and where in its buffers (:func:`exchange_layout`);
- array geometry shared with the transfers: a view as contiguous runs (:func:`runs`), C strides
  (:func:`c_strides`), a permuted shape (:func:`permuted`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from redist import program as P
from redist.mesh import Mesh

__all__ = ["STRIDED_RUN_MIN", "ALLGATHER_RANKS_PER_CORE", "ALLGATHER_MAX_BYTES", "roles", "scratch_use", "packings",
           "unpackings", "gathers_in_place", "gathers_with_allgather", "exchange_layout", "offsets", "runs",
           "c_strides", "permuted"]

# A receive whose place in its destination is strided (an all-gather's chunk in each row of the result, a pencil
# transpose's received row in the unpacked result) lands there directly, described by an MPI derived datatype,
# where the place's contiguous runs hold at least this many bytes; shorter runs arrive packed and numpy moves them.
# Measured here (bench/mpi_datatypes.py, 16 MiB per rank, -n 2 and 4, three runs, bench/results/mpi_datatypes_n*):
# the direct receive took 0.64-0.92x the packed receive's time at runs of 1-16 KiB, 0.84-1.64x at 512 bytes and
# 1.4-3x at 32-128 bytes. Sends stay packed: a send described by a datatype (a slab transpose's rows, 1-4 KiB
# runs) took 0.97-3.9x the packed send's time, and 2.4x at 64 MiB per rank.
STRIDED_RUN_MIN = 1024
# An all-gather whose chunks' places in the result are contiguous is MPI's ``Iallgather`` (for large messages MPICH
# passes the chunks around a ring: k - 1 steps, each sending the chunk received last to the next member) where the
# node runs at most ALLGATHER_RANKS_PER_CORE ranks per core and the result is smaller than ALLGATHER_MAX_BYTES;
# elsewhere it posts every transfer at once (mpi_transfers.post_rows). glibc maps an allocation of 32 MiB or more
# afresh from the system, so such a result's pages are new on every call, and receiving every chunk at once overlaps
# their faults; a smaller result reuses mapped pages. Measured here (2 cores, 16-64 MiB per rank, medians of paired
# rounds against ``Allgather``): with the result's pages mapped, a ring took 1.00-1.02x the ``Allgather``'s time at
# -n 2 and 4 and posting at once 1.03-1.23x; with fresh pages, the ring 1.00-1.01x and posting at once 0.69-0.87x; at
# -n 8 (4 ranks per core), where each step of the ring waits for a neighbour to be scheduled, the ring 1.01x and
# posting at once 0.86-0.90x with mapped pages, 0.50-0.64x with fresh ones. The ring was first stepped from Python,
# each step's transfers posted and completed in turn; MPI's blocking ``Allgather`` after the verdict, in one call,
# measured 3-5% faster than that (whole ``reshard`` calls, 16 MiB results, paired medians against the hand-written
# ``Allgather``: -n 4 1.04-1.09x against 1.07-1.11x, -n 2 1.06x against 1.09-1.10x), as the ranks sharing a core no
# longer come back to Python between steps; and ``Iallgather`` posted before the verdict is waited for, so that the
# two travel together, as fast as that at -n 2 and 0.3-7% faster in five paired comparisons at -n 4 (medians of
# 200-300 rounds: 1.05-1.09x against 1.07-1.17x), where ranks sharing a core made the verdict one more point at which
# all must be scheduled.
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
