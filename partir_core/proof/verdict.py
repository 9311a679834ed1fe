"""The outcome of proving a partitioned program: redist's :class:`~redist.verify.Verdict`, how an op is named in
it, and the exception by which a check that cannot be made ends the proof early.

A verdict on a program is ``"proved"`` (the local program, run on every device, computes the reference's
outputs), ``"refuted"`` (it does not: ``counterexample`` names the reference's op where the two part ways —
``op``, ``source``, ``eqn`` — and the output a run on random inputs showed differing) or ``"undecided"``
(``reason`` says what no proved rule covers, naming the op). ``details`` counts what was proved."""

from __future__ import annotations

from redist.verify.verdict import Verdict  # noqa: F401 - the verdict of a program is redist's

__all__ = ["Verdict", "NotProved", "op_name"]


class NotProved(Exception):
    """A check of the walk does not hold or cannot be made: ``reason``, at equation ``eqn`` (or None)."""

    def __init__(self, reason: str, eqn: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.eqn = eqn


def op_name(graph, i: int) -> str:
    """Equation ``i`` of ``graph`` in words: ``eqn 12 (dot_general at model.py:40:8 (mlp))``."""
    eqn = graph.eqns[i]
    return f"eqn {i} ({eqn.name}" + (f" at {eqn.source})" if eqn.source else ")")
