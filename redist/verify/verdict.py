"""The outcome of a verification: the public :class:`Verdict`, and the two exceptions by which a check ends
the verification early, :class:`Refuted` and :class:`Undecided`, which :func:`redist.verify.verify` turns into
the verdicts ``"refuted"`` and ``"undecided"``."""

from __future__ import annotations

from dataclasses import dataclass, field

from redist.errors import ShardingError

STATUSES = ("proved", "refuted", "undecided")


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`redist.verify.verify`.

    ``status`` is ``"proved"`` (every check holds), ``"refuted"`` (some check fails: ``reason`` says which, and
    ``counterexample``, where there is one, names a device — id and coordinates —, a local index or ``None``,
    what that device holds there and what the claim expects) or ``"undecided"`` (the time ran out or Z3 gave
    up: ``reason`` says what was not finished, and nothing is known). ``ok`` is True only when proved; tell
    refuted from undecided by ``status``, never by the wording of ``reason``.
    """

    status: str
    reason: str
    counterexample: dict | None = None
    seconds: float = 0.0
    details: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ShardingError(f"Verdict status {self.status!r} is not one of {', '.join(STATUSES)}")

    @property
    def ok(self) -> bool:
        return self.status == "proved"

    def __bool__(self) -> bool:
        return self.ok


class Refuted(Exception):
    """A check fails: the claim is not what the program computes (``reason``, and where there is one a
    ``counterexample`` as in :class:`Verdict`)."""

    def __init__(self, reason: str, counterexample: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.counterexample = counterexample


class Undecided(Exception):
    """The time ran out or Z3 gave up: ``reason`` says what was not finished."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
