"""Stabilized Truncated SGD (STSGD) burst kernel — ALGORITHMS.md §2, (ST-1)–(ST-5), (ST-9) ratios.

One call advances ONE path over one CSR block (rows visited in the order given by ``rows``).
Everything that must survive the call lives in the arrays passed in and is mutated in place, so a
burst or a stage may span any number of calls and blocks, and the path is resumable at every row
boundary: splitting ``rows`` anywhere (mid-burst included) gives bit-identical state to one call.

Per-path state (allocate with :func:`new_path_state`)
------------------------------------------------------
All per-feature values of one path live in ONE record of 32 bytes, so the row loop and the burst close
touch one cache line per non-zero (two features share a 64-byte line):

=============  ===========================  ========================================================
array          dtype / shape                meaning
=============  ===========================  ========================================================
``rec``        float64[p, 4]                per-feature record; float64 columns R_W = 0 (w^(m)_j) and
                                            R_WSTART = 1 (w_j at the first touch of j in the open
                                            burst, written only when ratios are recorded or in
                                            quantile mode, which it feeds; stale outside a burst; in
                                            quantile mode the burst's ratio r_j; Gl_j in uniform
                                            mode, see stsgd_block); columns 2-3 hold four int32 read through
                                            ``irec = int_view(rec)`` (int32[p, 8], same memory):
  ``irec[:, 4]``  int32  (RI_KT)            k̃_j of the open burst (ST-3), 0 between bursts;
                                            −1 = purged (not in Ω, skipped everywhere, ST-8)
  ``irec[:, 5]``  int32  (RI_EVID)          c: bursts of this stage in which j had evidence (k̃>0)
  ``irec[:, 6]``  int32  (RI_SURV)          b: bursts of this stage with evidence and ŵ_j ≠ 0 after
                                            truncation
  ``irec[:, 7]``  int32  (RI_UPD)           κ: Σ k̃_j over the bursts of this stage (≤ the rows of
                                            one pass: stages never cross a pass boundary)
``touched``    int32[cap_t]                 features with k̃_j > 0 in the open burst, first-touch
                                            order (unused with the lazy close of :func:`stsgd_block`,
                                            where k̃_j > 0 may also be a closed burst's until j is read
                                            again); fill count istate[I_NTOUCHED]. cap_t must be ≥ the
                                            number of distinct alive features a burst can touch
                                            (p is always enough; K·max row nnz also); overflow raises
``istate``     int64[ISTATE_SIZE]           see I_* below
``fstate``     float64[FSTATE_SIZE]         see F_* below
``ratios``     float64[cap_r, 2]            (ST-9) movement ratios of this stage: column 0 = feature
                                            id (exact in float64 below 2^53), column 1 =
                                            r = |w_end,j − w_start,j| / k̃_j (pre-truncation).
                                            Fill count istate[I_NRATIOS]. When more than cap_r ratios
                                            are produced in a stage, the buffer becomes a uniform
                                            reservoir sample (Algorithm R, deterministic RNG in
                                            istate[I_RNG]); istate[I_RATIOS_SEEN] counts all.
                                            cap_r = 0: no ratio is computed or recorded (for a
                                            gravity that does not read them); the weights are the
                                            same.
=============  ===========================  ========================================================

:func:`views` gives the column views (w, w_start, kt, cnt_evid, cnt_surv, cnt_upd) and a copy of
``alive`` (kt ≥ 0); :func:`purge_features` marks features purged. The record replaces separate arrays
(w, w_start, alive, kt and three int64 counters: up to 5 cache lines per non-zero) for speed only; the
arithmetic, and so every result, is unchanged.

istate slots: I_T per-path update count t (lifetime; one per row drawn, used by η_t = η/√t);
I_POS updates done in the open burst (0 ≤ pos < K between calls); I_NTOUCHED fill of ``touched``;
I_STAGE_BURSTS bursts completed in the current stage (the kernel stops when it reaches
``max_bursts``); I_BURSTS bursts completed (lifetime); I_NRATIOS fill of ``ratios``;
I_RATIOS_SEEN ratios produced this stage; I_RNG reservoir RNG state (splitmix64, any seed).

fstate slots: F_BIAS the (unregularised, never truncated) bias; F_G0_LAST the base gravity used at
the last truncation (g0, or the per-burst quantile in ``quantile_first_burst`` mode);
F_LOSS_SUM Σ ℓ(f_t, y_t) evaluated before each update (progressive training loss, lifetime).

Stage start (engine / driver): :func:`reset_stage` zeroes the three counters, the ratio fill counts
and I_STAGE_BURSTS (the driver zeroes the counters in its ``apply``, where it copies the record anyway).
With ``n_K`` > 0 a stage ends at a burst boundary (the kernel returns right after the burst that reaches
``max_bursts``); with ``n_K`` = 0 (the default) it ends with the pass or its ``--stage-blocks``, inside a burst,
and :func:`stsgd_end_stage` closes that open burst as a partial one (amount g0·updates in it, [R] in
pipeline.algorithms.stsgd) and every burst whose close was deferred: all gravity is applied before purging
(ST-8) or changing K (ST-12).

Choices made here (documented interpretations)
-----------------------------------------------
* Truncation modes: ``TRUNC_INFORMATIVE`` S(w_j, g0·k̃_j) on the burst's touched coordinates (ST-4, the paper);
  ``TRUNC_TOUCHED`` TG's amount g0·K on the touched coordinates only (untouched weights are not shrunk, unlike
  dense TG); ``TRUNC_UNIFORM`` (the default) every alive coordinate loses g0 per update, lazily (TG's rule).
  For a partial burst closed with :func:`stsgd_close_burst` the amount is g0·(updates in burst).
* Every row drawn is one update (t and the burst position advance even for a row with no alive
  feature). With ``count_violations_only`` (R hinge code) rows whose ℓ' is 0 are not counted in k̃
  (they change nothing in w either).
* ``quantile_first_burst`` ([R] in ST-9, stage 1 without g0_init): the burst's own ratios are
  selected in place (quickselect on ``touched``) and g = r_(⌈βn⌉) of its n ratios (0 if β = 0);
  then every touched j is truncated by S(w_j, g·k̃_j) (or g·K when not informative). Because
  g·k̃_j is rounded, the feature sitting exactly at the quantile may survive by one ulp.
* Reservoir sampling keeps memory bounded for long stages; the (ST-9) quantile is then computed on
  a uniform sample of the stage's ratios (exact while I_RATIOS_SEEN ≤ cap_r).
"""
import math

