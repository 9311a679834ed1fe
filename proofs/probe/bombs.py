"""Resource bombs: meshes of 2^30 to 2^31 - 1 devices (:data:`BOMB_MESHES`, some past the limit) and dims up to
2^40, on which a user synthesizes a plan (by bytes or by modeled time) and asks for its figures, program,
proof, file and pictures. Each call gives a value (the accounting stays symbolic: per class of devices, not
per device) or a :class:`redist.ShardingError` that names the limit it met; within :data:`BOMB_MEMORY` of
ru_maxrss growth (the child runs under an address-space cap of :data:`BOMB_ADDRESS_SPACE`, so a runaway
allocation fails there, not the machine), ``verify`` within its ``timeout_s`` (and :data:`VERIFY_SLACK_S`),
and any other call within :data:`BOMB_CALL_S`. Each bomb is a few lines of code, its own reproducer."""

from __future__ import annotations

import random
import re
import resource
import time
from typing import Callable

from proofs.probe.tally import Tally, unexpected
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.types import ShardingType

BOMB_MEMORY = 2 << 30  # bytes of ru_maxrss growth that one call may take
BOMB_ADDRESS_SPACE = 4 << 30
BOMB_CALL_S = 60.0
VERIFY_SLACK_S = 5.0  # how far past its timeout_s a verify call may return

BOMB_MESHES = ("x=32768,y=32768", "x=2147483647", "x=1073741824", "x=65536,y=16384", "x=46341,y=46340",
               ",".join(f"a{i}=2" for i in range(30)), "x=1024,y=1024,z=1024", "x=4194304,y=256",
               "x=1000,y=1000,z=1000", "x=4096,y=4096,z=64", "x=2,y=1073741823", "x=65536,y=65536")
LIMIT_WORDS = re.compile(r"limit|MAX_|more than \d|too large|at most \d")


def _bomb_layout(rng: random.Random, mesh: Mesh, rank: int, partial: bool):
    """Random axes of a type on ``mesh``: each axis whole or cut in two sub-axes (by a small factor: listing
    every factorization of 2^30 would take forever), to a random dim, to the partial axes or nowhere."""
    tokens = []
    for name, size in mesh.axes:
        cuts = [f for f in (2, 3, 4, 8, 16, 1024) if size % f == 0 and f < size]
        if cuts and rng.random() < 0.3:
            f = rng.choice(cuts)
            tokens += [f"{name}:(1){f}", f"{name}:({f}){size // f}"]
        else:
            tokens.append(name)
    dims, part = [[] for _ in range(rank)], []
    for token in rng.sample(tokens, len(tokens)):
        r = rng.random()
        if r < 0.6 and rank:
            dims[rng.randrange(rank)].append(token)
        elif r < 0.75 and partial:
            part.append(token)
    return tuple(map(tuple, dims)), tuple(part)


def bomb_pair(rng: random.Random) -> tuple[str, tuple[str, str] | None]:
    """A mesh text of :data:`BOMB_MESHES` and a pair of type texts on it (None where the mesh is refused), with
    dims of the block counts or of any size up to 2^40 (the pair may then be refused: too many elements)."""
    from redist.bounds import check_pair

    mesh_text = rng.choice(BOMB_MESHES)
    try:
        mesh = Mesh.parse(mesh_text)
    except ShardingError:
        return mesh_text, None
    while True:
        rank = rng.randint(0, 3)
        d1, p1 = _bomb_layout(rng, mesh, rank, rng.random() < 0.3)
        d2, p2 = _bomb_layout(rng, mesh, rank, False)
        p2 = tuple(a for a in p1 if rng.random() < 0.5 and not any(mesh.axis(a).overlaps(mesh.axis(b))
                                                                   for d in d2 for b in d))
        shape = []
        for a, b in zip(d1, d2):
            k = max(mesh.group_size(a), mesh.group_size(b))
            shape.append(rng.choice((k, 2 * k, k + 1, max(0, k - 1), 1, 0, 2**20, 2**40)))
        dtype = rng.choice(("f32", "i8", "f64", "c128", "bool"))
        kind = rng.choice(("sum", "max")) if p1 and dtype != "c128" else "sum"
        try:
            src = ShardingType(mesh, tuple(shape), dtype, d1, p1, kind)
            dst = ShardingType(mesh, tuple(shape), dtype, d2, p2, kind)
            check_pair(src, dst)
        except ShardingError as e:
            if LIMIT_WORDS.search(str(e)):  # too many elements: a bomb refused, kept as an input
                return mesh_text, (f"ShardingType(mesh, {tuple(shape)}, {dtype!r}, {d1}, {p1}, {kind!r})", None)
            continue
        return mesh_text, (str(src), str(dst))


