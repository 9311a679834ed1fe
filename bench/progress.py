"""The progress bars of the benchmarks that run for minutes: a tqdm bar over a benchmark's cases on standard
error, drawn where standard error is a terminal and ``--no-progress`` was not given (a log file, a pipe or a
CI job gets none), so that standard output holds the benchmark's table alone.

    ap = argparse.ArgumentParser(...)
    add_option(ap)
    args = ap.parse_args(argv)
    for case in bar(cases, desc="cases", shown=not args.no_progress):
        write(row(measure(case)))          # a line of the table, printed above the bar
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

__all__ = ["add_option", "bar", "write"]


def add_option(parser: argparse.ArgumentParser) -> None:
    """``--no-progress`` on ``parser``: no bar even on a terminal."""
    parser.add_argument("--no-progress", action="store_true",
                        help="draw no progress bar (none is drawn where standard error is not a terminal)")


def bar(iterable=None, *, desc: str, total: int | None = None, unit: str = "case", shown: bool = True,
        leave: bool = True) -> tqdm:
    """A tqdm bar on standard error over ``iterable`` (or of ``total`` steps, advanced by ``update``), drawn
    only if ``shown`` and standard error is a terminal; ``leave=False`` erases it when done."""
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=leave,
                disable=not (shown and sys.stderr.isatty()))


def write(line: str) -> None:
    """Print ``line`` on standard output above any bar being drawn, at once (a log file sees it when it is
    printed, as ``print(..., flush=True)``)."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()
