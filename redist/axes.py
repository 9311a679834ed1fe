"""Mesh axes and sub-axes as values, and the algebra of axis lists.

An :class:`Axis` is factor ``size`` of mesh axis ``name``, after the factor ``pre`` (Shardy's ``AxisRefAttr``,
written ``name:(pre)size``): axis ``name`` of size ``S`` viewed as ``pre × size × S/(pre·size)``, major to
minor; the axis is the middle factor, and a device with coordinate ``c`` on ``name`` has coordinate
``(c // (S / (pre·size))) % size`` on it. The whole axis (``pre == 1``, ``size == S``) is written ``name``.
Axes are made once, where text meets a mesh (:meth:`redist.Mesh.axis`, which parses ``"y:(2)2"``, and
:class:`redist.ShardingType`, which holds its dims and partial axes as axes); everything after reads
``name``, ``pre``, ``size`` and ``axis_size``, and text exists only in that parsing and in ``str()``.

Design: an :class:`Axis` is a ``str`` whose text is its canonical token, carrying its parsed fields. docs/spec.md §2 has
``t.dims`` and ``t.partial`` compare equal to tuples of token strings, hash like them and print like them,
and users pass token strings wherever an axis is wanted; the JSON and text forms of plans, error messages,
the JAX axis names of a refined mesh and the verifier (which restates the semantics on its own, from a
program's token text) read the text too. As a ``str``, an axis is all of that by construction: equality,
hashing, ordering, ``repr`` and JSON are its token's, and ``isinstance(a, str)`` holds. (A frozen dataclass
would need ``__eq__`` and ``__hash__`` against strings and would still fail ``isinstance`` checks, ``json``
and ``",".join``.) So, as with strings, two axes with the same text are equal whatever their meshes.

An axis cannot be invalid: the constructor checks its fields and builds its text from them (so the text is
canonical: ``y:(1)4`` of an axis of size 4 is ``y``), and it cannot be changed afterwards.

The functions below work on tuples of axes, major to minor, that do not overlap (as in a sharding type).
Lists of one mesh axis's sub-axes compare piece by piece after :func:`split_common` cuts them at every boundary
any of them uses.
"""

from __future__ import annotations

import re
from dataclasses import FrozenInstanceError

from redist.errors import ShardingError, shown

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TOKEN = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::\((?P<pre>[0-9]+)\)(?P<size>[0-9]+))?\Z")


