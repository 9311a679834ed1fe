"""Device meshes: ordered named axes, and the device at each mesh position (row-major by default).

Positions and devices. A mesh's positions are numbered row-major over its axes (the last axis varies
fastest), and ``device_ids[p]`` is the id of the device at position ``p`` (docs/spec.md §1): any distinct device
numbers below :data:`MAX_DEVICES`, ``range(size)`` by default. A device id is a *global* device number: two
meshes may hold the same devices in another order or arrangement, some of them, or others (the stages of a
pipeline, a job resized from 8 devices to 6), and a redistribution may move an array between any two
(docs/spec.md §3). Sharding types speak of positions (a device holds the block of its position); buffers,
ranks and everything that runs speak of device ids. So every method that takes or returns a ``device``
(``coords``, ``device``, ``group_index``, ``groups``) means a device id, read through ``device_ids``; with
the default order an id is its position. Buffers indexed by device id are lists of :attr:`Mesh.id_bound`
entries (one past the largest id), ``None`` at the numbers that are no device of the mesh. Two meshes are
the same when their axes, sizes and device ids agree. Text form: ``x=2,y=4`` for the default order,
``x=2,y=2,device_ids=[3,2,1,0]`` or ``x=4,device_ids=[4,5,6,7]`` (Shardy's ``device_ids`` list) otherwise.

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
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Mapping

import numpy as np

from redist.axes import Axis, check_group, read_token
from redist.errors import ShardingError, shown

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_AXIS_TEXT = re.compile(r"(?P<name>[^=]*)=(?P<size>[0-9]+)\Z")
_DEVICE_IDS = "device_ids="  # the mesh text's last part, ``device_ids=[3,2,1,0]``, after the axes and a comma

MAX_DEVICES = 2**31 - 1
"""The most devices a mesh may have, and the bound below every device id (a list indexed by device id has at
most this many entries): MPI ranks and JAX/XLA device ids are 32-bit integers."""


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


_GROUPS_KNOWN = 1 << 12  # group sizes a mesh remembers (Mesh.group_size) before it forgets them all


@dataclass(frozen=True)
class Mesh:
    """An ordered set of named axes and the device at each position. ``Mesh({"x": 2, "y": 4})`` has 8 devices.

    Positions are row-major over the axes in mesh order, exactly like ``np.arange(size).reshape(shape)``;
    ``device_ids[p]`` is the device at position ``p`` (default: device ``p``). See the module docstring.
    """

    axes: tuple[tuple[str, int], ...]
    # None for the default (row-major) order, so that a mesh of a billion devices holds no table.
    _device_ids: tuple[int, ...] | None = field(default=None, repr=False)

    def __init__(self, axes: Mapping[str, int] | tuple[tuple[str, int], ...], device_ids=None):
        """``axes``: a mapping from axis name to size, or ``(name, size)`` pairs, in mesh order. Names are
        identifiers, sizes integers >= 1, at most :data:`MAX_DEVICES` devices in all. ``device_ids``: None (the
        default order, ``range(size)``) or a sequence giving the device id at each row-major position: distinct
        integers from 0 to ``MAX_DEVICES - 1``. Anything else raises :class:`ShardingError`."""
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
        size = math.prod(s for _, s in axes)
        if size > MAX_DEVICES:
            raise ShardingError(f"mesh {', '.join(f'{n}={shown(s)}' for n, s in axes)} has more than {MAX_DEVICES} "
                                "devices")
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "_device_ids", _device_order(device_ids, size, axes))

    @classmethod
    def parse(cls, text: str) -> "Mesh":
        """Parse ``"x=2,y=4"`` or, with a device order, ``"x=2,y=2,device_ids=[3,2,1,0]"`` (whitespace-insensitive;
        numbers in ASCII digits)."""
        if not isinstance(text, str):
            raise ShardingError(f"mesh text must be a string like 'x=2,y=4', got {type(text).__name__} {shown(text)}")
        body, ids = _split_device_ids("".join(text.split()), text)
        if not body:
            raise ShardingError(f"empty mesh text {shown(text)}; expected something like 'x=2,y=4'")
        items = []
        for part in body.split(","):
            m = _AXIS_TEXT.match(part)
            if not m:
                raise ShardingError(f"cannot read mesh axis {shown(part)} in {shown(text)}; expected NAME=SIZE "
                                    "with SIZE in digits 0-9")
            items.append((m["name"], read_decimal(m["size"], f"the size of mesh axis {m['name']!r}", MAX_DEVICES)))
        return cls(tuple(items), ids)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @cached_property
    def _whole_names(self) -> frozenset:
        """:attr:`names` as a set: whether a token names a whole mesh axis (not a sub-axis), in one lookup (not
        part of equality or hashing)."""
        return frozenset(self.names)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def device_ids(self) -> tuple[int, ...]:
        """The device id at each row-major position (a new tuple of ``size`` ints: ``range(size)`` in the
        default order)."""
        return tuple(range(self.size)) if self._device_ids is None else self._device_ids

    @property
    def is_row_major(self) -> bool:
        """Whether device ``p`` is at position ``p`` for every ``p`` (the default order)."""
        return self._device_ids is None

    @cached_property
    def devices(self):
        """The device ids of the mesh in increasing order: ``range(size)`` where they are ``0 … size−1`` (in any
        order), else a tuple (not part of equality or hashing)."""
        if self._device_ids is None or self.id_bound == self.size:
            return range(self.size)
        return tuple(sorted(self._device_ids))

    @cached_property
    def id_bound(self) -> int:
        """One past the largest device id: the length of a list indexed by device id that holds a buffer for
        every device of the mesh (``size`` where the ids are ``0 … size−1``)."""
        return self.size if self._device_ids is None else max(self._device_ids) + 1

    def has_device(self, device) -> bool:
        """Whether ``device`` (an int) is the id of a device of this mesh."""
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)):
            return False
        if self._device_ids is None:
            return 0 <= device < self.size
        return int(device) in self._positions

    def same_devices(self, other: "Mesh") -> bool:
        """Whether ``other`` holds exactly these devices, in whatever order or arrangement."""
        if not isinstance(other, Mesh) or (self.size, self.id_bound) != (other.size, other.id_bound):
            return False
        return self.id_bound == self.size or set(self._device_ids) == set(other._device_ids)

    def is_reordering_of(self, other: "Mesh") -> bool:
        """Whether ``other`` is this mesh or its axes on its devices in another order (a *device order* of it):
        a redistribution between the two runs its collectives on either. Between any other two meshes (other
        devices or other axes) an array moves by a transfer (:class:`redist.steps.Transfer`)."""
        return self.same_axes(other) and self.same_devices(other)

    def reordered(self, device_ids) -> "Mesh":
        """This mesh's axes on the devices ``device_ids``, one per position (None: the default order); see
        :class:`Mesh`."""
        return Mesh(self.axes, device_ids)

    def same_axes(self, other: "Mesh") -> bool:
        """Whether ``other`` has these axes (names, sizes, order), whatever its devices and their order."""
        return isinstance(other, Mesh) and self.axes == other.axes

    def position(self, device: int) -> int:
        """The row-major position of device ``device`` (:class:`ShardingError` for no device of this mesh)."""
        if not self.has_device(device):
            raise ShardingError(f"device {shown(device)} is not a device of mesh {self} ({self._ids_text()})")
        return int(device) if self._device_ids is None else self._positions[int(device)]

    def _ids_text(self) -> str:
        """The mesh's device ids in a message: ``ids 0 to 7``, or the first few of them."""
        ids = self.devices
        if isinstance(ids, range):
            return f"ids 0 to {self.size - 1}"
        return f"ids {', '.join(map(str, ids[:8]))}{', …' if len(ids) > 8 else ''}"

    @cached_property
    def _positions(self) -> dict[int, int]:
        """The inverse of ``_device_ids``: the position of each device id (not part of equality or hashing)."""
        return {d: p for p, d in enumerate(self._device_ids)}

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
        """The number of devices in a group spanning ``names`` (the product of their sizes); remembered per
        tuple of names (planning and partitioning ask for the same few groups millions of times)."""
        known = self._group_sizes if type(names) is tuple else None
        k = None if known is None else known.get(names)
        if k is None:
            k = 1
            for a in names:
                k *= self.axis(a).size
            if known is not None:
                if len(known) >= _GROUPS_KNOWN:
                    known.clear()
                known[names] = k
        return k

    @cached_property
    def _group_sizes(self) -> dict:
        """:meth:`group_size` by tuple of names (not part of equality or hashing)."""
        return {}

    def coords(self, device: int) -> dict[str, int]:
        """Coordinates of device ``device`` (the coordinates of its position), by axis name."""
        p = self.position(device)
        out = {}
        for name, size in reversed(self.axes):
            p, out[name] = divmod(p, size)
        return {n: out[n] for n in self.names}

    def device(self, coords: Mapping[str, int]) -> int:
        """The id of the device at ``coords``, a coordinate for every mesh axis (the inverse of :meth:`coords`).
        Raises :class:`ShardingError` for a missing or unknown axis, or a coordinate outside its axis."""
        if not isinstance(coords, Mapping) or coords.keys() != self._size_of.keys():
            raise ShardingError(f"device coordinates {shown(coords)} must give one coordinate for each axis of "
                                f"mesh {self} ({', '.join(self.names) or 'no axes'})")
        p = 0
        for name, size in self.axes:
            c = coords[name]
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < size:
                raise ShardingError(f"coordinate {shown(c)} on mesh axis {name!r} is outside the axis "
                                    f"(0 to {size - 1})")
            p = p * size + int(c)
        return p if self._device_ids is None else self._device_ids[p]

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
        of a mesh axis) or split one mesh axis in incompatible ways: they define no groups.
        """
        axes = self.axes_of(names)
        try:
            check_group(axes)
        except ShardingError as e:
            raise ShardingError(f"on mesh {self}: {e}") from None
        by_key: dict[tuple[int, ...], dict[int, int]] = {}
        for d in self.devices:  # device ids in order, so that groups come in the order of their lowest id
            c = self.coords(d)
            key = dict(c)
            for a in axes:
                key[a.name] -= a.coord(c[a.name]) * a.stride
            by_key.setdefault(tuple(key[n] for n in self.names), {})[self.group_index(d, axes)] = d
        return [[ranks[r] for r in range(len(ranks))] for ranks in by_key.values()]

    def __str__(self) -> str:
        text = ",".join(f"{n}={s}" for n, s in self.axes)
        return text if self._device_ids is None else f"{text},device_ids=[{','.join(map(str, self._device_ids))}]"

    def __repr__(self) -> str:
        if self._device_ids is None:
            return f"Mesh({dict(self.axes)!r})"
        return f"Mesh({dict(self.axes)!r}, device_ids={self._device_ids!r})"


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


def _device_order(device_ids, size: int, axes) -> tuple[int, ...] | None:
    """``device_ids`` as a tuple of ints, None for the default order (given as None or as ``0 … size−1`` in
    order), or :class:`ShardingError` unless it is ``size`` distinct integers from 0 to ``MAX_DEVICES - 1``."""
    if device_ids is None:
        return None
    where = f"device_ids of mesh {','.join(f'{n}={s}' for n, s in axes)}"
    if isinstance(device_ids, (str, bytes, Mapping)) or not hasattr(device_ids, "__len__"):
        raise ShardingError(f"{where} must be a sequence of {size} distinct device ids, one per mesh position, "
                            f"got {type(device_ids).__name__} {shown(device_ids)}")
    ids = tuple(device_ids)
    if len(ids) != size:
        raise ShardingError(f"{where}: expected {size} device ids, one per mesh position, got {len(ids)}")
    bad = next((d for d in ids if isinstance(d, bool) or not isinstance(d, (int, np.integer))), None)
    if bad is not None:
        raise ShardingError(f"{where}: {shown(bad)} is not a device id (an integer from 0 to {MAX_DEVICES - 1})")
    bad = next((d for d in ids if not 0 <= d < MAX_DEVICES), None)
    if bad is not None:
        raise ShardingError(f"{where}: device id {shown(bad)} is out of range: device ids are integers from 0 to "
                            f"{MAX_DEVICES - 1} (redist.mesh.MAX_DEVICES - 1), so that a list indexed by them can be "
                            "made")
    ids = tuple(int(d) for d in ids)
    if len(set(ids)) != size:
        seen = set()
        twice = next(d for d in ids if d in seen or seen.add(d))
        raise ShardingError(f"{where}: device {twice} is listed twice; a mesh holds each device once")
    return None if ids == tuple(range(size)) else _DeviceOrder(ids)


class _DeviceOrder(tuple):
    """A mesh's device order: a tuple of ints that hashes once. A mesh is hashed wherever a type is looked up
    (:func:`redist.mpi.reshard` looks its arguments up on every call), and hashing thousands of ids on each
    lookup would cost more than the lookup. The hash is the tuple's own (equal to an equal plain tuple's); a
    pickled order carries only its ids, and a copy hashes again on first use."""

    def __hash__(self) -> int:
        h = self.__dict__.get("hash")
        if h is None:
            h = self.__dict__["hash"] = tuple.__hash__(self)
        return h

    def __reduce__(self):
        return _DeviceOrder, (tuple(self),)


def _split_device_ids(body: str, whole: str) -> tuple[str, tuple[int, ...] | None]:
    """The axes part of a mesh's text ``body`` (whitespace removed) and the ids of its ``device_ids=[…]`` part
    (None without one), in one pass over the text; ``whole`` is quoted in an error."""
    axes, found, rest = body.partition(_DEVICE_IDS)
    if not found:
        return body, None
    if not (rest.startswith("[") and rest.endswith("]")) or (axes and not axes.endswith(",")):
        raise ShardingError(f"cannot read {shown(whole)}: device ids come last, after a comma, as "
                            "device_ids=[ID,ID,...]")
    return axes[:-1], _read_ids(rest[1:-1], whole)


def _read_ids(text: str, whole: str) -> tuple[int, ...]:
    """The ids of ``device_ids=[…]`` in a mesh's text (``whole``, quoted in an error)."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        if not part.isascii() or not part.isdigit():
            raise ShardingError(f"cannot read device id {shown(part)} in {shown(whole)}; expected digits 0-9")
        out.append(read_decimal(part, "device id", MAX_DEVICES - 1))
    return tuple(out)


@lru_cache(maxsize=65536)
def _parsed_axis(mesh: Mesh, token: str) -> Axis:
    """:meth:`Mesh._parse_axis`, cached: token text is read once per mesh."""
    return mesh._parse_axis(token)
