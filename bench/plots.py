"""Every figure of the benchmarks, drawn from their saved JSON in ``bench/results/`` (no benchmark reruns).

    python bench/plots.py [NAME ...]   # ./dev bench plots; NAME: redistribution, partitioning, synthesis_speed, scale

One figure per question, each a PNG beside its JSON (``NAME.json`` gives ``NAME_FIGURE.png``):

- ``redistribution_bytes``: bytes received against the lower bound, redist and XLA, per case;
- ``redistribution_speedup``: XLA time / redist time per case and topology (modeled at the measured and at
  the large size, and measured on the host devices), as a table of numbers coloured by speedup;
- ``redistribution_memory``: compiled memory (``memory_analysis`` temp + output), redist and XLA;
- ``partitioning_time``: simulated and measured step time, schedules in simulated order, per model;
- ``partitioning_bytes``: collective bytes per device and step, ours and XLA's partitioner;
- ``synthesis_speed_time``: a histogram of synthesis times (even and uneven pairs);
- ``synthesis_speed_bytes``: a histogram of bytes received / lower bound (pairs without a reduction);
- ``scale_time``: median seconds of synthesis, lowering, verification and the lower bound against the device
  count, on log axes (``bench/scale.py``).

Each case is named by its case name and its types (``mesh: src -> dst``) in a column beside the bars. Cases
where redist and XLA are the same (same bytes, same plan, same memory) are left out of a figure and
counted in its title. Tick labels are plain numbers (``2x``, ``100 KiB``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TOPOLOGIES = ("tpu-v4", "nvlink-8", "2x8-nodes", "cpu-host")
OURS, XLA = "#1f77b4", "#ff7f0e"
ROW_IN = 0.24  # inches per case row


def _ratio_axis(ax, axis: str = "x") -> None:
    """Log scale with plain ratio tick labels (0.5x, 1x, 2x, ...)."""
    getattr(ax, f"set_{axis}scale")("log", base=2)
    fmt = FuncFormatter(lambda v, _: f"{v:g}x")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_formatter(fmt)
    target.set_minor_formatter(NullFormatter())


def _case_labels(cases: list[dict]) -> list[str]:
    """``name  mesh  src -> dst`` per case, in columns (padded to one width, for monospace right-aligned labels)."""
    cols = [[c["name"] for c in cases], [c["mesh"] for c in cases], [c["src"] for c in cases],
            [c["dst"] for c in cases]]
    widths = [max(map(len, col), default=0) for col in cols]
    return [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {s:<{widths[2]}} -> {d:<{widths[3]}}" for a, b, s, d in zip(*cols)]


def _case_rows(ax, cases: list[dict]) -> None:
    """Cases top to bottom on the y axis, each named by its case label in monospace (the legend table)."""
    ax.set_yticks(range(len(cases)), _case_labels(cases), fontsize=7, family="monospace")
    ax.set_ylim(len(cases) - 0.5, -0.5)
    ax.tick_params(axis="y", length=0)


# ---------------------------------------------------------------------------------------------- redistribution
def redistribution_bytes(data: dict) -> str:
    cases = data["cases"]
    off = [c for c in cases if c["bytes"]["bound"] and max(c["bytes"]["ours"], c["bytes"]["xla"]) > c["bytes"]["bound"]]
    off.sort(key=lambda c: (-c["bytes"]["xla"] / c["bytes"]["bound"], -c["bytes"]["ours"] / c["bytes"]["bound"]))
    b = data["summary"]["bytes"]
    fig, ax = plt.subplots(figsize=(6, 1.2 + ROW_IN * len(off)))
    y = np.arange(len(off))
    ours = [c["bytes"]["ours"] / c["bytes"]["bound"] for c in off]
    xla = [c["bytes"]["xla"] / c["bytes"]["bound"] for c in off]
    ax.hlines(y, ours, xla, color="0.75", lw=2, zorder=1)
    ax.scatter(xla, y, marker="s", s=30, color=XLA, label="XLA", zorder=2)
    ax.scatter(ours, y, marker="o", s=30, color=OURS, label="redist", zorder=3)
    ax.axvline(1, color="black", lw=0.8)
    _ratio_axis(ax)
    ax.set_xlim(0.85, 10)
    _case_rows(ax, off)
    ax.set_xlabel("bytes received per device / lower bound (1x: at the bound)")
    ax.set_title(f"Bytes received over the lower bound, the {len(off)} cases above it\n"
                 f"at the bound: redist {b['ours_at_bound']}, XLA {b['xla_at_bound']} of {len(cases)} cases; "
                 f"total {b['ours_total'] / 2**20:.1f} MiB vs XLA {b['xla_total'] / 2**20:.1f} MiB "
                 f"(bound {b['bound_total'] / 2**20:.1f} MiB)", fontsize=9, loc="left")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", color="0.9")
    ax.set_axisbelow(True)
    return fig


def _speedup_columns(cases: list[dict]) -> tuple[list[str], np.ndarray]:
    cols, values = [], []
    for key, size in (("modeled", "1 MiB"), ("modeled_large", "256 MiB")):
        for name in TOPOLOGIES:
            cols.append(f"{name}\n{size}")
            values.append([c[key][name]["speedup"] for c in cases])
    if all("measured" in c for c in cases):
        cols.append("measured\n8 host CPUs")
        values.append([c["measured"]["speedup"] for c in cases])
    return cols, np.array(values).T


def redistribution_speedup(data: dict) -> str:
    """A table: one row per case where some modeled speedup is not 1 (redist's plan differs from XLA's),
    one column per topology and size; each cell the speedup, coloured (blue faster, red slower)."""
    cases = data["cases"]
    cols, all_values = _speedup_columns(cases)
    n_modeled = 2 * len(TOPOLOGIES)
    keep = [i for i in range(len(cases)) if np.any(np.abs(all_values[i, :n_modeled] - 1) > 0.005)]
    keep.sort(key=lambda i: -all_values[i, n_modeled - 1])
    rows, values = [cases[i] for i in keep], all_values[keep]
    fig, ax = plt.subplots(figsize=(1.2 + 0.78 * len(cols), 1.6 + ROW_IN * len(rows)))
    logv = np.log2(values)
    lim = max(1.0, float(np.abs(logv).max()))
    im = ax.imshow(logv, cmap="RdBu", norm=TwoSlopeNorm(0, -lim, lim), aspect="auto")
    for (r, k), v in np.ndenumerate(values):
        ax.text(k, r, f"{v:.2f}", ha="center", va="center", fontsize=7,
                color="white" if abs(logv[r, k]) > 0.6 * lim else "black")
    ax.set_xticks(range(len(cols)), cols, fontsize=7)
    ax.xaxis.tick_top()
    _case_rows(ax, rows)
    for x in (n_modeled / 2 - 0.5, n_modeled - 0.5):
        ax.axvline(x, color="white", lw=3)
    summary = data["summary"]
    geo = [summary[key][name]["geomean"] for key in ("modeled", "modeled_large") for name in TOPOLOGIES]
    geo += [summary["measured_host"]["geomean"]] if len(cols) > n_modeled else []
    ax.set_xlabel("geomean over every case that communicates (the benchmark's summary):\n" + ", ".join(
        f"{c.replace(chr(10), ' ')} {g:.2f}x" for c, g in zip(cols, geo)), fontsize=7)
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.02, format=FuncFormatter(lambda v, _: f"{2 ** v:.2g}x"),
                 label="XLA time / redist time")
    ax.set_title(f"Speedup over XLA's resharding: the {len(rows)} cases whose plan differs from XLA's "
                 f"(the other {len(cases) - len(rows)}: 1.00x modeled everywhere)", fontsize=9, loc="left", pad=28)
    return fig


def redistribution_memory(data: dict) -> str:
    """Compiled memory of redist's program and XLA's, per case where they differ, with the difference
    written out (a few cases differ by bytes only, which no bar would show)."""
    cases = data["cases"]
    mem = [c for c in cases if c["memory"]["ours_temp_plus_output"] != c["memory"]["xla_temp_plus_output"]]
    mem.sort(key=lambda c: c["memory"]["ours_temp_plus_output"] - c["memory"]["xla_temp_plus_output"])
    ours = [c["memory"]["ours_temp_plus_output"] / 1024 for c in mem]
    xla = [c["memory"]["xla_temp_plus_output"] / 1024 for c in mem]
    fig, ax = plt.subplots(figsize=(6, 1.4 + ROW_IN * len(mem)))
    y = np.arange(len(mem))
    ax.hlines(y, ours, xla, color="0.75", lw=2, zorder=1)
    ax.scatter(xla, y, marker="s", s=30, color=XLA, label="XLA", zorder=2)
    ax.scatter(ours, y, marker="o", s=30, color=OURS, label="redist", zorder=3)
    for k, (o, x) in enumerate(zip(ours, xla)):
        diff = (o - x) * 1024
        text = f"XLA / redist {x / o:.2f}x" if x / o >= 1.005 else f"redist {diff:+,.0f} B"
        ax.annotate(text, (1.01, k), xycoords=("axes fraction", "data"), va="center", fontsize=7,
                    color="black" if diff < 0 else "#d62728")
    _case_rows(ax, mem)
    ax.set_xlim(0, None)
    ax.set_xlabel("compiled memory, temp + output (KiB, memory_analysis)")
    ax.set_title(f"Compiled memory, the {len(mem)} cases where redist and XLA differ "
                 f"(the other {len(cases) - len(mem)}: equal)", fontsize=9, loc="left")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", color="0.9")
    ax.set_axisbelow(True)
    return fig


# ---------------------------------------------------------------------------------------------- partitioning
def partitioning_time(data: dict) -> str:
    rows = data["cases"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    spearman = data["summary"].get("spearman_sim_vs_measured", {})
    fig, axs = plt.subplots(1, len(models), figsize=(4.2 * len(models), 4), squeeze=False)
    for ax, model in zip(axs[0], models):
        rs = sorted((r for r in rows if r["model"] == model), key=lambda r: r["sim_step_s"])
        x = np.arange(len(rs))
        ax.plot(x, [r["sim_step_s"] * 1e3 for r in rs], "o-", color=OURS, label="simulated (cpu-host)")
        ax.plot(x, [r["time_ours_s"] * 1e3 for r in rs], "s--", color="black", label="measured")
        ax.set_xticks(x, [r["schedule"] for r in rs], rotation=45, ha="right", fontsize=8)
        ax.set_ylim(0, None)
        ax.set_ylabel("step time (ms)")
        rho = f", Spearman {spearman[model]:.2f}" if model in spearman else ""
        ax.set_title(f"{model}{rho}", fontsize=10)
        ax.grid(axis="y", color="0.9")
    axs[0][0].legend(fontsize=8)
    fig.suptitle("Step time of each schedule, simulated and measured (8 host devices, batch=2 x model=4); "
                 "schedules in simulated order", fontsize=10)
    fig.tight_layout()
    return fig


def partitioning_bytes(data: dict) -> str:
    rows = data["cases"]
    fig, ax = plt.subplots(figsize=(7, 1.2 + ROW_IN * len(rows)))
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [r["bytes_ours"] / 1024 for r in rows], 0.4, color=OURS, label="ours")
    ax.barh(y + 0.2, [r["bytes_xla"] / 1024 for r in rows], 0.4, color=XLA, label="XLA's partitioner")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    kib = [r[k] / 1024 for r in rows for k in ("bytes_ours", "bytes_xla") if r[k] > 0]
    if kib and max(kib) / min(kib) < 30:  # an axis of a decade or so: plain numbers at 2, 3 and 5 times 10^k too
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "235" else ""))
    wm, ws = (max(len(r[k]) for r in rows) for k in ("model", "schedule"))
    ax.set_yticks(y, [f"{r['model']:<{wm}}  {r['schedule']:<{ws}}" for r in rows], fontsize=7, family="monospace")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("collective KiB received per device per step (same input and output shardings)")
    ax.set_title(f"Collective bytes, ours vs XLA:\n{sum(r['bytes_ours'] <= r['bytes_xla'] for r in rows)} of "
                 f"{len(rows)} at or below XLA's", fontsize=9, loc="left")
    ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1, 1), ncol=2, frameon=False)
    ax.grid(axis="x", color="0.9")
    ax.set_axisbelow(True)
    return fig


# ---------------------------------------------------------------------------------------------- synthesis
def synthesis_speed(data: dict) -> str:
    series = [("even dims", data["cases"], OURS), ("uneven dims", data.get("uneven_cases", []), XLA)]
    times = [t * 1e3 for _, cs, _ in series for t in (c["seconds"] for c in cs)]
    bins = np.logspace(np.log10(min(times)), np.log10(max(times)), 40)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, cs, color in series:
        if cs:
            ms = [c["seconds"] * 1e3 for c in cs]
            med = float(np.median(ms))
            ax.hist(ms, bins=bins, alpha=0.6, color=color, label=f"{label}: {len(ms)} pairs, median {med:.2f} ms")
            ax.axvline(med, color=color, lw=1.2, ls="--")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("synthesis time per pair (ms, log scale)")
    ax.set_ylabel("pairs")
    ax.set_title(f"Synthesis time over seeded random pairs ({data['summary'].get('machine', '')})", fontsize=9,
                 loc="left")
    ax.legend(fontsize=8)
    return fig


def _partial(type_text: str) -> set[str]:
    """The pending-sum axes of a sharding type's text."""
    m = re.search(r"partial\{([^}]*)\}", type_text)
    return set(m[1].split(",")) if m else set()


