"""Pictures: ``ShardingType.show()``, ``Plan.show()``, ``redist.show``, ``Plan.plot`` and ``redist plan --show /
--plot``, and ``Partitioned.summary()``.

A type's picture is checked against what ``redist.shard`` really puts on each device: the text is read back
(every block's index ranges, the coordinates it names and the devices it lists) and every listed device must
hold exactly those elements of a numbered array, have those coordinates, and be grouped with the devices it
sums with; every block is there once, or counted among those left out. Random types of ranks 0 to 5 on random
meshes: uneven dims, partial axes of every reduction kind, sub-axes, device orders.
"""

import os
import random
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import redist
from redist import Mesh, Plan, ShardingError, ShardingType
from redist.cli import main
from redist.steps import AllGather, AllToAll, ReduceScatter
from redist.testing import SeededDraw, draw_mesh, draw_pair
from redist.types import REDUCTIONS
from tests import ROOT

_LABEL = re.compile(r"(\d+):(\d+) (\S+)")
_TITLE = re.compile(r"\s+dim (\d+) \{[^}]*\}$")
_TABLE_ROW = re.compile(r"\s*(\d+)\s+\[([^\]]*)\]\s+((?:\S+=\d+\s+)+)(.*)$")


# ---------------------------------------------------------------------------- reading a picture back
def _devices(text: str):
    """``(groups, total)`` of a cell's device list: ``0+1,4+5,… (8 devices)``."""
    m = re.search(r" \((\d+) devices\)$", text)
    total = int(m[1]) if m else None
    text = text[:m.start()] if m else text
    groups = [[int(d) for d in g.split("+") if d != "…"] for g in text.split(",") if g != "…"]
    return groups, (total if total is not None else sum(map(len, groups)))


def _coords(text: str) -> dict:
    """``{"x": 1, "y:(2)2": 0}`` of ``x=1,y:(2)2=0`` (or of space-separated lists of them)."""
    out = {}
    for part in text.replace(" ", ",").split(","):
        if part:
            axis, _, c = part.rpartition("=")
            out[axis] = int(c)
    return out


def _read(t: ShardingType, text: str):
    """Every block the picture of ``t`` lists, as ``(box, coords, groups, total)``, and the number of blocks
    it says it has (those shown and those counted as left out)."""
    lines = text.splitlines()
    if any(line.split()[:2] == ["block", "index"] for line in lines):
        return _read_table(t, lines)
    return _read_grid(t, lines)


def _read_table(t, lines):
    blocks = []
    for line in lines:
        m = _TABLE_ROW.match(line)
        if m:
            box = tuple(slice(int(a), int(b)) for a, b in (r.split(":") for r in m[2].split(", ")))
            blocks.append((box, _coords(m[3]), *_devices(m[4])))
    more = [int(m[1]) for line in lines if (m := re.match(r"… (\d+) more blocks?$", line))]
    return blocks, len(blocks) + sum(more)


def _read_grid(t, lines):
    top = next(i for i, line in enumerate(lines) if "┌" in line)
    row_dim = re.match(r"dim (\d+) ", lines[top])
    row_dim = int(row_dim[1]) if row_dim else None
    col_dim, col_labels = None, [None]
    if top >= 2 and _TITLE.match(lines[top - 2]):
        col_dim = int(_TITLE.match(lines[top - 2])[1])
        col_labels = _LABEL.findall(lines[top - 1])
    blocks, rows = [], 0
    for line in lines[top + 1:]:
        if "│" not in line:
            continue
        rows += 1
        parts = line.split("│")
        row_label = _LABEL.match(parts[0])
        assert (row_label is not None) == (row_dim is not None), line
        for col_label, cell in zip(col_labels, parts[1:-1]):
            box, coords = [slice(0, n) for n in t.shape], {}
            for dim, label in ((row_dim, row_label and row_label.groups()), (col_dim, col_label)):
                if dim is not None:
                    box[dim] = slice(int(label[0]), int(label[1]))
                    coords.update(_coords(label[2]))
            blocks.append((tuple(box), coords, *_devices(cell.strip())))
    more_rows = sum(int(m[1]) for line in lines if (m := re.match(r"… (\d+) more rows?$", line)))
    more_cols = sum(int(m[1]) for line in lines if (m := re.search(r"… (\d+) more columns?$", line)))
    return blocks, (rows + more_rows) * (len(col_labels) + more_cols)


