"""Moves between meshes: redist's plans against ``jax.device_put``, a gather-then-scatter baseline and hand-written
MPI, and the MPI permute against a hand-written ``Sendrecv``.

    python bench/cross_mesh.py [--rounds 15] [--mpi-rounds 60] [--permute-rounds 30] [--permute-mib 16 32 64]
                               [--launches 5] [--quick] [--only jax mpi permute] [--out FILE]

Every part measures the checkout on ``PYTHONPATH`` (the MPI workers, ``bench/cross_mesh_worker.py``, use only
redist's public API), so that ``PYTHONPATH=OTHER_CHECKOUT python bench/cross_mesh.py --only permute --out FILE``
measures another version of the runtime.

Cases (``CASES``; an f32 array of 3072 x 3072, 36 MiB): a pipeline stage's hand-off to the next stage's devices in
the same layout and in another, a mesh of 8 devices to 6, to 4, 4 to 8, ``a=2,b=4`` to ``x=3``, ``x=8`` to
``a=2,b=4`` on the same devices in another layout, a pending sum handed to the next stage, and an uneven dim from 8
devices to 6. For each, the plan's steps, its bytes received per device against ``redist.lower_bound_bytes``, and
its peak bytes per device against the bound ``max(src, dst)`` of local bytes; then times:

- JAX, on 8 host CPU devices in this process: ``redist.jax.reshard(x, NamedSharding(other_mesh, spec))`` (for a
  pending sum or an uneven dim, which no JAX array holds, the same runtime on per-device buffers:
  ``redist.backends.jax_stages.run_stages``) against ``jax.device_put(x, NamedSharding(other_mesh, spec))`` (JAX's
  own move between meshes; the JSON records whether it goes through the host, which redist's never does: on
  host CPU devices the host's memory is the devices', so there a move through the host costs copies, not
  transfers, and says little of an accelerator) and against gather-then-scatter (every source buffer copied to
  the first source device, the array assembled there, pending sums summed, and each destination block copied from
  there to its device: device to device, as a user without a plan would move it). Each call gets an array of its
  own (JAX keeps an array's host copy once made) and is timed around the call and ``jax.block_until_ready``.
- MPI, ``mpiexec -n 8`` (``bench/cross_mesh_worker.py``), every rank calling: ``redist.mpi.reshard`` against the
  mpi4py a competent user writes (``Isend``/``Irecv`` of each block's intersections, posted at once into a fresh
  result; a pending sum reduced first by ``Reduce_scatter_block`` on the source's ranks).
- permute, ``mpiexec -n 4``: a block swap ``[R{x}, C{y}] -> [R{y}, C{x}]`` on ``x=2,y=2`` (one
  ``CollectivePermute``: ranks 1 and 2 swap their blocks, ranks 0 and 3 keep theirs) of ``--permute-mib`` MiB per
  rank, ``redist.mpi.reshard`` against a hand-written ``Sendrecv`` and ``Isend``/``Irecv``, each into a fresh
  array (the ranks that keep their block copy it, as reshard returns a new array).

Method: per case, a first call (synthesis, compiles, MPI's agreement and communicators) apart, two warm-up calls
of each contender, then rounds in which each contender runs once, in a random order per round (the same on every
rank), so that the load of the shared machine falls on all alike and no contender always follows the same one.
An MPI call is ``Barrier``, time, call, and the maximum over ranks. The machine's 2 cores run 8 (or 4) ranks:
oversubscribed, so single timings carry scheduling noise, and the paired ratios are the figures to read. Each MPI
part is launched ``--launches`` times (fresh ``mpiexec``, whose ranks land on the cores anew) and the rounds of
every launch are pooled: one launch's paired medians scatter by several percent from launch to launch.
Reported: per contender the minimum over rounds, and the median over rounds of the ratio of two contenders' times
in the same round (``paired``: the two ran moments apart under the same load); JAX: the contender's time over
redist's (> 1: redist is faster), MPI: redist's over the hand-written one's (< 1: redist is faster). Results are
checked exactly (entries are the flat index mod 65521, exact in f32). The load average is recorded before and
after. Writes ``bench/results/cross_mesh.json`` and prints a table.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from functools import lru_cache  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "bench", "results")
WORKER = os.path.join(ROOT, "bench", "cross_mesh_worker.py")
MPIEXEC = os.path.join(sys.prefix, "bin", "mpiexec")

# name: (source type, its mesh, destination type, its mesh); R x C the global shape (R, C multiples of 24)
CASES = {
    "stage, same layout": ("f32[R{x}, C]", "x=4", "f32[R{x}, C]", "x=4,device_ids=[4,5,6,7]"),
    "stage, other layout": ("f32[R{x}, C]", "x=4", "f32[R, C{x}]", "x=4,device_ids=[4,5,6,7]"),
    "8 -> 6": ("f32[R{x}, C]", "x=8", "f32[R{x}, C]", "x=6"),
    "8 -> 4": ("f32[R{x}, C]", "x=8", "f32[R{x}, C]", "x=4"),
    "4 -> 8": ("f32[R{x}, C]", "x=4", "f32[R{x}, C]", "x=8"),
    "2x4 -> 3": ("f32[R{a}, C{b}]", "a=2,b=4", "f32[R{x}, C]", "x=3"),
    "x=8 -> a=2,b=4": ("f32[R{x}, C]", "x=8", "f32[R{b}, C{a}]", "a=2,b=4"),
    "pending sum to a stage": ("f32[R, C] partial{x}", "x=4", "f32[R{x}, C]", "x=4,device_ids=[4,5,6,7]"),
    "uneven, 8 -> 6": ("f32[R-1{x}, C]", "x=8", "f32[R-1{x}, C]", "x=6"),
}


def case_types(name: str, rows: int, cols: int):
    """The case's source and destination types for a global array of ``rows`` x ``cols``."""
    import redist

    a, ma, b, mb = CASES[name]
    text = lambda t: t.replace("R-1", str(rows - 1)).replace("R", str(rows)).replace("C", str(cols))  # noqa: E731
    return (redist.ShardingType.parse(text(a), redist.Mesh.parse(ma)),
            redist.ShardingType.parse(text(b), redist.Mesh.parse(mb)))


