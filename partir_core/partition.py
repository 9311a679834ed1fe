"""The entry point: ``partir_core.jit(fn, mesh, schedule)`` and the partitioned program it lowers to.

``pf = partir_core.jit(fn, mesh, schedule)`` has ``fn``'s signature: ``pf(*args, **kwargs)`` binds its
arguments as ``fn`` would (a missing or extra argument is a :class:`~partir_core.PartitionError` naming it),
traces ``fn`` on the arguments' shapes, applies the tactics in order (each followed by propagation to a fixed
point), lowers to one ``jax.shard_map`` program over the ``mesh.size`` first JAX devices, runs it and returns
what ``fn`` returns. ``pf`` can itself be traced by ``jax.jit``. Lowerings are cached per argument structure and shapes.

``pf.lower(*args, **kwargs)`` returns the :class:`Partitioned` program: input/output sharding types (pytrees of
``redist.ShardingType``), collectives, text after each tactic, conflicts, unsupported primitives,
``simulate()``, and ``automatic`` (what an ``AutomaticPartition`` found, as pasteable manual tactics).
"""

from __future__ import annotations

import functools
import inspect

import jax
import numpy as np

import redist
from redist.errors import shown
from redist.mesh import Mesh

from partir_core import ir, keys
from partir_core.automatic import search
from partir_core.choice import analyze
from partir_core.lowering import lower
from partir_core.program import LocalProgram
from partir_core.propagation import State, propagate
from partir_core.registry import rule_for
from partir_core.simulator import simulate as _simulate
from partir_core.summary import summary
from partir_core.tactics import AutomaticPartition, PartitionError, check_schedule


class Partitioned:
    """A partitioned program (see the module docstring)."""

    def __init__(self, graph, rules, mesh, schedule, states, program: LocalProgram, automatic=()):
        self.graph = graph
        self.rules = rules
        self.mesh = mesh
        self.schedule = list(schedule)
        self.states = states  # states[k]: after k tactics
        self.program = program
        self.automatic_results = list(automatic)

    @property
    def automatic(self):
        """The result of the (last) ``AutomaticPartition`` in the schedule, or None: its ``tactics`` (manual
        tactics to paste in its place), ``code``, ``text`` (the program after it), ``action_space`` sizes,
        ``groups`` and search ``stats`` (see :class:`partir_core.automatic.AutoResult`)."""
        return self.automatic_results[-1] if self.automatic_results else None

    # ---------------------------------------------------------------- types
    @property
    def in_types(self):
        return jax.tree_util.tree_unflatten(self.graph.in_tree, self.program.in_types)

    @property
    def out_types(self):
        return jax.tree_util.tree_unflatten(self.graph.out_tree, self.program.out_types)

    def input_type(self, path: str) -> redist.ShardingType:
        """The type of the input named ``path``."""
        if path not in self.graph.in_paths:
            shown_paths = ", ".join(self.graph.in_paths[:12]) + (", …" if len(self.graph.in_paths) > 12 else "")
            raise PartitionError(f"no input is named {shown(path)}; inputs are {shown_paths}")
        return self.program.in_types[self.graph.in_paths.index(path)]

    @property
    def types(self) -> dict:
        """Every value's type as its producer gives it (partial where a pending sum)."""
        return self.program.analysis.types

    # ---------------------------------------------------------------- reports
    @property
    def collectives(self):
        """``Collective(kind, axes, bytes, where)`` for every collective, in program order."""
        return self.program.collectives

    @property
    def conflicts(self):
        return list(self.states[-1].conflicts)

    @property
    def unsupported(self):
        """``(eqn index, primitive, why)`` for every op run replicated for lack of a rule."""
        return list(self.program.analysis.unsupported)

    @property
    def carry_reshards(self):
        """Loop carries moved back to their carry's layout at the end of every iteration (where propagation
        left a carry's body result in another layout than its parameter): :class:`partir_core.program.CarryReshard`."""
        return list(self.program.carry_reshards)

    @property
    def fallbacks(self):
        """Reshards that used gather-and-slice instead of a redist plan: ``(where, src, dst, why)``."""
        return list(self.program.fallbacks)

    def after(self, k: int) -> str:
        """The IR text after the first ``k`` tactics (``after(0)``: unpartitioned)."""
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(self.states):
            raise PartitionError(f"after({shown(k)}): k must be an int from 0 to {len(self.states) - 1}, the number "
                                 "of tactics in the schedule")
        return render(self.graph, self.rules, self.states[k], self.mesh)

    def __str__(self):
        return self.after(len(self.states) - 1)

    def summary(self) -> str:
        """The mesh and the collectives, then each input's and output's path, sharding type and bytes per device
        (see :mod:`partir_core.summary`)."""
        return summary(self)

    def simulate(self, hardware=None):
        """Per-device step time, peak memory, communication and FLOPs (see :mod:`partir_core.simulator`)."""
        return _simulate(self.program, hardware)

    def run(self, *args):
        """Run on ``args``: the arguments as lowered, positional ones first, then the values of the keyword ones."""
        leaves = jax.tree_util.tree_leaves(tuple(args))
        outs = self.program.run(*leaves)
        return jax.tree_util.tree_unflatten(self.graph.out_tree, list(outs))


