"""The demo: plan, verify and run a handful of classic reshards on 8 devices, on every backend.

``redist demo`` prints one table: each case's plan, bytes received against the lower bound, peak memory
against ``max(src, dst)``, whether Z3 proves the lowered program correct, and whether the result is exact
on the numpy backend, through JAX collectives on 8 host devices and under ``mpiexec -n 8``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

import redist
from redist.data import random_array, summands
from redist.errors import ShardingError, shown

BACKENDS = ("numpy", "jax", "mpi")
CASES = [
    # (mesh, source, destination, what it is)
    ("x=8", "f32[64{x}, 32]", "f32[64, 32{x}]", "move a sharded dim"),
    ("x=2,y=4", "f32[32{x}, 32{y}]", "f32[32{y}, 32{x}]", "swap the axes of two dims"),
    ("x=4,y=2", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "jax-ml/jax#21562 (XLA gathers all)"),
    ("x=2,y=4", "f32[32{x,y}, 8]", "f32[32{y,x}, 8]", "reorder axes within a dim"),
    ("x=2,y=2,z=2", "f32[8{x}, 8{y}, 8{z}]", "f32[8, 8, 8]", "gather everything"),
    ("x=2,y=4", "f32[32, 32]", "f32[32{y}, 32{x}]", "slice (no communication)"),
    ("x=2,y=4", "f32[4{x}]", "f32[4{y}]", "needs a sub-axis of y"),
    ("x=2,y=4", "f32[32, 16] partial{x}", "f32[32{x}, 16]", "reduce-scatter a pending sum"),
    ("x=2,y=2,z=2", "f32[16{z}, 8] partial{x,y}", "f32[16{z}, 8{x}]", "reduce two pending sums"),
    ("x=4,y=2", "f32[50257{x}, 8]", "f32[50257, 8{x}]", "vocabulary 50257 over 4 (padding)"),
    ("x=2,y=4", "f32[13{x,y}, 4]", "f32[13{y,x}, 4]", "uneven blocks, same padded shape"),
]


def _types(mesh_text, a, b):
    mesh = redist.Mesh.parse(mesh_text)
    return redist.ShardingType.parse(a, mesh), redist.ShardingType.parse(b, mesh)


def _value(t, seed=0):
    return random_array(np.random.default_rng(seed), t.shape, t.np_dtype, -8, 9)


def _summands(t, value, seed=1):
    return summands(t, value, np.random.default_rng(seed))


def _expected(dst, value, out):
    if dst.partial:
        return np.array_equal(redist.unshard(dst, out), value)
    return all(np.array_equal(o[dst.data_box(d)], e[dst.data_box(d)])
               for d, (o, e) in enumerate(zip(out, redist.shard(dst, value))))


def run_numpy(src, dst):
    value = _value(src)
    out = redist.execute(redist.synthesize(src, dst), _summands(src, value))
    return _expected(dst, value, out)


def run_jax(src, dst):
    """Through JAX collectives on 8 host devices: ``redist.jax.reshard`` on a placed array; a partial source
    (JAX arrays carry no pending sums) or an uneven one (JAX shards are not padded) runs its per-device
    buffers through ``redist.execute(..., backend="jax")``."""
    # JAX (the [jax] extra) is imported on first use: main sets XLA_FLAGS for 8 host devices before it
    import jax
    from jax.sharding import NamedSharding

    import redist.jax as rjax

    value = _value(src)
    if src.partial or not (src.is_even() and dst.is_even()):
        out = redist.execute(redist.synthesize(src, dst), _summands(src, value), backend="jax")
        return _expected(dst, value, out)
    jmesh = jax.sharding.Mesh(np.array(jax.devices()[: src.mesh.size]).reshape(src.mesh.shape), src.mesh.names)
    x = jax.device_put(value, NamedSharding(jmesh, src.partition_spec()))
    y = rjax.reshard(x, NamedSharding(jmesh, dst.partition_spec()))
    shards = [np.asarray(s.data) for s in sorted(y.addressable_shards, key=lambda s: s.device.id)]
    return _expected(dst, value, shards) and np.array_equal(np.asarray(y), value)


def mpi_worker():
    """Run every case under MPI (one rank per device); rank 0 prints one JSON line of results."""
    # the [mpi] extra, imported in the worker ranks only
    from mpi4py import MPI

    import redist.mpi as rmpi

    comm = MPI.COMM_WORLD
    results = []
    for mesh_text, a, b, _ in CASES:
        src, dst = _types(mesh_text, a, b)
        if src.mesh.size != comm.size:
            results.append(None)
            continue
        value = _value(src)
        mine = rmpi.reshard(_summands(src, value)[comm.rank], src, dst, comm=comm)
        gathered = comm.gather(mine, root=0)
        results.append(bool(_expected(dst, value, gathered)) if comm.rank == 0 else None)
    if comm.rank == 0:
        print("RESULTS " + json.dumps(results), flush=True)


def run_mpi(n=8, timeout=300):
    mpiexec = os.path.join(sys.prefix, "bin", "mpiexec")
    if not os.path.exists(mpiexec):  # asked for and not run: a failed check, not a skipped one
        return [False] * len(CASES), f"no mpiexec in {sys.prefix}/bin"
    cmd = [mpiexec, "-n", str(n), sys.executable, "-m", "redist.demo", "--mpi-worker"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [False] * len(CASES), "mpiexec timed out"
    for line in proc.stdout.splitlines():
        if line.startswith("RESULTS "):
            return json.loads(line[len("RESULTS "):]), None
    return [False] * len(CASES), (proc.stderr or proc.stdout)[-2000:]


def _mark(ok):
    return {True: "ok", False: "FAIL", None: "-"}[ok]


def backend_names(text: str) -> set[str]:
    """The backends that ``text`` (comma-separated, e.g. ``"numpy,jax"``) names; :class:`ShardingError` for a
    name that is none of :data:`BACKENDS` (an empty one included)."""
    if not isinstance(text, str):
        raise ShardingError(f"backends must be a comma-separated string like 'numpy,jax', got {shown(text)}")
    names = {b.strip() for b in text.split(",")}
    unknown = sorted(names - set(BACKENDS))
    if unknown:
        raise ShardingError(f"unknown backend {', '.join(map(repr, unknown))} in {text!r}; the backends are "
                            f"{', '.join(BACKENDS)} (comma-separated)")
    return names


def main(backends="numpy,jax,mpi", say=print) -> int:
    """Run the demo on ``backends`` (comma-separated names of :data:`BACKENDS`), printing its table line by line
    with ``say`` (the command line passes its own, which reports output that cannot be written); returns 0
    when every check passed, 1 otherwise. Raises :class:`ShardingError` for an unknown backend, before running
    anything."""
    wanted = backend_names(backends)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    mpi_results, mpi_error = run_mpi() if "mpi" in wanted else ([None] * len(CASES), None)
    header = f"{'case':<36}{'plan':<44}{'bytes / bound':>16}{'peak / max':>14}  {'Z3':<5}{'numpy':<6}{'jax':<5}{'mpi':<5}"
    say(header)
    say("-" * len(header))
    failures = 0
    for (mesh_text, a, b, what), mpi_ok in zip(CASES, mpi_results):
        src, dst = _types(mesh_text, a, b)
        plan = redist.synthesize(src, dst)
        lb = redist.lower_bound_bytes(src, dst)
        verdict = redist.verify(plan).ok
        np_ok = run_numpy(src, dst) if "numpy" in wanted else None
        jax_ok = run_jax(src, dst) if "jax" in wanted else None
        steps = ", ".join(s.kind for s in plan.steps) or "(none)"
        peak = f"{plan.peak_bytes}/{max(src.local_bytes, dst.local_bytes)}"
        say(f"{what:<36}{steps:<44}{f'{plan.bytes_received}/{lb}':>16}{peak:>14}  "
              f"{_mark(verdict):<5}{_mark(np_ok):<6}{_mark(jax_ok):<5}{_mark(mpi_ok):<5}")
        say(f"    mesh {mesh_text}: {src}  ->  {dst}")
        failures += sum(r is False for r in (verdict, np_ok, jax_ok, mpi_ok))
    if mpi_error:
        say(f"\nMPI: {mpi_error}")
    say(f"\n{'all checks passed' if not failures else f'{failures} checks FAILED'}"
          " (bytes: received per device vs lower bound; peak: bytes per device vs max(src, dst))")
    return 1 if failures else 0


if __name__ == "__main__":
    if "--mpi-worker" in sys.argv:
        mpi_worker()
    else:
        sys.exit(main())
