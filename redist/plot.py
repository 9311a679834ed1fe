"""A plan as a figure: one panel per type it passes through, showing which devices hold which block.

:func:`plot_plan` (:meth:`redist.Plan.plot`, ``redist plan --plot FILE``) draws the source and the type after
each step, each titled with the step and the bytes the busiest device receives in it. A type that splits at most
two dims is drawn as the array seen along those dims (:func:`redist.picture.grid_dims`; the other dims are
noted in the panel): one rectangle per block, its size the block's share of the elements, coloured by block and
labelled with the devices holding it (``0+1`` a partial group, ``0,4`` replicas); a block's padding (an uneven
dim, docs/spec.md §2) is hatched. A type that splits more dims is drawn as its table of blocks
(:func:`redist.picture.table`). Sizes are capped so that the figure stays readable: at most :data:`MAX_PANELS`
panels and :data:`MAX_SIDE` blocks along a side of a panel.

Needs matplotlib (the ``[bench]`` extra), imported when a figure is drawn; the figure is written as PNG or SVG,
after the path's extension.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from redist.errors import ShardingError, shown
from redist.extras import missing_extra
from redist.picture import BlockMap, format_bytes, grid_dims, holders_text, table

if TYPE_CHECKING:  # plan calls this module: a runtime import would be a cycle
    from redist.plan import Plan
    from redist.types import ShardingType

FORMATS = ("png", "svg")
"""The figure formats written, by the path's extension."""
MAX_PANELS = 12
"""The most panels (types) a figure shows: the source and the first steps."""
MAX_SIDE = 16
"""The most blocks drawn along a side of a panel."""
_TABLE_LINES = 18


def plot_plan(plan: Plan, path: str | os.PathLike) -> None:
    """Draw ``plan`` (module docstring) and write the figure to ``path`` (``.png`` or ``.svg``). Raises
    :class:`ShardingError` for another extension or a path that cannot be written, and the ``[bench]`` extra's
    ModuleNotFoundError without matplotlib."""
    if not isinstance(path, (str, os.PathLike)):
        raise ShardingError(f"a figure's path must be a string ending in .png or .svg, got {shown(path)}")
    path = os.fspath(path)
    fmt = path.rpartition(".")[2].lower()
    if fmt not in FORMATS:
        raise ShardingError(f"cannot tell the figure format of {shown(path)}: the path must end in .png or .svg")
    fig = figure(plan)
    try:
        fig.savefig(path, format=fmt, dpi=100)
    except OSError as e:
        raise ShardingError(f"cannot write the figure to {shown(path)}: {e}") from None


def figure(plan: Plan):
    """The figure of ``plan``: a ``matplotlib.figure.Figure`` (no pyplot state is touched)."""
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as e:
        raise missing_extra(e, "redist's figures (Plan.plot, redist plan --plot)", "bench") from e
    panels = list(zip([None, *plan.steps], plan.types, [0, *plan.step_bytes()]))[:MAX_PANELS]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(5.2 * cols, 4.4 * rows), layout="constrained")
    title = f"{plan.src} -> {plan.dst} on mesh {plan.src.mesh or '(no axes)'}"
    if len(plan.types) > MAX_PANELS:
        title += f" (the first {MAX_PANELS} of {len(plan.types)} types)"
    fig.suptitle(title, fontsize=10)
    for k, (step, t, received) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, k + 1)
        head = "source" if step is None else f"step {k}: {step}\nthe busiest device receives {format_bytes(received)}"
        ax.set_title(f"{head}\n{t}  ({format_bytes(t.local_bytes)} per device)", fontsize=8)
        blocks = BlockMap(t)
        if len(blocks.split) <= 2:
            _draw_grid(ax, blocks)
        else:
            _draw_table(ax, blocks)
    return fig


def _drawn_dims(blocks: BlockMap) -> tuple[int | None, int | None]:
    """The dims along the rows and the columns of a panel: those of the text grid, and where that leaves a side
    without a dim, another dim of the array drawn whole (the last one for the columns, the first for the rows)."""
    rows_dim, cols_dim = grid_dims(blocks)
    rest = [i for i in range(blocks.type.rank) if i not in (rows_dim, cols_dim)]
    if rest and cols_dim is None:
        cols_dim = rest.pop()
    if rest and rows_dim is None:
        rows_dim = rest.pop(0)
    return rows_dim, cols_dim


