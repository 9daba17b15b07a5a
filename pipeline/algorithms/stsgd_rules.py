"""STSGD stage-end rules — ALGORITHMS.md §2, (ST-6)–(ST-13). NumPy (and the linear-time merges of
pipeline.kernels.sparse_sets), no Dask, no I/O.

The kernel (pipeline.kernels.stsgd) leaves per-path dense counters ``cnt_evid`` (c), ``cnt_surv``
(b), ``cnt_upd`` (κ) and a ratio buffer. Between paths everything travels SPARSELY:

* :func:`sparse_counters` turns one path's dense counters into a :data:`Sparse` tuple
  ``(idx, evid, surv, upd)`` of touched features only (idx int32 below 2^31 features, strictly increasing;
  counts in the smallest unsigned dtype that holds them);
* :func:`merge_sparse` sums two such tuples (any number of value arrays, same layout), result
  sorted by feature id; :func:`tree_merge` reduces a list pairwise in a fixed balanced tree whose
  shape depends only on the list length, so the result is a function of the inputs' order only
  (integer counters are exact whatever the tree; float values are bit-reproducible for a fixed M).

Stage-end sequence (driver):
    counters = tree_merge([sparse_counters(*path_counters) for path in paths])
    idx, prob, carry = carried_selection_probability(carry, counters, delta_K)   # (ST-11)/(ST-6)
    alive, purged = stable_set(alive, prob, pi0, idx=idx)                        # (ST-7)
    purge(path_w, purged) for every path                                         # (ST-8)
    d = |Ω| / seen (d_base "seen"; |Ω| / p with "p") ; beta = anneal_beta(beta0, gamma, d)   # (ST-10)
    g0 = adaptive_gravity(pooled_ratios(buffers, Ω_prev), beta)  # (ST-9; ratio_pool "stage"; Ω with "stable")
    K = burst_size(K0, alpha, d) if annealing bursts                             # (ST-12)
    w_bar = aggregate(path_w); stop = should_stop(...)                           # (ST-13)
"""
import math

import numpy as np

from pipeline.kernels.sparse_sets import union_positions

# ---------------------------------------------------------------------------------------------
# sparse counter exchange


def sparse_counters(cnt_evid, cnt_surv, cnt_upd=None, chunk: int = 1 << 20):
    """Touched features of one path's stage counters: ``(idx, evid, surv, upd)``, or ``(idx, evid, surv)`` without
    ``cnt_upd`` (the stage end needs κ only for carried counters or the paper's ratio).

    A feature is touched in the stage iff it had evidence in some burst (c_j > 0, equivalently κ_j > 0). idx is
    strictly increasing, int32 when the width is below 2^31 (the store's indices are int32) else int64; each value
    array is in the smallest unsigned dtype that holds its largest count (:func:`count_dtype`: c and b count the
    stage's bursts, uint8 below 256 bursts), so a touched feature travels in 6 bytes at the defaults instead of 20
    (int64 id, three int32). Built ``chunk`` features at a time: no temporary beyond the result. Integer values are
    exact in any dtype, so the decisions are unchanged; :func:`merge_sparse` widens a sum that would overflow.
    """
    cols = [np.asarray(c) for c in (cnt_evid, cnt_surv, cnt_upd) if c is not None]
    p = cols[0].shape[0]
    n = int(np.count_nonzero(cols[0]))
    idx = np.empty(n, dtype=np.int32 if p < 2 ** 31 else np.int64)
    vals = [np.empty(n, dtype=count_dtype(c)) for c in cols]
    k = 0
    for lo in range(0, p, chunk):
        part = cols[0][lo:lo + chunk].nonzero()[0]  # a record column is strided: no flattened copy
        idx[k:k + part.size] = part + lo
        for v, c in zip(vals, cols):
            v[k:k + part.size] = c[lo:lo + chunk][part]
        k += part.size
    return (idx, *vals)


def count_dtype(counts) -> np.dtype:
    """The smallest unsigned integer dtype holding every value of ``counts`` (non-negative integers)."""
    top = int(np.max(counts)) if np.size(counts) else 0
    if top < 0:
        raise ValueError("count_dtype: counts must be >= 0")
    return np.min_scalar_type(top)


def empty_sparse(n_values=3, dtype=np.int64):
    """An empty sparse set ``(idx, v1, ..., vn)`` (identity of :func:`merge_sparse`)."""
    return (np.zeros(0, dtype=np.int64),) + tuple(np.zeros(0, dtype=dtype) for _ in range(n_values))


