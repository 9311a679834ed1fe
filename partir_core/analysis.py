"""Dimension groups: which tensor dims of a whole program must share a sharding (as in TOAST/Automap).

Every dim of every (non-constant) value is a node. At each op, the registry's factor rule says which dims
carry the same factor (``dot_general`` ``(i,k),(k,j)->(i,j)``: the ``k`` dims of both operands, the ``i``
dims of lhs and result, ...); sharding that factor shards all of them alike, so a union-find joins them.
Over the whole traced program (forward, ``jax.grad``'s backward pass and the optimizer update) this leaves
a few dozen groups: for an MLP, ``w1``'s output dim, ``b1``, ``w2``'s input dim, the hidden activations and
their gradients and momenta are one group ("the hidden dim"), which is what Megatron splits.

- A dim made of several factors (a reshape merging ``(heads, dh) → d``) joins the group of its *major*
  factor: sharding the merged dim on one axis shards that factor.
- Blocked factors (``gather``'s indexed dim, a ``concatenate``'s dim, ...) and ops without a rule join
  nothing: those dims must be replicated there, and lowering reshards around them.

*Conflicts* are the places where one group cannot be sharded on one axis everywhere: a value with two of
its dims in the same group (attention scores ``(b, h, q, k)`` carry the sequence group twice, a square
``x @ x.T`` likewise). Sharding such a group on an axis shards one of those dims; which one is decided by
propagation order.

Groups are reached through *inputs*: a group is actionable if some input dim (a parameter, optimizer state
or data dim) is in it. *Layer grouping* then merges groups whose input dims coincide up to layer indices
(``params/layers/0/w1:1`` and ``params/layers/1/w1:1``): one decision for every layer, as experts make it.

*Input kinds* (:func:`input_kinds`) come from the program too, not from names: an input the step *updates*
(an output is its new value: same shape and dtype, computed from it by a short chain of ops of its shape, as
``p - lr·m`` or ``b1·mu + (1 - b1)·g`` are, or returned at the input's place in the results and computed from
updated inputs, as mixed precision's working copy is cast from its master weights) is a *parameter* if it is
a floating-point value that reaches an output other than the updates (the loss, metrics), else *optimizer
state* (momenta, Adam's ``mu``/``nu``, step counters, master weights); an input the step does not update is
*data*. A training step returns its new parameters and optimizer state in the types of the inputs they replace
(:func:`tied_outputs`). A program that updates none of its inputs (a forward pass) gives no such evidence,
and ``x @ w`` cannot tell a weight from an example: the kinds then follow the inputs' names
(:func:`named_kind`).

:func:`analyze_groups` returns :class:`DimGroups`, with the action space sizes before and after grouping.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import jax
import numpy as np

from partir_core.ir import Graph, is_enter, is_exit

KIND_ORDER = {"param": 0, "state": 1, "data": 2}
# the longest chain of same-shape ops from an input to its new value (Adam's parameter update is 1, its moments 2)
UPDATE_DEPTH = 8


class _UnionFind:
    """Disjoint sets of orderable items (path compression; the smaller root wins a union; :meth:`add` first)."""

    def __init__(self):
        self.parent: dict = {}

    def add(self, x):
        self.parent.setdefault(x, x)

    def find(self, x):
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if rb < ra:
                ra, rb = rb, ra
            self.parent[rb] = ra


def named_kind(path: str) -> str:
    """The kind by name, for a program that updates none of its inputs: ``param`` (``params/...``), ``state``
    (``momentum/...``, ``opt_state/...``, ...) or ``data`` (everything else)."""
    head = path.split("/", 1)[0]
    if head in ("params", "param", "weights", "variables"):
        return "param"
    if "/" in path and head not in ("batch", "data", "inputs"):
        return "state"
    return "data"


def dependencies(graph: Graph) -> dict[int, int]:
    """Every value's inputs as a bit mask (bit ``i``: ``graph.invars[i]``): the inputs it is computed from.
    Across a region's boundary along its ties (a body parameter depends on the outer value it becomes, an outer
    result on the body results it is made of); a loop carry inside its body counts its initial value's."""
    deps = {v: 1 << i for i, v in enumerate(graph.invars)}
    for e in graph.eqns:
        if is_enter(e):
            for i, o, _ in e.params["ties"]:
                deps[e.outvars[o]] = deps.get(e.invars[i], 0)
        elif is_exit(e):
            for o, members, _ in e.params["ties"]:
                mask = 0
                for m in members:
                    mask |= deps.get(e.invars[m], 0)
                deps[e.outvars[o]] = mask
        else:
            mask = 0
            for v in e.invars:
                mask |= deps.get(v, 0)
            for v in e.outvars:
                deps[v] = mask
    return deps


