"""Pipelines in the automatic search: the stage axis, the microbatch count and the schedule as its actions.

A pipeline changes the traced program (:mod:`partir_core.pipeline`: the layer scan becomes a pipelined loop), so
it is no action on the one graph the tree search explores: :func:`lower` tries pipelines around that search.
Where the step has a *layer scan* (:func:`layer_scan`: a forward scan over stacked parameter inputs whose carry
has a batch dim, a dim group reached by data inputs only), it proposes a few (:func:`candidates`): on every search
axis that no tactic before the search uses and whose size ``S`` divides the layers, GPipe with ``M = S, 2S,
4S`` microbatches and circular with 2 repeats and ``M = S, 2S`` (those ``M`` that divide the batch). Each is composed with the search's result on the
other axes (its tactics on an axis overlapping the stage axis dropped), lowered and simulated on the search's hardware; the fastest that fits the memory budget is the result
if it is faster than the search's own (or the search found nothing that fits). The result then lists the
:class:`~partir_core.Pipeline` first in :attr:`AutoResult.tactics` and :attr:`AutoResult.code`, and its
:attr:`AutoResult.candidates` start with it, then the search's own; its ``stats``
(:class:`~partir_core.automatic.SearchStats`) give every pipeline's simulated step time and peak
(``stats.pipelines``) and those of the search's own result (``stats.spmd``). On a step without a layer scan the
search's result is returned as it is.

All this is within the tactic's ``time_budget_s``, counted from the start of the lowering: the search leaves
:data:`PIPELINE_SHARE` of it to the pipelines where any may be tried, and they are tried in the order above
while the next, if it took as long as the slowest before it, would end in time (``stats.pipelines_left``: those
left untried).
"""

from __future__ import annotations

import time
from dataclasses import replace

from partir_core import ir
from partir_core.analysis import analyze_groups, input_kinds
from partir_core.automatic.actions import search_axes
from partir_core.automatic.result import AutoResult, Candidate, MemoryBudgetError
from partir_core.factors import overlap
from partir_core.pipeline import Pipeline
from partir_core.registry import rule_for
from partir_core.tactics import AutomaticPartition, ManualPartition, PartitionError

MICROBATCHES = {"gpipe": (1, 2, 4), "circular": (1, 2)}  # per schedule: the microbatch counts tried, in stages
CIRCULAR_REPEATS = 2
PIPELINE_SHARE = 0.3  # of the time budget, kept from the search for the pipelines where any may be tried


def lower(pf, call, lower_with, started: float):
    """The :class:`~partir_core.Partitioned` of ``pf``'s schedule on ``call`` (a
    :class:`~partir_core.arguments.Call`; ``lower_with(schedule, plain, deadline)`` lowers a schedule, the step
    traced plainly already where ``plain`` is given, its search ending by ``deadline``), a pipeline tried where
    the schedule has one :class:`AutomaticPartition` and no :class:`~partir_core.Pipeline` (see the module
    docstring). Its ``time_budget_s`` counts from ``started`` (a ``time.perf_counter()``, before tracing): where
    pipelines may be tried, the search ends :data:`PIPELINE_SHARE` of it early, and they are tried while each,
    lowered as long as the slowest before it (the first: at once), ends by then. Raises the search's
    :class:`MemoryBudgetError` when neither its result nor a pipeline fits the budget."""
    schedule = pf.schedule
    autos = [k for k, t in enumerate(schedule) if isinstance(t, AutomaticPartition)]
    if len(autos) != 1 or any(isinstance(t, Pipeline) for t in schedule):
        return lower_with(schedule)
    k = autos[0]
    tactic = schedule[k]
    graph = ir.trace(call.function(pf.fn), call.args, call.kwargs)
    deadline = started + float(tactic.time_budget_s)
    share = PIPELINE_SHARE if candidates(graph, pf.mesh, tactic, schedule[:k], []) else 0.0
    try:
        base, error = lower_with(schedule, graph, deadline - share * float(tactic.time_budget_s)), None
        found = base.automatic
    except MemoryBudgetError as e:
        base, error, found = None, e, e.result
    pipes = candidates(graph, pf.mesh, tactic, schedule[:k], found.actions)
    if not pipes:
        if error is not None:
            raise error
        return base
    best, tried, slowest = None, [], 0.0
    for n, (pipe, rest) in enumerate(pipes):
        t_start = time.perf_counter()
        if t_start + slowest > deadline:
            found.stats.pipelines_left = len(pipes) - n
            break
        try:
            low = lower_with([*schedule[:k], pipe, *(a.tactic for a in rest), *schedule[k + 1:]], graph)
            sim = low.simulate(tactic.hardware)
        except PartitionError:  # a step this candidate cannot pipeline
            continue
        finally:
            slowest = max(slowest, time.perf_counter() - t_start)
        tried.append((str(pipe), sim.step_time_s, sim.peak_bytes))
        fits = tactic.memory_budget_bytes is None or sim.peak_bytes <= tactic.memory_budget_bytes
        if fits and (best is None or sim.step_time_s < best[2].step_time_s):
            best = (pipe, rest, sim, low)
    found.stats.pipelines = tried
    found.stats.spmd = (found.step_time_s, found.peak_bytes)
    if best is None or (base is not None and found.step_time_s <= best[2].step_time_s):
        if error is not None:
            raise error
        return base
    return _reported(pf.schedule, k, found, *best)


