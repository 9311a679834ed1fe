"""Sharding types: how a global array is laid out over a device mesh.

``f32[1024{x}, 512{y,z}] partial{w}`` says: dim 0 is split over mesh axis ``x``; dim 1 over ``y`` (major)
then ``z`` (minor); each group of devices that differ only in ``w`` holds summands whose sum is the value.
Axes a type does not name replicate. On device coordinates ``c``, a dim of size ``N`` split over axes
``(a1, …, ak)`` (``k = s[a1]…s[ak]`` blocks) has block index ``b = ((c[a1]·s[a2] + c[a2])·s[a3] + …)`` and local
size ``L = ceil(N / k)``; the device holds elements ``[min(N, b·L), min(N, (b+1)·L))`` of it, at the start of its
local buffer, which is padded to ``L`` (XLA's padding rule; the padding holds no data and is never read as
data). This is JAX's ``PartitionSpec(("a1", …, "ak"))``.

A dim is *even* when ``k`` divides ``N``. An uneven type is the same layout as the even type of its
``padded_shape`` (each dim ``k·L``) whose trailing elements are padding: the collectives of :mod:`redist.steps`
run on that padded view, and layouts whose padded views differ are bridged by a point-to-point exchange.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from redist.errors import ShardingError
from redist.mesh import Mesh

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
    "u32": np.dtype(np.uint32),
    "bool": np.dtype(np.bool_),
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

_TYPE_RE = re.compile(r"(?P<dtype>[a-z0-9]+)\[(?P<dims>[^\]]*)\](?:partial\{(?P<partial>[^}]*)\})?\Z")
_DIM_RE = re.compile(r"(?P<size>-?\d+)(?:\{(?P<axes>[^}]*)\})?\Z")


def dtype_name(dtype: Any) -> str:
    """The type-syntax name (``"f32"``) of a numpy dtype or of a name already in that syntax."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    try:
        return _DTYPE_NAMES[np.dtype(dtype)]
    except (TypeError, KeyError):
        raise ShardingError(f"unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}") from None


def _split_axes(text: str, where: str) -> tuple[str, ...]:
    if text == "":
        return ()
    names = tuple(text.split(","))
    if any(n == "" for n in names):
        raise ShardingError(f"empty axis name in {where}")
    return names