def updates(graph: Graph) -> dict[int, int]:
    """The inputs the program updates: input position → the position of the output that is its new value. An
    output qualifies for an input when it has the input's shape and dtype and a chain of 1 to
    :data:`UPDATE_DEPTH` ops, each with a result of that shape, leads from the input to it; the shortest chains
    are matched first, each input and output at most once; then the inputs the step returns where it took them,
    made from updated inputs (:func:`_updates_in_place`). Remembered per graph (the kinds, the ties and the
    presets all read it): the caller must not change it."""
    return graph.memo("updates", _updates)


def _updates(graph: Graph) -> dict[int, int]:
    """:func:`updates`, found anew."""
    readers = graph.readers()
    positions: dict = {}
    for k, v in enumerate(graph.outvars):
        positions.setdefault(v, []).append(k)
    found = []
    for i, v in enumerate(graph.invars):
        shape, dtype = graph.shape(v), graph.dtype(v)
        seen, frontier = {v}, [v]
        for dist in range(1, UPDATE_DEPTH + 1):
            nxt = []
            for u in frontier:
                for j in readers.get(u, ()):
                    e = graph.eqns[j]
                    if is_enter(e) or is_exit(e):
                        continue
                    for r in e.outvars:
                        if r in seen or graph.shape(r) != shape:
                            continue
                        seen.add(r)
                        nxt.append(r)
                        if graph.dtype(r) == dtype:
                            found += [(dist, i, k) for k in positions.get(r, ())]
            frontier = nxt
    out: dict = {}
    taken: set = set()
    for _, i, k in sorted(found):
        if i not in out and k not in taken:
            out[i] = k
            taken.add(k)
    return _updates_in_place(graph, out, taken)


def _updates_in_place(graph: Graph, out: dict, taken: set) -> dict:
    """``out`` (:func:`updates` found by dataflow) with the inputs whose new value no chain of their shape reaches
    but the step returns where it took them: an output at the input's place in the results (its key path in
    the results' pytree that of the input in the arguments'), of its shape and dtype, computed from an updated
    input. Mixed precision's working copy is one: ``(params, master, ...) → (cast(master'), master', ...)``."""
    if graph.in_tree is None or graph.out_tree is None:
        return out

    def key_paths(tree):
        return [kp for kp, _ in jax.tree_util.tree_flatten_with_path(
            jax.tree_util.tree_unflatten(tree, list(range(tree.num_leaves))))[0]]

    at = {kp: k for k, kp in enumerate(key_paths(graph.out_tree))}
    updated = sum(1 << i for i in out)
    deps = None
    for i, kp in enumerate(key_paths(graph.in_tree)):
        k = at.get(kp)
        if i in out or k is None or k in taken:
            continue
        v, new = graph.invars[i], graph.outvars[k]
        if graph.shape(new) != graph.shape(v) or graph.dtype(new) != graph.dtype(v):
            continue
        deps = dependencies(graph) if deps is None else deps
        if deps.get(new, 0) & updated:
            out[i] = k
            taken.add(k)
    return out


def tied_outputs(graph: Graph) -> dict[int, int]:
    """The outputs a training step returns in place of its inputs: output value → the input value whose new value
    it is (:func:`updates`), for every updated parameter and piece of optimizer state (:func:`input_kinds`), in
    a program with at least one parameter; empty for any other program (a forward pass, ``x @ w`` with a square
    ``w``). Remembered per graph."""
    def ties(graph):
        kinds = input_kinds(graph)
        if "param" not in kinds.values():
            return {}
        return {graph.outvars[k]: graph.invars[i] for i, k in updates(graph).items()
                if kinds[graph.in_paths[i]] in ("param", "state")}

    return graph.memo("tied_outputs", ties)


