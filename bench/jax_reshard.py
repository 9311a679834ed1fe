"""``redist.jax.reshard`` as a drop-in for ``jax.device_put``: time and memory against XLA's own resharding.

The reference is XLA's device-side resharding, ``jax.jit(lambda a: a, out_shardings=dst)`` (a fresh ``jit``
object per pair, so every first call compiles). ``jax.device_put(x, dst)`` is measured too, for information:
on host CPU devices it copies through host memory (no compile, no collectives), so it is no reference for
device-side speed here.

Pairs (``PAIRS``): each a mesh of 8 host CPU devices and one array, or a pytree of them, of about 1 MiB
in all: gathers, slices, all-to-alls (f32 and bf16), jax-ml/jax#21562, FSDP -> Megatron, swaps of two
axes, a reorder within a dim, a pair that needs sub-axes, and two pytrees (a layer of mixed shardings, and a
101-leaf parameter tree).

Per pair, measured identically on both sides (``reshard(x, dst)``, the public call with all its Python work,
against ``f(x)``):

- warm: ``--rounds`` rounds after two warm-up calls each; in every round each program runs once, in the
  next of all the orders of the programs (interleaved, so that load from other jobs falls on all of them
  alike, and each program follows each other equally often: a rotation of one order would always run ours
  right after ``device_put``'s host copies); each call is timed with ``time.perf_counter`` around the call
  and ``jax.block_until_ready``. Medians are compared.
- first call: on ``--first`` new pairs (the pair with dim 0 grown by a few blocks, so that no cache of ours
  or JAX's holds it): synthesis, tracing, compile and run, ours and jit's alternately first. The median of
  the per-shape ratios is the pair's ratio.
- second call: after clearing redist's caches, one first call, then a call on new arrays of the same types
  (median of ``--second`` such rounds), against the warm median; the same for a new ``jit`` object (its
  first call compiles, or finds JAX's cache), for comparison: a second call right after a compile is slower
  than the median of warm calls on either side.
- memory: ``compiled.memory_analysis()`` of both programs (``redist.jax.lower`` gives ours), as the bytes
  held per device during the call, ``argument + output + temp - alias``, without and with donation; the
  type-level bound ``max(src, dst)`` (local bytes, summed over leaves) next to them.
- bytes received per device, read from both compiled HLOs (``redist.hlo.parse_hlo``).

The machine's load average is recorded before and after (``os.getloadavg``); on a shared machine the figures
carry that noise. Outputs: a table on stdout (a progress bar on stderr while running, on a terminal),
``bench/results/jax_reshard.json`` and ``bench/results/jax_reshard.png``.

    python bench/jax_reshard.py [--rounds 42] [--first 5] [--second 5] [--only NAME ...] [--no-progress]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import redist.jax as rj  # noqa: E402
from bench import progress  # noqa: E402
from redist import hlo, jax_programs  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")


# ---------------------------------------------------------------------------------------------- pairs
@dataclass(frozen=True)
class Leaf:
    """One array of a pair: its shape at 1 MiB in all (``dim 0`` is scaled), dtype, source and target specs."""

    shape: tuple[int, ...]
    dtype: object
    src: P
    dst: P


@dataclass(frozen=True)
class Pair:
    name: str
    family: str
    mesh: tuple[tuple[int, ...], tuple[str, ...]]
    leaves: dict[str, Leaf] | Leaf  # a single array, or a flat pytree (dict) of them


M8 = ((8,), ("x",))
M24 = ((2, 4), ("x", "y"))
M42 = ((4, 2), ("x", "y"))
DM = ((2, 4), ("data", "model"))  # data x model, as FSDP and Megatron name them
FSDP = P(("data", "model"))


def _layer() -> dict[str, Leaf]:
    """One transformer layer's parameters, stored FSDP (dim 0 over every device), wanted Megatron (attention
    and MLP column- then row-split on model), with norms and biases replicated or split on model."""
    return {"wqkv": Leaf((256, 768), np.float32, FSDP, P(None, "model")),
            "wo": Leaf((256, 256), np.float32, FSDP, P("model", None)),
            "w1": Leaf((256, 512), np.float32, FSDP, P(None, "model")),
            "w2": Leaf((512, 256), np.float32, FSDP, P("model", None)),
            "b1": Leaf((512,), np.float32, FSDP, P("model")),
            "norm": Leaf((256,), np.float32, FSDP, P())}


def _params101() -> dict[str, Leaf]:
    """A 101-leaf parameter tree (25 blocks of 4 leaves and an embedding), FSDP -> Megatron, 16-64 KiB a leaf."""
    out = {"embed": Leaf((512, 64), np.float32, FSDP, P(None, "model"))}
    for i in range(25):
        out[f"block{i:02d}/w_in"] = Leaf((64, 128), np.float32, FSDP, P(None, "model"))
        out[f"block{i:02d}/w_out"] = Leaf((128, 64), np.float32, FSDP, P("model", None))
        out[f"block{i:02d}/bias"] = Leaf((128,), np.float32, FSDP, P("model"))
        out[f"block{i:02d}/norm"] = Leaf((64,), np.float32, FSDP, P())
    return out


PAIRS = [
    Pair("gather-1d", "gather", M8, Leaf((262144,), np.float32, P("x"), P())),
    Pair("gather-2d", "gather", M24, Leaf((512, 512), np.float32, P("x", "y"), P(None, "y"))),
    Pair("slice-1d", "slice", M8, Leaf((512, 512), np.float32, P(), P(None, "x"))),
    Pair("slice-2d", "slice", M24, Leaf((512, 512), np.float32, P(None, "y"), P("x", "y"))),
    Pair("all-to-all", "all-to-all", M8, Leaf((512, 512), np.float32, P("x"), P(None, "x"))),
    Pair("all-to-all-bf16", "all-to-all", M24, Leaf((1024, 512), jnp.bfloat16, P("y", "x"), P("x", "y"))),
    Pair("jax#21562", "21562", M42, Leaf((64, 64, 64), np.float32, P("y", None, "x"), P(None, ("x", "y"), None))),
    Pair("fsdp-megatron", "fsdp-megatron", DM, Leaf((512, 512), np.float32, FSDP, P(None, "model"))),
    Pair("swap", "swap", M24, Leaf((512, 512), np.float32, P("x", "y"), P("y", "x"))),
    Pair("reorder", "swap", M24, Leaf((262144,), np.float32, P(("x", "y")), P(("y", "x")))),
    Pair("sub-axes", "sub-axes", M24, Leaf((262144,), np.float32, P("x"), P("y"))),
    Pair("pytree-layer", "pytree", DM, _layer()),
    Pair("pytree-101", "pytree", DM, _params101()),
]


def _mesh(pair: Pair) -> jax.sharding.Mesh:
    shape, names = pair.mesh
    return jax.sharding.Mesh(np.array(jax.devices()[: math.prod(shape)]).reshape(shape), names)


def _leaves(pair: Pair) -> dict[str, Leaf]:
    return pair.leaves if isinstance(pair.leaves, dict) else {"": pair.leaves}


def _grown(pair: Pair, mesh, k: int) -> Pair:
    """The pair with dim 0 of every leaf grown by ``k`` blocks of its source and target layouts (a new
    shape for every ``k``; ``k = 0`` is the pair)."""
    def grow(leaf: Leaf) -> Leaf:
        src, dst = (rj.sharding_type(leaf.shape, leaf.dtype, NamedSharding(mesh, s)) for s in (leaf.src, leaf.dst))
        unit = math.lcm(src.blocks(0), dst.blocks(0))
        return Leaf((leaf.shape[0] + k * unit,) + leaf.shape[1:], leaf.dtype, leaf.src, leaf.dst)

    leaves = {n: grow(leaf) for n, leaf in _leaves(pair).items()}
    return Pair(pair.name, pair.family, pair.mesh, leaves if isinstance(pair.leaves, dict) else leaves[""])


def _arrays(pair: Pair, mesh, seed: int):
    """``(x, dst)``: the pair's input, placed once from host data (set-up only), and its target shardings."""
    rng = np.random.default_rng(seed)

    def make(leaf: Leaf):
        host = rng.standard_normal(leaf.shape).astype(leaf.dtype)
        return jax.device_put(host, NamedSharding(mesh, leaf.src))

    leaves = _leaves(pair)
    xs = {n: make(leaf) for n, leaf in leaves.items()}
    dsts = {n: NamedSharding(mesh, leaf.dst) for n, leaf in leaves.items()}
    if not isinstance(pair.leaves, dict):
        return xs[""], dsts[""]
    return xs, dsts


