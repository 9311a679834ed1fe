"""Scale: synthesis, accounting, lowering and verification on meshes of 8 to 65,536 devices.

Method. Groups of pairs, each group in a fresh Python process (so that its peak memory is its own):

- random groups: ``--pairs`` (20) seeded pairs of :mod:`redist.testing`'s generator on each mesh of
  :data:`MESHES` (8, 64, 105 = 3x5x7, 216 = 6x6x6, 512, 4,096, 8,192 and 65,536 devices, 8 to 16 axes of
  size 2 among them), ranks 1 to the mesh's ``max_rank`` (4, or 8 on the meshes of axes of size 2), sources
  partial over some axes (30%), sub-axes (30% of the splittable axes) and uneven dims (30% of the pairs);
- named groups: each pair of :data:`NAMED` (large transposes, rank-8 shifts, uneven exchanges, permutes) alone, and
  each of :data:`HARD_TO_VERIFY` (the plans the verifier found slowest, rarely drawn at random) alone.

For each pair, every ``functools`` cache of ``redist`` is cleared, then each of these is timed with
``time.perf_counter``: ``synthesize``; ``lower_bound_bytes``; ``bytes_received`` of a fresh
``Plan.from_steps`` of the plan's steps (the accounting alone: typing rules, per-step and per-device bytes);
``plan.program`` of that plan (lowering); and ``verify(plan, timeout_s=30)``. ``rss_mb`` is the process's
peak resident set (``bench/memory.py``) after parsing, synthesizing and lowering every pair of the
group, before any verification (imports included); ``rss_verify_mb`` the peak after verifying them too.
``bytes/bound`` is ``bytes_received / lower_bound_bytes`` over pairs whose bound is not zero (geometric mean and
max; ``no-red max``: the max over the pairs that reduce no pending sum). The bound is attainable without
reductions (one exchange receives it); with sums to reduce over ``k`` devices it counts one value per element a
device ends with, while a reduction receives about ``(k−1)/k`` of the buffer it reduces, so there the ratio
grows with ``k`` and says nothing about the plan's quality at scale. A pair whose synthesis and lowering run
past ``--pair-timeout`` (60 s) is recorded as a timeout. The growth exponent of a phase is the slope of a
least-squares fit of log(median time) against log(devices) over the random groups.

Output: a table on stdout (progress bars on stderr while running, on a terminal), JSON in
``bench/results/scale.json`` and a PNG of median time against devices on log axes
(``bench/results/scale_time.png``, drawn by ``bench/plots.py``). ``--quick`` runs three small groups and one
named pair with 3 pairs each in this process (a smoke test) and writes only where ``--out``
says.

    python bench/scale.py [--pairs 20] [--seed 0] [--quick] [--out PATH.json] [--no-progress]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import memory, progress  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "scale.json")
VERIFY_TIMEOUT_S = 30.0


def _two(n: int) -> str:
    return ",".join(f"a{i}=2" for i in range(n))


MESHES = {  # label: (mesh, max_rank)
    "2x2x2": ("x=2,y=2,z=2", 4),
    "4x4x4": ("x=4,y=4,z=4", 4),
    "3x5x7": ("x=3,y=5,z=7", 4),
    "6x6x6": ("x=6,y=6,z=6", 4),
    "8x8x8": ("x=8,y=8,z=8", 4),
    "16x16x16": ("dp=16,fsdp=16,tp=16", 4),
    "2^12": (_two(12), 8),
    "2x16x16x16": ("pp=2,dp=16,fsdp=16,tp=16", 4),
    "256x256": ("x=256,y=256", 4),
    "2^16": (_two(16), 8),
}


def _rank8_shift(n_axes: int, shift: int, size: int = 16) -> tuple[str, str, str]:
    """Rank 8 over ``n_axes`` axes of size 2 (dealt out to the dims in turn), each dim's axes moved ``shift``
    dims on."""
    dims = [[f"a{j}" for j in range(n_axes) if j % 8 == i] for i in range(8)]

    def text(ds):
        return "f32[" + ", ".join(f"{size}{{{','.join(d)}}}" if d else str(size) for d in ds) + "]"

    return _two(n_axes), text(dims), text([dims[(i + shift) % 8] for i in range(8)])


NAMED = {  # label: (mesh, src, dst)
    "transpose 256x256": ("x=256,y=256", "f32[4096{x}, 4096{y}]", "f32[4096{y}, 4096{x}]"),
    "transpose 1000x1000": ("x=1000,y=1000", "f32[4000{x}, 4000{y}]", "f32[4000{y}, 4000{x}]"),
    "rank 8 on 8 axes": _rank8_shift(8, 1),
    "rank 8 on 12 axes": _rank8_shift(12, 3),
    "rank 8 on 16 axes": _rank8_shift(16, 1),
    "6-axis shift (64)": (_two(6), "f32[64{a0,a1}, 64{a2,a3}, 64{a4,a5}]", "f32[64{a1,a2}, 64{a3,a4}, 64{a5,a0}]"),
    "5-axis shift": ("dp=4,fsdp=4,tp=4,sp=4,ep=4", "bf16[4096{dp,fsdp}, 1024{tp,sp}, 128{ep}]",
                     "bf16[4096{fsdp,tp}, 1024{sp,ep}, 128{dp}]"),
    "uneven exchange 256": ("x=16,y=16", "f32[1000{x}]", "f32[1000{y,x}]"),
    "uneven exchange 1024": ("x=32,y=32", "f32[4000{x}]", "f32[4000{y,x}]"),
    "uneven exchange 4096": ("x=64,y=64", "f32[70000{x}]", "f32[70000{y,x}]"),
    "permute 4096": ("dp=16,fsdp=16,tp=16", "f32[4096{dp}, 1024{fsdp,tp}]", "f32[4096{tp}, 1024{dp,fsdp}]"),
    "permute 4096 sub-axes": ("dp=16,fsdp=16,tp=16", "f32[4096{dp,fsdp:(1)4}, 1024{tp}]",
                              "f32[4096{tp,fsdp:(4)4}, 1024{dp}]"),
    "x=8,y=8,z=16 {x,y}->{y,z}": ("x=8,y=8,z=16", "f32[128{x,y}]", "f32[128{y,z}]"),
    "x=4,y=8,z=8 {x,y}->{y,z}": ("x=4,y=8,z=8", "f32[64{x,y}]", "f32[64{y,z}]"),
}

# Plans that random groups rarely draw and that are the slowest known to verify: exchanges with thousands of
# segments per block, and a group sum before one.
HARD_TO_VERIFY = {  # label: (mesh, src, dst)
    "verify: 2,048 segments per block": ("x=256,y=256", "f32[65536{y,x}, 128]",
                                         "f32[65536{y:(2)32}, 128{x:(16)8,x:(4)4,x:(2)2,x:(1)2}]"),
    "verify: uneven, sub-axes": ("x=256,y=256", "f32[76756{x:(4)32,x:(2)2,y:(4)32}, 2, 3{x:(128)2,y:(128)2}]",
                                 "f32[76756{y,x}, 2, 3]"),
    "verify: sum, then exchange": ("x=256,y=256",
                                   "f32[74160{y:(1)4,y:(8)2,x:(16)16,x:(1)2,y:(4)2}] partial{x:(2)8}",
                                   "f32[74160{x:(4)4,y:(2)2,y:(32)2,y:(1)2,x:(16)16,x:(1)2,y:(64)4,x:(2)2,y:(4)8}]"),
}

QUICK = ["2x2x2", "3x5x7", "4x4x4", "transpose 256x256"]


class _PairTimeout(BaseException):
    """Raised by the alarm in a pair that runs too long (a BaseException: no ``except Exception`` swallows
    it)."""


def _clear_caches() -> None:
    """Clear every ``functools`` cache of the library, so that each pair is timed cold."""
    for name, module in list(sys.modules.items()):
        if name == "redist" or name.startswith("redist."):
            for value in vars(module).values():
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()


def _timed(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def _pairs(label: str, n: int, seed: int):
    """The pairs of one group: the named pair, or ``n`` seeded random pairs of rank 1 or more."""
    import random

    import redist
    from redist.testing import SeededDraw, draw_pair

    if label in NAMED or label in HARD_TO_VERIFY:
        mesh_text, a, b = {**NAMED, **HARD_TO_VERIFY}[label]
        mesh = redist.Mesh.parse(mesh_text)
        return [(redist.ShardingType.parse(a, mesh), redist.ShardingType.parse(b, mesh))]
    mesh_text, max_rank = MESHES[label]
    mesh = redist.Mesh.parse(mesh_text)
    draw = SeededDraw(random.Random(f"{seed}/{label}"))
    out = []
    while len(out) < n:
        src, dst = draw_pair(draw, mesh, max_rank=max_rank, partial=0.3, sub_axes=0.3, uneven=0.3,
                             padded=False, empty_dims=False)
        if src.rank:
            out.append((src, dst))
    return out


def _measure_one(src, dst, pair_timeout_s: float) -> tuple[dict, object]:
    """Time synthesis, the bound, the accounting and the lowering of one pair; the row and the plan (None on a
    timeout)."""
    import redist

    from redist.axes import remove_axes

    row = {"mesh": str(src.mesh), "devices": src.mesh.size, "src": str(src), "dst": str(dst), "rank": src.rank,
           "reduces": src.mesh.group_size(remove_axes(src.partial, dst.partial)) > 1}
    signal.alarm(max(1, math.ceil(pair_timeout_s)))
    try:
        _clear_caches()
        plan, row["synthesize_s"] = _timed(lambda: redist.synthesize(src, dst))
        _clear_caches()
        bound, row["lower_bound_s"] = _timed(lambda: redist.lower_bound_bytes(src, dst))
        fresh = redist.Plan.from_steps(src, plan.steps)
        received, row["bytes_received_s"] = _timed(lambda: fresh.bytes_received)
        program, row["lowering_s"] = _timed(lambda: fresh.program)
    except _PairTimeout:
        row["timeout"] = True
        return row, None
    finally:
        signal.alarm(0)
    row.update(steps=[s.kind for s in plan.steps], instructions=len(program.instructions),
               bytes_received=received, lower_bound=bound, ratio=received / bound if bound else None)
    return row, plan


def run_group(label: str, n: int, seed: int, pair_timeout_s: float, shown: bool = True) -> dict:
    """Every pair of one group: the rows, the peak memory before and after verification; ``shown``: progress
    bars of the group's pairs (:mod:`bench.progress`)."""
    import redist

    def alarm(*_):
        raise _PairTimeout

    signal.signal(signal.SIGALRM, alarm)
    pairs = _pairs(label, n, seed)
    rows, plans = [], []
    for src, dst in progress.bar(pairs, desc=f"{label}: plan", unit="pair", shown=shown, leave=False):
        row, plan = _measure_one(src, dst, pair_timeout_s)
        rows.append(row)
        plans.append(plan)
    rss = memory.peak_rss_mb()
    for row, plan in progress.bar(list(zip(rows, plans)), desc=f"{label}: verify", unit="plan", shown=shown,
                                  leave=False):
        if plan is not None:
            v = redist.verify(plan, timeout_s=VERIFY_TIMEOUT_S)
            row.update(verify_s=v.seconds, verify=v.status)
    return {"label": label, "named": label in NAMED or label in HARD_TO_VERIFY, "devices": pairs[0][0].mesh.size,
            "mesh": str(pairs[0][0].mesh), "rows": rows, "rss_mb": rss,
            "rss_verify_mb": memory.peak_rss_mb()}


