"""Pictures of a layout: which block of the array each device holds, as plain text, for a type of any rank.

A sharding type ``t`` (:mod:`redist.types`) cuts each dim it splits into blocks; a *block* of the array is one
block of every split dim, so the array has ``Π_i t.blocks(i)`` blocks. Device ``d`` holds the block of its
coordinates on the splitting axes; the devices that hold one block differ on the other factors of the mesh,
which are of two kinds:

- the *partial* axes: the devices that differ only there form a group whose buffers combine by the type's
  reduction into the block (written ``0+1``, in rank order over ``t.partial``);
- the *replicated* factors (every factor of a mesh axis that no dim and no partial axis uses): each group has
  a replica that differs there (groups written ``0+1,4+5``, in rank order over those factors, mesh order).

:class:`BlockMap` states this by arithmetic on coordinates (:func:`redist.blocks.with_ranks`): a block's
devices are computed from its index, so a mesh of 2³⁰ devices costs what the blocks shown cost.
:func:`type_picture` renders it: a header (the type, its mesh, bytes per device and in all), notes (replicas,
pending reductions, uneven dims and their padding), then a grid when the type splits at most two dims (rows:
the blocks of one, columns: those of the other, as JAX's ``visualize_array_sharding`` draws them; each cell
lists its devices) or else a table of blocks (one row per block: its index box, the coordinates that select
it and its devices). Each row and column names its index range and the coordinates of its splitting axes
(``0:4 x=1``); ranges are the data a block holds, so a block of an uneven dim is shorter (or empty) and the
rest of its buffer is padding. Output is capped (:data:`MAX_BLOCKS` blocks, :data:`MAX_DEVICES` devices per
block), with what is left out counted.

The module reads types through their attributes only (``redist.types`` imports it for
:meth:`redist.ShardingType.show`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from redist.axes import Axis
from redist.blocks import device_id, with_ranks
from redist.errors import ShardingError, shown

if TYPE_CHECKING:  # types calls this module: a runtime import would be a cycle
    from redist.types import ShardingType

MAX_BLOCKS = 32
"""The most blocks a picture shows (table rows, or grid cells), unless told otherwise."""
MAX_COLUMNS = 8
"""The most columns of a grid."""
MAX_DEVICES = 8
"""The most device ids listed for one block in a table (a grid cell lists half as many); the rest are counted."""

_COMBINE = {"sum": "sum", "max": "maximum", "min": "minimum", "prod": "product"}


def format_bytes(n) -> str:
    """``n`` bytes as ``123 B`` below 1 KiB, else with two decimals in KiB, MiB, GiB or TiB."""
    n = float(n)
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.2f} {unit}"
    return f"{n / 1024:.2f} TiB"


class BlockMap:
    """The blocks of ``t`` and the devices that hold each, by arithmetic on coordinates (module docstring).

    ``split``: the dims ``t`` splits, in order; ``counts``: their block counts; ``size``: the number of blocks.
    A block is named by its index tuple (one block index per split dim), and blocks are numbered row-major
    over ``counts``. ``replica_axes``: the replicated factors (mesh order), ``replicas`` the number of groups
    holding each block and ``group`` the devices per group (1 without partial axes).
    """

    def __init__(self, t: ShardingType):
        self.type = t
        self.split = tuple(i for i, d in enumerate(t.dims) if d)
        self.counts = tuple(t.blocks(i) for i in self.split)
        self.size = math.prod(self.counts)
        self.replica_axes = _replicated(t)
        self.replicas = math.prod(a.size for a in self.replica_axes)
        self.group = math.prod(a.size for a in t.partial)

    def index(self, n: int) -> tuple[int, ...]:
        """The index tuple of block number ``n``."""
        out = []
        for k in reversed(self.counts):
            n, b = divmod(n, k)
            out.append(b)
        return tuple(reversed(out))

    def dim_range(self, dim: int, b: int) -> slice:
        """The elements of dim ``dim`` that its block ``b`` holds (the whole dim for an unsplit one)."""
        n, L = self.type.shape[dim], self.type.local_shape[dim]
        return slice(min(n, b * L), min(n, (b + 1) * L))

    def box(self, index: tuple[int, ...]) -> tuple[slice, ...]:
        """The global index box of the block ``index``: one range per dim of the array."""
        blocks = dict(zip(self.split, index))
        return tuple(self.dim_range(i, blocks.get(i, 0)) for i in range(self.type.rank))

    def coords(self, dim: int, b: int) -> tuple[tuple[Axis, int], ...]:
        """The coordinate on each axis splitting ``dim`` of the devices holding its block ``b``."""
        out = []
        for a in reversed(self.type.dims[dim]):
            b, c = divmod(b, a.size)
            out.append((a, c))
        return tuple(reversed(out))

    def device(self, index: tuple[int, ...], replica: int, member: int) -> int:
        """The id of the device holding block ``index`` in group ``replica``, at rank ``member`` in it."""
        t = self.type
        ranks = [(t.dims[i], b) for i, b in zip(self.split, index)]
        ranks += [(self.replica_axes, replica), (t.partial, member)]
        return int(device_id(t.mesh, with_ranks({n: 0 for n in t.mesh.names}, ranks)))

    def holders(self, index: tuple[int, ...], limit: int = MAX_DEVICES) -> list[list[int]]:
        """The groups holding block ``index``, each its devices in rank order: whole groups, in replica order,
        while they list at most ``limit`` devices in all (at least one group, cut to ``limit`` devices)."""
        groups = []
        for r in range(min(self.replicas, max(1, limit // self.group))):
            groups.append([self.device(index, r, m) for m in range(min(self.group, limit))])
        return groups


def _replicated(t: ShardingType) -> tuple[Axis, ...]:
    """The factors of the mesh axes that no dim and no partial axis of ``t`` uses, in mesh order (major to minor):
    each mesh axis cut at the boundaries ``t``'s axes use on it."""
    used = [a for d in t.dims for a in d] + list(t.partial)
    cuts = t.mesh.cut_points(used)
    out = []
    for name, size in t.mesh.axes:
        for lo, hi in zip(cuts[name], cuts[name][1:]):
            if not any(a.name == name and a.pre <= lo and hi <= a.stop for a in used):
                out.append(Axis(name, lo, hi // lo, size))
    return tuple(out)


# ---------------------------------------------------------------------- text
def holders_text(blocks: BlockMap, index: tuple[int, ...], limit: int = MAX_DEVICES) -> str:
    """The devices holding block ``index`` (at most ``limit`` of them): groups separated by ``,``, members of a
    partial group joined by ``+``; ``… (N devices)`` where some are left out."""
    groups = blocks.holders(index, limit)
    text = ",".join("+".join(map(str, g)) + ("+…" if len(g) < blocks.group else "") for g in groups)
    total = blocks.replicas * blocks.group
    if len(groups) < blocks.replicas:
        text += ",…"
    return text if sum(map(len, groups)) == total else f"{text} ({total} devices)"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _range(s: slice) -> str:
    return f"{s.start}:{s.stop}"


def _coords(coords) -> str:
    return ",".join(f"{a}={c}" for a, c in coords)


def _axes(axes) -> str:
    return "{" + ",".join(axes) + "}"


def check_limit(limit) -> None:
    """Raises :class:`ShardingError` unless ``limit`` (the most blocks a picture shows) is an int >= 1."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ShardingError(f"a picture's limit is the most blocks it shows, an int >= 1; got {shown(limit)}")


def _header(t: ShardingType) -> list[str]:
    """The type, its mesh and device count; bytes per device (its local buffer) and of the whole array."""
    mesh = t.mesh
    local = f"{t.dtype}[{', '.join(map(str, t.local_shape))}]"
    return [f"{t}  on mesh {mesh or '(no axes)'}: {_count(mesh.size, 'device')}",
            f"{format_bytes(t.local_bytes)} per device ({local}), {format_bytes(t.global_bytes)} global"]


def _notes(blocks: BlockMap) -> list[str]:
    """How many blocks and holders, what the partial groups combine into, and each uneven dim's padding."""
    t = blocks.type
    held = blocks.replicas * blocks.group
    lines = [f"{_count(blocks.size, 'block')}, each held by {_count(held, 'device')}"]
    if blocks.replicas > 1:
        lines[0] += f": replicas over {_axes(blocks.replica_axes)}, listed in that order"
    if t.partial:
        lines.append(f"pending {t.reduction} over {_axes(t.partial)}: the devices joined by + hold values whose "
                     f"{_COMBINE[t.reduction]} is the block")
    for i in blocks.split:
        if not t.is_even(i):
            lines.append(_padding(t, i))
    return lines


def _padding(t: ShardingType, dim: int) -> str:
    """``dim`` of ``t`` (uneven): its blocks, their size, and which ones hold less than that."""
    n, k, L = t.shape[dim], t.blocks(dim), t.local_shape[dim]
    full, rest = divmod(n, L)
    parts = []
    if full:
        parts.append("block 0 full" if full == 1 else f"blocks 0-{full - 1} full")
    if rest:
        parts.append(f"block {full} holds {rest}")
    first_empty = full + (rest > 0)
    if first_empty < k:
        parts.append(f"block {first_empty} empty" if first_empty == k - 1 else f"blocks {first_empty}-{k - 1} empty")
    return (f"dim {dim} is uneven: {k} blocks of {L} for {n} elements (padded to {k * L}): "
            + ", ".join(parts))


def _block_label(blocks: BlockMap, dim: int | None, b: int) -> str:
    """Block ``b`` of ``dim`` as ``4:8 x=1``: its range and its coordinates on the splitting axes ("" for no
    dim)."""
    return "" if dim is None else f"{_range(blocks.dim_range(dim, b))} {_coords(blocks.coords(dim, b))}"


def grid_dims(blocks: BlockMap) -> tuple[int | None, int | None]:
    """The dims along the rows and the columns of a grid of ``blocks`` (a type that splits at most two dims):
    the first and the second split dim; one split dim along the columns if it is the array's last dim and its
    blocks fit :data:`MAX_COLUMNS`, else along the rows; None for no dim."""
    split, last = blocks.split, blocks.type.rank - 1
    if len(split) == 2 or (len(split) == 1 and (split[0] != last or blocks.counts[0] > MAX_COLUMNS)):
        return split[0], (split[1] if len(split) == 2 else None)
    return None, (split[0] if split else None)


def _grid(blocks: BlockMap, limit: int = MAX_BLOCKS) -> list[str]:
    """The blocks of a type that splits at most two dims as a grid of at most ``limit`` cells and
    :data:`MAX_COLUMNS` columns, along :func:`grid_dims`. Row and column labels give the block's range and its
    coordinates on the splitting axes; each cell lists the devices holding its block."""
    t = blocks.type
    rows_dim, cols_dim = grid_dims(blocks)
    n_rows, n_cols = (t.blocks(d) if d is not None else 1 for d in (rows_dim, cols_dim))
    n_cols_shown = min(n_cols, MAX_COLUMNS, limit)
    n_rows_shown = min(n_rows, max(1, limit // n_cols_shown))

    def cell(r, c):
        index = tuple(b for d, b in ((rows_dim, r), (cols_dim, c)) if d is not None)
        return holders_text(blocks, index, MAX_DEVICES // 2)

    cells = [[cell(r, c) for c in range(n_cols_shown)] for r in range(n_rows_shown)]
    col_labels = [_block_label(blocks, cols_dim, c) for c in range(n_cols_shown)]
    row_labels = [_block_label(blocks, rows_dim, r) for r in range(n_rows_shown)]
    widths = [max(len(col_labels[c]), *(len(row[c]) for row in cells)) + 2 for c in range(n_cols_shown)]
    row_title = _dim_title(t, rows_dim) if rows_dim is not None else ""
    margin = max(len(s) + 1 for s in [*row_labels, row_title]) if rows_dim is not None else 0

    def line(left, texts, sep="│"):
        return f"{left:<{margin}}{sep}" + sep.join(f" {s:<{w - 1}}" for s, w in zip(texts, widths)) + sep

    def rule(corners):
        return " " * margin + corners[0] + corners[1].join("─" * w for w in widths) + corners[2]

    lines = []
    if cols_dim is not None:
        more = f"  … {_count(n_cols - n_cols_shown, 'more column')}" if n_cols_shown < n_cols else ""
        lines.append(" " * (margin + 1) + _dim_title(t, cols_dim))
        lines.append(line("", col_labels, " ").rstrip() + more)
    lines.append(row_title + rule("┌┬┐")[len(row_title):])
    for r, row in enumerate(cells):
        if r:
            lines.append(rule("├┼┤"))
        lines.append(line(row_labels[r], row))
    lines.append(rule("└┴┘"))
    if n_rows_shown < n_rows:
        lines.append(f"… {_count(n_rows - n_rows_shown, 'more row')}")
    return lines


def _dim_title(t: ShardingType, dim: int) -> str:
    return f"dim {dim} {_axes(t.dims[dim])}"


def table(blocks: BlockMap, limit: int = MAX_BLOCKS) -> list[str]:
    """The blocks as a table, one row per block (the first ``limit``, in block order): its number, its index
    box, the coordinates of the devices holding it on the splitting axes, and those devices."""
    rows = [("block", "index box", "coordinates", "devices")]
    for n in range(min(blocks.size, limit)):
        index = blocks.index(n)
        coords = " ".join(_coords(blocks.coords(d, b)) for d, b in zip(blocks.split, index))
        box = "[" + ", ".join(_range(s) for s in blocks.box(index)) + "]"
        rows.append((str(n), box, coords, holders_text(blocks, index)))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = [f"{r[0]:>{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]
    if blocks.size > limit:
        lines.append(f"… {_count(blocks.size - limit, 'more block')}")
    return lines


def blocks_picture(t: ShardingType, limit: int = MAX_BLOCKS) -> list[str]:
    """The notes and the grid or table of ``t`` (no header)."""
    blocks = BlockMap(t)
    return _notes(blocks) + (_grid(blocks, limit) if len(blocks.split) <= 2 else table(blocks, limit))


def type_picture(t: ShardingType, limit: int = MAX_BLOCKS) -> str:
    """The picture of ``t`` (module docstring): header, notes, then its grid or table of at most ``limit``
    blocks. Raises :class:`ShardingError` unless ``limit`` is an int >= 1."""
    check_limit(limit)
    return "\n".join(_header(t) + blocks_picture(t, limit))
