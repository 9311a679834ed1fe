"""Sharding types: how a global array is laid out over a device mesh.

``f32[1024{x}, 512{y,z}] partial{w}`` says: dim 0 is split over mesh axis ``x``; dim 1 over ``y`` (major)
then ``z`` (minor); each group of devices that differ only in ``w`` holds summands whose sum is the value.
``partial(max){w}`` (also ``min``, ``prod``) says the group's maximum (minimum, product) is the value: a type has
one *reduction kind* (``reduction``, ``"sum"`` for plain ``partial{…}``). Of ``bool`` values the sum and the
maximum are the logical or, the minimum and the product the logical and; complex numbers have no maximum or
minimum, so ``partial(max)`` and ``partial(min)`` of ``c64``/``c128`` are refused.
Axes a type does not name replicate. On device coordinates ``c``, a dim of size ``N`` split over axes
``(a1, …, ak)`` (``k = s[a1]…s[ak]`` blocks) has block index ``b = ((c[a1]·s[a2] + c[a2])·s[a3] + …)`` and local
size ``L = ceil(N / k)``; the device holds elements ``[min(N, b·L), min(N, (b+1)·L))`` of it, at the start of its
local buffer, which is padded to ``L`` (XLA's padding rule; the padding holds no data and is never read as
data). This is JAX's ``PartitionSpec(("a1", …, "ak"))``.

A dim is *even* when ``k`` divides ``N``. An uneven type is the same layout as the even type of its
``padded_shape`` (each dim ``k·L``) whose trailing elements are padding: the collectives of :mod:`redist.steps`
run on that padded view, and layouts whose padded views differ are bridged by a point-to-point exchange.

Sizes are written in ASCII digits ``0-9`` (as everywhere in redist's text forms, see :mod:`redist.mesh`); an
array has at most :data:`MAX_ELEMENTS` elements. Parsing and construction take time linear in the length of
the text and in the rank.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import ml_dtypes
import numpy as np

import redist.blocks
from redist.axes import Axis, canonical_axes, check_factorization
from redist.errors import ShardingError, shown
from redist.mesh import Mesh, read_decimal
from redist.picture import MAX_BLOCKS, type_picture

DTYPES: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "bool": np.dtype(np.bool_),
    "c64": np.dtype(np.complex64),
    "c128": np.dtype(np.complex128),
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

MAX_ELEMENTS = 2**63 - 1
"""The most elements an array may have (and so the largest dim): numpy, JAX and XLA index with 64-bit integers."""

REDUCTIONS = ("sum", "max", "min", "prod")
"""The reduction kinds of pending values (docs/spec.md §2): how a partial group's buffers combine into the value."""

REDUCERS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
"""The elementwise numpy ufunc of each reduction kind. On ``bool`` arrays numpy's sum and maximum are the
logical or, its minimum and product the logical and; its maximum and minimum propagate NaN."""

_TYPE_RE = re.compile(r"(?P<dtype>[a-z0-9]+)\[(?P<dims>[^\]]*)\]"
                      r"(?:partial(?:\((?P<reduction>[^()]*)\))?\{(?P<partial>[^}]*)\})?\Z")
# One dim and the comma after it; matched at successive positions of the dims text (one pass, no splitting).
_DIM_RE = re.compile(r"(?P<size>-?[0-9]+)(?:\{(?P<axes>[^{}]*)\})?(?P<comma>,?)")