PHASES = ("synthesize_s", "lower_bound_s", "bytes_received_s", "lowering_s", "verify_s")


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {}
    return {"median": statistics.median(xs), "p99": xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)],
            "max": xs[-1]}


def summarize(group: dict) -> dict:
    rows = group["rows"]
    out = {k: group[k] for k in ("label", "named", "devices", "mesh", "rss_mb", "rss_verify_mb")}
    out["pairs"] = len(rows)
    out["timeouts"] = sum(bool(r.get("timeout")) for r in rows)
    for phase in PHASES:
        out[phase] = _stats([r[phase] for r in rows if phase in r])
    out["plan_and_lower_max_s"] = max((r["synthesize_s"] + r["lowering_s"] for r in rows if "lowering_s" in r),
                                      default=None)
    out["verify"] = {s: sum(r.get("verify") == s for r in rows) for s in ("proved", "refuted", "undecided")}
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    out["ratio_geomean"] = math.exp(statistics.fmean(map(math.log, ratios))) if ratios else None
    out["ratio_max"] = max(ratios, default=None)
    out["ratio_max_no_reduction"] = max((r["ratio"] for r in rows if r.get("ratio") and not r["reduces"]), default=None)
    out["ratio_max_reduction"] = max((r["ratio"] for r in rows if r.get("ratio") and r["reduces"]), default=None)
    out["synthesize_rank_le_4_s"] = _stats([r["synthesize_s"] for r in rows if "synthesize_s" in r and r["rank"] <= 4])
    return out


