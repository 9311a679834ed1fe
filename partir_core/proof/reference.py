"""A reference function against the partitioned program's own: structural alignment, and a numeric witness.

:func:`align` traces nothing; it compares two flat graphs (:mod:`partir_core.ir`) equation by equation, in
order: the same primitive with the same parameters, reading the values the equations aligned before produce
(inputs by position, constants by value), results of the same shapes and dtypes, and the same outputs. Two
graphs that align compute the same function, so the proof of the program against its own graph is a proof
against the reference. The first equation that does not align is where the two part ways; alignment is
syntactic, so graphs that part ways may still compute the same function (``a * 2`` and ``a + a``).

:func:`witness` decides that case numerically: it runs the partitioned program (or, when JAX has too few
devices, the function it was proved to compute) and the reference on the same random inputs and returns the
first output that differs, or None. Only such a witness makes a refutation.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from partir_core import keys

RTOL, ATOL = 1e-3, 1e-4  # a differing output differs by more than float32 rounding of these models' depth


@dataclass(frozen=True)
class Parting:
    """Where a reference parts ways with the program's graph: the reference's equation ``eqn`` (None: at the
    inputs or the outputs) and ``why``."""

    eqn: int | None
    why: str


def align(graph, ref) -> Parting | None:
    """None where ``ref`` aligns with ``graph`` equation by equation (see the module docstring), else the
    first :class:`Parting`."""
    if [graph.avals[v] for v in graph.invars] != [ref.avals[v] for v in ref.invars]:
        return Parting(None, "the reference takes inputs of other shapes or dtypes")
    same = dict(zip(ref.invars, graph.invars))
    for i, a in enumerate(ref.eqns):
        if i >= len(graph.eqns):
            return Parting(i, "the program has no equation there")
        why = _differs(a, graph.eqns[i], same, ref, graph)
        if why:
            return Parting(i, why)
        same.update(zip(a.outvars, graph.eqns[i].outvars))
    if len(graph.eqns) > len(ref.eqns):
        return Parting(None, f"the program goes on with {graph.eqns[len(ref.eqns)].name} after the reference's last "
                             "equation")
    for j, (r, v) in enumerate(zip(ref.outvars, graph.outvars)):
        if not _same_value(r, v, same, ref, graph):
            return Parting(None, f"output {j} is another value")
    if len(ref.outvars) != len(graph.outvars):
        return Parting(None, f"the reference returns {len(ref.outvars)} outputs, the program {len(graph.outvars)}")
    return None


def _differs(a, b, same, ref, graph) -> str | None:
    if a.name != b.name:
        return f"the reference applies {a.name} where the program applies {b.name}"
    if not _same_params(a.params, b.params):
        changed = sorted(k for k in set(a.params) | set(b.params) if not _same_params(
            {k: a.params.get(k)}, {k: b.params.get(k)}))
        return f"{a.name} with other {', '.join(map(str, changed))}"
    if len(a.invars) != len(b.invars):
        return f"{a.name} of {len(a.invars)} operands, not {len(b.invars)}"
    for k, (x, y) in enumerate(zip(a.invars, b.invars)):
        if not _same_value(x, y, same, ref, graph):
            return f"operand {k} of {a.name} is another value"
    if [ref.avals[v] for v in a.outvars] != [graph.avals[v] for v in b.outvars]:
        return f"{a.name} gives results of other shapes or dtypes"
    return None


def _same_params(p, q) -> bool:
    try:
        if p == q:
            return True
    except Exception:  # noqa: BLE001 - parameters that do not compare (arrays): compared as text
        pass
    return sorted(p) == sorted(q) and all(str(p[k]) == str(q[k]) for k in p)


def _same_value(x, y, same, ref, graph) -> bool:
    if x in ref.consts or y in graph.consts:
        if x not in ref.consts or y not in graph.consts or ref.avals[x] != graph.avals[y]:
            return False
        cx, cy = ref.consts[x], graph.consts[y]
        if keys.is_key(ref.dtype(x)):
            cx, cy = keys.to_data(cx), keys.to_data(cy)
        return np.array_equal(np.asarray(cx), np.asarray(cy), equal_nan=True)
    return same.get(x) == y


def random_inputs(graph, seed: int = 0) -> list:
    """One random array per input of ``graph``: normal floats, integers in ``[0, 3)`` (valid indices of any dim
    of 3 or more), random booleans, keys from the seed."""
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.invars:
        shape, dtype = graph.avals[v]
        if keys.is_key(dtype):
            out.append(jax.random.split(jax.random.key(seed), shape) if shape else jax.random.key(seed))
        elif np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
            out.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == np.bool_:
            out.append(rng.integers(0, 2, shape).astype(bool))
        else:
            out.append(rng.integers(0, 3, shape).astype(dtype))
    return out


def witness(run_program, run_reference, leaves) -> dict | None:
    """The first output where ``run_program(leaves)`` and ``run_reference(leaves)`` (each a list of outputs)
    differ beyond rounding: ``{"output": j, "index": ..., "program": ..., "reference": ...}``; None where they
    agree (or return different numbers of outputs: then ``{"output": None, ...}``)."""
    got, want = run_program(leaves), run_reference(leaves)
    if len(got) != len(want):
        return {"output": None, "index": None, "program": f"{len(got)} outputs", "reference": f"{len(want)} outputs"}
    for j, (a, b) in enumerate(zip(got, want)):
        a, b = np.asarray(keys.to_data(a)), np.asarray(keys.to_data(b))
        if a.shape != b.shape:
            return {"output": j, "index": None, "program": f"shape {a.shape}", "reference": f"shape {b.shape}"}
        bad = ~np.isclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)
        if bad.any():
            at = tuple(int(x) for x in np.argwhere(bad)[0])
            return {"output": j, "index": at, "program": a[at].item(), "reference": b[at].item()}
    return None
