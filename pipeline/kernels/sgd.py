"""SGD / Truncated Gradient kernels (ALGORITHMS.md §1), lazy so that a row costs O(nnz(row)).

Dense rule being implemented, for step t = 1, 2, ... (one row (x, y) per step, true weights u, bias b):

    f   = u·x + b                                   (score with the current, fully truncated weights)
    d   = ℓ'(f, y)                                  (losses.dloss, ALGORITHMS.md §0)
    u  ← (1 − η_t·l2)·u                             (optional weight decay, before the gradient step)
    u  ← u − η_t·d·x              (TG-1)            b ← b − η_t·d   (only if fit_bias; never decayed/truncated)
    u  ← T1(u, η_t·K·g, θ)        (TG-2, C-2)       only when t % K == 0 (applied to *every* coordinate)

with η_t = eta (schedule 0) or eta / t**power_t (schedule 1). g = 0 is plain SGD.

Lazy representation (exact, by the composition rule T1(T1(v,a,θ),b,θ) = T1(v,a+b,θ) of §0):

* true weights u = wscale·w, so the decay is the O(1) update wscale ← (1 − η_t·l2)·wscale;
* G = Σ (η_k·K·g / wscale_k) over the truncation steps k so far (gravity in *storage* units: since
  S(c·v, c·a) = c·S(v, a) for c > 0, truncating u by a equals truncating w by a / wscale);
* Gl[j] = the part of G already applied to w[j]; a coordinate is caught up (w[j] ← T1(w[j], G − Gl[j], θ'))
  just before it is read and right after its gradient step, so coordinates absent from the rows are never
  touched (bit-identical until ``tg_flush``);
* when wscale < FOLD_THRESHOLD the scale is folded back into w (one O(p) flush) to avoid underflow.

The truncation window is compared on the true weights: θ' = θ / wscale. With l2 = 0 (wscale ≡ 1) everything
is exact for any θ. With l2 > 0 it is exact only for θ = ∞: the window |u| ≤ θ does not commute with a
changing scale, so catch-up over several steps is then an approximation; ``check_tg_params`` rejects that
combination (the kernel itself raises nothing).

State layout (all mutated in place, nothing survives in locals between calls):
    w      float64[p]   scaled weights (true weights = wscale·w after catch-up)
    Gl     float64[p]   gravity already applied to each coordinate (storage units)
    istate int64[1]     [t]  number of updates done so far (t counts from 1 at the first update)
    fstate float64[3]   [G, wscale, bias]            (float64[4] [G, wscale, bias, n_bias] with AdaGrad)
    n      float64[p]   AdaGrad only: Σ_s g_{s,j}² per coordinate (``sgd_tg_ada_block``)

AdaGrad steps (ALGORITHMS.md §8, Duchi, Hazan & Singer 2011), ``sgd_tg_ada_block`` / ``tg_ada_flush``: the
global η_t is replaced per coordinate by η_{t,j} = η_t / (δ + √n_j(t)), n_j(t) = Σ_{s ≤ t} g_{s,j}², where
g_{s,j} = ℓ'(f_s, y_s)·x_{s,j} is the gradient of the loss only (the L2 decay keeps the global rate η_t, so
wscale is unchanged); the bias has its own accumulator n_b = Σ_s ℓ'(f_s, y_s)². Dense rule per step t:

    f = u·x + b ;  d = ℓ'(f, y) ;  n_j += (d·x_j)² on nz(x) ;  n_b += d²
    u ← (1 − η_t·l2)·u ;  u_j ← u_j − η_t/(δ + √n_j)·d·x_j ;  b ← b − η_t/(δ + √n_b)·d
    if t % K == 0:  u_j ← T1(u_j, η_t·K·g/(δ + √n_j), θ)     for *every* coordinate j (n_j of step t)

Lazy form (exact): G is unchanged (Σ η_k·K·g / wscale_k, no per-coordinate factor), and coordinate j owes
(G − Gl[j]) / (δ + √n_j) in storage units. This is exact because n_j changes only when j is touched, and a
touch settles j's debt first: between two touches every truncation step k applies η_k·K·g/(wscale_k·(δ + √n_j))
with the same n_j, whose sum is (G − Gl[j])/(δ + √n_j), and T1 composes (C-2). Order at a touch: catch up with
the OLD n_j, score, n_j += g², gradient step with the new n_j, this step's truncation with the new n_j
(G − Gl[j] is then this step's gravity only). ``_fold``/``tg_ada_flush`` use the same per-coordinate factor.
Cost per row stays O(nnz(row)).

One sweep applies a row's gradient step and its truncation (TG-2), coordinate by coordinate: each coordinate's
own order (step, then truncation) is the dense rule's because rows never repeat an index (the store guarantees
it: the parser refuses a repeated or decreasing feature index). With a repeated index the first occurrence would
be truncated before the second's step, and AdaGrad's per-entry accumulation would differ from the dense
g_j = d·Σx_j.
"""
import math

