"""The ``redist`` command as a hostile user runs it: random arguments (a command, types and meshes valid,
mutated or repeated, flags with good and bad values, plan files good, edited, empty, binary, missing or a
directory, junk inserted or an argument dropped), run in this process by :func:`redist.cli.main`; and the
edges of :func:`edges`, each in a process of its own: closed stdout or stdin, a broken pipe, a full disk,
undecodable and huge arguments, endless and deeply nested plan files. Each ends with exit status 0-3 (141 for
a broken pipe) and at most one line on stderr, never a traceback or an internal error; exit 2 with a line
``redist: error: ...`` and nothing on stdout (:func:`problem`)."""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import subprocess
import sys
import tempfile

from proofs.probe.plan_files import mutated_plan_file, random_plan
from proofs.probe.tally import ROOT, Tally, case_rng, child_environment, shown, unexpected
from proofs.probe.text import MESH_TOKENS, TYPE_TOKENS, mutated
from redist.mesh import Mesh
from redist.synthesis import synthesize
from redist.testing import SeededDraw, draw_mesh, draw_pair
from redist.types import REDUCTIONS, ShardingType

CLI_TIMEOUT_S = 120.0  # an edge command still running after this long hangs

TOPOLOGIES = ("tpu-v4", "nvlink-8", "2x8-nodes", "cpu-host", "bogus", "", "TPU-V4")
TIMEOUTS = ("1e-9", "0.5", "30", "nan", "-1", "inf", "1e400", "x", "", "0", "1e-320")
JUNK_ARGS = ("--", "-", "--mesh", "--json", "--plan", "-x", "--mesh=x=2", "--timeout", "--claim", "\x00", "é" * 3,
             "--help", "--version", "plan", "verify", "--dst-mesh", "--topology", "--show")


def _plan_files(directory: str) -> tuple[list[str], str]:
    """Paths for ``--plan`` (a plan file, edits of it, an empty file, bytes that are no UTF-8, a directory, a
    path that does not exist, /dev/null and standard input), written into ``directory``; and the plan file's
    text."""
    rng = random.Random(0)
    plan = random_plan(rng)
    files = {"plan.json": plan.to_json(), "empty.json": "", "binary.json": b"\xff\xfe\x00{"}
    for i in range(4):
        files[f"edited{i}.json"] = mutated_plan_file(rng, plan)
    for name, text in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
    paths = [os.path.join(directory, n) for n in files]
    return paths + [directory, os.path.join(directory, "missing.json"), "/dev/null", "-"], files["plan.json"]


def random_argv(rng: random.Random, files: list[str]) -> list[str]:
    """Random arguments of ``redist``: a command, types and meshes (valid, mutated or repeated), flags with
    good and bad values, and junk inserted or an argument dropped."""
    draw = SeededDraw(rng)
    mesh = draw_mesh(draw, max_devices=8, min_devices=2, device_order=0.1)
    src, dst = draw_pair(draw, mesh, sub_axes=0.3, uneven=0.3, reductions=REDUCTIONS, create=0.1, reorder=0.1)

    def text(value, tokens) -> str:
        r = rng.random()
        return str(value) if r < 0.75 else mutated(rng, str(value), tokens) if r < 0.97 else str(value) * 300

    command = rng.choice(("plan", "plan", "verify", "verify", "verify", "demo", "", "bogus", "--version", "--help"))
    argv = [command] if command else []
    if command in ("plan", "verify") and (command == "plan" or rng.random() < 0.7):
        argv += [text(src, TYPE_TOKENS), text(dst, TYPE_TOKENS), "--mesh", text(mesh, MESH_TOKENS)]
        if dst.mesh != mesh and rng.random() < 0.9:
            argv += ["--dst-mesh", text(dst.mesh, MESH_TOKENS)]
    elif command == "verify":
        argv += ["--plan", rng.choice(files)]
    elif command == "demo":
        argv += ["--backends", rng.choice(("bogus", "numpy,cuda", "", ",", "NUMPY", "numpy,,jax"))]
    flags = [["--json"], ["--program"], ["--show"], ["--topology", rng.choice(TOPOLOGIES)],
             ["--claim", text(rng.choice((src, dst)), TYPE_TOKENS)], ["--timeout", rng.choice(TIMEOUTS)],
             ["--plan", rng.choice(files)], ["--plot", rng.choice(("/nonexistent/dir/p.png", "plot.txt"))]]
    for flag in rng.sample(flags, rng.choice((0, 0, 1, 1, 2, 3))):
        argv += flag
    if argv and rng.random() < 0.15:
        argv.pop(rng.randrange(len(argv)))
    if rng.random() < 0.15:
        argv.insert(rng.randint(0, len(argv)), rng.choice(JUNK_ARGS))
    return argv


