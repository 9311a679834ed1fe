"""The lowered buffer program: per-device SPMD instructions that every backend and the verifier read.

A :class:`Program` is what actually runs. Each device holds one local buffer; every instruction maps it to
the next one, the same instruction on every device. Groups are explicit: an instruction over ``axes``
(mesh axes or sub-axes ``name:(pre)size``) acts within each *group* of devices whose coordinates agree on
every other part of the mesh, and a device's *rank* in its group is ``mesh.group_index(device, axes)``:
row-major over ``axes`` in the order listed. ``k`` is the group size.

Instructions (``x`` is a device's buffer before, ``r`` its group rank):

- ``Reshape(shape)``: the same elements in row-major order, viewed with ``shape``. Local.
- ``Transpose(perm)``: ``np.transpose(x, perm)`` (result dim ``a`` is input dim ``perm[a]``). Local.
- ``Slice(dim, axes)``: keep ``x[..., r·n/k : (r+1)·n/k, ...]`` along ``dim`` (``n = x.shape[dim]``). Local.
- ``AllGather(dim, axes)``: concatenate the group's buffers along ``dim`` in rank order.
- ``AllToAll(axes)``: ``x`` has a leading dim of k chunks; chunk j (``x[j]``) goes to rank j, and the chunk
  received from rank s becomes ``new[s]``: ``new[s] = (buffer of rank s)[r]``; the shape does not change.
  (Every all-to-all of a plan is lowered to this leading-dim form between local reshapes and transposes,
  so each backend implements only this form: ``lax.all_to_all(x, axes, 0, 0, tiled=True)``, an MPI
  ``Alltoall`` of contiguous rows.)
- ``ReduceScatter(dim, axes, reduction)``: reduce the group's buffers elementwise (``reduction``: ``"sum"``,
  ``"max"``, ``"min"`` or ``"prod"``; of ``bool`` buffers sum and max are the logical or, min and prod the
  logical and; max and min propagate NaN), keep chunk r of k along ``dim``. When k does not divide
  ``n = x.shape[dim]``, the chunks follow XLA's padding rule: chunk r is ``[min(n, r·L), min(n, (r+1)·L))``
  with ``L = ceil(n/k)``, at the start of a result of ``L`` along ``dim`` whose rest is zero (the typed step
  makes this only of a dim that no axis split before; see :class:`redist.steps.ReduceScatter`).
- ``AllReduce(axes, reduction)``: reduce the group's buffers elementwise, as ``ReduceScatter``.
- ``KeepRoot(axes)``: the member of rank 0 keeps ``x``; every other member's buffer becomes zeros. Local.
- ``EmbedChunk(dim, axes)``: a zero buffer k times longer along ``dim`` with ``x`` as chunk r:
  ``new[..., r·n : (r+1)·n, ...] = x`` (the adjoint of ``Slice``). Local.

  These two create pending sums (:class:`redist.steps.ReplicateToPartial`, :class:`redist.steps.ShardToPartial`)
  and are the only instructions that write values no device held: zeros, the identity of a sum (only sums
  are created: :func:`redist.bounds.check_pair`). (A ``shard_to_partial`` that leaves an uneven dim whole
  is lowered to an ``Exchange`` of local copies instead (a :class:`CopyTable`), each device's block placed where the dim holds it:
  an ``EmbedChunk`` would place it at ``r·n``, past the end for the last blocks.)
- ``CollectivePermute(sources)``: device d's new buffer is device ``sources[d]``'s buffer, where ``sources`` is
  a tuple of device ids (a permutation of the devices; ``sources[d] == d`` means d keeps its buffer and
  receives nothing) or a :class:`CoordinateMap`: the source of d is the device whose rank over ``source_axes``
  is d's rank over ``axes``, for each of its groups ``(source_axes, axes)``, and whose other coordinates are
  d's. Lowered permutes are coordinate maps (a few axes, whatever the device count); a table serves
  permutations without such structure (a program written by hand).
- ``Exchange(shape, dims)``: device d's new buffer has ``shape``, zero where no copy writes (padding), and is
  filled by copies of boxes from other buffers. ``dims[i]`` (an :class:`ExchangeDim`) lists the dim's
  :class:`~redist.blocks.Segment` s: a device whose rank over ``axes`` is ``block`` takes ``[src_start,
  src_start + size)`` from a device whose rank over ``source_axes`` is ``source_block`` into ``[dst_start,
  dst_start + size)``. A copy is one segment per dim (for d's blocks), from the device that differs from d
  only in its coordinates on the source axes of all dims, which are those of its segments' source blocks
  (:meth:`Exchange.copies`): ``new[c.dst_start : c.dst_start + c.size] = (buffer of device c.source)[c.src_start
  : c.src_start + c.size]``. Point-to-point: it differs per device, and the boxes of one device do not
  overlap. The tables have ``O(k_in + k_out)`` segments per dim, whatever the device count.

Instructions name their axes as :class:`~redist.axes.Axis` values, which are the token strings (lowering makes
them on the plan's mesh; a program built by hand may name them as plain token strings). Backends read them
through the mesh (``mesh.groups``, ``mesh.group_index``, ``mesh.axis``); the verifier reads their text.

Devices. ``d`` above is a device id, and buffers are per device id (an MPI rank, a shard of
:func:`redist.execute`). Groups and ranks are those of ``Program.mesh``, whose ``device_ids`` say which device
is at which position (:class:`redist.Mesh`). A permute's table names devices by id and does not depend on
it; a coordinate map and an exchange's segment tables speak of coordinates, those of positions on ``mesh``.
``src_mesh`` and ``dst_mesh`` are the device orders the input buffers and the result are laid out in (the
source's and destination's meshes: the same axes as ``mesh``, and ``mesh`` itself unless the plan changes the
device order, which it does by a permute or an exchange; every collective of a plan runs on one device order,
``mesh``). Lowered, such a change is a permute's table, or an exchange on ``mesh`` next to a table that
relabels whole buffers between ``mesh`` and the other order.

Device ids are any distinct numbers (:class:`redist.Mesh`): tables by device id (a permute's table, a
:class:`CopyTable`) have an entry for every number up to the mesh's ``id_bound``, the identity or no copies at
a number that is no device of it.

Stages. A plan across meshes (a ``transfer`` step, :class:`redist.steps.Transfer`) lowers to *stages*
(:func:`redist.lowering.lower_stages`): a :class:`Program` per run of steps on one mesh, and a :class:`Transfer` between two
runs, the per-device copies (naming global device ids) that move the buffers from the devices of one mesh to
those of the next. A plan within one mesh is one program. Each runtime runs a program as it is; a transfer
is point to point between whichever devices the copies name.

The backends (:mod:`redist.backends`) execute these, and :mod:`redist.verify` proves these same instructions
correct; :mod:`redist.lowering` makes them from a plan's typed steps. Nothing here refers to sharding types or
steps.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from redist.axes import Axis, check_factorization
from redist.blocks import (Copy, DeviceClasses, Segment, check_listed, copied_elements, device_coords, device_id, rank,
                           with_ranks)
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.types import REDUCTIONS


@dataclass(frozen=True)
class Reshape:
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Transpose:
    perm: tuple[int, ...]


@dataclass(frozen=True)
class Slice:
    dim: int
    axes: tuple[Axis, ...]


@dataclass(frozen=True)
class AllGather:
    dim: int
    axes: tuple[Axis, ...]


@dataclass(frozen=True)
class AllToAll:
    axes: tuple[Axis, ...]


@dataclass(frozen=True)
class ReduceScatter:
    dim: int
    axes: tuple[Axis, ...]
    reduction: str = "sum"


@dataclass(frozen=True)
class AllReduce:
    axes: tuple[Axis, ...]
    reduction: str = "sum"


@dataclass(frozen=True)
class KeepRoot:
    axes: tuple[Axis, ...]


@dataclass(frozen=True)
class EmbedChunk:
    dim: int
    axes: tuple[Axis, ...]


@dataclass(frozen=True)
class CoordinateMap:
    """The source of every device of a permute, by coordinates: for each group ``(source_axes, axes)`` of
    ``groups``, the source's rank over ``source_axes`` is the device's rank over ``axes``; its coordinates on
    every other part of the mesh are the device's. It is a permutation when each group's two sides have the
    same size and the source axes of all groups cover the same factors of the mesh as their axes
    (:meth:`check`)."""

    groups: tuple[tuple[tuple[Axis, ...], tuple[Axis, ...]], ...]

    def sources(self, mesh: Mesh, devices):
        """The source of each of ``devices`` (a device id, or a numpy array of them)."""
        c = device_coords(mesh, devices)
        return device_id(mesh, with_ranks(c, [(mesh.axes_of(s), rank(c, mesh.axes_of(a))) for s, a in self.groups]))

    def inverse(self) -> "CoordinateMap":
        """The map of the inverse permutation: the device that takes each device's buffer."""
        return CoordinateMap(tuple((a, s) for s, a in self.groups))

    def check(self, mesh: Mesh) -> None:
        """Raise :class:`ShardingError` unless the map is a permutation of ``mesh``'s devices: axes of the mesh,
        the two sides of each group of equal size, no factor of a mesh axis on one side twice, both sides
        covering the same factors of each mesh axis, and all of them factors of one decomposition of it."""
        sides: list[list[Axis]] = [[], []]
        if not (isinstance(self.groups, tuple) and all(isinstance(g, tuple) and len(g) == 2 for g in self.groups)):
            raise ShardingError(f"a permute's groups must be (source_axes, axes) pairs, got {self.groups!r:.80}")
        for source_axes, axes in self.groups:
            s, a = mesh.axes_of(source_axes), mesh.axes_of(axes)
            if mesh.group_size(s) != mesh.group_size(a):
                raise ShardingError(f"group ({','.join(s)}) <- ({','.join(a)}) of a permute: the sides have "
                                    f"{mesh.group_size(s)} and {mesh.group_size(a)} coordinates")
            sides[0] += s
            sides[1] += a
        for name in mesh.names:
            on = [[x for x in side if x.name == name] for side in sides]
            check_factorization(name, on[0] + on[1])
            covered = []
            for side in on:
                for i, x in enumerate(side):
                    if any(x.overlaps(y) for y in side[:i]):
                        raise ShardingError(f"axis {x} is named twice on one side of a permute's groups")
                covered.append(_merged(sorted((x.pre, x.stop) for x in side)))
            if covered[0] != covered[1]:
                raise ShardingError(f"a permute's groups name other factors of mesh axis {name!r} on the source "
                                    "side than on the other: it is no permutation")


