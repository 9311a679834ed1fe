"""Well-formedness: what the verifier checks of a plan's instructions and the two types before any query.

Every field of every instruction (a transfer between meshes too) must be of the right kind and fit the buffer
it reads (:func:`derive_shapes`, which re-derives the buffer shapes from the instructions alone); the meshes,
dtypes and shapes of the programs, the transfers between them and the types must agree (:func:`check_fields`),
and so must the reduction kinds (:func:`check_reductions`).
What fails is refuted (:class:`~redist.verify.verdict.Refuted`), naming the instruction or field; a field that
is the same on every device has a counterexample of its own (:func:`field_cx`). The header of
:mod:`redist.verify` lists where each field is checked.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from redist import program as P
from redist.verify.encoding import Axis, DeviceOrder, ksize, position_coords, read_axes
from redist.verify.solver import Deadline
from redist.verify.verdict import Refuted

# The reduction kinds (docs/spec.md §2), and those for which taking a summand twice changes nothing.
_KINDS = ("sum", "max", "min", "prod")
IDEMPOTENT = ("max", "min")


def derive_shapes(chain, deadline: Deadline) -> list[tuple[int, ...]]:
    """The local shape after each instruction of the chain (:class:`~redist.verify.chain.Chain`), from the
    instruction semantics alone: each program's (:func:`_program_shapes`), and each transfer's, which must read
    the last buffer of the program before it, write the first of the program after it and fit both
    (:func:`_check_copies`)."""
    shapes: list[tuple[int, ...]] = []
    for k, program in enumerate(chain.programs):
        first = chain.first_instruction(k)
        if k:
            _check_transfer(first - 1, chain.instructions[first - 1], shapes[-1], program, deadline)
        shapes += _program_shapes(program, first, deadline)
    return shapes


def _check_transfer(t: int, ins, shape_in: tuple, after, deadline: Deadline) -> None:
    """Transfer ``t`` reads buffers of ``shape_in`` and writes the first buffers of program ``after``: its fields
    of the right kinds, its shapes those, and its copies from devices of its ``src_mesh`` to devices of its
    ``mesh`` (:func:`_check_copies`)."""
    where = f"instruction {t} ({_brief(ins)})"
    bad = _malformed_transfer(ins, len(shape_in), deadline, f"checking {where}")
    if bad:
        raise Refuted(f"{where}: {bad}")
    if tuple(ins.src_shape) != shape_in:
        raise Refuted(f"{where}: it reads buffers of shape {tuple(ins.src_shape)}, but the program before it leaves "
                      f"buffers of shape {shape_in}")
    if tuple(after.shapes[0]) != tuple(ins.shape):
        raise Refuted(f"{where}: it makes buffers of shape {tuple(ins.shape)}, but the program after it starts from "
                      f"buffers of shape {tuple(after.shapes[0])}")
    _check_copies(ins.copies.copies, shape_in, tuple(ins.shape), DeviceOrder(ins.src_mesh), DeviceOrder(ins.mesh),
                  where, deadline)


def _program_shapes(program, first: int, deadline: Deadline) -> list[tuple[int, ...]]:
    """The local shape after each instruction of ``program`` (whose first instruction is number ``first`` of
    the chain). Refutes an instruction with a field of the wrong kind, a dim the buffer lacks, axes that are not
    the mesh's or overlap, a split that does not divide, a permute that is not a permutation of the mesh's
    devices, or an exchange whose copies do not fit; and shapes other than those the program lists."""
    mesh_sizes = dict(program.mesh.axes)
    order = DeviceOrder(program.mesh)
    shapes = [tuple(program.shapes[0])]
    for t, ins in enumerate(program.instructions, first):
        x = list(shapes[-1])
        where = f"instruction {t} ({_brief(ins)})"
        deadline.check(f"checking {where}")
        bad = _malformed(ins, len(x), deadline, f"checking {where}")
        if bad:
            raise Refuted(f"{where}: {bad}")

        def dim_ok(d):
            if not 0 <= d < len(x):
                raise Refuted(f"{where}: the buffer has no dim {d!r}")

        if isinstance(ins, P.CollectivePermute):
            if isinstance(ins.sources, P.CoordinateMap):
                _check_map(ins.sources, mesh_sizes, where)
            elif not _is_permutation(ins.sources, order):
                raise Refuted(f"{where}: sources are not a permutation of the {order.size} devices")
        elif isinstance(ins, P.Exchange) and isinstance(ins.dims, P.CopyTable):
            _check_copies(ins.dims.copies, tuple(x), tuple(ins.shape), order, order, where, deadline)
            x = list(ins.shape)
        elif isinstance(ins, P.Exchange):
            _check_exchange(ins, tuple(x), mesh_sizes, where, deadline)
            x = list(ins.shape)
        elif isinstance(ins, P.Reshape):
            if math.prod(ins.shape) != math.prod(x) or any(n < 0 for n in ins.shape):
                raise Refuted(f"{where}: cannot view a buffer of shape {tuple(x)} as {tuple(ins.shape)}")
            x = list(ins.shape)
        elif isinstance(ins, P.Transpose):
            if sorted(ins.perm) != list(range(len(x))):
                raise Refuted(f"{where}: {tuple(ins.perm)} is not a permutation of the {len(x)} dims")
            x = [x[p] for p in ins.perm]
        else:
            k = ksize(read_axes(mesh_sizes, ins.axes, where))
            if isinstance(ins, P.Slice):
                dim_ok(ins.dim)
                if x[ins.dim] % k:
                    raise Refuted(f"{where}: local dim {ins.dim} of size {x[ins.dim]} does not split in {k}")
                x[ins.dim] //= k
            elif isinstance(ins, P.ReduceScatter):
                dim_ok(ins.dim)
                x[ins.dim] = -(-x[ins.dim] // k)  # chunks by the padding rule
            elif isinstance(ins, (P.AllGather, P.EmbedChunk)):
                dim_ok(ins.dim)
                x[ins.dim] *= k
            elif isinstance(ins, P.AllToAll):
                dim_ok(0)
                if x[0] != k:
                    raise Refuted(f"{where}: the leading dim of size {x[0]} is not the group's {k} chunks")
        shapes.append(tuple(x))
    if len(program.shapes) != len(shapes) or any(tuple(a) != b for a, b in zip(program.shapes, shapes)):
        raise Refuted(f"the program's buffer shapes {list(map(tuple, program.shapes))} are not what its "
                      f"instructions produce ({shapes})")
    return shapes


def _is_permutation(sources: tuple, order: DeviceOrder) -> bool:
    """Whether a permute's table by device id (``order.id_bound`` entries) takes each device's buffer from a
    device of ``order``, a different one for each, and is its own number at every number that is no device."""
    if len(sources) != order.id_bound:
        return False
    if order.is_identity:
        return sorted(sources) == list(range(order.size))
    devices = order.devices()
    return (sorted(sources[d] for d in devices) == sorted(devices)
            and all(s == d for d, s in enumerate(sources) if not order.has(d)))


def _brief(ins) -> str:
    """An instruction, shortened for messages (a permute over 65,536 devices prints as a long table). A
    malformed instruction (its fields of the wrong kinds: refuted right after) may not print: its repr then."""
    try:
        text = str(ins)
    except Exception:  # noqa: BLE001 - fields of any kind reach here, and only a message is at stake
        text = object.__repr__(ins)
    return text if len(text) <= 120 else text[:117] + "..."


def _is_int(x) -> bool:
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))  # int: the fast path


def _is_tokens(x) -> bool:
    """A tuple of axis tokens (strings; :func:`~redist.verify.encoding.read_axes` reads them)."""
    return isinstance(x, tuple) and all(isinstance(a, str) for a in x)


def is_ints(x, n: int | None = None) -> bool:
    """A tuple of ``n`` integers (any number, if None)."""
    return isinstance(x, tuple) and (n is None or len(x) == n) and all(_is_int(v) for v in x)


def _malformed(ins, rank: int, deadline: Deadline, doing: str) -> str | None:
    """What is wrong with the kinds of an instruction's fields (None: nothing), before any is used; ``rank``
    is the rank of the buffer it reads."""
    if isinstance(ins, P.CollectivePermute):
        if isinstance(ins.sources, P.CoordinateMap):
            groups = ins.sources.groups
            ok = isinstance(groups, tuple) and all(
                isinstance(g, tuple) and len(g) == 2 and all(_is_tokens(side) for side in g) for g in groups)
            return None if ok else f"groups {groups!r:.80} are not pairs of axis lists"
        return None if is_ints(ins.sources) else f"sources {ins.sources!r:.80} are not device ids"
    if isinstance(ins, (P.Reshape, P.Exchange)) and not is_ints(ins.shape):
        return f"shape {ins.shape!r} is not a tuple of sizes"
    if isinstance(ins, P.Transpose) and not is_ints(ins.perm):
        return f"perm {ins.perm!r} is not a tuple of dims"
    if isinstance(ins, P.Exchange):
        if len(ins.shape) != rank:
            return f"shape {ins.shape} has another rank than the buffer it reads ({rank})"
        if isinstance(ins.dims, P.CopyTable):
            return _malformed_copies(ins.dims.copies, rank, deadline, doing)
        if not isinstance(ins.dims, tuple) or len(ins.dims) != rank:
            return f"it has no table for each of the {rank} dims"
        for i, x in enumerate(ins.dims):
            if not (_is_tokens(getattr(x, "source_axes", None)) and _is_tokens(getattr(x, "axes", None))
                    and isinstance(getattr(x, "segments", None), tuple)
                    and all(is_ints(tuple(seg) if isinstance(seg, tuple) else seg, 5)
                            for seg in deadline.each(x.segments, doing))):
                return f"the table of dim {i} ({x!r:.80}) is not axes and segments of five integers"
        return None
    if isinstance(ins, (P.Slice, P.AllGather, P.ReduceScatter, P.EmbedChunk)) and not _is_int(ins.dim):
        return f"dim {ins.dim!r} is not a dim"
    if isinstance(ins, (P.ReduceScatter, P.AllReduce)) and ins.reduction not in _KINDS:
        return f"reduction {ins.reduction!r} is none of {', '.join(_KINDS)}"
    if not isinstance(ins, (P.Reshape, P.Transpose, P.Slice, P.AllGather, P.AllToAll, P.ReduceScatter, P.AllReduce,
                            P.KeepRoot, P.EmbedChunk)):
        return f"unknown instruction {type(ins).__name__}"
    return None


def _malformed_copies(table, rank: int, deadline: Deadline, doing: str) -> str | None:
    """What is wrong with the kinds of a copy table's fields (None: nothing): a tuple per device of copies,
    each a source device and three boxes' worth of integers of rank ``rank``."""
    if not isinstance(table, tuple) or not all(isinstance(cs, tuple) for cs in table):
        return "its copy table is not a tuple of copies per device"
    for d, copies in deadline.each(enumerate(table), doing):
        for c in copies:
            if not (_is_int(getattr(c, "source", None))
                    and all(is_ints(getattr(c, f, None), rank) for f in ("src_start", "dst_start", "size"))):
                return f"copy {c!r} of device {d} is not a copy between boxes of rank {rank}"
    return None


