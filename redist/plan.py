"""A plan: typed steps from a source type to a destination type, with their costs and lowered program."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import numpy as np

from redist import plan_file
from redist import steps as S
from redist.blocks import DeviceClasses
from redist.bounds import check_pair, lower_bound_bytes
from redist.errors import ShardingError, shown
from redist.picture import MAX_BLOCKS, format_bytes
from redist.plan_picture import plan_picture, summary
from redist.plot import plot_plan
from redist.lowering import check_meshes, lower_stages, segments
from redist.program import Program, Transfer, point_to_point_bytes
from redist.types import ShardingType


def _number(x: Fraction) -> int | float:
    return int(x) if x.denominator == 1 else float(x)


def _check_redistribution(steps: tuple, types: tuple) -> None:
    """Raise :class:`ShardingError` unless typed ``steps`` (with their ``len(steps) + 1`` types) are a
    redistribution, whichever way the plan is built (its constructor, :meth:`Plan.from_steps`,
    :meth:`Plan.from_json`): its destination is a possible target of its source
    (:func:`redist.bounds.check_pair`: the same shape, dtype and mesh axes, sub-axes of one factorization, no
    change of reduction kind), which the steps' typing rules do not ensure (``pad`` then ``unpad`` to another
    shape; ``all_reduce(max)`` then ``replicate_to_partial``), and the collectives of each run of steps
    between transfers run on one device order (:func:`redist.lowering.check_meshes`)."""
    try:
        check_pair(types[0], types[-1])
    except ShardingError as e:
        raise ShardingError(f"the steps turn {types[0]} into {types[-1]}, which is no redistribution of it: "
                            f"{e}") from None
    check_meshes(steps, types)


@dataclass(frozen=True)
class Plan:
    """``steps[i]`` turns ``types[i]`` into ``types[i + 1]``; ``types[0]`` is the source, ``types[-1]`` the
    destination. Construction checks every step's typing rule and raises :class:`ShardingError` for anything
    else: not one type more than steps, something that is no :class:`redist.ShardingType` or no step of
    :mod:`redist.steps`, a step that does not turn its type into the next, or steps that are no
    redistribution: steps whose destination is no possible target of their source (another shape, dtype or
    mesh axes, another reduction kind, sub-axes of no one factorization), or whose collectives do not run on
    one device order."""

    steps: tuple
    types: tuple

    def __post_init__(self):
        for field, value in (("steps", self.steps), ("types", self.types)):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise ShardingError(f"Plan {field} must be a tuple, got {type(value).__name__} {shown(value)}")
            object.__setattr__(self, field, tuple(value))
        if len(self.types) != len(self.steps) + 1:
            raise ShardingError(f"a plan of {len(self.steps)} steps needs {len(self.steps) + 1} types (the source, "
                                f"then the type after each step), got {len(self.types)}")
        for i, t in enumerate(self.types):
            if not isinstance(t, ShardingType):
                raise ShardingError(f"type {i} of the plan is no redist.ShardingType: {type(t).__name__} {shown(t)}")
        for i, (step, t, t_next) in enumerate(zip(self.steps, self.types, self.types[1:])):
            if not isinstance(step, S.Step):
                raise ShardingError(f"step {i} of the plan is no redist step: {type(step).__name__} {shown(step)}")
            out = step.apply(t)
            if out != t_next:
                raise ShardingError(f"step {i} of the plan, {step}, turns {t} into {out}, not into {t_next}")
        _check_redistribution(self.steps, self.types)

    @classmethod
    def from_steps(cls, src: ShardingType, steps: Iterable[S.Step]) -> Plan:
        """The plan that runs ``steps`` (steps of :mod:`redist.steps`, in order) from ``src``: each step's
        typing rule (``step.apply``) gives the type after it, and the last type is the plan's destination.
        No steps: the plan from ``src`` to itself.

        Raises :class:`~redist.errors.ShardingError` if ``src`` is not a :class:`~redist.types.ShardingType`,
        ``steps`` is not a sequence of steps, a step does not fit the type before it (the message gives
        the step's position, the step and that type), or the steps are no redistribution: the checks of the
        constructor and of :meth:`from_json`.
        """
        if not isinstance(src, ShardingType):
            raise ShardingError(f"Plan.from_steps: src must be a redist.ShardingType, got {type(src).__name__} "
                                f"{shown(src)}")
        if isinstance(steps, (S.Step, str, bytes)) or not isinstance(steps, Iterable):
            raise ShardingError(f"Plan.from_steps: steps must be a sequence of steps of redist.steps, got "
                                f"{type(steps).__name__} {shown(steps)}")
        steps = tuple(steps)
        types = [src]
        for n, step in enumerate(steps):
            if not isinstance(step, S.Step):
                raise ShardingError(f"Plan.from_steps: step {n} is {type(step).__name__} {shown(step)}, not a step "
                                    "of redist.steps")
            try:
                types.append(step.apply(types[-1]))
            except ShardingError as e:
                raise ShardingError(f"Plan.from_steps: step {n} of {len(steps)}: {e}") from None
        try:
            return cls._typed(steps, tuple(types))
        except ShardingError as e:
            raise ShardingError(f"Plan.from_steps: {e}") from None

    @classmethod
    def _typed(cls, steps: tuple, types: tuple) -> Plan:
        """The plan of ``steps`` (a tuple of steps) and ``types``: the source, then the type each step's typing rule
        gave (``types[i + 1]`` is ``steps[i].apply(types[i])``, as :meth:`from_steps` made them). All that the
        constructor checks holds by construction but :func:`_check_redistribution`, checked here: the
        steps are not applied a second time (a step's typing rule is a function of the step and its type, so it
        would give these types again). Synthesis builds every plan it keeps through :meth:`from_steps`."""
        plan = object.__new__(cls)
        object.__setattr__(plan, "steps", steps)
        object.__setattr__(plan, "types", types)
        _check_redistribution(steps, types)
        return plan

    @property
    def src(self):
        return self.types[0]

    @property
    def dst(self):
        return self.types[-1]

    @property
    def peak_bytes(self) -> int:
        """The largest local buffer, per device, at any step boundary."""
        return max(t.local_bytes for t in self.types)

    @cached_property
    def _received(self) -> Fraction:
        """The most bytes any device receives over the whole plan. Collectives receive the same on every
        device; point-to-point steps (permute, exchange) per device: one of them adds its own maximum, and
        several are added up per class of devices (:class:`redist.blocks.DeviceClasses` of the axes that
        decide what a device receives in them), so that no device is counted at two different maxima. A plan
        that changes the device order adds them up per device, from its program's tables
        (:func:`redist.program.point_to_point_bytes`), and so does a plan across meshes
        (:meth:`_received_across_meshes`)."""
        uniform, p2p = Fraction(0), []
        for step, t in zip(self.steps, self.types):
            b = step.bytes_received(t)
            if hasattr(step, "class_bytes") and b:
                p2p.append((step, t, b))
            else:
                uniform += b
        if self.crosses_meshes:
            return self._received_across_meshes()
        if p2p and any(t.mesh != self.src.mesh for t in self.types):
            return uniform + int(point_to_point_bytes(self.stages[0]).max())
        if len(p2p) <= 1:
            return uniform + sum(b for _, _, b in p2p)
        classes = DeviceClasses(self.src.mesh, [a for s, t, _ in p2p for a in s.class_axes(t)])
        return uniform + int(max(sum(s.class_bytes(t, classes.coords) for s, t, _ in p2p)))

    def _received_across_meshes(self) -> Fraction:
        """:attr:`_received` of a plan with transfers, device by device over every device of its meshes: the
        collectives of a run of steps on one mesh add their bytes on its devices, its permutes and exchanges
        and the transfers their tables' (:func:`redist.program.point_to_point_bytes`,
        :meth:`redist.program.Transfer.received_bytes`)."""
        total: dict[int, Fraction] = {}
        for (run, run_types), stage in zip(segments(self.steps, self.types), self.stages):
            if isinstance(stage, Transfer):
                per_device = stage.received_bytes(self.src.itemsize)
                uniform = Fraction(0)
            else:
                p2p = [hasattr(s, "class_bytes") for s in run]
                uniform = sum((s.bytes_received(t) for s, t, x in zip(run, run_types, p2p) if not x), Fraction(0))
                per_device = point_to_point_bytes(stage) if any(p2p) else np.zeros(stage.mesh.id_bound, np.int64)
            for d in stage.mesh.devices:
                total[d] = total.get(d, Fraction(0)) + uniform + int(per_device[d])
        return max(total.values(), default=Fraction(0))

    @property
    def crosses_meshes(self) -> bool:
        """Whether the plan moves the array to another mesh (a transfer: other devices or other axes)."""
        return any(isinstance(s, S.Transfer) for s in self.steps)

    @property
    def bytes_received(self) -> int | float:
        """The largest, over devices, of the bytes a device receives over the whole plan. Raises
        :class:`ShardingError` where counting it would list more than :data:`redist.blocks.MAX_LISTED` classes of
        devices (point-to-point steps on a mesh of millions of devices that both layouts split finely)."""
        return _number(self._received)

    def step_bytes(self) -> tuple[int | float, ...]:
        """Bytes received per device in each step (the most any device receives in it)."""
        return tuple(_number(s.bytes_received(t)) for s, t in zip(self.steps, self.types))

    @cached_property
    def stages(self) -> tuple:
        """The plan lowered for the numpy backend (:func:`redist.lowering.lower_stages`): a
        :class:`~redist.program.Program` per run of steps on one mesh and a :class:`~redist.program.Transfer` per
        transfer between meshes, in order; for a plan within one mesh, its one program."""
        return lower_stages(self.steps, self.types)

    @property
    def program(self) -> Program:
        """The lowered buffer program of a plan within one mesh whose device ids are ``0 … size−1`` (what
        ``redist.mpi.run_program`` runs): ``stages[0]``.

        Raises :class:`ShardingError` for a plan across meshes, which has a program per mesh and transfers
        between them, and for a plan on a mesh numbered otherwise: read :attr:`stages`, which
        :func:`redist.execute`, :func:`redist.jax.reshard` and :func:`redist.mpi.reshard` run and
        :func:`redist.verify` proves."""
        if self.crosses_meshes:
            raise ShardingError(f"the plan moves the array from mesh {self.src.mesh} to mesh {self.dst.mesh}: it "
                                "lowers to a program per mesh and a transfer between them (plan.stages), not to one "
                                "program; redist.execute, redist.jax.reshard and redist.mpi.reshard run plan.stages, "
                                "and redist.verify proves them")
        mesh = next((t.mesh for t in self.types if t.mesh.id_bound != t.mesh.size), None)
        if mesh is not None:
            raise ShardingError(f"the plan runs on mesh {mesh}, whose device ids are not 0 to {mesh.size - 1}: its "
                                "program is plan.stages[0], which redist.execute, redist.jax.reshard and "
                                "redist.mpi.reshard run and redist.verify proves")
        return self.stages[0]

    def __str__(self) -> str:
        lines = [f"{self.src}"]
        for step, t, b in zip(self.steps, self.types[1:], self.step_bytes()):
            lines.append(f"  {str(step):<34} -> {t}   recv {format_bytes(b)}")
        if not self.steps:
            lines.append("  (no steps: the types are equal)")
        return "\n".join(lines + [summary(self)])

    def show(self, blocks: bool | None = None, limit: int = MAX_BLOCKS) -> str:
        """The plan step by step (:mod:`redist.plan_picture`): each step, the type after it, its bytes per device,
        what the busiest device receives in it and the peak so far; with ``blocks`` (default: on meshes of at
        most 32 devices) a picture of each type's blocks, at most ``limit`` each; then the two lines that end
        ``str(plan)`` (:func:`redist.plan_picture.summary`)."""
        return plan_picture(self, blocks, limit)

    def plot(self, path: str) -> None:
        """Draw the plan as a figure, one panel per type, and write it to ``path`` (``.png`` or ``.svg``;
        :mod:`redist.plot`). Needs matplotlib (the ``[bench]`` extra)."""
        plot_plan(self, path)

    def to_dict(self) -> dict:
        """The plan as a plan file's JSON object (format in :mod:`redist.plan_file`): the source, each step's
        kind and ``args`` (what :meth:`from_json` rebuilds it from), text, type after it and bytes, and the
        plan's figures against its two bounds. ``dst_mesh`` is there only when the destination's mesh is another
        (another device order, or other devices or axes after a transfer)."""
        out: dict = {"format": plan_file.FORMAT, "mesh": str(self.src.mesh)}
        if self.dst.mesh != self.src.mesh:
            out["dst_mesh"] = str(self.dst.mesh)
        out.update({
            "src": str(self.src),
            "dst": str(self.dst),
            "steps": [
                {"kind": s.kind, "args": plan_file.step_args(s), "step": str(s), "type": str(t),
                 "bytes_received": b}
                for s, t, b in zip(self.steps, self.types[1:], self.step_bytes())
            ],
            "peak_bytes": self.peak_bytes,
            "bytes_received": self.bytes_received,
            "memory_bound_bytes": max(self.src.local_bytes, self.dst.local_bytes),
            "lower_bound_bytes": lower_bound_bytes(self.src, self.dst),
        })
        return out

    def to_json(self, **kw) -> str:
        """:meth:`to_dict` as JSON text (``kw`` goes to ``json.dumps``, e.g. ``indent=2``)."""
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_json(cls, text) -> "Plan":
        """The plan a plan file holds (the text :meth:`to_json` writes), rebuilt step by step through the step
        classes and their typing rules (:func:`redist.plan_file.parse`), every derived field checked against
        the steps. Raises :class:`~redist.errors.ShardingError` naming the first field that is wrong. It does
        not prove the plan: :func:`redist.verify` does."""
        read = plan_file.parse(text)
        try:
            plan = cls(read.steps, read.types)
        except ShardingError as e:
            raise ShardingError(f"plan file: {e}") from None
        read.check_figures(plan.step_bytes(), plan.to_dict())
        return plan
