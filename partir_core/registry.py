"""The tile-mapping registry: per primitive, an einsum-like *factor rule* and its local (per-shard) form.

A :class:`Rule` names, for every operand and result dim, the factors it is made of (major → minor), as in
Shardy's ``(i,k),(k,j)->(i,j)``. Sharding a factor on mesh axes shards every dim that carries it the same
way; a dim made of several factors (a reshape merging ``(h, d) → hd``) is split over their axes in order,
which is valid only if every factor but the last sharded one is fully split. A dim with no factor (``()``)
must be replicated.

Factors that occur in operands but in no result are *reductions*: ``reduce[f] == "sum"`` makes the result a
pending sum over f's axes (contracting dims of ``dot_general``, the reduced dims of ``reduce_sum``, the
scattered dims of ``scatter-add``); ``"max"``/``"min"`` are finished at once with ``pmax``/``pmin``. Any
factor in ``blocked`` (and any non-result factor that is not a reduction) may not be sharded: its dims are
gathered before the op. Factors that occur only in results (``iota``, new ``broadcast_in_dim`` dims) are
produced locally, at the device's block offset.

``proposed`` factors are split only where propagation puts them: the per-op choice keeps them as the state
proposes (a gather's masked lookup, whose pending-sum result that choice cannot price where it follows its
operands' layouts).

``independent`` marks a rule whose values are tied in independent groups (a region's enter or exit: each
operand becomes its own body parameter): a mesh axis may then split two factors that never meet in one value;
for any other op, one mesh axis splits at most one factor.

``linear`` says which operands may stay pending sums through the op: ``"all"`` (all operands pending over the
same axes, e.g. ``add``), ``"one"`` (exactly one operand pending, e.g. ``mul``, ``dot_general``), or None.

``local(ctx, *xs)`` runs the op on local shards (default: the primitive with its own params); ``ctx`` is a
:class:`LocalContext` giving local shapes and block offsets. A local form that communicates itself (the
static permutation of :mod:`partir_core.permutation`, whose rows move by ``lax.ppermute``) says what a device
receives in it: ``collectives(eqn, in_types)`` gives ``(kind, axes, bytes)`` per collective.
:func:`rule_for` returns None for a primitive with no rule; the partitioner then runs it on replicated
operands and reports it.

Gathers and scatter-adds (every form ``jnp.take``, ``x[idx]``, ``take_along_axis``, ``nn.Embed`` and their
gradients produce, batching dims included): indices split on their batch dims; the operand split on an indexed
dim that slices of 1 are taken from (an embedding's vocabulary): a gather looks up locally the indices in the
device's block (zero elsewhere) and its result is a pending sum, a scatter-add adds the updates of the device's
own rows; both keep the unpartitioned handling of out-of-range indices (clamped, or filled / dropped).

Convolutions (``conv_general_dilated``, forward and both gradients): the batch dim, the input channels (a ``sum``
reduction) and the output channels are factors, as a matmul's; the spatial dims are blocked. ``rev`` (the
kernel's flip in the input gradient) blocks the dims it reverses.

A region's enter and exit (:mod:`partir_core.ir`) tie each outer value to the body value it becomes.

Random keys (:mod:`partir_core.keys`): rules see a key array's key shape. ``random_seed``, ``random_fold_in``,
``random_clone`` and the raw ``threefry2x32`` hash act on each element alone, so they are elementwise.
``random_bits`` and ``random_split`` map each key to new values: the key dims share factors with the result's
leading dims (each key of a batch draws its own values). A counter-based draw (threefry, JAX's default:
:func:`partir_core.keys.counter_based`) is also split on its new dims, each device hashing its own block's
positions; any other draw has them *blocked*: drawn whole, then sliced locally. Either way a device draws the
unpartitioned bits.
``random_wrap`` / ``random_unwrap`` convert to and from key data, whose key-data dims stay replicated.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from partir_core import keys, permutation
from partir_core.ir import CONTROL_FLOW, ENTER

Dims = list  # per dim: tuple of factor names

ELEMENTWISE = {
    "add", "sub", "mul", "div", "rem", "pow", "max", "min", "neg", "sign", "abs", "floor", "ceil", "round",
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "sqrt", "rsqrt", "cbrt",
    "square", "integer_pow", "erf", "erfc", "erf_inv", "is_finite", "atan2", "nextafter", "not", "and", "or",
    "xor", "eq", "ne", "lt", "le", "gt", "ge", "select_n", "clamp", "convert_element_type", "stop_gradient",
    "add_any", "copy", "copy_p", "reduce_precision", "real", "imag", "conj", "asin", "acos", "atan", "sinh",
    "cosh", "asinh", "acosh", "atanh", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "population_count", "clz", "optimization_barrier",
    # bit-level and random-key ops that act on each element alone (bitcast_convert_type keeps the shape only
    # between equal bit widths; the other bitcasts get no rule)
    "bitcast_convert_type", "random_seed", "random_fold_in", "random_clone", "threefry2x32",
}
IDENTITY = {"sharding_constraint", "mesh_cast", "reshard"}
LINEAR_ALL = {"add", "sub", "add_any", "neg", "copy", "copy_p", "reduce_sum", "transpose", "reshape",
              "broadcast_in_dim", "squeeze"}
LINEAR_ONE = {"mul", "dot_general"}


@dataclass
class Rule:
    """A factor rule; see the module docstring."""

    operands: list[Dims]
    results: list[Dims]
    sizes: dict[str, int]
    reduce: dict[str, str] = field(default_factory=dict)
    blocked: frozenset = frozenset()
    linear: str | None = None
    local: Callable | None = None
    independent: bool = False
    proposed: frozenset = frozenset()
    collectives: Callable | None = None

    def factors(self) -> list[str]:
        """All factors, in order of first appearance (results first)."""
        seen: dict[str, None] = {}
        for dims in self.results + self.operands:
            for fs in dims:
                for f in fs:
                    seen.setdefault(f, None)
        return list(seen)

    def result_factors(self) -> set[str]:
        return {f for dims in self.results for fs in dims for f in fs}

    def shardable(self, f: str) -> bool:
        return f not in self.blocked and (f in self.result_factors() or f in self.reduce)

    def exclusive(self, f: str, g: str) -> bool:
        """Whether factors ``f`` and ``g`` may not share a mesh axis: always, unless the rule is
        ``independent`` and no value has dims of both."""
        if not self.independent:
            return True
        holders = self._holders
        return not holders.get(f, frozenset()).isdisjoint(holders.get(g, frozenset()))

    @functools.cached_property
    def _holders(self) -> dict:
        """Per factor, the values (operands, then results, by position) with a dim carrying it."""
        out: dict = {}
        for k, dims in enumerate(self.operands + self.results):
            for fs in dims:
                for f in fs:
                    out.setdefault(f, set()).add(k)
        return out

    def __str__(self) -> str:
        def side(lst):
            return ",".join("(" + ",".join("·".join(fs) if fs else "_" for fs in d) + ")" for d in lst)

        text = f"{side(self.operands)}->{side(self.results)}"
        extra = [f"{k}{{{','.join(sorted(f for f, v in self.reduce.items() if v == k))}}}"
                 for k in ("sum", "max", "min") if k in self.reduce.values()]
        if self.blocked:
            extra.append("blocked{" + ",".join(sorted(self.blocked)) + "}")
        return text + (" " + " ".join(extra) if extra else "")


@dataclass
class LocalContext:
    """What a rule's local implementation may ask about the current device's shards.

    ``in_shapes``/``out_shapes`` are local shapes, ``in_dims``/``out_dims`` the mesh axes of every dim;
    ``offset(r, d)`` / ``in_offset(k, d)`` is the traced global index at which this device's block of dim ``d``
    of result ``r`` / operand ``k`` starts; ``new_partial`` are the axes over which this op makes
    its results pending sums (for ``scatter-add``, whose operand must then be counted once). ``axis_names``
    maps mesh axes to the names the enclosing ``shard_map``'s mesh gives them (its mesh may be refined:
    :class:`partir_core.reshard.AxisNames`); :meth:`axis_index` goes through it."""

    eqn: Any
    in_shapes: list[tuple[int, ...]]
    out_shapes: list[tuple[int, ...]]
    out_dims: list[tuple[tuple[str, ...], ...]]
    mesh: Any
    new_partial: tuple[str, ...] = ()
    axis_names: Callable[[tuple[str, ...]], tuple[str, ...]] = tuple
    in_dims: list[tuple[tuple[str, ...], ...]] = field(default_factory=list)

    def axis_index(self, axes):
        """This device's index in its group over mesh ``axes`` (row-major over them, traced)."""
        return lax.axis_index(self.axis_names(tuple(axes)))

    def offset(self, r: int, d: int):
        """Where this device's block of dim ``d`` of result ``r`` starts (traced; 0 for a whole dim)."""
        axes = self.out_dims[r][d]
        if not axes:
            return 0
        return self.axis_index(axes) * self.out_shapes[r][d]

    def in_offset(self, k: int, d: int):
        """Where this device's block of dim ``d`` of operand ``k`` starts (traced; 0 for a whole dim)."""
        axes = self.in_dims[k][d]
        if not axes:
            return 0
        return self.axis_index(axes) * self.in_shapes[k][d]


