"""redist: memory-efficient array redistribution by type-directed synthesis of collectives.

    mesh = redist.Mesh({"x": 2, "y": 4})
    src = redist.ShardingType.parse("f32[1024{x}, 512{y}]", mesh)
    dst = redist.ShardingType.parse("f32[1024{y}, 512{x}]", mesh)
    plan = redist.synthesize(src, dst)           # typed steps; plan.peak_bytes <= max of the two
    out = redist.execute(plan, redist.shard(src, array))
"""

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic)

from redist.bounds import lower_bound_bytes
from redist.data import shard, unshard
from redist.errors import ShardingError
from redist.execute import execute
from redist.mesh import Mesh
from redist.plan import Plan
from redist.synthesis import synthesize
from redist.types import ShardingType
from redist.verify import Verdict, verify

__all__ = [
    "Mesh", "ShardingType", "ShardingError", "Plan", "synthesize", "lower_bound_bytes",
    "shard", "unshard", "execute", "verify", "Verdict",
]
