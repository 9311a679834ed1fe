"""The collectives of a compiled XLA program, read from its HLO text, in the terms of plan steps.

    collectives = redist.hlo.parse_hlo(compiled.as_text(), mesh)   # partition id == device id of ``mesh``
    collectives[0]   # Collective(kind, axes, span, bytes_received, result_shapes, dtype, groups, pairs, ...)

Parsing (:func:`parse_hlo`). The text is walked from the ENTRY computation in schedule order, descending
into called computations (``calls=``, ``body=``, ``branch_computations=``), and yields one :class:`Collective`
per ``all-gather``, ``all-to-all``, ``collective-permute``, ``reduce-scatter``, ``all-reduce`` (and their
``-start`` halves of async pairs) and per ``dynamic-slice`` (a local slice, 0 bytes; one-element
dynamic-slices, which look up a start offset in a per-partition table, are not data and are skipped).
Replica groups are read in all three forms XLA prints:

- explicit: ``replica_groups={{0,1},{2,3}}`` (``{}``: one group of every device);
- iota: ``replica_groups=[2,4]<=[4,2]T(1,0)``, i.e. ``arange(8).reshape(4,2).transpose(1,0).reshape(2,4)``,
  one group per row;
- mesh axes: ``replica_groups=mesh['a'=2,'b'=4], device_ids=([4,2]T(1,0)) {'b':(2)2}``: the device array
  ``iota(8).reshape(4,2).transpose(1,0).reshape(2,4)`` over a mesh ``a=2,b=4`` (no ``device_ids``: iota),
  and the groups vary over the listed axes or sub-axes (Shardy's ``(pre)size``), major to minor.

Groups are mapped back to redist axis tokens by :func:`groups_to_axes`: the tuple of mesh axes or sub-axes
(``"x:(2)2"``) whose groups, in rank order, are exactly the given ones.

Byte accounting (per device, as in :mod:`redist.steps`; ``k`` the group size, ``L`` bytes per device):
all-gather ``(k−1)/k · L_out``; all-to-all ``(k−1)/k · L`` (a tuple all-to-all's L is the sum of its
elements); reduce-scatter ``(k−1)/k · L_in = (k−1) · L_out``; all-reduce ``2(k−1)/k · L``;
collective-permute ``L`` for a device that is the target of a pair whose source is another device, else 0.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

import numpy as np

from redist.axes import Axis, canonical_axes
from redist.errors import ShardingError
from redist.mesh import Mesh

__all__ = ["Collective", "Instruction", "parse_hlo", "computations", "collective_of", "parse_replica_groups",
           "groups_to_axes", "HLO_BYTES"]

# Bytes per element of HLO primitive types.
HLO_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1,
}
_KINDS = {
    "all-gather": "all_gather", "all-to-all": "all_to_all", "collective-permute": "collective_permute",
    "reduce-scatter": "reduce_scatter", "all-reduce": "all_reduce", "dynamic-slice": "dynamic_slice",
}


@dataclass(frozen=True)
class Collective:
    """One collective (or local dynamic-slice) of a compiled program, in the terms of a plan step.

    ``kind``: ``all_gather``, ``all_to_all``, ``collective_permute``, ``reduce_scatter``, ``all_reduce`` or
    ``dynamic_slice``. ``axes``: the redist axis tokens whose groups equal the replica groups (rank order
    included), or ``None`` when no tuple of mesh axes / sub-axes gives them (always ``None`` for a permute
    and a dynamic-slice). ``span``: the mesh axes along which members of a group (or a permute's source and
    target) differ, in mesh order; this is what the cost model prices. ``bytes_received``: the most any
    device receives in it; ``device_bytes`` the same per device. ``result_shapes``: the per-device result
    buffers (several for a tuple collective); ``dtype`` the HLO element type. ``groups``: the replica groups
    as device ids in rank order; ``pairs``: a permute's ``(source, target)`` pairs.
    """

    kind: str
    axes: tuple[str, ...] | None
    span: tuple[str, ...]
    bytes_received: float
    result_shapes: tuple[tuple[int, ...], ...]
    dtype: str
    groups: tuple[tuple[int, ...], ...] = ()
    pairs: tuple[tuple[int, int], ...] = ()
    device_bytes: tuple[float, ...] = field(default=(), repr=False)
    name: str = ""

    @property
    def result_shape(self) -> tuple[int, ...]:
        """The result shape (the first element's for a tuple collective)."""
        return self.result_shapes[0] if self.result_shapes else ()

    def to_dict(self) -> dict:
        return {"kind": self.kind, "axes": None if self.axes is None else list(self.axes), "span": list(self.span),
                "bytes_received": self.bytes_received, "result_shapes": [list(s) for s in self.result_shapes],
                "dtype": self.dtype, "groups": [list(g) for g in self.groups],
                "pairs": [list(p) for p in self.pairs], "name": self.name}


# ---------------------------------------------------------------------------------------------- replica groups
def _iota(dims, perm=None) -> np.ndarray:
    a = np.arange(math.prod(dims)).reshape(dims)
    return a.transpose(perm) if perm is not None else a


def _ints(text: str) -> list[int]:
    return [int(v) for v in re.findall(r"\d+", text)]


_IOTA_RE = re.compile(r"\[(?P<dims>[\d,]*)\]<=\[(?P<rdims>[\d,]*)\](?:T\((?P<perm>[\d,]*)\))?")
_MESH_RE = re.compile(
    r"mesh\[(?P<axes>[^\]]*)\]"
    r"(?:\s*,\s*device_ids=(?P<ids>\(\[[\d,]*\](?:T\([\d,]*\))?\)|\[[\d,\s]*\]|\{[\d,\s]*\}))?"
    r"\s*\{(?P<sel>[^}]*)\}")
_MESH_AXIS_RE = re.compile(r"'(?P<name>[^']+)'\s*=\s*(?P<size>\d+)")
_SEL_RE = re.compile(r"'(?P<name>[^']+)'(?::\((?P<pre>\d+)\)(?P<size>\d+))?")


def _balanced(text: str, start: int, open_ch: str = "{", close_ch: str = "}") -> int:
    """Index just past the bracket group that opens at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ShardingError(f"unbalanced {open_ch}{close_ch} in HLO attribute {text[start:start + 80]!r}")


def parse_replica_groups(attrs: str, num_devices: int) -> tuple[tuple[int, ...], ...]:
    """The replica groups named in an instruction's attribute text (the part after its operands), as device
    ids in rank order, in any of the three forms (see the module docstring). No ``replica_groups`` attribute,
    or ``{}``, means one group of all ``num_devices`` devices."""
    m = re.search(r"replica_groups=", attrs)
    if not m:
        return (tuple(range(num_devices)),)
    rest = attrs[m.end():]
    if rest.startswith("{"):
        body = rest[: _balanced(rest, 0)]
        inner = body[1:-1].strip()
        if not inner:
            return (tuple(range(num_devices)),)
        return tuple(tuple(_ints(g)) for g in re.findall(r"\{([^{}]*)\}", inner))
    if rest.startswith("["):
        im = _IOTA_RE.match(rest)
        if not im:
            raise ShardingError(f"cannot read iota replica groups {rest[:80]!r}")
        dims, rdims = _ints(im["dims"]), _ints(im["rdims"])
        perm = _ints(im["perm"]) if im["perm"] is not None else None
        return tuple(tuple(int(v) for v in row) for row in _iota(rdims, perm).reshape(dims))
    if rest.startswith("mesh["):
        mm = _MESH_RE.match(rest)
        if not mm:
            raise ShardingError(f"cannot read mesh replica groups {rest[:120]!r}")
        axes = [(a["name"], int(a["size"])) for a in _MESH_AXIS_RE.finditer(mm["axes"])]
        shape = [s for _, s in axes]
        ids = mm["ids"]
        if ids is None:
            devices = np.arange(math.prod(shape))
        elif ids.startswith("("):
            im = re.match(r"\(\[(?P<rdims>[\d,]*)\](?:T\((?P<perm>[\d,]*)\))?\)", ids)
            devices = _iota(_ints(im["rdims"]), _ints(im["perm"]) if im["perm"] is not None else None)
        else:
            devices = np.array(_ints(ids))
        devices = np.asarray(devices).reshape(shape)
        sel = [(s["name"], int(s["pre"]) if s["pre"] else None, int(s["size"]) if s["size"] else None)
               for s in _SEL_RE.finditer(mm["sel"])]
        return _mesh_groups(axes, devices, sel)
    raise ShardingError(f"cannot read replica groups {rest[:80]!r}")


def _mesh_groups(axes, devices: np.ndarray, sel) -> tuple[tuple[int, ...], ...]:
    """Groups of a mesh-axes replica-group list: ``devices`` laid over mesh ``axes``; members vary over the
    selected (sub-)axes ``sel`` (name, pre, size), major to minor as listed."""
    full = dict(axes)
    cuts = {n: {1, s} for n, s in axes}
    picked = []
    for name, pre, size in sel:
        if name not in full:
            raise ShardingError(f"replica groups select unknown mesh axis {name!r}")
        pre, size = (1, full[name]) if pre is None else (pre, size)
        cuts[name] |= {pre, pre * size}
        picked.append((name, pre, pre * size))
    factors, where = [], {}
    for n, s in axes:
        pts = sorted(cuts[n])
        for lo, hi in zip(pts, pts[1:]):
            if hi % lo:
                raise ShardingError(f"replica groups select sub-axes of mesh axis {n!r} that are no factors of one "
                                    f"decomposition of it (cut points {pts})")
            where[(n, lo, hi)] = len(factors)
            factors.append(hi // lo)
    fine = devices.reshape(factors)
    moved = []
    for name, lo, hi in picked:
        pts = sorted(p for p in cuts[name] if lo <= p <= hi)
        moved.extend(where[(name, a, b)] for a, b in zip(pts, pts[1:]))
    rest = [i for i in range(len(factors)) if i not in moved]
    k = math.prod(factors[i] for i in moved)
    arr = fine.transpose(rest + moved).reshape(-1, k)
    return tuple(tuple(int(v) for v in row) for row in arr)


@lru_cache(maxsize=4096)
def groups_to_axes(mesh: Mesh, groups: tuple[tuple[int, ...], ...]) -> tuple[Axis, ...] | None:
    """The axis tokens (mesh axes or sub-axes, canonical, major to minor) whose groups are ``groups``.

    The groups must be given in rank order; the tuple whose ``mesh.groups`` equals them as sets and in every
    group's order is returned (there is at most one canonical one). ``None`` if no tuple of sub-axes does.

    Read from the groups' structure, in time linear in the device count (no search over axes): in a group over
    axes ``A``, the member of rank ``r`` is the rank-0 member plus the device-id offsets of ``r``'s digits over
    ``A``, the same offsets in every group. The minor axis of ``A`` is therefore the longest run of offsets
    ``0, w, 2w, …`` (``w`` the offset of rank 1) that fits the mesh axis whose id stride ``w`` is a multiple
    of; the other axes follow from the offsets of the ranks that are multiples of its length. Every group is
    then compared with the groups of the axes found.
    """
    n = mesh.size
    k = len(groups[0]) if groups else 1
    if any(len(g) != k for g in groups) or sorted(d for g in groups for d in g) != list(range(n)):
        return None
    if k == 1:
        return ()
    id_stride, below = {}, 1
    for name, size in reversed(mesh.axes):
        id_stride[name], below = below, below * size
    offsets = [d - groups[0][0] for d in groups[0]]
    minor_first: list[Axis] = []
    while len(offsets) > 1:
        w = offsets[1]
        name = next((nm for nm, size in mesh.axes if w > 0 and w % id_stride[nm] == 0
                     and w // id_stride[nm] < size), None)
        if name is None:
            return None
        size, stride = mesh.axis_size(name), w // id_stride[name]
        room = size // stride if size % stride == 0 else 0
        m = max((m for m in range(2, room + 1) if room % m == 0 and len(offsets) % m == 0
                 and all(offsets[j] == j * w for j in range(m))), default=None)
        if m is None:
            return None
        minor_first.append(Axis(name, room // m, m, size))
        offsets = offsets[::m]
    axes = canonical_axes(tuple(reversed(minor_first)))
    try:
        got = _mesh_groups(mesh.axes, np.arange(n), [(a.name, a.pre, a.size) for a in axes])
    except ShardingError:  # sub-axes of one mesh axis that are no factors of one decomposition
        return None
    return axes if set(got) == set(groups) else None


# ---------------------------------------------------------------------------------------------- HLO text
_SHAPE_RE = re.compile(r"(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[\d,]*)\]")


def _shapes(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """Array shapes in a shape text (one, or a tuple), layouts ignored."""
    text = re.sub(r"\{[^{}]*\}", "", text)  # layouts {2,1,0}
    return [(m["dtype"], tuple(_ints(m["dims"]))) for m in _SHAPE_RE.finditer(text) if m["dtype"] in HLO_BYTES]


@dataclass
class Instruction:
    """One instruction of an HLO computation, as text: its ``name``, result ``shape``, ``opcode``, the
    ``operands`` between its parentheses and the attribute text after them (``attrs``)."""

    name: str
    shape: str
    opcode: str
    operands: str
    attrs: str


def _parse_instruction(line: str) -> Instruction | None:
    line = re.sub(r"/\*.*?\*/", "", line).strip()
    if line.startswith("ROOT "):
        line = line[5:]
    m = re.match(r"%?(?P<name>[\w.\-]+) = ", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        end = _balanced(rest, 0, "(", ")")
    else:
        sp = re.match(r"\S+", rest)
        end = sp.end() if sp else 0
    shape, rest = rest[:end], rest[end:].lstrip()
    om = re.match(r"(?P<op>[a-z][\w\-]*)\(", rest)
    if not om:
        return None
    close = _balanced(rest, om.end() - 1, "(", ")")
    return Instruction(m["name"], shape, om["op"], rest[om.end():close - 1], rest[close:])


def computations(text: str) -> tuple[dict[str, list[Instruction]], str | None]:
    """The computations of an HLO module's text, each a list of its instructions in schedule order, by name;
    and the name of the ENTRY computation (None if it has none)."""
    comps: dict[str, list[Instruction]] = {}
    entry, current = None, None
    for raw in text.splitlines():
        line = raw.strip()
        hm = re.match(r"(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(\(.*\))?\s*->.*\{$", line)
        if hm and " = " not in line.split("->")[0]:
            current = hm["name"]
            comps[current] = []
            if hm["entry"]:
                entry = current
            continue
        if line == "}":
            current = None
            continue
        if current is not None:
            ins = _parse_instruction(line)
            if ins is not None:
                comps[current].append(ins)
    return comps, entry


def parse_hlo(text: str, mesh: Mesh) -> list[Collective]:
    """The collectives and dynamic-slices of an SPMD-partitioned HLO module, in schedule order.

    ``mesh`` gives the device numbering (partition id == device id) used to map replica groups to axes.
    """
    comps, entry = computations(text)
    if entry is None:
        raise ShardingError("no ENTRY computation in the HLO text")
    out: list[Collective] = []

    def walk(comp: str, seen: tuple[str, ...]):
        for ins in comps.get(comp, []):
            c = collective_of(ins, mesh)
            if c is not None:
                out.append(c)
            for callee in re.findall(r"(?:calls|body|true_computation|false_computation)=%?([\w.\-]+)", ins.attrs):
                if callee not in seen:
                    walk(callee, seen + (callee,))
            bm = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
            if bm:
                for callee in re.findall(r"%?([\w.\-]+)", bm.group(1)):
                    if callee not in seen:
                        walk(callee, seen + (callee,))

    walk(entry, (entry,))
    return out


def collective_of(ins: Instruction, mesh: Mesh) -> Collective | None:
    """The :class:`Collective` that ``ins`` is (a collective, the ``-start`` half of an async one, or a data
    dynamic-slice; module docstring), or None for any other instruction."""
    base = ins.opcode[: -len("-start")] if ins.opcode.endswith("-start") else ins.opcode
    if base not in _KINDS:
        return None
    kind = _KINDS[base]
    shapes = _shapes(ins.shape)
    if ins.opcode.endswith("-start") and kind in ("all_gather", "collective_permute") and len(shapes) > 1:
        # async start: (operands..., results..., [contexts]) -- keep the result half
        shapes = shapes[len(shapes) // 2:]
    dtype = shapes[0][0] if shapes else "f32"
    result_shapes = tuple(s for _, s in shapes)
    L = sum(math.prod(s) * HLO_BYTES[dt] for dt, s in shapes)
    n = mesh.size
    if kind == "dynamic_slice":
        # A one-element dynamic-slice is an offset-table lookup (partition id -> start index), not data.
        if sum(math.prod(s) for s in result_shapes) <= 1:
            return None
        return Collective(kind, None, (), 0.0, result_shapes, dtype, device_bytes=(0.0,) * n, name=ins.name)
    if kind == "collective_permute":
        pm = re.search(r"source_target_pairs=", ins.attrs)
        body = ins.attrs[pm.end():] if pm else "{}"
        body = body[: _balanced(body, 0)]
        pairs = tuple((a, b) for a, b in (tuple(_ints(p)) for p in re.findall(r"\{([^{}]*)\}", body[1:-1])))
        moved = [(s, t) for s, t in pairs if s != t]
        dev = [0.0] * n
        for s, t in moved:
            dev[t] = float(L)
        return Collective(kind, None, mesh.varying_axes(moved), max(dev, default=0.0), result_shapes, dtype,
                          pairs=pairs, device_bytes=tuple(dev), name=ins.name)
    groups = parse_replica_groups(ins.attrs, n)
    k = len(groups[0])
    per = {
        "all_gather": Fraction(k - 1, k) * L,
        "all_to_all": Fraction(k - 1, k) * L,
        "reduce_scatter": Fraction(k - 1) * L,
        "all_reduce": Fraction(2 * (k - 1), k) * L,
    }[kind]
    members = {d for g in groups for d in g}
    dev = tuple(float(per) if d in members else 0.0 for d in range(n))
    return Collective(kind, groups_to_axes(mesh, groups), mesh.varying_axes(groups), float(per), result_shapes, dtype,
                      groups=groups, device_bytes=dev, name=ins.name)
