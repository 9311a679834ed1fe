"""Wall time and memory of ``redist.verify`` with a ``timeout_s`` on 65,536 devices (mesh x=256, y=256).

Method: two plans, each verified with ``timeout_s`` 10 and 60, every (plan, timeout) in a fresh Python process
so that memory figures do not mix: a transpose-like permute (``f32[256{x}, 256{y}] -> f32[256{y}, 256{x}]``,
one ``CollectivePermute`` over every device) and an exchange (``f32[70000{x}] -> f32[70000{y,x}]``, one
``Exchange`` of 35,000 copies). The plan is synthesized and lowered (``plan.program``) before the clock starts;
``wall_s`` is ``time.perf_counter`` around ``verify`` alone; ``rss_before_mb`` is the process's peak resident
set before ``verify`` (plan construction included) and ``rss_peak_mb`` after it (``bench/memory.py``; a peak,
so a verify that needs less than the plan did shows the plan's figure). The target: ``wall_s``
about ``timeout_s`` (the call returns "undecided" or a verdict within it). A progress bar over the runs is
drawn on stderr while it runs, on a terminal.

    python bench/verify_deadline.py [--timeouts 10 60] [--no-progress]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import memory, progress  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "verify_deadline.json")
MESH = {"x": 256, "y": 256}
CASES = {
    "permute": ("f32[256{x}, 256{y}]", "f32[256{y}, 256{x}]"),
    "exchange": ("f32[70000{x}]", "f32[70000{y,x}]"),
}


def measure_one(case: str, timeout_s: float) -> dict:
    """Build the plan of ``case``, then time one ``verify(plan, timeout_s=timeout_s)``."""
    import redist

    mesh = redist.Mesh(MESH)
    src, dst = (redist.ShardingType.parse(t, mesh) for t in CASES[case])
    t0 = time.perf_counter()
    plan = redist.synthesize(src, dst)
    program = plan.program
    build_s = time.perf_counter() - t0
    rss_before = memory.peak_rss_mb()
    t0 = time.perf_counter()
    v = redist.verify(plan, timeout_s=timeout_s)
    wall = time.perf_counter() - t0
    return {"case": case, "timeout_s": timeout_s, "instructions": [type(i).__name__ for i in program.instructions],
            "build_s": build_s, "wall_s": wall, "status": v.status, "reason": v.reason,
            "rss_before_mb": rss_before, "rss_peak_mb": memory.peak_rss_mb()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeouts", type=float, nargs="+", default=[10.0, 60.0])
    ap.add_argument("--one", nargs=2, metavar=("CASE", "TIMEOUT"), help=argparse.SUPPRESS)
    progress.add_option(ap)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one[0], float(args.one[1]))))
        return 0
    rows = []
    runs = [(case, t) for case in CASES for t in args.timeouts]
    for case, t in progress.bar(runs, desc="verify runs", unit="run", shown=not args.no_progress):
        out = subprocess.run([sys.executable, __file__, "--one", case, str(t)], check=True,
                             capture_output=True, text=True)
        rows.append(json.loads(out.stdout.splitlines()[-1]))
        r = rows[-1]
        progress.write(f"{case:<9} timeout_s={t:>4g}  verify {r['wall_s']:6.1f} s  {r['status']:<9}  "
                       f"peak RSS {r['rss_peak_mb']:6.0f} MB (before verify {r['rss_before_mb']:.0f} MB)  "
                       f"{r['reason'][:70]}")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"machine": platform.platform(), "cpus": os.cpu_count(), "mesh": MESH, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