import numba
import numpy as np

from .intrinsics import base, prefetch
from .losses import HINGE, LOGISTIC, SQUARED, dloss  # noqa: F401  (codes re-exported for callers)

SCHEDULE_CONSTANT = 0
SCHEDULE_INVSCALING = 1
SCHEDULE_CODES = {"constant": SCHEDULE_CONSTANT, "invscaling": SCHEDULE_INVSCALING}


@numba.njit(cache=True, nogil=True, inline="always")
def step_size(eta, schedule, power_t, t):
    """η_t: ``eta`` (SCHEDULE_CONSTANT) or eta / t**power_t (SCHEDULE_INVSCALING), t counting from 1."""
    return eta / (float(t) ** power_t) if schedule == SCHEDULE_INVSCALING else eta


@numba.njit(cache=True, nogil=True, inline="always")
def bias_step(b, nb, e, d, bias_delta):
    """The bias's step b ← b − η_t·d, or its AdaGrad step (``bias_delta`` > 0: n_b += d², b ← b − η_t·d/(δ + √n_b));
    returns (b, n_b)."""
    if bias_delta > 0.0:
        nb += d * d
        return b - e * d / (bias_delta + math.sqrt(nb)), nb
    return b - e * d, nb


FOLD_THRESHOLD = 1e-9
"""Fold wscale back into w (O(p)) as soon as it drops below this value."""

PREFETCH_DISTANCE = 64
"""The catch-up sweep asks for w[j], Gl[j] (and n[j]) of the entry this many positions ahead in the row: at
webspam width (16.6M features) nearly every entry misses every cache twice (w and Gl), and the loads the core
keeps in flight on its own cover too few entries. Measured on 35k webspam-like rows (115M non-zeros, one
process, AMD EPYC): 50M non-zeros/s without, 62/72/80/90M with 8/16/32/64 ahead; 128 and more no better. A
hint only: the arithmetic, and so every weight, is unchanged."""


def new_tg_state(p, adagrad=False, bias_adagrad=False):
    """Fresh state arrays ``(w, Gl, istate, fstate)`` for ``p`` features (t = 0, G = 0, wscale = 1, bias = 0).

    With ``adagrad``: ``(w, Gl, n, istate, fstate)``, n = 0 and fstate = [G, wscale, bias, n_bias = 0]; with
    ``bias_adagrad`` alone fstate has the n_bias slot too.
    """
    w = np.zeros(p, dtype=np.float64)
    Gl = np.zeros(p, dtype=np.float64)
    istate = np.zeros(1, dtype=np.int64)
    if adagrad:
        return w, Gl, np.zeros(p, dtype=np.float64), istate, np.array([0.0, 1.0, 0.0, 0.0], dtype=np.float64)
    fstate = np.array([0.0, 1.0, 0.0] + [0.0] * bias_adagrad, dtype=np.float64)
    return w, Gl, istate, fstate


