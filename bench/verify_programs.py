"""How long ``Partitioned.verify`` takes per program, and how it grows with layers and devices.

Setup. 16 host devices. (a) Every model of the zoo (``examples/zoo``) and of the bench (``partir_core.models``)
under every preset and composition that applies (``BP``, ``MP``, ``Z3``, ``BP+MP``, ``BP+MP+Z3``, ``EMB`` for the
models with embeddings) on the mesh ``batch=2, model=4``: the verdict, the seconds of ``verify`` (a fresh
process's caches of plan verdicts warm as the programs go, as in a session that lowers many programs) and of
lowering, the local ops and reshards proved. Target: at most 10 s per program. (b) Growth: the transformer
under ``BP+MP`` with 1, 2, 4 and 8 layers on ``batch=2, model=4``, and with 2 layers on meshes of 4, 8 and 16
devices. Prints a table and saves ``bench/results/verify_programs.json``.

    python bench/verify_programs.py [--quick]     # --quick: the bench models and the growth only
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=16").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

import redist  # noqa: E402
import partir_core as pc  # noqa: E402
from partir_core import models, schedules  # noqa: E402

OUT = Path(__file__).parent / "results" / "verify_programs.json"
MESH = redist.Mesh({"batch": 2, "model": 4})
SCHEDULES = ("BP", "MP", "Z3", "BP+MP", "BP+MP+Z3", "EMB")


def measure(step, inputs, schedule, mesh, model=None) -> dict:
    """Lower ``step`` under ``schedule`` on ``mesh`` and verify it: the verdict and its seconds."""
    try:
        tactics = schedules.schedule(schedule, model or step, inputs, mesh=mesh)
    except pc.PartitionError as e:
        return {"status": "does not apply", "reason": str(e)}
    t = time.perf_counter()
    low = pc.jit(step, mesh, tactics).lower(*inputs)
    lower_s = time.perf_counter() - t
    v = low.verify(timeout_s=60)
    return {"status": v.status, "verify_s": v.seconds, "lower_s": lower_s, "reason": "" if v.ok else v.reason,
            "local_ops": v.details.get("local ops"), "reshards": v.details.get("reshards"),
            "plans": v.details.get("plans verified")}


def programs(quick: bool):
    """``(suite, name, step, inputs, model)`` of every program to measure."""
    for name, make in models.MODELS.items():
        m = make()
        yield "bench", name, m.step, m.init(jax.random.key(0)), m
    if not quick:
        from examples import zoo

        for name in zoo.NAMES:
            step, inputs = zoo.module(name).make()
            yield "zoo", name, step, inputs, None


def growth() -> list[dict]:
    rows = []
    for layers in (1, 2, 4, 8):
        m = models.transformer(layers=layers)
        r = measure(m.step, m.init(jax.random.key(0)), "BP+MP", MESH, m)
        rows.append({"layers": layers, "devices": MESH.size, **r})
    for shape in ((2, 2), (2, 4), (4, 4)):
        mesh = redist.Mesh({"batch": shape[0], "model": shape[1]})
        m = models.transformer(layers=2)
        r = measure(m.step, m.init(jax.random.key(0)), "BP+MP", mesh, m)
        rows.append({"layers": 2, "devices": mesh.size, **r})
    return rows


def main(argv=None) -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--quick", action="store_true")
    quick = args.parse_args(argv).quick
    rows = []
    for suite, name, step, inputs, model in programs(quick):
        for schedule in SCHEDULES:
            r = measure(step, inputs, schedule, MESH, model)
            if r["status"] == "does not apply":
                continue
            rows.append({"suite": suite, "model": name, "schedule": schedule, **r})
            print(f"{suite:<5} {name:<20} {schedule:<9} {r['status']:<9} verify {r['verify_s']:5.2f} s  "
                  f"lower {r['lower_s']:5.2f} s  {r['local_ops']} local ops, {r['reshards']} reshards  "
                  f"{r['reason'][:100]}", flush=True)
    grow = growth()
    for r in grow:
        print(f"transformer BP+MP, {r['layers']} layers, {r['devices']:>2} devices: {r['status']}, verify "
              f"{r['verify_s']:.2f} s, {r['local_ops']} local ops, {r['reshards']} reshards", flush=True)
    proved = [r for r in rows if r["status"] == "proved"]
    summary = {"programs": len(rows), "proved": len(proved), "max_verify_s": max(r["verify_s"] for r in rows),
               "over_10s": [f"{r['model']} {r['schedule']}" for r in rows if r["verify_s"] > 10],
               "not_proved": [f"{r['suite']} {r['model']} {r['schedule']}: {r['reason']}" for r in rows
                              if r["status"] != "proved"]}
    print(json.dumps(summary, indent=1))
    OUT.write_text(json.dumps({"programs": rows, "growth": grow, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
