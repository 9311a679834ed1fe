"""Every python code block of the README runs as written, each in a fresh interpreter outside the checkout
(without the test suite's JAX settings: a block that needs 8 devices must ask for them itself). Indented
blocks are shell commands or output, not python."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    README = f.read()
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README, flags=re.S | re.M)
# The partitioning example traces, partitions, runs and simulates a transformer: a minute on a busy machine.
SLOW = [i for i, b in enumerate(BLOCKS) if "partir_core" in b]


def test_the_readme_has_its_examples():
    assert len(BLOCKS) == 4 and len(SLOW) == 1
    assert README.count("```") == 2 * len(BLOCKS)  # every fenced block is a python one, found above
    assert any("redist.jax.reshard" in b and "jax.device_put" in b for b in BLOCKS)  # reshard next to device_put


@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.slow) if i in SLOW else i for i in range(len(BLOCKS))])
def test_readme_block_runs(i, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "PYTHONPATH")}
    proc = subprocess.run([sys.executable, "-c", BLOCKS[i]], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, f"README block {i}:\n{BLOCKS[i]}\n{proc.stderr[-3000:]}"
