"""Data given to redist, and the one rule by which it is accepted (docs/spec.md §4: no silent casts).

Every entry point that takes data converts it here: :func:`redist.shard` and :func:`redist.unshard`,
:func:`redist.execute` on every backend, :func:`redist.mpi.reshard`. So they all accept and refuse the same
inputs, with the same messages.

The rule: data is converted to the type's dtype only when no value can change.

- Data with a dtype (numpy and JAX arrays, numpy scalars) is accepted when every value *of its dtype* is a
  value of the type's dtype (:func:`lossless`): the same dtype; ``bool`` into any number type; an integer
  type into one whose range holds it (``i8`` into ``i32``, ``u8`` into ``i16``); an integer type into a
  float type that holds all of its integers (``i8``/``u8`` into ``f16`` or ``bf16``, ``i16`` into ``f32``,
  ``i32``/``u32`` into ``f64``); a float type into one of at least its precision and range (``f16`` or
  ``bf16`` into ``f32``, ``f32`` into ``f64``); a real or complex type into a complex one whose real and
  imaginary parts each hold it (``c64`` into ``c128``, ``f32`` or ``i16`` into ``c64``, ``f64`` into
  ``c128``, but not ``f64`` into ``c64``). The check reads dtypes, not the values at hand, so whether a
  call is accepted never depends on the data: ``f64`` into ``f32``, ``i64`` into ``i32``, ``i32`` into
  ``f32``, ``i64`` into ``f64`` (which numpy calls "safe") and complex into real are refused even where
  today's values would fit.
- Python scalars and (nested) lists or tuples, which have no dtype, are accepted when every value converts
  exactly: integers in range (300 is no ``u8`` value), no fraction, NaN or infinity into an integer type,
  only floats that the dtype holds exactly (0.1 is no ``f32`` value), no imaginary part into a real type.
- Masked arrays (``numpy.ma``) are refused (:func:`check_unmasked`): converting one would drop its mask.
  :func:`redist.jax.reshard`, which places other host data as ``jax.device_put`` does, refuses them here too.

To round or wrap on purpose, convert first (``x.astype(np.float32)``).
"""

from __future__ import annotations

import numbers
import re
import warnings
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from redist.errors import ShardingError, first_line

__all__ = ["lossless", "as_array", "local_buffer", "device_buffers", "mesh_buffers", "describe", "check_unmasked"]


def _kind(dtype: np.dtype) -> str | None:
    """numpy's kind letter for the number dtypes (``"f"`` for ml_dtypes' floats such as bf16), else None."""
    if dtype.kind in "biufc":
        return dtype.kind
    try:
        ml_dtypes.finfo(dtype)
    except ValueError:
        return None
    return "f"


def _component(dtype: np.dtype) -> np.dtype:
    """The real dtype of each part of a complex dtype."""
    return np.empty((), dtype).real.dtype


def lossless(given, want) -> bool:
    """Whether every value of dtype ``given`` is exactly a value of dtype ``want`` (NaN and infinities
    included): the dtype part of the rule in this module's docstring."""
    given, want = np.dtype(given), np.dtype(want)
    if given == want:
        return True
    g, w = _kind(given), _kind(want)
    if g is None or w is None or w == "b" or (g == "c" and w != "c"):
        return False
    if w == "c":
        return lossless(_component(given) if g == "c" else given, _component(want))
    if g == "b":
        return True  # 0 and 1
    if g in "iu" and w in "iu":
        gi, wi = np.iinfo(given), np.iinfo(want)
        return wi.min <= gi.min and gi.max <= wi.max
    if g in "iu":  # into a float: every integer of the range needs a significand of its own
        gi, wf = np.iinfo(given), ml_dtypes.finfo(want)
        largest = max(-int(gi.min), int(gi.max))
        return largest <= 2 ** (wf.nmant + 1) and largest <= float(wf.max)
    if g == "f" and w == "f":
        gf, wf = ml_dtypes.finfo(given), ml_dtypes.finfo(want)
        return (wf.nmant >= gf.nmant and wf.maxexp >= gf.maxexp
                and wf.minexp - wf.nmant <= gf.minexp - gf.nmant)  # the smallest subnormals
    return False


