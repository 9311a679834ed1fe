"""``redist.show(x)``: print the picture of a layout or a plan, whatever holds it.

``x`` is a :class:`redist.ShardingType` (:meth:`~redist.ShardingType.show`: which block each device holds), a
:class:`redist.Plan` (:meth:`~redist.Plan.show`: the plan step by step), or a ``jax.Array`` laid out by a
``NamedSharding``, whose type :func:`redist.jax.sharding_type` reads (JAX is imported only for such an array,
so that ``import redist`` needs no JAX).
"""

from __future__ import annotations

import sys

from redist.errors import ShardingError, shown
from redist.picture import MAX_BLOCKS
from redist.plan import Plan
from redist.types import ShardingType


def show(x, limit: int = MAX_BLOCKS) -> None:
    """Print the picture of ``x`` (module docstring), at most ``limit`` blocks per layout. Raises
    :class:`ShardingError` for anything else, or for a JAX array that lies on no ``NamedSharding``."""
    if isinstance(x, (ShardingType, Plan)):
        print(x.show(limit=limit))
        return
    if "jax" in sys.modules and isinstance(x, sys.modules["jax"].Array):  # no JAX array exists before JAX
        print(_jax_type(x).show(limit=limit))
        return
    raise ShardingError(f"redist.show takes a ShardingType, a Plan or a jax.Array with a NamedSharding, got "
                        f"{type(x).__name__} {shown(x)}")


def _jax_type(x) -> ShardingType:
    """The sharding type of JAX array ``x``."""
    from jax.sharding import NamedSharding

    from redist.jax import sharding_type  # JAX is loaded already: x is one of its arrays

    if not isinstance(x.sharding, NamedSharding):
        raise ShardingError(f"redist.show reads a JAX array's layout from a NamedSharding; this array has "
                            f"{type(x.sharding).__name__} {shown(x.sharding)}: jax.device_put it on a NamedSharding")
    return sharding_type(x.shape, x.dtype, x.sharding)
