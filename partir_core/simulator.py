"""An analytical simulator of the lowered SPMD program (per device).

Fusion. XLA fuses elementwise work into its consumers, so the simulator first decides which local values are
*materialized* (get a buffer and a kernel of their own): inputs, reshard results, outputs, and every result of
an op that is not fusible (``dot_general``, reductions, gather/scatter, sort, control flow, ...) or that is read
by an op that cannot take it fused (a ``dot_general``, gather/scatter, a reshard, a collective). A result of a
fusible op (elementwise, broadcasts, reshapes, transposes, iota, ...) read only by fusible ops and reductions is
fused: it gets no buffer, and its readers read its materialized sources instead. When it reaches several
kernels (its readers' kernels, through the fused values they write), XLA duplicates it into each of them, except
an expensive op (:data:`EXPENSIVE`: transcendentals, float division), which it computes once, and except where
one of those kernels is a library reduction (:func:`_library_reduction`: the CPU backend runs large float sums,
maxima and minima with YNNPACK, whose fusion takes only producers it is the sole reader of); such a value is
materialized.

- Compute: per op ``max(flops / peak_flops, bytes_moved / hbm_bw)``, ``bytes_moved`` the materialized buffers
  it reads and writes; plus ``op_overhead_s`` per kernel (one per materialized op result, one per reshard's
  local step) -- on a CPU host, launch and thread-pool dispatch dominate small programs.
- Collectives: as the compiled program runs them (:func:`combined_collectives`: XLA merges independent
  all-reduces of one reduction over the same devices into one, whose every operand after the first still
  costs ``combine_ratio`` times a collective's latency: calibrated, about 0.96 on the CPU host), each alpha-beta,
  ``alpha + alpha_per_peer * (k - 1) + bytes / beta`` per collective over a group of ``k`` devices, ``bytes``
  the bytes a device receives (redist's accounting; summed over a combined group), ``beta`` the slowest link
  among the collective's axes (``axis_bw`` overrides ``link_bw`` per axis); ``kind_links`` may give a
  collective kind its own ``(alpha, beta)`` and ``alpha_per_peer`` its own per-peer latency (a
  ``all_reduce_max``/``all_reduce_min`` without an entry of its own takes ``all_reduce``'s).
- Memory: what XLA's ``compiled.memory_analysis()`` reports for the compiled program, argument + output +
  temp − alias bytes per device: every input's local buffer (all program long); every output's allocation
  (and, for several outputs, the output tuple's 8-byte pointers); and the temporary block. Materialized
  temporaries (reshard results and intermediate values) are live from the op that writes them to their last
  effective read, outputs from their write to the end. As XLA's buffer assignment does, a temporary reuses an
  output's allocation when it fits in it and is dead before that output is written (largest temporaries
  first); the temporary block holds the peak of the others live at once. Nothing is donated, so nothing
  aliases. An op that XLA runs as a loop over buffers of its own (:data:`SCRATCH`: the threefry hash of
  ``random_bits``) also holds that scratch while it runs.
- Step time: ``launch_s`` (one program launch) + kernels x ``op_overhead_s`` + compute + collectives, in
  sequence (nothing overlaps).

Presets: ``HARDWARE["cpu-host"]`` (the default; JAX host devices: collectives from redist.cost's calibrated
``cpu-host`` link, ``bench/results/cpu_host_profile.json``; compute from ``bench/results/cpu_host_compute.json``
written by ``bench/partitioning.py --calibrate``, else :data:`CPU_COMPUTE_DEFAULT`), ``"tpu-v4"``,
``"a100-nvlink"``; any :class:`Hardware` may be passed instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from redist.errors import ShardingError, shown


@dataclass(frozen=True)
class Hardware:
    """Per-device peak FLOP/s and memory bandwidth, per-kernel overhead; per-collective latency and link
    bandwidth (bytes/s), optionally per collective kind (``kind_links[kind] = (alpha, beta)``) and per peer
    in the group (``alpha_per_peer[kind]``, seconds per device beyond the first). ``combine_ratio``: the
    latency of each further operand of a combined all-reduce, as a fraction of a separate collective's."""

    name: str
    peak_flops: float
    hbm_bw: float
    alpha_s: float
    link_bw: float
    axis_bw: dict = field(default_factory=dict)
    op_overhead_s: float = 0.0
    kind_links: dict = field(default_factory=dict)
    launch_s: float = 0.0
    alpha_per_peer: dict = field(default_factory=dict)
    combine_ratio: float = 0.0

    def beta(self, axes) -> float:
        return min((self.axis_bw.get(a, self.link_bw) for a in axes), default=self.link_bw)

    def collective_time(self, kind: str, axes, nbytes: float, group: int = 1, operands: int = 1) -> float:
        """Seconds for one collective of ``kind`` over ``axes`` (``group`` devices), ``nbytes`` received, made of
        ``operands`` combined collectives (each after the first adds ``combine_ratio`` of the latency)."""
        if nbytes <= 0:
            return 0.0
        base = "all_reduce" if kind.startswith("all_reduce_") and kind not in self.kind_links else kind
        alpha, beta = self.kind_links.get(base, (self.alpha_s, None))
        if beta is None or any(a in self.axis_bw for a in axes):
            beta = self.beta(axes)
        latency = alpha + self.alpha_per_peer.get(base, 0.0) * max(group - 1, 0)
        return latency * (1 + self.combine_ratio * (operands - 1)) + nbytes / beta


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_COMPUTE_PROFILE = os.path.join(ROOT, "bench", "results", "cpu_host_compute.json")
# Measured on the 2-core development machine with 8 host devices running at once (bench/partitioning.py
# --calibrate): per-device throughput, so the 8 devices' share of the cores is included.
CPU_COMPUTE_DEFAULT = {"peak_flops": 8.0e9, "hbm_bw": 7.0e8, "op_overhead_s": 1.0e-6, "launch_s": 2.5e-4,
                       "combine_ratio": 1.0}


