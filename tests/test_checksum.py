"""Block checksums: the numba XXH64 kernel and checksum.xxh64_python (the path of processes without numba) against
the specification's test vectors and a one-operation-at-a-time reference."""
import numpy as np
import pytest

from pipeline.kernels.xxh64 import xxh64 as xxh64_kernel
from pipeline.store import checksum

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161, 9650029242287828579,
                      2870177450012600261)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def rnd(acc, lane):
    return rotl((acc + lane * P2) & M, 31) * P1 & M


def reference_xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 written from the specification, one Python int operation at a time."""
    n, i = len(data), 0
    word = lambda k, w=8: int.from_bytes(data[k:k + w], "little")  # noqa: E731
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        while i + 32 <= n:
            v = [rnd(v[j], word(i + 8 * j)) for j in range(4)]
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            h = ((h ^ rnd(0, x)) * P1 + P4) & M
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, word(i)), 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (word(i, 4) * P1 & M), 23) * P2 + P3) & M
        i += 4
    while i < n:
        h = rotl(h ^ (data[i] * P5 & M), 11) * P1 & M
        i += 1
    h ^= h >> 33
    h = h * P2 & M
    h ^= h >> 29
    h = h * P3 & M
    return h ^ (h >> 32)


def kernel(data: bytes, seed: int = 0) -> int:
    return int(xxh64_kernel(np.frombuffer(data, np.uint8).copy(), np.uint64(seed)))


def python(data: bytes, seed: int = 0) -> int:
    return checksum.xxh64_python(np.frombuffer(data, np.uint8), seed)


@pytest.mark.parametrize("text,want", [(b"", 0xEF46DB3751D8E999), (b"a", 0xD24EC4F1A98C6E5B),
                                       (b"abc", 0x44BC2CF5AD770999),
                                       (b"Nobody inspects the spammish repetition", 0xFBCEA83C8A378BF1)])
def test_xxh64_test_vectors(text, want):
    assert reference_xxh64(text) == want and kernel(text) == want and python(text) == want


@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_xxh64_equals_reference_for_every_tail_length(seed):
    rng = np.random.default_rng(seed % 1000)
    for n in list(range(0, 80)) + [1000, 4099]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert kernel(data, seed) == reference_xxh64(data, seed) == python(data, seed), n


def test_python_xxh64_equals_kernel_on_block_arrays():
    """Long inputs (many stripes) and unaligned starts (a slice one byte in), as _bytes gives them."""
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (1 << 20) + 77, dtype=np.uint8)
    for buf in (raw, raw[1:], raw[5:4101]):
        assert checksum.xxh64_python(buf) == int(xxh64_kernel(np.ascontiguousarray(buf), np.uint64(0)))


def test_checksum_same_with_and_without_numba_path(monkeypatch):
    """The Python budget decides which implementation hashes, never the checksum; past it, the kernel."""
    rng = np.random.default_rng(4)
    arrays = (np.arange(101, dtype=np.int64), rng.integers(0, 1 << 30, 3000).astype(np.int32),
              rng.random(3000).astype(np.float32), rng.choice([-1.0, 1.0], 100).astype(np.float32))
    seen, python_xxh64 = [], checksum.xxh64_python
    monkeypatch.setattr(checksum, "xxh64_python", lambda buf: seen.append(buf.nbytes) or python_xxh64(buf))
    monkeypatch.setattr(checksum, "numba_started", lambda: False)
    monkeypatch.setattr(checksum, "_python_left", 1 << 30)
    by_python = checksum.checksum(*arrays)
    assert len(seen) == 5  # four arrays and the digests, all in Python
    monkeypatch.setattr(checksum, "_python_left", 0)
    assert checksum.checksum(*arrays) == by_python and len(seen) == 5  # all in the kernel
    monkeypatch.setattr(checksum, "_python_left", 1 << 20)
    checksum.expect(1 << 19)  # a command announcing reads within the budget: Python still
    assert checksum.checksum(*arrays) == by_python and len(seen) == 10
    checksum.expect(1 << 20)  # more than is left: the kernel from the first byte
    assert checksum.checksum(*arrays) == by_python and len(seen) == 10


def test_block_checksum_and_old_crc32_both_verify():
    rng = np.random.default_rng(5)
    arrays = (np.array([0, 2, 5], np.int64), rng.integers(0, 9, 5).astype(np.int32), rng.random(5).astype(np.float32),
              np.array([1.0, -1.0], np.float32))
    new, old = checksum.checksum(*arrays), checksum.crc32(*arrays)
    assert new.startswith("xxh64:") and len(new) == 22 and len(old) == 8
    assert checksum.matches(new, *arrays) and checksum.matches(old, *arrays)
    changed = (arrays[0], arrays[1], arrays[2] * np.float32(1.5), arrays[3])
    assert not checksum.matches(new, *changed) and not checksum.matches(old, *changed)
    # the digest of each array is chained in order: swapping two equal-length arrays changes the checksum
    assert checksum.checksum(arrays[1], arrays[2]) != checksum.checksum(arrays[2], arrays[1])
