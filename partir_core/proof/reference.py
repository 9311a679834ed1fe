"""A reference function against the partitioned program's own: structural alignment, and a numeric witness.

:func:`align` traces nothing; it compares two flat graphs (:mod:`partir_core.ir`) equation by equation, in
order: the same primitive with the same parameters, reading the values the equations aligned before produce
(inputs by position, constants by value), results of the same shapes and dtypes, and the same outputs. Two
graphs that align compute the same function, so the proof of the program against its own graph is a proof
against the reference. The first equation that does not align is where the two part ways; alignment is
syntactic, so graphs that part ways may still compute the same function (``a * 2`` and ``a + a``).

:func:`witness` decides that case numerically, and the case of a program whose proof stopped at a check that
does not hold: it runs the partitioned program (or, when JAX has too few devices, the function it was proved
to compute) and the reference on the same random inputs (:func:`witness_inputs`) and returns the first output
that differs, or None. Only such a witness makes a refutation.
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


def random_inputs(graph, seed: int = 0, wide: dict | None = None) -> list:
    """One random array per input of ``graph``: normal floats, integers in ``[0, 3)`` (valid indices of any dim
    of 3 or more; an input ``v`` of ``wide`` in ``[lo, hi)``, ``wide[v] = (lo, hi)``), random booleans, keys
    from the seed."""
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
            lo, hi = (wide or {}).get(v, (0, 3))
            info = np.iinfo(dtype)
            out.append(rng.integers(max(lo, info.min), min(hi, info.max), shape).astype(dtype))
    return out


WIDE_SEEDS = 4  # draws of wide indices a witness tries after the narrow one
# The operands of each indexing primitive that hold indices: positions from, to (None: to the last).
INDEX_OPERANDS = {"gather": (1, 2), "scatter": (1, 2), "scatter-add": (1, 2), "scatter-mul": (1, 2),
                  "scatter-min": (1, 2), "scatter-max": (1, 2), "dynamic_slice": (1, None),
                  "dynamic_update_slice": (2, None)}


def witness_inputs(graph):
    """The inputs a witness is sought on, lazily: :func:`random_inputs`; then, where no op of ``graph`` promises
    its indices in bounds (past the bounds its result is undefined), :data:`WIDE_SEEDS` draws in which each input
    that only indexes (:func:`index_inputs`) ranges over every dim of the graph and past both ends (``[-d-2,
    d+2)``, ``d`` its largest dim): they reach the blocks' edges and the indices that gathers fill and scatters
    drop or clamp. Inputs that feed arithmetic (a step count in a power) stay small, so that no extreme value
    turns rounding into a difference."""
    yield random_inputs(graph)
    if any(str(e.params.get("mode", "")).endswith("PROMISE_IN_BOUNDS") for e in graph.eqns):
        return
    indexing = index_inputs(graph)
    if not indexing:
        return
    d = max((n for shape, _ in graph.avals.values() for n in shape), default=1)
    for seed in range(1, WIDE_SEEDS + 1):
        yield random_inputs(graph, seed, dict.fromkeys(indexing, (-d - 2, d + 2)))


def index_inputs(graph) -> list[int]:
    """The integer inputs of ``graph`` that only index: each op that reads one, or what is computed from it,
    reads it as indices (:data:`INDEX_OPERANDS`) or computes integers or booleans from it."""
    def exact(v):
        dtype = graph.dtype(v)
        return not keys.is_key(dtype) and (np.issubdtype(dtype, np.integer) or dtype == np.bool_)

    out = []
    for v in graph.invars:
        if not exact(v) or graph.dtype(v) == np.bool_:
            continue
        tainted = {v}
        for e in graph.eqns:
            reads = [k for k, x in enumerate(e.invars) if x in tainted]
            first, end = INDEX_OPERANDS.get(e.name, (len(e.invars), None))
            if not reads or all(first <= k < (end or len(e.invars)) for k in reads):
                continue
            if not all(map(exact, e.outvars)):
                break
            tainted.update(e.outvars)
        else:
            out.append(v)
    return out


def witness(run_program, run_reference, inputs) -> dict | None:
    """The first output where ``run_program(leaves)`` and ``run_reference(leaves)`` (each a list of outputs)
    differ beyond rounding, on the first ``leaves`` of ``inputs`` where any does: ``{"output": j, "index": ...,
    "program": ..., "reference": ..., "inputs": k}`` (``k``: which of ``inputs``); None where they agree on
    every one.

    Beyond rounding: a float output differs where the program is further from the reference's exact value
    (the reference run again in float64, its float inputs widened) than :data:`NOISE_FACTOR` times the
    reference's own largest rounding error in that output (its float32 run against its float64 one), plus
    ``RTOL`` and ``ATOL``; an output of integers or booleans differs where the program's is another, unless
    rounding changes the reference's own (a float32 and a float64 run that disagree there: an argmax of near
    ties). A program that fails with a ``TypeError`` or ``ValueError`` (a :class:`~redist.errors.ShardingError`
    among them) where the reference runs differs too: on inputs of its own types, that is a program whose
    buffers' shapes or ops' types do not fit, which runs on no input. So do outputs of other numbers or shapes.
    Where the reference cannot run in float64, nothing beyond the first comparison is known: no witness."""
    for k, leaves in enumerate(inputs):
        want = run_reference(leaves)
        try:
            got = run_program(leaves)
        except (TypeError, ValueError) as e:  # ill-formed: its buffers' shapes or its ops' types do not fit
            return {"output": None, "index": None, "program": f"fails, {type(e).__name__}: {e}",
                    "reference": "runs", "inputs": k}
        if _differing(got, want) is None:
            continue  # they agree within RTOL and ATOL: the rest is no better
        try:
            with jax.enable_x64(True):
                exact = run_reference([_widened(x) for x in leaves])
        except Exception:  # noqa: BLE001 - a reference that only runs in float32 gives no measure of rounding
            return None
        found = _differing(got, want, exact)
        if found is not None:
            return {**found, "inputs": k}
    return None


NOISE_FACTOR = 100  # how many times the reference's own rounding error a program's may reach


def _widened(x):
    """A float input in float64 (a complex one in complex128); any other as it is."""
    dtype = np.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype
    if keys.is_key(dtype) or not jax.dtypes.issubdtype(dtype, np.inexact):
        return x
    return np.asarray(x).astype(np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64)


def _differing(got: list, want: list, exact: list | None = None) -> dict | None:
    """The first element where ``got`` differs from ``want``: within ``RTOL``/``ATOL`` where ``exact`` is None,
    else as :func:`witness` says."""
    if len(got) != len(want):
        return {"output": None, "index": None, "program": f"gives {len(got)} outputs",
                "reference": f"gives {len(want)} outputs"}
    for j, (a, b) in enumerate(zip(got, want)):
        a, b = _values(a), _values(b)
        if a.shape != b.shape:
            return {"output": j, "index": None, "program": f"shape {a.shape}", "reference": f"shape {b.shape}"}
        bad = ~np.isclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)
        if exact is not None and bad.any():
            bad &= _beyond_rounding(a, b, _values(exact[j]))
        if bad.any():
            at = tuple(int(x) for x in np.argwhere(bad)[0])
            return {"output": j, "index": at, "program": a[at].item(), "reference": b[at].item()}
    return None


def _values(x) -> np.ndarray:
    """An output as numpy compares it: a key array's data; floats narrower than float32 in float32."""
    x = np.asarray(keys.to_data(x))
    if jax.dtypes.issubdtype(x.dtype, np.floating) and x.dtype.itemsize < 4:
        return x.astype(np.float32)
    return x


def _beyond_rounding(got: np.ndarray, want: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Where ``got`` differs from the reference beyond rounding (see :func:`witness`), elementwise."""
    if exact.shape != want.shape:
        return np.zeros(got.shape, bool)
    if not np.issubdtype(want.dtype, np.inexact):
        return np.broadcast_to(np.array_equal(want, exact), got.shape) & (got != want)
    exact = exact.astype(np.complex128 if np.iscomplexobj(exact) else np.float64)
    with np.errstate(invalid="ignore"):
        noise = np.abs(want - exact)
        own = float(noise.max(initial=0.0)) if np.isfinite(noise).all() else np.inf
        err = np.abs(got - exact)
        return ~(err <= NOISE_FACTOR * own + ATOL + RTOL * np.abs(exact)) & ~(np.isnan(got) & np.isnan(exact))
