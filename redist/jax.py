"""The JAX runtime: run a synthesized plan with ``jax.shard_map`` collectives (SPEC section 5).

    y = redist.jax.reshard(x, NamedSharding(mesh, P(None, ("x", "y"))))

Devices. Device id ``d`` of the redist mesh is position ``d`` of ``jax_mesh.devices`` in row-major order
(``jax_mesh.devices.flat[d]``), whatever the JAX ``device.id`` there is. Everything here works in mesh
positions (``lax.axis_index``), exactly as ``NamedSharding`` does, so a mesh whose devices are in any order
is handled correctly; only comparisons with per-``device.id`` lists assume the usual order
``np.array(jax.devices()[:n]).reshape(shape)``.

Sub-axes. A program may name sub-axes ``y:(pre)size``. JAX collectives need real axis names, so the plan
runs on a *refined* mesh: the same devices in the same order, every axis split at the boundaries the
program's tokens use (splitting an axis of a row-major device array into factors keeps the order). A
piece of axis ``y`` is named by its token, e.g. ``"y:(1)2"``; an axis that is not split keeps its name. The
names contain ``:`` and so never clash with a mesh axis name (those are identifiers).

Group order. A multi-axis collective over ``("c", "a")`` ranks its members row-major over the tuple as
given, which is ``Mesh.group_index``; ``tests/test_jax_backend.py`` checks this.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Mapping

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
from redist.buffers import describe, device_buffers
from redist.errors import ShardingError
from redist.mesh import Mesh, sub_axis_token
from redist.steps import Copy
from redist.synthesis import synthesize
from redist.types import ShardingType

__all__ = ["reshard", "run_program", "run_on_buffers", "in_dtype", "refined_axis_names", "refine_mesh",
           "redist_mesh", "sharding_type"]


# ---------------------------------------------------------------------- meshes and axis names
def redist_mesh(jax_mesh) -> Mesh:
    """The redist mesh with the axes (names, sizes, order) of a JAX mesh."""
    try:
        return Mesh(tuple(zip(jax_mesh.axis_names, jax_mesh.axis_sizes)))
    except ShardingError as e:
        raise ShardingError(f"the JAX mesh {jax_mesh} cannot be used by redist: {e}") from None


def _pieces(mesh: Mesh, tokens) -> dict[str, list[tuple[int, int]]]:
    """Per mesh axis, its factor ranges ``[lo, hi)`` (major to minor) after splitting at every token's ends."""
    return {n: list(zip(pts, pts[1:])) for n, pts in mesh.cut_points(tokens).items()}