@dataclass(frozen=True)
class ShardingType:
    """A global array's shape and dtype, and how its elements are laid out on ``mesh``.

    ``dims[i]`` lists the mesh axes that split dim ``i``, major to minor; ``partial`` lists the axes over
    which buffers are pending summands, in mesh order. Every mesh axis appears at most once in a type.
    Instances are immutable and hashable; construction validates everything and raises
    :class:`ShardingError` naming the problem.
    """

    mesh: Mesh
    shape: tuple[int, ...]
    dtype: str
    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()

    def __post_init__(self):
        shape = tuple(self.shape)
        dims = tuple(tuple(d) for d in self.dims)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if len(dims) != len(shape):
            raise ShardingError(f"{len(shape)} dims in the shape but {len(dims)} dim shardings")
        for i, n in enumerate(shape):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
                raise ShardingError(f"dim {i} has size {n!r}; sizes are integers >= 0")
        object.__setattr__(self, "shape", tuple(int(n) for n in shape))
        seen: dict[str, list[tuple[int, int, str, str]]] = {}
        for where, names in [(f"dim {i}", d) for i, d in enumerate(dims)] + [("partial", tuple(self.partial))]:
            for a in names:
                name, pre, size = self.mesh.sub_axis(a)
                for p2, s2, a2, where2 in seen.get(name, []):
                    if (pre, size) == (p2, s2) or (pre < p2 * s2 and p2 < pre * size):
                        which = f"mesh axis {a!r}" if a == a2 else f"mesh axes {a2!r} and {a!r} overlap and are"
                        raise ShardingError(f"{which} used twice (in {where2} and in {where})")
                seen.setdefault(name, []).append((pre, size, a, where))
        for name, spans in seen.items():
            if len(spans) > 1:  # one token of an axis always fits a factorization of it
                check_factorization(self.mesh, name, [a for _, _, a, _ in spans])
        order = {n: i for i, n in enumerate(self.mesh.names)}
        partial = sorted(self.partial, key=lambda a: (order[self.mesh.sub_axis(a)[0]], self.mesh.sub_axis(a)[1]))
        object.__setattr__(self, "partial", canonical_axes(self.mesh, partial))
        dims = tuple(canonical_axes(self.mesh, d) for d in dims)
        object.__setattr__(self, "dims", dims)

    # ------------------------------------------------------------------ text form
    @classmethod
    def parse(cls, text: str, mesh: Mesh) -> "ShardingType":
        """Parse the text form, e.g. ``"f32[1024{x}, 512{y,z}] partial{w}"`` (whitespace-insensitive)."""
        body = "".join(text.split())
        m = _TYPE_RE.match(body)
        if not m:
            raise ShardingError(
                f"cannot read sharding type {text!r}; expected e.g. 'f32[1024{{x}}, 512{{y,z}}] partial{{w}}'"
            )
        if m["dtype"] not in DTYPES:
            raise ShardingError(f"unknown dtype {m['dtype']!r} in {text!r}; use one of {', '.join(DTYPES)}")
        shape, dims = [], []
        if m["dims"]:
            for i, part in enumerate(_split_dims(m["dims"])):
                dm = _DIM_RE.match(part)
                if not dm:
                    raise ShardingError(f"cannot read dim {i} {part!r} in {text!r}; expected SIZE or SIZE{{axes}}")
                shape.append(int(dm["size"]))
                dims.append(_split_axes(dm["axes"] or "", f"dim {i} of {text!r}"))
        partial = _split_axes(m["partial"] or "", f"partial{{…}} of {text!r}")
        if len(set(partial)) != len(partial):
            raise ShardingError(f"an axis is listed twice in partial{{…}} of {text!r}")
        return cls(mesh, tuple(shape), m["dtype"], tuple(dims), partial)

    def __str__(self) -> str:
        dims = ", ".join(f"{n}{{{','.join(d)}}}" if d else str(n) for n, d in zip(self.shape, self.dims))
        text = f"{self.dtype}[{dims}]"
        return text + (f" partial{{{','.join(self.partial)}}}" if self.partial else "")

    def __repr__(self) -> str:
        return f"ShardingType.parse({str(self)!r}, {self.mesh!r})"

    # ------------------------------------------------------------------ JAX interop
    @classmethod
    def from_partition_spec(cls, shape, dtype, spec, mesh: Mesh, partial=()) -> "ShardingType":
        """Build a type from a JAX ``PartitionSpec`` or a tuple like ``(("x", "y"), None)``."""
        entries = tuple(spec)
        if len(entries) > len(shape):
            raise ShardingError(f"partition spec {spec!r} has {len(entries)} entries for a rank-{len(shape)} array")
        entries += (None,) * (len(shape) - len(entries))
        dims = []
        for e in entries:
            if e is None:
                dims.append(())
            elif isinstance(e, str):
                dims.append((e,))
            else:
                dims.append(tuple(e))
        return cls(mesh, tuple(shape), dtype, tuple(dims), tuple(partial))

    def partition_spec(self):
        """The JAX ``PartitionSpec`` of this type (partial axes are not part of it)."""
        from jax.sharding import PartitionSpec

        return PartitionSpec(*[None if not d else d[0] if len(d) == 1 else d for d in self.dims])

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

    @property
    def local_shape(self) -> tuple[int, ...]:
        """The local buffer's shape, padding included: ``ceil(N / k)`` per dim."""
        return tuple(-(-n // self.blocks(i)) for i, n in enumerate(self.shape))

    @property
    def local_bytes(self) -> int:
        """The local buffer's size in bytes, padding included (what a device allocates)."""
        return math.prod(self.local_shape) * self.itemsize

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """Each dim rounded up to a multiple of its block count: the shape of the even view of this layout."""
        return tuple(L * self.blocks(i) for i, L in enumerate(self.local_shape))

    def is_even(self, dim: int | None = None) -> bool:
        """Whether dim ``dim`` (default: every dim) divides evenly into its blocks, i.e. has no padding."""
        dims = range(self.rank) if dim is None else (dim,)
        return all(self.padded_shape[i] == self.shape[i] for i in dims)

    def padded(self) -> "ShardingType":
        """The even type of shape ``padded_shape`` with the same axes: every device's buffer is the same."""
        return ShardingType(self.mesh, self.padded_shape, self.dtype, self.dims, self.partial)

    @property
    def global_bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def used_axes(self) -> frozenset[str]:
        """Axes that split some dim (not the partial ones)."""
        return frozenset(a for d in self.dims for a in d)

    def block_index(self, dim: int, device: int) -> int:
        """The block of dim ``dim`` that ``device`` holds."""
        return self.mesh.group_index(device, self.dims[dim])

    def local_box(self, device: int) -> tuple[slice, ...]:
        """The global index box of the elements ``device`` holds (its data; for an uneven dim it can be shorter
        than the local buffer, or empty). They sit at the start of the local buffer: see :meth:`data_box`."""
        return tuple(
            slice(min(n, self.block_index(i, device) * L), min(n, (self.block_index(i, device) + 1) * L))
            for i, (n, L) in enumerate(zip(self.shape, self.local_shape))
        )

    def data_box(self, device: int) -> tuple[slice, ...]:
        """The local index box that holds ``device``'s data (the rest of the buffer is padding)."""
        return tuple(slice(0, s.stop - s.start) for s in self.local_box(device))

    def replace(self, dims=None, partial=None) -> "ShardingType":
        return ShardingType(
            self.mesh, self.shape, self.dtype, self.dims if dims is None else dims,
            self.partial if partial is None else partial,
        )


def _split_dims(text: str) -> list[str]:
    """Split ``"8{x,y},4,2{z}"`` at the commas that are outside braces."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


# ---------------------------------------------------------------------- axis lists with sub-axes
def _pieces(mesh: Mesh, token_lists) -> list[list[tuple[str, int, int]]]:
    """Each token list as (axis, lo, hi) pieces, split at every boundary any of the lists uses on that axis.

    A token ``name:(pre)size`` covers the factor range ``[pre, pre·size)`` of its axis; after the split, equal
    pieces in two lists denote the same sub-axis, so lists can be compared piece by piece.
    """
    cuts: dict[str, set[int]] = {}
    spans = []
    for tokens in token_lists:
        span = []
        for tok in tokens:
            name, pre, size = mesh.sub_axis(tok)
            cuts.setdefault(name, set()).update((pre, pre * size))
            span.append((name, pre, pre * size))
        spans.append(span)
    out = []
    for span in spans:
        pieces = []
        for name, lo, hi in span:
            if lo == hi:  # an axis of size 1: one piece
                pieces.append((name, lo, hi))
                continue
            pts = sorted(p for p in cuts[name] if lo <= p <= hi)
            pieces.extend((name, a, b) for a, b in zip(pts, pts[1:]))
        out.append(pieces)
    return out


def tokens_of_pieces(mesh: Mesh, pieces) -> tuple[str, ...]:
    """Canonical tokens for (axis, lo, hi) pieces, major to minor: adjacent, contiguous pieces of one axis
    merge (``y:(1)2, y:(2)2`` → ``y``)."""
    from redist.mesh import sub_axis_token

    merged: list[list] = []
    for name, lo, hi in pieces:
        if merged and merged[-1][0] == name and merged[-1][2] == lo:
            merged[-1][2] = hi
        else:
            merged.append([name, lo, hi])
    return tuple(sub_axis_token(n, lo, hi // lo, mesh.axis_size(n)) for n, lo, hi in merged)


def check_factorization(mesh: Mesh, name: str, tokens) -> None:
    """Sub-axes of one axis must cut it at points that each divide the next (a chain of factors): ``x:(1)2``
    and ``x:(3)2`` of an axis of size 6 are not factors of one decomposition and cannot be used together."""
    points = sorted({p for tok in tokens for p in (mesh.sub_axis(tok)[1], mesh.sub_axis(tok)[1] * mesh.sub_axis(tok)[2])}
                    | {1, mesh.axis_size(name)})
    for lo, hi in zip(points, points[1:]):
        if hi % lo:
            raise ShardingError(
                f"sub-axes {', '.join(tokens)} split mesh axis {name!r} (size {mesh.axis_size(name)}) in "
                "incompatible ways: they are not factors of one decomposition of the axis")


def canonical_axes(mesh: Mesh, tokens) -> tuple[str, ...]:
    """``tokens`` with adjacent contiguous sub-axes of one axis merged."""
    if not any(":" in t for t in tokens):  # whole axes are canonical already
        return tuple(tokens)
    return tokens_of_pieces(mesh, _pieces(mesh, [tokens])[0])


def strip_suffix(mesh: Mesh, tokens, suffix) -> tuple[str, ...] | None:
    """``tokens`` without ``suffix`` at its minor end, or None if ``suffix`` is not its minor end."""
    whole, end = _pieces(mesh, [tokens, suffix])
    if not end or whole[len(whole) - len(end):] != end:
        return None
    return tokens_of_pieces(mesh, whole[: len(whole) - len(end)])


def remove_axes(mesh: Mesh, tokens, remove) -> tuple[str, ...] | None:
    """The set ``tokens`` less ``remove``, or None if some of ``remove`` is not in ``tokens``."""
    have, drop = _pieces(mesh, [tokens, remove])
    if not set(drop) <= set(have):
        return None
    return tokens_of_pieces(mesh, [p for p in have if p not in set(drop)])
