"""How an MPI rank's data travels: numpy memory as mpi4py messages, and the transfers of a personalised
exchange.

- Data travels in numpy buffers through the buffer (uppercase) methods of mpi4py, never pickled
  (:func:`message`: a C-contiguous array's memory as bytes, whatever its dtype, bf16 and bool included).
  What a rank sends is contiguous bytes.
- What a rank receives may land in a strided place of a C-contiguous array (:func:`place`): one element of a
  derived datatype, nested byte vectors over the place's contiguous runs, committed once per shape and
  strides and kept in a bounded cache (a datatype freed while a transfer uses it stays valid for it).
- A personalised exchange among the members of a group (:func:`post_rows`) posts, for each shift, a receive
  from one member and a send to another, all at once; every point-to-point transfer carries :data:`TAG`.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from redist.backends.mpi_placement import runs
from redist.extras import missing_extra

try:
    from mpi4py import MPI
except ModuleNotFoundError as e:
    raise missing_extra(e, "redist.mpi", "mpi") from e

__all__ = ["TAG", "raw", "message", "place", "post_rows"]

TAG = 0x5EED  # point-to-point tag of every transfer, on the channel's private communicators


def raw(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array's memory as bytes (any dtype, bf16 and bool included)."""
    return a.reshape(-1).view(np.uint8)


def post_rows(sub, me: int, k: int, shifts, send, recv) -> list:
    """Post the transfers of a personalised exchange among the ``k`` members of ``sub`` (this rank is member
    ``me``) at the given ``shifts``: for each shift ``s``, a receive into ``recv(j)`` from member ``j = me − s``
    and a send of ``send(j)`` to member ``j = me + s`` (mod ``k``; arrays or buffers, :func:`message`), all at
    once; returns the requests. Every member posting the same shifts makes each send meet its receive among
    them. (MPICH's ``Ialltoall`` and ``Iallgather`` pass the data in k - 1 dependent steps, each waiting for a
    peer to be scheduled, which is slower than this once ranks share cores.) A caller does its local copies
    after the transfers complete, not between posting and waiting: a rank busy copying answers no handshake,
    which would hold its peers' transfers back."""
    return ([sub.Irecv(message(recv((me - s) % k)), (me - s) % k, TAG) for s in shifts]
            + [sub.Isend(message(send((me + s) % k)), (me + s) % k, TAG) for s in shifts])


def message(a) -> list:
    """The mpi4py buffer of ``a``: a C-contiguous array as bytes (mpi4py reads the memory of any dtype given
    ``MPI.BYTE``, bf16 and bool included), or ``a`` itself if it is one already (:func:`place`)."""
    return a if isinstance(a, list) else [a, MPI.BYTE]


_DATATYPES: OrderedDict = OrderedDict()  # (shape, strides) -> committed datatype, most recently used last
_DATATYPES_MAX = 256


def place(base: np.ndarray, view: np.ndarray) -> list:
    """The mpi4py buffer of ``view``, a (strided) view into the C-contiguous ``base``: ``base``'s bytes from the
    view's first element, one element of a derived datatype (nested byte vectors, remembered by the view's
    shape and strides) that picks out the view's runs; a C-contiguous view's bytes as they are."""
    if view.flags.c_contiguous:
        return message(view)
    key = (view.shape, view.strides)
    datatype = _DATATYPES.pop(key, None)
    if datatype is None:
        run, dims = runs(view.shape, view.strides, view.itemsize)
        datatype = MPI.BYTE.Create_contiguous(run)
        for count, stride in reversed(dims):
            inner, datatype = datatype, datatype.Create_hvector(count, 1, stride)
            inner.Free()
        datatype.Commit()
        while len(_DATATYPES) >= _DATATYPES_MAX:  # a datatype freed while a transfer uses it stays valid for it
            _DATATYPES.popitem(last=False)[1].Free()
    _DATATYPES[key] = datatype
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return [raw(base)[offset:], 1, datatype]