def growth(summaries: list[dict]) -> dict:
    """Per phase, the slope of log(median seconds) against log(devices) over the random groups."""
    import numpy as np

    out = {}
    for phase in PHASES:
        pts = [(s["devices"], s[phase]["median"]) for s in summaries
               if not s["named"] and s[phase] and s[phase]["median"] > 0]
        if len({d for d, _ in pts}) >= 2:
            x, y = np.log([d for d, _ in pts]), np.log([t for _, t in pts])
            out[phase] = float(np.polyfit(x, y, 1)[0])
    return out


def targets(summaries: list[dict]) -> list[tuple[str, str, bool]]:
    """The benchmark's targets: (target, measured, met)."""
    at_4096 = [s for s in summaries if not s["named"] and s["devices"] == 4096 and s["synthesize_s"]]
    out = []
    for s in at_4096:
        syn = s["synthesize_rank_le_4_s"]
        out.append((f"{s['label']} (4,096), pairs of rank <= 4: synthesis median <= 20 ms, max <= 1 s",
                    f"{syn['median'] * 1e3:.1f} ms / {syn['max']:.2f} s", syn["median"] <= 0.02 and syn["max"] <= 1))
        ver = s["verify_s"]
        if ver:
            out.append((f"{s['label']}: verify median <= 2 s", f"{ver['median']:.2f} s", ver["median"] <= 2))
    random_groups = [s for s in summaries if not s["named"] and s["ratio_max_no_reduction"]]
    small = max((s["ratio_max_no_reduction"] for s in random_groups if s["devices"] <= 8), default=None)
    large = max((s["ratio_max_no_reduction"] for s in random_groups if s["devices"] >= 4096), default=None)
    if small is not None and large is not None:
        out.append(("bytes/bound at 4,096+ devices no worse than on 8 (pairs without sums to reduce: max)",
                    f"{large:.2f} at scale, {small:.2f} on 8 devices", large <= small))
    for s in summaries:
        if s["label"] in NAMED:
            limit = 2.0 if s["label"] == "rank 8 on 16 axes" else 1.0
            got = s["plan_and_lower_max_s"]
            out.append((f"{s['label']}: synthesis + lowering <= {limit:g} s",
                        "timeout" if got is None else f"{got:.3f} s", got is not None and got <= limit))
    worst = max((s["verify_s"]["max"] for s in summaries if s["verify_s"]), default=0.0)
    undecided = sum(s["verify"]["undecided"] + s["verify"]["refuted"] for s in summaries)
    out.append(("verify <= 30 s for every plan up to 65,536 devices, all proved",
                f"max {worst:.2f} s, {undecided} not proved", worst <= 30 and not undecided))
    rss = max(s["rss_mb"] for s in summaries)
    out.append(("parse, synthesize, lower: a few hundred MB (<= 500 MB peak RSS, imports included)",
                f"max {rss:.0f} MB", rss <= 500))
    return out