def check_tg_params(l2, theta, g, K, *, eta=None, schedule=None, power_t=None):
    """Validate TG hyper-parameters in Python before any kernel call; raise ValueError if invalid.

    Rejected: g < 0, K < 1 or non-integer K, theta < 0 or NaN, l2 < 0, non-finite g / l2, and l2 > 0 together
    with a finite theta (the lazy truncation is only exactly composable with the L2 scale for θ = ∞, see the
    module docstring). Optionally also checks eta > 0 and eta·l2 < 1 (so the decay factor 1 − η_t·l2 stays
    positive for every t, since η_t ≤ eta), schedule ∈ {0, 1} and power_t ≥ 0.
    """
    if isinstance(K, bool) or not float(K).is_integer():
        raise ValueError(f"K must be an integer >= 1, got {K!r}")
    if int(K) < 1:
        raise ValueError(f"K must be >= 1, got {K!r}")
    if not math.isfinite(g) or g < 0:
        raise ValueError(f"gravity g must be finite and >= 0, got {g!r}")
    if math.isnan(theta) or theta < 0:
        raise ValueError(f"theta must be >= 0 (inf allowed), got {theta!r}")
    if not math.isfinite(l2) or l2 < 0:
        raise ValueError(f"l2 must be finite and >= 0, got {l2!r}")
    if l2 > 0 and math.isfinite(theta):
        raise ValueError(
            "l2 > 0 with a finite theta is not supported: truncation with a window does not compose exactly "
            "with the L2 scale factor; use theta = inf or l2 = 0")
    if eta is not None:
        if not math.isfinite(eta) or eta <= 0:
            raise ValueError(f"eta must be finite and > 0, got {eta!r}")
        if eta * l2 >= 1.0:
            raise ValueError(f"eta * l2 must be < 1 (decay factor 1 - eta*l2 must stay > 0), got {eta * l2!r}")
    if schedule is not None and schedule not in (SCHEDULE_CONSTANT, SCHEDULE_INVSCALING):
        raise ValueError(f"schedule must be 0 (constant) or 1 (eta / t**power_t), got {schedule!r}")
    if power_t is not None and (not math.isfinite(power_t) or power_t < 0):
        raise ValueError(f"power_t must be finite and >= 0, got {power_t!r}")


@numba.njit(cache=True, nogil=True, inline="always")
def row_dot(w, indices, data, lo, hi):
    """w·x for the CSR row whose entries are indices/data[lo:hi] (same summation order as a plain loop), read
    through raw pointers (``intrinsics.base``: no negative-index wraparound at each access; C-contiguous arrays)."""
    wp = base(w)
    ip = base(indices)
    vp = base(data)
    acc = 0.0
    for k in range(lo, hi):
        acc += wp[ip[k]] * vp[k]
    return acc


@numba.njit(cache=True, nogil=True, inline="always")
def _soft(v, a):
    """(C-1) S(v, a) = sign(v)·max(|v| − a, 0) for a ≥ 0, computed branch-free as v − clip(v, −a, a).

    Bit-identical to the branchy form: v − a for v > a, v + a for v < −a, and an exact +0.0 when |v| ≤ a
    (v − v = +0.0 in round-to-nearest, also for v = −0.0). NaN propagates.
    """
    c = v
    if c > a:
        c = a
    if c < -a:
        c = -a
    return v - c


@numba.njit(cache=True, nogil=True, inline="always")
def _t1(v, a, theta):
    """(C-2) T1(v, a, θ) = S(v, a) if |v| ≤ θ else v (θ = ∞ gives S)."""
    if abs(v) <= theta:
        return _soft(v, a)
    return v


@numba.njit(cache=True, nogil=True, inline="always")
def _rate(n, j, delta):
    """AdaGrad's per-coordinate factor 1/(δ + √n_j) is applied as a division by this denominator."""
    return delta + math.sqrt(n[j])


