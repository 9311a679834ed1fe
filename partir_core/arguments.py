"""How a call's arguments become a partitioned program's inputs: binding, static and donated arguments, paths.

:class:`Arguments` binds ``pf(*args, **kwargs)`` as ``fn`` binds them (:meth:`Arguments.bind`): every argument
that can be positional is, and the keyword-only ones (and ``**kw`` entries) follow in ``fn``'s parameter order;
a missing or extra argument is a :class:`~partir_core.PartitionError` naming it. The result, a :class:`Call`,
is what the program is traced and run on.

Static arguments (``static_argnums``: positions among the bound positional arguments; ``static_argnames``:
parameter names), as in ``jax.jit``, are not inputs: the function is traced with their values, which must be
hashable and are part of what a lowering is cached by, and they take no path. In a :class:`Call` each holds
``None`` (an empty pytree) in its place, and :meth:`Call.function` puts the value back.

Donated arguments (``donate_argnums``, ``donate_argnames``), as in ``jax.jit``, give the buffers of their arrays
to the program: the program may write its outputs there, and the arrays are deleted after the call.

Input paths (docs/spec.md §6): the parameter name, then pytree keys joined by ``/``
(:func:`partir_core.ir.input_paths`).
"""

from __future__ import annotations

import functools
import inspect
import numbers
from dataclasses import dataclass

import jax

from redist.errors import shown

from partir_core import ir
from partir_core.tactics import PartitionError


@dataclass(frozen=True)
class Call:
    """One call's arguments as ``fn`` binds them: ``args`` (positional) and ``kwargs`` (keyword-only and
    ``**kw`` entries), with ``None`` in place of each static argument; ``static`` the static ones,
    ``(position or name, value)``; ``donated`` the positions among the flattened inputs (the leaves of
    ``(*args, *kwargs.values())``) whose buffers the program takes."""

    args: tuple
    kwargs: dict
    static: tuple
    donated: tuple

    @functools.cached_property
    def flat(self) -> tuple[list, object]:
        """``(leaves, treedef)`` of ``(*args, *kwargs.values())``: the inputs and their structure (flattened once)."""
        return jax.tree_util.tree_flatten((*self.args, *self.kwargs.values()))

    @property
    def leaves(self) -> list:
        """The inputs: the leaves of ``(*args, *kwargs.values())``."""
        return self.flat[0]

    def function(self, fn):
        """``fn`` with the static arguments put back in their places (``fn`` itself when there are none); it
        keeps ``fn``'s signature, so that the inputs keep their paths."""
        if not self.static:
            return fn

        @functools.wraps(fn)
        def with_static(*args, **kwargs):
            args, kwargs = self.restored(args, kwargs)
            return fn(*args, **kwargs)

        return with_static

    def restored(self, args, kwargs) -> tuple[tuple, dict]:
        """``args`` and ``kwargs``, shaped as this call's, with the static values back in their places."""
        args, kwargs = list(args), dict(kwargs)
        for where, value in self.static:
            if isinstance(where, int):
                args[where] = value
            else:
                kwargs[where] = value
        return tuple(args), kwargs


