"""Factor algebra: how the mesh axes of a dim are shared among the factors a rule gives it, and back.

A :class:`~partir_core.registry.Rule` names every dim of an op's operands and results by its factors (major →
minor). A *use* maps each factor to the mesh axes it is split over, ``use[f] = (axes, provenance)``
(provenance: the tactic that decided it; lower decides earlier). A dim's axes are its factors' axes
concatenated (:func:`compose`), and a dim's axes are shared out among its factors by :func:`decompose`.
Blocks stay contiguous only if every factor before the last split one is split fully; a dim of several
factors must also be split evenly (uneven blocks of a compound dim do not follow its factors).
"""

from __future__ import annotations

from partir_core.registry import Rule

Axes = tuple  # tuple[str, ...]


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
    """Drop factor choices until every operand and result dim composes (contiguous blocks)."""
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


def dim_axes(mesh, rule: Rule, use: dict, fs) -> Axes:
    """The axes of a dim made of factors ``fs`` under ``use`` (none if they do not compose)."""
    return compose(mesh, [use.get(f, ((), 0))[0] for f in fs], fs, rule.sizes) or ()


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
