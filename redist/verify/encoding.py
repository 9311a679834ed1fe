"""How the verifier states devices and types for Z3: axis tokens read on its own, device orders read as data,
device coordinates written as digits, and the meaning of a type.

- Axes: :func:`read_axis` reads a token's text, ``name`` or ``name:(pre)size``, into an :class:`Axis` (its
  mesh axis, size, stride and factor range, derived here from the text alone); a token that the backends'
  reader refuses (one grammar, :func:`redist.axes.read_token`, for both), and axes of one group that overlap
  (:func:`read_axes`), are refuted.
- Device orders: a mesh's ``device_ids`` read as data, the default order listing nothing
  (:class:`DeviceOrder`), and the coordinates of a position, row-major (:func:`position_coords`).
- Coordinates as digits: :class:`Digits`, over the cut points of the (sub-)axes that a program and its two
  types name (:func:`named_axes`); :class:`ChainDigits`, those of each program of a plan across meshes.
- The meaning of a type (stated in the package header): :func:`type_meaning`, in Z3 terms.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from redist import program as P
from redist.axes import read_token
from redist.errors import ShardingError
from redist.mesh import MAX_DEVICES, read_decimal
from redist.verify.solver import conjunction, z3
from redist.verify.verdict import Refuted


# ----------------------------------------------------------------------------- axes, independently
@dataclass(frozen=True)
class Axis:
    """A (sub-)axis token as the verifier reads it: its mesh axis ``name``, its ``size``, ``stride`` (how many
    consecutive coordinates of the mesh axis share one coordinate on it) and ``full`` size of the mesh axis, and
    the factor range ``[lo, hi)`` it covers of the mesh axis."""

    token: str
    name: str
    size: int  # size of the (sub-)axis
    stride: int  # S / (pre·size)
    full: int  # size of the whole mesh axis
    lo: int  # factor range [pre, pre·size) on the axis, for overlap checks
    hi: int


def read_axis(mesh_sizes: dict[str, int], token: Any) -> Axis:
    """The (sub-)axis ``token`` names on a mesh with axes ``mesh_sizes``; refutes a token that names none.

    The token's text is read with the grammar of :func:`redist.axes.read_token` and its numbers with
    :func:`redist.mesh.read_decimal`, as the backends' reader :meth:`redist.Mesh.axis` reads them, and the same
    tokens are accepted: a whole axis, or a sub-axis ``name:(pre)size`` with ``pre >= 1`` and ``size >= 2``
    whose ``pre·size`` divides the axis. Its size, stride and factor range are derived here."""
    parts = read_token(token) if isinstance(token, str) else None
    if parts is None or parts[0] not in mesh_sizes:
        raise Refuted(f"axis {token!r} is not an axis or sub-axis of the mesh")
    name, pre_digits, size_digits = parts
    full = mesh_sizes[name]
    if pre_digits is None:
        return Axis(token, name, full, 1, full, 1, full)
    try:
        pre = read_decimal(pre_digits, f"the pre-size of sub-axis {token!r}", MAX_DEVICES)
        size = read_decimal(size_digits, f"the size of sub-axis {token!r}", MAX_DEVICES)
    except ShardingError as e:
        raise Refuted(str(e)) from None
    if pre < 1 or size < 2 or full % (pre * size):
        raise Refuted(f"sub-axis {token!r} does not fit mesh axis {name!r} of size {full}")
    return Axis(token, name, size, full // (pre * size), full, pre, pre * size)


def read_axes(mesh_sizes, tokens, where: str) -> tuple[Axis, ...]:
    """The axes of a group, ``tokens`` (a list of them; ``where`` says whose, for the message); refutes axes
    that overlap."""
    if not isinstance(tokens, (tuple, list)):
        raise Refuted(f"{where}: axes {tokens!r} are not a list of axis names")
    out = tuple(read_axis(mesh_sizes, t) for t in tokens)
    for x in range(len(out)):
        for y in range(x):
            a, b = out[x], out[y]
            # One factor named twice overlaps itself even where it is of size 1 (as the backends read it).
            if a.name == b.name and ((a.lo, a.hi) == (b.lo, b.hi) or (a.lo < b.hi and b.lo < a.hi)):
                raise Refuted(f"{where}: axes {b.token!r} and {a.token!r} overlap; the group is not defined")
    return out


def ksize(axes) -> int:
    """The number of devices in a group over ``axes``."""
    return math.prod(a.size for a in axes)


# ----------------------------------------------------------------------------- device orders
class DeviceOrder:
    """A mesh's device order, read as data: the device at each position and the position of each device.
    The default order (``Mesh.is_row_major``: device p at position p) is the identity, and lists nothing, so
    that a mesh of 2**31 devices costs no memory; another order is its ``device_ids`` (any distinct device ids:
    a permutation of ``0 … size−1``, or the global numbers of other devices), inverted on first use."""

    def __init__(self, mesh):
        self.size = mesh.size
        self.ids = None if mesh.is_row_major else tuple(mesh.device_ids)
        self._positions = None

    def __eq__(self, other) -> bool:
        return isinstance(other, DeviceOrder) and (self.size, self.ids) == (other.size, other.ids)

    @property
    def is_identity(self) -> bool:
        return self.ids is None

    @property
    def id_bound(self) -> int:
        """One past the largest device id: the length of a table by device id."""
        return self.size if self.ids is None else max(self.ids, default=-1) + 1

    def device(self, p: int) -> int:
        """The device at position ``p``."""
        return p if self.ids is None else self.ids[p]

    def has(self, d: int) -> bool:
        """Whether ``d`` is the id of a device of the order."""
        return 0 <= d < self.size if self.ids is None else d in self._inverse()

    def position(self, d: int) -> int:
        """The position of device ``d`` (one of the order's)."""
        return d if self.ids is None else self._inverse()[d]

    def _inverse(self) -> dict[int, int]:
        if self._positions is None:
            self._positions = {dev: p for p, dev in enumerate(self.ids)}
        return self._positions

    def devices(self):
        """The device at each position, in position order."""
        return range(self.size) if self.ids is None else self.ids

    def same_devices(self, other: "DeviceOrder") -> bool:
        """Whether ``other`` orders the same devices."""
        if self.size != other.size:
            return False
        if self.ids is None or other.ids is None:
            return self.id_bound == other.id_bound == self.size
        return set(self.ids) == set(other.ids)


def position_coords(mesh_sizes: dict, device: int) -> dict[str, int]:
    """The coordinates of position ``device``: row-major over the mesh axes, the last varying fastest (a
    device id's own position in the default device order)."""
    out = {}
    for name in reversed(list(mesh_sizes)):
        device, out[name] = divmod(device, mesh_sizes[name])
    return {name: out[name] for name in mesh_sizes}


# ----------------------------------------------------------------------------- coordinates as digits
class Digits:
    """How the walk writes a device's coordinates: per mesh axis, as digits over the cut points of that axis
    that the program and the two types use.

    The (sub-)axes named anywhere cut a mesh axis of size S at factor boundaries ``1 = p0 < p1 < … < pm = S``
    (a sub-axis ``name:(pre)size`` at ``pre`` and ``pre·size``). Where they form a chain (each divides the
    next: the sub-axes of one decomposition), the coordinate is a mixed-radix number of m digits, digit k in
    ``[0, p(k+1)/pk)`` of weight ``S/p(k+1)``, and the coordinate on a (sub-)axis between cut points ``lo``
    and ``hi``, ``(c // (S/hi)) % (hi/lo)``, is the mixed-radix number of the digits between them: a linear
    term, no division or remainder by a constant (which Z3 decides badly: a permute over many sub-axes of a
    256-sized axis went undecided after 120 s). Setting a rank writes fresh digits tied to it by one linear
    equation. Where the cut points are no chain (sub-axes of two decompositions of one axis, of 2 and of 3
    on an axis of 12), the axis is one digit and its sub-axes are read by division and remainder, as the
    meaning states them.

    Coordinates are a dict from each mesh axis name to the tuple of its digit terms, major first. ``ctx`` is the
    Z3 context of the call (:func:`~redist.verify.solver.new_context`): every term of the encoding is made in
    it."""

    def __init__(self, mesh_sizes: dict[str, int], axes, ctx: z3.Context):
        self.mesh_sizes = mesh_sizes
        self.ctx = ctx
        points = {name: {1, size} for name, size in mesh_sizes.items()}
        for ax in axes:
            if ax.size != 1:  # a sub-axis of size 1 is coordinate 0, whatever its place
                points[ax.name].update((ax.lo, ax.hi))
        self.cuts: dict[str, tuple[int, ...]] = {}
        for name, pts in points.items():
            pts = sorted(pts)
            chain = all(b % a == 0 for a, b in zip(pts, pts[1:]))
            self.cuts[name] = tuple(pts) if chain else (1, mesh_sizes[name])
        self.radix = {n: tuple(b // a for a, b in zip(p, p[1:])) for n, p in self.cuts.items()}
        self.weight = {n: tuple(mesh_sizes[n] // b for b in p[1:]) for n, p in self.cuts.items()}

    def fresh(self, new) -> dict:
        """Coordinates of a symbolic device: fresh digits, ``new(base, lo, hi)`` making each (in range)."""
        return {n: tuple(new(f"{n}_{k}", 0, r) for k, r in enumerate(self.radix[n])) for n in self.mesh_sizes}

    def value(self, c: dict, name: str):
        """The coordinate on mesh axis ``name``."""
        return horner(c[name], self.radix[name], self.ctx)

    def _span(self, ax: Axis) -> range | None:
        """The digits of ``ax`` (None: it does not lie on cut points)."""
        p = self.cuts[ax.name]
        return range(p.index(ax.lo), p.index(ax.hi)) if ax.lo in p and ax.hi in p else None

    def sub(self, c: dict, ax: Axis):
        """The coordinate on (sub-)axis ``ax``: (c[name] // stride) % size."""
        if ax.size == 1:
            return z3.IntVal(0, self.ctx)
        span = self._span(ax)
        if span is not None:
            return horner([c[ax.name][k] for k in span], [self.radix[ax.name][k] for k in span], self.ctx)
        v = self.value(c, ax.name)
        if ax.stride != 1:
            v = v / ax.stride
        return v % ax.size if ax.lo != 1 else v  # pre > 1: the quotient can exceed size

    def rank(self, c: dict, axes):
        """The rank over ``axes`` (row-major, the last varying fastest)."""
        return horner([self.sub(c, ax) for ax in axes], [ax.size for ax in axes], self.ctx)

    def key(self, c: dict, partial) -> list:
        """Which partial group over ``partial`` a device is in: its digits with those of ``partial`` zeroed."""
        out = {n: list(ds) for n, ds in c.items()}
        for ax in partial:
            if ax.size == 1:
                continue
            span = self._span(ax)
            if span is None:
                out[ax.name] = [self.value(out, ax.name) - self.sub(out, ax) * ax.stride]
            else:
                for k in span:
                    out[ax.name][k] = z3.IntVal(0, self.ctx)
        return [d for n in self.mesh_sizes for d in out[n]]

    def with_rank(self, w, c: dict, axes, j, bounded: bool) -> dict:
        """``c`` with its rank over ``axes`` set to ``j`` (the group member of rank ``j``), fresh digits of walk
        ``w`` tied to ``j`` by one equation. ``bounded``: ``j`` lies in ``[0, group size)`` by construction;
        otherwise it is taken modulo the group size (as a remainder would), by a free quotient, so that the
        equation has a solution whatever ``j`` is (on paths where the element is no data, an index and so
        ``j`` may lie anywhere)."""
        axes = [ax for ax in axes if ax.size != 1]
        if not axes:
            return c
        spans = [self._span(ax) for ax in axes]
        if any(s is None for s in spans):  # an axis with sub-axes of two decompositions: remainders
            out = c
            for ax in reversed(axes):
                out = self._with_sub(w, out, ax, j % ax.size)
                j = j / ax.size
            return out
        out = {n: list(ds) for n, ds in c.items()}
        digits, radices = [], []
        for ax, span in zip(axes, spans):
            for k in span:
                out[ax.name][k] = w.fresh(f"{ax.name}_{k}", 0, self.radix[ax.name][k])
                digits.append(out[ax.name][k])
                radices.append(self.radix[ax.name][k])
        number = horner(digits, radices, self.ctx)
        if not bounded and digits:
            number = number + w.var("q") * math.prod(radices)
        w.defs.append(j == number)
        return {n: tuple(ds) for n, ds in out.items()}

    def _with_sub(self, w, c: dict, ax: Axis, value) -> dict:
        """``c`` with its coordinate on ``ax`` set to ``value`` (in range)."""
        if self._span(ax) is not None:
            return self.with_rank(w, c, (ax,), value, bounded=True)
        out = dict(c)
        out[ax.name] = self.from_value(w, ax.name, self.value(c, ax.name) + (value - self.sub(c, ax)) * ax.stride)
        return out

    def from_value(self, w, name: str, value) -> tuple:
        """The digits of ``value`` (in ``[0, size)``) on mesh axis ``name``: itself where the axis is one digit,
        else fresh digits of walk ``w`` tied to it."""
        if len(self.radix[name]) == 1:
            return (value,)
        digits = tuple(w.fresh(f"{name}_{k}", 0, r) for k, r in enumerate(self.radix[name]))
        w.defs.append(value == horner(digits, self.radix[name], self.ctx))
        return digits


def horner(digits, radices, ctx: z3.Context):
    """The mixed-radix number of ``digits`` (major first) with ``radices`` (0 in context ``ctx`` if there are
    none)."""
    if not digits:
        return z3.IntVal(0, ctx)
    r = digits[0]
    for d, n in zip(digits[1:], radices[1:]):
        r = r * n + d
    return r


def named_axes(program, mesh_sizes, types) -> list[Axis]:
    """Every (sub-)axis the program's instructions and ``types`` (the types on its mesh) name (checked by then):
    they set the cut points of :class:`Digits`."""
    tokens = [a for t in types for a in (*itertools.chain(*t.dims), *t.partial)]
    for ins in program.instructions:
        if isinstance(ins, P.CollectivePermute):
            if isinstance(ins.sources, P.CoordinateMap):
                tokens += [a for group in ins.sources.groups for side in group for a in side]
        elif isinstance(ins, P.Exchange):
            if not isinstance(ins.dims, P.CopyTable):
                tokens += [a for x in ins.dims for a in (*x.axes, *x.source_axes)]
        elif not isinstance(ins, (P.Reshape, P.Transpose)):
            tokens += list(ins.axes)
    return [read_axis(mesh_sizes, a) for a in tokens]


class ChainDigits:
    """The :class:`Digits` and :class:`DeviceOrder` of each program of a chain
    (:class:`~redist.verify.chain.Chain`), all in the one Z3 context ``ctx`` of the call: a program's digits cut
    its mesh's axes where its instructions name them, the first program's where the source type does too, the
    last's where the claim does. :meth:`at` gives those of the program a buffer belongs to; ``src`` and ``dst``
    those the source type and the claim are read with (one and the same for a plan within one mesh)."""

    def __init__(self, chain, src, dst, ctx: z3.Context):
        last = len(chain.programs) - 1
        self.ctx = ctx
        self.owner = chain.owner
        self.stages = []
        for k, program in enumerate(chain.programs):
            sizes = dict(program.mesh.axes)
            types = [src] * (k == 0) + [dst] * (k == last)
            self.stages.append(Digits(sizes, named_axes(program, sizes, types), ctx))
        self.orders = [DeviceOrder(program.mesh) for program in chain.programs]

    @property
    def src(self) -> Digits:
        return self.stages[0]

    @property
    def dst(self) -> Digits:
        return self.stages[-1]

    def at(self, t: int) -> Digits:
        """The digits of buffer ``t``'s program."""
        return self.stages[self.owner[t]]

    def order_at(self, t: int) -> DeviceOrder:
        """The device order of buffer ``t``'s program's mesh (on which its collectives run)."""
        return self.orders[self.owner[t]]


# ----------------------------------------------------------------------------- the meaning of a type
def type_meaning(mesh_sizes, t, digits: Digits | None = None, c: dict | None = None, idx=None):
    """docs/spec.md §2, stated in Z3: the global index that local index ``idx`` is on a device with
    coordinates ``c`` (written by ``digits``) under type ``t``, whether it is data (not padding), and the
    device's summand coordinates (its coordinates on the partial axes). Returns ``(global index exprs, local
    shape, summand exprs, partial axes, data condition)``; without ``idx`` only the local shape and partial axes
    (the rest empty, the data condition None)."""
    g, local, data = [], [], []
    for d, (n, tokens) in enumerate(zip(t.shape, t.dims)):
        axes = read_axes(mesh_sizes, tokens, f"dim {d} of {t}")
        k = ksize(axes)
        L = -(-n // k)
        local.append(L)
        if idx is not None:
            g.append(digits.rank(c, axes) * L + idx[d])
            if n % k:
                data.append(g[-1] < n)
    partial = read_axes(mesh_sizes, tuple(t.partial), f"partial of {t}")
    used = [a for d, toks in enumerate(t.dims) for a in read_axes(mesh_sizes, toks, f"dim {d} of {t}")]
    read_axes(mesh_sizes, tuple(a.token for a in used) + tuple(a.token for a in partial), f"{t}")
    summands = [] if idx is None else [digits.sub(c, a) for a in partial]
    return g, tuple(local), summands, partial, None if idx is None else conjunction(data, digits.ctx)
