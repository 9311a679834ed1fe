"""Tactics: the steps of a partitioning schedule, each incremental on the result of those before it.

``ManualPartition({path: dim, ...}, axis="model")`` shards dim ``dim`` of every input whose path matches
``path`` (``fnmatch`` wildcards: ``"params/*/w1"``) on mesh axis ``axis``, then propagates to a fixed point.
A dim already split by an earlier tactic is split further (``axis`` appended at the minor end). ``dim=None``
*pins* the matched inputs: propagation will never change their sharding (they stay as they are, usually
replicated), which is how ZeRO-2 keeps parameters whole while sharding the optimizer state.

Sub-axes. ``axis`` may name a sub-axis in redist's (Shardy's) token syntax, ``"model:(2)2"``: factor 2 of
mesh axis ``model`` after the factor 2 (on ``model=4``, the minor half; ``"model:(1)2"`` is the major one).
A sub-axis is a mesh axis like any other for the tactics after it and for propagation, with one rule: axes
that *overlap* (name a common factor of one mesh axis: an axis and its sub-axes, ``model:(1)4`` and
``model:(2)2`` on ``model=8``) split one value, or one op, at most once, as one axis does; sub-axes that do
not overlap may split two dims of one value, or two factors of one op, or one dim in either order
(``8{batch,model:(1)2}``, with ``model:(2)2`` on another dim). So a batch split on ``batch`` and
``model:(1)2`` beside an MLP split on ``model:(2)2`` runs Megatron on half of the model axis and data
parallelism on the rest. Types name the sub-axes (``f32[8{batch,model:(1)2}, 16]``), and where one dim holds
adjacent halves they merge (``model:(1)2, model:(2)2`` is ``model``). The reshards between such types are
redist's plans, and the program runs on the mesh refined at the sub-axes' boundaries (the same devices in the
same order; :mod:`partir_core.reshard`).

Errors (:class:`PartitionError`, a ``ShardingError``/``ValueError``) are raised before anything runs: arguments of
the wrong kind when a tactic is made (dims not a dict, a time budget that is not a positive number), an unknown
axis when the schedule meets the mesh (:func:`check_schedule`), a path matching no input or a dim out of range
by :meth:`validate`. An axis is named in the user's terms (the token, its mesh axis and that axis's size, for a
malformed token, an unknown axis or a sub-axis that does not divide its axis; for an unknown axis, the mesh's axes
and the nearest of them), a path that matches nothing by the input paths nearest to it (:func:`nearest_inputs`).
A dim need not divide by the axis size: it is then split by XLA's padding rule (ceil-sized blocks, padded local
buffers; docs/spec.md §2), and ops that reduce over it count its data only. ``AutomaticPartition`` searches for
the tactics (see :mod:`partir_core.automatic`).
"""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass, field

import jax

from redist.axes import Axis, read_token
from redist.errors import ShardingError, shown
from redist.mesh import Mesh

from partir_core.factors import overlap
from partir_core.ir import Graph
from partir_core.propagation import Conflict, State
from partir_core.simulator import hardware_profile


class PartitionError(ShardingError):
    """A schedule that cannot apply to this function: names the path, dim or axis at fault."""


