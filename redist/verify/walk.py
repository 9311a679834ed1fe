"""The backward walk of one element of the result through a plan's instructions (:class:`Walk`).

The proof follows each element of the result backward. For a symbolic device (mesh coordinates are Z3
integers in range) and a symbolic local index, each instruction, read in reverse, says which device and
which local index of the buffer before it the element came from. Devices are followed by their coordinates
on the program's mesh (``Program.mesh``, whose groups the collectives use), each written as digits over the
cut points of its mesh axis that the program and the types use (:class:`~redist.verify.encoding.Digits`:
every (sub-)axis coordinate and rank is then a linear term, no division by a constant); the claim's device
order (``Program.dst_mesh``) and the source's (``Program.src_mesh``) are translated to and from it by tables
over the position, as for a permute (none where the device orders agree). Instructions that name devices (a
permute's sources, an exchange's copies) name device ids, read through the program mesh's ``device_ids``.
A plan across meshes is a chain of programs and the transfers between them
(:class:`~redist.verify.chain.Chain`): the walk writes a device on the mesh of the program it is in, and
changes meshes at each transfer.

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
  ``If(d < start, …)`` over the runs of devices on which the coordinate is affine in d
  (:func:`~redist.verify.tables.lookup`). A coordinate map (the form lowering makes) is read symbolically: for
  each group ``(source_axes, axes)`` the source's rank over ``source_axes`` is d's rank over ``axes``
  (mixed-radix arithmetic on d's coordinates), its other coordinates are d's: a few terms per group, whatever
  the device count.
- ``Exchange(shape, dims)``: per dim, a selector over the slots of d's block (its rank over the dim's
  ``axes``; slot r: the block's r-th run of segments that tile an interval with one size and affine source
  blocks and starts, :func:`~redist.verify.tables.segment_runs`; each field a table over the block,
  :meth:`Walk.table`): the one whose interval holds the index gives, through one bounded quotient (the
  segment within the run), the source index and the source's block over the dim's ``source_axes`` (a block
  without an r-th run has count 0 there, and its other fields, never read, repeat a neighbour's, so that they
  break no run or period); the source device is d with its rank over each dim's source axes set to those
  blocks. An index no segment of some dim covers is *unwritten* (the walk records that it must not be). The
  terms grow with the runs and with the pieces of their tables (runs of blocks on which a field is affine, or
  periods that repeat shifted: a few for blocks of equal size, even uneven ones), not with the segments, the
  devices or their copies; over more than ``DENSE_BLOCKS`` blocks, a table is read from the blocks that have
  segments alone. A copy table (an exchange between two device orders, ``CopyTable``): a selector
  over every device's copies, linear in them.
- ``Transfer`` (between two programs of a chain): as a copy table, to the devices of the program after it
  from those of the program before it (global device ids, each read through its own program's mesh); from
  there on the walk is on the mesh of the program before it.
- ``Transpose(perm)``: same device; input index ``perm[a]`` is output index ``a``.
- ``Reshape(shape)``: same device; the index with the same row-major position in the input shape.

"""

from __future__ import annotations

import math
from typing import Sequence

from redist import program as P
from redist.verify.encoding import ChainDigits, DeviceOrder, horner, ksize, position_coords, read_axes
from redist.verify.solver import Deadline, disjunction, z3
from redist.verify.tables import (COUNT, DST, SHIFT, SIZE, SOURCE, affine, lookup, periodic_pieces, segment_runs,
                                  sparse_lookup)
from redist.verify.verdict import Refuted


# Blocks of an exchange's dim up to which its tables are listed block by block (and their periods found).
DENSE_BLOCKS = 2**20


