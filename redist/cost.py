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
parsed from its HLO by :mod:`redist.xla_baseline`, with the same formula so that both sides compare on one
scale (:func:`records_time`).

Presets (:data:`PRESETS`, mapped onto a mesh's axes by :func:`topology`):

- ``"tpu-v4"``: a slice of the TPU v4 3-D torus, every mesh axis on ICI.
- ``"nvlink-8"``: 8 GPUs joined by NVLink, every axis on NVLink.
- ``"2x8-nodes"``: 2 nodes of 8 GPUs: the FIRST mesh axis crosses nodes (InfiniBand), the others NVLink.
- ``"cpu-host"``: JAX host devices in one process, calibrated by ``bench/calibrate_cpu_host.py``, which writes
  ``bench/results/cpu_host_profile.json``; that file is read when present, otherwise :data:`CPU_HOST_DEFAULT`.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Callable, Iterable

from redist import steps as S
from redist.errors import ShardingError, shown
from redist.mesh import Mesh
from redist.plan import Plan

__all__ = [
    "Link", "Topology", "PRESETS", "CPU_HOST_DEFAULT", "CPU_HOST_PROFILE", "topology", "as_topology", "preset_names",
    "collective_time", "step_time", "step_axes", "plan_time", "records_time", "cpu_host_link",
]


@dataclass(frozen=True)
class Link:
    """One mesh axis's link: ``alpha`` seconds of latency per collective, ``beta`` bytes/s received per device."""

    alpha: float
    beta: float

    def __post_init__(self):
        if not (_is_real(self.alpha) and self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ShardingError(f"link latency alpha={shown(self.alpha)} must be a finite number >= 0 seconds")
        if not (_is_real(self.beta) and self.beta > 0 and math.isfinite(self.beta)):
            raise ShardingError(f"link bandwidth beta={shown(self.beta)} must be a finite number > 0 bytes/s")


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class Topology:
    """Per-axis links of a mesh: ``links`` pairs every mesh axis name with its :class:`Link`.

    ``name`` says which system it models. Build one from a preset with :func:`topology`, or directly.
    """

    name: str
    links: tuple[tuple[str, Link], ...]

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

    def link(self, token: str) -> Link:
        """The link of a mesh axis, or of the axis a sub-axis token ``name:(pre)size`` is part of."""
        name = token.split(":", 1)[0]
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
        return Link(max(l.alpha for l in links), min(l.beta for l in links))


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
# JAX host (CPU) devices when no calibration file exists: what bench/calibrate_cpu_host.py measured on a
# shared 2-core machine (alpha 288 µs, beta 1.78 GB/s; collectives there are memcpys between threads, paced by
# a per-collective rendezvous). Regenerate the file rather than trusting this on another machine.
CPU_HOST_DEFAULT = Link(alpha=3e-4, beta=1.8e9)
CPU_HOST_PROFILE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results", "cpu_host_profile.json")


def cpu_host_link(path: str | None = None) -> Link:
    """The ``cpu-host`` link: from the calibration file (``{"alpha": s, "beta": B/s, ...}``) if it exists,
    else :data:`CPU_HOST_DEFAULT`. A file that exists but cannot be read raises :class:`ShardingError`."""
    path = CPU_HOST_PROFILE if path is None else path
    if not os.path.exists(path):
        return CPU_HOST_DEFAULT
    try:
        with open(path) as f:
            data = json.load(f)
        return Link(float(data["alpha"]), float(data["beta"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ShardingError(f"cannot read the cpu-host profile {path}: {e}") from None


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


def as_topology(value, mesh: Mesh) -> Topology | None:
    """A ``topology=`` argument as the :class:`Topology` it names on ``mesh``: None stays None (no cost
    model), a preset name is laid over ``mesh`` (:func:`topology`), and a :class:`Topology` must give a link
    to every axis of ``mesh``. Anything else raises :class:`ShardingError`."""
    if value is None:
        return None
    if isinstance(value, str):
        return topology(value, mesh)
    if not isinstance(value, Topology):
        raise ShardingError(f"topology must be a preset name ({', '.join(PRESETS)}) or a redist.cost.Topology, "
                            f"got {type(value).__name__} {shown(value)}")
    for name in mesh.names:
        value.link(name)  # raises, naming the axis it lacks
    return value


# ---------------------------------------------------------------------------------------------- pricing
def collective_time(axes: Iterable[str], nbytes: float, topo: Topology) -> float:
    """``alpha_A + nbytes / beta_A`` for a collective over ``axes``; 0 when it moves no bytes."""
    axes = tuple(axes)
    if nbytes <= 0 or not axes:
        return 0.0
    link = topo.axes_link(axes)
    return link.alpha + float(nbytes) / link.beta


def step_axes(step, t_in) -> tuple[str, ...]:
    """The axes a step communicates over: its own axes, or for a permute or an exchange the mesh axes along
    which some device's source device differs from it (in mesh order). An exchange is priced as one
    collective over them (one latency)."""
    if isinstance(step, S.Permute):
        sources = S.permute_sources(t_in, step.apply(t_in))
        return t_in.mesh.varying_axes((d, s) for d, s in enumerate(sources) if s != d)
    if isinstance(step, S.Exchange):
        copies = S.exchange_copies(t_in, step.apply(t_in))
        return t_in.mesh.varying_axes((d, c.source) for d, cs in enumerate(copies) for c in cs if c.source != d)
    if isinstance(step, (S.AllSlice, S.Pad, S.Unpad)):
        return ()
    return tuple(step.axes)


def step_time(step, t_in, topo: Topology) -> float:
    """Modeled seconds of one plan step applied to type ``t_in``."""
    nbytes = step.bytes_received(t_in)
    if nbytes == 0:
        return 0.0
    return collective_time(step_axes(step, t_in), float(nbytes), topo)


def plan_time(plan, topo: Topology | str) -> float:
    """Modeled seconds of a :class:`redist.Plan` on ``topo`` (a :class:`Topology` or a preset name): the sum of
    its steps' times."""
    if not isinstance(plan, Plan):
        raise ShardingError(f"plan_time() takes a redist.Plan, got {type(plan).__name__} {shown(plan)}")
    if topo is None:
        raise ShardingError(f"plan_time() needs a topology: a preset name ({', '.join(PRESETS)}) or a Topology")
    topo = as_topology(topo, plan.src.mesh)
    return sum(step_time(s, t, topo) for s, t in zip(plan.steps, plan.types))


def records_time(records, topo: Topology) -> float:
    """Modeled seconds of a list of collectives given as records with ``.span`` (the mesh axes a group
    spans) and ``.bytes_received`` (per device, the most any device receives in it), such as
    :class:`redist.xla_baseline.Collective`. Local ops (bytes 0) cost nothing."""
    return sum(collective_time(r.span, r.bytes_received, topo) for r in records)
