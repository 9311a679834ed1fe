"""redist: memory-efficient array redistribution by type-directed synthesis of collectives.

    mesh = redist.Mesh({"x": 2, "y": 4})
    src = redist.ShardingType.parse("f32[1024{x}, 512{y}]", mesh)
    dst = redist.ShardingType.parse("f32[1024{y}, 512{x}]", mesh)
    plan = redist.synthesize(src, dst)           # typed steps; plan.peak_bytes <= max of the two
    out = redist.execute(plan, redist.shard(src, array))

Layers, from the bottom up; a module imports only from its own layer and those below it (the table is ``LAYERS`` in
tests/project/test_layers.py, which checks every import): the vocabulary (errors, extras, axes, mesh, types,
blocks, buffers, data, picture); steps, bounds, the lowered program and the lowering of steps to it; plans, plan
files and their pictures (plan_picture, plot); the cost model; synthesis and the verifier; the runtimes (execute,
backends, hlo, xla_log, jax_programs, jax, mpi); this namespace and show; the tools (cli, demo, testing,
xla_baseline). The verifier imports nothing of steps, blocks or synthesis: it checks a plan's lowered program
against the types' semantics, not against the rules that made the plan. partir_core reaches redist through the
vocabulary and this namespace, and beyond them through partir_core.reshard (steps, bounds, redist.jax),
partir_core.simulator (cost) and partir_core.proof (verify) only; redist never imports partir_core. """

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic)

from redist.bounds import lower_bound_bytes
from redist.data import shard, unshard
from redist.errors import ShardingError
from redist.execute import execute
from redist.mesh import Mesh
from redist.plan import Plan
from redist.show import show
from redist.synthesis import synthesize
from redist.types import ShardingType
from redist.verify import Verdict, verify

__all__ = [
    "Mesh", "ShardingType", "ShardingError", "Plan", "synthesize", "lower_bound_bytes",
    "shard", "unshard", "execute", "verify", "Verdict", "show",
]