class Axis(str):
    """Factor ``size`` of mesh axis ``name`` (of size ``axis_size``) after the factor ``pre``; a ``str`` whose
    text is the token ``name:(pre)size``, or ``name`` for the whole axis. See the module docstring.

    ``Axis(name, pre, size, axis_size)`` raises :class:`ShardingError` unless ``name`` is an identifier, the
    numbers are integers, ``axis_size >= 1``, ``pre >= 1`` and ``pre · size`` divides ``axis_size``, with
    ``size >= 2`` for a proper sub-axis. Immutable; pickles and copies as itself.
    """

    name: str
    pre: int
    size: int
    axis_size: int

    def __new__(cls, name: str, pre: int, size: int, axis_size: int) -> "Axis":
        if not isinstance(name, str) or not _NAME.match(name):
            raise ShardingError(f"mesh axis name {shown(name)} is not an identifier")
        for what, n in (("pre-size", pre), ("size", size), ("axis size", axis_size)):
            if isinstance(n, bool) or not isinstance(n, int):
                raise ShardingError(f"the {what} of an axis of mesh axis {name!r} must be an integer, got {shown(n)}")
        whole = pre == 1 and size == axis_size
        text = str(name) if whole else f"{name}:({pre}){size}"
        if axis_size < 1 or pre < 1 or (size < 2 and not whole) or axis_size % (pre * size):
            raise ShardingError(f"sub-axis {text!r} does not fit mesh axis {name!r} of size {axis_size}")
        self = super().__new__(cls, text)
        d = self.__dict__
        d["name"], d["pre"], d["size"], d["axis_size"] = str(name), pre, size, axis_size
        return self

    def __setattr__(self, key, value):
        raise FrozenInstanceError(f"cannot assign to field {key!r} of an Axis")

    def __delattr__(self, key):
        raise FrozenInstanceError(f"cannot delete field {key!r} of an Axis")

    def __reduce__(self):
        return Axis, (self.name, self.pre, self.size, self.axis_size)

    @property
    def stop(self) -> int:
        """The end of the axis's factor range ``[pre, pre · size)`` of its mesh axis."""
        return self.pre * self.size

    @property
    def stride(self) -> int:
        """How many consecutive coordinates of the mesh axis share one coordinate on this axis."""
        return self.axis_size // (self.pre * self.size)

    @property
    def is_whole(self) -> bool:
        return self.pre == 1 and self.size == self.axis_size

    def coord(self, axis_coord: int) -> int:
        """The coordinate on this axis of a device whose coordinate on mesh axis ``name`` is ``axis_coord``."""
        return (axis_coord // self.stride) % self.size

    def overlaps(self, other: "Axis") -> bool:
        """Whether the two name a common factor of one mesh axis."""
        return self.name == other.name and (
            (self.pre, self.size) == (other.pre, other.size) or (self.pre < other.stop and other.pre < self.stop))


def read_token(text: str) -> tuple[str, str | None, str | None] | None:
    """``(name, pre digits, size digits)`` of a token's text (``"y:(2)2"`` → ``("y", "2", "2")``, ``"y"`` →
    ``("y", None, None)``), or None if it is not one. The grammar only: :meth:`redist.Mesh.axis` reads the numbers
    and checks them against the mesh."""
    m = _TOKEN.match(text)
    return None if m is None else (m["name"], m["pre"], m["size"])


def axis_name(axis: str) -> str:
    """The mesh axis that an axis, or a token's text, names (``"y:(2)2"`` → ``"y"``; text that is no token is
    returned as it is): for callers that know mesh axis names but not their sizes (a cost model's links)."""
    if isinstance(axis, Axis):
        return axis.name
    parts = read_token(axis) if isinstance(axis, str) else None
    return axis if parts is None else parts[0]


# ---------------------------------------------------------------------- axis lists
def canonical_axes(axes) -> tuple[Axis, ...]:
    """``axes`` with adjacent contiguous sub-axes of one axis merged (``y:(1)2, y:(2)2`` → ``y``)."""
    if all(a.is_whole for a in axes):  # whole axes are canonical already
        return tuple(axes)
    merged: list[Axis] = []
    for a in axes:
        if merged and merged[-1].name == a.name and merged[-1].stop == a.pre:
            merged[-1] = Axis(a.name, merged[-1].pre, merged[-1].size * a.size, a.axis_size)
        else:
            merged.append(a)
    return tuple(merged)


def split_common(axis_lists) -> list[list[tuple[str, int, int]]]:
    """Each list of axes as ``(name, lo, hi)`` pieces (factor ranges of mesh axis ``name``), split at every
    boundary that any of the lists uses on that mesh axis.

    An axis covers the factor range ``[pre, pre · size)`` of its mesh axis; after the split, equal pieces in
    two lists denote the same sub-axis, so lists can be compared piece by piece. (A piece is a sub-axis only if
    ``lo`` divides ``hi``: lists whose axes are not factors of one decomposition give others.)
    """
    cuts: dict[str, set[int]] = {}
    for axes in axis_lists:
        for a in axes:
            cuts.setdefault(a.name, set()).update((a.pre, a.stop))
    out = []
    for axes in axis_lists:
        pieces = []
        for a in axes:
            if a.pre == a.stop:  # an axis of size 1: one piece
                pieces.append((a.name, a.pre, a.stop))
                continue
            pts = sorted(p for p in cuts[a.name] if a.pre <= p <= a.stop)
            pieces.extend((a.name, lo, hi) for lo, hi in zip(pts, pts[1:]))
        out.append(pieces)
    return out


def _axes_of_pieces(pieces, axes) -> tuple[Axis, ...] | None:
    """Canonical axes for ``(name, lo, hi)`` pieces of the mesh axes that ``axes`` are part of, or None if a
    piece is no sub-axis."""
    size_of = {a.name: a.axis_size for a in axes}
    if any(hi % lo for _, lo, hi in pieces):
        return None
    return canonical_axes(tuple(Axis(n, lo, hi // lo, size_of[n]) for n, lo, hi in pieces))


def strip_suffix(axes: tuple[Axis, ...], suffix: tuple[Axis, ...]) -> tuple[Axis, ...] | None:
    """``axes`` without ``suffix`` at its minor end, or None if ``suffix`` is not its minor end."""
    whole, end = split_common([axes, suffix])
    if not end or whole[len(whole) - len(end):] != end:
        return None
    return _axes_of_pieces(whole[: len(whole) - len(end)], axes)


def remove_axes(axes: tuple[Axis, ...], remove: tuple[Axis, ...]) -> tuple[Axis, ...] | None:
    """The set ``axes`` less ``remove``, or None if some of ``remove`` is not in ``axes``."""
    have, drop = split_common([axes, remove])
    dropped = set(drop)
    if not dropped <= set(have):
        return None
    return _axes_of_pieces([p for p in have if p not in dropped], axes)


def difference(axes: tuple[Axis, ...], other: tuple[Axis, ...]) -> tuple[Axis, ...]:
    """The factors of ``axes`` that ``other`` does not name, as canonical axes (whatever of ``other`` is not
    in ``axes`` is ignored): ``difference((y,), (y:(1)2,))`` is ``(y:(2)2,)``."""
    have, drop = split_common([axes, other])
    dropped = set(drop)
    return _axes_of_pieces([p for p in have if p not in dropped], axes) or ()


def check_factorization(name: str, axes) -> None:
    """Raise :class:`ShardingError` unless the sub-axes ``axes`` of mesh axis ``name`` cut it at points that each
    divide the next (a chain of factors): ``x:(1)2`` and ``x:(3)2`` of an axis of size 6 are not factors of one
    decomposition and cannot be used together."""
    axes = tuple(axes)
    if not axes:
        return
    size = axes[0].axis_size
    points = sorted({p for a in axes for p in (a.pre, a.stop)} | {1, size})
    for lo, hi in zip(points, points[1:]):
        if hi % lo:
            raise ShardingError(
                f"sub-axes {', '.join(axes)} split mesh axis {name!r} (size {size}) in incompatible ways: they "
                "are not factors of one decomposition of the axis")


def check_group(axes) -> None:
    """Raise :class:`ShardingError` unless ``axes`` define groups of devices (the devices whose coordinates agree
    outside them): no two of them overlap (name a common factor of one mesh axis, as an axis named twice
    does) and the sub-axes of each mesh axis are factors of one decomposition of it
    (:func:`check_factorization`). Time ``O(n log n)`` in the number of axes."""
    axes = tuple(axes)
    ordered = sorted(axes, key=lambda a: (a.name, a.pre, a.size))
    for a, b in zip(ordered, ordered[1:]):  # factor ranges sorted by start: one overlapping pair is adjacent
        if a.overlaps(b):
            which = f"axis {a!r} is named twice" if a == b else f"axes {a!r} and {b!r} overlap"
            raise ShardingError(f"{which}: {{{','.join(axes)}}} define no groups of devices (a group names each "
                                "factor of a mesh axis once)")
    names = {a.name for a in axes}
    if len(names) < len(axes):  # one axis alone always fits a factorization of its mesh axis
        for name in names:
            check_factorization(name, [a for a in axes if a.name == name])
