"""What a category of the probe finds, and what its categories share: the random source of each input, and how
a reproducer quotes an input or an error."""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Tally:
    """What one category found: the inputs tried, each input's outcome, the failures (each with a reproducer)
    and notes (figures worth printing)."""

    name: str
    tried: int = 0
    outcomes: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    peaks: dict = field(default_factory=dict)  # measure -> [its largest value, the input that gave it]
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return self.tried - len(self.failures)

    def add(self, outcome: str, failure: str | None = None) -> None:
        """One input: its outcome, and what went wrong with it (None: nothing)."""
        self.tried += 1
        self.outcomes[outcome] += 1
        if failure is not None:
            self.failures.append(failure)

    def peak(self, measure: str, value: float, where: str) -> None:
        """Keep the largest ``value`` of ``measure`` seen, and ``where`` it was seen."""
        if measure not in self.peaks or value > self.peaks[measure][0]:
            self.peaks[measure] = [value, where]

    def record(self) -> dict:
        """The tally as JSON, for a child process to hand to its parent (:meth:`merge`)."""
        return {"tried": self.tried, "outcomes": dict(self.outcomes), "failures": self.failures, "notes": self.notes,
                "peaks": self.peaks}

    def merge(self, record: dict) -> None:
        """Add a child's :meth:`record`."""
        self.tried += record["tried"]
        self.outcomes.update(record["outcomes"])
        self.failures += record["failures"]
        self.notes += record["notes"]
        for measure, (value, where) in record["peaks"].items():
            self.peak(measure, value, where)


def case_rng(seed: int, category: str, i: int) -> random.Random:
    """The random source of input ``i`` of ``category``: a function of the three alone, so that one input is
    drawn again without the others."""
    return random.Random(f"{seed}:{category}:{i}")


def shown(value, limit: int = 400) -> str:
    """``repr(value)``, cut in the middle past ``limit`` characters (saying how long ``value`` is)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 40]}…{text[-30:]} ({len(value)} long)"


def unexpected(e: BaseException) -> str:
    """How a failure quotes an error that should not have been raised."""
    return f"raised {type(e).__name__}: {str(e)[:300]}"


def child_environment() -> dict:
    """The environment of a child Python: this checkout first on its path, 8 JAX devices on the host, one BLAS
    thread."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               JAX_PLATFORMS="cpu", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    return env