class _Names:
    """Fresh factor names for one rule, and their sizes."""

    def __init__(self):
        self.it = (f"f{i}" for i in itertools.count())
        self.sizes: dict[str, int] = {}

    def __call__(self, size: int) -> tuple[str, ...]:
        """A fresh factor for a dim of ``size`` (size-1 dims get none)."""
        if size == 1:
            return ()
        f = next(self.it)
        self.sizes[f] = size
        return (f,)


def bind(ctx, *xs, **overrides):
    """The results (a list) of ``ctx``'s primitive on ``xs``, with its parameters updated by ``overrides``."""
    e = ctx.eqn
    out = e.prim.bind(*xs, **{**e.params, **overrides})
    return list(out) if e.prim.multiple_results else [out]


# ---------------------------------------------------------------------------------------- the rules
def _elementwise(eqn, shapes, out_shapes):
    n = _Names()
    out = out_shapes[0]
    dims = [n(s) for s in out]
    ops = []
    for s in shapes:
        if len(s) == len(out) and all(a == b or a == 1 for a, b in zip(s, out)):
            ops.append([f if a == b else () for f, a, b in zip(dims, s, out)])  # size-1 dims broadcast
        elif len(s) == 0:
            ops.append([])
        else:
            return None
    name = eqn.name
    linear = "all" if name in LINEAR_ALL else "one" if name in LINEAR_ONE else None
    if name == "convert_element_type":
        floating = all(np.issubdtype(d, np.floating) for d in (eqn.in_dtypes[0], eqn.params["new_dtype"]))
        linear = "all" if floating else None
    if name == "div":
        linear = None
    local = (lambda ctx, x: [x]) if name in IDENTITY else None
    return Rule(ops, [list(dims) for _ in out_shapes], n.sizes, linear=linear, local=local)


