"""Categories run in child processes, so that a crash (a segfault, an abort, an out-of-memory kill) or a hang is
counted against the input that caused it, and the probe goes on in a fresh child.

A child (``python -m proofs.probe --child NAME --seed S --cases FIRST:LAST``) runs cases ``FIRST`` to
``LAST - 1`` of category ``NAME`` and prints, for each, ``case I``, then ``about CODE`` (JSON: what it is about
to run, the reproducer of a crash there) as often as it likes, then ``record RECORD`` (JSON,
:meth:`Tally.record`). The parent reads these lines as they come: a child that ends before the record of its
case crashed there, and one that prints nothing for :data:`CASE_TIMEOUT_S` hangs there (it is killed); either
way the next case runs in a fresh child."""

from __future__ import annotations

import json
import queue
import resource
import subprocess
import sys
import threading
from typing import Callable

from proofs.probe import bombs, jax_misuse, threads
from proofs.probe.tally import ROOT, Tally, case_rng, child_environment

CASE_TIMEOUT_S = 300.0

#: category: (one case, cases in the quick run, in the full run, a fresh process for every case)
CHILD_CASES: dict[str, tuple[Callable, int, int, bool]] = {
    "threads": (threads.case, 1, 4, True),
    "jax": (jax_misuse.case, 100, 800, False),
    "bombs": (bombs.case, 15, 120, False),
}


def child_main(name: str, seed: int, quick: bool, first: int, last: int) -> None:
    """Run cases ``first`` to ``last - 1`` of category ``name``, printing what the module header says. The
    bombs run under an address-space cap of :data:`proofs.probe.bombs.BOMB_ADDRESS_SPACE`."""
    if name == "bombs":
        resource.setrlimit(resource.RLIMIT_AS, (bombs.BOMB_ADDRESS_SPACE, bombs.BOMB_ADDRESS_SPACE))
    case = CHILD_CASES[name][0]
    for i in range(first, last):
        print(f"case {i}", flush=True)
        tally = Tally(name)
        case(tally, case_rng(seed, name, i), quick, lambda code: print("about " + json.dumps(code), flush=True))
        print("record " + json.dumps(tally.record()), flush=True)


def probe_in_children(name: str, seed: int, quick: bool) -> Tally:
    """Category ``name``'s cases in child processes: one child for all of them (or a fresh one for each, where
    :data:`CHILD_CASES` says so), and a fresh one after a crash or a hang, which is that case's failure."""
    tally = Tally(name)
    _, n_quick, n_full, fresh = CHILD_CASES[name]
    n = n_quick if quick else n_full
    first = 0
    while first < n:
        first = _child(tally, name, seed, quick, first, first + 1 if fresh else n)
    return tally


def _child(tally: Tally, name: str, seed: int, quick: bool, first: int, last: int) -> int:
    """Run cases ``first`` to ``last - 1`` in one child, tallying their records; returns the case to go on from
    (the one after a crash or a hang, which is tallied as such)."""
    cmd = [sys.executable, "-m", "proofs.probe", "--child", name, "--seed", str(seed), "--cases", f"{first}:{last}"]
    cmd += ["--quick"] * quick
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: queue.Queue = queue.Queue()
    err: list[str] = []
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    current, about, hung = first, "", False
    while True:
        try:
            line = lines.get(timeout=CASE_TIMEOUT_S)
        except queue.Empty:
            proc.kill()
            hung = True
            break
        if line is None:
            break
        if line.startswith("case "):
            current, about = int(line.split()[1]), ""
        elif line.startswith("about "):
            about = json.loads(line[len("about "):])
        elif line.startswith("record "):
            tally.merge(json.loads(line[len("record "):]))
            current += 1
    proc.wait()
    if current >= last and not hung and proc.returncode == 0:
        return last
    what = f"printed nothing for {CASE_TIMEOUT_S:.0f} s" if hung else f"ended with exit status {proc.returncode}"
    again = " ".join(cmd[1:]).replace(f"{first}:{last}", f"{current}:{current + 1}")
    tally.add("hang" if hung else "crash", f"{name} case {current} {what} (again: python {again}):\n{about}\n"
                                            f"{''.join(err)[-1500:]}")
    return current + 1
