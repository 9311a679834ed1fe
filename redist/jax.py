"""The JAX entry point: reshard a ``jax.Array`` by a synthesized plan, run as ``jax.shard_map`` collectives
(SPEC section 5).

    y = redist.jax.reshard(x, NamedSharding(mesh, P(None, ("x", "y"))))

:func:`reshard` reads the layouts, plans (:func:`redist.synthesize`) and runs the plan's program with the
JAX interpreter, :mod:`redist.backends.jax_backend`, whose names this module re-exports
(:func:`run_program`, :func:`run_on_buffers`, :func:`refine_mesh`, …); device order, sub-axes and group
order are described there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from redist.backends import interpreter
from redist.backends.jax_backend import (JaxBackend, in_dtype, jax_mesh_of, redist_mesh, refine_mesh,
                                         refined_axis_names, run_on_buffers, run_program)
from redist.buffers import describe
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.synthesis import synthesize
from redist.types import ShardingType

__all__ = ["reshard", "run_program", "run_on_buffers", "in_dtype", "refined_axis_names", "refine_mesh",
           "redist_mesh", "sharding_type"]


def _spec(dims, names: Mapping[str, tuple[str, ...]]) -> PartitionSpec:
    """The PartitionSpec on the refined mesh of per-dim token lists."""
    out = []
    for d in dims:
        axes = tuple(a for tok in d for a in names[tok])
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


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


def _redist_meshes(src_jmesh, jmesh) -> tuple[Mesh, Mesh]:
    """The redist meshes of the array's JAX mesh and of the target's: one mesh, or two device orders of the
    same axes and devices (:func:`redist_mesh`; both number the devices by the same ranks of their ids).
    Raises :class:`ShardingError` for anything else."""
    if _same_mesh(src_jmesh, jmesh):
        mesh = redist_mesh(jmesh)
        return mesh, mesh
    reordered = (isinstance(src_jmesh, jax.sharding.Mesh) and src_jmesh.shape_tuple == jmesh.shape_tuple
                 and {d.id for d in src_jmesh.devices.flat} == {d.id for d in jmesh.devices.flat})
    if not reordered:
        raise ShardingError(f"the array is on mesh {src_jmesh} but the target sharding on mesh {jmesh}; "
                            "reshard moves data within one mesh, or between two device orders of it (the same "
                            "axes and devices)")
    return redist_mesh(src_jmesh), redist_mesh(jmesh)


def _between_device_orders(x, src_t: ShardingType, dst_t: ShardingType, sharding, traced: bool):
    """:func:`reshard` between two device orders, eagerly: the plan's program on the buffers of every device
    (:func:`_program_on_devices`), its results restated as ``sharding``'s array where they are."""
    if traced:
        raise ShardingError(f"under jax.jit, JAX runs a computation on one device order, but the array's mesh "
                            f"({src_t.mesh}) and the target's ({dst_t.mesh}) order the devices differently; call "
                            "reshard outside jax.jit to move between them")
    with in_dtype(src_t.np_dtype):
        if x.size == 0:
            return _empty(x.shape, src_t.np_dtype, sharding)
        devices = sorted(sharding.mesh.devices.flat, key=lambda d: d.id)
        run, stacked_sharding = _program_on_devices(src_t, dst_t, tuple(devices))
        by_device = {s.device: s.data for s in x.addressable_shards}
        stacked = jax.make_array_from_single_device_arrays(
            (src_t.mesh.size,) + src_t.local_shape, stacked_sharding,
            [by_device[d][None] for d in stacked_sharding.mesh.devices.flat])
        return jax.make_array_from_single_device_arrays(
            x.shape, sharding, [s.data[0] for s in run(stacked).addressable_shards])


@lru_cache(maxsize=256)
def _program_on_devices(src_t: ShardingType, dst_t: ShardingType, devices: tuple):
    """``(jitted function, its input sharding)``: the plan's program run on a stack of every device's buffer
    (row ``p``: the device at position ``p`` of the program's mesh, on the JAX mesh of that device order,
    ``devices[d]`` being device ``d``), as :func:`run_on_buffers` runs it."""
    program = synthesize(src_t, dst_t).program
    refined, names = refine_mesh(jax_mesh_of(program.mesh, devices), program.axis_tokens())
    spec = PartitionSpec(tuple(refined.axis_names))
    backend = JaxBackend(program.mesh, names)
    mapped = jax.shard_map(lambda b: interpreter.run(program, backend, b[0])[None], mesh=refined, in_specs=spec,
                           out_specs=spec, check_vma=False)
    return jax.jit(mapped), NamedSharding(refined, spec)


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

    Device order: the array's mesh and the target's may hold the same devices in different orders (the
    same axes; ``jax.make_mesh`` and a hand-made device array, say): the plan then moves blocks between the
    two orders (SPEC 1, :func:`redist.synthesize`): it runs on every device's buffer and the result's buffers
    become the target-sharded array where they are. Only eagerly: JAX compiles a computation for one device
    order (it refuses arguments and constraints on another inside ``jax.jit``), so under ``jax.jit`` such a
    reshard raises :class:`ShardingError`.

    Raises :class:`ShardingError` if ``x`` is no JAX array, ``sharding`` (or ``x``'s sharding) is not a
    ``NamedSharding``, the meshes differ other than in device order, or the shape does not fit the
    shardings (an unknown axis, too many spec entries, a dim that does not divide).
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
    src_mesh, mesh = _redist_meshes(src.mesh, jmesh)
    try:
        dtype = np.dtype(x.dtype)
    except TypeError:
        raise ShardingError(f"unsupported dtype {x.dtype}") from None
    src_t = sharding_type(x.shape, dtype, src, src_mesh)
    dst_t = sharding_type(x.shape, dtype, sharding, mesh)
    _check_even(src_t, "the array's sharding")
    _check_even(dst_t, "the target sharding")
    if any(e is PartitionSpec.UNCONSTRAINED for e in sharding.spec):
        sharding = NamedSharding(jmesh, PartitionSpec(
            *(None if e is PartitionSpec.UNCONSTRAINED else e for e in sharding.spec)))
    if src_mesh != mesh:
        return _between_device_orders(x, src_t, dst_t, sharding, traced)
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
    backend = JaxBackend(program.mesh, names)
    mapped = jax.shard_map(
        lambda x: interpreter.run(program, backend, x),
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