def _dot_general(eqn, shapes, out_shapes):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    ls, rs = shapes
    n = _Names()
    lhs: list = [None] * len(ls)
    rhs: list = [None] * len(rs)
    out = []
    reduce = {}
    for a, b in zip(lb, rb):
        lhs[a] = rhs[b] = n(ls[a])
        out.append(lhs[a])
    for a, b in zip(lc, rc):
        lhs[a] = rhs[b] = n(ls[a])
        for f in lhs[a]:
            reduce[f] = "sum"
    for i, s in enumerate(ls):
        if lhs[i] is None:
            lhs[i] = n(s)
            out.append(lhs[i])
    for i, s in enumerate(rs):
        if rhs[i] is None:
            rhs[i] = n(s)
            out.append(rhs[i])
    return Rule([lhs, rhs], [out], n.sizes, reduce=reduce, linear="one")


def _broadcast_in_dim(eqn, shapes, out_shapes):
    n = _Names()
    shape, bd = eqn.params["shape"], eqn.params["broadcast_dimensions"]
    out = [n(s) for s in shape]
    op = [out[o] if shapes[0][i] == shape[o] else () for i, o in enumerate(bd)]
    ops = [op] + [[] for _ in shapes[1:]]  # dynamic shape operands (none in practice)

    def local(ctx, x, *rest):
        return bind(ctx, x, *rest, shape=tuple(ctx.out_shapes[0]), sharding=None)

    return Rule(ops, [out], n.sizes, linear="all", local=local)


def _reshape(eqn, shapes, out_shapes):
    """``reshape``, its operand first transposed by ``dimensions`` where given (as the gradients of grouped
    convolutions reshape kernels): dims of the (transposed) operand and of the result are matched in row-major
    order; a dim split into several, or several merged into one, share factors; a general regrouping is
    blocked."""
    n = _Names()
    perm = eqn.params.get("dimensions") or tuple(range(len(shapes[0])))
    src, dst = tuple(shapes[0][d] for d in perm), tuple(out_shapes[0])
    op: list = [()] * len(src)
    out: list = [()] * len(dst)
    blocked = set()
    si = [i for i, s in enumerate(src) if s != 1]
    di = [i for i, s in enumerate(dst) if s != 1]
    a = b = 0
    while a < len(si) or b < len(di):
        ga, gb = [si[a]], [di[b]]
        pa, pb = src[si[a]], dst[di[b]]
        a += 1
        b += 1
        while pa != pb:
            if pa < pb:
                ga.append(si[a]); pa *= src[si[a]]; a += 1  # noqa: E702
            else:
                gb.append(di[b]); pb *= dst[di[b]]; b += 1  # noqa: E702
        if len(ga) == 1:
            fs = tuple(f for j in gb for f in n(dst[j]))
            op[ga[0]] = fs
            for j, f in zip(gb, fs):
                out[j] = (f,)
        elif len(gb) == 1:
            fs = tuple(f for j in ga for f in n(src[j]))
            out[gb[0]] = fs
            for j, f in zip(ga, fs):
                op[j] = (f,)
        else:  # a general regrouping: not shardable
            for j in ga:
                op[j] = n(src[j]); blocked.update(op[j])  # noqa: E702
            for j in gb:
                out[j] = n(dst[j]); blocked.update(out[j])  # noqa: E702

    def local(ctx, x, *rest):
        return bind(ctx, x, *rest, new_sizes=tuple(ctx.out_shapes[0]), sharding=None)

    by_operand_dim = [None] * len(src)
    for j, d in enumerate(perm):
        by_operand_dim[d] = op[j]
    return Rule([by_operand_dim] + [[] for _ in shapes[1:]], [out], n.sizes, blocked=frozenset(blocked),
                linear="all", local=local)


