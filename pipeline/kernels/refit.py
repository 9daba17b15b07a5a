"""Refit of a selected support (relaxed lasso, ALGORITHMS.md §8): per-block kernels.

The refit minimises, over weights supported on S (sorted column ids, |S| = s) and a bias b,

    F(w, b) = (1/n) Σ_i ℓ(x_{i,S}·w + b, y_i) + (l2/2)·‖w‖²        (ℓ: losses.loss, logistic or squared)

by full-batch passes over the training blocks. A block is first *compacted* to S once (``compact_block``):
the same rows, only the entries whose column is in S, columns renumbered to their position 0..s-1 in S.
After that an evaluation (``loss_grad``) costs O(non-zeros of the block inside S), not O(block) nor O(width).

Membership and position: a bitmap of the width and the rank of each of its bytes (``support_index``, p/8 bytes
and p/2 bytes: 10 MB at 16.6M features, built once per worker and support) reject columns outside S in O(1) and
locate a hit in O(1): its position in S is its byte's rank plus the set bits below it in that byte.
"""
import numba
import numpy as np

from .intrinsics import base
from .losses import dloss, loss


_POP8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.int32)  # set bits of each byte value


@numba.njit(cache=True, nogil=True)
def support_index(support, n_features, like=np.zeros(0, np.int32)):
    """(bits, rank) of the sorted ``support`` at this width: bits uint8[(n_features + 7) // 8], bit j set iff column
    j is in S (ids >= n_features ignored); rank[same] of ``like``'s dtype (int32 below 2^31 features), the number
    of columns of S below 8·b for byte b (:func:`_position`)."""
    nb = (n_features + 7) // 8
    bits = np.zeros(nb, dtype=np.uint8)
    for k in range(support.shape[0]):
        j = support[k]
        if 0 <= j < n_features:
            bits[j >> 3] |= np.uint8(1 << (j & 7))
    rank = np.empty(nb, dtype=like.dtype)
    r = 0
    for b in range(nb):
        rank[b] = r
        r += _POP8[bits[b]]
    return bits, rank


@numba.njit(cache=True, nogil=True, inline="always")
def _slot(bits, nb8, j):
    """(1 if column j is in S else 0, j itself or 0 beyond the bitmap's width ``nb8``), without a branch: the second
    is a column whose byte may be read (compact_block reuses it for the position)."""
    inb = np.int64(j < nb8)
    jj = j * inb
    return inb & ((np.int64(bits[jj >> 3]) >> (jj & 7)) & 1), jj


@numba.njit(cache=True, nogil=True, inline="always")
def _member(bits, j):
    """1 if column j is in S, else 0 (also beyond the bitmap's width)."""
    return _slot(bits, bits.shape[0] * 8, j)[0]


@numba.njit(cache=True, nogil=True, inline="always")
def _position(bits, rank, j):
    """Index of column j in the sorted support (j is known to be in it): its byte's rank plus the bits set below
    it in that byte. (A binary search in S cost ~13 hard-to-predict branches per entry: compacting a 3.6M
    non-zero block to a 7k-column S took 100 ms.)"""
    return rank[j >> 3] + _POP8[bits[j >> 3] & ((1 << (j & 7)) - 1)]


def position_dtype(s: int) -> np.dtype:
    """The narrowest dtype of a column position in a support of ``s`` columns: uint16 up to 65,536 columns. The
    evaluation streams (position, value) pairs of every compacted block: 6 bytes instead of 8 made it 1.23x
    faster (350k webspam-like rows, stsgd's S of 5,753 columns: 47.5 -> 38.6 ms per 31M non-zeros, same sums)."""
    return np.dtype(np.uint16) if s <= 1 << 16 else np.dtype(np.int32)


