"""A partitioned program's conflicts and unsupported ops in words (:meth:`partir_core.Partitioned.explain`).

A *conflict* (:class:`partir_core.propagation.Conflict`) is a tactic's request that could not be honoured: two
demands on one op that cannot both hold, or an input a tactic asks to split that is pinned or already split on
the axis. For each, the explanation says

- where: the op (its equation index, primitive and the line of the user's code that applied it, where JAX kept
  one), or the input;
- what was asked: the tactic (its number in the schedule and its text; for an ``AutomaticPartition``, the action
  of its result) and the value and dim it asked to split, named by its input path where it is an input;
- what was kept and why: the dims that hold the axis, and the tactic that decided them (earlier tactics win);
- what it costs: the reshards the lowered program runs into that op (each a redist plan: its source and
  destination types, its collectives, the bytes a device receives and their simulated time on ``hardware``,
  :func:`partir_core.simulator.collectives_time`), or that it moves nothing.

An *unsupported* op (a primitive without a factor rule, :class:`partir_core.choice.Unsupported`) runs whole on
every device: its operands are gathered to replicated first and its results are replicated.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

from redist.picture import format_bytes

from partir_core.automatic.evaluation import STEP
from partir_core.factors import overlap
from partir_core.program import Compute, Reshard, walk
from partir_core.propagation import op_slots
from partir_core.simulator import collectives_time, hardware_profile
from partir_core.tactics import AutomaticPartition, ManualPartition

if TYPE_CHECKING:  # partition calls this module
    from partir_core.partition import Partitioned

UNDECIDED = 1 << 30  # the provenance propagation gives a dim no tactic decided (partir_core.propagation.resolve)


def explain(p: Partitioned, hardware=None) -> str:
    """The conflicts and unsupported ops of ``p`` in words (module docstring); ``hardware`` prices the reshards
    (a :data:`partir_core.HARDWARE` name or a :class:`partir_core.Hardware`; None: ``"cpu-host"``)."""
    words = _Words(p, hardware_profile(hardware))
    conflicts, unsupported = p.conflicts, p.unsupported
    lines = [f"{len(conflicts) or 'no'} conflict{'s' * (len(conflicts) != 1)}, {len(unsupported) or 'no'} op"
             f"{'s' * (len(unsupported) != 1)} without a partitioning rule, on mesh {p.mesh or '(no axes)'}; "
             "the schedule:"]
    lines += [f"  tactic {k}: {t}" for k, t in enumerate(p.schedule, start=1)]
    for n, c in enumerate(conflicts, start=1):
        lines += [f"conflict {n}: {words.where(c)}", *("  " + line for line in words.conflict(c))]
    for u in unsupported:
        lines.append(f"unsupported: {words.op(u.eqn)} has no partitioning rule: {words.replicated(u.eqn)}")
    return "\n".join(lines)


class _Words:
    """Names of a partitioned program's values, tactics and reshards, in the user's terms."""

    def __init__(self, p: Partitioned, hardware):
        self.p, self.graph, self.mesh = p, p.graph, p.mesh
        self.hardware = hardware
        self.producer = {v: i for i, e in enumerate(self.graph.eqns) for v in e.outvars}
        self.inputs = dict(zip(self.graph.invars, self.graph.in_paths))
        self.moves: dict = {}  # equation -> [(operand, Reshard)] the program runs into it
        reshards = {ins.dst_buf: ins for ins in walk(p.program.instructions) if isinstance(ins, Reshard)}
        for ins in walk(p.program.instructions):
            if isinstance(ins, Compute):
                moved = [(k, reshards[b]) for k, b in enumerate(ins.reads) if b in reshards]
                self.moves.setdefault(ins.eqn_index, []).extend(moved)
        automatic = [k for k, t in enumerate(p.schedule, start=1) if isinstance(t, AutomaticPartition)]
        self.automatic = dict(zip(automatic, p.automatic_results))

    # ------------------------------------------------------------------ names
    def op(self, i: int) -> str:
        """``eqn 6 (dot_general at model.py:12:8 (loss))``."""
        eqn = self.graph.eqns[i]
        return f"eqn {i} ({eqn.name}" + (f" at {eqn.source})" if eqn.source else ")")

    def value(self, v: int) -> str:
        """An input by its path, a loop body's parameter by the input it comes from, else ``%v`` and its
        producer."""
        if v in self.inputs:
            return f"input {self.inputs[v]}"
        if v in self.graph.names:
            return self.graph.names[v]
        if v in self.producer:
            return f"%{v} (the result of eqn {self.producer[v]}, {self.graph.eqns[self.producer[v]].name})"
        return f"%{v}"

    def tactic(self, t) -> str:
        """The tactic of provenance ``t`` by its number (the schedule lists their texts); an
        ``AutomaticPartition``'s action also by its text."""
        if t is None or t >= UNDECIDED:
            return "no tactic (undecided)"
        k, j, manual = self.decided_by(t)
        if k not in self.automatic:
            return f"tactic {k}"
        return f"tactic {k}'s action {j + 1}, {manual or 'an action it tried'}"

    def decided_by(self, t) -> tuple[int, int, ManualPartition | None]:
        """``(k, j, tactic)`` of provenance ``t``: the schedule's tactic ``k``, the ``j``-th action of an
        ``AutomaticPartition`` (its provenance is ``k + j·STEP``, :data:`partir_core.automatic.evaluation.STEP`), and
        the manual tactic that decided it (None for an action the search tried and did not keep)."""
        k = int(t)
        result = self.automatic.get(k)
        if result is None:
            tactic = self.p.schedule[k - 1]
            return k, 0, tactic if isinstance(tactic, ManualPartition) else None
        j = round((t - k) / STEP)
        return k, j, result.tactics[j] if j < len(result.tactics) else None

    def asked(self, v: int, d: int, axes, t) -> str:
        """What a demand asked: the tactic, the value and dim, and the tactic's entry that names the input (or
        that propagation carried it there)."""
        manual = self.decided_by(t)[2] if t is not None and t < UNDECIDED else None
        entries = [f"{pattern!r}: {dim}" for pattern, dim in (manual.dims.items() if manual else ())
                   if v in self.inputs and fnmatch.fnmatchcase(self.inputs[v], pattern)]
        how = f"its entry {entries[0]}" if entries else "through propagation"
        return f"{self.tactic(t)} splits {self.value(v)} dim {d} on {_axes(axes)} ({how})"

    # ------------------------------------------------------------------ conflicts
    def where(self, c) -> str:
        place = c.primitive if c.eqn < 0 else f"at {self.op(c.eqn)}"
        return f"{place}, found applying tactic {c.tactic:g}"

    def conflict(self, c) -> list[str]:
        lines = [f"asked: {self.asked(*demand)}" for demand in c.demands]
        if c.eqn < 0:
            lines.append(f"kept:  the input as it is ({c.reason}; earlier tactics win)")
            lines.append("cost:  nothing moves (the input keeps its type)")
            return lines
        held = "; ".join(f"{self.value(v)} dim {d} from {self.tactic(t)}" for v, d, _, t in self.holders(c))
        lines.append(f"kept:  {_axes(c.kept)} for the op ({c.reason}; earlier tactics win)"
                     + (f", held by {held}" if held else ""))
        moves = self.moves.get(c.eqn, [])
        if not moves:
            lines.append("cost:  nothing moves into this op")
            return lines
        eqn, op = self.graph.eqns[c.eqn], self.p.program.analysis.ops[c.eqn]
        operands = ", ".join(f"{t} ({self.value(v)})" for v, t in zip(eqn.invars, op.in_types)
                             if v not in self.graph.consts)
        lines.append(f"runs:  on {operands}: of the layouts its operands and results carry, the one that moves the "
                     "fewest bytes")
        for k, ins in moves:
            lines.append(f"cost:  operand {k} ({self.value(self.graph.eqns[c.eqn].invars[k])}) {self.reshard(ins)}")
        return lines

    def holders(self, c) -> list[tuple]:
        """``(value, dim, axes, provenance)`` of the op's dims, other than those demanded, whose axes overlap
        the axes demanded: what holds them, in the final state."""
        eqn, rule = self.graph.eqns[c.eqn], self.p.rules[c.eqn]
        state = self.p.states[-1]
        asked = {(v, d) for v, d, _, _ in c.demands}
        axes = {a for _, _, demanded, _ in c.demands for a in demanded} | set(c.kept)
        out = []
        for v, d, _ in op_slots(rule, eqn) if rule is not None else ():
            have = state.dims.get(v, ())[d] if v in state.dims else ()
            if (v, d) not in asked and any(overlap(self.mesh, a, b) for a in have for b in axes):
                out.append((v, d, tuple(have), state.prov[v][d]))
        operands = [h for h in out if h[0] in eqn.invars]
        return list(dict.fromkeys(operands or out))[:2]

    def reshard(self, ins: Reshard) -> str:
        """``moves f32[8{batch}, 16] -> f32[8, 16]: all_gather over batch, 256 B per device, 0.004 ms ...``."""
        steps = ", ".join(f"{c.kind} over {','.join(c.axes)}" for c in ins.collectives) or "local slices only"
        received = sum(c.bytes * c.trips for c in ins.collectives)
        seconds = collectives_time(ins.collectives, self.hardware, self.mesh)
        plan = "" if ins.move.fallback is None else " (gather-then-slice: redist found no plan)"
        return (f"moves {ins.src} -> {ins.dst}{plan}: {steps}; {format_bytes(received)} received per device, "
                f"{seconds * 1e3:.4g} ms simulated ({self.hardware.name})")

    # ------------------------------------------------------------------ unsupported ops
    def replicated(self, i: int) -> str:
        """What running op ``i`` replicated costs: the reshards into it."""
        moves = self.moves.get(i, [])
        head = "it runs whole on every device, its results replicated"
        if not moves:
            return head + "; its operands are replicated already"
        return head + "; " + "; ".join(f"operand {k} {self.reshard(ins)}" for k, ins in moves)


def _axes(axes) -> str:
    return "{" + ",".join(axes) + "}"