class Walk:
    """One backward walk of a symbolic element through a chain of programs and transfers
    (:class:`~redist.verify.chain.Chain`; a plan within one mesh is one program). ``digits``, ``mesh_sizes``,
    ``names`` and ``order`` are those of the program whose buffer the walk is at (:meth:`enter`): the result's
    at first."""

    def __init__(self, chain, digits: ChainDigits, tag: str, deadline: Deadline):
        self.chain = chain
        self.stage_digits = digits
        self.ctx = digits.ctx  # the call's Z3 context
        self.tag = tag
        self.deadline = deadline
        self.defs: list = []  # definitional constraints (each has exactly one solution per input)
        self.ranges: list = []  # ranges of the free variables
        self.sum_vars: list = []  # (instruction index, fresh member coordinate vars)
        self.live: list = []  # (instruction, condition): the element is data, not a zero the instruction wrote
        self.quotients: dict = {}  # (key, lo, period) -> the quotient variable of :meth:`quotient`
        self.n = 0
        self.enter(len(chain.instructions))

    def enter(self, t: int) -> None:
        """Write devices as the program of buffer ``t`` does: its digits, and the device order of its mesh."""
        self.digits = self.stage_digits.at(t)
        self.mesh_sizes = self.digits.mesh_sizes
        self.names = list(self.mesh_sizes)
        self.order = self.stage_digits.order_at(t)

    def fresh(self, base: str, lo: int, hi: int):
        self.n += 1
        v = z3.Int(f"{self.tag}_{base}_{self.n}", self.ctx)
        self.ranges.append(z3.And(v >= lo, v < hi))
        return v

    def alive(self, since: int = 0, before: float = math.inf) -> list:
        """The conditions under which the element is data, not a zero, at the instructions ``since`` up to
        ``before`` (default: all)."""
        return [cond for t, cond in self.live if since <= t < before]

    def var(self, base: str):
        """A fresh variable of any value (a quotient)."""
        self.n += 1
        return z3.Int(f"{self.tag}_{base}_{self.n}", self.ctx)

    def position(self, c):
        """The row-major position of coordinates ``c``."""
        return horner([self.digits.value(c, name) for name in self.names],
                       [self.mesh_sizes[name] for name in self.names], self.ctx)

    def from_values(self, t, values: dict) -> dict:
        """Named coordinates whose value on each mesh axis is ``values[name]`` (in range)."""
        return self._named_coords(t, {name: self.digits.from_value(self, name, values[name])
                                      for name in self.names})

    def reorder(self, c: dict, from_order: DeviceOrder, to_order: DeviceOrder, what: str) -> dict:
        """The coordinates, on the device order ``to_order``, of the device at coordinates ``c`` on the device
        order ``from_order``; ``c`` itself where the orders agree."""
        if from_order == to_order:
            return c
        doing = f"encoding the device order of the {what} for the {self.tag!r} walk"
        targets = [position_coords(self.mesh_sizes, to_order.position(d))
                   for d in self.deadline.each(from_order.devices(), doing)]
        key = self.position(c)
        out = {name: lookup(key, [x[name] for x in targets], self.deadline, doing) for name in self.names}
        self.n += 1
        return self.from_values(f"o{self.n}", out)

    def run(self, c: dict, idx: list, below: int | None = None, stop: int = 0):
        """Walk back through instructions ``below − 1`` down to ``stop`` (default: the whole chain, from the
        result to the source) from coordinates ``c`` on the mesh of buffer ``below``'s program; returns the
        device coords (on the mesh of buffer ``stop``'s program, where the walk is then) and index before
        instruction ``stop``."""
        prog = self.chain
        below = len(prog.instructions) if below is None else below
        self.enter(below)
        for t in range(below - 1, stop - 1, -1):
            ins = prog.instructions[t]
            self.deadline.check(f"encoding instruction {t} ({type(ins).__name__}) for the {self.tag!r} walk")
            n_in, n_out = prog.shapes[t], prog.shapes[t + 1]
            idx = list(idx)
            if isinstance(ins, P.CollectivePermute):
                c = self._permute(t, ins, c)
                continue
            if isinstance(ins, P.Transfer):
                c, idx = self._transfer(t, ins, c, idx)
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
                    flat = z3.IntVal(0, self.ctx)
                    for d in dims_out:
                        flat = flat * n_out[d] + idx[d]
                    stride = math.prod(n_in[d] for d in dims_in)
                    for pos, d in enumerate(dims_in):
                        stride //= n_in[d]
                        digit = flat / stride if stride > 1 else flat
                        before[d] = digit if pos == 0 else digit % n_in[d]
                idx = self._named(t, before)
                continue
            axes = read_axes(self.mesh_sizes, ins.axes, f"instruction {t}")
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
                self.live.append((t, D.rank(c, axes) == 0))
            elif isinstance(ins, P.EmbedChunk):
                start = D.rank(c, axes) * n_in[ins.dim]
                self.live.append((t, z3.And(idx[ins.dim] >= start, idx[ins.dim] < start + n_in[ins.dim])))
                idx[ins.dim] = idx[ins.dim] - start
            elif isinstance(ins, (P.ReduceScatter, P.AllReduce)):
                if isinstance(ins, P.ReduceScatter):
                    idx[ins.dim] = idx[ins.dim] + D.rank(c, axes) * n_out[ins.dim]
                    if n_in[ins.dim] % ksize(axes):  # the padding rule: past the input, a zero
                        self.live.append((t, idx[ins.dim] < n_in[ins.dim]))
                members = [self.fresh(f"sum{t}", 0, ax.size) for ax in axes]
                c = D.with_rank(self, c, axes, horner(members, [ax.size for ax in axes], self.ctx), bounded=True)
                self.sum_vars.append((t, members, axes))
            else:
                raise Refuted(f"instruction {t}: unknown instruction {type(ins).__name__}")
            # Name the intermediate coordinates and index: keeps the terms small for the solver.
            c, idx = self._named_coords(t, c), self._named(t, idx)
        return c, idx

    def _permute(self, t: int, ins, c: dict) -> dict:
        """The coordinates of the source of the device at ``c``. A table: one table per mesh axis, of the
        source's coordinate on it, over the position (no division in the terms; the device at position p is
        ``ids[p]``, its source ``sources[ids[p]]``). A coordinate map: its ranks read from ``c``, then set on the
        source axes (groups do not overlap: checked); positions, so no device order enters."""
        if isinstance(ins.sources, P.CoordinateMap):
            groups = [(read_axes(self.mesh_sizes, s, f"instruction {t}"),
                       read_axes(self.mesh_sizes, a, f"instruction {t}")) for s, a in ins.sources.groups]
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
        sources = [position_coords(self.mesh_sizes, self.order.position(ins.sources[d]))
                   for d in self.deadline.each(self.order.devices(), doing)]
        return self.from_values(t, {name: lookup(did, [s[name] for s in sources], self.deadline, doing)
                                    for name in self.names})

    def _exchange(self, t: int, ins, c: dict, idx: list):
        """Read an exchange backward, dim by dim: the segment for the device's block whose destination interval
        holds the index.

        Per dim, the segments of each receiver block, in order of their destination, are grouped into runs
        (:func:`~redist.verify.tables.segment_runs`): segments of one size that tile an interval, with source
        blocks and source starts affine in their number q within the run. Slot ``r`` is a block's r-th run (an
        empty one where the block has fewer), each field a table over the block (:meth:`table`). Where the runs
        of a slot share their segment size and slopes, the segment of the index within the run is one bounded
        quotient ``q = (index − start) // size``; else each run is one segment (q = 0). A selector ``k`` names
        the slot whose run holds the index (``k == s``, the number of slots: none does, the element is
        unwritten): ``k == r → (0 ≤ q < count) ∧ (source block and source index)``, and ``k == s → no slot holds
        it``; the segments of one block do not overlap (checked), so ``k`` is a function of the device and
        index. The source device is the device with its rank over each dim's source axes set to the selected
        source blocks. The terms grow with the runs and with the pieces of their tables, not with the
        segments."""
        doing = f"encoding the segments of instruction {t} (exchange) for the {self.tag!r} walk"
        i2, settings = [], []
        for i, x in enumerate(ins.dims):
            self.deadline.check(doing)
            axes = read_axes(self.mesh_sizes, x.axes, f"instruction {t}")
            source_axes = read_axes(self.mesh_sizes, x.source_axes, f"instruction {t}")
            by_block, uniform = segment_runs(x.segments, self.deadline, doing)
            n_blocks = ksize(axes)
            slots = max(map(len, by_block.values()), default=0)
            k = self.fresh(f"seg{t}_{i}", 0, slots + 1)
            block = z3.Int(f"{self.tag}_b{t}_{i}", self.ctx)
            self.defs.append(block == self.digits.rank(c, axes))
            source_block = z3.Int(f"{self.tag}_sb{t}_{i}", self.ctx)
            index = z3.Int(f"{self.tag}_i{t}_{i}", self.ctx)

            def slot(r: int, field: int):
                """Per block, ``field`` of its r-th run, as a table over the block. Where a block has no r-th run,
                its count and size are 0 (no index is inside it) and its other fields are never read: they
                repeat a neighbour's (:func:`_filled`), which keeps the table's runs and periods whole. Over more
                than ``DENSE_BLOCKS`` blocks, the table is read from the blocks that have an r-th run alone
                (:func:`~redist.verify.tables.sparse_lookup`), not listed block by block."""
                points = {b: runs[r][field] for b, runs in by_block.items() if r < len(runs)}
                if n_blocks > DENSE_BLOCKS:
                    return sparse_lookup(block, points, "zero" if field in (SIZE, COUNT) else "previous",
                                         self.deadline, doing)
                values = [points.get(b) for b in range(n_blocks)]
                return self.table(block, [0 if v is None else v for v in values] if field in (SIZE, COUNT)
                                  else _filled(values), doing)

            covers = []
            for r in range(slots):
                start = slot(r, DST)
                if uniform[r] is None:  # one segment per run: q = 0
                    size = slot(r, SIZE)
                    inside = z3.And(idx[i] >= start, idx[i] < start + size)
                    src, offset = slot(r, SOURCE), slot(r, SHIFT)
                else:
                    size, d_source, d_src = uniform[r]
                    q = self.var(f"q{t}_{i}_{r}")  # the segment within the run: a quotient, defined for every index
                    self.defs.append(z3.And(size * q <= idx[i] - start, idx[i] - start < size * q + size))
                    inside = z3.And(q >= 0, q < slot(r, COUNT))
                    src = slot(r, SOURCE) + d_source * q
                    offset = slot(r, SHIFT) + (d_src - size) * q
                covers.append(inside)
                self.defs.append(z3.Implies(k == r, z3.And(inside, source_block == src, index == idx[i] + offset)))
            self.defs.append(z3.Implies(k == slots, z3.Not(disjunction(covers, self.ctx))))
            self.live.append((t, k < slots))
            i2.append(index)
            settings.append((source_axes, source_block))
        out = dict(c)
        for source_axes, source_block in settings:
            # bounded: a segment names a source block that exists (checked); where none is taken, any will do
            out = self.digits.with_rank(self, out, source_axes, source_block, bounded=True)
        return self._named_coords(t, out), i2

    def table(self, key, values: Sequence[int], doing: str):
        """``values[key]`` for a symbolic ``key`` in ``range(len(values))``, as
        :func:`~redist.verify.tables.lookup`, but over the pieces of :func:`~redist.verify.tables.periodic_pieces`:
        a piece of whole periods, whose values repeat shifted by the same amount from one period to the next, is
        one leaf: that shift times the period's number ``q`` (a quotient, defined for every key, as the walk's
        definitions are) plus the table of one period (its runs, :func:`~redist.verify.tables.lookup`) at the
        offset within it. A table of ``b // 19``, ``2·(b % 19)`` or ``2·b % 145`` over 65,536 blocks is a few
        leaves, not thousands of runs."""
        pieces = periodic_pieces(values, self.deadline, doing)

        def leaf(piece):
            lo, period, periods, per_period = piece
            if periods == 1:  # one run, affine in the key
                slope = values[lo + 1] - values[lo] if period > 1 else 0
                return affine(key, slope, values[lo] - slope * lo)
            q = self.quotient(key, lo, period)
            within = lookup(key - lo - period * q, values[lo:lo + period], self.deadline, doing)
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
        """Read a copy table (an exchange between two device orders) backward: :meth:`_copies`, from and to the
        devices of the program's mesh."""
        return self._copies(t, ins.dims.copies, self.position(c), self.order, idx, "exchange")

    def _transfer(self, t: int, ins, c: dict, idx: list):
        """Read a transfer backward: :meth:`_copies`, to the devices of the program after it (the walk's, at
        coordinates ``c``) from those of the program before it, whose coordinates the walk takes from here on.
        The transfer's meshes are those programs' input and output device orders, which hold the devices of
        their meshes (checked)."""
        did, receivers = self.position(c), self.order
        self.enter(t)
        return self._copies(t, ins.copies.copies, did, receivers, idx, "transfer")

    def _copies(self, t: int, table, did, receivers: DeviceOrder, idx: list, what: str):
        """The copy whose destination box, on the device at position ``did`` of ``receivers``, holds the index:
        its source device, written on the walk's mesh (that of the buffer the copies read), and the index there.

        A selector ``k`` names that copy (``k == J``, the number of copies: none holds it, the element is
        unwritten). Each copy is one implication, ``k == j → (device and index in its box) ∧ (source device
        and index)``, and ``k == J → no box holds it``; the boxes of one device do not overlap, so ``k`` is a
        function of the device and index: linear in the number of copies (such a table is per device, as a
        mesh in another order is)."""
        doing = f"encoding the copies of instruction {t} ({what}) for the {self.tag!r} walk"
        n_copies = sum(len(copies) for copies in table)
        k = self.fresh(f"copy{t}", 0, n_copies + 1)
        c2 = self.digits.fresh(lambda base, lo, hi: self.fresh(f"x{t}_{base}", lo, hi))
        i2 = [z3.Int(f"{self.tag}_i{t}_{d}", self.ctx) for d in range(len(idx))]
        covers, j = [], 0
        for d, copies in enumerate(table):
            if d % 256 == 0:
                self.deadline.check(doing)
            if not copies:
                continue
            on_d = did == receivers.position(d)
            for cp in copies:
                inside = z3.And([on_d] + [z3.And(i >= lo, i < lo + n) for i, lo, n in zip(idx, cp.dst_start, cp.size)])
                covers.append(inside)
                source = position_coords(self.mesh_sizes, self.order.position(cp.source))
                self.defs.append(z3.Implies(k == j, z3.And(
                    [inside] + [self.digits.value(c2, name) == source[name] for name in self.names]
                    + [a == (i if lo_in == lo_out else i + (lo_in - lo_out))
                       for a, i, lo_in, lo_out in zip(i2, idx, cp.src_start, cp.dst_start)])))
                j += 1
        self.deadline.check(doing)
        self.defs.append(z3.Implies(k == n_copies, z3.Not(disjunction(covers, self.ctx))))
        self.live.append((t, k < n_copies))
        return c2, i2

    def _named(self, t: int, idx: list) -> list:
        """Fresh names for the index before instruction ``t`` (keeps the solver's terms small)."""
        out = []
        for d, e in enumerate(idx):
            v = z3.Int(f"{self.tag}_i{t}_{d}", self.ctx)
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
                    v = z3.Int(f"{self.tag}_c{t}_{name}_{k}", self.ctx)
                    self.defs.append(v == e)
                    e = v
                digits.append(e)
            out[name] = tuple(digits)
        return out


def _filled(values: Sequence[int | None]) -> list[int]:
    """``values`` with each None replaced by the value before it (the first value, for those before it; 0 if
    there is none)."""
    out, last = [], next((v for v in values if v is not None), 0)
    for v in values:
        last = last if v is None else v
        out.append(last)
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