def cpu_host(compute_path: str | None = None) -> Hardware:
    """The ``cpu-host`` preset from the calibration files (see the module docstring).

    Bandwidths per collective kind come from redist's ``cpu-host`` profile. Latencies come from the compute
    profile's ``collective_alpha`` (``{kind: [a0, per_peer]}``, measured inside one program, where a
    collective costs far less than the profile's one-collective program launch) where it has the kind,
    else from redist's profile."""
    from redist import cost

    comp = dict(CPU_COMPUTE_DEFAULT)
    in_program: dict = {}
    path = CPU_COMPUTE_PROFILE if compute_path is None else compute_path
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
        comp.update({k: float(v) for k, v in data.items() if k in CPU_COMPUTE_DEFAULT})
        in_program = {k: (float(a0), float(peer)) for k, (a0, peer) in data.get("collective_alpha", {}).items()}
    link = cost.cpu_host_link()
    kinds = {}
    try:
        with open(cost.CPU_HOST_PROFILE) as f:
            per = json.load(f).get("per_kind", {})
        names = {"all_gather": "all_gather", "all_to_all": "all_to_all", "ppermute": "permute"}
        kinds = {names.get(k, k): (float(v["alpha"]), float(v["beta"])) for k, v in per.items()}
    except (OSError, ValueError, KeyError):
        pass
    for k, (a0, _) in in_program.items():
        kinds[k] = (a0, kinds.get(k, (None, link.beta))[1])
    return Hardware("cpu-host", comp["peak_flops"], comp["hbm_bw"], float(link.alpha), link.beta,
                    op_overhead_s=comp["op_overhead_s"], kind_links=kinds, launch_s=comp["launch_s"],
                    alpha_per_peer={k: peer for k, (_, peer) in in_program.items()},
                    combine_ratio=comp["combine_ratio"])


HARDWARE = {
    "cpu-host": cpu_host(),
    "tpu-v4": Hardware("tpu-v4", peak_flops=2.75e14, hbm_bw=1.2e12, alpha_s=2e-6, link_bw=4.5e10,
                       op_overhead_s=1e-6),
    "a100-nvlink": Hardware("a100-nvlink", peak_flops=1.56e14, hbm_bw=1.55e12, alpha_s=5e-6, link_bw=3e11,
                            op_overhead_s=4e-6),
}

