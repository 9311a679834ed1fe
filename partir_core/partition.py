"""The entry point: ``partir_core.jit(fn, mesh, schedule)`` and the partitioned program it lowers to.

``pf = partir_core.jit(fn, mesh, schedule)`` has ``fn``'s signature. ``pf(*args)`` traces ``fn`` on the
arguments' shapes, applies the tactics in order (each followed by propagation to a fixed point), lowers to
one ``jax.shard_map`` program over the ``mesh.size`` first JAX devices, runs it and returns what ``fn``
returns. ``pf`` can itself be traced by ``jax.jit``. Lowerings are cached per argument structure and shapes.

``pf.lower(*args)`` returns the :class:`Partitioned` program: input/output sharding types (pytrees of
``redist.ShardingType``), collectives, text after each tactic, conflicts, unsupported primitives,
``simulate()``, and ``automatic`` (what an ``AutomaticPartition`` found, as pasteable manual tactics).
"""

from __future__ import annotations

import functools

import jax
import numpy as np

import redist
from redist.mesh import Mesh

from partir_core import ir, keys
from partir_core.automatic import search
from partir_core.choice import analyze
from partir_core.lowering import lower
from partir_core.program import LocalProgram
from partir_core.propagation import State, propagate
from partir_core.registry import rule_for
from partir_core.simulator import simulate as _simulate
from partir_core.tactics import AutomaticPartition, PartitionError


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
    def fallbacks(self):
        """Reshards that used gather-and-slice instead of a redist plan: ``(where, src, dst, why)``."""
        return list(self.program.fallbacks)

    def after(self, k: int) -> str:
        """The IR text after the first ``k`` tactics (``after(0)``: unpartitioned)."""
        if not 0 <= k < len(self.states):
            raise IndexError(f"after({k}): the schedule has {len(self.states) - 1} tactics")
        return render(self.graph, self.rules, self.states[k], self.mesh)

    def __str__(self):
        return self.after(len(self.states) - 1)

    def simulate(self, hardware=None):
        """Per-device step time, peak memory, communication and FLOPs (see :mod:`partir_core.simulator`)."""
        return _simulate(self.program, hardware)

    def run(self, *args):
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

    lines = []
    for p, v in zip(graph.in_paths, graph.invars):
        lines.append(f"  input {name(v)}: {a.types[v]}    # {p}")
    for i, e in enumerate(graph.eqns):
        outs = ", ".join(f"{name(v)}: {a.types[v]}" for v in e.outvars)
        rule = a.ops[i].rule
        note = f"   # {rule}" if rule is not None else "   # no rule: replicated"
        lines.append(f"  {outs} = {e.name} {' '.join(name(v) for v in e.invars)}{note}")
    lines.append("  return " + ", ".join(name(v) for v in graph.outvars))
    return "\n".join(lines)


class PartitionedFunction:
    """What :func:`jit` returns: call it like ``fn``; ``lower(*args)`` gives the :class:`Partitioned`."""

    def __init__(self, fn, mesh: Mesh, schedule):
        if not isinstance(mesh, Mesh):
            raise PartitionError(f"partir_core.jit needs a redist.Mesh, got {type(mesh).__name__}")
        self.fn = fn
        self.mesh = mesh
        self.schedule = list(schedule)
        for t in self.schedule:
            t.check_mesh(mesh)
        self._cache: dict = {}
        functools.update_wrapper(self, fn)

    def _key(self, args):
        leaves, tree = jax.tree_util.tree_flatten(tuple(args))
        return tree, tuple((tuple(np.shape(x)), str(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)) for x in leaves)

    def lower(self, *args) -> Partitioned:
        key = self._key(args)
        if key not in self._cache:
            self._cache[key] = self._lower(args)
        return self._cache[key]

    def _lower(self, args) -> Partitioned:
        graph = ir.trace(self.fn, args)
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

    def __call__(self, *args):
        return self.lower(*args).run(*args)


def jit(fn, mesh: Mesh, schedule=()) -> PartitionedFunction:
    """Partition ``fn`` over ``mesh`` with ``schedule`` (a list of tactics); see the module docstring."""
    return PartitionedFunction(fn, mesh, schedule)
