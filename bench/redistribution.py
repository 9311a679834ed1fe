"""Redistribution benchmark: redist's plans against XLA's own resharding, on bytes, memory and time.

Cases. Hand-written families on the meshes ``x=8``, ``x=2,y=4``, ``x=4,y=2`` and ``x=2,y=2,z=2`` (ranks 1-4):
transposes of a sharded dim, axis reorders within a dim, gathers, slices, axis swaps that need sub-axes, the
jax-ml/jax#21562 family (``P('y',None,'x') -> P(None,('x','y'),None)`` and variants), plus seeded random
pairs from ``bench/random_pairs.py`` on those meshes (no partial axes, rank >= 1, source != destination).
Every case is an f32 array of about ``--mib`` MiB (dims of the random pairs are doubled until it is).

Per case, measured identically for both sides:

- bytes: ours = ``redist.synthesize(src, dst).bytes_received`` (also read back from our compiled HLO as a
  check); XLA's = the collectives of ``jax.jit(lambda a: a, out_shardings=dst)`` parsed from its compiled HLO
  (``redist.xla_baseline``), counted per device as in ``redist.steps``; bound = ``redist.lower_bound_bytes``.
- memory: type level ``plan.peak_bytes``; ``compiled.memory_analysis()`` temp + output bytes of both compiled
  programs (ours: ``jax.jit(lambda a: redist.jax.reshard(a, dst, src=src), out_shardings=dst)``).
- modeled time (``redist.cost``) per topology preset: ours ``plan_time`` of the plan synthesized for that
  topology (``synthesize(src, dst, topology=...)``, cost-driven choice), XLA's ``records_time`` of its
  parsed collectives, at the measured size and at a large size (dim 0 scaled so the array is ``--model-mib``
  MiB; XLA is compiled again at that shape, nothing is run), where bandwidth rather than latency dominates.
- wall time on 8 host devices: both compiled programs on one input made once with
  ``jax.make_array_from_callback``; two warm-up runs each, then ``--repeats`` runs each, interleaved (the
  order alternates every round), each timed with ``time.perf_counter`` around the call and
  ``block_until_ready``; medians are compared (ratio from one run, since the machine is shared and noisy).
  Both results are checked against the host array once.
- MPI (``bench/mpi_replay_worker.py`` under ``.venv/bin/mpiexec -n 8``, ``-n 6`` for meshes ``x=6``,
  ``x=2,y=3``, ``x=3,y=2``, and ``-n 16`` for a few 16-device meshes without an XLA replay): ours (``redist.mpi.reshard``) vs XLA's parsed collective sequence replayed with
  mpi4py (same message sizes, groups and permute pairs; communication and local slices only, so it is slightly
  favoured) vs gather-then-slice (``Allgather`` of every shard, assemble, slice); partial sources: ours vs
  ``Allreduce``-then-slice. Method of timing: see the worker's docstring.

Outputs: a table on stdout (a progress bar on stderr while running, on a terminal),
``bench/results/redistribution.json``, ``bench/results/redistribution_speedup.png`` and
``bench/results/redistribution_bytes.png``.

    python bench/redistribution.py [--quick] [--repeats 21] [--mpi-repeats 11] [--no-mpi] [--no-progress]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import redist  # noqa: E402
from bench import plots, progress  # noqa: E402
from bench.random_pairs import random_pair  # noqa: E402
from redist import cost, xla_baseline as xb  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
TOPOLOGIES = ("tpu-v4", "nvlink-8", "2x8-nodes", "cpu-host")
MESHES = {"1d": "x=8", "2x4": "x=2,y=4", "4x2": "x=4,y=2", "2x2x2": "x=2,y=2,z=2"}


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    src: redist.ShardingType
    dst: redist.ShardingType


# ---------------------------------------------------------------------------------------------- cases
def _scaled(text: str, mesh: redist.Mesh, elements: int) -> redist.ShardingType:
    """The type ``text`` with every dim multiplied by powers of two (smallest dim first) until it has at least
    ``elements`` elements. Written with ``B`` for the base unit of a dim, e.g. ``f32[8{x}, 8]``."""
    t = redist.ShardingType.parse(text, mesh)
    return _grow(t, elements)


def _grow(t: redist.ShardingType, elements: int) -> redist.ShardingType:
    shape = list(t.shape)
    if not shape:
        return t
    while math.prod(shape) < elements:
        i = min(range(len(shape)), key=lambda j: (shape[j], j))
        shape[i] *= 2
    return redist.ShardingType(t.mesh, tuple(shape), t.dtype, t.dims, t.partial)


def _pair(name, family, mesh_text, src, dst, elements) -> Case:
    mesh = redist.Mesh.parse(mesh_text)
    s = _scaled(src, mesh, elements)
    d = redist.ShardingType(mesh, s.shape, s.dtype, redist.ShardingType.parse(dst, mesh).dims)
    return Case(name, family, s, d)


# (family, mesh, src, dst). Dims are written at a small size that every layout divides; they are scaled up.
HAND = [
    # transposes of a sharded dim
    ("transpose", "x=8", "f32[8{x},8]", "f32[8,8{x}]"),
    ("transpose", "x=2,y=4", "f32[8{x,y},8]", "f32[8,8{x,y}]"),
    ("transpose", "x=4,y=2", "f32[8{x},8{y}]", "f32[8{y},8{x}]"),
    ("transpose", "x=2,y=4", "f32[8{x},8{y}]", "f32[8{y},8{x}]"),
    ("transpose", "x=2,y=2,z=2", "f32[8{x,y},8{z}]", "f32[8{z},8{y,x}]"),
    ("transpose", "x=2,y=2,z=2", "f32[8{x},8{y,z}]", "f32[8{y,z},8{x}]"),
    ("transpose", "x=4,y=2", "f32[8{x,y},8,8]", "f32[8,8,8{x,y}]"),
    ("transpose", "x=2,y=4", "f32[8{y},8{x},8,8]", "f32[8,8,8{x},8{y}]"),
    # axis reorders within a dim
    ("reorder", "x=2,y=4", "f32[64{x,y}]", "f32[64{y,x}]"),
    ("reorder", "x=4,y=2", "f32[8{x,y},8]", "f32[8{y,x},8]"),
    ("reorder", "x=2,y=2,z=2", "f32[8{x,y,z},8]", "f32[8{z,y,x},8]"),
    ("reorder", "x=2,y=2,z=2", "f32[8,8{x,z},8]", "f32[8,8{z,x},8]"),
    ("reorder", "x=2,y=4", "f32[8,8{y,x},8]", "f32[8,8{x,y},8]"),
    # gathers
    ("gather", "x=8", "f32[64{x}]", "f32[64]"),
    ("gather", "x=2,y=4", "f32[8{x,y},8]", "f32[8{x},8]"),
    ("gather", "x=4,y=2", "f32[8{x},8{y}]", "f32[8,8{y}]"),
    ("gather", "x=2,y=2,z=2", "f32[8{x},8{y},8{z}]", "f32[8,8,8{z}]"),
    ("gather", "x=2,y=4", "f32[8{y,x},8]", "f32[8{y},8]"),
    # slices
    ("slice", "x=8", "f32[8,8]", "f32[8,8{x}]"),
    ("slice", "x=2,y=4", "f32[8,8]", "f32[8{y},8{x}]"),
    ("slice", "x=2,y=2,z=2", "f32[8{x},8]", "f32[8{x},8{z,y}]"),
    # gather + move (memory-bounded)
    ("mixed", "x=2,y=4", "f32[8{x,y},8]", "f32[8,8{y}]"),
    ("mixed", "x=4,y=2", "f32[8{x},8,8]", "f32[8,8{y},8]"),
    ("mixed", "x=2,y=2,z=2", "f32[8{x,y},8{z}]", "f32[8{z},8]"),
    # swaps that need sub-axes
    ("sub-axes", "x=2,y=4", "f32[8{x},8]", "f32[8{y},8]"),
    ("sub-axes", "x=4,y=2", "f32[8{x},8{y}]", "f32[8{y},8{x}]"),
    ("sub-axes", "x=2,y=4", "f32[8{y},8{x}]", "f32[8{x},8{y}]"),
    # the jax-ml/jax#21562 family
    ("21562", "x=4,y=2", "f32[16{y},16,16{x}]", "f32[16,16{x,y},16]"),
    ("21562", "x=4,y=2", "f32[16{y},16,16{x}]", "f32[16,16{y,x},16]"),
    ("21562", "x=4,y=2", "f32[16{x},16,16{y}]", "f32[16,16{x,y},16]"),
    ("21562", "x=2,y=4", "f32[16{y},16,16{x}]", "f32[16,16{x,y},16]"),
    ("21562", "x=2,y=4", "f32[16{x},16,16{y}]", "f32[16,16{y,x},16]"),
    ("21562", "x=4,y=2", "f32[16{y},16,16{x}]", "f32[16{x,y},16,16]"),
    ("21562", "x=2,y=2,z=2", "f32[16{z},16,16{x,y}]", "f32[16,16{x,y,z},16]"),
    ("21562", "x=2,y=4", "f32[16{x},16,16{y}]", "f32[16{y,x},16,16]"),
    ("21562", "x=4,y=2", "f32[16{y},16{x},16]", "f32[16,16,16{x,y}]"),
    ("21562", "x=2,y=2,z=2", "f32[16{y},16,16{x},16{z}]", "f32[16,16{x,y,z},16,16]"),
]

# Non-power-of-two meshes, for the MPI run under -n 6 (XLA compiled on 6 of the 8 host devices).
HAND6 = [
    ("n6", "x=6", "f32[12{x},12]", "f32[12,12{x}]"),
    ("n6", "x=6", "f32[12{x},12]", "f32[12,12]"),
    ("n6", "x=2,y=3", "f32[12{x},12{y}]", "f32[12{y},12{x}]"),
    ("n6", "x=2,y=3", "f32[12{x,y},12]", "f32[12,12{y,x}]"),
    ("n6", "x=3,y=2", "f32[12{y},12,12{x}]", "f32[12,12{x,y},12]"),
    ("n6", "x=3,y=2", "f32[12{x},12]", "f32[12{y},12]"),
]

# 16 ranks, MPI only (JAX here has 8 devices, so no XLA replay): ours vs gather-then-slice.
HAND16 = [
    ("n16", "x=2,y=8", "f32[16{y},16,16{x}]", "f32[16,16{x,y},16]"),
    ("n16", "x=4,y=4", "f32[16{x},16{y}]", "f32[16{y},16{x}]"),
    ("n16", "x=2,y=8", "f32[16{x,y},16]", "f32[16,16{x,y}]"),
    ("n16", "x=2,y=2,z=4", "f32[16{x,y},16{z}]", "f32[16{z},16{y,x}]"),
]

# Partial sources, MPI only (JAX arrays do not carry pending sums): ours vs Allreduce-then-slice.
PARTIAL = [
    ("partial", "x=8", "f32[8,8] partial{x}", "f32[8{x},8]"),
    ("partial", "x=8", "f32[8,8] partial{x}", "f32[8,8]"),
    ("partial", "x=2,y=4", "f32[8{x},8] partial{y}", "f32[8{x},8{y}]"),
    ("partial", "x=2,y=4", "f32[8{x},8] partial{y}", "f32[8,8{y}]"),
    ("partial", "x=4,y=2", "f32[8,8] partial{x,y}", "f32[8{y},8{x}]"),
    ("partial", "x=2,y=2,z=2", "f32[8{x},8] partial{y,z}", "f32[8{z},8{x,y}]"),
]

QUICK = {"transpose": 2, "reorder": 1, "gather": 1, "slice": 1, "mixed": 1, "sub-axes": 1, "21562": 2,
         "random": 2, "n6": 2, "partial": 2}


def build_cases(mib: float, n_random: int, seed: int, quick: bool):
    elements = int(mib * 2**20 / 4)
    counts: dict[str, int] = {}

    def take(family):
        counts[family] = counts.get(family, 0) + 1
        return not quick or counts[family] <= QUICK.get(family, 1)

    main, six, partial, sixteen = [], [], [], []
    for i, (fam, m, s, d) in enumerate(HAND):
        if take(fam):
            main.append(_pair(f"{fam}-{i}", fam, m, s, d, elements))
    rng = random.Random(seed)
    per_mesh = max(1, n_random // len(MESHES))
    for key, m in MESHES.items():
        mesh = redist.Mesh.parse(m)
        got = 0
        while got < per_mesh:
            src, dst = random_pair(rng, mesh=mesh, max_rank=4, partial=False)
            if src.rank == 0 or src == dst:
                continue
            got += 1
            s = _grow(src, elements)
            d = redist.ShardingType(mesh, s.shape, s.dtype, dst.dims)
            if take("random"):
                main.append(Case(f"random-{key}-{got}", "random", s, d))
    for i, (fam, m, s, d) in enumerate(HAND6):
        if take(fam):
            six.append(_pair(f"{fam}-{i}", fam, m, s, d, elements))
    for i, (fam, m, s, d) in enumerate(PARTIAL):
        if take(fam):
            mesh = redist.Mesh.parse(m)
            st = _scaled(s, mesh, elements)
            dt = redist.ShardingType(mesh, st.shape, st.dtype, redist.ShardingType.parse(d, mesh).dims)
            partial.append(Case(f"{fam}-{i}", fam, st, dt))
    if not quick:
        for i, (fam, m, s, d) in enumerate(HAND16):
            sixteen.append(_pair(f"{fam}-{i}", fam, m, s, d, elements))
    return main, six, partial, sixteen


# ---------------------------------------------------------------------------------------------- measuring
def geomean(xs) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(statistics.fmean(map(math.log, xs))) if xs else float("nan")


def _ratio(xla: float, ours: float) -> float:
    if ours == 0:
        return 1.0 if xla == 0 else float("inf")
    return xla / ours


def _large(t: redist.ShardingType, mib: float) -> redist.ShardingType:
    """``t`` with dim 0 multiplied by a power of two until the array is at least ``mib`` MiB."""
    shape = list(t.shape)
    while math.prod(shape) * t.itemsize < mib * 2**20:
        shape[0] *= 2
    return redist.ShardingType(t.mesh, tuple(shape), t.dtype, t.dims, t.partial)


def modeled(src, dst, xla_collectives) -> dict:
    """Per topology: our plan chosen for that topology (``synthesize(..., topology=)``) against XLA's
    collectives, both priced by ``redist.cost``."""
    out = {}
    for name in TOPOLOGIES:
        topo = cost.topology(name, src.mesh)
        plan = redist.synthesize(src, dst, topology=topo)
        ours, theirs = cost.plan_time(plan, topo), cost.records_time(xla_collectives, topo)
        out[name] = {"ours_s": ours, "xla_s": theirs, "speedup": _ratio(theirs, ours),
                     "plan": [str(s) for s in plan.steps]}
    return out


def time_pair(f_ours, f_xla, x, repeats: int):
    """Interleaved medians (seconds) of two compiled programs on the same input."""
    for _ in range(2):
        f_ours(x).block_until_ready()
        f_xla(x).block_until_ready()
    t_ours, t_xla = [], []
    for r in range(repeats):
        order = ((f_ours, t_ours), (f_xla, t_xla)) if r % 2 == 0 else ((f_xla, t_xla), (f_ours, t_ours))
        for f, acc in order:
            t0 = time.perf_counter()
            f(x).block_until_ready()
            acc.append(time.perf_counter() - t0)
    return statistics.median(t_ours), statistics.median(t_xla)


def measure_case(case: Case, repeats: int, model_mib: float, run: bool = True) -> dict:
    src, dst = case.src, case.dst
    plan = redist.synthesize(src, dst)
    xla = xb.compile_xla(src, dst)
    ours = xb.compile_redist(src, dst)
    row = {
        "name": case.name, "family": case.family, "mesh": str(src.mesh), "src": str(src), "dst": str(dst),
        "plan": [str(s) for s in plan.steps],
        "xla": [c.to_dict() for c in xla.collectives],
        "bytes": {"ours": plan.bytes_received, "ours_hlo": ours.bytes_received, "xla": xla.bytes_received,
                  "bound": redist.lower_bound_bytes(src, dst)},
        "memory": {"plan_peak": plan.peak_bytes, "type_bound": max(src.local_bytes, dst.local_bytes),
                   "ours_temp_plus_output": ours.memory.temp_plus_output,
                   "xla_temp_plus_output": xla.memory.temp_plus_output,
                   "ours": vars(ours.memory), "xla": vars(xla.memory)},
        "modeled": modeled(src, dst, xla.collectives),
    }
    big_src, big_dst = _large(src, model_mib), _large(dst, model_mib)
    big_xla = xb.compile_xla(big_src, big_dst)
    row["modeled_large"] = modeled(big_src, big_dst, big_xla.collectives)
    row["modeled_large"]["shape"] = list(big_src.shape)
    if run:
        x, host = xb.make_input(src)
        f_ours, f_xla = ours.compiled, xla.compiled
        ok = bool(np.array_equal(np.asarray(f_ours(x)), host)) and bool(np.array_equal(np.asarray(f_xla(x)), host))
        t_ours, t_xla = time_pair(f_ours, f_xla, x, repeats)
        row["measured"] = {"ours_s": t_ours, "xla_s": t_xla, "speedup": t_xla / t_ours, "correct": ok}
        del x
    return row


# ---------------------------------------------------------------------------------------------- MPI
def run_mpi(rows_by_size: dict[int, list[dict]], repeats: int, timeout: int) -> dict:
    """Run the MPI worker once per communicator size; returns {size: worker output}."""
    out = {}
    mpiexec = os.path.join(ROOT, ".venv", "bin", "mpiexec")
    python = sys.executable
    worker = os.path.join(ROOT, "bench", "mpi_replay_worker.py")
    for size, cases in rows_by_size.items():
        if not cases:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cin, cout = os.path.join(tmp, "cases.json"), os.path.join(tmp, "out.json")
            with open(cin, "w") as f:
                json.dump(cases, f)
            cmd = [mpiexec, "-n", str(size), python, worker, cin, cout, "--repeats", str(repeats)]
            t0 = time.perf_counter()
            env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            if proc.returncode != 0 or not os.path.exists(cout):
                out[size] = {"error": f"mpiexec -n {size} failed (rc {proc.returncode}): "
                                      f"{(proc.stderr or proc.stdout)[-2000:]}"}
                continue
            with open(cout) as f:
                out[size] = json.load(f)
            out[size]["wall_s"] = time.perf_counter() - t0
    return out


def _mpi_case(item) -> dict:
    """A case for the MPI worker: a measured row (with XLA's collectives) or a partial Case (none)."""
    if isinstance(item, Case):
        return {"name": item.name, "family": item.family, "mesh": str(item.src.mesh), "src": str(item.src),
                "dst": str(item.dst), "xla": None}
    return {k: item[k] for k in ("name", "family", "mesh", "src", "dst", "xla")}


# ---------------------------------------------------------------------------------------------- report
def summarize(rows: list[dict], mpi: dict) -> dict:
    s: dict = {"cases": len(rows)}
    b_more = [r["name"] for r in rows if r["bytes"]["ours"] > r["bytes"]["xla"] + 1e-9]
    m_more = [r["name"] for r in rows
              if r["memory"]["ours_temp_plus_output"] > r["memory"]["xla_temp_plus_output"]]
    s["bytes"] = {
        "ours_total": sum(r["bytes"]["ours"] for r in rows), "xla_total": sum(r["bytes"]["xla"] for r in rows),
        "bound_total": sum(r["bytes"]["bound"] for r in rows),
        "ours_at_bound": sum(r["bytes"]["ours"] == r["bytes"]["bound"] for r in rows),
        "xla_at_bound": sum(abs(r["bytes"]["xla"] - r["bytes"]["bound"]) < 1e-9 for r in rows),
        "ours_more_than_xla": b_more,
        "ours_less_than_xla": sum(r["bytes"]["ours"] < r["bytes"]["xla"] - 1e-9 for r in rows),
        "xla_over_ours_geomean": geomean([_ratio(r["bytes"]["xla"], r["bytes"]["ours"]) for r in rows
                                         if r["bytes"]["ours"] > 0]),
        "hlo_mismatch": [r["name"] for r in rows if abs(r["bytes"]["ours"] - r["bytes"]["ours_hlo"]) > 1e-9],
    }
    s["memory"] = {
        "ours_more_than_xla": m_more,
        "ours_less_than_xla": sum(r["memory"]["ours_temp_plus_output"] < r["memory"]["xla_temp_plus_output"]
                                  for r in rows),
        "xla_over_ours_geomean": geomean([r["memory"]["xla_temp_plus_output"] / r["memory"]["ours_temp_plus_output"]
                                          for r in rows if r["memory"]["ours_temp_plus_output"]]),
        "xla_over_ours_max": max((r["memory"]["xla_temp_plus_output"] / max(1, r["memory"]["ours_temp_plus_output"])
                                  for r in rows), default=float("nan")),
    }
    for key in ("modeled", "modeled_large"):
        s[key] = {}
        for name in TOPOLOGIES:
            sp = [r[key][name]["speedup"] for r in rows if r[key][name]["xla_s"] > 0 or r[key][name]["ours_s"] > 0]
            worse = [r["name"] for r in rows if r[key][name]["speedup"] < 1 - 1e-9]
            s[key][name] = {"geomean": geomean(sp), "max": max(sp, default=float("nan")),
                            "min": min(sp, default=float("nan")), "cases_slower": worse}
    meas = [r["measured"] for r in rows if "measured" in r]
    if meas:
        s["measured_host"] = {"geomean": geomean([m["speedup"] for m in meas]),
                              "max": max(m["speedup"] for m in meas), "min": min(m["speedup"] for m in meas),
                              "all_correct": all(m["correct"] for m in meas),
                              "cases_slower": [r["name"] for r in rows if "measured" in r
                                               and r["measured"]["speedup"] < 1]}
    for size, res in mpi.items():
        if "error" in res:
            s[f"mpi_n{size}"] = {"error": res["error"][:300]}
            continue
        cs = res["cases"]

        plain = [c for c in cs if c["family"] != "partial"]
        part = [c for c in cs if c["family"] == "partial"]
        s[f"mpi_n{size}"] = {
            "cases": len(cs), "all_correct": all(c["correct"] for c in cs), "wall_s": res.get("wall_s"),
            # ours = redist.mpi.reshard (with its argument-agreement Allgather); program = run_program only
            "ours_vs_xla_replay_geomean": geomean([c["xla_s"] / c["ours_s"] for c in plain if c.get("xla_s")]),
            "program_vs_xla_replay_geomean": geomean([c["xla_s"] / c["ours_program_s"] for c in plain
                                                      if c.get("xla_s")]),
            "ours_vs_gather_slice_geomean": geomean([c["baseline_s"] / c["ours_s"] for c in plain]),
            "program_vs_gather_slice_geomean": geomean([c["baseline_s"] / c["ours_program_s"] for c in plain]),
            "partial_ours_vs_allreduce_slice_geomean": geomean([c["baseline_s"] / c["ours_s"] for c in part]),
            "partial_program_vs_allreduce_slice_geomean": geomean([c["baseline_s"] / c["ours_program_s"]
                                                                   for c in part]),
        }
    return s


def print_table(rows: list[dict]) -> None:
    head = (f"{'case':<16}{'mesh':<13}{'ours B':>10}{'XLA B':>10}{'bound':>10}{'ours mem':>10}{'XLA mem':>10}"
            f"  {'tpu':>6}{'nvl':>6}{'2x8':>6}{'cpu':>6}  {'host':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        b, m, ml = r["bytes"], r["memory"], r["modeled_large"]
        meas = r.get("measured", {}).get("speedup", float("nan"))
        print(f"{r['name']:<16}{r['mesh']:<13}{b['ours']:>10.0f}{b['xla']:>10.0f}{b['bound']:>10.0f}"
              f"{m['ours_temp_plus_output']:>10}{m['xla_temp_plus_output']:>10}"
              f"  {ml['tpu-v4']['speedup']:>6.2f}{ml['nvlink-8']['speedup']:>6.2f}{ml['2x8-nodes']['speedup']:>6.2f}"
              f"{ml['cpu-host']['speedup']:>6.2f}  {meas:>6.2f}")
    print("(B: bytes received per device; mem: memory_analysis temp+output; speedups = XLA time / ours, "
          "modeled at the large size; host = measured on 8 host devices)")


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a ~2-minute smoke run: a few cases per family")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per side on host devices (default 21; quick 5)")
    ap.add_argument("--mib", type=float, default=1.0, help="array size of a case in MiB (default 1)")
    ap.add_argument("--model-mib", type=float, default=256.0, help="array size for the large modeled size")
    ap.add_argument("--random", type=int, default=28, help="random pairs in all (split over the 4 meshes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mpi-repeats", type=int, default=None, help="timed rounds under MPI (default 11; quick 3)")
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--out", default=os.path.join(RESULTS, "redistribution.json"))
    progress.add_option(ap)
    args = ap.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 21)
    logging.getLogger("jax").setLevel(logging.ERROR)
    t_start = time.perf_counter()
    if len(jax.devices()) < 8:
        raise SystemExit("needs 8 JAX devices")
    main_cases, six, partial, sixteen = build_cases(args.mib, args.random, args.seed, args.quick)
    rows, six_rows = [], []
    for case in progress.bar(main_cases + six, desc="JAX cases", shown=not args.no_progress):
        row = measure_case(case, repeats, args.model_mib, run=case.src.mesh.size == 8)
        (rows if case.src.mesh.size == 8 else six_rows).append(row)
    t_jax = time.perf_counter() - t_start
    mpi = {}
    if not args.no_mpi:
        by_size: dict[int, list[dict]] = {8: [_mpi_case(r) for r in rows],
                                          6: [_mpi_case(r) for r in six_rows]}
        for c in partial + sixteen:
            by_size.setdefault(c.src.mesh.size, []).append(_mpi_case(c))
        print(f"MPI: {sum(map(len, by_size.values()))} cases under mpiexec -n {'/'.join(map(str, by_size))} ...",
              flush=True)
        mpi = run_mpi(by_size, args.mpi_repeats or (3 if args.quick else 11), timeout=900)
    summary = summarize(rows, mpi)
    summary["six_device_cases"] = summarize(six_rows, {}) if six_rows else {}
    summary["seconds"] = {"jax_part": t_jax, "total": time.perf_counter() - t_start}
    summary["machine"] = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                          f"jax {jax.__version__}, shared with other jobs")
    summary["settings"] = {"quick": args.quick, "repeats": repeats, "mpi_repeats": args.mpi_repeats or
                           (3 if args.quick else 11), "mib": args.mib, "model_mib": args.model_mib, "seed": args.seed}
    print_table(rows)
    _print_summary(summary)
    os.makedirs(RESULTS, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "cases": rows, "six_device_cases": six_rows, "mpi": mpi}, f, indent=1,
                  default=float)
    figures = plots.draw("redistribution", args.out)
    print(f"wrote {os.path.relpath(args.out)} and {', '.join(os.path.relpath(f) for f in figures)} "
          f"({summary['seconds']['total']:.0f} s)")
    return summary


