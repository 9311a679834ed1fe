"""Factor algebra: how the mesh axes of a dim are shared among the factors a rule gives it, and back.

A :class:`~partir_core.registry.Rule` names every dim of an op's operands and results by its factors (major →
minor). A *use* maps each factor to the mesh axes it is split over, ``use[f] = (axes, provenance)``
(provenance: the tactic that decided it; lower decides earlier). A dim's axes are its factors' axes
concatenated (:func:`compose`), and a dim's axes are shared out among its factors by :func:`decompose`.
Blocks stay contiguous only if every factor before the last split one is split fully; a dim of several
factors must also be split evenly (uneven blocks of a compound dim do not follow its factors).

Axes may be sub-axes of a mesh axis (``model:(2)2``, redist's :class:`~redist.axes.Axis`). Two axes then
*overlap* when they name a common factor of one mesh axis (:func:`overlap`: a whole axis overlaps each of its
sub-axes), which is what "one mesh axis per op" and "one mesh axis per value" forbid; and two axis lists are
compared by the factor pieces they cover (:func:`refines`), so a dim over ``(model:(1)2, model:(2)2)`` is one
over ``(model,)`` and refines one over ``(model:(1)2,)``. On whole axes both are plain equality.
"""

from __future__ import annotations

from redist.axes import split_common

from partir_core.registry import Rule

Axes = tuple  # tuple[str, ...]: mesh axes and sub-axis tokens, major → minor


def overlap(mesh, a: str, b: str) -> bool:
    """Whether axes (or sub-axes) ``a`` and ``b`` of ``mesh`` name a common factor of one mesh axis."""
    return a == b or mesh.axis(a).overlaps(mesh.axis(b))


def clash(mesh, axes, others) -> bool:
    """Whether some axis of ``axes`` overlaps some axis of ``others``."""
    return any(overlap(mesh, a, b) for a in axes for b in others)


def refines(mesh, axes: Axes, prefix: Axes) -> bool:
    """Whether a dim split over ``axes`` refines one split over ``prefix``: ``prefix``'s factors are the major
    factors of ``axes`` (compared by the pieces they cover, see the module docstring)."""
    if tuple(axes[: len(prefix)]) == tuple(prefix):
        return True
    names = mesh._whole_names
    if all(a in names for a in axes) and all(a in names for a in prefix):  # whole axes: plain equality
        return False
    long, short = split_common([mesh.axes_of(axes), mesh.axes_of(prefix)])
    return long[: len(short)] == short


def same_axes(mesh, a: Axes, b: Axes) -> bool:
    """Whether dims split over ``a`` and over ``b`` have the same blocks (``(model:(1)2, model:(2)2)`` and
    ``(model,)`` do)."""
    return tuple(a) == tuple(b) or (refines(mesh, a, b) and refines(mesh, b, a))


def group(mesh, axes) -> int:
    """The number of devices in a group over ``axes``."""
    return mesh.group_size(tuple(axes))


def decompose(mesh, axes: Axes, factors, sizes) -> list[Axes] | None:
    """Split a dim's axes over its factors (major → minor), or None if no split fits."""
    if not factors:
        return [] if not axes else None
    if not axes:
        return [()] * len(factors)
    f, rest = factors[0], factors[1:]
    if sizes[f] % group(mesh, axes) == 0:
        return [tuple(axes)] + [()] * len(rest)
    for j in range(1, len(axes)):
        if group(mesh, axes[:j]) == sizes[f]:
            tail = decompose(mesh, axes[j:], rest, sizes)
            return None if tail is None else [tuple(axes[:j])] + tail
    return None


def compose(mesh, per_factor: list[Axes], factors, sizes) -> Axes | None:
    """The dim's axes when its factors are split as given, or None if the blocks would not be contiguous
    (a factor before the last split one is not fully split, or a dim of several factors would be split
    unevenly: uneven blocks of a compound dim do not follow its factors)."""
    last = max((i for i, a in enumerate(per_factor) if a), default=-1)
    for i in range(last):
        if group(mesh, per_factor[i]) != sizes[factors[i]]:
            return None
    if len(factors) > 1 and last >= 0 and sizes[factors[last]] % group(mesh, per_factor[last]):
        return None
    return tuple(a for axes in per_factor for a in axes)


def fit_use(mesh, rule: Rule, use: dict) -> dict:
    """Drop factor choices until every operand and result dim composes (contiguous blocks). Which factors are
    dropped depends on ``rule``, ``mesh`` and each factor's axes alone, and is remembered by them (per-op
    choice fits the same uses many times)."""
    key = (id(rule), mesh, tuple([(f, u[0]) for f, u in use.items()]))
    hit = _FITTED.get(key)
    if hit is None:
        if len(_FITTED) >= _FITTED_SIZE:
            _FITTED.clear()
        hit = _FITTED[key] = (rule, frozenset(use.keys() - _fitted(mesh, rule, use).keys()))
    dropped = hit[1]
    return {f: u for f, u in use.items() if f not in dropped} if dropped else dict(use)


# fit_use's answers: (id of the rule, mesh, each factor's axes) -> (the rule, kept alive so that no other object
# takes its id while the entry is there; the factors dropped), forgotten in full when full
_FITTED: dict = {}
_FITTED_SIZE = 1 << 14


def _fitted(mesh, rule: Rule, use: dict) -> dict:
    """:func:`fit_use`, worked out."""
    use = dict(use)
    changed = True
    while changed:
        changed = False
        for dims in rule.operands + rule.results:
            for fs in dims:
                per = [use.get(f, ((), 0))[0] for f in fs]
                if compose(mesh, per, fs, rule.sizes) is None:
                    last = max(i for i, a in enumerate(per) if a)
                    del use[fs[last]]
                    changed = True
    return use


def dims_axes(mesh, rule: Rule, use: dict, dims) -> tuple[Axes, ...]:
    """The axes of each dim of ``dims`` (one array's factors, per dim) under ``use``: a dim of one factor takes
    its axes, a dim of several what :func:`compose` gives (none if they do not compose)."""
    out = []
    for fs in dims:
        if len(fs) == 1:  # the common case, inline: what compose gives for one factor
            u = use.get(fs[0])
            out.append(() if u is None else tuple(u[0]))
        else:
            out.append(compose(mesh, [use.get(f, ((), 0))[0] for f in fs], fs, rule.sizes) or ())
    return tuple(out)


def drop_clashes(use: dict) -> dict:
    """One mesh axis per op: a factor whose axes clash with an earlier-decided factor keeps the longest
    prefix that does not clash (rather than nothing)."""
    out, taken = {}, set()
    for f in sorted(use, key=lambda f: use[f][1]):
        axes, prov = use[f]
        keep = []
        for a in axes:
            if a in taken:
                break
            keep.append(a)
        if keep:
            out[f] = (tuple(keep), prov)
            taken.update(keep)
    return out
