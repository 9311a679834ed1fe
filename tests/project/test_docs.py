"""The documentation's examples run as written, its links lead somewhere, and its generated page is current.

Collected from README.md and docs/**/*.md:

- Every ```python block runs in a fresh interpreter outside the checkout, with this checkout on PYTHONPATH and
  without the test suite's JAX settings (a block that needs 8 devices asks for them itself). A python block
  followed by a ```console block whose command is ``.venv/bin/mpiexec -n N python FILE`` runs as that command.
- Every command of a ```console block that calls ``redist`` runs, the block's commands in order in one folder:
  it must exit 0, or N where its comment says ``exits N``, and print the lines shown after it, if any
  (seconds masked). Other shell commands (``./dev``, ``pip``) are in indented blocks and do not run.
- Every relative link leads to a file that exists.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest

from bench import report
from tests import ROOT

PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                             recursive=True)
                               if "_build" not in p)
MPIEXEC = os.path.join(sys.prefix, "bin", "mpiexec")
# Fenced blocks a page may hold: examples (python), shell sessions (console), pictures (text) and the
# directives of the Sphinx build (toctree, eval-rst).
LANGUAGES = {"python", "console", "text", "{toctree}", "{eval-rst}"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks(page: str) -> list[Block]:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    return [Block(page, text.count("\n", 0, m.start()) + 1, m[1], m[2])
            for m in re.finditer(r"^```(\S*)\n(.*?)^```$", text, flags=re.S | re.M)]


BLOCKS = [b for page in PAGES for b in _blocks(page)]


def _launch(block: Block) -> list[str] | None:
    """The ``mpiexec`` command a python block runs under: the console block right after it, if it is one."""
    following = BLOCKS[BLOCKS.index(block) + 1] if BLOCKS.index(block) + 1 < len(BLOCKS) else None
    if following is None or following.page != block.page or following.language != "console":
        return None
    with open(os.path.join(ROOT, block.page), encoding="utf-8") as f:
        between = f.read().split("\n")[block.line + block.text.count("\n") + 1:following.line - 1]  # after the fence
    command = following.text.strip()
    if any(line.strip() for line in between) or not command.startswith("$ .venv/bin/mpiexec"):
        return None
    return shlex.split(command[2:])


PYTHON = [b for b in BLOCKS if b.language == "python"]
# Blocks that train a model of partir_core's zoo repeat tests/partir_core/test_partition.py, at half a minute each.
SLOW = [b for b in PYTHON if "partir_core import models" in b.text]
CONSOLE = [b for b in BLOCKS if b.language == "console" and "redist " in b.text]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_every_fenced_block_is_of_a_known_kind():
    assert PYTHON and {b.language for b in BLOCKS} <= LANGUAGES, {b.name: b.language for b in BLOCKS
                                                                  if b.language not in LANGUAGES}


def test_every_mpiexec_line_runs_the_example_above_it():
    shown = [b for b in BLOCKS if b.language == "console" and "mpiexec" in b.text]
    launched = [BLOCKS[BLOCKS.index(b) - 1] for b in shown]
    assert shown and all(b.language == "python" and _launch(b) for b in launched), [b.name for b in shown]


def test_the_readme_is_the_front_door():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[2].split("#")[0].strip() == "./dev demo" and lines[3].split("#")[0].strip() == "./dev test"
    assert len(lines) <= 150
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", "\n".join(lines))  # figures and dates: docs/benchmarks.md
    readme = [b.text for b in PYTHON if b.page == "README.md"]
    for needed in ("redist.synthesize", "redist.mpi.reshard", "partir_core.ManualPartition",
                   "partir_core.AutomaticPartition"):
        assert any(needed in b for b in readme), needed
    assert any("redist.jax.reshard" in b and "jax.device_put" in b for b in readme)  # reshard next to device_put
    console = " ".join(b.text for b in CONSOLE if b.page == "README.md")
    assert "redist plan" in console and "redist verify" in console


def _marks(block: Block) -> list:
    return [pytest.mark.slow] * (block in SLOW) + [pytest.mark.mpi] * (_launch(block) is not None)


@pytest.mark.parametrize("block", [pytest.param(b, marks=_marks(b)) for b in PYTHON], ids=lambda b: b.name)
def test_python_block_runs(block, tmp_path):
    launch = _launch(block)
    if launch is None:
        cmd = [sys.executable, "-c", block.text]
    else:
        script = launch[-1]
        (tmp_path / script).write_text(block.text)
        cmd = [MPIEXEC] + [sys.executable if a == "python" else a for a in launch[1:]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=_env())
    assert proc.returncode == 0, f"{block.name}:\n{block.text}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def _commands(block: Block) -> list[tuple[str, list[str]]]:
    """Each ``$ command`` of a console block with the output lines shown after it."""
    out: list[tuple[str, list[str]]] = []
    for line in block.text.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            out.append((line[2:], []))
        else:
            out[-1][1].append(line)
    return out


def _masked(text: str) -> str:
    return re.sub(r"\b\d+\.\d+ s\b", "N s", text)


@pytest.mark.parametrize("block", CONSOLE, ids=lambda b: b.name)
def test_console_block_prints_what_it_shows(block, tmp_path):
    for command, shown in _commands(block):
        words = shlex.split(command, comments=True)
        if os.path.basename(words[0]) != "redist":
            continue
        exits = re.search(r"#.*\bexits (\d+)", command)
        redirect = words.index(">") if ">" in words else None
        args = words[1:redirect]
        proc = subprocess.run([sys.executable, "-m", "redist", *args], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env=_env())
        assert proc.returncode == (int(exits[1]) if exits else 0), f"{block.name}: {command}\n{proc.stderr}"
        if redirect is not None:
            (tmp_path / words[redirect + 1]).write_text(proc.stdout)
        if shown:
            assert _masked(proc.stdout).rstrip("\n").split("\n") == [_masked(s) for s in shown], command


def _links(page: str) -> list[str]:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = re.sub(r"^```.*?^```$", "", f.read(), flags=re.S | re.M)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_lead_to_files(page):
    missing = []
    for target in _links(page):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target.split("#")[0]))
        if not os.path.exists(path):
            missing.append(target)
    assert not missing, f"{page} links to files that do not exist: {missing}"


def test_the_benchmarks_page_is_up_to_date():
    """docs/benchmarks.md is bench/report.py's rendering of bench/results/ (``./dev bench report`` writes it)."""
    with open(os.path.join(ROOT, "docs", "benchmarks.md"), encoding="utf-8") as f:
        assert f.read() == report.render(), "bench/results/ changed: run ./dev bench report and commit the page"
