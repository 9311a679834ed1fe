"""Pipeline schedules: which stage runs which microbatch at each tick, the bubble, and their picture.

A :class:`Schedule` describes the pipelined loop that :class:`partir_core.Pipeline` makes of a layer scan
(:mod:`partir_core.pipeline`): ``L`` layers over ``S`` stages, ``M`` microbatches, ``R`` repeats (``R = 1``:
GPipe; ``R > 1``: circular). Each stage holds ``K = L / (S·R)`` layers per repeat; in repeat ``r`` stage ``s``
runs layers ``(r·S + s)·K`` to ``(r·S + s)·K + K - 1`` (GPipe: stage ``s`` holds layers ``s·K ... s·K + K - 1``;
circular with ``K = 1``: layers ``s, s + S, s + 2S, ...``, as MaxText's circular pipeline).

Ticks. The loop runs ``T = M·R + S - 1`` ticks. At tick ``t`` stage ``s`` works on job ``j = t - s`` when
``0 ≤ j < M·R``: microbatch ``j mod M`` in repeat ``j div M`` (it left stage ``s - 1`` at the tick before; stage
0 takes a new microbatch at ticks ``0 ... M - 1`` and, in later repeats, the one stage ``S - 1`` finished
``M - S + 1`` ticks before, which is why a circular schedule needs ``M ≥ S``). Otherwise the stage idles (in the
SPMD program it computes on data that is thrown away): the *bubble*.

Bubble. Every tick costs every stage the same (the stages are equal: ``K`` layers on one microbatch), and each
stage idles in ``S - 1`` of the ``T`` ticks, so the share of the pipelined loop's time lost to the bubble is

    bubble = (S - 1) / (M·R + S - 1)

(GPipe: ``(S - 1) / (M + S - 1)``). The pipelined loop takes ``T·K`` layer-steps on a microbatch against
``M·L/S`` for a perfect pipeline: circular ticks are ``R`` times shorter, so its bubble lasts ``(S - 1)·L/(S·R)``
layer-steps instead of GPipe's ``(S - 1)·L/S``. JAX's backward pass is the transpose of this loop, tick by tick
in reverse, with the same bubble. The simulator (:attr:`partir_core.Simulation.bubble_fraction`) measures the
bubble of the lowered program: the time of the ticks where a stage idles over the time of the pipelined loops.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = {"gpipe": "GPipe", "circular": "circular"}


@dataclass(frozen=True)
class Schedule:
    """A pipelined layer loop: ``kind`` (``"gpipe"`` or ``"circular"``), ``stages`` (S), ``microbatches`` (M),
    ``repeats`` (R), ``layers`` (L), and the mesh ``axis`` its stages lie on."""

    kind: str
    stages: int
    microbatches: int
    repeats: int
    layers: int
    axis: str = ""

    @property
    def layers_per_stage(self) -> int:
        """K: the layers a stage runs per repeat."""
        return self.layers // (self.stages * self.repeats)

    @property
    def ticks(self) -> int:
        """T = M·R + S - 1: the iterations of the pipelined loop."""
        return self.microbatches * self.repeats + self.stages - 1

    @property
    def bubble_fraction(self) -> float:
        """(S - 1) / (M·R + S - 1): the share of the pipelined loop each stage idles (see the module docstring)."""
        return (self.stages - 1) / self.ticks

    def job(self, tick: int, stage: int) -> tuple[int, int] | None:
        """``(microbatch, repeat)`` that ``stage`` works on at ``tick``, or None in the bubble."""
        j = tick - stage
        if 0 <= j < self.microbatches * self.repeats:
            return j % self.microbatches, j // self.microbatches
        return None

    def stage_layers(self, stage: int) -> list[range]:
        """The layers ``stage`` runs, one range per repeat."""
        k = self.layers_per_stage
        return [range((r * self.stages + stage) * k, (r * self.stages + stage) * k + k) for r in range(self.repeats)]

    def picture(self) -> str:
        """A text picture: per stage (one row each), the microbatch it works on at each tick of the forward loop
        (a letter after it names the repeat in a circular schedule), ``.`` in the bubble."""
        name = SCHEDULES[self.kind]
        head = (f"{name} pipeline over {self.axis or 'the stage axis'}: {self.stages} stages, "
                f"{_count(self.microbatches, 'microbatch', 'microbatches')}"
                + (f", {self.repeats} repeats" if self.repeats > 1 else "")
                + f", {self.layers} layers; {self.ticks} ticks per pass, bubble {100 * self.bubble_fraction:.1f}% "
                f"({self.stages - 1} of {self.ticks} ticks per stage)")
        cells = [[self._cell(t, s) for t in range(self.ticks)] for s in range(self.stages)]
        width = max(len(c) for row in cells for c in row + [str(self.ticks - 1)])
        labels = [f"stage {s} (layers {_ranges(self.stage_layers(s))})" for s in range(self.stages)]
        pad = max(len(x) for x in labels + ["tick"])
        lines = [head, "tick".ljust(pad) + " " + " ".join(str(t).rjust(width) for t in range(self.ticks))]
        lines += [label.ljust(pad) + " " + " ".join(c.rjust(width) for c in row) for label, row in zip(labels, cells)]
        lines.append("the backward pass runs these ticks in reverse")
        return "\n".join(lines)

    def _cell(self, tick: int, stage: int) -> str:
        job = self.job(tick, stage)
        if job is None:
            return "."
        m, r = job
        return f"{m}{chr(ord('a') + r % 26)}" if self.repeats > 1 else str(m)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _ranges(rs: list[range]) -> str:
    return ", ".join(f"{r.start}-{r.stop - 1}" if len(r) > 1 else str(r.start) for r in rs)
