"""Lowering: typed plan steps to the instructions of the buffer program (:mod:`redist.program`).

One instruction per step, except that an all-to-all step (of one move or several) becomes one ``AllToAll``
between local reshapes and transposes that bring its chunks to the front and the received ones into place
(:func:`lower_step`); a step which moves nothing (over size-1 axes, or an identity permutation) has no
instruction, and ``pad`` and ``unpad`` steps are views with none. A permute or an exchange lowers to its
compact form (a coordinate map, segment tables) where both its types lie on the program's mesh, else to a
table over the devices. A plan across meshes lowers to *stages* (:func:`lower_stages`): a program per run of
steps on one mesh and a :class:`~redist.program.Transfer` between runs. Nothing in the result refers back to
sharding types: the backends and the verifier read only the instructions.
"""

from __future__ import annotations

import math

from redist import steps as S
from redist.blocks import (Copy, exchange_copies, exchange_segments, local_box, permute_groups, permute_sources,
                           transfer_copies)
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.program import (AllGather, AllReduce, AllToAll, CollectivePermute, CoordinateMap, CopyTable,
                            EmbedChunk, Exchange, ExchangeDim, Instruction, KeepRoot, Program, ReduceScatter,
                            Reshape, Slice, Transfer, Transpose, moves_nothing, shape_after)


def _embed_in_place(t_in, t_out) -> Exchange:
    """An exchange of one local copy per device (none for a device without elements): its elements under
    ``t_in`` placed where its block under ``t_out`` holds them, which contains them (a ``shard_to_partial`` onto
    a whole dim); the rest of the buffer is zero."""
    copies: list = [()] * t_in.mesh.id_bound
    for d in t_in.mesh.devices:
        have, want = local_box(t_in, d), local_box(t_out, d)
        size = tuple(h.stop - h.start for h in have)
        at = tuple(h.start - w.start for h, w in zip(have, want))
        copies[d] = (Copy(d, (0,) * len(size), at, size),) if all(size) else ()
    return Exchange(t_out.local_shape, CopyTable(tuple(copies)))


def _select_in_place(t_in, t_out, axes) -> Exchange:
    """An exchange of local copies for a ``select_to_partial`` over ``axes``: in each group over them, each member
    whose block under ``t_in`` no member before it holds copies the part of its box that lies in the group's box
    under ``t_out`` to where that box holds it; the rest of every buffer is zero."""
    copies: list = [()] * t_in.mesh.id_bound
    for group in t_in.mesh.groups(axes):
        seen = set()
        for d in group:
            have, want = local_box(t_in, d), local_box(t_out, d)
            block = tuple((h.start, h.stop) for h in have)
            lo = [max(h.start, w.start) for h, w in zip(have, want)]
            hi = [min(h.stop, w.stop) for h, w in zip(have, want)]
            if block not in seen and all(h > l for l, h in zip(lo, hi)):
                copies[d] = (Copy(d, tuple(l - h.start for l, h in zip(lo, have)),
                                  tuple(l - w.start for l, w in zip(lo, want)), tuple(h - l for l, h in zip(lo, hi))),)
            seen.add(block)
    return Exchange(t_out.local_shape, CopyTable(tuple(copies)))


def lower_step(step, t_in, mesh: Mesh | None = None) -> tuple[Instruction, ...]:
    """The instructions that implement one typed step on buffers of type ``t_in``, in a program on ``mesh``
    (default: ``t_in.mesh``; see "Devices" above and :func:`_point_to_point`)."""
    if isinstance(step, (S.Permute, S.Exchange)):
        return _point_to_point(step, t_in, step.apply(t_in), mesh or t_in.mesh)
    if isinstance(step, S.ShardToPartial) and not (t_in.is_even(step.dim) and step.apply(t_in).is_even(step.dim)):
        return (_embed_in_place(t_in, step.apply(t_in)),)
    if isinstance(step, S.SelectToPartial):
        return (_select_in_place(t_in, step.apply(t_in), t_in.mesh.axes_of(step.axes)),)
    if isinstance(step, S.AllToAll):
        return _all_to_all(((step.src_dim, step.dst_dim, t_in.mesh.axes_of(step.axes)),), t_in, step.apply(t_in))
    if isinstance(step, S.MultiAllToAll):
        moves = tuple((i, j, t_in.mesh.axes_of(axes)) for i, j, axes in step.moves)
        return _all_to_all(moves, t_in, step.apply(t_in))
    if isinstance(step, (S.Pad, S.Unpad)):
        return ()
    return (_lower_one(step, t_in),)


