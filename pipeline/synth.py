"""Synthetic webspam-like LIBSVM generator (DESIGN.md, "Synthetic webspam-like data").

Model of the data, per row:
- length L ~ lognormal with mean ``nnz_per_row`` (sigma ``ROW_SIGMA``), clipped to [1, features];
- L distinct feature ranks drawn from a power law p(r) ~ r^-ZIPF_EXPONENT on [1, features + 1)
  (Zipf-like, as trigram counts are; duplicates are re-drawn, at most ``MAX_DRAWS`` * L draws, so a
  row may come out shorter when L nears ``features``), mapped rank -> feature id by a seeded affine
  bijection (a * r + b) mod features, and sorted;
- values Exp(1) + ``VALUE_FLOOR``, then the row is L2-normalised;
- label +1 iff w*.x + b + eps > 0, eps ~ Logistic(0, noise_scale); w* has ``support`` non-zeros,
  N(0, 1), on random features among the ``4 * support`` most frequent; b is solved on a pilot sample
  so that ``POSITIVE_FRACTION`` of rows are positive in expectation.

Output is LIBSVM text: 1-based sorted unique indices, labels ``+1``/``-1``, values as ``%.6g``, ``\\n``.
Rows are made in fixed-size chunks, chunk k seeded from (seed, k), so bytes depend only on the
arguments (never on ``workers``), and a file's first rows equal a shorter file's. All per-token work
is in numba kernels that release the GIL.
The ground truth goes to ``OUT.truth.npz`` (indices int64 0-based columns, values float64, bias) and
``OUT.truth.json`` (parameters and realised statistics).
"""
from __future__ import annotations

import json
import math
import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np

from pipeline.cluster import in_order

__all__ = ["synth", "format_rows", "format_bound", "generate_chunk", "WEBSPAM_FEATURES"]

WEBSPAM_FEATURES = 16_609_143
ZIPF_EXPONENT = 1.1        # power-law exponent of feature-rank frequencies
ROW_SIGMA = 0.5            # lognormal sigma of row lengths
VALUE_FLOOR = 0.1          # raw values are Exp(1) + VALUE_FLOOR before normalisation
POSITIVE_FRACTION = 0.6    # expected share of +1 labels
NOISE_REL = 0.1            # logistic label-noise scale relative to the pilot margins' std
MAX_SUPPORT = 2000         # non-zeros of w* (fewer for small feature counts: features // 100)
SUPPORT_POOL = 4           # w* support drawn among the SUPPORT_POOL * support most frequent ranks
PILOT_ROWS = 2048          # rows used to solve the bias
MAX_DRAWS = 20             # a row stops after MAX_DRAWS * length draws even if short of distinct ranks
HEAD_RANKS = 1 << 16       # most frequent ranks sampled exactly by an alias table
TAIL_KNOTS = 4096          # equal-mass buckets of the rarer ranks (power law, linear within a bucket)
CHUNK_BYTES = 48 << 20     # target text bytes per chunk (sets rows per chunk; part of the output's identity)
_GEN_VERSION = 1

# Powers of ten 1e-340 .. 1e308, correctly rounded (parsed from strings); index = exponent + 340.
_P10_OFF = 340
_P10 = np.array([float(f"1e{k}") for k in range(-_P10_OFF, 309)])


# ----------------------------------------------------------------------------------------------
# Text formatting kernels
# ----------------------------------------------------------------------------------------------

_DIG2 = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode(), np.uint8).copy()


@numba.njit(cache=True, nogil=True, inline="always")
def _ndigits(x):
    """Decimal digits of int64 x >= 0 (x = 0 has one)."""
    if x < 10_000:
        if x < 100:
            return 1 if x < 10 else 2
        return 3 if x < 1000 else 4
    if x < 100_000_000:
        if x < 1_000_000:
            return 5 if x < 100_000 else 6
        return 7 if x < 10_000_000 else 8
    n = 9
    x //= 1_000_000_000
    while x > 0:
        x //= 10
        n += 1
    return n


@numba.njit(cache=True, nogil=True, inline="always")
def _put_digits(buf, end, x, n):
    """Write the n low decimal digits of int64 x >= 0 (zero-padded) ending just before buf[end]."""
    p = end
    while n >= 2:
        q = x // 100
        r = (x - q * 100) * 2
        p -= 2
        buf[p] = _DIG2[r]
        buf[p + 1] = _DIG2[r + 1]
        x = q
        n -= 2
    if n == 1:
        buf[p - 1] = 48 + x % 10


