"""Mutation testing of the verifier: mutate synthesized programs and count how many mutants it kills.

Operators (each mutant is a modified :class:`redist.program.Program`; its buffer shapes are re-derived from
its instructions so that it is a well-formed program wherever the mutation allows — a mutant whose shapes
cannot be derived, e.g. a split that no longer divides, is ill-formed: it keeps the original shapes and the
verifier must still refute it; the numpy backend refuses it, as every backend checks a program's shapes
and copies before running it):

- ``reverse_axes``: an instruction's axes tuple reversed (swaps the group members' order);
- ``wrong_dim``: an instruction's dim moved to another dim (an all-to-all has none: its chunks are its
  leading dim, placed by the transposes around it);
- ``wrong_axis``: one axis token replaced by another mesh axis or sub-axis not already named there;
- ``drop``: one instruction removed;
- ``duplicate``: one instruction repeated;
- ``swap_permute_pair``: two entries of a collective permute's source table exchanged (a permute lowered as a
  coordinate map is mutated in its table form, which the verifier reads another way);
- on a permute's coordinate map (the compact form lowering makes; each group says that the source's rank
  over its source axes is the receiver's rank over its axes): ``map_reverse_group`` (a group's source axes
  in reverse order: the right class of devices, in the wrong order), ``map_swap_sides`` (a group's two sides
  exchanged: the inverse map), ``map_swap_groups`` (the source axes of two groups exchanged),
  ``map_wrong_axis`` (one axis of a group replaced by another token of the mesh) and ``map_drop_group``
  (one group removed); where the result is no permutation (sides of different sizes or factors) the mutant
  is ill-formed;
- ``reduce_kind``: a reduce-scatter turned into an all-reduce or back (with a slice);
- ``embed_gather``: an ``EmbedChunk`` (a created summand: the member's block in its own chunk of zeros)
  turned into an ``AllGather`` of the same shape, or back (``KeepRoot``, which zeros all but one member,
  is mutated by ``drop``, ``duplicate`` and ``wrong_axis``);
- ``wrong_reduction``: a reduce-scatter's or all-reduce's reduction kind replaced by another the dtype has
  (not on ``bool``, whose sum and maximum are both "or", nor over a group of one device, where every kind
  is the identity, nor on buffers without elements: such mutants are equivalent, but the verifier refutes
  them, docs/spec.md §2: a plan never converts between kinds);
- ``swap_transpose``: two entries of a local transpose's permutation exchanged (the transposes around an
  all-to-all);
- on an ``Exchange`` (per-dim segment tables, uneven dims): ``drop_segment`` (one segment removed),
  ``shift_segment_src`` / ``shift_segment_dst`` (one segment's ``src_start`` / ``dst_start`` moved by ±1,
  where the exchange stays well-formed), ``shift_segment_off`` (such a move that leaves it ill-formed: off a
  buffer's edge, or onto another segment of its block), ``segment_source`` (one segment reads another source
  block: a wrong class of senders), ``segment_block`` (one segment serves another receiver block),
  ``shrink_segment`` (one segment's size less one) and ``exchange_axes`` (a dim's source axes or axes
  reversed, or swapped for each other). An exchange is ill-formed when a segment names a block that does not
  exist, does not fit the buffer it reads or the one it writes, or overlaps another segment of its block, or
  when source axes overlap;
- on an exchange between two device orders (a copy table, per device): ``drop_copy`` (one copy of one device
  removed), ``shift_copy_src`` / ``shift_copy_dst`` (one copy's ``src_start`` / ``dst_start`` moved by ±1
  along one dim, where the table stays well-formed), ``shift_copy_off`` (such a move that leaves it
  ill-formed), ``copy_source`` (one copy reads another device) and ``shrink_copy`` (one copy's size less one
  along one dim);
- on a transfer between meshes (a plan across meshes: its stages are mutated, each program by the operators
  above and each transfer by these): ``transfer_source`` (one copy reads another device of the source's mesh),
  ``transfer_receiver`` (one copy moved to another device of the destination's mesh), ``transfer_src`` /
  ``transfer_dst`` / ``transfer_size`` (one copy's ``src_start``, ``dst_start`` or size moved by ±1 along one
  dim: a wrong block offset or size; ``_off`` where that leaves the transfer ill-formed), ``transfer_outside``
  (one copy moved to, or read from, a device of neither mesh: ill-formed), ``transfer_drop_copy`` (one copy
  removed) and ``drop_transfer`` (every copy removed: the destination's devices hold zeros). A transfer is
  ill-formed when a copy names a device outside its meshes, does not fit a buffer or overlaps another copy of
  its device; a program mutant whose result changes shape no longer fits the transfer after it.

On the claim side (each mutant is the plan's program with a claimed destination type that differs from the
plan's in one field the value query does not read; claims that are not well-formed types are skipped, as
nobody can make them):

- ``claim_dtype``: another dtype (those of the same item size among them: ``i32`` for ``f32``);
- ``claim_mesh_order``: the mesh's axes in another order (``y=2,x=4`` for ``x=4,y=2``): the same devices,
  numbered differently (device 1 is at ``x=0,y=1`` on one and ``y=0,x=1`` on the other, so it holds another
  block than the claim says unless the type replicates over those axes);
- ``claim_axis_sizes``: the same axis names in the same order, with other sizes of the same product (``x=4,y=2``
  for ``x=2,y=4``, or a prime factor moved between two axes);
- ``claim_shape``: one dim one element longer;
- ``claim_device_order``: the same axes with the devices in another order (``device_ids`` reversed, rotated
  by one, or a random permutation; docs/spec.md §1: another mesh is another type): a device then holds the block of
  another position;
- ``claim_reduction``: a partial claim of another reduction kind the dtype has (not on ``bool``, nor where
  the partial group is one device: see ``wrong_reduction``).

Uneven plans are mutated too: fixed pairs of both kinds (collectives on the padded view between ``pad`` and
``unpad``, whose program is the even program on the padded buffers, so the operators above apply; and an
exchange, with or without an all-reduce), and a share of the random pairs. The oracle fills source padding
with NaN, so a mutant that reads padding as data is non-equivalent.

Not covered: an off-by-one slice bound. The instruction set cannot express it (a ``Slice`` always keeps
chunk ``r`` of ``k`` equal chunks), and the backends refuse a mutant-only subclass (they run the
instructions of :mod:`redist.program` only), so no backend could witness it; the operator is skipped.

The random plans are drawn with every feature of the types: partial sources of every reduction kind, source
meshes and destinations in random device orders, complex and bool dtypes among the real ones; and, apart, plans
across meshes of every relation (:data:`FIXED_CROSS_MESH_PAIRS`, then random ones).

A mutant the verifier proves correct (a survivor) must be equivalent: the numpy backend, run on random
data (distinct elements, random summands per partial group), must give the correct result (in the claimed
dtype, on the claimed mesh: :func:`proofs.common.oracle`). A mutant the verifier refutes while the backend
finds it correct is a false alarm. Both are failures of this script, and so are a mutant the verifier leaves
undecided and a refuted claim mutant without a counterexample.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import sys
import time

import numpy as np

from redist import program as P
from redist.synthesis import synthesize
from redist.verify import verify_program


def derive_shapes(prog: P.Program, instructions) -> tuple | None:
    """The buffer shapes of ``instructions`` from ``prog``'s input shape, or None if they are ill-formed."""
    mesh = prog.mesh
    shapes = [tuple(prog.shapes[0])]
    for ins in instructions:
        x = list(shapes[-1])
        try:
            if isinstance(ins, (P.CollectivePermute, P.Exchange)):
                # A table, a coordinate map or segment tables: the library's checks of the instruction's form.
                x = list(P.shape_after(ins, tuple(x), mesh))
            elif isinstance(ins, P.Reshape):
                if math.prod(ins.shape) != math.prod(x):
                    return None
                x = list(ins.shape)
            elif isinstance(ins, P.Transpose):
                if sorted(ins.perm) != list(range(len(x))):
                    return None
                x = [x[p] for p in ins.perm]
            else:
                k = mesh.group_size(ins.axes)
                if isinstance(ins, P.Slice):
                    if x[ins.dim] % k:
                        return None
                    x[ins.dim] //= k
                elif isinstance(ins, P.ReduceScatter):  # chunks by the padding rule
                    x[ins.dim] = -(-x[ins.dim] // k)
                elif isinstance(ins, (P.AllGather, P.EmbedChunk)):
                    x[ins.dim] *= k
                elif isinstance(ins, P.AllToAll) and x[0] != k:
                    return None
        except (IndexError, ValueError):  # ShardingError is a ValueError
            return None
        shapes.append(tuple(x))
    return tuple(shapes)


def _well_formed(ins, shape_in, mesh) -> bool:
    try:
        P.shape_after(ins, shape_in, mesh)
    except ValueError:
        return False
    return True


def _exchange_mutants(x: P.Exchange, shape_in: tuple, mesh):
    """(operator, description, mutated exchange) for every exchange mutant of the module docstring, for an
    exchange that reads buffers of ``shape_in``."""
    def with_dim(i, **change):
        dims = list(x.dims)
        dims[i] = dataclasses.replace(dims[i], **change)
        return P.Exchange(x.shape, tuple(dims))

    def with_segment(i, j, new):
        segs = x.dims[i].segments
        return with_dim(i, segments=segs[:j] + ((new,) if new is not None else ()) + segs[j + 1:])

    for i, dim in enumerate(x.dims):
        k_in, k_out = mesh.group_size(dim.source_axes), mesh.group_size(dim.axes)
        for j, g in enumerate(dim.segments):
            yield "drop_segment", f"dim {i} segment {j} ({tuple(g)}) dropped", with_segment(i, j, None)
            for delta in (1, -1):
                for field in ("src_start", "dst_start"):
                    y = with_segment(i, j, g._replace(**{field: getattr(g, field) + delta}))
                    op = f"shift_segment_{field[:3]}" if _well_formed(y, shape_in, mesh) else "shift_segment_off"
                    yield op, f"dim {i} segment {j} {field} {delta:+d}", y
            if g.size >= 1:
                yield "shrink_segment", f"dim {i} segment {j} size -1", with_segment(i, j, g._replace(size=g.size - 1))
            for sb in range(k_in):
                if sb != g.source_block:
                    yield ("segment_source", f"dim {i} segment {j} source block {g.source_block} -> {sb}",
                           with_segment(i, j, g._replace(source_block=sb)))
            for b in range(k_out):
                if b != g.block:
                    yield ("segment_block", f"dim {i} segment {j} block {g.block} -> {b}",
                           with_segment(i, j, g._replace(block=b)))
        for field in ("source_axes", "axes"):
            axes = getattr(dim, field)
            if len(axes) >= 2:
                yield "exchange_axes", f"dim {i} {field} reversed", with_dim(i, **{field: axes[::-1]})
        if dim.source_axes != dim.axes:
            yield ("exchange_axes", f"dim {i} source axes and axes swapped",
                   with_dim(i, source_axes=dim.axes, axes=dim.source_axes))


def _copy_table_mutants(x: P.Exchange, shape_in: tuple, mesh):
    """(operator, description, mutated exchange) for the copy-table operators of the module docstring (an
    exchange between two device orders), for an exchange that reads buffers of ``shape_in``."""
    table = x.dims.copies

    def with_copy(d, j, new):
        copies = list(table)
        copies[d] = copies[d][:j] + ((new,) if new is not None else ()) + copies[d][j + 1:]
        return P.Exchange(x.shape, P.CopyTable(tuple(copies)))

    def moved(start, k, delta):
        return start[:k] + (start[k] + delta,) + start[k + 1:]

    for d, copies in enumerate(table):
        for j, c in enumerate(copies):
            yield "drop_copy", f"device {d} copy {j} ({c}) dropped", with_copy(d, j, None)
            for k in range(len(c.size)):
                for delta in (1, -1):
                    for field in ("src_start", "dst_start"):
                        y = with_copy(d, j, dataclasses.replace(c, **{field: moved(getattr(c, field), k, delta)}))
                        op = f"shift_copy_{field[:3]}" if _well_formed(y, shape_in, mesh) else "shift_copy_off"
                        yield op, f"device {d} copy {j} {field}[{k}] {delta:+d}", y
                if c.size[k] >= 1:
                    yield ("shrink_copy", f"device {d} copy {j} size[{k}] -1",
                           with_copy(d, j, dataclasses.replace(c, size=moved(c.size, k, -1))))
            for e in mesh.devices:
                if e != c.source:
                    yield ("copy_source", f"device {d} copy {j} source {c.source} -> {e}",
                           with_copy(d, j, dataclasses.replace(c, source=e)))


def _transfer_mutants(x: P.Transfer):
    """(operator, description, mutated transfer) for the transfer operators of the module docstring."""
    table = x.copies.copies

    def changed(d, j, new, to=None):
        """The transfer with copy ``j`` of device ``d`` replaced by ``new`` (None: dropped) or, with ``to``, moved
        to the end of device ``to``'s copies (rows added up to it)."""
        rows = [list(r) for r in table]
        c = rows[d].pop(j)
        if to is None and new is not None:
            rows[d].insert(j, new)
        elif to is not None:
            rows += [[] for _ in range(len(rows), to + 1)]
            rows[to].append(c)
        return dataclasses.replace(x, copies=P.CopyTable(tuple(map(tuple, rows))))

    def moved(start, k, delta):
        return start[:k] + (start[k] + delta,) + start[k + 1:]

    yield "drop_transfer", "every copy dropped", dataclasses.replace(x, copies=P.CopyTable(((),) * len(table)))
    outside = next(d for d in itertools.count() if not x.mesh.has_device(d))
    unknown = next(d for d in itertools.count() if not x.src_mesh.has_device(d))
    for d, copies in enumerate(table):
        for j, c in enumerate(copies):
            yield "transfer_drop_copy", f"device {d} copy {j} ({c}) dropped", changed(d, j, None)
            for e in x.src_mesh.devices:
                if e != c.source:
                    yield ("transfer_source", f"device {d} copy {j} source {c.source} -> {e}",
                           changed(d, j, dataclasses.replace(c, source=e)))
            for e in x.mesh.devices:
                if e != d:
                    yield "transfer_receiver", f"device {d} copy {j} moved to device {e}", changed(d, j, c, to=e)
            yield ("transfer_outside", f"device {d} copy {j} moved to {outside}, no device of mesh {x.mesh}",
                   changed(d, j, c, to=outside))
            yield ("transfer_outside", f"device {d} copy {j} source {c.source} -> {unknown}, no device of mesh "
                   f"{x.src_mesh}", changed(d, j, dataclasses.replace(c, source=unknown)))
            for k in range(len(c.size)):
                for delta in (1, -1):
                    for field in ("src_start", "dst_start", "size"):
                        y = changed(d, j, dataclasses.replace(c, **{field: moved(getattr(c, field), k, delta)}))
                        op = f"transfer_{field.split('_')[0]}" + ("" if _well_formed_transfer(y) else "_off")
                        yield op, f"device {d} copy {j} {field}[{k}] {delta:+d}", y


def _well_formed_transfer(x: P.Transfer) -> bool:
    """Whether a transfer's copies name devices of its meshes and fit its buffers without overlapping."""
    try:
        P.check_copy_table(x.copies.copies, x.src_shape, x.shape, x.src_mesh, x.mesh, "transfer")
    except ValueError:  # ShardingError is a ValueError
        return False
    return True


def _map_mutants(x: P.CollectivePermute, mesh):
    """(operator, description, mutated permute) for the coordinate-map operators of the module docstring."""
    groups = x.sources.groups

    def permute(new_groups):
        return P.CollectivePermute(P.CoordinateMap(tuple(new_groups)))

    for g, (source_axes, axes) in enumerate(groups):
        rest = list(groups[:g]), list(groups[g + 1:])
        if len(source_axes) >= 2:
            yield ("map_reverse_group", f"group {g} source axes reversed",
                   permute(rest[0] + [(source_axes[::-1], axes)] + rest[1]))
        yield "map_swap_sides", f"group {g} sides swapped", permute(rest[0] + [(axes, source_axes)] + rest[1])
        yield "map_drop_group", f"group {g} dropped", permute(rest[0] + rest[1])
        for side in (0, 1):
            names = (source_axes, axes)[side]
            for j in range(len(names)):
                for tok in _tokens(mesh):
                    if tok not in names:
                        new = names[:j] + (mesh.axis(tok),) + names[j + 1:]
                        pair = (new, axes) if side == 0 else (source_axes, new)
                        yield ("map_wrong_axis", f"group {g} axis {names[j]} -> {tok}",
                               permute(rest[0] + [pair] + rest[1]))
        for h in range(g + 1, len(groups)):
            swapped = list(groups)
            swapped[g], swapped[h] = (groups[h][0], axes), (source_axes, groups[h][1])
            yield "map_swap_groups", f"groups {g} and {h}: source axes exchanged", permute(swapped)


def _tokens(mesh):
    out = list(mesh.names)
    for name, size in mesh.axes:
        for pre in range(1, size + 1):
            for s in range(2, size + 1):
                if size % (pre * s) == 0 and (pre, s) != (1, size) and size // (pre * s) >= 1:
                    out.append(f"{name}:({pre}){s}")
    return out


def mutants(prog: P.Program, rng: random.Random, max_per_op: int = 3):
    """Yield (operator, description, instructions) for mutants of ``prog``."""
    ins = list(prog.instructions)
    rank = len(prog.shapes[0])
    mesh = prog.mesh
    found: dict[str, list] = {}

    def add(op, desc, new):
        found.setdefault(op, []).append((op, desc, tuple(new)))

    for t, x in enumerate(ins):
        axes = getattr(x, "axes", None)
        if axes and len(axes) >= 2:
            add("reverse_axes", f"{t}: axes {axes} reversed", ins[:t] + [dataclasses.replace(x, axes=axes[::-1])] + ins[t + 1:])
        if hasattr(x, "dim"):
            for d in range(rank):
                if d != x.dim:
                    add("wrong_dim", f"{t}: dim {x.dim} -> {d}",
                        ins[:t] + [dataclasses.replace(x, dim=d)] + ins[t + 1:])
        if axes:
            for j in range(len(axes)):
                for tok in _tokens(mesh):
                    if tok not in axes:
                        new_axes = axes[:j] + (tok,) + axes[j + 1:]
                        add("wrong_axis", f"{t}: axis {axes[j]} -> {tok}",
                            ins[:t] + [dataclasses.replace(x, axes=new_axes)] + ins[t + 1:])
        add("drop", f"{t}: {x} dropped", ins[:t] + ins[t + 1:])
        add("duplicate", f"{t}: {x} duplicated", ins[:t + 1] + ins[t:])
        if isinstance(x, P.CollectivePermute):
            src = list(x.source_table(mesh))
            for a in range(len(src)):
                for b in range(a + 1, len(src)):
                    if src[a] != src[b] and (src[a] != a or src[b] != b):
                        s2 = list(src)
                        s2[a], s2[b] = s2[b], s2[a]
                        add("swap_permute_pair", f"{t}: sources[{a}] <-> sources[{b}]",
                            ins[:t] + [P.CollectivePermute(tuple(s2))] + ins[t + 1:])
            if isinstance(x.sources, P.CoordinateMap):
                for op, desc, y in _map_mutants(x, mesh):
                    add(op, f"{t}: {desc}", ins[:t] + [y] + ins[t + 1:])
        if isinstance(x, P.Transpose):
            perm = list(x.perm)
            for a in range(len(perm)):
                for b in range(a + 1, len(perm)):
                    p2 = list(perm)
                    p2[a], p2[b] = p2[b], p2[a]
                    add("swap_transpose", f"{t}: perm entries {a} <-> {b}",
                        ins[:t] + [P.Transpose(tuple(p2))] + ins[t + 1:])
        if isinstance(x, P.Exchange):
            make = _copy_table_mutants if isinstance(x.dims, P.CopyTable) else _exchange_mutants
            for op, desc, y in make(x, prog.shapes[t], mesh):
                add(op, f"{t}: {desc}", ins[:t] + [y] + ins[t + 1:])
        if isinstance(x, (P.EmbedChunk, P.AllGather)):
            other = P.AllGather if isinstance(x, P.EmbedChunk) else P.EmbedChunk
            add("embed_gather", f"{t}: {type(x).__name__} -> {other.__name__}",
                ins[:t] + [other(x.dim, x.axes)] + ins[t + 1:])
        if isinstance(x, P.ReduceScatter):
            add("reduce_kind", f"{t}: reduce_scatter -> all_reduce",
                ins[:t] + [P.AllReduce(x.axes, x.reduction)] + ins[t + 1:])
        if isinstance(x, P.AllReduce) and rank:
            add("reduce_kind", f"{t}: all_reduce -> reduce_scatter + all_gather",
                ins[:t] + [P.ReduceScatter(0, x.axes, x.reduction), P.AllGather(0, x.axes[::-1])] + ins[t + 1:])
        if isinstance(x, (P.ReduceScatter, P.AllReduce)) and math.prod(prog.shapes[t]):  # no elements: equivalent
            for kind in _other_reductions(x.reduction, prog.dtype, mesh.group_size(x.axes)):
                add("wrong_reduction", f"{t}: {x.reduction} -> {kind}",
                    ins[:t] + [dataclasses.replace(x, reduction=kind)] + ins[t + 1:])
    for op, lst in found.items():
        rng.shuffle(lst)
        yield from lst[:max_per_op]


def stage_mutants(stages: tuple, rng: random.Random, max_per_op: int = 3):
    """Yield (operator, description, stages, ill-formed) for mutants of a plan's stages across meshes: each
    program's (:func:`mutants`, as :func:`reshaped`; one whose result changes shape no longer fits the transfer
    after it, so it is ill-formed too) and each transfer's (:func:`_transfer_mutants`); at most ``max_per_op``
    of each operator."""
    found: dict[str, list] = {}
    for i, stage in enumerate(stages):
        if isinstance(stage, P.Transfer):
            made = [(op, desc, y, not _well_formed_transfer(y)) for op, desc, y in _transfer_mutants(stage)]
        else:
            made = [(op, desc, *reshaped(stage, new)) for op, desc, new in mutants(stage, rng, max_per_op)]
            made = [(op, desc, y, ill or y.shapes[-1] != stage.shapes[-1]) for op, desc, y, ill in made]
        for op, desc, y, ill in made:
            found.setdefault(op, []).append((op, f"stage {i}: {desc}", stages[:i] + (y,) + stages[i + 1:], ill))
    for lst in found.values():
        rng.shuffle(lst)
        yield from lst[:max_per_op]


def reshaped(prog: P.Program, instructions) -> tuple[P.Program, bool]:
    """``prog`` with ``instructions`` and their shapes (:func:`derive_shapes`), and whether it is ill-formed: then
    it keeps the original shapes, padded (the verifier must refute it; the backends refuse it, see the module
    docstring)."""
    shapes = derive_shapes(prog, instructions)
    if shapes is not None:
        return dataclasses.replace(prog, instructions=instructions, shapes=shapes), False
    shapes = (tuple(prog.shapes) + (prog.shapes[-1],) * len(instructions))[: len(instructions) + 1]
    return dataclasses.replace(prog, instructions=instructions, shapes=shapes), True


def claim_mutants(dst, rng: random.Random, max_per_op: int = 3):
    """Yield (operator, description, claim) for the claim-side operators of the module docstring: types
    that differ from ``dst`` in its dtype, its mesh's axis order, its mesh's axis sizes, its shape, its
    mesh's device order or its reduction kind."""
    from redist.errors import ShardingError
    from redist.mesh import Mesh, prime_factors
    from redist.types import DTYPES, ShardingType

    def on(mesh, shape=dst.shape, dtype=dst.dtype, reduction=dst.reduction):
        try:
            return ShardingType(mesh, shape, dtype, dst.dims, dst.partial, reduction)
        except ShardingError:  # a sub-axis that does not fit the new mesh: not a claim anyone can make
            return None

    axes, sizes, ids = list(dst.mesh.axes), list(dst.mesh.shape), dst.mesh.device_ids
    found = {
        "claim_dtype": [(f"dtype {dst.dtype} -> {d}", on(dst.mesh, dtype=d)) for d in DTYPES if d != dst.dtype],
        "claim_mesh_order": [(f"mesh {dst.mesh} -> {Mesh(order, ids)}", on(Mesh(order, ids)))
                             for order in itertools.permutations(axes) if list(order) != axes],
        "claim_axis_sizes": [],
        "claim_device_order": [(f"device_ids {list(dst.mesh.device_ids)} -> {list(m.device_ids)}", on(m))
                               for m in _other_device_orders(dst.mesh, rng)],
        "claim_reduction": [(f"partial({dst.reduction}) -> partial({k})", on(dst.mesh, reduction=k))
                            for k in (_other_reductions(dst.reduction, dst.np_dtype, dst.mesh.group_size(dst.partial))
                                      if dst.partial else ())],
        "claim_shape": [(f"dim {i} of {n} -> {n + 1}", on(dst.mesh, shape=dst.shape[:i] + (n + 1,) + dst.shape[i + 1:]))
                        for i, n in enumerate(dst.shape)],
    }
    resized = {tuple(p) for p in itertools.permutations(sizes)}
    for i, j in itertools.permutations(range(len(sizes)), 2):
        for p in set(prime_factors(sizes[i])):
            new = list(sizes)
            new[i], new[j] = new[i] // p, new[j] * p
            resized.add(tuple(new))
    for new in sorted(resized - {tuple(sizes)}):
        mesh = Mesh(tuple((name, n) for (name, _), n in zip(axes, new)), ids)
        found["claim_axis_sizes"].append((f"mesh {dst.mesh} -> {mesh}", on(mesh)))
    for op, lst in found.items():
        lst = [(desc, claim) for desc, claim in lst if claim is not None]
        rng.shuffle(lst)
        for desc, claim in lst[:max_per_op]:
            yield op, desc, claim


def _other_reductions(kind: str, dtype, group: int) -> list[str]:
    """The reduction kinds other than ``kind`` that ``dtype`` has, as mutants that change the result: none for
    ``bool`` (sum and maximum are both "or") or for a group of one device (every kind is the identity)."""
    from redist.types import REDUCTIONS

    dtype = np.dtype(dtype)
    if dtype == np.bool_ or group < 2:
        return []
    return [k for k in REDUCTIONS if k != kind and not (dtype.kind == "c" and k in ("max", "min"))]


def _other_device_orders(mesh, rng: random.Random) -> list:
    """``mesh``'s axes with its device ids reversed, rotated by one position and randomly permuted (those that
    differ from ``mesh``; none for one device)."""
    ids = list(mesh.device_ids)
    shuffled = list(ids)
    rng.shuffle(shuffled)
    out = []
    for order in (ids[::-1], ids[1:] + ids[:1], shuffled):
        m = mesh.reordered(order)
        if m != mesh and m not in out:
            out.append(m)
    return out


# Pairs whose plans use every instruction kind, the two-move all-to-all (local reshapes and transposes
# around one AllToAll) and sub-axes among them; mutated before the random plans.
FIXED_PAIRS = [
    ("x=2,y=4", "f32[8{y}, 4{x}, 8, 4]", "f32[8, 4, 8{x}, 4{y}]"),
    ("x=2,y=2,z=2", "f32[4{x}, 4{z}, 4, 4{y}]", "f32[4, 4{y}, 4{x}, 4{z}]"),
    ("x=2,y=4", "f32[4{x}]", "f32[4{y}]"),
    ("x=4,y=2", "f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]"),
]

# Uneven pairs: plans of collectives on the padded view (with and without a reduction), and plans with an
# exchange (sub-axes' worth of copies, a kept partial axis, a reduced one).
FIXED_UNEVEN_PAIRS = [
    ("x=2,y=2", "f32[7{x}, 3{y}]", "f32[7{y}, 3{x}]"),
    ("x=2,y=4", "f32[7{x}] partial{y}", "f32[7{y}]"),
    ("x=2,y=2", "f32[7{x,y}, 4]", "f32[7{x}, 4{y}]"),
    ("x=2,y=4", "f32[7{x}, 5{y}]", "f32[7{y}, 5{x}]"),
    ("x=3,y=2", "f32[5{x,y}, 3]", "f32[5, 3{y}]"),
    ("x=2,y=2", "f32[5{x}, 3] partial{y}", "f32[5, 3{x}] partial{y}"),
    ("x=2,y=3", "f32[5{x}, 4] partial{y}", "f32[5{x}, 4{y}]"),
]
# The two kinds of uneven plan (words of :func:`proofs.exhaustive.plan_shape`) that the run must mutate.
UNEVEN_KINDS = ("padded collectives", "exchange")
# The dtypes of the random plans: mostly f32, complex, bool and an integer type among them.
DRAWN_DTYPES = ("f32", "f32", "f32", "c64", "c128", "bool", "i32")

# Pairs whose destinations create pending sums (docs/spec.md §3): from replicated and from sharded dims, onto a
# sub-axis, next to a kept and a reduced sum, and uneven; and a reduce-scatter with uneven counts. Mutated
# before the random creating plans (``n_creating`` of them, drawn apart from the other random plans).
FIXED_CREATING_PAIRS = [
    ("x=2,y=2", "f32[4, 6]", "f32[4, 6] partial{x}"),
    ("x=2,y=4", "f32[8{y}, 4] partial{x}", "f32[8, 4] partial{x,y}"),
    ("x=2,y=4", "f32[8, 4]", "f32[8, 4] partial{y:(1)2}"),
    ("x=2,y=2", "f32[8] partial{x}", "f32[8] partial{y}"),
    ("x=2,y=2", "f32[4{x}, 4]", "f32[4, 4{y}] partial{x}"),
    ("x=4", "i32[5{x}, 2]", "i32[5, 2] partial{x}"),
    ("x=4", "f32[13, 3] partial{x}", "f32[13{x}, 3]"),
]
# The creating instructions that the run must mutate.
CREATING_KINDS = ("KeepRoot", "EmbedChunk")

# Pairs across meshes (docs/spec.md §3): a pipeline stage's hand-off, replicas that share the sending, a resize
# to fewer devices, the same devices as another mesh, a partial source reduced before the transfer, sums created
# within it and summands handed over, an uneven dim and a transfer that keeps what a shared device holds.
# Mutated before the random plans across meshes (``n_cross`` of them).
FIXED_CROSS_MESH_PAIRS = [
    ("data=2,model=2", "f32[8{data}, 16{model}]", "model=4,device_ids=[4,5,6,7]", "f32[8, 16{model}]"),
    ("x=2", "f32[8, 4]", "y=4,device_ids=[2,3,4,5]", "f32[8, 4]"),
    ("dp=8", "f32[48{dp}, 4]", "dp=6", "f32[48{dp}, 4]"),
    ("x=8", "f32[16{x}, 8]", "a=2,b=4", "f32[16{b}, 8{a}]"),
    ("x=4", "f32[64] partial{x}", "x=4,device_ids=[4,5,6,7]", "f32[64{x}]"),
    ("x=2", "f32[8{x}]", "y=2,device_ids=[2,3]", "f32[8] partial{y}"),
    ("x=2", "f32[8] partial{x}", "y=2,device_ids=[1,2]", "f32[8] partial{y}"),
    ("x=2,y=2", "f32[7{x}, 5{y}]", "z=3,device_ids=[3,4,5]", "f32[7, 5{z}]"),
    ("x=4", "f32[16{x}]", "y=2,device_ids=[0,9]", "f32[16{y}]"),
]


def run(n_plans: int = 300, seed: int = 0, max_per_op: int = 3, uneven: float = 0.3, n_creating: int = 40,
        n_cross: int = 40) -> dict:
    """Mutate the fixed pairs' plans, then random plans (a share ``uneven`` of them uneven) up to ``n_plans``
    plans, then ``n_creating`` random plans whose destination creates pending sums, then the fixed pairs
    across meshes and ``n_cross`` random ones (every relation of two meshes of up to 8 devices, partial sources
    of every kind, created sums, uneven dims). ``uneven_plans`` counts the uneven plans mutated by
    :func:`proofs.exhaustive.plan_shape`, ``creating_instructions`` the creating instructions in mutated
    programs, ``cross_mesh_plans`` the plans across meshes; ``ok`` also needs each of :data:`UNEVEN_KINDS` and
    :data:`CREATING_KINDS` in some of them."""
    from proofs.common import progress
    from redist import Mesh, ShardingType
    from redist.testing import SeededDraw, draw_cross_mesh_pair, draw_mesh, draw_mesh_pair, draw_pair
    from redist.types import REDUCTIONS

    rng = random.Random(seed)
    draw = SeededDraw(rng)
    t0 = time.perf_counter()
    stats = {"plans": 0, "mutants": 0, "ill_formed": 0, "killed_by_verify": 0, "survivors": 0,
             "equivalent_survivors": 0, "unsound": [], "false_alarms": [], "undecided": [], "no_counterexample": [],
             "by_op": {}, "uneven_plans": {}, "creating_instructions": {}, "cross_mesh_plans": 0}
    from proofs.step_rules import creating_pairs

    fixed = FIXED_PAIRS + FIXED_UNEVEN_PAIRS
    total = max(n_plans, len(fixed)) + len(FIXED_CREATING_PAIRS) + n_creating + len(FIXED_CROSS_MESH_PAIRS) + n_cross
    with progress(desc="mutation", total=total, unit="plan") as bar:
        for mesh_text, a, b in fixed:
            mesh = Mesh.parse(mesh_text)
            src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
            _mutate(synthesize(src, dst), src, dst, rng, max_per_op, stats)
            bar.update()
        while stats["plans"] < n_plans:
            mesh = draw_mesh(draw, max_axes=3, max_devices=8, min_devices=2, device_order=0.2)
            src, dst = draw_pair(draw, mesh, partial=0.4, sub_axes=0.25, uneven=uneven, dtype=DRAWN_DTYPES,
                                 reductions=REDUCTIONS, reorder=0.2)
            plan = synthesize(src, dst)
            if plan.steps:
                _mutate(plan, src, dst, rng, max_per_op, stats)
                bar.update()
        creating = [(ShardingType.parse(a, Mesh.parse(m)), ShardingType.parse(b, Mesh.parse(m)))
                    for m, a, b in FIXED_CREATING_PAIRS]
        for src, dst in creating + list(creating_pairs(n_creating, seed, max_devices=8)):
            _mutate(synthesize(src, dst), src, dst, rng, max_per_op, stats)
            bar.update()
        cross = [(ShardingType.parse(a, Mesh.parse(m)), ShardingType.parse(b, Mesh.parse(n)))
                 for m, a, n, b in FIXED_CROSS_MESH_PAIRS]
        cross += [draw_cross_mesh_pair(draw, draw_mesh_pair(draw, max_devices=8), partial=0.4, dst_partial=0.3,
                                       uneven=uneven, reductions=REDUCTIONS) for _ in range(n_cross)]
        for src, dst in cross:
            _mutate(synthesize(src, dst), src, dst, rng, max_per_op, stats)
            bar.update()
    non_equiv = stats["mutants"] - stats["equivalent_survivors"]
    stats["non_equivalent"] = non_equiv
    stats["kill_rate"] = stats["killed_by_verify"] / non_equiv if non_equiv else 1.0
    stats["seconds"] = time.perf_counter() - t0
    stats["missing_uneven_kinds"] = [k for k in UNEVEN_KINDS if not any(k in shape for shape in stats["uneven_plans"])]
    stats["missing_creating_kinds"] = [k for k in CREATING_KINDS if k not in stats["creating_instructions"]]
    stats["ok"] = not (stats["unsound"] or stats["false_alarms"] or stats["undecided"] or stats["no_counterexample"]
                       or stats["missing_uneven_kinds"] or stats["missing_creating_kinds"])
    return stats


def _mutate(plan, src, dst, rng, max_per_op, stats) -> None:
    """Mutate one plan's program (across meshes: its stages), then its claim; count every mutant into
    ``stats``."""
    from proofs.exhaustive import plan_shape

    stats["plans"] += 1
    if not (src.is_even() and dst.is_even()):
        shape = plan_shape(plan)
        stats["uneven_plans"][shape] = stats["uneven_plans"].get(shape, 0) + 1
    programs = [s for s in plan.stages if isinstance(s, P.Program)]
    for ins in (ins for prog in programs for ins in prog.instructions):
        if isinstance(ins, (P.KeepRoot, P.EmbedChunk)):
            kind = type(ins).__name__
            stats["creating_instructions"][kind] = stats["creating_instructions"].get(kind, 0) + 1
    if plan.crosses_meshes:
        stats["cross_mesh_plans"] += 1
        target = plan.stages
        for op, desc, new, ill_formed in stage_mutants(target, rng, max_per_op):
            _judge(op, desc, new, src, dst, stats, ill_formed=ill_formed)
    else:
        target = plan.program
        for op, desc, new in mutants(target, rng, max_per_op):
            # Ill-formed (a split that does not divide, a dim that does not exist): the verifier must refute
            # it. The backend raises on it or gives a wrong result (see the module docstring); if it gave the
            # right one, that is a false alarm in _judge.
            mutant, ill_formed = reshaped(target, new)
            _judge(op, desc, mutant, src, dst, stats, ill_formed=ill_formed)
    for op, desc, claim in claim_mutants(dst, rng, max_per_op):
        _judge(op, f"claim {claim}: {desc}", target, src, claim, stats, claim_side=True)


def _judge(op, desc, prog, src, dst, stats, ill_formed: bool = False, claim_side: bool = False) -> None:
    """Verify one mutant, ask the numpy oracle, and count the outcome into ``stats``."""
    from proofs.common import oracle

    row = stats["by_op"].setdefault(op, {"mutants": 0, "killed": 0, "equivalent": 0, "ill_formed": 0})
    row["mutants"] += 1
    stats["mutants"] += 1
    if ill_formed:
        stats["ill_formed"] += 1
        row["ill_formed"] += 1
    v = verify_program(prog, src, dst)
    ok, why = oracle(prog, src, dst, seed=stats["mutants"])
    if v.status == "undecided":
        stats["undecided"].append(f"{src} -> {dst}: {desc}: {v.reason}")
    elif v.status == "proved":
        stats["survivors"] += 1
        if ok:
            stats["equivalent_survivors"] += 1
            row["equivalent"] += 1
        else:
            stats["unsound"].append(f"{src} -> {dst}: {desc}: verify proved it, numpy: {why}")
    else:
        stats["killed_by_verify"] += 1
        row["killed"] += 1
        if claim_side and v.counterexample is None:
            stats["no_counterexample"].append(f"{src} -> {dst}: {desc}: refuted without one: {v.reason}")
        if ok:
            # Killed but the backend finds no difference on random data: recheck with many more trials. A
            # pending max or min shows a dropped summand only where that member holds the extreme, one member
            # in k at each element: on a buffer of one element, a few trials can miss it.
            ok2, _ = oracle(prog, src, dst, seed=stats["mutants"] + 10**6, trials=64)
            if ok2:
                stats["false_alarms"].append(f"{src} -> {dst}: {desc}: verify: {v.reason}")


if __name__ == "__main__":
    s = run(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
    for k, v in s.items():
        if k not in ("unsound", "false_alarms", "undecided", "no_counterexample", "by_op", "uneven_plans",
                     "creating_instructions"):
            print(f"{k}: {v}")
    for op, row in s["by_op"].items():
        print(f"  {op:<18} {row}")
    print("uneven plans:", s["uneven_plans"])
    print("creating instructions mutated:", s["creating_instructions"])
    for line in s["unsound"] + s["false_alarms"] + s["undecided"] + s["no_counterexample"]:
        print(line)
    sys.exit(0 if s["ok"] else 1)
