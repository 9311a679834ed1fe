"""Partitioning benchmark: partir_core's schedules against XLA partitioning the same step, per model.

Setup. 8 host devices as the 2-axis mesh ``batch=2, model=4``; the models of ``partir_core.models`` (mlp,
transformer, gnn, and the scanned models: scanned_mlp and scanned_transformer, whose layers run in one
``lax.scan`` over stacked weights; default sizes) and the schedule presets of ``partir_core.schedules`` and
their compositions (EMB only for the transformers, which have embeddings). Per model x schedule:

- (a) match: ``pf(*inputs)`` against the unpartitioned step (rtol 1e-4, atol 1e-5).
- (b) bytes: ours = the sum of ``pf.lower(*inputs).collectives`` bytes times their ``trips`` (redist's
  per-device accounting; a collective in a loop body counts once per iteration), also read back from our
  compiled HLO; XLA's = ``jax.jit(step, in_shardings=..., out_shardings=...)`` with OUR input and output
  shardings (``NamedSharding`` of the lowered program's input and output types), compiled, its collectives
  parsed as ``redist.hlo.parse_hlo`` parses them, each counted ``known_trip_count`` times when it
  is in a while loop's body (``loop_collectives``; per device, same accounting, max over devices).
- (c) time: per model, all its cases' compiled programs (ours and XLA's) on the same device-resident inputs,
  timed together (``interleaved_times``): 2 warm-up calls each, then ``--rounds`` rounds in which every program
  runs a burst of ``--repeats`` calls (each timed with ``time.perf_counter`` around the call and
  ``block_until_ready``), the order reversed every other round; a program's time is the minimum over rounds of
  its per-round median (the host's speed drifts over seconds; programs timed in the same
  round share its state, and the minimum keeps the undisturbed rounds); ratio = ours / XLA.
- (d) memory: the simulator's ``peak_bytes`` (argument + output + peak temporaries, per device) against
  ``compiled.memory_analysis()`` argument + output + temp - alias of OUR compiled program (the target: the
  simulator models our program); XLA's program's figure is reported alongside, and the ratio of the
  compiled temp + output bytes, ours / XLA's (``mem_ratio``).
- (e) Spearman rank correlation between ``simulate("cpu-host").step_time_s`` and our measured median step
  time, across the schedules of each model and pooled over all models.

Simulator calibration (``cpu-host`` compute and in-program collective latency; collective bandwidths from
the ``link`` section of the same profile, ``bench/calibrate_cpu_host.py``). Microbenchmarks, each a
replicated program on all 8 host devices at once run through ``partir_core.jit`` (so the 8 devices' share of
the machine's cores is included), all timed together by ``interleaved_times``: per-kernel overhead = slope of
time against the simulator's kernel count over chains of 16 and 96 small ``tanh(x @ w)`` layers; launch = a
one-kernel program (``x + 1``, 8 elements) less one kernel; FLOP/s = the marginal cost of FLOPs between chains
of 16 ``tanh(x @ w)`` at the two ``SIZES["matmul"]``; bytes/s = the marginal cost of bytes between 16 rounds of
``a = a*0.5 + sum(a)*1e-6`` (a reduction and an elementwise pass each: 3 passes over ``a``) at the two
``SIZES["stream"]``, sizes spanning these models' larger local ops and both split over XLA's CPU thread pool
(at 1024 f32 the fusions are not split, and the pool's dispatch, not the bytes, would make most of the
difference); the two programs of a pair have the same kernels,
so per-kernel costs cancel. In-program collective latency per kind (``calibrate_collectives``): the slope of
chains of 0 and 16 collectives of 2 KB on the mesh's axis groups (2, 4, 8 devices), fitted as
``a0 + per_peer * (k - 1)``; a collective inside one program costs far less than the profile's one-collective
program. ``combine_ratio``: XLA combines independent all-reduces into one, but each further operand still
costs most of a collective's latency; the ratio of that cost (1 vs 16 independent psums) to an all-reduce's
in the chain. The simulator charges the launch once per step, these latencies, and the profile's bandwidths.
Written with ``--calibrate`` as the ``compute`` section of the ``cpu-host`` calibration profile that the package
reads in this checkout, ``redist/profiles/cpu-host.json`` (package data; the simulator's ``cpu-host`` preset reads
it), or of the copy ``--profile PATH`` (then put in use with ``redist.cost.use_profile(PATH)``; see
``bench/calibration.py``); the run then simulates with it.

Outputs: a table on stdout (a progress bar over the schedules on stderr while running, on a terminal),
``bench/results/partitioning.json``, ``bench/results/partitioning.png`` (simulated vs measured step time per
model; bytes ours vs XLA).

    python bench/partitioning.py [--quick] [--rounds 8] [--repeats 10] [--calibrate [--profile PATH]] [--no-progress]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import partir_core as pc  # noqa: E402
import redist  # noqa: E402
from bench import plots, progress  # noqa: E402
from bench.calibration import PACKAGE_PROFILE, write_section  # noqa: E402
from partir_core import models, schedules, simulator  # noqa: E402
from redist import hlo  # noqa: E402
from redist import xla_baseline as xb  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
MESH = redist.Mesh({"batch": 2, "model": 4})
COMMON = ["BP", "MP", "Z2", "Z3", "BP+MP", "BP+Z2", "BP+Z3", "BP+MP+Z3"]
SCHEDULES = {"mlp": COMMON, "gnn": COMMON, "transformer": COMMON + ["EMB", "BP+EMB", "BP+MP+EMB"],
             "scanned_mlp": COMMON, "scanned_transformer": COMMON + ["EMB", "BP+EMB", "BP+MP+EMB"]}
SCANNED = ("scanned_mlp", "scanned_transformer")
# calibration sizes spanning these models' local ops: square matmuls, and f32 vectors for bytes/s
# (both stream sizes above the size at which XLA's CPU backend splits a loop fusion over its thread pool, so
# that the pair differs in bytes only, not in how its kernels are dispatched)
SIZES = {"matmul": (32, 128), "stream": (4096, 16384)}
QUICK = {"mlp": ["BP", "MP", "Z3", "BP+MP", "BP+MP+Z3"], "gnn": ["BP", "MP", "Z3", "BP+MP", "BP+MP+Z3"],
         "transformer": ["BP", "MP", "Z3", "EMB", "BP+MP", "BP+MP+Z3"],
         "scanned_mlp": ["BP", "MP", "Z3", "BP+MP", "BP+MP+Z3"],
         "scanned_transformer": ["BP", "MP", "Z3", "EMB", "BP+MP", "BP+MP+Z3"]}


# ---------------------------------------------------------------------------------------------- helpers
def median_time(fn, args, repeats=9, warmup=2):
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def interleaved_times(calls, rounds, burst, warmup=2):
    """Robust step times of several programs on a host whose speed drifts over seconds.

    ``calls``: ``[(fn, args), ...]``. After ``warmup`` calls each, ``rounds`` rounds; in every round each
    program runs a burst of ``burst`` calls (each timed with ``perf_counter`` around the call and
    ``block_until_ready``), the programs in turn, the order reversed every other round; a program's time is
    the minimum over rounds of its per-round median. Programs timed in the same round share the machine's
    state, and the minimum keeps the rounds the host ran undisturbed. Returns one time per program."""
    for fn, a in calls:
        for _ in range(warmup):
            jax.block_until_ready(fn(*a))
    best = [float("inf")] * len(calls)
    order = list(range(len(calls)))
    for r in range(rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            fn, a = calls[i]
            ts = []
            for _ in range(burst):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*a))
                ts.append(time.perf_counter() - t0)
            best[i] = min(best[i], statistics.median(ts))
    return best


def spearman(xs, ys) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(xs) < 3:
        return float("nan")
    rx, ry = np.array(ranks(xs)), np.array(ranks(ys))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def total_bytes(cols) -> float:
    """The most any device receives over ``cols``: ``(collective, times it runs)`` pairs."""
    if not cols:
        return 0.0
    return float(np.sum([np.asarray(c.device_bytes) * n for c, n in cols], axis=0).max())


def loop_collectives(text: str, mesh) -> list:
    """``(collective, times it runs per call)`` for every collective of a compiled HLO module: those
    ``redist.hlo.parse_hlo`` finds, walked the same way, a while loop's body and condition counted as
    often as its ``known_trip_count`` (XLA's backend config; 1 when it has none)."""
    comps, entry = hlo.computations(text)
    out = []

    def walk(comp, times, seen):
        for ins in comps.get(comp, []):
            c = hlo.collective_of(ins, mesh)
            if c is not None:
                out.append((c, times))
            trips = 1
            if ins.opcode == "while":
                m = re.search(r'"known_trip_count":\{"n":"(\d+)"', ins.attrs)
                trips = int(m.group(1)) if m else 1
            callees = re.findall(r"(?:calls|body|condition|true_computation|false_computation)=%?([\w.\-]+)", ins.attrs)
            bm = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
            callees += re.findall(r"%?([\w.\-]+)", bm.group(1)) if bm else []
            for callee in callees:
                if callee not in seen:
                    walk(callee, times * trips, seen + (callee,))

    walk(entry, 1, (entry,))
    return out


def mem_total(m: xb.MemoryStats) -> int:
    return m.argument + m.output + m.temp - m.alias


# ---------------------------------------------------------------------------------------------- calibration
def calibrate(path: str, rounds: int = 8) -> dict:
    """Per-device compute costs of the host devices (see the module docstring); writes them as the ``compute``
    section of the profile at ``path`` and puts it in use."""
    mesh = MESH
    key = jax.random.key(0)

    def chain(n):
        def f(x, w):
            for _ in range(n):
                x = jnp.tanh(x @ w)
            return x
        return f

    def stream(a):
        for _ in range(16):
            a = a * 0.5 + jnp.sum(a) * 1e-6  # a reduction and an elementwise kernel, both reading a
        return a

    def program(fn, *args):
        low = pc.jit(fn, mesh, []).lower(*args)
        sim = low.simulate(simulator.Hardware("count", 1e30, 1e30, redist.cost.Link(0, 1e30)))
        return (low.program.executable(), jax.tree.leaves(args)), sim

    def square(n):
        return jax.random.normal(key, (n, n)) * (1 / n) ** 0.5

    small, big = SIZES["matmul"]
    short, long_ = SIZES["stream"]
    progs = {
        "chain16": program(chain(16), square(8), square(8)),
        "chain96": program(chain(96), square(8), square(8)),
        "one": program(lambda a: a + 1.0, square(8)),  # one tiny kernel: launching a program on 8 devices
        "mm_small": program(chain(16), square(small), square(small)),
        "mm_big": program(chain(16), square(big), square(big)),
        "stream_short": program(stream, jax.random.normal(key, (short,))),
        "stream_long": program(stream, jax.random.normal(key, (long_,))),
    }
    t = dict(zip(progs, interleaved_times([c for c, _ in progs.values()], rounds, 9)))
    sim = {k: s for k, (_, s) in progs.items()}
    overhead = max((t["chain96"] - t["chain16"]) / max(sim["chain96"].kernels - sim["chain16"].kernels, 1), 1e-7)
    base = max(t["one"] - overhead * sim["one"].kernels, 0.0)
    # marginal costs: the two programs of a pair have the same kernels, so launch and overheads cancel
    peak_flops = (sim["mm_big"].flops - sim["mm_small"].flops) / max(t["mm_big"] - t["mm_small"], 1e-7)
    hbm_bw = 16 * 3 * 4 * (long_ - short) / max(t["stream_long"] - t["stream_short"], 1e-7)
    out = {"peak_flops": peak_flops, "hbm_bw": hbm_bw, "op_overhead_s": overhead, "launch_s": base,
           **calibrate_collectives(overhead, rounds=rounds),
           "method": f"8 host devices at once, replicated partir_core programs, all timed together "
                     f"({rounds} interleaved rounds of 9 calls each, minimum over rounds of the per-round "
                     f"median): overhead = slope over tanh(x@w) chains of 16 and 96 layers (8x8) per simulated "
                     f"kernel; launch from a one-kernel program; FLOP/s = the marginal cost of FLOPs between "
                     f"chains of 16 tanh(x@w) at {small}x{small} and {big}x{big}; bytes/s = the marginal cost of "
                     f"bytes between 16 rounds of a = a*0.5 + sum(a)*1e-6 (3 passes over a each) over {short} "
                     f"and {long_} f32, the sizes of these models' larger local ops (same kernels, each split over the "
                     f"thread pool, in each pair, so "
                     f"per-kernel costs cancel). collective_alpha[kind] = [a0, per_peer]: the in-program "
                     "latency of one collective over a group of k devices is a0 + per_peer * (k - 1), fitted "
                     "by least squares to the per-collective slope (chains of 0 and 16 collectives of 2 KB, "
                     "each followed by a fused scale, one kernel overhead subtracted) over the mesh's axis "
                     "groups batch (2), model (4) and batch+model (8), timed the same way. combine_ratio: "
                     "the cost of each further operand of a combined all-reduce (1 and 16 independent "
                     "psums, which XLA combines into one) over an all-reduce's in the chain, mean over "
                     "the three groups",
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
           "jax": jax.__version__}
    write_section(path, "compute", out)
    return out


def calibrate_collectives(overhead: float, chain: int = 16, rounds: int = 8) -> dict:
    """In-program latency of one collective per kind (see the module docstring): ``{"collective_alpha": {kind:
    [a0, per_peer]} (seconds, kinds named as redist names them), "combine_ratio": r}``."""
    from jax import lax
    from jax.sharding import PartitionSpec

    jmesh = jax.sharding.Mesh(np.array(jax.devices()[: MESH.size]).reshape(MESH.shape), MESH.names)
    groups = [("batch",), ("model",), ("batch", "model")]

    def step(kind, axes, k, x):
        if kind == "all_reduce":
            return lax.psum(x, axes) * (1.0 / k)
        if kind == "all_gather":
            return lax.all_gather(x, axes, axis=0, tiled=True)[: x.shape[0]] * 0.5
        if kind == "reduce_scatter":
            return jnp.tile(lax.psum_scatter(x, axes, scatter_dimension=0, tiled=True), (k, 1)) * 0.5
        if kind == "all_to_all":
            return lax.all_to_all(x, axes, 0, 0, tiled=True) * 0.5
        return lax.ppermute(x, axes, [(i, (i + 1) % k) for i in range(k)]) * 0.5

    def program(kind, axes, n):
        k = MESH.group_size(axes)

        def body(x):
            for _ in range(n):
                x = step(kind, axes, k, x)
            return x
        return jax.jit(jax.shard_map(body, mesh=jmesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(),
                                     check_vma=False))

    def combined(axes, n):
        """``n`` independent all-reduces over ``axes``: XLA combines them into one tuple all-reduce."""
        k = MESH.group_size(axes)

        def body(x):
            return sum(lax.psum(x * (1.0 + i), axes) for i in range(n)) * (1.0 / k)
        return jax.jit(jax.shard_map(body, mesh=jmesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(),
                                     check_vma=False))

    x = jnp.ones((8, 64), jnp.float32)
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute")
    cases = [(kind, axes) for kind in kinds for axes in groups]
    empty = program("all_reduce", groups[0], 0)
    programs = [(empty, [x])] + [(program(kind, axes, chain), [x]) for kind, axes in cases]
    programs += [(combined(axes, 1), [x]) for axes in groups] + [(combined(axes, chain), [x]) for axes in groups]
    t = interleaved_times(programs, rounds, 9)
    slope = {c: max((b - t[0]) / chain - overhead, 0.0) for c, b in zip(cases, t[1:])}
    one, many = t[1 + len(cases):1 + len(cases) + len(groups)], t[1 + len(cases) + len(groups):]
    # each further operand of a combined all-reduce (its own multiply fused in: one kernel overhead less),
    # against one all-reduce of a dependent chain
    ratios = [max((b - a) / (chain - 1) - overhead, 0.0) / slope[("all_reduce", axes)]
              for a, b, axes in zip(one, many, groups) if slope[("all_reduce", axes)] > 0]
    out = {"combine_ratio": float(np.mean(ratios)) if ratios else 1.0}
    alphas = {}
    for kind in kinds:
        ks = [MESH.group_size(axes) - 1 for axes in groups]
        ts = [slope[(kind, axes)] for axes in groups]
        per_peer = max(float(np.polyfit(ks, ts, 1)[0]), 0.0)
        alphas[kind] = [max(float(np.mean(ts)) - per_peer * float(np.mean(ks)), 0.0), per_peer]
    out["collective_alpha"] = alphas
    return out


# ---------------------------------------------------------------------------------------------- one case
def run_case(model, inputs, want, name):
    """Everything but timing for one model x schedule: the record and ``[(ours, args), (XLA, args)]``."""
    rec = {"model": model.name, "schedule": name}
    t0 = time.perf_counter()
    pf = pc.jit(model.step, MESH, schedules.schedule(name, model, inputs, mesh=MESH))
    low = pf.lower(*inputs)
    rec["lower_s"] = time.perf_counter() - t0
    got = pf(*inputs)
    errs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / (1e-5 + 1e-4 * np.abs(np.asarray(b)))))
            if np.size(a) else 0.0 for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
    rec["match"] = bool(max(errs) <= 1.0) and jax.tree.structure(got) == jax.tree.structure(want)
    rec["unsupported"] = len(low.unsupported)
    rec["fallbacks"] = len(low.fallbacks)
    rec["conflicts"] = len(low.conflicts)

    flat = jax.tree.leaves(inputs)
    ish = [xb.named_sharding(t) for t in low.program.in_types]
    osh = [xb.named_sharding(t) for t in low.program.out_types]
    args = [jax.device_put(x, s) for x, s in zip(flat, ish)]
    ours_fn = low.program.executable()
    ours_c = ours_fn.lower(*args).compile()
    xla_fn = jax.jit(model.step, in_shardings=jax.tree_util.tree_unflatten(low.graph.in_tree, ish),
                     out_shardings=jax.tree_util.tree_unflatten(low.graph.out_tree, osh))
    xargs = jax.tree_util.tree_unflatten(low.graph.in_tree, args)
    xla_c = xla_fn.lower(*xargs).compile()
    ours_cols = loop_collectives(ours_c.as_text(), MESH)
    xla_cols = loop_collectives(xla_c.as_text(), MESH)
    rec["bytes_ours"] = float(sum(c.bytes * c.trips for c in low.collectives))
    rec["bytes_ours_hlo"] = total_bytes(ours_cols)
    rec["bytes_xla"] = total_bytes(xla_cols)
    rec["n_collectives_ours"] = len([c for c, _ in ours_cols if c.bytes_received > 0])
    rec["n_collectives_xla"] = len([c for c, _ in xla_cols if c.bytes_received > 0])
    rec["bytes_ratio"] = rec["bytes_ours"] / rec["bytes_xla"] if rec["bytes_xla"] else (
        1.0 if rec["bytes_ours"] == 0 else float("inf"))
    # XLA's result equals ours too (the comparison is of the same function)
    xla_out = xla_c(*xargs)
    rec["xla_match"] = all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
                           for a, b in zip(jax.tree.leaves(xla_out), jax.tree.leaves(want)))

    sim = low.simulate("cpu-host")
    rec["sim_step_s"] = sim.step_time_s
    rec["sim_compute_s"] = sim.compute_time_s
    rec["sim_comm_s"] = sim.comm_time_s
    rec["sim_kernels"] = sim.kernels
    rec["sim_peak_bytes"] = sim.peak_bytes
    mo, mx = xb.MemoryStats.of(ours_c), xb.MemoryStats.of(xla_c)
    rec["mem_ours"] = mo.__dict__ | {"total": mem_total(mo)}
    rec["mem_xla"] = mx.__dict__ | {"total": mem_total(mx)}
    rec["mem_err_vs_ours"] = sim.peak_bytes / mem_total(mo) - 1
    rec["mem_err_vs_xla"] = sim.peak_bytes / mem_total(mx) - 1
    rec["mem_ratio"] = (mo.temp + mo.output) / max(mx.temp + mx.output, 1)  # compiled temp + output, ours / XLA

    return rec, [(ours_c, args), (xla_c, xargs)]


