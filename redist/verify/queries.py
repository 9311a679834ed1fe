"""The queries that prove a program computes its claim, and the counterexamples of their models.

Each element of the result is followed back to the source by a walk (:class:`~redist.verify.walk.Walk`), through
the program or, across meshes, the chain of programs and transfers (:class:`~redist.verify.chain.Chain`; the
claim is read on the last program's mesh, the source type on the first's). At the source, the source type's
meaning gives the global index and summand coordinate the element is.
Each (device, index, choice of summation members) is a *contributor* to a group sum of the destination: a
source element (summand), or no data, a zero. Queries (``unsat`` = proved):

1. *values*: some device, local index that the destination type says is data, and choice of summation
   members where the element is no data, comes from a padding position of the source, or has a source
   global index other than the one the destination type assigns there (padding positions of the result may
   hold anything);
2. *sums* (only with partial axes or reductions): with ``Q`` the destination's partial axes, the
   contributors to the group reduction at (device, index) are indexed by (summation members, Q-coordinates
   of the group member). For a sum or a product each summand must be taken exactly once: their number must
   equal the number of source summand coordinates, and query 2 asks for two different contributors with the
   same source summand coordinate, or from two different source partial groups (docs/spec.md §4: *any* summands
   whose group sums are right must work, so the summands of one group need not agree with those of a
   replica group). ``unsat`` proves the contributors are a bijection onto the summands of one source group.
   For an idempotent reduction (max, min, and every reduction of ``bool``: or, and) a summand taken twice
   changes nothing, and summands of other groups of the same element change nothing either once one whole
   group is in (each is at most the maximum, at least the minimum), so the query asks instead that the
   contributors *cover* every summand of one group: a bijection proves it at once; otherwise, with the
   contributor of all-zero members as the witness group, query 3 asks for a summand coordinate of that
   group that no contributor (each concrete choice of members, one walk each) takes. ``unsat`` proves the
   group is covered. (A program that covers some other group but not the witness's is refuted; every
   reduction of a synthesized plan covers all groups alike.)

   Where the claim has no partial group of more than one device, every contributor starts at the one base
   element, and the instructions after the program's last reduction move it as one value whatever the
   members are: that part is walked once and shared (:class:`_Base`), and each contributor walks only from
   the last reduction back. The queries then hold one copy of an exchange or permute that follows the
   reductions, not one per contributor for Z3 to prove equal (with one copy per contributor, the summation
   query of an all-reduce before an exchange of tens of thousands of segments is out of Z3's reach).

*Creating* pending sums (docs/spec.md §3: the destination may be partial over axes the source is not; the program
then holds zeros where a summand lacks data: ``KeepRoot``, ``EmbedChunk``, an exchange or a padded chunk
that writes none) makes some contributors zeros, and the counting in 2 no longer holds. When the claim
is partial over a factor of the mesh that the source is not, or the program has a creating instruction, or
query 1 finds an element no instruction writes (an exchange that copies nothing there, as an uneven
``shard_to_partial`` lowers) where the values are sums that a reduction or the claim adds up (a zero may be a
summand of them), the *summand-bijection* queries replace 1 and 2:

1'. *values*: as 1, except that a contributor may be no data (a zero adds nothing to a sum);
2'. *injective*: two different contributors at one (device, index), both data, with the same source summand
   coordinate or from two source partial groups (as 2, over data contributors only);
3'. *onto*: with every contributor enumerated (the Q-coordinates and summation members take each of their
   values, one walk each: at most ``_MAX_CONTRIBUTORS``), a (device, index) and a source summand
   coordinate ``σ`` that no data contributor there holds.

``unsat`` of all three proves that each destination group sum adds every summand of one source group
exactly once, and zeros elsewhere. Zeros are the identity of a sum only: a program or claim that creates
pending values of another reduction kind is refuted before these queries.

*Two stages*: a source pending in another kind than a sum may be reduced whole before instruction ``cut``,
then made pending sums and summed again from ``cut`` on (:func:`~redist.verify.wellformed.check_reductions`).
The element at a position of the result is then a sum, over the contributors followed back to ``cut`` (the
claim's Q-coordinates and the members of the sums), of the element before ``cut``, which is a reduction in the
source's kind over the members before it. Zeros may be written from ``cut`` on only (one in a product, a
maximum or a minimum is wrong):

1''. *values*: as 1, except that a contributor may be a zero that an instruction at or after ``cut`` wrote;
2''. *once*: two different contributors followed back to ``cut`` that are both data (the element before
   ``cut`` is one value: the sum must take it once);
3''. *onto*: a position where none of them is data (each enumerated, as in 3');
4''. the reduction before ``cut``, at the data contributor after it (that walk is shared): query 2, and 3
   for an idempotent kind, over the members before ``cut``.

``unsat`` of all four proves that each destination group sum is one element before ``cut``, which is the
reduction of one source group's summands.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from redist import program as P
from redist.verify.encoding import (ChainDigits, DeviceOrder, Digits, horner, ksize, position_coords, read_axes,
                                    type_meaning)
from redist.verify.solver import Deadline, conjunction, disjunction, model_int, solve, z3
from redist.verify.verdict import Refuted, Undecided
from redist.verify.walk import Walk


def value_query(chain, digits: ChainDigits, src, dst, dst_local, deadline: Deadline, details: dict,
                zeros_from: int | None = None) -> None:
    """Query 1 of the module header: every data position of the result holds the claimed element. With
    ``zeros_from`` (1' and 1''), a contributor may be a zero that an instruction at or after that index wrote
    (those before it must write none)."""
    src_partial = type_meaning(digits.src.mesh_sizes, src)[3]
    w = Walk(chain, digits, "a", deadline)
    c = digits.dst.fresh(lambda base, lo, hi: w.fresh(f"dev_{base}", lo, hi))  # on the claim's device order
    idx = [w.fresh(f"idx{d}", 0, L) for d, L in enumerate(dst_local)]
    want, _, _, _, is_data = type_meaning(digits.dst.mesh_sizes, dst, digits.dst, c, idx)
    c0, i0 = _walk_between_orders(w, chain, c, idx)
    got, _, summand, _, from_data = type_meaning(digits.src.mesh_sizes, src, digits.src, c0, i0)
    since = len(chain.instructions) if zeros_from is None else zeros_from
    live = conjunction(w.alive(before=since), digits.ctx)  # a zero before ``since`` is wrong
    wrong = [z3.Not(live), z3.Not(from_data)] + [a != b for a, b in zip(got, want)]
    bad = z3.And(conjunction(w.alive(since=since), digits.ctx), z3.Or(wrong))
    s, res = solve(w.ranges + w.defs + [is_data, bad], deadline, "value query", digits.ctx)
    details["queries"] = 1
    if res == z3.unsat:
        return
    mdl = s.model()
    cx = _cex(mdl, digits, w, chain, c, idx, want, c0, i0, got, summand, src_partial)
    where = f"device {cx['device']} {cx['coords']} at local index {cx['index']}"
    if not z3.is_true(mdl.eval(live, model_completion=True)):
        cx["holds"] = {"unwritten": True}
        raise Refuted(f"{where} is never written (no exchange or transfer copy, padded reduce-scatter chunk or "
                      f"creating instruction puts data there: it holds a zero), but {dst} puts global element "
                      f"{cx['expected']['global_index']} there", cx)
    if not z3.is_true(mdl.eval(from_data, model_completion=True)):
        cx["holds"]["padding"] = True
        raise Refuted(f"{where} holds padding of {src} (device {cx['holds']['from_device']}, local index "
                      f"{cx['holds']['from_local_index']}), but {dst} puts global element "
                      f"{cx['expected']['global_index']} there", cx)
    raise Refuted(
        f"{where} holds global element "
        f"{cx['holds']['global_index']} (from device {cx['holds']['from_device']}), but {dst} puts "
        f"{cx['expected']['global_index']} there", cx)


def _walk_between_orders(w: Walk, chain, c: dict, idx: list):
    """Walk back from coordinates ``c`` on the claim's device order (``chain.dst_mesh``) and local index
    ``idx`` to the source: returns the source device's coordinates on the source's device order
    (``chain.src_mesh``) and its local index."""
    c = w.reorder(c, DeviceOrder(chain.dst_mesh), w.order, "claim")
    c0, i0 = w.run(c, idx)
    return w.reorder(c0, w.order, DeviceOrder(chain.src_mesh), "source"), i0


def sum_query(chain, digits: ChainDigits, src, dst, dst_local, deadline: Deadline, details: dict,
              idempotent: bool, cut: int | None = None) -> None:
    """Query 2 of the module header: each group reduction takes every summand of one source group exactly
    once, or (``idempotent``) at least once. With ``cut`` (4''), the reductions before instruction ``cut``, at
    the one contributor after it that is data (2'' and 3'')."""
    src_partial = type_meaning(digits.src.mesh_sizes, src)[3]
    dst_partial = () if cut is not None else type_meaning(digits.dst.mesh_sizes, dst)[3]
    n_members = math.prod(ksize(read_axes(digits.at(t).mesh_sizes, ins.axes, f"instruction {t}"))
                          for t, ins in enumerate(chain.instructions[:cut])
                          if isinstance(ins, (P.ReduceScatter, P.AllReduce)))
    n_q = ksize(dst_partial)
    n_summands = ksize(src_partial)
    if n_members * n_q < n_summands or (not idempotent and n_members * n_q != n_summands):
        raise Refuted(
            f"each element of the result reduces {n_members} source summand(s) per device "
            f"(x {n_q} over the destination's partial axes), but the source has {n_summands} summand(s) "
            "per element: some summand is dropped" + ("" if idempotent else " or taken more than once"),
            {"device": DeviceOrder(chain.dst_mesh).device(0), "coords": position_coords(digits.dst.mesh_sizes, 0),
             "index": (0,) * len(dst_local),
             "holds": {"summands": n_members * n_q}, "expected": {"summands": n_summands}})
    if n_summands == 1:
        return  # one summand: every contributor holds the value (query 1), and each is taken once or, if
        # idempotent, any number of times
    details["queries"] = 2
    base = _base_position(chain, digits, dst, dst_local, deadline, shared_to=cut)
    walks = [_contributor(chain, digits, tag, base, src, src_partial, dst_partial, deadline) for tag in ("p", "q")]
    bijection = n_members * n_q == n_summands
    if (bijection or not idempotent) and _pair_query(chain, digits, base, walks, src_partial, deadline,
                                                     refute=not idempotent):
        return
    _coverage_query(chain, digits, src, src_partial, dst_partial, base, walks[0][0], deadline, details)


def _pair_query(chain, digits: ChainDigits, base: _Base, walks, src_partial, deadline: Deadline,
                refute: bool, stop: int = 0) -> bool:
    """The summation query (2 and 2' of the module header) on two contributors ``walks`` to the group reduction
    at ``base`` (:func:`_contributor`): can two different members take one source summand, or summands of two
    source partial groups? True where they cannot; where they can, refutes with them (:func:`_refute_pair`) if
    ``refute``, else returns False."""
    (w1, m1, s1, cs1, g1), (w2, m2, s2, cs2, g2) = walks
    ctx = digits.ctx
    differ = disjunction([a != b for a, b in zip(m1, m2)], ctx)
    same = conjunction([a == b for a, b in zip(s1, s2)], ctx)
    other_group = disjunction([a != b for a, b in zip(g1, g2)], ctx)
    s, res = solve(base.constraints + w1.ranges + w1.defs + w1.alive() + w2.ranges + w2.defs + w2.alive()
                   + [differ, z3.Or(same, other_group)], deadline, "summation query", ctx)
    if res == z3.unsat:
        return True
    if refute:
        _refute_pair(s.model(), digits, chain, base, (cs1, cs2), (s1, s2), src_partial, stop)
    return False


@dataclass(frozen=True)
class _Base:
    """A symbolic data position of the result, and the part of the walk back from it that every contributor
    to its group reduction shares.

    ``c`` and ``idx``: device coordinates (on the claim's device order) and local index. Where the claim has
    no partial group of more than one device, every contributor starts at this one element, and the
    instructions after the program's last reduction move it as one value, whatever the members: that part is
    walked once (the ``fork``: coordinates on the mesh of buffer ``below``'s program and index before it, and
    the walk's liveness conditions, which each contributor adds to its own), not once per contributor. Each
    contributor then walks only the instructions ``below − 1`` down to 0, so that a query comparing two of
    them (or enumerating them) has one copy of an exchange or permute after the reductions, not one per
    contributor that Z3 would have to prove equal. ``fork`` is None where each contributor starts at its own
    member of the claim's partial group. ``constraints``: the position in range at a data position of the
    claim, and the ranges and definitions of the shared walk."""

    c: dict
    idx: list
    constraints: list
    fork: tuple | None


def _base_position(chain, digits: ChainDigits, dst, dst_local, deadline: Deadline, stop: int = 0,
                   shared_to: int | None = None) -> _Base:
    """A symbolic data position of the result, and the walk its contributors share (:class:`_Base`): with
    ``shared_to``, down to that instruction, from one member of the claim's partial group (its Q-coordinates,
    and the members of the reductions from ``shared_to`` on, are one for all the contributors); else, where the
    claim has no partial group of more than one device, down to the last reduction at or after instruction
    ``stop`` (to which the contributors walk)."""
    ranges: list = []

    def new(base, lo, hi):
        v = z3.Int(f"base_{base}", digits.ctx)
        ranges.append(z3.And(v >= lo, v < hi))
        return v

    c = digits.dst.fresh(new)
    idx = [new(f"i{d}", 0, L) for d, L in enumerate(dst_local)]
    meaning = type_meaning(digits.dst.mesh_sizes, dst, digits.dst, c, idx)
    ranges.append(meaning[4])  # data positions only
    dst_partial = meaning[3]
    if shared_to is None and ksize(dst_partial) > 1:
        return _Base(c, idx, ranges, None)
    w = Walk(chain, digits, "tail", deadline)
    c_fork = c
    if shared_to is None:
        reductions = [t for t, ins in enumerate(chain.instructions)
                      if t >= stop and isinstance(ins, (P.ReduceScatter, P.AllReduce))]
        below = reductions[-1] + 1 if reductions else stop
    else:
        below = shared_to
        qs = [w.fresh("grp", 0, ax.size) for ax in dst_partial]
        c_fork = digits.dst.with_rank(w, c, dst_partial, horner(qs, [ax.size for ax in dst_partial], digits.ctx),
                                  bounded=True)
    c_fork = w.reorder(c_fork, DeviceOrder(chain.dst_mesh), w.order, "claim")
    c_fork, idx_fork = w.run(c_fork, idx, stop=below)
    return _Base(c, idx, ranges + w.ranges + w.defs, (c_fork, idx_fork, below, w.live))


def _contributor(chain, digits: ChainDigits, tag, base: _Base, src, src_partial, dst_partial, deadline, stop: int = 0):
    """One symbolic contributor to the group reduction at the base device and index: a walk from the member
    of the base's destination group given by fresh Q-coordinates (or from the base's fork, which the walk's
    liveness then includes) back to instruction ``stop``. Returns ``(walk, member variables (Q-coordinates,
    then each reduction's), source summand coordinates, source device coordinates, source group key)``; with
    ``stop`` > 0, the element before instruction ``stop`` is one value (the source's pending value, reduced
    whole before it): no summand coordinates nor group key, and the device's coordinates on the mesh of the
    program that instruction belongs to."""
    wk = Walk(chain, digits, tag, deadline)
    if base.fork is None:
        qs = [wk.fresh("grp", 0, ax.size) for ax in dst_partial]
        cc = digits.dst.with_rank(wk, base.c, dst_partial, horner(qs, [ax.size for ax in dst_partial], digits.ctx),
                              bounded=True)
        cc = wk.reorder(cc, DeviceOrder(chain.dst_mesh), wk.order, "claim")
        cs, ii = wk.run(cc, list(base.idx), stop=stop)
    else:
        qs = []
        c_fork, idx_fork, below, live = base.fork
        wk.live += live
        cs, ii = wk.run(c_fork, idx_fork, below=below, stop=stop)
    members = qs + [v for _, vs, _ in wk.sum_vars for v in vs]
    if stop:
        return wk, members, [], cs, []
    cs = wk.reorder(cs, wk.order, DeviceOrder(chain.src_mesh), "source")
    _, _, summ, _, _ = type_meaning(digits.src.mesh_sizes, src, digits.src, cs, ii)
    return wk, members, summ, cs, digits.src.key(cs, src_partial)


def _member_sizes(base: _Base, dst_partial, template: Walk) -> list[int]:
    """The number of values of each member variable of a contributor (:func:`_contributor`, of which
    ``template`` is the walk): its Q-coordinates (none where the base's fork holds them), then each of its
    reductions' members."""
    return ([] if base.fork else [ax.size for ax in dst_partial]) + [
        ax.size for _, _, axes in template.sum_vars for ax in axes]


def _model_position(mdl, digits: ChainDigits, chain, base: _Base) -> dict:
    """Where a group-sum query's model puts its destination element: ``device`` (an id on the destination's
    device order), ``coords`` and local ``index``: the head of its counterexample."""
    dev = _model_coords(mdl, digits.dst, base.c)
    return {"device": _device_at(chain.dst_mesh, dev, digits.dst.mesh_sizes), "coords": dev,
            "index": tuple(model_int(mdl, v) for v in base.idx)}


def _refute_pair(mdl, digits: ChainDigits, chain, base: _Base, cs, ss, src_partial, stop: int) -> None:
    """Refute with the model of query 2: two contributors that take one summand, or two source groups (with
    ``stop``, 2'': two contributors that are data before instruction ``stop``)."""
    summ = [{a.token: model_int(mdl, e) for a, e in zip(src_partial, x)} for x in ss]
    at = digits.at(stop)  # the mesh of the program the contributors are followed back to (stop 0: the source's)
    from_devs = [_device_at(chain.program_at(stop).mesh if stop else chain.src_mesh, _model_coords(mdl, at, cc),
                            at.mesh_sizes) for cc in cs]
    cx = {**_model_position(mdl, digits, chain, base),
          "holds": {"summands": summ, "added_from_devices": from_devs},
          "expected": {"summands": "the element once" if stop else
                       "each summand of one source partial group, exactly once"}}
    if stop:
        why = f"adds the element twice (from devices {from_devs}, before instruction {stop})"
    elif summ[0] == summ[1]:
        why = f"adds source summand {summ[0]} twice (from devices {from_devs})"
    else:
        why = (f"mixes summands of different source partial groups (devices {from_devs} are in different "
               f"groups over {{{','.join(a.token for a in src_partial)}}})")
    raise Refuted(f"the group sum at device {cx['device']} {cx['coords']}, local index {cx['index']} {why}", cx)


def _coverage_query(chain, digits: ChainDigits, src, src_partial, dst_partial, base: _Base, template: Walk,
                    deadline: Deadline, details: dict) -> None:
    """Query 3 of the module header (idempotent reductions): one walk per concrete choice of the members
    (Q-coordinates, then each reduction's members, as in ``template``); the contributor of all-zero members
    names the witness group, and the query asks for a summand coordinate of it that no contributor takes."""
    sizes = _member_sizes(base, dst_partial, template)
    choices = list(itertools.product(*(range(k) for k in sizes)))
    details["queries"] = 3
    details["coverage_walks"] = len(choices)
    missing = [z3.Int(f"missing_{a.token}", digits.ctx) for a in src_partial]
    constraints = list(base.constraints) + [z3.And(v >= 0, v < a.size) for v, a in zip(missing, src_partial)]
    witness, covered = None, []
    for j, choice in enumerate(choices):
        deadline.check(f"encoding contributor {j} of {len(choices)} for the coverage query")
        wk, members, summ, _, group = _contributor(chain, digits, f"m{j}", base, src, src_partial, dst_partial,
                                                   deadline)
        constraints += wk.ranges + wk.defs + wk.alive() + [v == x for v, x in zip(members, choice)]
        if witness is None:
            witness = group
        covered.append(conjunction([a == b for a, b in zip(group, witness)] + [a == b for a, b in zip(summ, missing)],
                                   digits.ctx))
    s, res = solve(constraints + [z3.Not(disjunction(covered, digits.ctx))], deadline, "coverage query", digits.ctx)
    if res == z3.unsat:
        return
    mdl = s.model()
    summand = {a.token: model_int(mdl, v) for a, v in zip(src_partial, missing)}
    cx = {**_model_position(mdl, digits, chain, base), "holds": {"missing_summand": summand},
          "expected": {"summands": "every summand of one source partial group, at least once"}}
    raise Refuted(f"the group reduction at device {cx['device']} {cx['coords']}, local index {cx['index']} never "
                  f"takes source summand {summand} of the group of its first contributor", cx)


# The onto query walks once per contributor to a group sum; beyond this many it answers undecided.
_MAX_CONTRIBUTORS = 1024


def creation_queries(chain, digits: ChainDigits, src, dst, dst_local, deadline: Deadline, details: dict,
                     stop: int = 0) -> None:
    """Queries 2' and 3' of the module header (after 1', :func:`value_query` with ``zeros_from``): no two data
    contributors to one group sum hold one source summand or come from two source partial groups, and every
    summand of the group reaches it. With ``stop`` (2'' and 3''), the contributors are followed back to
    instruction ``stop`` only, where the element is one value: exactly one of them is data."""
    src_partial = () if stop else type_meaning(digits.src.mesh_sizes, src)[3]
    dst_partial = type_meaning(digits.dst.mesh_sizes, dst)[3]
    base = _base_position(chain, digits, dst, dst_local, deadline, stop=stop)
    walks = [_contributor(chain, digits, tag, base, src, src_partial, dst_partial, deadline, stop)
             for tag in ("p", "q")]
    if walks[0][1]:  # more than one contributor per group sum: compare two of them
        details["queries"] = 2
        _pair_query(chain, digits, base, walks, src_partial, deadline, refute=True, stop=stop)
    _onto_query(chain, digits, src, src_partial, dst_partial, base, walks[0][0], deadline, details, stop)


def _onto_query(chain, digits: ChainDigits, src, src_partial, dst_partial, base: _Base, template: Walk,
                deadline: Deadline, details: dict, stop: int = 0) -> None:
    """Query 3' of the module header: every summand of the source reaches each group sum of the result.

    Every contributor is enumerated: one walk per value of (Q-coordinates, summation members, as in
    ``template``), all from the symbolic ``base`` position; the query asks for a base position and a source
    summand coordinate ``σ`` that no data contributor holds. With 2' (all data contributors hold distinct
    summands of one source group) its ``unsat`` makes the data contributors a bijection onto that group's
    summands. ``stop``: as for :func:`creation_queries`."""
    sizes = _member_sizes(base, dst_partial, template)
    count = math.prod(sizes)
    if count > _MAX_CONTRIBUTORS:
        raise Undecided(f"the onto query of a creating claim would walk {count} contributors per group sum, "
                        f"more than {_MAX_CONTRIBUTORS}")
    sigma = [z3.Int(f"sigma_{a.token}", digits.ctx) for a in src_partial]
    constraints = list(base.constraints) + [z3.And(v >= 0, v < a.size) for v, a in zip(sigma, src_partial)]
    for j, choice in enumerate(itertools.product(*(range(k) for k in sizes))):
        deadline.check(f"encoding contributor {j} of {count} for the onto query")
        wk, members, summ, _, _ = _contributor(chain, digits, f"o{j}", base, src, src_partial, dst_partial,
                                               deadline, stop)
        constraints += wk.ranges + wk.defs + [v == x for v, x in zip(members, choice)]
        held = wk.alive() + [a == b for a, b in zip(summ, sigma)]
        constraints.append(z3.Not(conjunction(held, digits.ctx)))
    details["queries"] = 3
    s, res = solve(constraints, deadline, "onto query", digits.ctx)
    if res == z3.unsat:
        return
    mdl = s.model()
    missing = {a.token: model_int(mdl, v) for a, v in zip(src_partial, sigma)}
    cx = {**_model_position(mdl, digits, chain, base),
          "holds": {"missing_summand": missing, "contributors": count},
          "expected": {"summands": "each summand of one source partial group, exactly once"}}
    what = f"source summand {missing}" if missing else "the source element"
    raise Refuted(f"the group sum at device {cx['device']} {cx['coords']}, local index {cx['index']} lacks {what}: "
                  f"none of its {count} contributor(s) holds it", cx)


# ----------------------------------------------------------------------------- counterexamples
def _device_at(mesh, coords: dict, mesh_sizes: dict) -> int | None:
    """The id of the device at ``coords`` on ``mesh``'s device order; None where a coordinate is off its axis
    (a model leaves the source coordinates free where no source element is read)."""
    p = 0
    for n, size in mesh_sizes.items():
        if not 0 <= coords[n] < size:
            return None
        p = p * size + coords[n]
    return DeviceOrder(mesh).device(p)


def _cex(mdl, digits: ChainDigits, w, chain, c, idx, want, c0, i0, got, summand, src_partial) -> dict:
    """The value query's counterexample: the device (id, and coordinates on the claim's device order), the
    local index, what it holds (global index, source device id and local index, summand, members) and
    what the claim expects there."""
    coords = _model_coords(mdl, digits.dst, c)
    src_coords = _model_coords(mdl, digits.src, c0)
    sums = {f"instruction {t}": [model_int(mdl, v) for v in vs] for t, vs, _ in w.sum_vars}
    out = {
        "device": _device_at(chain.dst_mesh, coords, digits.dst.mesh_sizes),
        "coords": coords,
        "index": tuple(model_int(mdl, v) for v in idx),
        "holds": {
            "global_index": tuple(model_int(mdl, e) for e in got),
            "from_device": _device_at(chain.src_mesh, src_coords, digits.src.mesh_sizes),
            "from_local_index": tuple(model_int(mdl, e) for e in i0),
        },
        "expected": {"global_index": tuple(model_int(mdl, e) for e in want)},
    }
    if src_partial:
        out["holds"]["summand"] = {a.token: model_int(mdl, e) for a, e in zip(src_partial, summand)}
    if sums:
        out["holds"]["summation_members"] = sums
    return out


def _model_coords(model, digits: Digits, c: dict) -> dict[str, int]:
    """The coordinates ``c`` take in ``model``, by mesh axis."""
    return {n: model_int(model, digits.value(c, n)) for n in digits.mesh_sizes}
