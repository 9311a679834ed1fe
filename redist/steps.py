"""Typed redistribution steps: each step's typing rule and byte accounting, in one place.

Every step maps a :class:`ShardingType` to another (``apply``) or raises :class:`ShardingError` naming the
step and the type it does not fit. Axis lists are major → minor, and collectives act at the minor end of a
dim, so a dim's axis list behaves like a stack. A step's axes define its groups of devices, so a step that
names an axis twice or two that overlap (``all_reduce({x,x:(2)2})``) is refused whatever the type
(:func:`redist.axes.check_group`); the dims of a permute or an exchange are a type's, which names each factor
of a mesh axis once. ``L`` below is the local buffer in bytes, ``k`` the number of devices in a group (the
product of the sizes of the step's axes).

| step                          | type change                                        | local size | bytes received   |
|-------------------------------|----------------------------------------------------|------------|------------------|
| all_slice(dim, axes)          | append unused ``axes`` at the minor end of ``dim`` | ÷ k        | 0                |
| all_gather(dim, axes)         | drop ``axes``, a minor-end suffix of ``dim``       | × k        | (k−1)/k · L_out  |
| all_to_all(d1 -> d2, axes)    | move minor-end suffix ``axes`` of d1 to d2's end   | same       | (k−1)/k · L      |
| all_to_all(d1 -> d2 {A}, …)   | several such moves at once, from distinct dims to  | same       | (k−1)/k · L      |
|                               | others; the group is all their axes (k = product)  |            |                  |
| permute(to dims)              | any change keeping each dim's block count          | same       | L, on a device   |
|                               | and the partial axes                               |            | that moves       |
| exchange(to dims)             | any change keeping the partial axes                | any        | what a device    |
|                               |                                                    |            | lacks            |
| reduce_scatter(dim, axes)     | remove ``axes`` from partial, append them to dim   | ÷ k        | (k−1)/k · L_in   |
| all_reduce(axes)              | remove ``axes`` from partial                       | same       | 2(k−1)/k · L     |
| replicate_to_partial(axes)    | add unused ``axes`` to partial                     | same       | 0                |
| shard_to_partial(dim, axes)   | move minor-end suffix ``axes`` of dim to partial   | × k        | 0                |
| select_to_partial(to dims,    | any ``dims``, unused ``axes`` added to partial,    | any        | 0                |
|   axes)                       | where each group over ``axes`` holds its block     |            |                  |
| transfer(to dims partial{P}   | the array on another ``mesh`` (other devices or    | any        | what a device    |
|   on mesh)                    | axes); summand groups of one size, or created sums |            | lacks            |

A reduce-scatter onto a dim that no axis splits before it may leave that dim uneven: the chunks then follow the
padding rule (chunk ``r`` is elements ``[min(N, r·L), min(N, (r+1)·L))``, ``L = ceil(N / k)``, at the start of a
buffer of ``L``), and ``L_in`` is counted on the input viewed padded to ``k·L``: a device receives ``(k−1)·L_out``,
the ``k − 1`` other summands of its chunk (Shardy's and DTensor's uneven reduce-scatter pad the same way; MPI's
``Reduce_scatter`` with counts sends no padding, and the device with the longest chunk receives exactly this).

Creating pending sums (docs/spec.md §3: the destination's group sums must equal the value) moves no data: each step
splits a device's block into summands whose group sum is the block, with zeros, the identity of a sum.
``replicate_to_partial`` keeps the buffer on the member of rank 0 of each group over ``axes`` and zeros it on
the others; ``shard_to_partial`` places each member's block of ``dim`` as chunk ``r`` (its rank) of a zero
buffer ``k`` times longer, so the group's buffers are disjoint zero-padded pieces of the gathered block (an
all-gather without the communication: the buffer grows as in a gather). Onto a dim left whole, the blocks
may be uneven: each member's block sits where the dim holds it (``5{x} -> 5 partial{x}`` on ``x=4``).

``select_to_partial`` creates sums where the members of each group over its axes hold their new block between
them already (a source replicated over them, or one that splits a dim over them where the destination splits
it over other axes of the same sizes): each member keeps the part of the block its own block holds, unless a
member before it holds the same block, and zeros elsewhere (:func:`redist.blocks.needed_by_group` says
whether the members hold it; the typing rule refuses the step otherwise).

A permute sends whole buffers between devices: device ``d`` receives the buffer of the device that
:func:`redist.blocks.permute_groups` names by coordinates, which holds exactly the block (and, for a partial
type, the summand) that ``d`` must hold after. Devices that already hold theirs keep them and receive nothing
(for swaps of axes of equal sizes; see there). Which device holds which block, and what an exchange copies, is
device geometry: :mod:`redist.blocks`.

Accounting. Collectives receive the same on every device (the table). A permute or an exchange receives per
device; ``bytes_received`` is the most any device receives, computed from the block structure without
enumerating devices, and ``class_bytes`` gives the per-device amounts over classes of devices
(:class:`redist.blocks.DeviceClasses` of ``class_axes``), for a plan that adds up several such steps.

Reductions. ``reduce_scatter`` and ``all_reduce`` carry a reduction kind (``reduction``: ``"sum"``, ``"max"``,
``"min"`` or ``"prod"``, :data:`redist.types.REDUCTIONS`; written ``all_reduce(max, {x})``, and without the
kind for a sum) and fit only a type whose pending reduction is of that kind: no step converts between kinds.

Device order. ``permute`` and ``exchange`` may also move the array to the same mesh axes with another device
order (``device_ids``, docs/spec.md §1): each device then gets the block its position on the new mesh holds, from
the devices that hold it on the old one: a table of sources (:func:`redist.blocks.permute_sources`) or of
copies per device (:func:`redist.blocks.exchange_copies`), as :mod:`redist.program` lowers them, and their
bytes are counted per device from those tables (``O(devices)``, as a mesh in another order is a table of its
devices). A transfer moves the array to another mesh (below); no other step changes the mesh.

Across meshes. ``transfer`` moves the array to another mesh (:class:`redist.Mesh`: any devices and axes; the two
meshes may share devices): every device of the new mesh assembles its block from devices of the old one that
hold it, point to point (:func:`redist.blocks.transfer_copies`: a device in both meshes keeps what it holds, and
the holders of one block share the sending); a device of the old mesh only drops its buffer. Its typing rule:
the output is the same shape and dtype on the new mesh, with any ``dims`` and ``partial`` axes there, and its
summand groups (the devices that differ only on partial axes) have the input's size, so that each output group
takes the summands of one input group; or the input has no pending values and the output pending sums, each
output group receiving each piece of its block once, on one member. Its bytes, like an exchange's between
device orders, are counted per device from its copies: the most elements a device copies from others, times
the item size (what it lacks, where no pending values move). The steps before a transfer run on the old mesh,
those after it on the new one; a plan may hold several.

Steps hold their axes as given (token strings or :class:`~redist.axes.Axis` values); applying a step reads them
on the type's mesh (:meth:`redist.Mesh.axis`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from redist.axes import Axis, check_group, remove_axes, strip_suffix
from redist.blocks import (check_factors, copied_elements, exchange_copies, max_missing_elements, missing_elements_on,
                           needed_by_group, permute_groups, permute_sources, rank, transfer_copies)
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.types import REDUCTIONS, ShardingType


def _axes(axes) -> str:
    return "{" + ",".join(axes) + "}"


def _rebuild(step, t: ShardingType, dims, partial=None, regrouped=(), mesh=None) -> ShardingType:
    """``t`` with new ``dims``, ``partial`` and ``mesh`` (a device order); the dims in ``regrouped`` change their
    block count and must be even before and after (see "Uneven dims" above)."""
    try:
        out = t.replace(dims=dims, partial=partial, mesh=mesh)
    except ShardingError as e:
        raise ShardingError(f"{step} does not fit {t}: {e}") from None
    for d in regrouped:
        for which, u in (("before", t), ("after", out)):
            if not u.is_even(d):
                raise ShardingError(
                    f"{step} does not fit {t}: dim {d} (size {u.shape[d]}) does not divide into its "
                    f"{u.blocks(d)} blocks {which} the step, and uneven blocks do not nest; synthesize() runs "
                    "such dims on their padded view or with an exchange")
    return out


def _group_axes(step, t: ShardingType, axes) -> tuple[Axis, ...]:
    """``step``'s ``axes`` read on ``t``'s mesh. Raises :class:`ShardingError` naming the step unless they
    define groups of devices (:func:`redist.axes.check_group`): an axis named twice, or two that overlap
    (``{x,x:(2)2}``), define none, whatever the type."""
    try:
        axes = t.mesh.axes_of(axes)
        check_group(axes)
    except ShardingError as e:
        raise ShardingError(f"{step}: {e}") from None
    return axes


def _without_suffix(step, t: ShardingType, dim: int, axes) -> tuple[Axis, ...]:
    _check_dim(step, t, dim)
    rest = strip_suffix(t.dims[dim], _group_axes(step, t, axes)) if axes else None
    if rest is None:
        raise ShardingError(f"{step} does not fit {t}: {_axes(axes)} is not the minor end of dim {dim}")
    return rest


def _check_dim(step, t: ShardingType, dim: int) -> None:
    if not 0 <= dim < t.rank:
        raise ShardingError(f"{step} does not fit {t}: the array has no dim {dim}")


def _check_named(step, axes) -> None:
    if not axes:
        raise ShardingError(f"{step} names no axes")


def _partial_without(step, t: ShardingType, axes) -> tuple[Axis, ...]:
    rest = remove_axes(t.partial, _group_axes(step, t, axes)) if axes else None
    if rest is None:
        raise ShardingError(f"{step} does not fit {t}: {_axes(axes)} are not all partial axes")
    if step.reduction != t.reduction:
        raise ShardingError(f"{step} does not fit {t}: it takes the {step.reduction} of the group, but the pending "
                            f"reduction is a {t.reduction}; no step converts between reduction kinds")
    return rest


def _check_reduction(step) -> None:
    if not isinstance(step.reduction, str) or step.reduction not in REDUCTIONS:
        raise ShardingError(f"{step.kind} has reduction {step.reduction!r}; use one of {', '.join(REDUCTIONS)}")


def _kind(reduction: str) -> str:
    """The reduction kind as a step's text shows it: nothing for a sum (the text of plans before kinds)."""
    return "" if reduction == "sum" else f"{reduction}, "