# ---------------------------------------------------------------------------------------------- output
def table(rows) -> str:
    head = (f"{'model':19s} {'schedule':10s} {'match':5s} {'ours B':>9s} {'XLA B':>9s} {'B ratio':>7s} "
            f"{'ours ms':>8s} {'XLA ms':>8s} {'t ratio':>7s} {'sim MB':>8s} {'ours MB':>8s} {'err%':>6s} "
            f"{'XLA MB':>8s} {'err%':>6s} {'T+O rt':>6s} {'sim ms':>8s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['model']:19s} {r['schedule']:10s} {'yes' if r['match'] else 'NO':5s} {r['bytes_ours']:9.0f} "
            f"{r['bytes_xla']:9.0f} {r['bytes_ratio']:7.2f} {r['time_ours_s'] * 1e3:8.3f} "
            f"{r['time_xla_s'] * 1e3:8.3f} {r['time_ratio']:7.2f} {r['sim_peak_bytes'] / 1e6:8.4f} "
            f"{r['mem_ours']['total'] / 1e6:8.4f} {100 * r['mem_err_vs_ours']:6.1f} "
            f"{r['mem_xla']['total'] / 1e6:8.4f} {100 * r['mem_err_vs_xla']:6.1f} {r['mem_ratio']:6.2f} "
            f"{r['sim_step_s'] * 1e3:8.3f}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer schedules, 4 timed rounds")
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per program per round (default 10)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 8; quick 4)")
    ap.add_argument("--calibrate", action="store_true", help="re-run the cpu-host compute calibration")
    ap.add_argument("--profile", default=PACKAGE_PROFILE,
                    help="the calibration profile --calibrate writes (default: the package's)")
    ap.add_argument("--models", default="mlp,gnn,transformer,scanned_mlp,scanned_transformer")
    ap.add_argument("--out", default=os.path.join(RESULTS, "partitioning.json"))
    progress.add_option(ap)
    args = ap.parse_args(argv)
    repeats = args.repeats
    rounds = args.rounds or (4 if args.quick else 8)
    logging.getLogger("jax").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    if len(jax.devices()) < 8:
        raise SystemExit("needs 8 JAX devices")
    calib = None
    if args.calibrate:
        calib = calibrate(args.profile)
        print("calibrated cpu-host compute:", {k: v for k, v in calib.items() if k not in ("method",)})
    hw = simulator.HARDWARE["cpu-host"]
    network = hw.topology(MESH)
    print(f"simulator cpu-host: peak {hw.peak_flops:.3g} FLOP/s, {hw.hbm_bw:.3g} B/s, overhead "
          f"{hw.op_overhead_s * 1e6:.1f} us/kernel, collectives alpha {network.link('batch').alpha * 1e6:.0f} us, "
          f"beta {network.link('batch').beta:.3g} B/s ({redist.cost.profile().source})", flush=True)
    rows = []
    chosen = QUICK if args.quick else SCHEDULES
    names = args.models.split(",")
    bar = progress.bar(desc="schedules", total=sum(len(chosen[m]) for m in names), unit="schedule",
                       shown=not args.no_progress)
    for mname in names:
        model = models.MODELS[mname]()
        inputs = model.init(jax.random.key(0))
        want = jax.jit(model.step)(*inputs)
        recs, calls = [], []
        for name in chosen[mname]:
            rec, pair = run_case(model, inputs, want, name)
            recs.append(rec)
            calls += pair
            bar.update()
        times = interleaved_times(calls, rounds, repeats)
        for k, rec in enumerate(recs):
            rec["time_ours_s"], rec["time_xla_s"] = times[2 * k], times[2 * k + 1]
            rec["time_ratio"] = rec["time_ours_s"] / rec["time_xla_s"]
            rows.append(rec)
            progress.write(f"  {mname:19s} {rec['schedule']:10s} match={rec['match']} bytes {rec['bytes_ours']:.0f}/"
                           f"{rec['bytes_xla']:.0f} time {rec['time_ours_s'] * 1e3:.2f}/{rec['time_xla_s'] * 1e3:.2f} "
                           f"ms mem sim {rec['sim_peak_bytes']} ours {rec['mem_ours']['total']} "
                           f"({time.perf_counter() - start:.0f}s)")
    bar.close()
    spear = {}
    for m in {r["model"] for r in rows}:
        rs = [r for r in rows if r["model"] == m]
        spear[m] = spearman([r["sim_step_s"] for r in rs], [r["time_ours_s"] for r in rs])
    spear["pooled"] = spearman([r["sim_step_s"] for r in rows], [r["time_ours_s"] for r in rows])
    mem_errs = [abs(r["mem_err_vs_ours"]) for r in rows]
    summary = {
        "mesh": "batch=2, model=4 (8 host devices)",
        "cases": len(rows),
        "all_match": all(r["match"] for r in rows),
        "max_bytes_ratio": max(r["bytes_ratio"] for r in rows),
        "cases_bytes_over_1.1": [f"{r['model']} {r['schedule']}" for r in rows if r["bytes_ratio"] > 1.1],
        "geomean_time_ratio": float(np.exp(np.mean([np.log(r["time_ratio"]) for r in rows]))),
        "max_abs_mem_err_vs_ours": max(mem_errs),
        "cases_mem_err_over_15pct": [f"{r['model']} {r['schedule']}" for r in rows if abs(r["mem_err_vs_ours"]) > 0.15],
        "max_abs_mem_err_vs_xla": max(abs(r["mem_err_vs_xla"]) for r in rows),
        "spearman_sim_vs_measured": spear,
        "scanned": {
            "max_mem_ratio": max((r["mem_ratio"] for r in rows if r["model"] in SCANNED), default=None),
            "cases_mem_ratio_over_1.25": [f"{r['model']} {r['schedule']}" for r in rows
                                          if r["model"] in SCANNED and r["mem_ratio"] > 1.25],
            "max_bytes_ratio": max((r["bytes_ratio"] for r in rows if r["model"] in SCANNED), default=None),
            "cases_bytes_over_1.1": [f"{r['model']} {r['schedule']}" for r in rows
                                     if r["model"] in SCANNED and r["bytes_ratio"] > 1.1],
            "max_abs_mem_err_vs_ours": max((abs(r["mem_err_vs_ours"]) for r in rows if r["model"] in SCANNED),
                                           default=None),
            "unsupported": sum(r["unsupported"] for r in rows if r["model"] in SCANNED),
        },
        "timing": f"per model, all its cases' programs (ours and XLA's) interleaved: {rounds} rounds, each a "
                  f"burst of {repeats} calls per program, the order reversed every other round; time = the "
                  f"minimum over rounds of the per-round median",
        "quick": args.quick,
        "hardware": {"peak_flops": hw.peak_flops, "hbm_bw": hw.hbm_bw, "op_overhead_s": hw.op_overhead_s,
                     "alpha_s": network.link("batch").alpha, "link_bw": network.link("batch").beta,
                     "kind_links": {k: (l.alpha, l.beta) for k, l in network.kind_links}},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                   f"jax {jax.__version__}",
    }
    summary["runtime_s"] = time.perf_counter() - start
    print()
    print(table(rows))
    print()
    print("Spearman(sim step time, measured):", {k: round(v, 3) for k, v in spear.items()})
    print(json.dumps({k: v for k, v in summary.items() if k not in ("hardware",)}, indent=1))
    os.makedirs(RESULTS, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "cases": rows, "calibration": calib}, f, indent=1)
    figures = plots.draw("partitioning", args.out)
    print(f"wrote {args.out} and {', '.join(figures)} in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
