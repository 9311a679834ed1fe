"""The JAX entry point: :func:`reshard`, ``jax.device_put(x, sharding)`` for sharded data, with the arrays moved
by synthesized plans (docs/spec.md §5).

    y = redist.jax.reshard(x, NamedSharding(mesh, P(None, ("x", "y"))))
    with jax.set_mesh(mesh):
        params = redist.jax.reshard(params, P(None, "model"))        # one spec for every leaf
    params = redist.jax.reshard(params, shardings, donate=True)       # a pytree of shardings; inputs deleted

Arguments follow ``jax.device_put``'s rules: ``x`` is any pytree; ``sharding`` (and ``src``) is one
``NamedSharding`` or ``PartitionSpec`` for every leaf, or a pytree prefix of ``x`` of them (``None``: leave the
leaf as ``jax.device_put(leaf)`` leaves it); a ``PartitionSpec`` is taken on the context mesh of
``jax.set_mesh``. Every array of a call that already lies on the mesh moves in one jitted program (one
dispatch); an array whose target lies on another mesh (other devices or axes, or another device order) moves
eagerly, device to device; host data, Python scalars and single-device arrays are placed as ``jax.device_put``
places them.

Which program moves each array (redist's plan or XLA's own resharding, by a documented rule), the cache of
programs and how sub-axis plans meet ``jax.set_mesh`` are in :mod:`redist.jax_programs`; the JAX interpreter
of plans is :mod:`redist.backends.jax_backend`, whose names this module re-exports (:func:`run_program`,
:func:`run_on_buffers`, :func:`refine_mesh`, …). ``logging.getLogger("redist")`` says at DEBUG, for each call,
which plan every array took and whether the program came from the cache.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

from redist.extras import missing_extra

try:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.jax", "jax") from e

from redist import jax_programs as programs
from redist.backends.jax_backend import in_dtype, packing_of, redist_mesh, refine_mesh, refined_axis_names, \
    run_on_buffers, run_packed, run_program
from redist.buffers import check_unmasked, describe
from redist.errors import ShardingError, first_line, shown
from redist.jax_programs import clear_cache, sharding_type

__all__ = ["reshard", "lower", "clear_cache", "run_program", "run_on_buffers", "run_packed", "packing_of", "in_dtype",
           "refined_axis_names", "refine_mesh", "redist_mesh", "sharding_type"]

_log = logging.getLogger("redist")


def reshard(x, sharding, *, src=None, donate=False):
    """Return ``x`` laid out as ``sharding``: ``jax.device_put(x, sharding, donate=donate)`` with every array
    that lies on the mesh moved by a synthesized plan (or XLA's own resharding where the plan has nothing to
    add; the rule is in :mod:`redist.jax_programs`) on the devices, never through the host.

    ``x``: a pytree of ``jax.Array`` s laid out by a ``NamedSharding`` (or tracers, under ``jax.jit`` or
    ``jax.grad``), numpy arrays and scalars. ``sharding``: a ``NamedSharding`` or a ``PartitionSpec`` (on the
    context mesh of ``jax.set_mesh``) for every leaf, or a pytree prefix of ``x`` of them; a ``None`` there
    leaves its leaves as ``jax.device_put(leaf)`` does. The result has ``x``'s structure, and each array its
    target sharding (``UNCONSTRAINED`` spec entries read as replicated and come back as ``None``; under
    ``jax.jit`` JAX may drop trailing ``None`` entries, an equivalent sharding).

    Eagerly, all the arrays that lie on a mesh move in one compiled program, cached per call signature (each
    array's shape, dtype, source and target sharding, and ``donate``): a second call on new arrays of the same
    types only dispatches. An array whose sharding already is the target is returned as it is (unless
    donated). Host data (numpy arrays and scalars, Python numbers) and arrays on a single device are placed as
    ``jax.device_put`` places them: with JAX's x64 mode off, a numpy array of a 64-bit dtype comes back in the
    32-bit one (``float64`` as ``float32``, ``int64`` as ``int32``, ``uint64`` as ``uint32``, ``complex128``
    as ``complex64``), as JAX canonicalizes host data; a JAX array keeps its dtype, 64-bit included.

    ``donate=True`` donates the input arrays to the program and deletes every input array afterwards
    (``x.is_deleted()``), also where XLA did not reuse a buffer (its CPU client never does). Under a trace
    (``jax.jit``, ``jax.grad``) ``donate`` is ignored: donation is then the enclosing ``jax.jit``'s
    ``donate_argnums``.

    Under a trace the source layout of a tracer is read from ``jax.typeof(x).sharding`` when every mesh axis
    is ``Explicit``. With ``Auto`` axes (``jax.sharding.Mesh``'s default) it is not known while tracing: pass
    it as ``src`` (like ``sharding``: one ``NamedSharding``/``PartitionSpec`` or a pytree prefix of them); if
    the real layout differs, XLA moves the data to ``src`` first (correct, but not by redist's plan). Eagerly,
    ``src`` must agree with the arrays' shardings.

    Across meshes: an array's mesh and its target's may be two meshes: the same devices in different orders
    (the same axes; ``jax.make_mesh`` and a hand-made device array, say), or meshes of other devices or axes (a
    pipeline's next stage, a job's devices less some, ``jax.make_mesh((8,), ("x",))`` and
    ``jax.make_mesh((2, 4), ("a", "b"))`` on the same devices). Their devices are then numbered by their JAX ids
    (global device ids, docs/spec.md §1) and the plan between the two types (:func:`redist.synthesize`) runs on
    every device's buffer: its steps on each mesh as programs of their own, its transfer as copies from device to
    device of the pieces each destination device lacks, never through the host; the result's buffers become the
    target-sharded array where they are (:mod:`redist.backends.jax_stages`). Only eagerly: JAX compiles a
    computation for one mesh in one device order (it refuses arguments and constraints on another inside
    ``jax.jit``), so under a trace such a reshard raises :class:`ShardingError`.

    Raises :class:`ShardingError`, naming the leaf, if ``sharding`` or ``src`` is not a tree prefix of ``x``
    or holds something else than the above, a ``PartitionSpec`` has no context mesh, an array's source
    layout is unknown or on another mesh than its target under a trace, the shape
    does not fit a sharding (an unknown axis, too many spec entries, a dim that does not divide), a leaf
    cannot be placed, or an input array was deleted (donated before).
    """
    if (src is None and isinstance(sharding, NamedSharding) and isinstance(x, jax.Array)
            and not isinstance(x, jax.core.Tracer) and (donate is False or donate is True)):
        y = _from_the_cache(x, sharding, donate)
        if y is not None:
            return y
    if not isinstance(donate, bool):
        raise ShardingError(f"donate must be True or False, got {describe(donate)}")
    leaves, treedef = jax.tree.flatten(x)
    targets = _per_leaf(sharding, treedef, "sharding")
    sources = _per_leaf(src, treedef, "src")
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        out = _traced(x, leaves, targets, sources)
    else:
        call = _Call(x, leaves, targets, sources, donate)
        out = call.run()
    return jax.tree.unflatten(treedef, out)


def lower(x, sharding, *, src=None, donate=False) -> jax.stages.Lowered:
    """The program that :func:`reshard` runs for the arrays of ``x`` that lie on a mesh, lowered for them
    (``jax.stages.Lowered``: ``.compile().memory_analysis()``, ``.as_text()``); arrays that move between two
    meshes (device orders, or other devices or axes) run apart and are not in it. Nothing runs and nothing is
    placed. Raises :class:`ShardingError` as :func:`reshard` does, or if no array of ``x`` needs a program."""
    if not isinstance(donate, bool):
        raise ShardingError(f"donate must be True or False, got {describe(donate)}")
    leaves, treedef = jax.tree.flatten(x)
    call = _Call(x, leaves, _per_leaf(sharding, treedef, "sharding"), _per_leaf(src, treedef, "src"), donate)
    return call.lower()


# ---------------------------------------------------------------------- arguments
def _per_leaf(spec, treedef, what: str) -> list:
    """``spec`` (one ``NamedSharding``, ``PartitionSpec`` or None, or a pytree prefix of the tree ``treedef``
    of them) broadcast to one entry per leaf, as ``jax.device_put`` broadcasts its ``device`` and ``src``; a
    ``PartitionSpec`` given as the target is read on the context mesh. ``what`` names the argument."""
    if spec is None or isinstance(spec, (jax.sharding.Sharding, PartitionSpec)):
        return [_entry(spec, what)] * treedef.num_leaves
    entries, structure = jax.tree.flatten(spec, is_leaf=_is_entry)
    if structure == treedef:  # one entry per leaf (the common case, and no tree walk per entry)
        return [_entry(s, what) for s in entries]
    out = [None] * treedef.num_leaves
    _broadcast(spec, treedef.unflatten(range(treedef.num_leaves)), (), out, what)
    return out


def _broadcast(spec, positions, path: tuple, out: list, what: str) -> None:
    """Set ``out[i]`` to the entry of ``spec`` that covers leaf ``i``, for the leaves of ``positions`` (the
    subtree of ``x`` at key path ``path``, each leaf replaced by its index). Raises :class:`ShardingError`
    naming the first key path at which ``spec`` is no prefix of ``x``."""
    if _is_entry(spec):
        s = _entry(spec, what)
        for i in jax.tree.leaves(positions):
            out[i] = s
        return
    kids, node = _children(spec)
    if node.num_nodes == 1 and node.num_leaves == 1:  # a leaf that is no entry
        _entry(spec, what)
    if isinstance(positions, int):
        raise _no_prefix(what, f"x{jax.tree_util.keystr(path)} is a leaf where {what} has {describe(spec)}")
    x_kids, x_node = _children(positions)
    if node != x_node:
        raise _no_prefix(what, _difference(what, path, spec, positions))
    for (key, s), (_, p) in zip(kids, x_kids):
        _broadcast(s, p, path + key, out, what)


def _children(tree) -> tuple[list, jax.tree_util.PyTreeDef]:
    """The ``(key, child)`` pairs of the root of ``tree``, and the one-level structure they make."""
    return jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda node: node is not tree)


def _difference(what: str, path: tuple, spec, x_tree) -> str:
    """How the node ``spec`` of ``what`` differs from ``x``'s node ``x_tree`` at key path ``path``: its type,
    the first key path on each side that the other lacks, or else the nodes' metadata."""
    where = f"x{jax.tree_util.keystr(path)}"
    if type(spec) is not type(x_tree):
        return f"{where} is {_kind(x_tree)} where {what} has {_kind(spec)}"
    (kids, node), (x_kids, x_node) = _children(spec), _children(x_tree)
    keys, x_keys = [k for k, _ in kids], [k for k, _ in x_kids]
    missing = [f"x{jax.tree_util.keystr(path + k)} has no entry in {what}" for k in x_keys if k not in keys][:1]
    extra = [f"{what}{jax.tree_util.keystr(path + k)} is not in x" for k in keys if k not in x_keys][:1]
    return ", and ".join(missing + extra) or (f"at {where}, x's node and {what}'s differ: {shown(x_node)} and "
                                              f"{shown(node)}")


def _kind(node) -> str:
    """A node's type in a message: "None", "a dict", "an OrderedDict"."""
    name = type(node).__name__
    return "None" if node is None else f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def _no_prefix(what: str, difference: str) -> ShardingError:
    return ShardingError(f"{what} must be one NamedSharding or PartitionSpec, or a pytree prefix of x of them: "
                         f"{difference}")


def _is_entry(s) -> bool:
    return s is None or isinstance(s, (jax.sharding.Sharding, PartitionSpec))


def _entry(s, what: str):
    """One entry of ``sharding`` or ``src``, checked; a target ``PartitionSpec`` on the context mesh."""
    if s is None or isinstance(s, NamedSharding):
        return s
    if isinstance(s, PartitionSpec):
        return _on_context_mesh(s) if what == "sharding" else s
    raise ShardingError(f"{what}: reshard takes a NamedSharding or a PartitionSpec (or None) for each leaf, "
                        f"got {describe(s)}")


def _on_context_mesh(spec: PartitionSpec) -> NamedSharding:
    """``spec`` on the concrete mesh of ``jax.set_mesh``.

    The abstract mesh of the context does not do: a ``shard_map`` over an abstract mesh is lowered on the
    context's concrete mesh, whose axes a plan on sub-axes does not have. So the concrete mesh is read as
    ``jax.device_put`` reads it for a ``PartitionSpec``, from JAX's context (the one private name this package
    uses): ``jax.sharding.get_mesh`` (public from JAX 0.8.1) returns it too, but refuses under a trace.
    """
    from jax._src.mesh import get_concrete_mesh

    mesh = get_concrete_mesh()
    if mesh.empty:
        raise ShardingError(f"the target {_spec_text(spec)} is a PartitionSpec but no mesh is set: call reshard inside "
                            "`with jax.set_mesh(mesh):`, or give a NamedSharding(mesh, spec)")
    return _named(mesh, spec, "the target")


def _named(mesh, spec: PartitionSpec, what: str) -> NamedSharding:
    """``NamedSharding(mesh, spec)``, or :class:`ShardingError` naming ``spec`` (``what``: "the target", "src")
    and the mesh's axes where ``spec`` does not fit the mesh: an axis the mesh lacks, an axis used twice."""
    try:
        return NamedSharding(mesh, spec)
    except Exception as e:  # noqa: BLE001 - JAX's ValueError, TypeError or DuplicateSpecError (not public)
        reason = first_line(e)
    axes = tuple(mesh.axis_names)
    used = [a for entry in getattr(spec, "partitions", spec)  # without unreduced axes, which iterating refuses
            if entry is not None and entry is not PartitionSpec.UNCONSTRAINED
            for a in (entry if isinstance(entry, tuple) else (entry,))]
    unknown = [a for a in used if a not in axes]
    twice = [a for i, a in enumerate(used) if a in used[:i]]
    if unknown:
        why = f"names axis {shown(unknown[0])}, which the mesh lacks"
    elif twice:
        why = f"uses axis {shown(twice[0])} twice (a mesh axis splits one dim, once)"
    else:
        why = f"does not fit the mesh ({reason})"
    raise ShardingError(f"{what} {_spec_text(spec)} {why}; the mesh's axes are {', '.join(map(repr, axes)) or 'none'}")


def _spec_text(spec) -> str:
    """``spec`` as ``P('x', None)`` on every JAX version (older ones print ``PartitionSpec(...)``)."""
    if not isinstance(spec, PartitionSpec):
        return repr(spec)
    return "P" + repr(tuple(spec)) if not getattr(spec, "unreduced", None) else repr(spec)


def _on_mesh(leaf) -> bool:
    """Whether ``leaf`` is a concrete array laid out on a mesh (else it is host data or on one device)."""
    return isinstance(leaf, jax.Array) and isinstance(leaf.sharding, NamedSharding)


def _source(leaf, src, target) -> NamedSharding:
    """The layout of a concrete array on a mesh: its sharding, which ``src`` (if given) must agree with."""
    have = leaf.sharding
    if src is None:
        return have
    if isinstance(src, PartitionSpec) and isinstance(target, NamedSharding):
        src = _named(target.mesh, src, "src")
    if src != have and not (isinstance(src, NamedSharding) and src.is_equivalent_to(have, leaf.ndim)):
        raise ShardingError(f"src= says the array is laid out as {src}, but it is laid out as {have}")
    return have


class _Where:
    """Names leaf ``i`` of ``x`` in messages (nothing for a bare array); the path is found only when needed."""

    def __init__(self, x, i: int):
        self.x, self.i = x, i

    def __str__(self) -> str:
        path, _ = jax.tree_util.tree_flatten_with_path(self.x)[0][self.i]
        return f"leaf x{jax.tree_util.keystr(path)}: " if path else ""

    @contextlib.contextmanager
    def naming(self):
        try:
            yield
        except ShardingError as e:
            raise ShardingError(f"{self}{e}") from None


# ---------------------------------------------------------------------- placing host data
def _place(leaf, target, where: _Where):
    """``jax.device_put(leaf, target)`` of host data (a numpy array's dtype canonicalized as JAX does it: with
    x64 off a 64-bit dtype becomes its 32-bit one) or of an array on a single device (which keeps its dtype,
    64-bit included, as every JAX array does)."""
    dtype = leaf.dtype if isinstance(leaf, jax.Array) else None
    with where.naming():
        if isinstance(leaf, jax.Array) and leaf.is_deleted():
            raise ShardingError("the array has been deleted (was it donated before?)")
        check_unmasked(leaf, "it")
        rank = getattr(leaf, "ndim", 0 if isinstance(leaf, (int, float, complex)) else None)
        if isinstance(target, NamedSharding) and rank is not None and len(target.spec) > rank:
            raise ShardingError(f"partition spec {_spec_text(target.spec)} has {len(target.spec)} entries for a "
                                f"rank-{rank} array ({describe(leaf)})")
        try:
            with _wide(dtype):
                return jax.device_put(leaf, target)
        except (TypeError, ValueError, OverflowError) as e:
            raise ShardingError(f"{describe(leaf)} cannot be placed as {target}: {first_line(e)}") from None


@contextlib.contextmanager
def _quiet_donation():
    """No warning that XLA could not reuse a donated buffer (a gather's input cannot hold its output): the
    caller asked for the inputs to go, and they are deleted after the call whether XLA reused them or not."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        yield


def _wide(dtype):
    """:func:`in_dtype` of ``dtype``, if any: JAX keeps a 64-bit dtype within."""
    return in_dtype(dtype) if dtype is not None else contextlib.nullcontext()


def _empty(shape, dtype, sharding: NamedSharding):
    """An array of no elements laid out as ``sharding``, made on the devices. (JAX 0.10's ``jit`` gives a
    zero-size result shards of the global shape, which cannot be read back, whatever its ``out_shardings``.)"""
    local = sharding.shard_shape(tuple(shape))
    return jax.make_array_from_single_device_arrays(
        tuple(shape), sharding, [jnp.zeros(local, dtype, device=d) for d in sharding.addressable_devices])


# ---------------------------------------------------------------------- eager calls
def _signature(leaf, target) -> tuple:
    """What identifies a moved array's part of a program: its type (shape, dtype, weak type), its layout and
    its target."""
    return leaf.shape, leaf.dtype, leaf.weak_type, leaf.sharding, target


def _from_the_cache(x, target: NamedSharding, donate: bool):
    """``reshard(x, target, donate=donate)`` of one concrete array, by the cached program of this call
    signature (the key :class:`_Call` gives it), with no other work: None where there is no such program (or
    ``x`` was deleted), and the full path then runs (and raises where it must)."""
    program = programs.cached(((_signature(x, target),), (0,), donate))
    if program is None or x.is_deleted():
        return None
    _log_program(program, 1, cached=True)
    if program.wide is None:
        y, = program.fn(x)
    else:
        with in_dtype(program.wide):
            y, = program.fn(x)
    if donate and not x.is_deleted():
        x.delete()
    return y


def _log_program(program: programs.Program, leaves: int, cached: bool) -> None:
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("reshard: %d of %d arrays moved by one program (%s):\n%s", len(program.moves), leaves,
                   "from the cache" if cached else "new: synthesized and compiled now", program.description)


class _Call:
    """One eager call: which leaves the program moves (``moved``, with the program's distinct input arrays
    ``inputs`` and ``index`` from moved leaf to input), and the signature that keys the program cache.
    Building it checks only what identifies the program; the moves are checked on a cache miss. Leaves whose
    mesh is not the target's (``between``: the same devices in another order, or other devices or axes) move
    apart, eagerly (:func:`redist.jax_programs.between_meshes`)."""

    def __init__(self, x, leaves, targets, sources, donate: bool):
        self.x, self.leaves, self.targets, self.donate = x, leaves, targets, donate
        self.moved, self.inputs, index, signature = [], [], [], []
        self.rest, self.between = [], []  # leaves the program does not move
        position: dict[int, int] = {}
        for i, (leaf, target, src) in enumerate(zip(leaves, targets, sources)):
            if target is None or not _on_mesh(leaf):
                self.rest.append(i)
                continue
            if src is not None:
                with _Where(x, i).naming():
                    _source(leaf, src, target)
            have = leaf.sharding
            if (have == target and not donate) or leaf.size == 0:
                self.rest.append(i)
                continue
            if have.mesh != target.mesh:
                self.between.append(i)
                continue
            j = position.setdefault(id(leaf), len(self.inputs))
            if j == len(self.inputs):
                self.inputs.append(leaf)
            self.moved.append(i)
            index.append(j)
            signature.append(_signature(leaf, target))
        self.index = tuple(index)
        self.key = (tuple(signature), self.index, donate)

    def _moves(self) -> tuple[programs.Move, ...]:
        out = []
        for i in self.moved:
            leaf = self.leaves[i]
            with _Where(self.x, i).naming():
                out.append(programs.move(leaf.shape, leaf.dtype, leaf.sharding, self.targets[i]))
        return tuple(out)

    def _program(self) -> tuple[programs.Program, bool]:
        """The program, and whether it came from the cache."""
        program, cached = programs.program(self.key, self._moves, self.index, self.donate)
        _log_program(program, len(self.leaves), cached)
        return program, cached

    def lower(self) -> jax.stages.Lowered:
        if not self.moved:
            raise ShardingError("no array of x needs a program (nothing lies on a mesh and changes layout)")
        program, _ = self._program()
        with _wide(program.wide), _quiet_donation():
            return program.jitted.lower(*self.inputs)

    def run(self) -> list:
        """The leaves of the result. Everything is checked (the programs built, the other leaves placed)
        before a program runs, and donated arrays are deleted only after they ran."""
        out = list(self.leaves)
        program, cached = self._program() if self.moved else (None, True)
        between = []
        for i in self.between:
            leaf = self.leaves[i]
            with _Where(self.x, i).naming():
                between.append(programs.move(leaf.shape, leaf.dtype, leaf.sharding, self.targets[i]))
        for i in self.rest:
            out[i] = self._rest(i)
        for i in self.moved + self.between:
            if self.leaves[i].is_deleted():
                raise ShardingError(f"{_Where(self.x, i)}the array has been deleted (was it donated before?)")
        for i, m in zip(self.between, between):  # before the program, which may donate their buffers
            _log.debug("reshard: %sbetween two meshes, eagerly: %s", _Where(self.x, i), m.describe())
            with _Where(self.x, i).naming():
                out[i] = programs.between_meshes(m, self.leaves[i])
        if program is not None:
            with _wide(program.wide), _quiet_donation() if self.donate and not cached else contextlib.nullcontext():
                results = program.fn(*self.inputs)
            for i, y in zip(self.moved, results):
                out[i] = y
        if self.donate:
            kept = {id(y) for y in out}  # leaves returned as they are (target None)
            for leaf in self.leaves:
                if isinstance(leaf, jax.Array) and id(leaf) not in kept and not leaf.is_deleted():
                    leaf.delete()
        return out

    def _rest(self, i: int):
        """Leaf ``i``, which the program does not move: placed, made empty, or itself (its sharding is the
        target and it is not donated)."""
        leaf, target, where = self.leaves[i], self.targets[i], _Where(self.x, i)
        if target is None or not _on_mesh(leaf):
            return _place(leaf, target, where)
        if leaf.is_deleted():
            raise ShardingError(f"{where}the array has been deleted (was it donated before?)")
        if leaf.size:
            return leaf
        with where.naming():
            m = programs.move(leaf.shape, leaf.dtype, leaf.sharding, target)
        with _wide(leaf.dtype):
            return _empty(leaf.shape, leaf.dtype, m.sharding)


# ---------------------------------------------------------------------- under a trace
def _traced(x, leaves, targets, sources) -> list:
    """The leaves under a trace: the arrays moved inline by their routes (those of redist's route on one mesh
    in one shard_map), host data placed as ``jax.device_put`` places it."""
    out = list(leaves)
    moved, moves = [], []
    for i, (leaf, target, src) in enumerate(zip(leaves, targets, sources)):
        where = _Where(x, i)
        if target is None or not (isinstance(leaf, jax.core.Tracer) or _on_mesh(leaf)):
            out[i] = leaf if isinstance(leaf, jax.core.Tracer) else _place(leaf, target, where)
            continue
        with where.naming():
            if not isinstance(leaf, jax.core.Tracer):
                src = _source(leaf, src, target)
            elif src is None:
                src = _traced_layout(leaf)
            elif isinstance(src, PartitionSpec) and isinstance(target, NamedSharding):
                src = _named(target.mesh, src, "src")
            m = programs.move(leaf.shape, leaf.dtype, src, target)
            if m.between_meshes:
                raise programs.traced_between_meshes(m)
            moves.append(m)
        moved.append(i)
    if _log.isEnabledFor(logging.DEBUG) and moves:
        _log.debug("reshard under a trace, inline in the caller's program:\n%s",
                   "\n".join(f"  {_Where(x, i)}{m.describe()}" for i, m in zip(moved, moves)))
    for i, y in zip(moved, programs.apply(tuple(moves), [leaves[i] for i in moved])):
        out[i] = y
    return out


def _traced_layout(leaf) -> NamedSharding:
    """A tracer's layout, where JAX knows it while tracing: on a mesh whose axes are all Explicit."""
    sharding = jax.typeof(leaf).sharding
    mesh = getattr(sharding, "mesh", None)
    if (not isinstance(sharding, NamedSharding) or not mesh.axis_names
            or any(t != jax.sharding.AxisType.Explicit for t in mesh.axis_types)):
        raise ShardingError(
            "under jax.jit the source layout of a traced array is not known (mesh axes are not Explicit); "
            "pass it as reshard(x, sharding, src=NamedSharding(...) or PartitionSpec(...))")
    return sharding
