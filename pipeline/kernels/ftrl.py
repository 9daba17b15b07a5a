"""FTRL-Proximal kernels (McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD 2013,
Algorithm 1; ALGORITHMS.md §8). Lazy by construction: a row costs O(nnz(row)).

Per coordinate i the state is (z_i, n_i), both starting at 0. The weight is never stored; it is the
closed form (McMahan eq. (2) solved per coordinate, Algorithm 1's first loop)

    w_i = 0                                                 if |z_i| <= l1       (exact zeros)
    w_i = −(z_i − sgn(z_i)·l1) / ((β + √n_i)/α + l2)         otherwise

and for a row (x, y), with the weights just computed from (z, n):

    f   = Σ_{i ∈ nz(x)} w_i x_i + b                          (b: the bias, below)
    d   = ℓ'(f, y)                                           (losses.dloss; for logistic with ±1 labels
                                                              this equals the paper's p − y, y ∈ {0, 1})
    g_i = d·x_i                                              for i ∈ nz(x)
    σ_i = (√(n_i + g_i²) − √n_i) / α                         (so Σ_s σ_s,i = √n_i/α = 1/η_t,i − β/α)
    z_i ← z_i + g_i − σ_i·w_i
    n_i ← n_i + g_i²

The per-coordinate learning rate is η_{t,i} = α/(β + √n_i). Coordinates absent from a row are not read or
written: since w_i depends only on (z_i, n_i), nothing is owed to them (no catch-up as in TG).

Bias: an unregularised extra coordinate with constant feature value 1 (like Vowpal Wabbit's constant
feature), updated by the same FTRL rule with l1 = l2 = 0: b = −z_b / ((β + √n_b)/α), g_b = d. Off with
``fit_bias = False`` (b = 0, z_b and n_b untouched).

State layout (all mutated in place; nothing survives in locals between calls, so a resume is exact):
    z      float64[p]   FTRL's z accumulators
    n      float64[p]   sums of squared gradients
    istate int64[1]     [t] number of rows processed (a counter; the rule itself does not use it)
    fstate float64[2]   [z_b, n_b] the bias coordinate's accumulators
:func:`ftrl_block` also takes z and n interleaved in one array (``S`` = 2, ``O`` = 1: z_j at 2j, n_j at 2j + 1, the
same array passed as both): a coordinate then costs one cache line instead of two (the algorithm's stage layout).
"""
import math

import numba
import numpy as np

from .intrinsics import base, prefetch
from .losses import dloss
from .sgd import PREFETCH_DISTANCE
from .splitmix import GOLDEN, MIX1, MIX2, mix64, unit


def new_ftrl_state(p):
    """Fresh state ``(z, n, istate, fstate)`` for ``p`` features (all zero: every weight is 0)."""
    return np.zeros(p, dtype=np.float64), np.zeros(p, dtype=np.float64), np.zeros(1, dtype=np.int64), \
        np.zeros(2, dtype=np.float64)


@numba.njit(cache=True, nogil=True, inline="always")
def ftrl_weight(z, n, alpha, beta, l1, l2):
    """The closed form: 0 if |z| <= l1, else −(z − sgn(z)·l1) / ((β + √n)/α + l2)."""
    if abs(z) <= l1:
        return 0.0
    s = l1 if z > 0.0 else -l1
    return -(z - s) / ((beta + math.sqrt(n)) / alpha + l2)


@numba.njit(cache=True, nogil=True, inline="always")
def ftrl_z_for(w, n, z_own, alpha, beta, l1, l2):
    """A z that the closed form maps to ``w`` given ``n`` (the inverse used by mix="w" and warm starts).

    For w ≠ 0 the closed form is invertible: sgn(z) = −sgn(w), |z| = |w|·((β + √n)/α + l2) + l1, i.e.
    z = −w·((β + √n)/α + l2) − sgn(w)·l1 (then |z| > l1, and the closed form gives back w up to rounding).
    For w = 0 every z in [−l1, l1] is consistent; we keep the one nearest to the path's own z (z_own clipped
    to [−l1, l1]) so evidence below the threshold is not thrown away.
    """
    if w == 0.0:
        if z_own > l1:
            return l1
        if z_own < -l1:
            return -l1
        return z_own
    s = l1 if w > 0.0 else -l1
    return -w * ((beta + math.sqrt(n)) / alpha + l2) - s


@numba.njit(cache=True, nogil=True, inline="always")
def uniform_hash(a, b, c):
    """A uniform number in [0, 1) from three integers (splitmix64's finaliser of a mix of them): the same draw on
    every executor and worker count, nothing carried in a generator's state."""
    return unit(mix64((np.uint64(a) * GOLDEN) ^ (np.uint64(b) * MIX1) ^ (np.uint64(c) * MIX2)))


@numba.njit(cache=True, nogil=True)
def round_to_grid(w, bits, salt, out):
    """McMahan et al.'s rounding for memory (§4.3): each w_j to a multiple of 2^-bits, up or down at random so
    that E[out_j] = w_j (the draw ``uniform_hash(salt, 0, j)``); a zero stays zero."""
    scale = 2.0 ** bits
    for j in range(w.shape[0]):
        v = w[j]
        out[j] = 0.0 if v == 0.0 else math.floor(v * scale + uniform_hash(salt, 0, j)) / scale