def _merged(ranges) -> list[tuple[int, int]]:
    """Sorted factor ranges ``[lo, hi)`` with adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        elif lo != hi:
            out.append((lo, hi))
    return out


@dataclass(frozen=True)
class CollectivePermute:
    sources: tuple[int, ...] | CoordinateMap

    def source_of(self, mesh: Mesh, device: int) -> int:
        """The device whose buffer ``device`` takes."""
        if isinstance(self.sources, CoordinateMap):
            return int(self.sources.sources(mesh, device))
        return self.sources[device]

    def target_of(self, mesh: Mesh, device: int) -> int:
        """The device that takes ``device``'s buffer."""
        if isinstance(self.sources, CoordinateMap):
            return int(self.sources.inverse().sources(mesh, device))
        return self.sources.index(device)

    def source_table(self, mesh: Mesh) -> tuple[int, ...]:
        """The source of every device, by device id (a table of the mesh's :attr:`~redist.Mesh.id_bound`
        entries, each number that is no device its own source: for runtimes that need one)."""
        if isinstance(self.sources, CoordinateMap):
            table = np.arange(mesh.id_bound, dtype=np.int64)
            devices = np.asarray(mesh.devices, dtype=np.int64)
            table[devices] = self.sources.sources(mesh, devices)
            return tuple(table.tolist())
        return self.sources

    def moves(self) -> bool:
        """Whether some device takes another's buffer (a coordinate map moves some device when it has a group:
        lowering leaves out groups that keep every device in place)."""
        if isinstance(self.sources, CoordinateMap):
            return bool(self.sources.groups)
        return any(s != d for d, s in enumerate(self.sources))

    def __str__(self) -> str:
        if isinstance(self.sources, CoordinateMap):
            return "CollectivePermute(" + ", ".join(f"({','.join(s)}) <- ({','.join(a)})"
                                                    for s, a in self.sources.groups) + ")"
        text = str(self.sources)
        return f"CollectivePermute({text if len(text) <= 80 else text[:77] + '...'})"


