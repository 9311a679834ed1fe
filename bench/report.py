"""The benchmarks page, docs/benchmarks.md, written from the saved results in ``bench/results/`` (no benchmark reruns).

    python bench/report.py           # ./dev bench report: rewrite docs/benchmarks.md
    python bench/report.py --check   # exit 1 if the page is not what the results give

One section per benchmark: the command that writes its JSON, the method (the JSON's own ``method`` or
``timing`` where it records one, else the docstring of the script that wrote it), the machine and load as
the JSON records them, its summary, a table per case and the figures ``bench/plots.py`` draws beside it.
The page is committed, so that it reads on any Markdown viewer and its links work from a clean clone;
tests/project/test_docs.py fails when a result changes and the page was not written again.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Callable

BENCH = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(BENCH, "results")
PAGE = os.path.join(os.path.dirname(BENCH), "docs", "benchmarks.md")
FIGURES = "../bench/results"  # the figures, relative to the page
# Fields shown apart from a summary table: the machine, the method and the load.
APART = re.compile(r"machine|method|timing|load_average.*|cpus|cores|python")


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict], object]


@dataclass(frozen=True)
class Benchmark:
    """One results file: what wrote it, where its summary and its cases are, which columns a case shows."""

    title: str
    json: str
    script: str
    command: str
    summary: Callable[[dict], dict] = lambda d: d.get("summary", {})
    cases: Callable[[dict], list] = lambda d: []
    columns: tuple[Column, ...] = ()
    extra: Callable[[dict], list[str]] = lambda d: []
    figures: tuple[str, ...] = field(default=())


def fmt(value) -> str:
    """A cell: numbers to 3 significant digits, lists joined, nothing as a dash."""
    if value is None or value == [] or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return f"{value:g}"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return out + ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]


def flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    """``a.b.c -> value`` for every leaf of a nested summary, the fields shown apart left out."""
    out: list[tuple[str, object]] = []
    for key, value in d.items():
        if APART.fullmatch(key) or (isinstance(value, str) and len(value) > 120):
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += flatten(value, name + ".")
        else:
            out.append((name, value))
    return out


def _found(d: dict, pattern: re.Pattern) -> dict:
    """Every field of ``d`` (nested in dicts) whose name matches ``pattern``."""
    out = {}
    for key, value in d.items():
        if pattern.fullmatch(key):
            out[key] = value
        elif isinstance(value, dict):
            out.update(_found(value, pattern))
    return out


def method(data: dict, script: str) -> list[str]:
    """The method: the JSON's own record of it, else the docstring of the script that wrote it."""
    recorded = _found(data, re.compile(r"method|timing"))
    if any(isinstance(v, str) and len(v) > 40 for v in recorded.values()):
        text = next(v for v in recorded.values() if isinstance(v, str) and len(v) > 40)
        source = "as recorded in the JSON"
    else:
        with open(os.path.join(BENCH, script), encoding="utf-8") as f:
            text = ast.get_docstring(ast.parse(f.read())) or ""
        source = f"from the docstring of `bench/{script}`"
    text = re.sub(r":\w+:`~?([^`]+)`", r"``\1``", text)
    quoted = ["> " + line if line.strip() else ">" for line in text.strip().split("\n")]
    return [f"**Method** ({source}):", ""] + quoted


def machine(data: dict) -> str:
    found = _found(data, APART)
    parts = [f"{k.replace('_', ' ')}: {fmt(v)}" for k, v in found.items()
             if not re.fullmatch(r"method|timing", k) and not isinstance(v, dict)]
    parts += [f"load average {k}: {fmt(v)}" for k, v in found.items() if isinstance(v, dict) and "load" in k
              for k, v in v.items()]
    return "**Machine** (as recorded in the JSON): " + ("; ".join(parts) if parts else "not recorded") + "."


def section(b: Benchmark) -> list[str]:
    with open(os.path.join(RESULTS, b.json), encoding="utf-8") as f:
        data = json.load(f)
    out = [f"## {b.title}", "", f"`{b.command}` writes `bench/results/{b.json}`.", "", machine(data), ""]
    out += method(data, b.script) + [""]
    summary = flatten(b.summary(data))
    if summary:
        out += ["### Summary", ""] + table(["figure", "value"], [[f"`{k}`", v] for k, v in summary]) + [""]
    out += b.extra(data)
    cases = b.cases(data)
    if cases:
        out += ["### Cases", ""] + table([c.header for c in b.columns],
                                         [[c.value(case) for c in b.columns] for case in cases]) + [""]
    for name in b.figures:
        out += [f"![{name}]({FIGURES}/{name}.png)", ""]
    return out