def merge_sparse(a, b):
    """Sum two sparse sets ``(idx, v1, ..., vn)`` with strictly increasing idx.

    Result idx = sorted union; each value array is the element-wise sum (features present in one
    set only keep their value exactly). Commutative bit for bit.
    """
    if len(a) != len(b):
        raise ValueError("merge_sparse: sets have different numbers of value arrays")
    ia, ib = np.asarray(a[0]), np.asarray(b[0])
    it = np.result_type(ia.dtype, ib.dtype) if ia.dtype.kind == ib.dtype.kind == "i" else np.dtype(np.int64)
    u, pa, pb = union_positions(ia.astype(it, copy=False), ib.astype(it, copy=False))  # O(|a| + |b|): sorted
    out = [u]
    for va, vb in zip(a[1:], b[1:]):
        va = np.asarray(va)
        vb = np.asarray(vb)
        dt = np.result_type(va.dtype, vb.dtype)
        if dt.kind in "iu" and va.size and vb.size:  # counters summed over paths: widen only as far as needed
            top = int(va.max()) + int(vb.max())
            if top > np.iinfo(dt).max:
                dt = np.promote_types(dt, np.min_scalar_type(top))
        s = np.zeros(u.shape[0], dtype=dt)
        s[pa] = va
        s[pb] += vb  # idx unique within a set: plain fancy-index add is exact
        out.append(s)
    return tuple(out)


def tree_merge(sets):
    """Reduce a list of sparse sets with :func:`merge_sparse` in a fixed balanced binary tree
    (pairs (0,1), (2,3), … then recursively), so the result depends only on the list."""
    sets = list(sets)
    if not sets:
        raise ValueError("tree_merge: empty list")
    while len(sets) > 1:
        nxt = [merge_sparse(sets[i], sets[i + 1]) for i in range(0, len(sets) - 1, 2)]
        if len(sets) % 2:
            nxt.append(sets[-1])
        sets = nxt
    return sets[0]


def densify(sparse, p, which=1):
    """Dense length-p array of value array number ``which`` of a sparse set (tests, small p)."""
    idx = sparse[0]
    v = np.asarray(sparse[which])
    out = np.zeros(p, dtype=v.dtype)
    out[idx] = v
    return out


# ---------------------------------------------------------------------------------------------
# selection probability, stable set, purge


def selection_probability(evid, surv):
    """(ST-6), eq. (8): Π̂_j = b_j / c_j if c_j > 0 else 1 (element-wise).

    ``evid`` (c_j) = bursts, pooled over paths and the stage's bursts, in which j had evidence;
    ``surv`` (b_j) = those in which ŵ_j ≠ 0 after truncation. With counters of a single path this
    is eq. (7) (M = 1). Works on dense length-p arrays or on the values of a sparse set.
    """
    evid = np.asarray(evid)
    surv = np.asarray(surv)
    out = np.ones(evid.shape, dtype=np.float64)
    m = evid > 0
    np.divide(surv, evid, out=out, where=m, dtype=np.float64)
    return out


def carried_counters_elementwise(carry_evid, carry_surv, carry_upd, evid, surv, upd, delta_K,
                                 ratio="c"):
    """(ST-11), eq. (16) on aligned arrays (dense, or values of the same sparse idx).

    κ̃_s = κ̃_{s−1}·1[κ̃_{s−1} ≤ δ_K] + κ_s, and the same carry rule for b̃ and c̃;
    Π̂ = b̃/c̃ (``ratio="c"``, [R] default: δ_K = 0 gives eq. (8) exactly) or b̃/κ̃
    (``ratio="paper"``) where κ̃ > δ_K, else 1 — and then the carry is kept.

    ``carry_*`` are the carried values *as stored after the previous stage*: i.e. the κ̃_{s−1},
    b̃_{s−1}, c̃_{s−1} of the previous stage (the indicator is applied here). Returns
    ``(prob, new_carry_evid, new_carry_surv, new_carry_upd)``; the new carries are κ̃_s, b̃_s, c̃_s.
    """
    if ratio not in ("c", "paper"):
        raise ValueError(f"ratio must be 'c' or 'paper', got {ratio!r}")
    if delta_K < 0:
        raise ValueError("delta_K must be >= 0")
    keep = np.asarray(carry_upd) <= delta_K
    k_t = np.where(keep, carry_upd, 0) + np.asarray(upd)
    b_t = np.where(keep, carry_surv, 0) + np.asarray(surv)
    c_t = np.where(keep, carry_evid, 0) + np.asarray(evid)
    used = k_t > delta_K
    den = c_t if ratio == "c" else k_t
    prob = np.ones(np.shape(k_t), dtype=np.float64)
    ok = used & (den > 0)
    prob[ok] = b_t[ok] / den[ok]
    return prob, c_t, b_t, k_t