def _occurrence(receiver: np.ndarray, source: np.ndarray) -> np.ndarray:
    """For moves listed in order, how many earlier moves have the same receiver and source: the j of the
    j-th copy a receiver gets from one source (:meth:`Exchange.rounds`' second round key)."""
    order = np.lexsort((np.arange(receiver.size), source, receiver))
    r, s = receiver[order], source[order]
    first = np.ones(order.size, bool)
    first[1:] = (r[1:] != r[:-1]) | (s[1:] != s[:-1])
    position = np.arange(order.size)
    out = np.empty(order.size, np.int64)
    out[order] = position - np.maximum.accumulate(np.where(first, position, 0))
    return out


@dataclass(frozen=True)
class ExchangeDim:
    """One dim of an :class:`Exchange`: the receiver's block is its rank over ``axes``, a sender's its rank over
    ``source_axes``, and ``segments`` say which interval of the dim goes where (by receiver block)."""

    source_axes: tuple[Axis, ...]
    axes: tuple[Axis, ...]
    segments: tuple[Segment, ...]

    @cached_property
    def by_block(self) -> dict[int, tuple[Segment, ...]]:
        """The segments of each receiver block, in table order."""
        out: dict[int, list[Segment]] = {}
        for seg in self.segments:
            out.setdefault(seg.block, []).append(seg)
        return {b: tuple(segs) for b, segs in out.items()}


