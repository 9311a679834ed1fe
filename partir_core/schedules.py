"""Named schedules: the presets of :mod:`partir_core.presets` by short names, composed with ``+``.

``schedule(name, step, inputs, batch_axis="batch", model_axis="model", mesh=None)`` → a list of
:class:`~partir_core.ManualPartition`: ``name`` is a preset's name or a ``"+"``-composition of them, applied
left to right (``"BP+MP+Z3"``); ``step`` a training step function, or a :class:`partir_core.models.Model`;
``inputs`` the step's example arguments (a tuple); ``mesh`` (optional) checks the axes and gives their sizes.

- ``BP``: batch parallelism on ``batch_axis`` (:func:`~partir_core.presets.batch_parallel`); for a ``Model``,
  its ``batch_inputs``.
- ``MP``: Megatron on ``model_axis`` (:func:`~partir_core.presets.megatron`).
- ``Z1``, ``Z2``, ``Z3``: ZeRO's stages on ``batch_axis`` (:func:`~partir_core.presets.zero`; stages 1 and 2
  give the same tactics).
- ``EMB``: sharded embeddings on ``model_axis`` (:func:`~partir_core.presets.embedding`).

:data:`PRESETS` maps each name to ``f(step, inputs, batch_axis=, model_axis=, mesh=)``, its schedule alone,
also bound to the name itself (``schedules.BP(step, inputs, batch_axis="model")``).
"""

from __future__ import annotations

import functools

from redist.errors import shown

from partir_core import presets
from partir_core.models import Model
from partir_core.tactics import PartitionError, mesh_axis

__all__ = ["schedule", "preset", "PRESETS", "NAMES", "BP", "MP", "Z1", "Z2", "Z3", "EMB"]

NAMES = ("BP", "MP", "Z1", "Z2", "Z3", "EMB")


def preset(name: str, batch_axis: str = "batch", model_axis: str = "model", batch_inputs=None) -> presets.Preset:
    """The preset a name stands for, on those axes (``batch_inputs``: ``BP``'s ``inputs``)."""
    if name == "BP":
        return presets.batch_parallel(batch_axis, inputs=batch_inputs)
    if name == "MP":
        return presets.megatron(model_axis)
    if name in ("Z1", "Z2", "Z3"):
        return presets.zero(int(name[1]), batch_axis)
    if name == "EMB":
        return presets.embedding(model_axis)
    raise PartitionError(f"unknown schedule {name!r}; presets: {', '.join(NAMES)}")


def schedule(name: str, step, inputs, batch_axis="batch", model_axis="model", mesh=None):
    """The tactics of a preset or ``"+"``-composition of presets (``"BP+MP+Z3"``), in order, for ``step`` (a
    function or a :class:`~partir_core.models.Model`) called on ``inputs``. Raises :class:`PartitionError` for
    an unknown name, an axis that ``mesh`` (when given) lacks, or a preset that finds nothing to act on."""
    if not isinstance(name, str):
        raise PartitionError(f"a schedule name is a string like 'BP+MP', got {type(name).__name__} {shown(name)}")
    unknown = [part for part in name.split("+") if part not in NAMES]
    if unknown:
        raise PartitionError(f"unknown schedule {unknown[0]!r} in {name!r}; presets: {', '.join(NAMES)}")
    if mesh is not None:
        for part in name.split("+"):
            mesh_axis("schedule", model_axis if part in ("MP", "EMB") else batch_axis, mesh)
    batch_inputs = step.batch_inputs if isinstance(step, Model) else None
    fn = step.step if isinstance(step, Model) else step
    parts = [preset(part, batch_axis, model_axis, batch_inputs) for part in name.split("+")]
    return functools.reduce(lambda a, b: a + b, parts)(fn, *inputs, mesh=mesh)


PRESETS = {name: functools.partial(schedule, name) for name in NAMES}
BP, MP, Z1, Z2, Z3, EMB = (PRESETS[name] for name in NAMES)
