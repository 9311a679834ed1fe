"""``python -m proofs.probe [--seed N] [--quick] [CATEGORY ...]``: the probe of :mod:`proofs.probe`; exit 1 on any
failure, 2 on a usage error."""

from __future__ import annotations

import argparse
import sys

from proofs.probe import CATEGORIES, report, run
from proofs.probe.children import CHILD_CASES, child_main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proofs.probe",
                                     description="An adversarial probe of redist's public surface (proofs/probe).",
                                     epilog="The quick run takes about a minute on 2 cores, the full one under ten.")
    parser.add_argument("categories", nargs="*", metavar="CATEGORY",
                        help=f"categories to run (default: all): {', '.join(CATEGORIES)}")
    parser.add_argument("--seed", type=int, default=0, help="the seed every input is drawn from (0)")
    parser.add_argument("--quick", action="store_true", help="smaller samples, for a smoke run")
    parser.add_argument("--child", choices=sorted(CHILD_CASES), help=argparse.SUPPRESS)
    parser.add_argument("--cases", default="0:1", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        first, last = map(int, args.cases.split(":"))
        child_main(args.child, args.seed, args.quick, first, last)
        return 0
    unknown = [c for c in args.categories if c not in CATEGORIES]
    if unknown:
        parser.error(f"unknown category {unknown[0]!r}; the categories are {', '.join(CATEGORIES)}")
    tallies = run(args.seed, args.quick, args.categories,
                  progress=lambda name: print(f"probe: {name}", file=sys.stderr, flush=True))
    print(report(tallies))
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
