"""AutomaticPartition on meshes of a thousand devices: how fast it evaluates candidates, and where the time goes.

Method: for each model and mesh, one ``pc.jit(step, mesh, [AutomaticPartition(time_budget_s=--time-budget,
seed=--seed)]).lower(...)``, with redist's and partir_core's plan caches cleared before it (each cell starts
cold). Nothing runs: the search scores candidates with :class:`partir_core.estimate.Estimator` on the mesh
described, whatever devices this machine has. Models: the transformer of :mod:`partir_core.models` and the
flax.linen LM of ``bench/flax_lm.py``, both at vocab 512, width 256, 2 layers, 8 heads, sequence 32, batch 64
(the defaults are too small to split over 64 devices). Meshes: ``2x4`` (the reference), ``16x64``, ``32x32``
and ``8x16x8`` (1,024 devices each). Reported from ``AutoResult.stats``: evaluations, evaluations per second
over the search's wall time, why it stopped and its seconds; the simulated step time found against the
start's; and the time spent in ``redist.synthesize`` (timed around every call partir_core makes), with
the number of calls and its share of the whole ``lower()`` (the search, then the final choice lowered): pricing
candidates plans their reshards, and on large meshes that can be most of the search. Wall-clock figures on the
machine that runs it: say how loaded it was. A progress bar over the cells is drawn on stderr while it runs, on
a terminal.

    python bench/autopartition_meshes.py [--time-budget 20] [--models transformer,flax_lm]
                                         [--meshes 2x4,16x64,32x32,8x16x8] [--seed 0] [--no-progress]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

import partir_core as pc  # noqa: E402
import redist  # noqa: E402
from bench import flax_lm, progress  # noqa: E402
from partir_core import models, reshard  # noqa: E402
from redist.synthesis import cases  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "autopartition_meshes.json")
SIZE = {"vocab": 512, "d_model": 256, "layers": 2, "heads": 8, "seq": 32, "batch": 64}
MODELS = {"transformer": models.transformer, "flax_lm": flax_lm.flax_lm}
MESHES = {"2x4": {"batch": 2, "model": 4}, "16x64": {"batch": 16, "model": 64}, "32x32": {"batch": 32, "model": 32},
          "8x16x8": {"dp": 8, "fsdp": 16, "tp": 8}}


class _Timed:
    """``redist.synthesize`` as partir_core calls it, timed: calls and seconds (redist's own calls inside a
    synthesis go to the module's function, not through this)."""

    def __init__(self, inner):
        self.inner, self.calls, self.seconds = inner, 0, 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - t0


def cell(model: str, mesh_name: str, args) -> dict:
    m = MODELS[model](**SIZE)
    ins = m.init(jax.random.key(0))
    mesh = redist.Mesh(MESHES[mesh_name])
    reshard.clear_cache()
    cases.searched_plan.cache_clear()
    timed = _Timed(redist.synthesize)
    redist.synthesize = timed
    try:
        tactic = pc.AutomaticPartition(time_budget_s=args.time_budget, seed=args.seed, progress=False)
        t0 = time.perf_counter()
        res = pc.jit(m.step, mesh, [tactic]).lower(*ins).automatic
        lower_s = time.perf_counter() - t0
    finally:
        redist.synthesize = timed.inner
    st = res.stats
    return {"model": model, "mesh": mesh_name, "devices": mesh.size, "evaluations": st.evaluations,
            "evals_per_s": st.evals_per_s, "stopped": st.stopped, "search_s": st.seconds, "lower_s": lower_s,
            "synthesize_calls": timed.calls, "synthesize_s": timed.seconds, "step_time_s": res.step_time_s,
            "start_time_s": res.start_time_s, "tactics": [str(t) for t in res.tactics]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-budget", type=float, default=20.0)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--meshes", default=",".join(MESHES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=RESULTS)
    progress.add_option(ap)
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    print(f"{'model':<12}{'mesh':<8}{'evals':>6}{'evals/s':>9}{'search s':>9}{'stopped':>12}{'synth s':>9}"
          f"{'calls':>7}{'synth %':>8}{'step ms':>9}{'start ms':>10}")
    rows = []
    cells = [(mesh_name, model) for mesh_name in args.meshes.split(",") for model in args.models.split(",")]
    for mesh_name, model in progress.bar(cells, desc="cells", unit="cell", shown=not args.no_progress):
        r = cell(model, mesh_name, args)
        rows.append(r)
        progress.write(f"{model:<12}{mesh_name:<8}{r['evaluations']:>6}{r['evals_per_s']:>9.1f}{r['search_s']:>9.1f}"
                       f"{r['stopped']:>12}{r['synthesize_s']:>9.1f}{r['synthesize_calls']:>7}"
                       f"{100 * r['synthesize_s'] / r['lower_s']:>7.0f}%{r['step_time_s'] * 1e3:>9.3f}"
                       f"{r['start_time_s'] * 1e3:>10.3f}")
    out = {"time_budget_s": args.time_budget, "seed": args.seed, "size": SIZE, "rows": rows,
           "load_average_at_start": load, "load_average_at_end": os.getloadavg()[0],
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                      f"Python {platform.python_version()}, JAX {jax.__version__}"}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {os.path.relpath(args.out)}")
    return out


if __name__ == "__main__":
    main()
