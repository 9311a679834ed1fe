"""The reference interpreter: all devices' buffers in one process, one numpy array per device id."""

from __future__ import annotations

import numpy as np

from redist import program as P
from redist.buffers import device_buffers
from redist.errors import ShardingError


def _chunks(x, dim, k):
    n = x.shape[dim]
    if n % k:
        raise ShardingError(f"cannot split a local dim of size {n} into {k} equal chunks")
    return np.split(x, k, axis=dim)


def run(program: P.Program, shards) -> list[np.ndarray]:
    """Execute ``program`` on per-device buffers (index = device id); returns the new buffers.

    ``shards`` are taken by :func:`redist.buffers.device_buffers` (one per device, of ``program.shapes[0]``,
    of ``program.dtype`` or one that converts without loss; else :class:`ShardingError`). The program runs on
    copies: the results are new arrays, never the caller's (not even for devices whose buffer stays put),
    and the caller's arrays are never written to.
    """
    mesh = program.mesh
    bufs = device_buffers(shards, mesh.size, program.shapes[0], program.dtype, copy=True)
    for ins in program.instructions:
        bufs = _step(mesh, ins, bufs)
    return bufs


def _step(mesh, ins, bufs):
    out = list(bufs)
    if isinstance(ins, P.Reshape):
        return [x.reshape(ins.shape) for x in bufs]
    if isinstance(ins, P.Transpose):
        return [np.ascontiguousarray(np.transpose(x, ins.perm)) for x in bufs]
    if isinstance(ins, P.CollectivePermute):
        return [bufs[s].copy() if s != d else bufs[d] for d, s in enumerate(ins.sources)]
    if isinstance(ins, P.Exchange):
        return [_assemble(ins.shape, copies, bufs) for copies in ins.copies]
    for group in mesh.groups(ins.axes):
        k = len(group)
        xs = [bufs[d] for d in group]
        if isinstance(ins, P.Slice):
            for r, d in enumerate(group):
                out[d] = _chunks(xs[r], ins.dim, k)[r].copy()
        elif isinstance(ins, P.AllGather):
            full = np.concatenate(xs, axis=ins.dim)
            for d in group:
                out[d] = full.copy()
        elif isinstance(ins, P.AllToAll):
            pieces = [_chunks(x, ins.split_dim, k) for x in xs]
            for r, d in enumerate(group):
                out[d] = np.concatenate([pieces[src][r] for src in range(k)], axis=ins.concat_dim)
        elif isinstance(ins, P.ReduceScatter):
            total = _sum(xs)
            for r, d in enumerate(group):
                out[d] = _chunks(total, ins.dim, k)[r].copy()
        elif isinstance(ins, P.AllReduce):
            total = _sum(xs)
            for d in group:
                out[d] = total.copy()
        else:
            raise TypeError(f"unknown instruction {ins!r}")
    return out


def _assemble(shape, copies, bufs):
    out = np.zeros(shape, bufs[0].dtype)
    for c in copies:
        out[c.dst_box] = bufs[c.source][c.src_box]
    return out


def _sum(xs):
    total = xs[0].copy()
    for x in xs[1:]:
        total = total + x
    return total.astype(xs[0].dtype)
