"""Run a plan's lowered program on per-device buffers, with the backend of the caller's choice."""

from __future__ import annotations

import numpy as np

from redist.errors import ShardingError
from redist.plan import Plan

BACKENDS = ("numpy",)


def execute(plan: Plan, shards, backend: str = "numpy") -> list[np.ndarray]:
    """Execute ``plan`` on ``shards`` (one local buffer per device id, of type ``plan.src``).

    Returns the buffers of type ``plan.dst``. For a partial source, any summands whose group sums are the
    value give the value's destination layout (summed where the destination is not partial).
    """
    if backend == "numpy":
        from redist.backends import numpy_backend

        return numpy_backend.run(plan.program, shards)
    raise ShardingError(f"unknown backend {backend!r}; execute() runs {', '.join(BACKENDS)} "
                        "(use redist.jax.reshard or redist.mpi.reshard for the runtimes)")
