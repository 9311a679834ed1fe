"""The automatic search's space: actions ("shard decision d on mesh axis a") and the sets of them it searches.

The decisions come from :mod:`partir_core.analysis`: dims that must share a sharding form groups (union-find
over the registry's factors, backward pass included), groups are reached through an input dim (a parameter if
the group has one), and groups that differ only by layer index form one decision. An *action* is
``(decision, axis)``; it is applied as the :class:`~partir_core.ManualPartition` that names the decision's
representative input dims (``ManualPartition({"params/layers/*/w1": 1}, axis="model")``), followed by
propagation, exactly as a hand-written tactic would be. So the search result *is* a list of manual tactics, and
pasting them into a schedule reproduces the program. A dim need not divide by the axis (it is then split by the
padding rule). Two *composite* actions per axis reach what no single group does, as ZeRO shards weights
(:func:`zero_actions`, read off the inputs' kinds): ZeRO-3 (every parameter and optimizer-state input on its
largest dim) and ZeRO-2 (the optimizer state so, the parameters pinned).

Search state: a *set* of actions, applied in a canonical order (decisions that reach data inputs first, as
batch parallelism is composed first by hand; then the others in program order; the composite ones last; axes in
the order given). Provenance keeps that order: the j-th action gets tactic index ``k + j/1000`` (``k``: the
``AutomaticPartition``'s place in the schedule; :data:`partir_core.automatic.evaluation.STEP`), so earlier
actions win conflicts, as earlier tactics do. An action that changes nothing where it is applied (its input dim
already split on that axis, the axis taken by another dim of the input, a pinned input) is not a move.

The weight decisions (:func:`weight_actions`: decisions that reach parameters and no data input), their pairs
on one axis (:func:`weight_pairs`) and Megatron's splits (:func:`megatron_actions`: what
:func:`partir_core.presets.megatron` finds, on one axis) are what the search's Megatron-style moves add.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass

from redist.mesh import prime_factors

from partir_core.analysis import DimGroups
from partir_core.presets import TracedStep
from partir_core.tactics import AutomaticPartition, ManualPartition


@dataclass(frozen=True)
class Action:
    """Shard decision ``decision`` (a :class:`~partir_core.analysis.MacroGroup`) on mesh axis ``axis``."""

    decision: int
    axis: str
    dims: tuple  # ((path pattern, dim), ...) of the ManualPartition

    def __hash__(self):  # sets of actions key the search's caches: hashed often, told apart by these two
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.decision, self.axis))
        return h

    def __getstate__(self) -> dict:  # the hash is not pickled: string hashes differ between processes
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def tactic(self) -> ManualPartition:
        return ManualPartition(dict(self.dims), axis=self.axis)

    def __str__(self):
        return str(self.tactic)


def compress(pairs, in_paths) -> tuple:
    """``((pattern, dim), ...)`` naming exactly the input dims ``pairs`` (``(path, dim)``): paths that differ
    only in all-digit components are joined by a ``*`` wildcard when it matches nothing else."""
    by: dict = {}
    for p, d in pairs:
        parts = p.split("/")
        key = (tuple("*" if c.isdigit() else c for c in parts), d)
        by.setdefault(key, []).append(p)
    out = []
    for (parts, d), paths in by.items():
        pattern = "/".join(parts)
        hits = [q for q in in_paths if fnmatch.fnmatchcase(q, pattern)]
        if len(paths) > 1 and sorted(hits) == sorted(paths):
            out.append((pattern, d))
        else:
            out.extend((p, d) for p in paths)
    return tuple(out)


def search_axes(tactic: AutomaticPartition, mesh) -> list[str]:
    """The axes the search shards on: the tactic's ``axes`` (mesh axes or sub-axes; none given: every mesh
    axis), and with ``tactic.sub_axes`` also the two halves of each whole axis among them of size >= 4
    (``model:(1)2`` and ``model:(2)2`` on ``model=4``; ``model:(1)2`` and ``model:(2)4`` on ``model=8``: the
    axis split at its smallest prime factor), so that the search can compose, say, data parallelism on one half
    of an axis with Megatron on the other. A half and its whole axis overlap: where both reach one value or
    one op, the earlier action keeps it (:mod:`partir_core.propagation`), so a set holding both is a set
    holding the earlier one."""
    axes = [str(mesh.axis(a)) for a in tactic.axes] or list(mesh.names)
    halves = []
    for a in map(mesh.axis, axes if tactic.sub_axes else ()):
        p = prime_factors(a.size)[0]
        if a.is_whole and a.size >= 4 and p < a.size:
            halves += [f"{a.name}:(1){p}", f"{a.name}:({p}){a.size // p}"]
    return list(dict.fromkeys(axes + halves))


def build_actions(groups: DimGroups, graph, mesh, axes) -> list[Action]:
    """The legal actions in canonical order (see the module docstring): every decision on every axis of size
    > 1 that is no larger than each of its input dims (a dim need not divide by the axis: a vocabulary of
    50 on 4 devices, a batch of 5 on 2 are split by the padding rule, as experts split them), then the
    composite actions (:func:`zero_actions`)."""
    sizes = {a: mesh.axis_size(a) for a in axes}

    def data_first(m):
        has_data = any(groups.kinds[p] == "data" for g in m.groups for p, _ in g.inputs)
        return (0 if has_data else 1, m.id)

    out = []
    for m in sorted(groups.macro, key=data_first):
        dims = compress(m.reps, graph.in_paths)
        for a in axes:
            fits = all(graph.shape(graph.invars[graph.in_paths.index(p)])[d] >= sizes[a] for p, d in m.reps)
            if fits and sizes[a] > 1:
                out.append(Action(m.id, a, dims))
    return out + zero_actions(len(groups.macro), graph, groups.kinds, mesh, axes)


def zero_actions(first_id: int, graph, kinds: dict, mesh, axes) -> list[Action]:
    """Composite actions that no single group reaches, as ZeRO shards weights (Automap's inductive tactics,
    read off the inputs' ``kinds``, :func:`partir_core.analysis.input_kinds`): per axis, *ZeRO-3* (decision
    ``first_id``: every parameter and optimizer-state input split on its largest dim that divides by the
    axis) and *ZeRO-2* (decision ``first_id + 1``: the optimizer state split so, the parameters pinned as they
    are). They come last in canonical order, as ZeRO is composed last by hand (``BP+MP+Z2``)."""
    sizes = {a: mesh.axis_size(a) for a in axes}
    leaves = [(p, graph.shape(v)) for p, v in zip(graph.in_paths, graph.invars) if kinds[p] != "data"]
    out = []
    for a in axes:
        if sizes[a] <= 1:
            continue
        largest = {}
        for p, shape in leaves:
            ok = [d for d, n in enumerate(shape) if n % sizes[a] == 0 and n >= sizes[a]]
            if ok:
                largest[p] = max(ok, key=lambda d: shape[d])
        state = {p: d for p, d in largest.items() if kinds[p] == "state"}
        if largest:
            out.append(Action(first_id, a, compress(list(largest.items()), graph.in_paths)))
        if state:
            pins = [(p, None) for p, _ in leaves if kinds[p] == "param"]
            out.append(Action(first_id + 1, a, compress(pins + list(state.items()), graph.in_paths)))
    return out


def weight_actions(actions: list, groups: DimGroups) -> list[Action]:
    """The actions over decisions that reach parameters and no data input (weight dims), in canonical order."""
    weights = {m.id for m in groups.macro if m.kind == "param" and not any(
        groups.kinds[p] == "data" for g in m.groups for p, _ in g.inputs)}
    return [a for a in actions if a.decision in weights]


def weight_pairs(actions: list, groups: DimGroups) -> list[tuple]:
    """Pairs of :func:`weight_actions` on one axis over two decisions with no input in common (one axis splits
    one dim of an input: of two decisions that meet in a weight, as ``w1``'s input and hidden dims do, the
    second would be no move there; Megatron's pairs, the MLP's hidden dim and the attention heads, meet in
    none)."""
    inputs = {m.id: {p for g in m.groups for p, _ in g.inputs} for m in groups.macro}
    return [(a, b) for a, b in itertools.combinations(weight_actions(actions, groups), 2)
            if a.axis == b.axis and not inputs[a.decision] & inputs[b.decision]]


def megatron_actions(actions: list, groups: DimGroups, graph) -> dict[str, tuple]:
    """``{axis: actions}``: the decisions Megatron splits (:meth:`partir_core.presets.TracedStep.megatron_groups`:
    every layer's MLP hidden dim and attention heads, found in the program), each on ``axis``, in canonical
    order; axes where it splits none left out. The pairs of :func:`weight_pairs` are two of these; a model of
    several layers that are not one decision (flax.linen's ``Block_0``, ``Block_1``) needs them all at once,
    as the ``megatron`` preset takes them."""
    chosen = set(TracedStep.of_program(graph, groups).megatron_groups())
    decisions = {m.id for m in groups.macro if any(g.id in chosen for g in m.groups)}
    out: dict = {}
    for a in actions:
        if a.decision in decisions:
            out.setdefault(a.axis, []).append(a)
    return {axis: tuple(acts) for axis, acts in out.items()}
