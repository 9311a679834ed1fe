"""An analytical simulator of the lowered SPMD program (per device).

- Compute: roofline per op, ``max(flops / peak_flops, bytes_moved / hbm_bw)``, where bytes moved are the op's
  local operand and result buffers.
- Collectives: alpha-beta, ``alpha + bytes / beta`` per collective, ``bytes`` the bytes a device receives
  (redist's accounting), ``beta`` the slowest link among the collective's axes (``axis_bw`` overrides
  ``link_bw`` per axis).
- Memory: liveness over the local program: a buffer is live from the instruction that writes it (inputs:
  from the start) to its last read (outputs: to the end); ``peak_bytes`` is the largest sum of live buffers.

Presets: ``HARDWARE["cpu-host"]`` (the default), ``"tpu-v4"``, ``"a100-nvlink"``; any :class:`Hardware` may
be passed instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hardware:
    """Per-device peak FLOP/s and memory bandwidth; per-collective latency and link bandwidth (bytes/s)."""

    name: str
    peak_flops: float
    hbm_bw: float
    alpha_s: float
    link_bw: float
    axis_bw: dict = field(default_factory=dict)

    def beta(self, axes) -> float:
        return min((self.axis_bw.get(a, self.link_bw) for a in axes), default=self.link_bw)


HARDWARE = {
    "cpu-host": Hardware("cpu-host", peak_flops=5e10, hbm_bw=2e10, alpha_s=2e-5, link_bw=5e9),
    "tpu-v4": Hardware("tpu-v4", peak_flops=2.75e14, hbm_bw=1.2e12, alpha_s=2e-6, link_bw=4.5e10),
    "a100-nvlink": Hardware("a100-nvlink", peak_flops=1.56e14, hbm_bw=1.55e12, alpha_s=5e-6, link_bw=3e11),
}


@dataclass(frozen=True)
class Simulation:
    """Per-device predictions: seconds per step, peak live bytes, bytes received, FLOPs."""

    step_time_s: float
    peak_bytes: int
    comm_bytes: float
    flops: float
    compute_time_s: float
    comm_time_s: float
    hardware: str

    def __str__(self):
        return (f"{self.hardware}: step {self.step_time_s * 1e3:.3f} ms (compute {self.compute_time_s * 1e3:.3f}, "
                f"comm {self.comm_time_s * 1e3:.3f}), peak {self.peak_bytes} B, comm {self.comm_bytes:.0f} B, "
                f"{self.flops:.3g} FLOPs")


def simulate(program, hardware=None) -> Simulation:
    """Simulate a :class:`partir_core.lowering.LocalProgram` on ``hardware`` (a preset name or a Hardware)."""
    from partir_core.lowering import Compute, Finish, Reshard

    if hardware is None:
        hardware = "cpu-host"
    hw = HARDWARE[hardware] if isinstance(hardware, str) else hardware
    if isinstance(hardware, str) and hardware not in HARDWARE:
        raise ValueError(f"unknown hardware preset {hardware!r}; presets: {', '.join(HARDWARE)}")
    size = program.buf_bytes
    compute_t = comm_t = total_flops = comm_bytes = 0.0
    reads_at: dict = {}
    steps = program.instructions
    for t, ins in enumerate(steps):
        for b in _reads(ins):
            reads_at[b] = t
    end = len(steps)
    for b in program.out_bufs:
        reads_at[b] = end
    for ins in steps:
        if isinstance(ins, Compute):
            moved = sum(size.get(b, 0) for b in ins.reads) + sum(size.get(b, 0) for b in ins.writes)
            compute_t += max(ins.flops / hw.peak_flops, moved / hw.hbm_bw)
            total_flops += ins.flops
        if isinstance(ins, (Reshard, Finish)):
            for c in ins.collectives:
                comm_t += hw.alpha_s + c.bytes / hw.beta(c.axes)
                comm_bytes += c.bytes
    # liveness: inputs live from the start; constants are not buffers
    live_set = {v for v in program.graph.invars if v in reads_at}
    live = sum(size[v] for v in live_set)
    peak = live
    for t, ins in enumerate(steps):
        for b in _writes(ins):
            if b not in live_set:
                live_set.add(b)
                live += size.get(b, 0)
        peak = max(peak, live)
        for b in set(_reads(ins)) | set(_writes(ins)):
            if b in live_set and reads_at.get(b, -1) <= t:
                live_set.discard(b)
                live -= size.get(b, 0)
    return Simulation(compute_t + comm_t, int(peak), comm_bytes, total_flops, compute_t, comm_t, hw.name)


def _reads(ins):
    from partir_core.lowering import Compute, Finish, Reshard

    if isinstance(ins, Reshard):
        return [ins.src_buf]
    if isinstance(ins, Compute):
        return list(ins.reads)
    if isinstance(ins, Finish):
        return [ins.buf]
    return []


def _writes(ins):
    from partir_core.lowering import Compute, Reshard

    if isinstance(ins, Reshard):
        return [ins.dst_buf]
    if isinstance(ins, Compute):
        return list(ins.writes)
    return []