@numba.njit(cache=True, nogil=True, inline="always")
def _put_uint(buf, pos, x):
    """Write non-negative integer x in decimal at buf[pos:]; return the new position."""
    n = _ndigits(x)
    _put_digits(buf, pos + n, x, n)
    return pos + n


@numba.njit(cache=True, nogil=True, inline="always")
def _put_uint_pad(buf, pos, x, width):
    """Write non-negative integer x < 10^width with exactly ``width`` digits (zero-padded)."""
    _put_digits(buf, pos + width, x, width)
    return pos + width


@numba.njit(cache=True, nogil=True, inline="always")
def _put_g6(buf, pos, v, p10):
    """Write finite float v like C's ``%.6g`` at buf[pos:]; return the new position."""
    if 1e-4 <= v < 1.0:  # fast path: "0." [zeros] six digits, trailing zeros dropped
        if v >= 0.01:
            e = -1 if v >= 0.1 else -2
        else:
            e = -3 if v >= 0.001 else -4
        m = np.int64(v * p10[5 - e + _P10_OFF] + 0.5)
        if m >= 1000000:
            m = 100000
            e += 1
            if e == 0:
                buf[pos] = 49
                return pos + 1
        buf[pos] = 48
        buf[pos + 1] = 46
        pos += 2
        for i in range(-e - 1):
            buf[pos] = 48
            pos += 1
        q = m // 10000
        r = m - q * 10000
        h = r // 100
        t = r - h * 100
        buf[pos] = _DIG2[2 * q]
        buf[pos + 1] = _DIG2[2 * q + 1]
        buf[pos + 2] = _DIG2[2 * h]
        buf[pos + 3] = _DIG2[2 * h + 1]
        buf[pos + 4] = _DIG2[2 * t]
        buf[pos + 5] = _DIG2[2 * t + 1]
        pos += 6
        while buf[pos - 1] == 48:
            pos -= 1
        return pos
    if v == 0.0:
        buf[pos] = 48
        return pos + 1
    if v < 0.0:
        buf[pos] = 45
        pos += 1
        v = -v
    # decimal exponent e with 10^e <= v < 10^(e+1)
    e = 0
    if v >= 1.0:
        while e < 308 and v >= p10[e + 1 + _P10_OFF]:
            e += 1
    else:
        e = -1
        while e > -_P10_OFF and v < p10[e + _P10_OFF]:
            e -= 1
    k = 5 - e
    if k > 300:
        x = v * 1e100 * p10[k - 100 + _P10_OFF]
    elif k >= 0:
        x = v * p10[k + _P10_OFF]
    else:
        x = v / p10[-k + _P10_OFF]
    m = np.int64(np.rint(x))
    if m >= 1000000:
        m //= 10
        e += 1
    elif m < 100000:  # only reachable through double rounding at the 10^e boundary
        m = 100000
    # six significant digits in m; strip trailing zeros -> nd digits
    nd = 6
    while nd > 1 and m % 10 == 0:
        m //= 10
        nd -= 1
    if e < -4 or e >= 6:
        div = np.int64(1)
        for i in range(nd - 1):
            div *= 10
        buf[pos] = 48 + m // div
        pos += 1
        if nd > 1:
            buf[pos] = 46
            pos = _put_uint_pad(buf, pos + 1, m % div, nd - 1)
        buf[pos] = 101
        if e < 0:
            buf[pos + 1] = 45
            e = -e
        else:
            buf[pos + 1] = 43
        pos += 2
        if e < 10:
            buf[pos] = 48
            pos += 1
        return _put_uint(buf, pos, e)
    if e >= 0:
        if nd <= e + 1:
            pos = _put_uint(buf, pos, m)
            for i in range(e + 1 - nd):
                buf[pos] = 48
                pos += 1
            return pos
        div = np.int64(1)
        for i in range(nd - e - 1):
            div *= 10
        pos = _put_uint(buf, pos, m // div)
        buf[pos] = 46
        return _put_uint_pad(buf, pos + 1, m % div, nd - e - 1)
    buf[pos] = 48
    buf[pos + 1] = 46
    pos += 2
    for i in range(-e - 1):
        buf[pos] = 48
        pos += 1
    return _put_uint(buf, pos, m)


@numba.njit(cache=True, nogil=True)
def _format_rows(labels, indptr, indices, values, index_base, buf, p10):
    pos = 0
    for i in range(labels.shape[0]):
        buf[pos] = 43 if labels[i] > 0 else 45  # '+' / '-'
        buf[pos + 1] = 49                       # '1'
        pos += 2
        for j in range(indptr[i], indptr[i + 1]):
            buf[pos] = 32
            pos = _put_uint(buf, pos + 1, np.int64(indices[j]) + index_base)
            buf[pos] = 58
            pos = _put_g6(buf, pos + 1, values[j], p10)
        buf[pos] = 10
        pos += 1
    return pos


def format_bound(n_rows: int, nnz: int, max_index: int) -> int:
    """Upper bound on the bytes ``format_rows`` writes (values take at most 13 bytes as %.6g)."""
    return 4 * n_rows + nnz * (len(str(max(int(max_index), 0))) + 15)


def format_rows(labels, indptr, indices, values, index_base=1, buf=None):
    """Format CSR rows as LIBSVM text (``+1``/``-1`` labels, ``%.6g`` values); return bytes.

    ``buf`` (uint8, at least ``format_bound`` long) is reused when given; the result is a view into it.
    """
    labels = np.ascontiguousarray(labels)
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    indices = np.ascontiguousarray(indices)
    values = np.ascontiguousarray(values, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError("values must be finite")
    max_index = int(indices.max()) + index_base if indices.size else 0
    need = format_bound(labels.shape[0], indices.shape[0], max_index)
    if buf is None or buf.shape[0] < need:
        buf = np.empty(need, np.uint8)
    n = _format_rows(labels, indptr, indices, values, np.int64(index_base), buf, _P10)
    return buf[:n]


# ----------------------------------------------------------------------------------------------
# Row generation kernel
# ----------------------------------------------------------------------------------------------

_GOLD = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TWO_M53 = 1.0 / 9007199254740992.0


@numba.njit(cache=True, nogil=True, inline="always")
def _uniform(st):
    """Uniform double in [0, 1) from splitmix64; st is a one-element uint64 state array."""
    z = st[0] + _GOLD
    st[0] = z
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    z = z ^ (z >> _S31)
    return np.float64(z >> _S11) * _TWO_M53


@numba.njit(cache=True, nogil=True)
def _alias_table(p):
    """Vose alias table for probabilities p: (prob float64, alias int64)."""
    n = p.shape[0]
    q = p * (n / p.sum())
    prob = np.ones(n)
    alias = np.arange(n)
    small = np.empty(n, np.int64)
    large = np.empty(n, np.int64)
    ns = 0
    nl = 0
    for i in range(n):
        if q[i] < 1.0:
            small[ns] = i
            ns += 1
        else:
            large[nl] = i
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        s = small[ns]
        g = large[nl - 1]
        prob[s] = q[s]
        alias[s] = g
        q[g] = (q[g] + q[s]) - 1.0
        if q[g] < 1.0:
            nl -= 1
            small[ns] = g
            ns += 1
    return prob, alias


@numba.njit(cache=True, nogil=True)
def _radix_sort(a, tmp, count, n, shift, bits):
    """Sort a[:n] in place by bits [shift, bits) of its non-negative int64 keys (LSD, 8-bit digits).

    Keys must be distinct in those bits and below 2^bits; tmp (as long as a) and count (257) are
    scratch."""
    if n < 256:
        a[:n].sort()
        return
    src = a
    dst = tmp
    while shift < bits:
        count[:] = 0
        for k in range(n):
            count[((src[k] >> shift) & 255) + 1] += 1
        for d in range(256):
            count[d + 1] += count[d]
        for k in range(n):
            d = (src[k] >> shift) & 255
            dst[count[d]] = src[k]
            count[d] += 1
        src, dst = dst, src
        shift += 8
    if src is not a:
        a[:n] = src[:n]


@numba.njit(cache=True, nogil=True)
def generate_chunk(state, n_rows, features, log_mu, sigma, alias_prob, alias_idx, head_mass,
                   tail_x, map_a, map_b, slot_by_rank, w_slot, bias, noise_scale,
                   value_floor, max_draws):
    """Make ``n_rows`` rows; return (indptr int64, indices int32 0-based, values, labels int8, margins).

    ``state`` (two uint64, advanced in place) holds two splitmix64 streams, row lengths and row
    contents, so the output is a function of the arguments only (on any thread) and the first k rows
    do not depend on ``n_rows``.
    A rank is drawn from one uniform x: x < head_mass picks one of the H = len(alias_prob) head ranks
    by the alias table; otherwise r = floor(X(x)) - 1 with X the power-law inverse CDF, linear between
    the equal-mass knots ``tail_x`` (piecewise-uniform density within each tail bucket).
    Distinct ranks are collected with a per-row hash set until the row's length is reached or
    ``max_draws`` * length draws are spent, then mapped to ids (map_a * r + map_b) mod features.
    ``margins`` are w*.x (no bias, no noise).
    """
    st_len = state[0:1]
    st = state[1:2]
    lengths = np.empty(n_rows, np.int64)
    total = 0
    max_len = 1
    for i in range(n_rows):
        z = math.sqrt(-2.0 * math.log(1.0 - _uniform(st_len))) * math.cos(2.0 * math.pi * _uniform(st_len))
        L = np.int64(np.rint(math.exp(log_mu + sigma * z)))
        L = min(max(L, 1), features)
        lengths[i] = L
        total += L
        max_len = max(max_len, L)
    tbits = 4
    while (1 << tbits) < 2 * max_len:
        tbits += 1
    table = np.zeros(1 << tbits, np.int64)  # entries (row + 1) << 32 | rank; other rows' = empty
    uniq = np.empty(max_len, np.int64)
    keys = np.empty(max_len, np.int64)
    tmp = np.empty(max_len, np.int64)
    count = np.empty(257, np.int64)
    key_bits = 16
    while (np.int64(1) << (key_bits - 16)) < features:
        key_bits += 1
    indptr = np.zeros(n_rows + 1, np.int64)
    indices = np.empty(total, np.int32)
    values = np.empty(total, np.float64)
    labels = np.empty(n_rows, np.int8)
    margins = np.empty(n_rows, np.float64)
    n_head = alias_prob.shape[0]
    n_pool = slot_by_rank.shape[0]
    head_scale = n_head / head_mass
    n_tail = tail_x.shape[0] - 1
    tail_scale = n_tail / (1.0 - head_mass) if head_mass < 1.0 else 0.0
    pos = 0
    for i in range(n_rows):
        L = lengths[i]
        bits = 4
        while (1 << bits) < 2 * L:
            bits += 1
        mask = (1 << bits) - 1
        cur = np.int64(i + 1) << 32
        u = 0
        budget = max_draws * L + 64
        while u < L and budget > 0:
            budget -= 1
            x = _uniform(st)
            if x < head_mass:
                y = x * head_scale
                r = np.int64(y)
                if r >= n_head:
                    r = n_head - 1
                if y - r >= alias_prob[r]:
                    r = alias_idx[r]
            else:
                y = (x - head_mass) * tail_scale
                j = min(np.int64(y), n_tail - 1)
                r = np.int64(tail_x[j] + (y - j) * (tail_x[j + 1] - tail_x[j])) - 1
                r = min(max(r, n_head), features - 1)
            want = cur | r
            h = ((r * 2654435761) >> 7) & mask
            t = table[h]
            while t != want and (t >> 32) == (cur >> 32):
                h = (h + 1) & mask
                t = table[h]
            if t != want:
                table[h] = want
                uniq[u] = r
                u += 1
        for k in range(u):
            r = uniq[k]
            s = slot_by_rank[r] if r < n_pool else 0
            keys[k] = (((map_a * r + map_b) % features) << 16) | s
        _radix_sort(keys, tmp, count, u, 16, key_bits)
        norm = 0.0
        for k in range(u):
            v = value_floor - math.log(1.0 - _uniform(st))
            values[pos + k] = v
            norm += v * v
        inv = 1.0 / math.sqrt(norm)
        mg = 0.0
        for k in range(u):
            v = values[pos + k] * inv
            values[pos + k] = v
            key = keys[k]
            indices[pos + k] = np.int32(key >> 16)
            mg += w_slot[key & 0xFFFF] * v
        margins[i] = mg
        q = _uniform(st)
        eps = 0.0
        if noise_scale > 0.0 and q > 0.0:
            eps = noise_scale * math.log(q / (1.0 - q))
        labels[i] = 1 if mg + bias + eps > 0.0 else -1
        pos += u
        indptr[i + 1] = pos
    return indptr, indices[:pos], values[:pos], labels, margins


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------

def _state(*words: int) -> np.ndarray:
    """Two splitmix64 states for the streams named by words, e.g. (seed, chunk_index)."""
    return np.random.SeedSequence(list(words)).generate_state(2, np.uint64)


def _chunk_rows(features: int, nnz_per_row: int) -> int:
    per_row = nnz_per_row * (len(str(features)) + 12) + 4
    return max(1, CHUNK_BYTES // per_row)


def _check_int(name, x, lo, hi=None):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < lo or (hi is not None and x > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {rng}, got {x}")
    return int(x)


class _Model:
    """Everything fixed across chunks: rank sampler, rank -> id map, w* (as slots), bias, noise."""

    def __init__(self, seed, features, nnz_per_row):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0xFFFFFFFF, 1])))
        self.features = features
        # rank -> id: affine bijection mod features (a coprime to features)
        while True:
            a = int(rng.integers(1, max(features, 2)))
            if math.gcd(a, features) == 1:
                break
        self.map_a, self.map_b = a, int(rng.integers(0, features))
        # power law on [1, features + 1): head ranks by alias table, tail by inverse CDF
        t = 1.0 - ZIPF_EXPONENT
        zipf_c = 1.0 - (features + 1.0) ** t
        n_head = min(features, HEAD_RANKS)
        edges = np.arange(1, n_head + 2, dtype=np.float64) ** t
        self.alias_prob, self.alias_idx = _alias_table(edges[:-1] - edges[1:])
        self.head_mass = 1.0 if n_head == features else (1.0 - (n_head + 1.0) ** t) / zipf_c
        u = self.head_mass + (1.0 - self.head_mass) * np.arange(TAIL_KNOTS + 1) / TAIL_KNOTS
        self.tail_x = (1.0 - u * zipf_c) ** (1.0 / t)
        self.tail_x[0], self.tail_x[-1] = n_head + 1.0, features + 1.0
        # w*: support ranks among the most frequent
        self.support = max(1, min(MAX_SUPPORT, features // 100))
        pool = min(features, SUPPORT_POOL * self.support)
        ranks = np.sort(rng.choice(pool, self.support, replace=False))
        self.slot_by_rank = np.zeros(pool, np.int32)
        self.slot_by_rank[ranks] = np.arange(1, self.support + 1, dtype=np.int32)
        self.w_slot = np.zeros(self.support + 1)
        self.w_slot[1:] = rng.standard_normal(self.support)
        ids = (self.map_a * ranks.astype(np.int64) + self.map_b) % features
        order = np.argsort(ids)
        self.truth_indices, self.truth_values = ids[order], self.w_slot[1:][order]
        self.log_mu = math.log(nnz_per_row) - 0.5 * ROW_SIGMA ** 2
        # pilot sample: solve bias b so that mean sigmoid((m + b) / s) == POSITIVE_FRACTION
        _, _, _, _, m = self.rows(_state(seed, 0xFFFFFFFF, 2), PILOT_ROWS, 0.0, 0.0)
        sd = float(np.std(m))
        self.noise_scale = NOISE_REL * sd if sd > 0 else 1.0
        lo, hi = -float(np.max(m)) - 50 * self.noise_scale, -float(np.min(m)) + 50 * self.noise_scale
        for _ in range(200):
            b = 0.5 * (lo + hi)
            z = np.clip((m + b) / self.noise_scale, -500, 500)
            if np.mean(1.0 / (1.0 + np.exp(-z))) < POSITIVE_FRACTION:
                lo = b
            else:
                hi = b
        self.bias = 0.5 * (lo + hi)

    def rows(self, state, n_rows, bias, noise_scale):
        return generate_chunk(state, n_rows, self.features, self.log_mu, ROW_SIGMA,
                              self.alias_prob, self.alias_idx, self.head_mass, self.tail_x,
                              self.map_a, self.map_b, self.slot_by_rank,
                              self.w_slot, bias, noise_scale, VALUE_FLOOR, MAX_DRAWS)


def _make_chunk(model, seed, k, n_rows, pool):
    """Generate and format chunk k; the text buffer comes from (and goes back to) ``pool``."""
    indptr, indices, values, labels, _ = model.rows(_state(seed, k), n_rows, model.bias,
                                                    model.noise_scale)
    need = format_bound(n_rows, indices.shape[0], model.features)
    try:
        buf = pool.get_nowait()
    except queue.Empty:
        buf = None
    if buf is None or buf.shape[0] < need:
        buf = np.empty(int(need * 1.25), np.uint8)
    n = _format_rows(labels, indptr, indices, values, np.int64(1), buf, _P10)
    return buf, n, indices.shape[0], int(np.count_nonzero(labels > 0))


def _atomic_write(path: Path, write):
    tmp = path.with_name(f"{path.name}.partial-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def synth(out_path, rows, features=WEBSPAM_FEATURES, nnz_per_row=3700, seed=0, progress=None,
          workers=1, model_seed: int | None = None) -> dict:
    """Write ``rows`` webspam-like LIBSVM rows to ``out_path`` plus ``OUT.truth.npz``/``.json``.

    Deterministic in (rows, features, nnz_per_row, seed, model_seed); ``workers`` threads only change speed.
    ``model_seed`` (default: ``seed``) fixes the concept (w*, bias, rank -> feature map) and ``seed`` the rows,
    so files with one model seed and different seeds are daily samples of the same problem.
    ``progress(bytes_written, rows_written)`` is called after every chunk. The file appears only
    when complete. Returns {path, rows, features, nnz, bytes, seconds, mb_per_s (1 MB = 1e6 bytes),
    positive_fraction, setup_seconds (pilot sample and model, included in seconds)}.
    """
    t0 = time.perf_counter()
    rows = _check_int("rows", rows, 0)
    features = _check_int("features", features, 1, 2**31 - 1)
    nnz_per_row = _check_int("nnz_per_row", nnz_per_row, 1, features)
    seed = _check_int("seed", seed, 0, 2**63 - 1)
    workers = _check_int("workers", workers, 1)
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable or None")
    out = Path(out_path)
    model_seed = seed if model_seed is None else _check_int("model_seed", model_seed, 0, 2**63 - 1)
    model = _Model(model_seed, features, nnz_per_row)
    setup = time.perf_counter() - t0
    chunk = _chunk_rows(features, nnz_per_row)
    sizes = [min(chunk, rows - s) for s in range(0, rows, chunk)]
    stats = {"bytes": 0, "rows": 0, "nnz": 0, "pos": 0}
    pool = queue.SimpleQueue()  # reused text buffers (fresh ones cost page faults)

    def emit(f, result, n_rows):
        buf, n, nnz, npos = result
        f.write(memoryview(buf)[:n])
        stats["bytes"] += n
        stats["rows"] += n_rows
        stats["nnz"] += nnz
        stats["pos"] += npos
        pool.put(buf)
        if progress is not None:
            progress(stats["bytes"], stats["rows"])

    def write_data(f):
        # generation on `workers` threads (numba kernels release the GIL); this thread writes in order
        with ThreadPoolExecutor(workers) as ex:
            chunks = in_order(lambda i: ex.submit(_make_chunk, model, seed, i, sizes[i], pool), len(sizes), workers)
            for made, n_rows in zip(chunks, sizes):
                emit(f, made, n_rows)

    data_tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    try:
        with open(data_tmp, "wb") as f:
            write_data(f)
        pos_frac = stats["pos"] / rows if rows else 0.0
        params = {
            "generator": "sparsepipe.synth", "version": _GEN_VERSION, "seed": seed, "model_seed": model_seed, "rows": rows,
            "features": features, "nnz_per_row": nnz_per_row, "file_index_base": 1,
            "truth_index_base": 0, "zipf_exponent": ZIPF_EXPONENT, "row_length": "lognormal",
            "row_sigma": ROW_SIGMA, "value_floor": VALUE_FLOOR, "support": model.support,
            "support_pool": int(model.slot_by_rank.shape[0]), "bias": model.bias,
            "noise": "logistic", "noise_scale": model.noise_scale,
            "target_positive_fraction": POSITIVE_FRACTION, "pilot_rows": PILOT_ROWS,
            "chunk_rows": chunk, "max_draws": MAX_DRAWS, "head_ranks": HEAD_RANKS,
            "tail_knots": TAIL_KNOTS,
            "rank_to_id": [model.map_a, model.map_b], "nnz": stats["nnz"],
            "bytes": stats["bytes"], "positive_fraction": pos_frac,
            "label_rule": "y = +1 iff w.x + bias + eps > 0, eps ~ Logistic(0, noise_scale)",
        }
        _atomic_write(Path(f"{out}.truth.npz"), lambda fh: np.savez(
            fh, indices=model.truth_indices, values=model.truth_values,
            bias=np.array([model.bias], np.float64)))
        _atomic_write(Path(f"{out}.truth.json"),
                      lambda fh: fh.write(json.dumps(params, indent=2).encode() + b"\n"))
        os.replace(data_tmp, out)
    except BaseException:
        data_tmp.unlink(missing_ok=True)
        raise
    secs = time.perf_counter() - t0
    return {"path": str(out), "rows": rows, "features": features, "nnz": stats["nnz"],
            "bytes": stats["bytes"], "seconds": secs,
            "mb_per_s": stats["bytes"] / 1e6 / secs if secs > 0 else float("inf"),
            "positive_fraction": pos_frac, "setup_seconds": setup}