def dtype_name(dtype: Any) -> str:
    """The type-syntax name (``"f32"``) of a numpy dtype or of a name already in that syntax."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    try:
        if dtype is None:  # np.dtype(None) is float64: never guess a dtype
            raise TypeError
        return _DTYPE_NAMES[np.dtype(dtype)]
    except (TypeError, KeyError, ValueError):
        raise ShardingError(f"unsupported dtype {shown(dtype)}; use one of {', '.join(DTYPES)}") from None


@dataclass(frozen=True)
class ShardingType:
    """A global array's shape and dtype, and how its elements are laid out on ``mesh``.

    ``dims[i]`` lists the mesh axes or sub-axes that split dim ``i``, major to minor; ``partial`` lists the axes
    over which buffers are pending summands, in mesh order, and ``reduction`` (one of :data:`REDUCTIONS`) how
    they combine; a type without partial axes has no pending reduction and its ``reduction`` is ``"sum"``.
    Every mesh axis appears at most once in a type.
    Axes may be given as token strings (``"y:(2)2"``) and are held as :class:`~redist.axes.Axis` values, which
    are those strings (canonical: adjacent pieces of one axis merged), so ``t.dims == (("x",), ("y", "z"))``.
    Instances are immutable and hashable; construction validates everything and raises
    :class:`ShardingError` naming the problem.
    """

    mesh: Mesh
    shape: tuple[int, ...]
    dtype: str
    dims: tuple[tuple[Axis, ...], ...]
    partial: tuple[Axis, ...] = ()
    reduction: str = "sum"

    def __post_init__(self):
        if not isinstance(self.mesh, Mesh):
            raise ShardingError(f"a sharding type needs a redist.Mesh, got {type(self.mesh).__name__} {shown(self.mesh)}")
        shape = _sizes(self.shape)
        dims = _axis_lists(self.dims)
        partial = _axis_tokens(self.partial, "the partial axes")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if len(dims) != len(shape):
            raise ShardingError(f"{len(shape)} dims in the shape but {len(dims)} dim shardings")
        object.__setattr__(self, "shape", shape)
        dims, partial = _checked_axes(self.mesh, dims, partial)
        order = {n: i for i, n in enumerate(self.mesh.names)}
        partial = sorted(partial, key=lambda a: (order[a.name], a.pre))
        object.__setattr__(self, "partial", canonical_axes(partial))
        object.__setattr__(self, "dims", tuple(canonical_axes(d) for d in dims))
        object.__setattr__(self, "reduction", _reduction(self.reduction, self.dtype, bool(partial)))

    # ------------------------------------------------------------------ equality and hashing
    # Types key the caches of every planner and partitioner (hashed on every lookup) and are compared often,
    # mostly to types that differ in their dims: equality tries identity, then the fields most likely to
    # differ first; the hash is computed once per type and not pickled (string hashes differ between
    # processes). Both agree with the dataclass's own: all fields, compared as values.
    def __eq__(self, other):
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.dims == other.dims and self.partial == other.partial and self.shape == other.shape
                and self.dtype == other.dtype and self.reduction == other.reduction and self.mesh == other.mesh)

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.mesh, self.shape, self.dtype, self.dims, self.partial,
                                               self.reduction))
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    # ------------------------------------------------------------------ text form
    @classmethod
    def parse(cls, text: str, mesh: Mesh) -> "ShardingType":
        """Parse the text form, e.g. ``"f32[1024{x}, 512{y,z}] partial{w}"`` (whitespace-insensitive), in time
        linear in the length of ``text``. Raises :class:`ShardingError` quoting the part it cannot read."""
        if not isinstance(text, str):
            raise ShardingError(f"a sharding type's text must be a string like 'f32[1024{{x}}, 512]', got "
                                f"{type(text).__name__} {shown(text)}")
        if not isinstance(mesh, Mesh):
            raise ShardingError(f"parsing {shown(text)} needs a redist.Mesh, got {type(mesh).__name__} {shown(mesh)}")
        body = "".join(text.split())
        m = _TYPE_RE.match(body)
        if not m:
            raise ShardingError(
                f"cannot read sharding type {shown(text)}; expected e.g. 'f32[1024{{x}}, 512{{y,z}}] partial{{w}}'"
            )
        if m["dtype"] not in DTYPES:
            raise ShardingError(f"unknown dtype {m['dtype']!r} in {shown(text)}; use one of {', '.join(DTYPES)}")
        shape, dims = _parse_dims(m["dims"], text)
        partial = _axis_names(m["partial"], "partial{…}", text)
        if len(set(partial)) != len(partial):
            raise ShardingError(f"an axis is listed twice in partial{{…}} of {shown(text)}")
        reduction = m["reduction"]
        if reduction is not None and reduction not in REDUCTIONS:
            raise ShardingError(f"unknown reduction kind {shown(reduction)} in partial(…) of {shown(text)}; "
                                f"use one of {', '.join(REDUCTIONS)}")
        return cls(mesh, shape, m["dtype"], dims, partial, reduction or "sum")

    def __str__(self) -> str:
        dims = ", ".join(f"{n}{{{','.join(d)}}}" if d else str(n) for n, d in zip(self.shape, self.dims))
        text = f"{self.dtype}[{dims}]"
        if not self.partial:
            return text
        kind = "" if self.reduction == "sum" else f"({self.reduction})"
        return text + f" partial{kind}{{{','.join(self.partial)}}}"

    def __repr__(self) -> str:
        return f"ShardingType.parse({str(self)!r}, {self.mesh!r})"

    def show(self, limit: int = MAX_BLOCKS) -> str:
        """A text picture of which block of the array each device holds (:mod:`redist.picture`): the type, its
        mesh, bytes per device and global; replicas, pending reductions and padding; then a grid of the blocks
        (at most two dims split) or a table of them, at most ``limit`` blocks shown, each with its index range,
        the coordinates of the devices holding it and their ids."""
        return type_picture(self, limit)

    # ------------------------------------------------------------------ JAX interop
    @classmethod
    def from_partition_spec(cls, shape, dtype, spec, mesh: Mesh, partial=(), reduction: str = "sum") -> "ShardingType":
        """Build a type from a JAX ``PartitionSpec`` or a tuple like ``(("x", "y"), None)``: one entry per
        leading dim (missing trailing entries replicate), each None, an axis name or a tuple of axis names;
        ``partial`` and ``reduction`` as in the constructor. Raises :class:`ShardingError` for anything else,
        naming the entry."""
        shape = _sizes(shape)
        entries = _spec_entries(spec)
        if len(entries) > len(shape):
            raise ShardingError(f"partition spec {shown(spec)} has {len(entries)} entries for a rank-{len(shape)} array")
        dims = []
        for i, e in enumerate(entries):
            if e is None:
                dims.append(())
            elif isinstance(e, str):
                dims.append((e,))
            elif isinstance(e, (tuple, list)) and all(isinstance(a, str) for a in e):
                dims.append(tuple(e))
            else:
                raise ShardingError(f"entry {i} of partition spec {shown(spec)} is {shown(e)}; expected None, a mesh "
                                    "axis name or a tuple of axis names")
        dims += [()] * (len(shape) - len(entries))
        return cls(mesh, shape, dtype, tuple(dims), partial, reduction)

    def partition_spec(self):
        """The JAX ``PartitionSpec`` of this type (partial axes are not part of it)."""
        from jax.sharding import PartitionSpec

        names = [tuple(str(a) for a in d) for d in self.dims]  # JAX takes axis names as plain strings
        return PartitionSpec(*[None if not d else d[0] if len(d) == 1 else d for d in names])

    # ------------------------------------------------------------------ sizes
    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return self.np_dtype.itemsize

    def blocks(self, dim: int) -> int:
        """How many blocks dim ``dim`` is split into."""
        return self.mesh.group_size(self.dims[dim])

    @cached_property
    def local_shape(self) -> tuple[int, ...]:
        """The local buffer's shape, padding included: ``ceil(N / k)`` per dim."""
        return tuple(-(-n // self.blocks(i)) for i, n in enumerate(self.shape))

    @cached_property
    def local_bytes(self) -> int:
        """The local buffer's size in bytes, padding included (what a device allocates)."""
        return math.prod(self.local_shape) * self.itemsize

    @cached_property
    def padded_shape(self) -> tuple[int, ...]:
        """Each dim rounded up to a multiple of its block count: the shape of the even view of this layout."""
        return tuple(L * self.blocks(i) for i, L in enumerate(self.local_shape))

    def is_even(self, dim: int | None = None) -> bool:
        """Whether dim ``dim`` (default: every dim) divides evenly into its blocks, i.e. has no padding."""
        dims = range(self.rank) if dim is None else (dim,)
        return all(self.padded_shape[i] == self.shape[i] for i in dims)

    def padded(self) -> "ShardingType":
        """The even type of shape ``padded_shape`` with the same axes: every device's buffer is the same."""
        return ShardingType(self.mesh, self.padded_shape, self.dtype, self.dims, self.partial, self.reduction)

    @property
    def global_bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def used_axes(self) -> frozenset[Axis]:
        """Axes that split some dim (not the partial ones)."""
        return frozenset(a for d in self.dims for a in d)

    def block_index(self, dim: int, device: int) -> int:
        """The block of dim ``dim`` that ``device`` holds (:func:`redist.blocks.block_index`)."""
        return redist.blocks.block_index(self, dim, device)

    def local_box(self, device: int) -> tuple[slice, ...]:
        """The global index box of the elements ``device`` holds (its data; for an uneven dim it can be shorter
        than the local buffer, or empty). They sit at the start of the local buffer: see :meth:`data_box`.
        (:func:`redist.blocks.local_box`)"""
        return redist.blocks.local_box(self, device)

    def data_box(self, device: int) -> tuple[slice, ...]:
        """The local index box that holds ``device``'s data (the rest of the buffer is padding;
        :func:`redist.blocks.data_box`)."""
        return redist.blocks.data_box(self, device)

    def replace(self, dims=None, partial=None, mesh=None, reduction=None) -> "ShardingType":
        """This type with the given fields changed (None: kept). A ``mesh`` without these axes (names, sizes,
        order; its devices may be any) is refused (:class:`ShardingError`): the axes would mean something
        else."""
        if mesh is not None and not self.mesh.same_axes(mesh):
            raise ShardingError(f"cannot move {self} from mesh {self.mesh} to mesh {shown(mesh)}: a type keeps its "
                                "mesh's axes, only the devices may change (build a type on the other mesh to "
                                "move the array there)")
        return ShardingType(
            self.mesh if mesh is None else mesh, self.shape, self.dtype, self.dims if dims is None else dims,
            self.partial if partial is None else partial, self.reduction if reduction is None else reduction,
        )


# ---------------------------------------------------------------------- reading and checking arguments
def _reduction(kind, dtype: str, pending: bool) -> str:
    """The reduction kind of a type of ``dtype``: ``kind`` if it is one of :data:`REDUCTIONS`, and ``"sum"`` when
    nothing is ``pending`` (no partial axes: the kind means nothing, so that such types compare equal).
    Raises :class:`ShardingError` for another ``kind`` and for the maximum or minimum of complex numbers."""
    if not isinstance(kind, str) or kind not in REDUCTIONS:
        raise ShardingError(f"unknown reduction kind {shown(kind)}; use one of {', '.join(REDUCTIONS)}")
    if not pending:
        return "sum"
    if kind in ("max", "min") and DTYPES[dtype].kind == "c":
        raise ShardingError(f"partial({kind}) of {dtype} values: complex numbers have no {kind}imum; pending "
                            f"reductions of {dtype} are sums or products")
    return kind


def _parse_dims(body: str, text: str) -> tuple[tuple[int, ...], tuple[tuple[str, ...], ...]]:
    """The sizes and axis lists of ``body`` (``"8{x,y},4,2{z}"``, whitespace removed), read left to right in one
    pass: linear in its length. ``text`` (the user's whole text) is quoted only in an error."""
    shape: list[int] = []
    dims: list[tuple[str, ...]] = []
    pos = 0
    while body:
        m = _DIM_RE.match(body, pos)
        if m is None or (not m["comma"] and m.end() != len(body)):
            end = body.find(",", pos)
            part = body[pos:] if end < 0 else body[pos:end]
            raise ShardingError(f"cannot read dim {len(shape)} {shown(part)} in {shown(text)}; "
                                "expected SIZE or SIZE{axes}, SIZE in digits 0-9")
        if m["size"].startswith("-"):
            raise ShardingError(f"dim {len(shape)} has size {shown(m['size'])}; sizes are integers >= 0")
        shape.append(read_decimal(m["size"], f"the size of dim {len(shape)}", MAX_ELEMENTS))
        dims.append(_axis_names(m["axes"], len(dims), text))
        pos = m.end()
        if not m["comma"]:
            break
    return tuple(shape), tuple(dims)


def _axis_names(axes: str | None, where: int | str, text: str) -> tuple[str, ...]:
    """``"y,z"`` → ``("y", "z")``; ``where`` (a dim's index, or ``"partial{…}"``) and ``text`` name the list in an
    error."""
    if not axes:
        return ()
    names = tuple(axes.split(","))
    if "" in names:
        raise ShardingError(f"empty axis name in {_place(where)} of {shown(text)}")
    return names


def _spec_entries(spec) -> tuple:
    """The entries of a JAX ``PartitionSpec`` or of a tuple or list standing for one."""
    jax_sharding = sys.modules.get("jax.sharding")  # a PartitionSpec exists only once JAX is imported
    if jax_sharding is not None and isinstance(spec, jax_sharding.PartitionSpec):
        if spec.unreduced or spec.reduced:
            raise ShardingError(f"partition spec {spec} has unreduced or reduced axes; give pending sums as "
                                "partial=(axis, ...) instead")
        return tuple(spec)  # its entries (iteration works on every JAX; `.partitions` only from 0.10)
    if not _is_list(spec):
        raise ShardingError(f"partition spec must be a PartitionSpec or a tuple like (('x', 'y'), None), got "
                            f"{type(spec).__name__} {shown(spec)}")
    return tuple(spec)


def _place(where: int | str) -> str:
    return f"dim {where}" if isinstance(where, int) else where


def _is_list(value) -> bool:
    """A tuple, list or other sequence (not a string): what a shape or an axis list may be given as."""
    return isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes))


