"""The synthesizer's memory bound and correctness, checked with :func:`redist.verify.verify`.

- exhaustive: every (src, dst) pair of whole-axis types (partial types included, dst.partial ⊆ src.partial)
  of rank 0–3 on every mesh of at most 8 devices (axis sizes >= 2), each dim the smallest size both
  sides divide;
- random: a seeded sample of pairs on 16-device meshes (1–4 axes, sub-axes, partial types, dims up to 3×
  the smallest legal size).

For each pair: the plan is synthesized, ``verify(plan)`` must prove it (values, group sums, peak_bytes and
bytes_received against the instructions), the program's largest buffer (from the verifier's own shape
derivation) must be at most max(src, dst) local bytes (computed here from SPEC 2, not from the type
class), and bytes_received must not beat ``lower_bound_bytes``.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import random
import statistics
import sys
import time

from redist.bounds import lower_bound_bytes
from redist.synthesis import synthesize
from redist.verify import verify


def _local_bytes(t) -> int:
    n = 1
    for size, axes in zip(t.shape, t.dims):
        k = math.prod(t.mesh.axis_size(a) for a in axes)
        n *= size // k
    return n * t.itemsize


def check_pair(pair) -> dict:
    src, dst = pair
    out = {"pair": f"{src.mesh}: {src} -> {dst}", "ok": False, "seconds": 0.0}
    try:
        plan = synthesize(src, dst)
    except Exception as e:  # noqa: BLE001 - any synthesis failure is a finding
        out["error"] = f"synthesize raised {type(e).__name__}: {e}"
        return out
    v = verify(plan)
    out["seconds"] = v.seconds
    if not v.ok:
        out["error"] = f"verify refuted: {v.reason}; counterexample {v.counterexample}"
        return out
    bound = max(_local_bytes(src), _local_bytes(dst))
    if v.details["peak_bytes"] > bound:
        out["error"] = f"memory bound: peak {v.details['peak_bytes']} > max(src, dst) local bytes {bound}"
        return out
    if plan.bytes_received < lower_bound_bytes(src, dst):
        out["error"] = f"bytes_received {plan.bytes_received} below lower_bound_bytes {lower_bound_bytes(src, dst)}"
        return out
    out["ok"] = True
    return out


def _chunk(pairs):
    return [check_pair(p) for p in pairs]


def _run(pairs, workers: int, chunk: int = 64) -> list[dict]:
    chunks = [pairs[i:i + chunk] for i in range(0, len(pairs), chunk)]
    if workers <= 1:
        return [r for c in chunks for r in _chunk(c)]
    with mp.get_context("spawn").Pool(workers) as pool:
        return [r for rs in pool.imap_unordered(_chunk, chunks) for r in rs]


def exhaustive_pairs(max_devices: int = 8, max_rank: int = 3):
    from proofs.common import all_meshes, all_pairs

    out = []
    for mesh in all_meshes(max_devices):
        for rank in range(max_rank + 1):
            out += list(all_pairs(mesh, rank))
    return out


def random_pairs(n: int, seed: int = 0, devices: int = 16):
    from proofs.common import random_mesh, random_pair

    rng = random.Random(seed)
    out = []
    while len(out) < n:
        mesh = random_mesh(rng, max_axes=4, max_devices=devices, min_devices=devices)
        out.append(random_pair(rng, mesh, max_rank=4, partial=0.4, sub_axes=0.25))
    return out


def summarize(name: str, results: list[dict], seconds: float) -> dict:
    fails = [r for r in results if not r["ok"]]
    times = [r["seconds"] for r in results if r["seconds"]]
    return {
        "check": name,
        "cases": len(results),
        "passed": len(results) - len(fails),
        "failed": len(fails),
        "median_verify_s": statistics.median(times) if times else 0.0,
        "max_verify_s": max(times) if times else 0.0,
        "seconds": seconds,
        "failures": fails[:20],
    }


def run_exhaustive(workers: int = 2, max_devices: int = 8, max_rank: int = 3) -> dict:
    t = time.perf_counter()
    pairs = exhaustive_pairs(max_devices, max_rank)
    return summarize(f"exhaustive: all whole-axis pairs, meshes <= {max_devices} devices, rank <= {max_rank}",
                     _run(pairs, workers), time.perf_counter() - t)


def run_random(n: int = 10_000, workers: int = 2, seed: int = 0) -> dict:
    t = time.perf_counter()
    pairs = random_pairs(n, seed)
    return summarize(f"random: {n} pairs on 16-device meshes, rank <= 4 (sub-axes, partial)", _run(pairs, workers),
                     time.perf_counter() - t)


if __name__ == "__main__":
    res = run_exhaustive() if "--random" not in sys.argv else run_random()
    print({k: v for k, v in res.items() if k != "failures"})
    for f in res["failures"]:
        print(f)
    sys.exit(1 if res["failed"] else 0)
