"""The device-side programs of :func:`redist.jax.reshard`: how one array moves (a :class:`Move`), which program
moves it (:func:`route`), and one jitted program for all the arrays of a call, cached (:func:`program`).

Route. Two correct programs can move an array from ``src`` to ``dst``: redist's plan, run as a
``jax.shard_map`` of the plan's lowered program (:mod:`redist.backends.jax_backend`), and XLA's own resharding,
the semantics of ``jax.jit(lambda a: a, out_shardings=dst)`` (a sharding constraint; ``jax.sharding.reshard``
on Explicit axes). :func:`route` runs redist's plan where XLA's resharding falls back to gathering the whole
array (its "involuntary full rematerialization": where XLA cannot go from ``src`` to ``dst`` directly, every
device receives all of the array it lacks and slices its block out of it, e.g. jax-ml/jax#21562 and FSDP ->
Megatron) and the plan receives fewer bytes; everywhere else it runs XLA's resharding. There the plan brings a
k-fold saving in bytes and never holds the whole array, so it holds less memory and runs faster
(``bench/jax_reshard.py`` measures both: ``bench/results/jax_reshard.json``). Elsewhere XLA has a direct
program (the plan's own all-gathers, slices, all-to-alls or permutes, or its collectives for a swap of axes),
which runs as fast or faster than a ``shard_map`` (XLA fuses its collectives with the local copies that a
``shard_map`` keeps apart), costs less to compile and under the caller's ``jax.jit`` may fuse with the
neighbours; that holds also where the plan receives somewhat fewer bytes by an exchange, which the JAX backend
runs as rounds of ``ppermute`` with a gather and a scatter each (a swap of two axes: fewer bytes than XLA's,
but several times XLA's time and memory on host devices). The decision takes no timing, so it is the same on
every run: where the plan is empty or made of ``all_slice`` steps alone or of ``all_gather`` steps alone, XLA
emits the same local slices or the same all-gathers (the same bytes, the same buffers;
``tests/redist/test_jax_reshard.py`` checks this on XLA's compiled HLO), known without compiling; for any other plan
XLA's resharding of the pair is compiled once per (source type, destination type, mesh) for an abstract input
and the bytes its collectives receive per device are read from the HLO (:func:`redist.hlo.parse_hlo`). Where
XLA would gather the whole array, that compile logs XLA's "involuntary full rematerialization" warning, about
the program redist then does not run: the line is kept off standard error (:mod:`redist.xla_log`).

Batching. The arrays of one call that take redist's route move in one ``shard_map``, and those of one type pair
(a parameter tree holds many arrays of one shape and layout: a model's layers) move stacked: each collective of
their plan runs once for all of them (``jax.vmap`` of the plan's program batches its collectives). On a tree of
small arrays a collective's latency, not its bytes, is the cost, so one collective for 25 arrays takes a
fraction of 25 collectives' time (``bench/jax_reshard.py``'s 101-leaf tree), for a stacked copy of those arrays
in memory. (XLA's CPU compiler is slow on a stacked all-to-all; the compile is a first call's, cached after.)

Meshes. A plan over sub-axes runs on the refined mesh of :func:`~redist.backends.jax_backend.refine_mesh`.
``jax.shard_map`` wants its mesh to be the context mesh (``jax.set_mesh``), so the shard_map is traced under
``jax.sharding.use_abstract_mesh(refined)``; on Explicit axes the array's type names its mesh, so it is first
restated on the refined mesh (the same layout: no data moves). Either way the result is then restated on the
caller's mesh as the target sharding, which again moves nothing. An array's mesh and the target's may also
be two meshes (:func:`move`): the same devices in two orders, or other devices or axes (a pipeline's next stage,
a mesh of fewer devices, ``jax.make_mesh((8,), ...)`` and ``jax.make_mesh((2, 4), ...)``). Their devices are
then numbered by their JAX ids (:func:`~redist.backends.jax_backend.global_mesh`), and the plan moves the array
eagerly only (:func:`between_meshes`: its stages run on every device's buffer, the transfers as copies from
device to device), since JAX compiles a computation for one mesh in one device order.

Cache. :func:`program` keeps the jitted programs of the last :data:`PROGRAMS` call signatures (least recently
used first out); plans, routes and shard_maps are cached per (source type, destination type, mesh) in
bounded caches, and the per-device programs (moves between meshes, ``execute(..., backend="jax")``) per
(program, JAX mesh) by :func:`~redist.backends.jax_backend.on_devices`, with the transfers' per-device copies
(:func:`~redist.backends.jax_stages.clear_cache`). :func:`clear_cache` empties them all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Callable, Hashable, Mapping

import numpy as np

from redist.extras import missing_extra

try:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.jax", "jax") from e

from redist.backends import interpreter, jax_stages
from redist.backends.jax_backend import (JaxBackend, global_mesh, in_dtype, on_devices, redist_mesh, refine_mesh,
                                         without_context_mesh)
from redist.errors import ShardingError
from redist.hlo import HLO_BYTES, parse_hlo
from redist.mesh import Mesh
from redist.plan import Plan
from redist.synthesis import synthesize
from redist.types import ShardingType
from redist.xla_log import without_rematerialization_warning

__all__ = ["Move", "move", "route", "xla_bytes_received", "apply", "between_meshes", "traced_between_meshes",
           "Program", "program", "cached", "clear_cache", "sharding_type", "PROGRAMS"]

#: How many jitted programs (one per call signature: arrays' shapes, dtypes, shardings, donation) are kept.
PROGRAMS = 256


# ---------------------------------------------------------------------- types of JAX layouts
def sharding_type(shape, dtype, sharding, mesh: Mesh | None = None) -> ShardingType:
    """The redist type of an array of ``shape``/``dtype`` laid out by a ``NamedSharding``.

    Missing spec entries and ``None`` or ``UNCONSTRAINED`` entries replicate; unreduced axes are rejected.
    """
    if not isinstance(sharding, NamedSharding):
        raise ShardingError(f"redist.jax needs a NamedSharding, got {type(sharding).__name__}: {sharding}")
    spec = sharding.spec
    if getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
        raise ShardingError(f"partition spec {spec} has unreduced/reduced axes; redist.jax does not take them")
    entries = tuple(None if e is PartitionSpec.UNCONSTRAINED else e for e in spec)
    return ShardingType.from_partition_spec(
        tuple(shape), dtype, entries, mesh if mesh is not None else redist_mesh(sharding.mesh))


def _check_even(t: ShardingType, which: str) -> None:
    """JAX lays out a ``NamedSharding`` only on dims its blocks divide (shards are not padded), and
    ``jax.shard_map`` likewise: raise for an uneven dim of ``t``, naming it and its axes."""
    for i, (n, axes) in enumerate(zip(t.shape, t.dims)):
        if not t.is_even(i):
            raise ShardingError(
                f"{which}: dim {i} (size {n}) does not divide into its {t.blocks(i)} blocks over "
                f"{{{','.join(axes)}}}; JAX shards only even dims, so reshard needs them (uneven layouts run on "
                "padded per-device buffers with redist.jax.run_on_buffers)")


def _same_mesh(a, b) -> bool:
    """Equal meshes; a traced array may only carry the abstract mesh, which is then compared."""
    if a == b:
        return True
    if isinstance(a, jax.sharding.AbstractMesh) or isinstance(b, jax.sharding.AbstractMesh):
        return getattr(a, "abstract_mesh", a) == getattr(b, "abstract_mesh", b)
    return False


def _redist_meshes(src_jmesh, jmesh) -> tuple[Mesh, Mesh]:
    """The redist meshes of the array's JAX mesh and of the target's: one mesh (:func:`redist_mesh`), or two
    meshes whose devices are numbered by their JAX ids (:func:`global_mesh`): two device orders of the same axes
    and devices, or meshes of other devices or axes. Raises :class:`ShardingError` where the array's mesh is
    another abstract mesh (under a trace), whose devices are unknown."""
    if _same_mesh(src_jmesh, jmesh):
        mesh = redist_mesh(jmesh)
        return mesh, mesh
    if not isinstance(src_jmesh, jax.sharding.Mesh):
        raise ShardingError(f"under jax.jit the array is on mesh {src_jmesh} but the target sharding on mesh "
                            f"{jmesh}; JAX runs a computation on one mesh in one device order, so reshard moves an "
                            "array between two meshes or device orders only outside jax.jit")
    return global_mesh(src_jmesh), global_mesh(jmesh)


def _explicit(mesh) -> bool:
    return any(t == AxisType.Explicit for t in mesh.axis_types)


# ---------------------------------------------------------------------- one array's move
@dataclass(frozen=True)
class Move:
    """One array's reshard: from type ``src`` to type ``dst`` on the JAX ``mesh`` (the target's); ``source`` is the
    array's layout and ``sharding`` the target as the result carries it (``dst``'s ``NamedSharding`` as the
    caller spelled it, ``UNCONSTRAINED`` entries read as replicated). :attr:`plan` is redist's plan and
    :attr:`route` the program that runs. ``src.mesh`` and ``dst.mesh`` differ where the array's JAX mesh is not
    the target's (:attr:`between_meshes`): the target's devices in another order, or other devices or axes."""

    src: ShardingType
    dst: ShardingType
    mesh: jax.sharding.Mesh
    sharding: NamedSharding
    source: NamedSharding

    @property
    def plan(self) -> Plan:
        return _plan(self.src, self.dst)

    @property
    def route(self) -> str:
        return route(self)

    @property
    def between_meshes(self) -> bool:
        """Whether the move goes between two meshes: two device orders of one mesh, or meshes of other devices or
        axes (eagerly only: JAX compiles a computation for one mesh in one device order; :func:`between_meshes`)."""
        return self.src.mesh != self.dst.mesh

    def describe(self) -> str:
        """One line for the log: the pair, the program chosen, the plan's steps, bytes and peak."""
        plan = self.plan
        steps = "; ".join(map(str, plan.steps)) or "no step"
        program = "redist's plan" if self.route == "redist" else "XLA's own resharding"
        return (f"{self.src} -> {self.dst}: {program} [{steps}] (receives {plan.bytes_received} B per device, "
                f"peak {plan.peak_bytes} B)")