def _identity(x):
    return x


# ---------------------------------------------------------------------------------------------- measuring
def _timed(fn, x) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(x))
    return time.perf_counter() - t0


def _interleaved(fns: dict, x, rounds: int) -> dict[str, list[float]]:
    """Each function ``rounds`` times after two warm-up calls; each round runs them all, in the next of all
    their orders (so that each follows each other equally often)."""
    names = list(fns)
    orders = list(itertools.permutations(names))
    for name in names:
        for _ in range(2):
            jax.block_until_ready(fns[name](x))
    times = {n: [] for n in names}
    for r in range(rounds):
        for name in orders[r % len(orders)]:
            times[name].append(_timed(fns[name], x))
    return times


def _held(compiled) -> dict:
    ma = compiled.memory_analysis()
    arg, out, temp, alias = (int(v) for v in (ma.argument_size_in_bytes, ma.output_size_in_bytes,
                                              ma.temp_size_in_bytes, ma.alias_size_in_bytes))
    return {"argument": arg, "output": out, "temp": temp, "alias": alias, "held": arg + out + temp - alias}


def _received(compiled, mesh) -> float:
    collectives = hlo.parse_hlo(compiled.as_text(), rj.redist_mesh(mesh))
    if not collectives:
        return 0.0
    return float(np.sum([c.device_bytes for c in collectives], axis=0).max())


