"""Each step kind's typing rule, proved sound against its buffer-level semantics.

Part 1 — symbolic sizes (Z3, nonlinear integer arithmetic). The typing rules of :mod:`redist.steps` act at
the minor end of a dim's axis list. In block terms (docs/spec.md §2, row-major block index): a dim whose axes are a
prefix ``P`` (``p`` blocks, the device's block ``bP``) followed by a suffix ``A`` (group size ``k``, the device's
rank ``a`` in its A-group) has block ``bP·k + a`` (lemma ``concat``). Each rule then reads: type before and
after, as (block, local size) of the dims the step touches, and the instruction's semantics as in
:mod:`redist.program`; the proof obligation is that the element the instruction puts at every local index
is the one the type after assigns there, and that every index read is in bounds. Sizes ``p, k, L`` are
symbolic positive integers (no upper bound needed); ``div``/``mod`` by a symbolic size are written with their
defining constraints ``x = q·m + r, 0 ≤ r < m``.

Part 2 — the same rules as the synthesizer implements them: every step of the plans for a seeded sample
of pairs (meshes ≤ 16 devices, sub-axes, partial types) is lowered alone (``lower``) and proved by
:func:`redist.verify.verify_program` to turn its input type into ``step.apply(input)``; its byte count
(``step.bytes_received``) must equal what the verifier derives from the instruction.
"""

from __future__ import annotations

import time

import z3

from proofs.common import progress
from redist.lowering import lower


def _prove(name, hyps, goal, timeout_ms=20_000) -> dict:
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*hyps)
    s.add(z3.Not(goal))
    t = time.perf_counter()
    r = s.check()
    return {"rule": name, "ok": r == z3.unsat, "result": str(r), "seconds": time.perf_counter() - t}


def _pos(*xs):
    return [x >= 1 for x in xs]


def _in(x, n):
    return z3.And(x >= 0, x < n)


def _divmod(x, m, tag):
    q, r = z3.Ints(f"{tag}_q {tag}_r")
    return q, r, [x == q * m + r, _in(r, m)]


