"""The one bridge from partir_core to redist: how a buffer moves from one sharding type to another.

Every reshard of a partitioned program (an operand that lacks the type its op needs, a pending sum reduced, an
output brought to its type) is a :class:`redist.Plan` obtained here (:func:`move`): the synthesizer's
(:func:`redist.synthesize`: memory-bounded, fewest bytes received), sub-axes (``model:(2)2``) included. Only
when the synthesizer gives no plan does the bridge build the one XLA's partitioner falls back to (reduce the
pending sums, all-gather to replicated, slice locally: :attr:`Move.fallback` says why; the program lists these
in ``LocalProgram.fallbacks``). Either way redist's own step accounting prices it (:attr:`Move.collectives`,
:func:`reshard_bytes`, bounded from below without planning by :func:`reshard_floor`; :func:`finish_bytes`
prices the all-reduce that finishes a max/min reduction the same way), and redist's JAX interpreter runs it
(:func:`run`), so partir_core runs no collective of its own but the ``pmax``/``pmin`` of those finishes. Moves
are cached per (source, destination) pair in a bounded LRU (:func:`move`), and the synthesizer's plans per
shape-free pattern of a pair (:func:`_synthesized`); :func:`clear_cache` forgets both.

Sub-axes. JAX collectives need real mesh axis names, so a plan over sub-axes runs on a *refined* mesh: the same
devices in the same order, every axis split at the boundaries its tokens use (as :mod:`redist.jax` runs such
plans). A partitioned program runs in one ``jax.shard_map``; it runs over the mesh refined at every cut point
that any of its plans or of its values' types uses (a tactic may name a sub-axis: :mod:`partir_core.tactics`;
:func:`refine`), and wherever partir_core names mesh axes (specs, ``axis_index``, ``pmax``) it names their
refined pieces (:class:`AxisNames`). A group over a whole axis is the group over all its pieces, ranked
row-major, so nothing else changes; a program that names no sub-axis runs on the mesh itself.

Meshes. A program runs on the JAX mesh it is given, or on the devices its redist mesh's device ids name
(:func:`device_mesh`); :func:`mesh_of` is the redist mesh of a JAX mesh.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Mapping

import jax
import numpy as np
from jax.sharding import PartitionSpec

import redist
from redist import steps as S
from redist.axes import difference
from redist.bounds import check_pair, lower_bound_bytes
from redist.jax import packing_of, redist_mesh, refine_mesh, run_packed, run_program
from redist.types import ShardingType

from partir_core import keys


@dataclass(frozen=True)
class Collective:
    """One collective of the partitioned program: its ``kind`` (a plan step's, or ``all_reduce_max`` /
    ``all_reduce_min`` finishing a reduction), the mesh axes or sub-axes it runs over (a permute: all mesh axes),
    the ``bytes`` a device receives in it (redist's accounting), ``where`` in the program it is, and how often
    it runs per call (``trips``: inside a loop body, the loop's trip count; so a device receives ``bytes *
    trips`` in it per call)."""

    kind: str
    axes: tuple
    bytes: float
    where: str
    trips: int = 1


@dataclass(frozen=True)
class Move:
    """How a buffer of type ``plan.src`` becomes one of type ``plan.dst``: a redist ``plan``, the
    synthesizer's unless ``fallback`` (why there is none) is set."""

    plan: redist.Plan
    fallback: str | None = None

    @functools.cached_property
    def collectives(self) -> tuple[tuple[str, tuple, float], ...]:
        """``(kind, axes, bytes received per device)`` of every step that communicates (all but local slices);
        a step without axes of its own (a permute, an exchange) runs over all mesh axes."""
        mesh_axes = self.plan.src.mesh.names
        return tuple((s.kind, tuple(getattr(s, "axes", ()) or mesh_axes), float(b))
                     for s, b in zip(self.plan.steps, self.plan.step_bytes()) if s.kind != "all_slice")

    @property
    def bytes(self) -> float:
        """Bytes a device receives over the whole move."""
        return float(sum(b for _, _, b in self.collectives))


@functools.lru_cache(maxsize=4096)
def move(src: ShardingType, dst: ShardingType) -> Move:
    """The move from ``src`` to ``dst`` (cached; see the module docstring). Raises
    :class:`redist.ShardingError` for a pair no redistribution can do (``dst`` partial over an axis ``src``
    is not, different shapes or meshes)."""
    try:
        return Move(_synthesized(src, dst))
    except redist.ShardingError as e:
        check_pair(src, dst)  # an impossible pair is the caller's error, not a reason to fall back
        return Move(_gather_then_slice(src, dst), f"{type(e).__name__}: {e}")


def _synthesized(src: ShardingType, dst: ShardingType) -> redist.Plan:
    """:func:`redist.synthesize`'s plan from ``src`` to ``dst``, made from the plan of the pair's *pattern* where
    the pair has one (:func:`_pattern`): the same types with each dim ``d`` of size ``gcd(d, N)`` (``N`` the mesh's
    size). Between even types on one device order that create no pending sums, a plan depends on the shape only
    through which of the types' splits divide which dim, and every split is a product of (sub-)axes that divides
    ``N``, so ``d`` splits evenly exactly where ``gcd(d, N)`` does; and every candidate's bytes and peak scale
    with the global size alike, so the search ranks them alike. The pattern's steps are therefore the shape's
    (``tests/partir_core/test_reshard_pattern.py`` checks the plans equal on random pairs), and pairs that differ in
    shape only share one search: the automatic search's new pairs on the reference transformer fall from about
    790 to about 420."""
    key = _pattern_key(src, dst)
    if key is None:
        return redist.synthesize(src, dst)
    return redist.Plan.from_steps(src, _pattern_plan(*key).steps)


def _pattern_key(src: ShardingType, dst: ShardingType) -> tuple | None:
    """What the pair's pattern is made of (see :func:`_synthesized`): its mesh, shape and dtype and each type's
    dims, pending axes and reduction; None where it has none (uneven types, two device orders, created pending
    sums, an empty dim, two shapes or dtypes) or is the pair itself."""
    n = src.mesh.size
    shape = tuple(math.gcd(d, n) for d in src.shape)
    if (shape == src.shape or src.mesh != dst.mesh or src.shape != dst.shape or src.dtype != dst.dtype
            or not all(src.shape) or not (src.is_even() and dst.is_even()) or difference(dst.partial, src.partial)):
        return None
    return (src.mesh, shape, src.dtype) + tuple(x for t in (src, dst) for x in (t.dims, t.partial, t.reduction))


def _pattern(src: ShardingType, dst: ShardingType) -> tuple[ShardingType, ShardingType] | None:
    """The pair's pattern, its two types (see :func:`_synthesized`), or None where it has none."""
    key = _pattern_key(src, dst)
    return None if key is None else _pattern_types(*key)


def _pattern_types(mesh, shape, dtype, *fields) -> tuple[ShardingType, ShardingType]:
    return tuple(ShardingType(mesh, shape, dtype, *fields[j:j + 3]) for j in (0, 3))


@functools.lru_cache(maxsize=4096)
def _pattern_plan(*key) -> redist.Plan:
    """:func:`redist.synthesize`'s plan for the pattern :func:`_pattern_key` gives (cached per pattern)."""
    return redist.synthesize(*_pattern_types(*key))


@functools.lru_cache(maxsize=4096)
def _pattern_unit_bytes(*key) -> tuple:
    """The bytes a device receives in each communicating step of the pattern's plan, exactly (Fractions)."""
    plan = _pattern_plan(*key)
    return tuple(s.bytes_received(t) for s, t in zip(plan.steps, plan.types) if s.kind != "all_slice")


def clear_cache() -> None:
    """Forget every cached move and pattern plan (they are made again on the next call)."""
    move.cache_clear()
    _pattern_plan.cache_clear()
    _pattern_unit_bytes.cache_clear()


def _gather_then_slice(src: ShardingType, dst: ShardingType) -> redist.Plan:
    """The plan that needs no search: all-reduce the pending sums ``dst`` lacks, all-gather every split dim
    (to replicated), slice to ``dst``'s blocks. It may hold the whole array at once."""
    steps = []
    drop = tuple(a for a in src.partial if a not in dst.partial)
    if drop:
        steps.append(S.AllReduce(drop))
    steps += [S.AllGather(d, tuple(axes)) for d, axes in enumerate(src.dims) if axes]
    steps += [S.AllSlice(d, tuple(axes)) for d, axes in enumerate(dst.dims) if axes]
    return redist.Plan.from_steps(src, steps)


def reshard_bytes(src: ShardingType, dst: ShardingType) -> float:
    """Bytes a device receives moving ``src`` to ``dst`` (the move lowering would run); infinite when no
    redistribution can do it, or when ``dst`` is partial over an axis ``src`` is not: redist can create
    pending sums (docs/spec.md §3), but a partitioned program's pending sums come from its contractions, so a choice
    that creates them is never taken. Where the synthesizer's plan receives exactly the lower bound
    (:func:`_at_bound`), that is the answer and nothing is planned: per-op choice prices many more pairs than
    lowering moves; a pair with a pattern (:func:`_synthesized`) is priced from the pattern's plan, scaled,
    without planning the pair itself."""
    if src == dst:
        return 0.0
    if not _possible(src, dst):
        return float("inf")
    if _at_bound(src, dst):
        return reshard_floor(src, dst)
    key = _pattern_key(src, dst)
    if key is None:
        return move(src, dst).bytes
    # the pattern's plan is the pair's (_synthesized), each type's local buffer the pattern's times the same
    # whole number: each step's bytes scale exactly, summed as Move.bytes sums them, nothing planned for the pair
    scale = math.prod(d // p for d, p in zip(src.shape, key[1]))
    try:
        return float(sum(float(b * scale) for b in _pattern_unit_bytes(*key)))
    except redist.ShardingError:  # no plan for the pattern: the move's fallback, as move() makes it
        return move(src, dst).bytes


def _at_bound(src: ShardingType, dst: ShardingType) -> bool:
    """Whether :func:`move`'s plan receives exactly :func:`redist.lower_bound_bytes`: between even types on one
    device order with the same pending axes (nothing to reduce, nothing created), :func:`redist.synthesize`
    keeps its search's plan only where that plan is at the bound, and otherwise takes the one ``exchange``, which
    receives exactly the bound (``tests/redist/test_synthesis.py`` checks this on random pairs; the pattern's plan that
    :func:`move` runs is the pair's own, :func:`_synthesized`)."""
    return src.mesh == dst.mesh and set(src.partial) == set(dst.partial) and src.is_even() and dst.is_even()


@functools.lru_cache(maxsize=1 << 15)
def reshard_floor(src: ShardingType, dst: ShardingType) -> float:
    """A lower bound of :func:`reshard_bytes` that plans nothing: 0 between equal types, infinite where
    :func:`reshard_bytes` is, else :func:`redist.lower_bound_bytes` (what some device lacks, which no plan
    receives less than, the synthesizer's or the fallback; ``python -m proofs`` checks the synthesizer's plans
    against it on every pair it runs). Cached per pair."""
    if src == dst:
        return 0.0
    if not _possible(src, dst):
        return float("inf")
    return float(lower_bound_bytes(src, dst))


@functools.lru_cache(maxsize=1 << 15)
def _possible(src: ShardingType, dst: ShardingType) -> bool:
    """Whether lowering may move ``src`` to ``dst``: :func:`redist.bounds.check_pair` accepts the pair and it
    creates no pending sums (see :func:`reshard_bytes`). Cached per pair: per-op choice asks for the same pairs
    many times, and the answer depends on the two types alone."""
    try:
        check_pair(src, dst)
    except redist.ShardingError:
        return False
    return not difference(dst.partial, src.partial)


def finish_bytes(axes, types) -> float:
    """Bytes a device receives finishing a max/min reduction over mesh ``axes`` of results of ``types``: one
    all-reduce of each, counted as redist counts an ``all_reduce`` step."""
    step = S.AllReduce(tuple(axes))
    return float(sum(step.bytes_received(t) for t in types))


def run(m: Move, x, names: AxisNames):
    """Run move ``m`` on this device's buffer ``x``, inside the program's ``shard_map`` over a mesh that
    ``names`` describes (:func:`refine` for tokens that include the plan's). A key array moves as its key
    data."""
    if keys.is_key(x.dtype):  # a key array's type is its key data's
        return keys.from_data(run(m, keys.to_data(x), names), x.dtype)
    return run_program(m.plan.program, x, axis_names=names.mapping)


def packing(m: Move) -> tuple[tuple, int] | None:
    """``(key, nbytes)`` where move ``m`` can run packed with the moves of the same ``key`` as one collective
    (:func:`run_packed`), ``nbytes`` what its collective holds; None where it cannot (redist's
    :func:`redist.jax.packing_of` of its plan)."""
    return packing_of(m.plan.program)


def run_packed_moves(moves: list, xs: list, names: "AxisNames") -> list:
    """``[run(m, x, names) for m, x in zip(moves, xs)]``, their collectives run as one (moves of one
    :func:`packing` key). Key arrays move as their key data."""
    datas = [keys.to_data(x) if keys.is_key(x.dtype) else x for x in xs]
    out = run_packed([m.plan.program for m in moves], datas, names.mapping)
    return [keys.from_data(y, x.dtype) if keys.is_key(x.dtype) else y for y, x in zip(out, xs)]


class AxisNames:
    """How the program's ``shard_map`` names mesh axes: ``names(axes)`` is the tuple of JAX axis names that
    mesh axes (or sub-axis tokens) ``axes`` cover, major to minor; ``mapping`` gives them per name or token."""

    def __init__(self, mapping: Mapping[str, tuple[str, ...]]):
        self.mapping = dict(mapping)

    def __call__(self, axes) -> tuple[str, ...]:
        return tuple(piece for a in axes for piece in self.mapping[a])

    def spec(self, t: ShardingType) -> PartitionSpec:
        """The ``PartitionSpec`` of type ``t`` on the program's mesh (``t.partition_spec()`` when unrefined)."""
        dims = [self(d) for d in t.dims]
        return PartitionSpec(*[None if not d else d[0] if len(d) == 1 else d for d in dims])


def refine(jax_mesh: jax.sharding.Mesh, tokens) -> tuple[jax.sharding.Mesh, AxisNames]:
    """``(mesh, names)``: ``jax_mesh`` split at every boundary that ``tokens`` (the sub-axes of a program's
    plans) use, the same devices in the same order (``jax_mesh`` itself when they need no split), and how it
    names each mesh axis and token."""
    mesh, mapping = refine_mesh(jax_mesh, tuple(tokens))
    return mesh, AxisNames(mapping)


def device_mesh(mesh: redist.Mesh) -> jax.sharding.Mesh:
    """The JAX mesh a program over ``mesh`` runs on when it is given none: the device at position ``p`` is
    ``jax.devices()[mesh.device_ids[p]]`` (redist's device ids are JAX's, as :mod:`redist.jax` runs plans).
    Raises :class:`redist.ShardingError` if JAX has fewer devices."""
    devices = jax.devices()
    if len(devices) < mesh.size:
        raise redist.ShardingError(f"the mesh {mesh} needs {mesh.size} JAX devices, only {len(devices)} are available")
    return jax.sharding.Mesh(np.array([devices[d] for d in mesh.device_ids]).reshape(mesh.shape), mesh.names)


def mesh_of(jax_mesh: jax.sharding.Mesh) -> redist.Mesh:
    """The redist mesh of a JAX mesh: its axes and its device order (:func:`redist.jax.redist_mesh`). Raises
    :class:`redist.ShardingError` for axes redist cannot name."""
    return redist_mesh(jax_mesh)
