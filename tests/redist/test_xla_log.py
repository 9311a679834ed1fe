"""redist keeps XLA's "involuntary full rematerialization" warning, which its own compile of XLA's resharding
logs while choosing the route, off standard error, and nothing else: the capture of file descriptor 2
(:mod:`redist.xla_log`) in-process, and the README's JAX example and a flax parameter tree in a fresh
interpreter, whose standard error stays empty."""

import os
import re
import subprocess
import sys
import threading

import pytest

from redist import xla_log
from tests import ROOT

WARNING = (b"W1206 08:36:15.424428   27471 spmd_partitioner.cc:656] [SPMD] Involuntary full rematerialization. "
           b"The compiler cannot go from sharding {devices=[2,1,4]} to {devices=[1,8,1]} efficiently\n")


def test_the_warning_is_dropped_and_every_other_line_passes(capfd):
    with xla_log.without_rematerialization_warning():
        os.write(2, b"before\n" + WARNING + b"after\n")
        print("from python", file=sys.stderr)
    err = capfd.readouterr().err
    assert "before\nafter\n" in err and "from python\n" in err and "rematerialization" not in err


def test_standard_error_is_restored_when_the_block_raises(capfd):
    before = os.fstat(2)
    with pytest.raises(ValueError):
        with xla_log.without_rematerialization_warning():
            os.write(2, b"kept\n" + WARNING)
            raise ValueError("raised in the block")
    assert (os.fstat(2).st_ino, os.fstat(2).st_dev) == (before.st_ino, before.st_dev)
    os.write(2, b"later\n")
    assert capfd.readouterr().err == "kept\nlater\n"


def test_blocks_of_several_threads_share_one_capture(capfd):
    before = os.fstat(2)
    inside, release = threading.Barrier(2), threading.Event()

    def block(name: bytes):
        with xla_log.without_rematerialization_warning():
            inside.wait()  # both blocks are open
            os.write(2, name + b"\n" + WARNING)
            if name == b"first":
                release.set()
            else:
                release.wait()

    threads = [threading.Thread(target=block, args=(n,)) for n in (b"first", b"second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(capfd.readouterr().err.split()) == ["first", "second"]
    assert os.fstat(2).st_ino == before.st_ino


def _fresh_interpreter(code: str, tmp_path) -> subprocess.CompletedProcess:
    """``code`` run as a script in a fresh interpreter, outside the checkout, without the suite's JAX
    settings (the code asks for its 8 devices itself)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=env)


def test_the_readme_s_jax_example_prints_nothing_on_stderr(tmp_path):
    pytest.importorskip("jax")
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"^```python\n(.*?)^```$", f.read(), flags=re.S | re.M)
    example, = [b for b in blocks if "redist.jax.reshard" in b]
    proc = _fresh_interpreter(example, tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


FLAX_TREE = """
import jax
jax.config.update("jax_num_cpu_devices", 8)
import flax.linen as nn
import numpy as np
import redist.jax
from jax.sharding import NamedSharding, PartitionSpec as P

class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i in range(3):
            x = nn.Dense(64, name=f"dense{i}")(x)
        return nn.Embed(128, 64, name="embed")(x.astype(int))

mesh = jax.make_mesh((4, 2), ("x", "y"))
params = Model().init(jax.random.key(0), np.ones((8, 64), np.float32))["params"]
fsdp = jax.tree.map(lambda a: NamedSharding(mesh, P(("x", "y")) if a.ndim == 2 else P("x")), params)
megatron = jax.tree.map(lambda a: NamedSharding(mesh, P(None, "y") if a.ndim == 2 else P()), params)
x = jax.device_put(params, fsdp)
for _ in range(2):
    y = redist.jax.reshard(x, megatron)      # XLA's resharding would gather every kernel
assert all((np.asarray(a) == np.asarray(b)).all() for a, b in zip(jax.tree.leaves(y), jax.tree.leaves(params)))
from redist import jax_programs
k = params["dense0"]["kernel"]
assert jax_programs.move(k.shape, k.dtype, fsdp["dense0"]["kernel"], megatron["dense0"]["kernel"]).route == "redist"
"""


def test_a_flax_parameter_tree_reshard_prints_nothing_on_stderr(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("flax")
    proc = _fresh_interpreter(FLAX_TREE, tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