import numba
import numpy as np

from .intrinsics import base, prefetch, zeros_aligned
from .losses import dloss, loss as loss_fn
from .sgd import PREFETCH_DISTANCE, _soft  # (C-1) S(v, a), branch-free: min/max instead of unpredictable branches
from .splitmix import splitmix64, unit

# istate layout
I_T = 0
I_POS = 1
I_NTOUCHED = 2
I_STAGE_BURSTS = 3
I_BURSTS = 4
I_NRATIOS = 5
I_RATIOS_SEEN = 6
I_RNG = 7
ISTATE_SIZE = 8

# fstate layout
F_BIAS = 0
F_G0_LAST = 1
F_LOSS_SUM = 2
F_G = 3        # uniform mode: cumulative gravity G owed to every alive coordinate since the last flush
F_BIAS_ACC = 4  # AdaGrad: Σ ℓ'² of the bias
FSTATE_SIZE = 5

# truncation modes (the ``mode`` argument; False/True of older callers are TOUCHED/INFORMATIVE)
TRUNC_TOUCHED = 0      # ST-2 on the burst's touched coordinates: g0·(updates in the burst)
TRUNC_INFORMATIVE = 1  # ST-4: S(w_j, g0·k̃_j) on touched coordinates
TRUNC_UNIFORM = 2      # ST-2 on EVERY alive coordinate (TG's rule), lazily through G and Gl_j

