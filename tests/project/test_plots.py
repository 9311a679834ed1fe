"""bench/plots.py draws every figure from the saved JSON: plain tick labels (no ``6x10^0`` mathtext) and no
data drawn outside its axes (the old speedup plot clipped its tallest bars)."""

import os
import shutil

import matplotlib
import pytest
from matplotlib.collections import PathCollection

from bench import plots

matplotlib.use("Agg")


def _figures():
    for name, figures in plots.FIGURES.items():
        path = os.path.join(plots.RESULTS, f"{name}.json")
        for figure in figures:
            yield pytest.param(name, figure, path, id=f"{name}_{figure}")


def _inside(values, lo_hi) -> bool:
    lo, hi = sorted(lo_hi)
    return all(lo <= v <= hi for v in values)


@pytest.mark.parametrize("name, figure, path", list(_figures()))
def test_figure_is_readable(name, figure, path):
    import json

    with open(path) as f:
        fig = plots.FIGURES[name][figure](json.load(f))
    fig.canvas.draw()
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels()]
        assert not any("$" in t or "^" in t for t in labels), labels
        if ax.get_label() == "<colorbar>":
            continue
        for patch in ax.patches:  # bars
            x0, y0, w, h = patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()
            if w and h:  # an empty histogram bin is no bar
                assert _inside([x0 + w], ax.get_xlim()) and _inside([y0 + h], ax.get_ylim()), (figure, patch)
        for coll in ax.collections:
            if isinstance(coll, PathCollection):  # scatter points
                offsets = coll.get_offsets()
                assert _inside(offsets[:, 0], ax.get_xlim()) and _inside(offsets[:, 1], ax.get_ylim()), figure
    matplotlib.pyplot.close(fig)


def test_draw_writes_every_figure_beside_the_json(tmp_path):
    for name in plots.FIGURES:
        path = tmp_path / f"{name}.json"
        shutil.copy(os.path.join(plots.RESULTS, f"{name}.json"), path)
        written = plots.draw(name, str(path))
        assert written == [str(tmp_path / f"{name}_{f}.png") for f in plots.FIGURES[name]]
        for png in written:
            with open(png, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"