def render(graph, rules, state, mesh) -> str:
    a = analyze(graph, rules, state, mesh)

    def name(v):
        if v in graph.consts:
            c = graph.consts[v]
            c = np.asarray(keys.to_data(c) if keys.is_key(graph.dtype(v)) else c)  # a key shows its key data
            return repr(c.item()) if c.size == 1 else f"const{v}"
        return f"%{v}"

    def depth(i):
        r, n = graph.region_at(i), 0
        while r is not None:
            r, n = graph.regions[r].parent, n + 1
        return n

    lines = []
    for p, v in zip(graph.in_paths, graph.invars):
        lines.append(f"  input {name(v)}: {a.types[v]}    # {p}")
    for i, e in enumerate(graph.eqns):
        outs = ", ".join(f"{name(v)}: {a.types[v]}" for v in e.outvars)
        rule = a.ops[i].rule
        note = f"   # {rule}" if rule is not None else "   # no rule: replicated"
        if ir.is_enter(e):
            reg = graph.regions[e.params["region"]]
            params = ", ".join(f"{name(v)} = {graph.names[v]}" for v in e.outvars if v in graph.names)
            note = f"   # {reg.trips if reg.trips is not None else '?'} trips" + (f"; {params}" if params else "")
        lines.append(f"  {'  ' * depth(i)}{outs} = {e.name} {' '.join(name(v) for v in e.invars)}{note}")
    lines.append("  return " + ", ".join(name(v) for v in graph.outvars))
    return "\n".join(lines)


def _refuse_unknown_calls(graph: ir.Graph) -> None:
    """:class:`PartitionError` naming the first higher-order primitive of ``graph`` that partir_core does not
    inline or partition (:func:`ir.binds_functions`)."""
    name = next((e.name for e in graph.eqns if ir.binds_functions(e)), None)
    if name is not None:
        raise PartitionError(
            f"{name} inside a function to partition is not supported: partir_core partitions the whole function "
            f"and cannot partition inside {name} (it inlines jit, checkpoint and custom_jvp/custom_vjp calls and "
            f"partitions scan, while_loop and cond); call {name} outside partir_core.jit")