def _print_summary(s: dict) -> None:
    b, m = s["bytes"], s["memory"]
    print(f"\n{s['cases']} cases on 8 devices")
    print(f"bytes received: ours {b['ours_total']:.0f}, XLA {b['xla_total']:.0f}, bound {b['bound_total']:.0f} "
          f"(sums over cases); ours at bound {b['ours_at_bound']}, XLA at bound {b['xla_at_bound']}; "
          f"ours < XLA in {b['ours_less_than_xla']}; ours > XLA in {b['ours_more_than_xla'] or 'none'}")
    print(f"compiled memory (temp+output): ours < XLA in {m['ours_less_than_xla']}, ours > XLA in "
          f"{m['ours_more_than_xla'] or 'none'}; XLA/ours geomean {m['xla_over_ours_geomean']:.2f}, "
          f"max {m['xla_over_ours_max']:.2f}")
    for key, label in (("modeled", "modeled, measured size"), ("modeled_large", "modeled, large size")):
        for name, v in s[key].items():
            print(f"{label:<24}{name:<11} geomean {v['geomean']:.2f}x  max {v['max']:.2f}x  min {v['min']:.2f}x"
                  f"  slower in {len(v['cases_slower'])}")
    if "measured_host" in s:
        h = s["measured_host"]
        print(f"measured, host devices   geomean {h['geomean']:.2f}x  max {h['max']:.2f}x  min {h['min']:.2f}x  "
              f"all correct: {h['all_correct']}")
    for k, v in s.items():
        if k.startswith("mpi_"):
            if "error" in v:
                print(f"{k}: ERROR {v['error']}")
            else:
                print(f"{k} (reshard / run_program): vs XLA replay {v['ours_vs_xla_replay_geomean']:.2f}x / "
                      f"{v['program_vs_xla_replay_geomean']:.2f}x, vs gather-then-slice "
                      f"{v['ours_vs_gather_slice_geomean']:.2f}x / {v['program_vs_gather_slice_geomean']:.2f}x, "
                      f"partial vs allreduce-then-slice {v['partial_ours_vs_allreduce_slice_geomean']:.2f}x / "
                      f"{v['partial_program_vs_allreduce_slice_geomean']:.2f}x (geomeans), "
                      f"all correct: {v['all_correct']}")


if __name__ == "__main__":
    main()
