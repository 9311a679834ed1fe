"""Test configuration: 8 host devices for JAX, set before JAX is first imported."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

# CI runs the same examples every time (a red CI must mean a change broke something); runs elsewhere
# explore new examples, which is how edge cases are found.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
