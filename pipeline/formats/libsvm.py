"""LIBSVM / SVMlight text tokenizer: raw bytes -> CSR arrays, in numba.

The kernel walks a byte buffer that holds whole lines. Accepted syntax per line::

    <label> [qid:<int>] <index>:<value> ... [# comment]

Blank lines and comment-only lines are skipped; tabs and CR (CRLF line ends) are whitespace; the last
line may lack its newline; a row may have a label and no features. Values accept sign, decimals and
scientific notation. Every malformed line is reported as (line, column, error code); the caller turns
codes into messages with :data:`ERROR_MESSAGES` and adds the file name and absolute line number.

Speed notes. The common pair ``digits:[+-]digits[.digits]`` takes a branch-light SWAR path (8 bytes per
load, no per-digit loop); anything else goes through the general code from the token start, so
results and error columns are those of the general code. Helpers that numba inlines take a raw
pointer to the buffer, not the array: an inlined array argument costs an atomic incref/decref pair
per call, which used to be a large part of the parse time. :func:`parse_buffer` can also return the
block's per-feature statistics (``column_stats=True``), computed in a cache-blocked pass over the
parsed arrays (see :mod:`pipeline.kernels.colstats`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from pipeline import arena
from pipeline.kernels import colstats
from pipeline.kernels.intrinsics import base as _base
from pipeline.kernels.intrinsics import below_mask32 as _below_mask32
from pipeline.kernels.intrinsics import cttz as _cttz
from pipeline.kernels.intrinsics import load_u64 as _load_u64
from pipeline.kernels.intrinsics import prefetch as _prefetch

OK = 0
BAD_LABEL = 1
BAD_TOKEN = 2
INDEX_ZERO = 3
NON_INCREASING = 4
DUPLICATE = 5
NON_FINITE = 6
BEYOND_WIDTH = 7
LABEL_NOT_IN_PAIR = 8
NEGATIVE_INDEX = 9
INDEX_TOO_LARGE = 10
VALUE_BEYOND_DTYPE = 11  # finite in the text, infinite in the store's dtype
LABEL_BEYOND_FLOAT32 = 12

ERROR_MESSAGES = {
    BAD_LABEL: "bad label (expected a number)",
    BAD_TOKEN: "bad token (expected index:value)",
    INDEX_ZERO: "feature index 0 in 1-based data (use --zero-based if the file is 0-based)",
    NON_INCREASING: "feature indices not increasing",
    DUPLICATE: "duplicate feature index",
    NON_FINITE: "non-finite value (nan or inf)",
    BEYOND_WIDTH: "feature index beyond --n-features",
    LABEL_NOT_IN_PAIR: "label is not one of the two binary labels",
    NEGATIVE_INDEX: "negative feature index",
    INDEX_TOO_LARGE: "feature index too large for int32 indices (stores hold < 2**31 features)",
    VALUE_BEYOND_DTYPE: "value beyond the store's float32 range (|x| > 3.4e38): ingest with --dtype float64",
    LABEL_BEYOND_FLOAT32: "label beyond float32's range (|y| > 3.4e38; labels are stored as float32)",
}

_POW10 = np.array([10.0**k for k in range(309)], dtype=np.float64)
_POW10_INT = np.array([10**k for k in range(19)], dtype=np.int64)

_NL = 10
_CR = 13
_SP = 32
_TAB = 9
_HASH = 35
_COLON = 58

# The fast pair path reads bytes tok .. tok + 33 at most (see _fast_pair); it is used only where
# _FAST_SPAN bytes remain from the token start, so it never reads past the buffer.
_FAST_SPAN = 35


# ------------------------------------------------------------------------------ low-level helpers

# SWAR constants. numba types a bare int literal as int64, and uint64 (op) int64 is float64: keep the
# arithmetic in uint64 with these.
_U3 = np.uint64(3)
_U8 = np.uint64(8)
_U10 = np.uint64(10)
_U16 = np.uint64(16)
_U32 = np.uint64(32)
_BYTE = np.uint64(0xFF)
_BIT32 = np.uint64(1 << 32)
_MINUS = np.uint64(45)
_PLUS = np.uint64(43)
_B30 = np.uint64(0x3030303030303030)
_B76 = np.uint64(0x7676767676767676)
_B80 = np.uint64(0x8080808080808080)
_L1 = np.uint64(0x000000FF000000FF)
_MUL1 = np.uint64(100 + (1000000 << 32))
_MUL2 = np.uint64(1 + (10000 << 32))


@numba.njit(cache=True, nogil=True, inline="always")
def _digit_run(t):
    """Number of leading (lowest-address) bytes of ``t`` = x - 0x3030..30 that are digits (0..9), 0..8.

    A byte is a digit iff t < 10: flag t + 0x76 >= 0x80 (t in 10..0x7f) or t >= 0x80 (x < '0' borrows, or
    x >= 0xb0). Borrows and carries only travel to later bytes, so the first flag is exact.
    """
    return np.int64(_cttz(((t + _B76) | t) & _B80) >> _U3)


@numba.njit(cache=True, nogil=True, inline="always")
def _digits_value(t, k):
    """Integer value of the first ``k`` (0..8) digit bytes of ``t`` = x - 0x3030..30 (Lemire's SWAR)."""
    s = np.uint64(32 - 4 * k)
    t = (t << s) << s  # the k digits to the top bytes, zeros below; two shifts so that k == 0 gives 0
    t = t * _U10 + (t >> _U8)  # pairs
    return np.int64((((t & _L1) * _MUL1) + (((t >> _U16) & _L1) * _MUL2)) >> _U32)


@numba.njit(cache=True, nogil=True, inline="always")
def _is_space(c):
    return c == _SP or c == _TAB or c == _CR


@numba.njit(cache=True, nogil=True, inline="always")
def _is_end(c):
    return c == _NL or c == _HASH


@numba.njit(cache=True, nogil=True, inline="always")
def _token_end(p, pos, n):
    """A token may end at ``pos``: the buffer end, whitespace, a newline or a comment."""
    return pos >= n or _is_space(p[pos]) or _is_end(p[pos])


@numba.njit(cache=True, nogil=True, inline="always")
def _fast_pair(p, tok):
    """Fast path for a pair ``digits:[+-]digits[.digits]`` followed by a space, tab, CR or LF.

    Needs ``tok + _FAST_SPAN <= len`` (reads p[tok:tok+34] at most). Returns (index, value, token_end,
    ok); ok False means "not this simple shape: parse the token with the general code". Taken: index
    <= 8 digits, token < 24 bytes, value with <= 8 integer digits (7 after a sign), <= 16 fraction digits
    and 1..18 digits in all. The int64 mantissa and the one division by 10**fraction_digits are then
    exactly what :func:`_parse_number` computes, so the value is bit-identical (and equal to Python's
    float() when the mantissa is below 2**53).
    """
    x0 = _load_u64(p, tok)
    # the token end from one 32-byte compare: the next token does not wait for this one's value
    ln = np.int64(_cttz(_below_mask32(p, tok, 33) | _BIT32))
    te = tok + ln
    u0 = x0 - _B30
    k = _digit_run(u0)
    if ln >= 24 or p[tok + k] != _COLON:
        return 0, 0.0, te, False
    v = tok + k + 1
    y = _load_u64(p, v)
    b0 = y & _BYTE
    neg = b0 == _MINUS
    if neg or b0 == _PLUS:  # - +: drop the sign byte (at most 7 integer digits follow in y)
        y = y >> _U8
        v += 1
    uy = y - _B30
    a = _digit_run(uy)
    mant = np.int64(uy & _BYTE) if a == 1 else _digits_value(uy, a)  # one integer digit: "0.0123"
    q = v + a
    f = 0
    end = q
    if p[q] == 46:  # .
        uz = _load_u64(p, q + 1) - _B30
        f = _digit_run(uz)
        mant = mant * _POW10_INT[f] + _digits_value(uz, f)
        end = q + 1 + f
        if end != te:  # more than 8 fraction digits, or garbage (refused below): one more chunk
            uz = _load_u64(p, end) - _B30
            g = _digit_run(uz)
            mant = mant * _POW10_INT[g] + _digits_value(uz, g)
            f += g
            end += g
    c = p[te]
    if end != te or a + f == 0 or a + f > 18 or not (c == _SP or c == _NL or c == _TAB or c == _CR):
        return 0, 0.0, te, False
    val = float(mant) / _POW10[f]
    if neg:
        val = -val
    return _digits_value(u0, k), val, te, True


@numba.njit(cache=True, nogil=True, inline="always")
def _parse_number(p, pos, hi):
    """Parse a decimal float at p[pos:hi]; returns (value, end_pos, ok).

    Up to 18 significant digits go into an int64 mantissa, then one multiply or divide by an exact power
    of ten: the result is within an ulp of float64, far below the float32 the store keeps.
    ``inf``/``nan`` spellings parse (ok) so the caller can report them as non-finite, not as garbage.
    """
    neg = False
    c = p[pos] if pos < hi else 0
    if c == 43 or c == 45:  # + -
        neg = c == 45
        pos += 1
        c = p[pos] if pos < hi else 0
    lc = c | 32
    if lc == 105 or lc == 110:  # i / n : inf, infinity, nan
        start = pos
        while pos < hi and not _is_space(p[pos]) and p[pos] != _NL and p[pos] != _COLON:
            pos += 1
        n = pos - start
        if lc == 110 and n == 3 and (p[start + 1] | 32) == 97 and (p[start + 2] | 32) == 110:
            return np.nan, pos, True
        if lc == 105 and (n == 3 or n == 8) and (p[start + 1] | 32) == 110 and (p[start + 2] | 32) == 102:
            return (-np.inf if neg else np.inf), pos, True
        return 0.0, pos, False
    mant = 0
    room = 18  # significant digits still accepted into the mantissa
    exp10 = 0
    start = pos
    while pos < hi:
        d = p[pos] - 48
        if d < 0 or d > 9:
            break
        if room > 0:
            mant = mant * 10 + d
            if mant != 0:
                room -= 1
        else:
            exp10 += 1
        pos += 1
    seen = pos > start
    if pos < hi and p[pos] == 46:  # .
        pos += 1
        fstart = pos
        while pos < hi:
            d = p[pos] - 48
            if d < 0 or d > 9:
                break
            if room > 0:
                mant = mant * 10 + d
                exp10 -= 1
                if mant != 0:
                    room -= 1
            pos += 1
        seen = seen or pos > fstart
    if not seen:
        return 0.0, pos, False
    if pos < hi and (p[pos] | 32) == 101:  # e / E
        pos += 1
        eneg = False
        if pos < hi and (p[pos] == 43 or p[pos] == 45):
            eneg = p[pos] == 45
            pos += 1
        e = 0
        estart = pos
        while pos < hi:
            d = p[pos] - 48
            if d < 0 or d > 9:
                break
            if e < 100000:
                e = e * 10 + d
            pos += 1
        if pos == estart:
            return 0.0, pos, False
        exp10 += -e if eneg else e
    v = float(mant)
    if mant != 0:
        if exp10 > 0:
            v = v * _POW10[exp10] if exp10 <= 308 else np.inf
        elif exp10 < 0:
            k = -exp10
            while k > 308:
                v = v / 1e308
                k -= 308
            v = v / _POW10[k]
    return (-v if neg else v), pos, True


@numba.njit(cache=True, nogil=True)
def _general_pair(p, pos, n):
    """One token at p[pos:] by the general code: returns (index, value, end, code); index -1 for a
    ``qid:N`` token (accepted, skipped). Not inlined: the fast path's loop keeps its registers."""
    if (pos + 3 < n and p[pos] == 113 and p[pos + 1] == 105 and p[pos + 2] == 100
            and p[pos + 3] == _COLON):
        pos += 4
        q = pos
        while pos < n and p[pos] >= 48 and p[pos] <= 57:
            pos += 1
        if pos == q or not _token_end(p, pos, n):
            return 0, 0.0, pos, BAD_TOKEN
        return -1, 0.0, pos, OK
    if p[pos] == 45:
        return 0, 0.0, pos, NEGATIVE_INDEX
    idx = 0
    nd = 0
    while pos < n and p[pos] >= 48 and p[pos] <= 57:
        if nd < 18:
            idx = idx * 10 + (p[pos] - 48)
        nd += 1
        pos += 1
    if nd == 0 or nd > 18 or pos >= n or p[pos] != _COLON:
        return 0, 0.0, pos, BAD_TOKEN
    val, p2, ok = _parse_number(p, pos + 1, n)
    if not ok or not _token_end(p, p2, n):
        return 0, 0.0, p2, BAD_TOKEN
    return idx, val, p2, OK


@numba.njit(cache=True, nogil=True)
def _fast_pairs(p, pos, fast_last, base, lim, indices, data, nnz):
    """The common line: pairs of the fast shape (:func:`_fast_pair`), one space before each, increasing
    indices below ``lim``, then a newline. Stores pairs from ``pos`` while the line keeps that shape and
    returns (pos, nnz, prev) where it stopped: at the newline when the whole line was taken, else at the
    first token (or separator) that :func:`_pairs` must look at. Few live values: they stay in registers."""
    ip = _base(indices)
    dp = _base(data)
    prev = np.int64(-1)
    while pos < fast_last and p[pos] == _SP:
        c = p[pos + 1]
        if c < 48 or c > 57:
            break
        idx, val, te, ok = _fast_pair(p, pos + 1)
        j = idx - base
        if not ok or j <= prev or j >= lim:
            break
        prev = j
        ip[nnz] = j
        dp[nnz] = val
        nnz += 1
        pos = te
    return pos, nnz, prev


@numba.njit(cache=True, nogil=True)
def _pairs(p, pos, n, fast_last, base, lim, width, line_start, indices, data, nnz, prev, state):
    """The index:value pairs of one line from ``pos``; returns (pos, nnz, prev, code, col).

    A separate (not inlined) function so that the token loop gets the registers to itself. Values that
    keep declining the fast path (exponents, long mantissas) make it back off: after 1, 2, 3 .. failures
    in a row it skips 1, 3, 7 .. 63 pairs before the next attempt. ``state`` (wait, backoff) carries
    this from line to line.
    """
    code = OK
    col = 0
    ip = _base(indices)
    dp = _base(data)
    wait = state[0]  # pairs to go before the next fast-path attempt
    backoff = state[1]
    while code == OK:
        c = p[pos] if pos < n else _NL
        if c == _SP:  # usually exactly one space before the next pair
            pos += 1
            c = p[pos] if pos < n else _NL
        fast = pos <= fast_last and c >= 48 and c <= 57
        if not fast:
            while _is_space(c):
                pos += 1
                c = p[pos] if pos < n else _NL
            if _is_end(c):  # (also the buffer end)
                break
            fast = pos <= fast_last and c >= 48 and c <= 57
        tok = pos
        ok = False
        if fast:
            if wait == 0:
                idx, val, pos, ok = _fast_pair(p, tok)
                if ok:
                    backoff = 0
                else:  # not the simple shape (say 1e-05): back off
                    backoff = min(2 * backoff + 1, 63)
                    wait = backoff
            else:
                wait -= 1
        fin = True  # fast-path values are finite
        if not ok:  # the general path, from the token start
            idx, val, pos, code = _general_pair(p, tok, n)
            if code != OK:
                col = tok - line_start
                break
            if idx < 0:  # qid:N, skipped
                continue
            # finite, and in the store's dtype too (fast-path values have at most 8 integer digits)
            fin = math.isfinite(val) and (data.itemsize == 8 or math.isfinite(np.float32(val)))
        j = idx - base
        # one test for the common case (j <= prev also covers idx < base since prev >= -1)
        if j <= prev or j >= lim or not fin:
            col = tok - line_start
            if idx < base:
                code = INDEX_ZERO
            elif j == prev:
                code = DUPLICATE
            elif j < prev:
                code = NON_INCREASING
            elif not fin:
                code = NON_FINITE if not math.isfinite(val) else VALUE_BEYOND_DTYPE
            elif width >= 0 and j >= width:
                code = BEYOND_WIDTH
            else:
                code = INDEX_TOO_LARGE
            break
        prev = j
        ip[nnz] = j
        dp[nnz] = val
        nnz += 1
    state[0] = wait
    state[1] = backoff
    return pos, nnz, prev, code, col


@numba.njit(cache=True, nogil=True)
def _count_zeros(data, n):
    """How many of data[:n] are zero (a counting loop the compiler vectorises: ~0.1 ns a value, where a test per
    pair in the parse loops cost 2-4% of the parse)."""
    z = 0
    for k in range(n):
        z += data[k] == 0.0
    return z


@numba.njit(cache=True, nogil=True)
def _drop_zeros(indptr, indices, data, nrows):
    """Remove the zero values of the CSR rows ``indptr[:nrows + 1]`` in place (order kept, row pointers
    rewritten); returns the new number of entries."""
    k = 0
    lo = indptr[0]
    for r in range(nrows):
        hi = indptr[r + 1]
        for i in range(lo, hi):
            if data[i] != 0.0:
                indices[k] = indices[i]
                data[k] = data[i]
                k += 1
        lo = hi
        indptr[r + 1] = k
    return k


# ------------------------------------------------------------------------------------- the kernel

@numba.njit(cache=True, nogil=True)
def parse_libsvm(buf, one_based, width, skip_invalid, label_lo, label_hi, use_pair,
                 indptr, indices, data, labels, row_line, err_line, err_col, err_code):
    """Tokenize whole LIBSVM lines in ``buf`` (C-contiguous uint8) into preallocated CSR arrays.

    indptr[0] must be 0; indices are 0-based on output. ``width`` < 0 means no declared width. A pair whose
    value is zero in ``data``'s dtype (``j:0``, or a float32 underflow such as ``j:1e-50``) is checked like any
    other (index order, width) and counts for the width, but is not stored: the CSR holds non-zeros only (the
    kernels' per-feature counts, e.g. STSGD's k̃_j, would otherwise count a touch that carries no gradient).
    ``use_pair`` restricts labels to {label_lo, label_hi} (explicit binary encodings).
    Returns (n_rows, nnz, n_errors, max_index_plus_one, n_lines, zeros_dropped). With ``skip_invalid`` False the
    first error stops the scan (n_errors == 1); otherwise bad lines are dropped and all are recorded.
    """
    p = _base(buf)
    n = buf.shape[0]
    fast_last = n - _FAST_SPAN  # last token start that may take the fast path
    pos = 0
    line = 0
    nrows = 0
    nnz = 0
    nerr = 0
    maxidx = 0
    base = 1 if one_based else 0
    # one bound for both the declared width and the int32 limit; the exact error is sorted out after
    # (indices have at most 18 digits, so no index reaches 1 << 62)
    lim = width if width >= 0 else 1 << 62
    if indices.itemsize == 4 and lim > 2147483647:
        lim = 2147483647
    state = np.zeros(2, np.int64)  # the fast path's back-off (see _pairs)
    while pos < n:
        line_start = pos
        code = OK
        col = 0
        # skip leading whitespace
        while pos < n and _is_space(p[pos]):
            pos += 1
        if pos >= n or _is_end(p[pos]):
            # blank or comment-only line
            while pos < n and p[pos] != _NL:
                pos += 1
            pos += 1
            line += 1
            continue
        row_nnz_start = nnz
        # label
        lab, p2, ok = _parse_number(p, pos, n)
        if not ok or not _token_end(p, p2, n):
            code = BAD_LABEL
            col = pos - line_start
        elif not math.isfinite(lab):
            code = BAD_LABEL
            col = pos - line_start
        elif not math.isfinite(np.float32(lab)):  # labels are stored as float32
            code = LABEL_BEYOND_FLOAT32
            col = pos - line_start
        elif use_pair and lab != label_lo and lab != label_hi:
            code = LABEL_NOT_IN_PAIR
            col = pos - line_start
        pos = p2
        prev = -1
        if code == OK:
            pos, nnz, prev = _fast_pairs(p, pos, fast_last, base, lim, indices, data, np.int64(nnz))
            if pos >= n or p[pos] != _NL:  # not the whole line: the general loop from where it stopped
                # (int64 casts: no second, literal-typed compilation of _pairs)
                pos, nnz, prev, code, col = _pairs(p, pos, n, fast_last, base, lim, width, np.int64(line_start),
                                                   indices, data, np.int64(nnz), np.int64(prev), state)
        # advance to the end of the line
        while pos < n and p[pos] != _NL:
            pos += 1
        pos += 1
        if code != OK:
            err_line[nerr] = line
            err_col[nerr] = col + 1
            err_code[nerr] = code
            nerr += 1
            nnz = row_nnz_start
            line += 1
            if not skip_invalid:
                return nrows, nnz, nerr, maxidx, line, 0
            continue
        if prev + 1 > maxidx:
            maxidx = prev + 1
        labels[nrows] = lab
        row_line[nrows] = line
        nrows += 1
        indptr[nrows] = nnz
        line += 1
    zeros = _count_zeros(data, nnz)
    if zeros:  # explicit zeros (rare): the rows close up over them
        nnz = _drop_zeros(indptr, indices, data, nrows)
    return nrows, nnz, nerr, maxidx, line, zeros


def line_chunks(f, size: int):
    """Yield consecutive pieces of a binary stream that each hold whole lines (the last may lack its final
    newline): the framing for parsing a stream chunk by chunk. A piece holds the lines whose first byte lies in
    [k·size, (k+1)·size) of the stream, the rule the byte ranges of an uncompressed file follow
    (``pipeline.ingest.read_owned_lines``), so a compressed copy of a file is cut into the same blocks."""
    buf, base, bound = b"", 0, size  # base: the stream offset of buf[0]; cut after the line holding byte bound-1
    while True:
        nl = buf.find(b"\n", bound - 1 - base) if base + len(buf) >= bound else -1
        if nl >= 0:
            yield buf[: nl + 1]
            base, buf = base + nl + 1, buf[nl + 1:]
            bound = (base // size + 1) * size
            continue
        piece = f.read(size)
        if not piece:
            if buf:
                yield buf
            return
        buf += piece


@dataclass
class Parsed:
    """CSR arrays of the rows parsed from one buffer; ``row_line`` and ``errors`` are buffer-local lines.

    With ``parse_buffer(..., column_stats=True)`` the ``stats_*`` fields hold the block's per-feature
    statistics of the accepted rows: feature ids ascending, int32 non-zero counts, float64 sums of squares
    added in row order; otherwise they are None.
    """

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    labels: np.ndarray
    row_line: np.ndarray
    errors: list  # (local_line 0-based, column 1-based, code)
    n_lines: int
    max_index: int  # largest 0-based index + 1 (0 when no features)
    stats_idx: np.ndarray | None = None  # feature ids present, ascending (int32 or int64 like indices)
    stats_nnz: np.ndarray | None = None  # int32 non-zero count per feature
    stats_sumsq: np.ndarray | None = None  # float64 sum of squares per feature, added in row order
    zeros: int = 0  # explicit zero values checked but not stored (``j:0``, a float32 underflow)

    @property
    def n_rows(self) -> int:
        return self.labels.shape[0]

    @property
    def nnz(self) -> int:
        return self.indices.shape[0]


_AHEAD = 32


@numba.njit(cache=True, nogil=True)
def relabel_ids(indices, to_int):
    """indices[k] <- to_int[indices[k]] where indices[k] < len(to_int) (a store's feature order,
    :mod:`pipeline.store.order`; the identity beyond), in place; returns the largest id + 1 after (0: no entries)."""
    n = to_int.shape[0]
    top = -1
    m = indices.shape[0]
    mp = _base(to_int)
    for k in range(m):
        if k + _AHEAD < m:  # the map is 66 MB at webspam width: fetch the lines of the coming ids
            a = indices[k + _AHEAD]
            if a < n:
                _prefetch(mp, a)
        j = indices[k]
        if j < n:
            j = to_int[j]
            indices[k] = j
        if j > top:
            top = j
    return top + 1


def parse_buffer(buf, *, zero_based=False, width=-1, skip_invalid=False, label_pair=None,
                 index_dtype=np.int64, value_dtype=np.float64, column_stats=False, reuse=False,
                 relabel=None) -> Parsed:
    """Parse whole LIBSVM lines held in ``buf`` (bytes, memoryview or a uint8 array).

    Output capacity comes from safe bounds instead of a counting pass: a pair needs >= 4 bytes
    ("j:v" plus a separator) and a row >= 2 bytes, so nnz <= n/4 + 1 and rows <= n/2 + 1. The arrays are
    allocated uninitialised (untouched pages cost no memory) and returned as views of the used part.
    ``column_stats`` adds the per-feature statistics of the accepted rows (see :class:`Parsed`).
    ``reuse``: the arrays are views of this thread's :mod:`pipeline.arena` buffers, valid until its next
    ``reuse`` parse (for a caller that writes each block before parsing the next).
    ``relabel`` (a store's feature order, :func:`pipeline.store.order.maps`' first map): the ids are renumbered
    after the lines are checked (errors name the input's ids); rows then keep their input order, not ascending ids,
    and ``max_index`` covers the renumbered ids too.
    """
    arr = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    n = arr.shape[0]
    cap_nnz, cap_rows = n // 4 + 1, n // 2 + 2
    indptr = arena.empty("libsvm.indptr", cap_rows + 1, np.int64, reuse)
    indptr[0] = 0
    indices = arena.empty("libsvm.indices", cap_nnz, index_dtype, reuse)
    data = arena.empty("libsvm.data", cap_nnz, value_dtype, reuse)
    labels = arena.empty("libsvm.labels", cap_rows, np.float64, reuse)
    row_line = arena.empty("libsvm.row_line", cap_rows, np.int64, reuse)
    err_line = np.empty(cap_rows if skip_invalid else 1, dtype=np.int64)
    err_col = np.empty_like(err_line)
    err_code = np.empty_like(err_line)
    lo, hi = (float(label_pair[0]), float(label_pair[1])) if label_pair else (0.0, 0.0)
    nrows, nnz, nerr, maxidx, nlines, zeros = parse_libsvm(
        arr, not zero_based, int(width), bool(skip_invalid), lo, hi, label_pair is not None,
        indptr, indices, data, labels, row_line, err_line, err_col, err_code)
    errors = [(int(err_line[k]), int(err_col[k]), int(err_code[k])) for k in range(nerr)]
    out = Parsed(indptr[: nrows + 1], indices[:nnz], data[:nnz], labels[:nrows], row_line[:nrows],
                 errors, int(nlines), int(maxidx), zeros=int(zeros))
    if column_stats:  # of the ascending input ids: the cache-blocked pass over the rows
        out.stats_idx, out.stats_nnz, out.stats_sumsq = colstats.column_stats(
            out.indptr, out.indices, out.data, out.max_index, reuse=reuse, ascending=True)
    if relabel is not None:
        out.max_index = max(out.max_index, int(relabel_ids(out.indices, relabel)))
        if column_stats:  # the block's statistics set renumbered and put back in feature order: ~a fifth of the
            # entries to move, where summing the renumbered rows (in any order) would move them all
            n = out.stats_idx.shape[0]
            relabel_ids(out.stats_idx, relabel)
            out.stats_idx, out.stats_nnz, out.stats_sumsq = colstats.column_stats(
                np.array([0, n], np.int64), out.stats_idx, out.stats_sumsq, out.max_index, counts=out.stats_nnz,
                count_dtype=out.stats_nnz.dtype, ascending=False)
    return out
