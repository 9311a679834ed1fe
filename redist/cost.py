"""Alpha-beta cost model per mesh axis: what a plan (or a list of XLA's collectives) takes in modeled seconds.

    topo = redist.cost.topology("2x8-nodes", mesh)     # the first mesh axis crosses nodes
    seconds = redist.cost.plan_time(plan, topo)

Model. Every mesh axis has a link ``(alpha seconds, beta bytes/s)``. A collective over axes ``A`` (mesh axes
or sub-axes ``name:(pre)size``, which use their axis's link) costs

    time = max_{a in A} alpha_a + bytes_on_wire / min_{a in A} beta_a

where ``bytes_on_wire`` is what one device receives in it, counted exactly as :mod:`redist.steps` counts
(all_gather ``(k−1)/k · L_out``, all_to_all ``(k−1)/k · L``, reduce_scatter ``(k−1)/k · L_in``, all_reduce
``2(k−1)/k · L``, a permute the buffer a device gets from another device). A step that moves no bytes (an
``all_slice``, a permute in which nobody moves) costs nothing, and so does a group of one device. A permute's
axes are those along which some device's source differs from it. A plan's time is the sum of its steps'
times: steps run one after the other, and nothing overlaps.

The model deliberately charges one ``alpha`` per collective whatever the group size (a ring would pay ``k−1``
latencies, a tree ``log k``): it ranks plans that move different volumes, and it prices XLA's collectives,
parsed from its HLO by :mod:`redist.hlo`, with the same formula so that both sides compare on one
scale (:func:`records_time`).

Refinements, for callers that know more about a collective than its axes (partir_core's simulator prices a
whole program's collectives with them; :func:`plan_time` and :func:`records_time` price by axes only, so that
plans and XLA's collectives stay on one scale). A :class:`Link` may charge ``alpha_per_peer`` seconds for
every group member after the first; a :class:`Topology` may give a collective *kind* a link of its own
(``kind_links``: a system calibrated per kind; ``all_reduce_max``/``all_reduce_min`` without an entry take
``all_reduce``'s), and may charge each further operand of a combined collective ``combine_ratio`` of its
latency (XLA merges independent all-reduces into one). In full, :func:`collective_time` of ``operands``
combined collectives of ``kind`` over ``k`` devices is

    (alpha + alpha_per_peer · (k − 1)) · (1 + combine_ratio · (operands − 1)) + bytes_on_wire / beta

with ``(alpha, alpha_per_peer, beta)`` the kind's link if the topology has one, else the axes' link.

Presets (:data:`PRESETS`, mapped onto a mesh's axes by :func:`topology`):

- ``"tpu-v4"``: a slice of the TPU v4 3-D torus, every mesh axis on ICI.
- ``"nvlink-8"``: 8 GPUs joined by NVLink, every axis on NVLink.
- ``"2x8-nodes"``: 2 nodes of 8 GPUs: the FIRST mesh axis crosses nodes (InfiniBand), the others NVLink.
- ``"cpu-host"``: JAX host devices in one process, from the calibration :class:`Profile` in use.

Calibration profiles. A :class:`Profile` holds the measured figures of one system: the link of a collective
run as a program of its own (the ``cpu-host`` preset), per kind, the latency of a collective inside a larger
program, and the compute figures that partir_core's simulator reads. The shipped ``cpu-host`` profile is
package data (``redist/profiles/cpu-host.json``), read on first use (:func:`profile`), never at import, so an
installed package and a checkout price alike. :func:`load_profile` reads one from a file or a dict, and
:func:`use_profile` makes one the profile in use (``bench/calibrate_cpu_host.py`` and ``bench/partitioning.py
--calibrate`` write the file the package reads in a checkout)::

    redist.cost.use_profile("my-host.json")     # same schema as redist/profiles/cpu-host.json
    redist.cost.use_profile(None)               # back to the shipped profile
"""

from __future__ import annotations

import importlib.resources
import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import numpy as np

