"""A plan's stages on JAX devices, eagerly: every device's buffer a JAX array on that device, each program run on
its mesh's devices and each transfer between meshes run as copies from device to device, never through the host.

A plan across meshes (docs/spec.md §3: steps on the source's mesh, a transfer, steps on the destination's mesh)
lowers to stages (:attr:`redist.Plan.stages`): programs, each on one mesh, and the
:class:`~redist.program.Transfer` s between them. Here

- a program runs as one jitted ``jax.shard_map`` over the JAX mesh of its redist mesh, the buffers the rows of one
  array that stays where they are (:func:`~redist.backends.jax_backend.run_on_devices`); a program of no
  instructions is no call;
- a transfer runs as copies between devices (:func:`_transfer`): every source device cuts the pieces it sends
  out of its buffer (one jitted call per device for all its pieces; a whole buffer goes as it is),
  ``jax.device_put`` copies them to their receivers (one call for all of them, device to device), and every
  receiver assembles its new buffer from the pieces it received and the ones it holds itself (one jitted call per
  device, zeros where no copy writes: padding, or pending sums created); a buffer that is one piece received
  whole is that piece.

Every result is a new buffer: none aliases an input's, so that deleting or donating the input afterwards cannot
touch the result. JAX compiles a computation for one set of devices, so a move between meshes of other devices
is no single jitted program: its calls are dispatched eagerly, stage after stage, and run asynchronously.

Devices: ``devices`` maps a redist device id ``d`` to its JAX device
(:func:`~redist.backends.jax_backend.jax_devices`: by default the JAX device whose ``id`` is ``d``). Entry points:
:func:`run_stages` (JAX arrays on their devices, behind :func:`redist.jax.reshard` between two meshes) and
:func:`execute_stages` (numpy buffers, behind ``redist.execute(plan, shards, backend="jax")``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from redist.extras import missing_extra

try:
    import jax
    import jax.numpy as jnp
    from jax import lax
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.jax", "jax") from e

from redist import program as P
from redist.backends import interpreter
from redist.backends.jax_backend import in_dtype, jax_devices, jax_mesh_of, run_on_devices, without_context_mesh
from redist.buffers import mesh_buffers

__all__ = ["run_stages", "execute_stages", "result_mesh", "clear_cache"]


def result_mesh(stage):
    """The mesh whose devices hold a stage's results: a program's ``dst_mesh``, a transfer's ``mesh``."""
    return stage.mesh if isinstance(stage, P.Transfer) else stage.dst_mesh


def execute_stages(stages, shards, devices=None) -> list[np.ndarray | None]:
    """``stages`` run on per-device numpy buffers, as :func:`redist.execute` takes them (a list indexed by device
    id for the first stage's mesh, taken by :func:`redist.buffers.mesh_buffers`): each placed on its JAX device,
    then :func:`run_stages`; returns new numpy arrays in a list indexed by device id for the last stage's mesh
    (``None`` at the numbers that are no device of it). Raises :class:`~redist.errors.ShardingError` for stages
    that are not well formed (:func:`~redist.backends.interpreter.check_stages`), shards that do not fit, or a
    device JAX lacks."""
    interpreter.check_stages(stages, "the JAX backend")
    first, last = stages[0], result_mesh(stages[-1])
    shape_out = stages[-1].shapes[-1] if isinstance(stages[-1], P.Program) else stages[-1].shape
    bufs = mesh_buffers(shards, first.src_mesh, first.shapes[0], first.dtype)
    out: list[np.ndarray | None] = [None] * last.id_bound
    if math.prod(first.shapes[0]) == 0:  # an array of no elements: nothing moves (and JAX reads no empty shard)
        for d in last.devices:
            out[d] = np.zeros(shape_out, first.dtype)
        return out
    table = jax_devices(first.src_mesh, devices)
    with in_dtype(first.dtype):
        placed = [None] * first.src_mesh.id_bound
        for d in first.src_mesh.devices:
            placed[d] = jax.device_put(bufs[d], table[d])
        for d, y in enumerate(run_stages(stages, placed, devices)):
            if y is not None:
                out[d] = np.array(y)
    return out


def run_stages(stages, buffers, devices=None) -> list:
    """``stages`` (a plan's, :attr:`redist.Plan.stages`, checked) run on ``buffers``: a list indexed by device id,
    at each device of the first stage's mesh a JAX array of its input shape on that device (``None`` elsewhere);
    returns such a list of new arrays for the last stage's mesh. The buffers hold elements (an empty array moves
    nothing: the caller makes its result). Call it under :func:`~redist.backends.jax_backend.in_dtype` of the
    stages' dtype."""
    bufs = {d: buffers[d] for d in stages[0].src_mesh.devices}
    fresh = False
    with without_context_mesh():
        for stage in stages:
            if isinstance(stage, P.Transfer):
                bufs, fresh = _transfer(stage, bufs, jax_devices(stage.mesh, devices)), True
            elif stage.instructions:
                bufs, fresh = run_on_devices(stage, bufs, jax_mesh_of(stage.mesh, devices)), True
        last = result_mesh(stages[-1])
        out = [None] * last.id_bound
        for d in last.devices:
            out[d] = bufs[d] if fresh else jnp.array(bufs[d], copy=True)
    return out