# AdaGrad codes (the ``adagrad`` argument; False/True of older callers are ADA_OFF/ADA_ALL)
ADA_OFF = 0   # global step η_t everywhere
ADA_ALL = 1   # per-coordinate steps for every feature and the bias
ADA_BIAS = 2  # the bias only (its "feature" is 1 while a normalised row's values are ~1/√nnz)

SCHEDULE_CONSTANT = 0
SCHEDULE_INVSQRT = 1

# record layout: float64 columns of ``rec`` and int32 columns of ``irec = int_view(rec)``
REC_SLOTS = 4  # float64 slots per record (32 bytes); irec has 2·REC_SLOTS int32 slots
R_W = 0
R_WSTART = 1
RI_KT = 4
RI_EVID = 5
RI_SURV = 6
RI_UPD = 7
PURGED = -1  # irec[j, RI_KT] of a purged feature


def int_view(rec):
    """The int32[p, 8] view of a record array (same memory; columns RI_* hold k̃, c, b, κ)."""
    if rec.dtype != np.float64 or rec.ndim != 2 or rec.shape[1] != REC_SLOTS or not rec.flags.c_contiguous:
        raise ValueError("rec must be a C-contiguous float64[p, 4] record array")
    return rec.view(np.int32)


def new_path_state(p, ratio_capacity=1 << 16, touched_capacity=None, seed=0, adagrad=False):
    """Allocate the state arrays of one path (all features alive, w = 0).

    Returns a dict with keys rec, touched, istate, fstate, ratios, acc (see the module docstring for
    layouts; ``acc`` is float64[p] of AdaGrad accumulators when ``adagrad``, else a 1-element placeholder).
    """
    p = int(p)
    cap_t = p if touched_capacity is None else int(min(p, touched_capacity))
    istate = np.zeros(ISTATE_SIZE, dtype=np.int64)
    istate[I_RNG] = np.int64(seed & 0x7FFFFFFFFFFFFFFF)
    return {
        "rec": zeros_aligned((p, REC_SLOTS), np.float64),  # a record never straddles two cache lines
        "touched": np.zeros(max(cap_t, 1), dtype=np.int32),  # feature ids < 2^31 (the store's int32 indices)
        "istate": istate,
        "fstate": np.zeros(FSTATE_SIZE, dtype=np.float64),
        "ratios": np.zeros((max(int(ratio_capacity), 0), 2), dtype=np.float64),
        "acc": np.zeros(p if adagrad else 1, dtype=np.float64),
    }


def views(state):
    """Column views of a path state's record: w, w_start (float64), kt, cnt_evid, cnt_surv, cnt_upd (int32,
    writable views), and ``alive`` (a bool copy: kt ≥ 0)."""
    rec = state["rec"]
    irec = int_view(rec)
    return {"w": rec[:, R_W], "w_start": rec[:, R_WSTART], "kt": irec[:, RI_KT], "cnt_evid": irec[:, RI_EVID],
            "cnt_surv": irec[:, RI_SURV], "cnt_upd": irec[:, RI_UPD], "alive": irec[:, RI_KT] >= 0}


def purge_features(rec, idx):
    """(ST-8) in place: w_j = 0 and j marked purged (k̃_j = −1) for the feature ids ``idx``.

    Only between bursts (k̃ = 0 for alive features then)."""
    idx = np.asarray(idx, dtype=np.int64)
    rec[idx, R_W] = 0.0
    int_view(rec)[idx, RI_KT] = PURGED


