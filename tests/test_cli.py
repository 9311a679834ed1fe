"""The command line: ``redist plan`` prints the plan and its figures, ``--json`` the same as JSON, and bad
input is a one-line error with exit status 2."""

import json

from redist.cli import main


def test_plan_prints_steps_memory_and_bytes(capsys):
    assert main(["plan", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2", "--program"]) == 0
    out = capsys.readouterr().out
    assert "all_to_all(dim 2 -> dim 1 {x}, dim 0 -> dim 1 {y})" in out
    assert "peak memory     2048 B per device (bound max(src, dst) = 2048 B)" in out
    assert "bytes received  1792 B per device (lower bound 1792 B, 1.000x)" in out
    assert "AllToAll(split_dim=0, concat_dim=0" in out


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
