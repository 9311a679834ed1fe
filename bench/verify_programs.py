"""How long ``Partitioned.verify`` takes per program, and how it grows with layers and devices.

Setup. 16 host devices. (a) Every model of the zoo (``examples/zoo``) and of the bench (``partir_core.models``)
under every preset and composition that applies (``BP``, ``MP``, ``Z3``, ``BP+MP``, ``BP+MP+Z3``, ``EMB`` for the
models with embeddings) on the mesh ``batch=2, model=4``; (b) every pipelined program of ``bench/pipeline.py``
(its scanned transformer, ``S = 2, 4, 8`` stages, GPipe and circular, alone and beside batch and Megatron
parallelism; ``--quick``: its quick cases). Per program: the verdict, the local ops and reshards proved, the
seconds of lowering, and of ``verify`` started cold (:func:`partir_core.proof.clear_caches` first: no trace,
movement check or plan verdict kept from an earlier program; the lemmas, proved once per process, are kept)
as wall-clock seconds and as the CPU seconds of the process, which a loaded host inflates less. Target: at
most 10 s per program. (c) Growth: the transformer under ``BP+MP`` with 1, 2, 4 and 8 layers on ``batch=2,
model=4``, and with 2 layers on meshes of 4, 8 and 16 devices. The host's load average when the run starts
is recorded with the results (the host may be shared). Prints a table and saves
``bench/results/verify_programs.json``.

    python bench/verify_programs.py [--quick]     # --quick: the bench models, the quick pipelines, the growth
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=16").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

import redist  # noqa: E402
import partir_core as pc  # noqa: E402
from partir_core import models, proof, schedules  # noqa: E402

OUT = Path(__file__).parent / "results" / "verify_programs.json"
MESH = redist.Mesh({"batch": 2, "model": 4})
SCHEDULES = ("BP", "MP", "Z3", "BP+MP", "BP+MP+Z3", "EMB")


def measure(step, inputs, mesh, tactics) -> dict:
    """Lower ``step`` under ``tactics`` on ``mesh`` and verify it cold: the verdict and its seconds."""
    t = time.perf_counter()
    low = pc.jit(step, mesh, tactics).lower(*inputs)
    lower_s = time.perf_counter() - t
    proof.clear_caches()
    cpu = time.process_time()
    v = low.verify(timeout_s=60)
    return {"status": v.status, "verify_s": v.seconds, "verify_cpu_s": time.process_time() - cpu,
            "lower_s": lower_s, "reason": "" if v.ok else v.reason, "local_ops": v.details.get("local ops"),
            "reshards": v.details.get("reshards"), "plans": v.details.get("plans verified")}


def preset(step, inputs, schedule, mesh, model=None) -> dict:
    try:
        tactics = schedules.schedule(schedule, model or step, inputs, mesh=mesh)
    except pc.PartitionError as e:
        return {"status": "does not apply", "reason": str(e)}
    return measure(step, inputs, mesh, tactics)


def programs(quick: bool):
    """``(suite, name, schedule, measure())`` of every program to measure, measured as it is reached."""
    for name, make in models.MODELS.items():
        m = make()
        ins = m.init(jax.random.key(0))
        for schedule in SCHEDULES:
            yield "bench", name, schedule, lambda: preset(m.step, ins, schedule, MESH, m)
    if not quick:
        from examples import zoo

        for name in zoo.NAMES:
            step, ins = zoo.module(name).make()
            for schedule in SCHEDULES:
                yield "zoo", name, schedule, lambda: preset(step, ins, schedule, MESH)
    from bench import pipeline as bp  # after the backend has started with 16 devices (it asks for 8)

    m = models.scanned_transformer(**bp.MODEL)
    ins = m.init(jax.random.key(0))
    for s, mb, kind, repeats, comp in bp.pipeline_cases(quick):
        mesh, tactics = bp.pipeline_schedule(m, ins, s, mb, kind, repeats, comp)
        label = f"S={s} M={mb} {kind}" + (f" +{comp}" if comp else "")
        yield "pipeline", "scanned_transformer", label, lambda: measure(m.step, ins, mesh, tactics)


def growth() -> list[dict]:
    rows = []
    for layers in (1, 2, 4, 8):
        m = models.transformer(layers=layers)
        r = preset(m.step, m.init(jax.random.key(0)), "BP+MP", MESH, m)
        rows.append({"layers": layers, "devices": MESH.size, **r})
    for shape in ((2, 2), (2, 4), (4, 4)):
        mesh = redist.Mesh({"batch": shape[0], "model": shape[1]})
        m = models.transformer(layers=2)
        r = preset(m.step, m.init(jax.random.key(0)), "BP+MP", mesh, m)
        rows.append({"layers": 2, "devices": mesh.size, **r})
    return rows


def main(argv=None) -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--quick", action="store_true")
    quick = args.parse_args(argv).quick
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs", flush=True)
    jax.devices()  # start the backend (16 devices) before anything imports bench.pipeline
    rows = []
    for suite, name, schedule, run in programs(quick):
        r = run()
        if r["status"] == "does not apply":
            continue
        rows.append({"suite": suite, "model": name, "schedule": schedule, **r})
        print(f"{suite:<8} {name:<20} {schedule:<22} {r['status']:<9} verify {r['verify_s']:5.2f} s "
              f"({r['verify_cpu_s']:5.2f} s CPU)  lower {r['lower_s']:5.2f} s  {r['local_ops']} local ops, "
              f"{r['reshards']} reshards  {r['reason'][:100]}", flush=True)
    grow = growth()
    for r in grow:
        print(f"transformer BP+MP, {r['layers']} layers, {r['devices']:>2} devices: {r['status']}, verify "
              f"{r['verify_s']:.2f} s ({r['verify_cpu_s']:.2f} s CPU), {r['local_ops']} local ops, "
              f"{r['reshards']} reshards", flush=True)
    proved = [r for r in rows if r["status"] == "proved"]
    summary = {"programs": len(rows), "proved": len(proved), "max_verify_s": max(r["verify_s"] for r in rows),
               "max_verify_cpu_s": max(r["verify_cpu_s"] for r in rows),
               "over_10s": [f"{r['model']} {r['schedule']}" for r in rows if r["verify_s"] > 10],
               "over_10s_cpu": [f"{r['model']} {r['schedule']}" for r in rows if r["verify_cpu_s"] > 10],
               "not_proved": [f"{r['suite']} {r['model']} {r['schedule']}: {r['reason']}" for r in rows
                              if r["status"] != "proved"],
               "load_average_at_start": load, "cpus": os.cpu_count()}
    print(json.dumps(summary, indent=1))
    OUT.write_text(json.dumps({"programs": rows, "growth": grow, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
