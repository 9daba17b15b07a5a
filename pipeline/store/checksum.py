"""Block checksums recorded in the manifest: XXH64, ~3x faster than zlib's crc32 here (numba kernel).

A block's checksum is ``"xxh64:" + hex(XXH64 of the 8-byte little-endian XXH64 digests of its arrays)``;
stores written before it carry 8-hex-digit crc32 checksums, which :func:`matches` still verifies.

A process that has not started numba hashes its first :data:`PYTHON_BYTES` with :func:`xxh64_python` (the
kernel's digests, tested; ~40 MB/s against the kernel's GB/s) instead of paying numba's start (~0.6 s:
``import numba`` and its first call) for them: ``evaluate`` and ``predict`` on a small store then run without
numba. Past that budget, for a command that announces more (:func:`expect`), or once numba is imported for
anything else, the kernel hashes; either way the digests are the same.
"""
from __future__ import annotations

import zlib

import numpy as np

from pipeline.kernels import numba_started

PRIMES = (11400714785074694791, 14029467366897019727, 1609587929392839161, 9650029242287828579,
          2870177450012600261)  # XXH64's P1..P5 (the kernel's too)
_P1, _P2, _P3, _P4, _P5 = PRIMES
_M = (1 << 64) - 1
PYTHON_BYTES = 8 << 20  # ~0.2 s of xxh64_python at most per process, a third of numba's start
_python_left = PYTHON_BYTES


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return _rotl((acc + lane * _P2) & _M, 31) * _P1 & _M


def xxh64_python(buf: np.ndarray, seed: int = 0) -> int:
    """XXH64 of the bytes of ``buf`` (C-contiguous uint8) with ``seed``, in Python integers: NumPy loads the
    32-byte stripes' four lanes and multiplies them by P2 (mod 2^64) at once, the four accumulators run in
    Python loops. Same digests as :func:`pipeline.kernels.xxh64.xxh64`."""
    n = buf.shape[0]
    i = n - n % 32
    if n >= 32:
        lanes = (buf[:i].view("<u8").reshape(-1, 4) * np.uint64(_P2)).T.tolist()
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        for k in range(4):
            acc = v[k]
            for x in lanes[k]:  # _round(acc, lane) with lane * P2 done: the hot loop, inlined
                acc = (acc + x) & _M
                acc = ((acc << 31) | (acc >> 33)) * _P1 & _M
            v[k] = acc
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for x in v:
            h = ((h ^ _round(0, x)) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    tail = buf[i:].tobytes()
    j = 0
    while j + 8 <= len(tail):
        h = (_rotl(h ^ _round(0, int.from_bytes(tail[j:j + 8], "little")), 27) * _P1 + _P4) & _M
        j += 8
    if j + 4 <= len(tail):
        h = (_rotl(h ^ (int.from_bytes(tail[j:j + 4], "little") * _P1 & _M), 23) * _P2 + _P3) & _M
        j += 4
    for b in tail[j:]:
        h = _rotl(h ^ (b * _P5 & _M), 11) * _P1 & _M
    h ^= h >> 33
    h = h * _P2 & _M
    h ^= h >> 29
    h = h * _P3 & _M
    return h ^ (h >> 32)


def expect(nbytes: int) -> None:
    """A command is about to verify ``nbytes`` of block arrays: when they exceed what is left of the Python
    budget, the kernel hashes from the first byte (Python hashing up to the budget and numba's start after it
    would cost more than the start alone)."""
    global _python_left
    if nbytes > _python_left:
        _python_left = 0


def xxh64(buf: np.ndarray) -> int:
    """XXH64 (seed 0) of ``buf``'s bytes: :func:`xxh64_python` while this process has not imported numba and
    has hashed less than :data:`PYTHON_BYTES` that way, the numba kernel otherwise (same digests)."""
    global _python_left
    if not numba_started() and buf.nbytes <= _python_left:
        _python_left -= buf.nbytes  # a race between threads only moves the switch by a block
        return xxh64_python(buf)
    from pipeline.kernels.xxh64 import xxh64 as kernel

    return int(kernel(buf, np.uint64(0)))


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def checksum(*arrays: np.ndarray) -> str:
    """``"xxh64:<16 hex>"``: XXH64 of the arrays' XXH64 digests (each over the array's bytes), in order."""
    digests = np.array([xxh64(_bytes(a)) for a in arrays], dtype="<u8")
    return f"xxh64:{xxh64(digests.view(np.uint8)):016x}"


def crc32(*arrays: np.ndarray) -> str:
    """The checksum of stores written before XXH64: crc32 over the arrays' bytes, 8 hex digits."""
    c = 0
    for a in arrays:
        c = zlib.crc32(_bytes(a), c)
    return f"{c:08x}"


def matches(recorded: str, *arrays: np.ndarray) -> bool:
    """True when ``arrays`` have the ``recorded`` checksum (either kind)."""
    return recorded == (checksum(*arrays) if recorded.startswith("xxh64:") else crc32(*arrays))
