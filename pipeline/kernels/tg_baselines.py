"""TG's two baselines (ALGORITHMS.md §1), ``--algo tg --set rule=rounding|subgradient``; plain loops, no L2.

(TG-3) rounding, ``ROUNDING``: ŵ = w_t − η_t·ℓ'(w_t·x_t, y_t)·x_t (TG-1), then every K steps w = T0(ŵ, θ) on every
coordinate (C-3: 0 if |v| ≤ θ). Lazily and exactly: T0 is idempotent and an untouched coordinate does not move, so
the rounding events a coordinate missed since its last rounding amount to one T0 at its next read. fstate[0] counts
the rounding events so far; Gl[j] the count when j was last rounded (j owes a rounding while Gl[j] < fstate[0]).
Cost per row O(nnz(row)). ``rounding_flush`` applies what is owed (before any mix, evaluation or export).

(TG-4) naive L1 subgradient, ``SUBGRADIENT``: w_{t+1} = w_t − η_t·ℓ'·x_t − η_t·g·sign(w_t) on every coordinate (the
sign of w_t, before the step), so a weight never reaches 0 exactly but oscillates within η_t·g of it; the reported
model is rounded with T0(·, θ) (pipeline.algorithms.sgd). Dense: O(p) per row, a baseline for small widths.

The bias: b ← b − η_t·ℓ' (or its AdaGrad step with ``bias_delta`` > 0, accumulator in fstate[3]), never rounded.
State layout as TG's (pipeline.kernels.sgd): istate [t], fstate [G, wscale (1), bias(, n_bias)].
"""

import numba

from .losses import dloss
from .sgd import bias_step, step_size

ROUNDING = 1
SUBGRADIENT = 2


@numba.njit(cache=True, nogil=True, inline="always")
def _t0(v, theta):
    """(C-3) T0(v, θ): 0 if |v| ≤ θ, else v."""
    return 0.0 if abs(v) <= theta else v


@numba.njit(cache=True, nogil=True)
def tg_baseline_block(indptr, indices, data, y, rows, w, Gl, istate, fstate, eta, schedule, power_t, g, K, theta,
                      rule, loss, hinge_at_one, fit_bias, bias_delta):
    """(TG-3) or (TG-4) over ``rows`` (see the module docstring); η_t = eta (schedule 0) or eta / t**power_t."""
    t = istate[0]
    G = fstate[0]
    b = fstate[2]
    nb = fstate[3] if bias_delta > 0.0 else 0.0
    p = w.shape[0]
    for r in range(rows.shape[0]):
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        t += 1
        e = step_size(eta, schedule, power_t, t)
        acc = 0.0
        for k in range(lo, hi):
            j = indices[k]
            if rule == ROUNDING and Gl[j] < G:  # a rounding event since j's last one
                w[j] = _t0(w[j], theta)
                Gl[j] = G
            acc += w[j] * data[k]
        d = dloss(acc + b, y[i], loss, hinge_at_one)
        if rule == SUBGRADIENT:
            eg = e * g
            for j in range(p):
                if w[j] > 0.0:
                    w[j] -= eg
                elif w[j] < 0.0:
                    w[j] += eg
        for k in range(lo, hi):
            w[indices[k]] -= e * d * data[k]
        if rule == ROUNDING and t % K == 0:
            G += 1.0
            for k in range(lo, hi):  # this step's rounding for the row's coordinates; the others owe it
                j = indices[k]
                w[j] = _t0(w[j], theta)
                Gl[j] = G
        if fit_bias:
            b, nb = bias_step(b, nb, e, d, bias_delta)
    istate[0] = t
    fstate[0] = G
    fstate[2] = b
    if bias_delta > 0.0:
        fstate[3] = nb


@numba.njit(cache=True, nogil=True)
def rounding_flush(w, Gl, fstate, theta):
    """Apply the rounding every coordinate owes (Gl[j] < G): w = T0(w, θ); then G = 0 and Gl = 0."""
    G = fstate[0]
    for j in range(w.shape[0]):
        if Gl[j] < G:
            w[j] = _t0(w[j], theta)
        Gl[j] = 0.0
    fstate[0] = 0.0
