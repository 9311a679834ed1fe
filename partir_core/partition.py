"""The entry point: ``partir_core.jit(fn, mesh, schedule)`` and the partitioned program it lowers to.

``pf = partir_core.jit(fn, mesh, schedule)`` has ``fn``'s signature: ``pf(*args, **kwargs)`` binds its
arguments as ``fn`` would (:mod:`partir_core.arguments`: static and donated arguments as ``jax.jit``'s), traces
``fn`` on the arguments' shapes, applies the tactics in order (each followed by propagation to a fixed point),
lowers to one ``jax.shard_map`` program over the mesh's devices (a JAX mesh's own, in its order; a
``redist.Mesh``'s among the first JAX devices), runs it and returns what ``fn`` returns. ``pf`` can itself be
traced by ``jax.jit``. Lowerings are cached per argument structure, static values, shapes and dtypes. Where
``fn``'s parameters are all positional without defaults and a call gives them positionally, ``pf`` dispatches
as one ``jax.jit`` of ``fn`` would (its trace inlines the cached program), so that a warm call does no Python
work of its own.
``pf.place(*args, **kwargs)`` puts the arguments in their types once, so that calls on them move no input.

``pf.lower(*args, **kwargs)`` returns the :class:`Partitioned` program: input/output sharding types (pytrees of
``redist.ShardingType``) and their ``NamedSharding``s, collectives, text after each tactic, conflicts and
unsupported primitives (``explain()`` says them in words), ``simulate()``, and ``automatic`` (what an
``AutomaticPartition`` found, as pasteable manual tactics). :func:`input_paths` names a function's inputs.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Callable

import jax
import numpy as np

import redist
from redist.errors import shown
from redist.mesh import Mesh

from partir_core import ir, keys, pipeline
from partir_core.arguments import Arguments, Call
from partir_core.automatic import pipelines, search
from partir_core.choice import analyze
from partir_core.collector import collector_paused
from partir_core.explain import explain as _explain
from partir_core.lowering import lower
from partir_core.program import LocalProgram
from partir_core.proof import verify as _verify
from partir_core.propagation import State, propagate
from partir_core.registry import rule_for
from partir_core.reshard import mesh_of
from partir_core.simulator import simulate as _simulate
from partir_core.summary import summary
from partir_core.tactics import AutomaticPartition, ManualPartition, PartitionError, check_schedule, nearest_inputs


class Partitioned:
    """A partitioned program (see the module docstring)."""

    def __init__(self, graph, rules, mesh, schedule, states, program: LocalProgram, automatic=(), function=None,
                 call=None):
        self.graph = graph
        self.function = function  # the function traced (without its static arguments)
        self.call = call  # its arguments as traced (a Call of jax.ShapeDtypeStruct leaves)
        self.rules = rules
        self.mesh = mesh
        self.schedule = list(schedule)
        self.states = states  # states[k]: after k tactics
        self.program = program
        self.automatic_results = list(automatic)

    @property
    def automatic(self):
        """The result of the (last) ``AutomaticPartition`` in the schedule, or None: its ``tactics`` (manual
        tactics to paste in its place), ``code``, ``text`` (the program after it), ``candidates`` and
        ``summary()`` (the choice against its runners-up), ``action_space`` sizes, ``groups`` and search
        ``stats`` (see :class:`partir_core.automatic.AutoResult`)."""
        return self.automatic_results[-1] if self.automatic_results else None

    # ---------------------------------------------------------------- types
    @property
    def in_types(self):
        return jax.tree_util.tree_unflatten(self.graph.in_tree, self.program.in_types)

    @property
    def out_types(self):
        return jax.tree_util.tree_unflatten(self.graph.out_tree, self.program.out_types)

    @property
    def in_shardings(self):
        """Where each input lies when it has its type: a pytree of ``jax.sharding.NamedSharding`` on the JAX mesh
        the program runs on, shaped as :attr:`in_types` (``jax.device_put(args, in_shardings)`` places them, as
        ``PartitionedFunction.place`` does). A dim split unevenly is whole there (JAX shards only dims that
        divide; the program splits it itself); a type naming a sub-axis is on the mesh refined for it (the
        same devices in the same order). Inputs are never pending sums."""
        return jax.tree_util.tree_unflatten(self.graph.in_tree,
                                            self.program.layouts(self.graph.invars, self.program.in_types))

    @property
    def out_shardings(self):
        """Where the outputs lie: a pytree of ``jax.sharding.NamedSharding`` shaped as :attr:`out_types`, as
        :attr:`in_shardings` (outputs are never pending sums: lowering reduces them)."""
        return jax.tree_util.tree_unflatten(self.graph.out_tree,
                                            self.program.layouts(self.graph.outvars, self.program.out_types))

    def input_type(self, path: str) -> redist.ShardingType:
        """The type of the input named ``path``."""
        if path not in self.graph.in_paths:
            raise PartitionError(f"no input is named {shown(path)}; {nearest_inputs(path, self.graph.in_paths)}")
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
        """Every :class:`~partir_core.propagation.Conflict`: a tactic's request not honoured (:meth:`explain`
        says them in words)."""
        return list(self.states[-1].conflicts)

    @property
    def unsupported(self):
        """Every op run replicated for lack of a rule: :class:`~partir_core.choice.Unsupported` ``(eqn,
        primitive, why)``."""
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
        return self.renderer(k)()

    def renderer(self, k: int) -> Callable[[], str]:
        """What gives :meth:`after` ``(k)`` when called, holding what it reads (not this object): after the whole
        schedule, the program's own per-op choice; after fewer tactics, the state, chosen when called."""
        analysis = self.program.analysis if k == len(self.states) - 1 else None
        return functools.partial(render, self.graph, self.rules, self.states[k], self.mesh, analysis)

    def __str__(self):
        return self.after(len(self.states) - 1)

    def summary(self) -> str:
        """The mesh and the collectives, then each input's and output's path, sharding type and bytes per device
        (see :mod:`partir_core.summary`)."""
        return summary(self)

    def explain(self, hardware=None) -> str:
        """The conflicts and unsupported ops in words: for each conflict, the op (primitive and line of code)
        or input, what each tactic asked (its text, the value's path and dim), what was kept and why, and the
        reshards it costs (bytes per device and simulated time on ``hardware``, default ``"cpu-host"``); for
        each op without a rule, what running it replicated moves (see :mod:`partir_core.explain`)."""
        return _explain(self, hardware)

    def simulate(self, hardware=None):
        """Per-device step time, peak memory, communication and FLOPs (see :mod:`partir_core.simulator`)."""
        return _simulate(self.program, hardware)

    def verify(self, reference=None, timeout_s: float | None = None) -> redist.Verdict:
        """Prove that the local program, run on every device of the mesh, computes ``reference``'s outputs (None:
        the function it was traced from; else a function of the same signature, traced on the same arguments):
        a :class:`redist.Verdict` of status ``"proved"``, ``"refuted"`` (its ``counterexample`` names the
        reference's op where the two part ways, by source location, and an output that differs on random
        inputs) or ``"undecided"`` (``reason`` names what no proved rule covers), within ``timeout_s`` seconds
        (None: no bound). See :mod:`partir_core.proof`."""
        return _verify(self, reference, timeout_s)

    def run(self, *args):
        """Run on ``args``: the arguments as lowered, positional ones first, then the values of the keyword ones."""
        leaves = jax.tree_util.tree_leaves(tuple(args))
        outs = self.program.run(*leaves)
        return jax.tree_util.tree_unflatten(self.graph.out_tree, list(outs))


