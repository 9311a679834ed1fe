"""The instructions of a local program (:class:`partir_core.program.LocalProgram`), over per-device buffers named
by value ids, or ``("r", n)`` for resharded copies: what each reads and writes (see :mod:`partir_core.program`
for what they do)."""

from __future__ import annotations

from dataclasses import dataclass

from redist.types import ShardingType

from partir_core import reshard


@dataclass
class Reshard:
    """Move buffer ``src_buf`` (of type ``move.plan.src``) to a new buffer ``dst_buf`` of type
    ``move.plan.dst``; ``collectives`` are the move's, located in the program."""

    src_buf: object
    dst_buf: object
    move: reshard.Move
    collectives: list

    @property
    def src(self) -> ShardingType:
        return self.move.plan.src

    @property
    def dst(self) -> ShardingType:
        return self.move.plan.dst


@dataclass
class Compute:
    """Run equation ``eqn_index`` on local shards: read buffers ``reads``, write ``writes``. ``masks``:
    ``(operand, dim, kind)`` for every operand dim that is split unevenly and that the op reduces over (a
    contraction, a reduction, the summed dims of a scatter-add): its padding is replaced by the reduction's
    identity first (see :func:`partir_core.program._mask_padding`). ``flops``: per device. ``collectives``:
    those its local form runs (:attr:`partir_core.registry.Rule.collectives`), located in the program."""

    eqn_index: int
    reads: list
    writes: list
    masks: list
    flops: float
    collectives: tuple = ()


@dataclass
class Finish:
    """Finish a max/min reduction (``kind``) over mesh ``axes``: ``buf`` becomes its ``pmax``/``pmin`` over
    them; ``collectives``: that one all-reduce, located in the program."""

    buf: object
    kind: str
    axes: tuple
    collectives: list


@dataclass
class ControlFlow:
    """Run region ``region`` of the graph (a ``kind`` of ``"scan"``, ``"while"`` or ``"cond"``) as one JAX loop
    or switch on local shards: ``operands`` are the buffers of its enter's operands (already moved to the types
    it wants), ``bodies`` the instructions of each body, ``results`` the buffers each body returns (moved to
    the types its exit wants, at the body's end), ``writes`` the region's results (value ids). ``trips``: how
    often a body runs per execution (1 where unknown)."""

    region: int
    kind: str
    operands: list
    bodies: list
    results: list
    writes: list
    trips: int


@dataclass(frozen=True)
class CarryReshard:
    """A loop carry whose body result comes out in another layout than the carry's (``src`` → ``dst``, as text):
    it is moved back at the end of the body, inside the loop, every iteration. ``carry``: its index among the
    region's carries."""

    region: int
    carry: int
    src: str
    dst: str

    def __str__(self):
        return f"region {self.region}, carry {self.carry}: {self.src} -> {self.dst} at the end of every iteration"


def reads_of(ins) -> list:
    """The buffers instruction ``ins`` reads (a control-flow region's: its operands)."""
    if isinstance(ins, Reshard):
        return [ins.src_buf]
    if isinstance(ins, ControlFlow):
        return list(ins.operands)
    if isinstance(ins, Compute):
        return list(ins.reads)
    if isinstance(ins, Finish):
        return [ins.buf]
    return []


def writes_of(ins) -> list:
    """The buffers instruction ``ins`` writes new (a :class:`Finish` updates its buffer in place: none)."""
    if isinstance(ins, Reshard):
        return [ins.dst_buf]
    if isinstance(ins, (Compute, ControlFlow)):
        return list(ins.writes)
    return []


def changes_of(ins) -> list:
    """The buffers whose value instruction ``ins`` sets: those it writes new, or the one a :class:`Finish`
    updates in place (what a reader of them after it depends on)."""
    return [ins.buf] if isinstance(ins, Finish) else writes_of(ins)


def walk(instructions):
    """Every instruction of ``instructions``, those inside control flow included (after it), in order."""
    for ins in instructions:
        yield ins
        if isinstance(ins, ControlFlow):
            for body in ins.bodies:
                yield from walk(body)
