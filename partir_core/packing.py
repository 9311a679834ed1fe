"""Packing: independent collectives of one kind over the same mesh axes run as one collective.

On JAX's CPU host devices, what a small collective costs is mostly its latency: every one is a rendezvous of
the devices (redist's calibration profile, ``collective_alpha``). XLA's all-reduce combiner makes one tuple
all-reduce of independent all-reduces, but it has no combiner for all-gathers, reduce-scatters or
all-to-alls. A partitioned program with ZeRO gathers each parameter and reduce-scatters each gradient apart:
many collectives of a few hundred bytes. So the program packs them itself. All-reduces are left to XLA's
combiner, which needs no copies.

What packs (:func:`packs`): reshards (:class:`~partir_core.instructions.Reshard`) whose plan is one all-gather,
reduce-scatter (over a dim its group divides) or all-to-all among local steps (reshapes, transposes,
slices), in the same block of instructions, with the same kind, mesh axes, reduction and dtype. Greedily in
program order: a reshard joins the open pack of its key unless that would make packs wait on each other (its
operand depends on the pack, directly or through other packs), or the pack would hold more than
:data:`PACK_BYTES` (of each member's larger buffer, before or after its collective); else it opens a new
pack of its key. Control flow and in-place reductions (:class:`~partir_core.instructions.Finish`) close every
pack, and nothing moves across them.

How a pack runs (:func:`partir_core.reshard.run_packed_moves`, redist's :func:`redist.jax.run_packed`): each
member's local steps before its collective run alone; each buffer is then laid out with the dim its
collective splits or joins leading (its chunks contiguous) and flattened past it; the buffers are laid end to
end and the one collective runs on them; each member's result is cut back out, laid out again, and its local
steps after the collective run alone. It computes what the members compute alone, bit for bit (the same
reduction of the same elements).

Where a pack runs (:func:`schedule`): where its last member is; every instruction is emitted after what it
reads, in program order otherwise. So the gradients' reduce-scatters, which the lowering puts before their
optimizer updates, run as one before the first update; the parameters' all-gathers of a ZeRO-3 step run a
few layers ahead, as a prefetch. A pack delays its earlier members' results and keeps their operands live
until it runs; :data:`PACK_BYTES` bounds that. The instructions themselves are unchanged: the verifier
proves them, and the simulator walks them in this order, each pack priced as one collective
(:func:`partir_core.simulator.combined_collectives`).
"""

from __future__ import annotations

from partir_core import reshard
from partir_core.instructions import Compute, ControlFlow, Finish, Reshard, changes_of, reads_of, writes_of

# The most bytes (per device, of each member's larger buffer) one pack holds. A pack copies its buffers in and
# out, which costs more than the latencies it saves once they are large (a few hundred KiB on host devices),
# and keeps its earlier members' operands live until it runs: this bounds both.
PACK_BYTES = 256 << 10


def packs(instructions: list) -> list[list[int]]:
    """The packs of one block of ``instructions`` (see the module docstring): lists of two or more positions of
    reshards, each list in program order."""
    deps: dict = {}  # buffer -> bitmask of the packs (indices into found) its value depends on
    found: list = []  # per pack: [members, bytes, bitmask of the packs its members' operands depend on]
    open_pack: dict = {}  # key -> index into found
    get = deps.get
    for t, ins in enumerate(instructions):
        if type(ins) is Compute:  # the common case, inline: its results depend on its operands
            mask = 0
            for b in ins.reads:
                mask |= get(b, 0)
            if mask:
                for b in ins.writes:
                    deps[b] = mask
            continue
        if isinstance(ins, (ControlFlow, Finish)):
            open_pack.clear()
        mask = 0
        for b in reads_of(ins):
            mask |= get(b, 0)
        found_key = _packing(ins)
        if found_key is not None:
            key, nbytes = found_key
            j = open_pack.get(key)
            if j is None or found[j][1] + nbytes > PACK_BYTES or _reaches(found, mask, j):
                j = open_pack[key] = len(found)
                found.append([[], 0, 0])
            found[j][0].append(t)
            found[j][1] += nbytes
            found[j][2] |= mask
            mask = 1 << j
        for b in changes_of(ins):
            deps[b] = mask
    return [members for members, *_ in found if len(members) > 1]


def _reaches(found: list, mask: int, j: int) -> bool:
    """Whether a value that depends on the packs ``mask`` depends on pack ``j``, directly or through the packs
    they depend on (the graph of packs as it stands: a member that joins a pack adds its operand's)."""
    seen = 0
    while mask & ~seen:
        if mask >> j & 1:
            return True
        new = mask & ~seen
        seen |= new
        while new:
            low = new & -new
            mask |= found[low.bit_length() - 1][2]
            new ^= low
    return bool(mask >> j & 1)


def schedule(instructions: list, found: list[list[int]]) -> list:
    """The order to emit ``instructions`` in with their packs ``found`` (:func:`packs`): a list whose items are
    positions (one instruction) or tuples of positions (one pack). A pack comes where its last member is, or
    as soon after as what it reads is written; an instruction that reads what is not written yet (an earlier
    member's result, before its pack runs) comes as soon as it is; everything else in program order."""
    if not found:
        return list(range(len(instructions)))
    last = {members[-1]: tuple(members) for members in found}
    packed = {t for members in found for t in members}
    unwritten: set = set()  # results of packed reshards whose pack has not run, and of what waits on them
    waiting: list = []  # (unit, what it reads), in program order, of the units that read an unwritten buffer
    order: list = []

    def reads(unit):
        return [b for t in unit for b in reads_of(instructions[t])] if type(unit) is tuple else \
            reads_of(instructions[unit])

    def writes(unit):
        return [b for t in unit for b in writes_of(instructions[t])] if type(unit) is tuple else \
            writes_of(instructions[unit])

    def flush():
        """Emit what waits and can run now, in program order, until nothing more can."""
        progress = True
        while progress and waiting:
            progress, still = False, []
            for u, rd in waiting:
                if unwritten.isdisjoint(rd):
                    order.append(u)
                    unwritten.difference_update(writes(u))
                    progress = True
                else:
                    still.append((u, rd))
            waiting[:] = still

    for t, ins in enumerate(instructions):
        if t in packed and t not in last:
            unwritten.update(writes_of(ins))
            continue
        unit = last.get(t, t)
        rd = reads(unit)
        if not unwritten.isdisjoint(rd):
            waiting.append((unit, rd))
            unwritten.update(writes(unit))
        elif type(unit) is tuple:  # its members' results are written: what waited on them may run
            order.append(unit)
            unwritten.difference_update(writes(unit))
            flush()
        else:
            order.append(unit)
    assert not waiting, "packs wait on each other"  # packs() never makes them
    return order


def _packing(ins) -> tuple[tuple, int] | None:
    """``(key, bytes)`` of reshard ``ins`` for packing (:func:`partir_core.reshard.packing`), or None where it
    packs with nothing (not a reshard, or not a move of one collective among local steps)."""
    return reshard.packing(ins.move) if type(ins) is Reshard else None
