"""Lowering: from the per-op choices (:mod:`partir_core.choice`) to one SPMD program of local ops and moves.

:func:`lower` turns an :class:`~partir_core.choice.Analysis` into a :class:`~partir_core.program.LocalProgram`:
in program order, every operand whose type does not fit what its op needs is moved there
(:class:`~partir_core.program.Reshard`, a redist plan from :mod:`partir_core.reshard`; a buffer moved to one
type is moved once and the copy reused), the op runs on local shards (:class:`~partir_core.program.Compute`),
and a max/min reduction over a split dim is finished (:class:`~partir_core.program.Finish`). Pending sums
become ``all_reduce`` / ``reduce_scatter`` this way, when consumed by an op that needs a non-partial operand,
and at the outputs, which get the types propagation gives them.

A control-flow region (:class:`partir_core.ir.Region`) becomes one :class:`~partir_core.program.ControlFlow`
instruction, a partitioned ``lax.scan`` / ``while_loop`` / ``switch`` on local shards: its operands are moved
to the types its enter wants before it (once), each body is lowered the same way into instructions of its
own (its reshards and pending-sum reductions inside it, run every iteration), and at each body's end its
results are moved to the types its exit wants: a carry whose body result came out in another layout than the
carry's is moved back inside the loop, at the end of the body, and reported
(:attr:`~partir_core.program.LocalProgram.carry_reshards`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, is_not

from partir_core import reshard
from partir_core.choice import Analysis, OpSharding, local_shapes, output_type
from partir_core.ir import Graph, column
from partir_core.program import CarryReshard, Compute, ControlFlow, Finish, LocalProgram, Reshard
from partir_core.propagation import State
from partir_core.registry import flops


OP_MEMO_SIZE = 1 << 10  # entries of a lowering memo's table of one op's choices (see lower), forgotten when full


class _Lowering:
    """The state of one lowering: the program's buffers' bytes, the fallbacks and carry reshards found, and the
    per-op parts of its instructions remembered across lowerings of one graph (``memo``, see :func:`lower`)."""

    def __init__(self, graph: Graph, analysis: Analysis, memo: dict):
        self.graph = graph
        self.analysis = analysis
        self.types = analysis.types
        self.memo = memo
        self.enters = {reg.enter for reg in graph.regions}  # the regions' enter equations
        self.buf_bytes = dict(zip(analysis.types, map(attrgetter("local_bytes"), analysis.types.values())))
        self.fallbacks: list = []
        self.carry_reshards: list = []
        self.n = 0  # reshard buffers made so far

    def move(self, buf, src, dst, where, out: list, made: dict, trips: int):
        """The buffer holding ``buf`` (of type ``src``) as ``dst``: a :class:`Reshard` appended to ``out``, made
        once per block (``made``) and reused by later readers in it."""
        if src is dst or src == dst:
            return buf
        if (buf, dst) not in made:
            m = reshard.move(src, dst)
            if m.fallback is not None:
                self.fallbacks.append((where, str(src), str(dst), m.fallback))
            self.n += 1
            new = ("r", self.n)
            self.buf_bytes[new] = dst.local_bytes
            out.append(Reshard(buf, new, m, [reshard.Collective(k, a, b, where, trips) for k, a, b in m.collectives]))
            made[(buf, dst)] = new
        return made[(buf, dst)]

    def block(self, eqns: range, trips: int, made: dict | None = None) -> list:
        """The instructions of equations ``eqns`` (a body, or the whole program), each region as one
        :class:`ControlFlow`; ``trips``: how often the block runs per call; ``made``: the block's moves,
        ``(buffer, type) -> the buffer holding it`` (filled in; a body's are its own)."""
        g = self.graph
        out: list = []
        made = {} if made is None else made
        i = eqns.start
        while i < eqns.stop:
            if i in self.enters:
                r = g.eqns[i].params["region"]
                out.append(self.region(r, out, made, trips))
                i = g.regions[r].exit + 1
                continue
            self.op(i, out, made, trips)
            i += 1
        return out

    def op(self, i: int, out: list, made: dict, trips: int) -> bool:
        """Append equation ``i``'s instructions to ``out`` (not a region's enter): its operands' moves, its
        :class:`Compute`, the reductions it finishes. Whether it moves an operand."""
        eqn, op, types = self.graph.eqns[i], self.analysis.ops[i], self.types
        known = self.memo.get(i)  # the op's instruction as made before (see compute): the common case
        hit = None if known is None else known.get(id(op))
        compute, finishes = self.compute(i, op) if hit is None else hit[1]
        reads = None  # the operands' buffers, where one is moved
        for k, (v, t) in enumerate(zip(eqn.invars, op.in_types)):
            if types[v] is not t:
                reads = reads or list(eqn.invars)
                reads[k] = self.move(v, types[v], t, f"eqn {i} ({eqn.name})", out, made, trips)
        out.append(compute if reads is None else Compute(compute.eqn_index, reads, compute.writes, compute.masks,
                                                         compute.flops, compute.collectives))
        for kind, axes, b in finishes:
            out.append(Finish(eqn.outvars[0], kind, axes,
                              [reshard.Collective("all_reduce_" + kind, axes, b, f"eqn {i} ({eqn.name})", trips)]))
        return reads is not None and any(r is not v for r, v in zip(reads, eqn.invars))

    def flat(self, base: LocalProgram | None) -> tuple[list, "Segments", dict]:
        """The instructions of a program without regions, its :class:`Segments` and its moves (as :meth:`block`
        gives them). With ``base`` (a program lowered with the same memo from another analysis of the graph),
        the equations that run as they did there and move nothing are not lowered again: their
        instructions are taken from it as they are (the same objects: see :meth:`compute`). An equation is
        lowered again when its choice or an operand's type is another object than in the base's analysis, or
        when it moved an operand there (a move's buffer is numbered in program order, and a move is made once
        and reused: :meth:`move`); every move is then made where full lowering makes it, and numbered alike."""
        n = len(self.graph.eqns)
        out: list = []
        starts: list = []
        moving: list = []
        made: dict = {}
        dirty = range(n) if base is None else sorted(self._dirty(base))
        done = 0  # the equations before it are in out
        for i in dirty:
            if done < i:  # equations done..i-1 as the base has them
                self._copy(base, done, i, out, starts)
            starts.append(len(out))
            if self.op(i, out, made, 1):
                moving.append(i)
            done = i + 1
        if done < n:
            self._copy(base, done, n, out, starts)
        return out, Segments(starts, moving, len(out), len(dirty)), made

    def _dirty(self, base: LocalProgram) -> set:
        """The equations :meth:`flat` lowers again from ``base``: those whose choice is another object, those
        reading a value whose type is, and those that moved an operand in the base."""
        readers = self.graph.readers()
        read = column(list(readers))
        was = base.analysis
        dirty = set(compress(range(len(self.analysis.ops)), map(is_not, self.analysis.ops, was.ops)))
        for v in compress(readers, map(is_not, read(self.types), read(was.types))):
            dirty.update(readers[v])
        dirty.update(base.segments.moving)
        return dirty

    @staticmethod
    def _copy(base: LocalProgram, first: int, stop: int, out: list, starts: list) -> None:
        """Append the base's instructions of equations ``first`` to ``stop - 1`` to ``out``, and where each
        starts to ``starts``."""
        b_starts = base.segments.starts
        end = b_starts[stop] if stop < len(b_starts) else base.segments.end
        shift = len(out) - b_starts[first]
        starts.extend(map(shift.__add__, b_starts[first:stop]))
        out.extend(base.instructions[b_starts[first]:end])

    def compute(self, i: int, op: OpSharding) -> tuple:
        """``(compute, finishes)`` of equation ``i`` run as ``op``: its :class:`Compute` reading its operands'
        own buffers (its FLOPs per device, its :func:`_masks`), and ``(kind, axes, bytes)`` of each reduction it
        finishes; made here and remembered in ``memo`` (in a table of its own per equation, ``memo[i][id(op)]``,
        which :meth:`block` reads first) by the identity of ``op`` (an :class:`OpSharding` is never changed once
        made), and so shared by the programs lowered with that memo (an instruction is never changed once made).
        The entry keeps ``op`` alive, so no other object takes its id while the entry is there."""
        known = self.memo.setdefault(i, {})
        g, eqn = self.graph, self.graph.eqns[i]
        f = flops(eqn.name, local_shapes(g, eqn.invars, op.in_types), local_shapes(g, eqn.outvars, op.out_types),
                  eqn.params)
        finishes = [(kind, tuple(axes), reshard.finish_bytes(axes, op.out_types)) for kind, axes in op.finish]
        parts = (Compute(i, list(eqn.invars), list(eqn.outvars), _masks(op), f, _collectives(g, i, op)), finishes)
        if len(known) >= OP_MEMO_SIZE:
            known.clear()
        known[id(op)] = (op, parts)
        return parts

    def region(self, r: int, out: list, made: dict, trips: int) -> ControlFlow:
        """The :class:`ControlFlow` of region ``r``; its operands' moves are appended to ``out``."""
        g = self.graph
        reg = g.regions[r]
        enter, exit_ = g.eqns[reg.enter], g.eqns[reg.exit]
        wants, gives = self.analysis.ops[reg.enter].in_types, self.analysis.ops[reg.exit].in_types
        where = f"eqn {reg.enter} ({reg.kind})"
        operands = [self.move(v, self.types[v], t, where, out, made, trips) for v, t in zip(enter.invars, wants)]
        inner = trips * reg.trip_count
        # exit operand -> the carry it is the body's new value of (loops; a carry's result comes first in its tie)
        carry_of = {} if reg.kind == "cond" else {t[1][0]: t[0] for t in exit_.params["ties"] if not t[2]}
        bodies, results = [], []
        for b, eqns in enumerate(reg.bodies):
            made_in = {}  # the body's moves, reused by its results' (a value moved to one type once)
            body = self.block(eqns, inner, made_in)
            at = f"end of the body of eqn {reg.enter} ({reg.kind})"
            res = []
            for v, slot in zip(reg.results[b], reg.exit_slots[b]):
                src, dst = self.types[v], gives[slot]
                res.append(self.move(v, src, dst, at, body, made_in, inner))
                if src != dst and slot in carry_of:
                    self.carry_reshards.append(CarryReshard(r, carry_of[slot], str(src), str(dst)))
            bodies.append(body)
            results.append(res)
        return ControlFlow(r, reg.kind, operands, bodies, results, list(exit_.outvars), reg.trip_count)


@dataclass
class Segments:
    """Where each equation's instructions lie in a lowered program without regions (equation ``i``'s are
    ``program.instructions[starts[i]:starts[i + 1]]``, the last's end at ``end``, the outputs' moves after) and
    the equations among them that move an operand (``moving``): what :func:`lower` reads, beside the program's
    instructions and analysis, to lower another analysis of the graph from it (:meth:`_Lowering.flat`).
    ``lowered``: how many equations were lowered (the others' instructions were taken from a base program)."""

    starts: list
    moving: list
    end: int
    lowered: int


def lower(graph: Graph, analysis: Analysis, mesh, state: State | None = None,
          memo: dict | None = None, base: LocalProgram | None = None) -> LocalProgram:
    """The local program of ``analysis``. A reshard of one buffer to one type is made once per block (the
    program, or a body) and its result reused by every later reader there. Outputs are given the type
    propagation gives them (``state``; without it, their producer's type with pending sums reduced). ``memo``:
    a dict that a caller lowering many analyses of ``graph`` keeps between calls (the automatic search's
    candidates share most of their ops' choices): each op's :class:`Compute` (shared by the programs where it
    reads its operands' own buffers) and finishes are remembered there by the identity of its choice. ``base``:
    a program lowered before with the same memo (the same instructions come out; of a program without
    control flow, only the equations whose choice or operands differ from the base's are lowered again, see
    :meth:`_Lowering.flat`). Raises :class:`redist.ShardingError` if a value must reach a type no
    redistribution can give it."""
    state = analysis.state if state is None else state
    low = _Lowering(graph, analysis, {} if memo is None else memo)
    segments = None
    if graph.regions:
        made: dict = {}  # the program's moves, reused for the outputs
        instructions = low.block(range(len(graph.eqns)), 1, made)
    else:
        instructions, segments, made = low.flat(base)
    out_types, out_bufs = [], []
    for j, v in enumerate(graph.outvars):
        dst = output_type(graph, analysis, state, v, mesh)
        out_bufs.append(low.move(v, analysis.types[v], dst, f"output {j}", instructions, made, 1))
        out_types.append(dst)
    in_types = [analysis.types[v] for v in graph.invars]
    return LocalProgram(graph, mesh, analysis, instructions, in_types, out_types, out_bufs, low.buf_bytes,
                        low.fallbacks, low.carry_reshards, segments)


def _collectives(graph: Graph, i: int, op: OpSharding) -> tuple:
    """The collectives the local form of equation ``i`` runs as ``op`` (a rule's ``collectives``), located."""
    if op.rule is None or op.rule.collectives is None:
        return ()
    eqn = graph.eqns[i]
    return tuple(reshard.Collective(kind, axes, b, f"eqn {i} ({eqn.name})", graph.read_trips(i))
                 for kind, axes, b in op.rule.collectives(eqn, op.in_types))


def _masks(op: OpSharding) -> list:
    """The operand dims of ``op`` whose padding must be masked: split unevenly and reduced over by the op."""
    if op.rule is None:
        return []
    out = []
    for i, (dims, t) in enumerate(zip(op.rule.operands, op.in_types)):
        for d, fs in enumerate(dims):
            kinds = {op.rule.reduce[f] for f in fs if f in op.rule.reduce and f in op.use}
            if kinds and not t.is_even(d):
                (kind,) = kinds
                out.append((i, d, kind))
    return out
