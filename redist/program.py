"""The lowered buffer program: per-device SPMD instructions that every backend and the verifier read.

A :class:`Program` is what actually runs. Each device holds one local buffer; every instruction maps it to
the next one, the same instruction on every device. Groups are explicit: an instruction over ``axes``
(mesh axes or sub-axes ``name:(pre)size``) acts within each *group* of devices whose coordinates agree on
every other part of the mesh, and a device's *rank* in its group is ``mesh.group_index(device, axes)``:
row-major over ``axes`` in the order listed. ``k`` is the group size.

Instructions (``x`` is a device's buffer before, ``r`` its group rank):

- ``Slice(dim, axes)``: keep ``x[..., r·n/k : (r+1)·n/k, ...]`` along ``dim`` (``n = x.shape[dim]``). Local.
- ``AllGather(dim, axes)``: concatenate the group's buffers along ``dim`` in rank order.
- ``AllToAll(split_dim, concat_dim, axes)``: split ``x`` along ``split_dim`` into k equal chunks; chunk j goes
  to rank j; concatenate the k chunks received along ``concat_dim`` in the order of the sender's rank.
- ``ReduceScatter(dim, axes)``: sum the group's buffers, keep chunk r of k along ``dim``.
- ``AllReduce(axes)``: sum the group's buffers.
- ``CollectivePermute(sources)``: device d's new buffer is device ``sources[d]``'s buffer (a permutation of
  the devices; ``sources[d] == d`` means d keeps its buffer and receives nothing).

The numpy, JAX and MPI backends execute these, and :mod:`redist.verify` proves these same instructions
correct. Lowering is one instruction per plan step; nothing in the program refers back to sharding types.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from redist import steps as S
from redist.mesh import Mesh


@dataclass(frozen=True)
class Slice:
    dim: int
    axes: tuple[str, ...]


@dataclass(frozen=True)
class AllGather:
    dim: int
    axes: tuple[str, ...]


@dataclass(frozen=True)
class AllToAll:
    split_dim: int
    concat_dim: int
    axes: tuple[str, ...]


@dataclass(frozen=True)
class ReduceScatter:
    dim: int
    axes: tuple[str, ...]


@dataclass(frozen=True)
class AllReduce:
    axes: tuple[str, ...]


@dataclass(frozen=True)
class CollectivePermute:
    sources: tuple[int, ...]

    def pairs(self) -> tuple[tuple[int, int], ...]:
        """``(source, destination)`` pairs of the devices that move, as ``lax.ppermute`` takes them."""
        return tuple((s, d) for d, s in enumerate(self.sources) if s != d)


Instruction = Slice | AllGather | AllToAll | ReduceScatter | AllReduce | CollectivePermute


@dataclass(frozen=True)
class Program:
    """Instructions over ``mesh``; ``shapes[i]`` is the local buffer shape before instruction ``i``
    (``shapes[-1]`` the result's). ``dtype`` is a numpy dtype."""

    mesh: Mesh
    dtype: np.dtype
    instructions: tuple[Instruction, ...]
    shapes: tuple[tuple[int, ...], ...]

    def axis_tokens(self) -> tuple[str, ...]:
        """Every axis or sub-axis token that some instruction names, in first-use order."""
        seen: dict[str, None] = {}
        for ins in self.instructions:
            for a in getattr(ins, "axes", ()):
                seen.setdefault(a, None)
        return tuple(seen)

    def __str__(self) -> str:
        lines = [f"program on mesh {self.mesh}, {np.dtype(self.dtype).name}, local {self.shapes[0]}"]
        for ins, shape in zip(self.instructions, self.shapes[1:]):
            lines.append(f"  {ins}  -> {shape}")
        return "\n".join(lines)


def lower_step(step, t_in) -> Instruction:
    """The instruction that implements one typed step on buffers of type ``t_in``."""
    if isinstance(step, S.AllSlice):
        return Slice(step.dim, step.axes)
    if isinstance(step, S.AllGather):
        return AllGather(step.dim, step.axes)
    if isinstance(step, S.AllToAll):
        return AllToAll(step.dst_dim, step.src_dim, step.axes)
    if isinstance(step, S.ReduceScatter):
        return ReduceScatter(step.dim, step.axes)
    if isinstance(step, S.AllReduce):
        return AllReduce(step.axes)
    if isinstance(step, S.Permute):
        return CollectivePermute(S.permute_sources(t_in, step.apply(t_in)))
    raise TypeError(f"no lowering for step {step!r}")


def lower(steps, types) -> Program:
    """Lower typed steps (with their ``len(steps) + 1`` types) to a buffer program."""
    t0 = types[0]
    return Program(
        mesh=t0.mesh,
        dtype=t0.np_dtype,
        instructions=tuple(lower_step(s, t) for s, t in zip(steps, types)),
        shapes=tuple(t.local_shape for t in types),
    )
