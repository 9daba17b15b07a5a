"""LIBSVM / SVMlight text tokenizer: raw bytes -> CSR arrays, in numba.

The kernel walks a byte buffer that holds whole lines. Accepted syntax per line::

    <label> [qid:<int>] <index>:<value> ... [# comment]

Blank lines and comment-only lines are skipped; tabs and CR (CRLF line ends) are whitespace; the last
line may lack its newline; a row may have a label and no features. Values accept sign, decimals and
scientific notation. Every malformed line is reported as (line, column, error code); the caller turns
codes into messages with :data:`ERROR_MESSAGES` and adds the file name and absolute line number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

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
}

_POW10 = np.array([10.0**k for k in range(309)], dtype=np.float64)

_NL = 10
_CR = 13
_SP = 32
_TAB = 9
_HASH = 35
_COLON = 58


@numba.njit(cache=True, nogil=True, inline="always")
def _is_space(c):
    return c == _SP or c == _TAB or c == _CR


@numba.njit(cache=True, nogil=True, inline="always")
def _is_end(c):
    return c == _NL or c == _HASH


@numba.njit(cache=True, nogil=True, inline="always")
def _parse_number(buf, pos, hi):
    """Parse a decimal float at buf[pos:hi]; returns (value, end_pos, ok).

    Up to 18 significant digits go into an int64 mantissa, then one multiply or divide by an exact power
    of ten: the result is within an ulp of float64, far below the float32 the store keeps.
    ``inf``/``nan`` spellings parse (ok) so the caller can report them as non-finite, not as garbage.
    """
    neg = False
    c = buf[pos] if pos < hi else 0
    if c == 43 or c == 45:  # + -
        neg = c == 45
        pos += 1
        c = buf[pos] if pos < hi else 0
    lc = c | 32
    if lc == 105 or lc == 110:  # i / n : inf, infinity, nan
        start = pos
        while pos < hi and not _is_space(buf[pos]) and buf[pos] != _NL and buf[pos] != _COLON:
            pos += 1
        n = pos - start
        if lc == 110 and n == 3 and (buf[start + 1] | 32) == 97 and (buf[start + 2] | 32) == 110:
            return np.nan, pos, True
        if lc == 105 and (n == 3 or n == 8) and (buf[start + 1] | 32) == 110 and (buf[start + 2] | 32) == 102:
            return (-np.inf if neg else np.inf), pos, True
        return 0.0, pos, False
    mant = 0
    room = 18  # significant digits still accepted into the mantissa
    exp10 = 0
    start = pos
    while pos < hi:
        d = buf[pos] - 48
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
    if pos < hi and buf[pos] == 46:  # .
        pos += 1
        fstart = pos
        while pos < hi:
            d = buf[pos] - 48
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
    if pos < hi and (buf[pos] | 32) == 101:  # e / E
        pos += 1
        eneg = False
        if pos < hi and (buf[pos] == 43 or buf[pos] == 45):
            eneg = buf[pos] == 45
            pos += 1
        e = 0
        estart = pos
        while pos < hi:
            d = buf[pos] - 48
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
def parse_libsvm(buf, one_based, width, skip_invalid, label_lo, label_hi, use_pair,
                 indptr, indices, data, labels, row_line, err_line, err_col, err_code):
    """Tokenize whole LIBSVM lines in ``buf`` into preallocated CSR arrays.

    indptr[0] must be 0; indices are 0-based on output. ``width`` < 0 means no declared width.
    ``use_pair`` restricts labels to {label_lo, label_hi} (explicit binary encodings).
    Returns (n_rows, nnz, n_errors, max_index_plus_one, n_lines). With ``skip_invalid`` False the
    first error stops the scan (n_errors == 1); otherwise bad lines are dropped and all are recorded.
    """
    n = buf.shape[0]
    pos = 0
    line = 0
    nrows = 0
    nnz = 0
    nerr = 0
    maxidx = 0
    base = 1 if one_based else 0
    while pos < n:
        line_start = pos
        code = OK
        col = 0
        # skip leading whitespace
        while pos < n and _is_space(buf[pos]):
            pos += 1
        if pos >= n or _is_end(buf[pos]):
            # blank or comment-only line
            while pos < n and buf[pos] != _NL:
                pos += 1
            pos += 1
            line += 1
            continue
        row_nnz_start = nnz
        # label
        lab, p2, ok = _parse_number(buf, pos, n)
        if not ok or (p2 < n and not _is_space(buf[p2]) and not _is_end(buf[p2])):
            code = BAD_LABEL
            col = pos - line_start
        elif not math.isfinite(lab):
            code = BAD_LABEL
            col = pos - line_start
        elif use_pair and lab != label_lo and lab != label_hi:
            code = LABEL_NOT_IN_PAIR
            col = pos - line_start
        pos = p2
        prev = -1
        while code == OK:
            while pos < n and _is_space(buf[pos]):
                pos += 1
            if pos >= n or _is_end(buf[pos]):
                break
            tok = pos
            # qid:N is accepted and skipped
            if (pos + 3 < n and buf[pos] == 113 and buf[pos + 1] == 105 and buf[pos + 2] == 100
                    and buf[pos + 3] == _COLON):
                pos += 4
                q = pos
                while pos < n and buf[pos] >= 48 and buf[pos] <= 57:
                    pos += 1
                if pos == q or (pos < n and not _is_space(buf[pos]) and not _is_end(buf[pos])):
                    code = BAD_TOKEN
                    col = tok - line_start
                continue
            if buf[pos] == 45:
                code = NEGATIVE_INDEX
                col = tok - line_start
                break
            idx = 0
            nd = 0
            while pos < n and buf[pos] >= 48 and buf[pos] <= 57:
                if nd < 18:
                    idx = idx * 10 + (buf[pos] - 48)
                nd += 1
                pos += 1
            if nd == 0 or nd > 18 or pos >= n or buf[pos] != _COLON:
                code = BAD_TOKEN
                col = tok - line_start
                break
            pos += 1
            val, p2, ok = _parse_number(buf, pos, n)
            if not ok or (p2 < n and not _is_space(buf[p2]) and not _is_end(buf[p2])):
                code = BAD_TOKEN
                col = tok - line_start
                break
            pos = p2
            if idx < base:
                code = INDEX_ZERO
                col = tok - line_start
                break
            j = idx - base
            if j == prev:
                code = DUPLICATE
                col = tok - line_start
                break
            if j < prev:
                code = NON_INCREASING
                col = tok - line_start
                break
            if not math.isfinite(val):
                code = NON_FINITE
                col = tok - line_start
                break
            if width >= 0 and j >= width:
                code = BEYOND_WIDTH
                col = tok - line_start
                break
            if indices.itemsize == 4 and j > 2147483646:
                code = INDEX_TOO_LARGE
                col = tok - line_start
                break
            prev = j
            indices[nnz] = j
            data[nnz] = val
            nnz += 1
        # advance to the end of the line
        while pos < n and buf[pos] != _NL:
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
                return nrows, nnz, nerr, maxidx, line
            continue
        if prev + 1 > maxidx:
            maxidx = prev + 1
        labels[nrows] = lab
        row_line[nrows] = line
        nrows += 1
        indptr[nrows] = nnz
        line += 1
    return nrows, nnz, nerr, maxidx, line


def line_chunks(f, size: int):
    """Yield consecutive pieces of a binary stream of about ``size`` bytes that each hold whole lines
    (the last may lack its final newline): the framing for parsing a stream chunk by chunk."""
    carry = b""
    while True:
        piece = f.read(size)
        if not piece:
            if carry:
                yield carry
            return
        buf = carry + piece
        nl = buf.rfind(b"\n")
        if nl < 0:
            carry = buf
            continue
        yield buf[: nl + 1]
        carry = buf[nl + 1:]


@dataclass
class Parsed:
    """CSR arrays of the rows parsed from one buffer; ``row_line`` and ``errors`` are buffer-local lines."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    labels: np.ndarray
    row_line: np.ndarray
    errors: list  # (local_line 0-based, column 1-based, code)
    n_lines: int
    max_index: int  # largest 0-based index + 1 (0 when no features)

    @property
    def n_rows(self) -> int:
        return self.labels.shape[0]

    @property
    def nnz(self) -> int:
        return self.indices.shape[0]