def move(shape, dtype, src: NamedSharding, dst: NamedSharding) -> Move:
    """The :class:`Move` of an array of ``shape``/``dtype`` from layout ``src`` to ``dst``.

    Raises :class:`ShardingError` if either is no ``NamedSharding``, the target's mesh is not a concrete
    ``jax.sharding.Mesh``, the array's mesh is another abstract mesh (under a trace), ``dtype`` is not one redist
    moves, or the shape does not fit a sharding (an unknown axis, too many spec entries, a dim that does not
    divide). The two meshes may differ (:attr:`Move.between_meshes`).
    """
    if not isinstance(dst, NamedSharding):
        raise ShardingError(f"reshard needs a NamedSharding or a PartitionSpec as the target, got "
                            f"{type(dst).__name__}: {dst}")
    if not isinstance(dst.mesh, jax.sharding.Mesh):
        raise ShardingError(f"the target sharding's mesh must be a concrete jax.sharding.Mesh, got {dst.mesh}")
    if not isinstance(src, NamedSharding):
        raise ShardingError(f"the array's sharding must be a NamedSharding, got {type(src).__name__}: {src}")
    src_mesh, mesh = _redist_meshes(src.mesh, dst.mesh)
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ShardingError(f"unsupported dtype {dtype}") from None
    src_t, dst_t = sharding_type(shape, dtype, src, src_mesh), sharding_type(shape, dtype, dst, mesh)
    _check_even(src_t, "the array's sharding")
    _check_even(dst_t, "the target sharding")
    if any(e is PartitionSpec.UNCONSTRAINED for e in dst.spec):
        dst = NamedSharding(dst.mesh, PartitionSpec(*(None if e is PartitionSpec.UNCONSTRAINED else e
                                                      for e in dst.spec)))
    return Move(src_t, dst_t, dst.mesh, dst, src)