@numba.njit(cache=True, nogil=True)
def compact_block(indptr, indices, data, bits, rank, like=np.zeros(0, np.int32)):
    """The block's rows restricted to the columns of S (``support_index``'s ``bits``, ``rank``), renumbered 0..s-1.

    Returns (cindptr int64[n_rows + 1], cidx[m] of ``like``'s dtype (see :func:`position_dtype`), cval like
    ``data``[m]); every row is kept (a row with no entry in S still scores the bias). Columns beyond the bitmap's
    width count as outside S.

    Branch-free: every entry is written at the next slot and the slot advances only for a column of S (whether an
    entry is in S is a coin flip for the predictor: 39% of the entries at 350k webspam-like rows, stsgd's S). An
    entry outside S reads rank[0] instead of its own rank. 62M -> 91M entries a second there (one core). Through raw
    pointers (no negative-index wraparound per access) 68-86M -> 139-163M (28M entries, 39% in a 7,047-column S).
    """
    n_rows = indptr.shape[0] - 1
    nb8 = bits.shape[0] * 8
    cindptr = np.zeros(n_rows + 1, dtype=np.int64)
    xp = base(indices)
    bp = base(bits)
    m = 0
    for k in range(indptr[0], indptr[n_rows]):
        m += _slot(bp, nb8, np.int64(xp[k]))[0]
    cidx = np.empty(m + 1, dtype=like.dtype)  # one slot more: the last entry may be written and not kept
    cval = np.empty(m + 1, dtype=data.dtype)
    dp, rp, pp, cp, vp = base(data), base(rank), base(_POP8), base(cidx), base(cval)
    m = 0
    for i in range(n_rows):
        for k in range(indptr[i], indptr[i + 1]):
            inside, jj = _slot(bp, nb8, np.int64(xp[k]))
            b = jj >> 3
            cp[m] = rp[b * inside] + pp[bp[b] & ((1 << (jj & 7)) - 1)]
            vp[m] = dp[k]
            m += inside
        cindptr[i + 1] = m
    return cindptr, cidx[:m], cval[:m]


@numba.njit(cache=True, nogil=True, inline="always")
def _dot(ip, vp, wp, lo, hi):
    """Σ_{k in lo..hi-1} w[idx[k]]·val[k] through raw pointers, in four partial sums (entries k ≡ 0, 1, 2, 3
    mod 4 from lo, the remainder in the first, added as (s0 + s1) + (s2 + s3)): one running sum is a chain of
    dependent additions, four keep the gathers in flight. A fixed order, so the same bits on every run."""
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    k = lo
    while k + 4 <= hi:
        s0 += wp[ip[k]] * vp[k]
        s1 += wp[ip[k + 1]] * vp[k + 1]
        s2 += wp[ip[k + 2]] * vp[k + 2]
        s3 += wp[ip[k + 3]] * vp[k + 3]
        k += 4
    while k < hi:
        s0 += wp[ip[k]] * vp[k]
        k += 1
    return (s0 + s1) + (s2 + s3)


@numba.njit(cache=True, nogil=True)
def loss_grad(cindptr, cidx, cval, y, w, bias, code, grad):
    """Sums over the block's rows: returns (Σ ℓ(f_i, y_i), Σ ℓ'(f_i, y_i), Σ ℓ(f_i, y_i)²) with f_i = x_{i,S}·w +
    bias, and writes Σ ℓ'(f_i, y_i)·x_{i,S} into ``grad`` (overwritten; float64[s]). ``code``: losses.LOGISTIC or
    SQUARED. (Σ ℓ² gives the standard error of a mean validation loss.) The entries are read through raw pointers:
    without the negative-index wraparound of array indexing the loop ran at 695M entries/s instead of 570-600M (a
    compacted block of 28M entries over 7,047 columns), and with :func:`_dot`'s four partial sums at 765-790M
    instead of 670-680M (30 blocks of 350k webspam-like rows compacted to stsgd's S of 7,047 columns)."""
    grad[:] = 0.0
    ip = base(cidx)
    vp = base(cval)
    wp = base(w)
    gp = base(grad)
    total = 0.0
    total_sq = 0.0
    gbias = 0.0
    for i in range(cindptr.shape[0] - 1):
        lo = cindptr[i]
        hi = cindptr[i + 1]
        f = bias + _dot(ip, vp, wp, lo, hi)
        ell = loss(f, y[i], code)
        total += ell
        total_sq += ell * ell
        d = dloss(f, y[i], code, False)
        gbias += d
        for k in range(lo, hi):
            gp[ip[k]] += d * vp[k]
    return total, gbias, total_sq


