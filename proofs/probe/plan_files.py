"""Plan files, as a hostile user edits them: the JSON of real plans (synthesized, of random step sequences,
across meshes) with one to three random edits (a value replaced by junk or by another of the file's values, a
field or list entry dropped, duplicated or swapped, a number nudged, a text mutated, an unknown field added),
now and then cut short or given bytes that are no UTF-8. Each is refused with :class:`redist.ShardingError`,
or is the plan it was, or is another valid plan: its file reads back to it, numpy runs it right and verify
proves it."""

from __future__ import annotations

import copy
import json
import random

from proofs.probe.tally import Tally, case_rng, shown, unexpected
from proofs.probe.text import MESH_TOKENS, TYPE_TOKENS, mutated
from redist.errors import ShardingError
from redist.plan import Plan
from redist.synthesis import synthesize
from redist.testing import SeededDraw, draw_cross_mesh_pair, draw_mesh, draw_mesh_pair, draw_pair
from redist.types import REDUCTIONS

JUNK = (None, True, False, 0, -1, 1, 2, 3, 2**31, 2**63, -(2**63), 10**400, 1.5, float("nan"), float("inf"), "",
        "x", "sum", "max", "f32[8]", "x=2", [], {}, [0], ["x"], [[0, 1, ["x"]]], {"x": 2}, "redist.plan/1")
EDITS_PER_PLAN = 10


def random_plan(rng: random.Random, across_meshes: float = 0.0) -> Plan:
    """A real plan: synthesized for a random pair (meshes of up to 16 devices, sub-axes, uneven dims, pending
    values of every kind, device orders, created sums, four dtypes), or of random steps
    (:mod:`proofs.step_sequences`), or, with probability ``across_meshes``, synthesized across two meshes."""
    from proofs.step_sequences import random_plan as random_steps

    draw = SeededDraw(rng)
    if rng.random() < across_meshes:
        return synthesize(*draw_cross_mesh_pair(draw, draw_mesh_pair(draw), uneven=0.3))
    if rng.random() < 0.4:
        return random_steps(rng)
    mesh = draw_mesh(draw, max_devices=16, min_devices=2, device_order=0.2)
    return synthesize(*draw_pair(draw, mesh, sub_axes=0.3, uneven=0.3, reductions=REDUCTIONS, reorder=0.2,
                                 create=0.2, dtype=("f32", "i32", "bool", "c64")))


def _nodes(data, path=()):
    """Every (path, node) of a JSON value, the root first."""
    yield path, data
    children = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, child in children:
        yield from _nodes(child, path + (key,))


def mutated_plan_file(rng: random.Random, plan: Plan) -> str | bytes:
    """The plan's file with random edits (module header)."""
    data = json.loads(plan.to_json())
    for _ in range(rng.randint(1, 3)):
        _edit(rng, data)
    text = json.dumps(data)
    if rng.random() < 0.15:
        text = text[:rng.randint(0, len(text))]
    if rng.random() < 0.1:
        i = rng.randint(0, len(text))
        return text[:i].encode() + rng.choice((b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80")) + text[i:].encode()
    return text


def _edit(rng: random.Random, data: dict) -> None:
    """One random edit of ``data``, in place (an edit that does not fit the node drawn does nothing)."""
    nodes = list(_nodes(data))
    path, node = rng.choice(nodes)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    edit = rng.choice(("junk", "other", "drop", "duplicate", "swap", "nudge", "text", "field"))
    if edit in ("junk", "other", "nudge", "text") and path:
        if edit == "junk":
            new = rng.choice(JUNK)
        elif edit == "other":
            new = copy.deepcopy(rng.choice(nodes)[1])
        elif isinstance(node, int) and not isinstance(node, bool):
            new = rng.choice((node + 1, node - 1, -node, 2 * node, node + 2**32))
        else:
            new = mutated(rng, str(node), TYPE_TOKENS + MESH_TOKENS)
        parent[path[-1]] = new
    elif edit in ("drop", "duplicate") and path:
        if isinstance(parent, list) and edit == "duplicate":
            parent.insert(path[-1], copy.deepcopy(node))
        else:
            del parent[path[-1]]
    elif edit == "swap" and isinstance(node, list) and len(node) >= 2:
        i, j = rng.sample(range(len(node)), 2)
        node[i], node[j] = node[j], node[i]
    elif edit == "field" and isinstance(node, dict):
        node[rng.choice(("bogus", "dst_mesh", "args", "kind", "steps", "reduction"))] = rng.choice(JUNK)


def probe(seed: int, quick: bool) -> Tally:
    tally = Tally("plan_files")
    for i in range((1000 if quick else 5000) // EDITS_PER_PLAN):
        rng = case_rng(seed, "plan_files", i)
        plan = random_plan(rng, across_meshes=0.2)
        for _ in range(EDITS_PER_PLAN):
            _check(tally, plan, mutated_plan_file(rng, plan), rng.randrange(2**31))
    return tally


def _check(tally: Tally, original: Plan, text, seed: int) -> None:
    """Read the plan file ``text`` (edited from ``original``'s) and tally the outcome."""
    call = f"Plan.from_json({shown(text, 3000)})"
    try:
        plan = Plan.from_json(text)
    except ShardingError:
        tally.add("refused")
        return
    except Exception as e:  # noqa: BLE001 - what the probe looks for
        tally.add("other error", f"{call} {unexpected(e)}")
        return
    if plan == original:
        tally.add("read, the same plan")
        return
    problem = _invalid(plan, seed)
    tally.add("read, another valid plan" if problem is None else "wrong", None if problem is None else
              f"{call} read a plan that is not valid: {problem}")


def _invalid(plan: Plan, seed: int) -> str | None:
    """What is wrong with ``plan`` (None: nothing): its file does not read back to it, numpy runs it wrong, or
    (where it has one program: one mesh, numbered from 0) verify does not prove it."""
    import numpy as np

    from proofs.common import oracle, source_buffers
    from redist.data import unshard
    from redist.execute import execute
    from redist.verify import verify

    if Plan.from_json(plan.to_json()) != plan:
        return "its file reads back to another plan"
    if plan.crosses_meshes or any(t.mesh.id_bound != t.mesh.size for t in plan.types):
        bufs, value = source_buffers(plan.src, np.random.default_rng(seed))
        got = unshard(plan.dst, execute(plan, bufs))
        return None if np.array_equal(got, value) else "numpy: wrong values"
    ok, why = oracle(plan.program, plan.src, plan.dst, seed=seed)
    if not ok:
        return f"numpy: {why}"
    verdict = verify(plan, timeout_s=120)
    return None if verdict.status == "proved" else f"verify {verdict.status}: {verdict.reason}"
