"""Device meshes: ordered named axes, devices numbered row-major (the last axis varies fastest).

A mesh is where axis tokens become values: :meth:`Mesh.axis` reads ``"y"`` or ``"y:(2)2"`` into a
:class:`redist.axes.Axis` (once per mesh and token), and the group arithmetic (``group_index``, ``groups``,
``cut_points``) takes axes or tokens.

Numbers in the text forms (``x=4``, ``y:(2)2``, and the sizes of :mod:`redist.types`) are ASCII decimal digits
``0-9`` only: ``str.isdigit`` and the regex ``\\d`` also accept ``'²'`` and ``'٢'``, which are refused here
(:func:`read_decimal`), so that every text form reads numbers the same way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Mapping

import numpy as np

from redist.axes import Axis, read_token
from redist.errors import ShardingError, shown

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_AXIS_TEXT = re.compile(r"(?P<name>[^=]*)=(?P<size>[0-9]+)\Z")

MAX_DEVICES = 2**31 - 1
"""The most devices a mesh may have: MPI ranks and JAX/XLA device ids are 32-bit integers."""


def read_decimal(digits: str, what: str, limit: int) -> int:
    """The value of ``digits`` (ASCII ``0-9``, already matched by the caller) if it is at most ``limit``.

    Raises :class:`ShardingError` naming ``what`` otherwise, without converting a number longer than ``limit``
    (Python's ``int()`` refuses strings of over 4,300 digits, and is quadratic in their length).
    """
    significant = digits.lstrip("0") or "0"
    if len(significant) <= len(str(limit)):
        value = int(significant)
        if value <= limit:
            return value
    text = digits if len(digits) <= 24 else f"{digits[:12]}…{digits[-6:]} ({len(digits)} digits)"
    raise ShardingError(f"{what} {text} is too large; the limit is {limit}")


def prime_factors(n: int) -> list[int]:
    """The prime factors of ``n``, smallest first, with repetition (``12`` → ``[2, 2, 3]``)."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


@dataclass(frozen=True)
class Mesh:
    """An ordered set of named axes. ``Mesh({"x": 2, "y": 4})`` has 8 devices.

    Device ids are row-major over the axes in mesh order, exactly like
    ``np.arange(size).reshape(shape)``: device ``d`` has coordinates ``np.unravel_index(d, shape)``.
    """

    axes: tuple[tuple[str, int], ...]

    def __init__(self, axes: Mapping[str, int] | tuple[tuple[str, int], ...]):
        """``axes``: a mapping from axis name to size, or ``(name, size)`` pairs, in mesh order. Names are
        identifiers, sizes integers >= 1, at most :data:`MAX_DEVICES` devices in all; else
        :class:`ShardingError`."""
        items = _axis_items(axes)
        seen = set()
        for name, n in items:
            if not isinstance(name, str) or not _NAME.match(name):
                raise ShardingError(f"mesh axis name {shown(name)} is not an identifier")
            if name in seen:
                raise ShardingError(f"mesh axis {name!r} is named twice")
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ShardingError(f"mesh axis {name!r} has size {shown(n)}; sizes are integers >= 1")
            seen.add(name)
        axes = tuple((n, int(s)) for n, s in items)
        if math.prod(s for _, s in axes) > MAX_DEVICES:
            raise ShardingError(f"mesh {', '.join(f'{n}={shown(s)}' for n, s in axes)} has more than {MAX_DEVICES} "
                                "devices")
        object.__setattr__(self, "axes", axes)

    @classmethod
    def parse(cls, text: str) -> "Mesh":
        """Parse ``"x=2,y=4"`` (whitespace-insensitive; sizes in ASCII digits)."""
        if not isinstance(text, str):
            raise ShardingError(f"mesh text must be a string like 'x=2,y=4', got {type(text).__name__} {shown(text)}")
        body = "".join(text.split())
        if not body:
            raise ShardingError("empty mesh text; expected something like 'x=2,y=4'")
        items = []
        for part in body.split(","):
            m = _AXIS_TEXT.match(part)
            if not m:
                raise ShardingError(f"cannot read mesh axis {shown(part)} in {shown(text)}; expected NAME=SIZE "
                                    "with SIZE in digits 0-9")
            items.append((m["name"], read_decimal(m["size"], f"the size of mesh axis {m['name']!r}", MAX_DEVICES)))
        return cls(tuple(items))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def axis(self, token: str) -> Axis:
        """The :class:`~redist.axes.Axis` that ``token`` names: a mesh axis name (``"y"``, the whole axis) or a
        sub-axis ``"y:(pre)size"`` as in Shardy (axis ``y`` of size ``S`` viewed as ``pre × size × S/(pre·size)``,
        major to minor; the sub-axis is the middle factor). An :class:`Axis` of this mesh is returned as it is.
        Raises :class:`ShardingError` for anything that is not an axis of this mesh."""
        if type(token) is Axis and self._size_of.get(token.name) == token.axis_size:
            return token
        if not isinstance(token, str):
            raise ShardingError(f"cannot read axis {shown(token)}; expected a mesh axis name or NAME:(PRE)SIZE")
        return _parsed_axis(self, str(token))

    def axes_of(self, tokens) -> tuple[Axis, ...]:
        """:meth:`axis` of each of ``tokens``, as a tuple."""
        return tuple(self.axis(t) for t in tokens)

    @cached_property
    def _size_of(self) -> dict[str, int]:
        """Axis sizes by name (computed once per mesh; not part of equality or hashing)."""
        return dict(self.axes)

    def _parse_axis(self, token: str) -> Axis:
        """The axis ``token`` (text) names; uncached (see :meth:`axis`)."""
        parts = read_token(token)
        if parts is None:
            raise ShardingError(f"cannot read axis {shown(token)}; expected a mesh axis name or NAME:(PRE)SIZE "
                                "with PRE and SIZE in digits 0-9")
        name, pre, size = parts
        full = self._size_of.get(name)
        if full is None:
            raise ShardingError(
                f"unknown mesh axis {name!r}; the mesh has axes {', '.join(self.names) or '(none)'}"
            )
        if pre is None:
            return Axis(name, 1, full, full)
        pre = read_decimal(pre, f"the pre-size of sub-axis {shown(token)}", MAX_DEVICES)
        size = read_decimal(size, f"the size of sub-axis {shown(token)}", MAX_DEVICES)
        if pre < 1 or size < 2 or full % (pre * size):
            raise ShardingError(f"sub-axis {token!r} does not fit mesh axis {name!r} of size {full}")
        return Axis(name, pre, size, full)

    def axis_size(self, token: str) -> int:
        """The size of a mesh axis or sub-axis."""
        return self.axis(token).size

    def axis_coord(self, coords: Mapping[str, int], token: str) -> int:
        """A device's coordinate on a mesh axis or sub-axis, from its coordinates on the mesh axes."""
        a = self.axis(token)
        return a.coord(coords[a.name])

    def group_size(self, names) -> int:
        """The number of devices in a group spanning ``names`` (the product of their sizes)."""
        k = 1
        for a in names:
            k *= self.axis(a).size
        return k

    def coords(self, device: int) -> dict[str, int]:
        """Coordinates of device ``device``, by axis name."""
        out = {}
        for name, size in reversed(self.axes):
            device, out[name] = divmod(device, size)
        return {n: out[n] for n in self.names}

    def device(self, coords: Mapping[str, int]) -> int:
        """The id of the device at ``coords`` (the inverse of :meth:`coords`)."""
        d = 0
        for name, size in self.axes:
            d = d * size + coords[name]
        return d

    def group_index(self, device: int, names) -> int:
        """The rank of ``device`` in its group over ``names`` (axes or sub-axes): row-major over ``names`` in the
        given order.

        The group holds the devices whose coordinates differ only on ``names``.
        """
        c = self.coords(device)
        r = 0
        for n in names:
            a = self.axis(n)
            r = r * a.size + a.coord(c[a.name])
        return r

    def cut_points(self, axes) -> dict[str, list[int]]:
        """Per mesh axis, the sorted factor boundaries that ``axes`` use (``1`` and the axis size included):
        splitting each axis there gives the coarsest pieces of which every one of ``axes`` is a run."""
        cuts = {n: {1, s} for n, s in self.axes}
        for tok in axes:
            a = self.axis(tok)
            cuts[a.name] |= {a.pre, a.stop}
        return {n: sorted(c) for n, c in cuts.items()}

    def varying_axes(self, device_sets) -> tuple[str, ...]:
        """The mesh axes, in mesh order, along which the members of some set of devices differ."""
        varying = set()
        for devices in device_sets:
            coords = [self.coords(d) for d in devices]
            varying.update(n for n in self.names if len({c[n] for c in coords}) > 1)
        return tuple(n for n in self.names if n in varying)

    def groups(self, names) -> list[list[int]]:
        """The groups over ``names`` (axes or sub-axes), each listing its devices in rank order.

        A group holds the devices whose coordinates agree outside ``names``; groups come in the order of
        their lowest device id. Raises :class:`ShardingError` if two of ``names`` overlap (name a common factor
        of a mesh axis): they define no groups.
        """
        axes = self.axes_of(names)
        for i, a in enumerate(axes):
            for b in axes[i + 1:]:
                if a.overlaps(b):
                    raise ShardingError(f"axes {a!r} and {b!r} overlap: {{{','.join(axes)}}} define no groups of "
                                        f"devices on mesh {self}")
        by_key: dict[tuple[int, ...], dict[int, int]] = {}
        for d in range(self.size):
            c = self.coords(d)
            key = dict(c)
            for a in axes:
                key[a.name] -= a.coord(c[a.name]) * a.stride
            by_key.setdefault(tuple(key[n] for n in self.names), {})[self.group_index(d, axes)] = d
        return [[ranks[r] for r in range(len(ranks))] for ranks in by_key.values()]

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in self.axes)

    def __repr__(self) -> str:
        return f"Mesh({dict(self.axes)!r})"


def _axis_items(axes) -> tuple:
    """The ``(name, size)`` pairs of a :class:`Mesh` argument, or :class:`ShardingError`."""
    if isinstance(axes, Mapping):
        return tuple(axes.items())
    hint = "a dict like {'x': 2, 'y': 4} or (name, size) pairs"
    if isinstance(axes, str):
        raise ShardingError(f"Mesh takes {hint}, got the string {shown(axes)} (Mesh.parse reads text)")
    try:
        items = tuple(axes)
    except TypeError:
        raise ShardingError(f"Mesh takes {hint}, got {type(axes).__name__} {shown(axes)}") from None
    for item in items:
        if isinstance(item, str) or not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ShardingError(f"Mesh takes {hint}; {shown(item)} is not a (name, size) pair")
    return items


@lru_cache(maxsize=65536)
def _parsed_axis(mesh: Mesh, token: str) -> Axis:
    """:meth:`Mesh._parse_axis`, cached: token text is read once per mesh."""
    return mesh._parse_axis(token)
