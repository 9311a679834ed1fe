"""AutomaticPartition against the expert presets: 4 models x 3 meshes x 3 memory budgets.

Method, per model (``partir_core.models``: mlp, transformer, gnn at their default sizes, and the flax.linen LM
of ``bench/flax_lm.py``) and mesh ((2,4) and (4,2) with axes batch, model; (2,2,2) with axes batch, model, z):

- experts: every composition of one to three of the presets BP, MP, Z2, Z3, EMB (``partir_core.schedules``;
  on the flax LM, MP is ``bench.flax_lm.megatron``, EMB does not apply) and BP+MP+Z3+EMB, each also with one
  extra tactic on a spare axis (``+BP@model`` on the 2-D meshes: data parallel over all devices;
  ``+BP@z``, ``+MP@z``, ``+Z3@z`` on (2,2,2)); each is scored by ``partir_core.estimate.Estimator``, which
  ``tests/partir_core/test_estimate.py`` checks equal to ``pf.lower(...).simulate()``;
- memory budgets: none, 0.8x and 0.5x the simulated per-device peak of plain BP; "best preset" is the fastest
  expert whose simulated peak fits (none may fit at 0.5x);
- ``auto``: ``[AutomaticPartition(axes=all, memory_budget_bytes=budget, time_budget_s=--time-budget,
  seed=--seed)]``, its search time, evaluations and evaluations per second from ``AutoResult.stats``;
- every automatic result is run (``pf(*inputs)`` on 8 host devices) and compared with the unpartitioned step
  (rtol 1e-4, atol 1e-5);
- "Megatron": every layer's MLP split on its hidden dim over a common axis of both matmuls' weights (and on
  the flax LM, the attention's heads: query and output kernels), as the result's input types show.

Times are the simulator's (default hardware profile, ``cpu-host``), per device per step. Targets: auto
<= 1.00x the best fitting preset on every cell where one fits, < 1.0x on at least a third of the cells, each
search <= 60 s. Search times and evaluations per second are wall-clock on the machine that runs it: say how
loaded it was. A progress bar over the cells is drawn on stderr while it runs, on a terminal.

    python bench/autopartition.py [--time-budget 60] [--models mlp,transformer,gnn,flax_lm] [--meshes 2x4,4x2,2x2x2]
                                  [--out bench/results/autopartition.json] [--no-progress]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import partir_core as pc  # noqa: E402
import redist  # noqa: E402
from bench import flax_lm, progress  # noqa: E402
from partir_core import models, schedules  # noqa: E402
from partir_core.estimate import Estimator  # noqa: E402
from partir_core.propagation import State, propagate  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "autopartition.json")
MESHES = {"2x4": {"batch": 2, "model": 4}, "4x2": {"batch": 4, "model": 2}, "2x2x2": {"batch": 2, "model": 2, "z": 2}}
BUDGETS = (None, 0.8, 0.5)
BASE = ["BP", "MP", "Z2", "Z3", "EMB"]
MODELS = {**models.MODELS, "flax_lm": flax_lm.flax_lm}


def compositions():
    return ["+".join(c) for r in range(1, 4) for c in itertools.combinations(BASE, r)] + ["BP+MP+Z3+EMB"]


def preset(name, m, ins, mesh, **axes):
    """The tactics of a composition (None if it does not apply to the model)."""
    out = []
    for part in name.split("+"):
        if m.name == "flax_lm" and part == "MP":
            out += flax_lm.megatron(axes.get("model_axis", "model"))
            continue
        if m.name == "flax_lm" and part == "EMB":
            return None
        try:
            out += schedules.PRESETS[part](m, ins, mesh=mesh, **axes)
        except pc.PartitionError:  # EMB on a model without embeddings
            return None
    return out


def expert_schedules(m, ins, mesh):
    """``{name: tactics}`` for every composition, with and without one extra tactic on a spare axis."""
    names = mesh.names
    extras = {"": []}
    if len(names) == 2:
        extras["+BP@model"] = preset("BP", m, ins, mesh, batch_axis="model")
    else:
        z = names[2]
        extras[f"+BP@{z}"] = preset("BP", m, ins, mesh, batch_axis=z)
        extras[f"+MP@{z}"] = preset("MP", m, ins, mesh, model_axis=z)
        extras[f"+Z3@{z}"] = preset("Z3", m, ins, mesh, batch_axis=z)
    out = {}
    for c in compositions():
        base = preset(c, m, ins, mesh)
        if base is not None:
            for en, ex in extras.items():
                out[c + en] = base + ex
    return out


def score_experts(graph, rules, mesh, experts):
    """``{name: (step time, peak)}`` of every expert schedule, applied as ``partir_core.jit`` applies it and
    scored by the estimator (each from the one before)."""
    est = Estimator(graph, rules, mesh)
    out, previous = {}, None
    for name, tactics in experts.items():
        state = State.empty(graph)
        for k, t in enumerate(tactics, start=1):
            t.apply(graph, state, mesh, k)
            propagate(graph, rules, state, mesh, k)
        try:
            sim = est.score(name, state, previous)
            out[name] = (sim.step_time_s, sim.peak_bytes)
            previous = name
        except redist.ShardingError:
            continue
    return out


def megatron(low, m):
    """Whether the result splits every layer's MLP (and on the flax LM, attention) Megatron-style."""
    if m.name == "flax_lm":
        mlp, attention = flax_lm.is_megatron(low)
        return mlp and attention
    paths = low.graph.in_paths
    pairs = [(p, p[:-2] + "w2") for p in paths if p.startswith("params/") and p.endswith("/w1")]
    pairs = [(a, b) for a, b in pairs if b in paths]
    return bool(pairs) and all(set(low.input_type(a).dims[1]) & set(low.input_type(b).dims[0]) for a, b in pairs)