@dataclass(frozen=True)
class CopyTable:
    """The copies of every device, by device id (``copies[d]``): the form of an exchange between two device
    orders, whose devices have no coordinates in common (a mesh in another order is a table of its devices),
    and of the local copies of a ``shard_to_partial`` onto an uneven dim (each device's source is itself)."""

    copies: tuple[tuple[Copy, ...], ...]


@dataclass(frozen=True)
class Exchange:
    shape: tuple[int, ...]
    dims: tuple[ExchangeDim, ...] | CopyTable

    def copies(self, mesh: Mesh, device: int) -> tuple[Copy, ...]:
        """The copies that fill ``device``'s buffer: one per combination of a segment of each dim (for its
        blocks), in table order, from the device that differs from it only on the source axes (a
        :class:`CopyTable`: the device's row)."""
        if isinstance(self.dims, CopyTable):
            return self.dims.copies[device]
        c = device_coords(mesh, device)
        per_dim = [x.by_block.get(rank(c, mesh.axes_of(x.axes)), ()) for x in self.dims]
        out = []
        for segs in itertools.product(*per_dim):
            source = device_id(mesh, with_ranks(c, [(mesh.axes_of(x.source_axes), seg.source_block)
                                                    for x, seg in zip(self.dims, segs)]))
            out.append(Copy(int(source), tuple(s.src_start for s in segs), tuple(s.dst_start for s in segs),
                            tuple(s.size for s in segs)))
        return tuple(out)

    def copies_from(self, mesh: Mesh, device: int) -> list[tuple[int, Copy]]:
        """``(receiver, copy)`` for every copy whose source is ``device`` and whose receiver is another device, by
        receiver, each receiver's in the order of :meth:`copies`. Only the devices that differ from ``device``
        on the source axes can receive from it; they are found per class of those axes
        (:class:`~redist.blocks.DeviceClasses`), with no pass over the whole mesh (a :class:`CopyTable` is
        searched)."""
        if isinstance(self.dims, CopyTable):
            return [(d, c) for d, copies in enumerate(self.dims.copies) if d != device for c in copies
                    if c.source == device]
        mine = device_coords(mesh, device)
        classes = DeviceClasses(mesh, [a for x in self.dims for a in x.source_axes])
        receivers = classes.around(device)
        if classes.size > 1:
            c = device_coords(mesh, receivers)
            keep = np.ones(classes.size, bool)
            for x in self.dims:  # a receiver's block must have a segment from this device's source block
                mine_b = rank(mine, mesh.axes_of(x.source_axes))
                blocks = [seg.block for seg in x.segments if seg.source_block == mine_b]
                keep &= np.isin(rank(c, mesh.axes_of(x.axes)), blocks)
            receivers = receivers[keep]
        out = []
        for d in sorted(set(np.atleast_1d(receivers).tolist()) - {device}):
            out += [(d, cp) for cp in self.copies(mesh, d) if cp.source == device]
        return out

    def rounds(self, mesh: Mesh, local: bool = False) -> tuple[tuple[int, tuple[tuple[int, int, Copy], ...]], ...]:
        """The copies in rounds ``(shift, ((source, destination, copy), …))`` in which every device sends at most
        one copy and receives at most one: a round is a shift ``(destination − source) mod n`` and the
        how-many-th copy of such a pair it is, in the order of (shift, that count). The JAX backend runs each
        round of a nonzero shift as one ``ppermute``, and the cost model charges each its latency. Copies of no
        elements are left out, and so are copies within a device (shift 0) unless ``local``. This visits every
        device of ``mesh`` (a ``ppermute`` takes its pairs device by device). ``n`` is the mesh's
        :attr:`~redist.Mesh.id_bound` (its size where its devices are ``0 … size−1``)."""
        n = mesh.id_bound
        rounds: dict[tuple[int, int], list[tuple[int, int, Copy]]] = {}
        for d in mesh.devices:
            seen: dict[int, int] = {}
            for c in self.copies(mesh, d):
                if (c.source == d and not local) or math.prod(c.size) == 0:
                    continue
                j = seen.get(c.source, 0)
                seen[c.source] = j + 1
                rounds.setdefault(((d - c.source) % n, j), []).append((c.source, d, c))
        return tuple((shift, tuple(moves)) for (shift, _), moves in sorted(rounds.items()))

    def round_stats(self, mesh: Mesh) -> tuple[tuple[tuple[int, ...], tuple[str, ...]], ...]:
        """Per round of :meth:`rounds` (copies within a device left out), in order: the round's slab (the
        largest copy of the round along each dim) and the mesh axes along which its senders and receivers
        differ, in mesh order. The same figures as read from :meth:`rounds`, computed with numpy over every
        device at once from the segment tables (what :func:`redist.cost.exchange_time` prices): an array per copy
        slot over the devices, so :class:`ShardingError` where there are more than
        :data:`redist.blocks.MAX_LISTED` pairs of a device and a slot."""
        if isinstance(self.dims, CopyTable):
            return tuple((tuple(max(c.size[i] for _, _, c in moves) for i in range(len(self.shape))),
                          mesh.varying_axes((s, d) for s, d, _ in moves)) for _, moves in self.rounds(mesh))
        if not self.dims:  # rank 0: each device copies its own scalar
            return ()
        n = mesh.size
        check_listed(n * math.prod(max((len(v) for v in x.by_block.values()), default=0) for x in self.dims),
                     f"the pairs of a device and a copy slot of {self} on a mesh of {n:,} devices, priced round "
                     "by round")
        ids = np.asarray(mesh.devices, dtype=np.int64)
        c = device_coords(mesh, ids)
        tables = []  # per dim: the receiver block of each device, and per block its k-th segment's fields
        for x in self.dims:
            slots = max((len(v) for v in x.by_block.values()), default=0)
            if slots == 0:
                return ()
            k_out = max(x.by_block) + 1
            source_block = np.full((k_out, slots), -1, np.int64)
            size = np.zeros((k_out, slots), np.int64)
            for b, segs in x.by_block.items():
                for k, seg in enumerate(segs):
                    source_block[b, k], size[b, k] = seg.source_block, seg.size
            block = np.broadcast_to(rank(c, mesh.axes_of(x.axes)), (n,))
            ok = block < k_out
            tables.append((mesh.axes_of(x.source_axes), np.where(ok, block, 0), ok, source_block, size))
        sources, sizes, valid = [], [], []  # per copy slot, in the order of copies(): arrays over devices
        for combo in itertools.product(*(range(t[3].shape[1]) for t in tables)):
            live, size_k, replace_k = np.ones(n, bool), [], []
            for (axes, block, ok, source_block, size), k in zip(tables, combo):
                sb = source_block[block, k]
                live &= ok & (sb >= 0) & (size[block, k] > 0)
                size_k.append(size[block, k])
                replace_k.append((axes, np.maximum(sb, 0)))
            source = np.asarray(device_id(mesh, with_ranks(c, replace_k)), np.int64)
            sources.append(source)
            sizes.append(np.stack(size_k))
            valid.append(live & (source != ids))
        slot, at_device = np.nonzero(np.stack(valid))  # the moves between devices, by copy slot then receiver
        source, dest = np.stack(sources)[slot, at_device], ids[at_device]
        rounds, at = np.unique((((dest - source) % mesh.id_bound) * len(sources) + _occurrence(dest, source)),
                               return_inverse=True)  # round key order: (shift, j)
        slab = np.zeros((len(tables), rounds.size), np.int64)
        np.maximum.at(slab, (slice(None), at), np.stack(sizes)[slot, :, at_device].T)
        src_c, dst_c = device_coords(mesh, source), device_coords(mesh, dest)
        varying = np.zeros((len(mesh.names), rounds.size), bool)
        np.logical_or.at(varying, (slice(None), at), np.stack([src_c[m] != dst_c[m] for m in mesh.names]))
        return tuple((tuple(int(v) for v in slab[:, r]), tuple(m for m, on in zip(mesh.names, varying[:, r]) if on))
                     for r in range(rounds.size))

    def __str__(self) -> str:
        if isinstance(self.dims, CopyTable):
            moved = sum(c.source != d for d, cs in enumerate(self.dims.copies) for c in cs)
            return f"Exchange(shape={self.shape}, {moved} copies between devices)"
        parts = [f"({','.join(x.source_axes)}) -> ({','.join(x.axes)}): {len(x.segments)} segments" for x in self.dims]
        return f"Exchange(shape={self.shape}, {'; '.join(parts) or 'rank 0'})"