def symbolic_rules() -> list[dict]:
    """Each rule's proof obligation ``(name, hypotheses, goal)``, proved in turn (a progress bar on stderr)."""
    p, k, k1, k2, L, La, Lb, bP, a, r, i = z3.Ints("p k k1 k2 L La Lb bP a r i")
    obligations = []

    # lemma concat: the row-major block over P + (A1, A2) is bP·k + rank(A1, A2); ranks are a bijection
    u, v, u2, v2 = z3.Ints("u v u2 v2")
    hyps = _pos(p, k1, k2) + [_in(bP, p), _in(u, k1), _in(v, k2), _in(u2, k1), _in(v2, k2)]
    obligations.append(("concat: block(P+A) = block(P)·k + rank(A)", hyps,
                        (bP * k1 + u) * k2 + v == bP * (k1 * k2) + (u * k2 + v)))
    obligations.append(("rank over (A1, A2) is injective", hyps,
                        z3.Implies(u * k2 + v == u2 * k2 + v2, z3.And(u == u2, v == v2))))
    obligations.append(("rank over (A1, A2) is in [0, k1·k2)", hyps, _in(u * k2 + v, k1 * k2)))

    # lemma sub-axes: splitting an axis of size S = s1·s2·s3 into (1)s1, (s1)s2, (s1·s2)s3 gives coordinates
    # (c div (s2·s3)) mod s1, (c div s3) mod s2, c mod s3 whose row-major block is c itself.
    s1, s2, s3, c = z3.Ints("s1 s2 s3 c")
    q1, m1, d1 = _divmod(c, s2 * s3, "c23")
    q2, m2, d2 = _divmod(c, s3, "c3")
    q3, m3, d3 = _divmod(q2, s2, "c3_2")
    hyps = _pos(s1, s2, s3) + [_in(c, s1 * s2 * s3)] + d1 + d2 + d3
    obligations.append(("sub-axes (1)s1,(s1)s2,(s1·s2)s3 of an axis: block = coordinate", hyps,
                        z3.And(_in(q1, s1), (q1 * s2 + m3) * s3 + m2 == c)))

    # all_slice(dim, A): before (bP, Lb = k·La); after (bP·k + r, La); Slice keeps x[r·La : (r+1)·La]
    hyps = _pos(p, k, La) + [_in(bP, p), _in(r, k), _in(i, La)]
    ib = i + r * La
    obligations.append(("all_slice: value and bounds", hyps,
                        z3.And(_in(ib, k * La), bP * (k * La) + ib == (bP * k + r) * La + i)))

    # all_gather(dim, A): before (bP·k + a, L); after (bP, k·L); AllGather concatenates in rank order:
    # output index i comes from the member of rank i div L, at index i mod L.
    j, m, dm = _divmod(i, L, "ag")
    hyps = _pos(p, k, L) + [_in(bP, p), _in(i, k * L)] + dm
    obligations.append(("all_gather: value, source rank and bounds", hyps,
                        z3.And(_in(j, k), _in(m, L), (bP * k + j) * L + m == bP * (k * L) + i)))

    # all_to_all(d1 -> d2, A): before d1 (bP1·k + a, L1), d2 (bP2, L2 = k·C); after d1 (bP1, k·L1),
    # d2 (bP2·k + r, C). The lowered all-to-all sends chunk j of d2 to rank j and puts the sender's rank
    # at the major end of d1: output (i1, i2) came from the sender of rank i1 div L1, at index
    # (i1 mod L1, i2 + r·C).
    bP1, bP2, p1, p2, L1, C, i1, i2 = z3.Ints("bP1 bP2 p1 p2 L1 C i1 i2")
    j, m, dm = _divmod(i1, L1, "a2a")
    hyps = _pos(p1, p2, k, L1, C) + [_in(bP1, p1), _in(bP2, p2), _in(r, k), _in(i1, k * L1), _in(i2, C)] + dm
    obligations.append(("all_to_all: value on both dims and bounds", hyps, z3.And(
        _in(j, k), _in(m, L1), _in(i2 + r * C, k * C),
        (bP1 * k + j) * L1 + m == bP1 * (k * L1) + i1,
        bP2 * (k * C) + i2 + r * C == (bP2 * k + r) * C + i2)))

    # reduce_scatter(dim, A): before partial over A, dim (bP, k·La); after dim (bP·k + r, La), not partial
    # over A. Output i = sum over members j in [0, k) of x_j[i + r·La]; member j has A-coordinate j (its
    # summand), so the contributors are one summand per A-coordinate (j ↦ j), all at the same global index.
    jj = z3.Int("j")
    hyps = _pos(p, k, La) + [_in(bP, p), _in(r, k), _in(i, La), _in(jj, k)]
    obligations.append(("reduce_scatter: every member's contribution is at the right global index", hyps,
                        z3.And(_in(i + r * La, k * La), bP * (k * La) + i + r * La == (bP * k + r) * La + i)))
    # all_reduce(A): same index on every member; summand of member j is j: a bijection onto [0, k)
    hyps = _pos(p, k, L) + [_in(bP, p), _in(i, L), _in(jj, k)]
    obligations.append(("all_reduce: every member's contribution is at the right global index", hyps,
                        bP * L + i == bP * L + i))
    # permute: the source holds, under the type before, the block the receiver needs under the type after
    # (equal block indices, equal local sizes, equal summand coordinates), so indices agree.
    bIn, bOut = z3.Ints("bIn bOut")
    hyps = _pos(L) + [_in(i, L), bIn == bOut]
    obligations.append(("permute: same block and local size gives the same element", hyps,
                        bIn * L + i == bOut * L + i))

    # reduce_scatter onto a whole dim that k does not divide (the padding rule): before (0, N) on every
    # member, after (r, L) with L = ceil(N / k). Output i of member r sums the members' x_j[r·L + i]: where
    # the type after calls it data (r·L + i < N) the index read is inside the input, at the right global index.
    N = z3.Int("N")
    hyps = _pos(N, k, L) + [(L - 1) * k < N, N <= L * k, _in(r, k), _in(i, L), r * L + i < N]
    obligations.append(("reduce_scatter onto a whole uneven dim: data reads the input, at its global index", hyps,
                        z3.And(_in(r * L + i, N), 0 * N + r * L + i == r * L + i)))

    # shard_to_partial(dim, A): before (bP·k + a, L), after (bP, k·L) and partial over A with summand
    # coordinate a. EmbedChunk puts the input at chunk a: output i is data on the member a = i div L only,
    # there reading input i − a·L, whose global index is the one the type after assigns to i. So the A-group's
    # sum at i is exactly one element, the right one.
    q, m, dm = _divmod(i, L, "s2p")
    hyps = _pos(p, k, L) + [_in(bP, p), _in(a, k), _in(i, k * L)] + dm
    live = z3.And(i >= a * L, i < (a + 1) * L)
    obligations.append(("shard_to_partial: one member holds output i, with the right element", hyps, z3.And(
        live == (a == q), z3.Implies(live, z3.And(_in(i - a * L, L),
                                                  (bP * k + a) * L + (i - a * L) == bP * (k * L) + i)))))
    # replicate_to_partial(A): every member holds the same block; KeepRoot keeps it on the member of rank 0
    # and zeros it on the others: some member keeps it, and no two do, so the group's sum is the block.
    j1, j2 = z3.Ints("j1 j2")
    obligations.append(("replicate_to_partial: exactly one member keeps the block",
                        _pos(k) + [_in(j1, k), _in(j2, k)],
                        z3.And(_in(0, k), z3.Implies(z3.And(j1 == 0, j2 == 0), j1 == j2))))
    return [_prove(*o) for o in progress(obligations, desc="step rules, symbolic")]