def _worker(label: str, n: int, seed: int, pair_timeout_s: float, shown: bool) -> int:
    json.dump(run_group(label, n, seed, pair_timeout_s, shown), sys.stdout)
    return 0


def _in_subprocess(label: str, n: int, seed: int, pair_timeout_s: float, shown: bool) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", label, "--pairs", str(n), "--seed", str(seed),
           "--pair-timeout", str(pair_timeout_s)] + ([] if shown else ["--no-progress"])
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout)


def _print(summaries: list[dict], slopes: dict, checks: list) -> None:
    head = f"{'group':<28}{'dev':>7}{'n':>4}  {'synth med/p99/max ms':<24}{'lower med/max ms':<18}" \
           f"{'verify med/max s':<18}{'bytes/bound':<13}{'no-red max':<11}{'RSS MB':>7}"
    print(head)
    for s in summaries:
        syn, low, ver = s["synthesize_s"], s["lowering_s"], s["verify_s"]
        fmt = lambda d, k=1e3, p=1: f"{d['median'] * k:.{p}f}/{d['max'] * k:.{p}f}" if d else "-"  # noqa: E731
        synth = f"{syn['median'] * 1e3:.1f}/{syn['p99'] * 1e3:.1f}/{syn['max'] * 1e3:.0f}" if syn else "-"
        ratio = f"{s['ratio_geomean']:.2f}/{s['ratio_max']:.2f}" if s["ratio_geomean"] else "-"
        exact = f"{s['ratio_max_no_reduction']:.2f}" if s["ratio_max_no_reduction"] else "-"
        print(f"{s['label']:<28}{s['devices']:>7}{s['pairs']:>4}  {synth:<24}{fmt(low):<18}{fmt(ver, 1, 2):<18}"
              f"{ratio:<13}{exact:<11}{s['rss_mb']:>7.0f}" + (f"  ({s['timeouts']} timeouts)" if s["timeouts"] else ""))
    print("growth exponents (slope of log median time vs log devices, random groups): "
          + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in slopes.items()))
    for target, got, met in checks:
        print(f"{'ok  ' if met else 'MISS'} {target}: {got}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pair-timeout", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    progress.add_option(ap)
    args = ap.parse_args(argv)
    shown = not args.no_progress
    if args.worker:
        return _worker(args.worker, args.pairs, args.seed, args.pair_timeout, shown)
    if args.quick:
        groups = [run_group(label, 3, args.seed, args.pair_timeout, shown=False) for label in QUICK]
    else:
        labels = list(MESHES) + list(NAMED) + list(HARD_TO_VERIFY)
        groups = [_in_subprocess(label, args.pairs, args.seed, args.pair_timeout, shown)
                  for label in progress.bar(labels, desc="groups", unit="group", shown=shown)]
    summaries = [summarize(g) for g in groups]
    slopes, checks = growth(summaries), targets(summaries)
    _print(summaries, slopes, checks)
    out = args.out or (None if args.quick else RESULTS)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        result = {"method": __doc__.split("Output.")[0].strip(), "machine": platform.platform(),
                  "python": platform.python_version(), "pairs_per_random_group": args.pairs, "seed": args.seed,
                  "summaries": summaries, "growth_exponents": slopes,
                  "targets": [{"target": t, "measured": g, "met": m} for t, g, m in checks],
                  "groups": groups}
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        from bench import plots  # here, not above: the worker processes, whose memory is measured, skip matplotlib

        print(f"wrote {out} and {', '.join(plots.draw('scale', out))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
