"""Proofs that a partitioned program computes its function: ``Partitioned.verify(reference=None, timeout_s=None)``.

A translation validation of the lowered local program (:class:`~partir_core.program.LocalProgram`) against a
reference, by a block invariant: every buffer holds, on every device, the block of one global value that its
sharding type assigns to the device (a pending type: a summand, a partial maximum or minimum).

- :mod:`~partir_core.proof.lemmas`: the lemmas, proved once with symbolic sizes (Z3);
- :mod:`~partir_core.proof.rules`: the proved local forms, per primitive, written independently of the
  registry;
- :mod:`~partir_core.proof.movement`: local ops that move elements between devices (the static permutation
  of a pipeline's stage rotation), proved by running them on element ids;
- :mod:`~partir_core.proof.invariant`: the walk of the instructions that checks the invariant, each reshard
  by :func:`redist.verify.verify_program`, each loop body once with its carries' types as the loop invariant (a
  pipelined loop's too), what each device runs traced once per
  :mod:`~partir_core.proof.fingerprint` of it;
- :mod:`~partir_core.proof.reference`: a reference function's alignment with the program's own graph, and the
  numeric witness a refutation rests on;
- :mod:`~partir_core.proof.verdict`: the :class:`~redist.verify.Verdict` and how ops are named in it.

:func:`verify`'s answer is ``"proved"`` only when every instruction is covered by a proved rule or a proved
plan and the reference aligns with the program's graph; ``"refuted"`` only with a witness (random inputs on
which the partitioned program and the reference differ), naming the reference's op where the two part ways or,
where they align, the op where the walk stopped (the first whose blocks it could not account for);
``"undecided"`` otherwise, saying what is not covered. What is proved once is kept for the process (plan
verdicts, traces, movement checks; :func:`clear_caches` forgets them).
"""

from __future__ import annotations

import time

import jax

from redist.verify import checked_timeout
from redist.verify.solver import Deadline
from redist.verify.verdict import Undecided

from partir_core import ir, pipeline
from partir_core.pipeline import Pipeline
from partir_core.proof.invariant import Walk, clear_caches
from partir_core.proof.reference import align, witness, witness_inputs
from partir_core.proof.verdict import NotProved, Verdict, op_name
from partir_core.tactics import PartitionError

__all__ = ["verify", "Verdict", "clear_caches"]


def verify(partitioned, reference=None, timeout_s: float | None = None) -> Verdict:
    """The verdict on ``partitioned`` (a :class:`~partir_core.Partitioned`) against ``reference`` (None: the
    function it was traced from; else a function of the same signature, traced on the same arguments), within
    ``timeout_s`` seconds (None: no bound). See the module docstring. Raises :class:`~redist.ShardingError` for
    a ``timeout_s`` that is no number of seconds > 0, :class:`PartitionError` for a reference that cannot be
    traced on the step's arguments."""
    deadline = Deadline(checked_timeout(timeout_s), time.perf_counter())
    walk = Walk(partitioned.program, deadline)
    stopped = None
    try:
        details = walk.run()
        status, reason = "proved", "every device holds the block its type assigns of every value"
        if partitioned.graph.pipelines:
            reason += (" of the step as traced, its layer scan run as the pipelined loop of a Pipeline (that "
                       "rewrite of the scan is not part of the proof)")
    except NotProved as e:
        where = "" if e.eqn is None else f"{op_name(partitioned.graph, e.eqn)}: "
        status, reason, details, stopped = "undecided", f"not proved: {where}{e.reason}", {"eqn": e.eqn}, e
    except Undecided as e:
        return Verdict("undecided", e.reason, None, deadline.elapsed(), {})
    if reference is None:
        if stopped is not None:
            return _unproved(partitioned, partitioned.function, stopped, reason, details, deadline)
        return Verdict(status, reason, None, deadline.elapsed(), details)
    return _against(partitioned, reference, stopped, status, reason, details, deadline)


