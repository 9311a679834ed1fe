"""``redist.execute(plan, shards, backend="jax")``: the first call of a plan against its later calls, and
against the numpy backend.

The JAX backend compiles a plan's program once per plan and device placement and keeps it
(``redist.backends.jax_backend.on_devices``), so a later call of the plan only places the buffers on the
devices, dispatches and reads the results back. Cases (``CASES``): on 8 host CPU devices, uneven types (the
types ``redist.jax.reshard`` cannot take, for which the docs recommend this path), a swap of two axes, a
reduce-scatter of a pending sum, a 64-bit plan and a plan over a sub-axis.

Per case, the plan is synthesized first (not timed) and the caches of ``redist.jax`` are cleared; then the
first call (tracing, compile and run), and ``--calls`` later calls, each on newly made buffers of the same
values, each timed with ``time.perf_counter`` around ``execute`` (which returns numpy arrays, so the run has
ended); the numpy backend's calls are timed alike. Every result is checked against the value. Medians of
the later calls are compared: ``first / later`` is the saving of the cache (the target: at least 10).

The machine's load average is recorded before and after (``os.getloadavg``). Outputs: a table on stdout and
``bench/results/execute_jax.json``.

    python bench/execute_jax.py [--calls 7] [--out PATH]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

import redist  # noqa: E402
import redist.jax  # noqa: E402
from redist.data import random_array, summands  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "execute_jax.json")
CASES = [
    # (name, mesh, source, destination)
    ("vocabulary 50257 over 4 (uneven)", "x=4,y=2", "f32[50257{x}, 8]", "f32[50257, 8{x}]"),
    ("uneven blocks, axes reordered", "x=2,y=4", "f32[1000{x,y}, 64]", "f32[1000{y,x}, 64]"),
    ("swap the axes of two dims", "x=2,y=4", "f32[256{x}, 256{y}]", "f32[256{y}, 256{x}]"),
    ("reduce-scatter a pending sum", "x=2,y=4", "f32[256, 256] partial{x}", "f32[256{x}, 256]"),
    ("64-bit, all-to-all", "x=8", "f64[256{x}, 128]", "f64[256, 128{x}]"),
    ("needs a sub-axis of y", "x=2,y=4", "f32[4096{x}]", "f32[4096{y}]"),
]


def _timed(plan, value, backend: str) -> float:
    """Seconds of one ``execute`` on new buffers holding ``value``; the result checked."""
    shards = summands(plan.src, value, np.random.default_rng(1)) if plan.src.partial else redist.shard(plan.src, value)
    t0 = time.perf_counter()
    out = redist.execute(plan, shards, backend=backend)
    seconds = time.perf_counter() - t0
    if not np.array_equal(redist.unshard(plan.dst, out), value):
        raise SystemExit(f"{backend}: wrong result for {plan.src} -> {plan.dst}")
    return seconds


def measure(name: str, mesh_text: str, a: str, b: str, calls: int) -> dict:
    mesh = redist.Mesh.parse(mesh_text)
    plan = redist.synthesize(redist.ShardingType.parse(a, mesh), redist.ShardingType.parse(b, mesh))
    value = random_array(np.random.default_rng(0), plan.src.shape, plan.src.np_dtype, -8, 9)
    redist.jax.clear_cache()
    first = _timed(plan, value, "jax")
    later = [_timed(plan, value, "jax") for _ in range(calls)]
    numpy = [_timed(plan, value, "numpy") for _ in range(calls)]
    return {"name": name, "mesh": mesh_text, "src": a, "dst": b, "steps": [s.kind for s in plan.steps],
            "first_s": first, "later_median_s": statistics.median(later), "later_s": later,
            "numpy_median_s": statistics.median(numpy),
            "first_over_later": first / statistics.median(later)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=7, help="later calls per case and backend (default 7)")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    if len(jax.devices()) < 8:
        raise SystemExit("needs 8 JAX devices")
    load_before = os.getloadavg()
    rows = [measure(*case, args.calls) for case in CASES]
    ratios = [r["first_over_later"] for r in rows]
    summary = {"first_over_later_min": min(ratios), "first_over_later_median": statistics.median(ratios),
               "at_least_10x_everywhere": min(ratios) >= 10, "calls": args.calls,
               "load_average": {"before": load_before, "after": os.getloadavg()},
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                          f"jax {jax.__version__}, 8 host CPU devices, shared with other jobs"}
    print(f"{'case':<36}{'first s':>9}{'later ms':>10}{'numpy ms':>10}{'first/later':>13}")
    for r in rows:
        print(f"{r['name']:<36}{r['first_s']:>9.3f}{r['later_median_s'] * 1e3:>10.2f}"
              f"{r['numpy_median_s'] * 1e3:>10.2f}{r['first_over_later']:>13.0f}")
    print(f"first / later: min {summary['first_over_later_min']:.0f}, median {summary['first_over_later_median']:.0f}")
    with open(args.out, "w") as fh:
        json.dump({"summary": summary, "cases": rows}, fh, indent=1)
    print(f"wrote {os.path.relpath(args.out)}")
    return summary


if __name__ == "__main__":
    main()