@lru_cache(maxsize=1024)
def _plan(src: ShardingType, dst: ShardingType) -> Plan:
    return synthesize(src, dst)


def route(m: Move) -> str:
    """``"redist"`` if XLA's own resharding of ``m.src`` to ``m.dst`` on ``m.mesh`` gathers the whole array
    (some device receives at least the array's bytes less its source block, measured by
    :func:`xla_bytes_received`) while redist's plan receives fewer bytes, else ``"xla"``; a plan of slices
    alone or gathers alone is ``"xla"`` without measuring. Decided once per (source type, destination type,
    mesh); the rule and its reasons are in the module header. A move with pending values (a ``partial`` type
    of any reduction kind) or between two meshes (device orders, or other devices or axes) is always ``"redist"``:
    XLA's resharding of a ``NamedSharding`` within one computation expresses neither."""
    if m.src.partial or m.dst.partial or m.between_meshes:
        return "redist"
    key = (m.src, m.dst, m.mesh)
    decided = _ROUTES.get(key)
    if decided is None:
        kinds = {step.kind for step in m.plan.steps}
        decided = "xla"
        if not (kinds <= {"all_slice"} or kinds == {"all_gather"}):
            xla = xla_bytes_received(m)
            if xla > m.plan.bytes_received and xla >= m.src.global_bytes - m.src.local_bytes:
                decided = "redist"
        _ROUTES.put(key, decided)
    return decided