def _reported(schedule, k: int, found: AutoResult, pipe: Pipeline, rest: list, sim, low):
    """``low`` (lowered with ``pipe`` and the tactics of the actions ``rest`` in place ``k`` of ``schedule``) as
    the search's result in that place: its states those after each of ``schedule``'s tactics, its
    :class:`AutoResult` ``found``'s with those tactics and ``sim``'s figures, its candidates ``found``'s after
    its own."""
    tactics = [pipe, *(a.tactic for a in rest)]
    states = low.states[:k + 1] + low.states[k + len(tactics):]
    chosen = Candidate(tuple(rest), sim.step_time_s, sim.peak_bytes, True, pipe)
    result = replace(found, tactics=tactics, actions=list(rest), step_time_s=sim.step_time_s,
                     peak_bytes=sim.peak_bytes, candidates=[chosen, *found.candidates], state=None, analysis=None)
    pipelined = type(low)(low.graph, low.rules, low.mesh, schedule, states, low.program, [result], low.function,
                          low.call)
    result.render = pipelined.renderer(k + 1)
    return pipelined


def layer_scan(graph) -> tuple | None:
    """``(layers pattern, {batch input path: dim}, layers, batch size)`` of the step's layer scan, or None: the
    first forward scan over stacked parameter inputs that one path pattern names exactly (:func:`_pattern`),
    every carry leaf of which has a dim in one dim group reached by data inputs only (:func:`_batch`)."""
    names = dict(zip(graph.invars, graph.in_paths))
    kinds = input_kinds(graph)
    groups = None
    for reg in graph.regions:
        if reg.kind != "scan" or reg.params.get("reverse"):
            continue
        enter = graph.eqns[reg.enter]
        params = [names[enter.invars[i]] for i, _, stacked in enter.params["ties"]
                  if stacked and enter.invars[i] in names and kinds[names[enter.invars[i]]] == "param"]
        pattern = _pattern(graph, params) if params else None
        if pattern is None:
            continue
        groups = groups or analyze_groups(graph, [rule_for(e, graph) for e in graph.eqns])
        batch = _batch(graph, groups, reg)
        if batch is not None:
            return pattern, batch[0], reg.trip_count, batch[1]
    return None


def _pattern(graph, paths: list) -> str | None:
    """A pattern that matches the inputs ``paths`` and no other: the path of one, or the leading path components
    they share followed by ``/*``; None where that matches other inputs."""
    if len(paths) == 1:
        return paths[0]
    common = []
    for parts in zip(*(p.split("/") for p in paths)):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    pattern = "/".join([*common, "*"])
    return pattern if sorted(p for p, _ in graph.inputs_matching(pattern)) == sorted(paths) else None


def _batch(graph, groups, reg) -> tuple | None:
    """``({data input path: dim}, batch size)``: the one dim group that a dim of every carry leaf of ``reg`` is
    in and that only data inputs reach (each leaf's first such dim); None where there is none."""
    found = None
    for c in reg.carry:
        dims = (groups.find(c, d) for d in range(len(graph.shape(c))))
        g = next((g for g in dims if g is not None and g.inputs
                  and all(groups.kinds[p] == "data" for p, _ in g.inputs)), None)
        if g is None or (found is not None and g.id != found.id):
            return None
        found = g
    return None if found is None else (dict(found.inputs), found.size)


def candidates(graph, mesh, tactic: AutomaticPartition, before: list, found: list) -> list[tuple]:
    """``(pipeline, actions)`` to try on ``graph`` for ``tactic`` after the tactics ``before``, ``actions`` those
    of the search's result ``found`` (its actions) on the other axes (see the module docstring), in a fixed
    order."""
    scan = layer_scan(graph)
    if scan is None:
        return []
    pattern, batch, layers, size = scan
    used = [t.axis for t in before if isinstance(t, ManualPartition)]
    out = []
    for axis in search_axes(replace(tactic, sub_axes=False), mesh):
        s = mesh.axis_size(axis)
        if s < 2 or any(overlap(mesh, axis, u) for u in used):
            continue
        rest = [a for a in found if not overlap(mesh, a.axis, axis)]
        for schedule, repeats in (("gpipe", 1), ("circular", CIRCULAR_REPEATS)):
            if layers % (s * repeats):
                continue
            for m in (f * s for f in MICROBATCHES[schedule]):
                if size % m == 0:
                    out.append((Pipeline(layers=pattern, axis=axis, microbatches=m, schedule=schedule,
                                         repeats=repeats, batch=batch), rest))
    return out