def reset_stage(istate, rec=None):
    """Start a new stage: zero the ratio buffer fill and the stage burst count, and the stage counters
    c, b, κ of ``rec`` when given.

    Must be called at a burst boundary (istate[I_POS] == 0), which is where stages end.
    """
    if istate[I_POS] != 0 or istate[I_NTOUCHED] != 0:
        raise ValueError("reset_stage called inside an open burst")
    if rec is not None:
        int_view(rec)[:, RI_EVID:RI_UPD + 1] = 0
    istate[I_NRATIOS] = 0
    istate[I_RATIOS_SEEN] = 0
    istate[I_STAGE_BURSTS] = 0


@numba.njit(cache=True, nogil=True, inline="always")
def _splitmix64(state):
    """One splitmix64 step: returns (new_state, uniform double in [0, 1)); state is uint64."""
    s, z = splitmix64(state)
    return s, unit(z)


@numba.njit(cache=True, nogil=True)
def _select_kth(touched, n, rec, col, k):
    """Reorder touched[:n] in place so touched[k] holds the feature of the k-th smallest key
    rec[j, col] (0-based), like np.partition; returns that key. Iterative quickselect, middle pivot."""
    lo = 0
    hi = n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        pivot = rec[touched[mid], col]
        i = lo
        j = hi
        while i <= j:
            while rec[touched[i], col] < pivot:
                i += 1
            while rec[touched[j], col] > pivot:
                j -= 1
            if i <= j:
                tmp = touched[i]
                touched[i] = touched[j]
                touched[j] = tmp
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break
    return rec[touched[k], col]


@numba.njit(cache=True, nogil=True)
def _quantile_rank(beta, n):
    """⌈β n⌉ (1-based rank), robust to β·n landing one ulp above an integer; clamped to [1, n]."""
    x = beta * n
    k = np.int64(math.ceil(x - 1e-9 * max(1.0, x)))
    if k < 1:
        k = 1
    if k > n:
        k = n
    return k


@numba.njit(cache=True, nogil=True, inline="always")
def _scale(acc, j, adagrad, delta):
    """Per-coordinate step factor: 1/(δ + √acc_j) with AdaGrad on the features (ALGORITHMS.md §8), else 1."""
    if adagrad == ADA_ALL:
        return 1.0 / (delta + math.sqrt(acc[j]))
    return 1.0


@numba.njit(cache=True, nogil=True, inline="always")
def _count_burst(istate, fstate, g):
    """A burst closed with base gravity g: the burst position back to 0, the stage's and the lifetime burst counts."""
    istate[I_POS] = 0
    istate[I_STAGE_BURSTS] += 1
    istate[I_BURSTS] += 1
    fstate[F_G0_LAST] = g


@numba.njit(cache=True, nogil=True, inline="always")
def _count_close(irec, j, kj, v):
    """(ST-6) counters of coordinate j at the close of a burst with k̃_j = kj > 0 updates, v its weight after the
    truncation: c += 1, κ += k̃_j, b += [v ≠ 0] (branch-free: survival is a coin flip for the predictor); k̃_j = 0."""
    irec[j, RI_EVID] += 1
    irec[j, RI_UPD] += kj
    irec[j, RI_SURV] += v != 0.0
    irec[j, RI_KT] = 0


@numba.njit(cache=True, nogil=True, inline="always")
def lazy_close(mode, ratios, quantile_first_burst, g0):
    """Whether bursts are closed lazily (see :func:`stsgd_block`, "Lazy close"): uniform truncation with g0 > 0,
    no (ST-9) ratios and no quantile, which is STSGD's default. (g0 = 0 leaves G constant, and G is what tells a
    coordinate that a burst ended since it was read.) g0, K, the mode and the ratio buffer must then stay the same
    from a stage's first call to its :func:`stsgd_end_stage`: a deferred close is applied with the g0·K in force
    when it is read (the engine changes them between stages only, ST-9/ST-12)."""
    return mode == TRUNC_UNIFORM and ratios.shape[0] == 0 and not quantile_first_burst and g0 > 0.0