def describe(x) -> str:
    """A user's object in a message: its type, then its text (``str`` where the type defines one, else
    ``repr``, as for strings, whose quotes show) on one line, cut to 60 characters."""
    own_str = type(x).__str__ is not object.__str__ and not isinstance(x, (str, bytes))
    text = re.sub(r"\s*\n\s*", " ", str(x) if own_str else repr(x))  # one line (an array's text has several)
    return f"{type(x).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def as_array(data, dtype, what: str, copy: bool = False) -> np.ndarray:
    """``data`` as a numpy array of ``dtype``, under the rule of this module.

    Returns ``data`` itself when it already is a numpy array of ``dtype`` and ``copy`` is false, else a new
    (C-contiguous) array. ``what`` names the data in messages (``"shard of device 3"``). Raises
    :class:`ShardingError` (and nothing else) when ``data`` is no array of numbers (a string, ``None``, a
    ragged list, a traced JAX value) or when converting it could change a value.
    """
    want = np.dtype(dtype)
    if data is None or isinstance(data, (str, bytes)):
        raise ShardingError(f"{what} is {describe(data)}, not an array of numbers")
    check_unmasked(data, what)
    typed = isinstance(data, (np.ndarray, np.generic)) or hasattr(data, "__array__")
    try:
        arr = np.asarray(data)
    except Exception as e:  # noqa: BLE001 - whatever numpy cannot read (ragged lists, tracers) is bad input
        raise ShardingError(f"{what} ({describe(data)}) cannot be read as an array: {first_line(e)}") from None
    if typed:
        if not lossless(arr.dtype, want):
            raise ShardingError(
                f"{what} has dtype {arr.dtype.name}, expected {want.name}: not every {arr.dtype.name} value is a "
                f"{want.name} value, so redist does not convert it (to round on purpose, pass "
                f"x.astype({want.name}))")
        return np.array(arr, dtype=want, order="C", copy=True) if copy else np.asarray(arr, dtype=want)
    if arr.dtype.kind not in "biufcO" or arr.dtype.kind == "O" and not all(
            isinstance(v, numbers.Number) for v in arr.reshape(-1)):
        raise ShardingError(f"{what} ({describe(data)}) holds values that are not numbers")
    return _exactly(arr, want, what, data)


def check_unmasked(data, what: str) -> None:
    """Raise :class:`ShardingError` if ``data`` is a numpy masked array, whose mask a conversion would drop."""
    if isinstance(data, np.ma.MaskedArray):
        raise ShardingError(f"{what} is a masked array: masked arrays are not supported (the mask would be lost); "
                            "pass x.filled(value), or the data and the mask as two arrays")


