"""``python -m proofs [PART ...] [--quick] [--workers N]``: run the proof scripts (all parts, or those named),
with a progress bar per part on stderr; print a summary table; exit 1 on any failure, 2 on a usage error.

Parts, in the order they run: ``step_rules`` (the typing rules, with symbolic sizes, and each synthesized step
alone), ``exhaustive`` (every whole-axis pair on meshes of up to 8 devices), ``creating`` (pairs that create
pending sums: exhaustive to rank 2, and random ones), ``random`` (random pairs on 16-device meshes, and the median
verify time), ``uneven`` (random pairs with uneven dims), ``features`` (reduction kinds, device orders and complex
dtypes: exhaustive small pairs and random ones), ``mutation`` (mutants of lowered programs, transfers between
meshes included, and claims must be refuted), ``speed64`` (rank-4 plans on a 64-device mesh), ``sequences`` (plans
of random step sequences through the typing rules, not synthesized: proved exactly where the numpy backend runs
them right, and their mutants never proved where it does not), ``cross_mesh`` (random pairs across meshes: proved,
run exactly on numpy, within each device's memory bound, at the lower bound without pending values), ``probe`` (the
adversarial probe of :mod:`proofs.probe`: hostile text, plan files, claims, threads, JAX misuse, command lines,
resource bombs and an MPI failure; a row per category) and ``partitioned`` (mutants of partitioned programs and of
the registry are never proved unless equivalent).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, NamedTuple


class Outcome(NamedTuple):
    """What one part reports: summary rows ``(check, result, "ok" | "FAIL", seconds)``, failures, notes."""

    rows: list
    failures: list
    notes: list


def step_rules(quick: bool, workers: int) -> Outcome:
    from proofs import step_rules as rules

    r = rules.run()
    sym, conc = r["symbolic"], r["concrete"]
    rows = [("step rules, symbolic sizes (Z3)", f"{sum(x['ok'] for x in sym)}/{len(sym)} proved",
             "ok" if all(x["ok"] for x in sym) else "FAIL", sum(x["seconds"] for x in sym)),
            ("step rules, each synthesized step alone", f"{conc['steps']} steps {conc['by_kind']}",
             "ok" if not conc["failures"] else "FAIL", conc["seconds"])]
    failures = [f"step rule: {x['rule']}" for x in sym if not x["ok"]] + conc["failures"]
    return Outcome(rows, failures, [f"synthesis error: {e}" for e in conc["synthesis_errors"]])


def _pairs_outcome(res: dict, result: str) -> Outcome:
    return Outcome([(res["check"], f"{res['passed']}/{res['cases']} {result}", "ok" if not res["failed"] else "FAIL",
                     res["seconds"])], [f["pair"] + ": " + f["error"] for f in res["failures"]], [])


def exhaustive(quick: bool, workers: int) -> Outcome:
    from proofs import exhaustive as ex

    return _pairs_outcome(ex.run_exhaustive(workers=workers, max_rank=2 if quick else 3), "pairs proved")


def random_pairs(quick: bool, workers: int) -> Outcome:
    from proofs import exhaustive as ex

    rd = ex.run_random(n=1000 if quick else 10_000, workers=workers)
    out = _pairs_outcome(rd, "pairs proved")
    med = rd["median_verify_s"]
    out.rows.append(("speed: median verify, random 16-device pairs", f"median {med * 1000:.1f} ms, "
                     f"max {rd['max_verify_s'] * 1000:.0f} ms", "ok" if med <= 0.5 else "FAIL", 0.0))
    if med > 0.5:
        out.failures.append(f"median verify {med:.3f}s > 0.5s")
    return out


def uneven(quick: bool, workers: int) -> Outcome:
    from proofs import exhaustive as ex

    un = ex.run_random_uneven(n=300 if quick else 3000, workers=workers)
    out = _pairs_outcome(un, "pairs proved, oracle agrees")
    out.notes.append("random uneven plans by shape: " + ", ".join(f"{k} {v}" for k, v in un["by_shape"].items())
                     + f"; {un['at_bound']} exchange plans without a reduction receive exactly lower_bound_bytes")
    return out


def creating(quick: bool, workers: int) -> Outcome:
    """Pairs that create pending sums (docs/spec.md §3). Their proofs enumerate each group sum's contributors (the
    onto query), so the exhaustive part stops at rank 2 (4,796 pairs; rank 3 has 16,542)."""
    from proofs import exhaustive as ex

    out = _pairs_outcome(ex.run_exhaustive(workers=workers, max_rank=1 if quick else 2, creating=True),
                         "pairs proved")
    rc = ex.run_random_creating(n=200 if quick else 2000, workers=workers)
    rand = _pairs_outcome(rc, "pairs proved, oracle agrees")
    notes = ["random creating plans by shape: " + ", ".join(f"{k} {v}" for k, v in rc["by_shape"].items())]
    return Outcome(out.rows + rand.rows, out.failures + rand.failures, notes)


def features(quick: bool, workers: int) -> Outcome:
    """Reduction kinds, device orders and complex dtypes: exhaustive small pairs and random ones."""
    from proofs import exhaustive as ex

    fx, fr = ex.run_features(workers=workers, n_random=300 if quick else 2000, max_rank=1 if quick else 2)
    outs = [_pairs_outcome(res, "pairs proved") for res in (fx, fr)]
    notes = [f"{res['check'].split(':')[0]} proved by feature: "
             + ", ".join(f"{k} {v}" for k, v in res["by_feature"].items()) for res in (fx, fr)]
    return Outcome(outs[0].rows + outs[1].rows, outs[0].failures + outs[1].failures, notes)


def mutation(quick: bool, workers: int) -> Outcome:
    from proofs import mutation as mut

    mu = mut.run(n_plans=100 if quick else 300, n_creating=15 if quick else 40, n_cross=10 if quick else 40)
    notes = ["mutation by operator (killed/mutants, ill-formed): "
             + ", ".join(f"{k} {v['killed']}/{v['mutants']} ({v['ill_formed']})" for k, v in mu["by_op"].items()),
             "mutation: uneven plans mutated by shape: "
             + ", ".join(f"{k} {v}" for k, v in sorted(mu["uneven_plans"].items())),
             "mutation: creating instructions in mutated programs: "
             + ", ".join(f"{k} {v}" for k, v in sorted(mu["creating_instructions"].items()))]
    rows = [(f"mutation: {mu['plans']} plans ({mu['cross_mesh_plans']} across meshes), {mu['mutants']} mutants "
             f"({mu['ill_formed']} ill-formed)",
             f"{mu['killed_by_verify']}/{mu['non_equivalent']} non-equivalent killed "
             f"({100 * mu['kill_rate']:.1f}%), {mu['equivalent_survivors']} equivalent survivors",
             "ok" if mu["ok"] and mu["kill_rate"] == 1.0 else "FAIL", mu["seconds"])]
    failures = mu["unsound"] + mu["false_alarms"] + mu["undecided"] + mu["no_counterexample"]
    failures += [f"mutation: no uneven plan with {k} was mutated" for k in mu["missing_uneven_kinds"]]
    failures += [f"mutation: no program with {k} was mutated" for k in mu["missing_creating_kinds"]]
    return Outcome(rows, failures, notes)


def partitioned(quick: bool, workers: int) -> Outcome:
    from partir_core.proof import lemmas
    from proofs import partitioned_mutation as pm
    t = time.perf_counter()
    obligations = dict(r for lemma in lemmas.OBLIGATIONS for r in lemmas.results(lemma))
    r = pm.run()
    rows = [("local-form lemmas, symbolic sizes (Z3)", f"{sum(obligations.values())}/{len(obligations)} proved",
             "ok" if all(obligations.values()) else "FAIL", time.perf_counter() - t - r["seconds"]),
            (f"partitioned programs: {r['mutants']} mutants", f"{pm.killed(r)} killed (refuted or not lowered), "
             f"{len(r['survivors'])} equivalent survivors (confirmed by running), {len(r['unrefuted'])} not "
             f"killed", "ok" if r["ok"] else "FAIL", r["seconds"])]
    notes = ["partitioned mutants by operator (killed/mutants): " + ", ".join(
        f"{op} {s['refuted'] + s['not lowered']}/{s['mutants']}" for op, s in r["by_operator"].items())]
    return Outcome(rows, r["failures"] + r["unrefuted"] + [f"lemma: {o}" for o, ok in obligations.items() if not ok],
                   notes)


def speed64(quick: bool, workers: int) -> Outcome:
    """verify on rank-4 plans over a 64-device mesh (4x4x2x2): the slowest of several must take <= 5 s."""
    from proofs.common import progress
    from redist.errors import ShardingError
    from redist.mesh import Mesh
    from redist.synthesis import synthesize
    from redist.testing import SeededDraw, draw_layout
    from redist.types import ShardingType
    from redist.verify import verify

    t0 = time.perf_counter()
    mesh = Mesh({"a": 4, "b": 4, "c": 2, "d": 2})
    T = lambda s: ShardingType.parse(s, mesh)  # noqa: E731
    cases = [("f32[64{a}, 32{b}, 16{c}, 8{d}]", "f32[64{d,c}, 32{a}, 16, 8{b}]"),
             ("f32[64{a,b}, 32, 16{c}, 8] partial{d}", "f32[64{c}, 32{b,a}, 16, 8{d}]"),
             ("f32[64{a}, 32{b}, 16{c}, 8{d}]", "f32[64{b}, 32{a}, 16{d}, 8{c}]"),
             ("f32[64, 32, 16, 8] partial{a,b,c,d}", "f32[64{b}, 32{a}, 16{d}, 8{c}]")]
    pairs = [(T(a), T(b)) for a, b in cases]
    draw = SeededDraw(7)
    while len(pairs) < 12:
        d1, p1 = draw_layout(draw, mesh, 4, sub_axes=0.3)
        d2, _ = draw_layout(draw, mesh, 4, partial=False, sub_axes=0.3)
        shape = (64, 32, 16, 16)
        try:
            pairs.append((ShardingType(mesh, shape, "f32", d1, p1), ShardingType(mesh, shape, "f32", d2, ())))
        except ShardingError:  # sub-axes of one axis factored differently on the two sides
            continue
    times, failures = [], []
    for src, dst in progress(pairs, desc="speed, 64 devices", unit="plan"):
        try:
            plan = synthesize(src, dst)
        except Exception as e:  # noqa: BLE001
            failures.append(f"synthesize {src} -> {dst}: {e}")
            continue
        v = verify(plan)
        times.append(v.seconds)
        if not v.ok:
            failures.append(f"{src} -> {dst}: {v.reason}")
    worst, median = max(times, default=0.0), sorted(times)[len(times) // 2] if times else 0.0
    ok = not failures and worst <= 5.0
    return Outcome([("speed: rank-4 plans on 4x4x2x2 (64 devices)",
                     f"{len(times)} plans, max {worst * 1000:.0f} ms, median {median * 1000:.0f} ms",
                     "ok" if ok else "FAIL", time.perf_counter() - t0)], failures, [])


def sequences(quick: bool, workers: int) -> Outcome:
    from proofs import step_sequences as seq

    res = seq.run(n=300 if quick else 2000)
    ok = not res["failures"] and set(res["outcomes"]) == {"proved"}
    rows = [(f"sequences: {res['plans']} plans of random steps (not synthesized), meshes <= 8 devices",
             f"{res['outcomes'].get('proved', 0)}/{res['plans']} proved, numpy agrees; mutants sound",
             "ok" if ok else "FAIL", res["seconds"])]
    notes = ["sequences: steps " + ", ".join(f"{k} {v}" for k, v in sorted(res["steps"].items())),
             "sequences: plans by feature " + ", ".join(f"{k} {v}" for k, v in sorted(res["features"].items()))]
    return Outcome(rows, res["failures"], notes)


def cross_mesh(quick: bool, workers: int) -> Outcome:
    """Random pairs across meshes (:mod:`proofs.cross_mesh`), with the count per relation of the two meshes and
    the verify time per plan."""
    from proofs import cross_mesh as cm

    res = cm.run(n=300 if quick else 2000, workers=workers)
    out = _pairs_outcome(res, "pairs proved, numpy exact, memory bounded")
    out.rows.append(("speed: verify per plan across meshes", f"median {res['median_verify_s'] * 1000:.0f} ms, max "
                     f"{res['max_verify_s'] * 1000:.0f} ms", "ok", 0.0))
    by_relation = ", ".join(f"{k} {v}" for k, v in res["by_relation"].items())
    out.notes.append(f"cross mesh: proved pairs by relation: {by_relation}; {res['at_bound']} without pending values "
                     "receive exactly lower_bound_bytes")
    return out


def probe(quick: bool, workers: int) -> Outcome:
    """The adversarial probe (:mod:`proofs.probe`), seed 0: a row per category."""
    from proofs import probe as adversarial

    tallies = adversarial.run(quick=quick)
    rows = [(f"probe: {t.name}", f"{t.passed}/{t.tried} inputs passed", "ok" if not t.failures else "FAIL", t.seconds)
            for t in tallies]
    notes = [f"probe: {t.name}: " + ", ".join(f"{k} {v}" for k, v in sorted(t.outcomes.items(), key=lambda kv: -kv[1]))
             for t in tallies]
    notes += [f"probe: {n}" for t in tallies for n in t.notes]
    notes += [f"probe: {t.name}: largest {measure} {value:.3g}" for t in tallies
              for measure, (value, _) in t.peaks.items()]
    return Outcome(rows, [f"probe {t.name}: {f}" for t in tallies for f in t.failures], notes)


PARTS: dict[str, Callable[[bool, int], Outcome]] = {
    "step_rules": step_rules, "exhaustive": exhaustive, "creating": creating, "random": random_pairs,
    "uneven": uneven, "features": features, "mutation": mutation, "speed64": speed64, "sequences": sequences,
    "cross_mesh": cross_mesh, "probe": probe, "partitioned": partitioned,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m proofs", description=__doc__.split("\n\n")[1],
                                     epilog="The full run takes tens of minutes on 2 cores (the partitioned programs' "
                                            "mutants and the probe most of them); --quick a few.")
    parser.add_argument("parts", nargs="*", metavar="PART",
                        help=f"parts to run (default: all): {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="smaller samples, for a smoke run")
    parser.add_argument("--workers", type=int, default=2, metavar="N", help="processes for the pair checks (2)")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}; the parts are {', '.join(PARTS)}")
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    t0 = time.perf_counter()
    rows, failures, notes = [], [], []
    for name in [p for p in PARTS if p in args.parts or not args.parts]:
        out = PARTS[name](args.quick, args.workers)
        rows += out.rows
        failures += out.failures
        notes += out.notes
    w = max(len(r[0]) for r in rows)
    print(f"{'check':<{w}}  {'result':<60} {'status':<6} {'time':>8}")
    for name, res, status, secs in rows:
        print(f"{name:<{w}}  {res:<60} {status:<6} {secs:>7.1f}s")
    print(f"total {time.perf_counter() - t0:.1f}s")
    for n in notes:
        print("note:", n)
    for f in failures[:50]:
        print("FAILURE:", f)
    return 1 if failures or any(r[2] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