@dataclass
class ManualPartition:
    """Shard input dims on one mesh axis: ``ManualPartition({"params/*/w1": 1, "x": 0}, axis="model")``."""

    dims: dict
    axis: str = "model"

    def __post_init__(self):
        self.check_arguments()

    def check_arguments(self) -> None:
        """Raise :class:`PartitionError` unless ``dims`` maps path patterns to dims (ints, or None to pin) and
        ``axis`` is a name."""
        if not isinstance(self.dims, dict):
            raise PartitionError(f"ManualPartition: dims must be a dict {{path: dim}} like {{'x': 0}}, got "
                                 f"{type(self.dims).__name__} {shown(self.dims)}")
        for path, dim in self.dims.items():
            if not isinstance(path, str):
                raise PartitionError(f"ManualPartition: path {shown(path)} must be a string like 'params/w1'")
            if dim is not None and (isinstance(dim, bool) or not isinstance(dim, numbers.Integral)):
                raise PartitionError(f"ManualPartition: the dim of path {path!r} must be an int (or None to pin "
                                     f"the input), got {type(dim).__name__} {shown(dim)}")
        if not isinstance(self.axis, str):
            raise PartitionError(f"ManualPartition: axis must be a mesh axis name, got {shown(self.axis)} (a "
                                 "sub-axis is written NAME:(PRE)SIZE, like 'model:(2)2')")

    def check_mesh(self, mesh) -> None:
        mesh_axis("ManualPartition", self.axis, mesh)

    def matches(self, graph: Graph) -> list[tuple[str, int, int | None]]:
        """``(path, value, dim)`` for every input each path pattern names (dims normalised)."""
        out = []
        for pattern, dim in self.dims.items():
            hits = graph.inputs_matching(pattern)
            if not hits:
                raise PartitionError(f"ManualPartition: path {pattern!r} matches no input; "
                                     f"{nearest_inputs(pattern, graph.in_paths)}")
            for p, v in hits:
                if dim is None:
                    out.append((p, v, None))
                    continue
                rank = len(graph.shape(v))
                if not -rank <= dim < rank:
                    raise PartitionError(f"ManualPartition: dim {dim!r} is out of range for input {p!r} of shape "
                                         f"{graph.shape(v)} (path {pattern!r})")
                out.append((p, v, int(dim) % rank))
        return out

    def validate(self, graph: Graph, mesh) -> None:
        self.check_arguments()
        self.check_mesh(mesh)
        self.matches(graph)

    def apply(self, graph: Graph, state: State, mesh, index: int) -> None:
        """Record this tactic's decisions in ``state`` (propagation is the caller's). A dim already split on
        the axis is left as it is; an input that is pinned, or that another axis overlapping this one already
        splits (on any dim), is left as it is and the conflict recorded."""
        axis = mesh_axis("ManualPartition", self.axis, mesh)
        for p, v, d in self.matches(graph):
            if d is None:
                state.pinned.add(v)
                continue
            cur = state.dims[v][d]
            if axis in cur:
                continue
            used = [(j, a) for j, ax in enumerate(state.dims[v]) for a in ax if overlap(mesh, a, axis)]
            if v in state.pinned or used:
                if v in state.pinned:
                    why = "the input is pinned"
                else:
                    j, a = used[0]
                    where = "this dim" if j == d else f"dim {j}"
                    why = (f"axis {axis!r} already splits {where}" if a == axis
                           else f"axis {axis!r} overlaps axis {a!r}, which already splits {where}")
                state.conflicts.append(Conflict(index, -1, "input " + p, f"dim {d}",
                                                ((v, d, (axis,), index),), tuple(cur), why))
                continue
            state.set_dim(v, d, tuple(cur) + (axis,), index)

    def __str__(self):
        return f"ManualPartition({self.dims!r}, axis={self.axis!r})"


