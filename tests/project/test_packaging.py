"""Packaging: the wheel holds redist and partir_core (typed, licensed, versioned from one place) and not proofs;
``import redist`` and planning work with only the core dependencies, and each feature whose extra is missing
says which extra to install."""

import email.parser
import json
import os
import re
import subprocess
import sys
import tomllib
import venv
import zipfile

import ml_dtypes
import numpy
import pytest

import redist
from tests.project.packaging_helpers import ROOT, build_wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def _metadata(wheel) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode())


def test_the_wheel_holds_the_packages_typed_and_licensed(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"redist", "partir_core"}  # no top-level proofs (nor bench, tests)
    assert {"redist/py.typed", "partir_core/py.typed", "redist/profiles/cpu-host.json"} <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    meta = _metadata(wheel)
    assert meta["Version"] == redist.__version__ and meta["License-Expression"] == "Apache-2.0"


def test_the_version_is_written_once():
    """pyproject.toml reads redist.__version__; it holds no version of its own."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "redist.__version__"}


def test_core_dependencies_and_extras(wheel):
    requires = _metadata(wheel).get_all("Requires-Dist")
    core = sorted(_name(r) for r in requires if "extra ==" not in r)
    assert core == ["ml_dtypes", "numpy"]
    extras = set(_metadata(wheel).get_all("Provides-Extra"))
    assert extras == {"jax", "mpi", "verify", "bench", "docs", "test", "all"}
    by_extra = {e: {_name(r) for r in requires if f'extra == "{e}"' in r} for e in extras}
    assert {"jax"} <= by_extra["jax"] and by_extra["mpi"] == {"mpi4py", "mpich"}
    assert by_extra["verify"] == {"z3-solver"} and by_extra["bench"] == {"matplotlib", "tqdm"}
    assert by_extra["docs"] == {"sphinx", "myst-parser", "furo"}


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement)[0]


# Run in a venv that has only the wheel, numpy and ml_dtypes: every feature that needs an extra says which.
CORE_ONLY = r'''
import importlib, json, sys
import numpy as np
import redist

for name in ("jax", "z3", "mpi4py", "matplotlib", "tqdm"):
    try:
        importlib.import_module(name)
        sys.exit(f"{name} is importable: this is no core-only environment")
    except ModuleNotFoundError:
        pass
mesh = redist.Mesh({"x": 4, "y": 2})
src = redist.ShardingType.parse("f32[16{y}, 16, 16{x}]", mesh)
plan = redist.synthesize(src, redist.ShardingType.parse("f32[16, 16{x,y}, 16]", mesh))
value = np.arange(16**3, dtype=np.float32).reshape(16, 16, 16)
assert (redist.unshard(plan.dst, redist.execute(plan, redist.shard(src, value))) == value).all()
assert redist.Plan.from_json(plan.to_json()) == plan
out = {"version": redist.__version__, "file": redist.__file__}

def error(run):
    try:
        run()
    except ModuleNotFoundError as e:
        return str(e)
    return "no error"

out["verify"] = error(lambda: redist.verify(plan))
out["jax"] = error(lambda: importlib.import_module("redist.jax"))
out["execute"] = error(lambda: redist.execute(plan, redist.shard(src, value), backend="jax"))
out["mpi"] = error(lambda: importlib.import_module("redist.mpi"))
out["partir_core"] = error(lambda: importlib.import_module("partir_core"))
print(json.dumps(out))
'''


def _core_only_python(tmp_path, wheel) -> str:
    """A fresh venv whose site-packages holds the unpacked wheel and, linked from this environment, numpy
    and ml_dtypes (nothing else, not even pip); its python."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    for module in (numpy, ml_dtypes):
        parent = os.path.dirname(os.path.dirname(module.__file__))
        for entry in os.listdir(parent):  # the package, its .libs and its .dist-info
            if entry.split("-")[0].split(".")[0] == module.__name__:
                os.symlink(os.path.join(parent, entry), os.path.join(site, entry))
    return str(python)


def test_core_install_plans_and_names_the_missing_extras(tmp_path, wheel):
    python = _core_only_python(tmp_path, wheel)
    proc = subprocess.run([python, "-I", "-c", CORE_ONLY], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["version"] == redist.__version__ and out["file"].startswith(str(tmp_path))
    assert out["verify"] == "redist.verify needs z3, which is not installed: pip install 'redist[verify]'"
    assert out["jax"] == out["execute"] == "redist.jax needs jax, which is not installed: pip install 'redist[jax]'"
    assert out["mpi"] == "redist.mpi needs mpi4py, which is not installed: pip install 'redist[mpi]'"
    assert out["partir_core"] == "partir_core needs jax, which is not installed: pip install 'redist[jax]'"
    plan = subprocess.run([python, "-I", "-m", "redist", "plan", "f32[8{x}]", "f32[8]", "--mesh", "x=2"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert plan.returncode == 0 and "all_gather(dim 0, {x})" in plan.stdout, plan
    verify = subprocess.run([python, "-I", "-m", "redist", "verify", "f32[8{x}]", "f32[8]", "--mesh", "x=2"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert verify.returncode == 2 and verify.stdout == ""
    assert verify.stderr == ("redist: error: redist.verify needs z3, which is not installed: "
                             "pip install 'redist[verify]'\n")


def test_partir_core_without_z3_partitions_and_its_verify_names_the_extra(tmp_path):
    """With the [jax] extra and not [verify] (z3 blocked from importing), ``import partir_core`` and a partitioned
    call work; ``verify()`` raises the error that names the extra."""
    code = """
import sys
sys.modules["z3"] = None  # as if z3 were not installed
import numpy as np, redist, partir_core
pf = partir_core.jit(lambda x: x * 2, redist.Mesh({"x": 1}), [partir_core.ManualPartition({"x": 0}, axis="x")])
x = np.ones((4, 2), np.float32)
assert (np.asarray(pf(x)) == 2).all()
try:
    pf.lower(x).verify()
except ModuleNotFoundError as e:
    print(e)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "partir_core's verify() needs z3, which is not installed: pip install 'redist[verify]'\n"


def test_an_extra_that_is_present_imports_unchanged():
    """The guards change nothing when the dependency is installed (this environment has every extra)."""
    code = ("import sys, redist.jax, redist.mpi, partir_core; "
            "print(type(sys.modules['redist.verify.solver'].z3).__name__, "
            "type(sys.modules['partir_core.proof.lemmas'].z3).__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == "module module\n", proc.stderr