def _malformed_transfer(ins, rank: int, deadline: Deadline, doing: str) -> str | None:
    """What is wrong with the kinds of a transfer's fields (None: nothing); ``rank`` is the rank of the buffer it
    reads."""
    if not (is_ints(ins.src_shape, rank) and is_ints(ins.shape, rank)):
        return f"shapes {ins.src_shape!r} -> {ins.shape!r} are not tuples of {rank} sizes"
    if not isinstance(ins.copies, P.CopyTable):
        return f"its copies {ins.copies!r:.80} are not a CopyTable"
    return _malformed_copies(ins.copies.copies, rank, deadline, doing)


def _check_map(cmap, mesh_sizes, where: str) -> None:
    """A coordinate map must be a permutation: each group's two sides of equal size; on each side no factor of
    a mesh axis named twice; the cut points of every mesh axis a chain of factors (so that every (sub-)axis
    coordinate is a digit of it); and the two sides covering the same factors of each mesh axis (the digits a
    source takes are those the map reads)."""
    sides: list[list[Axis]] = [[], []]
    for source_tokens, tokens in cmap.groups:
        s, a = read_axes(mesh_sizes, source_tokens, where), read_axes(mesh_sizes, tokens, where)
        if ksize(s) != ksize(a):
            raise Refuted(f"{where}: group {source_tokens} <- {tokens} reads {ksize(a)} coordinates into "
                          f"{ksize(s)}")
        sides[0] += s
        sides[1] += a
    for side in sides:
        read_axes(mesh_sizes, tuple(ax.token for ax in side), f"{where}: one side of its groups")
    _check_chain(sides[0] + sides[1], where)
    for name in mesh_sizes:
        covered = [_merged(sorted((ax.lo, ax.hi) for ax in side if ax.name == name and ax.hi > ax.lo))
                   for side in sides]
        if covered[0] != covered[1]:
            raise Refuted(f"{where}: its groups set other factors of mesh axis {name!r} than they read: it is no "
                          "permutation")


