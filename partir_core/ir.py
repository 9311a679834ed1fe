"""The IR: a function's jaxpr, flattened into one list of equations over numbered values.

:func:`trace` runs ``jax.make_jaxpr`` on the function with its inputs flattened, and *inlines* every call-like
primitive (``jit``/``pjit``, ``closed_call``, ``core_call``, ``jax.checkpoint``'s ``remat2`` (``remat`` and
``checkpoint`` in other JAX releases), ``custom_jvp_call``, ``custom_vjp_call``) by splicing in its inner jaxpr,
so that partitioning sees one flat program. Any other primitive that JAX binds with functions made from its
jaxprs (``shard_map``) stays one equation, which :func:`binds_functions` tells apart: ``partir_core.jit``
refuses it.

Control flow (``scan``, ``while``, ``cond``) is *inlined with markers*: the choice made here. Its bodies are
spliced into the same flat list of equations, between two boundary equations of its own (:data:`ENTER`,
:data:`EXIT`), and a :class:`Region` records where they are::

    %p.. = scan_enter %outer..        # the body's parameters: loop invariants, carries, per-iteration xs
      ... the body's equations ...    # (while: cond_fun's, then body_fun's; cond: every branch's in turn)
    %out.. = scan_exit %r.. %p..      # the body's results (and, for loops, the carry parameters)

Why markers rather than sub-graphs: propagation, choice and the dim-group analysis then read every body like
straight-line code, with no case of their own. The boundary equations have factor rules like any primitive
(:mod:`partir_core.registry`): an outer operand and the body parameter it becomes share their factors (a scan's
stacked ``xs`` lose the leading dim, a stacked result gains one: that dim is *blocked*, whole inside the loop),
and at the exit a carry's body result, its parameter and the loop's result share theirs, so a carry's type is a
fixed point of propagation. Lowering and the simulator read the structure back from :attr:`Graph.regions` and
build one partitioned loop per region. A body reads only its parameters and constants (jaxprs are closed), so
a region's equations are self-contained; regions nest.

Values are integers. Each has a global shape and dtype (:attr:`Graph.avals`): a body's values have their
per-iteration shapes. A value is an *input* (one per flattened argument leaf, named by its path), the result of
an equation, or a *constant* (a jaxpr literal or closed-over const, held in :attr:`Graph.consts`; constants are
replicated and never constrain sharding). An array of random keys keeps its key dtype (``key<fry>``) and key
shape (see :mod:`partir_core.keys`).

Input paths: the function's parameter name, then the pytree keys joined by ``/`` (``"params/layers/0/w1"``,
``"x"``). A stacked weight keeps its path (``params/layers/w1``); inside a scan body its per-iteration slice is
named after it (:attr:`Graph.names`: ``params/layers/w1[i]``).
"""

from __future__ import annotations

import fnmatch
import inspect
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore
from jax.extend import source_info_util

from partir_core import keys

# jax.extend.core exports DropVar from JAX 0.10; JAX 0.8 and 0.9 have it only in jax.core (deprecated in 0.10)
_DROP_VAR = getattr(jcore, "DropVar", None) or jax.core.DropVar

INLINED = ("pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "custom_jvp_call",
           "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin")
CONTROL_FLOW = ("scan", "while", "cond")


class Boundary:
    """The pseudo-primitive of a region's enter or exit equation (``scan_enter``, ``cond_exit``, ...). It is
    never bound: lowering builds the loop or conditional itself."""

    multiple_results = True

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return self.name


ENTER = {k: Boundary(f"{k}_enter") for k in CONTROL_FLOW}
EXIT = {k: Boundary(f"{k}_exit") for k in CONTROL_FLOW}


def is_enter(eqn) -> bool:
    """Whether ``eqn`` is a region's enter equation."""
    return eqn.prim in ENTER.values()


def is_exit(eqn) -> bool:
    """Whether ``eqn`` is a region's exit equation."""
    return eqn.prim in EXIT.values()