@numba.njit(cache=True, nogil=True)
def ftrl_block(indptr, indices, data, y, rows, z, n, istate, fstate, alpha, beta, l1, l2, loss, hinge_at_one,
               fit_bias, S=1, O=0, inclusion_p=1.0, salt=0):
    """Advance FTRL-Proximal (Algorithm 1 of McMahan et al. 2013, see the module docstring) over the rows
    ``rows`` of one CSR block; cost O(Σ nnz(row)).

    Arguments: CSR block ``indptr`` (int64), ``indices`` (int32/int64), ``data`` (float32/float64), labels
    ``y`` (per block row: ±1, or real for squared loss), ``rows`` (int64 block-row indices, in order); state
    ``z``, ``n`` (float64[p]), ``istate`` = [t] (int64[1]), ``fstate`` = [z_b, n_b] (float64[2]); scalars
    ``alpha`` > 0, ``beta`` >= 0, ``l1``, ``l2`` >= 0, ``loss`` (losses code), ``hinge_at_one``, ``fit_bias``.
    Coordinate j's z is z[S·j] and its n is n[S·j + O] (S = 1, O = 0: two arrays; S = 2, O = 1: one interleaved
    array passed as both). ``inclusion_p`` < 1: McMahan et al.'s Poisson inclusion (§4.2), a coordinate not yet in
    the model (z_j = n_j = 0) takes a row's update only with probability ``inclusion_p`` (the draw
    ``uniform_hash(salt, t, j)``). Feature indices must be < p and unique within a row. A scratch buffer of the longest
    row's length (allocated once, before the row loop) keeps each row's weights between the score and the update.
    The score sweep prefetches the coordinate PREFETCH_DISTANCE entries ahead (a hint: the same arithmetic). Both
    sweeps read and write through raw pointers (``base``: no negative-index wraparound at each access): 35k webspam-like
    rows at full width, `train --algo ftrl --workers 2`, kernel 60.7-67.5M -> 67.8-76.6M non-zeros/s, the same bits.
    """
    longest = 0
    for r in range(rows.shape[0]):
        i = rows[r]
        ln = indptr[i + 1] - indptr[i]
        if ln > longest:
            longest = ln
    wrow = np.empty(longest, dtype=np.float64)
    t = istate[0]
    zb = fstate[0]
    nb = fstate[1]
    zp = base(z)
    npt = base(n)
    ip = base(indices)
    vp = base(data)
    wp = base(wrow)
    for r in range(rows.shape[0]):
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        t += 1
        acc = 0.0
        for k in range(lo, hi):
            if k + PREFETCH_DISTANCE < hi:
                jn = ip[k + PREFETCH_DISTANCE]
                prefetch(zp, S * jn)
                if S == 1:  # interleaved: n_j shares z_j's line
                    prefetch(npt, jn)
            j = ip[k]
            wj = ftrl_weight(zp[S * j], npt[S * j + O], alpha, beta, l1, l2)
            wp[k - lo] = wj
            acc += wj * vp[k]
        b = 0.0
        if fit_bias:
            b = ftrl_weight(zb, nb, alpha, beta, 0.0, 0.0)
        d = dloss(acc + b, y[i], loss, hinge_at_one)
        if d == 0.0:
            continue  # g = 0: σ = 0, z and n unchanged
        for k in range(lo, hi):
            j = ip[k]
            g = d * vp[k]
            ni = npt[S * j + O]
            if inclusion_p < 1.0 and ni == 0.0 and zp[S * j] == 0.0 and uniform_hash(salt, t, j) >= inclusion_p:
                continue  # not in the model yet, and not let in by this row
            nn = ni + g * g
            sigma = (math.sqrt(nn) - math.sqrt(ni)) / alpha
            zp[S * j] = zp[S * j] + g - sigma * wp[k - lo]
            npt[S * j + O] = nn
        if fit_bias:
            nn = nb + d * d
            sigma = (math.sqrt(nn) - math.sqrt(nb)) / alpha
            zb = zb + d - sigma * b
            nb = nn
    istate[0] = t
    fstate[0] = zb
    fstate[1] = nb


@numba.njit(cache=True, nogil=True)
def ftrl_weights(z, n, alpha, beta, l1, l2, out):
    """out[i] = the closed-form weight of (z[i], n[i]) for every coordinate (exact zeros); returns nnz. O(p)."""
    nnz = 0
    for i in range(z.shape[0]):
        w = ftrl_weight(z[i], n[i], alpha, beta, l1, l2)
        out[i] = w
        if w != 0.0:
            nnz += 1
    return nnz


@numba.njit(cache=True, nogil=True)
def ftrl_nnz(z, n, alpha, beta, l1, l2):
    """Number of non-zero closed-form weights, without materialising them. O(p), no allocation."""
    nnz = 0
    for i in range(z.shape[0]):
        if ftrl_weight(z[i], n[i], alpha, beta, l1, l2) != 0.0:
            nnz += 1
    return nnz


@numba.njit(cache=True, nogil=True)
def ftrl_z_from_weights(w, n, z_own, alpha, beta, l1, l2, out):
    """out[i] = ``ftrl_z_for(w[i], n[i], z_own[i], ...)`` (the inverse of the closed form); ``out`` may be
    ``z_own`` itself. Coordinates beyond len(w) get w = 0. O(p)."""
    pw = w.shape[0]
    for i in range(out.shape[0]):
        wi = w[i] if i < pw else 0.0
        out[i] = ftrl_z_for(wi, n[i], z_own[i], alpha, beta, l1, l2)
