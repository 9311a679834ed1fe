"""Expert partitioning strategies as named presets: functions of a model's inputs returning tactics.

Every preset is ``preset(model, inputs, batch_axis="batch", model_axis="model", mesh=None)`` → a list of
:class:`~partir_core.ManualPartition`, where ``model`` is a :class:`partir_core.models.Model` (its
``batch_inputs`` name the data inputs) and ``inputs`` its example inputs (``(params, momentum, *data)``; the
parameter tree names the weights). Paths follow the step's parameter names: ``params/...``,
``momentum/...``.

- ``BP``: batch parallelism: the data inputs' batch dim on the batch axis.
- ``MP``: Megatron: attention ``wq/wk/wv`` and MLP ``w1``/``b1`` column-split (dim 1 / dim 0), ``wo`` and
  ``w2`` row-split (dim 0), on the model axis; heads follow through the reshape. A stacked weight (the
  model's ``stacked`` paths, scanned over) is split the same way, one dim further in: inside the scan body,
  every layer's slice is Megatron-split.
- ``Z2``: ZeRO-2: the optimizer state (momentum) sharded on the batch axis, parameters pinned whole; the
  gradients are then reduce-scattered into the update.
- ``Z3``: ZeRO-3: parameters and optimizer state sharded on the batch axis (gathered before use); never on
  a stacked layer dim (that would gather every layer before the scan).
- ``EMB``: the embedding table on the model dim (dim 1) and the unembedding on the vocabulary (dim 1).

Compositions are ``"+"``-joined names, applied left to right: ``schedule("BP+MP+Z3", model, inputs)``.
"""

from __future__ import annotations

import jax
import numpy as np

from redist.errors import shown

from partir_core.ir import input_paths
from partir_core.tactics import ManualPartition, PartitionError, mesh_axis

COLUMN = {"wq": 1, "wk": 1, "wv": 1, "w1": 1, "b1": 0}
ROW = {"wo": 0, "w2": 0}


def _leaves(model, inputs, prefix):
    """``(path, shape)`` of the inputs under ``prefix``. Raises :class:`PartitionError` for a leaf that is not an
    array (a module passed whole, with its functions and settings as leaves)."""
    paths, leaves, _ = input_paths(model.step, inputs)
    out = []
    for p, x in zip(paths, leaves):
        if not p.startswith(prefix + "/"):
            continue
        if not hasattr(x, "shape") and not isinstance(x, (bool, int, float, complex)):
            raise PartitionError(f"input {p!r} is {type(x).__name__} {shown(x)}, not an array; pass a module's "
                                 "arrays only (equinox: params, static = eqx.partition(model, eqx.is_array))")
        out.append((p, np.shape(x)))
    return out


def _stacked(model, path) -> int:
    """1 if input ``path`` is a stacked weight of ``model`` (its dim 0 the layer), else 0."""
    return int(getattr(model, "is_stacked", lambda p: False)(path))


def _axis_size(mesh, axis, default=2):
    """The size of mesh axis or sub-axis ``axis`` (``default`` without a mesh)."""
    return default if mesh is None else mesh_axis("schedule", axis, mesh).size


def BP(model, inputs, batch_axis="batch", model_axis="model", mesh=None):
    return [ManualPartition(dict(model.batch_inputs), axis=batch_axis)]


def MP(model, inputs, batch_axis="batch", model_axis="model", mesh=None):
    dims = {}
    k = _axis_size(mesh, model_axis)
    for p, shape in _leaves(model, inputs, "params"):
        leaf = p.rsplit("/", 1)[-1]
        d = COLUMN.get(leaf, ROW.get(leaf))
        if d is not None:
            d += _stacked(model, p)
        if d is not None and d < len(shape) and shape[d] % k == 0:
            dims[p] = d
    return [ManualPartition(dims, axis=model_axis)]


def _zero_dims(model, inputs, prefix, k):
    """Per leaf: its largest dim divisible by the axis size, a stacked layer dim excepted (leaves with none are
    left replicated)."""
    dims = {}
    for p, shape in _leaves(model, inputs, prefix):
        ok = [d for d in range(_stacked(model, p), len(shape)) if shape[d] % k == 0 and shape[d] >= k]
        if ok:
            dims[p] = max(ok, key=lambda d: shape[d])
    return dims


def Z2(model, inputs, batch_axis="batch", model_axis="model", mesh=None):
    k = _axis_size(mesh, batch_axis)
    pin = {p: None for p, _ in _leaves(model, inputs, "params")}
    return [ManualPartition({**pin, **_zero_dims(model, inputs, "momentum", k)}, axis=batch_axis)]


def Z3(model, inputs, batch_axis="batch", model_axis="model", mesh=None):
    k = _axis_size(mesh, batch_axis)
    return [ManualPartition({**_zero_dims(model, inputs, "params", k),
                             **_zero_dims(model, inputs, "momentum", k)}, axis=batch_axis)]


def EMB(model, inputs, batch_axis="batch", model_axis="model", mesh=None):
    names = {p for p, _ in _leaves(model, inputs, "params")}
    dims = {p: d for p, d in (("params/embed", 1), ("params/unembed", 1)) if p in names}
    if not dims:
        raise PartitionError(f"EMB needs params/embed or params/unembed; model {model.name!r} has neither")
    return [ManualPartition(dims, axis=model_axis)]


PRESETS = {"BP": BP, "MP": MP, "Z2": Z2, "Z3": Z3, "EMB": EMB}


def schedule(name: str, model, inputs, batch_axis="batch", model_axis="model", mesh=None):
    """The tactics of a preset or ``"+"``-composition of presets (``"BP+MP+Z3"``), in order. Raises
    :class:`PartitionError` for an unknown name, or an axis that ``mesh`` (when given) lacks."""
    if not isinstance(name, str):
        raise PartitionError(f"a schedule name is a string like 'BP+MP', got {type(name).__name__} {shown(name)}")
    out = []
    for part in name.split("+"):
        if part not in PRESETS:
            raise PartitionError(f"unknown schedule {part!r} in {name!r}; presets: {', '.join(PRESETS)}")
        out += PRESETS[part](model, inputs, batch_axis=batch_axis, model_axis=model_axis, mesh=mesh)
    return out
