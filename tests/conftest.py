"""Test configuration: 8 host devices for JAX, set before JAX is first imported; Hypothesis profiles; the tests
that launch ``mpiexec`` kept to one pytest-xdist worker."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI runs the same examples every time (a red CI must mean a change broke something); runs elsewhere
# explore new examples, which is how edge cases are found.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_collection_modifyitems(items):
    """Tests marked ``mpi`` launch several ranks each, which busy-wait: under ``pytest -n`` (pytest-xdist with
    ``--dist loadgroup``) they all run on one worker, one at a time, beside the other workers' tests."""
    for item in items:
        if item.get_closest_marker("mpi"):
            item.add_marker(pytest.mark.xdist_group("mpiexec"))
