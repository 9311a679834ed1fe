"""The proved local forms: what a device's local op computes from the blocks of its operands.

A *local form* of an equation, given the types its operands are held in (what the walk of
:mod:`partir_core.proof.invariant` has proved of the buffers it reads), states

- ``out_types``: the types its results are then held in: blocks, pending sums, or a pending maximum or minimum
  (a type partial with reduction ``"max"``/``"min"``, which a ``Finish`` must complete);
- ``template``: the function the device must run on its local operands (the primitive with its own parameters,
  but the shape parameters made local), which the walk compares with what the program runs;
- ``masks``: the operand dims whose padding must be set to a reduction's identity first
  (``(operand, dim, kind)``);
- ``source`` (a data movement among devices, which has no template): the global indices of the operand
  elements that result elements hold, given theirs (an array, one index per row), which the walk checks by
  running what the device runs (:func:`partir_core.proof.movement.check`).

Each form names the lemma of :mod:`partir_core.proof.lemmas` it rests on: proved once, with symbolic sizes,
it says that the template on blocks of those types computes blocks (or summands, or partial extrema) of the
global op's results, of the types stated. The forms are written here from the primitives' own semantics,
independently of :mod:`partir_core.registry`, so that a registry rule or local form that is wrong cannot
prove itself right. A form covers exactly the operand types it accepts; anything else raises
:class:`NotCovered` (the walk then answers "undecided"), never a guess.

Values are those of real arithmetic: a pending sum of floats that is reduced later rounds differently from the
sum computed whole, as every partitioner's does.

Forms, by primitive (``T_k``: operand ``k``'s type; a type partial over ``P`` is a pending sum unless said):

- any primitive, **replicated**: every operand whole and not pending; its results whole.
- **elementwise** (:data:`ELEMENTWISE`): equal-rank operands (size-1 dims broadcast, which must be whole) and
  scalars (whole) with the same axes on every dim; a result dim has them. Pending sums: through
  :data:`LINEAR_ALL` when every operand is pending over the same axes; through ``mul`` when exactly one is.
- **dot_general**: batch and contracting dim pairs with equal axes; the result's dims are the batch dims', then
  each side's free dims'; it is pending over the contracting axes (masked where uneven), and over one
  operand's pending axes (the other not pending, the two sets disjoint).
- **conv_general_dilated**: spatial dims whole on both operands; the lhs batch dim's axes are the result's batch
  dim's (whole with batch groups), the rhs output-feature dim's the result's feature dim's, and the input
  features, paired on both operands with equal axes, are contracted: the result is pending over them (masked
  where uneven), and over one operand's pending axes as for ``dot_general``. With feature or batch groups the
  feature dims are whole.
- **reductions**: ``reduce_sum`` pending over the reduced dims' axes (and its operand's); ``reduce_max`` /
  ``reduce_min`` a pending maximum / minimum there; ``argmax``, ``argmin``, ``reduce_prod``, ``reduce_and`` and
  ``reduce_or`` with their reduced dims whole.
- **broadcast_in_dim**, **reshape**, **transpose**, **squeeze**, **rev**: layouts that map blocks to blocks (a
  reshape: when both sides' block structures, flattened row-major, are equal; ``rev``: its reversed dims whole);
  pending sums pass through.
- **slice**, **dynamic_slice**, **dynamic_update_slice**, **pad**, **concatenate**: the dims they slice, update,
  pad or join whole (a split dim taken whole: sliced from 0 to its end, updated by an update as large, not
  padded), indices and padding values whole; the other dims keep their operand's axes (an update's the
  operand's). Pending sums pass through ``slice`` and ``dynamic_slice``.
- **permute_dim** (a static permutation of one dim, :mod:`partir_core.permutation`): the result laid out as its
  operand, pending sums passing through; what the device runs is checked by running it
  (:mod:`partir_core.proof.movement`), not against a template: its rows move between devices.
- **iota**: each device counts from its block's start.
- **random_bits**: keys not pending, the result's leading dims split as the keys' dims (each key of a batch
  draws its own values); the new dims whole, the primitive run on the local keys, or, for a counter-based draw
  (:func:`partir_core.keys.counter_based`), split any way, each device drawing the positions from its blocks'
  starts (:func:`partir_core.keys.draw_block`, which the tests check against JAX's whole draw, is taken as the
  primitive's meaning on a block, as ``bind`` is for any primitive).
- **gather** / **scatter-add** with the indexed operand dims whole: indices split on their batch dims, the
  operand on its pass-through window dims; a scatter-add whose update rows are split is pending over their
  axes, the operand counted on the first device of each group only. A table split on a looked-up dim: each
  device looks up (adds) the indices in its block, an index out of range clamped first in ``CLIP`` mode (it
  then lies in exactly one block), else filled once (dropped everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from redist.errors import ShardingError

from partir_core import keys
from partir_core.choice import value_type

ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "rem", "pow", "max", "min", "neg", "sign", "abs", "floor", "ceil", "round",
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "sqrt", "rsqrt", "cbrt",
    "square", "integer_pow", "erf", "erfc", "erf_inv", "is_finite", "atan2", "nextafter", "reduce_precision",
    "not", "and", "or", "xor", "eq",
    "ne", "lt", "le", "gt", "ge", "select_n", "clamp", "convert_element_type", "stop_gradient", "add_any", "copy",
    "copy_p", "real", "imag", "conj", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "bitcast_convert_type", "shift_left", "shift_right_logical", "shift_right_arithmetic", "population_count",
    "clz", "random_seed", "random_fold_in", "random_clone", "threefry2x32"})
LINEAR_ALL = frozenset({"add", "sub", "add_any", "neg", "copy", "copy_p"})
REDUCED_WHOLE = frozenset({"argmax", "argmin", "reduce_prod", "reduce_and", "reduce_or"})
IDENTITY = frozenset({"sharding_constraint", "mesh_cast", "reshard"})


class NotCovered(Exception):
    """No proved local form covers the equation with these operand types: ``reason`` says what is not."""


@dataclass(frozen=True)
class LocalForm:
    """A proved local form (see the module docstring)."""

    lemma: str
    out_types: tuple
    template: Callable | None
    masks: frozenset = frozenset()
    source: Callable | None = None


@dataclass
class Site:
    """What a form reads of one equation: the graph, the equation, its operands' held types, the types the
    program declares for its results (a form takes from them only what is free: the axes of a broadcast's new
    dims, say, and checks them), the mesh, and how the program names mesh axes (``names``)."""

    graph: object
    eqn: object
    in_types: list
    declared: list
    mesh: object
    names: Callable

    def rank(self, v) -> int:
        return len(self.graph.shape(v))

    def dims(self, k: int) -> tuple:
        """Operand ``k``'s value dims' axes (a key array's key-data dims must be whole)."""
        return _value_dims(self.graph, self.eqn.invars[k], self.in_types[k])

    def out_dims(self, r: int) -> tuple:
        return _value_dims(self.graph, self.eqn.outvars[r], self.declared[r])

    def out_type(self, r: int, dims, partial=(), reduction="sum"):
        v = self.eqn.outvars[r]
        try:
            t = value_type(self.graph, v, self.mesh, tuple(tuple(d) for d in dims), tuple(partial))
            return t.replace(reduction=reduction) if partial and reduction != "sum" else t
        except ShardingError as e:
            raise NotCovered(f"its result would have no valid type: {e}") from None

    def local_out(self, r: int, t) -> tuple:
        return t.local_shape[: self.rank(self.eqn.outvars[r])]

    def pending(self, k: int) -> tuple:
        t = self.in_types[k]
        if t.partial and t.reduction != "sum":
            raise NotCovered(f"operand {k} is a pending {t.reduction}")
        return tuple(t.partial)


def _value_dims(graph, v, t) -> tuple:
    rank = len(graph.shape(v))
    if any(t.dims[rank:]):
        raise NotCovered("a key array's key data is split")
    return tuple(t.dims[:rank])


def bind(eqn, **overrides) -> Callable:
    """The template running ``eqn``'s primitive on local operands, its parameters updated by ``overrides``."""
    params = {**eqn.params, **overrides}

    def run(*xs):
        out = eqn.prim.bind(*xs, **params)
        return list(out) if eqn.prim.multiple_results else [out]

    return run


def _whole(site: Site) -> bool:
    return all(not any(site.dims(k)) and not site.in_types[k].partial for k in range(len(site.in_types)))


# ------------------------------------------------------------------------------------------- forms
def replicated(site: Site) -> LocalForm:
    if not _whole(site):
        raise NotCovered("an operand is split or pending")
    outs = tuple(site.out_type(r, ((),) * site.rank(v)) for r, v in enumerate(site.eqn.outvars))
    template = (lambda *xs: list(xs)) if site.eqn.name in IDENTITY else bind(site.eqn)
    return LocalForm("replicated", outs, template)


def elementwise(site: Site) -> LocalForm:
    eqn, g = site.eqn, site.graph
    if len(eqn.outvars) != 1:
        raise NotCovered("an elementwise op with several results")
    shape = g.shape(eqn.outvars[0])
    dims: list = [None] * len(shape)
    for k, v in enumerate(eqn.invars):
        s, ds = g.shape(v), site.dims(k)
        if not s:
            continue
        if len(s) != len(shape):
            raise NotCovered(f"operand {k} has rank {len(s)}, the result {len(shape)}")
        for d, (n, axes) in enumerate(zip(s, ds)):
            if n != shape[d]:
                if n != 1 or axes:
                    raise NotCovered(f"operand {k} broadcasts dim {d} but is split there")
            elif dims[d] is None:
                dims[d] = axes
            elif dims[d] != axes:
                raise NotCovered(f"dim {d} is split as {dims[d]} and {axes} by two operands")
    for k, v in enumerate(eqn.invars):
        if not g.shape(v) and any(site.dims(k)):
            raise NotCovered(f"scalar operand {k} is split")
    pend = [site.pending(k) for k in range(len(eqn.invars))]
    partial = _elementwise_pending(eqn, g, pend)
    out = site.out_type(0, [d or () for d in dims], partial)
    template = (lambda *xs: list(xs)) if eqn.name in IDENTITY else bind(eqn)
    return LocalForm("elementwise" if not partial else "elementwise of pending sums", (out,), template)


def _elementwise_pending(eqn, graph, pend) -> tuple:
    """The pending axes of an elementwise op's result, given its operands' (see the module docstring)."""
    if not any(pend):
        return ()
    linear = eqn.name in LINEAR_ALL
    if eqn.name == "convert_element_type":
        linear = all(np.issubdtype(d, np.floating) for d in (graph.dtype(eqn.invars[0]), eqn.params["new_dtype"]))
    if linear and all(p == pend[0] for p in pend):
        return pend[0]
    if eqn.name == "mul" and sum(bool(p) for p in pend) == 1:
        return next(p for p in pend if p)
    raise NotCovered(f"{eqn.name} of pending sums {pend} is not linear in them")


def dot_general(site: Site) -> LocalForm:
    (lc, rc), (lb, rb) = site.eqn.params["dimension_numbers"]
    L, R = site.dims(0), site.dims(1)
    tl, tr = site.in_types
    for a, b in [*zip(lb, rb), *zip(lc, rc)]:
        if L[a] != R[b]:
            raise NotCovered(f"paired dims {a} and {b} are split as {L[a]} and {R[b]}")
    contracted = tuple(x for a in lc for x in L[a])
    masks = set()
    for a, b in zip(lc, rc):
        if L[a] and not (tl.is_even(a) and tr.is_even(b)):
            masks.update({(0, a, "sum"), (1, b, "sum")})
    passed = _pending_through_product(site, contracted)
    free_l = [L[i] for i in range(len(L)) if i not in lc and i not in lb]
    free_r = [R[i] for i in range(len(R)) if i not in rc and i not in rb]
    out = site.out_type(0, [L[a] for a in lb] + free_l + free_r, passed + contracted)
    return LocalForm("dot_general", (out,), bind(site.eqn), frozenset(masks))


def _pending_through_product(site: Site, contracted: tuple) -> tuple:
    """The pending axes a product of two operands (``dot_general``, a convolution) passes on: one operand's, the
    other not pending, none of them an axis its contraction is split over."""
    pend = [site.pending(0), site.pending(1)]
    if all(pend):
        raise NotCovered("both operands are pending sums")
    passed = pend[0] or pend[1]
    if set(passed) & set(contracted):
        raise NotCovered(f"the contraction is split over {contracted}, over which an operand is pending")
    return passed


def conv_general_dilated(site: Site) -> LocalForm:
    p = site.eqn.params
    (lb, lf, *l_space), (ro, ri, *r_space), (ob, of, *o_space) = p["dimension_numbers"]
    L, R = site.dims(0), site.dims(1)
    if any(L[d] for d in l_space) or any(R[d] for d in r_space):
        raise NotCovered("a spatial dim is split")
    if p["batch_group_count"] != 1 and L[lb]:
        raise NotCovered("a convolution with batch groups is split on its batch")
    if (p["feature_group_count"] != 1 or p["batch_group_count"] != 1) and (L[lf] or R[ri] or R[ro]):
        raise NotCovered("a grouped convolution is split on its features")
    if L[lf] != R[ri]:
        raise NotCovered(f"the input features are split as {L[lf]} and {R[ri]}")
    contracted = tuple(L[lf])
    tl, tr = site.in_types
    masks = {(0, lf, "sum"), (1, ri, "sum")} if contracted and not (tl.is_even(lf) and tr.is_even(ri)) else set()
    passed = _pending_through_product(site, contracted)
    dims = [()] * site.rank(site.eqn.outvars[0])
    dims[ob], dims[of] = L[lb], R[ro]
    out = site.out_type(0, dims, passed + contracted)
    return LocalForm("conv_general_dilated", (out,), bind(site.eqn), frozenset(masks))


def reduction(site: Site) -> LocalForm:
    name, axes = site.eqn.name, set(site.eqn.params["axes"])
    ds, t = site.dims(0), site.in_types[0]
    red = tuple(a for d in sorted(axes) for a in ds[d])
    keep = [x for d, x in enumerate(ds) if d not in axes]
    pend = site.pending(0)
    if name in REDUCED_WHOLE or (name != "reduce_sum" and pend):
        if red or pend:
            raise NotCovered(f"{name} over a split or pending dim")
        outs = tuple(site.out_type(r, keep) for r in range(len(site.eqn.outvars)))
        return LocalForm("reduction along whole dims", outs, bind(site.eqn))
    kind = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}[name]
    masks = frozenset((0, d, kind) for d in axes if ds[d] and not t.is_even(d))
    if kind == "sum":
        return LocalForm("reduction", (site.out_type(0, keep, pend + red),), bind(site.eqn), masks)
    return LocalForm("reduction", (site.out_type(0, keep, red, kind),), bind(site.eqn), masks)