def input_kinds(graph: Graph) -> dict[str, str]:
    """Every input's kind, ``param``, ``state`` or ``data``, by the program's dataflow (see the module
    docstring); by :func:`named_kind` where the program updates none of its inputs. Without an output other
    than the updates, a parameter is an updated input that reaches an output of another shape (another
    parameter's update, through the gradients)."""
    new = updates(graph)
    if not new:
        return {p: named_kind(p) for p in graph.in_paths}
    deps = dependencies(graph)
    updated = set(new.values())
    others = [v for k, v in enumerate(graph.outvars) if k not in updated]
    kinds = {}
    for i, (p, v) in enumerate(zip(graph.in_paths, graph.invars)):
        if i not in new:
            kinds[p] = "data"
            continue
        reached = others or [o for o in graph.outvars if graph.shape(o) != graph.shape(v)]
        reaches = any(deps.get(o, 0) >> i & 1 for o in reached)
        floating = jax.dtypes.issubdtype(graph.dtype(v), np.inexact)
        kinds[p] = "param" if reaches and floating else "state"
    return kinds


def layer_pattern(path: str) -> str:
    """The path with every all-digit component replaced by ``*`` (``params/layers/0/w1`` → ``params/layers/*/w1``)."""
    return "/".join("*" if re.fullmatch(r"\d+", c) else c for c in path.split("/"))


@dataclass
class Group:
    """One group of dims that share a sharding. ``members``: ``(value, dim)``; ``inputs``: ``(path, dim)`` of
    the input dims in it; ``size``: the size of its factor; ``rep``: the input dim that stands for it (a
    parameter if any: the largest, then the first in input order)."""

    id: int
    members: list
    inputs: list
    size: int
    rep: tuple | None
    bytes: int = 0  # global bytes of the values it touches (each value once): a rough measure of weight
    conflicts: list = field(default_factory=list)  # (value, dims, where)

    def __str__(self):
        ins = ", ".join(f"{p}:{d}" for p, d in self.inputs[:6]) + (", …" if len(self.inputs) > 6 else "")
        return f"group {self.id} (size {self.size}, {len(self.members)} dims; inputs {ins})"


@dataclass
class MacroGroup:
    """Groups merged by layer grouping; one search decision. ``reps``: one input dim per member group."""

    id: int
    groups: list
    reps: list
    size: int
    bytes: int
    kind: str

    @property
    def signature(self) -> str:
        return ", ".join(sorted({f"{layer_pattern(p)}:{d}" for g in self.groups for p, d in g.inputs}))

    def __str__(self):
        reps = ", ".join(f"{p}:{d}" for p, d in self.reps)
        return f"decision {self.id}: {len(self.groups)} group(s), size {self.size}, via {reps}"


@dataclass
class DimGroups:
    """The analysis result (see the module docstring)."""

    groups: list
    macro: list
    conflicts: list
    n_values: int
    n_dims: int
    n_input_dims: int
    group_of: dict
    kinds: dict  # input path → "param", "state" or "data" (:func:`input_kinds`)

    def action_space(self, mesh, axes) -> dict:
        """Sizes of the action space "shard X on axis a" for ``axes``:

        - ``values_dims_axes``: every dim of every value, on every axis (no analysis);
        - ``input_dims_axes``: every input dim, on every axis (what manual tactics name);
        - ``groups_axes``: every actionable group (reached through an input dim), on every axis;
        - ``decisions_axes``: after layer grouping (what the search explores);
        - ``legal``: of those, the ones whose input dim is at least the axis size (evenly split or not)."""
        sizes = {a: mesh.axis_size(a) for a in axes}
        n = len(axes)
        legal = sum(1 for m in self.macro for a in axes if m.size >= sizes[a] > 1)
        return {"values_dims_axes": self.n_dims * n, "input_dims_axes": self.n_input_dims * n,
                "groups_axes": sum(1 for g in self.groups if g.inputs) * n,
                "decisions_axes": len(self.macro) * n, "legal": legal, "values": self.n_values,
                "axes": n}

    def find(self, v: int, d: int) -> Group | None:
        gid = self.group_of.get((v, d))
        return None if gid is None else self.groups[gid]

    def report(self, mesh=None, axes=None) -> str:
        lines = [f"{self.n_values} values, {self.n_dims} dims ({self.n_input_dims} input dims) → "
                 f"{len(self.groups)} groups, {sum(1 for g in self.groups if g.inputs)} with an input dim, "
                 f"{len(self.macro)} decisions after layer grouping; {len(self.conflicts)} conflicts"]
        if mesh is not None and axes:
            lines.append("action space: " + ", ".join(f"{k}={v}" for k, v in self.action_space(mesh, axes).items()))
        for m in self.macro:
            lines.append(f"  {m}  [{m.signature}]")
        for c in self.conflicts[:20]:
            lines.append(f"  conflict: group {c[0]}: %{c[1]} dims {c[2]} ({c[3]})")
        return "\n".join(lines)