@numba.njit(cache=True, nogil=True)
def row_losses(cindptr, cidx, cval, y, W, biases, code, out):
    """out[i, c] = ℓ(x_{i,S}·W[:, c] + biases[c], y_i) for every row i of the block and every column c of W
    (float64[s, m], one model per column; ``out`` float64[rows, m]): the per-row validation losses that compare
    models on the same rows (paired differences)."""
    m = W.shape[1]
    f = np.empty(m, dtype=np.float64)
    for i in range(cindptr.shape[0] - 1):
        for c in range(m):
            f[c] = biases[c]
        for k in range(cindptr[i], cindptr[i + 1]):
            j = cidx[k]
            v = cval[k]
            for c in range(m):
                f[c] += W[j, c] * v
        for c in range(m):
            out[i, c] = loss(f[c], y[i], code)


@numba.njit(cache=True, nogil=True)
def restrict_columns(cindptr, cidx, cval, pos):
    """A compacted block restricted further to a subset W of S: the entries whose position p in S has
    ``pos[p]`` ≥ 0, renumbered to ``pos[p]`` (W's own positions 0..|W|-1; int32[s], −1 outside W), in the same
    order. Returns (indptr int64[n_rows + 1], idx of ``cidx``'s dtype, val). Summing over it is summing over the
    block with w = 0 outside W, to rounding (:func:`_dot` groups a row's terms by their place in the row, and the
    zeros no longer take places). Branch-free as :func:`compact_block`."""
    n_rows = cindptr.shape[0] - 1
    m = 0
    for k in range(cindptr[0], cindptr[n_rows]):
        m += pos[cidx[k]] >= 0
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    idx = np.empty(m + 1, dtype=cidx.dtype)  # one slot more: the last entry may be written and not kept
    val = np.empty(m + 1, dtype=cval.dtype)
    m = 0
    for i in range(n_rows):
        for k in range(cindptr[i], cindptr[i + 1]):
            q = pos[cidx[k]]
            idx[m] = q
            val[m] = cval[k]
            m += q >= 0
        indptr[i + 1] = m
    return indptr, idx[:m], val[:m]


@numba.njit(cache=True, nogil=True)
def take_rows(cindptr, cidx, cval, rows):
    """The sub-CSR of the given rows (int64, increasing): (indptr int64[len(rows) + 1], idx, val)."""
    m = 0
    for r in range(rows.shape[0]):
        m += cindptr[rows[r] + 1] - cindptr[rows[r]]
    indptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    idx = np.empty(m, dtype=cidx.dtype)
    val = np.empty(m, dtype=cval.dtype)
    m = 0
    for r in range(rows.shape[0]):
        for k in range(cindptr[rows[r]], cindptr[rows[r] + 1]):
            idx[m] = cidx[k]
            val[m] = cval[k]
            m += 1
        indptr[r + 1] = m
    return indptr, idx, val


@numba.njit(cache=True, nogil=True)
def full_gradient_block(indptr, indices, data, y, bits, rank, w, bias, code, acc):
    """Adds Σ_i ℓ'(f_i, y_i)·x_ij to acc[j] for every column j of the block (acc: float64[width], the full width),
    with f_i = x_{i,S}·w + bias (w on the sorted support, ``support_index``'s ``bits`` and ``rank``). The gradient
    outside S is what the KKT conditions of an L1 solve restricted to S are checked with."""
    for i in range(indptr.shape[0] - 1):
        f = bias
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            if _member(bits, j):
                f += w[_position(bits, rank, j)] * data[k]
        d = dloss(f, y[i], code, False)
        for k in range(indptr[i], indptr[i + 1]):
            acc[indices[k]] += d * data[k]
