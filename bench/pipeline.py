"""Pipeline benchmark: ``partir_core.Pipeline`` on a deep scanned transformer LM, against SPMD-only schedules
and against XLA given the same shardings.

Setup. 8 host devices; ``partir_core.models.scanned_transformer`` with 16 layers (``d_model`` 32, 4 heads,
sequence 16, batch 16, vocabulary 64): its layers run in one ``lax.scan`` over stacked weights. Pipelines of
``S = 2, 4, 8`` stages, on the meshes ``stage=2, batch=2, model=2``, ``stage=4, batch=2`` and ``stage=8``,
with ``M = 1, 2, 4, 8, 16`` microbatches, GPipe and circular (2 repeats, ``M ≥ S``), alone and composed with
batch parallelism on ``batch`` and (``S = 2``) Megatron on ``model`` (``--quick``: ``M = 1, 4, 16``, alone
and with everything). The SPMD-only baselines are the presets ``BP``, ``MP``, ``BP+MP``, ``BP+MP+Z3`` on
``batch=2, model=4`` and ``BP``, ``BP+Z3`` on ``batch=8``. Per case:

- exact: the partitioned step against the unpartitioned one (rtol 1e-4, atol 1e-5);
- simulated (``cpu-host``): step time, bubble (:attr:`partir_core.Simulation.bubble_fraction`) against its
  formula ``(S - 1) / (M·R + S - 1)``, peak bytes per device;
- measured: our compiled program's step time, and that of ``jax.jit(step, in_shardings, out_shardings)``
  with our program's input and output shardings (XLA's partitioner on the unpipelined step, as
  ``bench/partitioning.py`` compares); every case's programs timed together by ``interleaved_times``
  (``bench/partitioning.py``); the compiled programs' ``memory_analysis`` (argument + output + temp - alias);
- the stacked layers' bytes per device.

The part ``auto``: :class:`partir_core.AutomaticPartition` (which tries pipelines around its SPMD search,
:mod:`partir_core.automatic.pipelines`) on the same model on each of the pipelines' meshes, with ``AUTO_EVALS``
evaluations, under three memory budgets derived from the SPMD-only cases' simulated peaks: none; 95% of the
fastest SPMD-only composition's peak (it does not fit, the others are slower); 95% of the smallest SPMD-only
peak (none fits). Per mesh and budget: the chosen tactics (``AutoResult.code``), whether they pipeline, the
simulated step time and peak, exactness, and the measured step time, timed as above together with the program
of the best expert composition that fits the budget (the fastest measured case, pipelined or not, whose
simulated peak is within it), rebuilt and compiled again; the pipelines the search tried and its own SPMD
result (``SearchStats.pipelines``, ``SearchStats.spmd``). It reads the expert cases from the results file.

Outputs: a table on stdout and ``bench/results/pipeline.json``; a part replaces only its own entries of that
file (``summary`` and ``cases``; ``auto``).

    python bench/pipeline.py [--part all|expert|auto] [--quick] [--rounds 4] [--repeats 5]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import partir_core as pc  # noqa: E402
import redist  # noqa: E402
from bench.partitioning import interleaved_times, mem_total, spearman  # noqa: E402
from partir_core import models, schedules  # noqa: E402
from partir_core.automatic import MemoryBudgetError  # noqa: E402
from redist import xla_baseline as xb  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
MODEL = {"vocab": 64, "d_model": 32, "layers": 16, "heads": 4, "seq": 16, "batch": 16}
BATCH = {"tokens": 0, "targets": 0}
MESHES = {2: redist.Mesh({"stage": 2, "batch": 2, "model": 2}), 4: redist.Mesh({"stage": 4, "batch": 2}),
          8: redist.Mesh({"stage": 8})}
COMPOSITIONS = {2: ("", "BP", "BP+MP"), 4: ("", "BP"), 8: ("",)}
MICROBATCHES = (1, 2, 4, 8, 16)
QUICK_MICROBATCHES = (1, 4, 16)
SPMD = {"batch=2,model=4": ["BP", "MP", "BP+MP", "BP+MP+Z3"], "batch=8": ["BP", "BP+Z3"]}
AUTO_EVALS, AUTO_TIME_S = 20, 20  # the part auto's search: evaluations, and seconds at most
AUTO_BUDGET_FRACTION = 0.95  # of an SPMD-only composition's simulated peak: a budget it does not fit


def pipeline_cases(quick: bool) -> list[tuple]:
    """``(S, M, schedule, repeats, composition)`` of every pipelined case."""
    out = []
    for s, mesh in MESHES.items():
        comps = COMPOSITIONS[s] if not quick else tuple(dict.fromkeys(("", COMPOSITIONS[s][-1])))
        for m in QUICK_MICROBATCHES if quick else MICROBATCHES:
            for schedule, repeats in (("gpipe", 1), ("circular", 2)):
                if schedule == "circular" and (m < s or MODEL["layers"] % (2 * s)):
                    continue
                out += [(s, m, schedule, repeats, comp) for comp in comps]
    return out


def pipeline_schedule(model, inputs, s, m, schedule, repeats, comp):
    mesh = MESHES[s]
    tactics = [pc.Pipeline(layers="params/layers/*", axis="stage", microbatches=m, schedule=schedule,
                           repeats=repeats, batch=BATCH)]
    if "BP" in comp:
        tactics.append(pc.ManualPartition(BATCH, axis="batch"))
    if "MP" in comp:
        tactics += schedules.schedule("MP", model, inputs, mesh=mesh)
    return mesh, tactics


def compiled(model, inputs, want, mesh, tactics, rec):
    """Fill ``rec`` for one schedule (exactness, simulation, our compiled program's memory); returns its
    :class:`~partir_core.Partitioned`, our compiled program and its device-resident arguments."""
    t0 = time.perf_counter()
    pf = pc.jit(model.step, mesh, tactics)
    low = pf.lower(*inputs)
    rec["lower_s"] = time.perf_counter() - t0
    got = pf(*inputs)
    rec["exact"] = all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
                       for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    rec["conflicts"] = len(low.conflicts)
    sim = low.simulate("cpu-host")
    rec["sim_step_s"], rec["sim_peak_bytes"] = sim.step_time_s, sim.peak_bytes
    rec["sim_bubble"] = sim.bubble_fraction
    rec["sim_pipeline_s"], rec["sim_bubble_s"] = sim.pipeline_time_s, sim.bubble_time_s
    rec["stacked_bytes_per_device"] = sum(low.input_type(p).local_bytes for p in low.graph.in_paths
                                          if p.startswith("params/layers/"))
    rec["comm_bytes"] = float(sum(c.bytes * c.trips for c in low.collectives))
    ish = [xb.named_sharding(t) for t in low.program.in_types]
    args = [jax.device_put(x, s) for x, s in zip(jax.tree.leaves(inputs), ish)]
    ours = low.program.executable().lower(*args).compile()
    rec["mem_ours"] = mem_total(xb.MemoryStats.of(ours))
    rec["mem_err_vs_ours"] = sim.peak_bytes / rec["mem_ours"] - 1
    return low, ours, args


def measure(model, inputs, want, mesh, tactics, rec) -> list:
    """:func:`compiled`, and XLA's program of the same step with our program's shardings; returns ``[(ours,
    args), (XLA's, args)]`` for timing."""
    low, ours, args = compiled(model, inputs, want, mesh, tactics, rec)
    ish = [xb.named_sharding(t) for t in low.program.in_types]
    osh = [xb.named_sharding(t) for t in low.program.out_types]
    xla_fn = jax.jit(model.step, in_shardings=jax.tree_util.tree_unflatten(low.graph.in_tree, ish),
                     out_shardings=jax.tree_util.tree_unflatten(low.graph.out_tree, osh))
    xargs = jax.tree_util.tree_unflatten(low.graph.in_tree, args)
    xla = xla_fn.lower(*xargs).compile()
    rec["mem_xla"] = mem_total(xb.MemoryStats.of(xla))
    return [(ours, args), (xla, xargs)]


def table(rows) -> str:
    head = (f"{'case':34s} {'exact':5s} {'sim ms':>7s} {'bubble%':>7s} {'formula%':>8s} {'ours ms':>8s} "
            f"{'XLA ms':>8s} {'sim MB':>7s} {'ours MB':>7s} {'XLA MB':>7s} {'layers KB':>9s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:34s} {'yes' if r['exact'] else 'NO':5s} {r['sim_step_s'] * 1e3:7.2f} "
                     f"{100 * r['sim_bubble']:7.1f} {100 * r.get('bubble_formula', 0):8.1f} "
                     f"{r['time_ours_s'] * 1e3:8.2f} {r['time_xla_s'] * 1e3:8.2f} {r['sim_peak_bytes'] / 1e6:7.3f} "
                     f"{r['mem_ours'] / 1e6:7.3f} {r['mem_xla'] / 1e6:7.3f} {r['stacked_bytes_per_device'] / 1e3:9.1f}")
    return "\n".join(lines)


def expert_part(args, model, inputs, want, start) -> dict:
    """The pipelined and SPMD-only cases, timed together: ``{"summary", "cases"}``."""
    load = os.getloadavg()[0]
    rows, calls = [], []
    for s, m, schedule, repeats, comp in pipeline_cases(args.quick):
        rec = {"kind": "pipeline", "stages": s, "microbatches": m, "schedule": schedule, "repeats": repeats,
               "composed": comp or "alone", "mesh": str(MESHES[s]),
               "case": f"S={s} M={m} {schedule}" + (f"x{repeats}" if repeats > 1 else "")
                       + (f" +{comp}" if comp else ""),
               "bubble_formula": (s - 1) / (m * repeats + s - 1)}
        calls += measure(model, inputs, want, *pipeline_schedule(model, inputs, s, m, schedule, repeats, comp), rec)
        rows.append(rec)
        print(f"  {rec['case']:34s} exact={rec['exact']} sim {rec['sim_step_s'] * 1e3:.2f} ms bubble "
              f"{100 * rec['sim_bubble']:.1f}% ({time.perf_counter() - start:.0f}s)", flush=True)
    for mesh_text, presets in SPMD.items():
        mesh = redist.Mesh.parse(mesh_text)
        for name in presets:
            rec = {"kind": "spmd", "case": f"SPMD {name} on {mesh_text}", "mesh": mesh_text, "schedule": name}
            calls += measure(model, inputs, want, mesh, schedules.schedule(name, model, inputs, mesh=mesh), rec)
            rows.append(rec)
            print(f"  {rec['case']:34s} exact={rec['exact']} sim {rec['sim_step_s'] * 1e3:.2f} ms "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)
    times = interleaved_times(calls, args.rounds, args.repeats)
    for k, rec in enumerate(rows):
        rec["time_ours_s"], rec["time_xla_s"] = times[2 * k], times[2 * k + 1]
    pipes = [r for r in rows if r["kind"] == "pipeline"]
    spmd = [r for r in rows if r["kind"] == "spmd"]
    best_pipe = min(pipes, key=lambda r: r["time_ours_s"])
    best_spmd = min(spmd, key=lambda r: r["time_ours_s"])
    summary = {
        "model": "scanned_transformer " + ", ".join(f"{k}={v}" for k, v in MODEL.items()),
        "cases": len(rows),
        "all_exact": all(r["exact"] for r in rows),
        "max_bubble_error_points": max(100 * abs(r["sim_bubble"] - r["bubble_formula"]) for r in pipes),
        "best_pipeline": best_pipe["case"], "best_pipeline_ms": best_pipe["time_ours_s"] * 1e3,
        "best_spmd": best_spmd["case"], "best_spmd_ms": best_spmd["time_ours_s"] * 1e3,
        "best_pipeline_over_best_spmd": best_pipe["time_ours_s"] / best_spmd["time_ours_s"],
        "geomean_ours_over_xla_pipelined": float(np.exp(np.mean([np.log(r["time_ours_s"] / r["time_xla_s"])
                                                                 for r in pipes]))),
        "spearman_sim_vs_measured_pipelined": spearman([r["sim_step_s"] for r in pipes],
                                                       [r["time_ours_s"] for r in pipes]),
        "max_abs_mem_err_vs_ours": max(abs(r["mem_err_vs_ours"]) for r in rows),
        "stacked_bytes_bp_over_pipeline_s8": (
            next(r["stacked_bytes_per_device"] for r in spmd if r["schedule"] == "BP")
            / next(r["stacked_bytes_per_device"] for r in pipes if r["stages"] == 8)),
        "timing": f"all cases' programs (ours and XLA's) interleaved: {args.rounds} rounds, each a burst of "
                  f"{args.repeats} calls per program, the order reversed every other round; time = the minimum "
                  f"over rounds of the per-round median",
        "quick": args.quick,
        "machine": machine(),
        "load_average_at_start": load,
    }
    summary["runtime_s"] = time.perf_counter() - start
    print()
    print(table(rows))
    print()
    print(json.dumps(summary, indent=1))
    return {"summary": summary, "cases": rows}


# ------------------------------------------------------------------------------------------ the part ``auto``
def budgets(cases) -> dict:
    """The memory budgets of the part ``auto`` (see the module docstring), by name: bytes or None."""
    spmd = [c for c in cases if c["kind"] == "spmd"]
    fastest = min(spmd, key=lambda c: c["time_ours_s"])
    return {"none": None,
            "95% of the fastest SPMD-only peak": int(AUTO_BUDGET_FRACTION * fastest["sim_peak_bytes"]),
            "95% of the smallest SPMD-only peak": int(AUTO_BUDGET_FRACTION * min(c["sim_peak_bytes"] for c in spmd))}


def fastest_within(cases, budget, kinds=("pipeline", "spmd")):
    """The fastest measured of ``cases`` of ``kinds`` whose simulated peak is within ``budget``, or None."""
    fit = [c for c in cases if c["kind"] in kinds and (budget is None or c["sim_peak_bytes"] <= budget)]
    return min(fit, key=lambda c: c["time_ours_s"]) if fit else None


def expert_schedule(model, inputs, case):
    """``(mesh, tactics)`` of an expert case of the results."""
    if case["kind"] == "spmd":
        mesh = redist.Mesh.parse(case["mesh"])
        return mesh, schedules.schedule(case["schedule"], model, inputs, mesh=mesh)
    comp = "" if case["composed"] == "alone" else case["composed"]
    return pipeline_schedule(model, inputs, case["stages"], case["microbatches"], case["schedule"],
                             case["repeats"], comp)


def auto_case(model, inputs, want, mesh, name, budget) -> tuple[dict, tuple | None]:
    """The record of one search (see the module docstring) and our compiled program with its arguments (None
    where nothing fits the budget)."""
    rec = {"mesh": str(mesh), "budget": name, "budget_bytes": budget}
    tactic = pc.AutomaticPartition(memory_budget_bytes=budget, max_evals=AUTO_EVALS, time_budget_s=AUTO_TIME_S,
                                   hardware="cpu-host", progress=False)
    try:
        low, ours, args = compiled(model, inputs, want, mesh, [tactic], rec)
    except MemoryBudgetError as e:
        res, call = e.result, None
        rec["fits"], rec["error"] = False, str(e).split(";")[0]
    else:
        res, call = low.automatic, (ours, args)
        rec["fits"] = True
    rec["code"] = res.code
    rec["pipelined"] = bool(res.tactics) and isinstance(res.tactics[0], pc.Pipeline)
    rec["search_sim_step_s"], rec["search_sim_peak_bytes"] = res.step_time_s, res.peak_bytes
    rec["evaluations"], rec["search_s"] = res.stats.evaluations, res.stats.seconds
    rec["pipelines_tried"] = [{"pipeline": p, "sim_step_s": t, "sim_peak_bytes": b} for p, t, b in res.stats.pipelines]
    rec["spmd_sim_step_s"], rec["spmd_sim_peak_bytes"] = res.stats.spmd or (None, None)
    return rec, call


def auto_part(args, model, inputs, want, cases, start) -> dict:
    """The part ``auto`` against the expert ``cases``: ``{"summary", "cases"}``."""
    load = os.getloadavg()[0]
    rows, calls, experts = [], [], {}
    for name, budget in budgets(cases).items():
        expert = fastest_within(cases, budget)
        spmd = fastest_within(cases, budget, ("spmd",))
        if expert is not None and expert["case"] not in experts:
            rec = {}
            _, ours, eargs = compiled(model, inputs, want, *expert_schedule(model, inputs, expert), rec)
            experts[expert["case"]] = (rec, len(calls))
            calls.append((ours, eargs))
        for mesh in MESHES.values():
            rec, call = auto_case(model, inputs, want, mesh, name, budget)
            rec["expert"] = None if expert is None else expert["case"]
            rec["expert_sim_peak_bytes"] = None if expert is None else expert["sim_peak_bytes"]
            rec["spmd_only"] = None if spmd is None else spmd["case"]
            rec["spmd_only_recorded_ms"] = None if spmd is None else spmd["time_ours_s"] * 1e3
            if call is not None:
                rec["call"] = len(calls)
                calls.append(call)
            rows.append(rec)
            print(f"  {name:36s} {rec['mesh']:22s} fits={rec['fits']} pipelined={rec['pipelined']} "
                  f"exact={rec.get('exact')} ({time.perf_counter() - start:.0f}s)", flush=True)
    times = interleaved_times(calls, args.rounds, args.repeats)
    for rec in rows:
        if "call" in rec:
            rec["time_auto_s"] = times[rec.pop("call")]
        if rec["expert"] is not None:
            erec, k = experts[rec["expert"]]
            rec["time_expert_s"], rec["expert_exact"] = times[k], erec["exact"]
            if "time_auto_s" in rec:
                rec["auto_over_expert"] = rec["time_auto_s"] / rec["time_expert_s"]
    paired = [r["auto_over_expert"] for r in rows if "auto_over_expert" in r]
    summary = {
        "max_evals": AUTO_EVALS, "time_budget_s": AUTO_TIME_S,
        "budgets_bytes": {r["budget"]: r["budget_bytes"] for r in rows},
        "searches": len(rows),
        "fit": sum(r["fits"] for r in rows),
        "pipelined": sum(r["pipelined"] and r["fits"] for r in rows),
        "all_exact": all(r["exact"] for r in rows if r["fits"]),
        "geomean_auto_over_best_expert": float(np.exp(np.mean(np.log(paired)))) if paired else None,
        "auto_faster_than_best_expert": sum(x < 1 for x in paired),
        "load_average_at_start_auto": load,
        "runtime_s": time.perf_counter() - start,
    }
    print()
    print(auto_table(rows))
    print()
    print(json.dumps(summary, indent=1))
    return {"summary": summary, "cases": rows}


def auto_table(rows) -> str:
    head = (f"{'budget':36s} {'mesh':22s} {'pipelined':9s} {'exact':5s} {'sim ms':>7s} {'sim MB':>7s} "
            f"{'auto ms':>8s} {'best expert that fits':34s} {'ms':>8s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        fits = r["fits"]
        lines.append(f"{r['budget']:36s} {r['mesh']:22s} {str(r['pipelined'] and fits):9s} "
                     f"{str(r.get('exact', '-')):5s} {r['sim_step_s'] * 1e3 if fits else float('nan'):7.2f} "
                     f"{r['search_sim_peak_bytes'] / 1e6:7.3f} {r.get('time_auto_s', float('nan')) * 1e3:8.2f} "
                     f"{r['expert'] or '-':34s} {r.get('time_expert_s', float('nan')) * 1e3:8.2f}")
    return "\n".join(lines)


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"jax {jax.__version__}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("all", "expert", "auto"), default="all",
                    help="expert: the pipelined and SPMD-only cases; auto: AutomaticPartition against them (reads "
                         "the expert cases from --out); all: both (default)")
    ap.add_argument("--quick", action="store_true", help="M = 1, 4, 16; alone and fully composed")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds (default 4)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per program per round (default 5)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "pipeline.json"))
    args = ap.parse_args(argv)
    logging.getLogger("jax").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    if len(jax.devices()) < 8:
        raise SystemExit("needs 8 JAX devices")
    data = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            data = json.load(f)
    if args.part == "auto" and "cases" not in data:
        raise SystemExit(f"--part auto reads the expert cases from {args.out}: run --part expert first")
    model = models.scanned_transformer(**MODEL)
    inputs = model.init(jax.random.key(0))
    want = jax.jit(model.step)(*inputs)
    if args.part in ("all", "expert"):
        data.update(expert_part(args, model, inputs, want, start))
    if args.part in ("all", "auto"):
        data["auto"] = auto_part(args, model, inputs, want, data["cases"], time.perf_counter())
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
