"""The synthesizer's memory bound and correctness, checked with :func:`redist.verify.verify`.

- exhaustive: every (src, dst) pair of whole-axis types (partial types included, dst.partial ⊆ src.partial)
  of rank 0–3 on every mesh of at most 8 devices (axis sizes >= 2), each dim the smallest size both
  sides divide; and, apart, every such pair whose destination creates pending sums (dst.partial ⊄
  src.partial: docs/spec.md §3; ``python -m proofs`` runs them to rank 2, as the proofs enumerate each group
  sum's contributors, whose number grows steeply with the rank);
- random: a seeded sample of pairs on 16-device meshes (1–4 axes, sub-axes, partial types, dims up to 3×
  the smallest legal size);
- random uneven: a seeded sample of pairs with non-divisible dims (XLA's padding rule, docs/spec.md §2) on meshes
  of 2–16 devices (1–4 axes, sub-axes, partial types, rank 1–3), every dim of any size from 0 to twice
  its larger block count plus one, at least one dim uneven on one side;
- random creating: a seeded sample of pairs whose destination creates pending sums, on meshes of 2–16
  devices (sub-axes, partial sources, a third uneven), also checked by the numpy oracle;
- exhaustive features: every whole-axis pair of rank 0–2 on every mesh of at most 8 devices once more,
  each with the reduction kinds, device orders and dtypes in turn: a partial source takes the
  next kind of max, min, prod, sum; the destination the next device order of the default one and those of
  :func:`proofs.common.device_orders`; the dtype the next of c64, f32, c128, bool (f32 where a complex
  dtype has no such reduction);
- random features: a seeded sample of pairs on meshes of up to 16 devices in random device orders, with
  every reduction kind, destinations on another device order, complex, bool and integer dtypes, sub-axes
  and uneven dims (those with the uneven checks below).

For each pair: the plan is synthesized, ``verify(plan)`` must prove it (values at every data position of
the destination, never read from source padding; group sums; peak_bytes and bytes_received against the
instructions), the program's largest buffer (from the verifier's own shape derivation) must be at most
max(src, dst) local bytes (computed here from docs/spec.md §2, not from the type class), and bytes_received must not
beat ``lower_bound_bytes``. For uneven pairs also: a plan with an exchange and no reduction must receive
exactly ``lower_bound_bytes`` (the exchange sends each device only the elements it lacks; between device
orders, only where no pending value must change hands, since a device may have to take another summand
there), and the numpy oracle (source padding filled with NaN) must give the destination's value.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import statistics
import sys
import time
from collections import Counter

from redist.bounds import lower_bound_bytes
from redist.testing import SeededDraw, draw_mesh, draw_pair
from redist.types import ShardingType


def local_bytes(t) -> int:
    """A device's buffer in bytes, padding included: ceil(N / k) per dim (docs/spec.md §2)."""
    n = 1
    for size, axes in zip(t.shape, t.dims):
        k = math.prod(t.mesh.axis_size(a) for a in axes)
        n *= -(-size // k)
    return n * t.itemsize


def plan_shape(plan) -> str:
    """How a plan is built: its step kinds in order, joined by `` + ``, with each ``pad`` … ``unpad`` run
    (collectives on the padded view) written ``padded collectives``; ``no steps`` for an empty plan. E.g.
    ``exchange``, ``all_reduce + exchange``, ``padded collectives + exchange``."""
    parts, padded = [], False
    for kind in (s.kind for s in plan.steps):
        if kind == "pad":
            padded = True
            parts.append("padded collectives")
        elif kind == "unpad":
            padded = False
        elif not padded:
            parts.append(kind)
    return " + ".join(parts) or "no steps"


def check_pair(pair, uneven: bool = False) -> dict:
    """The checks of the module docstring for one pair; ``uneven`` adds those for uneven pairs and records
    the plan's :func:`plan_shape`."""
    from proofs.common import synthesized_and_proved

    src, dst = pair
    out = {"pair": f"{src.mesh}: {src} -> {dst}", "ok": False, "seconds": 0.0}
    proved = synthesized_and_proved(src, dst, out)
    if proved is None:
        return out
    plan, v = proved
    bound = max(local_bytes(src), local_bytes(dst))
    if v.details["peak_bytes"] > bound:
        out["error"] = f"memory bound: peak {v.details['peak_bytes']} > max(src, dst) local bytes {bound}"
        return out
    least = lower_bound_bytes(src, dst)
    if plan.bytes_received < least:
        out["error"] = f"bytes_received {plan.bytes_received} below lower_bound_bytes {least}"
        return out
    if uneven:
        from proofs.common import oracle

        kinds = {s.kind for s in plan.steps}
        out["shape"] = plan_shape(plan)
        # without reductions or created sums, on one device order or without pending sums, an exchange
        # receives exactly what each device lacks
        out["at_bound"] = ("exchange" in kinds
                           and not kinds & {"all_reduce", "reduce_scatter", "replicate_to_partial", "shard_to_partial"}
                           and (src.mesh == dst.mesh or not src.partial))
        if out["at_bound"] and plan.bytes_received != least:
            out["error"] = f"exchange plan receives {plan.bytes_received} bytes, not lower_bound_bytes {least}"
            return out
        ok, why = oracle(plan.program, src, dst)
        if not ok:
            out["error"] = f"numpy oracle: {why}"
            return out
    out["ok"] = True
    return out


def _chunk(pairs):
    return [check_pair(p) for p in pairs]


def _chunk_uneven(pairs):
    return [check_pair(p, uneven=True) for p in pairs]


def _chunk_features(pairs):
    """:func:`check_pair` with the uneven checks for the uneven pairs; adds the features each pair has."""
    out = []
    for src, dst in pairs:
        r = check_pair((src, dst), uneven=not (src.is_even() and dst.is_even()))
        r["features"] = features(src, dst)
        out.append(r)
    return out


def features(src, dst) -> list[str]:
    """The features a pair exercises beyond the defaults: its reduction kind (partial sources), a change of
    device order, a source mesh in another device order than the default, and its dtype if complex or bool."""
    out = [f"partial({src.reduction})"] if src.partial else []
    out += ["another device order"] * (src.mesh != dst.mesh) + ["reordered mesh"] * (not src.mesh.is_row_major)
    return out + [src.dtype] * (src.dtype in ("c64", "c128", "bool"))


def run_pairs(pairs, workers: int, desc: str, chunk: int = 64, check=_chunk) -> list[dict]:
    """``check`` on every pair, in chunks, over ``workers`` processes, with a progress bar named ``desc``."""
    from proofs.common import progress

    chunks = [pairs[i:i + chunk] for i in range(0, len(pairs), chunk)]
    results: list[dict] = []
    with contextlib.ExitStack() as stack:
        bar = stack.enter_context(progress(desc=desc, total=len(pairs), unit="pair"))
        if workers <= 1:
            done = map(check, chunks)
        else:
            done = stack.enter_context(mp.get_context("spawn").Pool(workers)).imap_unordered(check, chunks)
        for rs in done:
            results += rs
            bar.update(len(rs))
    return results


def exhaustive_pairs(max_devices: int = 8, max_rank: int = 3, creating: bool = False):
    from proofs.common import all_meshes, all_pairs

    out = []
    for mesh in all_meshes(max_devices):
        for rank in range(max_rank + 1):
            out += list(all_pairs(mesh, rank, creating=creating))
    return out


def random_pairs(n: int, seed: int = 0, devices: int = 16):
    draw = SeededDraw(seed)
    return [draw_pair(draw, draw_mesh(draw, devices=devices), max_rank=4, partial=0.4, sub_axes=0.25)
            for _ in range(n)]


def random_uneven_pairs(n: int, seed: int = 0, max_devices: int = 16):
    draw = SeededDraw(seed)
    return [draw_pair(draw, draw_mesh(draw, max_devices=max_devices, min_devices=2), partial=0.4, sub_axes=0.25,
                      uneven=1.0)
            for _ in range(n)]


FEATURE_KINDS = ("max", "min", "prod", "sum")
FEATURE_DTYPES = ("c64", "f32", "c128", "bool")


def feature_pairs(max_devices: int = 8, max_rank: int = 2):
    """The pairs of "exhaustive features" in the module docstring."""
    from proofs.common import all_meshes, all_pairs, device_orders

    out, i = [], 0
    for mesh in all_meshes(max_devices):
        orders = [mesh] + device_orders(mesh)
        for rank in range(max_rank + 1):
            for src, dst in all_pairs(mesh, rank):
                kind = FEATURE_KINDS[i % len(FEATURE_KINDS)] if src.partial else "sum"
                dtype = FEATURE_DTYPES[i % len(FEATURE_DTYPES)]
                if kind in ("max", "min") and dtype in ("c64", "c128"):
                    dtype = "f32"
                out.append((ShardingType(mesh, src.shape, dtype, src.dims, src.partial, kind),
                            ShardingType(orders[i % len(orders)], dst.shape, dtype, dst.dims, dst.partial, kind)))
                i += 1
    return out


def random_feature_pairs(n: int, seed: int = 0, max_devices: int = 16):
    """The pairs of "random features" in the module docstring."""
    from redist.types import REDUCTIONS

    draw = SeededDraw(f"features:{seed}")
    return [draw_pair(draw, draw_mesh(draw, max_devices=max_devices, min_devices=2, device_order=0.3), max_rank=3,
                      partial=0.5, sub_axes=0.25, dtype=("f32", "c64", "c128", "bool", "i32", "bf16"),
                      reductions=REDUCTIONS, reorder=0.5, uneven=0.3, padded=False)
            for _ in range(n)]


def summarize(name: str, results: list[dict], seconds: float) -> dict:
    fails = [r for r in results if not r["ok"]]
    times = [r["seconds"] for r in results if r["seconds"]]
    return {
        "check": name,
        "cases": len(results),
        "passed": len(results) - len(fails),
        "failed": len(fails),
        "median_verify_s": statistics.median(times) if times else 0.0,
        "max_verify_s": max(times) if times else 0.0,
        "seconds": seconds,
        "failures": fails[:20],
    }


def run_exhaustive(workers: int = 2, max_devices: int = 8, max_rank: int = 3, creating: bool = False) -> dict:
    t = time.perf_counter()
    pairs = exhaustive_pairs(max_devices, max_rank, creating)
    what = "pairs creating pending sums" if creating else "pairs"
    return summarize(f"exhaustive: all whole-axis {what}, meshes <= {max_devices} devices, rank <= {max_rank}",
                     run_pairs(pairs, workers, f"exhaustive {what}"), time.perf_counter() - t)


def run_random(n: int = 10_000, workers: int = 2, seed: int = 0) -> dict:
    t = time.perf_counter()
    pairs = random_pairs(n, seed)
    return summarize(f"random: {n} pairs on 16-device meshes, rank <= 4 (sub-axes, partial)",
                     run_pairs(pairs, workers, "random"), time.perf_counter() - t)


def run_random_uneven(n: int = 3000, workers: int = 2, seed: int = 0) -> dict:
    """:func:`run_random` on :func:`random_uneven_pairs`, with the uneven checks; adds ``by_shape`` (proved
    plans per :func:`plan_shape`) and ``at_bound`` (proved exchange plans without a reduction, each
    receiving exactly the lower bound)."""
    t = time.perf_counter()
    results = run_pairs(random_uneven_pairs(n, seed), workers, "random uneven", check=_chunk_uneven)
    out = summarize(f"random uneven: {n} pairs on meshes <= 16 devices, rank <= 3 (sub-axes, partial)", results,
                    time.perf_counter() - t)
    proved = [r for r in results if r["ok"]]
    out["by_shape"] = dict(Counter(r["shape"] for r in proved).most_common())
    out["at_bound"] = sum(r["at_bound"] for r in proved)
    return out


def run_random_creating(n: int = 2000, workers: int = 2, seed: int = 0) -> dict:
    """:func:`proofs.step_rules.creating_pairs` checked like the uneven pairs (numpy oracle included); adds
    ``by_shape``."""
    from proofs.step_rules import creating_pairs

    t = time.perf_counter()
    results = run_pairs(creating_pairs(n, seed), workers, "random creating", check=_chunk_uneven)
    out = summarize(f"random creating: {n} pairs creating pending sums, meshes <= 16 devices (sub-axes, partial, "
                    "uneven)", results, time.perf_counter() - t)
    out["by_shape"] = dict(Counter(r["shape"] for r in results if r["ok"]).most_common(8))
    return out
def run_features(workers: int = 2, n_random: int = 2000, seed: int = 0, max_rank: int = 2) -> tuple[dict, dict]:
    """The exhaustive and random feature checks of the module docstring; each summary has ``by_feature``
    (proved pairs per :func:`features`)."""
    out = []
    for name, pairs in ((f"exhaustive features: pairs of rank <= {max_rank} on meshes <= 8 devices with kinds, "
                         "device orders, complex", feature_pairs(max_rank=max_rank)),
                        (f"random features: {n_random} pairs on meshes <= 16 devices (kinds, device orders, "
                         "complex, uneven)", random_feature_pairs(n_random, seed))):
        t = time.perf_counter()
        results = run_pairs(pairs, workers, name.split(":")[0], check=_chunk_features)
        res = summarize(name, results, time.perf_counter() - t)
        res["by_feature"] = dict(Counter(f for r in results if r["ok"] for f in r["features"]).most_common())
        out.append(res)
    return out[0], out[1]


if __name__ == "__main__":
    res = (run_random_uneven() if "--uneven" in sys.argv else run_random() if "--random" in sys.argv
           else run_random_creating() if "--creating" in sys.argv
           else run_exhaustive(creating="--exhaustive-creating" in sys.argv))
    print({k: v for k, v in res.items() if k != "failures"})
    for f in res["failures"]:
        print(f)
    sys.exit(1 if res["failed"] else 0)
