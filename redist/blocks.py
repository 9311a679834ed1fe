"""Device geometry: which device holds which block of an array, and the copies that move blocks between layouts.

A sharding type ``t`` (:mod:`redist.types`) splits dim ``i`` of size ``N`` into ``k`` blocks of ``L = ceil(N / k)``
elements; device ``d`` holds block ``b = block_index(t, i, d)`` (its rank over the dim's axes), that is the
elements ``[min(N, b·L), min(N, (b+1)·L))`` of the dim, at the start of its local buffer. Per device these
ranges make a *box* of global indices (:func:`local_box`), stored in the box ``data_box`` of its buffer; the
rest of the buffer is padding. Everything here is a pure function of types; the plan steps (:mod:`redist.steps`),
their lowering (:mod:`redist.program`), the cost model and the bounds read it.

Device orders. A device is named by its id, and its block is that of its position on the type's mesh
(:class:`redist.Mesh`: ``device_ids``); coordinates are those of positions (:func:`device_coords`,
:func:`device_id` translate). The two types of a permute or an exchange may lie on meshes with the same axes
and different device orders, on which a device has two unrelated positions: such a step is a table over the
devices (as a mesh in another order is one), a permute's sources (:func:`permute_sources`) or an exchange's
copies per device (:func:`exchange_copies`), each keeping what a device holds where it can. Between meshes of
other devices or axes (a transfer) the table is of the copies of every device of the new mesh from devices of
the old one (:func:`transfer_copies`). Device ids are any distinct numbers (:class:`redist.Mesh`): tables by
device id run up to the mesh's ``id_bound``, empty (or the identity) at a number that is no device.

Scale. Nothing below enumerates devices. A block index is a mixed-radix number over the digits of a device's
coordinates (:func:`rank`), so what a layout change does is stated per dim and per axis:

- :func:`max_missing_elements`: the most elements of its new box that a device lacks (what a point-to-point
  step receives, and what :func:`redist.lower_bound_bytes` counts), from each dim's interval arithmetic; only
  dims whose overlap varies and that share mesh axes are evaluated jointly, over the classes of devices that
  agree on those axes (:class:`DeviceClasses`);
- :func:`permute_groups`: for a permute (same block counts), the device whose whole buffer each device takes,
  as a map of coordinates (a few groups of axes, whatever the device count);
- :func:`exchange_segments`: for an exchange (any two layouts with the same partial axes), per dim, which
  interval of which source block lands where in which destination block (:class:`Segment`): ``O(k_in + k_out)``
  entries per dim; a device's copies (:class:`Copy`) are the product of its dims' segments, and how many of
  them come from other devices is counted from its own blocks alone (:func:`remote_copies`).

Where the classes of devices or the blocks of the dims still number about as many as the devices, listing
them is per-device work: beyond :data:`MAX_LISTED` of them (meshes of millions of devices split finely by the
layouts) a :class:`ShardingError` says so, rather than numpy arrays or tables of gigabytes being built.

Functions named ``…_on`` and :func:`rank` take device coordinates as numpy arrays (one entry per class of
devices, see :class:`DeviceClasses`) or as plain integers: the same arithmetic serves one device or many.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from redist.axes import Axis, canonical_axes, check_factorization, split_common
from redist.errors import ShardingError

if TYPE_CHECKING:  # types calls this module: a runtime import would be a cycle
    from redist.mesh import Mesh
    from redist.types import ShardingType

MAX_LISTED = 2**22
"""The most entries the accounting lists one by one: classes of devices (:class:`DeviceClasses`), blocks of an
exchange's dims (:func:`exchange_segments`), pairs of a device and a copy slot of an exchange priced round by
round (:meth:`redist.program.Exchange.round_stats`). An array of this many int64 entries takes 32 MiB, and
the accounting holds a few dozen."""


def check_listed(count: int, what: str) -> None:
    """Raise :class:`ShardingError` if ``count`` entries of ``what`` (a phrase naming them and why they are
    listed) exceed :data:`MAX_LISTED`."""
    if count > MAX_LISTED:
        raise ShardingError(f"{what} would be listed one by one: {count:,} of them, over the limit of "
                            f"{MAX_LISTED:,} (redist.blocks.MAX_LISTED); on so large a mesh this needs per-device "
                            "work that redist does not do")


# ---------------------------------------------------------------------- blocks and boxes of one device
def block_index(t: ShardingType, dim: int, device: int) -> int:
    """The block of dim ``dim`` of ``t`` that ``device`` holds: its rank in its group over ``t.dims[dim]``."""
    return t.mesh.group_index(device, t.dims[dim])


def local_box(t: ShardingType, device: int) -> tuple[slice, ...]:
    """The global index box of the elements ``device`` holds under ``t`` (padding is not an element: for an
    uneven dim the box can be shorter than the local buffer, or empty)."""
    box = []
    for i, (n, L) in enumerate(zip(t.shape, t.local_shape)):
        b = block_index(t, i, device)
        box.append(slice(min(n, b * L), min(n, (b + 1) * L)))
    return tuple(box)


def data_box(t: ShardingType, device: int) -> tuple[slice, ...]:
    """The box of ``device``'s local buffer that holds its elements (at the start; the rest is padding)."""
    return tuple(slice(0, s.stop - s.start) for s in local_box(t, device))