def _check_picture(t: ShardingType, text: str) -> None:
    """The picture ``text`` of ``t`` tells exactly which devices hold which elements (module docstring)."""
    mesh = t.mesh
    value = np.arange(1, 1 + int(np.prod(t.shape)), dtype=np.int64).reshape(t.shape)  # 0 is padding
    shards = redist.shard(ShardingType(mesh, t.shape, "i64", t.dims), value)  # the layout, not pending
    groups_of = {tuple(g) for g in mesh.groups(t.partial)} if t.partial else None
    blocks, count = _read(t, text)
    assert count == int(np.prod([t.blocks(i) for i in range(t.rank)])), text
    seen, listed_devices = set(), set()
    for box, coords, groups, total in blocks:
        key = tuple(sorted(coords.items()))
        assert key not in seen, f"block {coords} twice"
        seen.add(key)
        holders = [d for d in range(mesh.size)
                   if all(mesh.axis(a).coord(mesh.coords(d)[mesh.axis(a).name]) == c for a, c in coords.items())]
        assert total == len(holders), (coords, total, holders)
        group_size = int(np.prod([mesh.axis_size(a) for a in t.partial]))
        for g in groups:
            if t.partial and len(g) == group_size:
                assert tuple(g) in groups_of, (g, t.partial)
            elif t.partial:
                assert any(full[:len(g)] == tuple(g) for full in groups_of), g
            for d in g:
                assert d in holders and d not in listed_devices, (d, coords)
                listed_devices.add(d)
                local = shards[d]
                data = tuple(slice(0, s.stop - s.start) for s in box)
                assert np.array_equal(local[data], value[box]), (t, d, box)
                assert np.count_nonzero(local) == value[box].size, (t, d, box)  # the rest is padding
    if sum(total for *_, total in blocks) == mesh.size and len(blocks) == count:
        assert len(listed_devices) == sum(len(g) for *_, groups, _ in blocks for g in groups)


def _random_types(n: int, seed: int):
    rng = SeededDraw(random.Random(seed))
    for _ in range(n):
        mesh = draw_mesh(rng, max_devices=16, device_order=0.3)
        for t in draw_pair(rng, mesh, max_rank=5, partial=0.5, sub_axes=0.3, uneven=0.4, padded=False,
                           reductions=REDUCTIONS, reorder=0.3):
            yield t


# ---------------------------------------------------------------------------- ShardingType.show
@pytest.mark.parametrize("seed", range(4))
def test_the_picture_of_a_random_type_is_what_shard_puts_on_each_device(seed):
    for t in _random_types(40, seed):
        _check_picture(t, t.show(limit=10**6))


@pytest.mark.parametrize("text, mode", [
    ("f32[]", "grid"), ("f32[7]", "grid"), ("f32[7{x}]", "grid"), ("f32[6, 5{y}] partial(max){z}", "grid"),
    ("f32[16{x,y,z}, 3]", "grid"), ("f32[8{x}, 6{y}]", "grid"), ("f32[8{x}, 6{y}, 5{z}]", "table"),
    ("i32[3{x}, 2, 5{y:(1)2}, 4{z}, 1, 2{y:(2)2}] partial{w}", "table"), ("f32[0{x}, 4{y}, 2{z}]", "table"),
])
def test_grid_up_to_two_split_dims_then_a_table(text, mode):
    mesh = Mesh({"x": 2, "y": 4, "z": 2, "w": 2}, device_ids=random.Random(0).sample(range(32), 32))
    t = ShardingType.parse(text, mesh)
    picture = t.show(limit=10**6)
    assert ("┌" in picture) == (mode == "grid") and ("index box" in picture) == (mode == "table")
    _check_picture(t, picture)