def paired(times: dict[str, list[float]], base: str = "redist") -> dict[str, float]:
    """Per contender, the median over rounds of its time over ``base``'s in the same round."""
    return {k: statistics.median(t / b for t, b in zip(v, times[base])) for k, v in times.items() if k != base}


def interleaved(fns: dict, rounds: int, fresh, seed: int = 0) -> dict[str, list[float]]:
    """Two warm-up calls of each, then ``rounds`` rounds in a random order each. Every call gets an input of its
    own, made by ``fresh()`` before the clock starts (JAX keeps the host copy of an array once one is made, and a
    later move through the host would only read that); a call's time includes ``jax.block_until_ready`` of what it
    returns."""
    import jax

    names = list(fns)
    for _ in range(2):
        for name in names:
            jax.block_until_ready(fns[name](fresh()))
    times = {name: [] for name in names}
    order = random.Random(seed)
    for _ in range(rounds):
        order.shuffle(names)
        for name in names:
            x = fresh()
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](x))
            times[name].append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------------------------------------- JAX
def values(shape) -> np.ndarray:
    return (np.arange(math.prod(shape), dtype=np.int64) % 65521).astype(np.float32).reshape(shape)


def device_buffers(t, value) -> list:
    """``t``'s buffers of ``value`` on their JAX devices (device ``d`` the one of id ``d``), by device id; a
    pending sum's summands are ``value`` on the devices at partial coordinate 0 and zeros elsewhere."""
    import jax
    import redist

    devices = {d.id: d for d in jax.devices()}
    plain = redist.shard(t.replace(partial=()), value)
    out = [None] * t.mesh.id_bound
    for d in t.mesh.devices:
        coords = t.mesh.coords(d)
        keep = not any(t.mesh.axis_coord(coords, a) for a in t.partial)
        out[d] = jax.device_put(plain[d] if keep else np.zeros_like(plain[d]), devices[d])
    return out