def parse_buffer(buf, *, zero_based=False, width=-1, skip_invalid=False, label_pair=None,
                 index_dtype=np.int64, value_dtype=np.float64) -> Parsed:
    """Parse whole LIBSVM lines held in ``buf`` (bytes, memoryview or a uint8 array).

    Output capacity comes from safe bounds instead of a counting pass: a pair needs >= 4 bytes
    ("j:v" plus a separator) and a row >= 2 bytes, so nnz <= n/4 + 1 and rows <= n/2 + 1. The arrays are
    allocated uninitialised (untouched pages cost no memory) and returned as views of the used part.
    """
    arr = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    n = arr.shape[0]
    cap_nnz, cap_rows = n // 4 + 1, n // 2 + 2
    indptr = np.empty(cap_rows + 1, dtype=np.int64)
    indptr[0] = 0
    indices = np.empty(cap_nnz, dtype=index_dtype)
    data = np.empty(cap_nnz, dtype=value_dtype)
    labels = np.empty(cap_rows, dtype=np.float64)
    row_line = np.empty(cap_rows, dtype=np.int64)
    err_line = np.empty(cap_rows if skip_invalid else 1, dtype=np.int64)
    err_col = np.empty_like(err_line)
    err_code = np.empty_like(err_line)
    lo, hi = (float(label_pair[0]), float(label_pair[1])) if label_pair else (0.0, 0.0)
    nrows, nnz, nerr, maxidx, nlines = parse_libsvm(
        arr, not zero_based, int(width), bool(skip_invalid), lo, hi, label_pair is not None,
        indptr, indices, data, labels, row_line, err_line, err_col, err_code)
    errors = [(int(err_line[k]), int(err_col[k]), int(err_code[k])) for k in range(nerr)]
    return Parsed(indptr[: nrows + 1], indices[:nnz], data[:nnz], labels[:nrows], row_line[:nrows],
                  errors, int(nlines), int(maxidx))