@numba.njit(cache=True, nogil=True)
def _fold(w, Gl, n, G, wscale, theta, delta, ada, S=1, O=0):
    """Apply pending truncation (C-2) to every coordinate and multiply the scale in; O(p).

    The debt of coordinate j is G − Gl[j], divided by δ + √n_j when ``ada`` (``n``, ``delta`` unused otherwise).
    Afterwards w holds the true weights and Gl is all zero (the caller resets G = 0, wscale = 1). ``S``, ``O``: the
    layout of w and Gl (:func:`sgd_tg_block`'s ``stride``, ``goff``).
    """
    th = theta / wscale
    for j in range(w.shape[0] // S):
        v = w[S * j]
        pend = G - Gl[S * j + O]
        if pend != 0.0:
            if ada:
                pend = pend / _rate(n, j, delta)
            v = _t1(v, pend, th)
        w[S * j] = v * wscale
        Gl[S * j + O] = 0.0


@numba.njit(cache=True, nogil=True, inline="always")
def _tg_rows(indptr, indices, data, y, rows, w, Gl, n, istate, fstate, eta, schedule, power_t, l2, g, K, theta,
             delta, loss, hinge_at_one, fit_bias, ada, bias_delta, S, O):
    """The one TG loop behind ``sgd_tg_block`` (``ada`` = False) and ``sgd_tg_ada_block`` (``ada`` = True).

    Inlined into both with ``ada`` a literal, so the compiler drops the AdaGrad branches from the plain kernel
    (same arithmetic, same machine code as without them). See the two kernels for the rules. ``bias_delta`` > 0
    gives the bias alone an AdaGrad step (accumulator in fstate[3]); with ``ada`` the bias uses ``delta``. Coordinate
    j's weight is w[S·j], its applied gravity Gl[S·j + O] (S = 1, O = 0: two arrays; S = 2, O = 1: one interleaved).
    """
    t = istate[0]
    G = fstate[0]
    s = fstate[1]
    b = fstate[2]
    nb = 0.0
    if ada:
        bias_delta = delta
    bias_ada = bias_delta > 0.0
    if bias_ada:
        nb = fstate[3]
    Kg = K * g
    do_trunc = Kg > 0.0
    wp = base(w)
    gp = base(Gl)
    npt = base(n)
    for r in range(rows.shape[0]):
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        t += 1
        e = step_size(eta, schedule, power_t, t)
        th = theta / s
        trunc = do_trunc and t % K == 0  # (TG-2) at this step
        # catch up to step t-1 (pending lazy truncation, C-2; AdaGrad: with the OLD n_j) and score; each coordinate
        # then owes nothing (Gl_j = G), which a step that truncates records in its own sweep below
        acc = 0.0
        for k in range(lo, hi):
            if k + PREFETCH_DISTANCE < hi:
                jn = indices[k + PREFETCH_DISTANCE]
                prefetch(wp, S * jn)
                if S == 1:  # interleaved: Gl[2j + 1] shares w[2j]'s line
                    prefetch(gp, jn)
                if ada:
                    prefetch(npt, jn)
            j = indices[k]
            v = w[S * j]
            pend = G - Gl[S * j + O]
            owe = pend
            if ada:
                owe = pend / _rate(n, j, delta)
            vn = _t1(v, owe, th)
            v = vn if pend != 0.0 else v  # a select, not a branch: whether j owes is a coin flip per entry
            w[S * j] = v
            if not trunc:
                Gl[S * j + O] = G
            acc += v * data[k]
        f = s * acc + b
        d = dloss(f, y[i], loss, hinge_at_one)
        # weight decay: O(1) on the scale
        if l2 != 0.0:
            s *= 1.0 - e * l2
        # (TG-1) gradient step, in storage units (AdaGrad: n_j += (d·x_j)² first, then the new rate), and (TG-2) the
        # truncation of this step applied to the touched coordinates in the same sweep (each coordinate's own order:
        # step, then truncation; rows repeat no index), to the others lazily
        step = e * d / s
        owed = 0.0
        if trunc:
            G_caught = G  # every coordinate of the row is caught up to it: each owes G − G_caught
            G += e * Kg / s
            th = theta / s
            owed = G - G_caught
        for k in range(lo, hi):
            j = indices[k]
            dw = step * data[k]
            rj = 1.0
            if ada:
                gk = d * data[k]
                n[j] += gk * gk
                rj = _rate(n, j, delta)  # the new n_j's, for the step and the truncation
                dw = dw / rj
            v = w[S * j] - dw
            if trunc:
                a = owed
                if ada:
                    a = a / rj
                v = _t1(v, a, th)
                Gl[S * j + O] = G
            w[S * j] = v
        if fit_bias:
            b, nb = bias_step(b, nb, e, d, bias_delta)
        if s < FOLD_THRESHOLD:
            _fold(w, Gl, n, G, s, theta, delta, ada, S, O)
            G = 0.0
            s = 1.0
    istate[0] = t
    fstate[0] = G
    fstate[1] = s
    fstate[2] = b
    if bias_ada:
        fstate[3] = nb


@numba.njit(cache=True, nogil=True)
def sgd_tg_block(indptr, indices, data, y, rows, w, Gl, istate, fstate, eta, schedule, power_t, l2, g, K, theta,
                 loss, hinge_at_one, fit_bias, bias_delta=0.0, stride=1, goff=0):
    """Advance SGD / Truncated Gradient over the rows ``rows`` of one CSR block, lazily; cost O(Σ nnz(row)).

    Per step t: catch-up of the row's coordinates, f = wscale·(w·x) + b, d = ℓ'(f, y); decay
    wscale ← (1 − η_t·l2)·wscale; gradient step (TG-1) w_j ← w_j − (η_t·d / wscale)·x_j on nz(x) and
    b ← b − η_t·d if fit_bias; if g > 0 and t % K == 0: G ← G + η_t·K·g / wscale and the truncation (TG-2)
    with T1 (C-2) is applied to nz(x) now and to every other coordinate at its next use (or ``tg_flush``).

    Arguments: CSR block ``indptr`` (int64), ``indices`` (int32/int64), ``data`` (float32/float64), labels
    ``y`` (float64, per block row), ``rows`` (int64 block-row indices to visit, in order); state ``w``, ``Gl``
    (C-contiguous float64[p]: the catch-up sweep prefetches through their data pointers), ``istate`` = [t] (int64[1]), ``fstate`` = [G, wscale, bias] (float64[3]); scalars ``eta``,
    ``schedule`` (0: η_t = eta, 1: η_t = eta / t**power_t), ``power_t``, ``l2``, ``g``, ``K``, ``theta``
    (may be inf), ``loss`` (losses code), ``hinge_at_one``, ``fit_bias``. Feature indices must be < len(w).
    ``bias_delta`` > 0: AdaGrad for the bias alone, n_b ← n_b + d², b ← b − η_t·d / (bias_delta + √n_b), with
    ``fstate`` = [G, wscale, bias, n_b] (float64[4]); the weights keep the global rate.
    ``stride`` = 2, ``goff`` = 1: w and Gl are one interleaved float64[2p] array, passed as both (w_j at 2j, Gl_j at
    2j + 1: one cache line per coordinate instead of two; 35k webspam-like rows at 16.6M features: 84 -> 107-114M
    non-zeros/s, the same bits).
    """
    # n is never read without AdaGrad: Gl stands in for it (no allocation)
    _tg_rows(indptr, indices, data, y, rows, w, Gl, Gl, istate, fstate, eta, schedule, power_t, l2, g, K, theta,
             0.0, loss, hinge_at_one, fit_bias, False, bias_delta, stride, goff)


@numba.njit(cache=True, nogil=True)
def sgd_tg_ada_block(indptr, indices, data, y, rows, w, Gl, n, istate, fstate, eta, schedule, power_t, l2, g, K,
                     theta, delta, loss, hinge_at_one, fit_bias, stride=1, goff=0):
    """``sgd_tg_block`` with AdaGrad steps η_{t,j} = η_t / (δ + √n_j); cost O(Σ nnz(row)).

    How the per-coordinate step enters the cumulative gravity: G keeps summing η_t·K·g / wscale (no
    per-coordinate factor); coordinate j's debt G − Gl[j] is divided by δ + √n_j when it is applied. n_j only
    changes at a touch of j, so over an untouched interval every truncation step owed η_t·K·g/(δ + √n_j) with
    one n_j, and (G − Gl[j])/(δ + √n_j) is their exact sum (T1 composes, C-2). Per step t, for j ∈ nz(x):

        1. catch up:  w_j ← T1(w_j, (G − Gl[j]) / (δ + √n_j), θ/wscale), Gl[j] ← G      (OLD n_j)
        2. score:     f = wscale·(w·x) + b ;  d = ℓ'(f, y)
        3. decay:     wscale ← (1 − η_t·l2)·wscale                                       (global rate)
        4. n_j ← n_j + (d·x_j)² ;  w_j ← w_j − η_t·d·x_j / (wscale·(δ + √n_j))           (NEW n_j)
           bias:  n_b ← n_b + d² ;  b ← b − η_t·d / (δ + √n_b)
        5. if g > 0 and t % K == 0:  G ← G + η_t·K·g / wscale ;
           w_j ← T1(w_j, (G − Gl[j]) / (δ + √n_j), θ/wscale), Gl[j] ← G                 (NEW n_j)

    Untouched coordinates are settled at their next touch or by ``tg_ada_flush``. Arguments as
    ``sgd_tg_block``, plus ``n`` (C-contiguous float64[p], Σ g_j²) and ``delta`` (δ > 0); ``fstate`` = [G, wscale, bias,
    n_bias] (float64[4]); ``stride``, ``goff`` as there (n stays its own array).
    """
    _tg_rows(indptr, indices, data, y, rows, w, Gl, n, istate, fstate, eta, schedule, power_t, l2, g, K, theta,
             delta, loss, hinge_at_one, fit_bias, True, delta, stride, goff)


@numba.njit(cache=True, nogil=True)
def tg_flush(w, Gl, fstate, theta, stride=1, goff=0):
    """Apply all pending truncation (TG-2 / C-2) to every coordinate and fold wscale into w; O(p).

    Afterwards w holds the true weights, Gl[:] = 0, fstate[0] (G) = 0, fstate[1] (wscale) = 1; the bias and the
    step counter are unchanged. Idempotent. Call at pass ends and before any evaluation or export.
    """
    _fold(w, Gl, Gl, fstate[0], fstate[1], theta, 0.0, False, stride, goff)
    fstate[0] = 0.0
    fstate[1] = 1.0


@numba.njit(cache=True, nogil=True)
def tg_ada_flush(w, Gl, n, fstate, theta, delta, stride=1, goff=0):
    """``tg_flush`` for ``sgd_tg_ada_block``: coordinate j's pending gravity is (G − Gl[j]) / (δ + √n_j)."""
    _fold(w, Gl, n, fstate[0], fstate[1], theta, delta, True, stride, goff)
    fstate[0] = 0.0
    fstate[1] = 1.0


@numba.njit(cache=True, nogil=True)
def predict_block(indptr, indices, data, w, bias, out):
    """Scores f_i = bias + Σ_j w_j·x_ij (ALGORITHMS.md §0 "Prediction") for every row of a CSR block into out.

    Features with index j ≥ len(w) (a store wider than the model) contribute nothing. ``w`` must hold true
    weights (after ``tg_flush``), C-contiguous (prefetched PREFETCH_DISTANCE entries ahead, as in the training
    kernel; a hint past the end of ``w`` is harmless).
    """
    p = w.shape[0]
    wp = base(w)
    for i in range(indptr.shape[0] - 1):
        acc = 0.0
        hi = indptr[i + 1]
        for k in range(indptr[i], hi):
            if k + PREFETCH_DISTANCE < hi:
                prefetch(wp, indices[k + PREFETCH_DISTANCE])
            j = indices[k]
            if j < p:
                acc += w[j] * data[k]
        out[i] = bias + acc