def _sizes(shape) -> tuple[int, ...]:
    """``shape`` as a tuple of ints in ``[0, MAX_ELEMENTS]`` with at most :data:`MAX_ELEMENTS` elements in all."""
    if not _is_list(shape):
        raise ShardingError(f"shape must be a tuple of dim sizes like (1024, 512), got {type(shape).__name__} "
                            f"{shown(shape)}")
    for i, n in enumerate(shape):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_ELEMENTS:
            raise ShardingError(f"dim {i} has size {shown(n)}; sizes are integers >= 0 (at most {MAX_ELEMENTS})")
    shape = tuple(int(n) for n in shape)
    if 0 not in shape:
        total = 1
        for n in shape:  # stop at the limit: the product of a huge rank is a huge number
            total *= n
            if total > MAX_ELEMENTS:
                raise ShardingError(f"shape {shown(shape)} has more than {MAX_ELEMENTS} elements")
    return shape


def _axis_tokens(names, what: int | str) -> tuple[str, ...]:
    """``names`` (mesh axis or sub-axis names) as a tuple; ``what`` (a dim's index, or words) names it in an
    error."""
    if type(names) is not tuple:  # the common case is a tuple already, and types are built often
        if not _is_list(names):
            raise _not_axis_names(names, what)
        names = tuple(names)
    if not all(isinstance(a, str) for a in names):
        raise _not_axis_names(names, what)
    return names


