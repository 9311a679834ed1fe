"""How long CI takes: ``.ci/run`` from a clean clone of the current commit, timed, its pytest summaries read.

    ./dev bench ci_times            # clone HEAD into a temporary folder, run .ci/run there, record the times

Method: ``git clone`` of the checkout's HEAD into a fresh temporary folder (no venv, nothing cached), then
``.ci/run`` there under wall-clock timing; the two pytest summaries it prints (the whole suite on the newest
JAX, then the tests that meet JAX's API on the lowest) give each pass's test count and pytest's own duration. The
record (commit, date, counts, seconds, the machine's cores and load average at the start) is appended to
``bench/results/ci_times.json``, which the benchmarks page (``bench/report.py``) shows.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
OUT = os.path.join(BENCH, "results", "ci_times.json")
SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<seconds>[\d.]+)s", re.M)


def passes(log: str) -> list[dict]:
    """Each pytest summary line of ``log``: its counts by outcome and its duration in seconds."""
    out = []
    for m in SUMMARY.finditer(log):
        counts = {k: int(n) for n, k in (c.split() for c in m["counts"].split(", "))}
        out.append({"counts": counts, "seconds": float(m["seconds"])})
    return out


def main() -> int:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    record = {"commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        clone = os.path.join(tmp, "clone")
        subprocess.run(["git", "clone", "--quiet", ROOT, clone], check=True)
        start = time.perf_counter()
        proc = subprocess.run([os.path.join(clone, ".ci", "run")], cwd=clone, capture_output=True, text=True)
        record["total_s"] = round(time.perf_counter() - start, 1)
    record["returncode"] = proc.returncode
    record["passes"] = passes(proc.stdout)
    history = json.load(open(OUT)) if os.path.exists(OUT) else {"method": __doc__.split("Method: ")[1].strip(),
                                                                   "runs": []}
    history["runs"].append(record)
    with open(OUT, "w") as f:
        json.dump(history, f, indent=1)
        f.write("\n")
    print(json.dumps(record, indent=1))
    if proc.returncode:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
