"""Pipeline parallelism as a tactic: a step's layer scan becomes a pipelined loop over the stages of a mesh axis.

``Pipeline(layers="params/layers/*", axis="stage", microbatches=M, schedule="gpipe", batch={"tokens": 0})``
applies to a step whose layers run as one ``jax.lax.scan`` over stacked parameters (a leading layer dim), as
``flax.linen.scan``, ``nnx.scan`` and hand-written scans over an ``equinox`` model's stacked arrays do. The
stacked inputs matching ``layers`` get their layer dim split over ``axis`` (``S`` devices, one stage each), the
scan's carry (the activations) is split into ``M`` microbatches along the batch dim of the inputs matching
``batch``, and the scan runs as a pipelined loop (:mod:`partir_core.pipeline_schedule`: ticks, bubble, picture).

Design: the scan is replaced when the step is traced. A pipeline changes the program's loop structure, its
autodiff and its shapes, not only its shardings, so :func:`trace` traces the user's step again with
``jax.lax.scan`` intercepted: the one call whose scanned operands include the stacked inputs (recognised by
identity, through the ``jax.grad`` tracers wrapping them) runs :func:`_pipelined_scan` instead, and ``jax.grad``
differentiates the pipelined loop, as MaxText's pipeline is differentiated. Rewriting an already differentiated
program instead would mean rewriting the forward loop, its residuals and the transposed loop consistently.
A first, plain trace finds the layer scan and the carry's batch dims (the carry dims in the dim group of the
``batch`` inputs' dims, :mod:`partir_core.analysis`) and raises the user's errors before anything is rewritten.

The pipelined loop is MaxText's SPMD formulation. With ``L`` layers, ``S`` stages, ``R`` repeats (1 for GPipe)
and ``K = L / (S·R)`` layers per stage and repeat:

- the stacked layers are viewed as ``[S, K, ...]`` (GPipe: stage ``s`` holds layers ``s·K ... s·K + K - 1``, a
  block of the layer dim, so no data moves) or, circular, put in circular order (stage ``s`` holds layers
  ``(r·S + s)·K + k``) by a static permutation of the layer dim and viewed as ``[S, R, K, ...]``;
- the carry ``[..., B, ...]`` becomes microbatches ``[M, ..., B/M, ...]`` (microbatch ``m`` holds examples
  ``m, m + M, ...``, so a batch split over devices stays split within every microbatch);
- the loop state has a leading stage dim ``[S, ..., B/M, ...]``, split over ``axis`` like the layers, and so
  has a buffer of the microbatches ``[S, M, ..., B/M, ...]`` (every stage's row starts as the microbatches).
  Each of the ``M·R + S - 1`` ticks runs ``vmap(stage)`` over the stages, each on its current microbatch (the
  ``K`` layers of the user's scan body, in an inner scan; with ``remat``, under ``jax.checkpoint``), then
  rotates the state by one stage: a static permutation of the stage dim (:mod:`partir_core.permutation`), which
  lowers to one ``lax.ppermute`` over ``axis``, never a gather. The microbatch the last stage finished is now
  at stage 0, which writes it into its row of the buffer, from where it takes its next input: a new microbatch,
  or in a later repeat the one finished ``M - S + 1`` ticks before. Every tick's data stays on its device but
  for the rotation; at the end the buffer's row of stage 0 holds every microbatch's output, which a sum over the
  stage dim (one all-reduce, and in the backward pass one for the gradient of the microbatches) hands to the
  rest of the step.

Only the stacked layers and the loop state are split over ``axis``: the rest of the step (an embedding, the
loss, the optimizer update; the optimizer state of the stacked layers follows them) runs as the other tactics
place it, beside batch parallelism, Megatron or ZeRO on the other mesh axes, which apply inside every stage.

Not supported (a :class:`~partir_core.PartitionError` says so): layers unrolled by a Python loop (scan them),
a layer scan that also returns per-layer outputs (other than its layer operands returned as they came, which
``nnx.scan`` does), a carry leaf without the batch dim, ``reverse=True``, more
than one layer scan reaching the pattern, and a circular schedule with fewer microbatches than stages. The scan
must be reached as ``jax.lax.scan`` (``from jax.lax import scan`` binds it before the trace can intercept
it) while the step is traced, which patches ``jax.lax.scan`` for the duration of the trace. The layer body must
read per-example values only through its carry (a mask closed over by the body would not be microbatched).
"""