def measure(pair: Pair, rounds: int, first: int, second: int, log) -> dict:
    mesh = _mesh(pair)
    x, dst = _arrays(pair, mesh, seed=0)
    jit = jax.jit(_identity, out_shardings=dst)
    row: dict = {"name": pair.name, "family": pair.family, "leaves": len(_leaves(pair)),
                 "mesh": dict(zip(pair.mesh[1], pair.mesh[0]))}

    # first calls on new shapes, ours and jit's alternately first
    firsts = []
    for k in range(1, first + 1):
        grown = _grown(pair, mesh, k)
        xk, dk = _arrays(grown, mesh, seed=k)
        runs = {"ours": lambda v, d=dk: rj.reshard(v, d), "jit": jax.jit(_identity, out_shardings=dk),
                "device_put": lambda v, d=dk: jax.device_put(v, d)}
        order = list(runs) if k % 2 else list(runs)[::-1]
        firsts.append({name: _timed(runs[name], xk) for name in order})
    row["first"] = {name: statistics.median(f[name] for f in firsts) for name in ("ours", "jit", "device_put")}
    row["first"]["ratio_vs_jit"] = statistics.median(f["ours"] / f["jit"] for f in firsts)
    row["first"]["ratio_vs_device_put"] = statistics.median(f["ours"] / f["device_put"] for f in firsts)

    # second call: new arrays of the same types right after a first call, ours and a new jit's alternately first
    seconds = {"ours": [], "jit": []}
    for s in range(second):
        jax_programs.clear_cache()
        runs = {"ours": lambda v: rj.reshard(v, dst), "jit": jax.jit(_identity, out_shardings=dst)}
        for name in (("ours", "jit") if s % 2 else ("jit", "ours")):
            x1, _ = _arrays(pair, mesh, seed=100 + s)
            x2, _ = _arrays(pair, mesh, seed=200 + s)
            _timed(runs[name], x1)
            seconds[name].append(_timed(runs[name], x2))

    # warm, interleaved
    times = _interleaved({"ours": lambda v: rj.reshard(v, dst), "jit": jit,
                          "device_put": lambda v: jax.device_put(v, dst)}, x, rounds)
    warm = {name: statistics.median(t) for name, t in times.items()}
    row["warm"] = dict(warm, ratio_vs_jit=warm["ours"] / warm["jit"],
                       ratio_vs_device_put=warm["ours"] / warm["device_put"],
                       min_ratio_vs_jit=min(times["ours"]) / min(times["jit"]))
    second_median = {name: statistics.median(t) for name, t in seconds.items()}
    row["second"] = {"median": second_median["ours"], "ratio_vs_warm": second_median["ours"] / warm["ours"],
                     "jit_median": second_median["jit"], "jit_ratio_vs_warm": second_median["jit"] / warm["jit"]}

    # correctness of all three against the host values
    want = jax.tree.map(np.asarray, x)
    for name, fn in (("ours", lambda v: rj.reshard(v, dst)), ("jit", jit)):
        got = fn(x)
        assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), b), got, want)), name
        assert jax.tree.all(jax.tree.map(lambda a, d: a.sharding.is_equivalent_to(d, a.ndim), got, dst)), name

    # memory and bytes, without and with donation
    ours_c = rj.lower(x, dst).compile()
    jit_c = jit.lower(x).compile()
    row["memory"] = {"ours": _held(ours_c), "jit": _held(jit_c),
                     "ours_donated": _held(rj.lower(x, dst, donate=True).compile()),
                     "jit_donated": _held(jax.jit(_identity, out_shardings=dst, donate_argnums=0).lower(x).compile())}
    srcs = {n: rj.sharding_type(leaf.shape, leaf.dtype, NamedSharding(mesh, leaf.src))
            for n, leaf in _leaves(pair).items()}
    dsts = {n: rj.sharding_type(leaf.shape, leaf.dtype, NamedSharding(mesh, leaf.dst))
            for n, leaf in _leaves(pair).items()}
    row["memory"]["max_src_dst"] = sum(max(srcs[n].local_bytes, dsts[n].local_bytes) for n in srcs)
    row["memory"]["src_plus_dst"] = sum(srcs[n].local_bytes + dsts[n].local_bytes for n in srcs)
    row["bytes_received"] = {"ours": _received(ours_c, mesh), "jit": _received(jit_c, mesh)}
    moves = [jax_programs.move(leaf.shape, leaf.dtype, NamedSharding(mesh, leaf.src), NamedSharding(mesh, leaf.dst))
             for leaf in _leaves(pair).values()]
    row["routes"] = sorted({m.route for m in moves})
    row["plan"] = [str(s) for s in moves[0].plan.steps] if len(moves) == 1 else f"{len(moves)} leaves"
    log(f"{pair.name}: warm {row['warm']['ratio_vs_jit']:.2f}x jit, first {row['first']['ratio_vs_jit']:.2f}x, "
        f"second/warm {row['second']['ratio_vs_warm']:.2f}")
    return row


