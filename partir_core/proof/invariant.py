"""The block invariant of a local program, checked by walking its instructions once.

Invariant: every buffer the walk knows holds, on every device, the block of one value of the global program
that its type assigns to that device (a pending type: a summand of it, or a partial maximum / minimum). The
walk reads the program as :class:`~partir_core.program.LocalProgram` runs it, and nothing it declares is
taken on trust: each instruction's effect is derived from the types its operands are *held* in.

- Start: each input buffer holds its input in its input type (the ``shard_map``'s ``in_specs``, never
  pending); each constant is replicated.
- ``Reshard``: its buffer must hold the plan's source type; the program the device runs (``plan.program``)
  must be proved by :func:`redist.verify.verify_program` to take that type to the plan's destination type
  (each distinct program once, cached); the new buffer holds the same value in the destination type.
- ``Compute``: its buffers must hold the equation's operands, in the types the program declares for them (the
  local shapes and block offsets it runs with come from those); a proved local form
  (:mod:`partir_core.proof.rules`) must cover those types, give the types the program declares for the
  results (a pending maximum or minimum where it declares the finished one), ask for no padding mask the
  program does not apply, and its template must trace to the very jaxpr, constants included, of what the
  program runs on the device (:meth:`~partir_core.program.LocalProgram.local_op`); a form that moves
  elements between devices (a static permutation: a pipeline's stage rotation) has no template, and what the
  device runs is proved by running it on element ids (:mod:`partir_core.proof.movement`). Each trace and
  each such check is made once per :mod:`~partir_core.proof.fingerprint` of what it is (an unrolled model's
  layers share them, and so do the programs of one session). The results are then held in the form's types.
- ``Finish``: the buffer must hold a pending maximum / minimum over exactly its axes; it then holds the value.
- ``ControlFlow``: each operand must hold the enter's operand (not pending; a scan's stacked dim whole); each
  body parameter then holds its type (a stacked ``xs``: less its leading dim). Each body is walked once, from
  the buffers around it and its parameters; its results must be held in the types the loop assumed of its
  carries (the loop invariant: a carry leaves each iteration in the type it entered with), a ``while``'s
  predicate and a ``cond``'s index replicated (every device takes the same path), every branch of a ``cond``
  giving the same types; a scan's ``ys`` are stacked (a pending sum stays one).
- End: each output buffer must hold its output in its output type, not pending (``out_specs``).

So, by induction over the instructions (and over iterations for loops), the outputs are the global program's.
"""

from __future__ import annotations

import jax
from jax.extend.core import ClosedJaxpr

from redist.verify import verify_program
from redist.verify.solver import Deadline

from partir_core.choice import value_type
from partir_core.program import Compute, ControlFlow, Finish, Reshard
from partir_core.proof import lemmas, movement
from partir_core.proof.fingerprint import fingerprint
from partir_core.proof.rules import NotCovered, Site, local_forms
from partir_core.proof.verdict import NotProved, op_name
from partir_core.reshard import AxisNames

PLAN_CACHE_SIZE = 1 << 12
_plans: dict = {}  # (src, dst) -> (plan program, verdict): each distinct plan verified once per process


def plan_verdict(plan, deadline: Deadline):
    """:func:`redist.verify.verify_program`'s verdict on the program ``plan`` runs in a partitioned program
    (``plan.program``, what :func:`partir_core.reshard.run` runs; its costs not checked) from ``plan.src`` to
    ``plan.dst``, cached per (source, destination) and that program; an undecided verdict is not kept."""
    key = (plan.src, plan.dst)
    program = plan.program
    hit = _plans.get(key)
    if hit is not None and hit[0] == program:
        return hit[1]
    left = None if deadline.timeout_s is None else max(deadline.timeout_s - deadline.elapsed(), 1e-3)
    v = verify_program(program, plan.src, plan.dst, timeout_s=left)
    if v.status != "undecided":
        if len(_plans) >= PLAN_CACHE_SIZE:
            _plans.clear()
        _plans[key] = (program, v)
    return v


