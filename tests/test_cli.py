"""The command line: ``redist plan`` prints the plan and its figures, ``--json`` the same as JSON, and every
error (usage, bad input, a failure inside) is one line on stderr with exit status 2, never a traceback."""

import json
import os
import subprocess
import sys

import pytest

from redist.cli import main


def test_plan_prints_steps_memory_and_bytes(capsys):
    assert main(["plan", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2", "--program"]) == 0
    out = capsys.readouterr().out
    assert "all_to_all(dim 2 -> dim 1 {x}, dim 0 -> dim 1 {y})" in out
    assert "peak memory     2048 B per device (bound max(src, dst) = 2048 B)" in out
    assert "bytes received  1792 B per device (lower bound 1792 B, 1.000x)" in out
    assert "AllToAll(axes=('x', 'y'))" in out


def test_plan_json():
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["plan", "f32[8{x}, 4]", "f32[8, 4{x}]", "--mesh", "x=2", "--json"]) == 0
    data = json.loads(buf.getvalue())
    assert data["src"] == "f32[8{x}, 4]" and data["dst"] == "f32[8, 4{x}]"
    assert [s["kind"] for s in data["steps"]] == ["all_to_all"]
    assert data["bytes_received"] == data["lower_bound_bytes"] == 32
    assert data["peak_bytes"] == data["memory_bound_bytes"] == 64


def test_bad_input_is_a_clear_error(capsys):
    assert main(["plan", "f32[8{q}]", "f32[8]", "--mesh", "x=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("redist: error: unknown mesh axis 'q'")


# ---------------------------------------------------------------------------- the installed command
REDIST = os.path.join(os.path.dirname(sys.executable), "redist")  # the entry point pip installed beside python


def run_redist(*args):
    return subprocess.run([REDIST, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, words", [
    ([], "redist: error: the following arguments are required: command (see 'redist --help')"),
    (["bogus"], "redist: error: argument command: invalid choice: 'bogus'"),
    (["plan", "f32[8{x}]"], "redist plan: error: the following arguments are required: dst, --mesh"),
    (["plan", "f32[8{x}]", "f32[8]", "--mesh", "x=2", "--bogus"], "unrecognized arguments: --bogus"),
    (["plan", "f32[8{x}]", "f32[8]", "--mesh", "x=²"], "redist: error: cannot read mesh axis 'x=²'"),
    (["plan", "f32[8{x}]", "f32[8]", "--mesh", "x=" + "7" * 5000], "(5000 digits) is too large"),
    (["plan", "f32[8{x}]", "f32[8]", "--mesh", ""], "redist: error: empty mesh text"),
    (["plan", "f32[٨{x}]", "f32[8]", "--mesh", "x=2"], "redist: error: cannot read dim 0 '٨{x}'"),
    (["plan", "f32[8{x}]", "f64[8]", "--mesh", "x=2"], "redist: error: source dtype f32 differs from destination"),
    (["plan", "f32[6{x:(1)2}]", "f32[6{x:(1)3}]", "--mesh", "x=6"], "split mesh axis 'x' (size 6) in incompatible ways"),
    (["demo", "--backends", "bogus"], "redist: error: unknown backend 'bogus' in 'bogus'; the backends are numpy, jax, mpi"),
    (["demo", "--backends", "numpy,cuda"], "unknown backend 'cuda' in 'numpy,cuda'"),
])
def test_every_error_is_one_line_on_stderr_and_exit_2(args, words):
    """Usage errors, bad meshes and bad types alike: exit 2, one line naming the problem, no traceback, and
    nothing run (``demo --backends bogus`` used to print "all checks passed")."""
    r = run_redist(*args)
    assert r.returncode == 2, r
    assert r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and words in r.stderr, r.stderr


def test_an_internal_error_is_one_line_too(capsys, monkeypatch):
    """A failure inside (a bug of ours) is reported in one line with the words to report it, not a traceback."""
    import redist.cli

    def broken(src, dst):
        raise RuntimeError("no memory-bounded plan\nplease report this pair")

    monkeypatch.setattr(redist.cli, "synthesize", broken)
    assert main(["plan", "f32[8{x}]", "f32[8]", "--mesh", "x=2"]) == 2
    err = capsys.readouterr().err
    assert err == ("redist: error: internal error RuntimeError: no memory-bounded plan; please report this pair "
                   "(please report this)\n")


def test_demo_fails_when_a_requested_backend_cannot_run(monkeypatch, tmp_path):
    """MPI asked for but no mpiexec: every case fails on it (it used to be shown as skipped, and passed)."""
    from redist import demo

    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    results, error = demo.run_mpi()
    assert results == [False] * len(demo.CASES) and "no mpiexec" in error