def _transfer(stage: P.Transfer, bufs: dict, table: dict) -> dict:
    """The buffers of ``stage.mesh``'s devices after the transfer ``stage``, from ``bufs`` (by device id, on the
    devices of ``stage.src_mesh``); ``table`` gives the JAX device of each receiver. See the module header."""
    copies = stage.copies.copies
    outgoing: dict[int, list[tuple[int, int, object]]] = {}  # source -> (receiver, copy index, copy)
    for d in stage.mesh.devices:
        for i, c in enumerate(copies[d]):
            if c.source != d and math.prod(c.size):
                outgoing.setdefault(c.source, []).append((d, i, c))
    pieces, targets, slots = [], [], []
    for s, sent in outgoing.items():
        x = bufs[s]
        cut = [c for _, _, c in sent if not _whole(c, x.shape)]
        cuts = iter(_cutter(tuple(x.shape), tuple((c.src_start, c.size) for c in cut))(x) if cut else ())
        for d, i, c in sent:
            pieces.append(x if _whole(c, x.shape) else next(cuts))
            targets.append(table[d])
            slots.append((d, i))
    received = dict(zip(slots, jax.device_put(pieces, targets))) if pieces else {}
    dtype = next(iter(bufs.values())).dtype
    shape = tuple(stage.shape)
    out = {}
    for d in stage.mesh.devices:
        mine = [(i, c) for i, c in enumerate(copies[d]) if math.prod(c.size)]
        if len(mine) == 1 and mine[0][1].source != d and _whole(mine[0][1], shape):
            out[d] = received[(d, mine[0][0])]  # one piece, the whole buffer: a new array already
            continue
        if not mine:  # a member of a group whose pending sum another member takes whole: zeros
            out[d] = _zeros(shape, np.dtype(dtype), table[d])()
            continue
        local = tuple((c.src_start, c.dst_start, c.size) for _, c in mine if c.source == d)
        arrived = tuple((c.dst_start, c.size) for _, c in mine if c.source != d)
        args = ([bufs[d]] if local else []) + [received[(d, i)] for i, c in mine if c.source != d]
        out[d] = _assembler(shape, np.dtype(dtype), local, arrived)(*args)
    return out


def _whole(c, shape) -> bool:
    """Whether the copy ``c`` spans a whole buffer of ``shape`` (on its side: from it, or into it)."""
    return tuple(c.size) == tuple(shape)


@lru_cache(maxsize=1024)
def _cutter(shape: tuple, boxes: tuple):
    """A jitted function cutting the boxes ``(start, size)`` out of a buffer of ``shape``, all at once."""
    def cut(x):
        return tuple(lax.slice(x, start, tuple(a + n for a, n in zip(start, size))) for start, size in boxes)
    return jax.jit(cut)


@lru_cache(maxsize=1024)
def _assembler(shape: tuple, dtype: np.dtype, local: tuple, arrived: tuple):
    """A jitted function making a buffer of ``shape``: from the device's own buffer (its first argument, where
    ``local`` lists copies ``(src_start, dst_start, size)``) and the pieces received (the other arguments, one per
    ``(dst_start, size)`` of ``arrived``), each written into its box of a buffer of zeros."""
    def assemble(*args):
        own, got = (args[0], args[1:]) if local else (None, args)
        out = jnp.zeros(shape, dtype)
        for src_start, dst_start, size in local:
            piece = lax.slice(own, src_start, tuple(a + n for a, n in zip(src_start, size)))
            out = lax.dynamic_update_slice(out, piece, dst_start)
        for (dst_start, _), piece in zip(arrived, got):
            out = lax.dynamic_update_slice(out, piece, dst_start)
        return out
    return jax.jit(assemble)


@lru_cache(maxsize=1024)
def _zeros(shape: tuple, dtype: np.dtype, device):
    """A jitted function making a buffer of zeros of ``shape`` on ``device``."""
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=jax.sharding.SingleDeviceSharding(device))


def clear_cache() -> None:
    """Forget the jitted per-device copies of transfers (:func:`redist.jax.clear_cache` calls it)."""
    _cutter.cache_clear()
    _assembler.cache_clear()
    _zeros.cache_clear()
