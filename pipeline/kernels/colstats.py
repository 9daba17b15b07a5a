"""Per-feature statistics (non-zero count, float64 sum of squares) by a cache-blocked pass.

One kernel serves two callers:

* a parsed block (``counts`` None): the entries of CSR rows are values; each adds 1 and ``v * v``;
* the commit (``counts`` given): the "rows" are sorted statistics sets (one per block) concatenated; each
  entry adds its count and its partial sum of squares.

For each feature band [lo, lo + band) every row contributes its entries of that band (``cur`` keeps each
row's position; indices increase within a row), so every feature's values are added in row order, exactly
as a row-by-row scan over a width-sized accumulator would add them, while the float64[2 * band] scratch
(4 MiB at the default band) stays in the cache instead of a cache miss per entry into a width-sized one
(266 MB at webspam width).
"""
from __future__ import annotations

import threading

import numba
import numpy as np

from pipeline import arena
from pipeline.kernels.intrinsics import base, cttz, prefetch

# 1 << 18 measured best on webspam-like blocks (1 << 17: +7%, 1 << 19: +13%, 1 << 16: +20%). Module-level
# so that tests can change it.
STATS_BAND = 1 << 18
# The commit's few long sorted "rows" (one per set) afford many bands: a scratch in L1/L2 is ~20% faster
# than STATS_BAND's (3 webspam-like 64 MB blocks' sets: 15.4 ms against 18.6 ms).
SETS_BAND = 1 << 12

_BAND = threading.local()  # per thread: the band scratch (parse tasks may share a process)

_U1 = np.uint64(1)
_U6 = np.uint64(6)
_U63 = np.uint64(63)


@numba.njit(cache=True, nogil=True)
def band_sums(indptr, indices, values, counts, width, band, scratch, bits, cur, out_idx, out_nnz, out_ss):
    """Per-feature count and sum of squares of the rows indptr/indices (ascending within a row).

    ``counts`` None: ``values`` are entries, each adds (1, v * v); otherwise each entry adds
    (counts[k], values[k]). ``scratch`` float64[2 * band] and ``bits`` (one bit per feature of the band) are
    zero on entry and handed back zeroed. Writes the present features (< ``width``) in ascending order to
    the out arrays and returns their number.
    """
    nrows = indptr.shape[0] - 1
    ip = base(indices)
    dp = base(values)
    sp = base(scratch)
    bp = base(bits)
    for r in range(nrows):
        cur[r] = indptr[r]
    nt = 0
    lo = 0
    while lo < width:
        hi = min(lo + band, width)
        add_band(ip, dp, sp, bp, indptr, cur, counts, lo, band, np.uint64(0))
        nt = drain(bp, (hi - lo + 63) >> 6, sp, lo, out_idx, out_nnz, out_ss, nt)
        lo = hi
    return nt


@numba.njit(cache=True, nogil=True)
def band_adds(indptr, indices, values, counts, width, band, acc, bits, cur):
    """:func:`band_sums`' pass adding into a width-sized accumulator instead of draining each band: ``acc``
    float64[2 * width] ((count, sum of squares) pairs) and ``bits`` (one bit per feature) keep what earlier calls
    added, so sets summed group after group add each feature's values in set order, as one call over all of them
    would, while a band of the accumulator stays in the cache for every set of the group. The accumulator is still
    swept once per group: 37 webspam-like blocks' sets over a 5.9M-feature band took 11.9 ns per entry one set at a
    time, 9.7 / 8.3 / 5.2 ns in groups of 8 / 15 / 37."""
    ip = base(indices)
    dp = base(values)
    sp = base(acc)
    bp = base(bits)
    for r in range(indptr.shape[0] - 1):
        cur[r] = indptr[r]
    lo = 0
    while lo < width:
        add_band(ip, dp, sp, bp, indptr, cur, counts, lo, band, np.uint64(lo))
        lo += band


@numba.njit(cache=True, nogil=True, inline="always")
def add_band(ip, dp, sp, bp, indptr, cur, counts, lo, band, at):
    """Add every row's entries of the features [lo, lo + band), from ``cur`` on (advanced past them), at scratch
    offset ``at`` + (id - lo) (:func:`add_entry`). ``ip``, ``dp``, ``sp``, ``bp``: raw pointers."""
    nrows = indptr.shape[0] - 1
    uband = np.uint64(band)
    for r in range(nrows):
        if r + 8 < nrows:  # the rows' next segments are scattered: fetch a few rows ahead
            c = cur[r + 8]
            prefetch(ip, c)
            prefetch(dp, c)
            prefetch(ip, c + 16)
            prefetch(dp, c + 16)
        k = cur[r]
        e = indptr[r + 1]
        while k < e:
            jl = np.uint64(np.int64(ip[k]) - lo)  # unsigned: no wraparound code
            if jl >= uband:
                break
            add_entry(sp, bp, jl + at, np.float64(dp[k]), counts, k)
            k += 1
        cur[r] = k