def _merged(ranges) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _check_chain(axes, where: str) -> None:
    """The factor boundaries that ``axes`` use on each mesh axis must each divide the next."""
    by_name: dict[str, set[int]] = {}
    for ax in axes:
        by_name.setdefault(ax.name, {1, ax.full}).update((ax.lo, ax.hi))
    for name, cuts in by_name.items():
        pts = sorted(cuts)
        if any(b % a for a, b in zip(pts, pts[1:])):
            raise Refuted(f"{where}: its axes cut mesh axis {name!r} at {pts}, which are not factors of one "
                          "decomposition")


def _check_copies(table, shape_in: tuple, shape_out: tuple, senders: DeviceOrder, receivers: DeviceOrder,
                  where: str, deadline: Deadline) -> None:
    """A copy table (an exchange between two device orders, from and to the devices of its mesh; a transfer, from
    the devices of one mesh to those of another) must have a row per device id up to ``receivers``' id bound,
    copies only at its devices, each from a device of ``senders`` and fitting both buffers, and no two copies
    of a device overlapping."""
    doing = f"checking the copies of {where}"
    stray = next((d for d, copies in deadline.each(enumerate(table), doing) if copies and not receivers.has(d)), None)
    if stray is not None:
        raise Refuted(f"{where}: device {stray} is no device of the mesh it writes, but receives copies")
    if len(table) != receivers.id_bound:
        raise Refuted(f"{where}: copies for {len(table)} device ids, the mesh it writes has ids up to "
                      f"{receivers.id_bound - 1}")
    for d, copies in enumerate(table):
        deadline.check(doing)
        for c in copies:
            if not senders.has(c.source):
                raise Refuted(f"{where}: device {d} copies from device {c.source}, which is no device of the mesh "
                              "it reads")
            for lo_in, lo_out, n, cap_in, cap_out in zip(c.src_start, c.dst_start, c.size, shape_in, shape_out):
                if n < 0 or lo_in < 0 or lo_out < 0 or lo_in + n > cap_in or lo_out + n > cap_out:
                    raise Refuted(f"{where}: copy {c} of device {d} does not fit buffers {shape_in} -> {shape_out}")
        for a in range(len(copies)):
            for b in range(a):
                if all(x.dst_start[i] < y.dst_start[i] + y.size[i] and y.dst_start[i] < x.dst_start[i] + x.size[i]
                       for x, y in [(copies[a], copies[b])] for i in range(len(shape_out))):
                    raise Refuted(f"{where}: copies {copies[b]} and {copies[a]} of device {d} overlap")


