"""An adversarial probe of redist's public surface, run as a hostile user would run it: every input gives a right
answer or a :class:`redist.ShardingError` in the user's terms; never a crash, a wrong result, another kind of
error, or a hang that the user did not ask for.

Each category is a seeded sample (each input drawn from the seed, the category and its index alone) and has a
module of its own, whose header says what is tried and what must hold:

==============  ===========================================================================================
``text``        mesh and type text, random, mutated, huge, nested: parsed or refused, in linear time
                (:mod:`proofs.probe.text`)
``plan_files``  mutated JSON of real plans: refused, or a valid plan (:mod:`proofs.probe.plan_files`)
``sequences``   plans of random step sequences: verify and numpy agree (:mod:`proofs.probe.verdicts`)
``claims``      random claims: verify proves no claim that numpy refutes, and refutes none it confirms
                (:mod:`proofs.probe.verdicts`)
``threads``     8 threads of synthesize, verify, execute, plan files and reshard: single-threaded results,
                no crash (:mod:`proofs.probe.threads`)
``jax``         ``redist.jax.reshard`` misused: a short ShardingError, or the values moved
                (:mod:`proofs.probe.jax_misuse`)
``cli``         the ``redist`` command with random arguments and at its edges: exit 0-3 or 141, one line on
                stderr at most, no traceback (:mod:`proofs.probe.cli`)
``bombs``       meshes of 2^30 to 2^31 - 1 devices and huge dims: a value or a ShardingError naming the limit,
                in bounded memory and time (:mod:`proofs.probe.bombs`)
``mpi``         a rank that leaves the SPMD program early: every rank aborts (:mod:`proofs.probe.mpi`)
==============  ===========================================================================================

``threads``, ``jax`` and ``bombs`` run in child processes (:mod:`proofs.probe.children`), so that a crash or a
hang counts against its input. ``python -m proofs.probe [--seed N] [--quick] [CATEGORY ...]`` prints, per
category, the inputs tried and passed, the count of each outcome, the largest of its measures and each
failure with a reproducer, and exits 1 on any failure; ``python -m proofs probe`` runs it among the proofs.
"""

from __future__ import annotations

import time
from typing import Callable

from proofs.probe import cli, mpi, plan_files, text, verdicts
from proofs.probe.children import probe_in_children
from proofs.probe.tally import Tally

CATEGORIES: dict[str, Callable[[int, bool], Tally]] = {
    "text": text.probe,
    "plan_files": plan_files.probe,
    "sequences": verdicts.probe_sequences,
    "claims": verdicts.probe_claims,
    "threads": lambda seed, quick: probe_in_children("threads", seed, quick),
    "jax": lambda seed, quick: probe_in_children("jax", seed, quick),
    "cli": cli.probe,
    "bombs": lambda seed, quick: probe_in_children("bombs", seed, quick),
    "mpi": mpi.probe,
}


def run(seed: int = 0, quick: bool = False, categories=None,
        progress: Callable[[str], None] | None = None) -> list[Tally]:
    """The tallies of ``categories`` (default: all), each timed; ``progress`` is told each category's name as
    it starts."""
    tallies = []
    for name in categories or CATEGORIES:
        if progress is not None:
            progress(name)
        t0 = time.perf_counter()
        tally = CATEGORIES[name](seed, quick)
        tally.seconds = time.perf_counter() - t0
        tallies.append(tally)
    return tallies


def report(tallies: list[Tally]) -> str:
    """A table of the tallies (inputs tried, passed, failed, time, outcomes), then their notes, the largest of
    their measures and every failure."""
    lines = [f"{'category':<11} {'tried':>6} {'passed':>6} {'failed':>6} {'time':>7}  outcomes"]
    for t in tallies:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(t.outcomes.items(), key=lambda kv: -kv[1]))
        lines.append(f"{t.name:<11} {t.tried:>6} {t.passed:>6} {len(t.failures):>6} {t.seconds:>6.1f}s  {outcomes}")
    tried, failed = sum(t.tried for t in tallies), sum(len(t.failures) for t in tallies)
    lines.append(f"{'total':<11} {tried:>6} {tried - failed:>6} {failed:>6} {sum(t.seconds for t in tallies):>6.1f}s")
    lines += [f"note: {n}" for t in tallies for n in t.notes]
    lines += [f"largest: {t.name}: {measure} {value:.3g} ({where if len(where) <= 120 else where[:117] + '...'})"
              for t in tallies for measure, (value, where) in t.peaks.items()]
    lines += [f"FAILURE ({t.name}): {f}" for t in tallies for f in t.failures]
    return "\n".join(lines)
