"""The JAX interpreter: one device's buffer under ``jax.shard_map``, instructions as ``lax`` collectives.

Devices. The redist mesh of a JAX mesh (:func:`redist_mesh`) has its axes and its device order: the device at
position ``p`` (``jax_mesh.devices.flat[p]``, row-major) is redist device ``d``, the rank of its JAX
``device.id`` among the mesh's (so ``d`` is the JAX device id itself when the mesh holds devices ``0 … n-1``,
as ``jax.devices()[:n]`` in any arrangement, ``jax.make_mesh`` or a reversed device array does). Where two
meshes of other devices meet (a move across meshes, :mod:`redist.backends.jax_stages`), devices are numbered by
their JAX ids themselves, global device ids (:func:`global_mesh`). Going the other way, redist device ``d`` is the
JAX device whose ``id`` is ``d`` (:func:`jax_devices`, :func:`jax_mesh_of`), whatever the mesh's numbering.
Collectives work in mesh positions (``lax.axis_index``), exactly as ``NamedSharding`` does; the instructions
that name devices (a permute's sources, an exchange's copies) are translated from device ids to positions
through the program mesh's ``device_ids``, which must be the JAX mesh's order (``run_on_buffers`` builds or
checks that).

Sub-axes. A program may name sub-axes ``y:(pre)size``. JAX collectives need real axis names, so the program
runs on a *refined* mesh: the same devices in the same order, every axis split at the boundaries the
program's tokens use (splitting an axis of a row-major device array into factors keeps the order). A
piece of axis ``y`` is named by its token, e.g. ``"y:(1)2"``; an axis that is not split keeps its name. The
names contain ``:`` and so never clash with a mesh axis name (those are identifiers).

Group order. A multi-axis collective over ``("c", "a")`` ranks its members row-major over the tuple as
given, which is ``Mesh.group_index``; ``tests/redist/test_jax_backend.py`` checks this.

Entry points: :func:`run_program` (inside a ``shard_map`` of the caller's) and :func:`run_on_buffers`
(per-device numpy buffers, behind ``redist.execute(plan, shards, backend="jax")``); :mod:`redist.jax`
re-exports them next to ``reshard``, which plans first. A plan of several stages (across meshes) runs on
per-device buffers by :mod:`redist.backends.jax_stages`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Mapping

import numpy as np

from redist.extras import missing_extra

try:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.jax", "jax") from e

from redist import program as P
from redist.backends import interpreter
from redist.buffers import mesh_buffers
from redist.errors import ShardingError
from redist.axes import Axis
from redist.mesh import Mesh

__all__ = ["run_program", "run_on_buffers", "run_on_devices", "on_devices", "in_dtype", "without_context_mesh",
           "refined_axis_names", "refine_mesh", "redist_mesh", "global_mesh", "jax_devices", "jax_mesh_of", "JaxBackend",
           "ON_DEVICES", "packing_of", "run_packed"]

#: How many compiled per-device programs (one per program and JAX mesh) :func:`on_devices` keeps.
ON_DEVICES = 64


# ---------------------------------------------------------------------- meshes and axis names
def redist_mesh(jax_mesh) -> Mesh:
    """The redist mesh with the axes (names, sizes, order) of a JAX mesh and its device order: the device at
    each position is the rank of its JAX ``device.id`` among the mesh's (see "Devices" above). An abstract
    mesh, which holds no devices, gets the default order."""
    devices = getattr(jax_mesh, "devices", None)
    ids = None
    if isinstance(devices, np.ndarray):
        jax_ids = [d.id for d in devices.flat]
        rank = {i: r for r, i in enumerate(sorted(jax_ids))}
        ids = [rank[i] for i in jax_ids]
    return _redist_mesh(jax_mesh, ids)


def global_mesh(jax_mesh) -> Mesh:
    """The redist mesh with the axes of a (concrete) JAX mesh and, at each position, the JAX ``id`` of the device
    there: the numbering in which two meshes of other devices (a pipeline's stages, a mesh and a smaller one)
    name each device alike, so that a plan between them knows which devices they share (global device ids,
    docs/spec.md §1). It is :func:`redist_mesh` where the mesh holds the devices ``0 … n-1``."""
    return _redist_mesh(jax_mesh, [d.id for d in jax_mesh.devices.flat])


def _redist_mesh(jax_mesh, ids) -> Mesh:
    try:
        return Mesh(tuple(zip(jax_mesh.axis_names, jax_mesh.axis_sizes)), ids)
    except ShardingError as e:
        raise ShardingError(f"the JAX mesh {jax_mesh} cannot be used by redist: {e}") from None


def jax_devices(mesh: Mesh, devices=None) -> dict:
    """The JAX device of each device of ``mesh``, by redist device id: ``devices[d]`` (a list indexed by device
    id, or a mapping), by default the JAX device whose ``id`` is ``d`` (``jax.devices()[d]`` where JAX numbers
    its devices ``0 … n-1``, as on one host). Raises :class:`ShardingError` for a device JAX lacks."""
    if devices is None:
        devices = {dev.id: dev for dev in jax.devices()}
    elif not isinstance(devices, Mapping):
        devices = dict(enumerate(devices))
    missing = [d for d in mesh.devices if d not in devices]
    if missing:
        platform = next(iter(devices.values())).platform if devices else "none"
        more = (f"run it on a mesh of at most {len(devices)} devices, or give JAX more (on the CPU: "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={mesh.id_bound} before JAX starts)")
        if mesh.id_bound == mesh.size:
            raise ShardingError(f"the plan's mesh has {mesh.size} devices, JAX has {len(devices)} ({platform}); {more}")
        raise ShardingError(f"the plan's mesh {mesh} has device {missing[0]}, which JAX lacks (it has {len(devices)} "
                            f"devices, {platform}); {more}")
    return {d: devices[d] for d in mesh.devices}


def jax_mesh_of(mesh: Mesh, devices=None):
    """The JAX mesh of ``mesh``: its axes, and at each position the JAX device of the redist device there,
    :func:`jax_devices` (device ``d`` is ``devices[d]``, by default the JAX device whose ``id`` is ``d``; a list
    of devices sorted by id, so that :func:`redist_mesh` gives ``mesh`` back). Raises :class:`ShardingError` if
    JAX lacks a device."""
    table = jax_devices(mesh, devices)
    return jax.sharding.Mesh(np.array([table[d] for d in mesh.device_ids]).reshape(mesh.shape), mesh.names)


def _refined_axes(mesh: Mesh, tokens) -> dict[str, tuple[Axis, ...]]:
    """Per mesh axis, the axes of the refined mesh that split it (major to minor): its pieces between every
    boundary that ``tokens`` use (the whole axis if they cut it nowhere; none for an axis of size 1)."""
    return {n: tuple(Axis(n, lo, hi // lo, size) for lo, hi in zip(pts, pts[1:]))
            for (n, pts), size in zip(mesh.cut_points(tokens).items(), mesh.shape)}


def refined_axis_names(mesh: Mesh, tokens) -> dict[str, tuple[str, ...]]:
    """Map every mesh axis name and every token in ``tokens`` to the refined JAX axis names it covers.

    The refined mesh splits each axis at the boundaries ``tokens`` use; a piece is named by its own token
    (``"y:(2)2"``), an unsplit axis keeps its name. A token covers the pieces inside it, major to minor.
    """
    pieces = _refined_axes(mesh, tokens)
    out: dict[str, tuple[str, ...]] = {n: tuple(str(p) for p in ps) for n, ps in pieces.items()}
    for tok in tokens:
        a = mesh.axis(tok)
        out[tok] = tuple(str(p) for p in pieces[a.name] if a.pre <= p.pre and p.stop <= a.stop)
    return out


def refine_mesh(jax_mesh, tokens):
    """``(refined JAX mesh, names)``: ``jax_mesh`` with its axes split for ``tokens`` (same devices, same
    order) and the token → refined-axis-names map of :func:`refined_axis_names`."""
    mesh = redist_mesh(jax_mesh)
    names = refined_axis_names(mesh, tokens)
    pieces = _refined_axes(mesh, tokens)
    axis_names = tuple(p for n in mesh.names for p in names[n])
    shape = tuple(p.size for n in mesh.names for p in pieces[n])
    if axis_names == tuple(jax_mesh.axis_names):
        return jax_mesh, names
    # Each piece keeps its axis's type (Auto / Explicit).
    types = tuple(t for n, t in zip(mesh.names, jax_mesh.axis_types) for _ in pieces[n])
    return jax.sharding.Mesh(jax_mesh.devices.reshape(shape), axis_names, axis_types=types), names


# ---------------------------------------------------------------------- entry points
def run_program(program: P.Program, x, axis_names: Mapping[str, tuple[str, ...]] | None = None):
    """Run ``program`` on this device's buffer ``x``; call it inside ``jax.shard_map`` (per-device view).

    The shard_map's mesh must be the refined mesh of :func:`refine_mesh` for ``program.axis_tokens()``
    (or the JAX mesh itself when the program names no sub-axes), all of its axes manual, with the program
    mesh's device order (:func:`redist_mesh` of it is ``program.mesh``). ``axis_names`` maps each token and
    mesh axis name to refined JAX axis names; by default ``refined_axis_names(program.mesh,
    program.axis_tokens())``. Returns the buffer of shape ``program.shapes[-1]``. Reductions of ``bool``
    buffers are logical (as in the numpy backend; :class:`JaxBackend`). A program whose buffers are all empty
    runs no collective. Raises :class:`ShardingError` for a ``program``
    that is not a well-formed :class:`~redist.program.Program` or an ``x`` not of ``program.shapes[0]``.
    """
    interpreter.check_program(program, "run_program")
    if tuple(x.shape) != tuple(program.shapes[0]):
        raise ShardingError(f"local buffer has shape {tuple(x.shape)}, the program expects {program.shapes[0]}")
    if axis_names is None:
        axis_names = refined_axis_names(program.mesh, program.axis_tokens())
    return interpreter.run(program, JaxBackend(program.mesh, axis_names), x)


def run_on_buffers(program: P.Program, shards, jax_mesh=None) -> list[np.ndarray | None]:
    """Run ``program`` on arbitrary per-device buffers (index = device id; partial summands, say) with JAX
    collectives on host or accelerator devices; returns new numpy arrays (writable, never the caller's) of
    ``program.dtype`` in a list indexed by device id (``None`` at the numbers that are no device of the mesh).

    ``jax_mesh`` defaults to :func:`jax_mesh_of` the program's mesh (device ``d`` is the JAX device whose ``id``
    is ``d``); one given must have the program mesh's axes and device order (:func:`redist_mesh`: the order of
    its devices' ids). The buffers are placed on their devices and each device runs the program on its own
    buffer under ``jax.shard_map`` (:func:`run_on_devices`) — the per-device counterpart of :func:`reshard`,
    behind ``redist.execute(plan, shards, backend="jax")``. Types with uneven dims run here, on their padded
    local buffers (not through :func:`reshard`: JAX does not pad shards). A 64-bit dtype runs with JAX's x64
    mode switched on for the call (:func:`in_dtype`), so nothing is narrowed to 32 bits. The compiled program
    is kept per (program, JAX mesh) (:func:`on_devices`): a later call of the same program on the same devices
    compiles nothing.

    ``shards`` are taken by :func:`redist.buffers.mesh_buffers` (a list indexed by device id; no lossy
    conversion). Raises :class:`ShardingError` for a ``program`` that is not a well-formed
    :class:`~redist.program.Program`, for shards that do not fit, for a device JAX lacks, for a ``jax_mesh``
    whose axes or device order are not the program mesh's, or for a reduction JAX cannot run
    (:class:`JaxBackend`).
    """
    interpreter.check_program(program, "run_on_buffers")
    mesh = program.mesh
    bufs = mesh_buffers(shards, mesh, program.shapes[0], program.dtype)
    if jax_mesh is None:
        jax_mesh = jax_mesh_of(mesh)
    elif not redist_mesh(jax_mesh).same_axes(mesh):
        raise ShardingError(f"jax_mesh has axes {dict(zip(jax_mesh.axis_names, jax_mesh.axis_sizes))}, the "
                            f"program runs on mesh {mesh}")
    elif redist_mesh(jax_mesh) != _ranked(mesh):
        raise ShardingError(f"jax_mesh orders its devices as mesh {redist_mesh(jax_mesh)}, the program runs on "
                            f"mesh {mesh}: the same axes in another device order")
    out: list[np.ndarray | None] = [None] * mesh.id_bound
    if all(math.prod(s) == 0 for s in program.shapes):
        # Nothing to move (a dim of size 0), and JAX cannot read back shards of no elements made under jit.
        for d in mesh.devices:
            out[d] = np.zeros(program.shapes[-1], program.dtype)
        return out
    table = dict(zip(mesh.device_ids, jax_mesh.devices.flat))
    with in_dtype(program.dtype), without_context_mesh():
        placed = {d: jax.device_put(bufs[d], table[d]) for d in mesh.devices}
        for d, y in run_on_devices(program, placed, jax_mesh).items():
            out[d] = np.array(y)
    return out


def _ranked(mesh: Mesh) -> Mesh:
    """``mesh`` with each device id replaced by its rank among the mesh's ids (:func:`redist_mesh`'s numbering)."""
    rank = {d: r for r, d in enumerate(mesh.devices)}
    return mesh.reordered([rank[d] for d in mesh.device_ids])


def run_on_devices(program: P.Program, buffers: Mapping[int, jax.Array], jax_mesh) -> dict[int, jax.Array]:
    """Run ``program`` on per-device JAX arrays: ``buffers[d]``, of ``program.shapes[0]``, on the device at ``d``'s
    position in ``jax_mesh`` (which has the program mesh's axes and device order), for every device ``d`` of the
    program's mesh; returns new arrays by device id, each on its device. The buffers become the rows of one array
    over the mesh (:func:`on_devices`) without leaving their devices. Call it under :func:`in_dtype` of
    ``program.dtype``, on buffers that hold elements."""
    mesh = program.mesh
    run, sharding = on_devices(program, jax_mesh)
    rows = [buffers[d].reshape(1, -1) for d in mesh.device_ids]
    x = jax.make_array_from_single_device_arrays((mesh.size, math.prod(program.shapes[0])), sharding, rows)
    by_device = {s.device: s.data for s in run(x).addressable_shards}
    shape = tuple(program.shapes[-1])
    return {d: by_device[dev].reshape(shape) for d, dev in zip(mesh.device_ids, sharding.mesh.devices.flat)}


@lru_cache(maxsize=ON_DEVICES)
def on_devices(program: P.Program, jax_mesh) -> tuple[Callable, NamedSharding]:
    """``(run, sharding)``: ``program`` run by every device of ``jax_mesh`` on its own buffer, as one jitted
    function ``run`` of an array of shape ``(mesh size, elements of a buffer)`` laid out as ``sharding`` (on the
    refined mesh of :func:`refine_mesh`): row ``p``, in and out, is the buffer of the device at position ``p``,
    flattened (a leading dim of positions on a buffer of numpy's largest rank, 64, would be one dim more than
    numpy holds). ``jax_mesh`` has the program mesh's axes and device order. Call ``run`` under
    :func:`in_dtype` of ``program.dtype``.

    Cached per (program, JAX mesh), the last :data:`ON_DEVICES` of them, so that a program is traced and
    compiled once and a later call of :func:`run_on_buffers` only places its buffers and dispatches
    (``redist.jax.clear_cache()`` empties the cache)."""
    refined, names = refine_mesh(jax_mesh, program.axis_tokens())
    spec = PartitionSpec(tuple(refined.axis_names))
    shape_in = tuple(program.shapes[0])
    backend = JaxBackend(program.mesh, names)
    mapped = jax.shard_map(lambda b: interpreter.run(program, backend, b.reshape(shape_in)).reshape(1, -1),
                           mesh=refined, in_specs=spec, out_specs=spec, check_vma=False)
    return jax.jit(mapped), NamedSharding(refined, spec)


_EMPTY_MESH = jax.sharding.Mesh(np.empty((), dtype=object), ())  # no devices, no axes


@contextlib.contextmanager
def without_context_mesh():
    """A context without the caller's mesh of ``jax.set_mesh``, for the eager programs that redist runs on
    meshes of its own (:func:`run_on_buffers`, :func:`redist.backends.jax_stages.run_stages`, moves between
    meshes): JAX checks eager operations and ``jax.shard_map`` against the context mesh, and refuses arrays and
    meshes that are not on it. The context mesh becomes the empty mesh (what ``jax.set_mesh(None)`` sets, which
    JAX releases before 0.10 do not take). Under a trace, where ``jax.set_mesh`` cannot be called, nothing
    changes."""
    if jax.sharding.get_abstract_mesh().empty:
        yield
        return
    try:
        context = jax.set_mesh(_EMPTY_MESH)
    except ValueError:  # under a trace
        yield
        return
    with context:
        yield


def in_dtype(dtype):
    """A context in which JAX keeps ``dtype``: JAX's x64 mode switched on for the context (this thread only)
    where JAX's current mode would narrow ``dtype`` (``f64``, ``i64``, ``u64`` to 32 bits), else no change."""
    dtype = np.dtype(dtype)
    if jax.dtypes.canonicalize_dtype(dtype) == dtype:
        return contextlib.nullcontext()
    return jax.enable_x64(True)


# ---------------------------------------------------------------------- the instructions
class JaxBackend(interpreter.Backend):
    """The state is this device's buffer, a traced ``jax.Array``; a collective over tokens runs over their
    refined JAX axes, ``axis_names[token]`` (:func:`refined_axis_names` of the program's tokens).

    Reductions: a sum is ``psum`` / ``psum_scatter``; an all-reduce by max or min is ``pmax`` / ``pmin``. JAX
    has no reduce-scatter by max, min or product, nor an all-reduce by product: those run as an all-to-all
    of the ``k`` chunks (each member receives chunk ``r`` of every member's buffer) and the reduction of the
    received chunks on the device, which receives ``(k−1)/k · L_in`` as a reduce-scatter does and needs no
    buffer larger than its input; an all-reduce by product is that reduce-scatter over the flattened buffer
    (padded with ones to ``k`` chunks), then an all-gather: ``2(k−1)/k · L`` as an all-reduce. Reductions of
    ``bool`` run on ``int32`` (sum and max: or, min and prod: and)."""

    def __init__(self, mesh: Mesh, axis_names: Mapping[str, tuple[str, ...]]):
        self.mesh = mesh
        self.names = axis_names

    def axes(self, tokens) -> tuple[str, ...]:
        """The refined JAX axis names of ``tokens``, major to minor."""
        return tuple(a for tok in tokens for a in self.names[tok])

    def reshape(self, ins: P.Reshape, x):
        return x.reshape(ins.shape)

    def transpose(self, ins: P.Transpose, x):
        return jnp.transpose(x, ins.perm)

    def slice(self, ins: P.Slice, x):
        n = x.shape[ins.dim] // self.mesh.group_size(ins.axes)
        return lax.dynamic_slice_in_dim(x, lax.axis_index(self.axes(ins.axes)) * n, n, axis=ins.dim)

    def all_gather(self, ins: P.AllGather, x):
        return lax.all_gather(x, self.axes(ins.axes), axis=ins.dim, tiled=True)

    def all_to_all(self, ins: P.AllToAll, x):
        """Over the leading dim of chunks, XLA's own form (no temporary chunk on the CPU, as its resharding)."""
        return lax.all_to_all(x, self.axes(ins.axes), 0, 0, tiled=True)

    def reduce_scatter(self, ins: P.ReduceScatter, x):
        """``psum_scatter`` for a sum, else :func:`_reduce_scatter`; where k does not divide the dim, on the
        buffer padded with zeros to k chunks (the padding rule: the last chunks end in zeros, as the
        instruction says, whatever the reduction: every member pads with zeros)."""
        axes, reduction = self.axes(ins.axes), _kind(ins.reduction, x)
        k = self.mesh.group_size(ins.axes)
        short = -x.shape[ins.dim] % k
        if short:
            x = jnp.pad(x, [(0, short if d == ins.dim else 0) for d in range(x.ndim)])
        if reduction == "sum":
            return _on_ints(lambda v: lax.psum_scatter(v, axes, scatter_dimension=ins.dim, tiled=True), x)
        return _on_ints(lambda v: _reduce_scatter(v, axes, ins.dim, k, reduction), x)

    def all_reduce(self, ins: P.AllReduce, x):
        axes, reduction = self.axes(ins.axes), _kind(ins.reduction, x)
        if reduction == "prod":
            k = self.mesh.group_size(ins.axes)
            return _all_reduce_prod(x, axes, k)
        op = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[reduction]
        return _on_ints(lambda v: op(v, axes), x)

    def keep_root(self, ins: P.KeepRoot, x):
        return jnp.where(lax.axis_index(self.axes(ins.axes)) == 0, x, jnp.zeros_like(x))

    def embed_chunk(self, ins: P.EmbedChunk, x):
        k = self.mesh.group_size(ins.axes)
        n = x.shape[ins.dim]
        shape = x.shape[:ins.dim] + (n * k,) + x.shape[ins.dim + 1:]
        # zeros_like keeps x's dtype (jnp.zeros would narrow f64 without x64)
        zeros = jnp.zeros_like(x, shape=shape)
        return lax.dynamic_update_slice_in_dim(zeros, x, lax.axis_index(self.axes(ins.axes)) * n, axis=ins.dim)

    def collective_permute(self, ins: P.CollectivePermute, x):
        """Device d gets device ``sources[d]``'s buffer; ppermute indexes devices linearly over all axes in
        mesh order, which is the position, read from the device id through the mesh. Devices that keep their
        buffer are listed as ``(p, p)`` pairs, so the permutation is whole and no device is left with
        ppermute's zeros."""
        if not ins.moves():
            return x
        at = self.mesh.position
        sources = ins.source_table(self.mesh)
        return lax.ppermute(x, self.axes(self.mesh.names), perm=[(at(sources[d]), at(d)) for d in self.mesh.devices])

    def exchange(self, ins: P.Exchange, x):
        return _exchange(ins, x, self.axes(self.mesh.names), self.mesh)


def _kind(reduction: str, x) -> str:
    """The reduction to run: of ``bool``, a product is the minimum (logical and)."""
    return "min" if reduction == "prod" and x.dtype == jnp.bool_ else reduction


def _on_ints(op, x):
    """``op`` on ``x``, or for ``bool`` on its ``int32`` view, read back as ``!= 0`` (XLA does not reduce
    ``pred`` across devices): sum and max of 0s and 1s are non-zero where some is 1, min where all are."""
    if x.dtype == jnp.bool_:
        return op(x.astype(jnp.int32)) != 0
    return op(x)


_LOCAL_REDUCE = {"max": jnp.max, "min": jnp.min, "prod": jnp.prod}


def _reduce_scatter(x, axes, dim: int, k: int, reduction: str):
    """Reduce-scatter by ``reduction`` (max, min, prod) along ``dim`` over the group ``axes`` of ``k``: split
    ``dim`` into ``k`` chunks, bring them to the front, exchange them (all-to-all: chunk ``j`` to member ``j``;
    what arrives from member ``s`` is row ``s``), and reduce the rows."""
    n = x.shape[dim]
    chunks = jnp.moveaxis(x.reshape(x.shape[:dim] + (k, n // k) + x.shape[dim + 1:]), dim, 0)
    received = lax.all_to_all(chunks, axes, 0, 0, tiled=True)
    return _LOCAL_REDUCE[reduction](received, axis=0).astype(x.dtype)


def _all_reduce_prod(x, axes, k: int):
    """All-reduce by product over the group ``axes`` of ``k``: :func:`_reduce_scatter` of the flattened buffer
    padded with ones to a multiple of ``k``, then an all-gather of the chunks."""
    flat = x.reshape(-1)
    m = -(-flat.size // k)
    padded = jnp.concatenate([flat, jnp.ones((k * m - flat.size,), x.dtype)])
    chunk = _reduce_scatter(padded, axes, 0, k, "prod")
    return lax.all_gather(chunk, axes, axis=0, tiled=True)[: flat.size].reshape(x.shape)


@dataclass(frozen=True, eq=False)
class _Round:
    """One round of an :class:`~redist.program.Exchange`: every device sends at most one slab, to device
    ``(sender + shift) mod n`` (``n`` the mesh's ``id_bound``; ``shift == 0``: a copy within the device, nothing
    sent).

    The slab has the static shape ``slab`` (per dim, the largest copy of the round); a smaller copy fills its
    start and the rest is dropped on arrival. Tables are indexed by device id, with a column per dim:
    ``src_start`` for the device as sender (0 where it sends nothing), ``dst_start`` and ``size`` for it as
    receiver, with an extra leading column for a unit dim put in front of the output: size 1 where the
    device receives in this round, 0 where it does not (then every write of the round is dropped, rank 0
    arrays included).
    """

    shift: int
    senders: tuple[int, ...]
    slab: tuple[int, ...]
    src_start: np.ndarray  # (n, rank) int32
    dst_start: np.ndarray  # (n, rank + 1) int32
    size: np.ndarray       # (n, rank + 1) int32


@lru_cache(maxsize=256)
def _exchange_rounds(ins: P.Exchange, mesh: Mesh) -> tuple[_Round, ...]:
    """The tables of the rounds of :meth:`redist.program.Exchange.rounds` (copies within a device included, as
    rounds of shift 0), in which each device sends at most once and receives at most once; indexed by device id
    (up to the mesh's ``id_bound``)."""
    n = mesh.id_bound
    rank = len(ins.shape)
    out = []
    for shift, moves in ins.rounds(mesh, local=True):
        src_start = np.zeros((n, rank), np.int32)
        dst_start = np.zeros((n, rank + 1), np.int32)
        size = np.zeros((n, rank + 1), np.int32)
        for s, d, c in moves:
            src_start[s] = c.src_start
            dst_start[d, 1:] = c.dst_start
            size[d] = (1,) + tuple(c.size)
        slab = tuple(int(m) for m in size[:, 1:].max(axis=0))
        out.append(_Round(shift, tuple(s for s, _, _ in moves), slab, src_start, dst_start, size))
    return tuple(out)


def _exchange(ins: P.Exchange, x, all_axes, mesh: Mesh):
    """Point-to-point exchange, as rounds of :func:`_exchange_rounds`: each device gathers its slab with
    ``jnp.take`` along each dim (indices from its row of the round's tables, clipped into the buffer), one
    ``lax.ppermute`` over the round's (sender, receiver) pairs moves the slabs, and each receiver scatters its
    slab into the output with ``mode="drop"``, its indices past a copy's size (or all of them, if it receives
    nothing) out of range. The output starts as zeros, which stay where no copy writes. A device's position is
    its linear index over all the mesh axes (row-major), as ``ppermute`` numbers devices; the tables, by
    device id, are read in position order (``mesh.device_ids``); a round's shift is modulo the mesh's
    ``id_bound``, as :meth:`~redist.program.Exchange.rounds` counts it."""
    n, order, at = mesh.id_bound, np.asarray(mesh.device_ids), mesh.position
    me = lax.axis_index(all_axes)
    # A leading unit dim: see _Round. zeros_like keeps x's dtype (jnp.zeros would narrow f64 without x64).
    out = jnp.zeros_like(x, shape=(1,) + tuple(ins.shape))
    for rnd in _exchange_rounds(ins, mesh):
        start = jnp.asarray(rnd.src_start[order])[me]
        slab = x
        for dim, m in enumerate(rnd.slab):
            if m == x.shape[dim] and not rnd.src_start[:, dim].any():
                continue  # every sender takes the whole dim
            slab = jnp.take(slab, start[dim] + jnp.arange(m, dtype=jnp.int32), axis=dim, mode="clip")
        if rnd.shift:
            slab = lax.ppermute(slab, all_axes, perm=[(at(s), at((s + rnd.shift) % n)) for s in rnd.senders])
        dst, size = jnp.asarray(rnd.dst_start[order])[me], jnp.asarray(rnd.size[order])[me]
        index = []
        for dim, m in enumerate((1,) + rnd.slab):
            i = jnp.arange(m, dtype=jnp.int32)
            index.append(jnp.where(i < size[dim], dst[dim] + i, out.shape[dim]))
        out = out.at[jnp.ix_(*index)].set(slab[None], mode="drop")
    return out[0]


# ---------------------------------------------------------------------- packed programs
_PACKABLE = (P.AllGather, P.ReduceScatter, P.AllToAll)
_LOCAL = (P.Reshape, P.Transpose, P.Slice)


def packing_of(program: P.Program) -> tuple[tuple, int] | None:
    """``(key, nbytes)`` where :func:`run_packed` can run ``program`` with others of the same ``key`` (its
    collective's kind, axes, reduction and dtype) as one collective, ``nbytes`` the larger of that collective's
    buffers; None where it cannot: a program whose instructions are not one all-gather, reduce-scatter (over a
    dim its group divides) or all-to-all among local ones (reshapes, transposes, slices), or that moves
    between meshes."""
    at = _collective_at(program)
    if at is None or program.src_mesh != program.mesh or program.dst_mesh != program.mesh:
        return None
    op = program.instructions[at]
    if isinstance(op, P.ReduceScatter) and program.shapes[at][op.dim] % program.mesh.group_size(op.axes):
        return None
    key = (type(op).__name__, op.axes, getattr(op, "reduction", None), np.dtype(program.dtype).str)
    nbytes = max(math.prod(program.shapes[at]), math.prod(program.shapes[at + 1])) * np.dtype(program.dtype).itemsize
    return key, nbytes


def run_packed(programs: list, xs: list, axis_names: Mapping[str, tuple[str, ...]]) -> list:
    """``run_program(programs[i], xs[i], axis_names)`` for every ``i``, their collectives run as one (the
    programs of one :func:`packing_of` key): each buffer after its program's local steps before the collective
    is laid out with the dim the collective splits or joins leading (an all-to-all's chunks are its leading
    dim) and flattened past it; the buffers are laid end to end, the one collective runs on them, and each
    result is cut back out, laid out again and taken through its program's local steps after. The same values
    bit for bit as the programs run one by one (the same reduction of the same elements)."""
    backend = JaxBackend(programs[0].mesh, axis_names)
    at = [_collective_at(p) for p in programs]
    ys = [interpreter.run_instructions(p.instructions[:i], backend, x) for p, i, x in zip(programs, at, xs)]
    ops = [p.instructions[i] for p, i in zip(programs, at)]
    op = ops[0]
    k = programs[0].mesh.group_size(op.axes)
    dims = [0 if isinstance(o, P.AllToAll) else o.dim for o in ops]
    leading = [jnp.moveaxis(y, d, 0) for y, d in zip(ys, dims)]
    if isinstance(op, P.AllGather):
        rows = [y.reshape(1, -1) for y in leading]
        out = backend.all_gather(P.AllGather(0, op.axes), jnp.concatenate(rows, axis=1))
        shapes = [(y.shape[0] * k, *y.shape[1:]) for y in leading]
    else:
        rows = [y.reshape(k, -1) for y in leading]
        packed = jnp.concatenate(rows, axis=1)
        if isinstance(op, P.ReduceScatter):
            out = backend.reduce_scatter(P.ReduceScatter(0, op.axes, op.reduction), packed)
            shapes = [(y.shape[0] // k, *y.shape[1:]) for y in leading]
        else:
            out = backend.all_to_all(op, packed)
            shapes = [y.shape for y in leading]
    ends = np.cumsum([r.shape[1] for r in rows])[:-1]
    moved = [jnp.moveaxis(piece.reshape(shape), 0, d)
             for piece, shape, d in zip(jnp.split(out, ends, axis=1), shapes, dims)]
    return [interpreter.run_instructions(p.instructions[i + 1:], backend, y)
            for p, i, y in zip(programs, at, moved)]


def _collective_at(program: P.Program) -> int | None:
    """The position of ``program``'s one collective of :data:`_PACKABLE`, its other instructions local; else
    None."""
    at = None
    for i, ins in enumerate(program.instructions):
        if type(ins) in _PACKABLE and at is None:
            at = i
        elif type(ins) not in _LOCAL:
            return None
    return at
