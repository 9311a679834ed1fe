"""A plan told step by step: its figures against the two bounds, and a picture of every type it passes through.

:func:`summary` is the plan's two figures against their bounds, the lines that end ``str(plan)`` and that
``redist plan`` prints: the peak per-device memory against ``max(src, dst)`` (a plan never needs more,
docs/spec.md §3) and the bytes the busiest device receives against :func:`redist.lower_bound_bytes` (no plan
receives less). :func:`plan_picture` (:meth:`redist.Plan.show`) lists the source and then, per step, the step,
the type after it, its bytes per device, what the busiest device receives in it and the peak so far, each type
optionally drawn as :mod:`redist.picture` draws it, and ends with the summary.

The module reads plans through their attributes (``redist.plan`` imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redist.bounds import lower_bound_bytes
from redist.errors import ShardingError, shown
from redist.picture import MAX_BLOCKS, blocks_picture, check_limit, format_bytes

if TYPE_CHECKING:  # plan calls this module: a runtime import would be a cycle
    from redist.plan import Plan

BLOCKS_UP_TO = 32
"""``Plan.show()`` draws every type's blocks by default on meshes of at most this many devices."""


def summary(plan: Plan) -> str:
    """Two lines: the plan's peak bytes per device against ``max(src.local_bytes, dst.local_bytes)``, and the
    bytes its busiest device receives against the lower bound, with their ratio."""
    bound = max(plan.src.local_bytes, plan.dst.local_bytes)
    lb = lower_bound_bytes(plan.src, plan.dst)
    ratio = f"{plan.bytes_received / lb:.3f}x" if lb else ("exact" if plan.bytes_received == 0 else "n/a")
    return (f"peak memory     {plan.peak_bytes} B per device (bound max(src, dst) = {bound} B)\n"
            f"bytes received  {plan.bytes_received} B per device (lower bound {lb} B, {ratio})")


def plan_picture(plan: Plan, blocks: bool | None = None, limit: int = MAX_BLOCKS) -> str:
    """The plan step by step (module docstring). ``blocks``: draw each type's blocks (None: on meshes of at
    most :data:`BLOCKS_UP_TO` devices); ``limit``: the most blocks each picture shows. Raises
    :class:`ShardingError` for a ``blocks`` that is no bool or None, or a ``limit`` that is no int >= 1."""
    if blocks is not None and not isinstance(blocks, bool):
        raise ShardingError(f"blocks must be True, False or None (draw them on small meshes), got {shown(blocks)}")
    check_limit(limit)
    src, dst, mesh = plan.src, plan.dst, plan.src.mesh
    if blocks is None:
        blocks = max(t.mesh.size for t in plan.types) <= BLOCKS_UP_TO
    n = len(plan.steps)
    where = f"on mesh {_mesh(mesh)}"
    if not mesh.is_reordering_of(dst.mesh):
        where = f"from mesh {_mesh(mesh)} to mesh {_mesh(dst.mesh)}"
    lines = [f"plan {where}: {src} -> {dst}, {n} step{'s' * (n != 1)}", "", f"source  {src}",
             f"  {format_bytes(src.local_bytes)} per device"]
    if blocks:
        lines += _indented(blocks_picture(src, limit))
    peak = src.local_bytes
    for i, (step, t, b) in enumerate(zip(plan.steps, plan.types[1:], plan.step_bytes()), start=1):
        peak = max(peak, t.local_bytes)
        lines += ["", f"step {i}  {step}", f"  -> {t}",
                  f"  {format_bytes(t.local_bytes)} per device; the busiest device receives {format_bytes(b)}; "
                  f"peak so far {format_bytes(peak)}"]
        if not t.mesh.is_reordering_of(plan.types[i - 1].mesh):
            lines.append(f"  moved to mesh {t.mesh}")
        elif t.mesh != plan.types[i - 1].mesh:
            lines.append(f"  devices reordered: mesh {t.mesh}")
        if blocks:
            lines += _indented(blocks_picture(t, limit))
    if not plan.steps:
        lines += ["", "(no steps: the types are equal)"]
    return "\n".join(lines + ["", summary(plan)])


def _mesh(mesh) -> str:
    """A mesh and its device count, as the picture's first line names it."""
    return f"{mesh or '(no axes)'} ({mesh.size} device{'s' * (mesh.size != 1)})"


def _indented(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]