def _target_mesh(step, t: ShardingType):
    """The mesh ``step`` (a permute or exchange) moves ``t`` to: ``t.mesh`` in the order ``step.device_ids``
    (None: ``t.mesh`` as it is), which must hold the same devices (other devices: a transfer)."""
    if step.device_ids is None:
        return None
    try:
        mesh = t.mesh.reordered(step.device_ids)
    except ShardingError as e:
        raise ShardingError(f"{step} does not fit {t}: {e}") from None
    if not mesh.same_devices(t.mesh):
        raise ShardingError(f"{step} does not fit {t}: its device_ids are not the devices of mesh {t.mesh} in "
                            "another order; a transfer moves an array to other devices")
    return mesh


def _order(device_ids) -> str:
    """The device order of a permute or exchange in its text (nothing if it keeps the order)."""
    return "" if device_ids is None else f", device_ids=[{','.join(map(str, device_ids))}]"


@dataclass(frozen=True)
class AllSlice:
    """Each device keeps block ``group_index(axes)`` of ``k`` equal blocks of its local ``dim``. No communication."""

    dim: int
    axes: tuple[str, ...]
    kind = "all_slice"

    def apply(self, t: ShardingType) -> ShardingType:
        _check_dim(self, t, self.dim)
        _check_named(self, self.axes)
        _group_axes(self, t, self.axes)
        dims = list(t.dims)
        dims[self.dim] = dims[self.dim] + tuple(self.axes)
        return _rebuild(self, t, tuple(dims), regrouped=(self.dim,))

    def bytes_received(self, t: ShardingType) -> Fraction:
        return Fraction(0)

    def __str__(self):
        return f"all_slice(dim {self.dim}, {_axes(self.axes)})"