class Walk:
    """One walk of ``program``'s instructions (see the module docstring); :meth:`run` raises
    :class:`NotProved` at the first check that does not hold, and counts what it proved in ``stats``."""

    def __init__(self, program, deadline: Deadline):
        self.program = program
        self.graph = program.graph
        self.mesh = program.mesh
        self.deadline = deadline
        self.names = AxisNames({a: (a,) for a in self.mesh.names})
        self.axis_env = [(a, n) for a, n in self.mesh.axes]
        self.stats = {"local ops": 0, "reshards": 0, "plans verified": set(), "finishes": 0, "loops": 0,
                      "lemmas": set()}

    def run(self) -> dict:
        g, p = self.graph, self.program
        held: dict = {}
        for v, t in zip(g.invars, p.in_types):
            if t.partial or t != self._typed(v, t):
                raise NotProved(f"input %{v} is given in {t}, which is pending or not its shape")
            held[v] = (v, t)
        for v in g.consts:
            held[v] = (v, self._typed(v, None))
        self.block(p.instructions, held)
        for j, (v, buf, t) in enumerate(zip(g.outvars, p.out_bufs, p.out_types)):
            if t.partial:
                raise NotProved(f"output {j} is returned pending in {t}")
            self._expect(held, buf, v, t, f"output {j}")
        stats = dict(self.stats)
        stats["plans verified"] = len(stats["plans verified"])
        stats["lemmas"] = sorted(stats["lemmas"])
        return stats

    def _typed(self, v, t):
        """Value ``v``'s type with ``t``'s value dims (whole where ``t`` is None), never pending."""
        rank = len(self.graph.shape(v))
        dims = ((),) * rank if t is None else tuple(t.dims[:rank])
        return value_type(self.graph, v, self.mesh, dims)

    def _held(self, held, buf, value, where: str, eqn=None):
        if buf not in held:
            raise NotProved(f"{where} reads buffer {buf!r}, which holds nothing yet", eqn)
        v, t = held[buf]
        if v != value:
            raise NotProved(f"{where} reads buffer {buf!r} as %{value}, but it holds %{v}", eqn)
        return t

    def _expect(self, held, buf, value, t, where: str, eqn=None):
        have = self._held(held, buf, value, where, eqn)
        if have != t:
            raise NotProved(f"{where}: buffer {buf!r} holds %{value} in {have}, not in {t}", eqn)

    def block(self, instructions, held: dict) -> None:
        for ins in instructions:
            self.deadline.check("walking the local program")
            if isinstance(ins, Reshard):
                self.reshard(ins, held)
            elif isinstance(ins, Compute):
                self.compute(ins, held)
            elif isinstance(ins, Finish):
                self.finish(ins, held)
            elif isinstance(ins, ControlFlow):
                self.control_flow(ins, held)
            else:
                raise NotProved(f"an instruction of unknown kind {type(ins).__name__}")

    def reshard(self, ins: Reshard, held: dict) -> None:
        if ins.src_buf not in held:
            raise NotProved(f"a reshard reads buffer {ins.src_buf!r}, which holds nothing yet")
        v, t = held[ins.src_buf]
        plan = ins.move.plan
        where = f"the reshard of %{v} from {plan.src} to {plan.dst}"
        if plan.src != t:
            raise NotProved(f"{where} reads a buffer held in {t}")
        verdict = plan_verdict(plan, self.deadline)
        if not verdict.ok:
            raise NotProved(f"{where}: redist.verify says {verdict.status}: {verdict.reason}")
        self.stats["reshards"] += 1
        self.stats["plans verified"].add((plan.src, plan.dst))
        held[ins.dst_buf] = (v, plan.dst)

    def compute(self, ins: Compute, held: dict) -> None:
        g, i = self.graph, ins.eqn_index
        eqn, op = g.eqns[i], self.program.analysis.ops[i]
        if list(ins.writes) != list(eqn.outvars) or len(ins.reads) != len(eqn.invars):
            raise NotProved("it writes or reads other buffers than its equation's", i)
        types = [self._held(held, b, v, f"operand {k}", i) for k, (b, v) in enumerate(zip(ins.reads, eqn.invars))]
        if list(op.in_types) != types:
            raise NotProved(f"it runs with operand types {[str(t) for t in op.in_types]}, but its buffers hold "
                            f"{[str(t) for t in types]}", i)
        site = Site(g, eqn, types, list(op.out_types), self.mesh, self.names)
        try:
            forms = local_forms(site)
        except NotCovered as e:
            raise NotProved(f"no proved local form covers it: {e}", i) from None
        runs = _Runs(self, i, eqn, op, types)
        masks = {tuple(m) for m in ins.masks}
        why = []
        for form in forms:
            if not all(_declares(d, t) for d, t in zip(op.out_types, form.out_types)):
                why.append(f"{form.lemma} gives {[str(t) for t in form.out_types]}, the program declares "
                           f"{[str(t) for t in op.out_types]}")
            elif not form.masks <= masks:
                why.append(f"{form.lemma} needs the padding masks {sorted(form.masks - masks)}")
            elif not lemmas.proved(form.lemma):
                why.append(f"the {form.lemma} lemma is not proved")
            elif (differs := runs.differs(form)) is not None:
                why.append(differs)
            else:
                for v, t in zip(eqn.outvars, form.out_types):
                    held[v] = (v, t)
                self.stats["local ops"] += 1
                self.stats["lemmas"].add(form.lemma)
                return
        raise NotProved("; ".join(why), i)

    def finish(self, ins: Finish, held: dict) -> None:
        if ins.buf not in held:
            raise NotProved(f"a finish reads buffer {ins.buf!r}, which holds nothing yet")
        v, t = held[ins.buf]
        try:
            same = t.partial and t.reduction == ins.kind and t.replace(partial=tuple(ins.axes)) == t
        except Exception:  # noqa: BLE001 - axes that make no type are not the pending ones
            same = False
        if not same:
            raise NotProved(f"the all_reduce_{ins.kind} over {ins.axes} of %{v} finds it held in {t}")
        self.stats["finishes"] += 1
        held[ins.buf] = (v, t.replace(partial=()))

    def control_flow(self, ins: ControlFlow, held: dict) -> None:
        g = self.graph
        reg = g.regions[ins.region]
        enter, exit_ = g.eqns[reg.enter], g.eqns[reg.exit]
        where = op_name(g, reg.enter)
        if ins.kind != reg.kind or len(ins.operands) != len(enter.invars) or list(ins.writes) != list(exit_.outvars):
            raise NotProved(f"the {ins.kind} at {where} is not its region's", reg.enter)
        params = {}
        for i, o, stacked in enter.params["ties"]:
            t = self._held(held, ins.operands[i], enter.invars[i], f"operand {i} of the {reg.kind}", reg.enter)
            if t.partial or (stacked and t.dims[0]):
                raise NotProved(f"operand {i} enters the {reg.kind} as {t}: pending, or split on its stacked dim",
                                reg.enter)
            p = enter.outvars[o]
            params[p] = value_type(g, p, self.mesh, tuple(t.dims[int(stacked):int(stacked) + len(g.shape(p))]))
        if reg.kind == "cond":
            t = self._held(held, ins.operands[0], enter.invars[0], "the cond's index", reg.enter)
            if t != self._typed(enter.invars[0], None):
                raise NotProved(f"the cond's index is held in {t}, not replicated", reg.enter)
        results = []
        for b, body in enumerate(ins.bodies):
            inner = dict(held)
            inner.update({p: (p, t) for p, t in params.items()})
            self.block(body, inner)
            results.append([self._held(inner, buf, v, f"result {j} of body {b}", reg.enter)
                            for j, (buf, v) in enumerate(zip(ins.results[b], reg.results[b]))])
        outs = self._region_types(reg, params, results)
        self.stats["loops"] += reg.kind != "cond"
        for v, t in zip(exit_.outvars, outs):
            held[v] = (v, t)

    def _region_types(self, reg, params: dict, results: list) -> list:
        """The types of a region's results, once its bodies' results are known to be held in ``results``;
        :class:`NotProved` where the loop invariant or the agreement of the devices on their path fails."""
        g = self.graph
        carries = [params[c] for c in reg.carry]

        def invariant(got):
            for k, (want, have) in enumerate(zip(carries, got)):
                if want != have:
                    raise NotProved(f"carry {k} of the {reg.kind} enters an iteration as {want} and leaves it as "
                                    f"{have}: not a loop invariant", reg.enter)

        if reg.kind == "scan":
            nk = len(reg.carry)
            invariant(results[0][:nk])
            ys = []
            for t, v in zip(results[0][nk:], reg.results[0][nk:]):
                if t.partial and t.reduction != "sum":
                    raise NotProved(f"a scan's output leaves it as a pending {t.reduction}", reg.enter)
                ys.append(t)
            exit_ = g.eqns[reg.exit]
            outs = exit_.outvars[nk:]
            return carries + [value_type(g, o, self.mesh, ((),) + tuple(t.dims[:len(g.shape(o)) - 1]), t.partial)
                              for o, t in zip(outs, ys)]
        if reg.kind == "while":
            (pred,) = results[0]
            if pred != self._typed(reg.results[0][0], None):
                raise NotProved(f"the while loop's predicate is held in {pred}, not replicated", reg.enter)
            invariant(results[1])
            return carries
        first = results[0]
        for b, got in enumerate(results[1:], start=1):
            if got != first:
                raise NotProved(f"branch {b} of the cond gives {[str(t) for t in got]}, branch 0 "
                                f"{[str(t) for t in first]}", reg.enter)
        return first