def concrete_rules(n_pairs: int = 400, seed: int = 1, n_creating: int = 150) -> dict:
    """Every step of the plans of ``n_pairs`` random pairs and of ``n_creating`` random pairs that create
    pending sums (even and uneven), lowered alone and proved by the verifier."""
    from fractions import Fraction

    from redist.synthesis import synthesize
    from redist.testing import SeededDraw, draw_mesh, draw_pair
    from redist.verify import program_bytes, verify_program

    draw = SeededDraw(seed)
    by_kind: dict[str, int] = {}
    failures, synth_errors = [], []
    t0 = time.perf_counter()
    pairs = [draw_pair(draw, draw_mesh(draw, max_axes=4, max_devices=16), partial=0.5, sub_axes=0.3)
             for _ in range(n_pairs)]
    pairs += creating_pairs(n_creating, seed)
    for src, dst in progress(pairs, desc="step rules, each step alone", unit="plan"):
        try:
            plan = synthesize(src, dst)
        except Exception as e:  # noqa: BLE001 - reported, not a step-rule failure
            synth_errors.append(f"{src.mesh}: {src} -> {dst}: {type(e).__name__}: {e}")
            continue
        for step, t_in, t_out in zip(plan.steps, plan.types, plan.types[1:]):
            if step.kind in ("pad", "unpad"):
                continue  # views between two shapes, no instruction: proved within whole plans (exhaustive)
            prog = lower((step,), (t_in, t_out))
            v = verify_program(prog, t_in, step.apply(t_in))
            by_kind[step.kind] = by_kind.get(step.kind, 0) + 1
            if not v.ok:
                failures.append(f"{step} on {t_in}: {v.reason}")
                continue
            derived = program_bytes(prog)
            if Fraction(step.bytes_received(t_in)) != derived:
                failures.append(f"{step} on {t_in}: bytes_received {step.bytes_received(t_in)} != {derived}")
    return {"steps": sum(by_kind.values()), "by_kind": by_kind, "failures": failures,
            "synthesis_errors": synth_errors, "seconds": time.perf_counter() - t0}


def creating_pairs(n: int, seed: int, max_devices: int = 16) -> list:
    """``n`` seeded random pairs whose destination creates pending sums (meshes of 2 to ``max_devices``
    devices, sub-axes, partial sources, a third of them uneven): :func:`redist.testing.draw_pair` with
    ``create``, drawn again until the destination is partial over an axis the source is not."""
    from redist.testing import SeededDraw, draw_mesh, draw_pair

    draw = SeededDraw(f"creating:{seed}")
    out = []
    while len(out) < n:
        mesh = draw_mesh(draw, max_axes=4, max_devices=max_devices, min_devices=2)
        src, dst = draw_pair(draw, mesh, partial=0.4, sub_axes=0.3, uneven=0.3, create=1.0)
        if not set(dst.partial) <= set(src.partial):
            out.append((src, dst))
    return out


def run() -> dict:
    t0 = time.perf_counter()
    sym = symbolic_rules()
    conc = concrete_rules()
    return {"symbolic": sym, "concrete": conc, "ok": all(r["ok"] for r in sym) and not conc["failures"],
            "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    res = run()
    for r in res["symbolic"]:
        print(f"{'proved' if r['ok'] else 'FAILED':<7} {r['rule']}  ({r['result']}, {r['seconds']:.2f}s)")
    c = res["concrete"]
    print(f"concrete: {c['steps']} steps {c['by_kind']}, {len(c['failures'])} failures, {c['seconds']:.1f}s")
    for f in c["failures"]:
        print("  ", f)
    for f in c["synthesis_errors"]:
        print("   synthesis error (not a step-rule failure):", f)
    raise SystemExit(0 if res["ok"] else 1)
