"""Device meshes: ordered named axes, devices numbered row-major (the last axis varies fastest)."""

from __future__ import annotations

import math
import re
from functools import lru_cache
from dataclasses import dataclass
from typing import Iterator, Mapping

from redist.errors import ShardingError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SUB_AXIS = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::\((?P<pre>\d+)\)(?P<size>\d+))?\Z")


def prime_factors(n: int) -> list[int]:
    """The prime factors of ``n``, smallest first, with repetition (``12`` → ``[2, 2, 3]``)."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def sub_axis_token(name: str, pre: int, size: int, full: int) -> str:
    """The token naming factor ``size`` of axis ``name`` after ``pre`` (Shardy's ``name:(pre)size``).

    The whole axis is written plainly as ``name``.
    """
    return name if (pre, size) == (1, full) else f"{name}:({pre}){size}"


@dataclass(frozen=True)
class Mesh:
    """An ordered set of named axes. ``Mesh({"x": 2, "y": 4})`` has 8 devices.

    Device ids are row-major over the axes in mesh order, exactly like
    ``np.arange(size).reshape(shape)``: device ``d`` has coordinates ``np.unravel_index(d, shape)``.
    """

    axes: tuple[tuple[str, int], ...]

    def __init__(self, axes: Mapping[str, int] | tuple[tuple[str, int], ...]):
        items = tuple(axes.items()) if isinstance(axes, Mapping) else tuple(axes)
        seen = set()
        for name, size in items:
            if not isinstance(name, str) or not _NAME.match(name):
                raise ShardingError(f"mesh axis name {name!r} is not an identifier")
            if name in seen:
                raise ShardingError(f"mesh axis {name!r} is named twice")
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ShardingError(f"mesh axis {name!r} has size {size!r}; sizes are integers >= 1")
            seen.add(name)
        object.__setattr__(self, "axes", tuple((n, int(s)) for n, s in items))

    @classmethod
    def parse(cls, text: str) -> "Mesh":
        """Parse ``"x=2,y=4"`` (whitespace-insensitive)."""
        body = "".join(text.split())
        if not body:
            raise ShardingError("empty mesh text; expected something like 'x=2,y=4'")
        items = []
        for part in body.split(","):
            name, eq, size = part.partition("=")
            if not eq or not size.isdigit():
                raise ShardingError(f"cannot read mesh axis {part!r} in {text!r}; expected NAME=SIZE")
            items.append((name, int(size)))
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

    def sub_axis(self, token: str) -> tuple[str, int, int]:
        """Resolve an axis token to ``(axis name, pre, size)``.

        A token is a mesh axis name (``"y"``, the whole axis) or a sub-axis ``"y:(pre)size"`` as in Shardy:
        axis ``y`` of size ``S`` viewed as ``pre × size × S/(pre·size)`` (major to minor); the sub-axis is the
        middle factor, and a device's coordinate on it is ``(c[y] // (S // (pre·size))) % size``.
        """
        if not isinstance(token, str):
            raise ShardingError(f"cannot read axis {token!r}; expected a mesh axis name or NAME:(PRE)SIZE")
        return _resolve(self, token)

    def _resolve(self, token: str) -> tuple[str, int, int]:
        m = _SUB_AXIS.match(token)
        if not m:
            raise ShardingError(f"cannot read axis {token!r}; expected a mesh axis name or NAME:(PRE)SIZE")
        full = dict(self.axes).get(m["name"])
        if full is None:
            raise ShardingError(
                f"unknown mesh axis {m['name']!r}; the mesh has axes {', '.join(self.names) or '(none)'}"
            )
        if m["pre"] is None:
            return m["name"], 1, full
        pre, size = int(m["pre"]), int(m["size"])
        if pre < 1 or size < 2 or full % (pre * size):
            raise ShardingError(f"sub-axis {token!r} does not fit mesh axis {m['name']!r} of size {full}")
        return m["name"], pre, size

    def axis_size(self, token: str) -> int:
        """The size of a mesh axis or sub-axis."""
        return self.sub_axis(token)[2]

    def axis_coord(self, coords: Mapping[str, int], token: str) -> int:
        """A device's coordinate on a mesh axis or sub-axis, from its coordinates on the mesh axes."""
        name, pre, size = self.sub_axis(token)
        return (coords[name] // (dict(self.axes)[name] // (pre * size))) % size

    def group_size(self, names: tuple[str, ...]) -> int:
        """The number of devices in a group spanning ``names`` (the product of their sizes)."""
        return math.prod(self.axis_size(n) for n in names)

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

    def devices(self) -> Iterator[int]:
        return iter(range(self.size))

    def group_index(self, device: int, names: tuple[str, ...]) -> int:
        """The rank of ``device`` in its group over ``names``: row-major over ``names`` in the given order.

        The group holds the devices whose coordinates differ only on ``names`` (axes or sub-axes).
        """
        c = self.coords(device)
        r = 0
        for n in names:
            r = r * self.axis_size(n) + self.axis_coord(c, n)
        return r

    def cut_points(self, tokens) -> dict[str, list[int]]:
        """Per mesh axis, the sorted factor boundaries that ``tokens`` use (``1`` and the axis size included):
        splitting each axis there gives the coarsest pieces of which every token is a run."""
        cuts = {n: {1, s} for n, s in self.axes}
        for tok in tokens:
            name, pre, size = self.sub_axis(tok)
            cuts[name] |= {pre, pre * size}
        return {n: sorted(c) for n, c in cuts.items()}

    def varying_axes(self, device_sets) -> tuple[str, ...]:
        """The mesh axes, in mesh order, along which the members of some set of devices differ."""
        varying = set()
        for devices in device_sets:
            coords = [self.coords(d) for d in devices]
            varying.update(n for n in self.names if len({c[n] for c in coords}) > 1)
        return tuple(n for n in self.names if n in varying)

    def groups(self, names: tuple[str, ...]) -> list[list[int]]:
        """The groups over ``names`` (axes or sub-axes), each listing its devices in rank order.

        A group holds the devices whose coordinates agree outside ``names``; groups come in the order of
        their lowest device id.
        """
        by_key: dict[tuple[int, ...], dict[int, int]] = {}
        for d in range(self.size):
            c = self.coords(d)
            key = dict(c)
            for a in names:
                name, pre, size = self.sub_axis(a)
                stride = dict(self.axes)[name] // (pre * size)
                key[name] -= self.axis_coord(c, a) * stride
            by_key.setdefault(tuple(key[n] for n in self.names), {})[self.group_index(d, names)] = d
        return [[ranks[r] for r in range(len(ranks))] for ranks in by_key.values()]

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in self.axes)

    def __repr__(self) -> str:
        return f"Mesh({dict(self.axes)!r})"


@lru_cache(maxsize=65536)
def _resolve(mesh: Mesh, token: str) -> tuple[str, int, int]:
    """Cached :meth:`Mesh.sub_axis` (types are built often, by the synthesizer and by partitioning)."""
    return mesh._resolve(token)
