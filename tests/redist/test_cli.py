"""The command line: ``redist plan`` prints the plan and its figures, ``--json`` a plan file that ``redist verify
--plan`` reads back; ``redist verify`` exits 0 proved, 1 refuted, 3 undecided; and every error (usage, bad input,
a failure inside) is one line on stderr with exit status 2, never a traceback."""

import json
import os
import shlex
import subprocess
import sys

import pytest

import redist
from redist import Mesh, Plan, ShardingType, synthesize
from redist.cli import main
from redist.cost import plan_time
from tests import ROOT


def test_plan_prints_steps_memory_and_bytes(capsys):
    assert main(["plan", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2", "--program"]) == 0
    out = capsys.readouterr().out
    assert "all_to_all(dim 2 -> dim 1 {x}, dim 0 -> dim 1 {y})" in out
    assert "peak memory     2048 B per device (bound max(src, dst) = 2048 B)" in out
    assert "bytes received  1792 B per device (lower bound 1792 B, 1.000x)" in out
    assert "AllToAll(axes=('x', 'y'))" in out


def test_plan_json(capsys):
    assert main(["plan", "f32[8{x}, 4]", "f32[8, 4{x}]", "--mesh", "x=2", "--json"]) == 0
    text = capsys.readouterr().out
    data = json.loads(text)
    assert data["src"] == "f32[8{x}, 4]" and data["dst"] == "f32[8, 4{x}]"
    assert [s["kind"] for s in data["steps"]] == ["all_to_all"]
    assert data["bytes_received"] == data["lower_bound_bytes"] == 32
    assert data["peak_bytes"] == data["memory_bound_bytes"] == 64
    assert Plan.from_json(text) == synthesize(ShardingType.parse("f32[8{x}, 4]", Mesh.parse("x=2")),
                                              ShardingType.parse("f32[8, 4{x}]", Mesh.parse("x=2")))


def test_plan_with_a_topology_picks_by_modeled_time(capsys):
    """On 2x8-nodes the first axis crosses nodes: the plan that avoids it is chosen, and its time printed."""
    mesh = Mesh.parse("n=2,g=4")
    src, dst = ShardingType.parse("f32[64{n,g}, 64]", mesh), ShardingType.parse("f32[64{g,n}, 64]", mesh)
    fast = synthesize(src, dst, topology="2x8-nodes")
    assert main(["plan", str(src), str(dst), "--mesh", "n=2,g=4", "--topology", "2x8-nodes"]) == 0
    out = capsys.readouterr().out
    assert str(fast) in out and f"modeled time    {plan_time(fast, '2x8-nodes') * 1e6:.1f} us on 2x8-nodes" in out
    assert main(["plan", str(src), str(dst), "--mesh", "n=2,g=4", "--topology", "2x8-nodes", "--json"]) == 0
    assert Plan.from_json(capsys.readouterr().out) == fast


# ---------------------------------------------------------------------------- redist verify
def test_verify_synthesizes_and_proves(capsys):
    assert main(["verify", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2"]) == 0
    out = capsys.readouterr().out
    assert "all_to_all(dim 2 -> dim 1 {x}, dim 0 -> dim 1 {y})" in out and "verify: proved in" in out


def test_verify_a_plan_file_and_a_claim(tmp_path, capsys):
    """``plan --json`` output, saved, verifies; a false claim about it is refuted (exit 1) with a counterexample;
    a hand-edited file is refused (exit 2) naming the field."""
    assert main(["plan", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2", "--json"]) == 0
    path = tmp_path / "plan.json"
    path.write_text(capsys.readouterr().out)
    assert main(["verify", "--plan", str(path)]) == 0
    assert "verify: proved in" in capsys.readouterr().out
    assert main(["verify", "--plan", str(path), "--claim", "f32[16, 16{y,x}, 16]"]) == 1
    out = capsys.readouterr().out
    assert "verify: refuted the claim f32[16, 16{y,x}, 16]" in out and "counterexample: device " in out
    assert main(["verify", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2",
                 "--claim", "f32[16, 16{x,y}, 16]"]) == 0
    path.write_text(path.read_text().replace('"peak_bytes": 2048', '"peak_bytes": 1024'))
    assert main(["verify", "--plan", str(path)]) == 2
    assert capsys.readouterr().err == "redist: error: plan file: peak_bytes is 1024, but the steps give 2048\n"


def test_verify_undecided_when_the_timeout_runs_out(capsys):
    assert main(["verify", "f32[64{x}, 32{y}]", "f32[64{y}, 32{x}]", "--mesh", "x=4,y=4", "--timeout", "1e-9"]) == 3
    assert "verify: undecided in" in capsys.readouterr().out


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
    (["plan", "f32[8{x}]", "f32[8]", "--mesh", "x=2", "--topology", "tpu-v9"], "unknown topology preset 'tpu-v9'"),
    (["plan", "f32[8{x}]", "f32[8]", "--mesh", "x=2", "--json", "--program"], "--json writes a plan file, which "
                                                                              "holds no program"),
    (["verify", "f32[8{x}]", "--mesh", "x=2"], "redist verify: error: give SRC DST --mesh MESH, or --plan FILE"),
    (["verify", "f32[8{x}]", "f32[8]"], "give SRC DST --mesh MESH, or --plan FILE"),
    (["verify", "f32[8{x}]", "f32[8]", "--mesh", "x=2", "--plan", "p.json"], "not both"),
    (["verify", "--plan", "/nonexistent/p.json"], "redist: error: cannot read the plan file '/nonexistent/p.json'"),
    (["verify", "--plan", "/dev/null"], "redist: error: plan file: not JSON (Expecting value"),
    (["verify", "f32[8{x}]", "f32[8]", "--mesh", "x=2", "--timeout", "soon"], "not a number of seconds > 0: 'soon'"),
    (["verify", "f32[8{x}]", "f32[8]", "--mesh", "x=2", "--timeout", "0"], "not a number of seconds > 0: '0'"),
    (["verify", "f32[8{x}]", "f32[8]", "--mesh", "x=2", "--timeout", "nan"], "not a number of seconds > 0: 'nan'"),
    (["verify", "f32[8{x}]", "f32[8]", "--mesh", "x=2", "--claim", "f32[8{q}]"], "redist: error: --claim: unknown mesh axis 'q'"),
    (["verify", "f32[8{x}]", "f32[8]", "--mesh", "x=2", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_every_error_is_one_line_on_stderr_and_exit_2(args, words):
    """Usage errors, bad meshes and bad types alike: exit 2, one line naming the problem, no traceback, and
    nothing run (``demo --backends bogus`` does not print "all checks passed")."""
    r = run_redist(*args)
    assert r.returncode == 2, r
    assert r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and words in r.stderr, r.stderr


def test_an_internal_error_is_one_line_too(capsys, monkeypatch):
    """A failure inside (a bug of ours) is reported in one line with the words to report it, not a traceback."""
    import redist.cli

    def broken(src, dst, topology=None):
        raise RuntimeError("no memory-bounded plan\nplease report this pair")

    monkeypatch.setattr(redist.cli, "synthesize", broken)
    assert main(["plan", "f32[8{x}]", "f32[8]", "--mesh", "x=2"]) == 2
    err = capsys.readouterr().err
    assert err == ("redist: error: internal error RuntimeError: no memory-bounded plan; please report this pair "
                   "(please report this)\n")


def test_exit_status_of_the_installed_command():
    """0 proved, 1 refuted, 3 undecided, and ``plan --json | verify --plan -`` through a pipe."""
    types = ["f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2"]
    assert run_redist("verify", *types).returncode == 0
    refuted = run_redist("verify", *types, "--claim", "f32[16, 16{y,x}, 16]")
    assert refuted.returncode == 1 and "counterexample: device" in refuted.stdout
    undecided = run_redist("verify", "f32[64{x}, 32{y}]", "f32[64{y}, 32{x}]", "--mesh", "x=4,y=4", "--timeout", "1e-9")
    assert undecided.returncode == 3, undecided
    text = run_redist("plan", *types, "--json").stdout
    piped = subprocess.run([REDIST, "verify", "--plan", "-"], input=text, capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0 and "verify: proved" in piped.stdout, piped


PLAN = ["plan", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2"]


def test_a_plan_file_is_read_up_to_64_mib():
    """A file that never ends (/dev/zero) is refused after 64 MiB, not read forever."""
    r = subprocess.run([REDIST, "verify", "--plan", "/dev/zero"], capture_output=True, timeout=120)
    assert r.returncode == 2 and r.stdout == b"", r
    assert r.stderr == b"redist: error: the plan file '/dev/zero' is larger than 64 MiB, the most redist reads\n"


def test_closed_standard_streams_are_one_line_errors():
    """``>&-`` and ``<&-``: exit 2 and one line saying which stream is closed, as for any bad input."""
    shell = lambda line: subprocess.run(line, shell=True, capture_output=True, text=True, timeout=300)  # noqa: E731
    command = " ".join(map(shlex.quote, [REDIST, *PLAN]))
    for line in (f"{command} >&-", f"{command} --json >&-"):
        r = shell(line)
        assert (r.returncode, r.stderr) == (2, "redist: error: standard output is closed\n"), r
    r = shell(f"{shlex.quote(REDIST)} verify --plan - <&-")
    assert r.returncode == 2, r
    assert r.stderr == "redist: error: cannot read the plan file from standard input: it is closed\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [PLAN, ["demo", "--backends", "numpy"]])
def test_output_that_cannot_be_written_is_a_one_line_error(args):
    with open("/dev/full", "w") as full:
        r = subprocess.run([REDIST, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 2, r
    assert r.stderr == "redist: error: cannot write to standard output: [Errno 28] No space left on device\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_an_error_with_stderr_closed_or_full_writes_nothing_on_stdout_and_exits_2():
    """Regression (found by the adversarial probe, proofs/probe): with stderr closed (``2>&-``) the error line went to stdout,
    into the output the user redirected; with stderr on a full disk the failed print ended the command with
    exit status 1, which says "refuted"."""
    bad = [REDIST, "plan", "f32[8{q}]", "f32[8]", "--mesh", "x=2"]
    r = subprocess.run(["bash", "-c", 'exec "$@" 2>&-', "bash", *bad], capture_output=True, text=True, timeout=300)
    assert (r.returncode, r.stdout) == (2, ""), r
    with open("/dev/full", "w") as full:
        r = subprocess.run(bad, stdout=subprocess.PIPE, stderr=full, text=True, timeout=300)
    assert (r.returncode, r.stdout) == (2, ""), r


@pytest.mark.parametrize("args", [PLAN, PLAN + ["--json"], ["verify", *PLAN[1:]]])
def test_a_broken_pipe_ends_quietly_with_the_status_of_sigpipe(args):
    """``redist plan ... | head``: the reader went away; nothing on stderr, and 141 as Unix tools (128 + SIGPIPE).
    The pipe's read end is closed before the command starts, so every write meets a broken pipe."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([REDIST, *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (141, ""), r


def test_version_prints_the_package_s_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out == f"redist {redist.__version__}\n"
    r = subprocess.run([REDIST, "--version"], capture_output=True, text=True, timeout=300)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"redist {redist.__version__}\n", ""), r


def test_help_is_plain_text_for_users(capsys):
    """``redist --help`` lists every form of the command, in plain text: no reST markup from the module docstring,
    and no reference to the SPEC, which an installed user does not have."""
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit.value.code == 0
    assert "redist verify --plan FILE" in out and "redist plan SRC DST --mesh" in out
    assert "``" not in out and ":mod:" not in out and "SPEC" not in out


def test_demo_fails_when_a_requested_backend_cannot_run(monkeypatch, tmp_path):
    """MPI asked for but no mpiexec: every case fails on it (not skipped, which would pass)."""
    from redist import demo

    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    results, error = demo.run_mpi()
    assert results == [False] * len(demo.CASES) and "no mpiexec" in error


# ---------------------------------------------------------------------------- python -m proofs
def _proofs(*args):
    return subprocess.run([sys.executable, "-m", "proofs", *args], capture_output=True, text=True, timeout=120,
                          cwd=str(ROOT))


def test_proofs_help_runs_nothing():
    """``--help`` prints the usage and the parts, and exits, without starting a run."""
    r = _proofs("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m proofs [-h] [--quick] [--workers N] [PART ...]")
    assert "step_rules, exhaustive, creating, random, uneven, features, mutation, speed64" in " ".join(r.stdout.split())
    assert "check" not in r.stdout.split() and r.stderr == ""


@pytest.mark.parametrize("args, words", [
    (["--bogus"], "error: unrecognized arguments: --bogus"),
    (["--quick", "nope"], "error: unknown part 'nope'; the parts are step_rules, exhaustive"),
    (["--workers", "0"], "error: --workers must be at least 1, got 0"),
])
def test_proofs_refuses_unknown_arguments(args, words):
    """Unknown flags, unknown parts and bad values are refused (exit 2), never ignored with a full run started."""
    r = _proofs(*args)
    assert r.returncode == 2 and words in r.stderr and r.stdout == "", r


def test_proofs_runs_the_parts_named_with_progress():
    r = _proofs("step_rules", "--quick")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("  ")[0] for line in r.stdout.splitlines()[1:] if line and not line.startswith("total")]
    assert rows == ["step rules, symbolic sizes (Z3)", "step rules, each synthesized step alone"]
    assert "step rules, symbolic: 100%" in r.stderr and "step rules, each step alone: 100%" in r.stderr