# ---------------------------------------------------------------------------------------------- report
def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(rows: list[dict]) -> dict:
    warm = [r["warm"]["ratio_vs_jit"] for r in rows]
    first = [r["first"]["ratio_vs_jit"] for r in rows]
    return {
        "pairs": len(rows),
        "warm_vs_jit": {"geomean": geomean(warm), "max": max(warm), "worst": rows[warm.index(max(warm))]["name"],
                        "over_1.25": [r["name"] for r in rows if r["warm"]["ratio_vs_jit"] > 1.25]},
        "warm_vs_device_put_geomean": geomean(r["warm"]["ratio_vs_device_put"] for r in rows),
        "first_vs_jit": {"median": statistics.median(first), "max": max(first),
                         "worst": rows[first.index(max(first))]["name"]},
        "first_vs_device_put_median": statistics.median(r["first"]["ratio_vs_device_put"] for r in rows),
        "second_vs_warm": {"median": statistics.median(r["second"]["ratio_vs_warm"] for r in rows),
                           "max": max(r["second"]["ratio_vs_warm"] for r in rows),
                           "jit_median": statistics.median(r["second"]["jit_ratio_vs_warm"] for r in rows),
                           "jit_max": max(r["second"]["jit_ratio_vs_warm"] for r in rows)},
        "memory": {
            "ours_less": [r["name"] for r in rows if r["memory"]["ours"]["held"] < r["memory"]["jit"]["held"]],
            "ours_more": [r["name"] for r in rows if r["memory"]["ours"]["held"] > r["memory"]["jit"]["held"]],
            "donated_over_max_src_dst": {r["name"]: r["memory"]["ours_donated"]["held"] / r["memory"]["max_src_dst"]
                                         for r in rows},
            "donated_over_jit_donated": {r["name"]: r["memory"]["ours_donated"]["held"]
                                         / r["memory"]["jit_donated"]["held"] for r in rows},
        },
    }


