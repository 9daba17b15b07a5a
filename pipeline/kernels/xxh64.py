"""XXH64 (Collet's specification) as a numba kernel: the block checksums' hash (pipeline.store.checksum, which
also holds its pure-Python twin for processes that have not started numba)."""
from __future__ import annotations

import numba
import numpy as np

from pipeline.kernels.intrinsics import base, load_u64
from pipeline.store.checksum import PRIMES

_P1, _P2, _P3, _P4, _P5 = (np.uint64(p) for p in PRIMES)
_U0 = np.uint64(0)


@numba.njit(cache=True, nogil=True, inline="always")
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@numba.njit(cache=True, nogil=True, inline="always")
def _round(acc, lane):
    return _rotl(acc + lane * _P2, 31) * _P1


@numba.njit(cache=True, nogil=True, inline="always")
def _merge(acc, v):
    return (acc ^ _round(_U0, v)) * _P1 + _P4


@numba.njit(cache=True, nogil=True)
def xxh64(buf, seed):
    """XXH64 (Collet's specification) of the bytes of ``buf`` (C-contiguous uint8) with ``seed``."""
    p = base(buf)
    n = buf.shape[0]
    seed = np.uint64(seed)
    i = 0
    if n >= 32:
        v1 = seed + _P1 + _P2
        v2 = seed + _P2
        v3 = seed
        v4 = seed - _P1
        while i + 32 <= n:  # four independent lanes
            v1 = _round(v1, load_u64(p, i))
            v2 = _round(v2, load_u64(p, i + 8))
            v3 = _round(v3, load_u64(p, i + 16))
            v4 = _round(v4, load_u64(p, i + 24))
            i += 32
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _merge(_merge(_merge(_merge(h, v1), v2), v3), v4)
    else:
        h = seed + _P5
    h += np.uint64(n)
    while i + 8 <= n:
        h = _rotl(h ^ _round(_U0, load_u64(p, i)), 27) * _P1 + _P4
        i += 8
    if i + 4 <= n:
        w = np.uint64(p[i]) | (np.uint64(p[i + 1]) << np.uint64(8)) | (np.uint64(p[i + 2]) << np.uint64(16)) \
            | (np.uint64(p[i + 3]) << np.uint64(24))
        h = _rotl(h ^ (w * _P1), 23) * _P2 + _P3
        i += 4
    while i < n:
        h = _rotl(h ^ (np.uint64(p[i]) * _P5), 11) * _P1
        i += 1
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h
