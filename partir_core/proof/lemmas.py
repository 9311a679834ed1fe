"""The lemmas the local forms rest on, proved once with symbolic sizes (Z3, nonlinear integer arithmetic).

The meaning of a type (docs/spec.md §2): a dim of size ``N`` split ``k`` ways holds, on the device of block
``b`` (``0 ≤ b < k``, row-major over the dim's axes), the local extent ``L = ceil(N / k)``; local index ``i`` is
global index ``b·L + i``, data where that is below ``N`` and padding otherwise. Sizes ``N, k, L, m`` are
symbolic positive integers; every obligation is proved for all of them at once (``unsat`` of its negation),
as :mod:`proofs.step_rules` proves redist's step rules. Each local form of :mod:`partir_core.proof.rules`
names its lemma (:data:`OBLIGATIONS`); :func:`proved` proves a lemma's obligations on first use and
remembers the answer. Sums of real numbers over a group of any size are handled by their induction step
(one summand more), proved over the reals.
"""

from __future__ import annotations

import functools

from redist.extras import MissingModule

try:
    import z3
except ModuleNotFoundError as e:  # no [verify] extra: partir_core imports, and verify() says what to install
    z3 = MissingModule(e, "partir_core's verify()", "verify")


def _pos(*xs):
    return [x >= 1 for x in xs]


def _in(x, n):
    return z3.And(x >= 0, x < n)


def _uneven(N, k, L):
    """``L = ceil(N / k)``."""
    return [(L - 1) * k < N, N <= L * k]


def same_block():
    """Operands split alike hold the same global indices at the same local index: elementwise ops, paired dims
    of ``dot_general``, a convolution's batch and feature dims, batch dims of gathers, dims a transpose or
    squeeze keeps, a broadcast's kept dims."""
    b, b2, L, i = z3.Ints("b b2 L i")
    return [("equal blocks give equal global indices", _pos(L) + [_in(i, L), b == b2], b * L + i == b2 * L + i)]


def partition():
    """The blocks of a split dim partition its data: every global index lies in exactly one device's block,
    at local index ``g − b·L`` (contractions, a convolution's input features, reductions, split update rows,
    split tables); padding, masked to the reduction's identity (or looked up nowhere), adds nothing."""
    N, k, L, g, b, i, b2, i2 = z3.Ints("N k L g b i b2 i2")
    hyps = _pos(N, k, L) + _uneven(N, k, L) + [_in(g, N)]
    q, r = z3.Ints("q r")
    exists = z3.And(_in(q, k), _in(r, L), q * L + r == g)
    unique = z3.Implies(z3.And(_in(b, k), _in(i, L), _in(b2, k), _in(i2, L), b * L + i == g, b2 * L + i2 == g),
                        z3.And(b == b2, i == i2))
    return [("every data index is in some block", hyps + [g == q * L + r, _in(r, L)], exists),
            ("no data index is in two blocks", hyps, unique),
            ("the local index of a global one in its block", hyps + [_in(b, k), b * L <= g, g < b * L + L],
             z3.And(_in(g - b * L, L), b * L + (g - b * L) == g))]


def sums():
    """Induction steps of the pending sums that pass through linear ops: one summand more keeps
    ``Σ(a + c) = Σa + Σc`` and ``Σ(a·c) = (Σa)·c``, and exactly one device of a group (rank 0) counts a
    value added once."""
    sa, sc, sac, a, c, w = z3.Reals("sa sc sac a c w")
    k, j1, j2 = z3.Ints("k j1 j2")
    return [("sum of sums, one summand more", [sac == sa + sc], sac + (a + c) == (sa + a) + (sc + c)),
            ("sum times a common factor, one summand more", [sac == sa * w], sac + a * w == (sa + a) * w),
            ("exactly one device of a group has rank 0", _pos(k) + [_in(j1, k), _in(j2, k)],
             z3.And(_in(0, k), z3.Implies(z3.And(j1 == 0, j2 == 0), j1 == j2)))]


def radix():
    """Row-major digits merge: a dim of ``k·m`` split ``k`` ways is block digit ``b`` then local digit ``i``
    (index ``b·m + i``), and two adjacent digits of radices ``m1, m2`` are one of radix ``m1·m2``, a bijection
    (reshape: both sides' digit sequences equal give equal global flat indices)."""
    b, i, m, k, u, v, u2, v2, m1, m2 = z3.Ints("b i m k u v u2 v2 m1 m2")
    hyps = _pos(m1, m2) + [_in(u, m1), _in(v, m2), _in(u2, m1), _in(v2, m2)]
    return [("split dim: block digit then local digit", _pos(k, m) + [_in(b, k), _in(i, m)],
             z3.And(_in(b * m + i, k * m))),
            ("adjacent digits merge into one, in range", hyps, _in(u * m2 + v, m1 * m2)),
            ("adjacent digits merge into one, injectively", hyps,
             z3.Implies(u * m2 + v == u2 * m2 + v2, z3.And(u == u2, v == v2)))]


def counting():
    """A device counts from its block's start: local ``i`` of block ``b`` holds ``b·L + i`` (iota)."""
    b, L, i = z3.Ints("b L i")
    return [("iota: the block's start plus the local index", _pos(L) + [_in(i, L)], b * L + i == b * L + i)]


def clamped():
    """A dynamic slice or update as large as its dim starts at 0, wherever its start index points: JAX clamps
    the start into ``[0, N − S]`` (a device's block: ``[0, L − L]``), so a split dim taken whole is its block."""
    s, N = z3.Ints("s N")
    clamp = z3.If(s < 0, 0, z3.If(s > N - N, N - N, s))
    return [("a start clamped into an extent as large as the slice is 0", _pos(N), clamp == 0)]


OBLIGATIONS = {
    "replicated": [],
    "elementwise": [same_block],
    "elementwise of pending sums": [same_block, sums],
    "dot_general": [same_block, partition, sums],
    "conv_general_dilated": [same_block, partition, sums],
    "reduction": [same_block, partition, sums],
    "reduction along whole dims": [same_block],
    "broadcast_in_dim": [same_block, sums],
    "reshape": [same_block, radix, sums],  # same_block: the operand transposed by ``dimensions`` first
    "transpose": [same_block, sums],
    "squeeze": [same_block, sums],
    "rev": [same_block, sums],
    "iota": [counting],
    "random_bits": [same_block, counting],
    "gather": [same_block],
    "gather of a split table": [same_block, partition, sums],
    "scatter-add": [same_block],
    "scatter-add of split update rows": [same_block, partition, sums],
    "scatter-add into a split table": [same_block, partition, sums],
    "slice": [same_block, sums],
    "dynamic_slice": [same_block, clamped, sums],
    "dynamic_update_slice": [same_block, clamped],
    "pad": [same_block],
    "concatenate": [same_block],
    "permutation": [partition, sums],
}


@functools.lru_cache(maxsize=None)
def _prove(make) -> tuple:
    out = []
    for name, hyps, goal in make():
        s = z3.Solver()
        s.set("timeout", 20_000)
        s.add(*hyps)
        s.add(z3.Not(goal))
        out.append((f"{make.__name__}: {name}", s.check() == z3.unsat))
    return tuple(out)


def results(lemma: str) -> list[tuple[str, bool]]:
    """``(obligation, proved)`` for each obligation of ``lemma``."""
    return [r for make in OBLIGATIONS[lemma] for r in _prove(make)]


def proved(lemma: str) -> bool:
    """Whether every obligation of ``lemma`` is proved (proved once per process)."""
    return all(ok for _, ok in results(lemma))
