"""Synthesis speed and plan quality over random pairs.

Method: ``--cases`` (800) seeded random (source, destination) pairs (meshes of 1-4 axes with sizes in
{1, 2, 3, 4, 5, 6, 8} and at most 64 devices, ranks 0-4, partial sources included). Each pair is synthesized
once with every cache cleared first, timed with ``time.perf_counter``; the median is reported. Quality: for
pairs without a reduction (where the bound of docs/spec.md §3 applies as stated), how often ``bytes_received`` equals
``lower_bound_bytes``, and the geometric mean and maximum of their ratio over pairs with a non-zero bound.
Target: median synthesis time <= 1 ms on this machine. A second sample of ``--uneven`` (400) pairs has dims
that need not divide their axes (XLA's padding rule); it reports the same figures and how many plans use
an exchange.

    python bench/synthesis_speed.py [--cases 800] [--uneven 400] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redist  # noqa: E402
from redist.synthesis import cases  # noqa: E402
from bench import plots  # noqa: E402
from bench.random_pairs import random_pair  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "synthesis_speed.json")


def measure(pairs) -> tuple[dict, list]:
    """Synthesize every pair from cold caches; timing and bytes-against-bound figures, and one row per pair."""
    times, ratios, reduce_ratios, rows = [], [], [], []
    equal = exact_cases = exchanges = 0
    for src, dst in pairs:
        cases.searched_plan.cache_clear()
        t0 = time.perf_counter()
        plan = redist.synthesize(src, dst)
        times.append(time.perf_counter() - t0)
        assert plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)
        lb = redist.lower_bound_bytes(src, dst)
        assert plan.bytes_received >= lb
        exchanges += any(s.kind == "exchange" for s in plan.steps)
        if set(src.partial) == set(dst.partial):
            exact_cases += 1
            equal += plan.bytes_received == lb
            if lb:
                ratios.append(plan.bytes_received / lb)
        elif lb:
            reduce_ratios.append(plan.bytes_received / lb)
        rows.append({"mesh": str(src.mesh), "src": str(src), "dst": str(dst), "steps": len(plan.steps),
                     "bytes_received": plan.bytes_received, "lower_bound": lb, "seconds": times[-1]})
    summary = {
        "cases": len(rows),
        "median_ms": statistics.median(times) * 1e3,
        "p90_ms": sorted(times)[int(0.9 * len(times))] * 1e3,
        "max_ms": max(times) * 1e3,
        "pairs_without_reduction": exact_cases,
        "at_lower_bound": equal,
        "ratio_geomean": math.exp(statistics.fmean(map(math.log, ratios))) if ratios else 1.0,
        "ratio_max": max(ratios, default=1.0),
        "pairs_with_reduction": len(rows) - exact_cases,
        "reduction_ratio_geomean": math.exp(statistics.fmean(map(math.log, reduce_ratios))) if reduce_ratios else 1.0,
        "plans_with_exchange": exchanges,
    }
    return summary, rows


def _print(title: str, summary: dict) -> None:
    exact = summary["pairs_without_reduction"]
    print(title)
    print(f"{'  cases':<34}{summary['cases']}")
    print(f"{'  synthesis median / p90 / max':<34}{summary['median_ms']:.3f} / {summary['p90_ms']:.2f} / "
          f"{summary['max_ms']:.1f} ms   (target: median <= 1 ms)")
    print(f"{'  pairs without reduction':<34}{exact}")
    print(f"{'    bytes == lower bound':<34}{summary['at_lower_bound']} "
          f"({100 * summary['at_lower_bound'] / max(1, exact):.1f}%)")
    print(f"{'    bytes / bound, geomean':<34}{summary['ratio_geomean']:.3f}")
    print(f"{'    bytes / bound, max':<34}{summary['ratio_max']:.3f}")
    print(f"{'  pairs with a reduction':<34}{summary['pairs_with_reduction']}  (bound: every element needs one "
          f"value; bytes / bound geomean {summary['reduction_ratio_geomean']:.3f})")
    print(f"{'  plans with an exchange':<34}{summary['plans_with_exchange']}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=800)
    ap.add_argument("--uneven", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    even, even_rows = measure([random_pair(rng) for _ in range(args.cases)])
    uneven, uneven_rows = measure([random_pair(rng, uneven=True) for _ in range(args.uneven)])
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"Python {platform.python_version()}")
    summary = {**even, "seed": args.seed, "machine": machine, "uneven": uneven}
    _print("even dims", even)
    _print("uneven dims (padding)", uneven)
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"summary": summary, "cases": even_rows, "uneven_cases": uneven_rows}, f, indent=1)
    figures = plots.draw("synthesis_speed", RESULTS)
    print(f"wrote {os.path.relpath(RESULTS)} and {', '.join(os.path.relpath(f) for f in figures)}")
    return summary


if __name__ == "__main__":
    main()
