"""Set-up shared by the partir_core tests: they need JAX (the ``[jax]`` extra; without it they are not collected)
and the 8 host devices that ``tests/conftest.py`` asks XLA for (without them each test is skipped, saying so)."""

import pytest

try:
    import jax
except ImportError:
    collect_ignore_glob = ["test_*.py"]
else:
    @pytest.fixture(autouse=True)
    def eight_devices():
        if len(jax.devices()) < 8:
            pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS before JAX is imported)")