@dataclass(frozen=True)
class AllGather:
    """Concatenate the local ``dim`` blocks of the group over ``axes``, in group order (tiled all-gather)."""

    dim: int
    axes: tuple[str, ...]
    kind = "all_gather"

    def apply(self, t: ShardingType) -> ShardingType:
        dims = list(t.dims)
        dims[self.dim] = _without_suffix(self, t, self.dim, self.axes)
        return _rebuild(self, t, tuple(dims), regrouped=(self.dim,))

    def bytes_received(self, t: ShardingType) -> Fraction:
        k = t.mesh.group_size(self.axes)
        return Fraction(k - 1, k) * self.apply(t).local_bytes

    def __str__(self):
        return f"all_gather(dim {self.dim}, {_axes(self.axes)})"


@dataclass(frozen=True)
class AllToAll:
    """Split local ``dst_dim`` into k chunks, send chunk r to group member r, and concatenate what arrives
    along ``src_dim`` in group order: ``axes`` move from the minor end of ``src_dim`` to that of ``dst_dim``."""

    src_dim: int
    dst_dim: int
    axes: tuple[str, ...]
    kind = "all_to_all"

    def apply(self, t: ShardingType) -> ShardingType:
        _check_dim(self, t, self.dst_dim)
        if self.src_dim == self.dst_dim:
            raise ShardingError(f"{self} moves axes within one dim; use a permute")
        dims = list(t.dims)
        dims[self.src_dim] = _without_suffix(self, t, self.src_dim, self.axes)
        dims[self.dst_dim] = dims[self.dst_dim] + tuple(self.axes)
        return _rebuild(self, t, tuple(dims), regrouped=(self.src_dim, self.dst_dim))

    def bytes_received(self, t: ShardingType) -> Fraction:
        k = t.mesh.group_size(self.axes)
        return Fraction(k - 1, k) * t.local_bytes

    def __str__(self):
        return f"all_to_all(dim {self.src_dim} -> dim {self.dst_dim}, {_axes(self.axes)})"