def print_table(rows: list[dict]) -> None:
    head = (f"{'pair':<16}{'route':>8}{'warm us':>9}{'jit us':>8}{'w/jit':>7}{'w/dput':>7}{'1st ms':>8}"
            f"{'jit ms':>8}{'1/jit':>7}{'2nd/w':>7}{'held KiB':>9}{'jit KiB':>8}{'don KiB':>8}{'max KiB':>8}"
            f"{'recv KiB':>9}{'jit KiB':>8}")
    print(head)
    for r in rows:
        m, b = r["memory"], r["bytes_received"]
        print(f"{r['name']:<16}{'+'.join(r['routes']):>8}{r['warm']['ours'] * 1e6:>9.0f}{r['warm']['jit'] * 1e6:>8.0f}"
              f"{r['warm']['ratio_vs_jit']:>7.2f}{r['warm']['ratio_vs_device_put']:>7.2f}"
              f"{r['first']['ours'] * 1e3:>8.1f}{r['first']['jit'] * 1e3:>8.1f}{r['first']['ratio_vs_jit']:>7.2f}"
              f"{r['second']['ratio_vs_warm']:>7.2f}{m['ours']['held'] / 1024:>9.0f}{m['jit']['held'] / 1024:>8.0f}"
              f"{m['ours_donated']['held'] / 1024:>8.0f}{m['max_src_dst'] / 1024:>8.0f}"
              f"{b['ours'] / 1024:>9.0f}{b['jit'] / 1024:>8.0f}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    panels = [
        (axes[0], [r["warm"]["ratio_vs_jit"] for r in rows], [r["warm"]["ratio_vs_device_put"] for r in rows],
         "warm time / jit's", (1.0, 1.25)),
        (axes[1], [r["first"]["ratio_vs_jit"] for r in rows], [r["first"]["ratio_vs_device_put"] for r in rows],
         "first-call time / jit's", (2.0,)),
        (axes[2], [r["memory"]["ours"]["held"] / r["memory"]["jit"]["held"] for r in rows],
         [r["memory"]["ours_donated"]["held"] / r["memory"]["jit_donated"]["held"] for r in rows],
         "bytes held per device / jit's", (1.0,)),
    ]
    for ax, main, info, title, lines in panels:
        ax.bar(x - 0.2, main, 0.4, label="redist.jax.reshard vs jit(out_shardings)")
        ax.bar(x + 0.2, info, 0.4, label="vs device_put" if "memory" not in title and "held" not in title
               else "donated, vs jit donated", alpha=0.6)
        for y in lines:
            ax.axhline(y, color="grey", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xticks(x, names, rotation=70, fontsize=7, ha="right")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle("redist.jax.reshard against XLA's resharding (jax.jit(lambda a: a, out_shardings=dst)), "
                 "8 host CPU devices")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=42, help="interleaved warm rounds per pair (default 42: each "
                    "of the 6 orders of the 3 programs 7 times)")
    ap.add_argument("--first", type=int, default=5, help="new shapes per pair for first calls (default 5)")
    ap.add_argument("--second", type=int, default=5, help="first+second call rounds per pair (default 5)")
    ap.add_argument("--only", nargs="*", help="run only these pairs (names)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "jax_reshard.json"))
    progress.add_option(ap)
    args = ap.parse_args(argv)
    logging.getLogger("jax").setLevel(logging.ERROR)
    if len(jax.devices()) < 8:
        raise SystemExit("needs 8 JAX devices")
    pairs = [p for p in PAIRS if not args.only or p.name in args.only]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    rows = []
    for pair in progress.bar(pairs, desc="pairs", unit="pair", shown=not args.no_progress):
        rows.append(measure(pair, args.rounds, args.first, args.second, progress.write))
    load_after = os.getloadavg()
    summary = summarize(rows)
    summary["load_average"] = {"before": load_before, "after": load_after}
    summary["seconds"] = time.perf_counter() - t0
    summary["machine"] = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                          f"jax {jax.__version__}, 8 host CPU devices, shared with other jobs")
    summary["settings"] = {"rounds": args.rounds, "first": args.first, "second": args.second}
    print_table(rows)
    w, f = summary["warm_vs_jit"], summary["first_vs_jit"]
    print(f"\nwarm / jit: geomean {w['geomean']:.3f}, max {w['max']:.2f} ({w['worst']}); over 1.25: "
          f"{w['over_1.25'] or 'none'}; warm / device_put geomean {summary['warm_vs_device_put_geomean']:.2f}")
    print(f"first call / jit: median {f['median']:.2f}, max {f['max']:.2f} ({f['worst']}); / device_put median "
          f"{summary['first_vs_device_put_median']:.2f}; second call / warm: median "
          f"{summary['second_vs_warm']['median']:.2f}, max {summary['second_vs_warm']['max']:.2f} (jit's: median "
          f"{summary['second_vs_warm']['jit_median']:.2f}, max {summary['second_vs_warm']['jit_max']:.2f})")
    print(f"memory held: ours less in {summary['memory']['ours_less']}, "
          f"more in {summary['memory']['ours_more'] or 'none'}")
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}; {summary['seconds']:.0f} s")
    os.makedirs(RESULTS, exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"summary": summary, "pairs": rows}, fh, indent=1, default=float)
    plot(rows, os.path.splitext(args.out)[0] + ".png")
    print(f"wrote {os.path.relpath(args.out)} and {os.path.relpath(os.path.splitext(args.out)[0] + '.png')}")
    return summary


if __name__ == "__main__":
    main()
