"""The local program: instructions on per-device buffers, and their execution inside one ``jax.shard_map``.

A :class:`LocalProgram` (made by :func:`partir_core.lowering.lower`) is a list of instructions over buffers
named by value ids, or ``("r", n)`` for resharded copies:

- :class:`Reshard`: a buffer moved to another type by a redist plan (:mod:`partir_core.reshard`).
- :class:`Compute`: one equation on local shards, through its registry rule's local form (local shapes, block
  offsets); ops with no rule run on replicated operands with their original parameters. Operand dims that are
  split unevenly and reduced over first get their padding set to the reduction's identity. A local form that
  communicates (a static permutation's ``ppermute``) lists its collectives.
- :class:`Finish`: ``pmax``/``pmin`` after a max/min reduction over a split dim.
- :class:`ControlFlow`: a control-flow region (:class:`partir_core.ir.Region`) run as one ``lax.scan`` /
  ``lax.while_loop`` / ``lax.switch`` on local shards, each body a list of these instructions of its own.

:meth:`LocalProgram.run` interprets it inside one ``jax.shard_map`` over the whole mesh, refined where its
plans or types use sub-axes (:func:`partir_core.reshard.refine`), with the inputs' and outputs' partition specs;
inputs with uneven dims are padded to their padded shape before, outputs cut back after. Independent reshards
of one collective kind run packed, as one collective (:mod:`partir_core.packing`).

Arrays of random keys: buffers hold key arrays, ops see key shapes, and reshards and the ``shard_map`` boundary
move key data (:mod:`partir_core.keys`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from redist.types import ShardingType

from partir_core import keys, packing, reshard
from partir_core.choice import Analysis, local_shapes
from partir_core.instructions import (  # noqa: F401 (the program's vocabulary, named here too)
    CarryReshard, Compute, ControlFlow, Finish, Reshard, reads_of, walk, writes_of)
from partir_core.ir import Graph
from partir_core.registry import LocalContext, bind


@dataclass
class LocalProgram:
    """Instructions over per-device buffers (value ids, or ``("r", n)`` for resharded copies) and what they
    were lowered from: the ``graph``, its ``mesh``, the per-op choices (``analysis``), the types of the inputs
    and outputs, the buffers that hold the outputs, every buffer's local bytes, the reshards that use the
    gather-then-slice fallback (``(where, src, dst, why)``), the loop carries moved back at the end of
    their body (:class:`CarryReshard`), and the JAX mesh it runs on (``device_mesh``: one with the mesh's
    axes; None: :meth:`jax_mesh`'s default)."""

    graph: Graph
    mesh: object
    analysis: Analysis
    instructions: list
    in_types: list
    out_types: list
    out_bufs: list
    buf_bytes: dict
    fallbacks: list = field(default_factory=list)
    carry_reshards: list = field(default_factory=list)
    # where each equation's instructions lie, for lowering a similar analysis from this program (a program
    # without control flow: partir_core.lowering.Segments; None otherwise)
    segments: object = field(default=None, repr=False, compare=False)
    device_mesh: jax.sharding.Mesh | None = field(default=None, repr=False, compare=False)

    @property
    def collectives(self) -> list[reshard.Collective]:
        """Every collective, in program order, those inside loops once each (their ``trips`` say how often
        they run per call)."""
        return [c for ins in walk(self.instructions) if isinstance(ins, (Reshard, Finish, Compute))
                for c in ins.collectives]

    @property
    def axis_tokens(self) -> tuple[str, ...]:
        """The axes and sub-axis tokens that the program names, in a fixed order: those of its plans, and
        those of its values' types (a tactic's sub-axes: specs, block offsets and pending sums name them)."""
        tokens = {tok for ins in walk(self.instructions) if isinstance(ins, Reshard)
                  for tok in ins.move.plan.program.axis_tokens()}
        types = [*self.in_types, *self.out_types, *self.analysis.types.values()]
        types += [t for op in self.analysis.ops for t in (*op.in_types, *op.out_types)]
        tokens.update(a for t in types for axes in (*t.dims, t.partial) for a in axes)
        return tuple(sorted(tokens))

    def jax_mesh(self) -> jax.sharding.Mesh:
        """The JAX mesh the program runs on: :attr:`device_mesh`, or else the mesh's device order over the first
        ``mesh.size`` JAX devices (the device at position ``p`` is ``jax.devices()[mesh.device_ids[p]]``).
        Raises :class:`redist.ShardingError` if JAX has fewer devices."""
        return self.device_mesh if self.device_mesh is not None else reshard.device_mesh(self.mesh)

    @functools.cached_property
    def _refined(self) -> tuple[jax.sharding.Mesh, reshard.AxisNames]:
        """The ``shard_map``'s mesh: :meth:`jax_mesh` refined for :attr:`axis_tokens`, and its axis names."""
        return reshard.refine(self.jax_mesh(), self.axis_tokens)

    def body(self, *xs):
        """The per-device program (call inside a ``shard_map`` over the refined mesh)."""
        g = self.graph
        names = self._refined[1]
        env = {v: keys.from_data(x, g.dtype(v)) for v, x in zip(g.invars, xs)}
        for v, c in g.consts.items():
            env[v] = c if keys.is_key(g.dtype(v)) else jnp.asarray(c, dtype=g.dtype(v))
        self._run(self.instructions, env, names)
        return tuple(keys.to_data(env[b]) for b in self.out_bufs)

    def _run(self, instructions: list, env: dict, names: reshard.AxisNames) -> None:
        """Interpret ``instructions`` on the buffers of ``env`` (updated in place), the reshards of each pack
        as one collective (:mod:`partir_core.packing`)."""
        for unit in packing.schedule(instructions, packing.packs(instructions)):
            if isinstance(unit, tuple):
                members = [instructions[t] for t in unit]
                outs = reshard.run_packed_moves([m.move for m in members], [env[m.src_buf] for m in members], names)
                env.update(zip([m.dst_buf for m in members], outs))
                continue
            ins = instructions[unit]
            if isinstance(ins, Reshard):
                env[ins.dst_buf] = reshard.run(ins.move, env[ins.src_buf], names)
            elif isinstance(ins, Compute):
                for b, x in zip(ins.writes, self._compute(ins, [env[b] for b in ins.reads], names)):
                    env[b] = x
            elif isinstance(ins, Finish):
                red = lax.pmax if ins.kind == "max" else lax.pmin
                env[ins.buf] = red(env[ins.buf], names(ins.axes))
            else:
                env.update(zip(ins.writes, self._control_flow(ins, env, names)))

    def _control_flow(self, ins: ControlFlow, env: dict, names: reshard.AxisNames) -> list:
        """The results of region ``ins`` run as one ``lax.scan``, ``lax.while_loop`` or ``lax.switch`` on local
        buffers. A body sees the buffers of ``env`` (constants) and its parameters; it returns its results."""
        reg = self.graph.regions[ins.region]
        enter = self.graph.eqns[reg.enter]
        start = {enter.outvars[o]: env[ins.operands[i]] for i, o, _ in enter.params["ties"]}

        def body(b: int, bound: dict) -> list:
            local = {**env, **start, **bound}
            self._run(ins.bodies[b], local, names)
            return [local[v] for v in ins.results[b]]

        carry = [start[v] for v in reg.carry]
        if ins.kind == "scan":
            nk, p = len(reg.carry), reg.params

            def step(c, x):
                res = body(0, {**dict(zip(reg.carry, c)), **dict(zip(reg.xs, x))})
                return res[:nk], res[nk:]

            c, ys = lax.scan(step, carry, [start[v] for v in reg.xs], length=p["length"], reverse=p["reverse"],
                             unroll=p["unroll"])
            return list(c) + list(ys)
        if ins.kind == "while":
            out = lax.while_loop(lambda c: body(0, dict(zip(reg.carry, c)))[0],
                                 lambda c: body(1, dict(zip(reg.carry, c))), carry)
            return list(out)
        branches = [lambda b=b: body(b, {}) for b in range(len(ins.bodies))]
        return list(lax.switch(env[ins.operands[0]], branches))

    def _compute(self, ins: Compute, vals: list, names: reshard.AxisNames) -> list:
        """The results of ``ins`` on local operands ``vals``."""
        op = self.analysis.ops[ins.eqn_index]
        for i, d, kind in ins.masks:
            vals[i] = _mask_padding(vals[i], op.in_types[i], d, kind, names)
        return self.local_op(ins.eqn_index, names)(*vals)

    def local_op(self, i: int, names: reshard.AxisNames):
        """The function a device runs for equation ``i`` on its local operands (padding already masked), giving
        the list of its local results: the registry rule's local form, or the primitive with its own
        parameters (no rule, or a rule without a local form)."""
        g = self.graph
        eqn = g.eqns[i]
        op = self.analysis.ops[i]
        ctx = LocalContext(eqn, local_shapes(g, eqn.invars, op.in_types), local_shapes(g, eqn.outvars, op.out_types),
                           [t.dims for t in op.out_types], self.mesh, op.new_partial, names,
                           [t.dims for t in op.in_types])
        if op.rule is None or op.rule.local is None:
            return functools.partial(bind, ctx)
        return functools.partial(op.rule.local, ctx)

    def run(self, *flat_args, donate: tuple[int, ...] = ()):
        """The outputs on the inputs ``flat_args`` (the flattened arguments); the buffers of the inputs at the
        positions ``donate`` are given to the program (deleted after the call, as ``jax.jit`` donates)."""
        return self.executable(donate)(*flat_args)

    def executable(self, donate: tuple[int, ...] = ()):
        """The jitted program on global arrays, donating the inputs at positions ``donate`` (one per donation
        asked for). ``shard_map`` needs dims that divide their axes, so inputs
        with uneven dims are padded (with zeros) to their ``padded_shape`` first, whose blocks are exactly
        the padded local buffers, and outputs are cut back to their shape. Key arrays cross the boundary as
        their key data (their types' arrays). The outputs carry the ``NamedSharding`` of :meth:`layouts`, as the
        inputs placed in their types do (on a refined mesh: on the mesh itself where their types name whole
        axes only, on the refined mesh where they name a sub-axis; the same devices and blocks either way, so no
        data moves), so that a result fed back as an argument of its own type is one that call was traced for."""
        donate = tuple(donate)
        if donate not in self._executables:
            mesh, names = self._refined
            mapped = jax.shard_map(self.body, mesh=mesh, in_specs=tuple(names.spec(t) for t in self.in_types),
                                   out_specs=tuple(names.spec(t) for t in self.out_types), check_vma=False)

            def run(*xs):
                xs = [keys.to_data(x) for x in xs]
                xs = [x if t.is_even() else jnp.pad(x, [(0, p - n) for n, p in zip(t.shape, t.padded_shape)])
                      for x, t in zip(xs, self.in_types)]
                outs = mapped(*xs)
                outs = [y if t.is_even() else y[tuple(slice(0, n) for n in t.shape)]
                        for y, t in zip(outs, self.out_types)]
                return tuple(keys.from_data(y, self.graph.dtype(v)) for y, v in zip(outs, self.graph.outvars))

            self._executables[donate] = jax.jit(run, out_shardings=self.layouts(self.graph.outvars, self.out_types),
                                                donate_argnums=donate)
        return self._executables[donate]

    @functools.cached_property
    def _executables(self) -> dict:
        """The jitted programs made so far, by the positions of their donated inputs."""
        return {}

    def layouts(self, values: list, types: list) -> tuple[NamedSharding, ...]:
        """The ``NamedSharding`` of each of ``values`` in its type of ``types``: the type's spec over the value's
        own dims (a key array's, without its key-data dims), a dim split unevenly whole (JAX shards only dims
        that divide; the program pads and cuts such a dim itself); on :meth:`jax_mesh` where the type names
        whole axes only, else on the refined mesh (a sub-axis has no name on the mesh itself). The spec leaves
        out trailing whole dims (``P('batch')``, not ``P('batch', None)``), as JAX writes the sharding of a result
        it derives: ``jax.jit`` tells shardings apart by their spec, so an argument placed so is one a call that
        returned it was traced for. Pending sums have no ``NamedSharding``: a program's inputs and outputs have
        none."""
        jax_mesh = self.jax_mesh()
        refined, names = self._refined
        out = []
        for v, t in zip(values, types):
            whole = all(a.is_whole for axes in t.dims for a in axes)
            spec = t.partition_spec() if whole else names.spec(t)
            spec = [e if t.is_even(d) else None for d, e in enumerate(spec)][: len(self.graph.shape(v))]
            while spec and spec[-1] is None:
                spec.pop()
            spec = PartitionSpec(*spec)
            out.append(NamedSharding(jax_mesh if whole else refined, spec))
        return tuple(out)


_IDENTITY = {"sum": 0, "max": -np.inf, "min": np.inf}


def _mask_padding(x, t: ShardingType, dim: int, kind: str, names: reshard.AxisNames):
    """``x`` (a local buffer of type ``t``) with the padding of uneven dim ``dim`` set to the identity of a
    ``kind`` reduction (0 for sums, -inf / +inf or the dtype's extremes for max / min), so that reducing
    over the dim counts data only. Padding holds whatever the ops before computed there (never data)."""
    L = t.local_shape[dim]
    start = lax.axis_index(names(t.dims[dim])) * L
    valid = lax.broadcasted_iota(jnp.int32, x.shape, dim) + start < t.shape[dim]
    fill = _IDENTITY[kind]
    if jnp.issubdtype(x.dtype, jnp.integer) and fill:
        info = jnp.iinfo(x.dtype)
        fill = info.min if fill < 0 else info.max
    elif x.dtype == jnp.bool_:
        fill = kind == "min"
    return jnp.where(valid, x, jnp.asarray(fill, x.dtype))