@dataclass(frozen=True)
class MultiAllToAll:
    """Several all_to_all moves ``(src_dim, dst_dim, axes)`` as ONE all-to-all over the group of all their
    axes, listed move by move (XLA's multi-dimension all-to-all does the same). Source dims are distinct and
    none is also a destination; moves into one destination dim append their axes in move order. Member
    ``(r_1, …, r_M)`` keeps chunk ``r_m`` of each move's destination and gathers each source dim from the
    members that differ in that move's coordinate. It receives ``(k−1)/k`` of the buffer, where the moves
    done one by one would receive ``Σ (k_m−1)/k_m`` of it: moving ``{x}`` from dim 2 and ``{y}`` from dim 0
    into dim 1 at once (jax-ml/jax#21562) receives 7/8 of the buffer on a 4x2 mesh, not 3/4 + 1/2."""

    moves: tuple[tuple[int, int, tuple[str, ...]], ...]
    kind = "all_to_all"

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for _, _, axes in self.moves for a in axes)

    def apply(self, t: ShardingType) -> ShardingType:
        sources = [i for i, _, _ in self.moves]
        if len(self.moves) < 2 or len(set(sources)) != len(sources) or set(sources) & {j for _, j, _ in self.moves}:
            raise ShardingError(f"{self} needs two moves or more, from distinct dims that are not destinations")
        _group_axes(self, t, self.axes)
        dims = list(t.dims)
        for i, j, axes in self.moves:
            _check_dim(self, t, j)
            dims[i] = _without_suffix(self, t, i, axes)
            dims[j] = dims[j] + tuple(axes)
        return _rebuild(self, t, tuple(dims), regrouped=tuple(d for i, j, _ in self.moves for d in (i, j)))

    def bytes_received(self, t: ShardingType) -> Fraction:
        k = t.mesh.group_size(self.axes)
        return Fraction(k - 1, k) * t.local_bytes

    def __str__(self):
        return "all_to_all(" + ", ".join(f"dim {i} -> dim {j} {_axes(a)}" for i, j, a in self.moves) + ")"


