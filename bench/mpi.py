"""redist.mpi.reshard against hand-written mpi4py, XLA's collectives replayed, and gather-then-slice.

    python bench/mpi.py [--ranks 2 4 8] [--mib 16 64 256] [--mib-8 16 64 128] [--repeats 7] [--jobs 3] [--quick]
                        [--replot]

For each rank count ``n`` the script launches ``mpiexec -n n python bench/mpi_worker.py CASES OUT`` (the
virtual environment's MPICH) and streams its progress; rank 0 of the job writes the rows, and this driver
prints a table, writes ``bench/results/mpi.json`` and draws ``bench/results/mpi.png``.

Cases (f32; the size is the larger of the source and destination local buffers per rank, ``S`` MiB):

- ``slab``: ``[N{x}, M] -> [N, M{x}]`` on ``x=n`` (pack the chunks, one ``Alltoall``);
- ``pencil``: ``[X, Y{x}, Z{y}] -> [X{x}, Y, Z{y}]`` on ``x=2,y=n/2`` (one ``Alltoall`` per ``x`` group,
  then unpack);
- ``gather``, ``gather_inner``: ``[N{x}, M] -> [N, M]`` and ``[N, M{x}] -> [N, M]`` (``Allgather``, the
  second then interleaving the chunks);
- ``pending_sum``: ``[N, M] partial{x} -> [N{x}, M]`` (``Reduce_scatter_block``);
- ``uneven``: ``[N{x}, M] -> [N, M{x}]`` with ``n`` dividing neither dim (``Alltoallv``).

Contenders, each returning a new array as ``reshard`` does (rank r is device r):

- ``redist``: ``redist.mpi.reshard(local, src, dst)``, the public call with its argument agreement (after the
  first call, a 32-byte verdict started before the plan's transfers and waited for once they are under way: a
  nonblocking neighbourhood all-gather among every rank on at most 32 ranks, an ``Allreduce`` beyond,
  ``redist.backends.mpi_channels.Ballot``); ``program``: the same plan through ``redist.mpi.run_program`` (no
  agreement), which isolates the agreement's cost.
- ``hand``: what a competent mpi4py user writes for the pattern: a persistent packing buffer made once, the
  collective straight into a fresh result where the layout allows (slab, gathers, pending sum), a fresh
  result to unpack into otherwise (pencil, gather_inner, uneven).
- ``xla``: XLA's collective sequence for the same types (``jax.jit(lambda a: a, out_shardings=dst)`` compiled
  on 8 host devices, ``redist.xla_baseline``) replayed by :class:`bench.mpi_replay_worker.Replay` with its
  local copies (the fusions of the entry computation as contiguous copies, cheaper than the transposing
  copies some of them are) and its result in a buffer allocated per call (XLA's CPU runtime returns a new
  buffer per execution; its temporaries stay preallocated, which favours the replay). No replay for
  partial or uneven sources (a JAX array holds neither).
- ``gather_slice``: ``Allgather`` every shard, assemble the global array, copy out the destination block
  (partial sources: ``Allreduce``, then the block); left out where the global array on every rank would not
  fit in memory.

Method: per case, the first call of ``redist`` is timed alone after :func:`redist.mpi.clear_cache` (full agreement,
synthesis, the channel and its sub-communicators, the scratch buffer); then two warm-up calls of every contender
and ``--repeats`` rounds (times ``256 // S`` below 256 MiB, as a millisecond cell's minimum over fewer rounds moves
from run to run by more than the differences it compares), the contenders in a random order per round (the same on
every rank; in a rotation each contender would always follow the same one and pay for what it left behind); each
call is ``Barrier``, time, call, and the round's time of a contender is the maximum over ranks. All of this runs in
``--jobs`` separate ``mpiexec`` jobs per rank count, whose rounds are pooled: on shared cores a millisecond cell's
ratio moves more from one job to the next (where the ranks land, the state of the allocator) than within a job.
Reported: the minimum over all rounds (and the median), per contender the median over rounds of its time divided by
``hand``'s in the same round (``paired``: the two ran moments apart under the same load, so this ratio is steadier
than the ratio of minima on a shared machine, where one quiet round decides a minimum), and the lowest and highest
of the jobs' own ratios of minima. ``redist``, ``program``, ``hand`` and ``gather_slice`` results are checked
exactly against the destination block of the global array (entries are the flat index mod 65521, exact in f32; a
partial source's summands are the array on the ranks at partial coordinate 0 and zeros elsewhere); the replay moves
placeholder data and is not checked. The load average is recorded before and after each job.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
CASES = ("slab", "pencil", "gather", "gather_inner", "pending_sum", "uneven")


# ---------------------------------------------------------------------------------------------- cases
def case_types(name: str, n: int, mib: float) -> tuple[str, str, str]:
    """``(mesh, src, dst)`` texts of case ``name`` on ``n`` ranks with ``mib`` MiB local buffers (f32)."""
    e = int(mib * 2**20) // 4
    m = 4096
    if name == "slab":
        return f"x={n}", f"f32[{e // m * n}{{x}}, {m}]", f"f32[{e // m * n}, {m}{{x}}]"
    if name == "pencil":
        q = n // 2
        y, z = 512, 256 * q
        x = e // (256 * 256)
        return f"x=2,y={q}", f"f32[{x}, {y}{{x}}, {z}{{y}}]", f"f32[{x}{{x}}, {y}, {z}{{y}}]"
    if name == "gather":
        return f"x={n}", f"f32[{e // m}{{x}}, {m}]", f"f32[{e // m}, {m}]"
    if name == "gather_inner":
        return f"x={n}", f"f32[{e // m}, {m}{{x}}]", f"f32[{e // m}, {m}]"
    if name == "pending_sum":
        return f"x={n}", f"f32[{e // m}, {m}] partial{{x}}", f"f32[{e // m}{{x}}, {m}]"
    if name == "uneven":
        rows = e // m * n - 1
        return f"x={n}", f"f32[{rows}{{x}}, {m - 1}]", f"f32[{rows}, {m - 1}{{x}}]"
    raise ValueError(name)


def entry_sequence(hlo: str, collectives) -> list[dict]:
    """XLA's collectives and local copies in schedule order: the entry computation's instructions, each a
    collective of ``collectives`` (by name) or, for a fusion, copy or transpose, ``{"kind": "copy"}`` with its
    result shapes."""
    import re

    by_name = {c.name: c.to_dict() for c in collectives}
    body = hlo[hlo.index("\nENTRY"):]
    body = body[: body.index("\n}")]
    seq = []
    for line in body.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\([^()]*\)|\S+) ([\w\-]+)\(", line)
        if not m:
            continue
        name, shape, opcode = m.groups()
        if name in by_name:
            seq.append(by_name[name])
        elif opcode in ("fusion", "copy", "transpose"):
            dims = re.match(r"\w+\[([\d,]*)\]", shape)
            seq.append({"kind": "copy", "result_shapes": [[int(d) for d in dims.group(1).split(",") if d]]})
    return seq


def build_cases(ranks: list[int], sizes: dict[int, list[int]]) -> list[dict]:
    """Every case for every rank count and size, with XLA's sequence where JAX can express the types."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    import redist
    from redist import xla_baseline as xb

    cases = []
    for n in ranks:
        for mib in sizes[n]:
            for name in CASES:
                mesh_text, a, b = case_types(name, n, mib)
                mesh = redist.Mesh.parse(mesh_text)
                src, dst = (redist.ShardingType.parse(t, mesh) for t in (a, b))
                xla = None
                if not src.partial and name != "uneven":
                    comp = xb.compile_xla(src, dst)
                    xla = entry_sequence(comp.hlo, comp.collectives)
                cases.append({"name": name, "ranks": n, "mib": mib, "mesh": mesh_text, "src": a, "dst": b,
                              "xla": xla})
    return cases


