"""Calibration profiles: package data read on first use, never at import; loaded, replaced and shipped in the wheel."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

import redist
from redist import cost
from tests.project.packaging_helpers import build_wheel
from tests import ROOT

MESH = redist.Mesh({"batch": 2, "model": 4})
# The calibration that bench/results/cpu_host_profile.json and cpu_host_compute.json held before profiles
# became package data: the shipped profile must hold the same numbers.
SHIPPED_LINK = cost.Link(0.0002882061478304306, 1777088788.7927825)
SHIPPED_COMPUTE = {"peak_flops": 21837059679.71949, "hbm_bw": 7689837584.806091,
                   "op_overhead_s": 1.4524749985866946e-06, "launch_s": 0.00025461852678745347}


def _profile_dict(alpha=1e-4, beta=3e9):
    return {"name": "mine", "link": {"alpha": alpha, "beta": beta, "per_kind": {"ppermute": {"alpha": 2e-4, "beta": 1e9}}},
            "compute": {"peak_flops": 1e10, "hbm_bw": 1e9, "op_overhead_s": 1e-6, "launch_s": 1e-4,
                        "combine_ratio": 0.5, "collective_alpha": {"all_reduce": [1e-5, 2e-5], "permute": [3e-5, 0]}}}


@pytest.fixture
def restore_profile():
    yield
    cost.use_profile(None)


def test_shipped_profile_holds_the_calibrated_numbers():
    p = cost.profile()
    assert p.link == SHIPPED_LINK and dict(p.compute) == SHIPPED_COMPUTE
    assert p.source.endswith(os.path.join("redist", "profiles", "cpu-host.json"))
    assert cost.topology("cpu-host", MESH).links == (("batch", SHIPPED_LINK), ("model", SHIPPED_LINK))
    assert cost.cpu_host_link() == SHIPPED_LINK


def test_load_profile_from_a_file_or_a_dict(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_profile_dict()))
    p = cost.load_profile(str(f))
    assert p == cost.load_profile(f) and p.name == "mine" and p.link == cost.Link(1e-4, 3e9)
    assert cost.load_profile(_profile_dict()).link == p.link and cost.load_profile(p) is p
    assert cost.cpu_host_link(str(f)) == cost.Link(1e-4, 3e9)
    # JAX's collective names become redist's kinds; an in-program kind takes its kind's (else the) bandwidth
    assert dict(p.kind_links) == {"permute": cost.Link(2e-4, 1e9)}
    assert dict(p.in_program) == {"all_reduce": cost.Link(1e-5, 3e9, 2e-5), "permute": cost.Link(3e-5, 1e9, 0.0)}


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("compute"), "needs a 'compute' object"),
    (lambda d: d["link"].pop("beta"), r"link.beta must be a number, got None"),
    (lambda d: d["link"].update(alpha="fast"), r"link.alpha must be a number, got 'fast'"),
    (lambda d: d["link"].update(beta=-1.0), r"link: link bandwidth beta=-1.0"),
    (lambda d: d["compute"].update(launch_s=True), r"compute.launch_s must be a number, got True"),
    (lambda d: d["compute"]["collective_alpha"].update(all_gather=[1e-5]), r"compute.collective_alpha.all_gather must be"),
])
def test_bad_profiles_name_the_field(change, message):
    data = _profile_dict()
    change(data)
    with pytest.raises(redist.ShardingError, match=f"calibration profile given as a dict: {message}"):
        cost.load_profile(data)


def test_unreadable_profile_files_raise(tmp_path):
    with pytest.raises(redist.ShardingError, match="cannot read the calibration profile .*missing.json"):
        cost.load_profile(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(redist.ShardingError, match="cannot read the calibration profile .*bad.json"):
        cost.use_profile(str(bad))
    assert cost.profile().link == SHIPPED_LINK  # the profile in use is kept
    with pytest.raises(redist.ShardingError, match="a path to a JSON file, a dict or a redist.cost.Profile"):
        cost.load_profile(42)


def test_use_profile_replaces_the_cpu_host_figures(restore_profile):
    from partir_core.simulator import HARDWARE

    before = HARDWARE["cpu-host"]
    assert cost.use_profile(_profile_dict(alpha=5e-5)).link.alpha == 5e-5
    assert cost.topology("cpu-host", MESH).link("model") == cost.Link(5e-5, 3e9)
    hw = HARDWARE["cpu-host"]
    assert (hw.peak_flops, hw.launch_s) == (1e10, 1e-4) and hw.peak_flops != before.peak_flops
    assert hw.topology(MESH).combine_ratio == 0.5
    assert cost.use_profile(None).link == SHIPPED_LINK
    after = HARDWARE["cpu-host"]
    assert (after.peak_flops, after.launch_s, after.topology(MESH)) == (before.peak_flops, before.launch_s,
                                                                       before.topology(MESH))


def test_collective_time_refinements():
    """Kind links, latency per peer and combined operands, as the module docstring's formula says."""
    base, kind = cost.Link(1e-3, 1e9), cost.Link(1e-5, 2e9, 2e-6)
    topo = cost.Topology("t", (("batch", base), ("model", base)), (("all_reduce", kind),), combine_ratio=0.5)
    assert cost.collective_time(("model",), 1e6, topo) == 1e-3 + 1e6 / 1e9  # by axes only
    assert cost.collective_time(("model",), 1e6, topo, kind="all_gather", group=4) == 1e-3 + 1e6 / 1e9
    t = cost.collective_time(("model",), 1e6, topo, kind="all_reduce", group=4, operands=3)
    assert t == pytest.approx((1e-5 + 3 * 2e-6) * (1 + 0.5 * 2) + 1e6 / 2e9)
    assert cost.collective_time(("model",), 1e6, topo, kind="all_reduce_max", group=4, operands=3) == t
    assert cost.collective_time(("model",), 0, topo, kind="all_reduce", group=4) == 0.0
    with pytest.raises(redist.ShardingError, match="alpha_per_peer"):
        cost.Link(1e-6, 1e9, -1.0)