@dataclass(frozen=True)
class Permute:
    """Send whole local buffers between devices so that the result has per-dim axes ``dims``
    (same block count in every dim, same partial axes), on the device order ``device_ids`` (None: the input's;
    see "Device order" above)."""

    dims: tuple[tuple[str, ...], ...]
    device_ids: tuple[int, ...] | None = None
    kind = "permute"

    def apply(self, t: ShardingType) -> ShardingType:
        if len(self.dims) != t.rank:
            raise ShardingError(f"{self} does not fit {t}: it names {len(self.dims)} dims")
        out = _rebuild(self, t, tuple(tuple(d) for d in self.dims), mesh=_target_mesh(self, t))
        if out.local_shape != t.local_shape:
            raise ShardingError(f"{self} does not fit {t}: it changes the local shape")
        changed = next((i for i in range(t.rank) if out.blocks(i) != t.blocks(i)), None)
        if changed is not None:
            raise ShardingError(f"{self} does not fit {t}: it splits dim {changed} into {out.blocks(changed)} blocks, "
                                f"not {t.blocks(changed)}; a permute moves whole blocks (an exchange regroups them)")
        check_factors(t, out, f"{self} does not fit {t}")
        return out

    def bytes_received(self, t: ShardingType) -> Fraction:
        """The whole buffer if some device's block changes (:func:`redist.blocks.permute_groups` names a
        group; between two device orders, if some device's source in :func:`redist.blocks.permute_sources` is
        another device), else nothing."""
        out = self.apply(t)
        if out.mesh != t.mesh:
            return Fraction(t.local_bytes if any(s != d for d, s in enumerate(permute_sources(t, out))) else 0)
        return Fraction(t.local_bytes if permute_groups(t, out) else 0)

    def class_axes(self, t: ShardingType) -> tuple[Axis, ...]:
        """The axes whose coordinates decide whether a device moves."""
        return tuple(a for g in permute_groups(t, self.apply(t)) for axes in g for a in axes)

    def class_bytes(self, t: ShardingType, coords: dict) -> np.ndarray:
        """Per device at ``coords`` (see :mod:`redist.blocks`): the whole buffer if it moves, else nothing. A
        device moves when, for some group, its rank over the group's axes differs from its rank over the
        source axes (its source differs from it there)."""
        moves = False
        for source_axes, axes in permute_groups(t, self.apply(t)):
            moves = moves | (rank(coords, source_axes) != rank(coords, axes))
        return np.where(moves, t.local_bytes, 0)

    def __str__(self):
        return "permute(to [" + ", ".join(_axes(d) for d in self.dims) + "]" + _order(self.device_ids) + ")"


@dataclass(frozen=True)
class ReduceScatter:
    """Reduce (``reduction``: sum, max, min or prod) over the group of partial ``axes`` and keep block
    ``group_index(axes)`` of local ``dim``. Onto a dim that no axis splits before, the blocks may be uneven
    (the padding rule; see the module docstring)."""

    dim: int
    axes: tuple[str, ...]
    reduction: str = "sum"
    kind = "reduce_scatter"

    def apply(self, t: ShardingType) -> ShardingType:
        _check_dim(self, t, self.dim)
        _check_reduction(self)
        partial = _partial_without(self, t, self.axes)
        dims = list(t.dims)
        whole = not dims[self.dim]  # the blocks of a whole dim nest in it, even or not
        dims[self.dim] = dims[self.dim] + tuple(self.axes)
        return _rebuild(self, t, tuple(dims), partial, regrouped=() if whole else (self.dim,))

    def bytes_received(self, t: ShardingType) -> Fraction:
        """``(k−1)/k · L_in`` with ``L_in`` padded to ``k`` chunks: ``(k−1) · L_out``."""
        k = t.mesh.group_size(self.axes)
        return Fraction(k - 1) * self.apply(t).local_bytes

    def __str__(self):
        return f"reduce_scatter({_kind(self.reduction)}dim {self.dim}, {_axes(self.axes)})"