def col(header: str, path: str, scale: float = 1.0) -> Column:
    """A column read at a dotted path of a case, multiplied by ``scale`` (seconds shown as ms: 1e3)."""
    def value(case):
        v = case
        for key in path.split("."):
            v = v.get(key) if isinstance(v, dict) else None
        return v * scale if isinstance(v, (int, float)) and not isinstance(v, bool) and scale != 1.0 else v
    return Column(header, value)


def ratio(header: str, num: str, den: str) -> Column:
    def value(case):
        a, b = col("", num).value(case), col("", den).value(case)
        return a / b if a is not None and b else None
    return Column(header, value)


def _mpi_datatypes(ranks: int) -> Benchmark:
    out = f"bench/results/mpi_datatypes_n{ranks}.json"
    return Benchmark(
        f"MPI derived datatypes, {ranks} ranks", f"mpi_datatypes_n{ranks}.json", "mpi_datatypes.py",
        f".venv/bin/mpiexec -n {ranks} .venv/bin/python bench/mpi_datatypes.py --out {out}",
        summary=lambda d: {"strided_run_min": d["strided_run_min"]},
        cases=lambda d: d["rows"],
        columns=(col("case", "case"), col("run bytes", "run_bytes"), col("src", "src"), col("dst", "dst"),
                 col("ranks", "ranks"), col("MiB", "mib"), col("packed ms", "packed.min_s", 1e3),
                 col("in place ms", "in_place.min_s", 1e3), col("in place / packed", "in_place.over_packed")))


def _partitioning(title: str, name: str, command: str) -> Benchmark:
    return Benchmark(
        title, f"{name}.json", "partitioning.py", command, cases=lambda d: d["cases"],
        columns=(col("model", "model"), col("schedule", "schedule"), col("exact", "match"),
                 col("bytes ours", "bytes_ours"), col("bytes XLA", "bytes_xla"), col("bytes ratio", "bytes_ratio"),
                 col("simulated ms", "sim_step_s", 1e3), col("measured ms", "time_ours_s", 1e3),
                 col("XLA ms", "time_xla_s", 1e3), col("simulated peak", "sim_peak_bytes"),
                 col("memory error", "mem_err_vs_ours")),
        figures=(f"{name}_time", f"{name}_bytes"))


def _scale_targets(d: dict) -> list[str]:
    return ["### Targets", ""] + table(["target", "measured", "met"],
                                       [[t["target"], t["measured"], t["met"]] for t in d["targets"]]) + [""]


def _search_scale_named(d: dict) -> list[str]:
    rows = [[n["name"], n["devices"], n["src"], n["dst"], n["synthesize_s"] * 1e3, n["states"], len(n["steps"])]
            for n in d["named"]]
    return ["### Named pairs", ""] + table(["pair", "devices", "src", "dst", "synthesis ms", "states", "steps"],
                                           rows) + [""]


def _zoo_auto(d: dict) -> list[str]:
    rows = [[a["model"], a["ops"], a["budget_s"], a["lower_s"], a["search_s"], a["evaluations"], a["stopped"],
             a["pipelines_tried"], a["pipelines_left"], a["met"]] for a in d["auto"]]
    return (["### AutomaticPartition against its time budget", ""]
            + table(["model", "ops", "budget s", "pf.lower s", "search s", "evaluations", "search stopped by",
                     "pipelines tried", "left", "within budget + 10%"], rows) + [""]) if rows else []


def _ci_runs(d: dict) -> list[dict]:
    """One row per CI run: each pass's test count and pytest duration (the suite, then the lowest JAX)."""
    rows = []
    for r in d["runs"]:
        suite, second = (r["passes"] + [{}, {}])[:2]
        rows.append({"date": r["date"], "commit": (r["commit"] or "")[:10] or None,
                     "suite_tests": suite.get("counts", {}).get("passed"), "suite_s": suite.get("seconds"),
                     "second_tests": second.get("counts", {}).get("passed"), "second_s": second.get("seconds"),
                     "total_s": r["total_s"], "load": r["load_average_at_start"], "ok": r["returncode"] == 0,
                     "note": r.get("note")})
    return rows


