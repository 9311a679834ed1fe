"""A plan: typed steps from a source type to a destination type, with their costs and lowered program."""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

from redist.bounds import lower_bound_bytes
from redist.plan_file import FORMAT, read_plan, step_args
from redist.program import Program, lower


def _number(x: Fraction) -> int | float:
    return int(x) if x.denominator == 1 else float(x)


def _fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


@dataclass(frozen=True)
class Plan:
    """``steps[i]`` turns ``types[i]`` into ``types[i + 1]``; ``types[0]`` is the source, ``types[-1]`` the
    destination. Construction checks every step's typing rule."""

    steps: tuple
    types: tuple

    def __post_init__(self):
        assert len(self.types) == len(self.steps) + 1
        for step, t, t_next in zip(self.steps, self.types, self.types[1:]):
            if step.apply(t) != t_next:
                raise AssertionError(f"{step} on {t} gives {step.apply(t)}, not {t_next}")

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
    def device_bytes(self) -> tuple[Fraction, ...]:
        """Bytes each device receives over the whole plan (collectives count as in the steps' table)."""
        totals = [Fraction(0)] * self.src.mesh.size
        for step, t in zip(self.steps, self.types):
            if hasattr(step, "device_bytes"):  # point-to-point steps: each device receives its own amount
                totals = [b + x for b, x in zip(totals, step.device_bytes(t))]
            else:
                totals = [b + step.bytes_received(t) for b in totals]
        return tuple(totals)

    @property
    def bytes_received(self) -> int | float:
        """The largest, over devices, of the bytes a device receives over the whole plan."""
        return _number(max(self.device_bytes, default=Fraction(0)))

    def step_bytes(self) -> tuple[int | float, ...]:
        """Bytes received per device in each step (the most any device receives in it)."""
        return tuple(_number(s.bytes_received(t)) for s, t in zip(self.steps, self.types))

    @cached_property
    def program(self) -> Program:
        """The lowered buffer program that the backends execute and :func:`redist.verify` proves."""
        return lower(self.steps, self.types)

    def __str__(self) -> str:
        lines = [f"{self.src}"]
        for step, t, b in zip(self.steps, self.types[1:], self.step_bytes()):
            lines.append(f"  {str(step):<34} -> {t}   recv {_fmt_bytes(b)}")
        if not self.steps:
            lines.append("  (no steps: the types are equal)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The plan as a plan file's JSON object (format in :mod:`redist.plan_file`): the source, each step's
        kind and ``args`` (what :meth:`from_json` rebuilds it from), text, type after it and bytes, and the
        plan's figures against its two bounds."""
        return {
            "format": FORMAT,
            "mesh": str(self.src.mesh),
            "src": str(self.src),
            "dst": str(self.dst),
            "steps": [
                {"kind": s.kind, "args": step_args(s), "step": str(s), "type": str(t), "bytes_received": b}
                for s, t, b in zip(self.steps, self.types[1:], self.step_bytes())
            ],
            "peak_bytes": self.peak_bytes,
            "bytes_received": self.bytes_received,
            "memory_bound_bytes": max(self.src.local_bytes, self.dst.local_bytes),
            "lower_bound_bytes": lower_bound_bytes(self.src, self.dst),
        }

    def to_json(self, **kw) -> str:
        """:meth:`to_dict` as JSON text (``kw`` goes to ``json.dumps``, e.g. ``indent=2``)."""
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_json(cls, text) -> "Plan":
        """The plan a plan file holds (the text :meth:`to_json` writes), rebuilt step by step through the step
        classes and their typing rules, every derived field checked against the steps
        (:func:`redist.plan_file.read_plan`). Raises :class:`~redist.errors.ShardingError` naming the first
        field that is wrong. It does not prove the plan: :func:`redist.verify` does."""
        return read_plan(text)