@dataclass(frozen=True)
class AllReduce:
    """Reduce (``reduction``: sum, max, min or prod) over the group of partial ``axes``; every member gets the
    result."""

    axes: tuple[str, ...]
    reduction: str = "sum"
    kind = "all_reduce"

    def apply(self, t: ShardingType) -> ShardingType:
        _check_reduction(self)
        return _rebuild(self, t, t.dims, _partial_without(self, t, self.axes))

    def bytes_received(self, t: ShardingType) -> Fraction:
        k = t.mesh.group_size(self.axes)
        return Fraction(2 * (k - 1), k) * t.local_bytes

    def __str__(self):
        return f"all_reduce({_kind(self.reduction)}{_axes(self.axes)})"


def _check_creates_sum(step, t: ShardingType) -> None:
    """Creating summands writes zeros, the identity of a sum only: refuse a type with another pending kind."""
    if t.reduction != "sum":
        raise ShardingError(f"{step} does not fit {t}: it creates summands of zeros, which a pending "
                            f"{t.reduction} does not have as its identity")


@dataclass(frozen=True)
class ReplicateToPartial:
    """Make ``axes``, over which the type replicates, pending sums: in each group over ``axes`` the member of
    rank 0 keeps its buffer and the others hold zeros. Local; the group's sum is the block every member held."""

    axes: tuple[str, ...]
    kind = "replicate_to_partial"

    def apply(self, t: ShardingType) -> ShardingType:
        _check_named(self, self.axes)
        _group_axes(self, t, self.axes)
        _check_creates_sum(self, t)
        return _rebuild(self, t, t.dims, t.partial + tuple(self.axes))

    def bytes_received(self, t: ShardingType) -> Fraction:
        return Fraction(0)

    def __str__(self):
        return f"replicate_to_partial({_axes(self.axes)})"


@dataclass(frozen=True)
class ShardToPartial:
    """Make ``axes``, the minor end of ``dim``, pending sums: each member of a group over ``axes`` places its
    block of ``dim`` as chunk ``group_index(axes)`` of ``k`` along a zero buffer ``k`` times longer. Local; the
    group's sum is the block the group held together (the result of an all-gather, without communication).
    Where no axis is left in ``dim``, its blocks may be uneven: they nest in the whole dim, and each member's
    block goes where the dim holds it (the rest of the buffer, zeros)."""

    dim: int
    axes: tuple[str, ...]
    kind = "shard_to_partial"

    def apply(self, t: ShardingType) -> ShardingType:
        _check_creates_sum(self, t)
        dims = list(t.dims)
        dims[self.dim] = _without_suffix(self, t, self.dim, self.axes)
        whole = not dims[self.dim]  # the blocks of a dim nest in the whole dim, even or not
        return _rebuild(self, t, tuple(dims), t.partial + tuple(self.axes), regrouped=() if whole else (self.dim,))

    def bytes_received(self, t: ShardingType) -> Fraction:
        return Fraction(0)

    def __str__(self):
        return f"shard_to_partial(dim {self.dim}, {_axes(self.axes)})"