_SCRATCH = {}


@numba.njit(cache=True, nogil=True)
def _column_stats(indices, data, scratch, touched):
    """Per-feature non-zero count and sum of squares of one block in O(nnz). ``scratch`` is float64[width, 2]
    (count, sum of squares side by side: one cache line per feature), zero on entry and handed back zeroed.
    Features come out in order of first appearance (deterministic)."""
    nt = 0
    for k in range(indices.shape[0]):
        j = indices[k]
        if scratch[j, 0] == 0.0:
            touched[nt] = j
            nt += 1
        v = np.float64(data[k])
        scratch[j, 0] += 1.0
        scratch[j, 1] += v * v
    out_idx = np.empty(nt, dtype=np.int64)
    out_cnt = np.empty(nt, dtype=np.int64)
    out_ss = np.empty(nt, dtype=np.float64)
    for t in range(nt):
        j = touched[t]
        out_idx[t] = j
        out_cnt[t] = np.int64(scratch[j, 0])
        out_ss[t] = scratch[j, 1]
        scratch[j, 0] = 0.0
        scratch[j, 1] = 0.0
    return out_idx, out_cnt, out_ss


def release_scratch() -> None:
    """Free this process's column-statistics scratch (float64[width, 2]; 266 MB at webspam width)."""
    _SCRATCH.clear()


def column_stats(indices: np.ndarray, data: np.ndarray, width: int):
    """(feature ids, non-zero counts, sums of squares) of the features present in one block."""
    if indices.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    sc = _SCRATCH.get("cols")
    if sc is None or sc.shape[0] < width:
        sc = np.zeros((width, 2), np.float64)
        _SCRATCH["cols"] = sc
    touched = np.empty(min(indices.shape[0], width), dtype=np.int64)
    return _column_stats(indices, data, sc, touched)


@numba.njit(cache=True, nogil=True)
def accumulate_column_stats(col_nnz, col_sumsq, idx, nnz, sumsq):
    """col_nnz[idx] += nnz; col_sumsq[idx] += sumsq (idx unique within one block's statistics)."""
    for t in range(idx.shape[0]):
        j = idx[t]
        col_nnz[j] += nnz[t]
        col_sumsq[j] += sumsq[t]