def carried_selection_probability(carry, counters, delta_K=0, ratio="c"):
    """(ST-11) on sparse sets. ``carry`` and ``counters`` are ``(idx, evid, surv, upd)`` sets
    (``carry`` = None or empty at the first stage; only carries still kept, κ̃ ≤ δ_K, are stored).

    Returns ``(idx, prob, new_carry)``: Π̂ for the features in idx (all features absent from idx
    have Π̂ = 1), and the sparse carry to pass to the next stage (features with 0 < κ̃_s ≤ δ_K).
    With δ_K = 0 the carry is always empty and prob equals :func:`selection_probability`.
    """
    if carry is None:
        carry = empty_sparse(3)
    if len(carry[0]) == 0 and delta_K == 0 and ratio == "c":  # the default: eq. (8) on the stage's counters
        idx = np.asarray(counters[0], dtype=np.int64)          # (no temporaries: ~10^7 touched features)
        return idx, selection_probability(counters[1], counters[2]), empty_sparse(3)
    if len(carry[0]) == 0:  # always with δ_K = 0: the stage's own ids, no alignment
        idx = np.asarray(counters[0], dtype=np.int64)
        zero = np.zeros(idx.shape[0], dtype=np.int64)
        carried, stage = (zero, zero, zero), tuple(counters[1:])
    else:  # align: merged idx; carry values and stage values on the same idx
        zero_stage = (np.asarray(counters[0], dtype=np.int64),) + tuple(
            np.zeros(len(counters[0]), dtype=np.int64) for _ in range(3))
        zero_carry = (np.asarray(carry[0], dtype=np.int64),) + tuple(
            np.zeros(len(carry[0]), dtype=np.int64) for _ in range(3))
        c_al = merge_sparse(carry, zero_stage)
        idx, carried, stage = c_al[0], c_al[1:], merge_sparse(zero_carry, counters)[1:]
    prob, c_t, b_t, k_t = carried_counters_elementwise(*carried, *stage, delta_K, ratio)
    kept = (k_t <= delta_K) & (k_t > 0)
    new_carry = (idx[kept], c_t[kept], b_t[kept], k_t[kept])
    return idx, prob, new_carry


def stable_set(alive, prob, pi0, idx=None):
    """(ST-7), eq. (9): Ω_s = {j ∈ Ω_{s−1} : Π̂_j ≥ π0}.

    ``alive`` is the dense bool mask of Ω_{s−1} (not modified). ``prob`` is dense (length p) or,
    with ``idx``, the Π̂ of those features only (all others have Π̂ = 1 and stay). Returns
    ``(new_alive, purged)`` with ``purged`` the sorted int64 ids of newly purged features; Ω only
    shrinks.
    """
    alive = np.asarray(alive, dtype=np.bool_)
    prob = np.asarray(prob, dtype=np.float64)
    if idx is None:
        if prob.shape != alive.shape:
            raise ValueError("dense prob must have the shape of alive")
        idx = np.arange(alive.shape[0], dtype=np.int64)
    idx = np.asarray(idx, dtype=np.int64)
    drop = alive[idx] & (prob < pi0)
    purged = np.sort(idx[drop])
    new_alive = alive.copy()
    new_alive[purged] = False
    return new_alive, purged


def purge(w, purged):
    """(ST-8), eq. (10): w̃ = ŵ ⊙ 1_{Ω_s}; zero the newly purged coordinates of one path in place.

    Call for every path (w, and any per-feature optimiser state that must stay zero). The kernel
    skips features with alive[j] == False, so they stay exactly zero afterwards.
    """
    w[np.asarray(purged, dtype=np.int64)] = 0.0
    return w


# ---------------------------------------------------------------------------------------------
# annealing, gravity, burst size


def anneal_beta(beta0, gamma, d):
    """(ST-10), eq. (12) in the reconciled form [R]: with u = 1 − d (fraction purged),

        β = β0·[exp(−γu) − u·e^{−γ}]                 γ ≥ 0   (γ = 0: β = β0·d, linear)
        β = β0·log(1 − γ(1 − u)) / log(1 − γ)         γ < 0   (= β0·log(1 − γd)/log(1 − γ))

    φ(1) = β0, φ(0) = 0, increasing in d, decreasing in γ. β0 = 0.7, d = 0.5 gives
    γ = −5: 0.49, γ = 0: 0.35, γ = 5: 0.055.
    """
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"d must be in [0, 1], got {d}")
    u = 1.0 - d
    if gamma >= 0:
        val = math.exp(-gamma * u) - u * math.exp(-gamma)
    else:
        val = math.log1p(-gamma * d) / math.log1p(-gamma)
    return float(beta0 * min(max(val, 0.0), 1.0))


def quantile_rank(beta, n):
    """⌈β·n⌉ as an integer in [1, n], robust to β·n landing one ulp above an integer
    (e.g. 0.7·10 = 7.000000000000001 gives 7, not 8)."""
    x = beta * n
    k = int(math.ceil(x - 1e-9 * max(1.0, x)))
    return min(max(k, 1), n)


