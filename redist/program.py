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
  is lowered to an ``Exchange`` of local copies instead, each device's block placed where the dim holds it:
  an ``EmbedChunk`` would place it at ``r·n``, past the end for the last blocks.)
- ``CollectivePermute(sources)``: device d's new buffer is device ``sources[d]``'s buffer (a permutation of
  the devices; ``sources[d] == d`` means d keeps its buffer and receives nothing).
- ``Exchange(shape, copies)``: device d's new buffer has ``shape``, zero where no copy writes (padding), and
  for each :class:`~redist.blocks.Copy` ``c`` in ``copies[d]``: ``new[c.dst_start : c.dst_start + c.size] =
  (buffer of device c.source)[c.src_start : c.src_start + c.size]`` (boxes, per dim). Point-to-point: it
  differs per device, and the boxes of one device do not overlap.

Instructions name their axes as :class:`~redist.axes.Axis` values, which are the token strings (lowering makes
them on the plan's mesh; a program built by hand may name them as plain token strings). Backends read them
through the mesh (``mesh.groups``, ``mesh.group_index``, ``mesh.axis``); the verifier reads their text.

Devices. ``d`` above is a device id, and buffers are per device id (an MPI rank, a shard of
:func:`redist.execute`). Groups and ranks are those of ``Program.mesh``, whose ``device_ids`` say which device
is at which position (:class:`redist.Mesh`); ``CollectivePermute`` and ``Exchange`` name devices by id and do
not depend on it. ``src_mesh`` and ``dst_mesh`` are the device orders the input buffers and the result are
laid out in (the source's and destination's meshes: the same axes as ``mesh``, and ``mesh`` itself unless the
plan changes the device order, which it does by a permute or an exchange; every collective of a plan runs on
one device order, ``mesh``).

The backends (:mod:`redist.backends`) execute these, and :mod:`redist.verify` proves these same instructions
correct. Lowering is one instruction per plan step, except that an all-to-all step (of one move or several)
becomes one ``AllToAll`` between local reshapes and transposes that bring its chunks to the front and the
received ones into place, and that a step which moves nothing (over size-1 axes, or an identity
permutation) has no instruction; nothing in the program refers back to sharding types. ``pad`` and
``unpad`` steps are views and have no instruction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from redist import steps as S
from redist.axes import Axis
from redist.blocks import Copy, exchange_copies, local_box, permute_sources
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
class CollectivePermute:
    sources: tuple[int, ...]

    def pairs(self) -> tuple[tuple[int, int], ...]:
        """``(source, destination)`` pairs of the devices that move, as ``lax.ppermute`` takes them."""
        return tuple((s, d) for d, s in enumerate(self.sources) if s != d)


@dataclass(frozen=True)
class Exchange:
    shape: tuple[int, ...]
    copies: tuple[tuple[Copy, ...], ...]  # per destination device

    def received(self, device: int) -> int:
        """Elements ``device`` receives from other devices."""
        return sum(math.prod(c.size) for c in self.copies[device] if c.source != device)

    def rounds(self, local: bool = False) -> tuple[tuple[int, tuple[tuple[int, int, Copy], ...]], ...]:
        """The copies in rounds ``(shift, ((source, destination, copy), …))`` in which every device sends at most
        one copy and receives at most one: a round is a shift ``(destination − source) mod n`` and the
        how-many-th copy of such a pair it is, in the order of (shift, that count). The JAX backend runs each
        round of a nonzero shift as one ``ppermute``, and the cost model charges each its latency. Copies of no
        elements are left out, and so are copies within a device (shift 0) unless ``local``."""
        n = len(self.copies)
        rounds: dict[tuple[int, int], list[tuple[int, int, Copy]]] = {}
        for d, copies in enumerate(self.copies):
            seen: dict[int, int] = {}
            for c in copies:
                if (c.source == d and not local) or math.prod(c.size) == 0:
                    continue
                j = seen.get(c.source, 0)
                seen[c.source] = j + 1
                rounds.setdefault(((d - c.source) % n, j), []).append((c.source, d, c))
        return tuple((shift, tuple(moves)) for (shift, _), moves in sorted(rounds.items()))

    def __str__(self) -> str:
        moved = sum(1 for d, cs in enumerate(self.copies) for c in cs if c.source != d)
        return f"Exchange(shape={self.shape}, {moved} transfers between devices)"


Instruction = (Reshape | Transpose | Slice | AllGather | AllToAll | ReduceScatter | AllReduce | KeepRoot | EmbedChunk
               | CollectivePermute | Exchange)


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


def _embed_in_place(t_in, t_out) -> Exchange:
    """An exchange of one local copy per device (none for a device without elements): its elements under
    ``t_in`` placed where its block under ``t_out`` holds them, which contains them (a ``shard_to_partial`` onto
    a whole dim); the rest of the buffer is zero."""
    copies = []
    for d in range(t_in.mesh.size):
        have, want = local_box(t_in, d), local_box(t_out, d)
        size = tuple(h.stop - h.start for h in have)
        at = tuple(h.start - w.start for h, w in zip(have, want))
        copies.append((Copy(d, (0,) * len(size), at, size),) if all(size) else ())
    return Exchange(t_out.local_shape, tuple(copies))


def lower_step(step, t_in) -> tuple[Instruction, ...]:
    """The instructions that implement one typed step on buffers of type ``t_in``."""
    if isinstance(step, S.AllToAll):
        return _all_to_all(((step.src_dim, step.dst_dim, t_in.mesh.axes_of(step.axes)),), t_in, step.apply(t_in))
    if isinstance(step, S.MultiAllToAll):
        moves = tuple((i, j, t_in.mesh.axes_of(axes)) for i, j, axes in step.moves)
        return _all_to_all(moves, t_in, step.apply(t_in))
    if isinstance(step, (S.Pad, S.Unpad)):
        return ()
    return (_lower_one(step, t_in),)


def _lower_one(step, t_in) -> Instruction:
    if isinstance(step, S.Permute):
        return CollectivePermute(permute_sources(t_in, step.apply(t_in)))
    if isinstance(step, S.Exchange):
        t_out = step.apply(t_in)
        return Exchange(t_out.local_shape, exchange_copies(t_in, t_out))
    if isinstance(step, S.ShardToPartial) and not (t_in.is_even(step.dim) and step.apply(t_in).is_even(step.dim)):
        return _embed_in_place(t_in, step.apply(t_in))
    axes = t_in.mesh.axes_of(step.axes)
    if isinstance(step, S.AllSlice):
        return Slice(step.dim, axes)
    if isinstance(step, S.AllGather):
        return AllGather(step.dim, axes)
    if isinstance(step, S.ReduceScatter):
        return ReduceScatter(step.dim, axes, step.reduction)
    if isinstance(step, S.AllReduce):
        return AllReduce(axes, step.reduction)
    if isinstance(step, S.ReplicateToPartial):
        return KeepRoot(axes)
    if isinstance(step, S.ShardToPartial):
        return EmbedChunk(step.dim, axes)
    raise ShardingError(f"no lowering for {step!r}: it is not a redist step")


def _all_to_all(moves, t_in, t_out) -> tuple[Instruction, ...]:
    """An all-to-all of ``moves`` ``(i_m -> j_m, axes_m)`` (one or more) from type ``t_in`` to ``t_out``, in
    the canonical form of :class:`AllToAll` over the axes of all moves in move order. Split every destination
    ``j`` into (the chunk counts ``k_m`` of the moves into it, in move order, then the rest), bring the chunk
    dims to the front in move order and merge them into one dim of ``k`` chunks (row-major, so chunk index =
    rank over all the axes), exchange chunk ``r`` with member ``r``, then split the front dim by sender
    ``(s_1, …, s_M)`` and put each ``s_m`` at the major end of its source dim ``i_m``. Over a group of one
    device it is no instruction."""
    mesh = t_in.mesh
    axes = tuple(a for _, _, move_axes in moves for a in move_axes)
    if mesh.group_size(axes) == 1:
        return ()
    ks = [mesh.group_size(move_axes) for _, _, move_axes in moves]
    # Expanded dims: ("c", m) the chunk index of move m in its destination, ("d", d) the rest of dim d.
    expanded, sizes = [], {}
    for d, n in enumerate(t_in.local_shape):
        into = [m for m, (_, j, _) in enumerate(moves) if j == d]
        expanded += [("c", m) for m in into] + [("d", d)]
        sizes.update({("c", m): ks[m] for m in into})
        sizes[("d", d)] = n // math.prod(ks[m] for m in into)
    front = [("c", m) for m in range(len(moves))]
    rest = [e for e in expanded if e[0] == "d"]
    ins = [
        Reshape(tuple(sizes[e] for e in expanded)),
        Transpose(tuple(expanded.index(e) for e in front + rest)),
        Reshape((math.prod(ks),) + tuple(sizes[e] for e in rest)),
        AllToAll(axes),
    ]
    # After the exchange the front dims index the sender; each goes just before its source dim i_m.
    senders = [("s", m) for m in range(len(moves))]
    sizes.update({("s", m): k for m, k in enumerate(ks)})
    source_of = {i: m for m, (i, _, _) in enumerate(moves)}
    final = []
    for e in rest:
        if e[1] in source_of:
            final.append(("s", source_of[e[1]]))
        final.append(e)
    received = senders + rest
    ins += [
        Reshape(tuple(sizes[e] for e in received)),
        Transpose(tuple(received.index(e) for e in final)),
        Reshape(t_out.local_shape),
    ]
    return tuple(ins)


# Steps that lower to instructions naming devices by id (or to none): they may change the device order.
_POINT_TO_POINT = (S.Permute, S.Exchange, S.Pad, S.Unpad)


def collective_mesh(steps, types) -> Mesh:
    """The mesh on which the collectives of ``steps`` (with their ``len(steps) + 1`` types) run: the mesh of
    the type before each step other than a permute or an exchange (``types[0].mesh`` if there is none).
    Raises :class:`ShardingError` if they run on two device orders: the program's groups are one mesh's."""
    meshes = {t.mesh for step, t in zip(steps, types) if not isinstance(step, _POINT_TO_POINT)}
    if len(meshes) > 1:
        raise ShardingError(f"the plan's collectives run on {len(meshes)} device orders "
                            f"({'; '.join(sorted(map(str, meshes)))}); a plan changes the device order by a "
                            "permute or an exchange before or after all of its collectives")
    return meshes.pop() if meshes else types[0].mesh


def lower(steps, types) -> Program:
    """Lower typed steps (with their ``len(steps) + 1`` types) to a buffer program; its ``mesh`` is
    :func:`collective_mesh`, its ``src_mesh`` and ``dst_mesh`` the first and last types'."""
    t0 = types[0]
    mesh = collective_mesh(steps, types)
    instructions, shapes = [], [t0.local_shape]
    for step, t in zip(steps, types):
        for ins in lower_step(step, t):
            if _moves_nothing(ins, shapes[-1], mesh):
                continue
            instructions.append(ins)
            shapes.append(shape_after(ins, shapes[-1], mesh))
    assert shapes[-1] == types[-1].local_shape
    return Program(mesh=mesh, dtype=t0.np_dtype, instructions=tuple(instructions), shapes=tuple(shapes),
                   src_mesh=t0.mesh, dst_mesh=types[-1].mesh)


def _moves_nothing(ins, shape, mesh) -> bool:
    """Instructions that leave every buffer as it is (steps over size-1 axes, identity permutations) are
    left out of the program."""
    if isinstance(ins, CollectivePermute):
        return not ins.pairs()
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
        if sorted(ins.sources) != list(range(mesh.size)):
            raise ShardingError(f"{where}: sources are not a permutation of the {mesh.size} devices")
        return shape
    if isinstance(ins, Exchange):
        _check_copies(ins, shape, mesh.size, where)
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


def _check_copies(ins: Exchange, shape, n_dev: int, where: str) -> None:
    """An exchange's copies: a tuple per device, each copy from a device that exists, inside both buffers,
    and no two copies of a device writing one element (which of them wins would be the backend's choice)."""
    if len(ins.copies) != n_dev or len(ins.shape) != len(shape):
        raise ShardingError(f"{where}: expected copies for {n_dev} devices into a buffer of rank {len(shape)}, "
                            f"got {len(ins.copies)} into shape {tuple(ins.shape)}")
    for d, copies in enumerate(ins.copies):
        for c in copies:
            fits = all(n >= 0 and 0 <= a and a + n <= cap_in and 0 <= b and b + n <= cap_out
                       for a, b, n, cap_in, cap_out in zip(c.src_start, c.dst_start, c.size, shape, ins.shape))
            if not (0 <= c.source < n_dev and len(c.size) == len(shape) and fits):
                raise ShardingError(f"{where}: copy {c} of device {d} does not fit the buffers")
        for i, c in enumerate(copies):
            for e in copies[:i]:
                if all(max(b, f) < min(b + n, f + m) for b, n, f, m in zip(c.dst_start, c.size, e.dst_start, e.size)):
                    raise ShardingError(f"{where}: copies {e} and {c} of device {d} overlap")