@numba.njit(cache=True, nogil=True, inline="always")
def add_entry(sp, bp, jl, v, counts, k):
    """Add entry k at band offset ``jl`` to the (count, sum of squares) pairs ``sp`` and mark it in the bitmap
    ``bp``: (1, v * v) when ``counts`` is None, else (counts[k], v)."""
    s = jl + jl
    if counts is None:
        sp[s] += 1.0
        sp[s + _U1] += v * v
    else:
        sp[s] += np.float64(counts[k])
        sp[s + _U1] += v
    bp[jl >> _U6] |= _U1 << (jl & _U63)


@numba.njit(cache=True, nogil=True, inline="always")
def drain(bp, nwords, sp, lo, out_idx, out_nnz, out_ss, nt):
    """Move the features marked in the first ``nwords`` words of the bitmap ``bp`` (feature ``lo`` + bit
    position) from the (count, sum of squares) pairs ``sp`` to the out arrays from ``nt`` on, in feature
    order; zero the pairs and the words; return the new ``nt``. ``bp``, ``sp``: raw pointers."""
    for w in range(nwords):
        b = bp[w]
        if b != 0:
            bp[w] = 0
            while b != 0:
                jl = w * 64 + np.int64(cttz(b))
                out_idx[nt] = lo + jl
                out_nnz[nt] = np.int64(sp[2 * jl])
                out_ss[nt] = sp[2 * jl + 1]
                sp[2 * jl] = 0.0
                sp[2 * jl + 1] = 0.0
                nt += 1
                b &= b - _U1
    return nt


@numba.njit(cache=True, nogil=True)
def sorted_sums(indices, data, out_idx, out_nnz, out_ss):
    """The statistics of :func:`band_sums` (entries as values) by a stable sort of the entries (ties stay in
    row order): for blocks much sparser than their width, where scanning the band bitmaps would dominate."""
    order = np.argsort(indices, kind="mergesort")
    nt = -1
    last = -1
    for t in range(order.shape[0]):
        k = order[t]
        j = np.int64(indices[k])
        v = np.float64(data[k])
        if j != last:
            nt += 1
            out_idx[nt] = j
            out_nnz[nt] = 0
            out_ss[nt] = 0.0
            last = j
        out_nnz[nt] += 1
        out_ss[nt] += v * v
    return nt + 1


@numba.njit(cache=True, nogil=True)
def rows_ascending(indptr, indices):
    """Whether the ids increase within every row (a store in frequency order keeps its rows in input order)."""
    for r in range(indptr.shape[0] - 1):
        for k in range(indptr[r] + 1, indptr[r + 1]):
            if indices[k] <= indices[k - 1]:
                return False
    return True


@numba.njit(cache=True, nogil=True)
def partitioned_sums(indices, values, counts, width, shift, tmp_idx, tmp_val, tmp_cnt, scratch, bits, out_idx,
                     out_nnz, out_ss):
    """:func:`band_sums`' statistics of rows in any order (``counts`` None: entries, each adding (1, v * v); else
    each adds (counts[k], values[k])): a stable partition of the entries by band (id >> ``shift``; row order kept
    within a band), then each band's entries added into the band scratch (float64[2 << shift], zero on entry and
    handed back zeroed) and drained in feature order. ``tmp_cnt`` is None exactly when ``counts`` is."""
    nb = ((width - 1) >> shift) + 1
    starts = np.zeros(nb + 1, np.int64)
    n = indices.shape[0]
    for k in range(n):
        starts[(np.int64(indices[k]) >> shift) + 1] += 1
    for b in range(nb):
        starts[b + 1] += starts[b]
    pos = starts[:nb].copy()
    for k in range(n):
        b = np.int64(indices[k]) >> shift
        t = pos[b]
        tmp_idx[t] = indices[k]
        tmp_val[t] = values[k]
        if counts is not None:
            tmp_cnt[t] = counts[k]
        pos[b] = t + 1
    sp = base(scratch)
    bp = base(bits)
    nt = 0
    for b in range(nb):
        lo = b << shift
        for k in range(starts[b], starts[b + 1]):
            add_entry(sp, bp, np.uint64(np.int64(tmp_idx[k]) - lo), np.float64(tmp_val[k]), tmp_cnt, k)
        hi = min(lo + (1 << shift), width)
        nt = drain(bp, (hi - lo + 63) >> 6, sp, lo, out_idx, out_nnz, out_ss, nt)
    return nt