def adaptive_gravity(ratios, beta):
    """(ST-9), eq. (11) read as a quantile [R]: g0 = r_(⌈βN⌉), the ⌈βN⌉-th smallest of the N pooled
    ratios r = |Δw_j| / k̃_j; 0 if β = 0 or N = 0.

    Then #{r ≤ g0} / N = ⌈βN⌉/N exactly when the ratios are distinct (ties at the quantile add
    their multiplicity).
    """
    r = np.asarray(ratios, dtype=np.float64).ravel()
    n = r.shape[0]
    if beta <= 0.0 or n == 0:
        return 0.0
    if beta > 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    k = quantile_rank(beta, n)
    return float(np.partition(r, k - 1)[k - 1])


def pooled_ratios(buffers, alive):
    """Pool the (ST-9) ratios of the stage over paths, keeping features still in Ω_s.

    ``buffers`` is an iterable of ``(ratios, n)`` with ``ratios`` the kernel's float64[cap, 2]
    buffer
    (column 0 feature id, column 1 ratio) and ``n`` its fill count (istate[I_NRATIOS]). Concatenated
    in the given (path) order.
    """
    alive = np.asarray(alive, dtype=np.bool_)
    parts = []
    for buf, n in buffers:
        b = np.asarray(buf)[: int(n)]
        feat = b[:, 0].astype(np.int64)
        parts.append(b[alive[feat], 1])
    if not parts:
        return np.zeros(0, dtype=np.float64)
    return np.concatenate(parts)


def realized_rejection_rate(evid, surv):
    """Fraction of (feature, burst) pairs with evidence that truncation zeroed: 1 − Σb/Σc
    (logged to check that it tracks β_s, ALGORITHMS.md §7.7); 0 when there was no evidence."""
    c = float(np.sum(evid))
    return 0.0 if c == 0 else 1.0 - float(np.sum(surv)) / c


def burst_size(K0, alpha, d):
    """(ST-12): K_s = ⌈K0·log(1/(α·d_{s−1}))⌉, clamped to ≥ 1 [R]; needs 0 < α < 1, 0 < d ≤ 1.

    At d = 1, K = ⌈K0 log(1/α)⌉ (α = 0.5: ≈ 0.69·K0); K grows as features are purged (d shrinks).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 0.0 < d <= 1.0:
        raise ValueError(f"d must be in (0, 1], got {d}")
    x = K0 * math.log(1.0 / (alpha * d))
    k = int(math.ceil(x - 1e-12 * max(1.0, abs(x))))
    return max(1, k)


# ---------------------------------------------------------------------------------------------
# aggregation and stopping


def aggregate(paths):
    """(ST-13), Alg. 4: w̄ = (1/M) Σ_m w̃^(m), summed in path order (deterministic).

    ``paths`` is a sequence of equal-shape arrays (weights, or biases as 0-d arrays / floats).
    Each path keeps its own w̃^(m) for the next stage; w̄ is only the output.
    """
    paths = [np.asarray(w, dtype=np.float64) for w in paths]
    if not paths:
        raise ValueError("aggregate: no paths")
    acc = paths[0].copy()
    for w in paths[1:]:
        acc += w
    return acc / len(paths)


def aggregate_sparse(sets, M):
    """(ST-13) on sparse weights: ``sets`` are ``(idx, values)`` per path; returns ``(idx, w̄)``
    via :func:`tree_merge` (exact zeros dropped)."""
    idx, s = tree_merge(sets)
    v = s / M
    nz = v != 0.0
    return idx[nz], v[nz]


def sparse_weights(w):
    """``(idx, values)`` of the non-zero weights of one path (for :func:`aggregate_sparse`)."""
    w = np.asarray(w)
    idx = w.reshape(-1).nonzero()[0].astype(np.int64)  # a strided record column is read in place, not copied
    return idx, np.asarray(w, dtype=np.float64)[idx]


def converged(w_bar, w_bar_prev, tol):
    """‖w̄_s − w̄_{s−1}‖₂ ≤ tol·max(1, ‖w̄_{s−1}‖₂) [R]."""
    w_bar = np.asarray(w_bar, dtype=np.float64)
    w_bar_prev = np.asarray(w_bar_prev, dtype=np.float64)
    scale = max(1.0, float(np.linalg.norm(w_bar_prev)))
    return bool(np.linalg.norm(w_bar - w_bar_prev) <= tol * scale)


def should_stop(w_bar, w_bar_prev, tol, passes_done, max_passes):
    """(ST-13) stopping rule: stop when the per-path passes are exhausted, or when w̄ converged
    (:func:`converged`) after at least one full pass. ``w_bar_prev`` None (first stage) never
    converges. ``passes_done`` may be fractional (rows read / n)."""
    if passes_done >= max_passes:
        return True
    if w_bar_prev is None or passes_done < 1:
        return False
    return converged(w_bar, w_bar_prev, tol)
