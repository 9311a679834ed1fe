"""What a program's devices hold and receive, counted from its instructions alone.

``peak_bytes`` and ``bytes_received`` are recomputed from the instructions and buffer shapes (which are the
same on every device of an SPMD program; the shapes are themselves re-derived from the instructions): the
collectives receive the same on every device, and what the point-to-point instructions give each device is
counted with numpy arithmetic on every device's coordinates at once (:func:`program_bytes`), no query.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from redist import program as P
from redist.verify.encoding import Axis, device_order, ksize, position_coords, read_axes
from redist.verify.verdict import Refuted


def program_bytes(program, mesh_sizes=None) -> Fraction:
    """The most bytes any device receives over the program, from the instructions and shapes alone:
    Reshape, Transpose, Slice, KeepRoot and EmbedChunk 0; AllGather (k−1)/k·L_out; AllToAll (k−1)/k·L;
    ReduceScatter (k−1)·L_out (= (k−1)/k·L_in, the input padded to k chunks); AllReduce 2(k−1)/k·L (the same
    on every device); CollectivePermute L on a device whose source is another device; Exchange the elements a
    device copies from other devices (per device: :func:`_p2p_bytes`)."""
    uniform, per_device = _received(program, mesh_sizes or dict(program.mesh.axes))
    return uniform + (int(per_device.max()) if per_device.size else 0)


def check_costs(program, shapes, mesh_sizes, costs, details: dict) -> None:
    """Peak bytes and bytes received, from the instructions (SPMD: every device's buffer has the
    instruction's shape at every boundary), against the plan's ``costs`` when given."""
    itemsize = np.dtype(program.dtype).itemsize
    peak = max(math.prod(s) * itemsize for s in shapes)
    uniform, per_dev = _received(program, mesh_sizes)
    received = uniform + (int(per_dev.max()) if per_dev.size else 0)
    details.update(peak_bytes=peak, bytes_received=received)
    if costs is None:
        return
    claimed_peak, claimed_recv = costs
    if peak > claimed_peak:
        raise Refuted(f"a device holds {peak} bytes at a step boundary, more than peak_bytes={claimed_peak}")
    if peak != claimed_peak:
        raise Refuted(f"peak_bytes={claimed_peak} but the largest buffer is {peak} bytes")
    if abs(Fraction(claimed_recv) - received) > Fraction(1, 10**6) * max(1, received):
        dev = int(per_dev.argmax()) if per_dev.size else 0
        raise Refuted(f"bytes_received={claimed_recv} but the instructions make device {dev} receive "
                      f"{float(received):g} bytes")


def _received(program, mesh_sizes) -> tuple[Fraction, np.ndarray]:
    """What every device receives from the collectives (one number), and per position of the program's mesh
    what its device receives from the point-to-point instructions (a numpy array over all positions)."""
    item = np.dtype(program.dtype).itemsize
    uniform, per_device = Fraction(0), np.zeros(math.prod(mesh_sizes.values()), np.int64)
    ids = np.asarray(device_order(program.mesh), dtype=np.int64)
    for t, ins in enumerate(program.instructions):
        L_in = math.prod(program.shapes[t]) * item
        L_out = math.prod(program.shapes[t + 1]) * item
        if isinstance(ins, (P.CollectivePermute, P.Exchange)):
            per_device = per_device + _p2p_bytes(ins, mesh_sizes, L_in, item, ids)
            continue
        if isinstance(ins, (P.Reshape, P.Transpose)):
            continue
        k = ksize(read_axes(mesh_sizes, ins.axes, f"instruction {t}"))
        if isinstance(ins, (P.Slice, P.KeepRoot, P.EmbedChunk)):
            add = Fraction(0)
        elif isinstance(ins, P.AllGather):
            add = Fraction(k - 1, k) * L_out
        elif isinstance(ins, P.ReduceScatter):
            add = Fraction(k - 1) * L_out
        elif isinstance(ins, P.AllToAll):
            add = Fraction(k - 1, k) * L_in
        elif isinstance(ins, P.AllReduce):
            add = Fraction(2 * (k - 1), k) * L_in
        else:
            raise Refuted(f"instruction {t}: unknown instruction {type(ins).__name__}")
        uniform += add
    return uniform, per_device


def _p2p_bytes(ins, mesh_sizes, L_in: int, item: int, ids: np.ndarray) -> np.ndarray:
    """Per position (``ids``: the device at each), the bytes a permute or an exchange brings its device from
    other devices (numpy, every device at once). A permute: its whole buffer where its source is another
    device (a table names device ids; a coordinate map positions). An exchange: a device's copies are
    the products of one segment per dim for its blocks, from itself exactly when every segment's source block
    is its own rank over the dim's source axes; so it receives ``Π_i total_i − Π_i own_i`` elements, the sums
    of its segments' sizes per dim, all of them and its own ones."""
    n = math.prod(mesh_sizes.values())
    positions = np.arange(n, dtype=np.int64)
    c = position_coords(mesh_sizes, positions)
    if isinstance(ins, P.CollectivePermute):
        if isinstance(ins.sources, P.CoordinateMap):
            return np.where(_np_id(_np_map(c, ins.sources, mesh_sizes), mesh_sizes) != positions, L_in, 0)
        return np.where(np.asarray(ins.sources, dtype=np.int64)[ids] != ids, L_in, 0)
    if isinstance(ins.dims, P.CopyTable):  # by device id, read at each position
        table = ins.dims.copies
        return np.array([sum(math.prod(cp.size) for cp in table[d] if cp.source != d) for d in ids.tolist()],
                        np.int64) * item
    total, own = np.ones(n, np.int64), np.ones(n, np.int64)
    for x in ins.dims:
        axes = read_axes(mesh_sizes, x.axes, "exchange")
        source_axes = read_axes(mesh_sizes, x.source_axes, "exchange")
        k_in = ksize(source_axes)
        by_block = np.zeros(ksize(axes), np.int64)
        by_pair: dict[int, int] = {}  # block · k_in + source block -> elements
        for b, sb, _, _, size in x.segments:
            by_block[b] += size
            by_pair[b * k_in + sb] = by_pair.get(b * k_in + sb, 0) + size
        block = _np_rank(c, axes, n)
        total = total * by_block[block]
        if not by_pair:
            own[:] = 0
            continue
        keys = np.array(sorted(by_pair), dtype=np.int64)
        vals = np.array([by_pair[key] for key in keys.tolist()], dtype=np.int64)
        want = block * k_in + _np_rank(c, source_axes, n)
        at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
        own = own * np.where(keys[at] == want, vals[at], 0)
    return (total - own) * item


def _np_sub(c: dict, ax: Axis) -> np.ndarray:
    return (c[ax.name] // ax.stride) % ax.size


def _np_rank(c: dict, axes, n: int) -> np.ndarray:
    """Every device's rank over ``axes`` (numpy; ``n`` devices)."""
    r = np.zeros(n, np.int64)
    for ax in axes:
        r = r * ax.size + _np_sub(c, ax)
    return r


def _np_map(c: dict, cmap, mesh_sizes) -> dict:
    """The coordinates of each device's source under a coordinate map (numpy arrays, by mesh axis)."""
    n = math.prod(mesh_sizes.values())
    groups = [(read_axes(mesh_sizes, s, "permute"), read_axes(mesh_sizes, a, "permute")) for s, a in cmap.groups]
    ranks = [_np_rank(c, a, n) for _, a in groups]
    out = dict(c)
    for (s, _), r in zip(groups, ranks):
        for ax in reversed(s):
            out[ax.name] = out[ax.name] + (r % ax.size - _np_sub(out, ax)) * ax.stride
            r = r // ax.size
    return out


def _np_id(c: dict, mesh_sizes) -> np.ndarray:
    d = 0
    for name, size in mesh_sizes.items():
        d = d * size + c[name]
    return d