def test_the_header_and_the_notes():
    mesh = Mesh({"x": 2, "y": 2, "z": 2})
    t = ShardingType.parse("f32[8{x}, 6, 5{y}] partial(max){z}", mesh)
    lines = t.show().splitlines()
    assert lines[0] == "f32[8{x}, 6, 5{y}] partial(max){z}  on mesh x=2,y=2,z=2: 8 devices"
    assert lines[1] == "288 B per device (f32[4, 6, 3]), 960 B global"
    assert lines[2] == "4 blocks, each held by 2 devices"
    assert lines[3] == "pending max over {z}: the devices joined by + hold values whose maximum is the block"
    assert lines[4] == "dim 2 is uneven: 2 blocks of 3 for 5 elements (padded to 6): block 0 full, block 1 holds 2"
    assert "0+1" in lines[8] and "4+5" in lines[10]
    replicated = ShardingType.parse("f32[6{x,y}]", mesh).show()
    assert "4 blocks, each held by 2 devices: replicas over {z}, listed in that order" in replicated
    assert "blocks 0-2 full, block 3 empty" in replicated and "6:6 x=1,y=1" in replicated
    assert "1 block, each held by 8 devices" in ShardingType.parse("f32[]", mesh).show()


def test_big_meshes_are_capped_and_fast():
    """2³⁰ devices: the pictures list a few blocks and devices and count the rest, computed per block."""
    mesh = Mesh({"a": 1024, "b": 1024, "c": 1024})
    start = time.perf_counter()
    table = ShardingType.parse("f32[4096{a}, 4096{b}, 64{c}]", mesh).show()
    grid = ShardingType.parse("f32[4096{a}, 4096{b}, 64] partial{c}", mesh).show()
    column = ShardingType.parse("f32[4096{a,b}]", mesh).show(limit=4)
    assert time.perf_counter() - start < 2
    assert "… 1073741792 more blocks" in table and len(table.splitlines()) < 40
    assert "… 1016 more columns" in grid and "… 1020 more rows" in grid and "0+1+2+3+… (1024 devices)" in grid
    assert "1048576+1048577+1048578+1048579+… (1024 devices)" in grid
    assert "… 1048572 more rows" in column and "0,1,2,3,… (1024 devices)" in column
    assert len(grid.splitlines()) < 20 and len(column.splitlines()) < 20


def test_limit_is_checked():
    t = ShardingType.parse("f32[8{x}]", Mesh({"x": 2}))
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ShardingError, match="limit"):
            t.show(limit=bad)
    one = t.show(limit=1)
    assert one.count("│") == 2 and one.splitlines()[4].endswith("0:4 x=0  … 1 more column")


# ---------------------------------------------------------------------------- Plan.show and str(plan)
def three_step_plan() -> Plan:
    """A plan of three steps: reduce-scatter a pending sum, gather it, then move a dim's axes to another."""
    mesh = Mesh({"x": 2, "y": 4})
    src = ShardingType.parse("f32[16, 16{y}] partial{x}", mesh)
    return Plan.from_steps(src, [ReduceScatter(0, ("x",)), AllToAll(1, 0, ("y",)), AllGather(0, ("y",))])


def test_plan_show_lists_each_step_its_type_and_bytes_then_the_summary():
    plan = three_step_plan()
    text = plan.show()
    for i, (step, t, b) in enumerate(zip(plan.steps, plan.types[1:], plan.step_bytes()), start=1):
        assert f"step {i}  {step}\n  -> {t}\n" in text
    assert text.count("┌") == 4  # one grid per type on this small mesh
    assert text.endswith("\n" + redist.plan_picture.summary(plan))
    assert "128 B per device; the busiest device receives 128 B; peak so far 256 B" in text
    assert "┌" not in plan.show(blocks=False) and "step 3  all_gather(dim 0, {y})" in plan.show(blocks=False)
    with pytest.raises(ShardingError, match="blocks"):
        plan.show(blocks="yes")


