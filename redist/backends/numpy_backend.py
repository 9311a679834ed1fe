"""The reference interpreter: all devices' buffers in one process, one numpy array per device id (``None`` at the
numbers that are no device of the mesh); it also runs the stages of a plan across meshes."""

from __future__ import annotations

import numpy as np

from redist import program as P
from redist.backends import interpreter
from redist.buffers import mesh_buffers
from redist.mesh import Mesh
from redist.types import REDUCERS


def run(program: P.Program, shards) -> list[np.ndarray | None]:
    """Execute ``program`` on per-device buffers (index = device id); returns the new buffers.

    ``shards`` are taken by :func:`redist.buffers.mesh_buffers` (a list indexed by device id: one buffer per
    device of the program's mesh, of ``program.shapes[0]``, of ``program.dtype`` or one that converts without
    loss, ``None`` at the numbers that are no device of it; else :class:`~redist.errors.ShardingError`, as for
    a ``program`` that is no :class:`~redist.program.Program` or whose buffers have more dims than numpy holds,
    :func:`~redist.backends.interpreter.check_numpy_rank`). The program runs on copies: the results are new
    arrays, never the caller's (not even for devices whose buffer stays put), and the caller's arrays are never
    written to.
    """
    return run_stages((program,), shards)


def run_stages(stages, shards) -> list[np.ndarray | None]:
    """Execute a plan's stages (:attr:`redist.Plan.stages`: programs on meshes and the transfers between them)
    on per-device buffers of the first stage's mesh, as :func:`run` runs one program; returns the buffers of
    the last stage's mesh (a list indexed by device id up to its ``id_bound``, ``None`` at the numbers that are
    no device of it)."""
    interpreter.check_stages(stages, "the numpy backend")
    for stage in stages:
        if isinstance(stage, P.Program):
            interpreter.check_numpy_rank(stage, "the numpy backend")
    first = stages[0]  # a program: the stages begin and end with one (lower_stages)
    bufs = mesh_buffers(shards, first.src_mesh, first.shapes[0], first.dtype, copy=True)
    for stage in stages:
        if isinstance(stage, P.Transfer):
            bufs = _transfer(stage, bufs)
        else:
            bufs = interpreter.run(stage, NumpyBackend(stage.mesh), bufs)
    return bufs


def _transfer(stage: P.Transfer, bufs) -> list[np.ndarray | None]:
    """The buffers after a transfer: each device of ``stage.mesh`` assembles its new buffer from its copies
    (zeros where none writes); every other number holds None."""
    dtype = next(b.dtype for b in bufs if b is not None)
    out: list[np.ndarray | None] = [None] * stage.mesh.id_bound
    for d in stage.mesh.devices:
        new = np.zeros(stage.shape, dtype)
        for c in stage.copies.copies[d]:
            new[c.dst_box] = bufs[c.source][c.src_box]
        out[d] = new
    return out


class NumpyBackend(interpreter.Backend):
    """The state is the list of every device's buffer, by device id; collectives loop over the groups of
    ``mesh`` (:meth:`redist.mesh.Mesh.groups`, members in rank order). Reductions are numpy's elementwise
    ufuncs (:data:`redist.types.REDUCERS`), in rank order: of ``bool`` buffers the sum and the maximum are
    the logical or, the minimum and the product the logical and, as numpy computes them; the maximum and
    minimum propagate NaN."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh

    def reshape(self, ins: P.Reshape, bufs):
        return [None if x is None else x.reshape(ins.shape) for x in bufs]

    def transpose(self, ins: P.Transpose, bufs):
        return [None if x is None else np.ascontiguousarray(np.transpose(x, ins.perm)) for x in bufs]

    def slice(self, ins: P.Slice, bufs):
        out = list(bufs)
        for group in self.mesh.groups(ins.axes):
            for r, d in enumerate(group):
                out[d] = np.split(bufs[d], len(group), axis=ins.dim)[r].copy()
        return out

    def all_gather(self, ins: P.AllGather, bufs):
        out = list(bufs)
        for group in self.mesh.groups(ins.axes):
            full = np.concatenate([bufs[d] for d in group], axis=ins.dim)
            for d in group:
                out[d] = full.copy()
        return out

    def all_to_all(self, ins: P.AllToAll, bufs):
        out = list(bufs)
        for group in self.mesh.groups(ins.axes):
            for r, d in enumerate(group):
                out[d] = np.stack([bufs[s][r] for s in group])
        return out

    def reduce_scatter(self, ins: P.ReduceScatter, bufs):
        out = list(bufs)
        for group in self.mesh.groups(ins.axes):
            total = _reduce([bufs[d] for d in group], ins.reduction)
            for r, d in enumerate(group):
                out[d] = _chunk(total, ins.dim, len(group), r)
        return out

    def all_reduce(self, ins: P.AllReduce, bufs):
        out = list(bufs)
        for group in self.mesh.groups(ins.axes):
            total = _reduce([bufs[d] for d in group], ins.reduction)
            for d in group:
                out[d] = total.copy()
        return out

    def keep_root(self, ins: P.KeepRoot, bufs):
        out = list(bufs)
        for group in self.mesh.groups(ins.axes):
            for d in group[1:]:
                out[d] = np.zeros_like(bufs[d])
        return out

    def embed_chunk(self, ins: P.EmbedChunk, bufs):
        out = list(bufs)
        for group in self.mesh.groups(ins.axes):
            for r, d in enumerate(group):
                x = bufs[d]
                shape = list(x.shape)
                n, shape[ins.dim] = shape[ins.dim], shape[ins.dim] * len(group)
                new = np.zeros(shape, x.dtype)
                new[(slice(None),) * ins.dim + (slice(r * n, (r + 1) * n),)] = x
                out[d] = new
        return out

    def collective_permute(self, ins: P.CollectivePermute, bufs):
        return [bufs[s].copy() if s != d else bufs[d] for d, s in enumerate(ins.source_table(self.mesh))]

    def exchange(self, ins: P.Exchange, bufs):
        out = list(bufs)
        for d in self.mesh.devices:
            new = np.zeros(ins.shape, bufs[d].dtype)
            for c in ins.copies(self.mesh, d):
                new[c.dst_box] = bufs[c.source][c.src_box]
            out[d] = new
        return out


def _chunk(x: np.ndarray, dim: int, k: int, r: int) -> np.ndarray:
    """Chunk ``r`` of ``k`` of ``x`` along ``dim`` by the padding rule: ``L = ceil(n / k)`` elements from
    ``min(n, r·L)`` (fewer at the end, then zeros), as a new array."""
    n = x.shape[dim]
    size = -(-n // k)
    lo, hi = min(n, r * size), min(n, (r + 1) * size)
    shape = list(x.shape)
    shape[dim] = size
    out = np.zeros(shape, x.dtype)
    out[(slice(None),) * dim + (slice(0, hi - lo),)] = x[(slice(None),) * dim + (slice(lo, hi),)]
    return out


def _reduce(xs, reduction: str):
    """The reduction of the buffers ``xs``, in their order, in their dtype."""
    op = REDUCERS[reduction]
    total = xs[0].copy()
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on NaN in a max or min, which propagates it, as wanted
        for x in xs[1:]:
            total = op(total, x)
    return total.astype(xs[0].dtype)