def _check_exchange(ins, shape_in, mesh_sizes, where: str, deadline: Deadline) -> None:
    """An exchange's tables: one per dim; the source axes of all dims not overlapping and factors of one
    decomposition (a copy has one source); every segment naming blocks that exist and inside both buffers; the
    segments of one block of a dim not overlapping (so that no two copies of a device do)."""
    if len(ins.dims) != len(shape_in):
        raise Refuted(f"{where}: tables for {len(ins.dims)} dims, the buffer has {len(shape_in)}")
    source_axes = read_axes(mesh_sizes, tuple(a for x in ins.dims for a in x.source_axes), f"{where}: source axes")
    _check_chain(source_axes, where)
    for i, (x, cap_in, cap_out) in enumerate(zip(ins.dims, shape_in, ins.shape)):
        deadline.check(f"checking the segments of {where}")
        k_out = ksize(read_axes(mesh_sizes, x.axes, where))
        k_in = ksize(read_axes(mesh_sizes, x.source_axes, where))
        spans: dict[int, list[tuple[int, int]]] = {}
        for seg in deadline.each(x.segments, f"checking the segments of {where}"):
            block, source_block, src_start, dst_start, size = seg
            if not (0 <= block < k_out and 0 <= source_block < k_in and size >= 0 and src_start >= 0
                    and dst_start >= 0 and src_start + size <= cap_in and dst_start + size <= cap_out):
                raise Refuted(f"{where}: segment {tuple(seg)} of dim {i} does not fit buffers {shape_in} -> "
                              f"{ins.shape} with {k_in} -> {k_out} blocks")
            if size:
                spans.setdefault(block, []).append((dst_start, dst_start + size))
        for block, ss in spans.items():
            ss.sort()
            for a, b in zip(ss, ss[1:]):
                if b[0] < a[1]:
                    raise Refuted(f"{where}: segments {a} and {b} of block {block} of dim {i} overlap")