def _transpose(eqn, shapes, out_shapes):
    n = _Names()
    op = [n(s) for s in shapes[0]]
    return Rule([op], [[op[p] for p in eqn.params["permutation"]]], n.sizes, linear="all")


def _squeeze(eqn, shapes, out_shapes):
    n = _Names()
    gone = {d % len(shapes[0]) for d in eqn.params["dimensions"]}
    op = [n(s) for s in shapes[0]]
    return Rule([op], [[f for i, f in enumerate(op) if i not in gone]], n.sizes, linear="all")


def _reduction(kind):
    def rule(eqn, shapes, out_shapes):
        n = _Names()
        axes = set(eqn.params["axes"])
        op = [n(s) for s in shapes[0]]
        out = [f for i, f in enumerate(op) if i not in axes]
        red = [f for i, fs in enumerate(op) if i in axes for f in fs]
        if kind is None:
            return Rule([op], [out] * len(out_shapes), n.sizes, blocked=frozenset(red))
        return Rule([op], [out], n.sizes, reduce={f: kind for f in red},
                    linear="all" if kind == "sum" else None)

    return rule


def _iota(eqn, shapes, out_shapes):
    n = _Names()
    out = [n(s) for s in eqn.params["shape"]]
    dim = eqn.params["dimension"]

    def local(ctx):
        shape = tuple(ctx.out_shapes[0])
        x = lax.iota(eqn.params["dtype"], shape[dim]) + ctx.offset(0, dim)
        x = x.astype(eqn.params["dtype"])
        return [lax.broadcast_in_dim(x, shape, (dim,))]

    return Rule([], [out], n.sizes, local=local)


def _random_draw(eqn, shapes, out_shapes):
    """``random_bits`` / ``random_split``: keys ``S`` → values ``S + shape``; a counter-based draw split on any
    dim (the primitive itself where no new dim is), any other drawn whole per key."""
    n = _Names()
    per_key = [n(s) for s in shapes[0]]
    r, shape = len(shapes[0]), tuple(out_shapes[0][len(shapes[0]):])
    new = [n(s) for s in shape]
    if not (eqn.name == "random_bits" and keys.counter_based(eqn.in_dtypes[0], shape)):
        return Rule([per_key], [per_key + new], n.sizes, blocked=frozenset(f for fs in new for f in fs))

    def local(ctx, k):
        if not any(ctx.out_dims[0][r:]):
            return bind(ctx, k)
        starts = [ctx.offset(0, r + d) for d in range(len(shape))]
        return [keys.draw_block(k, eqn.params["bit_width"], shape, ctx.out_shapes[0][r:], starts)]

    return Rule([per_key], [per_key + new], n.sizes, local=local)


def _random_wrap(eqn, shapes, out_shapes):
    """``random_wrap``: key data ``S + K`` → keys ``S`` (the key-data dims ``K`` replicated)."""
    n = _Names()
    dims = [n(s) for s in out_shapes[0]]
    return Rule([dims + [()] * (len(shapes[0]) - len(dims))], [dims], n.sizes)


def _random_unwrap(eqn, shapes, out_shapes):
    """``random_unwrap``: keys ``S`` → key data ``S + K`` (the key-data dims ``K`` replicated)."""
    n = _Names()
    dims = [n(s) for s in shapes[0]]
    return Rule([dims], [dims + [()] * (len(out_shapes[0]) - len(dims))], n.sizes)


def _lookup_ok(dtype) -> bool:
    """Whether a lookup may be split into a masked local lookup and a pending sum: numbers, not booleans or keys."""
    return not keys.is_key(dtype) and np.dtype(dtype) != np.bool_


def _index_bounds(ops, dims, window):
    """The largest valid start index of each indexed dim (the dim's size less the window's)."""
    return np.array([ops[d] - window[d] for d in dims], np.int64)