def _run_here(argv: list[str], stdin: str) -> tuple[int, str, str]:
    """``redist.cli.main(argv)`` with its standard streams captured: (exit status, stdout, stderr)."""
    from redist.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as e:  # --help, --version
                status = e.code if isinstance(e.code, int) else 2
    finally:
        sys.stdin = old_stdin
    return status, out.getvalue(), err.getvalue()


def problem(status, out: str, err: str, allowed=(0, 1, 2, 3), stderr_closed: bool = False) -> str | None:
    """What is wrong with how a redist command ended (None: nothing): an exit status not ``allowed``, a
    traceback or an internal error, more than one line on stderr, an exit 2 without an error line there (none
    where stderr is closed) or with output on stdout."""
    if status not in allowed:
        return f"exit status {status}"
    if "Traceback" in err or "internal error" in err:
        return f"stderr {shown(err, 600)}"
    if len(err.splitlines()) > 1:
        return f"{len(err.splitlines())} lines on stderr: {shown(err, 600)}"
    if status == 2 and out:
        return f"exit 2 with output on stdout: {shown(out, 300)} (stderr {shown(err, 300)})"
    if status == 2 and not stderr_closed and not re.match(r"redist( \w+)?: (error: |interrupted)", err):
        return f"exit 2 without a line 'redist: error: ...' on stderr: {shown(err)}"
    return None


def _redist(*args) -> list:
    return [sys.executable, "-m", "redist", *args]


