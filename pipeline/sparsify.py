"""Randomized sparsification of a linear model (ALGORITHMS.md §3, stage 2: (TS-5)–(TS-9)).

Given ŵ and s_j = E[x_j²], draw i_1..i_K i.i.d. from p and return w̃ = (1/K) Σ_k (ŵ_{i_k}/p_{i_k}) e_{i_k}:
E[w̃] = ŵ, nnz(w̃) ≤ K, and for squared loss E[ER(w̃)] − ER(ŵ) ≤ C/K with C = Σ_j ŵ_j² s_j / p_j.

* ``dd`` (distribution-dependent, TS-5): p_j ∝ |ŵ_j|√s_j, C = (Σ_j |ŵ_j|√s_j)²  (the minimiser of C);
* ``mg`` (magnitude-based, TS-6):         p_j ∝ |ŵ_j|,     C = ‖ŵ‖₁ Σ_j |ŵ_j| s_j  (≥ the DD value).

K is given, or from a target number of non-zeros (``nnz_mode``: "draws" — K = N, unbiased, nnz ≤ N;
"distinct" [R] — the smallest K whose draws hit N distinct coordinates, so nnz = N exactly, at the price of a
small bias from the data-dependent K), or from (ε, δ) by (TS-9): K = ⌈C/(εδ)⌉ (Markov). Coordinates with
p_j = 0 (DD: a feature that never occurs, s_j = 0) are dropped; they do not change any prediction on data
like the training data. Draws are seeded (numpy PCG64): the same inputs give the same w̃.
"""
from __future__ import annotations

import math

import numpy as np

from pipeline.store.readlock import reads_store

METHODS = ("dd", "mg")
NNZ_MODES = ("draws", "distinct")


def probabilities(w: np.ndarray, s: np.ndarray | None, method: str) -> np.ndarray:
    """p of (TS-5) (``dd``, needs s) or (TS-6) (``mg``); all zeros when ŵ (times √s) is zero."""
    if method not in METHODS:
        raise ValueError(f"sparsify method must be one of {', '.join(METHODS)}, got {method!r}")
    a = np.abs(np.asarray(w, dtype=np.float64))
    if method == "dd":
        if s is None:
            raise ValueError("dd sparsification needs feature second moments E[x_j^2]")
        a = a * np.sqrt(np.maximum(np.asarray(s, dtype=np.float64), 0.0))
    tot = a.sum()
    return a / tot if tot > 0 else a


def bound_constant(w: np.ndarray, s: np.ndarray, method: str) -> float:
    """C with E[(w̃−ŵ)ᵀΣ(w̃−ŵ)] ≤ C/K (TS-8): (Σ|ŵ_j|√s_j)² for dd, ‖ŵ‖₁ Σ|ŵ_j| s_j for mg."""
    a = np.abs(np.asarray(w, dtype=np.float64))
    s = np.maximum(np.asarray(s, dtype=np.float64), 0.0)
    if method == "dd":
        return float(np.sum(a * np.sqrt(s)) ** 2)
    if method == "mg":
        return float(a.sum() * np.sum(a * s))
    raise ValueError(f"sparsify method must be one of {', '.join(METHODS)}, got {method!r}")


def draws_for_epsilon(w, s, epsilon: float, delta: float, method: str) -> int:
    """(TS-9): K = ⌈C/(εδ)⌉ so that ER(w̃) ≤ ER(ŵ) + ε with probability ≥ 1 − δ (at least 1)."""
    check_epsilon(epsilon, delta)
    with np.errstate(over="ignore", invalid="ignore"):
        k = bound_constant(w, s, method) / (epsilon * delta)
    if not math.isfinite(k):
        raise ValueError(f"the bound's constant C is not finite for this model and store (weights or feature scales "
                         f"past float64's range): give the number of draws with --nnz instead of --epsilon")
    return max(1, int(math.ceil(k)))


