"""Tables of integers over a symbolic key, as small Z3 terms, and the runs of an exchange's segments that the
walk reads its tables over.

A table ``values[key]`` (a permute's source coordinate per position, an exchange's field per block) would be a
chain of as many if-then-elses as entries; structure makes it small. :func:`lookup` is a balanced tree over the
runs of keys on which the value is affine in the key (:func:`run_tree`), and :func:`sparse_lookup` the same
for a table given at a few keys (the blocks of an exchange that receive something, of 2**31);
:func:`periodic_pieces` cuts a table into pieces that repeat a period shifted, which
:meth:`redist.verify.walk.Walk.table` reads with one quotient each; :func:`segment_runs` groups the segments of each receiver block of an exchange into runs that tile an interval
with one size and affine source blocks and starts, so that its tables are over runs, not segments.
"""

from __future__ import annotations

from typing import Sequence

from redist.verify.solver import Deadline, z3

def lookup(key, values: Sequence[int], deadline: Deadline, doing: str):
    """``values[key]`` for a symbolic ``key`` in ``range(len(values))``: a balanced tree of ``If(key < start,
    …, …)`` over the maximal runs of keys on which ``values`` is affine in the key (leaf ``a·key + b``).

    A run grows while consecutive differences agree, so every run but the last has two keys or more: at most
    ``ceil(n / 2)`` leaves, and ``2m + 1`` for a permute that moves ``m`` devices (the identity is affine). A
    table with structure has far fewer: the source coordinates of a permute that swaps mesh axes are affine
    along the minor axis (256 leaves per axis for a transpose of 256 x 256 devices, against 65,536 entries
    in a chain of if-then-elses)."""
    runs, start = [], 0
    while start < len(values):
        slope = values[start + 1] - values[start] if start + 1 < len(values) else 0
        end = start + 1
        while end < len(values) and values[end] - values[end - 1] == slope:
            end += 1
        runs.append((start, slope, values[start] - slope * start))
        start = end
    return run_tree(key, runs, deadline, doing)


def sparse_lookup(key, points: dict[int, int], gap: str, deadline: Deadline, doing: str):
    """As :func:`lookup`, for a table over keys from 0 given only at ``points`` (key: value): between them (and
    after the last) it is 0 where ``gap`` is ``"zero"``, else the value of the point before (the first point's
    before it). Its runs are those of the points and of the gaps, however many keys the gaps span: a table
    over the 2**31 blocks of an exchange to 7 of them is a few leaves, not a list of 2**31 values."""
    runs, at, last = [], 0, None
    for k, v in deadline.each(sorted(points.items()), doing):
        if k > at:  # the gap before this point
            runs.append((at, 0, 0 if gap == "zero" else v if last is None else last))
        runs.append((k, 0, v))
        at, last = k + 1, v
    runs.append((at, 0, 0 if gap == "zero" or last is None else last))  # the gap after the last point
    return run_tree(key, runs, deadline, doing)


def run_tree(key, runs, deadline: Deadline, doing: str):
    """A balanced tree of ``If(key < start, …, …)`` over ``runs`` (``(start, slope, offset)``, by start: from
    ``start`` to the next run's, the value is ``slope·key + offset``)."""

    def tree(lo: int, hi: int):
        if hi - lo == 1:
            deadline.check(doing)
            _, slope, offset = runs[lo]
            return affine(key, slope, offset)
        mid = (lo + hi) // 2
        return z3.If(key < runs[mid][0], tree(lo, mid), tree(mid, hi))

    return tree(0, len(runs))


def affine(key, slope: int, offset: int):
    """``slope·key + offset``, without the terms that are 0 or the factor that is 1."""
    out = key if slope == 1 else slope * key if slope else None
    if out is None:
        return z3.IntVal(offset, key.ctx)
    return out + offset if offset else out


# A piece of fewer periods stays runs: each quotient is a case split for the solver, worth it only where it
# replaces many leaves (measured: quotients on pieces of 2-4 periods made an exchange of 4,096 blocks of 18 from
# 64 of 1,094 take 18-30 s instead of 0.7 s).
_MIN_PERIODS = 8
# A period spans at most this many runs (the source blocks of uneven blocks: 2·b % 145 has 3 per period).
_PERIOD_RUNS = 4


