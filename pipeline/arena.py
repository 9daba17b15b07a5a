"""Per-thread reusable buffers for the ingest's large per-block arrays.

A Dask worker runs one block after another on each thread. Fresh arrays for every block cost page faults
on every block (and, on a fresh worker, the kernel's compaction for huge pages): ~40 ms of a 64 MB block's
~170 ms. A buffer reused from block to block pays them once. A view returned by :func:`buffer` is valid
until the same thread asks for the same name again.
"""
from __future__ import annotations

import threading

import numpy as np

_LOCAL = threading.local()


def buffer(name: str, n: int, dtype) -> np.ndarray:
    """An uninitialised view of ``n`` elements of ``dtype`` from this thread's buffer ``name`` (grown when
    too small, never shrunk)."""
    dtype = np.dtype(dtype)
    bufs = _LOCAL.__dict__.setdefault("bufs", {})
    need = n * dtype.itemsize
    raw = bufs.get(name)
    if raw is None or raw.shape[0] < need:
        raw = np.empty(max(need, 1 << 16), np.uint8)
        bufs[name] = raw
    return raw[:need].view(dtype)


def empty(name: str, n: int, dtype, reuse: bool) -> np.ndarray:
    """:func:`buffer` when ``reuse``, else a new uninitialised array."""
    return buffer(name, n, dtype) if reuse else np.empty(n, dtype)


def release() -> None:
    """Free this thread's buffers."""
    _LOCAL.__dict__.clear()