# ---------------------------------------------------------------------------------------------- driver
def run_jobs(cases: list[dict], ranks: list[int], repeats: int, jobs: int, timeout: int) -> list[dict]:
    """Run the cases of each rank count in ``jobs`` separate ``mpiexec`` jobs (the rank counts in turn, job
    ``j`` ordering its rounds with seed ``j``), and merge each case's runs (:func:`merged`)."""
    mpiexec = os.path.join(sys.prefix, "bin", "mpiexec")
    env = dict(os.environ, PYTHONPATH=ROOT)
    runs: dict[int, list[list[dict]]] = {n: [] for n in ranks}
    with tempfile.TemporaryDirectory() as tmp:
        for n in ranks:
            with open(os.path.join(tmp, f"cases{n}.json"), "w") as f:
                json.dump([c for c in cases if c["ranks"] == n], f)
        for job in range(jobs):
            for n in ranks:
                cin, cout = os.path.join(tmp, f"cases{n}.json"), os.path.join(tmp, f"out{n}.json")
                cmd = [mpiexec, "-n", str(n), sys.executable, os.path.join(ROOT, "bench", "mpi_worker.py"), cin,
                       cout, "--repeats", str(repeats), "--seed", str(job)]
                print(f"[mpi -n {n}] job {job + 1}/{jobs}", flush=True)
                load = os.getloadavg()
                proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, stdout=sys.stdout, stderr=sys.stderr)
                if proc.returncode != 0:
                    raise SystemExit(f"mpiexec -n {n} failed (exit {proc.returncode})")
                with open(cout) as f:
                    got = json.load(f)
                for row in got:
                    row["load_before"], row["load_after"] = load, os.getloadavg()
                runs[n].append(got)
    return [merged(list(same)) for n in ranks for same in zip(*runs[n])]


