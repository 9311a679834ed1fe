"""Z3 proofs that a plan's lowered buffer program computes its destination type.

Principle: *verify what you run*. :func:`verify` reads ``plan.program`` — the instructions the numpy, JAX and
MPI backends execute (semantics in :mod:`redist.program`) — and nothing else of the plan except its source
type (what the input buffers hold), its claimed destination type, and its reported ``peak_bytes`` and
``bytes_received``. It never calls the synthesizer's typing rules (:mod:`redist.steps`) nor the type class's
block arithmetic (``block_index``, ``local_box``, ``local_shape``, ``Mesh.group_index``): the meaning of a
type is stated once, below, in Z3 terms, from the contract (SPEC section 2):

    A dim of size N with axes (a1 … ak), major → minor, on a device with coordinates c has block index
    b = ((c[a1]·s[a2] + c[a2])·s[a3] + …), L = ceil(N / (s[a1]·…·s[ak])); local index i of that dim is global
    index b·L + i, which is data if b·L + i < N and padding otherwise. A sub-axis ``name:(pre)size`` of an
    axis of size S has coordinate (c[name] // (S / (pre·size))) % size. Partial axes: the buffers of the
    devices that differ only on them are summands of the value, summand coordinate = the device's
    coordinates on the partial axes.

The proof follows each element of the result backward. For a symbolic device (mesh coordinates are Z3
integers in range) and a symbolic local index, each instruction, read in reverse, says which device and
which local index of the buffer before it the element came from:

- ``Slice(dim, axes)``: same device; index + r·n_out along ``dim`` (r = the device's rank over ``axes``).
- ``AllGather(dim, axes)``: the group member of rank i // n_in; index i % n_in along ``dim``.
- ``AllToAll(split, concat, axes)``: the member of rank i[concat] // chunk[concat]; index i[concat] %
  chunk[concat], then + r·chunk[split] along ``split``.
- ``ReduceScatter(dim, axes)``: a *sum* over the group: a fresh symbolic member (one summand per value of
  it); index + r·n_out along ``dim``.
- ``AllReduce(axes)``: a sum over the group, fresh symbolic member, same index.
- ``CollectivePermute(sources)``: the device ``sources[d]`` (a table over the device id), same index.
- ``Exchange(shape, copies)``: a table over the device id and the copies' boxes: the copy of device d whose
  destination box holds the index gives the source device and index; an index no copy writes is *unwritten*
  (the walk records that it must not be).
- ``Transpose(perm)``: same device; input index ``perm[a]`` is output index ``a``.
- ``Reshape(shape)``: same device; the index with the same row-major position in the input shape.

At the source, the source type's meaning gives the global index and summand coordinate the element is.
Queries (``unsat`` = proved):

1. *values*: some device, local index that the destination type says is data, and choice of summation
   members where the element is unwritten by an exchange, comes from a padding position of the source, or
   has a source global index other than the one the destination type assigns there (padding positions
   of the result may hold anything);
2. *sums* (only with partial axes or reductions): with ``Q`` the destination's partial axes, the
   contributors to the group sum at (device, index) are indexed by (summation members, Q-coordinates of
   the group member); their number must equal the number of source summand coordinates, and query 2 asks
   for two different contributors with the same source summand coordinate, or from two different source
   partial groups (SPEC 4: *any* summands whose group sums are right must work, so the summands of one
   group need not agree with those of a replica group). ``unsat`` proves the contributors are a bijection
   onto the summands of one source group: each is added exactly once.

``peak_bytes`` and ``bytes_received`` are recomputed from the instructions and buffer shapes (which are the
same on every device of an SPMD program; the shapes are themselves re-derived from the instructions).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import z3

from redist import program as P

__all__ = ["Verdict", "verify", "verify_program", "program_bytes"]

_TOKEN = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::\((?P<pre>\d+)\)(?P<size>\d+))?\Z")


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`verify`. ``ok`` is True iff every check was proved. On failure ``reason`` says
    which check failed and ``counterexample`` (when there is one) names a device (id and coordinates), a
    local index, what that device holds there and what it should hold."""

    ok: bool
    reason: str
    counterexample: dict | None = None
    seconds: float = 0.0
    details: dict = field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return self.ok