# ----------------------------------------------------------------------------- fields no query reads
def check_fields(chain, src, dst, deadline: Deadline) -> None:
    """Meshes, dtypes and shapes must agree exactly (the audit in the header of :mod:`redist.verify`): each
    program's ``src_mesh`` and ``dst_mesh`` are its ``mesh``'s axes on its devices (in any order); each transfer
    reads on the ``dst_mesh`` of the program before it and writes on the ``src_mesh`` of the one after it; the
    source type's mesh is the first program's ``src_mesh`` and the claim's the last one's ``dst_mesh``; every
    program's dtype is the source type's, and the claim's dtype and shape are the source's."""
    named = len(chain.programs) > 1
    for k, program in enumerate(chain.programs):
        what = f"program {k} of the plan" if named else "the program"
        for which in ("src_mesh", "dst_mesh"):
            other = getattr(program, which)
            if tuple(other.axes) != tuple(program.mesh.axes) or not DeviceOrder(other).same_devices(
                    DeviceOrder(program.mesh)):
                raise Refuted(f"{what}'s {which} {other!r} is not the mesh {program.mesh!r} its collectives run on "
                              "in some device order", _mesh_difference(program.mesh, other, deadline))
        dtype = np.dtype(program.dtype)
        if dtype != src.np_dtype:
            raise Refuted(f"{what} computes on {dtype.name} buffers, but the source type {src} is {src.dtype}",
                          field_cx(program.mesh, "dtype", dtype.name, src.dtype))
    for t, transfer in chain.transfers():
        for have, want, role in ((transfer.src_mesh, chain.program_at(t).dst_mesh, "reads its buffers on"),
                                 (transfer.mesh, chain.program_at(t + 1).src_mesh, "leaves its buffers on")):
            cx = _mesh_difference(have, want, deadline)
            if cx is not None:
                raise Refuted(f"instruction {t} (a transfer) {role} mesh {have!r}, but the program "
                              f"{'before' if have is transfer.src_mesh else 'after'} it has them on {want!r}", cx)
    for what, t, have, role in (("source type", src, chain.src_mesh, "the plan reads its input on"),
                                ("claim", dst, chain.dst_mesh, "the plan leaves its result on")):
        cx = _mesh_difference(have, t.mesh, deadline)
        if cx is not None:
            raise Refuted(f"the {what} {t} is on mesh {t.mesh!r}, but {role} mesh {have!r}: device "
                          f"{cx['device']} is at {cx['holds']['coords']} on the plan's mesh and at "
                          f"{cx['expected']['coords']} on the {what}'s", cx)
    if dst.dtype != src.dtype:
        raise Refuted(f"the claim {dst} has dtype {dst.dtype}, but the program keeps the source's {src.dtype}",
                      field_cx(chain.dst_mesh, "dtype", src.dtype, dst.dtype))
    if tuple(src.shape) != tuple(dst.shape):
        raise Refuted(f"source shape {src.shape} and claimed shape {dst.shape} differ",
                      field_cx(chain.dst_mesh, "shape", tuple(src.shape), tuple(dst.shape)))


