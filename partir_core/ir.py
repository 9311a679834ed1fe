"""The IR: a function's jaxpr, flattened into one list of equations over numbered values.

:func:`trace` runs ``jax.make_jaxpr`` on the function with its inputs flattened, and *inlines* every call-like
primitive (``jit``/``pjit``, ``closed_call``, ``core_call``, ``remat``/``checkpoint``, ``custom_jvp_call``,
``custom_vjp_call``) by splicing in its inner jaxpr, so that partitioning sees one flat program. Control flow
(``scan``, ``while``, ``cond``) stays as a single equation whose sub-jaxprs are kept whole.

Values are integers. Each has a global shape and dtype (:attr:`Graph.avals`). A value is an *input* (one per
flattened argument leaf, named by its path), the result of an equation, or a *constant* (a jaxpr literal or
closed-over const, held in :attr:`Graph.consts`; constants are replicated and never constrain sharding).
An array of random keys keeps its key dtype (``key<fry>``) and key shape (see :mod:`partir_core.keys`).

Input paths: the function's parameter name, then the pytree keys joined by ``/``
(``"params/layers/0/w1"``, ``"x"``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from partir_core import keys

# jax.extend.core exports DropVar from JAX 0.10; JAX 0.8 and 0.9 have it only in jax.core (deprecated in 0.10)
_DROP_VAR = getattr(jcore, "DropVar", None) or jax.core.DropVar

INLINED = ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
           "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin")
CONTROL_FLOW = ("scan", "while", "cond")


@dataclass
class Eqn:
    """One primitive application: ``outvars = prim(*invars, **params)``."""

    prim: Any
    invars: list[int]
    outvars: list[int]
    params: dict

    @property
    def name(self) -> str:
        return self.prim.name


@dataclass
class Graph:
    """A flat program. ``outvars`` are values (inputs, equation results or constants)."""

    invars: list[int]
    outvars: list[int]
    eqns: list[Eqn]
    avals: dict[int, tuple[tuple[int, ...], Any]]  # (shape, numpy dtype or key dtype)
    consts: dict[int, Any] = field(default_factory=dict)
    in_paths: list[str] = field(default_factory=list)
    in_tree: Any = None
    out_tree: Any = None
    inlined: list[str] = field(default_factory=list)

    def shape(self, v: int) -> tuple[int, ...]:
        return self.avals[v][0]

    def dtype(self, v: int):
        """A numpy dtype, or a JAX key dtype for an array of random keys."""
        return self.avals[v][1]


def key_name(k) -> str:
    """One pytree key as a path component."""
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def input_paths(fn, args, kwargs=None) -> tuple[list[str], list[Any], Any]:
    """``(paths, leaves, treedef)`` of the positional ``args`` of ``fn`` and then of its keyword ``kwargs`` (in
    their order), named by its parameters (an entry of ``**name``: ``name/key``); ``treedef`` is that of
    ``(*args, *kwargs.values())``."""
    kwargs = kwargs or {}
    try:
        params = [p for p in inspect.signature(fn).parameters.values()]
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(len(args)):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY, params[i].POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        elif any(p.kind == p.VAR_POSITIONAL for p in params):
            var = next(p.name for p in params if p.kind == p.VAR_POSITIONAL)
            names.append(f"{var}/{i - sum(p.kind != p.VAR_POSITIONAL for p in params[:i])}")
        else:
            names.append(f"arg{i}")
    var_kw = next((p.name for p in params if p.kind == p.VAR_KEYWORD), None)
    named = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    names += [k if k in named or var_kw is None else f"{var_kw}/{k}" for k in kwargs]
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tuple(args) + tuple(kwargs.values()))
    paths, leaves = [], []
    for kp, leaf in with_path:
        head = names[kp[0].idx]
        paths.append("/".join([head] + [key_name(k) for k in kp[1:]]))
        leaves.append(leaf)
    return paths, leaves, treedef


class _Builder:
    """Accumulates the flat graph while jaxprs are inlined: fresh value ids, their avals, constants, equations
    and the names of the calls inlined."""

    def __init__(self):
        self.n = 0
        self.avals: dict[int, tuple] = {}
        self.consts: dict[int, Any] = {}
        self.eqns: list[Eqn] = []
        self.inlined: list[str] = []

    def new(self, aval) -> int:
        v = self.n
        self.n += 1
        dtype = aval.dtype if keys.is_key(aval.dtype) else np.dtype(aval.dtype)
        self.avals[v] = (tuple(int(d) for d in aval.shape), dtype)
        return v

    def const(self, value, aval) -> int:
        v = self.new(aval)
        self.consts[v] = value
        return v

    def read(self, env, atom) -> int:
        if isinstance(atom, jcore.Literal):
            return self.const(atom.val, atom.aval)
        return env[atom]

    def emit(self, jaxpr, consts, invals: list[int]) -> list[int]:
        """Splice ``jaxpr`` (an open jaxpr with ``consts``) reading ``invals``; returns its output values."""
        env: dict = {}
        for var, c in zip(jaxpr.constvars, consts):
            env[var] = self.const(c, var.aval)
        for var, v in zip(jaxpr.invars, invals):
            env[var] = v
        for e in jaxpr.eqns:
            ins = [self.read(env, a) for a in e.invars]
            inner = _inner_jaxpr(e)
            if inner is not None:
                sub, sub_consts, skip = inner
                self.inlined.append(e.primitive.name)
                outs = self.emit(sub, sub_consts, ins[skip:] if skip else ins)
                for var, v in zip(e.outvars, outs):
                    env[var] = v
                continue
            outs = [self.new(o.aval) for o in e.outvars]
            self.eqns.append(Eqn(e.primitive, ins, outs, dict(e.params)))
            for var, v in zip(e.outvars, outs):
                if not isinstance(var, _DROP_VAR):
                    env[var] = v
        return [self.read(env, a) for a in jaxpr.outvars]


def _inner_jaxpr(e):
    """``(jaxpr, consts, n_skipped_operands)`` of a call-like equation to inline, or None."""
    if e.primitive.name not in INLINED:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = e.params.get(key)
        if j is None:
            continue
        if isinstance(j, jcore.ClosedJaxpr):
            return j.jaxpr, j.consts, 0
        if isinstance(j, jcore.Jaxpr):
            return j, (), 0
    return None


def trace(fn, args, kwargs=None) -> Graph:
    """Trace ``fn(*args, **kwargs)`` (arrays or ``jax.ShapeDtypeStruct`` leaves) into a flat :class:`Graph`; its
    inputs are the leaves of ``(*args, *kwargs.values())``."""
    kwargs = kwargs or {}
    paths, leaves, treedef = input_paths(fn, args, kwargs)
    out_tree = []

    def flat(*xs):
        values = jax.tree_util.tree_unflatten(treedef, xs)
        out = fn(*values[:len(args)], **dict(zip(kwargs, values[len(args):])))
        outs, tree = jax.tree_util.tree_flatten(out)
        out_tree.append(tree)
        return outs

    specs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)
             for x in leaves]
    closed = jax.make_jaxpr(flat)(*specs)
    b = _Builder()
    invars = [b.new(v.aval) for v in closed.jaxpr.invars]
    outvars = b.emit(closed.jaxpr, closed.consts, invars)
    return Graph(invars, outvars, b.eqns, b.avals, b.consts, paths, treedef, out_tree[0], b.inlined)