def _python(code, cwd, env=None):
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_importing_reads_no_data_file(tmp_path):
    """Configuration is read on first use: importing redist and partir_core opens no JSON (or other data
    file of the checkout); the first simulation reads the shipped profile."""
    code = """if True:
        import os, sys
        opened = []
        def hook(event, args):
            if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
                path = os.fsdecode(args[0])
                if not path.endswith((".py", ".pyc", ".so")) and not os.path.isdir(path):
                    opened.append(path)
        sys.addaudithook(hook)
        import redist, redist.cost, redist.jax, partir_core, partir_core.simulator, partir_core.automatic
        ours = tuple(os.path.join(ROOT, d) for d in ("redist", "partir_core", "bench"))
        mine = [p for p in opened if p.endswith(".json") or os.path.abspath(p).startswith(ours)]
        print("import", mine)
        opened.clear()
        redist.cost.topology("cpu-host", redist.Mesh({"x": 2}))
        print("use", [p for p in opened if p.endswith(".json")])
    """
    out = _python(code.replace("ROOT", repr(str(ROOT))), tmp_path).splitlines()
    assert out[0] == "import []"
    assert out[1].startswith("use [") and "cpu-host.json" in out[1]


@pytest.mark.slow  # builds the wheel and simulates a transformer twice
def test_the_wheel_ships_the_profile_and_simulates_as_the_checkout(tmp_path):
    """An installed package (the wheel, unpacked as pip installs it) reads its own copy of the profile through
    importlib.resources, and simulates a reference model exactly as the checkout does."""
    with zipfile.ZipFile(build_wheel(tmp_path)) as z:
        assert "redist/profiles/cpu-host.json" in z.namelist()
        z.extractall(tmp_path / "site")
    code = """if True:
        import jax, redist, partir_core as pc
        from redist import cost
        from partir_core import models, schedules
        mesh = redist.Mesh({"batch": 2, "model": 4})
        m = models.transformer()
        ins = m.init(jax.random.key(0))
        low = pc.jit(m.step, mesh, schedules.schedule("BP+MP", m, ins, mesh=mesh)).lower(*ins)
        print(redist.__file__)
        print(cost.profile().source)
        print(repr(cost.topology("cpu-host", mesh).link("model").alpha), repr(low.simulate().step_time_s))
    """
    here = _python(code, tmp_path).splitlines()
    installed = _python(code, tmp_path, {"PYTHONPATH": str(tmp_path / "site")}).splitlines()
    site = str(tmp_path / "site")
    assert installed[0].startswith(site) and installed[1].startswith(site)
    assert here[0].startswith(str(ROOT)) and here[1].startswith(str(ROOT))
    assert installed[2] == here[2] and here[2].split()[0] == repr(SHIPPED_LINK.alpha)


def test_calibration_benchmarks_write_a_section_of_a_profile(tmp_path, restore_profile):
    """What bench/calibrate_cpu_host.py and bench/partitioning.py --calibrate write: one section of a profile
    (a new file starts from the package's), checked before it is written, then put in use."""
    from bench.calibration import PACKAGE_PROFILE, write_section

    assert os.path.samefile(PACKAGE_PROFILE, cost.profile().source)
    out = tmp_path / "host.json"
    write_section(str(out), "link", {"alpha": 1e-4, "beta": 2e9})
    assert cost.profile().link == cost.Link(1e-4, 2e9) and dict(cost.profile().compute) == SHIPPED_COMPUTE
    with pytest.raises(redist.ShardingError, match="compute.combine_ratio must be a number"):
        write_section(str(out), "compute", {"peak_flops": 1e9})
    assert cost.load_profile(str(out)).link == cost.Link(1e-4, 2e9)  # the file is as it was


@pytest.mark.parametrize("kw, message", [
    ({"kind_links": (("all_gather", 1.0),)}, "kind_links must be \\(collective kind, redist.cost.Link\\) pairs"),
    ({"kind_links": 3}, "kind_links must be"),
    ({"combine_ratio": -0.5}, "combine_ratio=-0.5 must be a finite number >= 0"),
    ({"combine_ratio": "half"}, "combine_ratio='half' must be"),
])
def test_bad_topology_refinements_raise(kw, message):
    with pytest.raises(redist.ShardingError, match=message):
        cost.Topology("t", (("x", cost.Link(1e-6, 1e9)),), **kw)