def broadcast_in_dim(site: Site) -> LocalForm:
    p = site.eqn.params
    shape, bd = p["shape"], p["broadcast_dimensions"]
    src, ds = site.graph.shape(site.eqn.invars[0]), site.dims(0)
    # a new dim, or one broadcast from size 1, holds the same values all along: any split is the local broadcast
    dims = list(site.out_dims(0))
    for i, o in enumerate(bd):
        if src[i] == shape[o]:
            dims[o] = ds[i]
        elif ds[i]:
            raise NotCovered(f"operand dim {i} is broadcast but split")
    out = site.out_type(0, dims, site.pending(0))
    return LocalForm("broadcast_in_dim", (out,), bind(site.eqn, shape=site.local_out(0, out), sharding=None))


def reshape(site: Site) -> LocalForm:
    """A reshape whose operand's blocks (transposed by ``dimensions`` first, where given: a transpose keeps each
    dim's blocks) flatten in row-major order as the result's do: each device reshapes its block alike."""
    dims = site.out_dims(0)
    out = site.out_type(0, dims, site.pending(0))
    shape, ds = site.graph.shape(site.eqn.invars[0]), site.dims(0)
    perm = site.eqn.params.get("dimensions") or range(len(shape))
    src = _blocks([shape[d] for d in perm], [ds[d] for d in perm], site.mesh)
    dst = _blocks(site.graph.shape(site.eqn.outvars[0]), dims, site.mesh)
    if src != dst:
        raise NotCovered(f"the blocks of {site.dims(0)} and {dims} do not flatten alike ({src} != {dst})")
    return LocalForm("reshape", (out,), bind(site.eqn, new_sizes=site.local_out(0, out), sharding=None))