def synthesis_bytes(data: dict) -> str:
    """Bytes over the bound for the pairs without a reduction (same partial axes on both sides), as the
    benchmark's summary counts them: a pair whose bound is 0 and receives nothing is at the bound."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, cs, color in (("even dims", data["cases"], OURS), ("uneven dims", data.get("uneven_cases", []), XLA)):
        kept = [c for c in cs if _partial(c["src"]) == _partial(c["dst"])]
        if not kept:
            continue
        at = sum(c["bytes_received"] == c["lower_bound"] for c in kept)
        ratios = [c["bytes_received"] / c["lower_bound"] for c in kept if c["lower_bound"]]
        ratios += [1.0] * sum(not c["lower_bound"] for c in kept)
        ax.hist(ratios, bins=np.linspace(1, max(3.0, max(ratios)), 41), alpha=0.6, color=color,
                label=f"{label}: {at} of {len(kept)} at the bound")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xlabel("bytes received / lower bound (pairs without a reduction; 1x: at the bound)")
    ax.set_ylabel("pairs (log scale)")
    ax.set_title("Plan quality over seeded random pairs", fontsize=9, loc="left")
    ax.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------------------------------------- scale
def _plain_log_axes(ax) -> None:
    """Log scales on both axes with plain number tick labels (``1000``, ``0.01``)."""
    for axis in (ax.xaxis, ax.yaxis):
        getattr(ax, f"set_{axis.axis_name}scale")("log")
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}" if v >= 1 else f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def scale_time(data: dict) -> str:
    """Median seconds of each phase against the device count (random groups, joined in device order), and
    synthesis + lowering of each named pair (crosses), on log axes."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = sorted((s for s in data["summaries"] if not s["named"]), key=lambda s: s["devices"])
    for phase, style in (("synthesize_s", "o-"), ("lowering_s", "s-"), ("verify_s", "^-"), ("lower_bound_s", "d--")):
        pts = [(s["devices"], s[phase]["median"]) for s in groups if s[phase] and s[phase]["median"] > 0]
        if pts:
            ax.plot(*zip(*pts), style, label=f"{phase[:-2].replace('_', ' ')} (median)")
    named = [s for s in data["summaries"] if s["named"] and s["plan_and_lower_max_s"]]
    ax.plot([s["devices"] for s in named], [s["plan_and_lower_max_s"] for s in named], "kx",
            label="named pairs: synthesize + lower")
    _plain_log_axes(ax)
    ax.set_xlabel("devices (log scale)")
    ax.set_ylabel("seconds (log scale)")
    ax.set_title(f"Scale: random pairs per mesh, {data['pairs_per_random_group']} each; medians", fontsize=9,
                 loc="left")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


