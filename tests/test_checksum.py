"""Block checksums: the numba XXH64 against the specification's test vectors and a pure-Python reference."""
import numpy as np
import pytest

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
    return int(checksum.xxh64(np.frombuffer(data, np.uint8).copy(), np.uint64(seed)))


@pytest.mark.parametrize("text,want", [(b"", 0xEF46DB3751D8E999), (b"a", 0xD24EC4F1A98C6E5B),
                                       (b"abc", 0x44BC2CF5AD770999),
                                       (b"Nobody inspects the spammish repetition", 0xFBCEA83C8A378BF1)])
def test_xxh64_test_vectors(text, want):
    assert reference_xxh64(text) == want and kernel(text) == want


@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_xxh64_equals_reference_for_every_tail_length(seed):
    rng = np.random.default_rng(seed % 1000)
    for n in list(range(0, 80)) + [1000, 4099]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert kernel(data, seed) == reference_xxh64(data, seed), n


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
