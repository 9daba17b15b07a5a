"""ℓ1-regularised dual averaging (Xiao 2010, enhanced ℓ1-RDA; ALGORITHMS.md §2 "what was measured").

With the running gradient sum G_t = Σ_{s≤t} g_s (ḡ_t = G_t/t) and λ_t = λ + γρ/√t:

    w_{t+1,j} = 0                                     if |ḡ_{t,j}| ≤ λ_t
    w_{t+1,j} = −(√t/γ)·(ḡ_{t,j} − λ_t·sign(ḡ_{t,j}))  otherwise                          (w_1 = 0)

w is a function of (G_j, t) only, so it is evaluated on demand for the row's coordinates: a row costs
O(nnz(x)) although the rule moves every coordinate. The bias (if fitted) is dual-averaged without ℓ1.

State: G float64[p] (gradient sums), istate int64[1] = [t], fstate float64[1] = [G_bias].
"""
import math

import numba

from .losses import dloss


@numba.njit(cache=True, nogil=True, inline="always")
def rda_weight(G, t, lam, gamma, rho):
    """w_{t+1} of one coordinate from its gradient sum G after t steps (0 for t = 0)."""
    if t == 0:
        return 0.0
    st = math.sqrt(t)
    gb = G / t
    lt = lam + gamma * rho / st
    if gb > lt:
        return -(st / gamma) * (gb - lt)
    if gb < -lt:
        return -(st / gamma) * (gb + lt)
    return 0.0


@numba.njit(cache=True, nogil=True)
def rda_block(indptr, indices, data, y, rows, G, istate, fstate, lam, gamma, rho, loss, hinge_at_one, fit_bias):
    """Advance ℓ1-RDA over ``rows`` of one CSR block (see module docstring)."""
    t = istate[0]
    Gb = fstate[0]
    for r in range(rows.shape[0]):
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        acc = 0.0
        for k in range(lo, hi):
            acc += rda_weight(G[indices[k]], t, lam, gamma, rho) * data[k]
        if fit_bias:
            acc += rda_weight(Gb, t, 0.0, gamma, 0.0)
        d = dloss(acc, y[i], loss, hinge_at_one)
        t += 1
        if d != 0.0:
            for k in range(lo, hi):
                G[indices[k]] += d * data[k]
            if fit_bias:
                Gb += d
    istate[0] = t
    fstate[0] = Gb


@numba.njit(cache=True, nogil=True)
def rda_weights(G, t, lam, gamma, rho, out):
    """Dense w_{t+1} from the gradient sums (for export/evaluation)."""
    for j in range(G.shape[0]):
        out[j] = rda_weight(G[j], t, lam, gamma, rho)
