"""Kernels of the ECML 2010 study (ALGORITHMS.md §5): the soft-thresholded perceptron and its baselines.

* ``nssl_block``   — (E-1)–(E-3): perceptron step only when y·w·x ≤ τ, then S(·, a) on the touched weights;
* ``smidas_block`` — (E-4)–(E-6): p-norm link mirror descent, soft threshold of the dual θ over its active
  list, link evaluated stably with M = max|θ|, w·x by plain left-to-right float64 summation;
* ``scd_steps``    — (E-7)–(E-9): stochastic coordinate descent over CSC columns with cached margins z and a
  per-coordinate curvature bound β_j (``column_curvature``: β·mean_i x_ij², or the paper's constant β);
* ``grades_block`` — the block part of (E-10): g += X_bᵀ(y_b − X_b w), Ψ += ½‖y_b − X_b w‖².

All kernels mutate their state arrays in place and allocate nothing in the row loop.
"""
import math

import numba
import numpy as np

from .losses import dloss, loss as loss_value
from .sgd import _soft, row_dot


# ------------------------------------------------------------------------------------------- nssl

@numba.njit(cache=True, nogil=True)
def nssl_block(indptr, indices, data, y, rows, w, istate, eta, tau, shrink, max_nnz):
    """Soft-thresholded perceptron (E-1)–(E-3) over ``rows`` of one CSR block; returns rows consumed.

    Per row: z = y·(w·x) with w before the update; if z ≤ τ: w_j ← S(w_j + η·y·x_j, shrink) for j ∈ nz(x)
    (``shrink`` is λ or ηλ, chosen by the caller). ``istate`` = [updates, nnz(w), rows seen] (int64[3]).
    Stops (returns r < len(rows)) before the first row at which nnz(w) ≥ ``max_nnz`` (density bound s).
    """
    t = istate[0]
    nnz = istate[1]
    seen = istate[2]
    n = rows.shape[0]
    consumed = n
    for r in range(n):
        if nnz >= max_nnz:
            consumed = r
            break
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        acc = row_dot(w, indices, data, lo, hi)
        seen += 1
        yi = y[i]
        if yi * acc <= tau:                                 # (E-1) margin gate
            t += 1
            step = eta * yi
            for k in range(lo, hi):
                j = indices[k]
                old = w[j]
                v = _soft(old + step * data[k], shrink)     # (E-2) then (E-3)
                w[j] = v
                if old == 0.0:
                    if v != 0.0:
                        nnz += 1
                elif v == 0.0:
                    nnz -= 1
    istate[0] = t
    istate[1] = nnz
    istate[2] = seen
    return consumed


# ------------------------------------------------------------------------------------------- SMIDAS

@numba.njit(cache=True, nogil=True, inline="always")
def _link(th, M, pm1, den):
    """(E-6) evaluated stably: sign(θ)·M·(|θ|/M)^(p−1) / den, den = (Σ(|θ_l|/M)^p)^((p−2)/p)."""
    v = M * (abs(th) / M) ** pm1 / den
    return v if th > 0 else -v


@numba.njit(cache=True, nogil=True)
def smidas_norm(theta, active, n_active, p, fstate):
    """fstate ← [M, S] with M = max|θ_j|, S = Σ (|θ_j|/M)^p over active[:n_active] (in list order)."""
    M = 0.0
    for u in range(n_active):
        a = abs(theta[active[u]])
        if a > M:
            M = a
    fstate[0] = M
    fstate[1] = _power_sum(theta, active, n_active, M, p)


@numba.njit(cache=True, nogil=True, inline="always")
def _power_sum(theta, active, n_active, M, p):
    """S = Σ_u (|θ_{active[u]}|/M)^p in list order (0 when M = 0): the scaled p-norm of (E-6)."""
    S = 0.0
    if M > 0.0:
        for u in range(n_active):
            S += (abs(theta[active[u]]) / M) ** p
    return S


@numba.njit(cache=True, nogil=True)
def smidas_block(indptr, indices, data, y, rows, theta, active, istate, fstate, eta, lam, p, loss, hinge_at_one):
    """SMIDAS (E-4)–(E-6) over ``rows`` of one CSR block.

    State: ``theta`` float64[d] (dual vector), ``active`` int64[d] (active[:n] = the non-zero θ, in insertion
    order), ``istate`` = [n_active, t], ``fstate`` = [M, S] (see ``smidas_norm``; kept current after every
    step). Per step: f = Σ_j w_j x_j with w_j from (E-6) (plain left-to-right float64 sum), v = ℓ'(f, y)·x,
    θ ← θ − ηv, then θ_j ← S(θ_j, ηλ) over the active list (compacted in place), then M, S recomputed.
    """
    na = istate[0]
    t = istate[1]
    M = fstate[0]
    S = fstate[1]
    pm1 = p - 1.0
    ex = (p - 2.0) / p
    a = eta * lam
    for r in range(rows.shape[0]):
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        acc = 0.0
        if M > 0.0:
            den = S ** ex
            for k in range(lo, hi):
                th = theta[indices[k]]
                if th != 0.0:
                    acc += _link(th, M, pm1, den) * data[k]
        d = dloss(acc, y[i], loss, hinge_at_one)
        t += 1
        if d != 0.0:                                        # (E-4), first half of (E-5)
            step = eta * d
            for k in range(lo, hi):
                j = indices[k]
                old = theta[j]
                nv = old - step * data[k]
                theta[j] = nv
                if old == 0.0 and nv != 0.0:
                    active[na] = j
                    na += 1
        q = 0                                               # (E-5) shrink, compact, max
        M = 0.0
        for u in range(na):
            j = active[u]
            v = _soft(theta[j], a)
            theta[j] = v
            if v != 0.0:
                active[q] = j
                q += 1
                av = abs(v)
                if av > M:
                    M = av
        na = q
        S = _power_sum(theta, active, na, M, p)
    istate[0] = na
    istate[1] = t
    fstate[0] = M
    fstate[1] = S


