"""Lowering: from the per-op choices (:mod:`partir_core.choice`) to one SPMD program of local ops and moves.

:func:`lower` turns an :class:`~partir_core.choice.Analysis` into a :class:`~partir_core.program.LocalProgram`:
in program order, every operand whose type does not fit what its op needs is moved there
(:class:`~partir_core.program.Reshard`, a redist plan from :mod:`partir_core.reshard`; a buffer moved to one
type is moved once and the copy reused), the op runs on local shards (:class:`~partir_core.program.Compute`),
and a max/min reduction over a split dim is finished (:class:`~partir_core.program.Finish`). Pending sums
become ``all_reduce`` / ``reduce_scatter`` this way, when consumed by an op that needs a non-partial operand,
and at the outputs, which get the types propagation gives them.
"""

from __future__ import annotations

from partir_core import reshard
from partir_core.choice import Analysis, OpSharding, local_shapes, output_type
from partir_core.ir import Graph
from partir_core.program import Compute, Finish, LocalProgram, Reshard
from partir_core.propagation import State
from partir_core.registry import flops


def lower(graph: Graph, analysis: Analysis, mesh, state: State | None = None) -> LocalProgram:
    """The local program of ``analysis``. A reshard of one buffer to one type is made once and its result
    reused by every later reader. Outputs are given the type propagation gives them (``state``; without
    it, their producer's type with pending sums reduced). Raises :class:`redist.ShardingError` if a value
    must reach a type no redistribution can give it."""
    types = analysis.types
    state = analysis.state if state is None else state
    instructions: list = []
    buf_bytes = {v: t.local_bytes for v, t in types.items()}
    fallbacks = []
    made: dict = {}  # (buffer, type) -> the buffer holding it

    def move(buf, src, dst, where):
        if src == dst:
            return buf
        if (buf, dst) not in made:
            m = reshard.move(src, dst)
            if m.fallback is not None:
                fallbacks.append((where, str(src), str(dst), m.fallback))
            new = ("r", len(made) + 1)
            buf_bytes[new] = dst.local_bytes
            instructions.append(Reshard(buf, new, m, [reshard.Collective(k, a, b, where) for k, a, b in m.collectives]))
            made[(buf, dst)] = new
        return made[(buf, dst)]

    for i, (eqn, op) in enumerate(zip(graph.eqns, analysis.ops)):
        where = f"eqn {i} ({eqn.name})"
        reads = [move(v, types[v], t, where) for v, t in zip(eqn.invars, op.in_types)]
        f = flops(eqn.name, local_shapes(graph, eqn.invars, op.in_types),
                  local_shapes(graph, eqn.outvars, op.out_types), eqn.params)
        instructions.append(Compute(i, reads, list(eqn.outvars), _masks(op), f))
        for kind, axes in op.finish:
            b = reshard.finish_bytes(axes, op.out_types)
            instructions.append(Finish(eqn.outvars[0], kind, tuple(axes),
                                       [reshard.Collective("all_reduce_" + kind, tuple(axes), b, where)]))
    out_types, out_bufs = [], []
    for j, v in enumerate(graph.outvars):
        dst = output_type(graph, analysis, state, v, mesh)
        out_bufs.append(move(v, types[v], dst, f"output {j}"))
        out_types.append(dst)
    in_types = [types[v] for v in graph.invars]
    return LocalProgram(graph, mesh, analysis, instructions, in_types, out_types, out_bufs, buf_bytes, fallbacks)


def _masks(op: OpSharding) -> list:
    """The operand dims of ``op`` whose padding must be masked: split unevenly and reduced over by the op."""
    if op.rule is None:
        return []
    out = []
    for i, (dims, t) in enumerate(zip(op.rule.operands, op.in_types)):
        for d, fs in enumerate(dims):
            kinds = {op.rule.reduce[f] for f in fs if f in op.rule.reduce and f in op.use}
            if kinds and not t.is_even(d):
                (kind,) = kinds
                out.append((i, d, kind))
    return out