def gather_then_scatter(src, dst):
    """A function of per-device buffers of ``src`` returning those of ``dst`` (both by device id): every source
    buffer that holds a distinct block (each summand of a pending sum) is copied to the first source device, which
    assembles the array (summing summands) and cuts every destination block, each then copied to its device."""
    import jax
    import jax.numpy as jnp

    devices = {d.id: d for d in jax.devices()}
    root = src.mesh.devices[0]
    chosen, seen = [], set()
    for group in src.mesh.groups(src.partial):
        box = tuple((b.start, b.stop) for b in src.replace(partial=()).local_box(group[0]))
        if box not in seen:
            seen.add(box)
            chosen += [(d, box) for d in group]
    targets = list(dst.mesh.devices)
    wanted = [tuple((b.start, b.stop) for b in dst.local_box(d)) for d in targets]

    def assemble(*bufs):
        whole = jnp.zeros(src.shape, src.np_dtype)
        for buf, (_, box) in zip(bufs, chosen):
            piece = buf[tuple(slice(0, b - a) for a, b in box)]
            whole = whole.at[tuple(slice(a, b) for a, b in box)].add(piece)
        out = []
        for box in wanted:
            block = jnp.zeros(dst.local_shape, dst.np_dtype)
            out.append(block.at[tuple(slice(0, b - a) for a, b in box)].set(whole[tuple(slice(a, b) for a, b in box)]))
        return tuple(out)

    assembled = jax.jit(assemble)

    def run(bufs):
        gathered = jax.device_put([bufs[d] for d, _ in chosen], [devices[root]] * len(chosen))
        out = [None] * dst.mesh.id_bound
        for d, block in zip(targets, jax.device_put(list(assembled(*gathered)), [devices[d] for d in targets])):
            out[d] = block
        return out
    return run


def through_host(fn) -> bool:
    """Whether ``fn()`` moves data between the host and a device (JAX's transfer guards refuse it)."""
    import jax

    try:
        with jax.transfer_guard_host_to_device("disallow_explicit"), \
                jax.transfer_guard_device_to_host("disallow_explicit"):
            jax.block_until_ready(fn())
        return False
    except Exception:  # noqa: BLE001 - JAX's runtime error for a refused transfer
        return True


def jax_case(name: str, rows: int, cols: int, rounds: int) -> dict:
    import jax
    import jax.numpy as jnp
    import redist
    import redist.jax as rj
    from jax.sharding import NamedSharding
    from redist.backends import jax_stages

    src, dst = case_types(name, rows, cols)
    plan = redist.synthesize(src, dst)
    value = values(src.shape)
    want = redist.shard(dst, value)
    baseline = gather_then_scatter(src, dst)
    by_id = {d.id: d for d in jax.devices()}
    as_array = not src.partial and src.is_even() and dst.is_even()
    fns, host = {}, None
    if as_array:
        def sharding(t):
            mesh = jax.sharding.Mesh(np.array([by_id[d] for d in t.mesh.device_ids]).reshape(t.mesh.shape),
                                     t.mesh.names)
            return NamedSharding(mesh, jax.sharding.PartitionSpec(*[a or None for a in t.dims]))
        x = jax.device_put(value, sharding(src))
        copy = jax.jit(jnp.copy)
        fresh = lambda: jax.block_until_ready(copy(x))  # noqa: E731
        target = sharding(dst)
        shards = lambda y: {s.device.id: s.data for s in y.addressable_shards}  # noqa: E731
        blocks = lambda ys: jax.make_array_from_single_device_arrays(  # noqa: E731
            dst.shape, target, [ys[d] for d in dst.mesh.devices])
        fns["redist"] = lambda y: rj.reshard(y, target)
        fns["device_put"] = lambda y: jax.device_put(y, target)
        fns["gather_scatter"] = lambda y: blocks(baseline(shards(y)))
        host = through_host(lambda: fns["device_put"](fresh()))
        assert not through_host(lambda: fns["redist"](fresh()))
        ok = {k: bool(np.array_equal(np.asarray(f(fresh())), value)) for k, f in fns.items()}
    else:
        bufs = device_buffers(src, value)
        fresh = lambda: bufs  # noqa: E731 - per-device buffers: no host copy kept
        fns["redist"] = lambda y: jax_stages.run_stages(plan.stages, y)
        fns["gather_scatter"] = baseline
        ok = {k: all(np.array_equal(np.asarray(f(bufs)[d]), want[d]) for d in dst.mesh.devices)
              for k, f in fns.items()}
    jax.clear_caches()
    redist.jax.clear_cache()
    first = fresh()
    t0 = time.perf_counter()
    jax.block_until_ready(fns["redist"](first))
    first = time.perf_counter() - t0
    times = interleaved(fns, rounds, fresh)
    return {"name": name, "src": f"{src} on {src.mesh}", "dst": f"{dst} on {dst.mesh}",
            "steps": [s.kind for s in plan.steps], "bytes_received": plan.bytes_received,
            "lower_bound_bytes": redist.lower_bound_bytes(src, dst), "peak_bytes": plan.peak_bytes,
            "memory_bound_bytes": max(src.local_bytes, dst.local_bytes),
            "gather_scatter_bytes": _gather_bytes(src, dst),
            "device_put_through_host": host, "correct": ok, "first_call_s": first,
            "min_s": {k: min(v) for k, v in times.items()}, "paired_over_redist": paired(times), "times_s": times}


