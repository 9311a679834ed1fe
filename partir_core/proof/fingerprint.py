"""Fingerprints of what a device runs: two equations whose fingerprints are equal run the same local function.

The walk of :mod:`partir_core.proof.invariant` traces, for every local op, the function the device runs and the
proved form's template, and compares their jaxprs. An unrolled model repeats the same op on the same types once
per layer, and a session lowers the same ops under many schedules; a fingerprint lets those share one trace.

:func:`fingerprint` is a hashable value equal for two values only when they behave alike: scalars with their
type and ``repr`` (``1``, ``1.0``, ``True``, ``0.0`` and ``-0.0`` differ), sequences and mappings element by
element, arrays by dtype, shape and bytes, functions by their code, defaults and the fingerprints of the values
they close over (a closure is its code run on those values), ``functools.partial`` by its parts. Any other
value is its own fingerprint if it is hashable (identity for objects that compare by identity, such as jaxprs);
a value that is none of these has no fingerprint (:data:`NONE`), and a key holding it is not cached.
"""

from __future__ import annotations

import enum
import functools
import types

import numpy as np

NONE = None  # no fingerprint: the value is traced afresh every time
MAX_DEPTH = 12  # closures nested deeper are not fingerprinted


class _Unknown(Exception):
    pass


def fingerprint(value):
    """The fingerprint of ``value`` (see the module docstring), or :data:`NONE`."""
    try:
        return _fp(value, 0)
    except _Unknown:
        return NONE


def _fp(v, depth: int):
    if depth > MAX_DEPTH:
        raise _Unknown
    d = depth + 1
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes, np.generic)):
        return (type(v).__name__, repr(v))
    if isinstance(v, enum.Enum):
        return (type(v).__qualname__, v.name)
    if isinstance(v, (tuple, list)):
        return (type(v).__qualname__, tuple(_fp(x, d) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((repr(k), _fp(x, d)) for k, x in v.items())))
    if isinstance(v, np.dtype):
        return ("dtype", str(v))
    if isinstance(v, np.ndarray) or hasattr(v, "__array__") and hasattr(v, "dtype") and hasattr(v, "shape"):
        try:
            a = np.asarray(v)
        except Exception:  # noqa: BLE001 - an array without host values (a key array): no fingerprint
            raise _Unknown from None
        return ("array", str(a.dtype), a.shape, a.tobytes())
    if isinstance(v, functools.partial):
        return ("partial", _fp(v.func, d), _fp(v.args, d), _fp(v.keywords, d))
    if isinstance(v, types.FunctionType):
        cells = tuple(_fp(_contents(c), d) for c in v.__closure__ or ())
        return ("function", v.__code__, _fp(v.__defaults__, d), _fp(v.__kwdefaults__, d), cells)
    try:
        hash(v)
    except TypeError:
        raise _Unknown from None
    return (type(v).__qualname__, v)


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled (a closure over a name assigned later)
        raise _Unknown from None