_CROSS_MESH_JAX = (col("case", "name"), col("src", "src"), col("dst", "dst"), col("steps", "steps"),
                   col("bytes received", "bytes_received"), col("bound", "lower_bound_bytes"),
                   col("peak bytes", "peak_bytes"), col("max(src, dst)", "memory_bound_bytes"),
                   col("reshard ms", "min_s.redist", 1e3), col("device_put / reshard", "paired_over_redist.device_put"),
                   col("gather-scatter / reshard", "paired_over_redist.gather_scatter"),
                   col("device_put via host", "device_put_through_host"),
                   Column("correct", lambda r: all(r["correct"].values())))


def _cross_mesh(d: dict) -> list[str]:
    """bench/cross_mesh.py's tables: JAX on 8 host devices, MPI's cases at 8 ranks, the permute at 4."""
    out = []
    if d.get("jax"):
        out += ["### JAX, 8 host CPU devices: against `jax.device_put` and gather-then-scatter", ""] + table(
            [c.header for c in _CROSS_MESH_JAX], [[c.value(r) for c in _CROSS_MESH_JAX] for r in d["jax"]]) + [""]
    if d.get("mpi"):
        rows = [[r["name"], r["min_s"]["redist"] * 1e3, r["min_s"]["hand"] * 1e3, r["redist_over"]["hand"],
                 all(r["correct"].values())] for r in d["mpi"]]
        out += ["### MPI, 8 ranks: against hand-written `Isend`/`Irecv`", ""] + table(
            ["case", "reshard ms", "hand-written ms", "reshard / hand-written (within-round median)", "correct"],
            rows) + [""]
    if d.get("permute"):
        rows = [[r["mib"], r["min_s"]["redist"] * 1e3, r["min_s"]["sendrecv"] * 1e3, r["min_s"]["isend"] * 1e3,
                 r["redist_over"]["sendrecv"], r["redist_over"]["isend"], all(r["correct"].values())]
                for r in d["permute"]]
        out += ["### MPI, 4 ranks: a block swap against hand-written `Sendrecv` and `Isend`/`Irecv`", ""] + table(
            ["MiB/rank", "reshard ms", "Sendrecv ms", "Isend/Irecv ms", "reshard / Sendrecv",
             "reshard / Isend-Irecv", "correct"], rows) + [""]
    return out


_PIPELINE_AUTO = (col("budget", "budget"), col("budget B", "budget_bytes"), col("mesh", "mesh"),
                  Column("chosen tactics", lambda r: " ".join(r["code"].split())), col("fits", "fits"), col("pipelined", "pipelined"),
                  col("exact", "exact"), col("simulated ms", "search_sim_step_s", 1e3),
                  col("simulated peak", "search_sim_peak_bytes"), col("measured ms", "time_auto_s", 1e3),
                  col("best expert that fits", "expert"), col("its simulated peak", "expert_sim_peak_bytes"),
                  col("its measured ms", "time_expert_s", 1e3), col("auto / expert", "auto_over_expert"),
                  col("best SPMD-only that fits", "spmd_only"), col("its ms (expert run)", "spmd_only_recorded_ms"))


def _pipeline_auto(d: dict) -> list[str]:
    """bench/pipeline.py's part auto: AutomaticPartition, with its pipeline actions, against the expert cases."""
    if "auto" not in d:
        return []
    return (["### Automatic partitioning with pipeline actions (`--part auto`)", "",
             "`AutomaticPartition` per mesh and memory budget, its measured time interleaved with that of the "
             "best expert case that fits the budget; a search that fits nothing shows the smallest peak it found.",
             ""] + table([c.header for c in _PIPELINE_AUTO], [[c.value(r) for c in _PIPELINE_AUTO]
                                                              for r in d["auto"]["cases"]]) + [""])


