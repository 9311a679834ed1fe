"""Z3 proofs that a plan's lowered buffer program computes its destination type.

Principle: *verify what you run*. :func:`verify` reads ``plan.program`` — the instructions the numpy, JAX and
MPI backends execute (semantics in :mod:`redist.program`) — and nothing else of the plan except its source
type (what the input buffers hold), its claimed destination type, and its reported ``peak_bytes`` and
``bytes_received``. It never calls the synthesizer's typing rules (:mod:`redist.steps`) nor the type class's
block arithmetic (``block_index``, ``local_box``, ``local_shape``, ``Mesh.group_index``, ``Mesh.coords``):
that independence is on purpose, so that a bug there cannot prove itself right. Instruction axes are
:class:`redist.axes.Axis` values, which are their token strings; the verifier reads only their text, parses each
token itself and re-derives name, pre-size and size independently. The meaning of a type is stated once, below, in Z3 terms, from the contract (SPEC sections 1 and 2):

    Mesh positions are numbered row-major over the mesh axes in mesh order (the last axis varies fastest),
    and ``device_ids[p]`` is the device at position p (default: device p); a device's coordinates are those
    of its position. A dim of size N with axes (a1 … ak), major → minor, on a device with coordinates c has
    block index
    b = ((c[a1]·s[a2] + c[a2])·s[a3] + …), L = ceil(N / (s[a1]·…·s[ak])); local index i of that dim is global
    index b·L + i, which is data if b·L + i < N and padding otherwise. A sub-axis ``name:(pre)size`` of an
    axis of size S has coordinate (c[name] // (S / (pre·size))) % size. Partial axes: the buffers of the
    devices that differ only on them are summands of the value, summand coordinate = the device's
    coordinates on the partial axes; the value is their sum, maximum, minimum or product (the type's
    ``reduction``; of ``bool`` values sum and maximum are the logical or, minimum and product the and).

The proof follows each element of the result backward. For a symbolic device (mesh coordinates are Z3
integers in range) and a symbolic local index, each instruction, read in reverse, says which device and
which local index of the buffer before it the element came from. Devices are followed by their coordinates
on the program's mesh (``Program.mesh``, whose groups the collectives use), each written as digits over the
cut points of its mesh axis that the program and the types use (:class:`_Digits`: every (sub-)axis
coordinate and rank is then a linear term, no division by a constant); the claim's device order
(``Program.dst_mesh``) and the source's (``Program.src_mesh``) are translated to and from it by tables over
the position, as for a permute (none where the device orders agree). Instructions that name devices (a
permute's sources, an exchange's copies) name device ids, read through the program mesh's ``device_ids``.

- ``Slice(dim, axes)``: same device; index + r·n_out along ``dim`` (r = the device's rank over ``axes``).
- ``AllGather(dim, axes)``: the group member of rank i // n_in; index i % n_in along ``dim``.
- ``AllToAll(axes)`` (over a leading dim of k chunks, the only all-to-all the instruction set has): the
  member of rank i[0]; index r along dim 0 (r = the device's rank over ``axes``), the rest the same.
- ``ReduceScatter(dim, axes)``: a *sum* over the group: a fresh symbolic member (one summand per value of
  it); index + r·n_out along ``dim``. Where k does not divide the dim (the padding rule), an index at or
  past the input's n_in along ``dim`` holds a zero: the element is *no data* (as below).
- ``AllReduce(axes)``: a sum over the group, fresh symbolic member, same index.
- ``KeepRoot(axes)``: same device and index; the element is no data (a zero) unless the device's rank over
  ``axes`` is 0.
- ``EmbedChunk(dim, axes)``: same device; index − r·n_in along ``dim``, and no data unless the index lies in
  chunk r (r·n_in ≤ index < (r+1)·n_in).
- ``CollectivePermute(sources)``: the device ``sources[d]``, same index. A table of device ids is read per
  mesh axis: a table over the device id d of ``sources[d]``'s coordinate on that axis, each a balanced tree of
  ``If(d < start, …)`` over the runs of devices on which the coordinate is affine in d (:func:`_table`). A
  coordinate map (the form lowering makes) is read symbolically: for each group ``(source_axes, axes)`` the
  source's rank over ``source_axes`` is d's rank over ``axes`` (mixed-radix arithmetic on d's coordinates),
  its other coordinates are d's: a few terms per group, whatever the device count.
- ``Exchange(shape, dims)``: per dim, a selector over the slots of d's block (its rank over the dim's
  ``axes``; slot r: the block's r-th run of segments that tile an interval with one size and affine source
  blocks and starts, :func:`_segment_runs`; each field a table over the block, :meth:`_Walk.table`): the
  one whose interval holds the index gives, through one bounded quotient (the segment within the run), the
  source index and the source's block over the dim's ``source_axes`` (a block without an r-th run has count
  0 there, and its other fields, never read, repeat a neighbour's, so that they break no run or period); the
  source device is d with its rank over each dim's source axes set to those blocks. An index no segment of
  some dim covers is *unwritten* (the walk records that it must not be). The terms grow with the runs and
  with the pieces of their tables (runs of blocks on which a field is affine, or periods that repeat shifted:
  a few for blocks of equal size, even uneven ones), not with the segments, the devices or their copies. A
  copy table (an exchange between two device orders, ``CopyTable``): a selector over every device's copies,
  linear in them.
- ``Transpose(perm)``: same device; input index ``perm[a]`` is output index ``a``.
- ``Reshape(shape)``: same device; the index with the same row-major position in the input shape.

At the source, the source type's meaning gives the global index and summand coordinate the element is.
Each (device, index, choice of summation members) is a *contributor* to a group sum of the destination: a
source element (summand), or no data, a zero. Queries (``unsat`` = proved):

1. *values*: some device, local index that the destination type says is data, and choice of summation
   members where the element is no data, comes from a padding position of the source, or has a source
   global index other than the one the destination type assigns there (padding positions of the result may
   hold anything);
2. *sums* (only with partial axes or reductions): with ``Q`` the destination's partial axes, the
   contributors to the group reduction at (device, index) are indexed by (summation members, Q-coordinates
   of the group member). For a sum or a product each summand must be taken exactly once: their number must
   equal the number of source summand coordinates, and query 2 asks for two different contributors with the
   same source summand coordinate, or from two different source partial groups (SPEC 4: *any* summands
   whose group sums are right must work, so the summands of one group need not agree with those of a
   replica group). ``unsat`` proves the contributors are a bijection onto the summands of one source group.
   For an idempotent reduction (max, min, and every reduction of ``bool``: or, and) a summand taken twice
   changes nothing, and summands of other groups of the same element change nothing either once one whole
   group is in (each is at most the maximum, at least the minimum), so the query asks instead that the
   contributors *cover* every summand of one group: a bijection proves it at once; otherwise, with the
   contributor of all-zero members as the witness group, query 3 asks for a summand coordinate of that
   group that no contributor (each concrete choice of members, one walk each) takes. ``unsat`` proves the
   group is covered. (A program that covers some other group but not the witness's is refuted; every
   reduction of a synthesized plan covers all groups alike.)

   Where the claim has no partial group of more than one device, every contributor starts at the one base
   element, and the instructions after the program's last reduction move it as one value whatever the
   members are: that part is walked once and shared (:class:`_Base`), and each contributor walks only from
   the last reduction back. The queries then hold one copy of an exchange or permute that follows the
   reductions, not one per contributor for Z3 to prove equal (an all-reduce before an exchange of 37,336
   segments on 65,536 devices: the summation query was undecided after 240 s, and takes 0.02 s).

*Creating* pending sums (SPEC 3: the destination may be partial over axes the source is not; the program
then holds zeros where a summand lacks data: ``KeepRoot``, ``EmbedChunk``, an exchange or a padded chunk
that writes none) makes some contributors zeros, and the counting in 2 no longer holds. When the claim
is partial over a factor of the mesh that the source is not, or the program has a creating instruction,
the *summand-bijection* queries replace 1 and 2:

1'. *values*: as 1, except that a contributor may be no data (a zero adds nothing to a sum);
2'. *injective*: two different contributors at one (device, index), both data, with the same source summand
   coordinate or from two source partial groups (as 2, over data contributors only);
3'. *onto*: with every contributor enumerated (the Q-coordinates and summation members take each of their
   values, one walk each: at most ``_MAX_CONTRIBUTORS``), a (device, index) and a source summand
   coordinate ``σ`` that no data contributor there holds.

``unsat`` of all three proves that each destination group sum adds every summand of one source group
exactly once, and zeros elsewhere. Zeros are the identity of a sum only: a program or claim that creates
pending values of another reduction kind is refuted before these queries.

``peak_bytes`` and ``bytes_received`` are recomputed from the instructions and buffer shapes (which are the
same on every device of an SPMD program; the shapes are themselves re-derived from the instructions): the
collectives receive the same on every device, and what the point-to-point instructions give each device is
counted with numpy arithmetic on every device's coordinates at once (:func:`program_bytes`), no query.

What is read, and where each field is checked
---------------------------------------------
Every field the verifier reads constrains the verdict; a claim that differs from what the program computes
in any of them is refuted (status ``"refuted"``, with a counterexample in the style of the value query:
``device``, ``coords``, ``index`` — ``None`` for a field that is the same at every index — ``holds`` and
``expected``, naming the field that differs). Arguments that are not what they should be at all raise
:class:`~redist.errors.ShardingError` naming the argument (:func:`_check_arguments`).

- ``plan`` must be a :class:`~redist.plan.Plan`. Read: ``program``, ``src`` (the type of the input buffers),
  ``dst`` (the claim when none is given), ``peak_bytes`` and ``bytes_received`` (:func:`_check_costs`).
- ``Mesh``: the source type's must be the program's ``src_mesh`` and the claim's its ``dst_mesh``, compared as
  whole values (axis names, sizes, their order and ``device_ids``) by the one helper
  :func:`_mesh_difference`: a type on another arrangement of the same number of devices (axes in another
  order, other sizes, other names, or another device order) is refuted, the counterexample naming a device
  whose position differs (``Mesh({"y": 2, "x": 4})`` against ``x=4,y=2``: device 1 is at ``{x: 0, y: 1}``
  on one and ``{y: 0, x: 1}`` on the other; ``device_ids=[1,0]`` against the default order: device 0 is at
  ``{x: 1}`` on one and ``{x: 0}`` on the other). The program's own three meshes must have the same axes
  (only their device orders may differ), else it is refuted. A type on another number of devices is no
  claim about these devices: ``ShardingError``. ``device_ids`` are read as data (a permutation, inverted
  here); no method of ``Mesh`` is called.
- ``Program.dtype`` must be the source type's dtype, and the claim's ``dtype`` the source's
  (:func:`_check_fields`). The names' meaning is ``ShardingType.np_dtype``: the dtype table, not block
  arithmetic, is the one thing read from the type class beyond its fields.
- ``ShardingType.shape``: the claim's must be the source's (:func:`_check_fields`).
- ``ShardingType.dims``: the value query, through the meaning above (and the local shapes, below).
- ``ShardingType.partial``: the sums query and its count of summands, or (creating) queries 1'-3'.
- ``Program.shapes``: re-derived from the instructions and compared (:func:`_derive_shapes`); the first must
  be the source's local shape, the last the claim's.
- ``Program.instructions``: every field of every instruction is checked by :func:`_derive_shapes` (dims in
  range, axes of the mesh that do not overlap, a permutation of the devices — a table of device ids, or a
  coordinate map whose groups' two sides have equal sizes and cover the same factors of the mesh —, an
  exchange's segments that fit their buffers, name blocks that exist and do not overlap, and source axes
  that do not overlap) and read by the walk.
- ``ShardingType.reduction`` and the instructions' ``reduction``: every reduction instruction of the program
  must take one kind, the source's where the source is partial, and a partial claim must be of the
  source's kind (:func:`_check_reductions`); the maximum or minimum of complex numbers is refuted. The kind
  decides query 2 (exactly once, or covered).

Time
----
``timeout_s`` bounds the wall time of the whole call. A deadline is checked while the constraints are built
(per instruction, per dim of an exchange, per leaf of a permute's table) and Z3 gets only the time that
is left, with a timer that interrupts it at the deadline (its own ``timeout`` is checked late in some
phases); running out gives status ``"undecided"`` and a reason saying what was not finished. The plan's own
work — lowering (``plan.program``) and ``plan.bytes_received``, each computed once per plan and cached —
happens before the first check and cannot be cut short.
"""