def box_size(box) -> int:
    """The number of indices in a box of slices (with steps of 1)."""
    return math.prod(s.stop - s.start for s in box)


# ---------------------------------------------------------------------- coordinates, one device or many
def rank(coords, axes):
    """A device's rank over ``axes`` (row-major, as :meth:`redist.Mesh.group_index`), from its coordinates on
    the mesh axes (``coords[name]``: an int, or a numpy array for many devices at once)."""
    r = 0
    for a in axes:
        r = r * a.size + (coords[a.name] // a.stride) % a.size
    return r


def with_ranks(coords: dict, replacements) -> dict:
    """``coords`` with the device's rank over each ``axes`` of ``replacements`` (``(axes, rank)`` pairs, axes
    that do not overlap) set to ``rank``, and every other coordinate kept (ints or numpy arrays)."""
    out = dict(coords)
    for axes, r in replacements:
        for a in reversed(axes):
            digit = r % a.size
            out[a.name] = out[a.name] + (digit - (out[a.name] // a.stride) % a.size) * a.stride
            r = r // a.size
    return out


def device_id(mesh: Mesh, coords: dict):
    """The id of the device at ``coords`` (the position row-major over the mesh axes, read through the mesh's
    device order; ints or numpy arrays)."""
    p = 0
    for name, size in mesh.axes:
        p = p * size + coords[name]
    if mesh.is_row_major:
        return p
    return _order(mesh)[0][p] if isinstance(p, np.ndarray) else mesh.device_ids[p]


def device_coords(mesh: Mesh, devices) -> dict:
    """The coordinates of the positions of device ids ``devices`` (an int or a numpy array of ids of devices
    of ``mesh``), by mesh axis name."""
    if not mesh.is_row_major:
        if isinstance(devices, np.ndarray):
            _, ids, positions = _order(mesh)
            devices = positions[np.searchsorted(ids, devices)]
        else:
            devices = mesh.position(devices)
    out = {}
    for name, size in reversed(mesh.axes):
        devices, out[name] = divmod(devices, size)
    return out


@lru_cache(maxsize=64)
def _order(mesh: Mesh) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The device id at each position of ``mesh``; its device ids in increasing order, and the position of
    each of them (arrays: device ids are any distinct numbers, so positions are found by search)."""
    ids = np.asarray(mesh.device_ids, np.int64)
    by_id = np.argsort(ids, kind="stable")
    return ids, ids[by_id], by_id


class DeviceClasses:
    """The devices of ``mesh`` up to their coordinates outside ``axes``: devices that agree on every one of
    ``axes`` form one class, and any function of their coordinates on ``axes`` alone is the same on all of them.

    Each mesh axis is cut at the boundaries that ``axes`` use on it (as :func:`redist.axes.split_common`
    does); the classes are the combinations of the digits of the pieces that lie inside one of ``axes``:
    ``size`` of them, the product of those pieces' sizes (at most the device count, and 1 for no axes).
    ``coords[name]`` (a numpy array, one entry per class) is the coordinate on mesh axis ``name`` of the
    class's *representative*, its member whose other digits are 0. A mesh axis whose boundaries are no chain
    of factors (sub-axes of two decompositions) is taken whole. Raises :class:`ShardingError` for an axis that
    is not of ``mesh``, or if there are more than :data:`MAX_LISTED` classes.
    """

    def __init__(self, mesh: Mesh, axes):
        axes = mesh.axes_of(tuple(axes))
        used: dict[str, list[Axis]] = {}
        for a in axes:
            used.setdefault(a.name, []).append(a)
        self.mesh = mesh
        self.pieces: list[tuple[str, int, int]] = []  # (mesh axis, lo, hi): a factor range of it
        for name, size in mesh.axes:
            if size == 1 or name not in used:
                continue
            pts = sorted({1, size} | {p for a in used[name] for p in (a.pre, a.stop)})
            if any(hi % lo for lo, hi in zip(pts, pts[1:])):
                self.pieces.append((name, 1, size))
                continue
            self.pieces += [(name, lo, hi) for lo, hi in zip(pts, pts[1:])
                            if any(a.pre <= lo and hi <= a.stop for a in used[name])]
        sizes = [hi // lo for _, lo, hi in self.pieces]
        self.size = math.prod(sizes)
        check_listed(self.size, f"the classes of devices that agree on {{{','.join(dict.fromkeys(axes))}}}")
        digits = np.indices(sizes, dtype=np.int64).reshape(len(sizes), self.size)
        self.coords = {name: np.zeros(self.size, np.int64) for name in mesh.names}
        for (name, _, hi), digit in zip(self.pieces, digits):
            self.coords[name] += digit * (mesh.axis_size(name) // hi)

    def rank(self, axes) -> np.ndarray:
        """Per class, its devices' rank over ``axes`` (which must be among, or made of pieces of, the axes the
        classes were made for)."""
        return np.broadcast_to(rank(self.coords, self.mesh.axes_of(axes)), (self.size,))

    def group_ids(self, axes) -> np.ndarray:
        """Per class, the id of the first device of its group over ``axes`` (which must be among the axes the
        classes were made for): the member whose coordinates on the pieces of ``axes`` are 0. Classes with one
        group id are in one group."""
        axes = self.mesh.axes_of(tuple(axes))
        key = {name: self.coords[name].copy() for name in self.mesh.names}
        for name, lo, hi in self.pieces:
            if any(a.name == name and a.pre <= lo and hi <= a.stop for a in axes):
                stride = self.mesh.axis_size(name) // hi
                key[name] -= key[name] // stride % (hi // lo) * stride
        return np.broadcast_to(np.asarray(device_id(self.mesh, key), np.int64), (self.size,))

    def around(self, device: int) -> np.ndarray:
        """Per class, the id of its member that agrees with ``device`` outside the classes' pieces."""
        mine = device_coords(self.mesh, device)
        coords = {}
        for name in self.mesh.names:
            kept = mine[name]
            for n, lo, hi in self.pieces:
                if n == name:
                    stride = self.mesh.axis_size(name) // hi
                    kept -= (kept // stride) % (hi // lo) * stride
            coords[name] = kept + self.coords[name]
        return device_id(self.mesh, coords)


# ---------------------------------------------------------------------- elements a device lacks
def max_missing_elements(src: ShardingType, dst: ShardingType) -> int:
    """``max_d (|T_d| − |T_d ∩ S_d|)``: the most elements of its box under ``dst`` that a device does not hold
    under ``src`` (``S_d``, ``T_d`` its boxes; padding is not an element). Partial axes do not enter.

    Per dim ``i`` a device's two intervals give ``lt_i = |T_d,i|`` and ``o_i = |S_d,i ∩ T_d,i|``, and the count
    is ``Π lt_i − Π o_i``. A dim whose ``(lt_i, o_i)`` is the same on every device is a constant factor
    (:func:`_dim_overlap`, from the range of the offset between the two intervals). The others are grouped into
    components that share mesh axes; a component of even dims of which one can miss its overlap entirely
    contributes ``(Π lt, 0)``, any other is evaluated over its classes of devices (:class:`DeviceClasses` of its
    axes, at most the devices its axes span). Components are independent: the Pareto-best ``(Π lt, Π o)`` of
    each are combined. Cost: polynomial in the rank and the number of axes, plus those classes (at most
    :data:`MAX_LISTED`, else :class:`ShardingError`).
    """
    if src.mesh != dst.mesh:  # two device orders: a device's two positions differ, so count per device
        return int(np.max(_missing_by_device(src, dst), initial=0))
    const_lt = const_o = 1
    open_dims: dict[int, tuple[int | None, bool]] = {}
    for i in range(src.rank):
        lt, o, zeroable = _dim_overlap(src, dst, i)
        if o is None:
            open_dims[i] = (lt, zeroable)
        else:
            const_lt, const_o = const_lt * lt, const_o * o
    pairs = [(1, 1)]
    for comp in _components(src, dst, list(open_dims)):
        lts = [open_dims[i][0] for i in comp]
        if None not in lts and any(open_dims[i][1] for i in comp):
            front = [(math.prod(lts), 0)]
        else:
            cls = DeviceClasses(src.mesh, [a for i in comp for a in src.dims[i] + dst.dims[i]])
            front = _pareto(*box_overlaps_on(src, dst, comp, cls.coords))
        pairs = _pareto_pairs([(a * c, b * e) for a, b in pairs for c, e in front])
    return max(const_lt * a - const_o * b for a, b in pairs)


def _missing_by_device(src: ShardingType, dst: ShardingType) -> np.ndarray:
    """Per device id, the elements of its box under ``dst`` it does not hold under ``src``, each box read at
    the device's position on its type's mesh (the meshes may differ in device order): ``O(devices · rank)``."""
    ids = np.asarray(src.mesh.devices, dtype=np.int64)
    cs, ct = device_coords(src.mesh, ids), device_coords(dst.mesh, ids)
    want = have = 1
    for n, Ls, Lt, a_s, a_t in zip(src.shape, src.local_shape, dst.local_shape, src.dims, dst.dims):
        bs, bt = rank(cs, a_s), rank(ct, a_t)
        s_lo, s_hi = np.minimum(n, bs * Ls), np.minimum(n, (bs + 1) * Ls)
        t_lo, t_hi = np.minimum(n, bt * Lt), np.minimum(n, (bt + 1) * Lt)
        want = want * (t_hi - t_lo)
        have = have * np.maximum(0, np.minimum(s_hi, t_hi) - np.maximum(s_lo, t_lo))
    return np.broadcast_to(want - have, ids.shape)


def missing_elements_on(src: ShardingType, dst: ShardingType, coords: dict):
    """Per device given by its ``coords`` (ints or numpy arrays; see :class:`DeviceClasses`), how many elements
    of its box under ``dst`` it does not hold under ``src``."""
    lt, o = box_overlaps_on(src, dst, range(src.rank), coords)
    return lt - o


def _dim_overlap(src: ShardingType, dst: ShardingType, i: int) -> tuple[int | None, int | None, bool]:
    """``(lt, o, zeroable)`` of dim ``i`` (see :func:`max_missing_elements`): ``lt`` when it is the same on
    every device (else None), ``o`` when it is too (else None), and whether some device's overlap is 0.

    For even dims, ``lt = L_dst`` and the overlap depends only on the offset ``δ = b_src·L_src − b_dst·L_dst``
    between the two intervals: ``o = max(0, min(L_src, L_dst, L_src + δ, L_dst − δ))``, a trapezoid in ``δ``.
    ``δ`` is linear in the digits of the pieces of the dim's axes (a piece in both lists adds up its two
    weights), so its range is ``[Σ min(0, w)(size − 1), Σ max(0, w)(size − 1)]`` and both ends are taken by
    some device. A trapezoid is lowest at an end of an interval: ``o`` reaches 0 if it does at an end, and is
    constant if both ends are on the top. Uneven dims are left open."""
    n = src.shape[i]
    if n == 0:
        return 0, 0, True
    ks, kt = src.blocks(i), dst.blocks(i)
    Ls, Lt = src.local_shape[i], dst.local_shape[i]
    if n % ks or n % kt:
        return None, None, False
    pieces = split_common([src.dims[i], dst.dims[i]])
    if any(hi % lo for p in pieces for _, lo, hi in p):
        return Lt, None, False  # no common digits: evaluate it over classes
    weight: dict[tuple, int] = {}
    for sign, length, ps in ((1, Ls, pieces[0]), (-1, Lt, pieces[1])):
        for j, p in enumerate(ps):
            weight[p] = weight.get(p, 0) + sign * length * math.prod(hi // lo for _, lo, hi in ps[j + 1:])
    lo = sum(min(0, w) * (p[2] // p[1] - 1) for p, w in weight.items())
    hi = sum(max(0, w) * (p[2] // p[1] - 1) for p, w in weight.items())

    def overlap(delta: int) -> int:
        return max(0, min(Ls, Lt, Ls + delta, Lt - delta))

    top = min(Ls, Lt)
    if lo == hi or overlap(lo) == overlap(hi) == top:
        return Lt, overlap(lo), overlap(lo) == 0
    return Lt, None, 0 in (overlap(lo), overlap(hi))


def _components(src: ShardingType, dst: ShardingType, dims: list[int]) -> list[list[int]]:
    """``dims`` grouped into the connected components of "shares a factor of a mesh axis" (sorted)."""
    pieces = split_common([a for i in dims for a in (src.dims[i], dst.dims[i])])
    owner: dict[tuple, int] = {}
    parent = {i: i for i in dims}

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for k, i in enumerate(dims):
        for p in pieces[2 * k] + pieces[2 * k + 1]:
            if p[1] == p[2]:
                continue  # an axis of size 1 splits nothing
            if p in owner:
                parent[find(i)] = find(owner[p])
            owner[p] = i
    comps: dict[int, list[int]] = {}
    for i in dims:
        comps.setdefault(find(i), []).append(i)
    return list(comps.values())


def box_overlaps_on(src: ShardingType, dst: ShardingType, dims, coords: dict):
    """``(Π lt_i, Π o_i)`` over ``dims`` for the devices at ``coords`` (ints or numpy arrays; see
    :func:`max_missing_elements`): the size of each device's box under ``dst`` and how much of it its box under
    ``src`` holds."""
    big = max((L * k for t in (src, dst) for L, k in zip(t.local_shape, map(t.blocks, range(t.rank)))), default=0)
    as_ints = (lambda x: x) if big < 2**62 else (lambda x: np.asarray(x, dtype=object))  # beyond int64
    lt_all, o_all = 1, 1
    for i in dims:
        n = src.shape[i]
        s0 = np.minimum(n, as_ints(rank(coords, src.dims[i])) * src.local_shape[i])
        t0 = np.minimum(n, as_ints(rank(coords, dst.dims[i])) * dst.local_shape[i])
        s1, t1 = np.minimum(n, s0 + src.local_shape[i]), np.minimum(n, t0 + dst.local_shape[i])
        lt_all = lt_all * (t1 - t0)
        o_all = o_all * np.maximum(0, np.minimum(s1, t1) - np.maximum(s0, t0))
    return lt_all, o_all


def _pareto(lt, o) -> list[tuple[int, int]]:
    """The pairs of ``(lt, o)`` (arrays, one entry per device class) that no other beats on both: larger ``lt``
    and smaller ``o`` are better, since a device's count is ``Π lt − Π o`` over components."""
    lt, o = (np.ravel(x) for x in np.broadcast_arrays(lt, o))
    if lt.dtype == object:  # sizes beyond int64: few classes, plain Python
        return _pareto_pairs(zip(lt.tolist(), o.tolist()))
    order = np.lexsort((o, lt))  # by lt, then o: the first of each lt has its least o
    lt, o = lt[order], o[order]
    first = np.flatnonzero(np.r_[True, lt[1:] != lt[:-1]])
    return _pareto_pairs(zip(lt[first].tolist(), o[first].tolist()))


def _pareto_pairs(pairs) -> list[tuple[int, int]]:
    """The pairs ``(lt, o)`` not beaten by another on both (larger ``lt``, smaller ``o``)."""
    out = []
    for a, b in sorted(set(pairs), key=lambda p: (-p[0], p[1])):
        if not out or b < out[-1][1]:
            out.append((a, b))
    return out


def needed_by_group(src: ShardingType, dst: ShardingType, axes) -> np.ndarray:
    """Per group over ``axes`` (on one device order; the groups in order of their first device): the elements
    of its members' block under ``dst`` that no member holds under ``src`` (``dst`` places none of ``axes`` in
    its dims, so the members share one block). Computed per class of the axes the layouts and ``axes`` use
    (:class:`DeviceClasses`), not per device: a group is the classes that agree outside the pieces of ``axes``,
    and its members' source blocks are the distinct source-block ranks among them (blocks of one layout are
    equal or disjoint)."""
    mesh = src.mesh
    axes = mesh.axes_of(tuple(axes))
    classes = DeviceClasses(mesh, [a for t in (src, dst) for d in t.dims for a in d] + list(axes))
    c = classes.coords
    lt, o = box_overlaps_on(src, dst, range(src.rank), c)
    lt, o = np.broadcast_to(lt, (classes.size,)), np.broadcast_to(o, (classes.size,))
    group = classes.group_ids(axes)
    blocks = np.stack([group] + [np.broadcast_to(rank(c, d), (classes.size,)) for d in src.dims])
    _, first = np.unique(blocks, axis=1, return_index=True)  # one class per (group, source block)
    groups, at = np.unique(group, return_inverse=True)
    held = np.zeros(groups.size, o.dtype)
    np.add.at(held, at[first], o[first])
    need = np.zeros(groups.size, lt.dtype)
    need[at] = lt  # the members share one block
    return need - held


# ---------------------------------------------------------------------- permutes
def permute_groups(t_in: ShardingType, t_out: ShardingType) -> tuple[tuple[tuple[Axis, ...], tuple[Axis, ...]], ...]:
    """The source of each device in a permute from ``t_in`` to ``t_out`` (same block count in every dim, same
    partial axes), as groups ``(source_axes, axes)``: device ``d`` takes the buffer of the device whose rank over
    ``source_axes`` is ``d``'s rank over ``axes``, for every group, and whose other coordinates are ``d``'s. No
    groups: nobody moves.

    The axes of both types are cut into common pieces. Per dim, the source must hold ``d``'s block: its rank
    over the dim's pieces under ``t_in`` is ``d``'s over those under ``t_out`` (one group per dim whose pieces
    differ, less the pieces the two lists share at their major and minor ends). The pieces only ``t_out`` places
    take, on the source, the digits of the pieces only ``t_in`` places, so that the map is a permutation: each
    such piece is paired with the piece found by following its position (the piece of ``t_in`` where ``t_out``
    has it, and so on), which keeps every device that already holds its block in place whenever those pieces
    have equal sizes (swaps of equal-sized axes, as the synthesizer makes); else they are taken in mesh order
    as one group. Partial axes and the axes neither type places keep their coordinates. Raises
    :class:`ShardingError` if the two types cut a mesh axis into factors of different decompositions.
    """
    r = t_in.rank
    cut = split_common([*t_in.dims, *t_out.dims, t_in.partial, t_out.partial])
    if any(hi % lo for ps in cut for _, lo, hi in ps):
        raise ShardingError(f"a permute from {t_in} to {t_out} cuts a mesh axis into factors of two different "
                            "decompositions")
    size_of = dict(t_in.mesh.axes)
    P = [[p for p in ps if p[1] != p[2]] for ps in cut[:r]]
    Q = [[p for p in ps if p[1] != p[2]] for ps in cut[r: 2 * r]]
    groups = []
    for p, q in zip(P, Q):
        while p and q and p[0] == q[0]:
            p, q = p[1:], q[1:]
        while p and q and p[-1] == q[-1]:
            p, q = p[:-1], q[:-1]
        if p:
            groups.append((p, q))
    placed_in = {p for g in groups for p in g[0]}
    placed_out = {p for g in groups for p in g[1]}
    mesh_order = {name: k for k, name in enumerate(t_in.mesh.names)}
    order = lambda p: (mesh_order[p[0]], p[1])  # noqa: E731
    only_out, only_in = sorted(placed_out - placed_in, key=order), sorted(placed_in - placed_out, key=order)
    pairs = _chains(groups, only_out, only_in)
    if pairs is not None:
        groups += [([b], [a]) for b, a in pairs]
    elif only_out:
        groups.append((only_out, only_in))

    def axes(pieces) -> tuple[Axis, ...]:
        return canonical_axes(tuple(Axis(n, lo, hi // lo, size_of[n]) for n, lo, hi in pieces))

    return tuple((axes(s), axes(a)) for s, a in groups)


def _chains(groups, only_out, only_in):
    """Pairs ``(b, a)``: piece ``b`` of ``only_out`` with the piece ``a`` of ``only_in`` reached by following
    positions (``b``'s position in ``t_out``'s list, the piece of ``t_in`` there, that piece's position in
    ``t_out``'s list if it has one, …), all of equal sizes; None if some chain meets another size or runs out."""
    at = {q: (g, j) for g, (_, qs) in enumerate(groups) for j, q in enumerate(qs)}
    out = []
    for b in only_out:
        cur = b
        while True:
            g, j = at[cur]
            ps = groups[g][0]
            if j >= len(ps) or ps[j][2] // ps[j][1] != cur[2] // cur[1]:
                return None
            cur = ps[j]
            if cur not in at:  # placed by t_in only
                out.append((b, cur))
                break
    return out


# ---------------------------------------------------------------------- exchanges
class Segment(NamedTuple):
    """Along one dim: a device whose block over the dim's axes is ``block`` takes ``[src_start, src_start +
    size)`` of its buffer's dim from a device whose block over the source's axes is ``source_block``, into
    ``[dst_start, dst_start + size)``."""

    block: int
    source_block: int
    src_start: int
    dst_start: int
    size: int


# ---------------------------------------------------------------------- changes of device order
def _blocks(t: ShardingType, device: int) -> tuple[int, ...]:
    """The block of every dim of ``t`` that ``device`` holds."""
    return tuple(block_index(t, i, device) for i in range(t.rank))


@lru_cache(maxsize=4096)
def permute_sources(t_in: ShardingType, t_out: ShardingType) -> tuple[int, ...]:
    """For each device, the device whose buffer under ``t_in`` it must hold under ``t_out``.

    Both types have the same block count in every dim and the same partial axes; their meshes have the same
    axes and may differ in device order. Summands move as whole partial groups (the devices that differ only
    on the partial axes): every group of ``t_out`` takes the buffers of one group of ``t_in`` that holds its
    blocks (:func:`_members`), so that its reduction is the value. A destination group that is a source group
    (the same devices) holding its blocks keeps its buffers; each other takes, among the remaining source
    groups of its blocks, the one that shares the most devices with it, else the first (both in order of
    lowest device id), so the result is a permutation. Without partial axes every group is one device: a
    device that already holds its block keeps it, the others take the remaining holders of their block in
    device order.
    """
    groups_in = [tuple(g) for g in t_in.mesh.groups(t_in.partial)]
    groups_out = [tuple(g) for g in t_out.mesh.groups(t_out.partial)]
    group_of = {d: g for g in groups_in for d in g}
    sets_in = {frozenset(g) for g in groups_in}
    kept = {frozenset(g) for g in groups_out
            if frozenset(g) in sets_in and _blocks(t_in, g[0]) == _blocks(t_out, g[0])}
    spare: dict = {}  # blocks -> {source group: None}, in order of lowest device id
    for g in groups_in:
        if frozenset(g) not in kept:
            spare.setdefault(_blocks(t_in, g[0]), {})[g] = None
    sources = list(range(t_in.mesh.id_bound))  # a number that is no device of the mesh keeps its (empty) place
    for g in groups_out:
        if frozenset(g) in kept:
            continue
        free = spare[_blocks(t_out, g[0])]
        shared = {}
        for d in g:
            if group_of[d] in free:
                shared[group_of[d]] = shared.get(group_of[d], 0) + 1
        src = max(shared, key=lambda h: (shared[h], -h[0])) if shared else next(iter(free))
        del free[src]
        for d, s in _members(g, src):
            sources[d] = s
    return tuple(sources)


def _members(dst_group, src_group) -> list[tuple[int, int]]:
    """``(device, source)`` pairs that give each member of ``dst_group`` one summand of ``src_group`` (groups of
    one size; reductions are commutative, so any pairing gives the group's value): a device in both keeps its
    own, the others pair in rank order."""
    common = set(dst_group) & set(src_group)
    rest = iter([s for s in src_group if s not in common])
    return [(d, d if d in common else next(rest)) for d in dst_group]


@dataclass(frozen=True)
class Copy:
    """``dst[dst_start : dst_start + size] = buffer of device source[src_start : src_start + size]``, per dim."""

    source: int
    src_start: tuple[int, ...]
    dst_start: tuple[int, ...]
    size: tuple[int, ...]

    @property
    def src_box(self) -> tuple[slice, ...]:
        """The copied box of the source device's buffer."""
        return tuple(slice(a, a + n) for a, n in zip(self.src_start, self.size))

    @property
    def dst_box(self) -> tuple[slice, ...]:
        """The box of the destination buffer it fills."""
        return tuple(slice(a, a + n) for a, n in zip(self.dst_start, self.size))


def exchange_segments(t_in: ShardingType, t_out: ShardingType) -> tuple[tuple[Segment, ...], ...]:
    """Per dim, the :class:`Segment` of every pair of a block under ``t_out`` and a block under ``t_in`` that
    share elements (padding is no element), by destination block, then source block: at most ``k_in + k_out − 1``
    per dim, whatever the device count.

    A device's copies in an exchange are the products of one segment per dim (for its blocks under ``t_out``),
    each from the device that differs from it only in its coordinates on ``t_in``'s dim axes, which are those of
    the segments' source blocks: a device that holds a block takes it from itself, and a sender shares every
    other coordinate (partial ones included) with its receiver. Raises :class:`ShardingError` if the dims have
    more than :data:`MAX_LISTED` blocks in all.
    """
    check_listed(sum(t.blocks(i) for t in (t_in, t_out) for i in range(t_in.rank)),
                 f"the blocks of the dims of an exchange from {t_in} to {t_out} (its segment tables)")
    out = []
    for n, Ls, Lt, kt in zip(t_in.shape, t_in.local_shape, t_out.local_shape, map(t_out.blocks, range(t_out.rank))):
        segs = []
        for b in range(kt):
            lo, hi = min(n, b * Lt), min(n, (b + 1) * Lt)
            for s in range(lo // Ls, -(-hi // Ls)) if hi > lo else ():
                a, z = max(lo, s * Ls), min(hi, (s + 1) * Ls)
                segs.append(Segment(b, s, a - s * Ls, a - lo, z - a))
        out.append(tuple(segs))
    return tuple(out)


def remote_copies(t_in: ShardingType, t_out: ShardingType, device: int) -> int:
    """How many copies of elements ``device`` receives from other devices in an exchange from ``t_in`` to
    ``t_out`` (on one device order), from its own blocks alone in ``O(rank)``, whatever the block counts: per
    dim, its block under ``t_out`` has one segment (:func:`exchange_segments`) per source block that shares
    elements with it, its own block under ``t_in`` among them or not; a copy is a segment of each dim, and it
    comes from the device itself exactly when every one of them is its own."""
    c = device_coords(t_in.mesh, device)
    every = own = 1
    for n, Ls, Lt, a_in, a_out in zip(t_in.shape, t_in.local_shape, t_out.local_shape, t_in.dims, t_out.dims):
        b, mine = rank(c, a_out), rank(c, a_in)
        lo, hi = min(n, b * Lt), min(n, (b + 1) * Lt)
        if hi <= lo:
            return 0
        every *= -(-hi // Ls) - lo // Ls  # the source blocks lo // Ls, …, ceil(hi / Ls) - 1
        own *= mine * Ls < hi and lo < (mine + 1) * Ls
    return every - own


@lru_cache(maxsize=256)
def exchange_copies(t_in: ShardingType, t_out: ShardingType) -> tuple[tuple[Copy, ...], ...]:
    """For each device, the copies that assemble its buffer under ``t_out`` from buffers under ``t_in``: the
    per-device form of an exchange between two device orders (``O(devices)``, as such a mesh is a table of its
    devices; on one order :func:`exchange_segments` is the compact form).

    Both types have the same partial axes; their meshes have the same axes and may differ in device order.
    Summands move as whole partial groups (the devices that differ only on the partial axes; one device each
    without partial axes): for each source block (the elements a source group holds) that meets a destination
    group's block, one source group holding it is chosen, and the member of rank ``r`` of the destination
    group copies from the member of rank ``r`` of that source group, so that every group sum adds each
    summand of one source group once (a device in both groups takes its own: :func:`_members`). The chosen
    group is the holder that shares the most devices with the destination group (itself, where the
    destination group is a source group holding the block: its members copy from themselves), then the one
    whose first member shares the most mesh coordinates (on ``t_in``'s mesh) with the destination group's
    first member, then the one of lowest device id. Indexed by device id up to the mesh's
    :attr:`~redist.Mesh.id_bound` (no copies at a number that is no device of the mesh).
    """
    mesh = t_in.mesh
    coords = {d: tuple(mesh.coords(d).values()) for d in mesh.devices}
    holders: dict = {}  # source box -> the source groups that hold it, in order of lowest device id
    for g in mesh.groups(t_in.partial):
        holders.setdefault(tuple((s.start, s.stop) for s in local_box(t_in, g[0])), []).append(tuple(g))
    out: list = [()] * mesh.id_bound
    for group in t_out.mesh.groups(t_out.partial):
        group = tuple(group)
        want = local_box(t_out, group[0])
        first = coords[group[0]]
        copies: list[list[Copy]] = [[] for _ in group]
        for box, groups in holders.items():
            lo = [max(a, w.start) for (a, _), w in zip(box, want)]
            hi = [min(b, w.stop) for (_, b), w in zip(box, want)]
            if any(h <= l for l, h in zip(lo, hi)):
                continue
            members = set(group)
            src = min(groups, key=lambda g: (-len(members.intersection(g)),
                                             -sum(x == y for x, y in zip(coords[g[0]], first)), g[0]))
            src_start = tuple(l - a for l, (a, _) in zip(lo, box))
            dst_start = tuple(l - w.start for l, w in zip(lo, want))
            size = tuple(h - l for l, h in zip(lo, hi))
            for r, (_, s) in enumerate(_members(group, src)):
                copies[r].append(Copy(s, src_start, dst_start, size))
        for d, cs in zip(group, copies):
            out[d] = tuple(sorted(cs, key=lambda c: c.source != d))
    return tuple(out)



def check_factors(t_in: ShardingType, t_out: ShardingType, where: str) -> None:
    """Raise :class:`ShardingError` (``"{where}: ..."``) unless the sub-axes that ``t_in`` and ``t_out`` use of
    each mesh axis are factors of one decomposition of it (as between a plan's source and destination)."""
    by_axis: dict[str, list[Axis]] = {}
    for t in (t_in, t_out):
        for a in [a for d in t.dims for a in d] + list(t.partial):
            by_axis.setdefault(a.name, []).append(a)
    for name, axes in by_axis.items():
        try:
            check_factorization(name, axes)
        except ShardingError as e:
            raise ShardingError(f"{where}: {e}") from None


# ---------------------------------------------------------------------- transfers between meshes
@lru_cache(maxsize=256)
def transfer_copies(t_in: ShardingType, t_out: ShardingType) -> tuple[tuple[Copy, ...], ...]:
    """For each device of ``t_out``'s mesh (indexed by device id up to its :attr:`~redist.Mesh.id_bound`; no
    copies at a number that is no device of it), the copies that assemble its buffer under ``t_out`` from the
    buffers under ``t_in`` of the devices of ``t_in``'s mesh: a transfer between any two meshes, which may share
    devices or not (``O(devices)``, as :func:`exchange_copies`).

    Summands move group to group where the two types' summand groups (the devices that differ only on the
    partial axes; one device each without them) have one size: for each source block that meets a destination
    group's block, one source group holding it is chosen, and member ``r`` of the destination group copies from
    the member of that source group that :func:`_members` pairs it with (a device in both copies from itself).
    Where the source has no pending values and the destination's groups are larger (pending sums created),
    each such piece of a group's block goes to one member, the others keeping zeros there: a member that holds
    it already, else the member that has received the fewest elements so far (then the first in rank order),
    so that the group shares what it receives.

    Senders, in this order of preference: the holder that shares the most devices with the destination group
    (a device in both meshes keeps what it holds); the holder whose busiest member has sent the fewest elements
    so far, so that replicas share the sending (greedy, destination groups in order of lowest device id, as
    Alpa's cross-mesh resharding picks the least-loaded sender); the holder of lowest device id.
    """
    senders = _Senders(t_in)
    creates = t_in.mesh.group_size(t_in.partial) < t_out.mesh.group_size(t_out.partial)
    out: list = [()] * t_out.mesh.id_bound
    for group in t_out.mesh.groups(t_out.partial):
        group = tuple(group)
        want = local_box(t_out, group[0])
        members = set(group)
        received = dict.fromkeys(group, 0)
        copies: dict[int, list[Copy]] = {d: [] for d in group}
        ranges = [range(w.start // L, -(-w.stop // L)) if w.stop > w.start else range(0)
                  for w, L in zip(want, t_in.local_shape)]
        for blocks in itertools.product(*ranges):
            lo = [max(w.start, b * L) for w, b, L in zip(want, blocks, t_in.local_shape)]
            hi = [min(w.stop, (b + 1) * L) for w, b, L in zip(want, blocks, t_in.local_shape)]
            src = senders.pick(blocks, group)
            size = tuple(h - l for l, h in zip(lo, hi))
            src_start = tuple(l - b * L for l, b, L in zip(lo, blocks, t_in.local_shape))
            dst_start = tuple(l - w.start for l, w in zip(lo, want))
            if creates:  # one member takes the piece: the sender itself if it is a member
                d = src[0] if src[0] in members else min(group, key=received.__getitem__)
                pairs = [(d, src[0])]
            else:
                pairs = _members(group, src)
            for d, s in pairs:
                copies[d].append(Copy(s, src_start, dst_start, size))
                if s != d:
                    senders.sent[s] += math.prod(size)
                    received[d] += math.prod(size)
        for d, cs in copies.items():
            out[d] = tuple(sorted(cs, key=lambda c: c.source != d))
    return tuple(out)


class _Senders:
    """The source groups of a transfer from ``t_in`` (the devices that differ only on its partial axes) by the
    blocks they hold, and the elements each source device has sent to others so far: :meth:`pick` chooses a
    block's sender group by :func:`transfer_copies`' rule, without a pass over all the block's holders (a lazy
    heap by load: loads only grow, so a stale entry is never above its true load)."""

    def __init__(self, t_in: ShardingType):
        self.blocks_of: dict[tuple, tuple] = {}  # source group -> the blocks it holds
        self.group_of: dict[int, tuple] = {}
        self.heaps: dict[tuple, list] = {}  # blocks -> [(load when pushed, first device, group)]
        for g in t_in.mesh.groups(t_in.partial):
            g = tuple(g)
            blocks = _blocks(t_in, g[0])
            self.blocks_of[g] = blocks
            self.group_of.update(dict.fromkeys(g, g))
            self.heaps.setdefault(blocks, []).append((0, g[0], g))  # in order of lowest device id: a heap
        self.sent = dict.fromkeys(t_in.mesh.devices, 0)

    def load(self, g: tuple) -> int:
        return max(self.sent[s] for s in g)

    def pick(self, blocks: tuple, group: tuple) -> tuple:
        """The holder of ``blocks`` that shares the most devices with the destination ``group``, then the least
        loaded (the most its busiest member has sent), then the one of lowest device id."""
        shared: dict[tuple, int] = {}
        for d in group:
            g = self.group_of.get(d)
            if g is not None and self.blocks_of[g] == blocks:
                shared[g] = shared.get(g, 0) + 1
        if shared:
            return min(shared, key=lambda g: (-shared[g], self.load(g), g[0]))
        heap = self.heaps[blocks]
        while True:
            load, first, g = heap[0]
            now = self.load(g)
            if now == load:
                return g
            heapq.heapreplace(heap, (now, first, g))


def copied_elements(copies: tuple[tuple[Copy, ...], ...]) -> np.ndarray:
    """Per device id of a copy table (:func:`transfer_copies`, :func:`exchange_copies`), the elements it copies
    from other devices."""
    return np.array([sum(math.prod(c.size) for c in cs if c.source != d) for d, cs in enumerate(copies)],
                    dtype=np.int64)