def xla_bytes_received(m: Move) -> float:
    """The most bytes any device receives in XLA's resharding of ``m`` (``jax.jit(lambda a: a,
    out_shardings=m.sharding)`` compiled for an abstract input laid out as ``m.source``; nothing runs), its
    collectives read from the compiled HLO and counted in the array's dtype, as the plan counts them: XLA's
    CPU backend carries ``bf16`` collectives as ``f32``, which doubles their bytes on the wire but not the
    elements moved (and it does the same to the plan's collectives). The compiled program is the one a call
    of that single array runs (:func:`_xla_resharding_jit`), so measuring costs such a call no second
    compile. An array of no elements receives nothing, and nothing is compiled for it (XLA before JAX 0.9.1
    fails to compile its resharding on Auto axes)."""
    if 0 in m.src.shape:
        return 0.0
    with in_dtype(m.src.np_dtype), without_rematerialization_warning():
        compiled = _xla_resharding_jit(m.sharding).lower(
            jax.ShapeDtypeStruct(m.src.shape, m.src.np_dtype, sharding=m.source)).compile()
    itemsize = m.src.np_dtype.itemsize
    per_device = [np.asarray(c.device_bytes) * itemsize / HLO_BYTES[c.dtype]
                  for c in parse_hlo(compiled.as_text(), m.src.mesh)]
    return float(np.sum(per_device, axis=0).max()) if per_device else 0.0


def _xla_resharding(a):
    """The identity: under ``jax.jit`` with ``out_shardings``, XLA's own resharding (the name shows in JAX's logs)."""
    return a


@lru_cache(maxsize=256)
def _xla_resharding_jit(sharding: NamedSharding):
    return jax.jit(_xla_resharding, out_shardings=sharding)


def apply(moves: tuple[Move, ...], xs) -> list:
    """``xs[j]`` moved by ``moves[j]`` (global arrays inside a trace: the caller's ``jax.jit`` or ``jax.grad``,
    or :func:`program`'s own ``jit``), each restated with the sharding ``moves[j].sharding``. The arrays that
    take redist's route on one mesh move in one ``shard_map``. No move may go between two meshes (JAX compiles a
    computation for one mesh in one device order; :func:`between_meshes` moves those eagerly)."""
    out = list(xs)
    meshes: dict = {}
    for j, m in enumerate(moves):
        if m.route == "redist":
            meshes.setdefault(m.mesh, []).append(j)
    for mesh, js in meshes.items():
        ys = _shard_mapped(tuple((moves[j].src, moves[j].dst) for j in js), mesh)(*(xs[j] for j in js))
        for j, y in zip(js, ys):
            out[j] = y
    return [jax.sharding.reshard(y, m.sharding) if _explicit(m.mesh) else
            lax.with_sharding_constraint(y, m.sharding) for m, y in zip(moves, out)]