@dataclass(frozen=True)
class Exchange:
    """Point-to-point: every device gets each element of its block under ``dims`` (on the device order
    ``device_ids``; None: the input's) that it lacks, from one device that holds it (same partial coordinates),
    and keeps what it has (see :func:`redist.blocks.exchange_segments`; between two device orders, see the
    module docstring)."""

    dims: tuple[tuple[str, ...], ...]
    device_ids: tuple[int, ...] | None = None
    kind = "exchange"

    def apply(self, t: ShardingType) -> ShardingType:
        if len(self.dims) != t.rank:
            raise ShardingError(f"{self} does not fit {t}: it names {len(self.dims)} dims")
        return _rebuild(self, t, tuple(tuple(d) for d in self.dims), mesh=_target_mesh(self, t))

    def bytes_received(self, t: ShardingType) -> Fraction:
        """The most elements of its new block that a device lacks (padding is not sent)
        (:func:`redist.blocks.max_missing_elements`); between two device orders, the most elements a device
        copies from others in :func:`redist.blocks.exchange_copies`."""
        out = self.apply(t)
        if out.mesh != t.mesh:
            return Fraction(max(sum(math.prod(c.size) for c in copies if c.source != d)
                                for d, copies in enumerate(exchange_copies(t, out))) * t.itemsize)
        return Fraction(max_missing_elements(t, out) * t.itemsize)

    def class_axes(self, t: ShardingType) -> tuple[Axis, ...]:
        """The axes whose coordinates decide what a device receives: those of both layouts' dims."""
        out = self.apply(t)
        return tuple(a for d in t.dims + out.dims for a in d)

    def class_bytes(self, t: ShardingType, coords: dict) -> np.ndarray:
        """Per device at ``coords`` (see :mod:`redist.blocks`): the elements of its new block it lacks."""
        return missing_elements_on(t, self.apply(t), coords) * t.itemsize

    def __str__(self):
        return "exchange(to [" + ", ".join(_axes(d) for d in self.dims) + "]" + _order(self.device_ids) + ")"


@dataclass(frozen=True)
class Pad:
    """View the array as its ``padded_shape`` (uneven dims rounded up to a multiple of their block count).
    No buffer changes: the padded view lays out every element where the uneven type does."""

    kind = "pad"

    def apply(self, t: ShardingType) -> ShardingType:
        return t.padded()

    def bytes_received(self, t: ShardingType) -> Fraction:
        return Fraction(0)

    def __str__(self):
        return "pad"


@dataclass(frozen=True)
class Unpad:
    """View a padded array as ``shape``, the inverse of :class:`Pad`: ``t.shape`` must be the padded shape of
    ``shape`` under ``t``'s axes. The elements beyond ``shape`` become padding."""

    shape: tuple[int, ...]
    kind = "unpad"

    def apply(self, t: ShardingType) -> ShardingType:
        try:
            out = ShardingType(t.mesh, self.shape, t.dtype, t.dims, t.partial, t.reduction)
        except ShardingError as e:
            raise ShardingError(f"{self} does not fit {t}: {e}") from None
        if out.padded_shape != t.shape:
            raise ShardingError(f"{self} does not fit {t}: its padded shape is {list(out.padded_shape)}, "
                                f"not {list(t.shape)}")
        return out

    def bytes_received(self, t: ShardingType) -> Fraction:
        return Fraction(0)

    def __str__(self):
        return f"unpad(to {list(self.shape)})"


