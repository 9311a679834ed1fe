"""Z3, the deadline of one call, and solving a query.

Z3 is an optional dependency (the ``[verify]`` extra): without it the package still imports (``import redist``
works), and the first use of ``z3`` raises the ModuleNotFoundError that says what to install. The modules of
the verifier take ``z3`` from here.

Time
----
``timeout_s`` bounds the wall time of the whole call. A deadline is checked while the constraints are built
(per instruction, per dim of an exchange, per leaf of a permute's table) and Z3 gets only the time that
is left, with a timer that interrupts it at the deadline (its own ``timeout`` is checked late in some
phases); running out gives status ``"undecided"`` and a reason saying what was not finished. The plan's own
work — lowering (``plan.program``) and ``plan.bytes_received``, each computed once per plan and cached —
happens before the first check and cannot be cut short. A ``timeout_s`` longer than Z3's timer counts
(``Z3_MAX_MS``, about 49.7 days) still bounds the building of the constraints, but leaves Z3 unbounded.

Threads
-------
Each call works in a Z3 context of its own (:func:`new_context`): every term, sort and solver of the call is
made in it, and the watchdog interrupts only the call's solver. Calls in several threads at once share no Z3
state (Z3's global context is never used), and a call's deadline cuts short no other call.
"""

from __future__ import annotations

import math
import threading
import time

from redist.extras import MissingModule
from redist.verify.verdict import Undecided

try:
    import z3
except ModuleNotFoundError as e:  # no [verify] extra: `import redist` works, and verify() says what to install
    z3 = MissingModule(e, "redist.verify", "verify")


# The longest timeout, in milliseconds, that Z3's timer takes (an unsigned 32-bit count).
Z3_MAX_MS = 2**32 - 1


def new_context() -> z3.Context:
    """A Z3 context for one call. Python may free another call's terms in this thread (a garbage collection
    runs in whichever thread triggers it), so the context takes reference decrements from any thread."""
    ctx = z3.Context()
    z3.Z3_enable_concurrent_dec_ref(ctx.ref())
    return ctx


class Deadline:
    """The wall-clock budget of one call (``timeout_s`` None: unbounded). :meth:`check` raises
    :class:`~redist.verify.verdict.Undecided` once it is spent, naming what was being done; :meth:`ms_left` is
    Z3's share."""

    def __init__(self, timeout_s: float | None, start: float):
        self.timeout_s = timeout_s
        self.start = start
        self.end = math.inf if timeout_s is None else start + timeout_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def check(self, doing: str) -> None:
        if time.perf_counter() >= self.end:
            raise Undecided(f"timeout_s={self.timeout_s:g} ran out while {doing}")

    def each(self, items, doing: str, every: int = 65536):
        """``items``, checking the deadline before the first and then every ``every`` of them (for loops over
        devices or segments, which may number 2**31)."""
        for n, item in enumerate(items):
            if n % every == 0:
                self.check(doing)
            yield item

    def ms_left(self) -> int | None:
        """The milliseconds left for Z3 (at least 1); None for no bound, or for more than Z3's timer counts
        (``Z3_MAX_MS``)."""
        ms = (self.end - time.perf_counter()) * 1000
        return None if ms > Z3_MAX_MS else max(1, int(ms))


def conjunction(conds, ctx: z3.Context) -> z3.BoolRef:
    """The conjunction of ``conds`` in context ``ctx`` (true if there are none)."""
    return z3.And(list(conds), ctx)


def disjunction(conds, ctx: z3.Context) -> z3.BoolRef:
    """The disjunction of ``conds`` in context ``ctx`` (false if there are none)."""
    return z3.Or(list(conds), ctx)


def solve(constraints, deadline: Deadline, query: str, ctx: z3.Context):
    """Check ``constraints`` (terms of context ``ctx``) with the time that is left; ``unknown`` (time out, or Z3
    gives up) is undecided.

    Besides Z3's own ``timeout``, which some of its phases check late (a 35,000-copy exchange overran it by
    18 s), a timer interrupts this solver at the deadline (only it: not the context, nor another thread's
    solver); an interrupt after ``check`` returned does nothing."""
    # z3.SolverFor would name the logic in Z3's global context: the solver is made in ``ctx`` alone.
    s = z3.Solver(z3.Z3_mk_solver_for_logic(ctx.ref(), z3.to_symbol("QF_LIA", ctx)), ctx)
    for start in range(0, len(constraints), 4096):
        deadline.check(f"handing the {query} to Z3")
        s.add(*constraints[start:start + 4096])
    ms = deadline.ms_left()
    watchdog = None
    if ms is not None:
        s.set("timeout", ms)
        watchdog = threading.Timer(ms / 1000, s.interrupt)
        watchdog.daemon = True
        watchdog.start()
    try:
        res = s.check()
    finally:
        if watchdog is not None:
            watchdog.cancel()
    if res == z3.unknown:
        budget = "" if deadline.timeout_s is None else f" within timeout_s={deadline.timeout_s:g}"
        raise Undecided(f"Z3 did not decide the {query}{budget} ({s.reason_unknown()})")
    return s, res


def model_int(model, e) -> int:
    return model.eval(e, model_completion=True).as_long()