BENCHMARKS = (
    Benchmark("Synthesis speed and plan quality", "synthesis_speed.json", "synthesis_speed.py",
              "./dev bench synthesis_speed", figures=("synthesis_speed_time", "synthesis_speed_bytes")),
    Benchmark("Search on large meshes", "search_scale.json", "search_scale.py", "./dev bench search_scale",
              summary=lambda d: {"peak_rss_mb": d["peak_rss_mb"], "seed": d["seed"]},
              cases=lambda d: [dict(m["summary"], mesh=name, devices=m["devices"]) for name, m in d["meshes"].items()],
              columns=(col("mesh", "mesh"), col("devices", "devices"), col("pairs", "pairs"),
                       col("synthesis median ms", "synthesize_median_ms"), col("p99 ms", "synthesize_p99_ms"),
                       col("max ms", "synthesize_max_ms"), col("states max", "states_max"),
                       col("without reduction", "without_reduction"), col("at the bound", "at_bound"),
                       col("bytes/bound geomean", "ratio_geomean"), col("max", "ratio_max")),
              extra=_search_scale_named),
    Benchmark("Scale: 8 to 65,536 devices", "scale.json", "scale.py", "./dev bench scale",
              summary=lambda d: {"growth_exponents": d["growth_exponents"], "seed": d["seed"],
                                 "pairs_per_random_group": d["pairs_per_random_group"]},
              cases=lambda d: d["summaries"],
              columns=(col("group", "label"), col("devices", "devices"), col("pairs", "pairs"),
                       col("synthesis median ms", "synthesize_s.median", 1e3), col("max ms", "synthesize_s.max", 1e3),
                       col("lowering median ms", "lowering_s.median", 1e3),
                       col("verify median s", "verify_s.median"), col("verify max s", "verify_s.max"),
                       col("proved", "verify.proved"), col("undecided", "verify.undecided"),
                       col("bytes/bound max, no reduction", "ratio_max_no_reduction"), col("peak MB", "rss_verify_mb")),
              extra=_scale_targets, figures=("scale_time",)),
    Benchmark("Verification deadline on 65,536 devices", "verify_deadline.json", "verify_deadline.py",
              "./dev bench verify_deadline", summary=lambda d: {"mesh": d["mesh"]}, cases=lambda d: d["rows"],
              columns=(col("case", "case"), col("instructions", "instructions"), col("timeout s", "timeout_s"),
                       col("build s", "build_s"), col("wall s", "wall_s"), col("status", "status"),
                       col("peak MB", "rss_peak_mb"))),
    Benchmark("Against XLA's resharding", "redistribution.json", "redistribution.py", "./dev bench redistribution",
              cases=lambda d: d["cases"],
              columns=(col("case", "name"), col("mesh", "mesh"), col("src", "src"), col("dst", "dst"),
                       col("plan", "plan"), col("bytes ours", "bytes.ours"), col("bytes XLA", "bytes.xla"),
                       col("bound", "bytes.bound"), col("measured XLA / ours", "measured.speedup")),
              figures=("redistribution_bytes", "redistribution_memory", "redistribution_speedup")),
    Benchmark("`redist.jax.reshard` against `jax.jit`", "jax_reshard.json", "jax_reshard.py",
              "./dev bench jax_reshard", cases=lambda d: d["pairs"],
              columns=(col("pair", "name"), col("leaves", "leaves"), col("route", "routes"),
                       col("warm / jit", "warm.ratio_vs_jit"), col("first call / jit", "first.ratio_vs_jit"),
                       col("second call / warm", "second.ratio_vs_warm"), col("bytes ours", "bytes_received.ours"),
                       col("bytes jit", "bytes_received.jit")),
              figures=("jax_reshard",)),
    Benchmark('`redist.execute(..., backend="jax")`: first and later calls', "execute_jax.json", "execute_jax.py",
              "./dev bench execute_jax", cases=lambda d: d["cases"],
              columns=(col("case", "name"), col("mesh", "mesh"), col("src", "src"), col("dst", "dst"),
                       col("steps", "steps"), col("first call s", "first_s"),
                       col("later calls ms (median)", "later_median_s", 1e3),
                       col("numpy ms (median)", "numpy_median_s", 1e3), col("first / later", "first_over_later"))),
    Benchmark("MPI at scale", "mpi.json", "mpi.py", "./dev bench mpi",
              summary=lambda d: dict(d["summary"], rounds_per_job=d["repeats"], jobs=d["jobs"]),
              cases=lambda d: d["cases"],
              columns=(col("case", "name"), col("ranks", "ranks"), col("MiB/rank", "mib"),
                       ratio("reshard / hand-written", "min_s.redist", "min_s.hand"),
                       col("within-round median", "paired_over_hand.redist"),
                       ratio("reshard / XLA replay", "min_s.redist", "min_s.xla"),
                       col("reshard ms", "min_s.redist", 1e3), col("first call extra ms", "first_call_extra_s", 1e3)),
              figures=("mpi",)),
    Benchmark("Across meshes: JAX and MPI", "cross_mesh.json", "cross_mesh.py", "./dev bench cross_mesh",
              summary=lambda d: dict(d["summary"], shape=d["shape"], rounds=d["rounds"]), extra=_cross_mesh),
    _mpi_datatypes(2),
    _mpi_datatypes(4),
    _partitioning("Partitioning against XLA's partitioner", "partitioning", "./dev bench partitioning"),
    _partitioning("Partitioning scanned models", "partitioning_scanned",
                  "./dev bench partitioning --models scanned_mlp,scanned_transformer "
                  "--out bench/results/partitioning_scanned.json"),
    Benchmark("The model zoo against `jax.jit`", "zoo.json", "zoo.py", "./dev bench zoo",
              cases=lambda d: d["cases"],
              columns=(col("model", "model"), col("schedule", "schedule"), col("exact", "match"),
                       col("bytes ours", "bytes_ours"), col("bytes XLA", "bytes_xla"),
                       col("bytes ratio", "bytes_ratio"), col("collectives ours", "collectives_ours"),
                       col("collectives XLA", "collectives_xla"),
                       col("ours ms", "time_ours_s", 1e3), col("XLA ms", "time_xla_s", 1e3),
                       col("time ratio", "time_ratio"), col("its quartiles", "time_ratio_quartiles"),
                       col("program ratio", "program_ratio")),
              extra=_zoo_auto),
    Benchmark("Pipeline parallelism", "pipeline.json", "pipeline.py", "./dev bench pipeline",
              summary=lambda d: dict(d["summary"], **({"auto": d["auto"]["summary"]} if "auto" in d else {})),
              extra=_pipeline_auto, cases=lambda d: d["cases"],
              columns=(col("case", "case"), col("exact", "exact"), col("simulated ms", "sim_step_s", 1e3),
                       col("bubble", "sim_bubble"), col("formula", "bubble_formula"),
                       col("measured ms", "time_ours_s", 1e3), col("XLA ms", "time_xla_s", 1e3),
                       col("simulated peak", "sim_peak_bytes"), col("compiled peak", "mem_ours"),
                       col("XLA peak", "mem_xla"), col("stacked layers B/device", "stacked_bytes_per_device"))),
    Benchmark("Automatic partitioning against the expert presets", "autopartition.json", "autopartition.py",
              "./dev bench autopartition", cases=lambda d: d["rows"],
              columns=(col("model", "model"), col("mesh", "mesh"), col("budget", "budget_fraction"),
                       col("best preset", "best_preset"), col("preset ms", "best_preset_time_s", 1e3),
                       col("auto ms", "auto.step_time_s", 1e3), col("auto / best", "auto_vs_best"),
                       col("evaluations", "auto.evaluations"), col("search s", "auto.search_s"))),
    Benchmark("Automatic partitioning on 1,024 devices", "autopartition_meshes.json", "autopartition_meshes.py",
              "./dev bench autopartition_meshes",
              summary=lambda d: {"time_budget_s": d["time_budget_s"], "seed": d["seed"], "size": d["size"]},
              cases=lambda d: d["rows"],
              columns=(col("model", "model"), col("mesh", "mesh"), col("devices", "devices"),
                       col("evaluations", "evaluations"), col("per s", "evals_per_s"), col("stopped", "stopped"),
                       col("search s", "search_s"), col("synthesis s", "synthesize_s"),
                       col("step ms", "step_time_s", 1e3))),
    Benchmark("CI: the test suite from a clean clone", "ci_times.json", "ci_times.py", "./dev bench ci_times",
              summary=lambda d: {}, cases=_ci_runs,
              columns=(col("date", "date"), col("commit", "commit"), col("suite tests", "suite_tests"),
                       col("suite s", "suite_s"), col("JAX-lowest tests", "second_tests"),
                       col("JAX-lowest s", "second_s"), col("total s", "total_s"), col("load at start", "load"),
                       col("passed", "ok"), col("note", "note"))),
)


def render() -> str:
    out = ["# Benchmarks", "",
           "Written by `bench/report.py` from `bench/results/*.json` (`./dev bench report`); do not edit by hand. "
           "Each section names the command that measures it, its method and the machine it ran on; the "
           "figures are drawn by `./dev bench plots`. Times depend on the machine and its load, which each "
           "section records: compare ratios within a section, not seconds across sections.", ""]
    for b in BENCHMARKS:
        out += section(b)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    page = render()
    if argv == ["--check"]:
        with open(PAGE, encoding="utf-8") as f:
            return 0 if f.read() == page else 1
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