def _blocks(shape, dims, mesh) -> tuple:
    """The row-major structure of an evenly split array of that ``shape`` whose dims are split over ``dims``
    (per dim, its mesh axes): per dim its block digit (its axes, their group size) then its local extent; size-1
    parts dropped, adjacent parts of one kind merged."""
    parts: list = []
    for n, axes in zip(shape, dims):
        k = mesh.group_size(tuple(axes))
        if n % k:
            raise NotCovered(f"a dim of {n} split {k} ways (uneven) in a reshape")
        for kind, part, m in (("split", tuple(axes), k), ("local", (), n // k)):
            if m == 1:
                continue
            if parts and parts[-1][0] == kind:
                parts[-1] = (kind, parts[-1][1] + part, parts[-1][2] * m)
            else:
                parts.append((kind, part, m))
    return tuple(parts)


def transpose(site: Site) -> LocalForm:
    ds = site.dims(0)
    out = site.out_type(0, [ds[p] for p in site.eqn.params["permutation"]], site.pending(0))
    return LocalForm("transpose", (out,), bind(site.eqn))


def squeeze(site: Site) -> LocalForm:
    ds, shape = site.dims(0), site.graph.shape(site.eqn.invars[0])
    gone = {d % len(shape) for d in site.eqn.params["dimensions"]}
    if any(shape[d] != 1 or ds[d] for d in gone):
        raise NotCovered("a squeezed dim is not of size 1")
    out = site.out_type(0, [x for d, x in enumerate(ds) if d not in gone], site.pending(0))
    return LocalForm("squeeze", (out,), bind(site.eqn))


def rev(site: Site) -> LocalForm:
    ds = site.dims(0)
    if any(ds[d] for d in site.eqn.params["dimensions"]):
        raise NotCovered("a reversed dim is split (its blocks would come from the mirrored devices)")
    out = site.out_type(0, ds, site.pending(0))
    return LocalForm("rev", (out,), bind(site.eqn))


def _kept(site: Site, k: int, whole) -> list:
    """Operand ``k``'s dims' axes, where each dim ``d`` split must be one that ``whole(d)`` says the op takes
    whole."""
    ds = site.dims(k)
    for d, axes in enumerate(ds):
        if axes and not whole(d):
            raise NotCovered(f"operand {k} is split on dim {d}, which the op does not take whole")
    return list(ds)


def _whole_scalars(site: Site, first: int) -> None:
    for k in range(first, len(site.in_types)):
        if any(site.dims(k)) or site.in_types[k].partial:
            raise NotCovered(f"operand {k} (an index or a padding value) is split or pending")


def slice_(site: Site) -> LocalForm:
    p, shape = site.eqn.params, site.graph.shape(site.eqn.invars[0])
    strides = p["strides"] or (1,) * len(shape)
    ds = _kept(site, 0, lambda d: (p["start_indices"][d], p["limit_indices"][d], strides[d]) == (0, shape[d], 1))
    out = site.out_type(0, ds, site.pending(0))
    L = site.in_types[0].local_shape
    limits = tuple(L[d] if ds[d] else p["limit_indices"][d] for d in range(len(shape)))
    return LocalForm("slice", (out,), bind(site.eqn, limit_indices=limits))


def dynamic_slice(site: Site) -> LocalForm:
    sizes, shape = site.eqn.params["slice_sizes"], site.graph.shape(site.eqn.invars[0])
    ds = _kept(site, 0, lambda d: sizes[d] == shape[d])
    _whole_scalars(site, 1)
    out = site.out_type(0, ds, site.pending(0))
    return LocalForm("dynamic_slice", (out,), bind(site.eqn, slice_sizes=site.local_out(0, out)))


def dynamic_update_slice(site: Site) -> LocalForm:
    x, u = (site.graph.shape(v) for v in site.eqn.invars[:2])
    ds = _kept(site, 0, lambda d: u[d] == x[d])
    if list(site.dims(1)) != ds:
        raise NotCovered(f"the update is split as {site.dims(1)}, the operand as {ds}")
    _whole_scalars(site, 2)
    if site.pending(0) or site.pending(1):
        raise NotCovered("a pending operand or update")
    return LocalForm("dynamic_update_slice", (site.out_type(0, ds),), bind(site.eqn))


def pad(site: Site) -> LocalForm:
    cfg = site.eqn.params["padding_config"]
    ds = _kept(site, 0, lambda d: tuple(cfg[d]) == (0, 0, 0))
    _whole_scalars(site, 1)
    if site.pending(0):
        raise NotCovered("a pending operand")
    return LocalForm("pad", (site.out_type(0, ds),), bind(site.eqn))


def concatenate(site: Site) -> LocalForm:
    dim = site.eqn.params["dimension"]
    ds = _kept(site, 0, lambda d: d != dim)
    for k in range(1, len(site.in_types)):
        if list(site.dims(k)) != ds:
            raise NotCovered(f"operand {k} is split as {site.dims(k)}, operand 0 as {ds}")
    if any(site.pending(k) for k in range(len(site.in_types))):
        raise NotCovered("a pending operand")
    return LocalForm("concatenate", (site.out_type(0, ds),), bind(site.eqn))


def permute_dim(site: Site) -> LocalForm:
    perm, dim = site.eqn.params["perm"], site.eqn.params["dim"]
    if sorted(perm) != list(range(site.graph.shape(site.eqn.invars[0])[dim])):
        raise NotCovered(f"{perm} is not a permutation of dim {dim}")
    out = site.out_type(0, site.dims(0), site.pending(0))

    def source(g):
        src = np.array(g)
        src[:, dim] = np.asarray(perm)[g[:, dim]]
        return src

    return LocalForm("permutation", (out,), None, source=source)


def iota(site: Site) -> LocalForm:
    p = site.eqn.params
    dim, dtype = p["dimension"], p["dtype"]
    out = site.out_type(0, site.out_dims(0))
    shape = site.local_out(0, out)
    axes = out.dims[dim]

    def template():
        x = lax.iota(dtype, shape[dim]) + (lax.axis_index(site.names(axes)) * shape[dim] if axes else 0)
        return [lax.broadcast_in_dim(x.astype(dtype), shape, (dim,))]

    return LocalForm("iota", (out,), template)


def random_bits(site: Site) -> LocalForm:
    if site.pending(0):
        raise NotCovered("pending keys")
    K, out = site.dims(0), site.out_dims(0)
    if tuple(out[:len(K)]) != K:
        raise NotCovered(f"the draw's key dims are split as {out[:len(K)]}, its keys as {K}")
    shape = tuple(site.eqn.params["shape"])
    if not any(out[len(K):]):
        return LocalForm("random_bits", (site.out_type(0, out),), bind(site.eqn))
    if not keys.counter_based(site.graph.dtype(site.eqn.invars[0]), shape):
        raise NotCovered("the new dims of a draw that is not counter-based are split")
    t = site.out_type(0, out)
    block = site.local_out(0, t)[len(K):]
    new = out[len(K):]

    def template(k):
        starts = [lax.axis_index(site.names(axes)) * n if axes else 0 for axes, n in zip(new, block)]
        return [keys.draw_block(k, site.eqn.params["bit_width"], shape, block, starts)]

    return LocalForm("random_bits", (t,), template)


def gather(site: Site) -> LocalForm:
    p, (ops, idx) = site.eqn.params, (site.graph.shape(v) for v in site.eqn.invars)
    dn, sizes = p["dimension_numbers"], tuple(p["slice_sizes"])
    X, I = site.dims(0), site.dims(1)
    if site.pending(0) or site.pending(1) or I[-1]:
        raise NotCovered("a pending operand, or split index vectors")
    for od, i in zip(dn.operand_batching_dims, dn.start_indices_batching_dims):
        if X[od] != I[i]:
            raise NotCovered(f"batching dims {od} and {i} are split as {X[od]} and {I[i]}")
    window = [d for d in range(len(ops)) if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
    passthrough = {d for d in window if d not in dn.start_index_map and sizes[d] == ops[d]}
    lookup = [d for d in dn.start_index_map if X[d] and sizes[d] == 1 and d in dn.collapsed_slice_dims]
    for d in range(len(ops)):
        if X[d] and d not in passthrough and d not in dn.operand_batching_dims and d not in lookup:
            raise NotCovered(f"operand dim {d} is split but indexed or sliced")
    out_rank = site.rank(site.eqn.outvars[0])
    dims: list = [()] * out_rank
    batch_pos = [q for q in range(out_rank) if q not in dn.offset_dims]
    for q, axes in zip(batch_pos, I[:-1]):
        dims[q] = axes
    for q, d in zip(dn.offset_dims, window):
        dims[q] = X[d]
    local_sizes = tuple(site.in_types[0].local_shape[d] if d in passthrough else s for d, s in enumerate(sizes))
    if not lookup:
        return LocalForm("gather", (site.out_type(0, dims),), bind(site.eqn, slice_sizes=local_sizes))
    dtype = np.dtype(site.graph.dtype(site.eqn.invars[0]))
    if dtype == np.bool_ or not np.issubdtype(dtype, np.number):
        raise NotCovered(f"a lookup split over its table of {dtype} values, which do not sum")
    rows = tuple(a for d in lookup for a in X[d])
    out = site.out_type(0, dims, rows)
    return LocalForm("gather of a split table", (out,), _lookup(site, ops, dn, sizes, local_sizes, lookup,
                                                                batch_pos, rows))


def _lookup(site, ops, dn, sizes, local_sizes, lookup, batch_pos, rows) -> Callable:
    """The template of a gather from a table split on its looked-up dims: each device looks up the indices
    in its own block (local index = global index − its block's start), zero elsewhere; an index out of range
    everywhere gets the fill value on the first device of the group only (``FILL_OR_DROP``), or is clamped."""
    p = site.eqn.params
    fill = p["mode"] == lax.GatherScatterMode.FILL_OR_DROP
    hi_np = np.array([ops[d] - sizes[d] for d in dn.start_index_map], np.int64)
    L = site.in_types[0].local_shape
    run = bind(site.eqn, slice_sizes=local_sizes, mode=lax.GatherScatterMode.FILL_OR_DROP, fill_value=0)

    def template(x, i):
        hi = jnp.asarray(hi_np, i.dtype)
        oob = jnp.any((i < 0) | (i > hi), axis=-1)
        gi = i if fill else jnp.clip(i, 0, hi)
        starts = [lax.axis_index(site.names(site.in_types[0].dims[d])) * L[d] if d in lookup else 0
                  for d in dn.start_index_map]
        li = gi - jnp.stack([jnp.asarray(s, gi.dtype) for s in starts])
        (y,) = run(x, li)
        if fill:
            first = (lax.axis_index(site.names(rows)) == 0).astype(y.dtype)
            value = jnp.asarray(p["fill_value"], y.dtype) * first
            y = jnp.where(lax.broadcast_in_dim(oob, y.shape, batch_pos), value, y)
        return [y]

    return template


def scatter_add(site: Site) -> LocalForm:
    dn = site.eqn.params["dimension_numbers"]
    ops, idx, upd = (site.graph.shape(v) for v in site.eqn.invars)
    X, I, U = site.dims(0), site.dims(1), site.dims(2)
    if site.pending(1) or I[-1]:
        raise NotCovered("pending or split index vectors")
    batching = dict(zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims))
    window = [d for d in range(len(ops)) if d not in dn.inserted_window_dims and d not in batching]
    for od, i in batching.items():
        if X[od] != I[i]:
            raise NotCovered(f"batching dims {od} and {i} are split as {X[od]} and {I[i]}")
    for q, d in zip(dn.update_window_dims, window):
        whole = upd[q] == ops[d] and d not in dn.scatter_dims_to_operand_dims
        if (X[d] or U[q]) and not (whole and X[d] == U[q]):
            raise NotCovered(f"update dim {q} and operand dim {d} are split as {U[q]} and {X[d]}")
    lookup = [d for d in dn.scatter_dims_to_operand_dims if X[d] and d in dn.inserted_window_dims]
    for d in range(len(ops)):
        if X[d] and d not in window and d not in batching and d not in lookup:
            raise NotCovered(f"operand dim {d} is indexed but split")
    scatter_pos = [q for q in range(len(upd)) if q not in dn.update_window_dims]
    by_index = set(batching.values())
    rows = ()
    masks = set()
    for q, i in zip(scatter_pos, range(len(idx) - 1)):
        if U[q] != I[i]:
            raise NotCovered(f"update dim {q} and index dim {i} are split as {U[q]} and {I[i]}")
        if i not in by_index:
            rows += tuple(U[q])
            if U[q] and not site.in_types[2].is_even(q):
                masks.add((2, q, "sum"))
    pend = [site.pending(0), site.pending(2)]
    if any(pend) or (rows and site.pending(0)):
        raise NotCovered("a pending operand or update")
    out = site.out_type(0, X, rows)
    run = bind(site.eqn)
    if not rows and not lookup:
        return LocalForm("scatter-add", (out,), run, frozenset(masks))
    if lookup:
        run = _masked_scatter(site, ops, dn, lookup)

    def template(x, i, u):
        if rows:
            first = lax.axis_index(site.names(rows)) == 0
            x = x * first.astype(x.dtype)
        return run(x, i, u)

    return LocalForm("scatter-add of split update rows" if rows else "scatter-add into a split table", (out,),
                     template, frozenset(masks))


def _masked_scatter(site, ops, dn, lookup) -> Callable:
    """A scatter-add into a table split on its indexed dims: each device adds the updates whose index falls
    in its block, at local index = global index − its block's start; an index out of range is clamped first
    in ``CLIP`` mode (as the op clamps it: it then lies in one block), else dropped everywhere."""
    hi_np = np.array([ops[d] - 1 for d in dn.scatter_dims_to_operand_dims], np.int64)
    L = site.in_types[0].local_shape
    clip = site.eqn.params["mode"] == lax.GatherScatterMode.CLIP
    run = bind(site.eqn, mode=lax.GatherScatterMode.FILL_OR_DROP)

    def scatter(x, i, u):
        hi = jnp.asarray(hi_np, i.dtype)
        oob = jnp.any((i < 0) | (i > hi), axis=-1)
        gi = jnp.clip(i, 0, hi) if clip else i
        starts = [lax.axis_index(site.names(site.in_types[0].dims[d])) * L[d] if d in lookup else 0
                  for d in dn.scatter_dims_to_operand_dims]
        li = gi - jnp.stack([jnp.asarray(s, gi.dtype) for s in starts])
        if not clip:
            li = jnp.where(oob[..., None], -1, li)
        return run(x, li, u)

    return scatter


FORMS: dict[str, Callable] = {
    "dot_general": dot_general, "conv_general_dilated": conv_general_dilated, "reduce_sum": reduction,
    "reduce_max": reduction, "reduce_min": reduction, **{k: reduction for k in REDUCED_WHOLE},
    "broadcast_in_dim": broadcast_in_dim, "reshape": reshape, "transpose": transpose, "squeeze": squeeze, "rev": rev,
    "iota": iota, "random_bits": random_bits, "gather": gather, "scatter-add": scatter_add,
    "scatter_add": scatter_add, "slice": slice_, "dynamic_slice": dynamic_slice,
    "dynamic_update_slice": dynamic_update_slice, "pad": pad, "concatenate": concatenate, "permute_dim": permute_dim,
    **{k: elementwise for k in ELEMENTWISE | IDENTITY},
}


def local_forms(site: Site) -> list[LocalForm]:
    """The local forms that cover ``site`` (its primitive's own form, then the replicated one), in that order;
    :class:`NotCovered` naming why each does not when none does."""
    found, why = [], []
    for form in (FORMS.get(site.eqn.name), replicated):
        if form is None:
            why.append(f"{site.eqn.name} has no proved local form")
            continue
        try:
            found.append(form(site))
        except NotCovered as e:
            why.append(str(e))
    if not found:
        raise NotCovered("; ".join(why))
    return found