def _extent(t: ShardingType, dim: int | None) -> tuple[int, int, int]:
    """Along ``dim``: the blocks drawn, the elements of a block (padding included, at least 1 so that an empty
    dim still shows) and the dim's size."""
    if dim is None:
        return 1, 1, 1
    return min(t.blocks(dim), MAX_SIDE), max(1, t.local_shape[dim]), t.shape[dim]


def _draw_grid(ax, blocks: BlockMap) -> None:
    """The blocks of a type splitting at most two dims as rectangles over the array's elements along them."""
    from matplotlib.patches import Rectangle

    t = blocks.type
    rows_dim, cols_dim = _drawn_dims(blocks)
    (n_rows, h, rows_size), (n_cols, w, cols_size) = _extent(t, rows_dim), _extent(t, cols_dim)
    cmap = _colours()
    font = 7 if n_rows * n_cols <= 16 else 5
    for r in range(n_rows):
        for c in range(n_cols):
            index = tuple(b for d, b in ((rows_dim, r), (cols_dim, c)) if d in blocks.split)
            colour = cmap[(r * n_cols + c) % len(cmap)]
            x, y = c * w, r * h
            data_w = max(0, min(w, cols_size - x)) if cols_dim is not None else w
            data_h = max(0, min(h, rows_size - y)) if rows_dim is not None else h
            ax.add_patch(Rectangle((x, y), w, h, facecolor="white", edgecolor="grey", hatch="///", linewidth=0.5))
            ax.add_patch(Rectangle((x, y), data_w, data_h, facecolor=colour, edgecolor="black", linewidth=0.8))
            if n_rows * n_cols <= 64:
                ax.text(x + w / 2, y + h / 2, holders_text(blocks, index, 4).replace(",", ", "), ha="center",
                        va="center", fontsize=font, wrap=True)
    ax.set_xlim(0, n_cols * w)
    ax.set_ylim(n_rows * h, 0)
    ax.set_xlabel(_axis_label(blocks, cols_dim, n_cols), fontsize=7)
    ax.set_ylabel(_axis_label(blocks, rows_dim, n_rows), fontsize=7)
    ax.tick_params(labelsize=6)
    others = [str(i) for i in range(t.rank) if i not in (rows_dim, cols_dim)]
    if others:
        ax.text(0.99, 0.01, f"not drawn: dim {', '.join(others)} (whole)", transform=ax.transAxes, ha="right", va="bottom",
                fontsize=6, color="dimgrey")
    if not t.shape or 0 in t.shape:
        ax.text(0.5, 0.02, "no elements" if t.shape else "a scalar", transform=ax.transAxes, ha="center",
                fontsize=6, color="dimgrey")


def _axis_label(blocks: BlockMap, dim: int | None, drawn: int) -> str:
    """What a side of a panel shows: the dim, its axes and blocks, and how many of them are drawn."""
    if dim is None:
        return ""
    t = blocks.type
    if not t.dims[dim]:
        return f"dim {dim}: whole ({t.shape[dim]})"
    label = f"dim {dim} {{{','.join(t.dims[dim])}}}: {t.blocks(dim)} blocks of {t.local_shape[dim]}"
    return label + (f" (the first {drawn} drawn)" if drawn < t.blocks(dim) else "")


def _draw_table(ax, blocks: BlockMap) -> None:
    """A type splitting more than two dims: its table of blocks, as monospace text."""
    lines = table(blocks, _TABLE_LINES)
    ax.axis("off")
    ax.text(0, 1, "\n".join(lines), family="monospace", fontsize=7, va="top", ha="left", transform=ax.transAxes)


def _colours() -> list:
    """Light colours for blocks, one per block cycling (matplotlib's ``Pastel1`` then ``Pastel2``)."""
    from matplotlib import colormaps

    return [*colormaps["Pastel1"].colors, *colormaps["Pastel2"].colors]