def merged(runs: list[dict]) -> dict:
    """One case's row from its runs in separate jobs: every round of every job pooled (``min_s``, ``median_s``,
    ``paired_over_hand``: the median over rounds of a contender's time over ``hand``'s in the same round), and
    the spread between jobs (``redist_over_hand_per_job``: each job's ratio of minima); the first call's extra
    cost is the median over jobs of its time less the pooled minimum."""
    first = runs[0]
    times = {k: [t for r in runs for t in r["times_s"][k]] for k in first["times_s"]}
    best = {k: min(ts) for k, ts in times.items()}
    first_call = statistics.median(r["first_call_s"] for r in runs)
    return {**{k: first[k] for k in ("name", "ranks", "mib", "mesh", "src", "dst", "steps")},
            "correct": {k: all(r["correct"][k] for r in runs) for k in first["correct"]}, "jobs": len(runs),
            "min_s": best, "median_s": {k: statistics.median(ts) for k, ts in times.items()},
            "paired_over_hand": {k: statistics.median(a / b for a, b in zip(ts, times["hand"]))
                                 for k, ts in times.items()},
            "redist_over_hand_per_job": [min(r["times_s"]["redist"]) / min(r["times_s"]["hand"]) for r in runs],
            "first_call_s": first_call, "first_call_extra_s": first_call - best["redist"],
            "load_before": first["load_before"], "load_after": runs[-1]["load_after"], "times_s": times}