BOMB_CALLS = ("lower_bound_bytes(src, dst)", "plan.bytes_received", "plan.peak_bytes", "plan.step_bytes()",
              "plan.program", "verify(plan, timeout_s={timeout})", "Plan.from_json(plan.to_json()) == plan",
              "str(plan)", "plan.show()", "src.show()", "src.local_bytes", "cost.plan_time(plan, 'tpu-v4')",
              "mesh.device({{n: s - 1 for n, s in mesh.axes}})", "mesh.coords(mesh.size - 1)",
              "ShardingType.parse(str(dst), mesh) == dst")
PRELUDE = "from redist import Mesh, Plan, ShardingType, cost, lower_bound_bytes, synthesize, verify"


def case(tally: Tally, rng: random.Random, quick: bool, announce: Callable[[str], None]) -> None:
    """One bomb: a mesh and a pair, a plan synthesized for it, then random calls on them, each a line of code
    run after :data:`PRELUDE` and the lines before it. The bomb stops at the first line refused (or failed)."""
    mesh_text, pair = bomb_pair(rng)
    lines = [f"mesh = Mesh.parse({mesh_text!r})"]
    if pair is not None and pair[1] is None:
        lines.append(f"src = {pair[0]}")
    elif pair is not None:
        topology = rng.choice(("", "", ", topology='tpu-v4'", ", topology='2x8-nodes'"))
        lines += [f"src = ShardingType.parse({pair[0]!r}, mesh)", f"dst = ShardingType.parse({pair[1]!r}, mesh)",
                  f"plan = synthesize(src, dst{topology})"]
        calls = rng.sample(BOMB_CALLS, rng.randint(1, 4 if quick else 6))
        lines += [call.format(timeout=2.0 if quick else 10.0) for call in calls]
    scope: dict = {}
    exec(PRELUDE, scope)  # noqa: S102 - the probe's own code
    for i, line in enumerate(lines):
        code = "\n".join(lines[:i + 1])
        announce(f"{PRELUDE}\n{code}")
        if not _run_line(tally, line, scope, code):
            return


def _run_line(tally: Tally, line: str, scope: dict, code: str) -> bool:
    """Run ``line`` (the last of ``code``) in ``scope`` and tally it; False if the bomb stops there."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    failure = None
    try:
        exec(line, scope) if " = " in line.split("(")[0] else eval(line, scope)  # noqa: S102, S307 - our own code
    except ShardingError as e:
        if LIMIT_WORDS.search(str(e)):
            outcome = "refused, naming the limit"
        else:
            outcome, failure = "refused otherwise", f"raised a ShardingError that names no limit: {str(e)[:400]}"
    except Exception as e:  # noqa: BLE001 - what the probe looks for (MemoryError included)
        outcome, failure = "other error", unexpected(e)
    else:
        outcome = "answered"
    seconds = time.perf_counter() - t0
    high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grown = high - rss
    timeout = re.search(r"timeout_s=([\d.]+)", line)
    bound = float(timeout[1]) + VERIFY_SLACK_S if timeout else BOMB_CALL_S
    if failure is None and grown > BOMB_MEMORY:
        outcome, failure = "memory", f"maxrss grew by {grown / 2**30:.1f} GiB"
    elif failure is None and seconds > bound:
        outcome, failure = "slow", f"took {seconds:.1f} s (bound {bound:.0f} s)"
    tally.add(outcome, None if failure is None else f"after {PRELUDE}:\n{code}\n{failure}")
    tally.peak("MiB of maxrss growth in a call", grown / 2**20, line)
    tally.peak("MiB of maxrss (the child's high-water mark)", high / 2**20, line)
    tally.peak("seconds of a call", seconds, line)
    return outcome == "answered"