def equal(got, want):
    try:
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        return True
    except AssertionError:
        return False


def run_auto(m, ins, want, mesh, budget, args):
    tactic = pc.AutomaticPartition(axes=list(mesh.names), memory_budget_bytes=budget, time_budget_s=args.time_budget,
                                   seed=args.seed, progress=False)
    pf = pc.jit(m.step, mesh, [tactic])
    try:
        low = pf.lower(*ins)
    except pc.PartitionError as e:
        return {"error": str(e)}
    sim, res = low.simulate(), low.automatic
    st = res.stats
    return {"tactics": [str(t) for t in res.tactics], "step_time_s": sim.step_time_s, "peak_bytes": sim.peak_bytes,
            "search_s": st.seconds, "evaluations": st.evaluations, "evals_per_s": st.evals_per_s,
            "evals_per_cpu_s": st.evals_per_cpu_s,
            "scoring_ms": st.scoring_ms, "stopped": st.stopped, "local": st.local,
            "templates": st.templates, "refinements": st.refinements, "load_average": os.getloadavg()[0],
            "megatron": megatron(low, m), "correct": equal(pf(*ins), want), "action_space": res.action_space}


def cell(m, ins, want, mesh, experts, bp_peak, fraction, args):
    budget = None if fraction is None else int(fraction * bp_peak)
    fitting = sorted((t, k) for k, (t, p) in experts.items() if budget is None or p <= budget)
    best_t, best_name = fitting[0] if fitting else (None, None)
    auto = run_auto(m, ins, want, mesh, budget, args)
    ratio = auto["step_time_s"] / best_t if best_t and "error" not in auto else None
    return {"budget_fraction": fraction, "memory_budget_bytes": budget, "best_preset": best_name,
            "best_preset_time_s": best_t, "fitting_presets": len(fitting), "auto": auto, "auto_vs_best": ratio}


def table(rows) -> list[str]:
    hdr = (f"{'model':<12}{'mesh':<7}{'budget':>7}{'best preset':>24}{'ms':>8}{'auto ms':>9}{'ratio':>7}"
           f"{'search s':>9}{'evals':>7}{'eval/s':>7}{'/cpu s':>7}{'run=':>5}{'Megatron':>9}")
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        a = r["auto"]
        budget = "none" if r["budget_fraction"] is None else f"{r['budget_fraction']}x"
        best = f"{r['best_preset_time_s'] * 1e3:>8.4f}" if r["best_preset"] else f"{'-':>8}"
        if "error" in a:
            lines.append(f"{r['model']:<12}{r['mesh']:<7}{budget:>7}{str(r['best_preset']):>24}{best}"
                         f"  no fit: {a['error'][:90]}")
            continue
        ratio = f"{r['auto_vs_best']:>7.3f}" if r["auto_vs_best"] else f"{'-':>7}"
        lines.append(f"{r['model']:<12}{r['mesh']:<7}{budget:>7}{str(r['best_preset']):>24}{best}"
                     f"{a['step_time_s'] * 1e3:>9.4f}{ratio}{a['search_s']:>9.1f}{a['evaluations']:>7}"
                     f"{a['evals_per_s']:>7.1f}{a['evals_per_cpu_s']:>7.1f}{'y' if a['correct'] else 'N':>5}"
                     f"{str(a['megatron']):>9}")
    return lines


def targets(rows) -> dict:
    ratios = [r["auto_vs_best"] for r in rows if r["auto_vs_best"] is not None]
    searches = [r["auto"]["search_s"] for r in rows if "error" not in r["auto"]]
    return {"cells": len(rows), "cells_with_a_fitting_preset": len(ratios),
            "auto_le_best_everywhere": all(x <= 1.0 + 1e-12 for x in ratios), "worst_ratio": max(ratios, default=None),
            "cells_below_1": sum(x < 1.0 - 1e-12 for x in ratios),
            "below_1_on_a_third": sum(x < 1.0 - 1e-12 for x in ratios) * 3 >= len(ratios),
            "max_search_s": max(searches, default=None), "searches_le_60s": all(s <= 60 for s in searches),
            "all_results_correct": all(r["auto"].get("correct") for r in rows if "error" not in r["auto"]),
            "no_fit_cells_where_a_preset_fits": sum(1 for r in rows if "error" in r["auto"] and r["best_preset"])}