def _not_axis_names(names, what: int | str) -> ShardingError:
    what = f"the axes of dim {what}" if isinstance(what, int) else what
    hint = f" (write ({names!r},) for one axis)" if isinstance(names, str) else ""
    return ShardingError(f"{what} must be a tuple of mesh axis names like ('x', 'y'), got {type(names).__name__} "
                         f"{shown(names)}{hint}")


def _axis_lists(dims) -> tuple[tuple[str, ...], ...]:
    """``dims`` (one tuple of axis names per dim) as tuples."""
    if not _is_list(dims):
        raise ShardingError(f"dims must be a tuple with one tuple of mesh axis names per dim, like (('x',), ()), "
                            f"got {type(dims).__name__} {shown(dims)}")
    return tuple(_axis_tokens(d, i) for i, d in enumerate(dims))


def _checked_axes(mesh: Mesh, dims, partial) -> tuple[tuple[tuple[Axis, ...], ...], tuple[Axis, ...]]:
    """The axes of the tokens of ``dims`` and ``partial`` on ``mesh``. Raises :class:`ShardingError` if a token
    names no axis of ``mesh``, if two axes overlap (a mesh axis is used once in a type), or if sub-axes of one
    mesh axis are not factors of one decomposition of it."""
    dims = tuple(mesh.axes_of(d) for d in dims)
    partial = mesh.axes_of(partial)
    seen: dict[str, list[tuple[Axis, int | str]]] = {}
    for where, axes in [*enumerate(dims), ("partial", partial)]:
        for a in axes:
            for b, where2 in seen.get(a.name, ()):
                if a.overlaps(b):
                    which = f"mesh axis {a!r}" if a == b else f"mesh axes {b!r} and {a!r} overlap and are"
                    raise ShardingError(f"{which} used twice (in {_place(where2)} and in {_place(where)})")
            seen.setdefault(a.name, []).append((a, where))
    for name, used in seen.items():
        if len(used) > 1:  # one axis alone always fits a factorization of its mesh axis
            check_factorization(name, [a for a, _ in used])
    return dims, partial
