"""partir_core: PartIR-style partitioning of JAX programs with schedules of tactics.

    mesh = redist.Mesh({"batch": 2, "model": 4})
    pf = partir_core.jit(train_step, mesh, [
        partir_core.ManualPartition({"x": 0}, axis="batch"),
        partir_core.ManualPartition({"params/w1": 1, "params/w2": 0}, axis="model"),
    ])
    out = pf(params, x)                  # runs on mesh.size JAX devices, equals train_step(params, x)
    lowered = pf.lower(params, x)        # types, shardings, collectives, .after(k), .explain(), .simulate()

The mesh may be a JAX mesh (``jax.make_mesh((2, 4), ("batch", "model"))``): the program then runs on its devices.

Modules, in dependency order: ``keys`` (random keys as key data), ``ir`` (trace and inline), ``permutation`` (a
static permutation of one dim, moved by ``lax.ppermute``), ``registry`` (factor rules and their local forms),
``factors`` (the factor algebra: dims ↔ factor axes), ``propagation`` (to a fixed point), ``reshard`` (the one
bridge to redist: plans, their bytes, running them), ``choice`` (per-op sharding choice), ``program`` (the local
program and its run under one ``shard_map``), ``lowering`` (choice → program), ``pipeline_schedule`` (pipeline
ticks, bubble, picture), ``simulator`` (redist's cost model for collectives), ``tactics``, ``analysis`` (dim
groups), ``pipeline`` (the ``Pipeline`` tactic: a layer scan traced as a pipelined loop), ``automatic`` (the
search: ``actions``, ``evaluation``, ``ranking``, ``tree``, ``goals``, ``local``, ``result``, ``pipelines``),
``arguments`` (binding a call), ``explain`` (conflicts in words), ``partition`` (``jit``), ``models``,
``presets`` (the experts' strategies, found in any step by analysis of its program), ``schedules`` (the presets
by short names).
"""

from redist.extras import missing_extra

try:
    import jax  # noqa: F401 - partir_core partitions JAX programs: without JAX, say what to install
except ModuleNotFoundError as e:
    raise missing_extra(e, "partir_core", "jax") from e

from partir_core.partition import Partitioned, PartitionedFunction, input_paths, jit
from partir_core.pipeline import Pipeline
from partir_core.simulator import HARDWARE, Hardware, Simulation
from partir_core.tactics import AutomaticPartition, ManualPartition, PartitionError

__all__ = ["jit", "input_paths", "ManualPartition", "AutomaticPartition", "Pipeline", "PartitionError",
           "Partitioned", "PartitionedFunction", "Hardware", "HARDWARE", "Simulation"]
