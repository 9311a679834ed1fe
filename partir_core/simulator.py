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
- Collectives: as the compiled program runs them (:func:`combined_collectives`: each pack of reshards,
  :mod:`partir_core.packing`, is one collective; XLA merges independent all-reduces of one reduction over the
  same devices into one, whose every operand after the first still costs a share of a collective's
  latency), each priced by redist's cost model (:func:`redist.cost.collective_time`
  with its kind, group size and number of combined operands) on the hardware's :meth:`Hardware.topology` of
  the program's mesh: ``bytes`` the bytes a device receives (redist's accounting; summed over a combined
  group), per-axis links, and where the topology has them per-kind links, latency per peer and the combine
  ratio.
- Memory: what XLA's ``compiled.memory_analysis()`` reports for the compiled program, argument + output +
  temp − alias bytes per device, in the order the program runs its instructions (its packs' members
  together, :func:`partir_core.packing.schedule`): every input's local buffer (all program long); every
  output's allocation (and, for several outputs, the output tuple's 8-byte pointers); and the temporary
  block. Materialized temporaries (reshard results and intermediate values) are live from the op that writes
  them to their last effective read, outputs from their write to the end. A pack holds its members' buffers
  laid end to end (before and after its collective) while it runs, and its members' results (cut from one
  buffer) until the last of them is read. An elementwise kernel writes its result in place of an
  operand of the same size it reads last, where it reads that operand elementwise (not through a fused
  broadcast, slice or transpose, unless a transpose of a matmul's result: :data:`REINDEXING`). As XLA's
  buffer assignment does, a temporary reuses an output's allocation when it fits in it and is dead before that
  output is written (largest temporaries first); the temporary block holds the peak of the others live at
  once. Nothing is donated, so nothing aliases. An op that XLA runs as a loop over buffers of its own
  (:data:`SCRATCH`: the threefry hash of ``random_bits``) also holds that scratch while it runs.
- Step time: ``launch_s`` (one program launch) + kernels x ``op_overhead_s`` + compute + collectives, in
  sequence (nothing overlaps).
- Control flow (:class:`~partir_core.program.ControlFlow`): a loop costs its trip count times its body (a
  while loop: its cond_fun and body; an unknown trip count counts 1), plus :data:`LOOP_KERNELS` per
  iteration; a cond its costliest branch. Each body is a block of its own: its parameters are the loop's
  state, its results temporaries live to its end, and its peak of temporaries is held beside the loop while it
  runs. The loop's results (carries and stacked ``ys``) are written when it starts (XLA's while loop keeps its
  state in one set of buffers for its whole life, the stacked results' filled in place); like any temporary
  they may share an output's allocation once dead. Collectives in a body combine among themselves and run as
  often as it does. A local form that communicates (a static permutation's ``ppermute``,
  :mod:`partir_core.permutation`) adds its collectives where it runs.
- Pipelines (:class:`partir_core.Pipeline`): a loop whose body rotates its state by a stage (a static
  permutation of a dim, at the top of the body) is a pipelined loop, the forward one or its transpose. Its
  time, kernels and collectives included, is :attr:`Simulation.pipeline_time_s`; of each of its ``T`` ticks,
  every stage idles in ``S - 1`` (``S``: the rotated dim), which is the bubble (:attr:`Simulation.bubble_time_s`,
  :attr:`Simulation.bubble_fraction`; :mod:`partir_core.pipeline_schedule` derives it). The microbatch
  activations the backward pass reads are the forward loop's stacked residuals, live from that loop to the
  backward one like any loop result.

Presets (:data:`HARDWARE`): ``"cpu-host"`` (the default; JAX host devices, from redist's calibration profile
in use, :func:`redist.cost.profile`: its compute figures, and its in-program collective latencies, read when the
preset is first asked for, never at import), ``"tpu-v4"``, ``"a100-nvlink"``; any :class:`Hardware` may be
passed instead.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from itertools import accumulate
from dataclasses import dataclass
from typing import Callable

import numpy as np

from redist import cost
from redist.errors import ShardingError, shown
from redist.mesh import Mesh

from partir_core import packing
from partir_core.instructions import Compute, ControlFlow, Finish, Reshard, changes_of, reads_of, writes_of
from partir_core.reshard import Collective


@dataclass(frozen=True)
class Hardware:
    """One device's compute, and the network between devices.

    ``peak_flops`` (FLOP/s) and ``hbm_bw`` (bytes/s) per device, ``op_overhead_s`` per kernel, ``launch_s`` per
    program. ``network`` prices collectives with :mod:`redist.cost`'s model: a :func:`redist.cost.topology`
    preset name, a :class:`redist.cost.Link` for every mesh axis, or a function from a :class:`redist.Mesh` to
    a :class:`redist.cost.Topology` (per-axis links, per-kind links, combined collectives)."""

    name: str
    peak_flops: float
    hbm_bw: float
    network: str | cost.Link | Callable[[Mesh], cost.Topology]
    op_overhead_s: float = 0.0
    launch_s: float = 0.0

    def __post_init__(self):
        if not (isinstance(self.network, (str, cost.Link)) or callable(self.network)):
            raise ShardingError(f"Hardware {self.name!r}: network must be a redist.cost preset name, a "
                                f"redist.cost.Link or a function mesh -> redist.cost.Topology, got "
                                f"{type(self.network).__name__} {self.network!r}")

    def topology(self, mesh: Mesh) -> cost.Topology:
        """The :class:`redist.cost.Topology` of :attr:`network` on ``mesh``."""
        if isinstance(self.network, str):
            return cost.topology(self.network, mesh)
        if isinstance(self.network, cost.Link):
            return cost.Topology(self.name, tuple((n, self.network) for n in mesh.names))
        return self.network(mesh)


def cpu_host() -> Hardware:
    """The ``cpu-host`` preset from the calibration profile in use (:func:`redist.cost.profile`): its compute
    figures, and collectives as they run inside one program (per-kind latency and bandwidth, latency per
    peer, combined all-reduces: :meth:`redist.cost.Profile.in_program_topology`)."""
    profile = cost.profile()
    compute = dict(profile.compute)
    return Hardware("cpu-host", compute["peak_flops"], compute["hbm_bw"], profile.in_program_topology,
                    op_overhead_s=compute["op_overhead_s"], launch_s=compute["launch_s"])


class _Presets(Mapping):
    """The hardware presets by name. ``"cpu-host"`` is made from the calibration profile in use each time it
    is looked up (:func:`cpu_host`), so that nothing is read at import and a profile put in use later counts."""

    _fixed = {
        # redist.cost's tpu-v4 link (ICI) on every axis
        "tpu-v4": Hardware("tpu-v4", peak_flops=2.75e14, hbm_bw=1.2e12, network="tpu-v4", op_overhead_s=1e-6),
        # NVLink 3 at its nominal 300 GB/s per direction (redist.cost's nvlink-8 preset takes NCCL's measured
        # 150 GB/s)
        "a100-nvlink": Hardware("a100-nvlink", peak_flops=1.56e14, hbm_bw=1.55e12, network=cost.Link(5e-6, 3e11),
                                op_overhead_s=4e-6),
    }

    def __getitem__(self, name: str) -> Hardware:
        return cpu_host() if name == "cpu-host" else self._fixed[name]

    def __iter__(self):
        return iter(("cpu-host", *self._fixed))

    def __len__(self) -> int:
        return 1 + len(self._fixed)


HARDWARE: Mapping[str, Hardware] = _Presets()

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
# Fusible ops that read their operand's elements at other positions than they write them (or several times): a
# kernel that reads a buffer through one of them cannot write its result in that buffer's place (XLA shares an
# operand's buffer with a fusion's result only where every use of the operand in the fusion is elementwise). A
# row-major reshape is a bitcast, and a transpose of a matmul's result is folded into the matmul (its operands
# swapped): neither reindexes.
REINDEXING = {"broadcast_in_dim", "transpose", "iota", "slice", "dynamic_slice", "pad", "concatenate"}
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
# Kernels a loop runs per iteration besides its body's: the loop's own test and counter, and the slices of its
# stacked operands and results (XLA's while loop on the CPU backend).
LOOP_KERNELS = 1
TAKES_FUSED = FUSIBLE | {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                         "argmax", "argmin"}


@dataclass(frozen=True)
class Simulation:
    """Per-device predictions: seconds per step, peak live bytes, bytes received, FLOPs. The memory figures are
    None where they were not asked for (:func:`simulate`'s ``memory``)."""

    step_time_s: float
    peak_bytes: int | None
    comm_bytes: float
    flops: float
    compute_time_s: float
    comm_time_s: float
    hardware: str
    kernels: int = 0
    argument_bytes: int | None = 0
    output_bytes: int | None = 0
    temp_bytes: int | None = 0
    pipeline_time_s: float = 0.0
    bubble_time_s: float = 0.0
    pipeline: object = None

    @property
    def bubble_fraction(self) -> float:
        """The share of the pipelined loops' time that stages idle in the bubble (0 without a pipeline;
        :mod:`partir_core.pipeline_schedule` derives its value, ``(S - 1) / (M·R + S - 1)``)."""
        return self.bubble_time_s / self.pipeline_time_s if self.pipeline_time_s else 0.0

    def schedule_picture(self) -> str:
        """Which stage runs which microbatch at each tick of the pipelined loop
        (:meth:`partir_core.pipeline_schedule.Schedule.picture`). Raises :class:`redist.ShardingError` for a
        program without a pipeline."""
        if self.pipeline is None:
            raise ShardingError("this program has no pipeline (partir_core.Pipeline) to picture")
        return self.pipeline.picture()

    def __str__(self):
        bubble = (f", pipeline {self.pipeline_time_s * 1e3:.3f} ms of which bubble {100 * self.bubble_fraction:.1f}%"
                  if self.pipeline_time_s else "")
        return (f"{self.hardware}: step {self.step_time_s * 1e3:.3f} ms (compute {self.compute_time_s * 1e3:.3f}, "
                f"comm {self.comm_time_s * 1e3:.3f}{bubble}), peak {self.peak_bytes} B (args {self.argument_bytes}, "
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
    """The buffers of ``program`` that get memory of their own (see the module docstring); inside control
    flow, every body's parameters and results, and what its own kernels materialize."""
    g = program.graph
    base = set(g.invars) | set(program.out_bufs)
    return _materialized(program, g.primitives(), program.instructions, base).difference(g.consts)


def _materialized(program, names: list, steps: list, out: set) -> set:
    """The materialized buffers of one block ``steps`` whose parameters and results are ``out`` (a copy is
    extended); a region's bodies are blocks of their own. ``names``: the primitive of every equation.

    One walk, consumers first: when an instruction is reached, every reader of what it writes has been, so its
    writes are decided (``reach[b]``: the kernels, as instruction indices, that read ``b`` directly or through
    the fused values that read it; ``unfused``: the buffers some reader cannot take fused), and then what its
    own kernel reaches is handed to its operands."""
    g = program.graph
    reach: dict = {}  # buffer -> the kernels its readers (those that take fused operands) reach so far
    unfused: set = set()  # buffers read by an instruction that cannot take them fused (not TAKES_FUSED)
    reductions: set = set()  # the instructions whose kernels may be library reductions (their primitive's)
    out = set(out)
    libraries: dict = {}  # instruction (one of reductions) -> whether its kernel is a library reduction, once asked

    def library(t):
        found = libraries.get(t)
        if found is None:
            ins = steps[t]
            found = libraries[t] = _library_reduction(names[ins.eqn_index], program.buf_bytes.get(ins.reads[0], 0),
                                                      g.dtype(ins.writes[0]))
        return found

    get = reach.get
    for t in reversed(range(len(steps))):
        ins = steps[t]
        if type(ins) is not Compute:
            unfused.update(reads_of(ins))  # a reshard, a collective or control flow reads a buffer of its own
            if isinstance(ins, Reshard):
                out.add(ins.dst_buf)
            elif isinstance(ins, ControlFlow):
                out.update(ins.writes)
                reg = g.regions[ins.region]
                params = set(g.eqns[reg.enter].outvars)
                for body, results in zip(ins.bodies, ins.results):
                    out |= _materialized(program, names, body, params | set(results))
            continue
        name = names[ins.eqn_index]
        fusible = name in FUSIBLE
        mine = None  # the kernels its operands reach through it: its own, or (its results all fused) theirs
        for b in ins.writes:
            ks = get(b)
            if not (fusible and ks) or b in unfused:
                out.add(b)
                mine = _OWN
                continue
            if len(ks) > 1 and (name in EXPENSIVE or not reductions.isdisjoint(ks)
                                and any(library(k) for k in reductions.intersection(ks))):
                out.add(b)
                mine = _OWN
            elif mine is not _OWN:
                mine = ks if mine is None else mine | ks
        if name not in TAKES_FUSED:
            unfused.update(ins.reads)
            continue
        if name in LIBRARY_REDUCTIONS:
            reductions.add(t)
        mine = frozenset((t,)) if mine is None or mine is _OWN else mine
        for b in ins.reads:
            ks = get(b)
            reach[b] = mine if ks is None or ks is mine else ks | mine
    return out


_OWN = frozenset()  # (_materialized) an instruction some of whose results are materialized: its kernel is its own


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
    :class:`~partir_core.reshard.Collective`), each group one collective of the compiled program.

    The program runs each pack of reshards (:mod:`partir_core.packing`) as one collective: here one
    :class:`~partir_core.reshard.Collective` whose bytes are its members', where its last member is. XLA's
    all-reduce combiner merges all-reduces of the same reduction over the same devices into one tuple
    all-reduce when none of them depends on another's result; it has no counterpart for all-gathers,
    reduce-scatters, all-to-alls or permutes on the CPU backend, which stay one collective each (as the
    compiled HLO shows). Modelled greedily in the order the program runs: an all-reduce joins the open group of its
    ``(kind, axes)`` unless its operand depends on a member of that group, which closes the group. The
    combiner works within one computation: a loop body's collectives combine among themselves (a group then
    runs as often as the loop's body: its members' ``trips``), none with those around the loop; around it, an
    all-reduce after the loop joins one before it unless it depends on it (the loss's sum, made before a
    backward scan, joins the gradients' sums after it)."""
    return _combined(program.instructions, _Emission())


class _Emission(dict):
    """How each block of one program runs, found once per block (by its identity: the program holds its blocks
    while it is simulated): ``(its instructions in the order they run, {position there of a packed reshard: the
    position of its pack's last member}, {that last position: the pack's one collective})``, the packs of
    :func:`partir_core.packing.packs` in :func:`partir_core.packing.schedule`'s order."""

    def __call__(self, steps: list) -> tuple:
        got = self.get(id(steps))
        if got is None:
            got = self[id(steps)] = _emitted(steps)
        return got


def _emitted(steps: list) -> tuple:
    """What :class:`_Emission` gives for the block ``steps``, found anew."""
    found = packing.packs(steps)
    if not found:
        return steps, {}, {}
    ran, at, cols = [], {}, {}
    for unit in packing.schedule(steps, found):
        if not isinstance(unit, tuple):
            ran.append(steps[unit])
            continue
        members = [steps[t] for t in unit]
        ran += members
        end = len(ran) - 1
        at.update(dict.fromkeys(range(len(ran) - len(members), len(ran)), end))
        parts = [c for m in members for c in m.collectives]
        cols[end] = Collective(parts[0].kind, parts[0].axes, sum(c.bytes for c in parts),
                               f"a pack of {len(members)} reshards, {parts[-1].where}", parts[0].trips)
    return ran, at, cols


def _combined(steps: list, emission: _Emission) -> list:
    """:func:`combined_collectives` of one block of instructions (its regions' bodies as blocks of their own)."""
    steps, at, packed = emission(steps)
    deps: dict = {}  # buffer -> bitmask of the collectives (in the order met) its value depends on
    groups: list = []
    open_group: dict = {}  # (kind, axes) -> (index into groups, bitmask of its members)
    n = 0
    members: list = []  # the open pack's earlier members: their results are written with its last member's
    get = deps.get
    for t, ins in enumerate(steps):
        if type(ins) is Compute and not ins.collectives:  # the common case, inline: its results depend on its operands
            mask = 0
            for b in ins.reads:
                mask |= get(b, 0)
            for b in ins.writes:
                deps[b] = mask
            continue
        mask = 0
        for b in reads_of(ins):
            mask |= get(b, 0)
        if isinstance(ins, ControlFlow):
            # its bodies' collectives combine among themselves, with none of this block's: an all-reduce after
            # it joins a group opened before it unless it depends on a member (through the region's operands)
            for body in ins.bodies:
                groups += _combined(body, emission)
        elif t in at and t not in packed:  # a pack's earlier member: its result comes with the pack's
            members.append((mask, changes_of(ins)))
            continue
        else:
            collectives = ins.collectives
            if t in at:  # a pack's last member: the pack's one collective, after every member's operands
                collectives = (packed[t],)
                for m, _ in members:
                    mask |= m
            for c in collectives:
                bit = 1 << n
                n += 1
                key = (c.kind, tuple(c.axes))
                if c.kind.startswith("all_reduce") and key in open_group and not mask & open_group[key][1]:
                    g, in_group = open_group[key]
                    groups[g].append(c)
                    open_group[key] = (g, in_group | bit)
                else:
                    groups.append([c])
                    if c.kind.startswith("all_reduce"):
                        open_group[key] = (len(groups) - 1, bit)
                mask |= bit  # a later step of the same reshard reads this one's result
            for _, written in members:
                for b in written:
                    deps[b] = mask
            members.clear()
        for b in changes_of(ins):
            deps[b] = mask
    return groups


def collectives_time(collectives, hardware, mesh: Mesh) -> float:
    """Seconds ``collectives`` (:class:`~partir_core.reshard.Collective`) take one after another on ``hardware``
    (a :class:`Hardware`) over ``mesh``, each priced alone by :func:`redist.cost.collective_time` and run its
    ``trips`` times: what one reshard costs, where :func:`simulate` prices the program's collectives as XLA
    combines them."""
    topology = hardware.topology(mesh)
    return sum(c.trips * cost.collective_time(c.axes, c.bytes, topology, kind=c.kind,
                                              group=mesh.group_size(tuple(c.axes))) for c in collectives)


def simulate(program, hardware=None, memory: bool = True) -> Simulation:
    """Simulate a :class:`partir_core.program.LocalProgram` on ``hardware`` (a preset name or a Hardware). With
    ``memory`` False, the live ranges are not worked out: the step time and the other figures are the same, the
    memory figures (``peak_bytes``, ``argument_bytes``, ``output_bytes``, ``temp_bytes``) are None (what a
    search without a memory budget asks of most candidates)."""
    hw = hardware_profile(hardware)
    g = program.graph
    walker = _Walker(program, hw, memory)
    ins_set, out_set = set(g.invars), set(program.out_bufs)
    outs = [b for b in out_set if b not in ins_set]
    blk = walker.block(program.instructions, ins_set, outs)
    topo = hw.topology(program.mesh)
    comm_t = _comm_time(_combined(program.instructions, walker.emission), topo, program.mesh)
    compute_t = blk.compute_s + blk.kernels * hw.op_overhead_s + hw.launch_s
    pipelined = _pipelined(walker, topo)
    if not memory:
        return Simulation(compute_t + comm_t, None, blk.comm_bytes, blk.flops, compute_t, comm_t, hw.name,
                          blk.kernels, None, None, None, *pipelined)
    # memory: arguments all program long; outputs and temporaries by liveness (see the module docstring)
    arg_bytes = sum(walker.size.get(v, 0) for v in g.invars)
    out_bytes = sum(walker.size.get(b, 0) for b in outs)
    if len(program.out_bufs) > 1:
        out_bytes += 8 * len(program.out_bufs)  # the output tuple's table of pointers
    return Simulation(compute_t + comm_t, int(arg_bytes + out_bytes + blk.heap), blk.comm_bytes, blk.flops,
                      compute_t, comm_t, hw.name, blk.kernels, int(arg_bytes), int(out_bytes), int(blk.heap),
                      *pipelined)


def _comm_time(groups: list, topo, mesh) -> float:
    """Seconds of the combined collectives ``groups`` (:func:`combined_collectives`), each as often as it runs."""
    total = 0.0
    for group in groups:
        c = group[0]
        total += c.trips * cost.collective_time(c.axes, sum(m.bytes for m in group), topo, kind=c.kind,
                                                group=mesh.group_size(tuple(c.axes)), operands=len(group))
    return total


def _pipelined(walker: "_Walker", topo) -> tuple:
    """``(pipeline_time_s, bubble_time_s, schedule)`` of the program's pipelined loops (see the module
    docstring; ``schedule``: the graph's first :class:`partir_core.pipeline_schedule.Schedule`, or None)."""
    hw, program = walker.hw, walker.program
    total = bubble = 0.0
    for ins, stages, blk in walker.pipelined:
        t = blk.compute_s + blk.kernels * hw.op_overhead_s
        t += _comm_time([g for body in ins.bodies for g in _combined(body, walker.emission)], topo, program.mesh)
        total += t
        bubble += t * (stages - 1) / max(ins.trips, 1)
    return total, bubble, next(iter(program.graph.pipelines), None)


@dataclass
class _Block:
    """What one block of instructions costs per run: compute seconds (without kernel overheads), FLOPs,
    kernels, bytes received, and the peak of its temporaries (None where the walk works out no memory)."""

    compute_s: float
    flops: float
    kernels: float
    comm_bytes: float
    heap: int | None


class _Walker:
    """Walks a program's blocks (the program, and each region's bodies): time, FLOPs, kernels and bytes in
    program order, and with ``memory`` the peak of the temporaries by liveness (see the module docstring)."""

    def __init__(self, program, hw: Hardware, memory: bool = True):
        self.program = program
        self.hw = hw
        self.memory = memory
        # buffer -> bytes; the memory walk adds the scratch an op holds while it runs (heap), to a copy
        self.size = dict(program.buf_bytes) if memory else program.buf_bytes
        self.names = program.graph.primitives()
        self.mat = materialized(program)
        self.consts = set(program.graph.consts)
        self.sources: dict = {}  # a fused value -> the materialized buffers its readers read instead
        self.pipelined: list = []  # (ControlFlow, stages, its _Block) of every pipelined loop (_pipelined)
        self.emission = _Emission()

    def srcs(self, b):
        if b in self.consts:
            return ()
        if b in self.mat or b not in self.sources:
            return (b,)
        return self.sources[b]

    def block(self, steps: list, params: set, outs: list) -> _Block:
        """The cost of ``steps`` whose parameters (inputs, or a body's) are ``params``, and whose results
        ``outs`` (the program's outputs, given allocations of their own; a body's results are temporaries
        live to its end)."""
        hw, size, mat, consts, sources = self.hw, self.size, self.mat, self.consts, self.sources
        names, srcs, get, memory = self.names, self.srcs, size.get, self.memory
        peak_flops, hbm_bw = hw.peak_flops, hw.hbm_bw
        compute_t = flops = comm_bytes = kernels = 0.0
        # the live ranges, gathered in the same walk: the first write of each materialized buffer (not a
        # parameter), the last effective read of each buffer, and the elementwise kernels that may write in
        # place of an operand (``(instruction, the effective reads it takes elementwise, the sizes of its
        # results)``; ``aligned``: the materialized buffers a fused value reads elementwise; ``matmuls``: the
        # buffers matmuls write)
        first: dict = {}
        last: dict = {}
        in_place: list = []
        aligned: dict = {}
        matmuls: set = set()
        scratch: dict = {}  # instruction -> bytes it holds while it runs, beside its operands and results
        steps, pack_at, _ = self.emission(steps)  # in the order they run
        held: dict = {}  # a pack's position -> its members' results (cut from one buffer, freed together)
        for t, ins in enumerate(steps):
            if type(ins) is Compute:
                # srcs of each read, inlined: the hot loop of a simulation
                reads = []
                for b in ins.reads:
                    if b in consts:
                        continue
                    if b in mat or b not in sources:
                        reads.append(b)
                    else:
                        reads.extend(sources[b])
                if len(reads) > 1:
                    reads = list(dict.fromkeys(reads))
                moved = 0  # bytes its kernel reads and writes
                for b in reads:
                    moved += get(b, 0)
                writes = []
                fused = False
                for b in ins.writes:
                    if b in mat:
                        writes.append(b)
                        moved += get(b, 0)
                    else:
                        sources[b] = tuple(reads)
                        fused = True
                compute_t += max(ins.flops / peak_flops, moved / hbm_bw)
                flops += ins.flops
                if writes:
                    kernels += 1
                if ins.collectives:
                    kernels += len(ins.collectives)
                    comm_bytes += sum(c.bytes for c in ins.collectives)
                if memory:
                    for b in reads:
                        last[b] = t
                    for b in writes:
                        if b not in params and b not in first:
                            first[b] = t
                    name = names[ins.eqn_index]
                    if name in FUSIBLE and (writes or fused):
                        if name not in REINDEXING:
                            through = self.aligned_reads(ins.reads, aligned)
                        elif name == "transpose":
                            through = [b for b in self.aligned_reads(ins.reads, aligned) if b in matmuls]
                        else:
                            through = ()
                        if writes:
                            in_place.append((t, through, {get(b, 0) for b in writes}))
                        if fused:
                            for b in ins.writes:
                                if b not in mat:
                                    aligned[b] = through
                    elif name == "dot_general":
                        matmuls.update(writes)
                    factor = SCRATCH.get(name)
                    if factor:
                        scratch[t] = factor * sum(get(b, 0) for b in ins.writes)
                continue
            if memory:
                at = pack_at.get(t, t)  # a packed reshard runs where its pack does, beside a buffer of each side
                for b in dict.fromkeys([r for b in reads_of(ins) for r in srcs(b)]):
                    last[b] = max(at, last.get(b, at))
                for b in writes_of(ins):
                    if b in mat and b not in params and b not in first:
                        first[b] = at
                if t in pack_at:
                    scratch[at] = scratch.get(at, 0) + get(ins.src_buf, 0) + get(ins.dst_buf, 0)
                    held.setdefault(at, []).append(ins.dst_buf)
            if isinstance(ins, Reshard):
                kernels += len(ins.move.plan.steps)
                compute_t += 2 * ins.dst.local_bytes / hbm_bw
            elif isinstance(ins, ControlFlow):
                body = self.region(ins)
                compute_t += body.compute_s
                flops += body.flops
                kernels += body.kernels
                comm_bytes += body.comm_bytes
                if memory:
                    scratch[t] = body.heap
            if isinstance(ins, (Reshard, Finish)):
                comm_bytes += sum(c.bytes for c in ins.collectives)
        if memory:
            for bufs in held.values():
                end = max(last.get(b, 0) for b in bufs)
                last.update(dict.fromkeys(bufs, end))
        heap = self.heap(steps, first, last, in_place, outs, scratch) if memory else None
        return _Block(compute_t, flops, kernels, comm_bytes, heap)

    def aligned_reads(self, reads: list, aligned: dict) -> list:
        """The materialized buffers an elementwise kernel reading ``reads`` reads elementwise: those it reads
        directly, and those its fused operands read elementwise (``aligned``)."""
        consts, mat, sources = self.consts, self.mat, self.sources
        out = []
        for b in reads:
            if b in consts:
                continue
            if b in mat or b not in sources:
                out.append(b)
            else:
                out.extend(aligned.get(b, ()))
        return out

    def region(self, ins: ControlFlow) -> _Block:
        """A region per execution: a loop's body (a while loop's cond_fun too) as often as it runs, plus
        :data:`LOOP_KERNELS` per iteration; a cond's costliest branch. Its heap: the largest body's."""
        params = set(self.program.graph.eqns[self.program.graph.regions[ins.region].enter].outvars)
        bodies = [self.block(body, params, list(results)) for body, results in zip(ins.bodies, ins.results)]
        heap = max((b.heap for b in bodies), default=0) if self.memory else None
        if ins.kind == "cond":
            worst = max(bodies, key=lambda b: (b.compute_s, b.kernels))
            return _Block(worst.compute_s, worst.flops, worst.kernels, worst.comm_bytes, heap)
        n = ins.trips
        blk = _Block(n * sum(b.compute_s for b in bodies), n * sum(b.flops for b in bodies),
                     n * (sum(b.kernels for b in bodies) + LOOP_KERNELS), n * sum(b.comm_bytes for b in bodies), heap)
        stages = self.rotated_stages(ins)
        if stages:
            self.pipelined.append((ins, stages, blk))
        return blk

    def rotated_stages(self, ins: ControlFlow) -> int:
        """The stages a pipelined loop rotates its state over (the size of the dim a static permutation at the
        top of its body permutes), or 0 for any other region."""
        if ins.kind != "scan":
            return 0
        g = self.program.graph
        for step in ins.bodies[0]:
            if type(step) is Compute and self.names[step.eqn_index] == "permute_dim":
                eqn = g.eqns[step.eqn_index]
                return g.shape(eqn.invars[0])[eqn.params["dim"]]
        return 0

    def heap(self, steps, first: dict, last: dict, in_place: list, outs: list, scratch: dict) -> int:
        """Peak bytes of the temporaries of one block (see the module docstring), from the live ranges
        :meth:`block` gathered (``last`` is changed)."""
        size = self.size
        out_set = set(outs)
        end = len(steps)
        # an elementwise kernel writes its result in place of an operand of the same size it reads last (and
        # elementwise)
        for t, reads, sizes in in_place:
            for b in reads:
                if last.get(b) == t and b in first and b not in out_set and size.get(b, 0) in sizes:
                    last[b] = t - 1
                    sizes.discard(size.get(b, 0))
        temps = {b: (t, max(last.get(b, t), t)) for b, t in first.items() if b not in out_set}
        for t, n in scratch.items():
            size[("scratch", id(steps), t)] = n
            temps[("scratch", id(steps), t)] = (t, t)
        return _heap_peak(temps, {b: (first.get(b, 0), end) for b in outs}, size)


def _heap_peak(temps: dict, outs: dict, size: dict) -> int:
    """Peak bytes of the temporaries that do not share an output's allocation.

    As XLA's buffer assignment does, temporaries are taken largest first, each placed in the first output
    allocation at least its size whose values (the output from its write to the end, and the temporaries
    already placed there) are never live at the same time as it; the others are live in the temporary block,
    whose size is the peak of their live bytes. ``temps`` and ``outs`` map a buffer to its live range
    ``(first step, last step)``, both inclusive."""
    # per output allocation: its capacity, and the starts and ends of the live ranges placed there (the
    # output's own first), sorted; they are disjoint, so sorted by start they are sorted by end
    allocs = [(size.get(b, 0), [s], [e]) for b, (s, e) in sorted(outs.items(), key=lambda kv: -size.get(kv[0], 0))]
    rest = []
    get = size.get
    # largest first, then by live range, then as given: sorted as tuples (in C), the index breaking ties
    order = sorted([(-get(b, 0), s, e, j) for j, (b, (s, e)) in enumerate(temps.items())])
    for minus_n, s, e, _ in order:
        n = -minus_n
        for cap, starts, ends in allocs:
            if cap < n:  # allocations come largest first: none after this one fits either
                rest.append((s, e, n))
                break
            j = bisect.bisect_right(starts, e)  # the ranges before j start by e; the last of them ends last
            if j == 0 or ends[j - 1] < s:
                starts.insert(j, s)
                ends.insert(j, e)
                break
        else:
            rest.append((s, e, n))
    events = sorted([(s, n) for s, _, n in rest] + [(e + 1, -n) for _, e, n in rest])
    return max(0, max(accumulate([n for _, n in events]), default=0))