def render(graph, rules, state, mesh, analysis=None) -> str:
    """The program with every value's type under ``state``, and each op's rule: ``analysis`` (the per-op choice
    of ``state``) where given, else :func:`~partir_core.choice.analyze`'s."""
    a = analysis if analysis is not None else analyze(graph, rules, state, mesh)

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


def _host_spec(arguments: Arguments, call: Call, j: int, x) -> tuple:
    """``(shape, dtype)`` of input ``j`` of ``call``, ``x``, which is no JAX array, as JAX takes it (``float64`` is
    ``float32`` unless 64-bit types are enabled). Raises :class:`PartitionError`, naming the input's path, for an
    ``x`` that is neither an array nor a number, or a masked array."""
    if isinstance(x, np.ma.MaskedArray):
        raise PartitionError(f"input {arguments.paths(call)[j]!r} is a masked array: masked arrays are not supported "
                             "(the mask would be lost); pass x.filled(value), or the data and the mask as two inputs")
    if hasattr(x, "dtype"):
        dtype = x.dtype
    elif isinstance(x, (bool, int, float, complex)):
        dtype = np.asarray(x).dtype
    else:
        raise PartitionError(f"input {arguments.paths(call)[j]!r} is {type(x).__name__} {shown(x)}; inputs are "
                             "arrays or numbers: pass a module's arrays and close over the rest (equinox: params, "
                             "static = eqx.partition(model, eqx.is_array))")
    if isinstance(dtype, np.dtype):
        if dtype.kind in "OSUV" and not jax.numpy.issubdtype(dtype, np.number):  # bfloat16 is "V" and a number
            raise PartitionError(f"input {arguments.paths(call)[j]!r} has dtype {dtype}; inputs are arrays of numbers")
        dtype = jax.dtypes.canonicalize_dtype(dtype)
    return tuple(np.shape(x)), dtype