from __future__ import annotations

import itertools
import math
import numbers
import re
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from redist import program as P
from redist.errors import ShardingError
from redist.extras import MissingModule
from redist.mesh import Mesh
from redist.plan import Plan
from redist.types import ShardingType

try:
    import z3
except ModuleNotFoundError as e:  # no [verify] extra: `import redist` works, and verify() says what to install
    z3 = MissingModule(e, "redist.verify", "verify")

__all__ = ["Verdict", "verify", "verify_program", "program_bytes", "STATUSES"]

STATUSES = ("proved", "refuted", "undecided")

_TOKEN = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::\((?P<pre>\d+)\)(?P<size>\d+))?\Z")
# The reduction kinds (SPEC 2), and those for which taking a summand twice changes nothing.
_KINDS = ("sum", "max", "min", "prod")
_IDEMPOTENT = ("max", "min")


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`verify`.

    ``status`` is ``"proved"`` (every check holds), ``"refuted"`` (some check fails: ``reason`` says which, and
    ``counterexample``, where there is one, names a device — id and coordinates —, a local index or ``None``,
    what that device holds there and what the claim expects) or ``"undecided"`` (the time ran out or Z3 gave
    up: ``reason`` says what was not finished, and nothing is known). ``ok`` is True only when proved; tell
    refuted from undecided by ``status``, never by the wording of ``reason``.
    """

    status: str
    reason: str
    counterexample: dict | None = None
    seconds: float = 0.0
    details: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ShardingError(f"Verdict status {self.status!r} is not one of {', '.join(STATUSES)}")

    @property
    def ok(self) -> bool:
        return self.status == "proved"

    def __bool__(self) -> bool:
        return self.ok


class _Refuted(Exception):
    def __init__(self, reason: str, counterexample: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.counterexample = counterexample


class _Undecided(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Deadline:
    """The wall-clock budget of one call (``timeout_s`` None: unbounded). :meth:`check` raises
    :class:`_Undecided` once it is spent, naming what was being done; :meth:`ms_left` is Z3's share."""

    def __init__(self, timeout_s: float | None, start: float):
        self.timeout_s = timeout_s
        self.start = start
        self.end = math.inf if timeout_s is None else start + timeout_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def check(self, doing: str) -> None:
        if time.perf_counter() >= self.end:
            raise _Undecided(f"timeout_s={self.timeout_s:g} ran out while {doing}")

    def ms_left(self) -> int | None:
        if self.end == math.inf:
            return None
        return max(1, int((self.end - time.perf_counter()) * 1000))


# ----------------------------------------------------------------------------- axes, independently
@dataclass(frozen=True)
class _Axis:
    token: str
    name: str
    size: int  # size of the (sub-)axis
    stride: int  # S / (pre·size)
    full: int  # size of the whole mesh axis
    lo: int  # factor range [pre, pre·size) on the axis, for overlap checks
    hi: int