@dataclass
class Eqn:
    """One primitive application: ``outvars = prim(*invars, **params)``.

    A region's enter and exit equations (``prim`` a :class:`Boundary`) have ``params = {"region": r, "ties":
    ...}``: an enter's ties are ``(operand, result, stacked)`` (the outer operand becomes that body parameter;
    ``stacked``: a scan's ``xs``, whose leading dim the body iterates over); an exit's are ``(result, operands,
    stacked)`` (the operands, body results and carry parameters, that become that outer result; ``stacked``: a
    scan's ``ys``, which gain a leading dim). ``sources``: the jaxpr equation's source info, then those of the
    calls inlined around it, innermost first (none for a boundary)."""

    prim: Any
    invars: list[int]
    outvars: list[int]
    params: dict
    sources: tuple = field(default=(), repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.prim.name

    @property
    def source(self) -> str | None:
        """Where the user's code applied it, ``file:line:column (function)``: its own frame, or that of the
        innermost call around it that has one (a ``jnp`` function's ops have none of their own); None where JAX
        kept no frame."""
        return next(filter(None, map(source_info_util.summarize, self.sources)), None)


@dataclass
class Region:
    """One ``scan``, ``while`` or ``cond``, inlined into :attr:`Graph.eqns` (see the module docstring).

    ``enter``/``exit``: the indices of its boundary equations. ``bodies``: the equation ranges of its bodies,
    in order (scan: ``[body]``; while: ``[cond_fun, body_fun]``; cond: one per branch), nested regions
    included. ``results``: per body, the values it returns (scan: carries then ``ys``; while: cond_fun the
    predicate, body_fun the carries; cond: the branch's results), and ``exit_slots`` the exit's operands
    they are. ``consts``/``carry``/``xs``: the enter's
    results by role (loop invariants, loop-carried values, a scan's per-iteration slices; a cond's operands
    are its ``consts``). ``index``: a cond's branch index (an outer value). ``params``: the control-flow
    equation's own (``length``, ``reverse``, ``unroll``, ...). ``trips``: iterations per execution (a scan's
    ``length``; a while loop's when its bound is static, else None; a cond: 1). ``parent``: the enclosing
    region, or None."""

    kind: str
    enter: int
    exit: int
    bodies: list
    results: list
    consts: list
    carry: list
    xs: list
    params: dict
    trips: int | None
    parent: int | None
    index: int | None = None
    exit_slots: list = field(default_factory=list)

    @property
    def trip_count(self) -> int:
        """:attr:`trips`, or 1 where it is unknown."""
        return 1 if self.trips is None else self.trips


@dataclass
class Graph:
    """A flat program. ``outvars`` are values (inputs, equation results or constants). ``regions``: the
    control flow inlined into ``eqns`` (see the module docstring); ``names``: what a value inside a body is
    called after (the input a body parameter comes from: ``params/layers/w1[i]``); ``pipelines``: the
    schedules of the layer scans traced as pipelined loops (:mod:`partir_core.pipeline`)."""

    invars: list[int]
    outvars: list[int]
    eqns: list[Eqn]
    avals: dict[int, tuple[tuple[int, ...], Any]]  # (shape, numpy dtype or key dtype)
    consts: dict[int, Any] = field(default_factory=dict)
    in_paths: list[str] = field(default_factory=list)
    in_tree: Any = None
    out_tree: Any = None
    inlined: list[str] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    pipelines: list = field(default_factory=list)  # partir_core.pipeline_schedule.Schedule of each pipelined scan
    _innermost: list | None = field(default=None, repr=False, compare=False)
    _primitives: list | None = field(default=None, repr=False, compare=False)
    _readers: tuple | None = field(default=None, repr=False, compare=False)
    _matching: dict = field(default_factory=dict, repr=False, compare=False)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def memo(self, key, make):
        """``make(self)``, made once per ``key`` and remembered: for analyses of the whole program that many
        lowerings of it read (a traced graph never changes)."""
        if key not in self._memo:
            self._memo[key] = make(self)
        return self._memo[key]

    def inputs_matching(self, pattern: str) -> list[tuple[str, int]]:
        """``(path, value)`` of every input whose path the glob ``pattern`` matches (``fnmatch.fnmatchcase``), in
        input order; remembered per pattern (a graph's inputs never change once traced, and a search applies the
        same tactics many times)."""
        hits = self._matching.get(pattern)
        if hits is None:
            hits = self._matching[pattern] = tuple((p, v) for p, v in zip(self.in_paths, self.invars)
                                                   if fnmatch.fnmatchcase(p, pattern))
        return list(hits)

    def shape(self, v: int) -> tuple[int, ...]:
        return self.avals[v][0]

    def dtype(self, v: int):
        """A numpy dtype, or a JAX key dtype for an array of random keys."""
        return self.avals[v][1]

    def region_at(self, i: int) -> int | None:
        """The innermost region whose body holds equation ``i`` (its own boundaries are outside it), or None."""
        if self._innermost is None or len(self._innermost) != len(self.eqns):
            inner: list = [None] * len(self.eqns)
            for r, reg in enumerate(self.regions):  # an inner region comes after the regions around it
                for i in range(reg.enter + 1, reg.exit):
                    inner[i] = r
            self._innermost = inner
        return self._innermost[i]

    def primitives(self) -> list[str]:
        """Every equation's primitive name, in order; remembered (a traced graph's equations never change; a
        list of another length is made again)."""
        if self._primitives is None or len(self._primitives) != len(self.eqns):
            self._primitives = [e.name for e in self.eqns]
        return self._primitives

    def readers(self) -> dict[int, tuple[int, ...]]:
        """Every value an equation reads: the equations that read it, in order; remembered (as
        :meth:`primitives`)."""
        if self._readers is None or self._readers[0] != len(self.eqns):
            found: dict = {}
            for i, eqn in enumerate(self.eqns):
                for v in eqn.invars:
                    found.setdefault(v, {})[i] = None
            self._readers = (len(self.eqns), {v: tuple(eqns) for v, eqns in found.items()})
        return self._readers[1]

    def trips(self, region: int | None) -> int:
        """How often region ``region``'s body runs per call of the program: the product of the trip counts of
        it and its enclosing regions (1 for None, the top level)."""
        n = 1
        while region is not None:
            n *= self.regions[region].trip_count
            region = self.regions[region].parent
        return n

    def read_trips(self, i: int) -> int:
        """How often equation ``i`` reads its operands per call: as often as its region runs; an exit reads
        the body's results inside the body, so as often as its own region's body."""
        eqn = self.eqns[i]
        if is_exit(eqn):
            return self.trips(eqn.params["region"])
        return self.trips(self.region_at(i))


def column(values: list):
    """A function reading ``values`` of a dict keyed by values (a state's dims, an analysis's types) as a tuple,
    in that order (``operator.itemgetter``, in C, where there are two or more)."""
    if len(values) >= 2:
        return itemgetter(*values)
    return lambda d: tuple([d[v] for v in values])


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
    """Accumulates the flat graph while jaxprs are inlined: fresh value ids, their avals, constants, equations,
    the control-flow regions and the names of the calls inlined."""

    def __init__(self):
        self.n = 0
        self.avals: dict[int, tuple] = {}
        self.consts: dict[int, Any] = {}
        self.eqns: list[Eqn] = []
        self.inlined: list[str] = []
        self.regions: list[Region] = []
        self.open: list[int] = []  # the regions being emitted, outermost first
        self.names: dict[int, str] = {}

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

    def emit(self, jaxpr, consts, invals: list[int], callers: tuple = ()) -> list[int]:
        """Splice ``jaxpr`` (an open jaxpr with ``consts``) reading ``invals``; returns its output values.
        ``callers``: the source info of the calls inlined around it, innermost first."""
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
                outs = self.emit(sub, sub_consts, ins[skip:] if skip else ins, (e.source_info, *callers))
            elif e.primitive.name in CONTROL_FLOW:
                outs = self.control_flow(e, ins)
            else:
                outs = [self.new(o.aval) for o in e.outvars]
                self.eqns.append(Eqn(e.primitive, ins, outs, dict(e.params), (e.source_info, *callers)))
            for var, v in zip(e.outvars, outs):
                if not isinstance(var, _DROP_VAR):
                    env[var] = v
        return [self.read(env, a) for a in jaxpr.outvars]

    def control_flow(self, e, ins: list[int]) -> list[int]:
        """Inline a ``scan``, ``while`` or ``cond`` equation reading ``ins`` as a :class:`Region`; returns the
        values of its results."""
        kind, p = e.primitive.name, e.params
        r = len(self.regions)
        reg = Region(kind, len(self.eqns), -1, [], [], [], [], [], dict(p), 1, self.open[-1] if self.open else None)
        self.regions.append(reg)
        self.eqns.append(None)  # the enter equation, once its parameters are known
        self.open.append(r)
        if kind == "scan":
            body, nc, nk = p["jaxpr"], p["num_consts"], p["num_carry"]
            params = [self.new(v.aval) for v in body.jaxpr.invars]
            reg.consts, reg.carry, reg.xs = params[:nc], params[nc:nc + nk], params[nc + nk:]
            enter_ties = [(i, i, i >= nc + nk) for i in range(len(ins))]
            reg.results = [self.body(reg, body, params)]
            rs = reg.results[0]
            exit_ins = rs + reg.carry
            exit_ties = [(i, (i, len(rs) + i), False) for i in range(nk)]
            exit_ties += [(i, (i,), True) for i in range(nk, len(rs))]
            reg.exit_slots = [list(range(len(rs)))]
            reg.trips = int(p["length"])
        elif kind == "while":
            cj, bj, cn, bn = p["cond_jaxpr"], p["body_jaxpr"], p["cond_nconsts"], p["body_nconsts"]
            cc = [self.new(v.aval) for v in cj.jaxpr.invars[:cn]]
            bc = [self.new(v.aval) for v in bj.jaxpr.invars[:bn]]
            reg.carry = [self.new(v.aval) for v in bj.jaxpr.invars[bn:]]
            reg.consts = cc + bc
            params = cc + bc + reg.carry
            enter_ties = [(i, i, False) for i in range(len(ins))]
            reg.results = [self.body(reg, cj, cc + reg.carry), self.body(reg, bj, bc + reg.carry)]
            (pred,), rs = reg.results
            exit_ins = rs + [pred] + reg.carry
            exit_ties = [(i, (i, len(rs) + 1 + i), False) for i in range(len(rs))]
            reg.exit_slots = [[len(rs)], list(range(len(rs)))]
            reg.trips = _static_trips(self, reg, ins)
        else:  # cond: operands (index, *ops); every branch reads the same parameters
            branches = p["branches"]
            reg.index = ins[0]
            params = reg.consts = [self.new(v.aval) for v in branches[0].jaxpr.invars]
            enter_ties = [(1 + i, i, False) for i in range(len(params))]
            reg.results = [self.body(reg, b, params) for b in branches]
            n = len(e.outvars)
            exit_ins = [v for rs in reg.results for v in rs]
            exit_ties = [(j, tuple(b * n + j for b in range(len(branches))), False) for j in range(n)]
            reg.exit_slots = [list(range(b * n, (b + 1) * n)) for b in range(len(branches))]
        for i, o, stacked in enter_ties:
            if ins[i] in self.names:  # a body parameter is named after the input it comes from
                self.names[params[o]] = self.names[ins[i]] + ("[i]" if stacked else "")
        self.eqns[reg.enter] = Eqn(ENTER[kind], ins, params, {"region": r, "ties": tuple(enter_ties)})
        self.open.pop()
        outs = [self.new(o.aval) for o in e.outvars]
        reg.exit = len(self.eqns)
        self.eqns.append(Eqn(EXIT[kind], exit_ins, outs, {"region": r, "ties": tuple(exit_ties)}))
        return outs

    def body(self, reg: Region, closed, params: list[int]) -> list[int]:
        """Emit one body (a closed jaxpr) of ``reg`` reading ``params``; records its range, returns its results."""
        start = len(self.eqns)
        outs = self.emit(closed.jaxpr, closed.consts, params)
        reg.bodies.append(range(start, len(self.eqns)))
        return outs


def _static_trips(b: _Builder, reg: Region, ins: list[int]) -> int | None:
    """The trip count of a while loop counting a carry up by 1 to a constant bound (``fori_loop`` with traced
    bounds, ``while i < n``), when its start and bound are constants; else None."""
    (pred,) = reg.results[0]
    test = next((e for e in b.eqns[reg.bodies[0].start:reg.bodies[0].stop] if pred in e.outvars), None)
    if test is None or test.name != "lt" or test.invars[0] not in reg.carry:
        return None
    k = reg.carry.index(test.invars[0])
    outer = dict(zip(reg.consts + reg.carry, ins))  # body parameter -> the outer value it starts as
    bound = outer.get(test.invars[1], test.invars[1])
    start = outer[reg.carry[k]]
    step = next((e for e in b.eqns[reg.bodies[1].start:reg.bodies[1].stop] if reg.results[1][k] in e.outvars), None)
    if (bound not in b.consts or start not in b.consts or step is None or step.name != "add"
            or step.invars[0] != reg.carry[k] or step.invars[1] not in b.consts):
        return None
    if int(np.asarray(b.consts[step.invars[1]])) != 1:
        return None
    return max(int(np.asarray(b.consts[bound])) - int(np.asarray(b.consts[start])), 0)


def binds_functions(eqn: Eqn) -> bool:
    """Whether ``eqn`` is a higher-order primitive that JAX binds with functions made from its jaxpr parameters
    (``shard_map``, ``xla_pmap``, a call primitive of another library) and that :func:`trace` did not inline:
    partir_core can neither partition inside it nor run it as one opaque equation. (Primitives that take
    their jaxprs as plain parameters, ``custom_linear_solve`` say, run as one replicated equation.)"""
    own = getattr(type(eqn.prim), "get_bind_params", None)
    return own is not None and own is not jcore.Primitive.get_bind_params


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
    b.names.update(zip(invars, paths))
    outvars = b.emit(closed.jaxpr, closed.consts, invars)
    names = {v: n for v, n in b.names.items() if v not in invars}
    return Graph(invars, outvars, b.eqns, b.avals, b.consts, paths, treedef, out_tree[0], b.inlined, b.regions, names)
