"""Threads: :data:`THREADS` threads calling synthesize, verify (with a proof, a refutation and a budget too
small to decide), plan files, execute and ``redist.jax.reshard`` at once, on the pairs of
:data:`THREAD_PAIRS`. Every call gives its single-threaded result (a call with a small budget may be
undecided instead), and nothing crashes; each round runs in a fresh child process
(:mod:`proofs.probe.children`), as a crash of the interpreter depends on the timing."""

from __future__ import annotations

import hashlib
import random
import threading
from typing import Callable

from proofs.probe.tally import Tally, unexpected
from redist.mesh import Mesh
from redist.plan import Plan
from redist.synthesis import synthesize
from redist.types import ShardingType

THREAD_PAIRS = [  # (mesh, src, dst, a false claim): whole axes first (redist.jax.reshard moves the first three)
    ("x=4,y=2", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "f32[16, 16{y,x}, 16]"),
    ("x=2,y=2,z=2", "i32[8{x,y}, 4{z}]", "i32[8{z}, 4{y,x}]", "i32[8{z}, 4{x,y}]"),
    ("x=4,y=2", "f32[12{x}, 6]", "f32[12, 6{y}]", "f32[12, 6{x}]"),
    ("x=4,y=2", "f32[8, 6] partial{x}", "f32[8{y}, 6{x}]", "f32[8{x}, 6{y}]"),
    ("x=4,y=2", "f32[7{x}, 5{y}]", "f32[7{y}, 5{x}]", "f32[7{x}, 5{y}]"),
    ("x=8", "i32[16{x:(1)2}, 8{x:(2)4}]", "i32[16{x:(2)4}, 8{x:(1)2}]", "i32[16{x:(1)2}, 8{x:(2)4}]"),
]
THREADS = 8
SMALL_BUDGET_S = 0.02  # a verify budget that often runs out: the call may be undecided


def _calls() -> dict[str, Callable[[], str]]:
    """Calls of every entry point on the pairs of :data:`THREAD_PAIRS`, each giving a digest of its result."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding

    import redist.jax
    from redist.data import random_array, shard
    from redist.execute import execute
    from redist.verify import verify

    def digest(arrays) -> str:
        return hashlib.sha1(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()

    calls = {}
    for k, (mesh_text, a, b, wrong) in enumerate(THREAD_PAIRS):
        mesh = Mesh.parse(mesh_text)
        src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
        plan = synthesize(src, dst)
        calls[f"synthesize {k}"] = lambda src=src, dst=dst: str(synthesize(src, dst))
        calls[f"verify {k}"] = lambda plan=plan: verify(plan).status
        calls[f"verify claim {k}"] = lambda plan=plan, wrong=wrong: verify(plan, wrong).status
        calls[f"verify small budget {k}"] = lambda plan=plan: verify(plan, timeout_s=SMALL_BUDGET_S).status
        calls[f"plan file {k}"] = lambda plan=plan: str(Plan.from_json(plan.to_json()) == plan)
        if src.partial:
            continue
        value = random_array(np.random.default_rng(k), src.shape, src.np_dtype)
        calls[f"execute {k}"] = lambda plan=plan, value=value: digest(execute(plan, shard(plan.src, value)))
        if k < 3:
            jmesh = jax.make_mesh(mesh.shape, mesh.names)
            x = jax.device_put(value, NamedSharding(jmesh, src.partition_spec()))
            target = NamedSharding(jmesh, dst.partition_spec())
            calls[f"reshard {k}"] = lambda x=x, target=target: digest([np.asarray(redist.jax.reshard(x, target))])
    return calls


def case(tally: Tally, rng: random.Random, quick: bool, announce: Callable[[str], None]) -> None:
    """One round: every call alone, then :data:`THREADS` threads making all of them at once, twice each, in a
    random order of their own."""
    calls = _calls()
    small = [name for name in calls if name.startswith("verify small budget")]
    alone = {name: call() for name, call in calls.items() if name not in small}
    alone.update({name: alone[name.replace("small budget ", "")] for name in small})  # given the time it needs
    orders = [rng.sample(sorted(calls), len(calls)) * 2 for _ in range(THREADS)]
    announce(f"{THREADS} threads making {sum(map(len, orders))} calls: {', '.join(sorted(calls))}")
    results: list[tuple[str, str]] = []

    def work(order):
        for name in order:
            try:
                results.append((name, calls[name]()))
            except Exception as e:  # noqa: BLE001 - what the probe looks for
                results.append((name, unexpected(e)))

    threads = [threading.Thread(target=work, args=(order,)) for order in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, got in results:
        same = got == alone[name] or got == "undecided" and name.startswith("verify small budget")
        tally.add("as alone" if same else "different", None if same else
                  f"{name} in {THREADS} threads (proofs/probe/threads.py THREAD_PAIRS) gave {got!r}, alone "
                  f"{alone[name]!r}")
