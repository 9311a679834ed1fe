"""What the automatic search reports: its result (:class:`AutoResult`), or why no set fit the memory budget
(:func:`peak_report`: the smallest peak found and the buffers that dominate it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax

from partir_core.analysis import DimGroups
from partir_core.automatic.evaluation import Evaluation, Evaluator
from partir_core.choice import analyze
from partir_core.ir import key_name
from partir_core.lowering import lower
from partir_core.propagation import State
from partir_core.simulator import simulate


@dataclass
class AutoResult:
    """What an :class:`~partir_core.AutomaticPartition` found (``Partitioned.automatic``).

    ``tactics``: the chosen actions as manual tactics, in the order they apply (paste them into a schedule
    in place of the ``AutomaticPartition``); ``code``: the same as Python source; ``text``: the program after
    them; ``action_space``: sizes before and after grouping; ``groups``: the analysis; ``stats``: search
    statistics (evaluations, ``evals_per_s`` over the search's wall time and ``evals_per_cpu_s`` over its
    process time, ``scoring_ms`` per evaluation, cache hits, per-op choices remembered for the op
    (``op_choice_hits``), shared with another op of its signature (``op_choice_shared``) or made
    (``op_choice_misses``), templates, iterations, the local pass, seconds,
    why it stopped, best over time)."""

    tactics: list
    actions: list
    step_time_s: float
    peak_bytes: int
    memory_budget_bytes: int | None
    action_space: dict
    groups: DimGroups
    stats: dict
    start_time_s: float
    start_peak_bytes: int
    text: str = ""
    state: State | None = field(default=None, repr=False)

    @property
    def code(self) -> str:
        return "[\n" + "".join(f"    {t},\n" for t in self.tactics) + "]"

    def __str__(self):
        st = self.stats
        return (f"AutomaticPartition: {len(self.tactics)} tactic(s), simulated step "
                f"{self.step_time_s * 1e3:.4f} ms, peak {self.peak_bytes} B"
                + (f" (budget {self.memory_budget_bytes} B)" if self.memory_budget_bytes else "")
                + f"; from {self.start_time_s * 1e3:.4f} ms / {self.start_peak_bytes} B; "
                f"{st['evaluations']} evaluations in {st['seconds']:.1f} s ({st['stopped']}); "
                f"action space {self.action_space['values_dims_axes']} → {self.action_space['decisions_axes']}\n"
                + self.code)


def peak_report(ev: Evaluator, key: tuple, best: Evaluation, top: int = 4) -> str:
    """``"; the smallest peak found is ... with [...]: arguments ..., outputs ..., temporaries ...; largest: ..."``
    for the set ``key`` (empty when it could not be lowered at all)."""
    if best.error is not None:
        return f"; no state could be lowered ({best.error})"
    program = lower(ev.graph, analyze(ev.graph, ev.rules, ev.state(key), ev.mesh), ev.mesh)
    sim = simulate(program, ev.estimator.hardware)
    g = program.graph
    named = [(f"input {p}", program.buf_bytes[v]) for p, v in zip(g.in_paths, g.invars)]
    named += [(f"output {name}", program.buf_bytes[b])
              for name, b in zip(_output_names(g), program.out_bufs) if b not in g.invars]
    named.sort(key=lambda nb: -nb[1])
    largest = ", ".join(f"{n} {b} B" for n, b in named[:top])
    return (f"; the smallest peak found is {sim.peak_bytes} B with {[str(a) for a in key]} (arguments "
            f"{sim.argument_bytes} B, outputs {sim.output_bytes} B, temporaries {sim.temp_bytes} B; largest "
            f"buffers per device: {largest})")


def _output_names(graph) -> list[str]:
    """The outputs' pytree paths joined by ``/`` (``0/layers/0/w1`` for the first element of a returned tuple)."""
    tree = jax.tree_util.tree_unflatten(graph.out_tree, list(range(len(graph.outvars))))
    return ["/".join(key_name(k) for k in path) or str(j)
            for j, (path, _) in enumerate(jax.tree_util.tree_flatten_with_path(tree)[0])]