class PartitionedFunction:
    """What :func:`jit` returns: call it like ``fn``; ``lower(*args, **kwargs)`` gives the :class:`Partitioned`,
    ``place(*args, **kwargs)`` puts the arguments where the program wants them."""

    def __init__(self, fn, mesh, schedule, static_argnums=(), static_argnames=(), donate_argnums=(),
                 donate_argnames=(), verify=False):
        if not callable(fn):
            raise PartitionError(f"partir_core.jit needs a function to partition, got {type(fn).__name__} {shown(fn)}")
        self.fn = fn
        self.mesh, self._jax_mesh = _meshes(mesh)
        self.schedule = check_schedule(schedule, self.mesh, (ManualPartition, AutomaticPartition, pipeline.Pipeline))
        self.arguments = Arguments(fn, static_argnums, static_argnames, donate_argnums, donate_argnames)
        if not isinstance(verify, bool):
            raise PartitionError(f"verify must be True or False, got {shown(verify)}")
        self.verify = verify
        self._cache: dict = {}
        functools.update_wrapper(self, fn)

    def _key(self, call: Call):
        """What a lowering depends on: the argument structure, the static arguments and every input's shape and
        dtype (as JAX takes it: ``float64`` is ``float32`` unless 64-bit types are enabled). Raises
        :class:`PartitionError` for an input that is neither an array nor a number, or a masked array. Cheap for
        JAX arrays (their dtypes are JAX's already): it is worked out at every call."""
        leaves, tree = call.flat
        specs = tuple((x.shape, x.dtype) if isinstance(x, jax.Array) else _host_spec(self.arguments, call, j, x)
                      for j, x in enumerate(leaves))
        return tuple(call.kwargs), tree, specs, call.static

    def lower(self, *args, **kwargs) -> Partitioned:
        """The :class:`Partitioned` program for these arguments (cached per argument structure, static values,
        shapes and dtypes)."""
        return self._lowered(self.arguments.bind(args, kwargs))

    def _lowered(self, call: Call) -> Partitioned:
        """The cached :class:`Partitioned` of ``call``, else traced, partitioned and lowered with Python's cyclic
        collector paused (:func:`~partir_core.collector.collector_paused`)."""
        key = self._key(call)
        low = self._cache.get(key)
        if low is None:
            started = time.perf_counter()  # an AutomaticPartition's time budget counts from here
            with collector_paused():
                low = pipelines.lower(self, call, functools.partial(self._lower, call), started)
            if self.verify:
                v = low.verify()
                if not v.ok:
                    raise PartitionError(f"partir_core.jit(verify=True) refuses to run the partitioned program of "
                                         f"{getattr(self.fn, '__name__', 'the function')}: it is {v.status}: "
                                         f"{v.reason}")
            self._cache[key] = low
        return low

    def _lower(self, call: Call, schedule, plain: ir.Graph | None = None, deadline: float | None = None
               ) -> Partitioned:
        """``call`` partitioned by ``schedule`` and lowered; ``plain``: the step traced already
        (:func:`partir_core.pipeline.trace`); ``deadline``: the one of the schedule's search
        (:func:`partir_core.automatic.search`)."""
        graph = pipeline.trace(call.function(self.fn), call.args, call.kwargs, schedule, self.mesh, plain)
        _refuse_unknown_calls(graph)
        for t in schedule:  # every error before anything runs
            t.validate(graph, self.mesh)
        rules = [rule_for(e, graph) for e in graph.eqns]
        state = State.empty(graph)
        states = [state.copy()]
        automatic = []
        analysis = None  # the per-op choice of the state so far, where a search made it
        for k, tactic in enumerate(schedule, start=1):
            if isinstance(tactic, AutomaticPartition):
                result = search(graph, rules, state, self.mesh, k, tactic, deadline=deadline)
                # propagated and chosen by the search: states[k], and lowered as chosen if no tactic follows
                state, analysis, result.state, result.analysis = result.state, result.analysis, None, None
                automatic.append((k, result))
            else:
                tactic.apply(graph, state, self.mesh, k)
                propagate(graph, rules, state, self.mesh, k)
                analysis = None
            states.append(state.copy())
        program = lower(graph, analysis if analysis is not None else analyze(graph, rules, state, self.mesh),
                        self.mesh)
        program = replace(program, device_mesh=self._jax_mesh)
        low = Partitioned(graph, rules, self.mesh, schedule, states, program, [r for _, r in automatic], self.fn,
                          _abstract(call))
        for k, result in automatic:
            result.render = low.renderer(k)
        return low

    def place(self, *args, **kwargs) -> tuple[tuple, dict]:
        """``(args, kwargs)``: the arguments as ``fn`` binds them (those that can be positional in ``args``),
        each array put in its input's type (``jax.device_put`` to :attr:`Partitioned.in_shardings`). Calling
        this function on them moves no input: place a training step's parameters once, not at every step.
        Static arguments and Python numbers are returned as they are. A placed array may share its buffer with
        the argument it came from (as ``jax.device_put``'s do), except a donated one, which is a copy."""
        call = self.arguments.bind(args, kwargs)
        low = self._lowered(call)
        values, tree = jax.tree_util.tree_flatten((*call.args, *call.kwargs.values()))
        shardings = low.program.layouts(low.graph.invars, low.program.in_types)
        placed = [jax.device_put(x, s) if hasattr(x, "dtype") else x for x, s in zip(values, shardings)]
        for i in call.donated:  # copies: a placed array may share the caller's buffer, which donating deletes
            if hasattr(placed[i], "dtype"):
                placed[i] = placed[i].copy()
        placed = jax.tree_util.tree_unflatten(tree, placed)
        return call.restored(placed[:len(call.args)], dict(zip(call.kwargs, placed[len(call.args):])))

    def __call__(self, *args, **kwargs):
        """``fn(*args, **kwargs)``, partitioned. A call of ``fn``'s positional parameters only, given
        positionally, is dispatched as ``jax.jit`` dispatches (:attr:`_dispatch`); any other binds its
        arguments here, finds its program in the cache and runs it."""
        if kwargs or len(args) != self.arguments.positional or self._dispatch is None:
            call = self.arguments.bind(args, kwargs)
            low = self._lowered(call)
            outs = low.program.run(*call.leaves, donate=call.donated)
            return jax.tree_util.tree_unflatten(low.graph.out_tree, list(outs))
        try:
            return self._dispatch(*args)
        except (TypeError, ValueError):
            # JAX refused an argument (not an array, a masked array, an unhashable static value): say which in
            # the user's terms; an error raised while tracing or lowering (inputs that bind) is raised as it is
            self._key(self.arguments.bind(args, kwargs))
            raise

    @functools.cached_property
    def _dispatch(self):
        """``fn`` as one ``jax.jit`` over its own arguments (static and donated as given to :func:`jit`), whose
        trace for each argument structure, static values, shapes and dtypes inlines that call's cached
        program (lowered then where it is not cached: eagerly, nothing of the lowering is traced): a warm call
        costs what a ``jax.jit`` call costs, with no binding, flattening or cache lookup in Python. None
        where calls do not bind as given (:meth:`~partir_core.arguments.Arguments.positions`)."""
        positions = self.arguments.positions()
        if positions is None:
            return None

        def traced(*args):
            call = self.arguments.bind(args, {})
            with jax.ensure_compile_time_eval():
                low = self._lowered(_abstract(call))
            outs = low.program.executable()(*call.leaves)
            return jax.tree_util.tree_unflatten(low.graph.out_tree, list(outs))

        static, donated = positions
        return jax.jit(traced, static_argnums=static, donate_argnums=donated)