def refined_axis_names(mesh: Mesh, tokens) -> dict[str, tuple[str, ...]]:
    """Map every mesh axis name and every token in ``tokens`` to the refined JAX axis names it covers.

    The refined mesh splits each axis at the boundaries ``tokens`` use; a piece is named by its own token
    (``"y:(2)2"``), an unsplit axis keeps its name. A token covers the pieces inside it, major to minor.
    """
    pieces = _pieces(mesh, tokens)
    full = dict(mesh.axes)
    piece_names = {n: [(lo, hi, n if len(ps) == 1 else sub_axis_token(n, lo, hi // lo, full[n])) for lo, hi in ps]
                   for n, ps in pieces.items()}
    out = {n: tuple(p[2] for p in ps) for n, ps in piece_names.items()}
    for tok in tokens:
        name, pre, size = mesh.sub_axis(tok)
        out[tok] = tuple(p for lo, hi, p in piece_names[name] if pre <= lo and hi <= pre * size)
    return out


def refine_mesh(jax_mesh, tokens):
    """``(refined JAX mesh, names)``: ``jax_mesh`` with its axes split for ``tokens`` (same devices, same
    order) and the token → refined-axis-names map of :func:`refined_axis_names`."""
    mesh = redist_mesh(jax_mesh)
    names = refined_axis_names(mesh, tokens)
    pieces = _pieces(mesh, tokens)
    axis_names = tuple(p for n in mesh.names for p in names[n])
    shape = tuple(hi // lo for n in mesh.names for lo, hi in pieces[n])
    if axis_names == tuple(jax_mesh.axis_names):
        return jax_mesh, names
    # Each piece keeps its axis's type (Auto / Explicit).
    types = tuple(t for n, t in zip(mesh.names, jax_mesh.axis_types) for _ in pieces[n])
    return jax.sharding.Mesh(jax_mesh.devices.reshape(shape), axis_names, axis_types=types), names


def _spec(dims, names: Mapping[str, tuple[str, ...]]) -> PartitionSpec:
    """The PartitionSpec on the refined mesh of per-dim token lists."""
    out = []
    for d in dims:
        axes = tuple(a for tok in d for a in names[tok])
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


# ---------------------------------------------------------------------- the interpreter
def run_program(program: P.Program, x, axis_names: Mapping[str, tuple[str, ...]] | None = None):
    """Run ``program`` on this device's buffer ``x``; call it inside ``jax.shard_map`` (per-device view).

    The shard_map's mesh must be the refined mesh of :func:`refine_mesh` for ``program.axis_tokens()``
    (or the JAX mesh itself when the program names no sub-axes), all of its axes manual. ``axis_names``
    maps each token and mesh axis name to refined JAX axis names; by default
    ``refined_axis_names(program.mesh, program.axis_tokens())``. Returns the buffer of shape
    ``program.shapes[-1]``. Pending sums of ``bool`` buffers are logical or (as in the numpy backend). A
    program whose buffers are all empty runs no collective.
    """
    _check_program(program)
    mesh = program.mesh
    names = axis_names if axis_names is not None else refined_axis_names(mesh, program.axis_tokens())

    def jaxes(tokens):
        return tuple(a for tok in tokens for a in names[tok])

    if tuple(x.shape) != tuple(program.shapes[0]):
        raise ShardingError(f"local buffer has shape {tuple(x.shape)}, the program expects {program.shapes[0]}")
    if all(math.prod(s) == 0 for s in program.shapes):
        # Nothing to move (a dim of size 0); XLA rejects some collectives of empty operands.
        return x.reshape(program.shapes[-1])
    for ins in program.instructions:
        if isinstance(ins, P.CollectivePermute):
            x = _permute(mesh, ins, x, jaxes(mesh.names))
            continue
        if isinstance(ins, P.Exchange):
            x = _exchange(ins, x, jaxes(mesh.names), mesh.size)
            continue
        if isinstance(ins, P.Reshape):
            x = x.reshape(ins.shape)
            continue
        if isinstance(ins, P.Transpose):
            x = jnp.transpose(x, ins.perm)
            continue
        axes = jaxes(ins.axes)
        if isinstance(ins, P.Slice):
            k = mesh.group_size(ins.axes)
            n = x.shape[ins.dim] // k
            x = lax.dynamic_slice_in_dim(x, lax.axis_index(axes) * n, n, axis=ins.dim)
        elif isinstance(ins, P.AllGather):
            x = lax.all_gather(x, axes, axis=ins.dim, tiled=True)
        elif isinstance(ins, P.AllToAll):
            x = _all_to_all(x, axes, ins.split_dim, ins.concat_dim, mesh.group_size(ins.axes))
        elif isinstance(ins, P.ReduceScatter):
            x = _summed(lambda v: lax.psum_scatter(v, axes, scatter_dimension=ins.dim, tiled=True), x)
        elif isinstance(ins, P.AllReduce):
            x = _summed(lambda v: lax.psum(v, axes), x)
        else:
            raise TypeError(f"unknown instruction {ins!r}")
    return x


def _check_program(program) -> None:
    if not isinstance(program, P.Program):
        raise ShardingError(f"expected a redist.program.Program (plan.program), got {describe(program)}")


def _all_to_all(x, axes, split_dim: int, concat_dim: int, k: int):
    """Tiled all-to-all through a leading dim of k chunks: split ``split_dim`` into (k, n/k), bring the
    chunks to the front, exchange them (chunk j to rank j; afterwards the front dim indexes the sender), and
    merge the sender index in as the major part of ``concat_dim``. Same result as ``lax.all_to_all(...,
    tiled=True)``; XLA's CPU all-to-all then needs no extra temporary chunk (as its own resharding)."""
    if split_dim == concat_dim:
        return lax.all_to_all(x, axes, split_dim, concat_dim, tiled=True)
    shape = list(x.shape)
    y = x.reshape(shape[:split_dim] + [k, shape[split_dim] // k] + shape[split_dim + 1:])
    y = lax.all_to_all(jnp.moveaxis(y, split_dim, 0), axes, 0, 0, tiled=True)
    rest = list(y.shape[1:])
    rest[concat_dim] *= k
    return jnp.moveaxis(y, 0, concat_dim).reshape(rest)


def _summed(op, x):
    if x.dtype == jnp.bool_:
        return op(x.astype(jnp.int32)) != 0
    return op(x)


def _permute(mesh: Mesh, ins: P.CollectivePermute, x, all_axes):
    """Device d gets device ``sources[d]``'s buffer; ppermute indexes devices linearly over all axes in
    mesh order, which is the device id. Devices that keep their buffer are listed as ``(d, d)`` pairs, so the
    permutation is whole and no device is left with ppermute's zeros."""
    if not ins.pairs():
        return x
    return lax.ppermute(x, all_axes, perm=[(s, d) for d, s in enumerate(ins.sources)])


@dataclass(frozen=True, eq=False)
class _Round:
    """One round of an :class:`~redist.program.Exchange`: every device sends at most one slab, to device
    ``(sender + shift) mod n`` (``shift == 0``: a copy within the device, nothing sent).

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
def _exchange_rounds(ins: P.Exchange, n: int) -> tuple[_Round, ...]:
    """The copies of ``ins`` in rounds keyed by (shift, how many earlier copies of that pair there are), so
    that within a round each device sends at most once and receives at most once; copies of no elements are
    left out, and so are rounds without any."""
    rounds: dict[tuple[int, int], list[tuple[int, int, Copy]]] = {}
    for d, copies in enumerate(ins.copies):
        seen: dict[int, int] = {}
        for c in copies:
            if math.prod(c.size) == 0:
                continue
            j = seen.get(c.source, 0)
            seen[c.source] = j + 1
            rounds.setdefault(((d - c.source) % n, j), []).append((c.source, d, c))
    rank = len(ins.shape)
    out = []
    for (shift, _), moves in sorted(rounds.items()):
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


def _exchange(ins: P.Exchange, x, all_axes, n: int):
    """Point-to-point exchange, as rounds of :func:`_exchange_rounds`: each device gathers its slab with
    ``jnp.take`` along each dim (indices from its row of the round's tables, clipped into the buffer), one
    ``lax.ppermute`` over the round's (sender, receiver) pairs moves the slabs, and each receiver scatters its
    slab into the output with ``mode="drop"``, its indices past a copy's size (or all of them, if it receives
    nothing) out of range. The output starts as zeros, which stay where no copy writes. The device's id is
    its linear index over all ``n`` devices' mesh axes (row-major), as ``ppermute`` numbers devices."""
    me = lax.axis_index(all_axes)
    # A leading unit dim: see _Round. zeros_like keeps x's dtype (jnp.zeros would narrow f64 without x64).
    out = jnp.zeros_like(x, shape=(1,) + tuple(ins.shape))
    for rnd in _exchange_rounds(ins, n):
        start = jnp.asarray(rnd.src_start)[me]
        slab = x
        for dim, m in enumerate(rnd.slab):
            if m == x.shape[dim] and not rnd.src_start[:, dim].any():
                continue  # every sender takes the whole dim
            slab = jnp.take(slab, start[dim] + jnp.arange(m, dtype=jnp.int32), axis=dim, mode="clip")
        if rnd.shift:
            slab = lax.ppermute(slab, all_axes, perm=[(s, (s + rnd.shift) % n) for s in rnd.senders])
        dst, size = jnp.asarray(rnd.dst_start)[me], jnp.asarray(rnd.size)[me]
        index = []
        for dim, m in enumerate((1,) + rnd.slab):
            i = jnp.arange(m, dtype=jnp.int32)
            index.append(jnp.where(i < size[dim], dst[dim] + i, out.shape[dim]))
        out = out.at[jnp.ix_(*index)].set(slab[None], mode="drop")
    return out[0]


def run_on_buffers(program: P.Program, shards, jax_mesh=None) -> list[np.ndarray]:
    """Run ``program`` on arbitrary per-device buffers (index = device id; partial summands, say) with JAX
    collectives on host or accelerator devices; returns new numpy arrays (writable, never the caller's), in
    device order, of ``program.dtype``.

    ``jax_mesh`` defaults to the first ``program.mesh.size`` devices in the mesh's shape. The buffers are
    placed on their devices as one array with a leading device dim, and each device runs the program on its
    own buffer under ``jax.shard_map`` — the per-device counterpart of :func:`reshard`, behind
    ``redist.execute(plan, shards, backend="jax")``. Types with uneven dims run here, on their padded local
    buffers (not through :func:`reshard`: JAX does not pad shards). A 64-bit dtype runs with JAX's x64 mode
    switched on for the call (:func:`in_dtype`), so nothing is narrowed to 32 bits.

    ``shards`` are taken by :func:`redist.buffers.device_buffers` (no lossy conversion). Raises
    :class:`ShardingError` for shards that do not fit, for a mesh larger than JAX's device count, or for a
    ``jax_mesh`` whose axes are not the program's.
    """
    _check_program(program)
    mesh = program.mesh
    bufs = device_buffers(shards, mesh.size, program.shapes[0], program.dtype)
    if jax_mesh is None:
        devices = jax.devices()
        if len(devices) < mesh.size:
            raise ShardingError(
                f"the plan's mesh has {mesh.size} devices, JAX has {len(devices)} ({devices[0].platform}); run "
                f"it on a mesh of at most {len(devices)} devices, or give JAX more (on the CPU: "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={mesh.size} before JAX starts)")
        jax_mesh = jax.sharding.Mesh(np.array(devices[: mesh.size]).reshape(mesh.shape), mesh.names)
    elif redist_mesh(jax_mesh).axes != mesh.axes:
        raise ShardingError(f"jax_mesh has axes {dict(zip(jax_mesh.axis_names, jax_mesh.axis_sizes))}, the "
                            f"program runs on mesh {mesh}")
    refined, names = refine_mesh(jax_mesh, program.axis_tokens())
    if all(math.prod(s) == 0 for s in program.shapes):
        return [np.zeros(program.shapes[-1], program.dtype) for _ in bufs]  # nothing to move (see _empty)
    spec = PartitionSpec(tuple(refined.axis_names))
    with in_dtype(program.dtype):
        x = jax.make_array_from_single_device_arrays(
            (mesh.size,) + tuple(program.shapes[0]), NamedSharding(refined, spec),
            [jax.device_put(b[None], dev) for b, dev in zip(bufs, refined.devices.flat)])
        f = jax.shard_map(lambda b: run_program(program, b[0], names)[None], mesh=refined, in_specs=spec,
                          out_specs=spec, check_vma=False)
        y = jax.jit(f)(x)
        by_device = {s.device: np.array(s.data)[0] for s in y.addressable_shards}
    return [by_device[dev] for dev in refined.devices.flat]


def in_dtype(dtype):
    """A context in which JAX keeps ``dtype``: JAX's x64 mode switched on for the context (this thread only)
    where JAX's current mode would narrow ``dtype`` (``f64``, ``i64``, ``u64`` to 32 bits), else no change."""
    dtype = np.dtype(dtype)
    if jax.dtypes.canonicalize_dtype(dtype) == dtype:
        return contextlib.nullcontext()
    return jax.enable_x64(True)


# ---------------------------------------------------------------------- reshard
def sharding_type(shape, dtype, sharding, mesh: Mesh | None = None) -> ShardingType:
    """The redist type of an array of ``shape``/``dtype`` laid out by a ``NamedSharding``.

    Missing spec entries and ``None`` or ``UNCONSTRAINED`` entries replicate; unreduced axes are rejected.
    """
    if not isinstance(sharding, NamedSharding):
        raise ShardingError(f"redist.jax needs a NamedSharding, got {type(sharding).__name__}: {sharding}")
    spec = sharding.spec
    if getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
        raise ShardingError(f"partition spec {spec} has unreduced/reduced axes; redist.jax does not take them")
    entries = tuple(None if e is PartitionSpec.UNCONSTRAINED else e for e in spec)
    return ShardingType.from_partition_spec(
        tuple(shape), dtype, entries, mesh if mesh is not None else redist_mesh(sharding.mesh))


def _check_even(t: ShardingType, which: str) -> None:
    """JAX lays out a ``NamedSharding`` only on dims its blocks divide (shards are not padded), and
    ``jax.shard_map`` likewise: raise for an uneven dim of ``t``, naming it and its axes."""
    for i, (n, axes) in enumerate(zip(t.shape, t.dims)):
        if not t.is_even(i):
            raise ShardingError(
                f"{which}: dim {i} (size {n}) does not divide into its {t.blocks(i)} blocks over "
                f"{{{','.join(axes)}}}; JAX shards only even dims, so reshard needs them (uneven layouts run on "
                "padded per-device buffers with redist.jax.run_on_buffers)")


def _same_mesh(a, b) -> bool:
    """Equal meshes; a traced array may only carry the abstract mesh, which is then compared."""
    if a == b:
        return True
    abstract = (jax.sharding.AbstractMesh,)
    if isinstance(a, abstract) or isinstance(b, abstract):
        return getattr(a, "abstract_mesh", a) == getattr(b, "abstract_mesh", b)
    return False


def reshard(x, sharding, *, src=None):
    """Return ``x`` laid out as ``sharding`` (a ``NamedSharding``), moved by a synthesized plan.

    ``x`` is a ``jax.Array`` with a ``NamedSharding`` on the same mesh, or a tracer under ``jax.jit``. The plan
    runs as ``jax.shard_map`` collectives on the devices; nothing goes through the host. The result's
    ``.sharding`` is ``sharding`` (``UNCONSTRAINED`` spec entries are taken as replicated and come back as
    ``None``; under ``jax.jit`` JAX may drop trailing ``None`` entries, an equivalent sharding).

    Under ``jax.jit`` a tracer has no ``.sharding``; the source layout is taken from
    ``jax.typeof(x).sharding`` when every mesh axis is ``Explicit``. With ``Auto`` axes (JAX's default)
    the layout is not known while tracing, so pass it as ``src`` (a ``NamedSharding`` or ``PartitionSpec``);
    if the real layout differs, XLA moves the data to ``src`` first (correct, but not by redist's plan).
    Limitation: under ``jax.jit`` inside a ``jax.set_mesh`` context, a plan that needs sub-axes fails in JAX
    (the refined mesh is not the context mesh); outside such a context, and eagerly, it works.

    The result has ``x``'s dtype: a 64-bit array (made under JAX's x64 mode) stays 64-bit even where x64 is
    off for this call.

    Raises :class:`ShardingError` if ``x`` is no JAX array, ``sharding`` (or ``x``'s sharding) is not a
    ``NamedSharding``, the meshes differ, or the shape does not fit the shardings (an unknown axis, too many
    spec entries, a dim that does not divide).
    """
    if not isinstance(x, jax.Array):
        raise ShardingError(f"reshard moves a jax.Array laid out on a mesh (jax.device_put(x, NamedSharding(mesh, "
                            f"spec))), got {describe(x)}")
    if not isinstance(sharding, NamedSharding):
        raise ShardingError(f"reshard needs a NamedSharding as the target, got {type(sharding).__name__}")
    jmesh = sharding.mesh
    if not isinstance(jmesh, jax.sharding.Mesh):
        raise ShardingError(f"the target sharding's mesh must be a concrete jax.sharding.Mesh, got {jmesh}")
    traced = isinstance(x, jax.core.Tracer)
    if src is None:
        if not traced:
            src = getattr(x, "sharding", None)
        else:
            src = jax.typeof(x).sharding
            types = getattr(src.mesh, "axis_types", ())
            if not isinstance(src, NamedSharding) or any(t != jax.sharding.AxisType.Explicit for t in types):
                raise ShardingError(
                    "under jax.jit the source layout of a traced array is not known (mesh axes are not "
                    "Explicit); pass it as reshard(x, sharding, src=NamedSharding(...) or PartitionSpec(...))")
    elif isinstance(src, PartitionSpec):
        src = NamedSharding(jmesh, src)
    if not isinstance(src, NamedSharding):
        raise ShardingError(f"the array's sharding must be a NamedSharding, got {type(src).__name__}: {src}")
    if not _same_mesh(src.mesh, jmesh):
        raise ShardingError(f"the array is on mesh {src.mesh} but the target sharding on mesh {jmesh}; "
                            "reshard moves data within one mesh")
    mesh = redist_mesh(jmesh)
    try:
        dtype = np.dtype(x.dtype)
    except TypeError:
        raise ShardingError(f"unsupported dtype {x.dtype}") from None
    src_t = sharding_type(x.shape, dtype, src, mesh)
    dst_t = sharding_type(x.shape, dtype, sharding, mesh)
    _check_even(src_t, "the array's sharding")
    _check_even(dst_t, "the target sharding")
    if any(e is PartitionSpec.UNCONSTRAINED for e in sharding.spec):
        sharding = NamedSharding(jmesh, PartitionSpec(
            *(None if e is PartitionSpec.UNCONSTRAINED else e for e in sharding.spec)))
    fn = _shard_mapped(src_t, dst_t, jmesh)
    if not traced:
        with in_dtype(dtype):
            if x.size == 0:
                return _empty(x.shape, dtype, sharding)
            return _jitted(src_t, dst_t, jmesh, sharding)(x)
    # The shard_map's result is laid out on the refined mesh, element for element as ``sharding`` says;
    # restating it on the original mesh moves no data (it only changes the type).
    y = fn(x)
    if any(t == jax.sharding.AxisType.Explicit for t in jmesh.axis_types):
        return jax.sharding.reshard(y, sharding)
    return lax.with_sharding_constraint(y, sharding)


@lru_cache(maxsize=256)
def _shard_mapped(src_t: ShardingType, dst_t: ShardingType, jmesh):
    """The plan from ``src_t`` to ``dst_t`` as a shard_map over the refined mesh of ``jmesh``."""
    program = synthesize(src_t, dst_t).program
    refined, names = refine_mesh(jmesh, program.axis_tokens())
    in_spec = _spec(src_t.dims, names)
    mapped = jax.shard_map(
        partial(run_program, program, axis_names=names),
        mesh=refined,
        in_specs=in_spec,
        out_specs=_spec(dst_t.dims, names),
        check_vma=False,
    )
    if refined is jmesh or not any(t == jax.sharding.AxisType.Explicit for t in jmesh.axis_types):
        return mapped
    # With Explicit axes the array's type names its mesh: restate it on the refined mesh first (the same
    # layout, so no data moves).
    return lambda x: mapped(jax.sharding.reshard(x, NamedSharding(refined, in_spec)))


def _empty(shape, dtype, sharding: NamedSharding):
    """An array of no elements laid out as ``sharding``, made on the devices. (JAX 0.10's ``jit`` gives a
    zero-size result shards of the global shape, which cannot be read back, whatever its ``out_shardings``.)"""
    local = sharding.shard_shape(tuple(shape))
    return jax.make_array_from_single_device_arrays(
        tuple(shape), sharding, [jnp.zeros(local, dtype, device=d) for d in sharding.addressable_devices])


@lru_cache(maxsize=256)
def _jitted(src_t, dst_t, jmesh, sharding):
    return jax.jit(_shard_mapped(src_t, dst_t, jmesh), out_shardings=sharding)