def _gather_bytes(src, dst) -> int:
    """The most bytes a device receives in gather-then-scatter: the first source device, every buffer it
    gathers but its own (or a destination's block, if larger)."""
    chosen = sum(len(g) for g in src.mesh.groups(src.partial))
    return max((chosen - 1) * src.local_bytes, dst.local_bytes)


# ---------------------------------------------------------------------------------------------- MPI
def mpi_job(n: int, args: list[str], out: str, launches: int) -> list[dict]:
    """Rank 0's rows of ``mpiexec -n n python bench/cross_mesh_worker.py MODE WHAT OUT ...`` (``args``: MODE, WHAT,
    then the options), run ``launches`` times, each a fresh ``mpiexec``: per row, the rounds of every launch one
    after the other (``times_s``), each launch's own first call (``first_call_s``, where the row has one: a list),
    the load average before the first launch and after the last."""
    load = os.getloadavg()
    pooled: dict = {}
    for _ in range(launches):
        subprocess.run([MPIEXEC, "-n", str(n), sys.executable, WORKER, *args[:2], out, *args[2:]], check=True,
                       cwd=ROOT)
        with open(out) as f:
            for row in json.load(f):
                key = row["name"], row.get("mib")
                if key not in pooled:
                    pooled[key] = {**row, "times_s": {k: [] for k in row["times_s"]}}
                    if "first_call_s" in row:
                        pooled[key]["first_call_s"] = []
                kept = pooled[key]
                if "first_call_s" in row:
                    kept["first_call_s"].append(row["first_call_s"])
                kept["correct"] = {k: kept["correct"][k] and v for k, v in row["correct"].items()}
                for k, v in row["times_s"].items():
                    kept["times_s"][k] += v
    rows = list(pooled.values())
    for row in rows:
        row["load_average_before_after"] = [round(load[0], 2), round(os.getloadavg()[0], 2)]
    return rows


def summarise_mpi(row: dict, base: str = "redist") -> dict:
    """An MPI row with, per contender, its minimum over rounds and ``redist_over``: the median over rounds of
    ``base``'s time over the contender's in the same round (< 1: redist faster)."""
    times = row.pop("times_s")
    row["min_s"] = {k: min(v) for k, v in times.items()}
    row["redist_over"] = {k: statistics.median(b / t for t, b in zip(v, times[base]))
                          for k, v in times.items() if k != base}
    row["times_s"] = times
    return row


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summary(result: dict) -> dict:
    """The figures to read first: bytes at the bound (where no pending sum is reduced: reducing one receives more
    than the bound, docs/spec.md §3) and memory within it in every case, the geometric mean of the JAX contenders'
    paired ratios over redist, and the MPI ratios of redist over hand-written (paired medians, worst and geometric
    mean)."""
    out = {}
    if result.get("jax"):
        jax_rows = result["jax"]
        out["bytes_at_bound_without_pending_sums"] = all(r["bytes_received"] == r["lower_bound_bytes"]
                                                         for r in jax_rows if "partial" not in r["src"])
        out["peak_within_bound"] = all(r["peak_bytes"] <= r["memory_bound_bytes"] for r in jax_rows)
        out["jax_correct"] = all(all(r["correct"].values()) for r in jax_rows)
        for other in ("device_put", "gather_scatter"):
            ratios = [r["paired_over_redist"][other] for r in jax_rows if other in r["paired_over_redist"]]
            out[f"jax_{other}_over_redist_geomean"] = round(geomean(ratios), 3)
        out["device_put_through_host"] = sorted({r["device_put_through_host"] for r in jax_rows} - {None})
    if result.get("mpi"):
        ratios = [r["redist_over"]["hand"] for r in result["mpi"]]
        out["mpi_redist_over_hand_max"] = round(max(ratios), 3)
        out["mpi_redist_over_hand_geomean"] = round(geomean(ratios), 3)
        out["mpi_correct"] = all(all(r["correct"].values()) for r in result["mpi"])
    for row in result.get("permute", []):
        for other in ("sendrecv", "isend"):
            out[f"permute_{row['mib']:g}mib_redist_over_{other}"] = round(row["redist_over"][other], 3)
    return out


