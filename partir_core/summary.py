"""A partitioned program in a few lines (:meth:`partir_core.Partitioned.summary`).

A header names the mesh and the collectives: how many there are and the bytes a device receives in them per
call (a collective inside a loop counted once per trip, docs/spec.md §6). Then one line per input and per
output: its path, its sharding type, and its bytes per device against the whole array's. Inputs are named by
their paths (the parameter, then pytree keys: ``params/w1``); outputs by their pytree keys in the result
(``0`` for a lone array or the first of a tuple, ``1/w1``, ``loss``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax

from redist.picture import format_bytes

from partir_core.ir import key_name

if TYPE_CHECKING:  # partition calls this module
    from partir_core.partition import Partitioned


def output_paths(out_types) -> list[str]:
    """The path of each leaf of ``out_types`` (a pytree of types shaped like the result), in leaf order."""
    leaves = jax.tree_util.tree_flatten_with_path(out_types)[0]
    return ["/".join(key_name(k) for k in path) or str(j) for j, (path, _) in enumerate(leaves)]


def summary(p: Partitioned) -> str:
    """The header and the table of inputs and outputs of ``p`` (module docstring)."""
    mesh, collectives = p.mesh, p.collectives
    received = sum(c.bytes * c.trips for c in collectives)
    n = len(collectives)
    head = (f"mesh {mesh or '(no axes)'} ({mesh.size} device{'s' * (mesh.size != 1)}); {n} collective"
            f"{'s' * (n != 1)}" + (f", {format_bytes(received)} received per device per call" if n else ""))
    rows = [("inputs", "", "per device", "global")]
    rows += [(f"  {path}", str(t), format_bytes(t.local_bytes), format_bytes(t.global_bytes))
             for path, t in zip(p.graph.in_paths, p.program.in_types)]
    rows.append(("outputs", "", "", ""))
    rows += [(f"  {path}", str(t), format_bytes(t.local_bytes), format_bytes(t.global_bytes))
             for path, t in zip(output_paths(p.out_types), jax.tree_util.tree_leaves(p.out_types))]
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}".rstrip()
             for r in rows]
    return "\n".join([head, *lines])