from redist import program as P
from redist import steps as S
from redist.axes import axis_name, split_common
from redist.blocks import DeviceClasses, exchange_segments, permute_groups, rank, remote_copies
from redist.errors import ShardingError, shown
from redist.lowering import lower_step
from redist.mesh import Mesh
from redist.plan import Plan

__all__ = [
    "Link", "Topology", "PRESETS", "topology", "as_topology", "preset_names", "collective_time", "step_time",
    "step_axes", "exchange_time", "exchange_time_lower_bound", "plan_time", "plan_time_lower_bound", "fastest",
    "cheap_to_price", "records_time", "cpu_host_link", "Profile", "load_profile", "use_profile", "profile",
    "PROFILE_RESOURCE",
]


@dataclass(frozen=True)
class Link:
    """One mesh axis's link: ``alpha`` seconds of latency per collective, ``beta`` bytes/s received per device,
    and ``alpha_per_peer`` seconds of latency for every group member after the first (0: a flat latency)."""

    alpha: float
    beta: float
    alpha_per_peer: float = 0.0

    def __post_init__(self):
        if not (_is_real(self.alpha) and self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ShardingError(f"link latency alpha={shown(self.alpha)} must be a finite number >= 0 seconds")
        if not (_is_real(self.beta) and self.beta > 0 and math.isfinite(self.beta)):
            raise ShardingError(f"link bandwidth beta={shown(self.beta)} must be a finite number > 0 bytes/s")
        if not (_is_real(self.alpha_per_peer) and self.alpha_per_peer >= 0 and math.isfinite(self.alpha_per_peer)):
            raise ShardingError(f"link latency per peer alpha_per_peer={shown(self.alpha_per_peer)} must be a "
                                "finite number >= 0 seconds")

    def latency(self, group: int) -> float:
        """Seconds of latency of one collective over ``group`` devices."""
        return self.alpha + self.alpha_per_peer * (group - 1)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class Topology:
    """Per-axis links of a mesh: ``links`` pairs every mesh axis name with its :class:`Link`.

    ``name`` says which system it models. Build one from a preset with :func:`topology`, or directly.
    ``kind_links`` pairs collective kinds (``"all_gather"``, ``"all_reduce"``, ...) with the link that a
    collective of that kind runs at whatever its axes (a system calibrated per kind); ``combine_ratio`` is the
    share of a collective's latency that each further operand of a combined collective costs (see the module
    docstring; both are used only where :func:`collective_time` is given the kind and operand count).
    """

    name: str
    links: tuple[tuple[str, Link], ...]
    kind_links: tuple[tuple[str, Link], ...] = ()
    combine_ratio: float = 0.0

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise ShardingError(f"a topology's name must be a string, got {shown(self.name)}")
        try:
            links = tuple((n, l) for n, l in self.links)
        except (TypeError, ValueError):
            links = None
        if links is None or not all(isinstance(n, str) and isinstance(l, Link) for n, l in links):
            raise ShardingError(f"topology {self.name!r}: links must be (mesh axis name, redist.cost.Link) pairs, "
                                f"got {shown(self.links)}")
        object.__setattr__(self, "links", links)
        try:
            kinds = tuple((k, l) for k, l in self.kind_links)
        except (TypeError, ValueError):
            kinds = None
        if kinds is None or not all(isinstance(k, str) and isinstance(l, Link) for k, l in kinds):
            raise ShardingError(f"topology {self.name!r}: kind_links must be (collective kind, redist.cost.Link) "
                                f"pairs, got {shown(self.kind_links)}")
        object.__setattr__(self, "kind_links", kinds)
        if not (_is_real(self.combine_ratio) and 0 <= self.combine_ratio < math.inf):
            raise ShardingError(f"topology {self.name!r}: combine_ratio={shown(self.combine_ratio)} must be a "
                                "finite number >= 0")

    def link(self, axis: str) -> Link:
        """The link of a mesh axis, or of the mesh axis that a sub-axis (an :class:`~redist.axes.Axis`, or its
        token ``name:(pre)size``) is part of."""
        name = axis_name(axis)
        for n, link in self.links:
            if n == name:
                return link
        raise ShardingError(
            f"topology {self.name!r} has no link for mesh axis {name!r}; it covers axes "
            f"{', '.join(n for n, _ in self.links) or '(none)'}"
        )

    def axes_link(self, axes: Iterable[str]) -> Link:
        """The link a collective over ``axes`` runs at: the largest alpha and the smallest beta among them."""
        links = [self.link(a) for a in axes]
        if not links:
            raise ShardingError("a collective over no axes has no link")
        return Link(max(l.alpha for l in links), min(l.beta for l in links), max(l.alpha_per_peer for l in links))

    def kind_link(self, kind: str) -> Link | None:
        """The link of collective ``kind`` if the topology gives the kind one (``all_reduce_max`` and
        ``all_reduce_min`` fall back to ``all_reduce``'s), else None."""
        links = dict(self.kind_links)
        if kind not in links and kind.startswith("all_reduce_"):
            kind = "all_reduce"
        return links.get(kind)


# ---------------------------------------------------------------------------------------------- presets
# TPU v4 ICI: each chip has 6 ICI links (±x, ±y, ±z of the 3-D torus); the JAX scaling book ("How to Think
# About TPUs", table of chip specs) gives 4.5e10 bytes/s per link per direction for v4 (9e10 bidirectional),
# and about 1 µs per hop of latency. We charge one direction per axis (45 GB/s) and alpha = 2 µs (a couple
# of hops plus launch): conservative for rings that use both directions, and the same on every axis.
TPU_V4_ICI = Link(alpha=2e-6, beta=45e9)
# NVLink inside one 8-GPU node: A100 NVLink 3 is 300 GB/s per direction per GPU on paper; NCCL's measured
# all-gather/all-to-all "bus bandwidth" on such nodes is around 150-230 GB/s (nccl-tests doc/PERFORMANCE.md
# defines bus bandwidth as exactly this bytes-received accounting). We take 150 GB/s and alpha = 5 µs, the
# usual small-message latency of an NCCL collective inside a node.
NVLINK = Link(alpha=5e-6, beta=150e9)
# Between nodes: one 200 Gb/s HDR InfiniBand NIC per GPU gives 25 GB/s per direction; the latency of an
# inter-node NCCL collective is some 10-20 µs (network round trip plus proxy thread), so alpha = 15 µs.
INFINIBAND_200G = Link(alpha=15e-6, beta=25e9)


def cpu_host_link(path: str | os.PathLike | None = None) -> Link:
    """The ``cpu-host`` link: that of the profile in use (:func:`profile`), or of the profile file ``path``
    (read by :func:`load_profile`, which raises :class:`ShardingError` for a file it cannot read)."""
    return (profile() if path is None else load_profile(path)).link


def _uniform(link: Link | Callable[[], Link]):
    def build(mesh: Mesh) -> tuple[tuple[str, Link], ...]:
        l = link() if callable(link) else link
        return tuple((n, l) for n in mesh.names)
    return build


def _two_nodes(mesh: Mesh) -> tuple[tuple[str, Link], ...]:
    # The first mesh axis is the node axis: every collective over it (or over a part of it) crosses nodes.
    return tuple((n, INFINIBAND_200G if i == 0 else NVLINK) for i, n in enumerate(mesh.names))


PRESETS: dict[str, Callable[[Mesh], tuple[tuple[str, Link], ...]]] = {
    "tpu-v4": _uniform(TPU_V4_ICI),
    "nvlink-8": _uniform(NVLINK),
    "2x8-nodes": _two_nodes,
    "cpu-host": _uniform(cpu_host_link),
}


def preset_names() -> tuple[str, ...]:
    return tuple(PRESETS)


def topology(name: str, mesh: Mesh) -> Topology:
    """The preset ``name`` laid over ``mesh``'s axes. Raises :class:`ShardingError` for an unknown name."""
    if not isinstance(mesh, Mesh):
        raise ShardingError(f"topology() needs a redist.Mesh, got {type(mesh).__name__}")
    build = PRESETS.get(name) if isinstance(name, str) else None
    if build is None:
        raise ShardingError(f"unknown topology preset {shown(name)}; known presets: {', '.join(PRESETS)}")
    return Topology(name, build(mesh))


def as_topology(value, mesh: Mesh, *more: Mesh) -> Topology | None:
    """A ``topology=`` argument as the :class:`Topology` it names on ``mesh`` (and the meshes ``more``, for a
    plan across meshes): None stays None (no cost model), a preset name is laid over each mesh
    (:func:`topology`; an axis name on two meshes takes its link on the first), and a :class:`Topology` must
    give a link to every axis of every mesh. Anything else raises :class:`ShardingError`."""
    if value is None:
        return None
    if isinstance(value, str):
        laid = [topology(value, m) for m in (mesh, *more)]
        if len(laid) == 1 or all(m == mesh for m in more):
            return laid[0]
        return Topology(value, tuple({n: link for t in reversed(laid) for n, link in t.links}.items()))
    if not isinstance(value, Topology):
        raise ShardingError(f"topology must be a preset name ({', '.join(PRESETS)}) or a redist.cost.Topology, "
                            f"got {type(value).__name__} {shown(value)}")
    for m in (mesh, *more):
        for name in m.names:
            value.link(name)  # raises, naming the axis it lacks
    return value


# ---------------------------------------------------------------------------------------------- pricing
def collective_time(axes: Iterable[str], nbytes: float, topo: Topology, kind: str | None = None, group: int = 1,
                    operands: int = 1) -> float:
    """Seconds of a collective over ``axes`` in which a device receives ``nbytes``; 0 when it moves no bytes.

    ``alpha_A + nbytes / beta_A`` by default. Given its ``kind``, the number of devices in its ``group`` and the
    number of ``operands`` combined in it, the full formula of the module docstring (the kind's link if
    ``topo`` has one, latency per peer, combined operands)."""
    axes = tuple(axes)
    if nbytes <= 0 or not axes:
        return 0.0
    link = (kind is not None and topo.kind_link(kind)) or topo.axes_link(axes)
    return link.latency(group) * (1 + topo.combine_ratio * (operands - 1)) + float(nbytes) / link.beta


def step_axes(step, t_in) -> tuple[str, ...]:
    """The axes a step communicates over: its own axes, or for a permute or an exchange the mesh axes along
    which some device's source device differs from it (in mesh order), never found device by device: for a
    permute from its groups' axes, for an exchange per class of devices (:class:`redist.blocks.DeviceClasses`
    of the axes the step's layouts use). An exchange is priced as one collective over them (one latency). A
    transfer runs between meshes, over links no axis of either names: it is priced as one collective over every
    axis of both (their slowest link, one latency)."""
    if isinstance(step, (S.Permute, S.Exchange)) and step.apply(t_in).mesh != t_in.mesh:
        return _reordered_axes(step, t_in)
    if isinstance(step, S.Permute):
        return _permute_axes(t_in, step.apply(t_in))
    if isinstance(step, S.Exchange):
        return _exchange_axes(t_in, step.apply(t_in))
    if isinstance(step, (S.AllSlice, S.Pad, S.Unpad, S.ReplicateToPartial, S.ShardToPartial, S.SelectToPartial)):
        return ()
    if isinstance(step, S.Transfer):
        return tuple(dict.fromkeys(t_in.mesh.names + step.mesh.names))
    return t_in.mesh.axes_of(step.axes)


def _reordered_axes(step, t_in) -> tuple[str, ...]:
    """The mesh axes (on ``t_in``'s mesh) along which some device's source differs from it, for a permute or
    an exchange to another device order: read device by device from its lowered tables (a mesh in another
    order is a table of its devices)."""
    mesh = t_in.mesh
    pairs = []
    for ins in lower_step(step, t_in):
        for d in mesh.devices:
            if isinstance(ins, P.CollectivePermute):
                pairs.append((d, ins.source_of(mesh, d)))
            else:
                pairs += [(d, c.source) for c in ins.copies(mesh, d)]
    return mesh.varying_axes((d, s) for d, s in pairs if s != d)


def _permute_axes(t_in, t_out) -> tuple[str, ...]:
    """The mesh axes on which some device's source in a permute differs from it, from the axes of its groups
    (:func:`redist.blocks.permute_groups`) alone, visiting no device. In a group ``(source_axes, axes)``, both
    cut into common pieces, the source's digit on a piece ``p`` of ``source_axes`` is the digit at ``p``'s place
    value ``v`` (the product of the sizes of the pieces after it) of the device's rank over ``axes``. It is the
    device's own digit on ``p`` everywhere if ``axes`` has ``p`` at place value ``v`` too; else some device's
    differs: one whose digit on ``p`` is free of that rank if ``axes`` lacks ``p``; the one whose rank is ``v``
    (digit 0 on ``p``, taking 1) if ``axes`` has ``p`` at a larger place value; the one whose only nonzero
    digit is a 1 on ``p`` (taking 0) if at a smaller one."""
    moved = set()
    for source_axes, axes in permute_groups(t_in, t_out):
        source_pieces, pieces = split_common([source_axes, axes])
        at = dict(_place_values(pieces))
        moved |= {p[0] for p, v in _place_values(source_pieces) if at.get(p) != v}
    return tuple(n for n in t_in.mesh.names if n in moved)


def _place_values(pieces) -> list[tuple[tuple[str, int, int], int]]:
    """Each piece ``(name, lo, hi)`` of a list (major to minor) that has more than one coordinate, with its place
    value in the mixed-radix rank over the list: the product of the sizes of the pieces after it."""
    out, below = [], 1
    for p in reversed(pieces):
        if p[2] > p[1]:
            out.append((p, below))
            below *= p[2] // p[1]
    return out


def _exchange_axes(t_in, t_out) -> tuple[str, ...]:
    """The mesh axes on which some copy's sender differs from its receiver in an exchange. A sender differs
    from its receiver only on ``t_in``'s dim axes, where it has its segment's source block: per receiver block,
    the coordinates on each such axis that its segments read from are compared with the receiver's own (a
    device whose block has no segment in some dim receives no copy)."""
    mesh = t_in.mesh
    classes = DeviceClasses(mesh, [a for t in (t_in, t_out) for d in t.dims for a in d])
    c = classes.coords
    receives = np.ones(classes.size, bool)
    differs = {n: np.zeros(classes.size, bool) for n in mesh.names}
    for source_axes, axes, segs in zip(t_in.dims, t_out.dims, exchange_segments(t_in, t_out)):
        k = mesh.group_size(axes)
        block = np.broadcast_to(rank(c, axes), (classes.size,))
        blocks = np.array([g.block for g in segs], np.int64)
        count = np.bincount(blocks, minlength=k)
        receives &= count[block] > 0
        below = 1
        for a in reversed(source_axes):  # the coordinate on ``a`` of each segment's source block
            coord = np.array([g.source_block // below % a.size for g in segs], np.int64)
            below *= a.size
            least, most = np.full(k, a.size, np.int64), np.full(k, -1, np.int64)
            np.minimum.at(least, blocks, coord)
            np.maximum.at(most, blocks, coord)
            own = (c[a.name] // a.stride) % a.size
            differs[a.name] |= (count[block] > 0) & ((least[block] != most[block]) | (least[block] != own))
    return tuple(n for n in mesh.names if np.any(receives & differs[n]))


def step_time(step, t_in, topo: Topology) -> float:
    """Modeled seconds of one plan step applied to type ``t_in`` (an exchange: :func:`exchange_time`)."""
    nbytes = step.bytes_received(t_in)
    if nbytes == 0:
        return 0.0
    if isinstance(step, S.Exchange):
        return exchange_time(step, t_in, topo)
    return collective_time(step_axes(step, t_in), float(nbytes), topo)


def exchange_time(step: S.Exchange, t_in, topo: Topology) -> float:
    """Modeled seconds of an exchange: the rounds it runs (:meth:`redist.program.Exchange.rounds`, one
    ``ppermute`` each in the JAX backend) one after the other, each a collective over the mesh axes along which
    its senders and receivers differ, moving the round's slab: the largest copy of the round along each dim
    (the static shape every sender of the round sends). One latency per round, not one in all."""
    (ins,) = lower_step(step, t_in)
    return sum(collective_time(axes, math.prod(slab) * t_in.itemsize, topo)
               for slab, axes in ins.round_stats(t_in.mesh))


# An exchange whose devices receive more copies than this in all is priced exactly only where its lower bound
# says it may be the fastest candidate (see :func:`cheap_to_price`): listing its rounds is linear in its copies.
_CHEAP_COPIES = 1 << 18


def _most_copies(step: S.Exchange, t_in) -> int:
    """The most copies from other devices that one of a few devices (the first, middle and last) receives in an
    exchange (:func:`redist.blocks.remote_copies`, from their blocks, without the exchange's tables): at most
    one arrives per round, so the exchange runs at least that many rounds."""
    devices, t_out = t_in.mesh.devices, step.apply(t_in)
    return max(remote_copies(t_in, t_out, devices[i]) for i in {0, len(devices) // 2, len(devices) - 1})


def exchange_time_lower_bound(step: S.Exchange, t_in, topo: Topology) -> float:
    """A lower bound on :func:`exchange_time` that does not list the exchange's rounds: at least as many
    rounds as the copies from other devices that one device receives (one arrives per round), each paying at
    least the smallest latency, whose slabs add up to at least what the device that receives most receives,
    over the fastest link."""
    nbytes = step.bytes_received(t_in)
    if nbytes == 0:
        return 0.0
    links = [topo.link(n) for n in t_in.mesh.names]
    return (_most_copies(step, t_in) * min(l.alpha for l in links) + float(nbytes) / max(l.beta for l in links))


def cheap_to_price(plan) -> bool:
    """Whether :func:`plan_time` of ``plan`` is cheap: its exchanges (if any) have few copies in all (about
    2**18; every other step is priced from its type)."""
    return all(not isinstance(s, S.Exchange) or s.apply(t).mesh != t.mesh
               or _most_copies(s, t) * t.mesh.size <= _CHEAP_COPIES for s, t in zip(plan.steps, plan.types))


def plan_time_lower_bound(plan, topo: Topology) -> float:
    """A lower bound on :func:`plan_time`: each exchange by :func:`exchange_time_lower_bound`, the other steps
    exactly (they are priced from their types alone)."""
    return sum(exchange_time_lower_bound(s, t, topo) if isinstance(s, S.Exchange) and s.apply(t).mesh == t.mesh
               else step_time(s, t, topo) for s, t in zip(plan.steps, plan.types))


def fastest(plans, topo: Topology, times: dict | None = None) -> tuple[Plan, float]:
    """The fastest of ``plans`` by :func:`plan_time` and its time; ties: fewer bytes, then fewer steps, then the
    first. Branch and bound: plans are priced exactly in order of :func:`plan_time_lower_bound`, and the search
    stops at the first whose bound exceeds the best time found, so an exchange of thousands of rounds that a
    collective plan beats is never listed round by round. ``times`` (keyed by ``id(plan)``) keeps the exact
    times across calls. A plan that cannot be priced without listing more than
    :data:`redist.blocks.MAX_LISTED` entries (an exchange on a mesh of millions of devices, whose rounds are
    read device by device) is passed over; if no plan can be priced, that :class:`ShardingError` is raised."""
    times = {} if times is None else times
    bounds, refused = [], None
    for p in plans:
        try:
            bounds.append(times[id(p)] if id(p) in times else plan_time_lower_bound(p, topo))
        except ShardingError as e:
            bounds.append(math.inf)
            refused = refused or e
    best = None
    for i in sorted(range(len(plans)), key=bounds.__getitem__):
        p = plans[i]
        if best is not None and bounds[i] > best[0][0] * (1 + 1e-9):  # not a tie that rounding hides
            break
        if bounds[i] == math.inf:  # its lower bound could not be priced
            continue
        try:
            if id(p) not in times:
                times[id(p)] = plan_time(p, topo)
            key = (times[id(p)], p.bytes_received, len(p.steps), i)
        except ShardingError as e:
            refused = refused or e
            continue
        if best is None or key < best[0]:
            best = (key, p)
    if best is None:
        raise refused
    return best[1], best[0][0]


def plan_time(plan, topo: Topology | str) -> float:
    """Modeled seconds of a :class:`redist.Plan` on ``topo`` (a :class:`Topology` or a preset name, laid over
    every mesh the plan runs on: :func:`as_topology`): the sum of its steps' times."""
    if not isinstance(plan, Plan):
        raise ShardingError(f"plan_time() takes a redist.Plan, got {type(plan).__name__} {shown(plan)}")
    if topo is None:
        raise ShardingError(f"plan_time() needs a topology: a preset name ({', '.join(PRESETS)}) or a Topology")
    topo = as_topology(topo, *dict.fromkeys(t.mesh for t in plan.types))
    return sum(step_time(s, t, topo) for s, t in zip(plan.steps, plan.types))


def records_time(records, topo: Topology) -> float:
    """Modeled seconds of a list of collectives given as records with ``.span`` (the mesh axes a group
    spans) and ``.bytes_received`` (per device, the most any device receives in it), such as
    :class:`redist.hlo.Collective`. Local ops (bytes 0) cost nothing."""
    return sum(collective_time(r.span, r.bytes_received, topo) for r in records)


# ---------------------------------------------------------------------------------------------- profiles
PROFILE_RESOURCE = "profiles/cpu-host.json"  # the shipped cpu-host profile, package data of redist
# JAX's names of the calibrated collectives, as redist names the kinds
_JAX_KINDS = {"ppermute": "permute"}
_COMPUTE_FIELDS = ("peak_flops", "hbm_bw", "op_overhead_s", "launch_s")


@dataclass(frozen=True)
class Profile:
    """The calibration of one system (schema: ``redist/profiles/cpu-host.json``).

    ``link``: a collective run as a program of its own (the ``cpu-host`` preset's link on every axis), fitted as
    ``alpha + bytes / beta``; ``kind_links``: the same fit per collective kind. ``in_program``: per kind, a
    collective inside a larger program, whose latency is far below a program launch (``alpha``, per peer
    ``alpha_per_peer``, the kind's bandwidth); ``combine_ratio``: see :class:`Topology`. ``compute``:
    per-device ``peak_flops``, ``hbm_bw`` (bytes/s), ``op_overhead_s`` (per kernel) and ``launch_s`` (per
    program), which partir_core's simulator reads. ``source`` says where it was read from."""

    name: str
    link: Link
    kind_links: tuple[tuple[str, Link], ...]
    in_program: tuple[tuple[str, Link], ...]
    combine_ratio: float
    compute: tuple[tuple[str, float], ...]
    source: str

    def in_program_topology(self, mesh: Mesh) -> Topology:
        """Collectives inside one program: :attr:`link` on every axis of ``mesh``; per kind, the kind's
        standalone link overridden by its in-program latency; ``combine_ratio``."""
        kinds = {**dict(self.kind_links), **dict(self.in_program)}
        return Topology(f"{self.name} (in program)", tuple((n, self.link) for n in mesh.names),
                        tuple(kinds.items()), self.combine_ratio)


def load_profile(source) -> Profile:
    """Read a calibration profile: ``source`` is a path to its JSON file, the parsed JSON (a dict), or a
    :class:`Profile` (returned as it is). Raises :class:`ShardingError` naming the file and the field for a
    file that cannot be read or a field that is missing or not a number."""
    if isinstance(source, Profile):
        return source
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(source) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise ShardingError(f"cannot read the calibration profile {os.fspath(source)!r}: {e}") from None
        return _parse_profile(data, repr(os.fspath(source)))
    if isinstance(source, Mapping):
        return _parse_profile(source, "given as a dict")
    raise ShardingError(f"a calibration profile is a path to a JSON file, a dict or a redist.cost.Profile, "
                        f"got {type(source).__name__}")


def _parse_profile(data, where: str) -> Profile:
    """The :class:`Profile` of parsed JSON ``data``; ``where`` names it in errors."""
    def fail(what):
        raise ShardingError(f"calibration profile {where}: {what}")

    def section(name):
        value = data.get(name) if isinstance(data, Mapping) else None
        if not isinstance(value, Mapping):
            fail(f"needs a {name!r} object")
        return value

    def number(value, path):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(f"{path} must be a number, got {value!r}")
        return float(value)

    def link(alpha, beta, path, per_peer=0.0):
        try:
            return Link(alpha, beta, per_peer)
        except ShardingError as e:
            fail(f"{path}: {e}")

    def fitted(obj, path):  # {"alpha": s, "beta": B/s}
        if not isinstance(obj, Mapping):
            fail(f"{path} must be an object with alpha and beta, got {obj!r}")
        return link(number(obj.get("alpha"), f"{path}.alpha"), number(obj.get("beta"), f"{path}.beta"), path)

    link_data, compute = section("link"), section("compute")
    base = fitted(link_data, "link")
    kinds = {_JAX_KINDS.get(k, k): fitted(v, f"link.per_kind.{k}") for k, v in link_data.get("per_kind", {}).items()}
    in_program = []
    for k, pair in compute.get("collective_alpha", {}).items():
        path = f"compute.collective_alpha.{k}"
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            fail(f"{path} must be [alpha, alpha_per_peer], got {pair!r}")
        kind = _JAX_KINDS.get(k, k)
        alpha, per_peer = number(pair[0], f"{path}[0]"), number(pair[1], f"{path}[1]")
        in_program.append((kind, link(alpha, kinds.get(kind, base).beta, path, per_peer)))
    return Profile(str(data.get("name", "cpu-host")), base, tuple(kinds.items()), tuple(in_program),
                   number(compute.get("combine_ratio"), "compute.combine_ratio"),
                   tuple((k, number(compute.get(k), f"compute.{k}")) for k in _COMPUTE_FIELDS), where)


_in_use: Profile | None = None


def profile() -> Profile:
    """The calibration profile in use: the one given to :func:`use_profile`, else the shipped ``cpu-host``
    profile (package data ``redist/`` :data:`PROFILE_RESOURCE`, read on the first call)."""
    global _in_use
    if _in_use is None:
        resource = importlib.resources.files("redist").joinpath(PROFILE_RESOURCE)
        try:
            data = json.loads(resource.read_text())
        except (OSError, ValueError) as e:
            raise ShardingError(f"cannot read redist's shipped calibration profile {resource}: {e}; the "
                                "installation is incomplete") from None
        _in_use = _parse_profile(data, f"{resource}")
    return _in_use


def use_profile(source) -> Profile:
    """Make ``source`` (see :func:`load_profile`) the calibration profile in use, for the ``cpu-host`` preset
    and partir_core's ``cpu-host`` hardware; ``None`` goes back to the shipped profile. Returns the profile now
    in use. Plans and simulations made before keep the figures they were made with. Raises
    :class:`ShardingError` (and keeps the profile in use) for a profile that cannot be read."""
    global _in_use
    _in_use = None if source is None else load_profile(source)
    return profile()
