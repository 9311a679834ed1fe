"""Calibrate the ``cpu-host`` link of :mod:`redist.cost`: fit alpha (s) and beta (bytes/s) on JAX host devices.

Method. On 8 host devices (``--xla_force_host_platform_device_count=8``), for groups of 8 (mesh ``x=8``) and of
2 (axis ``y`` of mesh ``x=4,y=2``), time three ``jax.shard_map`` collectives sized so that one device receives
8 KiB .. 2 MiB (larger transfers measure the page-fault cost of fresh buffers more than the copies): a tiled ``all_gather``, a tiled ``all_to_all`` and a cyclic ``ppermute``. Each program
is jitted, warmed up twice, then run ``--repeats`` times with ``block_until_ready``; the median wall time is
kept. The x-coordinate of a point is the bytes one device receives, counted as in :mod:`redist.steps`
(all_gather ``(k−1)/k · L_out``, all_to_all ``(k−1)/k · L``, ppermute ``L``). A least-squares line
``t = alpha + bytes / beta`` through all points, weighted by ``1 / t`` (relative error, so that the
small sizes that set alpha count as much as the large ones), gives the link; per-kind fits are recorded for information.
Writes the ``link`` section of the ``cpu-host`` calibration profile that the package reads in this checkout,
``redist/profiles/cpu-host.json`` (package data, read by ``redist.cost`` for the ``cpu-host`` preset and shipped
by ``pip install .``); with ``--out PATH``, of a copy at PATH instead, put in use with
``redist.cost.use_profile(PATH)`` (see ``bench/calibration.py``).

    python bench/calibrate_cpu_host.py [--repeats 15] [--quick] [--out PATH]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.calibration import PACKAGE_PROFILE, write_section  # noqa: E402


def _program(kind: str, mesh, axis: str, k: int):
    def body(x):
        if kind == "all_gather":
            return lax.all_gather(x, axis, axis=0, tiled=True)
        if kind == "all_to_all":
            return lax.all_to_all(x, axis, 0, 0, tiled=True)
        return lax.ppermute(x, axis, perm=[(i, (i + 1) % k) for i in range(k)])

    spec = P(mesh.axis_names)  # dim 0 split over every mesh axis: one block per device
    out = P(tuple(a for a in mesh.axis_names if a != axis)) if kind == "all_gather" else spec
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=out, check_vma=False))


def _received(kind: str, local_bytes: int, k: int) -> float:
    if kind == "all_gather":
        return (k - 1) * local_bytes  # (k-1)/k of the k·L result
    if kind == "all_to_all":
        return (k - 1) / k * local_bytes
    return float(local_bytes)


def _fit(points):
    xs = np.array([p[0] for p in points])
    ts = np.array([p[1] for p in points])
    w = 1.0 / ts
    A = np.stack([np.ones_like(xs), xs], axis=1) * w[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(A, ts * w, rcond=None)
    # A negative intercept (noise on tiny sizes) is clamped: latency cannot be negative.
    if alpha < 0:
        alpha = 0.0
        inv_beta = float((xs * w) @ (ts * w) / ((xs * w) @ (xs * w)))
    return float(alpha), float(1.0 / inv_beta)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats (a smoke run)")
    ap.add_argument("--out", default=PACKAGE_PROFILE, help="the profile to write (default: the package's)")
    args = ap.parse_args(argv)
    received = [8 << 10, 64 << 10, 512 << 10, 2 << 20] if not args.quick else [8 << 10, 512 << 10]
    repeats = 5 if args.quick else args.repeats
    devices = np.array(jax.devices()[:8])
    meshes = [(jax.sharding.Mesh(devices.reshape(8), ("x",)), "x", 8),
              (jax.sharding.Mesh(devices.reshape(4, 2), ("x", "y")), "y", 2)]
    points, rows = [], []
    for mesh, axis, k in meshes:
        for kind in ("all_gather", "all_to_all", "ppermute"):
            fn = _program(kind, mesh, axis, k)
            for recv in received:
                n = int(recv / _received(kind, 4, k))  # local f32 elements for this many received bytes
                n -= n % 64
                x = jax.device_put(np.ones(8 * n, np.float32), NamedSharding(mesh, P(mesh.axis_names)))
                for _ in range(2):
                    fn(x).block_until_ready()
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    fn(x).block_until_ready()
                    times.append(time.perf_counter() - t0)
                t = statistics.median(times)
                b = _received(kind, n * 4, k)
                points.append((b, t))
                rows.append({"kind": kind, "group": k, "local_bytes": n * 4, "bytes_received": b, "seconds": t})
                print(f"{kind:<11} k={k}  local {n * 4 / 2**20:7.3f} MiB  recv {b / 2**20:7.3f} MiB  "
                      f"median {t * 1e3:8.3f} ms")
    alpha, beta = _fit(points)
    per_kind = {}
    for kind in ("all_gather", "all_to_all", "ppermute"):
        a, bb = _fit([(r["bytes_received"], r["seconds"]) for r in rows if r["kind"] == kind])
        per_kind[kind] = {"alpha": a, "beta": bb}
    result = {
        "alpha": alpha, "beta": beta, "per_kind": per_kind, "points": rows,
        "method": "least-squares t = alpha + bytes_received/beta over all_gather/all_to_all/ppermute, "
                  "groups of 8 and 2, median of repeats",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__}",
        "repeats": repeats,
    }
    print(f"fit: alpha = {alpha * 1e6:.1f} us, beta = {beta / 1e9:.3f} GB/s")
    write_section(args.out, "link", result)
    print(f"wrote the link section of {os.path.relpath(args.out)}")
    return result


if __name__ == "__main__":
    main()