class _Refuted(Exception):
    def __init__(self, reason: str, counterexample: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.counterexample = counterexample


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
    out = tuple(_axis(mesh_sizes, t) for t in tokens)
    for x in range(len(out)):
        for y in range(x):
            a, b = out[x], out[y]
            if a.name == b.name and a.lo < b.hi and b.lo < a.hi:
                raise _Refuted(f"{where}: axes {b.token!r} and {a.token!r} overlap; the group is not defined")
    return out


def _sub(c: dict, ax: _Axis):
    """A device's coordinate on (sub-)axis ``ax``: (c[name] // stride) % size."""
    v = c[ax.name]
    if ax.stride != 1:
        v = v / ax.stride
    if ax.lo != 1:  # pre > 1: the quotient can exceed size
        v = v % ax.size
    return v


def _with_sub(c: dict, ax: _Axis, value) -> dict:
    """``c`` with its coordinate on ``ax`` replaced by ``value``."""
    out = dict(c)
    out[ax.name] = c[ax.name] + (value - _sub(c, ax)) * ax.stride
    return out


def _rank(c: dict, axes: tuple[_Axis, ...]):
    r = z3.IntVal(0)
    for ax in axes:
        r = r * ax.size + _sub(c, ax)
    return z3.simplify(r) if not axes else r


def _with_rank(c: dict, axes: tuple[_Axis, ...], j) -> dict:
    """The member of ``c``'s group over ``axes`` whose rank (row-major over ``axes``) is ``j``."""
    out = dict(c)
    for ax in reversed(axes):
        out = _with_sub(out, ax, j % ax.size if ax.size != 1 else z3.IntVal(0))
        j = j / ax.size
    return out


def _all(conds) -> z3.BoolRef:
    return z3.And(conds) if conds else z3.BoolVal(True)


def _ksize(axes) -> int:
    return math.prod(a.size for a in axes)


# ----------------------------------------------------------------------------- the meaning of a type
def _type_meaning(mesh_sizes, t, c: dict, idx):
    """SPEC section 2, stated in Z3: the global index that local index ``idx`` is on a device with
    coordinates ``c`` under type ``t``, whether it is data (not padding), and the device's summand
    coordinates (its coordinates on the partial axes). Returns ``(global index exprs, local shape, summand
    exprs, partial axes, data condition)``."""
    g, local, data = [], [], []
    for d, (n, tokens) in enumerate(zip(t.shape, t.dims)):
        axes = _axes(mesh_sizes, tokens, f"dim {d} of {t}")
        k = _ksize(axes)
        L = -(-n // k)
        local.append(L)
        if idx is not None:
            g.append(_rank(c, axes) * L + idx[d])
            if n % k:
                data.append(g[-1] < n)
    partial = _axes(mesh_sizes, tuple(t.partial), f"partial of {t}")
    used = [a for d, toks in enumerate(t.dims) for a in _axes(mesh_sizes, toks, f"dim {d} of {t}")]
    _axes(mesh_sizes, tuple(a.token for a in used) + tuple(a.token for a in partial), f"{t}")
    return g, tuple(local), [_sub(c, a) for a in partial], partial, _all(data)


# ----------------------------------------------------------------------------- shapes and bytes
def _derive_shapes(program, mesh_sizes) -> list[tuple[int, ...]]:
    """The local shape after each instruction, from the instruction semantics alone."""
    n_dev = math.prod(mesh_sizes.values())
    shapes = [tuple(program.shapes[0])]
    for t, ins in enumerate(program.instructions):
        x = list(shapes[-1])
        where = f"instruction {t} ({ins})"

        def dim_ok(d):
            if not isinstance(d, int) or not 0 <= d < len(x):
                raise _Refuted(f"{where}: the buffer has no dim {d!r}")

        if isinstance(ins, P.CollectivePermute):
            if sorted(ins.sources) != list(range(n_dev)):
                raise _Refuted(f"{where}: sources are not a permutation of the {n_dev} devices")
        elif isinstance(ins, P.Exchange):
            _check_copies(ins, tuple(x), n_dev, where)
            x = list(ins.shape)
        elif isinstance(ins, P.Reshape):
            if math.prod(ins.shape) != math.prod(x) or any(n < 0 for n in ins.shape):
                raise _Refuted(f"{where}: cannot view a buffer of shape {tuple(x)} as {tuple(ins.shape)}")
            x = list(ins.shape)
        elif isinstance(ins, P.Transpose):
            if sorted(ins.perm) != list(range(len(x))):
                raise _Refuted(f"{where}: {tuple(ins.perm)} is not a permutation of the {len(x)} dims")
            x = [x[p] for p in ins.perm]
        elif type(ins) in (P.Slice, P.AllGather, P.ReduceScatter, P.AllReduce, P.AllToAll):
            k = _ksize(_axes(mesh_sizes, ins.axes, where))
            if isinstance(ins, (P.Slice, P.ReduceScatter)):
                dim_ok(ins.dim)
                if x[ins.dim] % k:
                    raise _Refuted(f"{where}: local dim {ins.dim} of size {x[ins.dim]} does not split in {k}")
                x[ins.dim] //= k
            elif isinstance(ins, P.AllGather):
                dim_ok(ins.dim)
                x[ins.dim] *= k
            elif isinstance(ins, P.AllToAll):
                dim_ok(ins.split_dim)
                dim_ok(ins.concat_dim)
                if x[ins.split_dim] % k:
                    raise _Refuted(f"{where}: local dim {ins.split_dim} of size {x[ins.split_dim]} does not split in {k}")
                x[ins.split_dim] //= k
                x[ins.concat_dim] *= k
        else:
            raise _Refuted(f"{where}: unknown instruction {type(ins).__name__}")
        shapes.append(tuple(x))
    if len(program.shapes) != len(shapes) or any(tuple(a) != b for a, b in zip(program.shapes, shapes)):
        raise _Refuted(f"the program's buffer shapes {list(map(tuple, program.shapes))} are not what its "
                       f"instructions produce ({shapes})")
    return shapes


def _check_copies(ins, shape_in, n_dev: int, where: str) -> None:
    """An exchange's copies must name devices, fit both buffers, and not overlap on one device."""
    if len(ins.copies) != n_dev:
        raise _Refuted(f"{where}: copies for {len(ins.copies)} devices, the mesh has {n_dev}")
    for d, copies in enumerate(ins.copies):
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


def program_bytes(program, mesh_sizes=None) -> list[Fraction]:
    """Bytes each device receives over the program, per device id, from the instructions and shapes alone:
    Reshape, Transpose and Slice 0; AllGather (k−1)/k·L_out; AllToAll (k−1)/k·L; ReduceScatter (k−1)/k·L_in; AllReduce 2(k−1)/k·L;
    CollectivePermute L on a device whose source is another device; Exchange the elements a device copies
    from other devices."""
    mesh_sizes = mesh_sizes or dict(program.mesh.axes)
    n_dev = math.prod(mesh_sizes.values())
    item = program.dtype.itemsize if hasattr(program.dtype, "itemsize") else __import__("numpy").dtype(program.dtype).itemsize
    totals = [Fraction(0)] * n_dev
    for t, ins in enumerate(program.instructions):
        L_in = math.prod(program.shapes[t]) * item
        L_out = math.prod(program.shapes[t + 1]) * item
        if isinstance(ins, P.CollectivePermute):
            totals = [b + (L_in if s != d else 0) for d, (b, s) in enumerate(zip(totals, ins.sources))]
            continue
        if isinstance(ins, P.Exchange):
            totals = [b + ins.received(d) * item for d, b in enumerate(totals)]
            continue
        if isinstance(ins, (P.Reshape, P.Transpose)):
            continue
        k = _ksize(_axes(mesh_sizes, ins.axes, f"instruction {t}"))
        if isinstance(ins, P.Slice):
            add = Fraction(0)
        elif isinstance(ins, P.AllGather):
            add = Fraction(k - 1, k) * L_out
        elif isinstance(ins, (P.AllToAll, P.ReduceScatter)):
            add = Fraction(k - 1, k) * L_in
        elif isinstance(ins, P.AllReduce):
            add = Fraction(2 * (k - 1), k) * L_in
        else:
            raise _Refuted(f"instruction {t}: unknown instruction {type(ins).__name__}")
        totals = [b + add for b in totals]
    return totals


# ----------------------------------------------------------------------------- the backward walk
class _Walk:
    """One backward walk of a symbolic element through the program."""

    def __init__(self, program, mesh_sizes, tag: str):
        self.program = program
        self.mesh_sizes = mesh_sizes
        self.names = list(mesh_sizes)
        self.tag = tag
        self.defs: list = []  # definitional constraints (each has exactly one solution per input)
        self.ranges: list = []  # ranges of the free variables
        self.sum_vars: list = []  # (instruction index, fresh member coordinate vars)
        self.written: list = []  # conditions: the element was written by every exchange it passed
        self.n = 0

    def fresh(self, base: str, lo: int, hi: int):
        self.n += 1
        v = z3.Int(f"{self.tag}_{base}_{self.n}")
        self.ranges.append(z3.And(v >= lo, v < hi))
        return v

    def device_id(self, c):
        d = z3.IntVal(0)
        for name in self.names:
            d = d * self.mesh_sizes[name] + c[name]
        return d

    def coords_of(self, device: int) -> dict[str, int]:
        out = {}
        for name in reversed(self.names):
            device, out[name] = divmod(device, self.mesh_sizes[name])
        return out

    def run(self, c: dict, idx: list):
        """Walk from the result back to the source; returns (source device coords, source index)."""
        prog = self.program
        for t in range(len(prog.instructions) - 1, -1, -1):
            ins = prog.instructions[t]
            n_in, n_out = prog.shapes[t], prog.shapes[t + 1]
            idx = list(idx)
            if isinstance(ins, P.CollectivePermute):
                moving = [(d, s) for d, s in enumerate(ins.sources) if s != d]
                if not moving:
                    continue
                did = self.device_id(c)
                new = {name: z3.Int(f"{self.tag}_perm{t}_{name}") for name in self.names}
                for name in self.names:
                    expr = c[name]
                    for d, s in moving:
                        expr = z3.If(did == d, self.coords_of(s)[name], expr)
                    self.defs.append(new[name] == expr)
                c = new
                continue
            if isinstance(ins, P.Exchange):
                c, idx = self._exchange(t, ins, c, idx)
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
            if isinstance(ins, P.Slice):
                idx[ins.dim] = idx[ins.dim] + _rank(c, axes) * n_out[ins.dim]
            elif isinstance(ins, P.AllGather):
                m = n_in[ins.dim]
                j = idx[ins.dim] / m
                idx[ins.dim] = idx[ins.dim] % m
                c = _with_rank(c, axes, j)
            elif isinstance(ins, P.AllToAll):
                cd, sd = ins.concat_dim, ins.split_dim
                chunk = list(n_in)
                chunk[sd] = n_in[sd] // _ksize(axes)
                r = _rank(c, axes)
                j = idx[cd] / chunk[cd]
                idx[cd] = idx[cd] % chunk[cd]
                idx[sd] = idx[sd] + r * chunk[sd]
                c = _with_rank(c, axes, j)
            elif isinstance(ins, (P.ReduceScatter, P.AllReduce)):
                if isinstance(ins, P.ReduceScatter):
                    idx[ins.dim] = idx[ins.dim] + _rank(c, axes) * n_out[ins.dim]
                members = []
                for ax in axes:
                    v = self.fresh(f"sum{t}", 0, ax.size)
                    members.append(v)
                    c = _with_sub(c, ax, v)
                self.sum_vars.append((t, members, axes))
            else:
                raise _Refuted(f"instruction {t}: unknown instruction {type(ins).__name__}")
            # Name the intermediate coordinates and index: keeps the terms small for the solver.
            c2, idx2 = {}, []
            for name in self.names:
                v = z3.Int(f"{self.tag}_c{t}_{name}")
                self.defs.append(v == c[name])
                c2[name] = v
            for d, e in enumerate(idx):
                v = z3.Int(f"{self.tag}_i{t}_{d}")
                self.defs.append(v == e)
                idx2.append(v)
            c, idx = c2, idx2
        return c, idx

    def _exchange(self, t: int, ins, c: dict, idx: list):
        """Read an exchange backward: the copy whose destination box (on this device) holds the index.

        A selector ``k`` names that copy (``k == J``, the number of copies: none holds it, the element is
        unwritten). Each copy is one implication, ``k == j → (device and index in its box) ∧ (source device
        and index)``, and ``k == J → no box holds it``; the boxes of one device do not overlap, so ``k`` is a
        function of the device and index. This keeps the encoding linear in the number of copies (an
        if-then-else chain over thousands of copies is much slower to solve)."""
        did = self.device_id(c)
        flat = [(d, cp) for d, copies in enumerate(ins.copies) for cp in copies]
        k = self.fresh(f"copy{t}", 0, len(flat) + 1)
        c2 = {name: z3.Int(f"{self.tag}_x{t}_{name}") for name in self.names}
        i2 = [z3.Int(f"{self.tag}_i{t}_{d}") for d in range(len(idx))]
        covers = []
        for j, (d, cp) in enumerate(flat):
            inside = z3.And([did == d] + [z3.And(i >= lo, i < lo + n) for i, lo, n in zip(idx, cp.dst_start, cp.size)])
            covers.append(inside)
            coords = self.coords_of(cp.source)
            self.defs.append(z3.Implies(k == j, z3.And(
                [inside] + [c2[name] == coords[name] for name in self.names]
                + [a == i - lo_out + lo_in for a, i, lo_in, lo_out in zip(i2, idx, cp.src_start, cp.dst_start)])))
        self.defs.append(z3.Implies(k == len(flat), z3.And([z3.Not(x) for x in covers])))
        self.written.append(k < len(flat))
        return c2, i2

    def _named(self, t: int, idx: list) -> list:
        """Fresh names for the index before instruction ``t`` (keeps the solver's terms small)."""
        out = []
        for d, e in enumerate(idx):
            v = z3.Int(f"{self.tag}_i{t}_{d}")
            self.defs.append(v == e)
            out.append(v)
        return out


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


def _solve(constraints, timeout_ms: int):
    s = z3.SolverFor("QF_LIA")
    s.set("timeout", timeout_ms)
    s.add(*constraints)
    return s, s.check()


# ----------------------------------------------------------------------------- entry points
def verify(plan, dst=None, *, timeout_s: float = 60.0, check_costs: bool = True) -> Verdict:
    """Prove that ``plan.program`` turns buffers of type ``plan.src`` into buffers of type ``dst``
    (default ``plan.dst``) on every device at every local index (group sums, for partial types), and that
    ``plan.peak_bytes`` / ``plan.bytes_received`` agree with the instructions. ``dst`` may be a
    :class:`~redist.types.ShardingType` or its text. A false claim is refuted with a counterexample."""
    start = time.perf_counter()
    if isinstance(dst, str):
        from redist.types import ShardingType

        dst = ShardingType.parse(dst, plan.src.mesh)
    claim = plan.dst if dst is None else dst
    costs = (plan.peak_bytes, plan.bytes_received) if check_costs else None
    return verify_program(plan.program, plan.src, claim, costs=costs, timeout_s=timeout_s, start=start)


def verify_program(program, src, dst, *, costs=None, timeout_s: float = 60.0, start=None) -> Verdict:
    """:func:`verify` for a bare program: ``src`` is what its input buffers hold, ``dst`` the claim.
    ``costs``: optional ``(peak_bytes, bytes_received)`` to check against the instructions."""
    start = time.perf_counter() if start is None else start
    details: dict = {}
    try:
        _verify(program, src, dst, costs, int(timeout_s * 1000), details)
    except _Refuted as e:
        return Verdict(False, e.reason, e.counterexample, time.perf_counter() - start, details)
    return Verdict(True, "proved: every device holds the destination's elements at every local index"
                   + (" (group sums of partial axes)" if src.partial else "")
                   + ("; peak_bytes and bytes_received agree with the instructions" if costs else ""),
                   None, time.perf_counter() - start, details)


def _verify(program, src, dst, costs, timeout_ms, details) -> None:
    mesh_sizes = dict(program.mesh.axes)
    names = list(mesh_sizes)
    if dict(src.mesh.axes) != mesh_sizes or dict(dst.mesh.axes) != mesh_sizes:
        raise _Refuted("the types and the program are on different meshes")
    if tuple(src.shape) != tuple(dst.shape):
        raise _Refuted(f"source shape {src.shape} and claimed shape {dst.shape} differ")
    _, src_local, _, src_partial, _ = _type_meaning(mesh_sizes, src, {n: z3.IntVal(0) for n in names}, None)
    _, dst_local, _, dst_partial, _ = _type_meaning(mesh_sizes, dst, {n: z3.IntVal(0) for n in names}, None)
    if tuple(program.shapes[0]) != src_local:
        raise _Refuted(f"the program starts from local shape {tuple(program.shapes[0])}, but {src} is {src_local}")
    shapes = _derive_shapes(program, mesh_sizes)
    if shapes[-1] != dst_local:
        raise _Refuted(f"the program ends with local shape {shapes[-1]}, but {dst} has local shape {dst_local}",
                       {"device": 0, "coords": {n: 0 for n in names}, "index": None,
                        "holds": {"local_shape": shapes[-1]}, "expected": {"local_shape": dst_local}})
    # ---- bytes (SPMD: every device's buffer has the instruction's shape at every boundary)
    itemsize = __import__("numpy").dtype(program.dtype).itemsize
    peak = max(math.prod(s) * itemsize for s in shapes)
    per_dev = program_bytes(program, mesh_sizes)
    received = max(per_dev, default=Fraction(0))
    details.update(peak_bytes=peak, bytes_received=received)
    if costs is not None:
        claimed_peak, claimed_recv = costs
        if peak > claimed_peak:
            raise _Refuted(f"a device holds {peak} bytes at a step boundary, more than peak_bytes={claimed_peak}")
        if peak != claimed_peak:
            raise _Refuted(f"peak_bytes={claimed_peak} but the largest buffer is {peak} bytes")
        if abs(Fraction(claimed_recv) - received) > Fraction(1, 10**6) * max(1, received):
            dev = max(range(len(per_dev)), key=lambda d: per_dev[d])
            raise _Refuted(f"bytes_received={claimed_recv} but the instructions make device {dev} receive "
                           f"{float(received):g} bytes")
    if any(n == 0 for n in dst_local):
        return  # no elements: nothing to prove
    # ---- query 1: values
    w = _Walk(program, mesh_sizes, "a")
    c = {n: w.fresh(f"dev_{n}", 0, s) for n, s in mesh_sizes.items()}
    idx = [w.fresh(f"idx{d}", 0, L) for d, L in enumerate(dst_local)]
    want, _, _, _, is_data = _type_meaning(mesh_sizes, dst, c, idx)
    c0, i0 = w.run(c, idx)
    got, _, summand, _, from_data = _type_meaning(mesh_sizes, src, c0, i0)
    unwritten = z3.Not(_all(w.written))
    bad = z3.Or([unwritten, z3.Not(from_data)] + [a != b for a, b in zip(got, want)])
    s, res = _solve(w.ranges + w.defs + [is_data, bad], timeout_ms)
    details["queries"] = 1
    if res == z3.unknown:
        raise _Refuted(f"Z3 could not decide the value query ({s.reason_unknown()})")
    if res == z3.sat:
        mdl = s.model()
        cx = _cex(mdl, w, names, c, idx, want, c0, i0, got, summand, src_partial)
        where = f"device {cx['device']} {cx['coords']} at local index {cx['index']}"
        if not z3.is_true(mdl.eval(_all(w.written), model_completion=True)):
            cx["holds"] = {"unwritten": True}
            raise _Refuted(f"{where} is never written by an exchange, but {dst} puts global element "
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
    # ---- query 2: sums
    n_members = math.prod(ax.size for _, _, axes in w.sum_vars for ax in axes)
    n_q = _ksize(dst_partial)
    n_summands = _ksize(src_partial)
    if n_members * n_q != n_summands:
        raise _Refuted(
            f"each element of the result sums {n_members} source summand(s) per device "
            f"(x {n_q} over the destination's partial axes), but the source has {n_summands} summand(s) "
            "per element: some summand is dropped or added more than once",
            {"device": 0, "coords": {n: 0 for n in names}, "index": (0,) * len(dst_local),
             "holds": {"summands": n_members * n_q}, "expected": {"summands": n_summands}})
    if n_summands == 1:
        return
    details["queries"] = 2
    walks = []
    base_c = {n: z3.Int(f"base_{n}") for n in names}
    base_ranges = [z3.And(base_c[n] >= 0, base_c[n] < s) for n, s in mesh_sizes.items()]
    base_idx = [z3.Int(f"base_i{d}") for d in range(len(dst_local))]
    base_ranges += [z3.And(v >= 0, v < L) for v, L in zip(base_idx, dst_local)]
    base_ranges.append(_type_meaning(mesh_sizes, dst, base_c, base_idx)[4])  # data positions only
    for tag in ("p", "q"):
        wk = _Walk(program, mesh_sizes, tag)
        cc = dict(base_c)
        qs = []
        for ax in dst_partial:
            v = wk.fresh("grp", 0, ax.size)
            qs.append(v)
            cc = _with_sub(cc, ax, v)
        cs, ii = wk.run(cc, list(base_idx))
        _, _, summ, _, _ = _type_meaning(mesh_sizes, src, cs, ii)
        members = qs + [v for _, vs, _ in wk.sum_vars for v in vs]
        walks.append((wk, members, summ, cs, _group_key(cs, src_partial)))
    (w1, m1, s1, cs1, g1), (w2, m2, s2, cs2, g2) = walks
    differ = z3.Or([a != b for a, b in zip(m1, m2)])
    same = z3.And([a == b for a, b in zip(s1, s2)])
    other_group = z3.Or([a != b for a, b in zip(g1, g2)])
    s, res = _solve(base_ranges + w1.ranges + w1.defs + w1.written + w2.ranges + w2.defs + w2.written
                    + [differ, z3.Or(same, other_group)],
                    timeout_ms)
    if res == z3.unknown:
        raise _Refuted(f"Z3 could not decide the summation query ({s.reason_unknown()})")
    if res == z3.sat:
        mdl = s.model()
        dev = {n: _model_int(mdl, base_c[n]) for n in names}
        index = tuple(_model_int(mdl, v) for v in base_idx)
        src_dev = [{n: _model_int(mdl, cc[n]) for n in names} for cc in (cs1, cs2)]
        summ = [{a.token: _model_int(mdl, e) for a, e in zip(src_partial, ss)} for ss in (s1, s2)]
        from_devs = [_dev_id(d, mesh_sizes) for d in src_dev]
        cx = {"device": _dev_id(dev, mesh_sizes), "coords": dev, "index": index,
              "holds": {"summands": summ, "added_from_devices": from_devs},
              "expected": {"summands": "each summand of one source partial group, exactly once"}}
        if summ[0] == summ[1]:
            why = f"adds source summand {summ[0]} twice (from devices {from_devs})"
        else:
            why = (f"mixes summands of different source partial groups (devices {from_devs} are in different "
                   f"groups over {{{','.join(a.token for a in src_partial)}}})")
        raise _Refuted(f"the group sum at device {cx['device']} {dev}, local index {index} {why}", cx)


def _group_key(c: dict, partial: tuple[_Axis, ...]) -> list:
    """Which partial group a device is in: its coordinates with those on the partial axes zeroed. The
    source's summands are only constrained to sum right within a group (SPEC 4: any summands whose group
    sums are right), so a group sum must take all its summands from one group."""
    key = dict(c)
    for ax in partial:
        key[ax.name] = key[ax.name] - _sub(c, ax) * ax.stride
    return list(key.values())


def _dev_id(coords: dict, mesh_sizes: dict) -> int:
    d = 0
    for n, s in mesh_sizes.items():
        d = d * s + coords[n]
    return d


def _cex(mdl, w, names, c, idx, want, c0, i0, got, summand, src_partial) -> dict:
    coords = {n: _model_int(mdl, c[n]) for n in names}
    src_coords = {n: _model_int(mdl, c0[n]) for n in names}
    sums = {f"instruction {t}": [_model_int(mdl, v) for v in vs] for t, vs, _ in w.sum_vars}
    out = {
        "device": _dev_id(coords, w.mesh_sizes),
        "coords": coords,
        "index": tuple(_model_int(mdl, v) for v in idx),
        "holds": {
            "global_index": tuple(_model_int(mdl, e) for e in got),
            "from_device": _dev_id(src_coords, w.mesh_sizes),
            "from_local_index": tuple(_model_int(mdl, e) for e in i0),
        },
        "expected": {"global_index": tuple(_model_int(mdl, e) for e in want)},
    }
    if src_partial:
        out["holds"]["summand"] = {a.token: _model_int(mdl, e) for a, e in zip(src_partial, summand)}
    if sums:
        out["holds"]["summation_members"] = sums
    return out