@numba.njit(cache=True, nogil=True)
def stsgd_close_burst(rec, irec, touched, istate, fstate, ratios, g0, mode, quantile_first_burst, beta,
                      acc, adagrad, delta):
    """Close the open burst: record ratios (ST-9), truncate touched coordinates (ST-4 / ST-2),
    update the stage counters (ST-6 / ST-11), reset k̃. A no-op on an empty burst (pos == 0).

    Amount for a touched j: g0·k̃_j (``mode`` TRUNC_INFORMATIVE), g0·pos (TRUNC_TOUCHED, TRUNC_UNIFORM),
    times the coordinate's AdaGrad factor s_j = 1/(δ + √acc_j) when ``adagrad`` (gravity moves with the
    step, as TG's η_t·g does); the ratio is r_j = |Δw_j| / (k̃_j·s_j), in the units of g0. In
    TRUNC_UNIFORM every alive coordinate owes g0·pos too: G += g0·pos, and a touched j records
    Gl_j = G in the w_start column (see :func:`stsgd_block`).

    ``irec`` must be ``int_view(rec)``. Called by :func:`stsgd_block` after every K-th update outside the lazy
    close (:func:`lazy_close`); a stage ends with :func:`stsgd_end_stage`, which calls it for a partial burst (its
    uniform amount is then g0·pos).
    """
    if lazy_close(mode, ratios, quantile_first_burst, g0):
        raise ValueError("stsgd_close_burst: a lazily closed state is closed by stsgd_end_stage")
    pos = istate[I_POS]
    if pos == 0:
        return
    n = istate[I_NTOUCHED]
    g = g0
    if quantile_first_burst:
        # pass 1: per-feature movement ratio r_j = |Δw_j| / (k̃_j·s_j), kept in w_start[j]; its quantile
        for i in range(n):
            j = touched[i]
            rec[j, R_WSTART] = abs(rec[j, R_W] - rec[j, R_WSTART]) / (irec[j, RI_KT] * _scale(acc, j, adagrad,
                                                                                              delta))
        if beta <= 0.0 or n == 0:
            g = 0.0
        else:
            k = _quantile_rank(beta, n)
            g = _select_kth(touched, n, rec, R_WSTART, k - 1)
    uniform = mode == TRUNC_UNIFORM
    G = fstate[F_G] + g * pos
    # record ratio (ST-9 buffer; uniform reservoir once full), truncate, count
    cap = ratios.shape[0]
    seen = istate[I_RATIOS_SEEN]
    rng = np.uint64(istate[I_RNG])
    rp = base(rec)
    ap = base(acc)
    for i in range(n):
        if i + PREFETCH_DISTANCE < n:  # a burst of K rows touches ~10^6 features: their records are cold again
            jn = touched[i + PREFETCH_DISTANCE]
            prefetch(rp, REC_SLOTS * jn)
            if adagrad == ADA_ALL:
                prefetch(ap, jn)
        j = touched[i]
        kj = irec[j, RI_KT]
        wj = rec[j, R_W]
        sj = _scale(acc, j, adagrad, delta)
        if cap > 0:
            if quantile_first_burst:
                r = rec[j, R_WSTART]
            else:
                r = abs(wj - rec[j, R_WSTART]) / (kj * sj)
            if seen < cap:
                ratios[seen, 0] = float(j)
                ratios[seen, 1] = r
                seen += 1
            else:
                seen += 1
                rng, u = _splitmix64(rng)
                slot = np.int64(u * seen)
                if slot < cap:
                    ratios[slot, 0] = float(j)
                    ratios[slot, 1] = r
        if mode == TRUNC_INFORMATIVE:
            a = g * kj
        else:
            a = g * pos
        v = _soft(wj, a * sj)
        rec[j, R_W] = v
        if uniform:
            rec[j, R_WSTART] = G
        _count_close(irec, j, kj, v)
    if uniform:
        fstate[F_G] = G
    istate[I_RATIOS_SEEN] = seen
    istate[I_NRATIOS] = min(seen, cap)
    istate[I_RNG] = np.int64(rng)
    istate[I_NTOUCHED] = 0
    _count_burst(istate, fstate, g)