from __future__ import annotations

import contextlib
import functools
import numbers
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from redist.errors import shown

from partir_core import ir
from partir_core.analysis import analyze_groups
from partir_core.factors import clash
from partir_core.ir import Graph
from partir_core.permutation import permute, rotation
from partir_core.pipeline_schedule import SCHEDULES, Schedule
from partir_core.propagation import State
from partir_core.registry import rule_for
from partir_core.tactics import ManualPartition, PartitionError, mesh_axis


@dataclass
class Pipeline:
    """Pipeline the step's layer scan over the stages of mesh axis ``axis`` (see the module docstring).

    ``layers``: a path pattern naming the stacked layer inputs (``"params/layers/*"``), each scanned over by
    the layer scan, its leading dim the layer. ``microbatches``: ``M``, dividing the batch. ``schedule``:
    ``"gpipe"`` (``repeats`` 1) or ``"circular"`` (``repeats`` ``R`` ≥ 2 passes through the stages, ``M ≥ S``).
    ``batch``: the inputs split into microbatches, a path pattern (their dim 0) or ``{pattern: dim}``. ``remat``:
    recompute each stage in the backward pass, keeping only its inputs (``jax.checkpoint`` around it).
    Errors (:class:`PartitionError`) name the numbers and paths: layers not divisible by ``S·R``, a batch not
    divisible by ``M``, a pattern matching no input or an input no layer scan iterates over, a step with no
    layer scan."""

    layers: str
    axis: str
    microbatches: int = 1
    schedule: str = "gpipe"
    repeats: int = 1
    batch: str | dict | None = None
    remat: bool = False

    def __post_init__(self):
        self.check_arguments()

    def check_arguments(self) -> None:
        """Raise :class:`PartitionError` naming the first argument of the wrong kind or out of range."""
        def fail(name, expected):
            raise PartitionError(f"Pipeline: {name} must be {expected}, got {shown(getattr(self, name))}")

        if not isinstance(self.layers, str):
            fail("layers", "a path pattern naming the stacked layer inputs, like 'params/layers/*'")
        if not isinstance(self.axis, str):
            fail("axis", "a mesh axis name")
        for name in ("microbatches", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                fail(name, "an int >= 1")
        if self.schedule not in SCHEDULES:
            fail("schedule", "'gpipe' or 'circular'")
        if self.schedule == "gpipe" and self.repeats != 1:
            fail("repeats", "1 for schedule='gpipe' (use schedule='circular' for repeats)")
        if self.schedule == "circular" and self.repeats < 2:
            fail("repeats", "an int >= 2 for schedule='circular'")
        batch = self.batch
        if batch is not None and not isinstance(batch, str) and not (isinstance(batch, dict) and all(
                isinstance(p, str) and isinstance(d, numbers.Integral) and not isinstance(d, bool)
                for p, d in batch.items())):
            fail("batch", "a path pattern (dim 0 of the inputs it matches) or a dict {pattern: dim}")
        if batch is None and self.microbatches > 1:
            fail("batch", "the inputs to split into microbatches (a pattern, or {pattern: dim}) when "
                          "microbatches > 1")
        if not isinstance(self.remat, bool):
            fail("remat", "True or False")

    def check_mesh(self, mesh) -> None:
        mesh_axis("Pipeline", self.axis, mesh)

    def stages(self, mesh) -> int:
        """S: the size of the stage axis."""
        return mesh_axis("Pipeline", self.axis, mesh).size

    def batch_dims(self) -> dict:
        """``{pattern: dim}`` of the inputs split into microbatches."""
        if self.batch is None:
            return {}
        return {self.batch: 0} if isinstance(self.batch, str) else dict(self.batch)

    def validate(self, graph: Graph, mesh) -> None:
        self.check_arguments()
        self.check_mesh(mesh)
        if not graph.pipelines:
            raise PartitionError(f"{self}: the step was not traced with this pipeline (schedule it in "
                                 "partir_core.jit)")

    def apply(self, graph: Graph, state: State, mesh, index: int) -> None:
        """Split the layer dim of the stacked inputs and the stage dim of every rotation over the axis
        (propagation spreads the split through the pipelined loop). An input or value already split on an
        overlapping axis is left and a conflict recorded, as :class:`~partir_core.ManualPartition` does."""
        ManualPartition({self.layers: 0}, axis=self.axis).apply(graph, state, mesh, index)
        axis = mesh_axis("Pipeline", self.axis, mesh)
        for eqn in graph.eqns:
            if eqn.name != "permute_dim":
                continue
            d = eqn.params["dim"]
            for v in (*eqn.invars, *eqn.outvars):
                dims = state.dims.get(v)
                if dims is None or dims[d] or v in state.pinned or clash(mesh, [a for ax in dims for a in ax],
                                                                         [axis]):
                    continue
                state.set_dim(v, d, (axis,), index)

    def __str__(self):
        batch = f", batch={self.batch!r}" if self.batch is not None else ""
        repeats = f", repeats={self.repeats}" if self.schedule == "circular" else ""
        remat = ", remat=True" if self.remat else ""
        return (f"Pipeline(layers={self.layers!r}, axis={self.axis!r}, microbatches={self.microbatches}, "
                f"schedule={self.schedule!r}{repeats}{batch}{remat})")


@dataclass(frozen=True)
class _Plan:
    """What the intercepted layer scan becomes: the schedule, the stacked inputs it is recognised by, and the
    batch dim of each carry leaf (by the carry's and the stacked operands' shapes and dtypes)."""

    schedule: Schedule
    remat: bool
    layer_paths: tuple
    carry_avals: tuple
    xs_avals: tuple
    carry_batch_dims: tuple


def trace(fn, args, kwargs, schedule, mesh, plain: Graph | None = None) -> Graph:
    """``fn`` traced as :func:`partir_core.ir.trace` does, its layer scan pipelined where ``schedule`` holds a
    :class:`Pipeline` (see the module docstring); ``plain``: ``fn`` on these arguments traced so already (it is
    returned as it is, or read). Raises :class:`PartitionError` for more than one Pipeline and for what it
    cannot pipeline."""
    pipes = [t for t in schedule if isinstance(t, Pipeline)]
    if len(pipes) > 1:
        raise PartitionError(f"a schedule pipelines one layer scan: it has {len(pipes)} Pipeline tactics")
    plain = plain if plain is not None else ir.trace(fn, args, kwargs)
    if not pipes:
        return plain
    plan = _plan(pipes[0], plain, mesh)
    found = []

    @functools.wraps(fn)
    def intercepted(*a, **kw):
        paths, leaves, _ = ir.input_paths(fn, a, kw)
        layer_ids = {id(x) for p, x in zip(paths, leaves) if p in plan.layer_paths}
        with _scan_replaced(plan, layer_ids, found):
            return fn(*a, **kw)

    graph = ir.trace(intercepted, args, kwargs)
    if len(found) != 1:
        raise PartitionError(f"{pipes[0]}: {len(found)} layer scans iterate over {', '.join(plan.layer_paths)} "
                             "as the step runs; a Pipeline pipelines exactly one (call jax.lax.scan once over the "
                             "stacked layers, not `from jax.lax import scan`)")
    graph.pipelines.append(plan.schedule)
    return graph


def _plan(pipe: Pipeline, graph: Graph, mesh) -> _Plan:
    """The pipelined loop the layer scan of ``graph`` (traced plainly) becomes; the user's errors."""
    hits = graph.inputs_matching(pipe.layers)
    if not hits:
        raise PartitionError(f"{pipe}: layers={pipe.layers!r} matches no input; inputs are {_inputs(graph)}")
    region = _layer_scan(pipe, graph, dict(hits))
    reg = graph.regions[region]
    enter = graph.eqns[reg.enter]
    L, S, R, M = reg.trip_count, pipe.stages(mesh), pipe.repeats, pipe.microbatches
    if L % (S * R):
        raise PartitionError(f"{pipe}: the layer scan over {', '.join(p for p, _ in hits)} has {L} layers, not "
                             f"divisible by {S} stages (axis {pipe.axis!r})" + (f" x {R} repeats" if R > 1 else ""))
    if R > 1 and M < S:
        raise PartitionError(f"{pipe}: a circular schedule needs at least as many microbatches as stages: "
                             f"{M} microbatches, {S} stages")
    carry_dims = _carry_batch_dims(pipe, graph, reg, M)
    xs = [enter.invars[i] for i, _, stacked in enter.params["ties"] if stacked]
    init = enter.invars[len(reg.consts):len(reg.consts) + len(reg.carry)]
    return _Plan(Schedule(pipe.schedule, S, M, R, L, pipe.axis), pipe.remat, tuple(p for p, _ in hits),
                 tuple(_aval(graph, v) for v in init), tuple(_aval(graph, v) for v in xs), carry_dims)


def _inputs(graph: Graph) -> str:
    return ", ".join(graph.in_paths[:12]) + (", …" if len(graph.in_paths) > 12 else "")


def _aval(graph: Graph, v: int) -> tuple:
    return graph.shape(v), str(graph.dtype(v))


def _layer_scan(pipe: Pipeline, graph: Graph, layer_inputs: dict) -> int:
    """The region of the layer scan: the forward scan whose stacked operands include the inputs ``layer_inputs``
    (path → value); every one of them must be among them."""
    by_value = {v: p for p, v in layer_inputs.items()}
    for r, reg in enumerate(graph.regions):
        if reg.kind != "scan" or reg.params.get("reverse"):
            continue
        enter = graph.eqns[reg.enter]
        scanned = {enter.invars[i] for i, _, stacked in enter.params["ties"] if stacked}
        if not scanned & set(by_value):
            continue
        missing = [p for p, v in layer_inputs.items() if v not in scanned]
        if missing:
            raise PartitionError(f"{pipe}: layers={pipe.layers!r} matches {', '.join(missing)}, which the layer "
                                 "scan does not iterate over; name the stacked layer inputs only")
        return r
    raise PartitionError(f"{pipe}: no layer scan: no jax.lax.scan iterates over {', '.join(layer_inputs)} "
                         f"(layers={pipe.layers!r}). Pipeline needs the layers to run as one scan over stacked "
                         "parameters (jax.lax.scan, flax.linen.scan, nnx.scan); layers unrolled by a Python loop "
                         "are not supported: stack their parameters and scan them")


def _carry_batch_dims(pipe: Pipeline, graph: Graph, reg, M: int) -> tuple:
    """Per carry leaf of the layer scan: its dim in the dim group of the ``batch`` inputs' dims (0 where there
    is one microbatch and no ``batch``). Raises :class:`PartitionError` for a batch that does not divide into
    ``M`` or a carry leaf without the batch dim."""
    wanted = pipe.batch_dims()
    if not wanted:
        return tuple(0 for _ in reg.carry)
    dims = []
    for pattern, d in wanted.items():
        hits = graph.inputs_matching(pattern)
        if not hits:
            raise PartitionError(f"{pipe}: batch pattern {pattern!r} matches no input; inputs are {_inputs(graph)}")
        for p, v in hits:
            rank = len(graph.shape(v))
            if not -rank <= d < rank:
                raise PartitionError(f"{pipe}: batch dim {d} is out of range for input {p!r} of shape "
                                     f"{graph.shape(v)}")
            size = graph.shape(v)[d % rank]
            if size % M:
                raise PartitionError(f"{pipe}: the batch of {size} examples (dim {d % rank} of input {p!r}) is not "
                                     f"divisible by {M} microbatches")
            dims.append((v, d % rank))
    groups = analyze_groups(graph, [rule_for(e, graph) for e in graph.eqns])
    batch = {groups.group_of.get(vd) for vd in dims} - {None}
    out = []
    for k, c in enumerate(reg.carry):
        hit = next((d for d in range(len(graph.shape(c))) if groups.group_of.get((c, d)) in batch), None)
        if hit is None:
            raise PartitionError(f"{pipe}: carry leaf {k} of the layer scan, of shape {graph.shape(c)}, has no "
                                 f"batch dim (none in the dim group of {', '.join(wanted)}); the layer scan's "
                                 "carry must be per-example activations")
        out.append(hit)
    return tuple(out)


def _root(x):
    """The tracer (or array) that autodiff tracers wrapping ``x`` stand for."""
    while hasattr(x, "primal"):
        x = x.primal
    return x


@contextlib.contextmanager
def _scan_replaced(plan: _Plan, layer_ids: set, found: list):
    """``jax.lax.scan`` replaced, inside: a call that iterates over one of the stacked inputs (``layer_ids``:
    their tracers' ids) runs the pipelined loop (appended to ``found``), any other the original scan."""
    original = jax.lax.scan

    def scan(f, init, xs=None, length=None, reverse=False, unroll=1, **kw):
        if not any(id(_root(x)) in layer_ids for x in jax.tree.leaves(xs)):
            return original(f, init, xs, length=length, reverse=reverse, unroll=unroll, **kw)
        found.append(True)
        if reverse:
            raise PartitionError("Pipeline: the layer scan runs in reverse (reverse=True), which it cannot pipeline")
        return _pipelined_scan(plan, original, f, init, xs, unroll)

    jax.lax.scan = scan
    try:
        yield
    finally:
        jax.lax.scan = original


def _pipelined_scan(plan: _Plan, scan, f, init, xs, unroll):
    """What ``scan(f, init, xs)`` returns, computed by the pipelined loop of ``plan`` (see the module docstring).
    ``scan``: the original ``jax.lax.scan``."""
    sched = plan.schedule
    S, M, R, K = sched.stages, sched.microbatches, sched.repeats, sched.layers_per_stage
    carry, carry_tree = jax.tree.flatten(init)
    layers, layers_tree = jax.tree.flatten(xs)
    avals = (tuple((tuple(np.shape(c)), str(jnp.result_type(c))) for c in carry),
             tuple((tuple(np.shape(w)), str(jnp.result_type(w))) for w in layers))
    if avals != (plan.carry_avals, plan.xs_avals):
        raise PartitionError(f"Pipeline: the layer scan's carry and stacked operands {avals} are not those traced "
                             f"before {(plan.carry_avals, plan.xs_avals)}")
    bdims = plan.carry_batch_dims
    inputs = [_microbatches(c, d, M) for c, d in zip(carry, bdims)]  # [M, ...B/M...]
    staged = [_stage_layers(w, S, R, K) for w in layers]  # GPipe [S, K, ...]; circular [S, R, K, ...]
    outputs = []  # the structure of the body's per-layer outputs, and the layer operand each passes through

    def layer(c, x):
        """The user's body, its per-layer outputs dropped: each must be one of its layer operands, returned as
        it came (nnx.scan returns the scanned modules' state so)."""
        c, ys = f(c, x)
        ys, tree = jax.tree.flatten(ys)
        mine = jax.tree.leaves(x)
        through = [next((j for j, w in enumerate(mine) if w is y), None) for y in ys]
        if None in through:
            raise PartitionError("Pipeline: the layer scan returns per-layer outputs (ys) computed by its body; a "
                                 "pipelined layer scan may only carry its activations (return (carry, None))")
        outputs.append((tree, through))
        return c, None

    def stage(ws, cs):
        """One stage's K layers on one microbatch."""
        c = jax.tree.unflatten(carry_tree, cs)
        if K == 1:
            c, _ = layer(c, jax.tree.unflatten(layers_tree, [w[0] for w in ws]))
        else:
            c, _ = scan(layer, c, jax.tree.unflatten(layers_tree, ws), unroll=unroll)
        return jax.tree.leaves(c)

    if plan.remat:
        stage = jax.checkpoint(stage)
    index = lax.broadcasted_iota(jnp.int32, (S,), 0)

    def first_stage(x):
        return (index == 0).reshape((S,) + (1,) * (x.ndim - 1))

    def tick(state, _):
        t, shift, buf = state
        stage_in = [jnp.where(first_stage(sh), lax.dynamic_index_in_dim(b, t % M, 1, keepdims=False), sh)
                    for sh, b in zip(shift, buf)]
        ws = staged if R == 1 else [_repeat_of(w, jnp.clip((t - index) // M, 0, R - 1)) for w in staged]
        shift = [permute(o, rotation(S, 1), 0) for o in jax.vmap(stage)(ws, stage_in)]
        done = (t - (S - 1)) % M  # the microbatch the last stage finished, now at stage 0
        kept = [lax.dynamic_index_in_dim(b, done, 1, keepdims=False) for b in buf]
        buf = [lax.dynamic_update_index_in_dim(b, jnp.where(t >= S - 1, sh, k), done, 1)
               for b, sh, k in zip(buf, shift, kept)]
        return (t + 1, shift, buf), None

    buf = [jnp.broadcast_to(x, (S,) + x.shape) for x in inputs]  # [S, M, ...]: microbatches in, results out
    start = (jnp.int32(0), [b[:, 0] for b in buf], buf)
    (_, _, buf), _ = scan(tick, start, None, length=sched.ticks)
    outs = [_merged(jnp.sum(jnp.where(first_stage(b), b, jnp.zeros_like(b)), axis=0), d) for b, d in zip(buf, bdims)]
    tree, through = outputs[0]
    return jax.tree.unflatten(carry_tree, outs), jax.tree.unflatten(tree, [layers[j] for j in through])


def _microbatches(x, d: int, M: int):
    """``x`` with its batch dim ``d`` of ``B`` split into ``M`` microbatches of ``B/M``, stacked first; microbatch
    ``m`` holds examples ``m, m + M, ...`` (a batch split over devices stays split in each)."""
    x = jnp.moveaxis(x, d, 0)
    x = x.reshape((x.shape[0] // M, M) + x.shape[1:])
    return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 1, d + 1)


def _merged(x, d: int):
    """The inverse of :func:`_microbatches`."""
    x = jnp.moveaxis(jnp.moveaxis(x, d + 1, 1), 0, 1)
    return jnp.moveaxis(x.reshape((-1,) + x.shape[2:]), 0, d)


def _stage_layers(w, S: int, R: int, K: int):
    """Stacked layers ``[L, ...]`` as ``[S, K, ...]`` (one repeat: blocks of the layer dim) or, for ``R``
    repeats, ``[S, R, K, ...]`` with ``[s, r, k]`` layer ``(r·S + s)·K + k`` (the circular order, reached by a
    static permutation of the layer dim)."""
    rest = w.shape[1:]
    if R == 1:
        return w.reshape((S, K) + rest)
    order = [(r * S + s) * K + k for s in range(S) for r in range(R) for k in range(K)]
    return permute(w, order, 0).reshape((S, R, K) + rest)


def _repeat_of(w, repeat):
    """Per stage, its layers of repeat ``repeat[s]``: ``[S, R, K, ...]`` → ``[S, K, ...]``."""
    return jax.vmap(lambda ws, r: lax.dynamic_index_in_dim(ws, r, 0, keepdims=False))(w, repeat)