@numba.njit(cache=True, nogil=True)
def smidas_weights(theta, p, out):
    """w = f⁻¹(θ) (E-6) for every coordinate, stably (M = max|θ|); entries may underflow to exact 0."""
    M = 0.0
    for j in range(theta.shape[0]):
        a = abs(theta[j])
        if a > M:
            M = a
    for j in range(theta.shape[0]):
        out[j] = 0.0
    if M == 0.0:
        return
    S = 0.0
    for j in range(theta.shape[0]):
        if theta[j] != 0.0:
            S += (abs(theta[j]) / M) ** p
    den = S ** ((p - 2.0) / p)
    for j in range(theta.shape[0]):
        if theta[j] != 0.0:
            out[j] = _link(theta[j], M, p - 1.0, den)


# ------------------------------------------------------------------------------------------- SCD

@numba.njit(cache=True, nogil=True)
def scd_steps(cindptr, rowidx, cdata, y, z, w, coords, beta, lam, loss):
    """Stochastic coordinate descent (E-7)–(E-9) for each coordinate in ``coords`` (CSC columns).

    g_j = (1/m)·Σ_{i ∈ col j} ℓ'(z_i, y_i)·x_ij;  w_j ← S(w_j − g_j/β_j, λ/β_j);  z_i += Δ·x_ij on the column.
    ``z`` (float64[m]) are the cached margins Xw; ``beta`` (float64[d]) is a per-coordinate curvature bound
    β_j ≥ ∂²/∂w_j² of the mean loss: the paper's constant 1/4 (logistic) or 1 (squared) for every j, or
    that constant times (1/m)·Σ_i x_ij² (``column_curvature``). A column with β_j = 0 is empty: the loss does
    not depend on w_j, whose minimiser is 0 (λ > 0) or anything (λ = 0, w_j is left as it is).
    """
    m = z.shape[0]
    inv_m = 1.0 / m
    for s in range(coords.shape[0]):
        j = coords[s]
        lo = cindptr[j]
        hi = cindptr[j + 1]
        bj = beta[j]
        old = w[j]
        if bj <= 0.0:
            if lam > 0.0 and old != 0.0:
                w[j] = 0.0
            continue
        g = 0.0
        for k in range(lo, hi):
            i = rowidx[k]
            g += dloss(z[i], y[i], loss, False) * cdata[k]
        g *= inv_m
        new = _soft(old - g / bj, lam / bj)
        delta = new - old
        if delta != 0.0:
            w[j] = new
            for k in range(lo, hi):
                z[rowidx[k]] += delta * cdata[k]


@numba.njit(cache=True, nogil=True)
def column_curvature(cindptr, cdata, m, beta, out):
    """out[j] = β·(1/m)·Σ_i x_ij² over the CSC columns: the exact coordinate-wise Lipschitz constant of the
    gradient of (1/m)Σℓ(w·x_i, y_i) when ℓ'' ≤ β (a tighter bound than the paper's β whenever |x_ij| ≤ 1)."""
    inv_m = 1.0 / max(1, m)
    for j in range(cindptr.shape[0] - 1):
        acc = 0.0
        for k in range(cindptr[j], cindptr[j + 1]):
            acc += cdata[k] * cdata[k]
        out[j] = beta * acc * inv_m


@numba.njit(cache=True, nogil=True)
def mean_loss(z, y, loss):
    """(1/m)·Σ ℓ(z_i, y_i)."""
    acc = 0.0
    for i in range(z.shape[0]):
        acc += loss_value(z[i], y[i], loss)
    return acc / max(1, z.shape[0])


# ------------------------------------------------------------------------------------------- GraDes

@numba.njit(cache=True, nogil=True)
def grades_block(indptr, indices, data, y, rows, w, g, fstate):
    """Accumulate the full-batch quantities of (E-10) over ``rows``: g += X_bᵀ(y_b − X_b w),
    fstate[0] += ½‖y_b − X_b w‖² (the potential Ψ(w) of the current iterate)."""
    psi = fstate[0]
    for r in range(rows.shape[0]):
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        acc = row_dot(w, indices, data, lo, hi)
        res = y[i] - acc
        psi += 0.5 * res * res
        for k in range(lo, hi):
            g[indices[k]] += res * data[k]
    fstate[0] = psi


def hard_threshold(v: np.ndarray, s: int) -> np.ndarray:
    """(C-4) H(v, s): keep the s entries of largest |v_j| (ties by lower index), zero the rest."""
    if s >= v.shape[0]:
        return v.copy()
    keep = np.argsort(-np.abs(v), kind="stable")[:s]
    out = np.zeros_like(v)
    out[keep] = v[keep]
    return out


def exponent_stats(w: np.ndarray) -> dict:
    """Binary exponents of the non-zero weights (frexp): the paper's Table 3 columns (ALGORITHMS.md §5.2)."""
    nz = w[w != 0]
    if nz.size == 0:
        return {"nnz": 0, "within52": math.nan, "mean": math.nan, "sd": math.nan, "e_max": 0, "e_min": 0}
    e = np.frexp(nz)[1].astype(np.int64)
    emax = int(e.max())
    return {"nnz": int(nz.size), "within52": float(np.mean(e >= emax - 51)), "mean": float(e.mean()),
            "sd": float(e.std()), "e_max": emax, "e_min": int(e.min())}