@dataclass(frozen=True)
class SelectToPartial:
    """Make ``axes`` pending sums and lay the blocks out as ``dims``, moving no data: in each group over
    ``axes``, every member keeps the part of the group's block under ``dims`` that its own block holds, unless
    a member before it in rank order holds the same block (then zeros there); the rest of every buffer is zero.
    Local; the group's sum is the block. The members must hold the whole block between them: a source
    replicated over ``axes`` (then the first member keeps it all, as ``replicate_to_partial`` does), or one
    whose blocks the group's members hold side by side (``f32[8{x}] -> f32[8{y}] partial{x}`` on ``x=2,y=2``,
    where the member whose ``x`` is its ``y`` holds the block; ``f32[16{y,x}] -> f32[16] partial{x,y}``)."""

    dims: tuple[tuple[str, ...], ...]
    axes: tuple[str, ...]
    kind = "select_to_partial"

    def apply(self, t: ShardingType) -> ShardingType:
        _check_named(self, self.axes)
        _group_axes(self, t, self.axes)
        _check_creates_sum(self, t)
        if len(self.dims) != t.rank:
            raise ShardingError(f"{self} does not fit {t}: it names {len(self.dims)} dims")
        out = _rebuild(self, t, tuple(tuple(d) for d in self.dims), t.partial + tuple(self.axes))
        check_factors(t, out, f"{self} does not fit {t}")
        if needed_by_group(t, out, self.axes).max(initial=0):
            raise ShardingError(f"{self} does not fit {t}: the devices of some group over {_axes(self.axes)} do not "
                                "hold its new block between them; select_to_partial moves no data")
        return out

    def bytes_received(self, t: ShardingType) -> Fraction:
        return Fraction(0)

    def __str__(self):
        return "select_to_partial(to [" + ", ".join(_axes(d) for d in self.dims) + f"], {_axes(self.axes)})"


@dataclass(frozen=True)
class Transfer:
    """Move the array to another mesh: every device of ``mesh`` gets its block under ``dims`` (and
    ``partial``) from devices of the input's mesh that hold it, point to point; the devices of the input's mesh
    that are not devices of ``mesh`` drop their buffers. The two meshes may hold the same devices (in another
    arrangement, ``x=8`` to ``a=2,b=4``), some of them, or others, and have any axes.

    Summands move group to group: the input's and the output's summand groups (the devices that differ only on
    the partial axes) have one size, and each output group takes the summands of one input group that holds
    its block (:func:`redist.blocks.transfer_copies`: a device in both meshes keeps what it holds, and replicas
    share the sending). Or the input has no pending values and the output pending sums: each output group
    receives every piece of its block once, on one member (one that holds it already, else the one that has
    received least), the others holding zeros there. Other pending values are reduced before a transfer by the
    steps on the input's mesh. ``partial`` names the output's pending axes; their kind is the input's (a sum
    where the input has none)."""

    mesh: Mesh
    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()
    kind = "transfer"

    def apply(self, t: ShardingType) -> ShardingType:
        if not isinstance(self.mesh, Mesh):
            raise ShardingError(f"{self.kind} needs a redist.Mesh to move to, got {type(self.mesh).__name__}")
        if len(self.dims) != t.rank:
            raise ShardingError(f"{self} does not fit {t}: it names {len(self.dims)} dims")
        try:
            out = ShardingType(self.mesh, t.shape, t.dtype, tuple(tuple(d) for d in self.dims), tuple(self.partial),
                               t.reduction)
        except ShardingError as e:
            raise ShardingError(f"{self} does not fit {t}: {e}") from None
        k_in, k_out = t.mesh.group_size(t.partial), out.mesh.group_size(out.partial)
        if k_in != k_out and not (k_in == 1 and out.reduction == "sum"):
            raise ShardingError(f"{self} does not fit {t}: it moves summands group to group, but the input's "
                                f"summand groups have {k_in} devices and the output's {k_out}; reduce the pending "
                                f"{t.reduction} first, or create pending sums from values that have none")
        return out

    def bytes_received(self, t: ShardingType) -> Fraction:
        """The most elements a device copies from other devices (:func:`redist.blocks.transfer_copies`)."""
        return Fraction(int(copied_elements(transfer_copies(t, self.apply(t))).max(initial=0)) * t.itemsize)

    def __str__(self):
        dims = "[" + ", ".join(_axes(d) for d in self.dims) + "]"
        pending = f" partial{_axes(self.partial)}" if self.partial else ""
        return f"transfer(to {dims}{pending} on {self.mesh})"


Step = (AllSlice | AllGather | AllToAll | MultiAllToAll | Permute | ReduceScatter | AllReduce | ReplicateToPartial
        | ShardToPartial | Exchange | Pad | Unpad | SelectToPartial | Transfer)