@numba.njit(cache=True, nogil=True)
def stsgd_flush(rec, irec, fstate, acc, adagrad, delta):
    """TRUNC_UNIFORM: apply the gravity every alive coordinate still owes, S(w_j, (G − Gl_j)·s_j), and
    reset G = Gl_j = 0; O(p), at a burst boundary (stage ends). Exact: s_j only changes when j is
    touched, and a touch first catches j up. A no-op when G = 0."""
    G = fstate[F_G]
    if G == 0.0:
        return
    for j in range(rec.shape[0]):
        if irec[j, RI_KT] >= 0:
            owed = G - rec[j, R_WSTART]
            if owed != 0.0:
                rec[j, R_W] = _soft(rec[j, R_W], owed * _scale(acc, j, adagrad, delta))
        rec[j, R_WSTART] = 0.0
    fstate[F_G] = 0.0


@numba.njit(cache=True, nogil=True)
def stsgd_end_stage(rec, irec, touched, istate, fstate, ratios, g0, K, mode, quantile_first_burst, beta, acc,
                    adagrad, delta):
    """End a stage (a burst boundary): close the open burst (a partial one: amount g0·pos) and apply the gravity
    every alive coordinate still owes, so that the record holds the true weights, k̃ = 0 on Ω, the stage's
    counters c, b, κ complete, and G = Gl_j = 0. With the eager close, :func:`stsgd_close_burst` then
    :func:`stsgd_flush`. With the lazy close, one O(p) sweep that also closes the deferred bursts: a coordinate
    with k̃_j > 0 was last updated in the open burst when Gl_j = G (amount g0·pos), else in a full closed one (g0·K);
    it is counted as (ST-6) counts it and its weight becomes S(w_j, (G + g0·pos − Gl_j)·s_j), the composition
    (C-1) of that close and the gravity owed since."""
    if not lazy_close(mode, ratios, quantile_first_burst, g0):
        stsgd_close_burst(rec, irec, touched, istate, fstate, ratios, g0, mode, quantile_first_burst, beta, acc,
                          adagrad, delta)
        stsgd_flush(rec, irec, fstate, acc, adagrad, delta)
        return
    pos = istate[I_POS]
    G = fstate[F_G]
    Gf = G + g0 * pos
    for j in range(rec.shape[0]):
        kj = irec[j, RI_KT]
        if kj >= 0:
            gl = rec[j, R_WSTART]
            wj = rec[j, R_W]
            sj = _scale(acc, j, adagrad, delta)
            if kj > 0:
                a = g0 * pos if gl == G else g0 * K
                _count_close(irec, j, kj, _soft(wj, a * sj))
            rec[j, R_W] = _soft(wj, (Gf - gl) * sj)
        rec[j, R_WSTART] = 0.0
    fstate[F_G] = 0.0
    if pos > 0:
        _count_burst(istate, fstate, g0)