def simulator_accuracy(rows, rounds: int) -> dict:
    """How well the simulator ranks the flax LM's programs on this host: the experts BP, MP, BP+MP, BP+Z2,
    BP+Z3 and the automatic result without a budget on (2,4), each compiled and timed together
    (``bench.partitioning.interleaved_times``: ``rounds`` rounds of bursts of 5 calls, the minimum over rounds
    of the per-round median); simulated / measured per program and Spearman's rank correlation."""
    from bench.partitioning import interleaved_times, spearman
    from redist import xla_baseline as xb

    mesh = redist.Mesh(MESHES["2x4"])
    m = MODELS["flax_lm"]()
    ins = m.init(jax.random.key(0))
    auto = next(r["auto"] for r in rows if r["model"] == "flax_lm" and r["mesh"] == "2x4"
                and r["budget_fraction"] is None)
    scheds = {k: preset(k, m, ins, mesh) for k in ("BP", "MP", "BP+MP", "BP+Z2", "BP+Z3")}
    scheds["auto"] = [eval(t, {"ManualPartition": pc.ManualPartition}) for t in auto["tactics"]]
    calls, sims = [], {}
    for name, tactics in scheds.items():
        low = pc.jit(m.step, mesh, tactics).lower(*ins)
        args = [jax.device_put(x, xb.named_sharding(t)) for x, t in zip(jax.tree.leaves(ins), low.program.in_types)]
        calls.append((low.program.executable().lower(*args).compile(), args))
        sims[name] = low.simulate().step_time_s
    measured = dict(zip(scheds, interleaved_times(calls, rounds, 5)))
    return {"programs": {k: {"simulated_s": sims[k], "measured_s": measured[k], "ratio": sims[k] / measured[k]}
                         for k in scheds},
            "spearman": spearman([sims[k] for k in scheds], [measured[k] for k in scheds]),
            "method": f"(2,4), {rounds} interleaved rounds of 5 calls, min over rounds of per-round medians"}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-budget", type=float, default=60.0, help="time_budget_s per search (<= 60)")
    ap.add_argument("--models", default="mlp,transformer,gnn,flax_lm")
    ap.add_argument("--meshes", default=",".join(MESHES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=RESULTS, help="the results' JSON file (a .txt table beside it)")
    ap.add_argument("--accuracy-rounds", type=int, default=6,
                    help="timing rounds for the simulator's accuracy on the flax LM (0: skip)")
    progress.add_option(ap)
    args = ap.parse_args(argv)
    t_all = time.perf_counter()
    load = os.getloadavg()[0]
    rows = []
    meshes, names = args.meshes.split(","), args.models.split(",")
    bar = progress.bar(desc="cells", total=len(meshes) * len(names) * len(BUDGETS), unit="cell",
                       shown=not args.no_progress)
    for mesh_name in meshes:
        mesh = redist.Mesh(MESHES[mesh_name])
        for name in names:
            m = MODELS[name]()
            ins = m.init(jax.random.key(0))
            want = m.step(*ins)
            start = pc.jit(m.step, mesh, []).lower(*ins)
            experts = score_experts(start.graph, start.rules, mesh, expert_schedules(m, ins, mesh))
            bp_peak = experts["BP"][1]
            for fraction in BUDGETS:
                row = {"model": name, "mesh": mesh_name, "bp_peak_bytes": bp_peak,
                       **cell(m, ins, want, mesh, experts, bp_peak, fraction, args)}
                rows.append(row)
                progress.write(table([row])[-1])
                bar.update()
            rows[-1]["experts"] = {k: {"step_time_s": t, "peak_bytes": p} for k, (t, p) in experts.items()}
    bar.close()
    accuracy = None
    if args.accuracy_rounds and any(r["model"] == "flax_lm" and r["mesh"] == "2x4" for r in rows):
        accuracy = simulator_accuracy(rows, args.accuracy_rounds)
    total = time.perf_counter() - t_all
    summary = {"time_budget_s": args.time_budget, "seed": args.seed, "hardware": "cpu-host (simulator default)",
               "simulator_accuracy_flax_lm": accuracy, "targets": targets(rows), "total_s": total, "load_average_at_start": load,
               "load_average_at_end": os.getloadavg()[0],
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                          f"Python {platform.python_version()}, JAX {jax.__version__}"}
    lines = table(rows) + ["", json.dumps(summary["targets"])]
    if accuracy:
        lines.append("flax LM on (2,4), simulated / measured step: " + ", ".join(
            f"{k} {v['simulated_s'] * 1e3:.2f}/{v['measured_s'] * 1e3:.2f} ms" for k, v in accuracy["programs"].items())
            + f"; Spearman {accuracy['spearman']:.2f}")
    lines.append(f"total {total:.0f} s; load average {load:.1f} at the start, "
                 f"{summary['load_average_at_end']:.1f} at the end, on {os.cpu_count()} cores")
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1, default=str)
    with open(args.out.replace(".json", ".txt"), "w") as f:
        f.write(text + "\n")
    print(f"wrote {os.path.relpath(args.out)}")
    return summary


if __name__ == "__main__":
    main()