def _mesh_difference(have, want, deadline: Deadline) -> dict | None:
    """None if ``have`` and ``want`` are the same mesh, else a counterexample: the first device id (of either)
    that is no device of the other or whose position (coordinates by axis name, through each mesh's
    ``device_ids``) differs, or ``have``'s lowest id when every position agrees (axes of size 1 in another
    order); its coordinates are None on a mesh it is not on. The whole values are compared, so every field of
    ``Mesh`` (axes, sizes, their order, device ids) is."""
    if have == want:
        return None
    sizes_have, sizes_want = dict(have.axes), dict(want.axes)
    order_have, order_want = DeviceOrder(have), DeviceOrder(want)

    def where(sizes, order, d):
        return position_coords(sizes, order.position(d)) if order.has(d) else None

    def differs(d):
        return where(sizes_have, order_have, d) != where(sizes_want, order_want, d)

    n = order_have.size
    if order_have.is_identity and order_want.is_identity and n == order_want.size:
        d = next((d for d in _carries(sizes_have, sizes_want, n) if differs(d)), 0)
    else:  # a device order is a table of the devices: read it whole
        ids = sorted({*order_have.devices(), *order_want.devices()})
        d = next((d for d in deadline.each(ids, "comparing the device orders of two meshes") if differs(d)),
                 min(order_have.devices()))
    coords = where(sizes_have, order_have, d)
    return {"device": d, "coords": coords if coords is not None else where(sizes_want, order_want, d),
            "index": None, "holds": {"mesh": repr(have), "coords": coords},
            "expected": {"mesh": repr(want), "coords": where(sizes_want, order_want, d)}}


def _carries(sizes_have: dict, sizes_want: dict, n: int) -> list[int]:
    """Position 0 and the positions below ``n`` at which a coordinate carries into the next axis on one of two
    meshes of the default order (the products of their minor axes' sizes, 1 included), in order: the
    coordinates of two row-major numberings change alike between them, so that the first position where they
    differ is one of these (a scan of every position would take minutes on 2**31 devices)."""
    out = {0, 1} if n > 1 else {0}
    for sizes in (sizes_have, sizes_want):
        w = 1
        for size in reversed(list(sizes.values())):
            w *= size
            if w < n:
                out.add(w)
    return sorted(out)