def test_str_plan_ends_with_the_summary():
    plan = three_step_plan()
    lines = str(plan).splitlines()
    assert lines[0] == str(plan.src) and len(lines) == 1 + len(plan.steps) + 2
    bound = max(plan.src.local_bytes, plan.dst.local_bytes)
    lb = redist.lower_bound_bytes(plan.src, plan.dst)
    assert lines[-2] == f"peak memory     {plan.peak_bytes} B per device (bound max(src, dst) = {bound} B)"
    assert lines[-1].startswith(f"bytes received  {plan.bytes_received} B per device (lower bound {lb} B, ")
    empty = Plan.from_steps(plan.src, [])
    assert str(empty).splitlines()[1:] == ["  (no steps: the types are equal)",
                                           f"peak memory     {plan.src.local_bytes} B per device (bound max(src, "
                                           f"dst) = {plan.src.local_bytes} B)",
                                           "bytes received  0 B per device (lower bound 0 B, exact)"]
    assert "(no steps: the types are equal)" in empty.show()


def test_plan_show_on_a_big_mesh_draws_no_blocks_by_default():
    mesh = Mesh({"a": 64, "b": 64})
    plan = redist.synthesize(ShardingType.parse("f32[4096{a}, 4096{b}]", mesh),
                             ShardingType.parse("f32[4096{b}, 4096{a}]", mesh))
    assert "┌" not in plan.show() and "┌" in plan.show(blocks=True, limit=4)


# ---------------------------------------------------------------------------- redist.show
def test_redist_show_prints_types_and_plans(capsys):
    plan = three_step_plan()
    redist.show(plan.src)
    assert capsys.readouterr().out == plan.src.show() + "\n"
    redist.show(plan, limit=2)
    assert capsys.readouterr().out == plan.show(limit=2) + "\n"
    with pytest.raises(ShardingError, match="redist.show takes a ShardingType, a Plan or a jax.Array"):
        redist.show("f32[8]")