# Ops XLA fuses into their consumers (loop fusion); reductions take fused operands (input fusion).
FUSIBLE = {
    "add", "sub", "mul", "div", "rem", "pow", "max", "min", "neg", "sign", "abs", "floor", "ceil", "round",
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "sqrt", "rsqrt", "cbrt",
    "square", "integer_pow", "erf", "erfc", "erf_inv", "is_finite", "atan2", "not", "and", "or", "xor", "eq",
    "ne", "lt", "le", "gt", "ge", "select_n", "clamp", "convert_element_type", "stop_gradient", "add_any",
    "copy", "copy_p", "broadcast_in_dim", "reshape", "transpose", "squeeze", "iota", "sharding_constraint",
    "mesh_cast", "reshard", "reduce_precision", "slice", "dynamic_slice", "pad", "concatenate",
    # bit-level ops of random draws, and the conversions between keys and key data (they change no bits);
    # random_bits and the other threefry ops are not fused: XLA's CPU backend runs the hash as a loop
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "bitcast_convert_type", "random_wrap",
    "random_unwrap", "random_clone",
}
# Fusible ops XLA counts expensive (transcendentals, float division): never duplicated into several consumers.
EXPENSIVE = {"div", "rem", "pow", "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt",
             "cbrt", "tan", "erf", "erfc", "erf_inv", "atan2"}
# Reductions XLA's CPU backend hands to YNNPACK once their operand has this many elements.
LIBRARY_REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min"}
LIBRARY_MIN_ELEMENTS = 4096
# Scratch an op holds while it runs, in multiples of its results' bytes: XLA's CPU backend runs the threefry
# hash of ``random_bits`` as a while loop; a dropout mask's compiled program holds 3 bytes of temporaries per
# byte of random bits beside them (memory_analysis of f32[n, 1024] masks, n = 64..512, whole and batch-split).
SCRATCH = {"random_bits": 3}
TAKES_FUSED = FUSIBLE | {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                         "argmax", "argmin"}


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
    kernels: int = 0
    argument_bytes: int = 0
    output_bytes: int = 0
    temp_bytes: int = 0

    def __str__(self):
        return (f"{self.hardware}: step {self.step_time_s * 1e3:.3f} ms (compute {self.compute_time_s * 1e3:.3f}, "
                f"comm {self.comm_time_s * 1e3:.3f}), peak {self.peak_bytes} B (args {self.argument_bytes}, "
                f"outputs {self.output_bytes}, temp {self.temp_bytes}), comm {self.comm_bytes:.0f} B, "
                f"{self.flops:.3g} FLOPs")


def hardware_profile(hardware) -> Hardware:
    """The :class:`Hardware` that a ``hardware=`` argument names: None (the default, ``"cpu-host"``), a preset
    name of :data:`HARDWARE`, or a :class:`Hardware` itself. Raises :class:`redist.ShardingError` for anything
    else, listing the presets."""
    if hardware is None:
        hardware = "cpu-host"
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str) and hardware in HARDWARE:
        return HARDWARE[hardware]
    raise ShardingError(f"unknown hardware {shown(hardware)}; give a preset name ({', '.join(HARDWARE)}) or a "
                        "partir_core.Hardware")


def materialized(program) -> set:
    """The buffers of ``program`` that get memory of their own (see the module docstring)."""
    from partir_core.lowering import Compute, Finish, Reshard

    g = program.graph
    steps = program.instructions
    readers: dict = {}  # buffer -> [(instruction index, op name)]
    for t, ins in enumerate(steps):
        if isinstance(ins, Compute):
            for b in ins.reads:
                readers.setdefault(b, []).append((t, g.eqns[ins.eqn_index].name))
        elif isinstance(ins, Reshard):
            readers.setdefault(ins.src_buf, []).append((t, "<reshard>"))
        elif isinstance(ins, Finish):
            readers.setdefault(ins.buf, []).append((t, "<collective>"))
    out = set(g.invars) | set(program.out_bufs) | {i.dst_buf for i in steps if isinstance(i, Reshard)}

    def library(t):  # the kernel of instruction t is a library reduction
        ins = steps[t]
        if not isinstance(ins, Compute):
            return False
        name = g.eqns[ins.eqn_index].name
        return _library_reduction(name, program.buf_bytes.get(ins.reads[0], 0), g.dtype(ins.writes[0]))

    # kernels[b]: the instructions whose kernels read b, directly or through the fused values that read it;
    # decided consumers first
    kernels: dict = {}
    for t in reversed(range(len(steps))):
        ins = steps[t]
        if not isinstance(ins, Compute):
            continue
        name = g.eqns[ins.eqn_index].name
        for b in ins.writes:
            rs = readers.get(b, [])
            ks = set()
            for tr, _ in rs:
                ws = steps[tr].writes if isinstance(steps[tr], Compute) else []
                if not ws or any(w in out for w in ws):
                    ks.add(tr)
                else:
                    ks.update(*(kernels[w] for w in ws))
            kernels[b] = ks
            fused = name in FUSIBLE and rs and all(r in TAKES_FUSED for _, r in rs)
            if not fused or len(ks) > 1 and (name in EXPENSIVE or any(library(k) for k in ks)):
                out.add(b)
    return out - set(g.consts)


