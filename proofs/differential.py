"""A seeded random differential run of the backends against the numpy oracle.

    .venv/bin/python -m proofs.differential --numpy 10000 --jax 1000 --mpi 500 [--seed 0]

Each case is a random valid (source, destination) pair from :func:`redist.testing.draw_pair` (partial
sources of every reduction kind, sub-axes, uneven dims, a destination in another device order for a
quarter of them, destinations that create pending sums: docs/spec.md §3) on a random mesh
(:func:`redist.testing.draw_mesh`, a quarter of them in a random device order) whose axes have sizes 1 to 8
(so 1, 3, 5, 6 and 7 among them), in one of the dtypes f32, f64, i32, i64, bf16, bool, f16, u8, c64, c128.
The
plan is synthesized and run on a random value's buffers (:func:`redist.data.poisoned_source`: random integer
summands for a partial source, padding poisoned), and the result is compared element for element with the
oracle: every device's data block must equal that of ``redist.shard(dst, value)``, or for a partial
destination the group sums ``redist.unshard(dst, out)`` must equal the value. Counted per backend: wrong
values, dtype changes, shape changes, exceptions (a valid pair that raises is a failure too), and apart from
them synthesis errors (``synthesize`` raised: the synthesizer's failure, not the backend's). The exit status
is 1 if any was found.

Backends:

- numpy: ``redist.execute`` in this process, meshes of up to 32 devices;
- jax: ``redist.execute(..., backend="jax")`` on 8 host devices (JAX's x64 mode off, as by default), and
  for even pairs without pending sums or sub-axes also ``redist.jax.reshard`` of a placed array (a 64-bit
  array placed under x64, resharded with it off);
- mpi: ``redist.mpi.reshard`` on every rank, under ``mpiexec -n N`` for N = 2 … 8 on meshes of exactly N
  devices (mode ``differential`` of ``tests/redist/mpi_worker.py``, launched by ``tests/redist/mpi_launch.py``).

Case ``i`` of a backend depends only on ``(seed, backend, i)``; a failure prints them, with the pair.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from redist.data import poisoned_source, shard, unshard
from redist.errors import ShardingError
from redist.synthesis import synthesize
from redist.testing import SeededDraw, draw_mesh, draw_pair
from redist.types import REDUCTIONS, ShardingType

DTYPES = ("f32", "f32", "f64", "f64", "i32", "i64", "bf16", "bool", "f16", "u8", "c64", "c128")
BACKEND_IDS = {"numpy": 0, "jax": 1, "mpi": 2}  # the data rng's seed part: each backend draws its own cases
MPI_SIZES = (2, 3, 4, 5, 6, 7, 8)
KINDS = ("wrong values", "dtype changes", "shape changes", "exceptions", "synthesis errors")


# ---------------------------------------------------------------------------------------------- cases
def draw_case(seed: int, backend: str, i: int, max_devices: int = 8,
              devices: int | None = None) -> tuple[ShardingType, ShardingType]:
    """Case ``i`` of ``backend``'s run: a valid pair (a third of them uneven, on meshes of two devices or
    more; a fifth of them with a destination that may create pending sums) on a mesh of 1-4 axes with at most ``max_devices`` devices, or of 1-3 axes with exactly
    ``devices``; a function of its arguments only, so that every MPI rank draws the same one."""
    draw = SeededDraw(f"differential:{seed}:{backend}:{i}")
    if devices is None:
        mesh = draw_mesh(draw, max_devices=max_devices, device_order=0.25)
    else:
        mesh = draw_mesh(draw, max_axes=3, devices=devices, device_order=0.25)
    return draw_pair(draw, mesh, partial=0.4, sub_axes=0.25, dtype=DTYPES, uneven=0.35 if mesh.size >= 2 else 0.0,
                     reductions=REDUCTIONS, reorder=0.25, create=0.2)


def case_data(src: ShardingType, seed: int, backend: str, i: int):
    """``(value, per-device buffers)`` of case ``i``: :func:`redist.data.poisoned_source`."""
    return poisoned_source(src, np.random.default_rng([seed, BACKEND_IDS[backend], i]))


def judge(dst: ShardingType, value: np.ndarray, out) -> list[str]:
    """What is wrong with the buffers ``out`` that a plan to ``dst`` gave for ``value``: a sublist of
    ``["shape changes", "dtype changes", "wrong values"]``. Values are compared at data positions only
    (padding holds anything), and also where the dtype changed (in the destination's dtype)."""
    out = [np.asarray(o) for o in out]
    if len(out) != dst.mesh.size or any(o.shape != dst.local_shape for o in out):
        return ["shape changes"]
    found = []
    if any(o.dtype != dst.np_dtype for o in out):
        found.append("dtype changes")
        out = [o.astype(dst.np_dtype) for o in out]
    try:
        if dst.partial:
            right = np.array_equal(unshard(dst, out), value)
        else:
            want = shard(dst, value)
            right = all(np.array_equal(o[dst.data_box(d)], w[dst.data_box(d)])
                        for d, (o, w) in enumerate(zip(out, want)))
    except ShardingError:  # replicas of one block disagree
        right = False
    return found if right else found + ["wrong values"]


# ---------------------------------------------------------------------------------------------- tallies
@dataclass
class Tally:
    """Counts of one backend's run, and the first failures (each with what replays it)."""

    backend: str
    cases: int = 0
    passed: int = 0
    counts: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    failures: list = field(default_factory=list)
    features: dict = field(default_factory=dict)  # what the cases covered: feature -> number of cases
    seconds: float = 0.0

    def cover(self, *names: str) -> None:
        for name in names:
            self.features[name] = self.features.get(name, 0) + 1

    def add(self, label: str, problems: list[str], detail: str = "") -> None:
        self.cases += 1
        self.passed += not problems
        for p in problems:
            self.counts[p] += 1
        if problems and len(self.failures) < 20:
            self.failures.append(f"{label}: {', '.join(problems)}{': ' + detail if detail else ''}")

    def merge(self, other: dict) -> None:
        self.cases += other["cases"]
        self.passed += other["passed"]
        for k in KINDS:
            self.counts[k] += other["counts"][k]
        self.failures += other["failures"][: max(0, 20 - len(self.failures))]
        for name, n in other["features"].items():
            self.features[name] = self.features.get(name, 0) + n

    def line(self) -> str:
        return f"{self.backend}: {self.cases} cases, {self.passed} passed, " + ", ".join(
            f"{self.counts[k]} {k}" for k in KINDS)


def label(seed: int, backend: str, i: int, src: ShardingType, dst: ShardingType) -> str:
    return f"seed {seed} {backend} case {i} on {src.mesh}: {src} -> {dst}"


def features(src: ShardingType, dst: ShardingType) -> list[str]:
    """What a pair exercises, for the coverage line of the report."""
    tokens = [a for t in (src, dst) for d in t.dims for a in d] + list(src.partial)
    return ([f"dtype {src.dtype}"] + [f"axis of size {s}" for s in sorted(set(src.mesh.shape))]
            + [f"partial({src.reduction}) source"] * bool(src.partial) + ["partial destination"] * bool(dst.partial)
            + ["reordered mesh"] * (not src.mesh.is_row_major) + ["another device order"] * (src.mesh != dst.mesh)
            + ["sub-axes"] * any(":" in a for a in tokens) + ["uneven"] * (not (src.is_even() and dst.is_even()))
            + ["created pending sums"] * (not set(dst.partial) <= set(src.partial)))


def run_case(tally: Tally, seed: int, i: int, src: ShardingType, dst: ShardingType, execute) -> None:
    """Synthesize, run ``execute(plan, value, buffers) -> per-device outputs`` and judge; count the result."""
    name = label(seed, tally.backend, i, src, dst)
    tally.cover(*features(src, dst))
    try:
        plan = synthesize(src, dst)
    except Exception as e:  # noqa: BLE001 - every synthesis failure on a valid pair is a finding
        tally.add(name, ["synthesis errors"], f"{type(e).__name__}: {e}")
        return
    value, bufs = case_data(src, seed, tally.backend, i)
    try:
        out = execute(plan, value, bufs)
    except Exception as e:  # noqa: BLE001 - so is every exception on a valid pair
        tally.add(name, ["exceptions"], f"{type(e).__name__}: {e}")
        return
    tally.add(name, judge(dst, value, out))


def progress(tally: Tally, total: int, t0: float) -> None:
    if tally.cases == total or tally.cases % max(1, total // 10) == 0:
        print(f"  {tally.line()} ({time.perf_counter() - t0:.0f} s)", flush=True)


# ---------------------------------------------------------------------------------------------- backends
def run_numpy(n: int, seed: int) -> Tally:
    from redist.execute import execute

    tally, t0 = Tally("numpy"), time.perf_counter()
    for i in range(n):
        src, dst = draw_case(seed, "numpy", i, max_devices=32)
        run_case(tally, seed, i, src, dst, lambda plan, value, bufs: execute(plan, bufs))
        progress(tally, n, t0)
    tally.seconds = time.perf_counter() - t0
    return tally


def run_jax(n: int, seed: int) -> Tally:
    import jax

    from redist.execute import execute

    devices = len(jax.devices())
    tally, t0 = Tally("jax"), time.perf_counter()
    for i in range(n):
        src, dst = draw_case(seed, "jax", i, max_devices=devices)

        def both(plan, value, bufs):
            out = execute(plan, bufs, backend="jax")
            if not _reshardable(src, dst) or judge(dst, value, out):
                return out
            tally.cover("also through redist.jax.reshard")
            try:
                return _reshard(src, dst, value)
            except Exception as e:
                raise RuntimeError(f"redist.jax.reshard raised {type(e).__name__}: {e}") from e

        run_case(tally, seed, i, src, dst, both)
        progress(tally, n, t0)
    tally.seconds = time.perf_counter() - t0
    return tally


def _reshardable(src: ShardingType, dst: ShardingType) -> bool:
    """Whether ``redist.jax.reshard`` takes the pair: JAX arrays are even, carry no pending sums, and a
    ``PartitionSpec`` names whole axes only."""
    tokens = [a for t in (src, dst) for d in t.dims for a in d]
    return src.is_even() and dst.is_even() and not src.partial and not dst.partial and ":" not in "".join(tokens)


def _reshard(src: ShardingType, dst: ShardingType, value: np.ndarray) -> list[np.ndarray]:
    """``value`` placed as ``src`` (under x64 for a 64-bit dtype, as a user must) and resharded to ``dst`` by
    ``redist.jax.reshard`` with JAX's x64 mode as it was; the result's shards by device id. Each type's JAX
    mesh holds JAX device ``device_ids[p]`` at position ``p`` (the first ``mesh.size`` host devices)."""
    import jax
    from jax.sharding import NamedSharding

    import redist.jax as rj

    devices = jax.devices()[: src.mesh.size]

    def jax_mesh(mesh):
        return jax.sharding.Mesh(np.array([devices[d] for d in mesh.device_ids]).reshape(mesh.shape), mesh.names)

    with rj.in_dtype(src.np_dtype):
        x = jax.device_put(value, NamedSharding(jax_mesh(src.mesh), src.partition_spec()))
    y = rj.reshard(x, NamedSharding(jax_mesh(dst.mesh), dst.partition_spec()))
    by_device = {s.device: np.asarray(s.data) for s in y.addressable_shards}
    return [by_device[d] for d in devices]


def run_mpi(n: int, seed: int) -> Tally:
    """``n`` cases spread over one ``mpiexec`` job per size in :data:`MPI_SIZES`; a job that fails or hangs
    counts its cases as exceptions."""
    from tests.redist.mpi_launch import mpirun

    tally, t0 = Tally("mpi"), time.perf_counter()
    first = 0
    for k, ranks in enumerate(MPI_SIZES):
        count = n // len(MPI_SIZES) + (k < n % len(MPI_SIZES))
        if not count:
            continue
        proc, seconds, hung = mpirun(ranks, "differential", str(seed), str(first), str(count),
                                     timeout=120 + 10 * count)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("differential ")]
        if proc.returncode == 0 and lines:
            tally.merge(json.loads(lines[-1].split(" ", 1)[1]))
        else:
            why = "hung" if hung else f"exit {proc.returncode}"
            tally.cases += count
            tally.counts["exceptions"] += count
            tally.failures.append(f"mpiexec -n {ranks} (cases {first}..{first + count - 1}) {why}: "
                                  f"{(proc.stdout + proc.stderr)[-3000:]}")
        first += count
        print(f"  -n {ranks}: {seconds:.0f} s; {tally.line()}", flush=True)
    tally.seconds = time.perf_counter() - t0
    return tally


def mpi_cases(seed: int, first: int, count: int, comm) -> Tally | None:
    """The cases ``first … first + count - 1`` of the MPI run, on every rank of ``comm`` (called by
    ``tests/redist/mpi_worker.py differential``): ``redist.mpi.reshard`` of each rank's buffer, every rank's result
    gathered and judged on rank 0, whose :class:`Tally` is returned (None on the other ranks)."""
    import redist.mpi

    rank, size = comm.Get_rank(), comm.Get_size()
    tally = Tally("mpi")

    def everywhere(plan, value, bufs):
        try:
            mine = redist.mpi.reshard(bufs[rank], plan.src, plan.dst, comm)
        except ShardingError as e:  # the argument agreement raises on every rank alike
            mine = e
        except Exception as e:  # on this rank alone, mid-plan: the others wait in a collective, so end the job
            raise SystemExit(f"rank {rank}: {label(seed, 'mpi', i, src, dst)}: reshard raised "
                             f"{type(e).__name__}: {e}") from e
        out = comm.allgather(mine)
        raised = [r for r, o in enumerate(out) if isinstance(o, Exception)]
        if raised:
            raise RuntimeError(f"ranks {raised} raised: {out[raised[0]]}")
        return out

    for i in range(first, first + count):
        src, dst = draw_case(seed, "mpi", i, devices=size)
        run_case(tally, seed, i, src, dst, everywhere)
    return tally if rank == 0 else None


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proofs.differential", description=__doc__.split("\n\n")[0])
    parser.add_argument("--numpy", type=int, default=0, metavar="N", help="cases on the numpy backend")
    parser.add_argument("--jax", type=int, default=0, metavar="N", help="cases on JAX (8 host devices)")
    parser.add_argument("--mpi", type=int, default=0, metavar="N", help="cases under mpiexec -n 2 ... 8")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.jax:  # before JAX starts: 8 host devices, as in the tests
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()
    tallies = []
    for backend, n, run in (("numpy", args.numpy, run_numpy), ("jax", args.jax, run_jax), ("mpi", args.mpi, run_mpi)):
        if n:
            print(f"{backend}: {n} cases (seed {args.seed})", flush=True)
            tallies.append(run(n, args.seed))
    print()
    head = ["backend", "cases", "passed", *KINDS, "seconds"]
    print("  ".join(f"{h:>{max(7, len(h))}}" for h in head))
    for t in tallies:
        row = [t.backend, t.cases, t.passed, *(t.counts[k] for k in KINDS), f"{t.seconds:.0f}"]
        print("  ".join(f"{v:>{max(7, len(h))}}" for v, h in zip(row, head)))
    for t in tallies:
        print(f"{t.backend} covered: " + ", ".join(f"{k} {v}" for k, v in sorted(t.features.items())))
    for t in tallies:
        for f in t.failures:
            print(f"FAILURE {f}")
    return 1 if any(t.passed != t.cases for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