def test_redist_show_reads_a_jax_array():
    jax = pytest.importorskip("jax")
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("x", "y"))
    x = jax.device_put(np.zeros((8, 6, 4), np.float32), NamedSharding(mesh, P("x", None, "y")))
    out = subprocess.run([sys.executable, "-c", "import redist, sys; redist.show(redist.ShardingType.parse("
                          "'f32[8{x}]', redist.Mesh({'x': 2}))); assert 'jax' not in sys.modules"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "f32[8{x}]  on mesh x=2: 2 devices" in out.stdout, out.stderr
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as printed:
        redist.show(x)
    assert printed.getvalue().startswith("f32[8{x}, 6, 4{y}]  on mesh x=4,y=2: 8 devices\n")
    with pytest.raises(ShardingError, match="NamedSharding"):
        redist.show(jax.device_put(np.zeros(4), jax.sharding.SingleDeviceSharding(jax.devices()[0])))


# ---------------------------------------------------------------------------- figures
def test_plot_writes_png_and_svg(tmp_path):
    pytest.importorskip("matplotlib")
    plan = three_step_plan()
    plan.plot(tmp_path / "plan.png")  # a str or a path
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rank3 = redist.synthesize(ShardingType.parse("f32[8{x}, 6{y}, 5{z}]", Mesh({"x": 2, "y": 2, "z": 2})),
                              ShardingType.parse("f32[8, 6{x,y}, 5] partial{z}", Mesh({"x": 2, "y": 2, "z": 2})))
    rank3.plot(str(tmp_path / "plan.svg"))
    assert b"<svg" in (tmp_path / "plan.svg").read_bytes()[:1000]
    with pytest.raises(ShardingError, match=r"must end in \.png or \.svg"):
        plan.plot(str(tmp_path / "plan.jpg"))
    with pytest.raises(ShardingError, match="cannot write the figure"):
        plan.plot(str(tmp_path / "no" / "such" / "dir.png"))


def test_plot_without_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'redist\[bench\]'"):
        three_step_plan().plot("plan.png")


# ---------------------------------------------------------------------------- the command line
def test_cli_show_and_plot(tmp_path, capsys):
    args = ["plan", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]", "--mesh", "x=4,y=2"]
    plan = redist.synthesize(*(ShardingType.parse(s, Mesh.parse("x=4,y=2")) for s in args[1:3]))
    assert main(args + ["--show"]) == 0
    assert capsys.readouterr().out == f"mesh x=4,y=2\n{plan.show()}\n"
    png = tmp_path / "plan.png"
    assert main(args + ["--plot", str(png)]) == 0
    assert capsys.readouterr().out.endswith(f"figure          {png}\n")
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert main(args + ["--plot", str(tmp_path / "plan.gif")]) == 2
    assert "must end in .png or .svg" in capsys.readouterr().err
    assert main(args + ["--json", "--show"]) == 2
    assert "use --show without --json" in capsys.readouterr().err
    svg = tmp_path / "plan.svg"
    proc = subprocess.run([sys.executable, "-m", "redist", *args, "--show", "--plot", str(svg)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "step 1  all_to_all" in proc.stdout and svg.stat().st_size > 1000, proc.stderr


# ---------------------------------------------------------------------------- partir_core
def test_partitioned_summary():
    pytest.importorskip("jax")
    import jax.numpy as jnp

    import partir_core

    def mlp(params, x):
        h = jnp.tanh(x @ params["w1"])
        return {"y": h @ params["w2"], "norm": (h * h).sum()}

    mesh = Mesh({"batch": 2, "model": 4})
    pf = partir_core.jit(mlp, mesh, [partir_core.ManualPartition({"x": 0}, axis="batch"),
                                     partir_core.ManualPartition({"params/w1": 1, "params/w2": 0}, axis="model")])
    params = {"w1": np.ones((16, 32), np.float32), "w2": np.ones((32, 8), np.float32)}
    low = pf.lower(params, np.ones((8, 16), np.float32))
    lines = low.summary().splitlines()
    n = len(low.collectives)
    received = sum(c.bytes * c.trips for c in low.collectives)
    assert lines[0] == (f"mesh batch=2,model=4 (8 devices); {n} collectives, "
                        f"{redist.picture.format_bytes(received)} received per device per call")
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:] if line.startswith("  ")}
    assert list(rows) == ["params/w1", "params/w2", "x", "norm", "y"]
    assert rows["params/w1"] == ["f32[16,", "32{model}]", "512", "B", "2.00", "KiB"]
    assert rows["x"][:2] == ["f32[8{batch},", "16]"] and rows["y"][-4:] == ["128", "B", "256", "B"]
    assert str(low.out_types["norm"]) == " ".join(rows["norm"][:-4])
    assert lines[1].split() == ["inputs", "per", "device", "global"] and "outputs" in lines


# ---------------------------------------------------------------------------- docs/pictures.md
with open(os.path.join(ROOT, "docs", "pictures.md"), encoding="utf-8") as f:
    PICTURES = f.read()
# each python block, and the output pasted after it ("" where none is)
DOC_BLOCKS = re.findall(r"^```python\n(.*?)^```\n(?:\n```text\n(.*?)^```$)?", PICTURES, flags=re.S | re.M)


def test_the_doc_has_its_examples():
    assert len(DOC_BLOCKS) == 6 and PICTURES.count("```") == 2 * (len(DOC_BLOCKS) + sum(bool(o) for _, o in DOC_BLOCKS))


@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.slow) if "partir_core" in DOC_BLOCKS[i][0] else i
                               for i in range(len(DOC_BLOCKS))])
def test_doc_block_prints_what_the_doc_shows(i, tmp_path):
    """Each python block of docs/pictures.md runs as written (in a fresh interpreter, this checkout's redist,
    without the suite's JAX settings) and prints exactly the output pasted after it."""
    code, shown_output = DOC_BLOCKS[i]
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, f"docs/pictures.md block {i}:\n{code}\n{proc.stderr[-3000:]}"
    assert proc.stdout == shown_output