def _axis(mesh_sizes: dict[str, int], token: Any) -> _Axis:
    m = _TOKEN.match(token) if isinstance(token, str) else None
    if not m or m["name"] not in mesh_sizes:
        raise _Refuted(f"axis {token!r} is not an axis or sub-axis of the mesh")
    full = mesh_sizes[m["name"]]
    pre, size = (1, full) if m["pre"] is None else (int(m["pre"]), int(m["size"]))
    if pre < 1 or size < 1 or full % (pre * size):
        raise _Refuted(f"sub-axis {token!r} does not fit mesh axis {m['name']!r} of size {full}")
    return _Axis(token, m["name"], size, full // (pre * size), full, pre, pre * size)


def _axes(mesh_sizes, tokens, where: str) -> tuple[_Axis, ...]:
    if not isinstance(tokens, (tuple, list)):
        raise _Refuted(f"{where}: axes {tokens!r} are not a list of axis names")
    out = tuple(_axis(mesh_sizes, t) for t in tokens)
    for x in range(len(out)):
        for y in range(x):
            a, b = out[x], out[y]
            # One factor named twice overlaps itself even where it is of size 1 (as the backends read it).
            if a.name == b.name and ((a.lo, a.hi) == (b.lo, b.hi) or (a.lo < b.hi and b.lo < a.hi)):
                raise _Refuted(f"{where}: axes {b.token!r} and {a.token!r} overlap; the group is not defined")
    return out


def _all(conds) -> z3.BoolRef:
    return z3.And(conds) if conds else z3.BoolVal(True)


def _ksize(axes) -> int:
    return math.prod(a.size for a in axes)


# ----------------------------------------------------------------------------- coordinates as digits
class _Digits:
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

    Coordinates are a dict from each mesh axis name to the tuple of its digit terms, major first."""

    def __init__(self, mesh_sizes: dict[str, int], axes):
        self.mesh_sizes = mesh_sizes
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
        return _horner(c[name], self.radix[name])

    def _span(self, ax: _Axis) -> range | None:
        """The digits of ``ax`` (None: it does not lie on cut points)."""
        p = self.cuts[ax.name]
        return range(p.index(ax.lo), p.index(ax.hi)) if ax.lo in p and ax.hi in p else None

    def sub(self, c: dict, ax: _Axis):
        """The coordinate on (sub-)axis ``ax``: (c[name] // stride) % size."""
        if ax.size == 1:
            return z3.IntVal(0)
        span = self._span(ax)
        if span is not None:
            return _horner([c[ax.name][k] for k in span], [self.radix[ax.name][k] for k in span])
        v = self.value(c, ax.name)
        if ax.stride != 1:
            v = v / ax.stride
        return v % ax.size if ax.lo != 1 else v  # pre > 1: the quotient can exceed size

    def rank(self, c: dict, axes):
        """The rank over ``axes`` (row-major, the last varying fastest)."""
        return _horner([self.sub(c, ax) for ax in axes], [ax.size for ax in axes])

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
                    out[ax.name][k] = z3.IntVal(0)
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
        number = _horner(digits, radices)
        if not bounded and digits:
            number = number + w.var("q") * math.prod(radices)
        w.defs.append(j == number)
        return {n: tuple(ds) for n, ds in out.items()}

    def _with_sub(self, w, c: dict, ax: _Axis, value) -> dict:
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
        w.defs.append(value == _horner(digits, self.radix[name]))
        return digits


def _horner(digits, radices):
    """The mixed-radix number of ``digits`` (major first) with ``radices``."""
    if not digits:
        return z3.IntVal(0)
    r = digits[0]
    for d, n in zip(digits[1:], radices[1:]):
        r = r * n + d
    return r


# ----------------------------------------------------------------------------- the meaning of a type
def _type_meaning(mesh_sizes, t, digits: _Digits | None = None, c: dict | None = None, idx=None):
    """SPEC section 2, stated in Z3: the global index that local index ``idx`` is on a device with
    coordinates ``c`` (written by ``digits``) under type ``t``, whether it is data (not padding), and the
    device's summand coordinates (its coordinates on the partial axes). Returns ``(global index exprs, local
    shape, summand exprs, partial axes, data condition)``; without ``idx`` only the local shape and partial axes
    (the rest empty)."""
    g, local, data = [], [], []
    for d, (n, tokens) in enumerate(zip(t.shape, t.dims)):
        axes = _axes(mesh_sizes, tokens, f"dim {d} of {t}")
        k = _ksize(axes)
        L = -(-n // k)
        local.append(L)
        if idx is not None:
            g.append(digits.rank(c, axes) * L + idx[d])
            if n % k:
                data.append(g[-1] < n)
    partial = _axes(mesh_sizes, tuple(t.partial), f"partial of {t}")
    used = [a for d, toks in enumerate(t.dims) for a in _axes(mesh_sizes, toks, f"dim {d} of {t}")]
    _axes(mesh_sizes, tuple(a.token for a in used) + tuple(a.token for a in partial), f"{t}")
    summands = [] if idx is None else [digits.sub(c, a) for a in partial]
    return g, tuple(local), summands, partial, _all(data)


# ----------------------------------------------------------------------------- shapes and bytes
def _derive_shapes(program, mesh_sizes, deadline: _Deadline) -> list[tuple[int, ...]]:
    """The local shape after each instruction, from the instruction semantics alone. Refutes an instruction
    with a field of the wrong kind, a dim the buffer lacks, axes that are not the mesh's or overlap, a split
    that does not divide, a permute that is not a permutation, or an exchange whose copies do not fit."""
    n_dev = math.prod(mesh_sizes.values())
    shapes = [tuple(program.shapes[0])]
    for t, ins in enumerate(program.instructions):
        x = list(shapes[-1])
        where = f"instruction {t} ({_brief(ins)})"
        deadline.check(f"checking {where}")
        bad = _malformed(ins, len(x))
        if bad:
            raise _Refuted(f"{where}: {bad}")

        def dim_ok(d):
            if not 0 <= d < len(x):
                raise _Refuted(f"{where}: the buffer has no dim {d!r}")

        if isinstance(ins, P.CollectivePermute):
            if isinstance(ins.sources, P.CoordinateMap):
                _check_map(ins.sources, mesh_sizes, where)
            elif sorted(ins.sources) != list(range(n_dev)):
                raise _Refuted(f"{where}: sources are not a permutation of the {n_dev} devices")
        elif isinstance(ins, P.Exchange) and isinstance(ins.dims, P.CopyTable):
            _check_copies(ins, tuple(x), n_dev, where, deadline)
            x = list(ins.shape)
        elif isinstance(ins, P.Exchange):
            _check_exchange(ins, tuple(x), mesh_sizes, where, deadline)
            x = list(ins.shape)
        elif isinstance(ins, P.Reshape):
            if math.prod(ins.shape) != math.prod(x) or any(n < 0 for n in ins.shape):
                raise _Refuted(f"{where}: cannot view a buffer of shape {tuple(x)} as {tuple(ins.shape)}")
            x = list(ins.shape)
        elif isinstance(ins, P.Transpose):
            if sorted(ins.perm) != list(range(len(x))):
                raise _Refuted(f"{where}: {tuple(ins.perm)} is not a permutation of the {len(x)} dims")
            x = [x[p] for p in ins.perm]
        else:
            k = _ksize(_axes(mesh_sizes, ins.axes, where))
            if isinstance(ins, P.Slice):
                dim_ok(ins.dim)
                if x[ins.dim] % k:
                    raise _Refuted(f"{where}: local dim {ins.dim} of size {x[ins.dim]} does not split in {k}")
                x[ins.dim] //= k
            elif isinstance(ins, P.ReduceScatter):
                dim_ok(ins.dim)
                x[ins.dim] = -(-x[ins.dim] // k)  # chunks by the padding rule
            elif isinstance(ins, (P.AllGather, P.EmbedChunk)):
                dim_ok(ins.dim)
                x[ins.dim] *= k
            elif isinstance(ins, P.AllToAll):
                dim_ok(0)
                if x[0] != k:
                    raise _Refuted(f"{where}: the leading dim of size {x[0]} is not the group's {k} chunks")
        shapes.append(tuple(x))
    if len(program.shapes) != len(shapes) or any(tuple(a) != b for a, b in zip(program.shapes, shapes)):
        raise _Refuted(f"the program's buffer shapes {list(map(tuple, program.shapes))} are not what its "
                       f"instructions produce ({shapes})")
    return shapes


def _brief(ins) -> str:
    """An instruction, shortened for messages (a permute over 65,536 devices prints as a long table). A
    malformed instruction (its fields of the wrong kinds: refuted right after) may not print: its repr then."""
    try:
        text = str(ins)
    except Exception:  # noqa: BLE001 - fields of any kind reach here, and only a message is at stake
        text = object.__repr__(ins)
    return text if len(text) <= 120 else text[:117] + "..."


def _is_int(x) -> bool:
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))  # int: the fast path


def _is_tokens(x) -> bool:
    """A tuple of axis tokens (strings; :func:`_axes` reads them)."""
    return isinstance(x, tuple) and all(isinstance(a, str) for a in x)


def _is_ints(x, n: int | None = None) -> bool:
    """A tuple of ``n`` integers (any number, if None)."""
    return isinstance(x, tuple) and (n is None or len(x) == n) and all(_is_int(v) for v in x)


def _malformed(ins, rank: int) -> str | None:
    """What is wrong with the kinds of an instruction's fields (None: nothing), before any is used; ``rank``
    is the rank of the buffer it reads."""
    if isinstance(ins, P.CollectivePermute):
        if isinstance(ins.sources, P.CoordinateMap):
            groups = ins.sources.groups
            ok = isinstance(groups, tuple) and all(
                isinstance(g, tuple) and len(g) == 2 and all(_is_tokens(side) for side in g) for g in groups)
            return None if ok else f"groups {groups!r:.80} are not pairs of axis lists"
        return None if _is_ints(ins.sources) else f"sources {ins.sources!r:.80} are not device ids"
    if isinstance(ins, (P.Reshape, P.Exchange)) and not _is_ints(ins.shape):
        return f"shape {ins.shape!r} is not a tuple of sizes"
    if isinstance(ins, P.Transpose) and not _is_ints(ins.perm):
        return f"perm {ins.perm!r} is not a tuple of dims"
    if isinstance(ins, P.Exchange):
        if len(ins.shape) != rank:
            return f"shape {ins.shape} has another rank than the buffer it reads ({rank})"
        if isinstance(ins.dims, P.CopyTable):
            table = ins.dims.copies
            if not isinstance(table, tuple) or not all(isinstance(cs, tuple) for cs in table):
                return "its copy table is not a tuple of copies per device"
            for d, copies in enumerate(table):
                for c in copies:
                    if not (_is_int(getattr(c, "source", None))
                            and all(_is_ints(getattr(c, f, None), rank) for f in ("src_start", "dst_start", "size"))):
                        return f"copy {c!r} of device {d} is not a copy between boxes of rank {rank}"
            return None
        if not isinstance(ins.dims, tuple) or len(ins.dims) != rank:
            return f"it has no table for each of the {rank} dims"
        for i, x in enumerate(ins.dims):
            if not (_is_tokens(getattr(x, "source_axes", None)) and _is_tokens(getattr(x, "axes", None))
                    and isinstance(getattr(x, "segments", None), tuple)
                    and all(_is_ints(tuple(seg) if isinstance(seg, tuple) else seg, 5) for seg in x.segments)):
                return f"the table of dim {i} ({x!r:.80}) is not axes and segments of five integers"
        return None
    if isinstance(ins, (P.Slice, P.AllGather, P.ReduceScatter, P.EmbedChunk)) and not _is_int(ins.dim):
        return f"dim {ins.dim!r} is not a dim"
    if isinstance(ins, (P.ReduceScatter, P.AllReduce)) and ins.reduction not in _KINDS:
        return f"reduction {ins.reduction!r} is none of {', '.join(_KINDS)}"
    if not isinstance(ins, (P.Reshape, P.Transpose, P.Slice, P.AllGather, P.AllToAll, P.ReduceScatter, P.AllReduce,
                            P.KeepRoot, P.EmbedChunk)):
        return f"unknown instruction {type(ins).__name__}"
    return None


def _check_map(cmap, mesh_sizes, where: str) -> None:
    """A coordinate map must be a permutation: each group's two sides of equal size; on each side no factor of
    a mesh axis named twice; the cut points of every mesh axis a chain of factors (so that every (sub-)axis
    coordinate is a digit of it); and the two sides covering the same factors of each mesh axis (the digits a
    source takes are those the map reads)."""
    sides: list[list[_Axis]] = [[], []]
    for source_tokens, tokens in cmap.groups:
        s, a = _axes(mesh_sizes, source_tokens, where), _axes(mesh_sizes, tokens, where)
        if _ksize(s) != _ksize(a):
            raise _Refuted(f"{where}: group {source_tokens} <- {tokens} reads {_ksize(a)} coordinates into "
                           f"{_ksize(s)}")
        sides[0] += s
        sides[1] += a
    for side in sides:
        _axes(mesh_sizes, tuple(ax.token for ax in side), f"{where}: one side of its groups")
    _check_chain(sides[0] + sides[1], where)
    for name in mesh_sizes:
        covered = [_merged(sorted((ax.lo, ax.hi) for ax in side if ax.name == name and ax.hi > ax.lo))
                   for side in sides]
        if covered[0] != covered[1]:
            raise _Refuted(f"{where}: its groups set other factors of mesh axis {name!r} than they read: it is no "
                           "permutation")


def _merged(ranges) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _check_chain(axes, where: str) -> None:
    """The factor boundaries that ``axes`` use on each mesh axis must each divide the next."""
    by_name: dict[str, set[int]] = {}
    for ax in axes:
        by_name.setdefault(ax.name, {1, ax.full}).update((ax.lo, ax.hi))
    for name, cuts in by_name.items():
        pts = sorted(cuts)
        if any(b % a for a, b in zip(pts, pts[1:])):
            raise _Refuted(f"{where}: its axes cut mesh axis {name!r} at {pts}, which are not factors of one "
                           "decomposition")


def _check_copies(ins, shape_in, n_dev: int, where: str, deadline: _Deadline) -> None:
    """A copy table (an exchange between two device orders) must name devices, fit both buffers, and not
    overlap on one device."""
    table = ins.dims.copies
    if len(table) != n_dev:
        raise _Refuted(f"{where}: copies for {len(table)} devices, the mesh has {n_dev}")
    for d, copies in enumerate(table):
        deadline.check(f"checking the copies of {where}")
        for c in copies:
            if not 0 <= c.source < n_dev:
                raise _Refuted(f"{where}: device {d} copies from device {c.source}, which does not exist")
            for lo_in, lo_out, n, cap_in, cap_out in zip(c.src_start, c.dst_start, c.size, shape_in, ins.shape):
                if n < 0 or lo_in < 0 or lo_out < 0 or lo_in + n > cap_in or lo_out + n > cap_out:
                    raise _Refuted(f"{where}: copy {c} of device {d} does not fit buffers {shape_in} -> {ins.shape}")
        for a in range(len(copies)):
            for b in range(a):
                if all(x.dst_start[i] < y.dst_start[i] + y.size[i] and y.dst_start[i] < x.dst_start[i] + x.size[i]
                       for x, y in [(copies[a], copies[b])] for i in range(len(ins.shape))):
                    raise _Refuted(f"{where}: copies {copies[b]} and {copies[a]} of device {d} overlap")


def _check_exchange(ins, shape_in, mesh_sizes, where: str, deadline: _Deadline) -> None:
    """An exchange's tables: one per dim; the source axes of all dims not overlapping and factors of one
    decomposition (a copy has one source); every segment naming blocks that exist and inside both buffers; the
    segments of one block of a dim not overlapping (so that no two copies of a device do)."""
    if len(ins.dims) != len(shape_in):
        raise _Refuted(f"{where}: tables for {len(ins.dims)} dims, the buffer has {len(shape_in)}")
    source_axes = _axes(mesh_sizes, tuple(a for x in ins.dims for a in x.source_axes), f"{where}: source axes")
    _check_chain(source_axes, where)
    for i, (x, cap_in, cap_out) in enumerate(zip(ins.dims, shape_in, ins.shape)):
        deadline.check(f"checking the segments of {where}")
        k_out = _ksize(_axes(mesh_sizes, x.axes, where))
        k_in = _ksize(_axes(mesh_sizes, x.source_axes, where))
        spans: dict[int, list[tuple[int, int]]] = {}
        for seg in x.segments:
            block, source_block, src_start, dst_start, size = seg
            if not (0 <= block < k_out and 0 <= source_block < k_in and size >= 0 and src_start >= 0
                    and dst_start >= 0 and src_start + size <= cap_in and dst_start + size <= cap_out):
                raise _Refuted(f"{where}: segment {tuple(seg)} of dim {i} does not fit buffers {shape_in} -> "
                               f"{ins.shape} with {k_in} -> {k_out} blocks")
            if size:
                spans.setdefault(block, []).append((dst_start, dst_start + size))
        for block, ss in spans.items():
            ss.sort()
            for a, b in zip(ss, ss[1:]):
                if b[0] < a[1]:
                    raise _Refuted(f"{where}: segments {a} and {b} of block {block} of dim {i} overlap")


def program_bytes(program, mesh_sizes=None) -> Fraction:
    """The most bytes any device receives over the program, from the instructions and shapes alone:
    Reshape, Transpose, Slice, KeepRoot and EmbedChunk 0; AllGather (k−1)/k·L_out; AllToAll (k−1)/k·L;
    ReduceScatter (k−1)·L_out (= (k−1)/k·L_in, the input padded to k chunks); AllReduce 2(k−1)/k·L (the same
    on every device); CollectivePermute L on a device whose source is another device; Exchange the elements a device copies from other devices (per device: :func:`_p2p_bytes`)."""
    uniform, per_device = _received(program, mesh_sizes or dict(program.mesh.axes))
    return uniform + (int(per_device.max()) if per_device.size else 0)


def _received(program, mesh_sizes) -> tuple[Fraction, np.ndarray]:
    """What every device receives from the collectives (one number), and per position of the program's mesh
    what its device receives from the point-to-point instructions (a numpy array over all positions)."""
    item = np.dtype(program.dtype).itemsize
    uniform, per_device = Fraction(0), np.zeros(math.prod(mesh_sizes.values()), np.int64)
    ids = np.asarray(_device_order(program.mesh), dtype=np.int64)
    for t, ins in enumerate(program.instructions):
        L_in = math.prod(program.shapes[t]) * item
        L_out = math.prod(program.shapes[t + 1]) * item
        if isinstance(ins, (P.CollectivePermute, P.Exchange)):
            per_device = per_device + _p2p_bytes(ins, mesh_sizes, L_in, item, ids)
            continue
        if isinstance(ins, (P.Reshape, P.Transpose)):
            continue
        k = _ksize(_axes(mesh_sizes, ins.axes, f"instruction {t}"))
        if isinstance(ins, (P.Slice, P.KeepRoot, P.EmbedChunk)):
            add = Fraction(0)
        elif isinstance(ins, P.AllGather):
            add = Fraction(k - 1, k) * L_out
        elif isinstance(ins, P.ReduceScatter):
            add = Fraction(k - 1) * L_out
        elif isinstance(ins, P.AllToAll):
            add = Fraction(k - 1, k) * L_in
        elif isinstance(ins, P.AllReduce):
            add = Fraction(2 * (k - 1), k) * L_in
        else:
            raise _Refuted(f"instruction {t}: unknown instruction {type(ins).__name__}")
        uniform += add
    return uniform, per_device


def _p2p_bytes(ins, mesh_sizes, L_in: int, item: int, ids: np.ndarray) -> np.ndarray:
    """Per position (``ids``: the device at each), the bytes a permute or an exchange brings its device from
    other devices (numpy, every device at once). A permute: its whole buffer where its source is another
    device (a table names device ids; a coordinate map positions). An exchange: a device's copies are
    the products of one segment per dim for its blocks, from itself exactly when every segment's source block
    is its own rank over the dim's source axes; so it receives ``Π_i total_i − Π_i own_i`` elements, the sums
    of its segments' sizes per dim, all of them and its own ones."""
    n = math.prod(mesh_sizes.values())
    positions = np.arange(n, dtype=np.int64)
    c = _coords(mesh_sizes, positions)
    if isinstance(ins, P.CollectivePermute):
        if isinstance(ins.sources, P.CoordinateMap):
            return np.where(_np_id(_np_map(c, ins.sources, mesh_sizes), mesh_sizes) != positions, L_in, 0)
        return np.where(np.asarray(ins.sources, dtype=np.int64)[ids] != ids, L_in, 0)
    if isinstance(ins.dims, P.CopyTable):  # by device id, read at each position
        table = ins.dims.copies
        return np.array([sum(math.prod(cp.size) for cp in table[d] if cp.source != d) for d in ids.tolist()],
                        np.int64) * item
    total, own = np.ones(n, np.int64), np.ones(n, np.int64)
    for x in ins.dims:
        axes = _axes(mesh_sizes, x.axes, "exchange")
        source_axes = _axes(mesh_sizes, x.source_axes, "exchange")
        k_in = _ksize(source_axes)
        by_block = np.zeros(_ksize(axes), np.int64)
        by_pair: dict[int, int] = {}  # block · k_in + source block -> elements
        for b, sb, _, _, size in x.segments:
            by_block[b] += size
            by_pair[b * k_in + sb] = by_pair.get(b * k_in + sb, 0) + size
        block = _np_rank(c, axes, n)
        total = total * by_block[block]
        if not by_pair:
            own[:] = 0
            continue
        keys = np.array(sorted(by_pair), dtype=np.int64)
        vals = np.array([by_pair[key] for key in keys.tolist()], dtype=np.int64)
        want = block * k_in + _np_rank(c, source_axes, n)
        at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
        own = own * np.where(keys[at] == want, vals[at], 0)
    return (total - own) * item


def _np_sub(c: dict, ax: _Axis) -> np.ndarray:
    return (c[ax.name] // ax.stride) % ax.size


def _np_rank(c: dict, axes, n: int) -> np.ndarray:
    """Every device's rank over ``axes`` (numpy; ``n`` devices)."""
    r = np.zeros(n, np.int64)
    for ax in axes:
        r = r * ax.size + _np_sub(c, ax)
    return r


def _np_map(c: dict, cmap, mesh_sizes) -> dict:
    """The coordinates of each device's source under a coordinate map (numpy arrays, by mesh axis)."""
    n = math.prod(mesh_sizes.values())
    groups = [(_axes(mesh_sizes, s, "permute"), _axes(mesh_sizes, a, "permute")) for s, a in cmap.groups]
    ranks = [_np_rank(c, a, n) for _, a in groups]
    out = dict(c)
    for (s, _), r in zip(groups, ranks):
        for ax in reversed(s):
            out[ax.name] = out[ax.name] + (r % ax.size - _np_sub(out, ax)) * ax.stride
            r = r // ax.size
    return out


def _np_id(c: dict, mesh_sizes) -> np.ndarray:
    d = 0
    for name, size in mesh_sizes.items():
        d = d * size + c[name]
    return d


# ----------------------------------------------------------------------------- the backward walk
class _Walk:
    """One backward walk of a symbolic element through the program."""

    def __init__(self, program, digits: _Digits, tag: str, deadline: _Deadline):
        self.program = program
        self.digits = digits
        self.mesh_sizes = digits.mesh_sizes
        self.names = list(self.mesh_sizes)
        self.ids = _device_order(program.mesh)  # the device at each position of the program's mesh
        self.pos = _positions(self.ids)  # the position of each device id
        self.tag = tag
        self.deadline = deadline
        self.defs: list = []  # definitional constraints (each has exactly one solution per input)
        self.ranges: list = []  # ranges of the free variables
        self.sum_vars: list = []  # (instruction index, fresh member coordinate vars)
        self.live: list = []  # conditions: the element is data, not a zero that an instruction wrote there
        self.quotients: dict = {}  # (key, lo, period) -> the quotient variable of :meth:`quotient`
        self.n = 0

    def fresh(self, base: str, lo: int, hi: int):
        self.n += 1
        v = z3.Int(f"{self.tag}_{base}_{self.n}")
        self.ranges.append(z3.And(v >= lo, v < hi))
        return v

    def var(self, base: str):
        """A fresh variable of any value (a quotient)."""
        self.n += 1
        return z3.Int(f"{self.tag}_{base}_{self.n}")

    def position(self, c):
        """The row-major position of coordinates ``c``."""
        return _horner([self.digits.value(c, name) for name in self.names],
                       [self.mesh_sizes[name] for name in self.names])

    def from_values(self, t, values: dict) -> dict:
        """Named coordinates whose value on each mesh axis is ``values[name]`` (in range)."""
        return self._named_coords(t, {name: self.digits.from_value(self, name, values[name])
                                      for name in self.names})

    def reorder(self, c: dict, from_ids, to_ids, what: str) -> dict:
        """The coordinates, on the device order ``to_ids``, of the device at coordinates ``c`` on the device
        order ``from_ids`` (both: the device at each position); ``c`` itself where the orders agree."""
        if from_ids == to_ids:
            return c
        at = _positions(to_ids)
        doing = f"encoding the device order of the {what} for the {self.tag!r} walk"
        targets = [_coords(self.mesh_sizes, at[d]) for d in from_ids]
        key = self.position(c)
        out = {name: _table(key, [x[name] for x in targets], self.deadline, doing) for name in self.names}
        self.n += 1
        return self.from_values(f"o{self.n}", out)

    def run(self, c: dict, idx: list, below: int | None = None, stop: int = 0):
        """Walk back through instructions ``below − 1`` down to ``stop`` (default: the whole program, from the
        result to the source); returns the device coords and index before instruction ``stop``."""
        prog = self.program
        for t in range(len(prog.instructions) - 1 if below is None else below - 1, stop - 1, -1):
            ins = prog.instructions[t]
            self.deadline.check(f"encoding instruction {t} ({type(ins).__name__}) for the {self.tag!r} walk")
            n_in, n_out = prog.shapes[t], prog.shapes[t + 1]
            idx = list(idx)
            if isinstance(ins, P.CollectivePermute):
                c = self._permute(t, ins, c)
                continue
            if isinstance(ins, P.Exchange):
                read = self._copy_table if isinstance(ins.dims, P.CopyTable) else self._exchange
                c, idx = read(t, ins, c, idx)
                continue
            if isinstance(ins, P.Transpose):
                # result dim a is input dim perm[a]
                before = [None] * len(idx)
                for a, p in enumerate(ins.perm):
                    before[p] = idx[a]
                idx = self._named(t, before)
                continue
            if isinstance(ins, P.Reshape):
                # The same row-major position in both shapes, group by group: runs of dims whose sizes
                # multiply to the same number map onto each other (a split or a merge of dims).
                before = [None] * len(n_in)
                for dims_in, dims_out in _reshape_groups(n_in, n_out):
                    flat = z3.IntVal(0)
                    for d in dims_out:
                        flat = flat * n_out[d] + idx[d]
                    stride = math.prod(n_in[d] for d in dims_in)
                    for pos, d in enumerate(dims_in):
                        stride //= n_in[d]
                        digit = flat / stride if stride > 1 else flat
                        before[d] = digit if pos == 0 else digit % n_in[d]
                idx = self._named(t, before)
                continue
            axes = _axes(self.mesh_sizes, ins.axes, f"instruction {t}")
            D = self.digits
            if isinstance(ins, P.Slice):
                idx[ins.dim] = idx[ins.dim] + D.rank(c, axes) * n_out[ins.dim]
            elif isinstance(ins, P.AllGather):
                m = n_in[ins.dim]
                j = idx[ins.dim] / m
                idx[ins.dim] = idx[ins.dim] % m
                c = D.with_rank(self, c, axes, j, bounded=False)
            elif isinstance(ins, P.AllToAll):
                j = idx[0]
                idx[0] = D.rank(c, axes)
                c = D.with_rank(self, c, axes, j, bounded=False)
            elif isinstance(ins, P.KeepRoot):
                self.live.append(D.rank(c, axes) == 0)
            elif isinstance(ins, P.EmbedChunk):
                start = D.rank(c, axes) * n_in[ins.dim]
                self.live.append(z3.And(idx[ins.dim] >= start, idx[ins.dim] < start + n_in[ins.dim]))
                idx[ins.dim] = idx[ins.dim] - start
            elif isinstance(ins, (P.ReduceScatter, P.AllReduce)):
                if isinstance(ins, P.ReduceScatter):
                    idx[ins.dim] = idx[ins.dim] + D.rank(c, axes) * n_out[ins.dim]
                    if n_in[ins.dim] % _ksize(axes):  # the padding rule: past the input, a zero
                        self.live.append(idx[ins.dim] < n_in[ins.dim])
                members = [self.fresh(f"sum{t}", 0, ax.size) for ax in axes]
                c = D.with_rank(self, c, axes, _horner(members, [ax.size for ax in axes]), bounded=True)
                self.sum_vars.append((t, members, axes))
            else:
                raise _Refuted(f"instruction {t}: unknown instruction {type(ins).__name__}")
            # Name the intermediate coordinates and index: keeps the terms small for the solver.
            c, idx = self._named_coords(t, c), self._named(t, idx)
        return c, idx

    def _permute(self, t: int, ins, c: dict) -> dict:
        """The coordinates of the source of the device at ``c``. A table: one table per mesh axis, of the
        source's coordinate on it, over the position (no division in the terms; the device at position p is
        ``ids[p]``, its source ``sources[ids[p]]``). A coordinate map: its ranks read from ``c``, then set on the
        source axes (groups do not overlap: checked); positions, so no device order enters."""
        if isinstance(ins.sources, P.CoordinateMap):
            groups = [(_axes(self.mesh_sizes, s, f"instruction {t}"), _axes(self.mesh_sizes, a, f"instruction {t}"))
                      for s, a in ins.sources.groups]
            if not groups:
                return c
            ranks = [self.digits.rank(c, a) for _, a in groups]
            out = dict(c)
            for (s, _), r in zip(groups, ranks):
                out = self.digits.with_rank(self, out, s, r, bounded=True)
            return self._named_coords(t, out)
        if all(s == d for d, s in enumerate(ins.sources)):
            return c
        did, doing = self.position(c), f"encoding the source table of instruction {t}"
        sources = [_coords(self.mesh_sizes, self.pos[ins.sources[d]]) for d in self.ids]
        return self.from_values(t, {name: _table(did, [s[name] for s in sources], self.deadline, doing)
                                    for name in self.names})

    def _exchange(self, t: int, ins, c: dict, idx: list):
        """Read an exchange backward, dim by dim: the segment for the device's block whose destination interval
        holds the index.

        Per dim, the segments of each receiver block, in order of their destination, are grouped into runs
        (:func:`_segment_runs`): segments of one size that tile an interval, with source blocks and source
        starts affine in their number q within the run. Slot ``r`` is a block's r-th run (an empty one where
        the block has fewer), each field a table over the block (:meth:`table`). Where the runs of a slot
        share their segment size and slopes, the segment of the index within the run is one bounded quotient
        ``q = (index − start) // size``; else each run is one segment (q = 0). A selector ``k`` names the slot
        whose run holds the index (``k == s``, the number of slots: none does, the element is unwritten):
        ``k == r → (0 ≤ q < count) ∧ (source block and source index)``, and ``k == s → no slot holds it``;
        the segments of one block do not overlap (checked), so ``k`` is a function of the device and index.
        The source device is the device with its rank over each dim's source axes set to the selected source
        blocks. The terms grow with the runs and with the pieces of their tables, not with the segments."""
        doing = f"encoding the segments of instruction {t} (exchange) for the {self.tag!r} walk"
        i2, settings = [], []
        for i, x in enumerate(ins.dims):
            self.deadline.check(doing)
            axes = _axes(self.mesh_sizes, x.axes, f"instruction {t}")
            source_axes = _axes(self.mesh_sizes, x.source_axes, f"instruction {t}")
            by_block, uniform = _segment_runs(x.segments, _ksize(axes), self.deadline, doing)
            slots = max(map(len, by_block))
            k = self.fresh(f"seg{t}_{i}", 0, slots + 1)
            block = z3.Int(f"{self.tag}_b{t}_{i}")
            self.defs.append(block == self.digits.rank(c, axes))
            source_block = z3.Int(f"{self.tag}_sb{t}_{i}")
            index = z3.Int(f"{self.tag}_i{t}_{i}")

            def slot(r: int, field: int):
                """Per block, ``field`` of its r-th run, as a table over the block. Where a block has no r-th run,
                its count and size are 0 (no index is inside it) and its other fields are never read: they
                repeat a neighbour's (:func:`_filled`), which keeps the table's runs and periods whole."""
                values = [runs[r][field] if r < len(runs) else None for runs in by_block]
                return self.table(block, [0 if v is None else v for v in values] if field in (_SIZE, _COUNT)
                                  else _filled(values), doing)

            covers = []
            for r in range(slots):
                start = slot(r, _DST)
                if uniform[r] is None:  # one segment per run: q = 0
                    size = slot(r, _SIZE)
                    inside = z3.And(idx[i] >= start, idx[i] < start + size)
                    src, offset = slot(r, _SOURCE), slot(r, _SHIFT)
                else:
                    size, d_source, d_src = uniform[r]
                    q = self.var(f"q{t}_{i}_{r}")  # the segment within the run: a quotient, defined for every index
                    self.defs.append(z3.And(size * q <= idx[i] - start, idx[i] - start < size * q + size))
                    inside = z3.And(q >= 0, q < slot(r, _COUNT))
                    src = slot(r, _SOURCE) + d_source * q
                    offset = slot(r, _SHIFT) + (d_src - size) * q
                covers.append(inside)
                self.defs.append(z3.Implies(k == r, z3.And(inside, source_block == src, index == idx[i] + offset)))
            self.defs.append(z3.Implies(k == slots, z3.Not(z3.Or(covers)) if covers else z3.BoolVal(True)))
            self.live.append(k < slots)
            i2.append(index)
            settings.append((source_axes, source_block))
        out = dict(c)
        for source_axes, source_block in settings:
            # bounded: a segment names a source block that exists (checked); where none is taken, any will do
            out = self.digits.with_rank(self, out, source_axes, source_block, bounded=True)
        return self._named_coords(t, out), i2

    def table(self, key, values: Sequence[int], doing: str):
        """``values[key]`` for a symbolic ``key`` in ``range(len(values))``, as :func:`_table`, but over the
        pieces of :func:`_periodic_pieces`: a piece of whole periods, whose values repeat shifted by the same
        amount from one period to the next, is one leaf: that shift times the period's number ``q`` (a
        quotient, defined for every key, as the walk's definitions are) plus the table of one period (its
        runs, :func:`_table`) at the offset within it. A table of ``b // 19``, ``2·(b % 19)`` or ``2·b % 145``
        over 65,536 blocks is a few leaves, not thousands of runs."""
        pieces = _periodic_pieces(values, self.deadline, doing)

        def leaf(piece):
            lo, period, periods, per_period = piece
            if periods == 1:  # one run, affine in the key
                slope = values[lo + 1] - values[lo] if period > 1 else 0
                return _affine(key, slope, values[lo] - slope * lo)
            q = self.quotient(key, lo, period)
            within = _table(key - lo - period * q, values[lo:lo + period], self.deadline, doing)
            return per_period * q + within if per_period else within

        def tree(a: int, b: int):
            if b - a == 1:
                self.deadline.check(doing)
                return leaf(pieces[a])
            mid = (a + b) // 2
            return z3.If(key < pieces[mid][0], tree(a, mid), tree(mid, b))

        return tree(0, len(pieces))

    def quotient(self, key, lo: int, period: int):
        """``(key − lo) // period`` as a variable defined for every key, one per ``(key, lo, period)`` in the
        walk: the tables of an exchange's fields over one block share it (each more would be one more case
        split for the solver, equal to the others)."""
        at = (key.get_id(), lo, period)
        if at not in self.quotients:
            q = self.quotients[at] = self.var("period")
            self.defs.append(z3.And(period * q <= key - lo, key - lo < period * q + period))
        return self.quotients[at]

    def _copy_table(self, t: int, ins, c: dict, idx: list):
        """Read a copy table (an exchange between two device orders) backward: the copy whose destination box
        (on this device) holds the index.

        A selector ``k`` names that copy (``k == J``, the number of copies: none holds it, the element is
        unwritten). Each copy is one implication, ``k == j → (device and index in its box) ∧ (source device
        and index)``, and ``k == J → no box holds it``; the boxes of one device do not overlap, so ``k`` is a
        function of the device and index: linear in the number of copies (such a table is per device, as a
        mesh in another order is)."""
        did = self.position(c)
        doing = f"encoding the copies of instruction {t} (exchange) for the {self.tag!r} walk"
        table = ins.dims.copies
        n_copies = sum(len(copies) for copies in table)
        k = self.fresh(f"copy{t}", 0, n_copies + 1)
        c2 = self.digits.fresh(lambda base, lo, hi: self.fresh(f"x{t}_{base}", lo, hi))
        i2 = [z3.Int(f"{self.tag}_i{t}_{d}") for d in range(len(idx))]
        covers, j = [], 0
        for d, copies in enumerate(table):
            if d % 256 == 0:
                self.deadline.check(doing)
            if not copies:
                continue
            on_d = did == self.pos[d]
            for cp in copies:
                inside = z3.And([on_d] + [z3.And(i >= lo, i < lo + n) for i, lo, n in zip(idx, cp.dst_start, cp.size)])
                covers.append(inside)
                source = _coords(self.mesh_sizes, self.pos[cp.source])
                self.defs.append(z3.Implies(k == j, z3.And(
                    [inside] + [self.digits.value(c2, name) == source[name] for name in self.names]
                    + [a == (i if lo_in == lo_out else i + (lo_in - lo_out))
                       for a, i, lo_in, lo_out in zip(i2, idx, cp.src_start, cp.dst_start)])))
                j += 1
        self.deadline.check(doing)
        self.defs.append(z3.Implies(k == n_copies, z3.Not(z3.Or(covers)) if covers else z3.BoolVal(True)))
        self.live.append(k < n_copies)
        return c2, i2

    def _named(self, t: int, idx: list) -> list:
        """Fresh names for the index before instruction ``t`` (keeps the solver's terms small)."""
        out = []
        for d, e in enumerate(idx):
            v = z3.Int(f"{self.tag}_i{t}_{d}")
            self.defs.append(v == e)
            out.append(v)
        return out

    def _named_coords(self, t, c: dict) -> dict:
        """Fresh names for the digits of the device coordinates before instruction ``t`` that are terms (a
        digit that is a variable or a number stays as it is)."""
        out = {}
        for name in self.names:
            digits = []
            for k, e in enumerate(c[name]):
                if not z3.is_const(e):
                    v = z3.Int(f"{self.tag}_c{t}_{name}_{k}")
                    self.defs.append(v == e)
                    e = v
                digits.append(e)
            out[name] = tuple(digits)
        return out


def _device_order(mesh) -> tuple[int, ...]:
    """The device id at each row-major position of ``mesh``: its ``device_ids``, read as data."""
    return tuple(mesh.device_ids)


def _positions(ids: Sequence[int]) -> list[int]:
    """The position of each device id, given the device id at each position (a permutation)."""
    out = [0] * len(ids)
    for p, d in enumerate(ids):
        out[d] = p
    return out


def _coords(mesh_sizes: dict, device: int) -> dict[str, int]:
    """The coordinates of position ``device``: row-major over the mesh axes, the last varying fastest (a
    device id's own position in the default device order)."""
    out = {}
    for name in reversed(list(mesh_sizes)):
        device, out[name] = divmod(device, mesh_sizes[name])
    return {name: out[name] for name in mesh_sizes}


def _table(key, values: Sequence[int], deadline: _Deadline, doing: str):
    """``values[key]`` for a symbolic ``key`` in ``range(len(values))``: a balanced tree of ``If(key < start,
    …, …)`` over the maximal runs of keys on which ``values`` is affine in the key (leaf ``a·key + b``).

    A run grows while consecutive differences agree, so every run but the last has two keys or more: at most
    ``ceil(n / 2)`` leaves, and ``2m + 1`` for a permute that moves ``m`` devices (the identity is affine). A
    table with structure has far fewer: the source coordinates of a permute that swaps mesh axes are affine
    along the minor axis (256 leaves per axis for a transpose of 256 x 256 devices, against 65,536 entries
    in a chain of if-then-elses)."""
    runs, start = [], 0
    while start < len(values):
        slope = values[start + 1] - values[start] if start + 1 < len(values) else 0
        end = start + 1
        while end < len(values) and values[end] - values[end - 1] == slope:
            end += 1
        runs.append((start, slope, values[start] - slope * start))
        start = end

    def tree(lo: int, hi: int):
        if hi - lo == 1:
            deadline.check(doing)
            _, slope, offset = runs[lo]
            return _affine(key, slope, offset)
        mid = (lo + hi) // 2
        return z3.If(key < runs[mid][0], tree(lo, mid), tree(mid, hi))

    return tree(0, len(runs))


# The fields of a run of segments (:func:`_segment_runs`); the shift is the first segment's ``src − dst``.
_DST, _SIZE, _COUNT, _SOURCE, _SHIFT = range(5)


def _filled(values: Sequence[int | None]) -> list[int]:
    """``values`` with each None replaced by the value before it (the first value, for those before it; 0 if
    there is none)."""
    out, last = [], next((v for v in values if v is not None), 0)
    for v in values:
        last = last if v is None else v
        out.append(last)
    return out


def _segment_runs(segments, n_blocks: int, deadline: _Deadline, doing: str):
    """The non-empty segments of each receiver block, in order of their destination start, grouped into runs:
    maximal sequences of one size ``z`` whose q-th segment starts at ``dst + q·z`` and takes source block
    ``source + q·d_source`` from ``src + q·d_src``.

    Returns ``(by_block, uniform)``: per block, its runs as ``(dst, z, count, source, src − dst)`` (field order
    ``_DST`` …), and per slot ``r`` (a block's r-th run) ``(z, d_source, d_src)`` where every block's r-th run
    has size ``z`` and every one of more than one segment those slopes, so that one quotient selects the
    segment in all blocks; else ``None``, and every run of the blocks is split into single segments (one
    case per segment, as before any grouping) when some r-th run of several segments breaks that."""
    blocks: list[list] = [[] for _ in range(n_blocks)]
    for seg in segments:
        if seg.size:
            blocks[seg.block].append(seg)
    by_block, slopes = [], []
    for segs in blocks:
        deadline.check(doing)
        segs.sort(key=lambda g: g.dst_start)
        runs, j = [], 0
        while j < len(segs):
            g, m = segs[j], 1
            if j + 1 < len(segs):
                h = segs[j + 1]
                d_source, d_src = h.source_block - g.source_block, h.src_start - g.src_start
                while (j + m < len(segs) and segs[j + m].size == g.size
                       and segs[j + m].dst_start == g.dst_start + m * g.size
                       and segs[j + m].source_block == g.source_block + m * d_source
                       and segs[j + m].src_start == g.src_start + m * d_src):
                    m += 1
            runs.append(((g.dst_start, g.size, m, g.source_block, g.src_start - g.dst_start),
                         (d_source, d_src) if m > 1 else None))
            j += m
        by_block.append([run for run, _ in runs])
        slopes.append([d for _, d in runs])
    uniform = []
    for r in range(max(map(len, by_block), default=0)):
        sizes = {runs[r][_SIZE] for runs in by_block if r < len(runs)}
        ds = {d[r] for d in slopes if r < len(d) and d[r] is not None}
        if not ds:
            uniform.append(None)  # single segments
        elif len(sizes) == 1 and len(ds) == 1:
            uniform.append((sizes.pop(), *ds.pop()))
        else:  # no common quotient: one case per segment
            singles = [[(g.dst_start, g.size, 1, g.source_block, g.src_start - g.dst_start) for g in segs]
                       for segs in blocks]
            return singles, [None] * max(map(len, singles), default=0)
    return by_block, uniform


# A piece of fewer periods stays runs: each quotient is a case split for the solver, worth it only where it
# replaces many leaves (measured: quotients on pieces of 2-4 periods made an exchange of 4,096 blocks of 18 from
# 64 of 1,094 take 18-30 s instead of 0.7 s).
_MIN_PERIODS = 8
# A period spans at most this many runs (the source blocks of uneven blocks: 2·b % 145 has 3 per period).
_PERIOD_RUNS = 4


def _periodic_pieces(values: Sequence[int], deadline: _Deadline, doing: str) -> list[tuple]:
    """The table ``values`` over the keys ``range(len(values))`` as consecutive pieces ``(lo, period, periods,
    per_period)``: for a key ``lo + p·period + r`` (``0 ≤ p < periods``, ``0 ≤ r < period``) the value is
    ``values[lo + r] + p·per_period``. Greedy from each key ``lo``: a period is the span of the first one to
    ``_PERIOD_RUNS`` maximal runs from ``lo`` on which the value is affine in the key, the one that repeats
    over the most keys, shifted, ``_MIN_PERIODS`` times or more; where none does, the first run is a piece
    of its own (one period)."""
    n = len(values)

    def run_end(lo: int) -> int:
        slope = values[lo + 1] - values[lo] if lo + 1 < n else 0
        end = lo + 1
        while end < n and values[end] - values[end - 1] == slope:
            end += 1
        return end

    def periods_of(lo: int, period: int) -> int:
        shift, p = values[lo + period] - values[lo], 1
        while lo + (p + 1) * period <= n and all(values[lo + p * period + r] == values[lo + r] + p * shift
                                                 for r in range(period)):
            p += 1
        return p

    pieces, lo = [], 0
    while lo < n:
        deadline.check(doing)
        ends = [run_end(lo)]
        while len(ends) < _PERIOD_RUNS and ends[-1] < n:
            ends.append(run_end(ends[-1]))
        best = (1, ends[0] - lo)  # (periods, period)
        for end in ends:
            if end < n:
                periods = periods_of(lo, end - lo)
                if periods >= _MIN_PERIODS and periods * (end - lo) > best[0] * best[1]:
                    best = (periods, end - lo)
        periods, period = best
        pieces.append((lo, period, periods, values[lo + period] - values[lo] if periods > 1 else 0))
        lo += period * periods
    return pieces


def _affine(key, slope: int, offset: int):
    """``slope·key + offset``, without the terms that are 0 or the factor that is 1."""
    out = key if slope == 1 else slope * key if slope else None
    if out is None:
        return z3.IntVal(offset)
    return out + offset if offset else out


def _reshape_groups(shape_in, shape_out) -> list[tuple[list[int], list[int]]]:
    """Align two shapes of equal size into runs of dims with equal products, e.g. (8, 4) and (2, 4, 4) give
    ([0], [0, 1]) and ([1], [2]): row-major positions within a run correspond, whatever the other runs hold."""
    if 0 in shape_in or 0 in shape_out:
        return [(list(range(len(shape_in))), list(range(len(shape_out))))]
    groups, i, j = [], 0, 0
    while i < len(shape_in) or j < len(shape_out):
        gi, gj, pa, pb = [], [], 1, 1
        if i < len(shape_in):
            gi.append(i)
            pa *= shape_in[i]
            i += 1
        if j < len(shape_out):
            gj.append(j)
            pb *= shape_out[j]
            j += 1
        while pa != pb:
            if pa < pb:
                gi.append(i)
                pa *= shape_in[i]
                i += 1
            else:
                gj.append(j)
                pb *= shape_out[j]
                j += 1
        groups.append((gi, gj))
    return groups


def _model_int(model, e) -> int:
    return model.eval(e, model_completion=True).as_long()


def _model_coords(model, digits: _Digits, c: dict) -> dict[str, int]:
    """The coordinates ``c`` take in ``model``, by mesh axis."""
    return {n: _model_int(model, digits.value(c, n)) for n in digits.mesh_sizes}


def _solve(constraints, deadline: _Deadline, query: str):
    """Check ``constraints`` with the time that is left; ``unknown`` (time out, or Z3 gives up) is undecided.

    Besides Z3's own ``timeout``, which some of its phases check late (a 35,000-copy exchange overran it by
    18 s), a timer interrupts the solver at the deadline; an interrupt after ``check`` returned does nothing."""
    s = z3.SolverFor("QF_LIA")
    for start in range(0, len(constraints), 4096):
        deadline.check(f"handing the {query} to Z3")
        s.add(*constraints[start:start + 4096])
    ms = deadline.ms_left()
    watchdog = None
    if ms is not None:
        s.set("timeout", ms)
        watchdog = threading.Timer(ms / 1000, s.ctx.interrupt)
        watchdog.daemon = True
        watchdog.start()
    try:
        res = s.check()
    finally:
        if watchdog is not None:
            watchdog.cancel()
    if res == z3.unknown:
        budget = "" if deadline.timeout_s is None else f" within timeout_s={deadline.timeout_s:g}"
        raise _Undecided(f"Z3 did not decide the {query}{budget} ({s.reason_unknown()})")
    return s, res


# ----------------------------------------------------------------------------- entry points
def verify(plan, dst=None, timeout_s: float | None = None, *, check_costs: bool = True) -> Verdict:
    """Prove that ``plan.program`` turns buffers of type ``plan.src`` into buffers of type ``dst``
    (default ``plan.dst``) on every device at every local index (group sums, for partial types), and that
    ``plan.peak_bytes`` / ``plan.bytes_received`` agree with the instructions (unless ``check_costs`` is
    False).

    ``dst`` may be a :class:`~redist.types.ShardingType` or its text (read on the plan's mesh). A claim that
    differs from what the program computes in anything — layout, partial axes, dtype, shape, mesh — is
    refuted, with a counterexample (module header). ``timeout_s`` (seconds, None: no bound) bounds the wall
    time of the call; when it runs out the verdict is ``"undecided"``.

    Raises :class:`~redist.errors.ShardingError` if ``plan`` is not a Plan, ``dst`` is not a type (or text
    that parses) on a mesh of the plan's number of devices, ``timeout_s`` is not a positive number or None, or
    ``check_costs`` is not a bool."""
    start = time.perf_counter()
    if not isinstance(plan, Plan):
        raise ShardingError(f"verify: plan must be a redist.Plan (from redist.synthesize), got {_show(plan)}")
    timeout_s = _check_timeout(timeout_s)
    if not isinstance(check_costs, bool):
        raise ShardingError(f"verify: check_costs must be True or False, got {_show(check_costs)}")
    if isinstance(dst, str):
        try:
            dst = ShardingType.parse(dst, plan.src.mesh)
        except ShardingError as e:
            raise ShardingError(f"verify: dst: {e}") from None
    claim = plan.dst if dst is None else dst
    program = plan.program
    _check_arguments(program, plan.src, claim)
    costs = (plan.peak_bytes, plan.bytes_received) if check_costs else None
    return _run(program, plan.src, claim, costs, _Deadline(timeout_s, start))


def verify_program(program, src, dst, *, costs=None, timeout_s: float | None = None) -> Verdict:
    """:func:`verify` for a bare program: ``src`` is what its input buffers hold, ``dst`` the claim.
    ``costs``: optional ``(peak_bytes, bytes_received)`` to check against the instructions. Raises
    :class:`~redist.errors.ShardingError` if ``program`` is not a :class:`~redist.program.Program` (with
    tuples of instructions and shapes, a mesh and a dtype), ``src`` or ``dst`` is not a type on a mesh of the
    program's number of devices, or ``timeout_s`` is not a positive number or None."""
    start = time.perf_counter()
    timeout_s = _check_timeout(timeout_s)
    _check_arguments(program, src, dst)
    return _run(program, src, dst, costs, _Deadline(timeout_s, start))


def _show(x) -> str:
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _check_timeout(timeout_s) -> float | None:
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not timeout_s > 0:
        raise ShardingError(f"verify: timeout_s must be a number of seconds > 0, or None for no bound; "
                            f"got {_show(timeout_s)}")
    return float(timeout_s)


def _check_arguments(program, src, dst) -> None:
    """Arguments that are not a program and two types about its devices at all: ShardingError (a type on
    another arrangement of the same devices is a claim, refuted later by :func:`_check_fields`)."""
    if not isinstance(program, P.Program):
        raise ShardingError(f"verify: program must be a redist.program.Program, got {_show(program)}")
    if not (isinstance(program.instructions, tuple) and isinstance(program.shapes, tuple) and program.shapes
            and all(_is_ints(s) for s in program.shapes)):
        raise ShardingError("verify: the program's instructions and shapes must be tuples (shapes: one tuple of "
                            f"sizes per buffer), got {_show(program.instructions)} and {_show(program.shapes)}")
    for name in ("mesh", "src_mesh", "dst_mesh"):
        if not isinstance(getattr(program, name), Mesh):
            raise ShardingError(f"verify: the program's {name} must be a redist.Mesh, got "
                                f"{_show(getattr(program, name))}")
    try:
        np.dtype(program.dtype)
    except TypeError:
        raise ShardingError(f"verify: the program's dtype {program.dtype!r} is not a numpy dtype") from None
    for name, t, kind in (("src", src, "a redist.ShardingType"), ("dst", dst, "a redist.ShardingType or its text")):
        if not isinstance(t, ShardingType) or not isinstance(t.mesh, Mesh):
            raise ShardingError(f"verify: {name} must be {kind}, got {_show(t)}")
        if t.mesh.size != program.mesh.size:
            raise ShardingError(f"verify: {name} {t} is on mesh {t.mesh} of {t.mesh.size} devices, but the plan "
                                f"runs on mesh {program.mesh} of {program.mesh.size}: the types must be about the "
                                "devices the plan runs on")


def _run(program, src, dst, costs, deadline: _Deadline) -> Verdict:
    details: dict = {}
    try:
        _verify(program, src, dst, costs, deadline, details)
    except _Refuted as e:
        return Verdict("refuted", e.reason, e.counterexample, deadline.elapsed(), details)
    except _Undecided as e:
        return Verdict("undecided", e.reason, None, deadline.elapsed(), details)
    return Verdict("proved", "proved: every device holds the destination's elements at every local index"
                   + (" (group sums of partial axes)" if src.partial else "")
                   + ("; peak_bytes and bytes_received agree with the instructions" if costs else ""),
                   None, deadline.elapsed(), details)


def _verify(program, src, dst, costs, deadline: _Deadline, details: dict) -> None:
    mesh_sizes = dict(program.mesh.axes)
    _check_fields(program, src, dst)
    _, src_local, _, src_partial, _ = _type_meaning(mesh_sizes, src)
    _, dst_local, _, dst_partial, _ = _type_meaning(mesh_sizes, dst)
    if tuple(program.shapes[0]) != src_local:
        raise _Refuted(f"the program starts from local shape {tuple(program.shapes[0])}, but {src} is {src_local}",
                       _field_cx(mesh_sizes, "local_shape", tuple(program.shapes[0]), src_local))
    shapes = _derive_shapes(program, mesh_sizes, deadline)
    if shapes[-1] != dst_local:
        raise _Refuted(f"the program ends with local shape {shapes[-1]}, but {dst} has local shape {dst_local}",
                       _field_cx(mesh_sizes, "local_shape", shapes[-1], dst_local))
    _check_costs(program, shapes, mesh_sizes, costs, details)
    kind = _check_reductions(program, src, dst)
    if any(n == 0 for n in dst_local):
        return  # no elements: nothing to prove
    zeros = _creates(mesh_sizes, src, dst) or any(isinstance(ins, (P.KeepRoot, P.EmbedChunk))
                                                  for ins in program.instructions)
    created = kind or (dst.reduction if dst.partial else "sum")
    if zeros and created != "sum":
        raise _Refuted(f"the program or the claim {dst} creates pending values (zeros where a summand lacks "
                       f"data), but zeros are the identity of a sum only, and its values are a pending {created}",
                       _field_cx(mesh_sizes, "reduction", created, "sum"))
    digits = _Digits(mesh_sizes, _named_axes(program, mesh_sizes, src, dst))
    _value_query(program, digits, src, dst, dst_local, deadline, details, zeros)
    if zeros:
        _creation_queries(program, digits, src, dst, dst_local, deadline, details)
        return
    idempotent = kind in _IDEMPOTENT or np.dtype(program.dtype) == np.dtype(np.bool_)
    _sum_query(program, digits, src, dst, dst_local, deadline, details, idempotent)


def _named_axes(program, mesh_sizes, src, dst) -> list[_Axis]:
    """Every (sub-)axis the program's instructions and the two types name (checked by then): they set the
    cut points of :class:`_Digits`."""
    tokens = [a for t in (src, dst) for a in (*itertools.chain(*t.dims), *t.partial)]
    for ins in program.instructions:
        if isinstance(ins, P.CollectivePermute):
            if isinstance(ins.sources, P.CoordinateMap):
                tokens += [a for group in ins.sources.groups for side in group for a in side]
        elif isinstance(ins, P.Exchange):
            if not isinstance(ins.dims, P.CopyTable):
                tokens += [a for x in ins.dims for a in (*x.axes, *x.source_axes)]
        elif not isinstance(ins, (P.Reshape, P.Transpose)):
            tokens += list(ins.axes)
    return [_axis(mesh_sizes, a) for a in tokens]


def _creates(mesh_sizes, src, dst) -> bool:
    """Whether the claim ``dst`` is partial over some factor of a mesh axis that ``src`` is not: a partial
    axis's factor range ``[pre, pre·size)`` not covered by the ranges of the source's partial axes of that
    mesh axis."""
    have: dict[str, list] = {}
    for a in _axes(mesh_sizes, tuple(src.partial), f"partial of {src}"):
        have.setdefault(a.name, []).append((a.lo, a.hi))
    for a in _axes(mesh_sizes, tuple(dst.partial), f"partial of {dst}"):
        at = a.lo
        while at < a.hi:
            at = next((hi for lo, hi in have.get(a.name, ()) if lo <= at < hi), None)
            if at is None:
                return True
    return False


# ----------------------------------------------------------------------------- fields no query reads
def _check_fields(program, src, dst) -> None:
    """Meshes, dtypes and shapes must agree exactly (the audit in the module header): the source type's mesh
    is the program's ``src_mesh`` and the claim's its ``dst_mesh``, whose axes are those of the program's
    ``mesh``; the program's dtype is the source type's, and the claim's dtype and shape are the source's."""
    mesh_sizes = dict(program.mesh.axes)
    for which in ("src_mesh", "dst_mesh"):
        if tuple(getattr(program, which).axes) != tuple(program.mesh.axes):
            raise _Refuted(f"the program's {which} {getattr(program, which)!r} does not have the axes of the mesh "
                           f"{program.mesh!r} its collectives run on", _mesh_difference(program.mesh,
                                                                                        getattr(program, which)))
    for what, t, have, role in (("source type", src, program.src_mesh, "the program reads its input on"),
                                ("claim", dst, program.dst_mesh, "the program leaves its result on")):
        cx = _mesh_difference(have, t.mesh)
        if cx is not None:
            raise _Refuted(f"the {what} {t} is on mesh {t.mesh!r}, but {role} mesh {have!r}: device "
                           f"{cx['device']} is at {cx['holds']['coords']} on the program's mesh and at "
                           f"{cx['expected']['coords']} on the {what}'s", cx)
    dtype = np.dtype(program.dtype)
    if dtype != src.np_dtype:
        raise _Refuted(f"the program computes on {dtype.name} buffers, but the source type {src} is {src.dtype}",
                       _field_cx(mesh_sizes, "dtype", dtype.name, src.dtype))
    if dst.dtype != src.dtype:
        raise _Refuted(f"the claim {dst} has dtype {dst.dtype}, but the program keeps the source's {src.dtype}",
                       _field_cx(mesh_sizes, "dtype", src.dtype, dst.dtype))
    if tuple(src.shape) != tuple(dst.shape):
        raise _Refuted(f"source shape {src.shape} and claimed shape {dst.shape} differ",
                       _field_cx(mesh_sizes, "shape", tuple(src.shape), tuple(dst.shape)))


def _mesh_difference(have, want) -> dict | None:
    """None if ``have`` and ``want`` (meshes of the same number of devices) are the same mesh, else a
    counterexample: the first device id whose position (coordinates by axis name, through each mesh's
    ``device_ids``) differs, or device 0 when every position agrees (axes of size 1 in another order). The
    whole values are compared, so every field of ``Mesh`` (axes, sizes, their order, device order) is."""
    if have == want:
        return None
    sizes_have, sizes_want = dict(have.axes), dict(want.axes)
    at_have, at_want = _positions(_device_order(have)), _positions(_device_order(want))

    def where(sizes, at, d):
        return _coords(sizes, at[d])

    n = len(at_have)
    d = next((d for d in range(n) if where(sizes_have, at_have, d) != where(sizes_want, at_want, d)), 0)
    return {"device": d, "coords": where(sizes_have, at_have, d), "index": None,
            "holds": {"mesh": repr(have), "coords": where(sizes_have, at_have, d)},
            "expected": {"mesh": repr(want), "coords": where(sizes_want, at_want, d)}}


def _field_cx(mesh_sizes: dict, what: str, holds, expected) -> dict:
    """A counterexample for a field that is the same on every device and at every index: the device at
    position 0 (device 0 in the default order)."""
    return {"device": 0, "coords": _coords(mesh_sizes, 0), "index": None,
            "holds": {what: holds}, "expected": {what: expected}}


def _check_reductions(program, src, dst) -> str | None:
    """The reduction kind of the program (None if nothing is reduced or pending), after checking it against
    the types (the audit in the module header): the instructions take one kind, the source's where it is
    partial; a partial claim is of the source's kind; the maximum or minimum of complex numbers is refused."""
    mesh_sizes = dict(program.mesh.axes)
    taken = [(t, ins.reduction) for t, ins in enumerate(program.instructions)
             if isinstance(ins, (P.ReduceScatter, P.AllReduce))]
    kinds = {k for _, k in taken}
    if len(kinds) > 1:
        raise _Refuted(f"the program reduces by {' and '.join(sorted(kinds))}: one value has one reduction kind",
                       _field_cx(mesh_sizes, "reduction", sorted(kinds), sorted(kinds)[0]))
    pending = src.reduction if src.partial else None
    kind = pending or (kinds.pop() if kinds else None)
    if pending is not None:
        wrong = next(((t, k) for t, k in taken if k != pending), None)
        if wrong is not None:
            raise _Refuted(f"instruction {wrong[0]} takes the {wrong[1]} of its group, but the source {src} is a "
                           f"pending {pending}", _field_cx(mesh_sizes, "reduction", wrong[1], pending))
    if dst.partial and kind is not None and dst.reduction != kind:
        raise _Refuted(f"the claim {dst} is a pending {dst.reduction}, but the program's values are a pending "
                       f"{kind}", _field_cx(mesh_sizes, "reduction", kind, dst.reduction))
    if kind in _IDEMPOTENT and np.dtype(program.dtype).kind == "c":
        raise _Refuted(f"the program takes the {kind} of complex numbers, which have none",
                       _field_cx(mesh_sizes, "reduction", kind, "sum or prod"))
    return kind


def _check_costs(program, shapes, mesh_sizes, costs, details: dict) -> None:
    """Peak bytes and bytes received, from the instructions (SPMD: every device's buffer has the
    instruction's shape at every boundary), against the plan's ``costs`` when given."""
    itemsize = np.dtype(program.dtype).itemsize
    peak = max(math.prod(s) * itemsize for s in shapes)
    uniform, per_dev = _received(program, mesh_sizes)
    received = uniform + (int(per_dev.max()) if per_dev.size else 0)
    details.update(peak_bytes=peak, bytes_received=received)
    if costs is None:
        return
    claimed_peak, claimed_recv = costs
    if peak > claimed_peak:
        raise _Refuted(f"a device holds {peak} bytes at a step boundary, more than peak_bytes={claimed_peak}")
    if peak != claimed_peak:
        raise _Refuted(f"peak_bytes={claimed_peak} but the largest buffer is {peak} bytes")
    if abs(Fraction(claimed_recv) - received) > Fraction(1, 10**6) * max(1, received):
        dev = int(per_dev.argmax()) if per_dev.size else 0
        raise _Refuted(f"bytes_received={claimed_recv} but the instructions make device {dev} receive "
                       f"{float(received):g} bytes")


# ----------------------------------------------------------------------------- the two queries
def _value_query(program, digits: _Digits, src, dst, dst_local, deadline: _Deadline, details: dict,
                 zeros: bool = False) -> None:
    """Query 1 of the module header (1' with ``zeros``: a contributor may be a zero): every data position of
    the result holds the claimed element."""
    mesh_sizes = digits.mesh_sizes
    src_partial = _type_meaning(mesh_sizes, src)[3]
    w = _Walk(program, digits, "a", deadline)
    c = digits.fresh(lambda base, lo, hi: w.fresh(f"dev_{base}", lo, hi))  # on the claim's device order
    idx = [w.fresh(f"idx{d}", 0, L) for d, L in enumerate(dst_local)]
    want, _, _, _, is_data = _type_meaning(mesh_sizes, dst, digits, c, idx)
    c0, i0 = _walk_between_orders(w, program, c, idx)
    got, _, summand, _, from_data = _type_meaning(mesh_sizes, src, digits, c0, i0)
    live = _all(w.live)
    wrong = [z3.Not(from_data)] + [a != b for a, b in zip(got, want)]
    bad = z3.And(live, z3.Or(wrong)) if zeros else z3.Or([z3.Not(live)] + wrong)
    s, res = _solve(w.ranges + w.defs + [is_data, bad], deadline, "value query")
    details["queries"] = 1
    if res == z3.unsat:
        return
    mdl = s.model()
    cx = _cex(mdl, w, program, c, idx, want, c0, i0, got, summand, src_partial)
    where = f"device {cx['device']} {cx['coords']} at local index {cx['index']}"
    if not z3.is_true(mdl.eval(live, model_completion=True)):
        cx["holds"] = {"unwritten": True}
        raise _Refuted(f"{where} is never written (no exchange copy, padded reduce-scatter chunk or creating "
                       f"instruction puts data there: it holds a zero), but {dst} puts global element "
                       f"{cx['expected']['global_index']} there", cx)
    if not z3.is_true(mdl.eval(from_data, model_completion=True)):
        cx["holds"]["padding"] = True
        raise _Refuted(f"{where} holds padding of {src} (device {cx['holds']['from_device']}, local index "
                       f"{cx['holds']['from_local_index']}), but {dst} puts global element "
                       f"{cx['expected']['global_index']} there", cx)
    raise _Refuted(
        f"{where} holds global element "
        f"{cx['holds']['global_index']} (from device {cx['holds']['from_device']}), but {dst} puts "
        f"{cx['expected']['global_index']} there", cx)


def _walk_between_orders(w: _Walk, program, c: dict, idx: list):
    """Walk back from coordinates ``c`` on the claim's device order (``program.dst_mesh``) and local index
    ``idx`` to the source: returns the source device's coordinates on the source's device order
    (``program.src_mesh``) and its local index."""
    ids = w.ids
    c = w.reorder(c, _device_order(program.dst_mesh), ids, "claim")
    c0, i0 = w.run(c, idx)
    return w.reorder(c0, ids, _device_order(program.src_mesh), "source"), i0


def _sum_query(program, digits: _Digits, src, dst, dst_local, deadline: _Deadline, details: dict,
               idempotent: bool) -> None:
    """Query 2 of the module header: each group reduction takes every summand of one source group exactly
    once, or (``idempotent``) at least once."""
    mesh_sizes = digits.mesh_sizes
    src_partial = _type_meaning(mesh_sizes, src)[3]
    dst_partial = _type_meaning(mesh_sizes, dst)[3]
    n_members = math.prod(_ksize(_axes(mesh_sizes, ins.axes, f"instruction {t}"))
                          for t, ins in enumerate(program.instructions)
                          if isinstance(ins, (P.ReduceScatter, P.AllReduce)))
    n_q = _ksize(dst_partial)
    n_summands = _ksize(src_partial)
    if n_members * n_q < n_summands or (not idempotent and n_members * n_q != n_summands):
        raise _Refuted(
            f"each element of the result reduces {n_members} source summand(s) per device "
            f"(x {n_q} over the destination's partial axes), but the source has {n_summands} summand(s) "
            "per element: some summand is dropped" + ("" if idempotent else " or taken more than once"),
            {"device": 0, "coords": _coords(mesh_sizes, 0), "index": (0,) * len(dst_local),
             "holds": {"summands": n_members * n_q}, "expected": {"summands": n_summands}})
    if n_summands == 1:
        return  # one summand: every contributor holds the value (query 1), and each is taken once or, if
        # idempotent, any number of times
    details["queries"] = 2
    base = _base_position(program, digits, dst, dst_local, deadline)
    walks = [_contributor(program, digits, tag, base, src, src_partial, dst_partial, deadline) for tag in ("p", "q")]
    bijection = n_members * n_q == n_summands
    if (bijection or not idempotent) and _pair_query(program, digits, base, walks, src_partial, deadline,
                                                     refute=not idempotent):
        return
    _coverage_query(program, digits, src, src_partial, dst_partial, base, walks[0][0], deadline, details)


def _pair_query(program, digits: _Digits, base: _Base, walks, src_partial, deadline: _Deadline,
                refute: bool) -> bool:
    """The summation query (2 and 2' of the module header) on two contributors ``walks`` to the group reduction
    at ``base`` (:func:`_contributor`): can two different members take one source summand, or summands of two
    source partial groups? True where they cannot; where they can, refutes with them (:func:`_refute_pair`) if
    ``refute``, else returns False."""
    (w1, m1, s1, cs1, g1), (w2, m2, s2, cs2, g2) = walks
    differ = z3.Or([a != b for a, b in zip(m1, m2)])
    same = z3.And([a == b for a, b in zip(s1, s2)])
    other_group = z3.Or([a != b for a, b in zip(g1, g2)])
    s, res = _solve(base.constraints + w1.ranges + w1.defs + w1.live + w2.ranges + w2.defs + w2.live
                    + [differ, z3.Or(same, other_group)], deadline, "summation query")
    if res == z3.unsat:
        return True
    if refute:
        _refute_pair(s.model(), digits, program, base, (cs1, cs2), (s1, s2), src_partial)
    return False


@dataclass(frozen=True)
class _Base:
    """A symbolic data position of the result, and the part of the walk back from it that every contributor
    to its group reduction shares.

    ``c`` and ``idx``: device coordinates (on the claim's device order) and local index. Where the claim has
    no partial group of more than one device, every contributor starts at this one element, and the
    instructions after the program's last reduction move it as one value, whatever the members: that part is
    walked once (the ``fork``: coordinates on the program's mesh and index before instruction ``below``, and
    the walk's liveness conditions, which each contributor adds to its own), not once per contributor. Each
    contributor then walks only the instructions ``below − 1`` down to 0, so that a query comparing two of
    them (or enumerating them) has one copy of an exchange or permute after the reductions, not one per
    contributor that Z3 would have to prove equal. ``fork`` is None where each contributor starts at its own
    member of the claim's partial group. ``constraints``: the position in range at a data position of the
    claim, and the ranges and definitions of the shared walk."""

    c: dict
    idx: list
    constraints: list
    fork: tuple | None


def _base_position(program, digits: _Digits, dst, dst_local, deadline: _Deadline) -> _Base:
    """A symbolic data position of the result, and the walk its contributors share (:class:`_Base`)."""
    ranges: list = []

    def new(base, lo, hi):
        v = z3.Int(f"base_{base}")
        ranges.append(z3.And(v >= lo, v < hi))
        return v

    c = digits.fresh(new)
    idx = [new(f"i{d}", 0, L) for d, L in enumerate(dst_local)]
    meaning = _type_meaning(digits.mesh_sizes, dst, digits, c, idx)
    ranges.append(meaning[4])  # data positions only
    if _ksize(meaning[3]) > 1:
        return _Base(c, idx, ranges, None)
    reductions = [t for t, ins in enumerate(program.instructions) if isinstance(ins, (P.ReduceScatter, P.AllReduce))]
    below = reductions[-1] + 1 if reductions else 0
    w = _Walk(program, digits, "tail", deadline)
    c_fork = w.reorder(c, _device_order(program.dst_mesh), w.ids, "claim")
    c_fork, idx_fork = w.run(c_fork, idx, stop=below)
    return _Base(c, idx, ranges + w.ranges + w.defs, (c_fork, idx_fork, below, w.live))


def _contributor(program, digits: _Digits, tag, base: _Base, src, src_partial, dst_partial, deadline):
    """One symbolic contributor to the group reduction at the base device and index: a walk from the member
    of the base's destination group given by fresh Q-coordinates (or from the base's fork, which the walk's
    liveness then includes). Returns ``(walk, member variables (Q-coordinates, then each reduction's), source
    summand coordinates, source device coordinates, source group key)``."""
    wk = _Walk(program, digits, tag, deadline)
    if base.fork is None:
        qs = [wk.fresh("grp", 0, ax.size) for ax in dst_partial]
        cc = digits.with_rank(wk, base.c, dst_partial, _horner(qs, [ax.size for ax in dst_partial]), bounded=True)
        cs, ii = _walk_between_orders(wk, program, cc, list(base.idx))
    else:
        qs = []
        c_fork, idx_fork, below, live = base.fork
        wk.live += live
        cs, ii = wk.run(c_fork, idx_fork, below=below)
        cs = wk.reorder(cs, wk.ids, _device_order(program.src_mesh), "source")
    _, _, summ, _, _ = _type_meaning(digits.mesh_sizes, src, digits, cs, ii)
    members = qs + [v for _, vs, _ in wk.sum_vars for v in vs]
    return wk, members, summ, cs, digits.key(cs, src_partial)


def _model_position(mdl, digits: _Digits, program, base: _Base) -> dict:
    """Where a group-sum query's model puts its destination element: ``device`` (an id on the destination's
    device order), ``coords`` and local ``index``: the head of its counterexample."""
    dev = _model_coords(mdl, digits, base.c)
    return {"device": _device_at(program.dst_mesh, dev, digits.mesh_sizes), "coords": dev,
            "index": tuple(_model_int(mdl, v) for v in base.idx)}


def _refute_pair(mdl, digits: _Digits, program, base: _Base, cs, ss, src_partial) -> None:
    """Refute with the model of query 2: two contributors that take one summand, or two source groups."""
    summ = [{a.token: _model_int(mdl, e) for a, e in zip(src_partial, x)} for x in ss]
    from_devs = [_device_at(program.src_mesh, _model_coords(mdl, digits, cc), digits.mesh_sizes) for cc in cs]
    cx = {**_model_position(mdl, digits, program, base),
          "holds": {"summands": summ, "added_from_devices": from_devs},
          "expected": {"summands": "each summand of one source partial group, exactly once"}}
    if summ[0] == summ[1]:
        why = f"adds source summand {summ[0]} twice (from devices {from_devs})"
    else:
        why = (f"mixes summands of different source partial groups (devices {from_devs} are in different "
               f"groups over {{{','.join(a.token for a in src_partial)}}})")
    raise _Refuted(f"the group sum at device {cx['device']} {cx['coords']}, local index {cx['index']} {why}", cx)


def _coverage_query(program, digits: _Digits, src, src_partial, dst_partial, base: _Base, template: _Walk,
                    deadline: _Deadline, details: dict) -> None:
    """Query 3 of the module header (idempotent reductions): one walk per concrete choice of the members
    (Q-coordinates, then each reduction's members, as in ``template``); the contributor of all-zero members
    names the witness group, and the query asks for a summand coordinate of it that no contributor takes."""
    sizes = [ax.size for ax in dst_partial] + [ax.size for _, _, axes in template.sum_vars for ax in axes]
    choices = list(itertools.product(*(range(k) for k in sizes)))
    details["queries"] = 3
    details["coverage_walks"] = len(choices)
    missing = [z3.Int(f"missing_{a.token}") for a in src_partial]
    constraints = list(base.constraints) + [z3.And(v >= 0, v < a.size) for v, a in zip(missing, src_partial)]
    witness, covered = None, []
    for j, choice in enumerate(choices):
        deadline.check(f"encoding contributor {j} of {len(choices)} for the coverage query")
        wk, members, summ, _, group = _contributor(program, digits, f"m{j}", base, src, src_partial, dst_partial,
                                                   deadline)
        constraints += wk.ranges + wk.defs + wk.live + [v == x for v, x in zip(members, choice)]
        if witness is None:
            witness = group
        covered.append(z3.And([a == b for a, b in zip(group, witness)] + [a == b for a, b in zip(summ, missing)]))
    s, res = _solve(constraints + [z3.Not(z3.Or(covered))], deadline, "coverage query")
    if res == z3.unsat:
        return
    mdl = s.model()
    summand = {a.token: _model_int(mdl, v) for a, v in zip(src_partial, missing)}
    cx = {**_model_position(mdl, digits, program, base), "holds": {"missing_summand": summand},
          "expected": {"summands": "every summand of one source partial group, at least once"}}
    raise _Refuted(f"the group reduction at device {cx['device']} {cx['coords']}, local index {cx['index']} never "
                   f"takes source summand {summand} of the group of its first contributor", cx)


# The onto query walks once per contributor to a group sum; beyond this many it answers undecided.
_MAX_CONTRIBUTORS = 1024


def _creation_queries(program, digits: _Digits, src, dst, dst_local, deadline: _Deadline, details: dict) -> None:
    """Queries 2' and 3' of the module header (after 1', :func:`_value_query` with ``zeros``): no two data
    contributors to one group sum hold one source summand or come from two source partial groups, and every
    summand of the group reaches it."""
    src_partial = _type_meaning(digits.mesh_sizes, src)[3]
    dst_partial = _type_meaning(digits.mesh_sizes, dst)[3]
    base = _base_position(program, digits, dst, dst_local, deadline)
    walks = [_contributor(program, digits, tag, base, src, src_partial, dst_partial, deadline) for tag in ("p", "q")]
    if walks[0][1]:  # more than one contributor per group sum: compare two of them
        details["queries"] = 2
        _pair_query(program, digits, base, walks, src_partial, deadline, refute=True)
    _onto_query(program, digits, src, src_partial, dst_partial, base, walks[0][0], deadline, details)


def _onto_query(program, digits: _Digits, src, src_partial, dst_partial, base: _Base, template: _Walk,
                deadline: _Deadline, details: dict) -> None:
    """Query 3' of the module header: every summand of the source reaches each group sum of the result.

    Every contributor is enumerated: one walk per value of (Q-coordinates, summation members, as in
    ``template``), all from the symbolic ``base`` position; the query asks for a base position and a source
    summand coordinate ``σ`` that no data contributor holds. With 2' (all data contributors hold distinct
    summands of one source group) its ``unsat`` makes the data contributors a bijection onto that group's
    summands."""
    sizes = [ax.size for ax in dst_partial] + [ax.size for _, _, axes in template.sum_vars for ax in axes]
    count = math.prod(sizes)
    if count > _MAX_CONTRIBUTORS:
        raise _Undecided(f"the onto query of a creating claim would walk {count} contributors per group sum, "
                         f"more than {_MAX_CONTRIBUTORS}")
    sigma = [z3.Int(f"sigma_{a.token}") for a in src_partial]
    constraints = list(base.constraints) + [z3.And(v >= 0, v < a.size) for v, a in zip(sigma, src_partial)]
    for j, choice in enumerate(itertools.product(*(range(k) for k in sizes))):
        deadline.check(f"encoding contributor {j} of {count} for the onto query")
        wk, members, summ, _, _ = _contributor(program, digits, f"o{j}", base, src, src_partial, dst_partial,
                                               deadline)
        constraints += wk.ranges + wk.defs + [v == x for v, x in zip(members, choice)]
        constraints.append(z3.Not(z3.And([_all(wk.live)] + [a == b for a, b in zip(summ, sigma)])))
    details["queries"] = 3
    s, res = _solve(constraints, deadline, "onto query")
    if res == z3.unsat:
        return
    mdl = s.model()
    missing = {a.token: _model_int(mdl, v) for a, v in zip(src_partial, sigma)}
    cx = {**_model_position(mdl, digits, program, base),
          "holds": {"missing_summand": missing, "contributors": count},
          "expected": {"summands": "each summand of one source partial group, exactly once"}}
    what = f"source summand {missing}" if missing else "the source element"
    raise _Refuted(f"the group sum at device {cx['device']} {cx['coords']}, local index {cx['index']} lacks {what}: "
                   f"none of its {count} contributor(s) holds it", cx)


def _device_at(mesh, coords: dict, mesh_sizes: dict) -> int | None:
    """The id of the device at ``coords`` on ``mesh``'s device order; None where a coordinate is off its axis
    (a model leaves the source coordinates free where no source element is read)."""
    p = 0
    for n, size in mesh_sizes.items():
        if not 0 <= coords[n] < size:
            return None
        p = p * size + coords[n]
    return _device_order(mesh)[p]


def _cex(mdl, w, program, c, idx, want, c0, i0, got, summand, src_partial) -> dict:
    """The value query's counterexample: the device (id, and coordinates on the claim's device order), the
    local index, what it holds (global index, source device id and local index, summand, members) and
    what the claim expects there."""
    coords = _model_coords(mdl, w.digits, c)
    src_coords = _model_coords(mdl, w.digits, c0)
    sums = {f"instruction {t}": [_model_int(mdl, v) for v in vs] for t, vs, _ in w.sum_vars}
    out = {
        "device": _device_at(program.dst_mesh, coords, w.mesh_sizes),
        "coords": coords,
        "index": tuple(_model_int(mdl, v) for v in idx),
        "holds": {
            "global_index": tuple(_model_int(mdl, e) for e in got),
            "from_device": _device_at(program.src_mesh, src_coords, w.mesh_sizes),
            "from_local_index": tuple(_model_int(mdl, e) for e in i0),
        },
        "expected": {"global_index": tuple(_model_int(mdl, e) for e in want)},
    }
    if src_partial:
        out["holds"]["summand"] = {a.token: _model_int(mdl, e) for a, e in zip(src_partial, summand)}
    if sums:
        out["holds"]["summation_members"] = sums
    return out