def analyze_groups(graph: Graph, rules: list) -> DimGroups:
    """Union-find over the registry's factors across ``graph`` (see the module docstring)."""
    kinds = input_kinds(graph)
    uf = _UnionFind()
    values = [v for v in graph.invars] + [v for e in graph.eqns for v in e.outvars]
    values = [v for v in dict.fromkeys(values) if v not in graph.consts]
    for v in values:
        for d, s in enumerate(graph.shape(v)):
            if s > 1:
                uf.add((v, d))
    producer: dict = {}
    for i, (eqn, rule) in enumerate(zip(graph.eqns, rules)):
        for v in eqn.outvars:
            producer[v] = i
        if rule is None:
            continue
        slots: dict = {}
        for vals, dims_list in ((eqn.invars, rule.operands), (eqn.outvars, rule.results)):
            for v, dims in zip(vals, dims_list):
                if v in graph.consts:
                    continue
                for d, fs in enumerate(dims):
                    if fs and (v, d) in uf.parent:
                        slots.setdefault(fs[0], []).append((v, d))
        for f, ss in slots.items():
            if f in rule.blocked or not rule.shardable(f):
                continue
            for s in ss[1:]:
                uf.union(ss[0], s)
    # collect
    members: dict = {}
    for node in uf.parent:
        members.setdefault(uf.find(node), []).append(node)
    path_of = dict(zip(graph.invars, graph.in_paths))
    value_of = dict(zip(graph.in_paths, graph.invars))
    order = {v: i for i, v in enumerate(graph.invars)}
    roots = sorted(members, key=lambda r: min(members[r]))
    groups, group_of = [], {}
    for gid, r in enumerate(roots):
        ms = sorted(members[r])
        ins = sorted(((path_of[v], d) for v, d in ms if v in path_of), key=lambda pd: (order[value_of[pd[0]]], pd[1]))
        seen = {v for v, _ in ms}
        nbytes = sum(math.prod(graph.shape(v)) * graph.dtype(v).itemsize for v in seen)
        rep = None
        if ins:
            def key(pd):
                v = value_of[pd[0]]
                return (KIND_ORDER[kinds[pd[0]]], -math.prod(graph.shape(v)), order[v], pd[1])
            rep = min(ins, key=key)
        size = graph.shape(ms[0][0])[ms[0][1]]
        if rep is not None:
            size = graph.shape(value_of[rep[0]])[rep[1]]
        g = Group(gid, ms, ins, size, rep, nbytes)
        by_value: dict = {}
        for v, d in ms:
            by_value.setdefault(v, []).append(d)
        for v, ds in by_value.items():
            if len(ds) > 1:
                where = f"input {path_of[v]}" if v in path_of else \
                    f"eqn {producer[v]} ({graph.eqns[producer[v]].name})"
                g.conflicts.append((gid, v, tuple(ds), where))
        groups.append(g)
        for node in ms:
            group_of[node] = gid
    # layer grouping: groups whose input dims coincide up to layer indices
    by_sig: dict = {}
    for g in groups:
        if not g.inputs:
            continue
        sig = tuple(sorted({(layer_pattern(p), d) for p, d in g.inputs}))
        by_sig.setdefault(sig, []).append(g)
    macro = []
    for gs in sorted(by_sig.values(), key=lambda gs: gs[0].id):
        kind = min((kinds[p] for g in gs for p, _ in g.inputs), key=KIND_ORDER.get)
        macro.append(MacroGroup(len(macro), gs, [g.rep for g in gs], min(g.size for g in gs),
                                sum(g.bytes for g in gs), kind))
    conflicts = [c for g in groups for c in g.conflicts]
    n_dims = sum(len(graph.shape(v)) for v in values)
    n_input_dims = sum(len(graph.shape(v)) for v in graph.invars)
    return DimGroups(groups, macro, conflicts, len(values), n_dims, n_input_dims, group_of, kinds)