@lru_cache(maxsize=None)
def environment() -> dict:
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "jax_devices": "8 host CPU devices (XLA_FLAGS --xla_force_host_platform_device_count=8)"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--mpi-rounds", type=int, default=60)
    ap.add_argument("--permute-rounds", type=int, default=30)
    ap.add_argument("--launches", type=int, default=5, help="fresh mpiexec launches of each MPI part, pooled")
    ap.add_argument("--permute-mib", type=float, nargs="+", default=[16, 32, 64])
    ap.add_argument("--only", nargs="+", choices=("jax", "mpi", "permute"), default=["jax", "mpi", "permute"])
    ap.add_argument("--quick", action="store_true", help="small arrays, few rounds")
    ap.add_argument("--out", default=os.path.join(RESULTS, "cross_mesh.json"))
    args = ap.parse_args()
    if args.quick:
        args.rounds = args.mpi_rounds = args.permute_rounds = 3
        args.launches = 1
        args.permute_mib = [1]
    rows, cols = (480, 240) if args.quick else (3072, 3072)
    load = os.getloadavg()[0]
    result = {"method": __doc__.strip(), **environment(), "shape": [rows, cols],
              "rounds": {"jax": args.rounds, "mpi": args.mpi_rounds, "permute": args.permute_rounds},
              "mpi_launches": args.launches}
    if "jax" in args.only:
        result["jax"] = []
        for name in CASES:
            r = jax_case(name, rows, cols, args.rounds)
            result["jax"].append(r)
            print(f"[jax] {name}: redist {r['min_s']['redist'] * 1e3:.2f} ms, paired "
                  f"{ {k: round(v, 2) for k, v in r['paired_over_redist'].items()} }, correct {r['correct']}",
                  flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if "mpi" in args.only:
            cases = []
            for name in CASES:
                src, dst = case_types(name, rows, cols)
                cases.append({"name": name, "src": str(src), "src_mesh": str(src.mesh), "dst": str(dst),
                              "dst_mesh": str(dst.mesh)})
            path = os.path.join(tmp, "cases.json")
            with open(path, "w") as f:
                json.dump(cases, f)
            result["mpi"] = [summarise_mpi(r) for r in mpi_job(8, ["cases", path, "--rounds", str(args.mpi_rounds)],
                                                                 os.path.join(tmp, "mpi.json"), args.launches)]
        if "permute" in args.only:
            sizes = ",".join(f"{m:g}" for m in args.permute_mib)
            result["permute"] = [summarise_mpi(r) for r in mpi_job(
                4, ["permute", sizes, "--rounds", str(args.permute_rounds)], os.path.join(tmp, "permute.json"),
                args.launches)]
    result["load_average"] = {"before": round(load, 2), "after": round(os.getloadavg()[0], 2)}
    result["summary"] = summary(result)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print_table(result)


def print_table(result: dict) -> None:
    mpi = {r["name"]: r for r in result.get("mpi", [])}
    print(f"{'case':<24} {'recv B':>9} {'bound':>9} {'peak B':>9} {'bound':>9} {'redist ms':>9} {'put/redist':>10} "
          f"{'g+s/redist':>10} {'MPI ms':>8} {'MPI redist/hand':>15}")
    for row in result.get("jax", []):
        p, m = row["paired_over_redist"], mpi.get(row["name"])
        print(f"{row['name']:<24} {row['bytes_received']:>9} {row['lower_bound_bytes']:>9} {row['peak_bytes']:>9} "
              f"{row['memory_bound_bytes']:>9} {row['min_s']['redist'] * 1e3:>9.2f} "
              f"{p.get('device_put', float('nan')):>10.2f} {p['gather_scatter']:>10.2f} "
              f"{m['min_s']['redist'] * 1e3 if m else float('nan'):>8.2f} "
              f"{m['redist_over']['hand'] if m else float('nan'):>15.3f}")
    if not result.get("jax"):
        for row in mpi.values():
            print(f"{row['name']:<24} MPI redist {row['min_s']['redist'] * 1e3:7.2f} ms  hand "
                  f"{row['min_s']['hand'] * 1e3:7.2f} ms  redist/hand {row['redist_over']['hand']:5.3f}")
    for row in result.get("permute", []):
        print(f"permute {row['mib']:g} MiB/rank: redist {row['min_s']['redist'] * 1e3:7.2f} ms  redist/Sendrecv "
              f"{row['redist_over']['sendrecv']:5.3f}  redist/Isend-Irecv {row['redist_over']['isend']:5.3f}")


if __name__ == "__main__":
    main()