class Arguments:
    """How ``fn``'s calls bind (see the module docstring). Raises :class:`PartitionError` for static or donated
    argument numbers that are not ints, names that are not ``fn``'s parameters, or an argument both static and
    donated."""

    def __init__(self, fn, static_argnums=(), static_argnames=(), donate_argnums=(), donate_argnames=()):
        self.fn = fn
        self.name = getattr(fn, "__name__", "fn")
        try:
            self.signature = inspect.signature(fn)
        except (TypeError, ValueError):  # some builtins have none: arguments are then taken as given
            self.signature = None
        self.static_nums = _numbers("static_argnums", static_argnums)
        self.donate_nums = _numbers("donate_argnums", donate_argnums)
        self.static_names = self._names("static_argnames", static_argnames)
        self.donate_names = self._names("donate_argnames", donate_argnames)
        both = (set(self.static_nums) & set(self.donate_nums)) | (set(self.static_names) & set(self.donate_names))
        if both:
            raise PartitionError(f"partir_core.jit: argument {sorted(map(str, both))[0]} is both static and "
                                 "donated; a static argument is no array to donate")
        # a call of exactly this many positional arguments binds as given: every parameter positional, none
        # with a default (None: binding always goes through the signature); static and donated arguments are
        # then positions (:meth:`positions`)
        params = list(self.signature.parameters.values()) if self.signature is not None else None
        plain = params is not None and all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                                           and p.default is p.empty for p in params)
        self.positional = len(params) if plain else None

    def _names(self, what: str, names) -> tuple[str, ...]:
        """``names`` (one name or a sequence of them) as a tuple of ``fn``'s parameter names."""
        names = (names,) if isinstance(names, str) else names
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise PartitionError(f"partir_core.jit: {what} must be a parameter name or a sequence of them, got "
                                 f"{shown(names)}")
        params = self.signature.parameters if self.signature is not None else {}
        for n in names:
            if n not in params:
                raise PartitionError(f"partir_core.jit: {what} names {n!r}, which is no parameter of "
                                     f"{self.name}{self.signature or '(...)'}")
        return tuple(names)

    def bind(self, args, kwargs) -> Call:
        """The :class:`Call` of ``pf(*args, **kwargs)``. Raises :class:`PartitionError` naming a missing or
        extra argument, a static argument number past the positional arguments, or an unhashable static
        value."""
        args, kwargs = self._bound(args, kwargs)
        static = self._where(self.static_nums, self.static_names, args, kwargs, "static_argnums")
        donated = self._where(self.donate_nums, self.donate_names, args, kwargs, "donate_argnums")
        for where in static:
            value = args[where] if isinstance(where, int) else kwargs[where]
            try:
                hash(value)
            except TypeError:
                raise PartitionError(f"static argument {self._label(where)} of {self.name} must be hashable (it "
                                     f"is part of what a lowering is cached by), got {type(value).__name__} "
                                     f"{shown(value)}") from None
        fixed = tuple((w, args[w] if isinstance(w, int) else kwargs[w]) for w in static)
        args = tuple(None if i in static else a for i, a in enumerate(args))
        kwargs = {k: None if k in static else v for k, v in kwargs.items()}
        leaves, start = [], 0
        for where, value in [*enumerate(args), *kwargs.items()] if donated else ():
            n = len(jax.tree_util.tree_leaves(value))
            if where in donated:
                leaves += range(start, start + n)
            start += n
        return Call(args, kwargs, fixed, tuple(leaves))

    def positions(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """``(static, donated)``: the positions of the static and of the donated arguments in a call of
        :attr:`positional` positional arguments (as ``jax.jit``'s ``static_argnums`` and ``donate_argnums``);
        None where calls do not bind as given or an argument number is past the parameters."""
        if self.positional is None:
            return None
        names = list(self.signature.parameters)
        out = []
        for nums, picked in ((self.static_nums, self.static_names), (self.donate_nums, self.donate_names)):
            at = {n + self.positional if n < 0 else n for n in nums} | {names.index(name) for name in picked}
            if not all(0 <= i < self.positional for i in at):
                return None
            out.append(tuple(sorted(at)))
        return out[0], out[1]

    def _bound(self, args, kwargs) -> tuple[tuple, dict]:
        """``(args, kwargs)`` as ``fn`` binds them (module docstring)."""
        if self.signature is None:
            if kwargs:
                raise PartitionError(f"{self.name} has no signature to bind keyword arguments to; pass them "
                                     "positionally")
            return tuple(args), {}
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            given = f"{len(args)} positional" + (f" and keywords {', '.join(kwargs)}" if kwargs else "")
            raise PartitionError(f"arguments do not fit {self.name}{self.signature}: {e} (given {given})") from None
        return bound.args, bound.kwargs

    def _where(self, nums, names, args, kwargs, what: str) -> set:
        """The positions in ``args`` and the names in ``kwargs`` that ``nums`` and ``names`` pick (an argument
        not given, a default, is left out)."""
        picked = set()
        for n in nums:
            i = n + len(args) if n < 0 else n
            if not 0 <= i < len(args):
                raise PartitionError(f"{what} names argument {n} of {self.name}, which has {len(args)} positional "
                                     "arguments in this call")
            picked.add(i)
        params = self.signature.parameters.values() if self.signature is not None else ()
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for name in names:
            if name in kwargs:
                picked.add(name)
            elif name in positional and positional.index(name) < len(args):
                picked.add(positional.index(name))
        return picked

    def _label(self, where) -> str:
        """An argument as the user names it: its parameter name where it has one, else its position."""
        if isinstance(where, str):
            return repr(where)
        params = list(self.signature.parameters.values()) if self.signature is not None else []
        if where < len(params) and params[where].kind in (params[where].POSITIONAL_ONLY,
                                                          params[where].POSITIONAL_OR_KEYWORD):
            return repr(params[where].name)
        return str(where)

    def paths(self, call: Call) -> list[str]:
        """The path of every input of ``call``, in input order."""
        return ir.input_paths(self.fn, call.args, call.kwargs)[0]


def _numbers(what: str, nums) -> tuple[int, ...]:
    """``nums`` (one int or a sequence of them) as a tuple."""
    nums = (nums,) if isinstance(nums, numbers.Integral) and not isinstance(nums, bool) else nums
    if not isinstance(nums, (list, tuple)) or not all(
            isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in nums):
        raise PartitionError(f"partir_core.jit: {what} must be an argument number or a sequence of them, got "
                             f"{shown(nums)}")
    return tuple(int(n) for n in nums)