@dataclass
class AutomaticPartition:
    """Search for shardings on ``axes`` that fit ``memory_budget_bytes`` and minimise simulated step time:
    Monte Carlo tree search over "shard dimension group g on axis a" (:mod:`partir_core.automatic`),
    starting from the tactics before it, which it leaves intact (propagation never overrides them).

    ``axes``: the mesh axes or sub-axes it may use (empty: every mesh axis). ``sub_axes``: also the two
    halves of each of those axes of size >= 4 (``model:(1)2``, ``model:(2)2``;
    :func:`partir_core.automatic.actions.search_axes`): off by default, as more axes spread a small budget of
    evaluations thinner. ``memory_budget_bytes``: per-device simulated peak
    (None: no limit). ``time_budget_s``: wall-clock limit of the lowering with it (``pf.lower``, or the first
    call, when this is the schedule's one search: tracing, the search, the pipelines tried around it and the
    lowering of the result; a search among several has it from its own start): the search starts no evaluation
    it expects to end past its share of the limit (as long as the slowest of its last 32), so the lowering ends
    by then unless an evaluation is slower than those. ``seed``: tie-breaking; the search
    is deterministic for a seed when it stops by ``max_evals``, ``patience`` or exhaustion rather than by
    time. ``hardware``: the simulator profile (None: the default). ``progress``: a progress bar on stderr
    (None: when stderr is a terminal). The result (``Partitioned.automatic``) lists the chosen actions as
    :class:`ManualPartition` tactics that reproduce the program when pasted in its place. This record is the
    search's configuration; :func:`partir_core.automatic.search` runs it (``partir_core.jit`` does, in schedule
    order)."""

    axes: list = field(default_factory=list)
    memory_budget_bytes: int | None = None
    time_budget_s: float = 60
    seed: int = 0
    hardware: object = None
    max_evals: int | None = None
    patience: int | None = None
    max_depth: int | None = None
    exploration: float = 0.7
    progress: bool | None = None
    sub_axes: bool = False

    def __post_init__(self):
        self.check_arguments()

    def check_arguments(self) -> None:
        """Raise :class:`PartitionError` naming the first argument of the wrong kind or out of range."""
        def fail(name, expected):
            raise PartitionError(f"AutomaticPartition: {name} must be {expected}, got {shown(getattr(self, name))}")

        if isinstance(self.axes, str) or not isinstance(self.axes, (list, tuple)) or not all(
                isinstance(a, str) for a in self.axes):
            fail("axes", "a list of mesh axis names like ['batch']")
        if self.memory_budget_bytes is not None and not (_finite(self.memory_budget_bytes)
                                                         and self.memory_budget_bytes > 0):
            fail("memory_budget_bytes", "a finite number of bytes > 0, or None for no limit")
        if not (_finite(self.time_budget_s) and self.time_budget_s > 0):
            fail("time_budget_s", "a finite number of seconds > 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            fail("seed", "an int")
        for name in ("max_evals", "patience", "max_depth"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
                fail(name, "an int >= 1, or None")
        if not (_finite(self.exploration) and self.exploration >= 0):
            fail("exploration", "a finite number >= 0")
        if self.progress is not None and not isinstance(self.progress, bool):
            fail("progress", "True, False or None")
        if not isinstance(self.sub_axes, bool):
            fail("sub_axes", "True or False")
        try:
            hardware_profile(self.hardware)
        except ShardingError as e:
            raise PartitionError(f"AutomaticPartition: {e}") from None

    def check_mesh(self, mesh) -> None:
        for a in self.axes:
            mesh_axis("AutomaticPartition", a, mesh)

    def validate(self, graph: Graph, mesh) -> None:
        self.check_arguments()
        self.check_mesh(mesh)

    def __str__(self):
        budget = f", memory_budget_bytes={self.memory_budget_bytes}" if self.memory_budget_bytes else ""
        halves = ", sub_axes=True" if self.sub_axes else ""
        return (f"AutomaticPartition(axes={self.axes!r}{budget}{halves}, time_budget_s={self.time_budget_s}, "
                f"seed={self.seed})")


def mesh_axis(tactic: str, token: str, mesh) -> Axis:
    """The axis of ``mesh`` (a :class:`redist.Mesh`, or a ``jax.sharding.Mesh`` or ``AbstractMesh`` as
    :func:`partir_core.jit` takes them: its axes, in its order) that ``token`` names: a mesh axis, or a sub-axis
    ``NAME:(PRE)SIZE`` of one. Raises :class:`PartitionError` naming the ``tactic`` and the token: for a sub-axis
    that does not fit, also its mesh axis and that axis's size; for an unknown axis, the mesh's axes; for text
    that is no axis, the syntax."""
    if isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
        mesh = Mesh(tuple(zip(mesh.axis_names, mesh.axis_sizes)))
    parts = read_token(token) if isinstance(token, str) else None
    if parts is None:
        raise PartitionError(f"{tactic}: cannot read axis {shown(token)}; expected a mesh axis name "
                             f"({', '.join(mesh.names)}) or a sub-axis NAME:(PRE)SIZE with PRE and SIZE in digits "
                             "0-9, like 'model:(2)2'")
    name, pre, size = parts
    if name not in mesh.names:
        which = "mesh axis" if pre is None else f"mesh axis {name!r} in sub-axis"
        close = difflib.get_close_matches(name, mesh.names, n=1)
        raise PartitionError(f"{tactic}: unknown {which} {shown(token) if pre is not None else repr(name)}; the "
                             f"mesh has axes {', '.join(mesh.names) or '(none)'}"
                             + (f"; did you mean {close[0]!r}?" if close else ""))
    try:
        return mesh.axis(token)
    except ShardingError:
        full = mesh.axis_size(name)
        raise PartitionError(f"{tactic}: sub-axis {token!r} does not fit mesh axis {name!r} of size {full}: a "
                             f"sub-axis {name}:(PRE)SIZE needs SIZE >= 2 and PRE·SIZE dividing {full}") from None


def nearest_inputs(path: str, paths: list[str], n: int = 4) -> str:
    """What to tell a user whose ``path`` names no input: the ``n`` input paths nearest to it
    (``difflib.get_close_matches``), or, where none is near, the first of them."""
    close = difflib.get_close_matches(path, paths, n=n)
    if close:
        return (f"the nearest input paths are {', '.join(close)} (of {len(paths)}; partir_core.input_paths(fn, "
                "*args) lists them all)")
    return "inputs are " + ", ".join(paths[:12]) + (f", … ({len(paths)} in all)" if len(paths) > 12 else "")


def _finite(x) -> bool:
    """A finite real number (not a bool, not NaN)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def check_schedule(schedule, mesh, tactics: tuple) -> list:
    """``schedule`` as a list of tactics (instances of the classes ``tactics``: :class:`ManualPartition`,
    :class:`AutomaticPartition` and :class:`partir_core.Pipeline`, whose module builds on this one) whose axes
    are on ``mesh``; :class:`PartitionError` for anything else (a single tactic, a preset's name, None, or an
    element that is not a tactic)."""
    if isinstance(schedule, tactics):
        raise PartitionError(f"a schedule is a list of tactics; put the single tactic in a list: [{schedule}]")
    if isinstance(schedule, str):
        raise PartitionError(f"a schedule is a list of tactics, got the string {schedule!r}; preset strategies are "
                             "built by partir_core.schedules.schedule(name, model, inputs)")
    if not isinstance(schedule, (list, tuple)):
        raise PartitionError(f"a schedule is a list of tactics (ManualPartition, AutomaticPartition, Pipeline), got "
                             f"{type(schedule).__name__} {shown(schedule)}")
    for k, tactic in enumerate(schedule):
        if not isinstance(tactic, tactics):
            raise PartitionError(f"schedule entry {k} is {type(tactic).__name__} {shown(tactic)}, not a tactic "
                                 "(ManualPartition, AutomaticPartition or Pipeline)")
        tactic.check_mesh(mesh)
    return list(schedule)
