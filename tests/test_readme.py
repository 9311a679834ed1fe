"""The README's python examples run as written (each in a fresh interpreter with 8 JAX devices, as a reader
would run it) and their own asserts hold."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks() -> list[str]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.DOTALL | re.MULTILINE)


def test_the_readme_has_the_reshard_example():
    assert any("redist.jax.reshard" in b and "jax.device_put" in b for b in blocks())


@pytest.mark.parametrize("code", blocks(), ids=lambda code: code.splitlines()[0][:40])
def test_a_readme_example_runs(code):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip())
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
