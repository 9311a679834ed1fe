"""The zoo under the presets: partir_core's partitioned steps against ``jax.jit`` with the same shardings.

Method. 8 CPU host devices as the mesh ``batch=2, model=4``; every model of ``examples/zoo`` (training steps
written as flax.linen, flax.nnx, equinox and plain JAX with optax write them) and every preset and composition
of :data:`SCHEDULES` that applies to it (``partir_core.schedules.schedule`` on the step; one whose preset finds
nothing to act on says so and is left out). Per model x schedule:

- lowering: ``pf = partir_core.jit(step, mesh, tactics)``, ``low = pf.lower(*inputs)``, timed (``lower_s``);
- match: ``pf(*inputs)`` against ``jax.jit(step)(*inputs)`` (rtol 1e-4, atol 1e-5 on every output leaf);
- bytes per step, per device: ours = the sum over ``low.collectives`` of bytes times trips (a collective in a
  loop body counts once per iteration), also read back from our compiled HLO (``bytes_ours_hlo``); XLA's = the
  collectives of ``jax.jit(step, in_shardings=low.in_shardings, out_shardings=low.out_shardings)`` compiled,
  parsed from its HLO as ``bench/partitioning.py`` parses them (``loop_collectives``: a while loop's body counted
  ``known_trip_count`` times; the most any device receives); ``bytes_ratio`` = ours / XLA's (1 where both are 0);
- time: the inputs placed once (``pf.place``), XLA's function called on the same arrays. Four callables: ``pf``
  and XLA's function, each on the pytrees (what a user calls), and the two compiled programs alone on the
  flat arrays (``low.program.executable()``, and XLA's function of the flat leaves, jitted with their
  shardings: neither flattening pytrees nor building results). Each is called twice to warm up, then
  ``--rounds`` rounds in which each runs a burst of ``--repeats`` calls (each timed with
  ``time.perf_counter`` around the call and ``block_until_ready``), in turn, the order reversed every other
  round. ``time_ratio``: the median over rounds of ``pf``'s burst median over XLA's function's in the same
  round (``time_ratio_quartiles``: the first and third quartiles of those per-round ratios, how much the
  rounds agree); ``program_ratio``: the same of the two programs alone; the times are the medians of the
  burst medians.

AutomaticPartition against its time budget (``--auto-layers``, ``--auto-budgets``): the zoo's plain-JAX LM
(Adam) with that many layers, scanned and unrolled (``examples.zoo.jax_lm.make(unrolled=True)``: the block
repeated in the program), ``AutomaticPartition(time_budget_s=budget)`` on both mesh axes, for each budget (one
the search may end before, one that stops it); ``lower_s`` is the wall time of ``pf.lower(*inputs)`` (tracing,
the search, the pipelines tried around it, lowering), against ``budget * 1.1``.

Targets: ``time_ratio <= 1.1`` and ``bytes_ratio <= 1.0`` on every case; ``lower_s <= 1.1 * budget``. Times are
wall-clock on the machine that ran it, whose load the JSON records: ratios, not seconds, compare.

    python bench/zoo.py [--models flax_mlp,...] [--rounds 20] [--repeats 10] [--auto-layers 32]
                        [--auto-budgets 60,15] [--no-auto] [--out bench/results/zoo.json] [--no-progress]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import partir_core as pc  # noqa: E402
import redist  # noqa: E402
from bench import progress  # noqa: E402
from bench.partitioning import loop_collectives, total_bytes  # noqa: E402
from examples import zoo  # noqa: E402
from examples.zoo import jax_lm  # noqa: E402
from partir_core import schedules  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
MESH = redist.Mesh({"batch": 2, "model": 4})
SCHEDULES = ("BP", "MP", "Z2", "Z3", "EMB", "BP+MP", "BP+EMB", "BP+MP+Z3")
TIME_TARGET, BYTES_TARGET, BUDGET_SLACK = 1.1, 1.0, 1.1


def matches(got, want) -> bool:
    """Every leaf of ``got`` close to ``want``'s (rtol 1e-4, atol 1e-5), in the same tree."""
    return jax.tree.structure(got) == jax.tree.structure(want) and all(
        np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def paired_times(calls, pairs, rounds: int, burst: int, warmup: int = 2) -> tuple[list, list, list]:
    """``(times, ratios, quartiles)`` of the callables ``calls`` (no arguments): each called ``warmup`` times,
    then ``rounds`` rounds of a burst of ``burst`` timed calls each, in turn, the order reversed every other
    round; a callable's time is the median over rounds of its burst medians. Per ``(i, reference)`` of
    ``pairs``: its ratio, the median over rounds of call ``i``'s burst median over the reference's in the same
    round, and its quartiles, the first and third quartiles of those per-round ratios."""
    for call in calls:
        for _ in range(warmup):
            jax.block_until_ready(call())
    medians = [[] for _ in calls]
    order = list(range(len(calls)))
    for r in range(rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            ts = []
            for _ in range(burst):
                t0 = time.perf_counter()
                jax.block_until_ready(calls[i]())
                ts.append(time.perf_counter() - t0)
            medians[i].append(statistics.median(ts))
    ratios = [[a / b for a, b in zip(medians[i], medians[ref])] for i, ref in pairs]
    return ([statistics.median(m) for m in medians], [statistics.median(r) for r in ratios],
            [tuple(statistics.quantiles(r, n=4)[::2]) if len(r) > 1 else (r[0], r[0]) for r in ratios])


def run_case(name: str, step, inputs, want, schedule: str, rounds: int, repeats: int) -> dict:
    """One model x schedule: its record (see the module docstring)."""
    rec = {"model": name, "schedule": schedule}
    t0 = time.perf_counter()
    pf = pc.jit(step, MESH, schedules.schedule(schedule, step, inputs, mesh=MESH))
    low = pf.lower(*inputs)
    rec["lower_s"] = time.perf_counter() - t0
    rec["match"] = matches(pf(*inputs), want)
    rec["conflicts"], rec["unsupported"] = len(low.conflicts), len(low.unsupported)
    placed, _ = pf.place(*inputs)
    flat = jax.tree.leaves(placed)
    program = low.program.executable()
    xla = jax.jit(step, in_shardings=low.in_shardings, out_shardings=low.out_shardings)
    ours_cols = loop_collectives(program.lower(*flat).compile().as_text(), MESH)
    xla_cols = loop_collectives(xla.lower(*placed).compile().as_text(), MESH)
    rec["xla_match"] = matches(xla(*placed), want)
    rec["bytes_ours"] = float(sum(c.bytes * c.trips for c in low.collectives))
    rec["bytes_ours_hlo"] = total_bytes(ours_cols)
    rec["bytes_xla"] = total_bytes(xla_cols)
    rec["collectives_ours"] = len([c for c, _ in ours_cols if c.bytes_received > 0])
    rec["collectives_xla"] = len([c for c, _ in xla_cols if c.bytes_received > 0])
    rec["bytes_ratio"] = rec["bytes_ours"] / rec["bytes_xla"] if rec["bytes_xla"] else (
        1.0 if rec["bytes_ours"] == 0 else float("inf"))
    tree = jax.tree.structure(placed)
    xla_flat = jax.jit(lambda *leaves: jax.tree.leaves(step(*jax.tree.unflatten(tree, leaves))),
                       in_shardings=[x.sharding for x in flat],
                       out_shardings=jax.tree.leaves(low.out_shardings))
    times, ratios, quartiles = paired_times(
        [lambda: pf(*placed), lambda: xla(*placed), lambda: program(*flat), lambda: xla_flat(*flat)],
        [(0, 1), (2, 3)], rounds, repeats)
    rec["time_ours_s"], rec["time_xla_s"], rec["time_program_s"], rec["time_xla_program_s"] = times
    rec["time_ratio"], rec["program_ratio"] = ratios
    rec["time_ratio_quartiles"] = list(quartiles[0])
    return rec


def run_auto(layers: int, unrolled: bool, budget: float) -> dict:
    """AutomaticPartition on the zoo's plain-JAX LM of ``layers`` layers: ``pf.lower``'s wall time against
    ``budget``."""
    step, inputs = jax_lm.make(layers=layers, unrolled=unrolled)
    tactic = pc.AutomaticPartition(axes=["batch", "model"], time_budget_s=budget, progress=False)
    t0 = time.perf_counter()
    low = pc.jit(step, MESH, [tactic]).lower(*inputs)
    lower_s = time.perf_counter() - t0
    st = low.automatic.stats
    return {"model": f"jax_lm, {layers} layers {'unrolled' if unrolled else 'scanned'}", "ops": len(low.graph.eqns),
            "budget_s": budget, "lower_s": lower_s, "search_s": st.seconds, "evaluations": st.evaluations,
            "stopped": st.stopped, "pipelines_tried": len(st.pipelines), "pipelines_left": st.pipelines_left,
            "over_budget": lower_s / budget,
            "met": lower_s <= BUDGET_SLACK * budget, "tactics": [str(t) for t in low.automatic.tactics]}


def table(rows) -> str:
    head = (f"{'model':12s} {'schedule':9s} {'match':5s} {'ours B':>9s} {'XLA B':>9s} {'B ratio':>7s} "
            f"{'ours ms':>8s} {'XLA ms':>8s} {'t ratio':>7s} {'quartiles':>11s} {'prog ms':>8s} {'XLA prog':>8s} "
            f"{'p ratio':>7s} {'lower s':>7s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['model']:12s} {r['schedule']:9s} {'yes' if r['match'] else 'NO':5s} {r['bytes_ours']:9.0f} "
                     f"{r['bytes_xla']:9.0f} {r['bytes_ratio']:7.2f} {r['time_ours_s'] * 1e3:8.3f} "
                     f"{r['time_xla_s'] * 1e3:8.3f} {r['time_ratio']:7.2f} "
                     f"{'%.2f-%.2f' % tuple(r['time_ratio_quartiles']):>11s} {r['time_program_s'] * 1e3:8.3f} "
                     f"{r['time_xla_program_s'] * 1e3:8.3f} {r['program_ratio']:7.2f} "
                     f"{r['lower_s']:7.1f}")
    return "\n".join(lines)


def summarize(rows, autos) -> dict:
    return {
        "mesh": "batch=2, model=4 (8 host devices)",
        "cases": len(rows),
        "all_match": all(r["match"] and r["xla_match"] for r in rows),
        "max_time_ratio": max(r["time_ratio"] for r in rows),
        "geomean_time_ratio": float(np.exp(np.mean([np.log(r["time_ratio"]) for r in rows]))),
        "geomean_program_ratio": float(np.exp(np.mean([np.log(r["program_ratio"]) for r in rows]))),
        f"cases_time_over_{TIME_TARGET}": [f"{r['model']} {r['schedule']}" for r in rows
                                           if r["time_ratio"] > TIME_TARGET],
        "max_bytes_ratio": max(r["bytes_ratio"] for r in rows),
        "cases_bytes_over_xla": [f"{r['model']} {r['schedule']}" for r in rows if r["bytes_ratio"] > BYTES_TARGET],
        "auto_within_budget": all(a["met"] for a in autos) if autos else None,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(zoo.NAMES))
    ap.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds (default 20)")
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per program per round (default 10)")
    ap.add_argument("--auto-layers", type=int, default=32, help="layers of the LM AutomaticPartition runs on")
    ap.add_argument("--auto-budgets", default="60,15", help="its time_budget_s values (default 60,15)")
    ap.add_argument("--no-auto", action="store_true", help="skip the AutomaticPartition budget runs")
    ap.add_argument("--out", default=os.path.join(RESULTS, "zoo.json"))
    progress.add_option(ap)
    args = ap.parse_args(argv)
    logging.getLogger("jax").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    if len(jax.devices()) < 8:
        raise SystemExit("needs 8 JAX devices")
    start, load = time.perf_counter(), os.getloadavg()
    names = args.models.split(",")
    rows, left_out = [], []
    bar = progress.bar(desc="zoo", total=len(names) * len(SCHEDULES), unit="case", shown=not args.no_progress)
    for name in names:
        step, inputs = zoo.module(name).make()
        want = jax.jit(step)(*inputs)
        for schedule in SCHEDULES:
            try:
                schedules.schedule(schedule, step, inputs, mesh=MESH)
            except pc.PartitionError as e:  # a preset with nothing to act on in this model
                left_out.append({"model": name, "schedule": schedule, "why": str(e).split(";")[0]})
            else:
                rec = run_case(name, step, inputs, want, schedule, args.rounds, args.repeats)
                rows.append(rec)
                progress.write(f"  {name:12s} {schedule:9s} match={rec['match']} bytes {rec['bytes_ours']:.0f}/"
                               f"{rec['bytes_xla']:.0f} time x{rec['time_ratio']:.2f} (program "
                               f"x{rec['program_ratio']:.2f}) ({time.perf_counter() - start:.0f}s)")
            bar.update()
    bar.close()
    autos = [] if args.no_auto else [run_auto(args.auto_layers, unrolled, float(budget))
                                     for budget in args.auto_budgets.split(",") for unrolled in (False, True)]
    for a in autos:
        print(f"AutomaticPartition on {a['model']} ({a['ops']} ops): pf.lower {a['lower_s']:.1f} s for a "
              f"{a['budget_s']:.0f} s budget (search {a['search_s']:.1f} s, {a['evaluations']} evaluations, "
              f"{a['pipelines_tried']} pipelines tried)")
    summary = summarize(rows, autos)
    summary["timing"] = (f"{args.rounds} rounds of {args.repeats} calls per program, interleaved, the order "
                         "reversed every other round; ratios: the median over rounds of the per-round ratio of "
                         "burst medians")
    summary["machine"] = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                          f"jax {jax.__version__}")
    summary["load_average_at_start"] = {"1 min": load[0], "5 min": load[1], "15 min": load[2]}
    summary["runtime_s"] = time.perf_counter() - start
    print()
    print(table(rows))
    print(json.dumps(summary, indent=1))
    result = {"method": __doc__.split("\n\n    python")[0].strip(), "summary": summary, "cases": rows,
              "left_out": left_out, "auto": autos}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f}s")
    return result


if __name__ == "__main__":
    main()