def geomean(xs) -> float:
    xs = [x for x in xs if x and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarize(rows: list[dict]) -> dict:
    out = {}
    for n in sorted({r["ranks"] for r in rows}):
        mine = [r for r in rows if r["ranks"] == n]
        hand = [r["min_s"]["redist"] / r["min_s"]["hand"] for r in mine]
        paired = [r["paired_over_hand"]["redist"] for r in mine]
        xla = [r["min_s"]["redist"] / r["min_s"]["xla"] for r in mine if "xla" in r["min_s"]]
        out[f"n{n}"] = {"redist_over_hand_max": max(hand), "redist_over_hand_geomean": geomean(hand),
                        "redist_over_hand_paired_max": max(paired), "redist_over_hand_paired_geomean": geomean(paired),
                        "redist_over_xla_geomean": geomean(xla), "redist_over_xla_max": max(xla, default=None),
                        "all_correct": all(all(r["correct"].values()) for r in mine)}
    return out


def print_table(rows: list[dict]) -> None:
    print(f"\n{'n':>2} {'MiB':>4} {'case':<13}{'redist ms':>10}{'program':>9}{'hand':>9}{'xla':>9}{'g+s':>9}"
          f"{'r/hand':>8}{'paired':>7}{'per job':>11}{'r/xla':>7}{'1st+ms':>8}  load")
    for r in rows:
        t = r["min_s"]
        cell = lambda k: f"{t[k] * 1e3:9.2f}" if k in t else f"{'-':>9}"  # noqa: E731
        rx = f"{t['redist'] / t['xla']:7.2f}" if "xla" in t else f"{'-':>7}"
        print(f"{r['ranks']:>2} {r['mib']:>4} {r['name']:<13}{t['redist'] * 1e3:10.2f}{cell('program')}{cell('hand')}"
              f"{cell('xla')}{cell('gather_slice')}{t['redist'] / t['hand']:8.2f}"
              f"{r['paired_over_hand']['redist']:7.2f}"
              f"{min(r['redist_over_hand_per_job']):6.2f}-{max(r['redist_over_hand_per_job']):.2f}{rx}"
              f"{r['first_call_extra_s'] * 1e3:8.1f}  {r['load_before'][0]:.1f}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({r["ranks"] for r in rows})
    fig, axes = plt.subplots(1, len(ranks), figsize=(5 * len(ranks), 4.5), squeeze=False)
    for ax, n in zip(axes[0], ranks):
        mine = [r for r in rows if r["ranks"] == n]
        labels = [f"{r['name']} {r['mib']}" for r in mine]
        y = np.arange(len(mine))
        for off, (key, colour) in zip((-0.2, 0.2), (("hand", "#2ca02c"), ("xla", "#ff7f0e"))):
            ratios = [r["min_s"]["redist"] / r["min_s"][key] if key in r["min_s"] else np.nan for r in mine]
            ax.barh(y + off, ratios, height=0.4, color=colour, label=f"redist / {key}")
        ax.axvline(1.0, color="k", lw=0.8)
        ax.axvline(1.1, color="grey", lw=0.8, ls="--")
        ax.set_yticks(y, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"mpiexec -n {n} (2 cores)")
        ax.set_xlabel("time ratio (< 1: redist faster)")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--mib", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--mib-8", type=int, nargs="+", default=[16, 64, 128],
                    help="sizes at -n 8 (8 ranks of 256 MiB with every contender's buffers do not fit in 24 GiB)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=3, help="separate mpiexec jobs per rank count, their rounds pooled")
    ap.add_argument("--quick", action="store_true", help="1 MiB, -n 2 and 4, 3 rounds (a smoke run)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "mpi.json"))
    ap.add_argument("--replot", action="store_true", help="only draw the PNG from the saved JSON (--out)")
    args = ap.parse_args(argv)
    if args.replot:
        with open(args.out) as f:
            plot(json.load(f)["cases"], os.path.splitext(args.out)[0] + ".png")
        return
    if args.quick:
        args.ranks, args.mib, args.mib_8, args.repeats, args.jobs = [2, 4], [1], [1], 3, 1
    sizes = {n: (args.mib_8 if n == 8 else args.mib) for n in args.ranks}
    t0 = time.time()
    cases = build_cases(args.ranks, sizes)
    rows = run_jobs(cases, args.ranks, args.repeats, args.jobs, timeout=3600)
    print_table(rows)
    summary = summarize(rows)
    for key, s in summary.items():
        print(key, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "seconds": time.time() - t0, "cores": os.cpu_count(),
                   "repeats": args.repeats, "jobs": args.jobs, "summary": summary, "cases": rows}, f, indent=1)
    plot(rows, os.path.splitext(args.out)[0] + ".png")


if __name__ == "__main__":
    main()