def periodic_pieces(values: Sequence[int], deadline: Deadline, doing: str) -> list[tuple]:
    """The table ``values`` over the keys ``range(len(values))`` as consecutive pieces ``(lo, period, periods,
    per_period)``: for a key ``lo + p·period + r`` (``0 ≤ p < periods``, ``0 ≤ r < period``) the value is
    ``values[lo + r] + p·per_period``. Greedy from each key ``lo``: a period is the span of the first one to
    ``_PERIOD_RUNS`` maximal runs from ``lo`` on which the value is affine in the key, the one that repeats
    over the most keys, shifted, ``_MIN_PERIODS`` times or more; where none does, the first run is a piece
    of its own (one period)."""
    n = len(values)

    def run_end(lo: int) -> int:
        slope = values[lo + 1] - values[lo] if lo + 1 < n else 0
        end = lo + 1
        while end < n and values[end] - values[end - 1] == slope:
            end += 1
        return end

    def periods_of(lo: int, period: int) -> int:
        shift, p = values[lo + period] - values[lo], 1
        while lo + (p + 1) * period <= n and all(values[lo + p * period + r] == values[lo + r] + p * shift
                                                 for r in range(period)):
            p += 1
        return p

    pieces, lo = [], 0
    while lo < n:
        deadline.check(doing)
        ends = [run_end(lo)]
        while len(ends) < _PERIOD_RUNS and ends[-1] < n:
            ends.append(run_end(ends[-1]))
        best = (1, ends[0] - lo)  # (periods, period)
        for end in ends:
            if end < n:
                periods = periods_of(lo, end - lo)
                if periods >= _MIN_PERIODS and periods * (end - lo) > best[0] * best[1]:
                    best = (periods, end - lo)
        periods, period = best
        pieces.append((lo, period, periods, values[lo + period] - values[lo] if periods > 1 else 0))
        lo += period * periods
    return pieces


# The fields of a run of segments (:func:`segment_runs`); the shift is the first segment's ``src − dst``.
DST, SIZE, COUNT, SOURCE, SHIFT = range(5)


def segment_runs(segments, deadline: Deadline, doing: str):
    """The non-empty segments of each receiver block, in order of their destination start, grouped into runs:
    maximal sequences of one size ``z`` whose q-th segment starts at ``dst + q·z`` and takes source block
    ``source + q·d_source`` from ``src + q·d_src``.

    Returns ``(by_block, uniform)``: per block that has segments (a dict by block), its runs as ``(dst, z,
    count, source, src − dst)`` (field order ``DST`` …), and per slot ``r`` (a block's r-th run) ``(z, d_source,
    d_src)`` where every block's r-th run has size ``z`` and every one of more than one segment those slopes,
    so that one quotient selects the segment in all blocks; else ``None``, and every run of the blocks is split
    into single segments (one case per segment, as before any grouping) when some r-th run of several segments
    breaks that."""
    blocks: dict[int, list] = {}
    for seg in deadline.each(segments, doing):
        if seg.size:
            blocks.setdefault(seg.block, []).append(seg)
    by_block, slopes = {}, []
    for block, segs in sorted(blocks.items()):
        deadline.check(doing)
        segs.sort(key=lambda g: g.dst_start)
        runs, j = [], 0
        while j < len(segs):
            g, m = segs[j], 1
            if j + 1 < len(segs):
                h = segs[j + 1]
                d_source, d_src = h.source_block - g.source_block, h.src_start - g.src_start
                while (j + m < len(segs) and segs[j + m].size == g.size
                       and segs[j + m].dst_start == g.dst_start + m * g.size
                       and segs[j + m].source_block == g.source_block + m * d_source
                       and segs[j + m].src_start == g.src_start + m * d_src):
                    m += 1
            runs.append(((g.dst_start, g.size, m, g.source_block, g.src_start - g.dst_start),
                         (d_source, d_src) if m > 1 else None))
            j += m
        by_block[block] = [run for run, _ in runs]
        slopes.append([d for _, d in runs])
    uniform = []
    for r in range(max(map(len, by_block.values()), default=0)):
        sizes = {runs[r][SIZE] for runs in by_block.values() if r < len(runs)}
        ds = {d[r] for d in slopes if r < len(d) and d[r] is not None}
        if not ds:
            uniform.append(None)  # single segments
        elif len(sizes) == 1 and len(ds) == 1:
            uniform.append((sizes.pop(), *ds.pop()))
        else:  # no common quotient: one case per segment
            singles = {block: [(g.dst_start, g.size, 1, g.source_block, g.src_start - g.dst_start) for g in segs]
                       for block, segs in blocks.items()}
            return singles, [None] * max(map(len, singles.values()), default=0)
    return by_block, uniform
