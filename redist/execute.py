"""Run a plan's lowered program on per-device buffers, with the backend of the caller's choice."""

from __future__ import annotations

import numpy as np

from redist.backends import numpy_backend
from redist.buffers import describe
from redist.errors import ShardingError
from redist.plan import Plan

BACKENDS = ("numpy", "jax")


def execute(plan: Plan, shards, backend: str = "numpy") -> list[np.ndarray]:
    """Execute ``plan`` on ``shards`` (one local buffer per device id, of type ``plan.src``).

    ``backend``: ``"numpy"`` (the reference, in this process) or ``"jax"`` (JAX collectives on JAX devices,
    device ``d`` the one whose ``id`` is ``d``, in the plan's dtype whatever JAX's x64 mode; the plan's program is
    compiled on its first call and kept, so that later calls of the plan only dispatch, until
    :func:`redist.jax.clear_cache`; see :func:`redist.jax.run_on_buffers`; a plan across meshes runs its stages
    on the devices of each mesh, the transfer as copies from device to device:
    :mod:`redist.backends.jax_stages`). MPI runs one process per device: use :func:`redist.mpi.reshard` on
    every rank. Returns new arrays (never the caller's), the buffers of type ``plan.dst``. For a partial
    source, any summands whose group sums are the value give the value's destination layout (summed where
    the destination is not partial).

    ``shards`` is a list or tuple indexed by device id, as :func:`redist.shard` makes it: ``plan.src.mesh.id_bound``
    entries (``mesh.size`` where the device ids are ``0 … size−1``), an array of ``plan.src.local_shape`` at
    each device of the source's mesh and ``None`` at every other number. The result is such a list for
    ``plan.dst``'s mesh, whatever devices the two meshes share. No value is converted
    with loss (:mod:`redist.buffers`): each shard has the plan's dtype, or one whose every value the plan's
    dtype holds (``i8`` for ``i32``, ``f32`` for ``f64``), or is Python numbers that it holds exactly;
    ``f64``, ``i64`` or complex shards for an ``f32`` plan raise. Raises :class:`ShardingError` for a
    ``plan`` that is no :class:`Plan`, an unknown ``backend``, or shards that do not fit (naming the device).
    """
    if not isinstance(plan, Plan):
        raise ShardingError(f"execute needs a redist.Plan (from redist.synthesize(src, dst)), got {describe(plan)}")
    if backend == "numpy":
        return numpy_backend.run_stages(plan.stages, shards)
    if backend == "jax":
        from redist.backends.jax_backend import run_on_buffers  # the [jax] extra: imported when asked for
        from redist.backends.jax_stages import execute_stages

        stages = plan.stages
        return run_on_buffers(stages[0], shards) if len(stages) == 1 else execute_stages(stages, shards)
    raise ShardingError(f"unknown backend {backend!r}; execute() runs {', '.join(BACKENDS)} "
                        "(MPI runs one process per device: call redist.mpi.reshard on every rank)")
