"""Local ops that move elements among devices, proved by running them on element ids.

The static permutation of :mod:`partir_core.permutation` (a pipeline's stage rotation, the circular order of its
layers) runs on each device as a few ``lax.ppermute``\\ s and local ``take``\\ s. Its local form is a *selection*:
each element of a device's result is one element of some device's operand, or a constant, chosen by index
computations that never read the operand's values. Which element it is, is then the same for every operand,
so one run on every device, on an operand whose elements are the ids of their global positions, shows the
whole selection. :func:`check` proves that what the device runs is such a selection and that it selects, on
every device, the block of the result that its type assigns:

1. Selection: in the jaxpr the device runs, the operand (and every value computed from it) is read only by
   the primitives of :data:`MOVES`, at the operand positions they move, never as an index, a predicate or a
   shape; a gather only in a mode defined for every index, without claims about its indices.
2. Run: the jaxpr is interpreted on every device of the mesh in lockstep: ``axis_index`` gives the device's
   coordinate, ``ppermute`` moves values between the devices of one group as JAX defines it (a device no pair
   sends to gets zeros), every other primitive runs on each device (vmapped over them). Each operand element
   gets the id of its global index (pending operands: of its summand's too; padding: ids no data element
   has), written as digits of a base that the dtype holds exactly, one run per digit, each digit sent twice
   (as ``d + 1`` and ``d + 1 + B``): a constant cannot equal both, so an element that shows the expected digit
   in both runs is selected from an operand element with that digit, and with every digit, from that very
   element.
3. Compare: every data element of every device's result (its type's data box) holds the id of the operand
   element it must be, ``source(global index)``: the device holds its block of the result.

The check is exhaustive over devices and elements of one concrete op (no symbolic sizes), so it is cached by
the caller per what the device runs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

MOVES = {  # primitive -> operand positions that may hold the moved values (None: all)
    "gather": (0,), "dynamic_slice": (0,), "dynamic_update_slice": (0, 1), "concatenate": None, "ppermute": None,
    "slice": (0,), "reshape": (0,), "broadcast_in_dim": (0,), "squeeze": (0,), "transpose": (0,),
    "expand_dims": (0,), "rev": (0,), "copy": (0,), "copy_p": (0,), "pad": (0,), "select_n": "cases",
}
CALLS = frozenset({"jit", "pjit", "closed_call", "core_call"})
COLLECTIVES = frozenset({"psum", "psum2", "pmax", "pmin", "pbroadcast", "pvary", "all_gather", "all_to_all",
                         "psum_scatter", "reduce_scatter", "pgather"})
SAFE_GATHER_MODES = (lax.GatherScatterMode.CLIP, lax.GatherScatterMode.FILL_OR_DROP)


class NotAMove(Exception):
    """What the device runs is not a selection of the right elements (the message says where)."""


def check(closed, mesh, in_type, out_type, source) -> None:
    """Prove that ``closed`` (the jaxpr a device runs on its block of an operand of type ``in_type``, traced with
    the mesh axes as JAX axis names) gives every device of ``mesh`` its block of the result of type
    ``out_type``, whose element at global index ``g`` is the operand's at ``source(g)`` (``source`` maps an
    array of global indices, one per row, to theirs; see the module docstring); :class:`NotAMove` says why
    not."""
    if tuple(in_type.partial) != tuple(out_type.partial) or in_type.reduction != out_type.reduction:
        raise NotAMove(f"the result is pending over {out_type.partial}, the operand over {in_type.partial}")
    if len(closed.jaxpr.invars) != 1:
        raise NotAMove(f"it reads {len(closed.jaxpr.invars)} operands, not one")
    avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in closed.out_avals]
    if avals != [(tuple(out_type.local_shape), np.dtype(out_type.np_dtype))]:
        raise NotAMove(f"it gives {avals}, not one local block of {out_type}")
    _selection(closed.jaxpr, [True])
    base = _base(np.dtype(in_type.np_dtype))
    devices = list(mesh.devices)
    ids, total = _operand_ids(mesh, in_type, devices)
    want = _expected(mesh, out_type, devices, source, np.prod(in_type.shape, dtype=np.int64))
    run = jax.jit(functools.partial(_lockstep, closed, mesh, devices))
    for digit in range(max(1, math.ceil(math.log(max(total, 2), base)))):
        for shift in (1, 1 + base):
            outs = np.asarray(run(((ids // base ** digit) % base + shift).astype(in_type.np_dtype)))
            for dev, out, (box, w) in zip(devices, outs, want):
                expect = ((w // base ** digit) % base + shift).astype(out.dtype)
                if not np.array_equal(out[box], expect):
                    at = tuple(int(x) for x in np.argwhere(out[box] != expect)[0])
                    raise NotAMove(f"device {dev} does not hold its block of the result: at local index {at} it "
                                   f"holds another element of the operand, or a constant")


def _lockstep(closed, mesh, devices, ids):
    """The result on every device (a leading dim of one entry per device) of ``closed`` on ``ids`` (the same)."""
    (out, per), = _run(closed.jaxpr, closed.consts, [(ids, True)], mesh, devices)
    return out if per else jnp.broadcast_to(out, (len(devices),) + jnp.shape(out))


def _base(dtype: np.dtype) -> int:
    """The digit base ``B``: every integer up to ``2B`` is exact in ``dtype``."""
    if jnp.issubdtype(dtype, jnp.floating):
        exact = 2 ** (jnp.finfo(dtype).nmant + 1)
    elif jnp.issubdtype(dtype, jnp.integer):
        exact = int(jnp.iinfo(dtype).max)
    else:
        raise NotAMove(f"elements of {dtype} cannot carry ids")
    if exact < 4:
        raise NotAMove(f"elements of {dtype} cannot carry ids")
    return min(exact // 2, 1 << 30)


def _operand_ids(mesh, t, devices):
    """Every device's local block of element ids (int64, stacked in the order of ``devices``), and how many
    ids there are: data element ``g`` of the summand of pending group ``p`` has id ``p·size + flat(g)``;
    padding elements ids above all of those."""
    size = int(np.prod(t.shape, dtype=np.int64))
    groups = mesh.group_size(tuple(t.partial)) if t.partial else 1
    local = int(np.prod(t.local_shape, dtype=np.int64))
    out = []
    for k, dev in enumerate(devices):
        block = groups * size + k * local + np.arange(local, dtype=np.int64).reshape(t.local_shape)
        box, data = t.local_box(dev), t.data_box(dev)
        if all(s.stop > s.start for s in box):
            flat = np.ravel_multi_index(np.indices([s.stop - s.start for s in box]) +
                                        np.array([s.start for s in box]).reshape((-1,) + (1,) * len(box)), t.shape)
            block[data] = _group(mesh, t, dev) * size + flat
        out.append(block)
    return np.stack(out), groups * size + len(devices) * local


def _group(mesh, t, dev) -> int:
    return mesh.group_index(dev, tuple(t.partial)) if t.partial else 0


def _expected(mesh, t, devices, source, size):
    """Per device, ``(its data box in the local result, the ids it must hold there)``."""
    out = []
    for dev in devices:
        box, data = t.local_box(dev), t.data_box(dev)
        idx = np.indices([s.stop - s.start for s in box]).reshape(len(box), -1).T + [s.start for s in box]
        flat = np.ravel_multi_index(source(idx).T, t.shape) if len(idx) else np.zeros(0, np.int64)
        ids = _group(mesh, t, dev) * size + flat.reshape([s.stop - s.start for s in box])
        out.append((data, ids))
    return out


def _selection(jaxpr, tainted_in: list) -> list:
    """Check step 1 of the module docstring on ``jaxpr`` whose invars ``tainted_in`` carry the operand's
    values; the taint of its outvars."""
    tainted = {v for v, t in zip(jaxpr.invars, tainted_in) if t}
    for e in jaxpr.eqns:
        hot = [not _literal(v) and v in tainted for v in e.invars]
        name = e.primitive.name
        if name in CALLS:
            outs = _selection(_inner(e).jaxpr, hot)
            tainted.update(v for v, t in zip(e.outvars, outs) if t)
            continue
        if not any(hot):
            continue
        allowed = MOVES.get(name, ())
        if allowed == "cases":
            allowed = range(1, len(hot))
        elif allowed is None:
            allowed = range(len(hot))
        if any(h and k not in allowed for k, h in enumerate(hot)):
            raise NotAMove(f"{name} computes with the operand's values (reads them as other than data it moves)")
        if name == "gather" and (e.params["mode"] not in SAFE_GATHER_MODES or e.params["indices_are_sorted"]
                                 or e.params["unique_indices"]):
            raise NotAMove("a gather whose out-of-range or ordering behaviour is not defined for every index")
        tainted.update(e.outvars)
    return [not _literal(v) and v in tainted for v in jaxpr.outvars]


def _literal(v) -> bool:
    return hasattr(v, "val")


def _inner(e):
    return e.params.get("jaxpr") or e.params["call_jaxpr"]


def _run(jaxpr, consts, args, mesh, devices) -> list:
    """``jaxpr``'s outvars on ``args``, every device in lockstep (see the module docstring): each value is
    ``(array, per_device)``, per device a leading dim of one entry per device of ``devices``, else the same on
    every device. Traced into one program by :func:`check`."""
    env = {}

    def read(v):
        return (v.val, False) if _literal(v) else env[v]

    env.update({v: (c, False) for v, c in zip(jaxpr.constvars, consts)})
    env.update(zip(jaxpr.invars, args))
    for e in jaxpr.eqns:
        ins = [read(v) for v in e.invars]
        name = e.primitive.name
        if name in CALLS:
            inner = _inner(e)
            outs = _run(inner.jaxpr, inner.consts, ins, mesh, devices)
        elif name == "axis_index":
            names = _names(e.params["axis_name"])
            outs = [(jnp.asarray([mesh.group_index(d, names) for d in devices], jnp.int32), True)]
        elif name == "ppermute":
            outs = [_ppermute(x, e.params, mesh, devices) for x in ins]
        elif name in COLLECTIVES or "axis_name" in e.params:
            raise NotAMove(f"a collective {name} the check does not model")
        elif not any(per for _, per in ins):
            out = e.primitive.bind(*[x for x, _ in ins], **e.params)
            outs = [(o, False) for o in (out if e.primitive.multiple_results else [out])]
        else:
            def apply(*xs, e=e):
                out = e.primitive.bind(*xs, **e.params)
                return list(out) if e.primitive.multiple_results else [out]

            out = jax.vmap(apply, in_axes=[0 if per else None for _, per in ins])(*[x for x, _ in ins])
            outs = [(o, True) for o in out]
        env.update(zip(e.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def _names(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _ppermute(x, params, mesh, devices):
    """``lax.ppermute`` of ``x`` (``(array, per_device)``): within each group over the axis names, the device
    of rank ``dst`` receives the value of rank ``src`` for each pair; a device no pair sends to gets zeros."""
    value, per = x
    n = len(devices)
    if not per:
        value = jnp.broadcast_to(value, (n,) + jnp.shape(value))
    pos = {d: k for k, d in enumerate(devices)}
    src, got = np.arange(n), np.zeros(n, bool)
    for group in mesh.groups(_names(params["axis_name"])):
        for s, d in params["perm"]:
            src[pos[group[d]]], got[pos[group[d]]] = pos[group[s]], True
    mask = got.reshape((n,) + (1,) * (value.ndim - 1))
    return jnp.where(mask, value[src], jnp.zeros_like(value)), True
