"""Losses of ALGORITHMS.md §0 as numba scalar functions.

Codes: LOGISTIC = 0, HINGE = 1, SQUARED = 2, SQUARED_FULL = 3. ``dloss`` is ℓ'(f, y), the derivative with respect
to the score f, so the gradient with respect to w is ``dloss(f, y) * x``. Squared loss uses the ½ convention
(ℓ = ½(f − y)², ℓ' = f − y); TG's paper writes it without the ½ (ℓ = (f − y)², ℓ' = 2(f − y)): SQUARED_FULL,
which tg and sgd run with ``squared_half = false`` (ALGORITHMS.md §0).
"""
import math

import numba

LOGISTIC = 0
HINGE = 1
SQUARED = 2
SQUARED_FULL = 3  # (f − y)² without the ½: not a --loss name, the squared loss with squared_half = false

LOSS_CODES = {"logistic": LOGISTIC, "hinge": HINGE, "squared": SQUARED}


@numba.njit(cache=True, nogil=True, inline="always")
def loss(f, y, code):
    """ℓ(f, y); logistic in the stable form max(−m, 0) + log1p(exp(−|m|)) with m = y f."""
    if code == LOGISTIC:
        m = y * f
        return max(-m, 0.0) + math.log1p(math.exp(-abs(m)))
    if code == HINGE:
        return max(0.0, 1.0 - y * f)
    r = f - y
    return r * r if code == SQUARED_FULL else 0.5 * r * r


@numba.njit(cache=True, nogil=True, inline="always")
def dloss(f, y, code, hinge_at_one):
    """ℓ'(f, y): logistic −y·σ(−y f) (stable), hinge −y when y f < 1 (≤ 1 with hinge_at_one), squared f − y
    (2(f − y) for SQUARED_FULL)."""
    if code == LOGISTIC:
        m = y * f
        if m >= 0.0:
            e = math.exp(-m)
            return -y * e / (1.0 + e)
        return -y / (1.0 + math.exp(m))
    if code == HINGE:
        m = y * f
        if m < 1.0 or (hinge_at_one and m == 1.0):
            return -y
        return 0.0
    if code == SQUARED_FULL:
        return 2.0 * (f - y)
    return f - y