def _declares(declared, t) -> bool:
    """Whether the program's declared result type fits the form's: equal, or the finished value of a pending
    maximum / minimum (which a ``Finish`` must complete)."""
    if t.partial and t.reduction in ("max", "min"):
        return declared == t.replace(partial=())
    return declared == t


class _Runs:
    """What the device runs for one equation of a walk, compared with the proved forms (see the module
    docstring): traced once per fingerprint (:mod:`partir_core.proof.fingerprint`) of what it is, as is each
    form's template and each movement check."""

    def __init__(self, walk: Walk, i: int, eqn, op, types):
        self.walk, self.i, self.types = walk, i, types
        g = walk.graph
        self.avals = [jax.ShapeDtypeStruct(t.local_shape[:len(g.shape(v))], g.dtype(v))
                      for v, t in zip(eqn.invars, types)]
        params = fingerprint(eqn.params)
        local = op.rule.local if op.rule is not None else None
        runs = ("bind",) if local is None else fingerprint(local)
        self.site = None if params is None else (
            eqn.name, params, tuple(g.avals[v] for v in (*eqn.invars, *eqn.outvars)), tuple(types),
            tuple(op.out_types), tuple(walk.axis_env))
        self.key = None if self.site is None or runs is None else (self.site, tuple(op.new_partial), runs)

    def differs(self, form) -> str | None:
        """None where what the device runs is ``form``'s local form, else why not."""
        if form.source is not None:
            return _cached(_moved, self.key and (self.key, form.lemma), lambda: self._moves(form))
        runs = _cached(_traced, self.key and ("runs", self.key), self._trace_runs)
        mine = _cached(_traced, self.site and (form.lemma, self.site), lambda: self._trace(form.template))
        return None if mine == runs else f"what the device runs is not the {form.lemma} local form"

    def _trace_runs(self) -> str:
        return self._trace(self.walk.program.local_op(self.i, self.walk.names))

    def _trace(self, fn, text: bool = True):
        """The jaxpr of ``fn`` on the local operands (unless ``text`` is False: as :func:`_comparable`); where
        it does not trace, the exception's text, which matches no template."""
        try:
            closed = jax.make_jaxpr(fn, axis_env=self.walk.axis_env)(*self.avals)
        except Exception as e:  # noqa: BLE001 - a local op that does not trace is compared, and so not proved
            return f"<{type(e).__name__}: {e}>"
        return _comparable(closed) if text else closed

    def _moves(self, form) -> str | None:
        closed = self._trace(self.walk.program.local_op(self.i, self.walk.names), text=False)
        if isinstance(closed, str):
            return f"what the device runs does not trace: {closed}"
        try:
            movement.check(closed, self.walk.mesh, self.types[0], form.out_types[0], form.source)
        except movement.NotAMove as e:
            return f"what the device runs is not the {form.lemma}: {e}"
        return None


