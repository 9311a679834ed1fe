"""A static permutation of one dim, as a JAX primitive whose partitioned form moves whole rows between devices.

``permute(x, perm, dim)`` is ``jnp.take(x, perm, axis=dim)`` for a permutation ``perm`` known when tracing: row
``i`` of the result is row ``perm[i]`` of ``x``. The pipeline (:mod:`partir_core.pipeline`) uses it to rotate its
state by one stage every iteration and, for the circular schedule, to put the stacked layers in circular order.
A gather would need the permuted dim whole on every device; this primitive keeps it split. Its factor rule
(:mod:`partir_core.registry`) gives every dim of the result the factor of the same dim of the operand, so the
result is laid out as the operand is, and its local form (:func:`local`) runs inside the partitioned program:

- the dim whole: a local ``take``;
- the dim split over mesh axes into ``n`` blocks of ``b`` rows (the last padded where ``b·n`` exceeds the dim):
  device ``d`` needs the rows ``perm[d·b : (d+1)·b]``; those held ``δ`` devices further along the axes (modulo
  ``n``) come in one ``lax.ppermute`` that shifts by ``δ``, the others from its own block. A rotation by one
  stage with one stage per device is one collective permute of the whole local buffer.

The rows each ``lax.ppermute`` carries are padded to the most any device needs from that offset; :func:`receives`
gives the rows per offset, what the program reports and the simulator prices (``permute`` collectives).

Autodiff: the primitive is linear and its transpose is the inverse permutation. Under ``vmap`` the permuted dim
moves past the batch dim.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

permute_p = Primitive("permute_dim")


def permute(x, perm, dim: int = 0):
    """Rows of dim ``dim`` of ``x`` in the order ``perm`` (a permutation of ``range(x.shape[dim])``)."""
    dim = dim % np.ndim(x)
    perm = tuple(int(p) for p in perm)
    if sorted(perm) != list(range(np.shape(x)[dim])):
        raise ValueError(f"permute: {perm} is not a permutation of the {np.shape(x)[dim]} rows of dim {dim}")
    return permute_p.bind(x, perm=perm, dim=dim)


def inverse(perm: tuple) -> tuple:
    """The permutation that undoes ``perm``."""
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


def rotation(n: int, shift: int) -> tuple:
    """The permutation that moves row ``i`` to row ``i + shift`` (modulo ``n``)."""
    return tuple((i - shift) % n for i in range(n))


def _take(x, *, perm, dim):
    return jnp.take(x, np.asarray(perm, np.int32), axis=dim)


def _batched(args, dims, *, perm, dim):
    (x,), (bd,) = args, dims  # a rule of one operand is only called with it batched
    return permute_p.bind(x, perm=perm, dim=dim + (bd <= dim)), bd


permute_p.def_impl(_take)
permute_p.def_abstract_eval(lambda x, **_: x)
ad.deflinear2(permute_p, lambda ct, x, *, perm, dim: [permute_p.bind(ct, perm=inverse(perm), dim=dim)])
batching.primitive_batchers[permute_p] = _batched
mlir.register_lowering(permute_p, mlir.lower_fun(_take, multiple_results=False))


@functools.lru_cache(maxsize=256)
def exchange(perm: tuple, n: int) -> tuple:
    """How the rows of a dim split into ``n`` blocks move under ``perm``: ``(sends, gather)``. ``sends``: per
    device offset ``δ`` that some device receives rows from, ``(δ, rows)`` with ``rows[e]`` the local rows
    device ``e`` sends to device ``e - δ`` (padded with row 0 to the same count for every device); ``gather[d]``:
    for each local row of device ``d``'s result, its index in device ``d``'s own block followed by what it
    received, offset by offset (padding rows read row 0)."""
    rows = len(perm)
    b = -(-rows // n)
    needs = {}  # (device, offset) -> [(position, source row)]
    for d in range(n):
        for p in range(b):
            i = d * b + p
            if i < rows:
                j = perm[i]
                needs.setdefault((d, (j // b - d) % n), []).append((p, j % b))
    gather = np.zeros((n, b), np.int32)
    for (d, delta), got in needs.items():
        if delta == 0:
            for p, q in got:
                gather[d, p] = q
    sends, start = [], b
    for delta in range(1, n):
        count = max((len(needs.get((d, delta), ())) for d in range(n)), default=0)
        if not count:
            continue
        send = np.zeros((n, count), np.int32)
        for d in range(n):
            for k, (p, q) in enumerate(needs.get((d, delta), ())):
                send[(d + delta) % n, k] = q
                gather[d, p] = start + k
        sends.append((delta, send))
        start += count
    return tuple(sends), gather


def local(ctx, x):
    """The permutation on device-local rows (see the module docstring); ``ctx`` is a
    :class:`partir_core.registry.LocalContext`."""
    perm, dim = ctx.eqn.params["perm"], ctx.eqn.params["dim"]
    axes = tuple(ctx.in_dims[0][dim])
    if not axes:
        return [_take(x, perm=perm, dim=dim)]
    sends, gather = exchange(perm, ctx.mesh.group_size(axes))
    d = ctx.axis_index(axes)
    names = ctx.axis_names(axes)
    pieces = [x]
    for delta, send in sends:
        n = len(send)
        chunk = jnp.take(x, jnp.asarray(send)[d], axis=dim)
        pieces.append(lax.ppermute(chunk, names, [(e, (e - delta) % n) for e in range(n)]))
    return [jnp.take(jnp.concatenate(pieces, axis=dim), jnp.asarray(gather)[d], axis=dim)]


def receives(perm: tuple, dim: int, t) -> list[tuple[str, tuple, float]]:
    """``(kind, axes, bytes)`` of each collective :func:`local` runs on an operand of sharding type ``t``: one
    ``permute`` over the dim's axes per device offset, each device receiving its padded rows of it."""
    axes = tuple(t.dims[dim])
    if not axes:
        return []
    sends, _ = exchange(perm, t.mesh.group_size(axes))
    row = t.local_bytes / t.local_shape[dim]
    return [("permute", axes, float(send.shape[1] * row)) for _, send in sends]
