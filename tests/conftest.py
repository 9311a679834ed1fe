"""Test configuration: 8 host devices for JAX, set before JAX is first imported; one compilation cache for the
run; Hypothesis profiles; the tests that launch ``mpiexec`` kept to one pytest-xdist worker."""

import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI runs the same examples every time (a red CI must mean a change broke something); runs elsewhere
# explore new examples, which is how edge cases are found.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_configure(config):
    """One JAX compilation cache for the whole run, in a directory of its own that the run removes at its end:
    the pytest-xdist workers, the ranks ``mpiexec`` launches and the documentation examples' interpreters
    inherit it, so a program that several tests compile (a model's unpartitioned step, a preset's partitioned
    one) is compiled once per run. Nothing is kept from one run to the next, and a cache the caller set up is
    left as it is. Set here, in the process that starts the workers, before any test imports JAX. (JAX writes an
    entry in place: a process reading one while it is written gets a warning and compiles the program itself.)"""
    if hasattr(config, "workerinput") or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    config._run_cache = tempfile.mkdtemp(prefix="jax-cache-")
    os.environ.update(RUN_CACHE, JAX_COMPILATION_CACHE_DIR=config._run_cache)


# every program, not only those that take long to compile or give a large executable
RUN_CACHE = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}


def pytest_unconfigure(config):
    cache = getattr(config, "_run_cache", None)
    if cache:
        for name in (*RUN_CACHE, "JAX_COMPILATION_CACHE_DIR"):
            os.environ.pop(name, None)
        shutil.rmtree(cache, ignore_errors=True)


def pytest_collection_modifyitems(items):
    """Tests marked ``mpi`` launch several ranks each, which busy-wait: under ``pytest -n`` (pytest-xdist with
    ``--dist loadgroup``) they all run on one worker, one at a time, beside the other workers' tests."""
    for item in items:
        if item.get_closest_marker("mpi"):
            item.add_marker(pytest.mark.xdist_group("mpiexec"))