class PartitionedFunction:
    """What :func:`jit` returns: call it like ``fn``; ``lower(*args, **kwargs)`` gives the :class:`Partitioned`."""

    def __init__(self, fn, mesh: Mesh, schedule):
        if not callable(fn):
            raise PartitionError(f"partir_core.jit needs a function to partition, got {type(fn).__name__} {shown(fn)}")
        if not isinstance(mesh, Mesh):
            raise PartitionError(f"partir_core.jit needs a redist.Mesh, got {type(mesh).__name__}")
        self.fn = fn
        self.mesh = mesh
        self.schedule = check_schedule(schedule, mesh)
        try:
            self._signature = inspect.signature(fn)
        except (TypeError, ValueError):  # some builtins have none: arguments are then taken as given
            self._signature = None
        self._cache: dict = {}
        functools.update_wrapper(self, fn)

    def _bind(self, args, kwargs) -> tuple[tuple, dict]:
        """``(args, kwargs)`` as ``fn`` binds them: every argument that can be positional is, and the keyword
        ones follow ``fn``'s parameter order. Raises :class:`PartitionError` naming a missing or extra argument."""
        name = getattr(self.fn, "__name__", "fn")
        if self._signature is None:
            if kwargs:
                raise PartitionError(f"{name} has no signature to bind keyword arguments to; pass them positionally")
            return args, kwargs
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            given = f"{len(args)} positional" + (f" and keywords {', '.join(kwargs)}" if kwargs else "")
            raise PartitionError(f"arguments do not fit {name}{self._signature}: {e} (given {given})") from None
        return bound.args, bound.kwargs

    def _key(self, args, kwargs):
        """What a lowering depends on: the argument structure and every input's shape and dtype. Raises
        :class:`PartitionError` for an input that is neither an array nor a number, or a masked array."""
        paths, leaves, tree = ir.input_paths(self.fn, args, kwargs)
        specs = []
        for path, x in zip(paths, leaves):
            if isinstance(x, np.ma.MaskedArray):
                raise PartitionError(f"input {path!r} is a masked array: masked arrays are not supported (the mask "
                                     "would be lost); pass x.filled(value), or the data and the mask as two inputs")
            if hasattr(x, "dtype"):
                dtype = x.dtype
            elif isinstance(x, (bool, int, float, complex)):
                dtype = np.asarray(x).dtype
            else:
                raise PartitionError(f"input {path!r} is {type(x).__name__} {shown(x)}; inputs are arrays or numbers: "
                                     "pass a module's arrays and close over the rest (equinox: params, static = "
                                     "eqx.partition(model, eqx.is_array))")
            if isinstance(dtype, np.dtype) and dtype.kind in "OSUV":
                raise PartitionError(f"input {path!r} has dtype {dtype}; inputs are arrays of numbers")
            specs.append((tuple(np.shape(x)), str(dtype)))
        return tuple(kwargs), tree, tuple(specs)

    def lower(self, *args, **kwargs) -> Partitioned:
        return self._lowered(*self._bind(args, kwargs))

    def _lowered(self, args, kwargs) -> Partitioned:
        key = self._key(args, kwargs)
        if key not in self._cache:
            self._cache[key] = self._lower(args, kwargs)
        return self._cache[key]

    def _lower(self, args, kwargs) -> Partitioned:
        graph = ir.trace(self.fn, args, kwargs)
        _refuse_unknown_calls(graph)
        for t in self.schedule:  # every error before anything runs
            t.validate(graph, self.mesh)
        rules = [rule_for(e, graph) for e in graph.eqns]
        state = State.empty(graph)
        states = [state.copy()]
        automatic = []
        for k, tactic in enumerate(self.schedule, start=1):
            if isinstance(tactic, AutomaticPartition):
                result = search(graph, rules, state, self.mesh, k, tactic)
                state, result.state = result.state, None  # the Partitioned keeps it as states[k]
                result.text = render(graph, rules, state, self.mesh)
                automatic.append(result)
            else:
                tactic.apply(graph, state, self.mesh, k)
            propagate(graph, rules, state, self.mesh, k)
            states.append(state.copy())
        program = lower(graph, analyze(graph, rules, state, self.mesh), self.mesh)
        return Partitioned(graph, rules, self.mesh, self.schedule, states, program, automatic)

    def __call__(self, *args, **kwargs):
        args, kwargs = self._bind(args, kwargs)
        return self._lowered(args, kwargs).run(*args, *kwargs.values())


def jit(fn, mesh: Mesh, schedule=()) -> PartitionedFunction:
    """Partition ``fn`` over ``mesh`` with ``schedule`` (a list of tactics); see the module docstring. Raises
    :class:`PartitionError` for a ``fn`` that is not callable, a ``mesh`` that is not a :class:`redist.Mesh`, a
    schedule that is not a list of tactics, or a tactic naming an axis the mesh lacks."""
    return PartitionedFunction(fn, mesh, schedule)
