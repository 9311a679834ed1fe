"""XLA's own redistribution, and ours, measured the same way: collectives read from compiled HLO, and memory.

    comp = redist.xla_baseline.compile_xla(src, dst)      # jit(identity, out_shardings=dst) on src
    ours = redist.xla_baseline.compile_redist(src, dst)   # jit(redist.jax.reshard) on src
    comp.collectives     # [Collective(kind, axes, span, bytes_received, result_shapes, groups, pairs), ...]
    comp.bytes_received  # the most any device receives over the whole program
    comp.memory          # compiled.memory_analysis(): argument / output / temp / alias bytes per device

Both programs are compiled for an input described by ``jax.ShapeDtypeStruct(shape, dtype, sharding=
NamedSharding(mesh, src.partition_spec()))`` on the JAX mesh ``np.array(jax.devices()[:n]).reshape(shape)``,
so partition id == redist device id. The caller must give JAX enough devices (for host devices, set
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before JAX is first imported).

The collectives are read from the compiled HLO by :func:`redist.hlo.parse_hlo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from redist.extras import missing_extra

try:
    import jax
    from jax.sharding import NamedSharding
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.xla_baseline", "jax") from e

import redist.jax as rj
from redist.errors import ShardingError
from redist.hlo import Collective, parse_hlo
from redist.mesh import Mesh
from redist.types import ShardingType

__all__ = ["MemoryStats", "Compiled", "jax_mesh", "named_sharding", "compile_xla", "compile_redist", "make_input"]


# ---------------------------------------------------------------------------------------------- compiling
@dataclass(frozen=True)
class MemoryStats:
    """``compiled.memory_analysis()`` per device, in bytes."""

    argument: int
    output: int
    temp: int
    alias: int

    @property
    def temp_plus_output(self) -> int:
        return self.temp + self.output

    @classmethod
    def of(cls, compiled) -> "MemoryStats":
        ma = compiled.memory_analysis()
        return cls(int(ma.argument_size_in_bytes), int(ma.output_size_in_bytes), int(ma.temp_size_in_bytes),
                   int(ma.alias_size_in_bytes))


@dataclass
class Compiled:
    """A compiled redistribution program on ``src.mesh``: its jitted function, HLO, collectives, memory."""

    src: ShardingType
    dst: ShardingType
    fn: object
    compiled: object
    hlo: str
    collectives: list[Collective]
    memory: MemoryStats

    @property
    def communicating(self) -> list[Collective]:
        """The collectives that move bytes (no dynamic-slices, no all-local permutes)."""
        return [c for c in self.collectives if c.bytes_received > 0]

    @property
    def bytes_received(self) -> float:
        """The most any device receives over the whole program (per-device totals, then the max)."""
        if not self.collectives:
            return 0.0
        totals = np.sum([c.device_bytes for c in self.collectives], axis=0)
        return float(totals.max())


@lru_cache(maxsize=None)
def jax_mesh(mesh: Mesh):
    """``jax.sharding.Mesh(np.array(jax.devices()[:n]).reshape(shape), names)`` for a redist mesh."""
    devs = jax.devices()
    if len(devs) < mesh.size:
        raise ShardingError(f"mesh {mesh} needs {mesh.size} JAX devices, only {len(devs)} exist "
                            "(for host devices set XLA_FLAGS=--xla_force_host_platform_device_count=N first)")
    return jax.sharding.Mesh(np.array(devs[: mesh.size]).reshape(mesh.shape), mesh.names)


def named_sharding(t: ShardingType):
    """The ``NamedSharding`` of a (non-partial) type on :func:`jax_mesh`."""
    if t.partial:
        raise ShardingError(f"{t} is partial; a JAX array cannot carry pending sums here")
    return NamedSharding(jax_mesh(t.mesh), t.partition_spec())


def _input_spec(src: ShardingType):
    return jax.ShapeDtypeStruct(src.shape, src.np_dtype, sharding=named_sharding(src))


def _compile(src: ShardingType, dst: ShardingType, fn) -> Compiled:
    compiled = fn.lower(_input_spec(src)).compile()
    hlo = compiled.as_text()
    return Compiled(src, dst, fn, compiled, hlo, parse_hlo(hlo, src.mesh), MemoryStats.of(compiled))


def compile_xla(src: ShardingType, dst: ShardingType) -> Compiled:
    """XLA's redistribution: ``jax.jit(lambda a: a, out_shardings=dst)`` compiled for an input laid out as
    ``src``. (Not ``jax.device_put``, which may go through the host.)"""
    fn = jax.jit(lambda a: a, out_shardings=named_sharding(dst))
    return _compile(src, dst, fn)


def compile_redist(src: ShardingType, dst: ShardingType) -> Compiled:
    """Our redistribution: ``jax.jit(lambda a: redist.jax.reshard(a, dst, src=src), out_shardings=dst)``,
    compiled for the same input as :func:`compile_xla`."""
    s, d = named_sharding(src), named_sharding(dst)
    fn = jax.jit(lambda a: rj.reshard(a, d, src=s), out_shardings=d)
    return _compile(src, dst, fn)


def make_input(src: ShardingType, seed: int = 0):
    """A ``jax.Array`` laid out as ``src`` holding seeded data, built once from a host numpy array with
    ``jax.make_array_from_callback`` (set-up only; the measured programs never touch the host)."""
    rng = np.random.default_rng(seed)
    host = rng.standard_normal(src.shape).astype(src.np_dtype) if src.shape else np.asarray(
        rng.standard_normal(), dtype=src.np_dtype)
    return jax.make_array_from_callback(src.shape, named_sharding(src), lambda idx: host[idx]), host