def _gather(eqn, shapes, out_shapes):
    """``gather`` in every form ``jnp.take``, ``x[idx]``, ``take_along_axis`` and ``nn.Embed`` produce.

    Operand dims: a *batching* dim shares its factor with its indices batching dim and the result dim that
    becomes; a *passthrough* window dim (not indexed, whole slice) with its result offset dim; an *indexed* dim
    with slices of 1 (the vocabulary of an embedding lookup) has a factor of its own, a ``sum`` reduction: split,
    each device looks up the indices that fall in its block, zero elsewhere, and the result is a pending sum
    (Megatron's vocabulary-parallel embedding); other dims are blocked. Indices batch dims share their factors
    with the result's batch dims; the index vector dim is blocked."""
    dn = eqn.params["dimension_numbers"]
    ops, idx = shapes
    out_shape = out_shapes[0]
    sizes = tuple(eqn.params["slice_sizes"])
    n = _Names()
    blocked, reduce = set(), {}
    idx_dims = [n(s) for s in idx]
    blocked.update(idx_dims[-1])
    op: list = [None] * len(ops)
    for od, i in zip(dn.operand_batching_dims, dn.start_indices_batching_dims):
        op[od] = idx_dims[i]
    lookup = []
    for d in range(len(ops)):
        if op[d] is not None:
            continue
        op[d] = n(ops[d])
        if d in dn.start_index_map and sizes[d] == 1 and _lookup_ok(eqn.in_dtypes[0]):
            lookup.append(d)
            reduce.update({f: "sum" for f in op[d]})
        elif d in dn.start_index_map or sizes[d] != ops[d]:
            blocked.update(op[d])
    out: list = [()] * len(out_shape)
    batch_pos = [p for p in range(len(out_shape)) if p not in dn.offset_dims]
    for p, fs in zip(batch_pos, idx_dims[:-1]):
        out[p] = fs
    window = [d for d in range(len(ops)) if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
    whole = [d for d in window if d not in dn.start_index_map and sizes[d] == ops[d]]
    for pos, d in zip(dn.offset_dims, window):
        out[pos] = op[d] if d in whole else n(out_shape[pos])
        if d not in whole:
            blocked.update(out[pos])
    bounds = _index_bounds(ops, dn.start_index_map, sizes)

    def local(ctx, x, i):
        local_sizes = tuple(ctx.in_shapes[0][d] if d in whole else s for d, s in enumerate(sizes))
        split = [k for k, d in enumerate(dn.start_index_map) if d in lookup and ctx.in_dims[0][d]]
        if not split:
            return bind(ctx, x, i, slice_sizes=local_sizes)
        fill = eqn.params["mode"] == lax.GatherScatterMode.FILL_OR_DROP
        gi, oob = _global_indices(i, bounds, clip=not fill)
        li = gi - _block_starts(ctx, dn.start_index_map, split, gi.dtype)
        (y,) = bind(ctx, x, li, slice_sizes=local_sizes, mode=lax.GatherScatterMode.FILL_OR_DROP,
                    fill_value=0)
        if fill:  # an index out of range everywhere: the fill value, counted once in the pending sum
            first = (ctx.axis_index(ctx.new_partial) == 0).astype(y.dtype)
            value = jnp.asarray(eqn.params["fill_value"], y.dtype) * first
            y = jnp.where(lax.broadcast_in_dim(oob, y.shape, batch_pos), value, y)
        return [y]

    return Rule([op, idx_dims], [out], n.sizes, reduce=reduce, blocked=frozenset(blocked), local=local,
                proposed=frozenset(f for d in lookup for f in op[d]))


def _global_indices(i, bounds, clip: bool):
    """``(indices, out_of_range)``: the start indices (index vector last) clamped into ``[0, bounds]`` when
    ``clip`` (as XLA does for ``clip`` and ``promise_in_bounds``), and whether any coordinate lies outside."""
    hi = jnp.asarray(bounds, i.dtype)
    oob = jnp.any((i < 0) | (i > hi), axis=-1)
    return (jnp.clip(i, 0, hi) if clip else i), oob


def _block_starts(ctx, index_map, split, dtype):
    """Per coordinate of the index vector: where this device's block of the operand dim it indexes starts
    (0 for the coordinates in ``index_map`` not in ``split``)."""
    starts = [ctx.in_offset(0, d) if k in split else 0 for k, d in enumerate(index_map)]
    return jnp.stack([jnp.asarray(s, dtype) for s in starts])


def _scatter_add(eqn, shapes, out_shapes):
    """``scatter-add`` in every form the gradients of those gathers (and ``x.at[idx].add``) produce.

    Operand (= result) dims: a *batching* dim shares its factor with its indices batching dim and the update
    dim that maps to it; a window dim whose update is whole shares its factor with the update's; an *indexed*
    dim that updates write one slice of (the vocabulary of an embedding gradient) has a factor of its own:
    split, each device adds the updates whose index falls in its block (a masked local scatter: in ``clip``
    mode the index clamped first, as the op clamps it, else one out of range dropped everywhere); other dims
    are blocked. The updates' scatter dims (one per indices batch dim) are ``sum`` reductions: split, each
    device scatters its share and the result is a pending sum (the operand counted once)."""
    dn = eqn.params["dimension_numbers"]
    ops, idx, upd = shapes
    n = _Names()
    blocked, reduce = set(), {}
    idx_dims = [n(s) for s in idx]
    blocked.update(idx_dims[-1])
    op: list = [None] * len(ops)
    batching = dict(zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims))
    for od, i in batching.items():
        op[od] = idx_dims[i]
    for d in range(len(ops)):
        if op[d] is None:
            op[d] = n(ops[d])
    window = [d for d in range(len(ops)) if d not in dn.inserted_window_dims and d not in batching]
    up: list = [()] * len(upd)
    lookup = []
    for pos, d in zip(dn.update_window_dims, window):
        if upd[pos] == ops[d] and d not in dn.scatter_dims_to_operand_dims:
            up[pos] = op[d]
        else:
            up[pos] = n(upd[pos])
            blocked.update(up[pos])
            if d not in dn.scatter_dims_to_operand_dims or upd[pos] != 1:
                blocked.update(op[d])
    for d in dn.scatter_dims_to_operand_dims:
        if d in dn.inserted_window_dims or any(d == w and upd[p] == 1 for p, w in zip(dn.update_window_dims, window)):
            lookup.append(d)
        else:
            blocked.update(op[d])
    for d in dn.inserted_window_dims:
        if d not in lookup:
            blocked.update(op[d])
    scatter_pos = [p for p in range(len(upd)) if p not in dn.update_window_dims]
    by_index = {i: od for od, i in batching.items()}
    for p, (i, fs) in zip(scatter_pos, enumerate(idx_dims[:-1])):
        up[p] = fs
        if i not in by_index:
            reduce.update({f: "sum" for f in fs})
    window_sizes = [1] * len(ops)
    for pos, d in zip(dn.update_window_dims, window):
        window_sizes[d] = upd[pos]
    bounds = _index_bounds(ops, dn.scatter_dims_to_operand_dims, window_sizes)

    def local(ctx, x, i, u):
        if ctx.new_partial:  # the operand must be counted once in the pending sum
            first = ctx.axis_index(ctx.new_partial) == 0
            x = x * first.astype(x.dtype)
        split = [k for k, d in enumerate(dn.scatter_dims_to_operand_dims) if d in lookup and ctx.in_dims[0][d]]
        if not split:
            return bind(ctx, x, i, u)
        clip = eqn.params["mode"] == lax.GatherScatterMode.CLIP
        gi, oob = _global_indices(i, bounds, clip=clip)
        li = gi - _block_starts(ctx, dn.scatter_dims_to_operand_dims, split, gi.dtype)
        if not clip:  # out of range: dropped everywhere (also off padding); clamped, it is in one block
            li = jnp.where(oob[..., None], -1, li)
        return bind(ctx, x, li, u, mode=lax.GatherScatterMode.FILL_OR_DROP)

    return Rule([op, idx_dims, up], [op], n.sizes, reduce=reduce, blocked=frozenset(blocked), local=local)