def _library_reduction(name: str, nbytes: int, dtype) -> bool:
    """Whether XLA's CPU backend runs a reduction ``name`` of a ``nbytes`` operand of ``dtype`` as a library
    (YNNPACK) kernel rather than a loop: sums, maxima and minima of floats of at least
    :data:`LIBRARY_MIN_ELEMENTS` elements."""
    if name not in LIBRARY_REDUCTIONS:  # before reading the dtype, which may be a key dtype
        return False
    dtype = np.dtype(dtype)
    return np.issubdtype(dtype, np.floating) and nbytes // dtype.itemsize >= LIBRARY_MIN_ELEMENTS


def combined_collectives(program) -> list:
    """The program's collectives as the compiled program runs them: a list of groups (lists of
    :class:`~partir_core.lowering.Collective`), each group one collective of the compiled program.

    XLA's all-reduce combiner merges all-reduces of the same reduction over the same devices into one tuple
    all-reduce when none of them depends on another's result; it has no counterpart for all-gathers,
    reduce-scatters, all-to-alls or permutes on the CPU backend, which stay one collective each (as the
    compiled HLO shows). Modelled greedily in program order: an all-reduce joins the open group of its
    ``(kind, axes)`` unless its operand depends on a member of that group, which closes the group."""
    from partir_core.lowering import Finish, Reshard

    deps: dict = {}  # buffer -> bitmask of the collectives (indices into ``cols``) its value depends on
    groups: list = []
    open_group: dict = {}  # (kind, axes) -> (index into groups, bitmask of its members)
    n = 0
    for ins in program.instructions:
        mask = 0
        for b in _reads(ins):
            mask |= deps.get(b, 0)
        if isinstance(ins, (Reshard, Finish)):
            for c in ins.collectives:
                bit = 1 << n
                n += 1
                key = (c.kind, tuple(c.axes))
                if c.kind.startswith("all_reduce") and key in open_group and not mask & open_group[key][1]:
                    g, members = open_group[key]
                    groups[g].append(c)
                    open_group[key] = (g, members | bit)
                else:
                    groups.append([c])
                    if c.kind.startswith("all_reduce"):
                        open_group[key] = (len(groups) - 1, bit)
                mask |= bit  # a later step of the same reshard reads this one's result
        for b in (_writes(ins) if not isinstance(ins, Finish) else [ins.buf]):
            deps[b] = mask
    return groups