def column_stats(indptr, indices, values, width: int, counts=None, count_dtype=np.int32, band: int | None = None,
                 reuse: bool = False, ascending: bool | None = None):
    """(feature ids ascending, counts, float64 sums of squares) of the features < ``width`` of CSR rows.

    ``counts`` None: ``values`` are the entries (see :func:`band_sums`); otherwise the rows are statistics
    sets and ``values`` their sums of squares. ``band`` forces the band width (tests); by default it is
    chosen here. ``reuse``: the results are views of this thread's :mod:`pipeline.arena` buffers. ``ascending``:
    whether the ids increase within each row (None: checked here); rows in any order (a store in frequency order,
    :mod:`pipeline.store.order`) go through :func:`partitioned_sums`."""
    nnz, nrows = indices.shape[0], indptr.shape[0] - 1
    idx_dtype = np.int32 if indices.dtype == np.int32 else np.int64
    if nnz == 0 or width <= 0:
        return np.zeros(0, idx_dtype), np.zeros(0, count_dtype), np.zeros(0, np.float64)
    cap = min(nnz, width)
    out_idx = arena.empty("colstats.idx", cap, idx_dtype, reuse)
    out_nnz = arena.empty("colstats.nnz", cap, count_dtype, reuse)
    out_ss = arena.empty("colstats.ss", cap, np.float64, reuse)
    if not (rows_ascending(indptr, indices) if ascending is None else ascending):
        shift = int(STATS_BAND).bit_length() - 1
        sc, bits = _band_scratch(1 << shift)
        tmp_idx = arena.buffer("colstats.tmp_idx", nnz, indices.dtype)  # scratch of this call only
        tmp_val = arena.buffer("colstats.tmp_val", nnz, values.dtype)
        tmp_cnt = None if counts is None else arena.buffer("colstats.tmp_cnt", nnz, counts.dtype)
        nt = partitioned_sums(indices, values, counts, width, shift, tmp_idx, tmp_val, tmp_cnt, sc, bits, out_idx,
                              out_nnz, out_ss)
        return out_idx[:nt], out_nnz[:nt], out_ss[:nt]
    if band is None:
        if counts is None and width > 64 * nnz:  # the bitmaps (width / 64 words) would outweigh the entries
            nt = sorted_sums(indices, values, out_idx, out_nnz, out_ss)
            return out_idx[:nt], out_nnz[:nt], out_ss[:nt]
        # every band looks at every row: keep bands * rows <= nnz / 4 (wider bands for short rows; the
        # scratch then grows towards float64[2 * width], touched only where used)
        band = min(width, max(STATS_BAND if counts is None else SETS_BAND, -(-4 * width * nrows // nnz)))
    band = int(max(1, min(band, width)))
    sc, bits = _band_scratch(band)
    cur = np.empty(nrows, np.int64)
    nt = band_sums(indptr, indices, values, counts, width, band, sc, bits, cur, out_idx, out_nnz, out_ss)
    return out_idx[:nt], out_nnz[:nt], out_ss[:nt]


def _band_scratch(band: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's zeroed band scratch (float64[2 * band] or larger) and its bitmap."""
    sc = getattr(_BAND, "scratch", None)
    if sc is None or sc.shape[0] < 2 * band:
        sc = np.zeros(2 * band, np.float64)
        _BAND.scratch = sc
        _BAND.bits = np.zeros((band + 63) >> 6, np.uint64)
    return sc, _BAND.bits


def release_scratch() -> None:
    """Free this thread's band scratch."""
    _BAND.__dict__.clear()


@numba.njit(cache=True, nogil=True)
def add_sets(acc_nnz, acc_ss, idx, nnz, ss):
    """acc_nnz[idx[k]] += nnz[k], acc_ss[idx[k]] += ss[k] for every k in order (a block's statistics set folded
    into width-sized sums; ``idx`` unique within the set). NumPy's ``acc[idx] += v`` without its GIL-held
    fancy indexing (~5x slower at webspam width)."""
    for k in range(idx.shape[0]):
        j = idx[k]
        acc_nnz[j] += nnz[k]
        acc_ss[j] += ss[k]