def _comparable(closed) -> tuple:
    """A closed jaxpr as a value equal only for the same computation: its text, and the fingerprints of its
    constants and of those of every jaxpr inside it (the text names constants without their values; a
    constant without a fingerprint makes the value equal to no other)."""
    consts = []

    def collect(c):
        for x in c.consts:
            f = fingerprint(x)
            consts.append(object() if f is None else f)
        for e in c.jaxpr.eqns:
            for v in e.params.values():
                for inner in v if isinstance(v, (tuple, list)) else (v,):
                    if isinstance(inner, ClosedJaxpr):
                        collect(inner)

    collect(closed)
    return str(closed), tuple(consts)


CACHE_SIZE = 1 << 14
_traced: dict = {}  # key -> jaxpr text, of what devices run and of the forms' templates
_moved: dict = {}  # key -> the movement check's answer


def clear_caches() -> None:
    """Forget the plan verdicts, traces and movement checks kept: the next walk starts cold."""
    for cache in (_plans, _traced, _moved):
        cache.clear()


def _cached(cache: dict, key, compute):
    """``compute()``, kept in ``cache`` under ``key`` (None: not kept)."""
    if key is None:
        return compute()
    if key not in cache:
        if len(cache) >= CACHE_SIZE:
            cache.clear()
        cache[key] = compute()
    return cache[key]