def _point_to_point(step, t_in, t_out, mesh: Mesh) -> tuple[Instruction, ...]:
    """A permute or an exchange from ``t_in`` to ``t_out`` in a program on ``mesh``: the compact form (a
    coordinate map, segment tables), which reads coordinates on the program's mesh, where both types lie on
    it; else (a change of device order, or a step on the program's other order) a table over the devices:
    :func:`redist.blocks.permute_sources`, :func:`redist.blocks.exchange_copies`."""
    on_mesh = t_in.mesh == t_out.mesh == mesh
    if isinstance(step, S.Permute):
        return (CollectivePermute(CoordinateMap(permute_groups(t_in, t_out)) if on_mesh
                                  else permute_sources(t_in, t_out)),)
    if not on_mesh:
        return (Exchange(t_out.local_shape, CopyTable(exchange_copies(t_in, t_out))),)
    dims = tuple(ExchangeDim(x, y, segs) for x, y, segs in zip(t_in.dims, t_out.dims, exchange_segments(t_in, t_out)))
    return (Exchange(t_out.local_shape, dims),)


def _lower_one(step, t_in) -> Instruction:
    axes = t_in.mesh.axes_of(step.axes)
    if isinstance(step, S.AllSlice):
        return Slice(step.dim, axes)
    if isinstance(step, S.AllGather):
        return AllGather(step.dim, axes)
    if isinstance(step, S.ReduceScatter):
        return ReduceScatter(step.dim, axes, step.reduction)
    if isinstance(step, S.AllReduce):
        return AllReduce(axes, step.reduction)
    if isinstance(step, S.ReplicateToPartial):
        return KeepRoot(axes)
    if isinstance(step, S.ShardToPartial):
        return EmbedChunk(step.dim, axes)
    raise ShardingError(f"no lowering for {step!r}: it is not a redist step")


def _all_to_all(moves, t_in, t_out) -> tuple[Instruction, ...]:
    """An all-to-all of ``moves`` ``(i_m -> j_m, axes_m)`` (one or more) from type ``t_in`` to ``t_out``, in
    the canonical form of :class:`AllToAll` over the axes of all moves in move order. Split every destination
    ``j`` into (the chunk counts ``k_m`` of the moves into it, in move order, then the rest), bring the chunk
    dims to the front in move order and merge them into one dim of ``k`` chunks (row-major, so chunk index =
    rank over all the axes), exchange chunk ``r`` with member ``r``, then split the front dim by sender
    ``(s_1, …, s_M)`` and put each ``s_m`` at the major end of its source dim ``i_m``. Over a group of one
    device it is no instruction."""
    mesh = t_in.mesh
    axes = tuple(a for _, _, move_axes in moves for a in move_axes)
    if mesh.group_size(axes) == 1:
        return ()
    ks = [mesh.group_size(move_axes) for _, _, move_axes in moves]
    # Expanded dims: ("c", m) the chunk index of move m in its destination, ("d", d) the rest of dim d.
    expanded, sizes = [], {}
    for d, n in enumerate(t_in.local_shape):
        into = [m for m, (_, j, _) in enumerate(moves) if j == d]
        expanded += [("c", m) for m in into] + [("d", d)]
        sizes.update({("c", m): ks[m] for m in into})
        sizes[("d", d)] = n // math.prod(ks[m] for m in into)
    front = [("c", m) for m in range(len(moves))]
    rest = [e for e in expanded if e[0] == "d"]
    ins = [
        Reshape(tuple(sizes[e] for e in expanded)),
        Transpose(tuple(expanded.index(e) for e in front + rest)),
        Reshape((math.prod(ks),) + tuple(sizes[e] for e in rest)),
        AllToAll(axes),
    ]
    # After the exchange the front dims index the sender; each goes just before its source dim i_m.
    senders = [("s", m) for m in range(len(moves))]
    sizes.update({("s", m): k for m, k in enumerate(ks)})
    source_of = {i: m for m, (i, _, _) in enumerate(moves)}
    final = []
    for e in rest:
        if e[1] in source_of:
            final.append(("s", source_of[e[1]]))
        final.append(e)
    received = senders + rest
    ins += [
        Reshape(tuple(sizes[e] for e in received)),
        Transpose(tuple(received.index(e) for e in final)),
        Reshape(t_out.local_shape),
    ]
    return tuple(ins)