def _abstract(call: Call) -> Call:
    """``call`` with every array argument (a tracer included) replaced by its ``jax.ShapeDtypeStruct`` (a
    lowering keeps no array alive; one lowered from it is the one its arrays give)."""
    def spec(x):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype) if hasattr(x, "dtype") else x

    return replace(call, args=jax.tree.map(spec, call.args), kwargs=jax.tree.map(spec, call.kwargs))


def _meshes(mesh) -> tuple[Mesh, jax.sharding.Mesh | None]:
    """``(the redist mesh, the JAX mesh to run on)`` of :func:`jit`'s ``mesh``: a :class:`redist.Mesh` runs on
    the JAX devices its device ids name (None here: :meth:`partir_core.program.LocalProgram.jax_mesh`); a
    ``jax.sharding.Mesh`` on its own devices in its own order (its axes as ``Auto`` axes, whatever their type:
    the ``shard_map`` manages them all), its redist mesh the one of :func:`partir_core.reshard.mesh_of`; an
    ``AbstractMesh`` (axes and no devices) as the redist mesh of its axes."""
    if isinstance(mesh, Mesh):
        return mesh, None
    if isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
        axes = tuple(zip(mesh.axis_names, mesh.axis_sizes))
        try:
            if isinstance(mesh, jax.sharding.AbstractMesh):
                return Mesh(axes), None
            auto = (jax.sharding.AxisType.Auto,) * len(axes)  # the shard_map program manages every axis
            return mesh_of(mesh), jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=auto)
        except redist.ShardingError as e:
            raise PartitionError(f"partir_core.jit cannot partition over the JAX mesh {mesh}: {e}") from None
    raise PartitionError(f"partir_core.jit needs a mesh (redist.Mesh, jax.sharding.Mesh or AbstractMesh), got "
                         f"{type(mesh).__name__}")