Instruction = (Reshape | Transpose | Slice | AllGather | AllToAll | ReduceScatter | AllReduce | KeepRoot | EmbedChunk
               | CollectivePermute | Exchange)


@dataclass(frozen=True)
class Transfer:
    """The buffers move from the devices of ``src_mesh`` to those of ``mesh`` (any two meshes; they may share
    devices): every device ``d`` of ``mesh`` gets a new buffer of ``shape``, zero where no copy writes
    (padding), filled by its copies ``copies.copies[d]`` (:class:`~redist.blocks.Copy`, each from the buffer of
    shape ``src_shape`` of device ``c.source`` of ``src_mesh``, named by its global id); the devices of
    ``src_mesh`` that are not devices of ``mesh`` drop their buffers. Point to point, like an :class:`Exchange`
    between device orders, but across meshes: it is a stage of its own between two programs
    (:func:`redist.lowering.lower_stages`), not an instruction of one. The copy table is indexed by device id up to
    ``mesh.id_bound``."""

    src_mesh: Mesh
    mesh: Mesh
    src_shape: tuple[int, ...]
    shape: tuple[int, ...]
    copies: CopyTable

    def received_bytes(self, itemsize: int) -> np.ndarray:
        """Per device id of ``mesh`` (up to its ``id_bound``), the bytes it copies from other devices."""
        return copied_elements(self.copies.copies) * itemsize

    def __str__(self) -> str:
        moved = sum(c.source != d for d, cs in enumerate(self.copies.copies) for c in cs)
        return f"Transfer({self.src_mesh} -> {self.mesh}, shape={self.shape}, {moved} copies between devices)"