@numba.njit(cache=True, nogil=True)
def stsgd_block(indptr, indices, data, y, rows, start, rec, irec, touched, istate, fstate, ratios, eta,
                schedule, K, g0, loss, hinge_at_one, mode, count_violations_only, fit_bias, max_bursts,
                quantile_first_burst, beta, acc, adagrad, delta):
    """Advance one STSGD path over rows[start:] of a CSR block; returns the number of rows consumed.

    Bursts of K updates (ST-1, restricted to alive features) with informative counters k̃ (ST-3);
    at each burst end touched coordinates are truncated by S(w_j, g0·k̃_j) (ST-4, ``mode`` 1), or by
    g0·K (``mode`` 0: ST-2 on touched coordinates; ``mode`` 2: ST-2 on every alive coordinate, lazily).
    Stops right after the burst that makes istate[I_STAGE_BURSTS] == max_bursts (max_bursts ≤ 0: no
    limit) or when the rows run out (the open burst then stays in the state). η_t = eta (schedule 0) or
    eta/√t (schedule 1), t = the path's update count after increment. ``loss`` is a code of
    kernels.losses. ``irec`` must be ``int_view(rec)``.

    AdaGrad (``adagrad`` = ADA_ALL, ALGORITHMS.md §8): the step of coordinate j is η_t·g_j/(δ + √acc_j)
    with acc_j += g_j² first (g_j = ℓ'·x_j); the bias has its own accumulator (fstate[F_BIAS_ACC]), also
    used alone with ADA_BIAS.

    Uniform mode (``mode`` 2), exact lazy form of "every alive coordinate loses g0 per update": G
    (fstate[F_G]) sums the amounts g0·pos of the closed bursts; outside a burst the w_start column of an
    alive j holds Gl_j, the part of G already applied. Before j is read in a burst where it is not yet
    touched it is caught up: w_j ← S(w_j, (G − Gl_j)·s_j) (C-1 composes: S(S(v,a),b) = S(v,a+b); s_j is
    constant between touches); G does not change inside a burst. :func:`stsgd_flush` catches up all.

    Lazy close (:func:`lazy_close`: uniform mode, g0 > 0, no ratios, no quantile). The close of a burst then
    visits no coordinate: it adds g0·K to G, and each coordinate is closed at its next read, where Gl_j ≠ G says
    that a burst ended since (G grows at every close). Read then, j still holds the burst it was last updated in
    when k̃_j > 0: that burst's close is applied and counted there (c += 1, κ += k̃_j, b += [S(w_j, g0·K·s_j) ≠ 0]),
    and w_j ← S(w_j, (G − Gl_j)·s_j), which composes (C-1) the close and the gravity owed since (s_j does not change
    between j's reads); then Gl_j = G and k̃_j = 0. ``touched`` is not used. The weights are the eager close's up to
    rounding ((G − Gl_j) is one subtraction instead of a sum of amounts) and the counters are the same;
    :func:`stsgd_end_stage` closes what is still deferred. It saves the close's random visit of the ~10^6 records a
    burst touches at webspam width: 35k rows x 16.6M features, one path, 57 -> 65M non-zeros a second in the first
    pass, 54.6 -> 56.1M in a later one (Ω 6.7M features). That read is a branch, unlike the eager catch-up: written
    branch-free (c, b, κ and k̃ stored at every read) the later pass was 7% slower than the eager close.

    The sweeps read the record, ``indices`` and ``data`` through raw pointers (``intrinsics.base``): numba's array
    indexing wraps a negative index around, a compare and select per access. Without it, the same arithmetic ran
    62.7-63.5 -> 83.1-83.6M non-zeros a second in a first pass (35k rows x 16.6M features, one path) and 0.51 ->
    0.34 s over a later pass's kept entries.
    """
    if K < 1:
        raise ValueError("stsgd_block: K must be >= 1")
    nrows = rows.shape[0]
    if max_bursts > 0 and istate[I_STAGE_BURSTS] >= max_bursts:
        return 0
    cap_t = touched.shape[0]
    consumed = 0
    uniform = mode == TRUNC_UNIFORM
    keep_start = ratios.shape[0] > 0 or quantile_first_burst
    lazy = lazy_close(mode, ratios, quantile_first_burst, g0)
    gK = g0 * K  # a full burst's uniform amount
    rp = base(rec)  # raw pointers (no wraparound): rec[j, c] is rp[o + c], irec[j, c] is ip[2·o + c], o = REC_SLOTS·j
    ip = base(irec)
    ap = base(acc)
    xp = base(indices)
    dp = base(data)
    for ri in range(start, nrows):
        r = rows[ri]
        lo = indptr[r]
        hi = indptr[r + 1]
        yi = y[r]
        # prediction on the stable set (uniform mode: catch up coordinates not yet touched in this burst)
        f = fstate[F_BIAS]
        G = fstate[F_G]
        for q in range(lo, hi):
            if q + PREFETCH_DISTANCE < hi:  # a hint only (see sgd.PREFETCH_DISTANCE): one record, one line
                jn = xp[q + PREFETCH_DISTANCE]
                prefetch(rp, REC_SLOTS * jn)
                if adagrad == ADA_ALL:
                    prefetch(ap, jn)
            j = np.int64(xp[q])
            o = REC_SLOTS * j
            kj = ip[2 * o + RI_KT]
            if kj >= 0:
                wj = rp[o + R_W]
                if lazy:  # j's first read since a burst ended: close j's deferred burst, catch j up ("Lazy close")
                    gl = rp[o + R_WSTART]
                    if gl != G:
                        sj = _scale(acc, j, adagrad, delta)
                        if kj > 0:
                            _count_close(irec, j, kj, _soft(wj, gK * sj))
                        wj = _soft(wj, (G - gl) * sj)
                        rp[o + R_W] = wj
                        rp[o + R_WSTART] = G
                elif uniform:  # catch-up, branch-free: whether j is first read in this burst is a coin flip
                    ws = rp[o + R_WSTART]
                    first = kj == 0
                    owed = G - ws
                    wn = _soft(wj, owed * _scale(acc, j, adagrad, delta))
                    wj = wn if first and owed != 0.0 else wj
                    rp[o + R_W] = wj
                    rp[o + R_WSTART] = G if first else ws
                f += wj * dp[q]
        t = istate[I_T] + 1
        istate[I_T] = t
        fstate[F_LOSS_SUM] += loss_fn(f, yi, loss)
        d = dloss(f, yi, loss, hinge_at_one)
        if schedule == SCHEDULE_INVSQRT:
            e = eta / math.sqrt(t)
        else:
            e = eta
        if d != 0.0 or not count_violations_only:
            step = e * d
            nt = istate[I_NTOUCHED]
            for q in range(lo, hi):
                j = np.int64(xp[q])
                o = REC_SLOTS * j
                kj = ip[2 * o + RI_KT]
                if kj >= 0:
                    wj = rp[o + R_W]
                    first = kj == 0  # j's first touch in the burst, branch-free as in the sweep above
                    if not lazy:  # the eager close visits the burst's first touches
                        if nt < cap_t:
                            touched[nt] = j  # kept (nt advances) only on a first touch
                        elif first:
                            istate[I_NTOUCHED] = nt
                            raise ValueError("stsgd_block: touched buffer too small")
                        nt += np.int64(first)
                    if keep_start:  # w_start feeds the (ST-9) ratios only; in uniform mode the close rewrites it
                        ws = rp[o + R_WSTART]
                        rp[o + R_WSTART] = wj if first else ws
                    ip[2 * o + RI_KT] = kj + 1
                    if adagrad == ADA_ALL:
                        gj = d * dp[q]
                        a = ap[j] + gj * gj
                        ap[j] = a
                        rp[o + R_W] = wj - e * gj / (delta + math.sqrt(a))
                    else:
                        rp[o + R_W] = wj - step * dp[q]
            istate[I_NTOUCHED] = nt
        if fit_bias:
            if adagrad != ADA_OFF:
                ab = fstate[F_BIAS_ACC] + d * d
                fstate[F_BIAS_ACC] = ab
                fstate[F_BIAS] -= e * d / (delta + math.sqrt(ab))
            else:
                fstate[F_BIAS] -= e * d
        istate[I_POS] += 1
        consumed += 1
        if istate[I_POS] >= K:
            if lazy:
                fstate[F_G] += gK
                _count_burst(istate, fstate, g0)
            else:
                stsgd_close_burst(rec, irec, touched, istate, fstate, ratios, g0, mode, quantile_first_burst,
                                  beta, acc, adagrad, delta)
            if max_bursts > 0 and istate[I_STAGE_BURSTS] >= max_bursts:
                break
    return consumed
