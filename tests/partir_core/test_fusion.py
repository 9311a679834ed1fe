"""The simulator's fusion decisions (:func:`partir_core.simulator.materialized`, one walk that hands each kernel's
reach to its operands) are their definition (the simulator's module docstring), worked out here the plain way:
whether a buffer is materialized asked of its readers, recursively, on every preset of five models, on random
states, and inside loops."""

import functools

import pytest

import jax

from tests.partir_core.test_estimate import MESHES, PRESETS, model, preset, random_sets, schedule_state
import partir_core as pc
from partir_core.choice import analyze
from partir_core.lowering import lower
from partir_core.program import Compute, ControlFlow, Reshard, reads_of
from partir_core.simulator import EXPENSIVE, FUSIBLE, TAKES_FUSED, _library_reduction, materialized


def by_definition(program) -> set:
    """The materialized buffers of ``program``: inputs, outputs, reshard results, loops' results and bodies'
    parameters and results, and each result of an op that is not fusible, that nothing reads, that some reader
    cannot take fused, or that reaches several kernels (its readers', through the fused values they write) when
    its op is expensive or one of those kernels is a library reduction."""
    g = program.graph
    names = g.primitives()

    def block(steps, out):
        out = set(out)
        readers: dict = {}
        producer = {}
        for t, ins in enumerate(steps):
            for b in reads_of(ins):
                readers.setdefault(b, []).append(t)
            if type(ins) is Compute:
                producer.update((b, t) for b in ins.writes)
            elif isinstance(ins, Reshard):
                out.add(ins.dst_buf)
            elif isinstance(ins, ControlFlow):
                out.update(ins.writes)
                params = set(g.eqns[g.regions[ins.region].enter].outvars)
                for body, results in zip(ins.bodies, ins.results):
                    out |= block(body, params | set(results))

        def name(t):
            return names[steps[t].eqn_index]

        @functools.cache
        def kernels(b) -> frozenset:
            found = set()
            for r in readers[b]:
                ws = steps[r].writes
                if not ws or any(mat(w) for w in ws):
                    found.add(r)
                else:
                    for w in ws:
                        found |= kernels(w)
            return frozenset(found)

        def library(t):
            ins = steps[t]
            return _library_reduction(name(t), program.buf_bytes.get(ins.reads[0], 0), g.dtype(ins.writes[0]))

        @functools.cache
        def mat(b) -> bool:
            t = producer[b]
            rs = readers.get(b, [])
            if b in out or name(t) not in FUSIBLE or not rs:
                return True
            if any(type(steps[r]) is not Compute or name(r) not in TAKES_FUSED for r in rs):
                return True
            ks = kernels(b)
            return len(ks) > 1 and (name(t) in EXPENSIVE or any(library(k) for k in ks))

        return out | {b for b in producer if mat(b)}

    return block(program.instructions, set(g.invars) | set(program.out_bufs)) - set(g.consts)


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("name", ["mlp", "transformer", "gnn", "flax_lm", "scanned_transformer"])
def test_materialized_buffers_are_their_definition_on_every_preset(name, mesh_name):
    mesh = MESHES[mesh_name]
    m, ins = model(name)
    checked = fused = 0
    for p in ["", *PRESETS[mesh_name]]:
        tactics = preset(p, m, ins, mesh) if p else []
        if tactics is None:
            continue
        program = pc.jit(m.step, mesh, tactics).lower(*ins).program
        got = materialized(program)
        assert got == by_definition(program), p
        checked += 1
        fused += len(program.buf_bytes) - len(got)
    assert checked >= len(PRESETS[mesh_name]) - 1 and fused > 0  # some values are fused: a case worth checking


@pytest.mark.parametrize("name", ["transformer", "scanned_transformer"])
def test_materialized_buffers_are_their_definition_on_random_states(name):
    mesh = MESHES["2x4"]
    m, ins = model(name)
    low = pc.jit(m.step, mesh, []).lower(*ins)
    graph, rules = low.graph, low.rules
    for chain in random_sets(graph, rules, mesh, seed=7, n=4, depth=3):
        state = schedule_state(graph, rules, mesh, [a.tactic for a in chain])
        program = lower(graph, analyze(graph, rules, state, mesh), mesh)
        assert materialized(program) == by_definition(program)