FIGURES = {  # benchmark: {figure: how to draw it from the benchmark's JSON}
    "redistribution": {"bytes": redistribution_bytes, "speedup": redistribution_speedup,
                       "memory": redistribution_memory},
    "partitioning": {"time": partitioning_time, "bytes": partitioning_bytes},
    "synthesis_speed": {"time": synthesis_speed, "bytes": synthesis_bytes},
    "scale": {"time": scale_time},
}


def draw(name: str, path: str | None = None) -> list[str]:
    """Draw every figure of benchmark ``name`` from its JSON at ``path`` (default ``results/{name}.json``),
    each into ``{path without .json}_{figure}.png`` beside it; returns their paths."""
    path = path or os.path.join(RESULTS, f"{name}.json")
    with open(path) as f:
        data = json.load(f)
    out = []
    for figure, plot in FIGURES[name].items():
        fig = plot(data)
        out.append(f"{os.path.splitext(path)[0]}_{figure}.png")
        fig.savefig(out[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to draw (default: all): {', '.join(FIGURES)}")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in FIGURES]
    if unknown:
        ap.error(f"unknown benchmark {unknown[0]!r}; the benchmarks with figures are {', '.join(FIGURES)}")
    for name in args.names or FIGURES:
        if not os.path.exists(os.path.join(RESULTS, f"{name}.json")):
            print(f"{name}: no results/{name}.json yet (run ./dev bench {name})")
            continue
        for path in draw(name):
            print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
