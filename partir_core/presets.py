"""Presets: the experts' partitioning strategies, found in any training step by analysis of its program.

A preset is a strategy an expert applies by hand (batch parallelism, Megatron, ZeRO, sharded embeddings), made
for a step whatever its parameters are called: it traces the step on example arguments, reads the program
(which inputs the step updates, which dims must share a sharding: :mod:`partir_core.analysis`) and returns
ordinary tactics, a list of :class:`~partir_core.ManualPartition` to print, edit and paste::

    from partir_core import presets
    tactics = presets.megatron("model")(train_step, params, opt_state, x, y)
    tactics = (presets.batch_parallel() + presets.megatron() + presets.zero(3))(train_step, *inputs, mesh=mesh)
    pf = partir_core.jit(train_step, mesh, tactics)
    print("\\n".join(map(str, tactics)))        # ManualPartition({...}, axis='model'), pasteable

A preset is made with its settings (``megatron(axis="model")``) and called as ``preset(step, *args, mesh=None)``:
``args`` are the step's positional arguments (arrays or ``jax.ShapeDtypeStruct``s), as it will be called;
``mesh``, when given, checks the preset's axis and gives its size (2 without one). Presets compose with ``+``
into one that traces the step once and concatenates their tactics in order (earlier tactics win, as in any
schedule); ``preset.tactics(TracedStep(step, args), mesh)`` reuses one trace likewise. A preset that finds
nothing to act on raises :class:`~partir_core.PartitionError` saying so.

What the program tells (kinds: :func:`partir_core.analysis.input_kinds`):

- *parameters*: the floating-point inputs the step updates whose values reach the loss (or another output that
  is no update); *optimizer state*: the other updated inputs (momenta, Adam's ``mu``/``nu``, counters);
  *data*: the inputs the step does not update.
- *stacked layer dims*: the leading dim of an input a ``lax.scan`` iterates over (``flax.linen.scan``, MaxText
  style stacked weights), and every dim that must share its sharding (its momenta's). No preset splits one:
  that would gather every layer before the loop.
- *column and row matmuls*: in the forward computation (what the outputs other than the updates are computed
  from), a ``dot_general`` (or ``conv_general_dilated``) with an operand computed from parameters alone (a
  weight: the parameter, its cast, its slice in a scan body) is a *column* matmul of a dim group
  (:mod:`partir_core.analysis`) that the weight and the result carry but no other operand (the weight's output
  dim: the MLP's hidden dim, the attention heads), and a *row* matmul of a group that it contracts against the
  weight.

The presets:

- :func:`batch_parallel`: the data inputs (or those named) split on their leading dim.
- :func:`megatron`: Megatron-LM's tensor parallelism: every dim group that reaches parameters but no data and
  that column matmuls start and row matmuls end, unless it is a *stream*: a column matmul after its first row
  matmul brings in a new weight, as a residual stream is read by each layer's first matmul and written by its
  last, layer after layer. That is the MLP's hidden dim (the first matmul's output dim, its bias, the second's
  contracting dim) and the attention heads (q/k/v projections' head dim, the output projection's input dim),
  per layer, stacked or not, whatever the weights' layout (``(in, out)`` or ``(out, in)``); a norm over the
  hidden dim is no obstacle (its statistics are all-reduced). Groups are taken in forward order, skipping one
  that shares a weight with a group taken (a chain of three matmuls has two candidate pairs that share the
  middle weight: the first wins). A convolution counts as a matmul: its output channels are a column
  matmul's output dim, its input channels a row matmul's contracting dim.
- :func:`zero`: ZeRO's stages: the optimizer state (stages 1, 2) and the parameters too (stage 3) split on
  their largest dim that the axis divides.
- :func:`embedding`: embedding tables (parameters read by a ``gather`` whose indices are data, as
  ``jnp.take``, ``table[tokens]`` and ``nn.Embed`` read them) on their feature dim; an unembedding (a matmul
  contracting the tables' feature dim into the vocabulary, whose logits no weight contracts) on its
  vocabulary dim, with its bias; a tied table on its vocabulary dim.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import jax
import numpy as np

from redist.errors import shown

from partir_core import ir
from partir_core.analysis import analyze_groups, dependencies, updates
from partir_core.registry import rule_for
from partir_core.tactics import ManualPartition, PartitionError, mesh_axis

__all__ = ["batch_parallel", "megatron", "zero", "embedding", "Preset", "TracedStep"]

MATMULS = ("dot_general", "conv_general_dilated")  # a convolution's channels pair as a matmul's dims do


class Preset:
    """A strategy to find in a step: ``preset(step, *args, mesh=None)`` → tactics; ``a + b`` composes."""

    name: ClassVar[str] = "preset"

    def __call__(self, step, *args, mesh=None) -> list[ManualPartition]:
        return self.tactics(TracedStep(step, args), mesh)

    def tactics(self, traced: TracedStep, mesh) -> list[ManualPartition]:
        raise NotImplementedError

    def __add__(self, other):
        if not isinstance(other, Preset):
            return NotImplemented
        return Composition(_parts(self) + _parts(other))


def _parts(preset: Preset) -> tuple:
    return preset.parts if isinstance(preset, Composition) else (preset,)


@dataclass(frozen=True)
class Composition(Preset):
    """Presets applied in order to one trace of the step; their tactics concatenated."""

    parts: tuple

    def tactics(self, traced, mesh):
        return [t for p in self.parts for t in p.tactics(traced, mesh)]

    def __str__(self):
        return " + ".join(map(str, self.parts))


@dataclass(frozen=True)
class BatchParallel(Preset):
    """See :func:`batch_parallel`."""

    name: ClassVar[str] = "batch_parallel"

    axis: str = "batch"
    inputs: object = None

    def tactics(self, traced, mesh):
        _axis_size(self, mesh)
        if self.inputs is None:
            dims = {p: 0 for p, shape in traced.leaves if traced.kinds[p] == "data" and shape and shape[0] > 1}
            if not dims:
                raise PartitionError(f"batch_parallel found no data input with a leading dim in {traced.name} (data: "
                                     "the inputs it does not update); name them with inputs=")
        else:
            dims = traced.named_inputs(self.inputs)
        return [ManualPartition(dims, axis=self.axis)]

    def __str__(self):
        return f"batch_parallel(axis={self.axis!r}" + (f", inputs={self.inputs!r})" if self.inputs is not None else ")")


@dataclass(frozen=True)
class Megatron(Preset):
    """See :func:`megatron`."""

    name: ClassVar[str] = "megatron"

    axis: str = "model"

    def tactics(self, traced, mesh):
        k = _axis_size(self, mesh)
        chosen = traced.megatron_groups()
        if not chosen:
            raise PartitionError(f"megatron found no column-then-row matmul pair on parameters in {traced.name}")
        dims = traced.param_dims(chosen, lambda p, d, shape: shape[d] % k == 0)
        return [ManualPartition(dims, axis=self.axis)]

    def __str__(self):
        return f"megatron(axis={self.axis!r})"


@dataclass(frozen=True)
class Zero(Preset):
    """See :func:`zero`."""

    name: ClassVar[str] = "zero"

    stage: int = 3
    axis: str = "batch"

    def tactics(self, traced, mesh):
        k = _axis_size(self, mesh)
        params = [p for p, _ in traced.leaves if traced.kinds[p] == "param"]
        state = [p for p, _ in traced.leaves if traced.kinds[p] == "state"]
        if not params and not state:
            raise PartitionError(f"zero found no parameters or optimizer state in {traced.name}: it updates none "
                                 "of its inputs (an output with an input's shape and dtype computed from it)")
        if self.stage == 3:
            return [ManualPartition({**traced.largest_dims(params, k), **traced.largest_dims(state, k)},
                                    axis=self.axis)]
        sharded = traced.largest_dims(state, k)
        if not sharded:
            raise PartitionError(f"zero({self.stage}) found no optimizer state to shard in {traced.name} (state: "
                                 "the inputs it updates whose values do not reach the loss)")
        return [ManualPartition({**{p: None for p in params}, **sharded}, axis=self.axis)]

    def __str__(self):
        return f"zero({self.stage}, axis={self.axis!r})"


@dataclass(frozen=True)
class Embedding(Preset):
    """See :func:`embedding`."""

    name: ClassVar[str] = "embedding"

    axis: str = "model"

    def tactics(self, traced, mesh):
        _axis_size(self, mesh)
        dims = traced.embedding_dims()
        if not dims:
            raise PartitionError(f"embedding found no embedding table (a parameter read by a gather of data "
                                 f"indices) in {traced.name}")
        return [ManualPartition(dims, axis=self.axis)]

    def __str__(self):
        return f"embedding(axis={self.axis!r})"


def batch_parallel(axis: str = "batch", inputs=None) -> Preset:
    """Batch (data) parallelism: inputs split on their leading dim on ``axis``. ``inputs``: None (the data
    inputs, every input the step does not update, integer ones such as tokens and indices included), a path
    pattern or argument number or a list of them (every array leaf of that argument; a pattern as
    :class:`~partir_core.ManualPartition` reads it), or a dict ``{pattern: dim}`` to split other dims."""
    return BatchParallel(axis, inputs)


def megatron(axis: str = "model") -> Preset:
    """Megatron-LM's tensor parallelism on ``axis``: column-then-row matmul pairs (MLP hidden dims, attention
    heads) found in the program (see the module docstring), biases of the column matmuls included; stacked
    layer weights split one dim further in. A dim that the axis does not divide is left whole."""
    return Megatron(axis)


def zero(stage: int = 3, axis: str = "batch") -> Preset:
    """ZeRO (Rajbhandari et al.) on ``axis``: each sharded input on its largest dim that the axis size divides,
    never a stacked layer dim (scalars such as step counters stay whole).

    Stages 1 and 2 shard the optimizer state and pin the parameters whole; they give the same tactics. ZeRO-1
    all-reduces the gradients and updates a shard of the state, ZeRO-2 reduce-scatters the gradients into it;
    here tactics place inputs only, and propagation reduces a gradient straight into the sharded state's
    layout, a reduce-scatter, so both stages partition as ZeRO-2. Stage 3 shards the parameters too; they are
    gathered where they are used."""
    if isinstance(stage, bool) or stage not in (1, 2, 3):
        raise PartitionError(f"zero: stage must be 1, 2 or 3, got {shown(stage)}")
    return Zero(stage, axis)


def embedding(axis: str = "model") -> Preset:
    """Sharded embeddings on ``axis``: tables on their feature dim, unembeddings (and tied tables) on their
    vocabulary dim (see the module docstring)."""
    return Embedding(axis)


def _axis_size(preset, mesh) -> int:
    """The size of the preset's axis on ``mesh`` (2 without a mesh); :class:`PartitionError` for an axis the mesh
    lacks or a malformed one."""
    return 2 if mesh is None else mesh_axis(preset.name, preset.axis, mesh).size


class TracedStep:
    """A step traced on example arguments, and what the presets read off its program (the trace and the
    analyses are made when first needed)."""

    def __init__(self, step, args):
        if not callable(step):
            raise PartitionError(f"a preset needs the step function, got {type(step).__name__} {shown(step)}")
        self.step, self.args = step, tuple(args)
        self.name = getattr(step, "__name__", "step_fn")
        paths, leaves, _ = ir.input_paths(step, self.args)
        for p, x in zip(paths, leaves):
            if not hasattr(x, "shape") and not isinstance(x, (bool, int, float, complex)):
                raise PartitionError(f"input {p!r} is {type(x).__name__} {shown(x)}, not an array; pass a module's "
                                     "arrays only (equinox: params, static = eqx.partition(model, eqx.is_array))")
        self.leaves = [(p, tuple(np.shape(x))) for p, x in zip(paths, leaves)]
        self.arg_of = [kp[0].idx for kp, _ in jax.tree_util.tree_flatten_with_path(self.args)[0]]  # per leaf

    @classmethod
    def of_program(cls, graph, groups, name: str = "step_fn") -> TracedStep:
        """The analyses of a program already traced and grouped (the automatic search's), for what reads the
        program alone (:meth:`megatron_groups`); no step or arguments to name inputs by."""
        self = cls.__new__(cls)
        self.name, self.graph, self.groups = name, graph, groups  # the cached properties, set
        return self

    # ------------------------------------------------------------------------------------------ the program
    @functools.cached_property
    def graph(self):
        return ir.trace(self.step, self.args)

    @functools.cached_property
    def groups(self):
        return analyze_groups(self.graph, [rule_for(e, self.graph) for e in self.graph.eqns])

    @property
    def kinds(self) -> dict:
        return self.groups.kinds

    @functools.cached_property
    def deps(self) -> dict:
        return dependencies(self.graph)

    @functools.cached_property
    def params_mask(self) -> int:
        return sum(1 << i for i, p in enumerate(self.graph.in_paths) if self.kinds[p] == "param")

    @functools.cached_property
    def data_mask(self) -> int:
        return sum(1 << i for i, p in enumerate(self.graph.in_paths) if self.kinds[p] == "data")

    @functools.cached_property
    def forward(self) -> list[int]:
        """The equations the outputs other than the updates are computed from, in order (every equation where
        every output is an update)."""
        g = self.graph
        new = set(updates(g).values())
        wanted = [v for k, v in enumerate(g.outvars) if k not in new]
        if not wanted:
            return list(range(len(g.eqns)))
        producer = {v: i for i, e in enumerate(g.eqns) for v in e.outvars}
        seen, stack = set(), [producer[v] for v in wanted if v in producer]
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                stack += [producer[v] for v in g.eqns[i].invars if v in producer]
        return sorted(seen)

    def is_weight(self, v) -> bool:
        """Whether value ``v`` is computed from parameters alone."""
        d = self.deps.get(v, 0)
        return d != 0 and d & ~self.params_mask == 0

    def is_activation(self, v) -> bool:
        """Whether value ``v`` depends on an input other than the parameters."""
        return self.deps.get(v, 0) & ~self.params_mask != 0

    def group(self, v, d):
        """The id of the dim group of dim ``d`` of value ``v`` (None for a size-1 dim or a constant)."""
        return self.groups.group_of.get((v, d))

    def group_ids(self, values) -> set:
        return {g for v in values for d in range(len(self.graph.shape(v))) if (g := self.group(v, d)) is not None}

    # ------------------------------------------------------------------------------------------ the roles
    @functools.cached_property
    def roles(self) -> tuple[dict, dict]:
        """``(column, row)`` over the forward computation: per group, its column matmuls in order, as
        ``(equation index, the parameters of the weight)`` (a bit mask), and the index of its first row matmul."""
        column: dict = {}
        row: dict = {}
        g = self.graph
        for i in self.forward:
            e = g.eqns[i]
            if e.name not in MATMULS:
                continue
            results = self.group_ids(e.outvars)
            acts = self.group_ids([v for v in e.invars if self.is_activation(v)])
            for w in (v for v in e.invars if self.is_weight(v)):
                for gid in self.group_ids([w]):
                    if gid in results and gid not in acts:
                        column.setdefault(gid, []).append((i, self.deps[w]))
                    elif gid not in results:
                        row.setdefault(gid, i)
        return column, row

    def megatron_groups(self) -> list[int]:
        """The groups Megatron splits (see the module docstring), in forward order, skipping one that shares a
        weight with a group taken."""
        column, row = self.roles
        taken, chosen = set(), []
        for gid in sorted(column, key=lambda gid: column[gid][0][0]):
            g = self.groups.groups[gid]
            kinds = {self.kinds[p] for p, _ in g.inputs}
            params = {p for p, _ in g.inputs if self.kinds[p] == "param"}
            if (gid in row and not self.is_stream(column[gid], row[gid]) and "param" in kinds
                    and "data" not in kinds and not params & taken):
                chosen.append(gid)
                taken |= params
        return chosen

    @staticmethod
    def is_stream(columns, first_row) -> bool:
        """Whether a group is a stream through the network rather than a pair's inner dim: a column matmul after
        its first row matmul brings in a weight that none before did (a residual stream, read by a layer's
        first matmul and written by its last, layer after layer; a layer reused, as in ALBERT, is no stream)."""
        before = 0
        for i, weights in columns:
            if i < first_row:
                before |= weights
            elif weights & ~before:
                return True
        return False

    def param_dims(self, gids, keep) -> dict:
        """``{path: dim}`` of the parameter dims in groups ``gids`` for which ``keep(path, dim, shape)``, in
        input order (one dim per input: its first)."""
        wanted = set(gids)
        dims = {}
        for p, v in zip(self.graph.in_paths, self.graph.invars):
            if self.kinds[p] != "param":
                continue
            shape = self.graph.shape(v)
            for d in range(len(shape)):
                if self.group(v, d) in wanted and keep(p, d, shape):
                    dims[p] = d
                    break
        return dims

    @functools.cached_property
    def layer_groups(self) -> set:
        """The groups of the dims a scan iterates over (a stacked weight's layer dim)."""
        out = set()
        for e in self.graph.eqns:
            if ir.is_enter(e) and self.graph.regions[e.params["region"]].kind == "scan":
                out |= {self.group(e.invars[i], 0) for i, _, stacked in e.params["ties"] if stacked} - {None}
        return out

    def largest_dims(self, paths, k: int) -> dict:
        """``{path: dim}``: each input's largest dim that ``k`` divides (the first of equals), no stacked layer
        dim; inputs without one are left out."""
        value = dict(zip(self.graph.in_paths, self.graph.invars))
        dims = {}
        for p in paths:
            v = value[p]
            shape = self.graph.shape(v)
            ok = [d for d in range(len(shape)) if shape[d] % k == 0 and shape[d] >= k
                  and self.group(v, d) not in self.layer_groups]
            if ok:
                dims[p] = max(ok, key=lambda d: shape[d])
        return dims

    def origin(self, v) -> str | None:
        """The parameter a weight value is computed from, if it is one alone."""
        d = self.deps.get(v, 0)
        if not self.is_weight(v) or d & (d - 1):
            return None
        return self.graph.in_paths[d.bit_length() - 1]

    def input_dim(self, v, d, path) -> int | None:
        """The dim of input ``path`` in the group of dim ``d`` of value ``v``."""
        gid = self.group(v, d)
        if gid is None:
            return None
        return next((dd for p, dd in self.groups.groups[gid].inputs if p == path), None)

    def embedding_dims(self) -> dict:
        """``{path: dim}`` of :func:`embedding` (see the module docstring), in input order."""
        g = self.graph
        tables: dict = {}  # path -> (feature dim, the feature dim's group, vocabulary size)
        for i in self.forward:
            e = g.eqns[i]
            if e.name != "gather":
                continue
            table, indices = e.invars[0], e.invars[1]
            p = self.origin(table)
            if p is None or not self.deps.get(indices, 0) or self.deps[indices] & ~self.data_mask:
                continue
            shape = g.shape(table)
            indexed = set(e.params["dimension_numbers"].start_index_map)
            features = [d for d in range(len(shape)) if d not in indexed and shape[d] > 1]
            vocab = [d for d in indexed if shape[d] > 1]
            if features and len(vocab) == 1:
                f = max(features, key=lambda d: shape[d])
                fd = self.input_dim(table, f, p)
                if fd is not None:
                    tables.setdefault(p, (fd, self.group(table, f), shape[vocab[0]]))
        dims = {p: fd for p, (fd, _, _) in tables.items()}
        for gid in self.unembedding_groups({gid: n for _, gid, n in tables.values()}):
            dims.update(self.param_dims([gid], lambda p, d, shape: True))
        order = {p: i for i, p in enumerate(g.in_paths)}
        return dict(sorted(dims.items(), key=lambda pd: order[pd[0]]))

    def unembedding_groups(self, vocabularies: dict) -> list[int]:
        """The groups of the unembeddings' vocabulary dims: of every forward matmul that contracts a table's
        feature group (``vocabularies``: feature group → vocabulary size) against a weight, the weight's free
        dims of the vocabulary's size that no weight contracts after."""
        g = self.graph
        row = self.roles[1]
        out = []
        for i in self.forward:
            e = g.eqns[i]
            if e.name != "dot_general":
                continue
            (lc, rc), (lb, rb) = e.params["dimension_numbers"]
            for w, contracting, batch in ((e.invars[0], lc, lb), (e.invars[1], rc, rb)):
                if not self.is_weight(w):
                    continue
                sizes = {vocabularies[gid] for d in contracting if (gid := self.group(w, d)) in vocabularies}
                for d, n in enumerate(g.shape(w)):
                    gid = self.group(w, d)
                    if d not in contracting and d not in batch and n in sizes and gid not in row and gid not in out:
                        out.append(gid)
        return out

    # ------------------------------------------------------------------------------------------ named inputs
    def named_inputs(self, inputs) -> dict:
        """``{pattern: dim}`` of :func:`batch_parallel`'s ``inputs`` (see there)."""
        if isinstance(inputs, dict):
            return dict(inputs)
        dims = {}
        for item in inputs if isinstance(inputs, (list, tuple)) else [inputs]:
            if isinstance(item, str):
                dims[item] = 0
            elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item < len(self.args):
                dims.update({p: 0 for (p, shape), a in zip(self.leaves, self.arg_of) if a == item and shape})
            else:
                raise PartitionError(f"batch_parallel: inputs must be path patterns or argument numbers (0 to "
                                     f"{len(self.args) - 1}) or a dict {{pattern: dim}}, got {shown(item)}")
        return dims