def _boundary(eqn, shapes, out_shapes):
    """A region's enter or exit (:mod:`partir_core.ir`): the values each tie joins share their factors; a
    stacked dim (a scan's ``xs`` entering, ``ys`` leaving) has a factor of its own, blocked: the loop reads and
    writes it whole. Operands in no tie (a cond's index, a while loop's predicate) share nothing."""
    n = _Names()
    ops: list = [[n(s) for s in shape] for shape in shapes]
    outs: list = [[n(s) for s in shape] for shape in out_shapes]
    blocked = set()
    if eqn.prim in ENTER.values():
        for i, o, stacked in eqn.params["ties"]:
            ops[i] = (ops[i][:1] if stacked else []) + outs[o]
            if stacked:
                blocked.update(ops[i][0])
    else:
        for o, members, stacked in eqn.params["ties"]:
            if stacked:
                blocked.update(outs[o][0])
            for i in members:
                ops[i] = list(outs[o][1:] if stacked else outs[o])
    return Rule(ops, outs, n.sizes, blocked=frozenset(blocked), independent=True)


def _concatenate(eqn, shapes, out_shapes):
    n = _Names()
    dim = eqn.params["dimension"]
    out = [n(s) for s in out_shapes[0]]
    blocked = set(out[dim])
    ops = []
    for s in shapes:
        o = list(out)
        o[dim] = n(s[dim])
        blocked.update(o[dim])
        ops.append(o)
    return Rule(ops, [out], n.sizes, blocked=frozenset(blocked))