# Steps that lower to instructions naming devices by id (or to none): they may change the device order.
_POINT_TO_POINT = (S.Permute, S.Exchange, S.Pad, S.Unpad)


def collective_mesh(steps, types) -> Mesh:
    """The mesh on which the collectives of ``steps`` (with their ``len(steps) + 1`` types) run: the mesh of
    the type before each step other than a permute or an exchange (``types[0].mesh`` if there is none).
    Raises :class:`ShardingError` if they run on two device orders: the program's groups are one mesh's."""
    meshes = {t.mesh for step, t in zip(steps, types) if not isinstance(step, _POINT_TO_POINT)}
    if len(meshes) > 1:
        raise ShardingError(f"the plan's collectives run on {len(meshes)} device orders "
                            f"({'; '.join(sorted(map(str, meshes)))}); a plan changes the device order by a "
                            "permute or an exchange before or after all of its collectives")
    return meshes.pop() if meshes else types[0].mesh


def segments(steps, types) -> list[tuple[tuple, tuple]]:
    """``steps`` (with their ``len(steps) + 1`` types) cut at every transfer: the runs of steps on one mesh
    (each with its types) and the transfers, in order, each a ``(steps, types)`` pair (a transfer alone with its
    two types). A plan within one mesh is one run."""
    out, start = [], 0
    for i, step in enumerate(steps):
        if isinstance(step, S.Transfer):
            out += [(tuple(steps[start:i]), tuple(types[start:i + 1])), ((step,), tuple(types[i:i + 2]))]
            start = i + 1
    return out + [(tuple(steps[start:]), tuple(types[start:]))]


def check_meshes(steps, types) -> None:
    """Raise :class:`ShardingError` unless the collectives of each run of ``steps`` between transfers run on
    one device order (:func:`collective_mesh`)."""
    for run, run_types in segments(steps, types):
        if not (run and isinstance(run[0], S.Transfer)):
            collective_mesh(run, run_types)


def lower_stages(steps, types) -> tuple[Program | Transfer, ...]:
    """Lower typed steps to their *stages*: a :class:`Program` per run of steps on one mesh and a
    :class:`Transfer` per transfer step between them (:func:`segments`), in order; a plan within one mesh is one
    program."""
    return tuple(_transfer(run[0], run_types[0]) if run and isinstance(run[0], S.Transfer) else lower(run, run_types)
                 for run, run_types in segments(steps, types))


def _transfer(step: S.Transfer, t_in) -> Transfer:
    """The lowered form of a transfer step from buffers of type ``t_in``."""
    t_out = step.apply(t_in)
    return Transfer(t_in.mesh, t_out.mesh, t_in.local_shape, t_out.local_shape,
                    CopyTable(transfer_copies(t_in, t_out)))


def lower(steps, types) -> Program:
    """Lower typed steps (with their ``len(steps) + 1`` types) on one mesh (no transfer) to a buffer program;
    its ``mesh`` is :func:`collective_mesh`, its ``src_mesh`` and ``dst_mesh`` the first and last types'."""
    t0 = types[0]
    mesh = collective_mesh(steps, types)
    instructions, shapes = [], [t0.local_shape]
    for step, t in zip(steps, types):
        for ins in lower_step(step, t, mesh):
            if moves_nothing(ins, shapes[-1], mesh):
                continue
            instructions.append(ins)
            shapes.append(shape_after(ins, shapes[-1], mesh))
    assert shapes[-1] == types[-1].local_shape
    return Program(mesh=mesh, dtype=t0.np_dtype, instructions=tuple(instructions), shapes=tuple(shapes),
                   src_mesh=t0.mesh, dst_mesh=types[-1].mesh)