PLAN_ARGS = ("plan", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2")


def edges() -> list[tuple[str, dict, tuple]]:
    """Commands at the edges, each (what it is, ``subprocess.run`` arguments, the exit statuses allowed); the
    first five are the quick run's sample. A closed stream is closed by the shell (``exec ... >&-``)."""
    plan_text = synthesize(ShardingType.parse(PLAN_ARGS[1], Mesh.parse("x=4,y=2")),
                           ShardingType.parse(PLAN_ARGS[2], Mesh.parse("x=4,y=2"))).to_json()
    closed = lambda cmd, fd: ["bash", "-c", f'exec "$@" {fd}>&-', "bash", *cmd]  # noqa: E731
    return [
        ("stdout closed", dict(args=closed(_redist(*PLAN_ARGS), 1)), (2,)),
        ("stdin closed, --plan -", dict(args=closed(_redist("verify", "--plan", "-"), 0)), (2,)),
        ("reader gone (broken pipe)", dict(args=_redist(*PLAN_ARGS), stdout="broken pipe"), (141,)),
        ("--plan /dev/zero", dict(args=_redist("verify", "--plan", "/dev/zero")), (2,)),
        ("undecodable argument", dict(args=_redist("plan", b"f32[8{\xff}]", "f32[8]", "--mesh", "x=2")), (2,)),
        ("stdout a full disk", dict(args=_redist(*PLAN_ARGS), stdout="/dev/full"), (2,)),
        ("stdout a full disk, --json", dict(args=_redist(*PLAN_ARGS, "--json"), stdout="/dev/full"), (2,)),
        ("stderr closed, bad input", dict(args=closed(_redist("plan", "f32[8{q}]", "f32[8]", "--mesh", "x=2"), 2)),
         (2,)),
        ("stderr a full disk, bad input", dict(args=_redist("plan", "f32[8{q}]", "f32[8]", "--mesh", "x=2"),
                                               stderr="/dev/full"), (2,)),
        ("--plan - of '[' * 2,000,000", dict(args=_redist("verify", "--plan", "-"), input=b"[" * 2_000_000), (2,)),
        ("--plan - of 70 MB", dict(args=_redist("verify", "--plan", "-"), input=b" " * (70 << 20)), (2,)),
        ("--plan - of no UTF-8", dict(args=_redist("verify", "--plan", "-"), input=b"\xff\xfe{}"), (2,)),
        ("--plan - a plan", dict(args=_redist("verify", "--plan", "-"), input=plan_text.encode()), (0,)),
        ("--mesh of 120 KB", dict(args=_redist("plan", "f32[8{x}]", "f32[8]", "--mesh", "x=2," * 30_000)), (2,)),
        ("a type of 120 KB", dict(args=_redist("plan", "f32[" + "8{x}," * 24_000 + "8]", "f32[8]", "--mesh",
                                               "x=2")), (2,)),
        ("1,000 arguments", dict(args=_redist(*PLAN_ARGS, *["--json"] * 1000)), (0,)),
        ("C locale, text not ASCII", dict(args=_redist("plan", "f32[٨{x}]", "f32[8]", "--mesh", "x=2"),
                                          env={"LC_ALL": "C", "PYTHONUTF8": "0"}), (2,)),
        ("verify --timeout 1e-9 (undecided, as asked)",
         dict(args=_redist("verify", "f32[64{x}, 32{y}]", "f32[64{y}, 32{x}]", "--mesh", "x=4,y=4", "--timeout",
                           "1e-9")), (3,)),
    ]


def _run_edge(spec: dict) -> tuple[int | str, str, str]:
    """Run one edge command: (exit status, stdout, stderr), or status "hang" if it runs past
    :data:`CLI_TIMEOUT_S`. ``stdout`` and ``stderr`` may name a file to write to, or ``"broken pipe"``: a pipe
    whose reader is gone."""
    spec = dict(spec)
    env = child_environment()
    env.update(spec.pop("env", {}))
    opened: list[int] = []

    def stream(where):
        if where == "broken pipe":
            read, write = os.pipe()
            os.close(read)
            opened.append(write)
        elif isinstance(where, str):
            opened.append(os.open(where, os.O_WRONLY))
        else:
            return where
        return opened[-1]

    try:
        stdout, stderr = stream(spec.pop("stdout", subprocess.PIPE)), stream(spec.pop("stderr", subprocess.PIPE))
        r = subprocess.run(**spec, stdout=stdout, stderr=stderr, env=env, cwd=ROOT, timeout=CLI_TIMEOUT_S)
        return r.returncode, (r.stdout or b"").decode(errors="replace"), (r.stderr or b"").decode(errors="replace")
    except subprocess.TimeoutExpired:
        return "hang", "", ""
    finally:
        for fd in opened:
            os.close(fd)


def probe(seed: int, quick: bool) -> Tally:
    tally = Tally("cli")
    with tempfile.TemporaryDirectory() as directory:
        cwd = os.getcwd()
        os.chdir(directory)  # where a --plot FILE is written
        try:
            _random_commands(tally, seed, 300 if quick else 3000, directory)
        finally:
            os.chdir(cwd)
    for what, spec, allowed in edges()[:5] if quick else edges():
        status, out, err = _run_edge(spec)
        wrong = "hung" if status == "hang" else problem(status, out, err, allowed, "stderr" in what)
        tally.add(f"edge, exit {status}" if wrong is None else "wrong at an edge", None if wrong is None else
                  f"{what}: {shown(spec['args'], 300)}: {wrong}")
    return tally


def _random_commands(tally: Tally, seed: int, n: int, directory: str) -> None:
    """``n`` random command lines, run in this process with a random standard input."""
    files, plan_text = _plan_files(directory)
    for i in range(n):
        rng = case_rng(seed, "cli", i)
        argv = random_argv(rng, files)
        stdin = rng.choice((plan_text, "", "{", "[" * 10_000))
        call = f"redist.cli.main({shown(argv, 2000)}) with stdin {shown(stdin, 100)}"
        try:
            status, out, err = _run_here(argv, stdin)
        except Exception as e:  # noqa: BLE001 - what the probe looks for
            tally.add("other error", f"{call} {unexpected(e)}")
            continue
        wrong = problem(status, out, err)
        tally.add(f"exit {status}" if wrong is None else "wrong", None if wrong is None else f"{call}: {wrong}")
