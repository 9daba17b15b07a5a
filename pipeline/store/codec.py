"""The store's blosc codec (lz4, level 5, byte shuffle), compressing into a reused buffer.

numcodecs' ``Blosc.encode`` returns a new bytes object per call: for a 64 MB block's indices that is
~8 MB of fresh pages (~4 ms of page faults on every block). The c-blosc library inside numcodecs exports
``blosc_compress_ctx`` (no global state, the thread count per call); :func:`encode` calls it with this
thread's reusable buffer (:mod:`pipeline.arena`) and returns a view of the same frame numcodecs writes
(byte-identical: tested). Where the symbol cannot be found it falls back to numcodecs.
"""
from __future__ import annotations

import ctypes
import functools
import os

import numcodecs.blosc
import numpy as np
from numcodecs import Blosc

from pipeline import arena

CNAME, CLEVEL = "lz4", 5
# Buffers up to this size stay with the thread between calls; larger ones are freed after the call.
REUSE_BYTES = 64 << 20
_BLOSC = Blosc(cname=CNAME, clevel=CLEVEL, shuffle=Blosc.SHUFFLE, blocksize=0)


@functools.cache
def _compress_ctx():
    """ctypes binding of c-blosc's ``blosc_compress_ctx`` in numcodecs' extension, or None."""
    try:
        fn = ctypes.CDLL(numcodecs.blosc.__file__).blosc_compress_ctx
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
    return fn


def encode(arr: np.ndarray, reuse: bool = True):
    """Blosc frame of the contiguous array ``arr`` (typesize = its itemsize, one thread). With ``reuse`` and
    a frame of at most :data:`REUSE_BYTES`, a view of this thread's buffer, valid until its next encode."""
    fn = _compress_ctx()
    if fn is None:
        return _BLOSC.encode(arr)
    arr = np.ascontiguousarray(arr)
    cap = arr.nbytes + numcodecs.blosc.MAX_OVERHEAD  # the frame header
    out = arena.empty("codec.encode", cap, np.uint8, reuse and cap <= REUSE_BYTES)
    n = fn(CLEVEL, 1, arr.dtype.itemsize, arr.nbytes, arr.ctypes.data, out.ctypes.data, cap, CNAME.encode(),
           0, 1)
    if n <= 0:
        raise RuntimeError(f"blosc compression failed (code {n})")
    return out[:n].data


def decode_file(f, out: np.ndarray) -> None:
    """Decompress the blosc frame that makes up the rest of the open file ``f`` into ``out`` (uint8 view of
    the exact decompressed size), reading it into this thread's reusable buffer."""
    size = os.fstat(f.fileno()).st_size - f.tell()
    buf = arena.empty("codec.decode", size, np.uint8, size <= REUSE_BYTES)
    got = f.readinto(memoryview(buf))
    _BLOSC.decode(buf[:got], out=out)
