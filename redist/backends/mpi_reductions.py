"""Reductions in the MPI backend, element for element as numpy computes them.

An even ``ReduceScatter`` reduces the chunks it received with numpy, in group order (:func:`reduce_rows`): its
results are the numpy backend's, bit for bit. The other reductions (an ``AllReduce``, an uneven
``ReduceScatter``) are MPI's, with the element datatype and operation of :func:`reduce_op`, in MPI's reduction
order, so floating-point results can differ from the numpy backend in the last bits; integer-valued data and
integer dtypes agree exactly. Sums and products run as MPI's ``SUM`` and ``PROD`` (complex dtypes included),
maxima and minima of integers as ``MAX`` and ``MIN``; of ``bool``, sum and max as ``LOR``, min and prod as
``LAND``. Maxima and minima of floats, and every reduction of ``f16`` and ``bf16``, are user operations on
whole elements computed by numpy: MPI's ``MAX`` of a NaN and a number depends on their order, numpy's
propagates the NaN, as the other backends do.
"""

from __future__ import annotations

import numpy as np

from redist.backends.mpi_transfers import raw
from redist.extras import missing_extra
from redist.types import REDUCERS

try:
    from mpi4py import MPI
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.mpi", "mpi") from e

__all__ = ["reduce_op", "reduce_rows", "reduce_spec"]

_NATIVE = {
    np.dtype(np.int8): MPI.INT8_T, np.dtype(np.int16): MPI.INT16_T, np.dtype(np.int32): MPI.INT32_T,
    np.dtype(np.int64): MPI.INT64_T, np.dtype(np.uint8): MPI.UINT8_T, np.dtype(np.uint16): MPI.UINT16_T,
    np.dtype(np.uint32): MPI.UINT32_T,
    np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
    np.dtype(np.complex64): MPI.C_FLOAT_COMPLEX, np.dtype(np.complex128): MPI.C_DOUBLE_COMPLEX,
}
_NATIVE_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}
_BOOL_OPS = {"sum": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND, "prod": MPI.LAND}
_USER_OPS: dict = {}


def reduce_op(dtype: np.dtype, reduction: str):
    """``(element datatype, op)`` that reduces like numpy does (see the module docstring)."""
    if dtype == np.dtype(np.bool_):
        return MPI.C_BOOL, _BOOL_OPS[reduction]
    if dtype in _NATIVE and (dtype.kind in "iuc" or reduction in ("sum", "prod")):
        return _NATIVE[dtype], _NATIVE_OPS[reduction]
    key = (dtype, reduction)
    if key not in _USER_OPS:  # numpy's ufunc on whole elements
        def apply(inbuf, inoutbuf, _datatype, dtype=dtype, ufunc=REDUCERS[reduction]):
            acc = np.frombuffer(inoutbuf, dtype=dtype)
            acc[...] = ufunc(np.frombuffer(inbuf, dtype=dtype), acc)

        element = MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()
        _USER_OPS[key] = (element, MPI.Op.Create(apply, commute=True))
    return _USER_OPS[key]


def reduce_rows(rows, reduction: str, out: np.ndarray) -> None:
    """``out`` = the reduction of the equal-shaped ``rows``, in their order, in their dtype (as numpy's backend
    reduces: one elementwise ufunc pass per further row)."""
    op = REDUCERS[reduction]
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on NaN in a max or min, which propagates it, as wanted
        if len(rows) == 1:
            np.copyto(out, rows[0])
        else:
            op(rows[0], rows[1], out=out)
        for row in rows[2:]:
            op(out, row, out=out)


def reduce_spec(a: np.ndarray, element):
    """``a``'s memory as elements of ``element`` (the count follows from the byte length)."""
    return [raw(a), element]