def field_cx(mesh, what: str, holds, expected) -> dict:
    """A counterexample for a field that is the same on every device of ``mesh`` and at every index: the device
    at its position 0 (device 0 in the default order)."""
    return {"device": DeviceOrder(mesh).device(0), "coords": position_coords(dict(mesh.axes), 0), "index": None,
            "holds": {what: holds}, "expected": {what: expected}}


def check_reductions(chain, src, dst) -> tuple[str | None, int | None]:
    """The reduction kinds of the chain's instructions, checked against the types (the audit in the header of
    :mod:`redist.verify`): ``(kind, cut)``.

    One stage (``cut`` None): the instructions take one kind, ``kind`` (None if nothing is reduced or
    pending), the source's where it is partial, and a partial claim is of that kind. Two stages: a source
    pending in another kind than a sum, reduced whole and then made pending sums (SPEC 3: creating writes
    zeros, the identity of a sum only) and summed again: the instructions before ``cut`` (the one after the
    last of the source's kind) take the source's kind, ``kind``, those from it on take sums, and a partial
    claim is a sum. The maximum or minimum of complex numbers is refused. A counterexample names a device of
    the instruction's mesh, or of the claim's."""
    taken = [(t, ins.reduction) for t, ins in enumerate(chain.instructions)
             if isinstance(ins, (P.ReduceScatter, P.AllReduce))]
    pending = src.reduction if src.partial else None
    cut = None
    if pending not in (None, "sum") and ("sum" in {k for _, k in taken} or dst.partial and dst.reduction == "sum"):
        cut = max((t + 1 for t, k in taken if k == pending), default=0)
        wrong = next(((t, k) for t, k in taken if t < cut and k != pending or t >= cut and k != "sum"), None)
        if wrong is not None:
            t, k = wrong
            want = pending if t < cut else "sum"
            raise Refuted(f"instruction {t} takes the {k} of its group, but the values there are a pending {want}"
                          + (f" (the source {src} is reduced by instruction {cut - 1})" if t >= cut else ""),
                          field_cx(chain.program_at(t).mesh, "reduction", k, want))
        if dst.partial and dst.reduction != "sum":
            raise Refuted(f"the claim {dst} is a pending {dst.reduction}, but the program's values are pending sums "
                          f"(the source {src} is reduced by instruction {cut - 1})",
                          field_cx(chain.dst_mesh, "reduction", "sum", dst.reduction))
        kind = pending
    else:
        kind = _one_kind(chain, taken, pending, src, dst)
    if kind in IDEMPOTENT and np.dtype(chain.dtype).kind == "c":
        raise Refuted(f"the program takes the {kind} of complex numbers, which have none",
                      field_cx(chain.dst_mesh, "reduction", kind, "sum or prod"))
    return kind, cut


def _one_kind(chain, taken, pending, src, dst) -> str | None:
    """The one kind of a chain of one stage (:func:`check_reductions`): its reductions ``taken`` (instruction,
    kind) and the source's ``pending`` kind (None if it is not partial)."""
    kinds = {k for _, k in taken}
    if len(kinds) > 1:
        t = next(t for t, k in taken if k != taken[0][1])
        raise Refuted(f"the program reduces by {' and '.join(sorted(kinds))}: one value has one reduction kind",
                      field_cx(chain.program_at(t).mesh, "reduction", sorted(kinds), sorted(kinds)[0]))
    kind = pending or (kinds.pop() if kinds else None)
    if pending is not None:
        wrong = next(((t, k) for t, k in taken if k != pending), None)
        if wrong is not None:
            raise Refuted(f"instruction {wrong[0]} takes the {wrong[1]} of its group, but the source {src} is a "
                          f"pending {pending}", field_cx(chain.program_at(wrong[0]).mesh, "reduction", wrong[1],
                                                         pending))
    if dst.partial and kind is not None and dst.reduction != kind:
        raise Refuted(f"the claim {dst} is a pending {dst.reduction}, but the program's values are a pending "
                      f"{kind}", field_cx(chain.dst_mesh, "reduction", kind, dst.reduction))
    return kind