@dataclass(frozen=True)
class Program:
    """Instructions over ``mesh``; ``shapes[i]`` is the local buffer shape before instruction ``i``
    (``shapes[-1]`` the result's). ``dtype`` is a numpy dtype. ``src_mesh`` and ``dst_mesh`` (None: ``mesh``)
    are the device orders of the input buffers and of the result (see "Devices" above)."""

    mesh: Mesh
    dtype: np.dtype
    instructions: tuple[Instruction, ...]
    shapes: tuple[tuple[int, ...], ...]
    src_mesh: Mesh | None = None
    dst_mesh: Mesh | None = None

    def __post_init__(self):
        for name in ("src_mesh", "dst_mesh"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.mesh)

    def axis_tokens(self) -> tuple[Axis, ...]:
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


def point_to_point_bytes(program: Program) -> np.ndarray:
    """Per device id (up to the mesh's :attr:`~redist.Mesh.id_bound`; 0 at a number that is no device), the bytes
    the program's permutes and exchanges bring it from other devices, all devices at once (numpy): a permute its
    whole buffer where its source is another device; an exchange the product over dims of the sizes of the
    segments of its blocks, less the product of those it reads from itself (whose source block is its own rank
    over the dim's source axes)."""
    mesh, item = program.mesh, np.dtype(program.dtype).itemsize
    ids = np.asarray(mesh.devices, dtype=np.int64)
    c = device_coords(mesh, ids)
    total = np.zeros(mesh.id_bound, np.int64)
    for ins, shape in zip(program.instructions, program.shapes):
        if isinstance(ins, CollectivePermute):
            sources = ins.sources.sources(mesh, ids) if isinstance(ins.sources, CoordinateMap) else \
                np.asarray(ins.sources)[ids]
            total[ids] += np.where(sources != ids, math.prod(shape) * item, 0)
        elif isinstance(ins, Exchange) and isinstance(ins.dims, CopyTable):
            total += copied_elements(ins.dims.copies) * item
        elif isinstance(ins, Exchange):
            every, own = 1, 1
            for x in ins.dims:
                source_axes = mesh.axes_of(x.source_axes)
                k_in = mesh.group_size(source_axes)
                block = rank(c, mesh.axes_of(x.axes))
                by_block: dict[int, int] = {}
                by_pair: dict[int, int] = {}
                for g in x.segments:
                    by_block[g.block] = by_block.get(g.block, 0) + g.size
                    by_pair[g.block * k_in + g.source_block] = by_pair.get(g.block * k_in + g.source_block, 0) + g.size
                every = every * _sizes_at(by_block, block)
                own = own * _sizes_at(by_pair, block * k_in + rank(c, source_axes))
            total[ids] += (every - own) * item
    return total


