"""AutomaticPartition against the expert presets, under a memory budget at which plain BP does not fit.

Method, per reference model (``partir_core.models``: mlp, transformer, gnn, default sizes) and mesh
((2,4) with axes batch, model; (2,2,2) with axes batch, model, z):

- memory budget = ``--budget-fraction`` (0.8) x the simulated per-device peak of plain BP (the data inputs'
  batch dim on the ``batch`` axis), so BP itself does not fit;
- experts: every composition of the presets BP, MP, Z2, Z3, EMB (``partir_core.schedules``) on
  batch/model, each also with one extra tactic on a spare axis (``+BP@model`` on (2,4): data parallel over
  all devices; ``+BP@z``, ``+MP@z``, ``+Z3@z`` on (2,2,2)); those whose simulated peak fits the budget are
  compared, the best of them is "best preset";
- ``auto``: ``[AutomaticPartition(axes=all, memory_budget_bytes=budget, time_budget_s=--time-budget, seed=0)]``;
  ``BP+auto``: BP by hand on ``batch``, then ``AutomaticPartition`` on the other axes (composition);
- each automatic result is run (``pf(*inputs)`` on 8 host devices) and compared with the unpartitioned step;
- "Megatron": every layer's MLP ``w1`` split on its output dim (1) and ``w2`` on its input dim (0) on a
  common mesh axis, as the automatic result's input types show.

Times are the simulator's (default hardware profile, ``cpu-host``), per device per step. Target: auto within
5% of the best fitting preset on every model (lower is better), with at most 60 s of search.

    python bench/autopartition.py [--time-budget 60] [--models mlp,transformer,gnn] [--budget-fraction 0.8]
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
from partir_core import models, schedules  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "autopartition.json")
MESHES = {"(2,4)": {"batch": 2, "model": 4}, "(2,2,2)": {"batch": 2, "model": 2, "z": 2}}
BASE = ["BP", "MP", "Z2", "Z3", "EMB"]


def compositions():
    out = []
    for r in range(1, 4):
        for c in itertools.combinations(BASE, r):
            out.append("+".join(c))
    return out + ["BP+MP+Z3+EMB"]


def expert_schedules(m, ins, mesh):
    """``{name: tactics}`` for every composition, with and without one extra tactic on a spare axis."""
    names = mesh.names
    extras = {"": []}
    if len(names) == 2:
        extras["+BP@model"] = schedules.BP(m, ins, batch_axis="model", mesh=mesh)
    else:
        z = names[2]
        extras[f"+BP@{z}"] = schedules.BP(m, ins, batch_axis=z, mesh=mesh)
        extras[f"+MP@{z}"] = schedules.MP(m, ins, model_axis=z, mesh=mesh)
        extras[f"+Z3@{z}"] = schedules.Z3(m, ins, batch_axis=z, mesh=mesh)
    out = {}
    for c in compositions():
        try:
            base = schedules.schedule(c, m, ins, mesh=mesh)
        except ValueError:  # EMB on a model without embeddings
            continue
        for en, ex in extras.items():
            out[c + en] = base + ex
    return out


def megatron(low):
    """Every ``.../w1`` split on dim 1 and its ``.../w2`` on dim 0 over a common axis (and which axes)."""
    paths = low.graph.in_paths
    pairs = [(p, p[:-2] + "w2") for p in paths if p.startswith("params/") and p.endswith("/w1")]
    pairs = [(a, b) for a, b in pairs if b in paths]
    if not pairs:
        return False, []
    axes = []
    for a, b in pairs:
        common = set(low.input_type(a).dims[1]) & set(low.input_type(b).dims[0])
        if not common:
            return False, []
        axes.append(sorted(common))
    return True, axes


def equal(got, want):
    try:
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        return True
    except AssertionError:
        return False


def run_auto(m, ins, want, mesh, schedule):
    pf = pc.jit(m.step, mesh, schedule)
    t0 = time.perf_counter()
    low = pf.lower(*ins)
    lower_s = time.perf_counter() - t0
    sim = low.simulate()
    res = low.automatic
    mega, mega_axes = megatron(low)
    ok = equal(pf(*ins), want)
    return {"tactics": [str(t) for t in res.tactics], "step_time_s": sim.step_time_s, "peak_bytes": sim.peak_bytes,
            "search_s": res.stats["seconds"], "lower_s": lower_s, "evaluations": res.stats["evaluations"],
            "stopped": res.stats["stopped"], "megatron": mega, "megatron_axes": mega_axes, "correct": ok,
            "action_space": res.action_space, "conflicts": len(res.groups.conflicts),
            "history": res.stats["history"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-budget", type=float, default=60.0, help="time_budget_s per search (<= 60)")
    ap.add_argument("--models", default="mlp,transformer,gnn")
    ap.add_argument("--budget-fraction", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compose", action="store_true", help="skip the BP-by-hand + automatic rows")
    args = ap.parse_args(argv)
    t_all = time.perf_counter()
    rows = []
    for mesh_name, axes in MESHES.items():
        mesh = redist.Mesh(axes)
        for name in args.models.split(","):
            m = models.MODELS[name]()
            ins = m.init(jax.random.key(0))
            want = m.step(*ins)
            bp = pc.jit(m.step, mesh, schedules.schedule("BP", m, ins, mesh=mesh)).lower(*ins).simulate()
            budget = int(args.budget_fraction * bp.peak_bytes)
            experts = {}
            for ename, sched in expert_schedules(m, ins, mesh).items():
                sim = pc.jit(m.step, mesh, sched).lower(*ins).simulate()
                experts[ename] = {"step_time_s": sim.step_time_s, "peak_bytes": sim.peak_bytes,
                                  "fits": sim.peak_bytes <= budget}
            fitting = sorted((v["step_time_s"], k) for k, v in experts.items() if v["fits"])
            best_t, best_name = fitting[0] if fitting else (float("nan"), None)
            print(f"[{mesh_name} {name}] budget {budget} B (0.8 x BP peak {bp.peak_bytes} B); "
                  f"{len(fitting)}/{len(experts)} presets fit; best {best_name} {best_t * 1e3:.4f} ms", flush=True)
            auto = run_auto(m, ins, want, mesh, [pc.AutomaticPartition(
                axes=list(mesh.names), memory_budget_bytes=budget, time_budget_s=args.time_budget, seed=args.seed,
                progress=True)])
            print(f"  auto     {auto['step_time_s'] * 1e3:.4f} ms peak {auto['peak_bytes']} "
                  f"search {auto['search_s']:.1f} s ({auto['stopped']}), megatron {auto['megatron']}, "
                  f"correct {auto['correct']}: {auto['tactics']}", flush=True)
            row = {"model": name, "mesh": mesh_name, "axes": axes, "memory_budget_bytes": budget,
                   "bp_peak_bytes": bp.peak_bytes, "bp_step_time_s": bp.step_time_s,
                   "best_preset": best_name, "best_preset_time_s": best_t,
                   "fitting_presets": [k for _, k in fitting], "auto": auto,
                   "auto_vs_best": auto["step_time_s"] / best_t if fitting else None, "experts": experts}
            if not args.no_compose:
                rest = [a for a in mesh.names if a != "batch"]
                comp = run_auto(m, ins, want, mesh, schedules.schedule("BP", m, ins, mesh=mesh) + [
                    pc.AutomaticPartition(axes=rest, memory_budget_bytes=budget, time_budget_s=args.time_budget,
                                          seed=args.seed, progress=True)])
                print(f"  BP+auto  {comp['step_time_s'] * 1e3:.4f} ms peak {comp['peak_bytes']} "
                      f"search {comp['search_s']:.1f} s ({comp['stopped']}), megatron {comp['megatron']}, "
                      f"correct {comp['correct']}: {comp['tactics']}", flush=True)
                row["bp_plus_auto"] = comp
            rows.append(row)
    total = time.perf_counter() - t_all
    # ------------------------------------------------------------------ table
    hdr = (f"{'model':<12}{'mesh':<9}{'budget B':>10}{'best preset':>26}{'ms':>9}{'auto ms':>9}{'ratio':>7}"
           f"{'search s':>9}{'Megatron':>9}{'ok':>4}{'BP+auto ms':>11}{'Megatron':>9}")
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        a, c = r["auto"], r.get("bp_plus_auto")
        lines.append(f"{r['model']:<12}{r['mesh']:<9}{r['memory_budget_bytes']:>10}{str(r['best_preset']):>26}"
                     f"{r['best_preset_time_s'] * 1e3:>9.4f}{a['step_time_s'] * 1e3:>9.4f}"
                     f"{(r['auto_vs_best'] or float('nan')):>7.3f}{a['search_s']:>9.1f}{str(a['megatron']):>9}"
                     f"{'y' if a['correct'] else 'N':>4}"
                     + (f"{c['step_time_s'] * 1e3:>11.4f}{str(c['megatron']):>9}" if c else ""))
    lines.append("")
    for r in rows:
        lines.append(f"{r['model']} {r['mesh']}: presets that fit ({len(r['fitting_presets'])}): "
                     + ", ".join(f"{k} {r['experts'][k]['step_time_s'] * 1e3:.4f}"
                                 for k in r["fitting_presets"]))
        lines.append(f"  auto tactics: {r['auto']['tactics']}")
        if r.get("bp_plus_auto"):
            lines.append(f"  BP + auto tactics: {r['bp_plus_auto']['tactics']}")
        sp = r["auto"]["action_space"]
        lines.append(f"  action space: values x dims x axes {sp['values_dims_axes']}, input dims x axes "
                     f"{sp['input_dims_axes']}, groups x axes {sp['groups_axes']}, after layer grouping "
                     f"{sp['decisions_axes']} ({sp['actions']} legal); {r['auto']['conflicts']} conflicts")
    ratios = [r["auto_vs_best"] for r in rows if r["auto_vs_best"] is not None]
    target = all(x <= 1.05 for x in ratios) and all(r["auto"]["correct"] for r in rows)
    lines.append("")
    lines.append(f"target (auto within 5% of the best fitting preset everywhere, and correct): "
                 f"{'met' if target else 'NOT met'}; worst ratio {max(ratios):.3f}; total {total:.0f} s")
    text = "\n".join(lines)
    print(text)
    summary = {"time_budget_s": args.time_budget, "budget_fraction": args.budget_fraction, "seed": args.seed,
               "hardware": "cpu-host (simulator default)", "target_met": target,
               "worst_ratio": max(ratios) if ratios else None, "total_s": total,
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                          f"Python {platform.python_version()}, JAX {jax.__version__}"}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1, default=str)
    with open(RESULTS.replace(".json", ".txt"), "w") as f:
        f.write(text + "\n")
    print(f"wrote {os.path.relpath(RESULTS)}")
    return summary


if __name__ == "__main__":
    main()