def _spec(dims, names: Mapping[str, tuple[str, ...]]) -> PartitionSpec:
    """The PartitionSpec on the refined mesh of per-dim token lists."""
    out = []
    for d in dims:
        axes = tuple(a for tok in d for a in names[tok])
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


@lru_cache(maxsize=256)
def _shard_mapped(pairs: tuple[tuple[ShardingType, ShardingType], ...], mesh) -> Callable:
    """The plans of ``pairs`` (source and destination types on ``mesh``) as one function of the global arrays:
    one shard_map over the mesh refined at every boundary that any of the plans' sub-axes use, traced with
    that mesh as the context's abstract mesh (see Meshes in the module header). Arrays of one pair (the
    layers of a model: a parameter tree holds many arrays of one type) move together, by :func:`_batched`."""
    groups: dict[tuple[ShardingType, ShardingType], list[int]] = {}
    for j, pair in enumerate(pairs):
        groups.setdefault(pair, []).append(j)
    programs = {pair: _plan(*pair).program for pair in groups}
    tokens = sorted({tok for p in programs.values() for tok in p.axis_tokens()})
    refined, names = refine_mesh(mesh, tokens)
    in_specs = tuple(_spec(src.dims, names) for src, _ in pairs)
    backend = JaxBackend(next(iter(programs.values())).mesh, names)

    def moved(*bs):
        out = [None] * len(bs)
        for pair, js in groups.items():
            for j, y in zip(js, _batched(programs[pair], backend, [bs[j] for j in js])):
                out[j] = y
        return tuple(out)

    mapped = jax.shard_map(moved, mesh=refined, in_specs=in_specs,
                           out_specs=tuple(_spec(dst.dims, names) for _, dst in pairs), check_vma=False)
    restate = _explicit(mesh)

    def run(*xs):
        with jax.sharding.use_abstract_mesh(refined.abstract_mesh):
            if restate:
                xs = [jax.sharding.reshard(x, NamedSharding(refined, spec)) for x, spec in zip(xs, in_specs)]
            return mapped(*xs)

    return run


def _batched(program, backend: JaxBackend, buffers: list) -> list:
    """``program`` run on each of ``buffers`` (local buffers of one type): on their stack where there are
    several, so that each collective runs once for all (``jax.vmap`` batches the collectives along the stack;
    see Batching in the module header)."""
    if len(buffers) == 1:
        return [interpreter.run(program, backend, buffers[0])]
    stacked = jax.vmap(lambda b: interpreter.run(program, backend, b))(jnp.stack(buffers))
    return list(stacked)


# ---------------------------------------------------------------------- between two meshes
def between_meshes(m: Move, x):
    """``x`` (a concrete array laid out as ``m.source``) moved by ``m``, a move between two meshes (two device
    orders, or meshes of other devices or axes), eagerly: the plan's stages run on the buffers of every device
    (:func:`~redist.backends.jax_stages.run_stages`: a program per mesh, the transfers as copies from device to
    device), and their results become ``m.sharding``'s array where they are, new buffers all. An empty array is
    the caller's to make. Raises :class:`ShardingError` (:func:`traced_between_meshes`) if called under a trace,
    where nothing would run but be traced into the caller's computation, which has one mesh."""
    if isinstance(jax.device_put(x, x.sharding), jax.core.Tracer):  # x itself, unless inside jax.jit (closed over)
        raise traced_between_meshes(m)
    by_device = {s.device: s.data for s in x.addressable_shards}
    with in_dtype(m.src.np_dtype), without_context_mesh():
        buffers = [None] * m.src.mesh.id_bound
        for d, dev in zip(m.src.mesh.device_ids, x.sharding.mesh.devices.flat):
            buffers[d] = by_device[dev]
        out = jax_stages.run_stages(m.plan.stages, buffers)
        return jax.make_array_from_single_device_arrays(
            x.shape, m.sharding, [out[d] for d in m.dst.mesh.device_ids])