def _sizes_at(sizes: dict[int, int], keys) -> np.ndarray:
    """``sizes[key]`` (0 where absent) for every entry of ``keys`` (a numpy array or an int)."""
    keys = np.broadcast_to(np.asarray(keys, dtype=np.int64), np.shape(keys))
    if not sizes:
        return np.zeros(keys.shape, np.int64)
    known = np.array(sorted(sizes), dtype=np.int64)
    values = np.array([sizes[k] for k in known.tolist()], dtype=np.int64)
    at = np.minimum(np.searchsorted(known, keys), len(known) - 1)
    return np.where(known[at] == keys, values[at], 0)


def moves_nothing(ins, shape, mesh) -> bool:
    """Instructions that leave every buffer as it is (steps over size-1 axes, identity permutations) are
    left out of the program."""
    if isinstance(ins, CollectivePermute):
        return not ins.moves()
    if isinstance(ins, Exchange):
        return False
    if isinstance(ins, Reshape):
        return tuple(ins.shape) == tuple(shape)
    if isinstance(ins, Transpose):
        return tuple(ins.perm) == tuple(range(len(shape)))
    return mesh.group_size(ins.axes) == 1


def shape_after(ins: Instruction, shape, mesh: Mesh) -> tuple[int, ...]:
    """The local shape after ``ins`` on a buffer of ``shape`` on ``mesh``.

    Raises :class:`~redist.errors.ShardingError` when ``ins`` cannot run on such a buffer: a dim the buffer
    lacks, a split into chunks that does not divide, an all-to-all whose leading dim is not its group size,
    a reshape to another number of elements, a transpose or permute that is not a permutation, an exchange
    whose copies do not fit the buffers, a reduction of no known kind; and, from ``mesh``, axes that are not
    its own. (A reduce-scatter whose group size does not divide its dim pads its chunks; a slice does not.)
    """
    shape = tuple(shape)
    where = f"{type(ins).__name__} on a local buffer of shape {shape}"
    if isinstance(ins, Reshape):
        if math.prod(ins.shape) != math.prod(shape) or any(n < 0 for n in ins.shape):
            raise ShardingError(f"{where}: cannot view it as {tuple(ins.shape)}")
        return tuple(ins.shape)
    if isinstance(ins, Transpose):
        if sorted(ins.perm) != list(range(len(shape))):
            raise ShardingError(f"{where}: {tuple(ins.perm)} is not a permutation of its dims")
        return tuple(shape[p] for p in ins.perm)
    if isinstance(ins, CollectivePermute):
        if isinstance(ins.sources, CoordinateMap):
            try:
                ins.sources.check(mesh)
            except ShardingError as e:
                raise ShardingError(f"{where}: {e}") from None
        elif sorted(ins.sources) != list(range(mesh.id_bound)) or any(
                s != d for d, s in enumerate(ins.sources) if not mesh.has_device(d)):
            raise ShardingError(f"{where}: sources are not a permutation of the {mesh.size} devices")
        return shape
    if isinstance(ins, Exchange):
        _check_exchange(ins, shape, mesh, where)
        return tuple(ins.shape)
    if isinstance(ins, (ReduceScatter, AllReduce)) and ins.reduction not in REDUCTIONS:
        raise ShardingError(f"{where}: reduction {ins.reduction!r} is not one of {', '.join(REDUCTIONS)}")
    k = mesh.group_size(ins.axes)
    if isinstance(ins, (AllReduce, KeepRoot)):
        return shape
    dim = 0 if isinstance(ins, AllToAll) else ins.dim
    if not 0 <= dim < len(shape):
        raise ShardingError(f"{where}: the buffer has no dim {dim}")
    s = list(shape)
    if isinstance(ins, AllToAll):
        if s[0] != k:
            raise ShardingError(f"{where}: the leading dim must hold the {k} chunks of its group")
    elif isinstance(ins, (AllGather, EmbedChunk)):
        s[dim] *= k
    elif isinstance(ins, ReduceScatter):
        s[dim] = -(-s[dim] // k)
    else:  # Slice
        if s[dim] % k:
            raise ShardingError(f"{where}: dim {dim} does not split into {k} equal chunks")
        s[dim] //= k
    return tuple(s)


def _check_exchange(ins: Exchange, shape, mesh: Mesh, where: str) -> None:
    """An exchange's tables: one per dim of the buffer; axes of the mesh, the source axes of all dims not
    overlapping (so that a copy has one source); every segment's blocks in range, its intervals inside both
    buffers, and the segments of one receiver block not overlapping (so neither do a device's copies). A
    :class:`CopyTable`: :func:`_check_copies`."""
    if isinstance(ins.dims, CopyTable):
        return _check_copies(ins, shape, mesh, where)
    tables = isinstance(ins.dims, tuple) and all(
        isinstance(x, ExchangeDim) and isinstance(x.segments, tuple)
        and all(isinstance(g, tuple) and len(g) == 5 and all(isinstance(v, int) for v in g) for g in x.segments)
        for x in ins.dims)
    if not tables:
        raise ShardingError(f"{where}: its dims must be a tuple of ExchangeDim tables of Segments")
    if len(ins.dims) != len(shape) or len(ins.shape) != len(shape):
        raise ShardingError(f"{where}: expected tables for the {len(shape)} dims of the buffer into a buffer of "
                            f"rank {len(shape)}, got {len(ins.dims)} into shape {tuple(ins.shape)}")
    sources = [a for x in ins.dims for a in mesh.axes_of(x.source_axes)]
    for i, a in enumerate(sources):
        if any(a.overlaps(b) for b in sources[:i]):
            raise ShardingError(f"{where}: source axis {a} is named twice")
    for name in {a.name for a in sources}:
        check_factorization(name, [a for a in sources if a.name == name])
    for i, (x, cap_in, cap_out) in enumerate(zip(ins.dims, shape, ins.shape)):
        k_out, k_in = mesh.group_size(x.axes), mesh.group_size(x.source_axes)
        end: dict[int, list[tuple[int, int]]] = {}
        for seg in x.segments:
            fits = (0 <= seg.block < k_out and 0 <= seg.source_block < k_in and seg.size >= 0 and seg.src_start >= 0
                    and seg.dst_start >= 0 and seg.src_start + seg.size <= cap_in
                    and seg.dst_start + seg.size <= cap_out)
            if not fits:
                raise ShardingError(f"{where}: segment {tuple(seg)} of dim {i} does not fit the buffers")
            end.setdefault(seg.block, []).append((seg.dst_start, seg.dst_start + seg.size))
        for b, spans in end.items():
            spans = sorted(s for s in spans if s[1] > s[0])
            if any(a[1] > z[0] for a, z in zip(spans, spans[1:])):
                raise ShardingError(f"{where}: segments of block {b} of dim {i} overlap")


def _check_copies(ins: Exchange, shape, mesh: Mesh, where: str) -> None:
    """An exchange's copy table (:func:`check_copy_table`, from and to the devices of ``mesh``)."""
    check_copy_table(ins.dims.copies, shape, ins.shape, mesh, mesh, where)


def check_copy_table(table, shape, new_shape, senders: Mesh, mesh: Mesh, where: str) -> None:
    """Raise :class:`ShardingError` unless ``table`` holds copies for every device id up to ``mesh``'s
    :attr:`~redist.Mesh.id_bound` (none at a number that is no device of it), each from a device of ``senders``,
    inside both buffers (``shape`` and ``new_shape``), and no two copies of a device writing one element (which
    of them wins would be the backend's choice): an exchange's (``senders`` its mesh) or a transfer's."""
    n_dev = mesh.id_bound
    if not isinstance(table, tuple) or len(table) != n_dev or len(new_shape) != len(shape):
        raise ShardingError(f"{where}: expected copies for {n_dev} devices into a buffer of rank {len(shape)}, "
                            f"got {len(table) if isinstance(table, tuple) else table!r} into shape {tuple(new_shape)}")
    for d, copies in enumerate(table):
        if copies and not mesh.has_device(d):
            raise ShardingError(f"{where}: {d} is no device of mesh {mesh}, but has copies")
        for c in copies:
            fits = all(n >= 0 and 0 <= a and a + n <= cap_in and 0 <= b and b + n <= cap_out
                       for a, b, n, cap_in, cap_out in zip(c.src_start, c.dst_start, c.size, shape, new_shape))
            if not (isinstance(c, Copy) and senders.has_device(c.source) and len(c.size) == len(shape) and fits):
                raise ShardingError(f"{where}: copy {c} of device {d} does not fit the buffers")
        for i, c in enumerate(copies):
            for e in copies[:i]:
                if all(max(b, f) < min(b + n, f + m) for b, n, f, m in zip(c.dst_start, c.size, e.dst_start, e.size)):
                    raise ShardingError(f"{where}: copies {e} and {c} of device {d} overlap")