def _exactly(arr: np.ndarray, want: np.dtype, what: str, data) -> np.ndarray:
    """``arr`` (read from Python data) converted to ``want`` when every value survives the round trip."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # numpy warns on NaN into integers and on discarded imaginary parts
        try:
            out = arr.astype(want)
            back = out.astype(arr.dtype)
        except (TypeError, ValueError, OverflowError) as e:
            raise ShardingError(f"{what} ({describe(data)}) cannot be converted to {want.name}: {first_line(e)}") \
                from None
        # Both directions: the round trip catches lost precision, the direct comparison a wrapped integer
        # that the round trip would wrap back (-1 into an unsigned type of the same width).
        same = np.asarray(back == arr, dtype=bool) & np.asarray(out == arr, dtype=bool)
        if arr.dtype.kind in "fc" and _kind(want) in "fc":
            same |= np.isnan(arr) & np.isnan(back)
    if not same.all():
        i = int(np.argmin(same.reshape(-1)))
        given, becomes = (_python(a.reshape(-1)[i]) for a in (arr, out))
        raise ShardingError(
            f"{what} holds {given!r}, which {want.name} cannot hold exactly (it would become {becomes!r}); redist "
            f"does not convert it (to round on purpose, pass an array of dtype {want.name})")
    return out


def _python(value):
    """An element of an array as Python shows it: a numpy scalar's value; any other object (an element of an
    object array: a ``Fraction``, say) as it is."""
    return value.item() if isinstance(value, np.generic) else value


def local_buffer(data, shape, dtype, what: str, copy: bool = False) -> np.ndarray:
    """One device's buffer: ``data`` as a C-contiguous numpy array of ``shape`` and ``dtype``
    (:func:`as_array`: a fresh array if ``copy``, else the caller's own where it already is one).
    Raises :class:`ShardingError` for data that does not convert without loss or does not have ``shape``,
    naming it as ``what``."""
    if not copy and is_local_buffer(data, tuple(shape), dtype):
        return data  # the common case, in a few checks: a reshard's per-call cost is mostly such Python
    a = np.asarray(as_array(data, dtype, what, copy), order="C")
    if a.shape != tuple(shape):
        raise ShardingError(f"{what} has shape {a.shape}, expected {tuple(shape)}")
    return a


def is_local_buffer(data, shape: tuple, dtype) -> bool:
    """Whether ``data`` is already the buffer :func:`local_buffer` would make of it (without ``copy``): a
    C-contiguous numpy array of ``shape`` (a tuple) and ``dtype``. A few comparisons, no conversion."""
    return (type(data) is np.ndarray and data.dtype == dtype and data.shape == shape
            and data.flags.c_contiguous)


def device_buffers(shards, n: int, shape, dtype, copy: bool = False, devices=None) -> list[np.ndarray | None]:
    """Per-device buffers (index = device id) as a list of ``n`` entries: numpy arrays of ``shape`` and
    ``dtype`` at the ids of ``devices`` (a collection of ids below ``n``; None: every id below ``n``), ``None``
    at every other number.

    ``shards`` is a list or tuple (or an array whose leading dim indexes the devices) of ``n`` entries: at each
    device a buffer taken by :func:`local_buffer` (fresh arrays if ``copy``, else the caller's own where they
    already are C-contiguous arrays of ``dtype``), and ``None`` at every other number. Raises
    :class:`ShardingError` naming the device for a wrong container, count, dtype or shape, or an entry at a
    number that is no device.
    """
    if isinstance(shards, (str, bytes)) or not (
            isinstance(shards, Sequence) or isinstance(shards, np.ndarray) and shards.ndim):
        raise ShardingError(f"shards must be a list of {n} arrays, one per device id; got {describe(shards)}")
    if devices is None:
        if len(shards) != n:
            raise ShardingError(f"expected {n} shards (one per device), got {len(shards)}")
        return [local_buffer(x, shape, dtype, f"shard of device {d}", copy) for d, x in enumerate(shards)]
    if len(shards) != n:
        raise ShardingError(f"expected {n} shards (a list indexed by device id, with None at the numbers below {n} "
                            f"that are no device of the mesh), got {len(shards)}")
    devices = set(devices)
    out: list[np.ndarray | None] = [None] * n
    for d, x in enumerate(shards):
        if d in devices:
            out[d] = local_buffer(x, shape, dtype, f"shard of device {d}", copy)
        elif x is not None:
            raise ShardingError(f"shard {d} is {describe(x)}, but {d} is no device of the mesh: its entry must be "
                                "None")
    return out


def mesh_buffers(shards, mesh, shape, dtype, copy: bool = False) -> list[np.ndarray | None]:
    """:func:`device_buffers` of the devices of ``mesh`` (a :class:`redist.Mesh`): a list of
    ``mesh.id_bound`` entries, a buffer at each device, ``None`` elsewhere (for the default numbering, one
    buffer per device id, as it always was)."""
    if mesh.id_bound == mesh.size:
        return device_buffers(shards, mesh.size, shape, dtype, copy)
    return device_buffers(shards, mesh.id_bound, shape, dtype, copy, devices=mesh.devices)
