"""Plans across meshes, checked as a property over random pairs (docs/spec.md §3, "Across meshes").

Pairs are drawn on two meshes of up to 8 devices each, in turn of every relation of
:data:`redist.testing.MESH_RELATIONS` (the same devices as another mesh, disjoint devices, overlapping ones, and
a mesh of another size on some of them), with device ids in random orders and often not ``0 … n−1``: partial
sources of every reduction kind, destinations that create pending sums or keep the source's, uneven dims. For
each pair:

- ``verify(plan)`` proves it (every destination block on every device of the destination's mesh, the plan's
  footprint — no device above the larger of its two buffers, none of neither mesh touched — and the plan's
  ``peak_bytes`` and ``bytes_received`` against the instructions);
- the numpy backend runs ``plan.stages`` exactly (:func:`proofs.common.oracle`: distinct elements, random
  summands per partial group, source padding poisoned);
- every device holds at most the larger of its local bytes under the source and under the destination (0 on a
  mesh it is not in), counted here from docs/spec.md §2 on the types of the plan (not from the verifier's
  reading of the instructions);
- ``bytes_received`` is never below ``lower_bound_bytes``, and equals it where neither side has pending
  values (then the bound is attainable: one transfer of what each device lacks).

``python -m proofs cross_mesh`` prints the count per relation and the median and largest verify time per plan.
"""

from __future__ import annotations

import time
from collections import Counter

from redist.bounds import lower_bound_bytes
from redist.testing import MESH_RELATIONS, SeededDraw, draw_cross_mesh_pair, draw_mesh_pair
from redist.types import REDUCTIONS


def device_peaks_within_bound(plan) -> str | None:
    """What is wrong with the memory a plan's devices hold (None: nothing): each device holds, at each step
    boundary whose type's mesh it is on, that type's local bytes (padded, docs/spec.md §2), which must be at
    most the larger of its local bytes under the source and under the destination, each counted where the
    device is on that type's mesh."""
    from proofs.exhaustive import local_bytes

    src, dst = plan.src, plan.dst
    for t in plan.types:
        for d in t.mesh.devices:
            bound = max([local_bytes(src)] * src.mesh.has_device(d) + [local_bytes(dst)] * dst.mesh.has_device(d),
                        default=0)
            if local_bytes(t) > bound or not (src.mesh.has_device(d) or dst.mesh.has_device(d)):
                return f"device {d} holds {local_bytes(t)} bytes as {t}, above its bound {bound}"
    return None


def check_pair(case) -> dict:
    """The checks of the module docstring for one ``(relation, (src, dst))``."""
    from proofs.common import oracle, synthesized_and_proved

    relation, (src, dst) = case
    out = {"pair": f"{src.mesh} -> {dst.mesh}: {src} -> {dst}", "relation": relation, "ok": False, "seconds": 0.0,
           "at_bound": False}
    proved = synthesized_and_proved(src, dst, out)
    if proved is None:
        return out
    plan, v = proved
    ok, why = oracle(plan.stages, src, dst)
    if not ok:
        out["error"] = f"numpy oracle: {why}"
        return out
    memory = device_peaks_within_bound(plan)
    if memory:
        out["error"] = f"memory bound: {memory}"
        return out
    least = lower_bound_bytes(src, dst)
    if plan.bytes_received < least:
        out["error"] = f"bytes_received {plan.bytes_received} below lower_bound_bytes {least}"
        return out
    if not (src.partial or dst.partial):
        out["at_bound"] = True
        if plan.bytes_received != least:
            out["error"] = (f"no pending values, but bytes_received {plan.bytes_received} is not lower_bound_bytes "
                            f"{least}")
            return out
    out["ok"] = True
    return out


def _chunk(cases):
    return [check_pair(c) for c in cases]


def random_pairs(n: int, seed: int = 0, max_devices: int = 8):
    """``n`` ``(relation, (src, dst))`` cases, the relations in turn (the drawing of the module docstring)."""
    draw = SeededDraw(f"cross mesh:{seed}")
    out = []
    for i in range(n):
        relation = MESH_RELATIONS[i % len(MESH_RELATIONS)]
        meshes = draw_mesh_pair(draw, max_devices=max_devices, relations=(relation,))
        out.append((relation, draw_cross_mesh_pair(draw, meshes, partial=0.4, dst_partial=0.3, uneven=0.3,
                                                   reductions=REDUCTIONS)))
    return out


def run(n: int = 1000, workers: int = 2, seed: int = 0) -> dict:
    """Check ``n`` random pairs (:func:`random_pairs`) over ``workers`` processes; the summary of
    :func:`proofs.exhaustive.summarize`, with the passed pairs per relation and how many were held to the
    lower bound."""
    from proofs.exhaustive import run_pairs, summarize

    t = time.perf_counter()
    results = run_pairs(random_pairs(n, seed), workers, "cross mesh", chunk=16, check=_chunk)
    out = summarize(f"cross mesh: {n} random pairs on two meshes of <= 8 devices", results, time.perf_counter() - t)
    out["by_relation"] = dict(Counter(r["relation"] for r in results if r["ok"]))
    out["at_bound"] = sum(r["at_bound"] and r["ok"] for r in results)
    return out