def traced_between_meshes(m: Move) -> ShardingError:
    """The error for a move between two meshes under a trace."""
    if m.src.mesh.is_reordering_of(m.dst.mesh):
        return ShardingError(f"under jax.jit, JAX runs a computation on one device order, but the array's mesh "
                             f"({m.src.mesh}) and the target's ({m.dst.mesh}) order the devices differently; call "
                             "reshard outside jax.jit to move between them")
    return ShardingError(f"under jax.jit, JAX runs a computation on one mesh, but the array's mesh ({m.src.mesh}) and "
                         f"the target's ({m.dst.mesh}) hold other devices or axes; call reshard outside jax.jit to "
                         "move between them")


# ---------------------------------------------------------------------- all the arrays of one call
@dataclass(frozen=True)
class Program:
    """One jitted program moving several arrays: ``fn(*inputs)`` returns one array per move, move ``j``
    applied to ``inputs[index[j]]`` (an array at several leaves is one input, donated once); ``jitted`` is
    the ``jax.jit`` function that ``fn`` calls, to lower. ``wide`` is a 64-bit dtype among the arrays (run
    the call under :func:`redist.jax.in_dtype` of it), or None."""

    moves: tuple[Move, ...]
    index: tuple[int, ...]
    donate: bool
    fn: Callable = field(compare=False)
    jitted: Callable = field(compare=False)
    wide: np.dtype | None = field(compare=False)

    @cached_property
    def description(self) -> str:
        return "\n".join(f"  [{j}] {m.describe()}" for j, m in enumerate(self.moves))


def _build(moves: tuple[Move, ...], index: tuple[int, ...], donate: bool) -> Program:
    inputs = max(index) + 1

    def moved(*xs):
        return tuple(apply(moves, [xs[i] for i in index]))

    if len(moves) == 1 and not donate and moves[0].route == "xla":
        # The program the route measured (already compiled for this layout): one array, XLA's resharding.
        jitted = _xla_resharding_jit(moves[0].sharding)
        fn = lambda x: (jitted(x),)  # noqa: E731
    else:
        jitted = fn = jax.jit(moved, out_shardings=tuple(m.sharding for m in moves),
                              donate_argnums=tuple(range(inputs)) if donate else ())
    with jax.enable_x64(False):  # JAX's own rule for which dtypes its 32-bit mode narrows
        wide = next((m.src.np_dtype for m in moves
                     if jax.dtypes.canonicalize_dtype(m.src.np_dtype) != m.src.np_dtype), None)
    return Program(moves, index, donate, fn, jitted, wide)


class _Cache:
    """A bounded map, least recently used entry out first; safe to share between threads."""

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable):
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: Hashable, entry) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


_PROGRAMS = _Cache(PROGRAMS)
_ROUTES = _Cache(1024)


def program(key: Hashable, make_moves: Callable[[], tuple[Move, ...]], index: tuple[int, ...],
            donate: bool) -> tuple[Program, bool]:
    """``(the Program for the call signature key, whether it came from the cache)``.

    ``key`` must determine the moves, ``index`` and ``donate`` (the caller's signature of the arrays and
    targets); on a miss ``make_moves()`` builds the moves (synthesis and checks: it may raise
    :class:`ShardingError`, and then nothing is cached).
    """
    entry = _PROGRAMS.get(key)
    if entry is not None:
        return entry, True
    entry = _build(make_moves(), index, donate)
    _PROGRAMS.put(key, entry)
    return entry, False


def cached(key: Hashable) -> Program | None:
    """The cached Program of the call signature ``key`` (see :func:`program`), or None; builds nothing."""
    return _PROGRAMS.get(key)


def clear_cache() -> None:
    """Forget every cached program (``reshard``'s and ``execute(..., backend="jax")``'s), shard_map, route and
    plan (they are rebuilt on the next call)."""
    _PROGRAMS.clear()
    _shard_mapped.cache_clear()
    _ROUTES.clear()
    _xla_resharding_jit.cache_clear()
    on_devices.cache_clear()
    jax_stages.clear_cache()
    _plan.cache_clear()