def jit(fn, mesh, schedule=(), *, static_argnums=(), static_argnames=(), donate_argnums=(),
        donate_argnames=(), verify: bool = False) -> PartitionedFunction:
    """Partition ``fn`` over ``mesh`` with ``schedule`` (a list of tactics); see the module docstring.

    ``mesh``: a :class:`redist.Mesh` (the program runs on the JAX devices its ``device_ids`` name, by default
    the first ``mesh.size``), a ``jax.sharding.Mesh`` (``jax.make_mesh(...)``: the program runs on exactly its
    devices, in its order) or a ``jax.sharding.AbstractMesh`` (as the ``redist.Mesh`` of its axes).
    ``static_argnums``/``static_argnames``: arguments that are not arrays but hashable values ``fn`` is traced
    with, as ``jax.jit``'s (each value lowers a program of its own). ``donate_argnums``/``donate_argnames``:
    arguments whose arrays the call may reuse for its outputs and deletes, as ``jax.jit``'s. ``verify``: prove
    each program as it is lowered (:meth:`Partitioned.verify`) and refuse, with a :class:`PartitionError` saying
    why, to lower or run one that is not proved.

    Raises :class:`PartitionError` for a ``fn`` that is not callable, a ``mesh`` of none of those kinds, a
    schedule that is not a list of tactics, a tactic naming an axis the mesh lacks, or static and donated
    arguments that are not ``fn``'s."""
    return PartitionedFunction(fn, mesh, schedule, static_argnums, static_argnames, donate_argnums, donate_argnames,
                               verify)


def input_paths(fn, *args, **kwargs) -> list[str]:
    """The path of every input of ``fn(*args, **kwargs)``, in input order: the names tactics match (the
    parameter name, then pytree keys joined by ``/``: ``["params/w1", "params/w2", "x"]``). ``fn`` may be what
    :func:`jit` returns (its static arguments are no inputs). The arguments may be arrays or
    ``jax.ShapeDtypeStruct`` values; nothing is traced. Raises :class:`PartitionError` for arguments that do not bind."""
    if isinstance(fn, PartitionedFunction):
        arguments = fn.arguments
    elif callable(fn):
        arguments = Arguments(fn)
    else:
        raise PartitionError(f"input_paths needs a function, got {type(fn).__name__} {shown(fn)}")
    return arguments.paths(arguments.bind(args, kwargs))
