"""``python -m proofs``: run every proof script, print a summary table, exit non-zero on any failure.

Options: ``--quick`` (smaller samples, for a smoke run), ``--workers N`` (default 2).
"""

from __future__ import annotations

import sys
import time


def timing_64() -> dict:
    """verify on rank-4 plans over a 64-device mesh (4x4x2x2): the slowest of several."""
    from redist.errors import ShardingError
    from redist.mesh import Mesh
    from redist.synthesis import synthesize
    from redist.testing import SeededDraw, draw_layout
    from redist.types import ShardingType
    from redist.verify import verify

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
    times, fails = [], []
    for src, dst in pairs:
        try:
            plan = synthesize(src, dst)
        except Exception as e:  # noqa: BLE001
            fails.append(f"synthesize {src} -> {dst}: {e}")
            continue
        v = verify(plan)
        times.append(v.seconds)
        if not v.ok:
            fails.append(f"{src} -> {dst}: {v.reason}")
    return {"plans": len(times), "max_s": max(times), "median_s": sorted(times)[len(times) // 2],
            "failures": fails, "ok": not fails and max(times) <= 5.0}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    workers = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else 2
    from proofs import exhaustive, mutation, step_rules

    t0 = time.perf_counter()
    rows, failures = [], []

    r = step_rules.run()
    sym, conc = r["symbolic"], r["concrete"]
    rows.append(("step rules, symbolic sizes (Z3)", f"{sum(x['ok'] for x in sym)}/{len(sym)} proved",
                 "ok" if all(x["ok"] for x in sym) else "FAIL", sum(x["seconds"] for x in sym)))
    rows.append(("step rules, each synthesized step alone", f"{conc['steps']} steps {conc['by_kind']}",
                 "ok" if not conc["failures"] else "FAIL", conc["seconds"]))
    failures += [f"step rule: {x['rule']}" for x in sym if not x["ok"]] + conc["failures"]
    notes = [f"synthesis error: {e}" for e in conc["synthesis_errors"]]

    ex = exhaustive.run_exhaustive(workers=workers, max_rank=2 if quick else 3)
    rows.append((ex["check"], f"{ex['passed']}/{ex['cases']} pairs proved",
                 "ok" if not ex["failed"] else "FAIL", ex["seconds"]))
    failures += [f["pair"] + ": " + f["error"] for f in ex["failures"]]

    # Pairs that create pending sums (SPEC 3); their proofs enumerate each group sum's contributors (the onto
    # query), so the exhaustive part stops at rank 2 (4,796 pairs; rank 3 has 16,542).
    cr = exhaustive.run_exhaustive(workers=workers, max_rank=1 if quick else 2, creating=True)
    rows.append((cr["check"], f"{cr['passed']}/{cr['cases']} pairs proved",
                 "ok" if not cr["failed"] else "FAIL", cr["seconds"]))
    failures += [f["pair"] + ": " + f["error"] for f in cr["failures"]]

    rc = exhaustive.run_random_creating(n=200 if quick else 2000, workers=workers)
    rows.append((rc["check"], f"{rc['passed']}/{rc['cases']} pairs proved, oracle agrees",
                 "ok" if not rc["failed"] else "FAIL", rc["seconds"]))
    failures += [f["pair"] + ": " + f["error"] for f in rc["failures"]]
    notes.append("random creating plans by shape: " + ", ".join(f"{k} {v}" for k, v in rc["by_shape"].items()))

    rd = exhaustive.run_random(n=1000 if quick else 10_000, workers=workers)
    rows.append((rd["check"], f"{rd['passed']}/{rd['cases']} pairs proved",
                 "ok" if not rd["failed"] else "FAIL", rd["seconds"]))
    failures += [f["pair"] + ": " + f["error"] for f in rd["failures"]]

    un = exhaustive.run_random_uneven(n=300 if quick else 3000, workers=workers)
    rows.append((un["check"], f"{un['passed']}/{un['cases']} pairs proved, oracle agrees",
                 "ok" if not un["failed"] else "FAIL", un["seconds"]))
    failures += [f["pair"] + ": " + f["error"] for f in un["failures"]]
    notes.append("random uneven plans by shape: " + ", ".join(f"{k} {v}" for k, v in un["by_shape"].items())
                 + f"; {un['at_bound']} exchange plans without a reduction receive exactly lower_bound_bytes")

    fx, fr = exhaustive.run_features(workers=workers, n_random=300 if quick else 2000, max_rank=1 if quick else 2)
    for res in (fx, fr):
        rows.append((res["check"], f"{res['passed']}/{res['cases']} pairs proved",
                     "ok" if not res["failed"] else "FAIL", res["seconds"]))
        failures += [f["pair"] + ": " + f["error"] for f in res["failures"]]
        notes.append(f"{res['check'].split(':')[0]} proved by feature: "
                     + ", ".join(f"{k} {v}" for k, v in res["by_feature"].items()))

    mu = mutation.run(n_plans=100 if quick else 300, n_creating=15 if quick else 40)
    notes.append("mutation by operator (killed/mutants, ill-formed): "
                 + ", ".join(f"{k} {v['killed']}/{v['mutants']} ({v['ill_formed']})" for k, v in mu["by_op"].items()))
    notes.append("mutation: uneven plans mutated by shape: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(mu["uneven_plans"].items())))
    rows.append((f"mutation: {mu['plans']} plans, {mu['mutants']} mutants ({mu['ill_formed']} ill-formed)",
                 f"{mu['killed_by_verify']}/{mu['non_equivalent']} non-equivalent killed "
                 f"({100 * mu['kill_rate']:.1f}%), {mu['equivalent_survivors']} equivalent survivors",
                 "ok" if mu["ok"] and mu["kill_rate"] == 1.0 else "FAIL", mu["seconds"]))
    failures += mu["unsound"] + mu["false_alarms"] + mu["undecided"] + mu["no_counterexample"]
    failures += [f"mutation: no uneven plan with {k} was mutated" for k in mu["missing_uneven_kinds"]]
    failures += [f"mutation: no program with {k} was mutated" for k in mu["missing_creating_kinds"]]
    notes.append("mutation: creating instructions in mutated programs: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(mu["creating_instructions"].items())))

    med = rd["median_verify_s"]
    rows.append(("speed: median verify, random 16-device pairs", f"median {med * 1000:.1f} ms, "
                 f"max {rd['max_verify_s'] * 1000:.0f} ms", "ok" if med <= 0.5 else "FAIL", 0.0))
    tm = timing_64()
    rows.append(("speed: rank-4 plans on 4x4x2x2 (64 devices)",
                 f"{tm['plans']} plans, max {tm['max_s'] * 1000:.0f} ms, median {tm['median_s'] * 1000:.0f} ms",
                 "ok" if tm["ok"] else "FAIL", sum([0.0])))
    failures += tm["failures"]
    if med > 0.5:
        failures.append(f"median verify {med:.3f}s > 0.5s")

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
    raise SystemExit(main())
