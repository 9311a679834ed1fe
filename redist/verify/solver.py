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
happens before the first check and cannot be cut short.
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

    def ms_left(self) -> int | None:
        if self.end == math.inf:
            return None
        return max(1, int((self.end - time.perf_counter()) * 1000))


def conjunction(conds) -> z3.BoolRef:
    """The conjunction of ``conds`` (true if there are none)."""
    return z3.And(conds) if conds else z3.BoolVal(True)


def solve(constraints, deadline: Deadline, query: str):
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
        raise Undecided(f"Z3 did not decide the {query}{budget} ({s.reason_unknown()})")
    return s, res


def model_int(model, e) -> int:
    return model.eval(e, model_completion=True).as_long()