def _pad(eqn, shapes, out_shapes):
    cfg = eqn.params["padding_config"]
    n, op, out, blocked = _whole_or_blocked(shapes[0], out_shapes[0], lambda d: tuple(cfg[d]) == (0, 0, 0))
    return Rule([op, []], [out], n.sizes, blocked=frozenset(blocked))


def _whole_or_blocked(shape_a, shape_b, whole):
    """Factors for two values whose dims correspond one to one (an operand and its result or update): a dim
    pair where ``whole(d)`` shares one factor (shardable); any other pair gets a factor each, both blocked.
    Returns ``(names, dims of a, dims of b, blocked factors)``."""
    n = _Names()
    a_dims, b_dims, blocked = [], [], set()
    for d, (sa, sb) in enumerate(zip(shape_a, shape_b)):
        if whole(d):
            f = n(sa)
            a_dims.append(f); b_dims.append(f)  # noqa: E702
        else:
            fa, fb = n(sa), n(sb)
            a_dims.append(fa); b_dims.append(fb); blocked.update(fa + fb)  # noqa: E702
    return n, a_dims, b_dims, blocked


def _dynamic_slice(eqn, shapes, out_shapes):
    sizes = eqn.params["slice_sizes"]
    x = shapes[0]
    full = [sizes[d] == x[d] for d in range(len(x))]
    n, op, out, blocked = _whole_or_blocked(x, out_shapes[0], lambda d: full[d])

    def local(ctx, x, *idx):
        return bind(ctx, x, *idx, slice_sizes=tuple(ctx.out_shapes[0]))

    return Rule([op] + [[] for _ in shapes[1:]], [out], n.sizes, blocked=frozenset(blocked), local=local)


def _dynamic_update_slice(eqn, shapes, out_shapes):
    x, u = shapes[0], shapes[1]
    n, op, up, blocked = _whole_or_blocked(x, u, lambda d: x[d] == u[d])
    return Rule([op, up] + [[] for _ in shapes[2:]], [op], n.sizes, blocked=frozenset(blocked))


def _slice(eqn, shapes, out_shapes):
    p = eqn.params
    x = shapes[0]
    strides = p["strides"] or (1,) * len(x)
    full = [p["start_indices"][d] == 0 and p["limit_indices"][d] == x[d] and strides[d] == 1
            for d in range(len(x))]
    n, op, out, blocked = _whole_or_blocked(x, out_shapes[0], lambda d: full[d])

    def local(ctx, x):
        lim = tuple(ctx.in_shapes[0][d] if full[d] else p["limit_indices"][d] for d in range(len(x.shape)))
        return bind(ctx, x, limit_indices=lim)

    return Rule([op], [out], n.sizes, blocked=frozenset(blocked), local=local)


def _conv(eqn, shapes, out_shapes):
    """``conv_general_dilated``: the lhs batch dim shares its factor with the result's batch dim; the lhs
    feature dim (input channels) with the rhs input-feature dim, a ``sum`` reduction (each device convolves its
    channels, the result a pending sum); the rhs output-feature dim with the result's feature dim; the spatial
    dims (windows, strides, padding, dilations) are blocked, every device convolving them whole. With feature
    or batch groups, the feature dims are blocked (and, with batch groups, the batch dim): only a plain
    convolution splits them."""
    p = eqn.params
    lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
    (ls, rs), os_ = shapes, out_shapes[0]
    n = _Names()
    lhs, rhs, out = [n(d) for d in ls], [n(d) for d in rs], [n(d) for d in os_]
    plain = p["feature_group_count"] == 1 and p["batch_group_count"] == 1
    blocked = {f for dims, spec in ((lhs, lhs_spec), (rhs, rhs_spec), (out, out_spec)) for d in spec[2:]
               for f in dims[d]}
    if p["batch_group_count"] == 1:
        lhs[lhs_spec[0]] = out[out_spec[0]]
    else:
        blocked.update(lhs[lhs_spec[0]] + out[out_spec[0]])
    reduce = {}
    if plain:
        lhs[lhs_spec[1]] = rhs[rhs_spec[1]]
        rhs[rhs_spec[0]] = out[out_spec[1]]
        reduce = {f: "sum" for f in rhs[rhs_spec[1]]}
    else:
        blocked.update(lhs[lhs_spec[1]] + rhs[rhs_spec[0]] + rhs[rhs_spec[1]] + out[out_spec[1]])
    return Rule([lhs, rhs], [out], n.sizes, reduce=reduce, blocked=frozenset(blocked), linear="one")


