"""How the synthesizer's search scales with the mesh: time, states and bytes against the lower bound.

Method: for each mesh below, ``--pairs`` seeded random even pairs (:func:`redist.testing.draw_pair`: ranks 1 to 4,
or 1 to 8 on the meshes marked so, partial sources, sub-axes with probability 0.25), plus the pairs of ``NAMED``
(large transposes, axis shifts, rank-8 layouts) and four reductions that the automatic partitioner prices on meshes
of 1,024 devices. Each pair is synthesized once with the plan cache cleared, timed in CPU seconds of this process
(``time.process_time``: the search is single-threaded, and other processes on a shared machine do not count):
``synthesize`` is the whole call, ``search`` the time spent inside the searches (``redist.synthesis.search``, which
never enumerates devices; the rest of the call is the typing of the plan, the same at any mesh size). The byte
accounting (``lower_bound_bytes``, ``Plan.bytes_received``) runs after the clock, for the quality figures only (on
meshes of up to 4,096 devices): for pairs without a reduction, the share of plans at the lower bound and the
geometric mean and maximum of bytes / bound. ``states`` is what the searches generated (their budget is
deterministic). Memory: the process's peak resident set (``bench/memory.py``) at the end. Targets: on 4,096 devices with
rank <= 4, synthesis median <= 20 ms and max <= 1 s; every named pair <= 1 s, and <= 2 s for rank 8 on 16 axes;
bytes / bound at scale no worse than on 8 devices; a few hundred MB at most. A progress bar over the pairs is drawn
on stderr while it runs, on a terminal.

    python bench/search_scale.py [--pairs 100] [--seed 0] [--quick] [--no-progress]
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
from bench import memory, progress  # noqa: E402
from redist.synthesis import cases  # noqa: E402
from redist.testing import SeededDraw, draw_pair  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "search_scale.json")
# The quality figures are taken on meshes of at most this many devices: the byte accounting costs more per pair
# on larger ones.
_QUALITY_DEVICES = 4096


def _twos(n: int) -> dict[str, int]:
    return {f"a{i}": 2 for i in range(n)}


# (name, axes, max rank): the 8-device meshes give the reference bytes / bound.
MESHES = [
    ("2x2x2", {"x": 2, "y": 2, "z": 2}, 4),
    ("2x4", {"x": 2, "y": 4}, 4),
    ("16x16x16", {"dp": 16, "fsdp": 16, "tp": 16}, 4),
    ("8x8x8x8", {"a": 8, "b": 8, "c": 8, "d": 8}, 4),
    ("4x8x8x16", {"a": 4, "b": 8, "c": 8, "d": 16}, 4),
    ("2x16x16x8", {"a": 2, "b": 16, "c": 16, "d": 8}, 4),
    ("64x64", {"x": 64, "y": 64}, 4),
    ("4^6", {f"a{i}": 4 for i in range(6)}, 4),
    ("2^12", _twos(12), 4),
    ("2^8 rank 8", _twos(8), 8),
    ("2^16 rank 8", _twos(16), 8),
]
NAMED = [
    ("transpose 256x256", {"x": 256, "y": 256}, "f32[256{x}, 256{y}]", "f32[256{y}, 256{x}]"),
    ("transpose 1000x1000", {"x": 1000, "y": 1000}, "f32[1000{x}, 1000{y}]", "f32[1000{y}, 1000{x}]"),
    ("x=8,y=8,z=16", {"x": 8, "y": 8, "z": 16}, "f32[128{x,y}]", "f32[128{y,z}]"),
    ("x=4,y=8,z=8", {"x": 4, "y": 8, "z": 8}, "f32[64{x,y}]", "f32[64{y,z}]"),
    ("5-axis shift", {"dp": 2, "fsdp": 2, "tp": 2, "sp": 2, "ep": 2},
     "bf16[4096{dp,fsdp}, 1024{tp,sp}, 128{ep}]", "bf16[4096{fsdp,tp}, 1024{sp,ep}, 128{dp}]"),
    ("5-axis shift 16x16x16x2x2", {"dp": 16, "fsdp": 16, "tp": 16, "sp": 2, "ep": 2},
     "bf16[4096{dp,fsdp}, 1024{tp,sp}, 128{ep}]", "bf16[4096{fsdp,tp}, 1024{sp,ep}, 128{dp}]"),
    ("6-axis shift", _twos(6), "f32[4{a0,a1}, 4{a2,a3}, 4{a4,a5}]", "f32[4{a1,a2}, 4{a3,a4}, 4{a5,a0}]"),
    ("rank 8 on 2^8", _twos(8), "f32[2{a0},2{a1},2{a2},2{a3},2{a4},2{a5},2{a6},2{a7}]",
     "f32[2{a7},2{a0},2{a1},2{a2},2{a3},2{a4},2{a5},2{a6}]"),
    ("rank 8 on 2^16", _twos(16), "f32[8{a0,a1},8{a2,a3},8{a4,a5},8{a6,a7},8{a8,a9},8{a10,a11},8{a12,a13},8{a14,a15}]",
     "f32[8{a15,a0,a2},8{a1,a4},8{a3,a5},8{a6},8{a7,a8,a10},8{a9,a12},8{a11},8{a13,a14}]"),
    ("gather-slice 4096", {"dp": 16, "fsdp": 16, "tp": 16}, "f32[256{dp}, 256{fsdp,tp}, 32]",
     "f32[256{tp,fsdp}, 256, 32{dp}]"),
    # reductions the automatic partitioner prices on large meshes (without the reduction bound, the search over
    # prime atoms would run its whole budget on each)
    ("all-reduce 16x64", {"batch": 16, "model": 64}, "f32[8,16] partial{model}", "f32[8,16]"),
    ("reduce-scatter, all-reduce", {"batch": 16, "model": 64}, "f32[1,1,32] partial{batch,model}",
     "f32[1,1,32{batch}]"),
    ("all-reduce, all-gather", {"dp": 8, "fsdp": 16, "tp": 8}, "f32[64{dp,tp},32,8,32] partial{fsdp}",
     "f32[64{dp},32,8,32]"),
    ("slice, reduce-scatter, AR", {"dp": 8, "fsdp": 16, "tp": 8}, "f32[1024] partial{dp,tp}",
     "f32[1024{fsdp,dp}]"),
]


class _Timed:
    """Wraps ``cases.search``, the searches of ``synthesize``: the seconds and states of every search since the
    last ``reset``."""

    def __init__(self):
        self.inner, self.seconds, self.states = cases.search, 0.0, 0

    def __call__(self, *args, **kw):
        t0 = time.process_time()
        found = self.inner(*args, **kw)
        self.seconds += time.process_time() - t0
        self.states += found.states
        return found

    def reset(self):
        self.seconds, self.states = 0.0, 0


def measure(src, dst, timed: _Timed) -> dict:
    """One cold synthesis of ``src -> dst``: times, states, bytes, bound."""
    cases.searched_plan.cache_clear()
    timed.reset()
    t0 = time.process_time()
    plan = redist.synthesize(src, dst)
    total = time.process_time() - t0
    assert plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)
    row = {"src": str(src), "dst": str(dst), "synthesize_s": total, "search_s": timed.seconds, "states": timed.states,
           "steps": [str(s) for s in plan.steps], "reduces": set(src.partial) != set(dst.partial)}
    if src.mesh.size <= _QUALITY_DEVICES:
        row["bytes"], row["bound"] = plan.bytes_received, redist.lower_bound_bytes(src, dst)
    return row


def _summary(rows) -> dict:
    syn = sorted(r["synthesize_s"] for r in rows)
    search = sorted(r["search_s"] for r in rows)
    exact = [r for r in rows if not r["reduces"] and r.get("bound")]
    ratios = [r["bytes"] / r["bound"] for r in exact]
    return {"pairs": len(rows), "synthesize_median_ms": statistics.median(syn) * 1e3,
            "synthesize_p99_ms": syn[min(len(syn) - 1, int(0.99 * len(syn)))] * 1e3, "synthesize_max_ms": syn[-1] * 1e3,
            "search_median_ms": statistics.median(search) * 1e3, "search_max_ms": search[-1] * 1e3,
            "states_max": max(r["states"] for r in rows), "without_reduction": len(exact),
            "at_bound": sum(r["bytes"] == r["bound"] for r in exact),
            "ratio_geomean": math.exp(statistics.fmean(map(math.log, ratios))) if ratios else 1.0,
            "ratio_max": max(ratios, default=1.0)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="10 pairs per mesh, for a smoke test")
    progress.add_option(ap)
    args = ap.parse_args(argv)
    n = 10 if args.quick else args.pairs
    bar = progress.bar(desc="pairs", total=len(MESHES) * n + len(NAMED), unit="pair", shown=not args.no_progress)
    timed = _Timed()
    cases.search = timed
    out = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                      f"Python {platform.python_version()}", "seed": args.seed, "meshes": {}, "named": []}
    try:
        print(f"{'mesh':<14}{'pairs':>6}{'synth median':>14}{'p99':>9}{'max':>9}{'search max':>12}{'states':>9}"
              f"{'at bound':>10}{'geomean':>9}{'max':>7}   (ms; bytes / bound over pairs without a reduction)")
        for name, axes, max_rank in MESHES:
            mesh = redist.Mesh(axes)
            draw = SeededDraw(random.Random(f"{args.seed}-{name}"))
            rows = []
            for _ in range(n):
                while True:
                    src, dst = draw_pair(draw, mesh, max_rank=max_rank, partial=0.3, sub_axes=0.25,
                                         multipliers=(1, 2, 3))
                    if src.rank:
                        break
                rows.append(measure(src, dst, timed))
                bar.update()
            s = _summary(rows)
            out["meshes"][name] = {"devices": mesh.size, "summary": s, "rows": rows}
            progress.write(f"{name:<14}{n:>6}{s['synthesize_median_ms']:>14.2f}{s['synthesize_p99_ms']:>9.1f}"
                           f"{s['synthesize_max_ms']:>9.1f}{s['search_max_ms']:>12.1f}{s['states_max']:>9}"
                           f"{s['at_bound']:>5}/{s['without_reduction']:<4}{s['ratio_geomean']:>9.3f}"
                           f"{s['ratio_max']:>7.2f}")
        progress.write(f"\n{'named pair':<28}{'devices':>8}{'synth ms':>10}{'search ms':>11}{'states':>8}"
                       f"{'bytes/bound':>13}  plan")
        for name, axes, a, b in NAMED:
            mesh = redist.Mesh(axes)
            row = measure(redist.ShardingType.parse(a, mesh), redist.ShardingType.parse(b, mesh), timed)
            row.update(name=name, devices=mesh.size)
            out["named"].append(row)
            ratio = f"{row['bytes'] / row['bound']:.3f}" if row.get("bound") else "-"
            bar.update()
            progress.write(f"{name:<28}{mesh.size:>8}{row['synthesize_s'] * 1e3:>10.1f}{row['search_s'] * 1e3:>11.1f}"
                           f"{row['states']:>8}{ratio:>13}  {'; '.join(row['steps'])}")
    finally:
        bar.close()
        cases.search = timed.inner
    out["peak_rss_mb"] = memory.peak_rss_mb()
    print(f"\npeak resident set: {out['peak_rss_mb']:.0f} MB")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {os.path.relpath(RESULTS)}")
    return out


if __name__ == "__main__":
    main()
