"""Plans as files: the JSON form of a :class:`~redist.plan.Plan`, and the reader that checks it.

A plan can be synthesized once, written with ``plan.to_json()`` (or ``redist plan ... --json``), checked in,
reviewed, and read back with :meth:`Plan.from_json` to be verified (``redist verify --plan FILE``) or run.
The file for ``f32[8{x}, 4] -> f32[8, 4{x}]`` on ``x=2``::

    {"format": "redist.plan/1", "mesh": "x=2", "src": "f32[8{x}, 4]", "dst": "f32[8, 4{x}]",
     "steps": [{"kind": "all_to_all", "args": {"moves": [[0, 1, ["x"]]]},
                "step": "all_to_all(dim 0 -> dim 1, {x})", "type": "f32[8, 4{x}]", "bytes_received": 32}],
     "peak_bytes": 64, "bytes_received": 32, "memory_bound_bytes": 64, "lower_bound_bytes": 32}

What the reader builds from: ``mesh`` (``Mesh.parse``), ``src`` (``ShardingType.parse`` on it), ``dst_mesh``
(only in the file of a plan whose destination is on another mesh: another device order, or other devices or
axes after a transfer; ``dst`` is read on it) and each step's ``kind`` and ``args``, through the public step
classes of :mod:`redist.steps`:

    =================================  ===========================================================
    kind                               args
    =================================  ===========================================================
    all_slice, all_gather              ``dim`` (int), ``axes`` (axis tokens, major → minor)
    reduce_scatter                     ``dim``, ``axes``, ``reduction`` (sum, max, min or prod)
    all_reduce                         ``axes``, ``reduction``
    replicate_to_partial               ``axes`` (the pending sums it creates)
    shard_to_partial                   ``dim``, ``axes`` (the minor end of ``dim``, made pending sums)
    all_to_all                         ``moves``: ``[src_dim, dst_dim, axes]`` per move; one move is
                                       :class:`~redist.steps.AllToAll`, several a
                                       :class:`~redist.steps.MultiAllToAll`
    permute, exchange                  ``dims``: the axes of every dim after the step; ``device_ids``:
                                       the device order after it (null: unchanged)
    pad                                (none)
    unpad                              ``shape``: the array's shape after the step
    select_to_partial                  ``dims``: the axes of every dim after the step; ``axes``: the
                                       pending sums it creates
    transfer                           ``mesh``: the mesh the array moves to (its text, ``Mesh.parse``);
                                       ``dims`` and ``partial``: its axes there
    =================================  ===========================================================

Each step goes through its typing rule from the type before it (``steps[i].apply(types[i])``), so a step
that does not fit is refused, and the steps are then checked as every plan's are (:class:`~redist.plan.Plan`:
a redistribution of the source, its collectives on one device order). Every other field is derived and optional; where present it must agree with
what the steps give: a step's ``step`` (its text), ``type`` (the type after it) and ``bytes_received``; the
plan's ``dst`` (required: the type the steps must end at), ``peak_bytes``, ``bytes_received``,
``memory_bound_bytes`` (``max(src, dst)`` local bytes) and ``lower_bound_bytes``
(:func:`redist.lower_bound_bytes`). A file that is not such JSON, lacks a field, has one this format does not
know, or disagrees with its own steps raises :class:`~redist.errors.ShardingError` naming the field (with the
step's index), and nothing is returned. The reader does not prove the plan: :func:`redist.verify` does that.

This module knows a plan as its steps and types only, and imports nothing of :mod:`redist.plan`: the plan
writes its file through :data:`FORMAT` and :func:`step_args` (:meth:`~redist.plan.Plan.to_dict`), and reads
one by building itself from what :func:`parse` reads and handing its own figures to
:meth:`PlanFile.check_figures` (:meth:`~redist.plan.Plan.from_json`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from redist import steps as S
from redist.errors import ShardingError, shown
from redist.mesh import Mesh
from redist.types import REDUCTIONS, ShardingType

FORMAT = "redist.plan/1"
_PLAN_FIELDS = {"format", "mesh", "src", "dst", "steps"}
_PLAN_FIGURES = ("peak_bytes", "bytes_received", "memory_bound_bytes", "lower_bound_bytes")
_PLAN_OPTIONAL = ("dst_mesh",) + _PLAN_FIGURES
_STEP_FIELDS = {"kind", "args"}
_STEP_DERIVED = ("step", "type", "bytes_received")


# ---------------------------------------------------------------------------------------------- writing
def step_args(step) -> dict[str, Any]:
    """The ``args`` a step is rebuilt from (table in the module docstring), as JSON values."""
    match step:
        case S.AllSlice() | S.AllGather():
            return {"dim": step.dim, "axes": _tokens(step.axes)}
        case S.ReduceScatter():
            return {"dim": step.dim, "axes": _tokens(step.axes), "reduction": step.reduction}
        case S.AllReduce():
            return {"axes": _tokens(step.axes), "reduction": step.reduction}
        case S.ReplicateToPartial():
            return {"axes": _tokens(step.axes)}
        case S.ShardToPartial():
            return {"dim": step.dim, "axes": _tokens(step.axes)}
        case S.AllToAll():
            return {"moves": [[step.src_dim, step.dst_dim, _tokens(step.axes)]]}
        case S.MultiAllToAll():
            return {"moves": [[i, j, _tokens(axes)] for i, j, axes in step.moves]}
        case S.Permute() | S.Exchange():
            ids = None if step.device_ids is None else list(step.device_ids)
            return {"dims": [_tokens(d) for d in step.dims], "device_ids": ids}
        case S.Pad():
            return {}
        case S.Unpad():
            return {"shape": list(step.shape)}
        case S.SelectToPartial():
            return {"dims": [_tokens(d) for d in step.dims], "axes": _tokens(step.axes)}
        case S.Transfer():
            return {"mesh": str(step.mesh), "dims": [_tokens(d) for d in step.dims], "partial": _tokens(step.partial)}
    raise ShardingError(f"a plan file cannot hold the step {step!r}: its kind has no entry in redist.plan_file")


def file_text(plan) -> str:
    """``plan.to_dict()`` as the text of a plan file: one field per line and one line per step, so that the
    diff of two plan files shows the steps that changed. :meth:`~redist.plan.Plan.from_json` reads it back."""
    fields = []
    for key, value in plan.to_dict().items():
        if key == "steps" and value:
            value = "[\n" + ",\n".join(f"    {json.dumps(s)}" for s in value) + "\n  ]"
        else:
            value = json.dumps(value)
        fields.append(f"  {json.dumps(key)}: {value}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def _tokens(axes) -> list[str]:
    return [str(a) for a in axes]


# ---------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class PlanFile:
    """A plan file read and checked as far as its steps: the plan's ``steps`` and ``types`` (each step built and
    put through its typing rule, the last type the file's ``dst``) and the file's JSON object, ``data``, whose
    derived figures :meth:`check_figures` compares with those of the plan built from them."""

    steps: tuple
    types: tuple
    data: dict

    def check_figures(self, step_bytes, figures: dict) -> None:
        """Raise :class:`ShardingError` where a figure of the file disagrees with the plan's: a step's
        ``bytes_received`` with ``step_bytes`` (:meth:`~redist.plan.Plan.step_bytes`), the plan's figures with
        ``figures`` (:meth:`~redist.plan.Plan.to_dict`)."""
        for i, (entry, b) in enumerate(zip(self.data["steps"], step_bytes)):
            _agree(f"step {i} ({entry['kind']}): bytes_received", entry, "bytes_received", b)
        for key in _PLAN_FIGURES:
            _agree(key, self.data, key, figures[key])


def parse(text) -> PlanFile:
    """The steps and types that ``text`` (a plan file's contents, ``str`` or ``bytes``) describes, checked as
    the module docstring says but for the derived figures (:meth:`PlanFile.check_figures`). Raises
    :class:`ShardingError` naming the first field that is wrong."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise ShardingError(f"Plan.from_json takes the text of a plan file (str or bytes), got "
                            f"{type(text).__name__} {shown(text)}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and oversized numbers are ValueErrors
        raise ShardingError(f"plan file: not JSON ({_first_line(e)})") from None
    _fields(data, "the plan", _PLAN_FIELDS, _PLAN_OPTIONAL)
    if data["format"] != FORMAT:
        raise ShardingError(f"plan file: format is {shown(data['format'])}, this version of redist reads {FORMAT!r}")
    mesh = _field("mesh", lambda: Mesh.parse(data["mesh"]))
    src = _field("src", lambda: ShardingType.parse(data["src"], mesh))
    dst_mesh = _field("dst_mesh", lambda: Mesh.parse(data["dst_mesh"])) if "dst_mesh" in data else mesh
    dst = _field("dst", lambda: ShardingType.parse(data["dst"], dst_mesh))
    entries = data["steps"]
    if not isinstance(entries, list):
        raise ShardingError(f"plan file: steps must be a list of steps, got {shown(entries)}")
    steps, types = [], [src]
    for i, entry in enumerate(entries):
        step, t = _read_step(i, entry, types[-1])
        steps.append(step)
        types.append(t)
    if types[-1] != dst:
        raise ShardingError(f"plan file: the steps end at {types[-1]}, but dst is {dst}")
    return PlanFile(tuple(steps), tuple(types), data)


def _read_step(i: int, entry, t_in: ShardingType):
    """Step ``i`` of a plan file built and applied to ``t_in``: ``(step, type after it)``."""
    where = f"step {i}"
    _fields(entry, where, _STEP_FIELDS, _STEP_DERIVED)
    kind, args = entry["kind"], entry["args"]
    build = _BUILDERS.get(kind) if isinstance(kind, str) else None
    if build is None:
        raise ShardingError(f"plan file: {where}: unknown kind {shown(kind)}; the kinds are {', '.join(_BUILDERS)}")
    where = f"{where} ({kind})"
    names = _ARGS[kind]
    if not isinstance(args, dict) or set(args) != set(names):
        want = ", ".join(names) or "none"
        raise ShardingError(f"plan file: {where}: args must be an object with the fields {{{want}}}, "
                            f"got {shown(args)}")
    step = build(args, where)
    try:
        t_out = step.apply(t_in)
    except ShardingError as e:
        raise ShardingError(f"plan file: {where}: {e}") from None
    _agree(f"{where}: step", entry, "step", str(step))
    if "type" in entry:
        claimed = _field(f"{where}: type", lambda: ShardingType.parse(entry["type"], t_out.mesh))
        if claimed != t_out:
            raise ShardingError(f"plan file: {where}: {step} turns {t_in} into {t_out}, but the file says "
                                f"type {entry['type']}")
    return step, t_out


def _fields(obj, where: str, required: set, optional) -> None:
    if not isinstance(obj, dict):
        raise ShardingError(f"plan file: {where} must be a JSON object, got {shown(obj)}")
    missing = sorted(required - set(obj))
    if missing:
        raise ShardingError(f"plan file: {where} has no {', '.join(missing)}")
    unknown = sorted(set(obj) - required - set(optional))
    if unknown:
        raise ShardingError(f"plan file: {where} has fields this format does not know: {', '.join(unknown)} "
                            f"(it knows {', '.join(sorted(required | set(optional)))})")


def _field(where: str, read: Callable):
    try:
        return read()
    except ShardingError as e:
        raise ShardingError(f"plan file: {where}: {e}") from None


def _agree(where: str, obj: dict, key: str, derived) -> None:
    """A derived field, if the file has it, must be what the steps give (``True`` is no number here)."""
    if key in obj and (obj[key] != derived or isinstance(obj[key], bool) != isinstance(derived, bool)):
        raise ShardingError(f"plan file: {where} is {shown(obj[key])}, but the steps give {shown(derived)}")


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


# ---------------------------------------------------------------------------------------------- args
def _int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShardingError(f"plan file: {where} must be an integer, got {shown(value)}")
    return value


def _axes(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ShardingError(f"plan file: {where} must be a list of mesh axis names, got {shown(value)}")
    return tuple(value)


def _dims(value, where: str) -> tuple[tuple[str, ...], ...]:
    if not isinstance(value, list):
        raise ShardingError(f"plan file: {where} must be a list with the axes of every dim, got {shown(value)}")
    return tuple(_axes(d, f"{where}[{k}]") for k, d in enumerate(value))


def _moves(value, where: str) -> tuple[tuple[int, int, tuple[str, ...]], ...]:
    if not isinstance(value, list) or not value or not all(isinstance(m, list) and len(m) == 3 for m in value):
        raise ShardingError(f"plan file: {where} must be a non-empty list of [src_dim, dst_dim, axes], "
                            f"got {shown(value)}")
    return tuple((_int(a, f"{where}[{k}][0]"), _int(b, f"{where}[{k}][1]"), _axes(axes, f"{where}[{k}][2]"))
                 for k, (a, b, axes) in enumerate(value))


def _all_to_all(args, where: str):
    moves = _moves(args["moves"], f"{where}: moves")
    return S.AllToAll(*moves[0]) if len(moves) == 1 else S.MultiAllToAll(moves)


def _shape(value, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ShardingError(f"plan file: {where} must be a list of dim sizes, got {shown(value)}")
    return tuple(_int(n, f"{where}[{k}]") for k, n in enumerate(value))


def _reduction(value, where: str) -> str:
    if value not in REDUCTIONS:
        raise ShardingError(f"plan file: {where} must be one of {', '.join(REDUCTIONS)}, got {shown(value)}")
    return value


def _mesh(value, where: str) -> Mesh:
    return _field(where, lambda: Mesh.parse(value))


def _device_ids(value, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ShardingError(f"plan file: {where} must be null or a list of device ids, got {shown(value)}")
    return tuple(_int(n, f"{where}[{k}]") for k, n in enumerate(value))


_ARGS = {"all_slice": ("dim", "axes"), "all_gather": ("dim", "axes"), "reduce_scatter": ("dim", "axes", "reduction"),
         "all_reduce": ("axes", "reduction"), "replicate_to_partial": ("axes",), "shard_to_partial": ("dim", "axes"),
         "all_to_all": ("moves",), "permute": ("dims", "device_ids"),
         "exchange": ("dims", "device_ids"), "pad": (), "unpad": ("shape",),
         "select_to_partial": ("dims", "axes"), "transfer": ("mesh", "dims", "partial")}
_BUILDERS: dict[str, Callable[[dict, str], Any]] = {
    "all_slice": lambda a, w: S.AllSlice(_int(a["dim"], f"{w}: dim"), _axes(a["axes"], f"{w}: axes")),
    "all_gather": lambda a, w: S.AllGather(_int(a["dim"], f"{w}: dim"), _axes(a["axes"], f"{w}: axes")),
    "reduce_scatter": lambda a, w: S.ReduceScatter(_int(a["dim"], f"{w}: dim"), _axes(a["axes"], f"{w}: axes"),
                                                   _reduction(a["reduction"], f"{w}: reduction")),
    "all_reduce": lambda a, w: S.AllReduce(_axes(a["axes"], f"{w}: axes"),
                                           _reduction(a["reduction"], f"{w}: reduction")),
    "replicate_to_partial": lambda a, w: S.ReplicateToPartial(_axes(a["axes"], f"{w}: axes")),
    "shard_to_partial": lambda a, w: S.ShardToPartial(_int(a["dim"], f"{w}: dim"), _axes(a["axes"], f"{w}: axes")),
    "all_to_all": _all_to_all,
    "permute": lambda a, w: S.Permute(_dims(a["dims"], f"{w}: dims"),
                                      _device_ids(a["device_ids"], f"{w}: device_ids")),
    "exchange": lambda a, w: S.Exchange(_dims(a["dims"], f"{w}: dims"),
                                        _device_ids(a["device_ids"], f"{w}: device_ids")),
    "pad": lambda a, w: S.Pad(),
    "unpad": lambda a, w: S.Unpad(_shape(a["shape"], f"{w}: shape")),
    "select_to_partial": lambda a, w: S.SelectToPartial(_dims(a["dims"], f"{w}: dims"), _axes(a["axes"], f"{w}: axes")),
    "transfer": lambda a, w: S.Transfer(_mesh(a["mesh"], f"{w}: mesh"), _dims(a["dims"], f"{w}: dims"),
                                        _axes(a["partial"], f"{w}: partial")),
}