def simulate(program, hardware=None) -> Simulation:
    """Simulate a :class:`partir_core.lowering.LocalProgram` on ``hardware`` (a preset name or a Hardware)."""
    from partir_core.lowering import Compute, Finish, Reshard

    hw = hardware_profile(hardware)
    size = dict(program.buf_bytes)
    mat = materialized(program)
    consts = set(program.graph.consts)
    steps = program.instructions
    # fused values: readers read their materialized sources instead
    sources: dict = {}

    def srcs(b):
        if b in consts:
            return ()
        if b in mat or b not in sources:
            return (b,)
        return sources[b]

    compute_t = comm_t = total_flops = comm_bytes = 0.0
    kernels = 0
    eff_reads: list = []
    for ins in steps:
        reads = []
        for b in _reads(ins):
            reads.extend(srcs(b))
        reads = list(dict.fromkeys(reads))
        eff_reads.append(reads)
        if isinstance(ins, Compute):
            writes = [b for b in ins.writes if b in mat]
            for b in ins.writes:
                if b not in mat:
                    sources[b] = tuple(reads)
            moved = sum(size.get(b, 0) for b in reads) + sum(size.get(b, 0) for b in writes)
            compute_t += max(ins.flops / hw.peak_flops, moved / hw.hbm_bw)
            total_flops += ins.flops
            if writes:
                kernels += 1
        elif isinstance(ins, Reshard):
            steps_n = len(ins.plan.steps) if ins.plan is not None else max(1, len(ins.collectives))
            kernels += steps_n
            compute_t += 2 * ins.dst.local_bytes / hw.hbm_bw
        if isinstance(ins, (Reshard, Finish)):
            comm_bytes += sum(c.bytes for c in ins.collectives)
    for group in combined_collectives(program):
        c = group[0]
        comm_t += hw.collective_time(c.kind, c.axes, sum(g.bytes for g in group),
                                     program.mesh.group_size(tuple(c.axes)), operands=len(group))
    compute_t += kernels * hw.op_overhead_s + hw.launch_s
    # memory: arguments all program long; outputs and temporaries by liveness (see the module docstring)
    ins_set = set(program.graph.invars)
    out_set = set(program.out_bufs)
    arg_bytes = sum(size.get(v, 0) for v in program.graph.invars)
    outs = [b for b in out_set if b not in ins_set]
    out_bytes = sum(size.get(b, 0) for b in outs)
    if len(program.out_bufs) > 1:
        out_bytes += 8 * len(program.out_bufs)  # the output tuple's table of pointers
    last: dict = {}
    for t, reads in enumerate(eff_reads):
        for b in reads:
            last[b] = t
    end = len(steps)
    first: dict = {}
    for t, ins in enumerate(steps):
        for b in _writes(ins):
            if b in mat and b not in ins_set:
                first.setdefault(b, t)
    # an elementwise kernel writes its result in place of an operand of the same size it reads last
    for t, ins in enumerate(steps):
        if isinstance(ins, Compute) and program.graph.eqns[ins.eqn_index].name in FUSIBLE:
            sizes = {size.get(b, 0) for b in ins.writes if b in mat}
            for b in eff_reads[t]:
                if last.get(b) == t and b in first and b not in out_set and size.get(b, 0) in sizes:
                    last[b] = t - 1
                    sizes.discard(size.get(b, 0))
    temps = {b: (t, max(last.get(b, t), t)) for b, t in first.items() if b not in out_set}
    for t, ins in enumerate(steps):
        factor = isinstance(ins, Compute) and SCRATCH.get(program.graph.eqns[ins.eqn_index].name)
        if factor:
            size[("scratch", t)] = factor * sum(size.get(b, 0) for b in ins.writes)
            temps[("scratch", t)] = (t, t)
    heap = _heap_peak(temps, {b: (first.get(b, 0), end) for b in outs}, size)
    return Simulation(compute_t + comm_t, int(arg_bytes + out_bytes + heap), comm_bytes, total_flops, compute_t,
                      comm_t, hw.name, kernels, int(arg_bytes), int(out_bytes), int(heap))


def _heap_peak(temps: dict, outs: dict, size: dict) -> int:
    """Peak bytes of the temporaries that do not share an output's allocation.

    As XLA's buffer assignment does, temporaries are taken largest first, each placed in the first output
    allocation at least its size whose values (the output from its write to the end, and the temporaries
    already placed there) are never live at the same time as it; the others are live in the temporary block,
    whose size is the peak of their live bytes. ``temps`` and ``outs`` map a buffer to its live range
    ``(first step, last step)``, both inclusive."""
    allocs = [(size.get(b, 0), [rng]) for b, rng in sorted(outs.items(), key=lambda kv: -size.get(kv[0], 0))]
    rest = []
    for b, (s, e) in sorted(temps.items(), key=lambda kv: (-size.get(kv[0], 0), kv[1])):
        for cap, ranges in allocs:
            if cap >= size.get(b, 0) and all(e < s2 or e2 < s for s2, e2 in ranges):
                ranges.append((s, e))
                break
        else:
            rest.append((s, e, size.get(b, 0)))
    events = sorted([(s, n) for s, _, n in rest] + [(e + 1, -n) for _, e, n in rest], key=lambda x: (x[0], x[1]))
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return peak


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