def check_epsilon(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def _draw(cdf: np.ndarray, n: int, rng) -> np.ndarray:
    idx = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
    return np.minimum(idx, cdf.shape[0] - 1)


def _draws_until_distinct(cdf, target: int, rng, max_draws: int):
    """Draws (in order) up to and including the one that brings the distinct count to ``target``."""
    seen = np.zeros(cdf.shape[0], dtype=bool)
    out = []
    n_distinct = 0
    total = 0
    chunk = max(64, 2 * target)
    while n_distinct < target and total < max_draws:
        d = _draw(cdf, min(chunk, max_draws - total), rng)
        first = np.zeros(d.shape[0], dtype=bool)
        u, pos = np.unique(d, return_index=True)
        new = ~seen[u]
        first[pos[new]] = True
        cum = n_distinct + np.cumsum(first)
        if cum[-1] >= target:
            d = d[: int(np.searchsorted(cum, target)) + 1]
        seen[d] = True
        n_distinct = int(np.count_nonzero(seen))
        out.append(d)
        total += d.shape[0]
        chunk *= 2
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def sparsify_vector(w, s=None, *, method: str = "dd", draws: int | None = None, nnz: int | None = None,
                    epsilon: float | None = None, delta: float = 0.1, seed: int = 0, nnz_mode: str = "draws",
                    max_draws: int = 10 ** 8):
    """w̃ of (TS-7) and an info dict (method, K, nnz, bound constant C, expected excess bound C/K).

    Exactly one of ``draws`` (K), ``nnz`` (target support size) and ``epsilon`` (with ``delta``) is given.
    When the target support is ≥ the number of coordinates that can be drawn (p_j > 0) ŵ is returned on them
    (``K`` = 0 in the info): a weight whose feature has E[x_j²] = 0 on the store (p_j = 0) never moves a score
    there, so the result keeps at most ``nnz`` non-zeros.
    """
    w = np.asarray(w, dtype=np.float64)
    if nnz_mode not in NNZ_MODES:
        raise ValueError(f"nnz_mode must be one of {', '.join(NNZ_MODES)}, got {nnz_mode!r}")
    given = [x is not None for x in (draws, nnz, epsilon)]
    if sum(given) != 1:
        raise ValueError("give exactly one of draws (K), nnz and epsilon")
    p = probabilities(w, s, method)
    s_eff = np.asarray(s, dtype=np.float64) if s is not None else np.ones_like(w)
    C = bound_constant(w, s_eff, method) if s is not None else float("nan")
    info = {"method": method, "nnz_before": int(np.count_nonzero(w)), "bound_constant": C, "seed": int(seed)}
    rng = np.random.default_rng([int(seed), 5])
    cdf = np.cumsum(p)
    if cdf.shape[0] == 0 or cdf[-1] <= 0:
        out = np.zeros_like(w)
        info.update({"K": 0, "nnz": 0, "excess_bound": float("nan")})
        return out, info
    if epsilon is not None:
        if s is None:
            raise ValueError("epsilon needs feature second moments E[x_j^2]")
        K = draws_for_epsilon(w, s_eff, epsilon, delta, method)
        info.update({"epsilon": float(epsilon), "delta": float(delta)})
        idx = _draw(cdf, K, rng)
    elif nnz is not None:
        nnz = int(nnz)
        if nnz < 1:
            raise ValueError(f"nnz must be >= 1, got {nnz}")
        info.update({"nnz_target": nnz, "nnz_mode": nnz_mode})
        if nnz >= int(np.count_nonzero(p)):
            out = np.where(p > 0, w, 0.0)
            info.update({"K": 0, "nnz": int(np.count_nonzero(out)), "excess_bound": 0.0})
            return out, info
        if nnz_mode == "draws":
            idx = _draw(cdf, nnz, rng)
        else:
            idx = _draws_until_distinct(cdf, nnz, rng, max_draws)
        K = int(idx.shape[0])
    else:
        K = int(draws)
        if K < 1:
            raise ValueError(f"draws must be >= 1, got {K}")
        idx = _draw(cdf, K, rng)
    counts = np.bincount(idx, minlength=w.shape[0]).astype(np.float64)
    out = np.zeros_like(w)
    nz = counts > 0
    out[nz] = counts[nz] * (w[nz] / p[nz]) / K
    info.update({"K": int(K), "nnz": int(np.count_nonzero(out)), "excess_bound": C / K})
    return out, info


def store_second_moments(store_path: str, n_features: int | None = None) -> np.ndarray:
    """s_j = E[x_j²] over the store's training split (col_sumsq / n_rows), cut or zero-padded to n_features."""
    from pipeline.store.reader import open_store

    st = open_store(store_path)
    fs = st.feature_stats()
    s = np.asarray(fs["col_sumsq"], dtype=np.float64) / max(1, int(fs["n_rows"]))
    if st.feature_order:  # the model's weights use the input's ids
        from pipeline.store.order import dense_external

        s = dense_external(s, st.order_maps[0])
    if n_features is not None:
        out = np.zeros(n_features)
        n = min(n_features, s.shape[0])
        out[:n] = s[:n]
        s = out
    return s


@reads_store("store_path")
def sparsify_model(model, store_path: str, *, method: str = "dd", nnz: int | None = None,
                   epsilon: float | None = None, delta: float = 0.1, seed: int = 0, nnz_mode: str = "draws"):
    """A sparse copy of ``model`` (any algorithm) by (TS-7), with s from the store's feature statistics.

    For a two-stage model the dense stage-1 output ŵ (kept in its global state) is sparsified, otherwise the
    model's weights. What was done is recorded in ``meta["sparsify"]``; the optimiser state is dropped (a
    later ``train --init-model`` warm-starts from the sparse weights).
    """
    from pipeline.model import Model
    from pipeline.store.reader import open_store

    st = open_store(store_path)
    gs = model.gstate or {}
    if "w_hat" in gs:
        w = np.zeros(model.n_features)
        wh = np.asarray(gs["w_hat"], dtype=np.float64)
        n = min(w.shape[0], wh.shape[0])
        w[:n] = wh[:n]
        order = model.meta.get("feature_order")  # the optimiser state's ids: a store's in frequency order
        if order:
            if order != (st.feature_order or {}).get("digest"):
                raise ValueError(f"{store_path}: the model's stage-1 output is in the feature order of the store it "
                                 f"was trained on ({order}); sparsify it with that store")
            from pipeline.store.order import dense_external

            w = dense_external(w, st.order_maps[0])
        bias = float(np.asarray(gs.get("b_hat", [model.bias])).ravel()[0])
        source = "stage-1 output w_hat"
    else:
        w, bias, source = model.dense_weights(), model.bias, "model weights"
    s = store_second_moments(store_path, model.n_features)
    out, info = sparsify_vector(w, s, method=method, nnz=nnz, epsilon=epsilon, delta=delta, seed=seed,
                                nnz_mode=nnz_mode)
    info.update({"source": source, "store": st.path, "store_id": st.manifest["store_id"],
                 "bound_dd": bound_constant(w, s, "dd"), "bound_mg": bound_constant(w, s, "mg")})
    meta = {k: v for k, v in model.meta.items() if k not in ("path", "n_paths_saved")}
    meta["sparsify"] = info
    meta["holdout"] = None
    return Model.from_dense(out, bias, meta=meta)