def _rev(eqn, shapes, out_shapes):
    """``rev``: the reversed dims are blocked (a device's block would come from the mirrored device), the others
    shared with the result."""
    n, op, out, blocked = _whole_or_blocked(shapes[0], out_shapes[0], lambda d: d not in eqn.params["dimensions"])
    return Rule([op], [out], n.sizes, blocked=frozenset(blocked), linear="all")


def _along_axis(param):
    """Ops that act along one dim (``split``, ``sort``, ``cumsum``-like): that dim is blocked."""

    def rule(eqn, shapes, out_shapes):
        n = _Names()
        ax = eqn.params[param] % len(shapes[0])
        base = [n(s) for s in shapes[0]]
        blocked = set(base[ax])
        ops = []
        for s in shapes:
            o = list(base)
            o[ax] = n(s[ax]); blocked.update(o[ax])  # noqa: E702
            ops.append(o)
        outs = []
        for s in out_shapes:
            o = list(base)
            o[ax] = n(s[ax]); blocked.update(o[ax])  # noqa: E702
            outs.append(o)
        return Rule(ops, outs, n.sizes, blocked=frozenset(blocked))

    return rule


def _permute_dim(eqn, shapes, out_shapes):
    """A static permutation of one dim (:mod:`partir_core.permutation`): the result laid out as its operand,
    the rows moved between devices by its local form."""
    n = _Names()
    dims = [n(s) for s in shapes[0]]
    return Rule([dims], [list(dims)], n.sizes, linear="all", local=permutation.local,
                collectives=lambda eqn, in_types: permutation.receives(eqn.params["perm"], eqn.params["dim"],
                                                                       in_types[0]))


RULES: dict[str, Callable] = {
    "dot_general": _dot_general,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "reduce_sum": _reduction("sum"),
    "reduce_max": _reduction("max"),
    "reduce_min": _reduction("min"),
    "reduce_prod": _reduction(None),
    "reduce_and": _reduction(None),
    "reduce_or": _reduction(None),
    "argmax": _reduction(None),
    "argmin": _reduction(None),
    "iota": _iota,
    "gather": _gather,
    "scatter-add": _scatter_add,
    "scatter_add": _scatter_add,
    "concatenate": _concatenate,
    "pad": _pad,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "slice": _slice,
    "conv_general_dilated": _conv,
    "rev": _rev,
    "split": _along_axis("axis"),
    "sort": _along_axis("dimension"),
    "random_bits": _random_draw,
    "random_split": _random_draw,
    "random_wrap": _random_wrap,
    "random_unwrap": _random_unwrap,
    "permute_dim": _permute_dim,
    **{f"{k}_{side}": _boundary for k in CONTROL_FLOW for side in ("enter", "exit")},
}
for _name in ELEMENTWISE | IDENTITY:
    RULES[_name] = _elementwise


class EqnView:
    """The parts of an equation a rule reads."""

    def __init__(self, eqn, graph):
        self.prim = eqn.prim
        self.name = eqn.name
        self.params = eqn.params
        self.in_dtypes = [graph.dtype(v) for v in eqn.invars]


def rule_for(eqn, graph) -> Rule | None:
    """The factor rule of ``eqn`` in ``graph``, or None if its primitive has none (or this use is not covered)."""
    make = RULES.get(eqn.name)
    if make is None:
        return None
    shapes = [graph.shape(v) for v in eqn.invars]
    out_shapes = [graph.shape(v) for v in eqn.outvars]
    try:
        rule = make(EqnView(eqn, graph), shapes, out_shapes)
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if rule is None:
        return None
    assert len(rule.operands) == len(shapes) and len(rule.results) == len(out_shapes), eqn.name
    return rule


def supported_primitives() -> list[str]:
    """The primitives with a factor rule."""
    return sorted(RULES)


def flops(name: str, in_shapes, out_shapes, params) -> float:
    """FLOPs of one op on the given (local) shapes: ``2·M·N·K`` for ``dot_general``, two per output element and
    rhs window element (input features times kernel window) for ``conv_general_dilated``, one per output (or
    input, for reductions) element otherwise."""
    if name == "dot_general":
        (lc, _), _ = params["dimension_numbers"]
        k = math.prod(in_shapes[0][d] for d in lc)
        return 2.0 * math.prod(out_shapes[0]) * k
    if name == "conv_general_dilated":  # per output element, a window of the rhs's input features
        rhs_spec = params["dimension_numbers"][1]
        window = math.prod(in_shapes[1][d] for d in rhs_spec[1:])
        return 2.0 * math.prod(out_shapes[0]) * window
    if name.startswith("reduce_") or name in ("argmax", "argmin"):
        return float(math.prod(in_shapes[0]))
    return float(sum(math.prod(s) for s in out_shapes))