def _unproved(partitioned, reference, stopped: NotProved, reason, details, deadline) -> Verdict:
    """The verdict on a program whose walk ``stopped`` (a check that does not hold or cannot be made), against
    ``reference``, a function its graph aligns with: refuted where a run on random inputs differs from the
    reference's, naming the op where the walk stopped (the first whose blocks the proof could not account for);
    else undecided, with the walk's ``reason``."""
    found = None if time.perf_counter() >= deadline.end else _witness(partitioned, reference, False)
    if found is None:
        return Verdict("undecided", reason, None, deadline.elapsed(), details)
    graph, eqn = partitioned.graph, stopped.eqn
    at = "a reshard, a finish, or the program's inputs or outputs" if eqn is None else op_name(graph, eqn)
    cx = {"op": at, "eqn": eqn, "source": None if eqn is None else graph.eqns[eqn].source, "why": stopped.reason,
          **found}
    return Verdict("refuted", f"the partitioned program does not compute its function: the proof stops at {at} "
                   f"({stopped.reason}); on random inputs {_differing(found)}", cx, deadline.elapsed(), details)


def _differing(found: dict) -> str:
    if found["output"] is None:
        return f"the program {found['program']}, the reference {found['reference']}"
    return (f"output {found['output']} differs at {found['index']}: {found['program']} against "
            f"{found['reference']}")


def _against(partitioned, reference, stopped, status, reason, details, deadline) -> Verdict:
    """The verdict against a ``reference`` function, given the walk's (``status``, ``reason``; ``stopped``: the
    check it stopped at, or None)."""
    graph = partitioned.graph
    ref = _traced(partitioned, reference)
    parting = align(graph, ref)
    if parting is None:
        reason += "; the reference aligns with the program op for op"
        if stopped is not None:
            return _unproved(partitioned, reference, stopped, reason, details, deadline)
        return Verdict(status, reason, None, deadline.elapsed(), details)
    at = "the outputs" if parting.eqn is None else op_name(ref, parting.eqn)
    found = _witness(partitioned, reference, status == "proved")
    if found is None:
        return Verdict("undecided", f"the reference parts ways with the program at {at}: {parting.why}; but the "
                       "two agree on random inputs (or could not be run), so nothing is known", None,
                       deadline.elapsed(), details)
    cx = {"op": at, "eqn": parting.eqn, "source": None if parting.eqn is None else ref.eqns[parting.eqn].source,
          "why": parting.why, **found}
    return Verdict("refuted", f"the partitioned program does not compute the reference: they part ways at {at} "
                   f"({parting.why}); on random inputs {_differing(found)}", cx, deadline.elapsed(), details)


def _traced(partitioned, reference):
    """``reference`` traced on the program's arguments as its function was: its layer scan pipelined as the
    program's is (a reference that cannot be pipelined so: traced as it is)."""
    call = partitioned.call
    pipes = [t for t in partitioned.schedule if isinstance(t, Pipeline)]
    pipes += [t for a in partitioned.automatic_results for t in a.tactics if isinstance(t, Pipeline)]
    if partitioned.graph.pipelines and pipes:
        try:
            return pipeline.trace(call.function(reference), call.args, call.kwargs, pipes[:1], partitioned.mesh)
        except PartitionError:
            pass
    try:
        return ir.trace(call.function(reference), call.args, call.kwargs)
    except TypeError as e:
        raise PartitionError(f"verify: the reference {getattr(reference, '__name__', reference)!r} cannot be "
                             f"traced on the step's arguments: {e}") from None


def _witness(partitioned, reference, proved: bool) -> dict | None:
    """:func:`~partir_core.proof.reference.witness` of the partitioned program against ``reference``: the
    program itself where JAX has the devices, else the function it was traced from when the walk proved the
    program computes it (and it was traced as it is: no pipelined loop); None where neither can run, or where
    one fails."""
    graph, call = partitioned.graph, partitioned.call
    n_args = len(call.args)

    def as_call(leaves):
        values = jax.tree_util.tree_unflatten(graph.in_tree, leaves)
        return values[:n_args], dict(zip(call.kwargs, values[n_args:]))

    def run_reference(leaves):
        args, kwargs = as_call(leaves)
        return jax.tree_util.tree_leaves(jax.jit(call.function(reference))(*args, **kwargs))

    if len(jax.devices()) >= partitioned.mesh.size:
        def run_program(leaves):
            return list(partitioned.program.run(*leaves))
    elif proved and not graph.pipelines:
        def run_program(leaves):
            args, kwargs = as_call(leaves)
            return jax.tree_util.tree_leaves(jax.jit(call.function(partitioned.function))(*args, **kwargs))
    else:
        return None
    try:
        return witness(run_program, run_reference, witness_inputs(graph))
    except Exception:  # noqa: BLE001 - a program or reference that fails to run gives no witness
        return None
