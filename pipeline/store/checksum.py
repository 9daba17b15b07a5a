"""Block checksums recorded in the manifest: XXH64 (numba), ~3x faster than zlib's crc32 here.

A block's checksum is ``"xxh64:" + hex(XXH64 of the 8-byte little-endian XXH64 digests of its arrays)``;
stores written before it carry 8-hex-digit crc32 checksums, which :func:`matches` still verifies.
"""
from __future__ import annotations

import zlib

import numba
import numpy as np

from pipeline.kernels.intrinsics import base, load_u64

_P1 = np.uint64(11400714785074694791)
_P2 = np.uint64(14029467366897019727)
_P3 = np.uint64(1609587929392839161)
_P4 = np.uint64(9650029242287828579)
_P5 = np.uint64(2870177450012600261)
_U0 = np.uint64(0)
_U1 = np.uint64(1)


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


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def checksum(*arrays: np.ndarray) -> str:
    """``"xxh64:<16 hex>"``: XXH64 of the arrays' XXH64 digests (each over the array's bytes), in order."""
    digests = np.array([xxh64(_bytes(a), _U0) for a in arrays], dtype="<u8")
    return f"xxh64:{int(xxh64(digests.view(np.uint8), _U0)):016x}"


def crc32(*arrays: np.ndarray) -> str:
    """The checksum of stores written before XXH64: crc32 over the arrays' bytes, 8 hex digits."""
    c = 0
    for a in arrays:
        c = zlib.crc32(_bytes(a), c)
    return f"{c:08x}"


def matches(recorded: str, *arrays: np.ndarray) -> bool:
    """True when ``arrays`` have the ``recorded`` checksum (either kind)."""
    return recorded == (checksum(*arrays) if recorded.startswith("xxh64:") else crc32(*arrays))
