"""Diagnose learning against the synthetic ground truth, stage by stage (issue: models that learn at scale).

    python -m benchmarks.diagnose STORE TRUTH.npz --algo stsgd --passes 3 [--set KEY=VALUE ...]

Runs the engine in this process one stage at a time and prints, per stage: holdout error, density,
recall of the true support (true features kept / |truth|), precision, the gravity STSGD's rule picked,
the typical |w| of true and of noise features, and how many true features were purged in that stage
with their frequency ranks (1 = most frequent feature of the training split).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def load_truth(path: str, st=None):
    """(true feature ids, their weights); with a store ``st``, the ids its blocks use (:mod:`pipeline.store.order`),
    in the file's order."""
    z = np.load(path, allow_pickle=False)
    idx = np.asarray(z["indices"], dtype=np.int64)
    if st is not None and st.feature_order:
        from pipeline.store.order import ids_internal

        idx = ids_internal(idx, st.order_maps[0])
    return idx, np.asarray(z["values"], dtype=np.float64)


def support_scores(w: np.ndarray, truth_idx: np.ndarray) -> dict:
    """Recall and precision of the model's support S = {j : w_j != 0} against the true support."""
    nz = np.flatnonzero(w)
    kept = int(np.count_nonzero(w[truth_idx]))
    return {"nnz": int(nz.size), "recall": kept / max(1, truth_idx.size),
            "precision": kept / max(1, nz.size), "kept": kept}


ORACLE_C = 1000.0                   # scikit-learn's C (1 / (λ·n)) of the oracle fit: little shrinkage
Z_BANDS = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, np.inf)
DETECTABLE_Z = 3.0                  # a true feature the rows identify: oracle |z| ≥ 3


def truth_columns(store: str, tidx: np.ndarray, split: str = "train"):
    """(X restricted to the true columns ``tidx``, in that order, labels) of a store's ``split``, block by block: memory
    O(rows x |truth|) whatever the store's width and size."""
    import scipy.sparse as sp

    from pipeline.store.reader import open_store

    st = open_store(store)
    if st.feature_order:  # the blocks' ids of the true columns
        from pipeline.store.order import ids_internal

        tidx = ids_internal(tidx, st.order_maps[0])
    parts, ys = [], []
    for b in st.blocks(split):
        parts.append(b.X[:, tidx])
        ys.append(b.y)
    return sp.vstack(parts).tocsr(), np.concatenate(ys)


def oracle_fit(A, y, C: float = ORACLE_C):
    """L2 logistic regression (scikit-learn, C) on ``A`` = the training rows restricted to the true columns."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=C, max_iter=3000, tol=1e-7).fit(A, y)


def oracle_z(A, y, m=None) -> tuple[np.ndarray, np.ndarray]:
    """At the oracle fit ``m`` (:func:`oracle_fit`, made here when None): (|Wald z| = |w_j| / se_j of each true column,
    se from the inverse of the full Hessian; the fit's probabilities p_i): how far each true feature stands out of
    the noise these rows leave, with a perfect support."""
    m = oracle_fit(A, y) if m is None else m
    C = m.C
    w = m.coef_.ravel()
    p = 1.0 / (1.0 + np.exp(-(A @ w + m.intercept_[0])))
    H = (A.T @ A.multiply((p * (1.0 - p))[:, None])).toarray() + np.eye(A.shape[1]) / C
    return np.abs(w / np.sqrt(np.diag(np.linalg.inv(H)))), p


def band_recall(w: np.ndarray, tidx: np.ndarray, z_true: np.ndarray) -> dict:
    """Recall of the true support ``tidx`` per band of the oracle |z| (``Z_BANDS``; ``z_true`` in ``tidx``'s order)
    and of its detectable part (|z| ≥ ``DETECTABLE_Z``)."""
    kept = w[tidx] != 0
    out = {"detectable_recall": float(kept[z_true >= DETECTABLE_Z].mean())}
    for lo, hi in zip(Z_BANDS[:-1], Z_BANDS[1:]):
        band = (z_true >= lo) & (z_true < hi)
        out[f"z{lo:g}-{hi:g}"] = float(kept[band].mean()) if band.any() else None
    return out


def frequency_ranks(col_nnz: np.ndarray) -> np.ndarray:
    """rank[j] = 1 + position of feature j when features are sorted by decreasing frequency."""
    order = np.argsort(-col_nnz, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(1, order.size + 1)
    return rank


def diagnose(store: str, truth: str, algo: str, options: dict, passes: int, paths: int, seed: int = 0,
             stage_blocks: int = 0, shuffle_window: int = 4, out=print, cache_bytes: int = 4 << 30) -> list[dict]:
    from pipeline.algorithms import make_algorithm
    from pipeline.engine import DataRef, LocalExec, RunSpec, init_task, run_stages
    from pipeline.store.reader import open_store

    st = open_store(store)
    p = st.n_features
    tidx, tval = load_truth(truth, st)  # the engine's weights use the blocks' ids
    rank = frequency_ranks(np.asarray(st.feature_stats()["col_nnz"]))
    from pipeline.store.stats import calibrate

    alg = make_algorithm(algo, options)
    calibrate(alg, st)
    tr = st.entries("train")
    data = DataRef(st.path, st.manifest["manifest_version"], tuple(e["key"] for e in tr),
                   tuple(e["rows"] for e in tr), p, cache_bytes)
    holdout = (st.path, st.manifest["manifest_version"], tuple(e["key"] for e in st.entries("holdout")),
               st.label_kind)
    spec = RunSpec(seed=seed, n_paths=paths, end_pass=passes, stage_blocks=stage_blocks, window=shuffle_window)
    states = [init_task(alg, p, m, None) for m in range(paths)]
    gstate = alg.init_global(p)
    is_true = np.zeros(p, dtype=bool)
    is_true[tidx] = True
    rows = []
    t0 = time.time()
    while True:
        states, gstate, decision, hist = run_stages(LocalExec(), alg, states, gstate, data, spec, holdout,
                                                    max_stages=1)
        if not hist:
            break
        rec = hist[-1]
        w, _ = alg.weights(decision)
        sc = support_scores(w, tidx)
        aw = np.abs(w)
        row = {"stage": rec["stage"], "pass": rec["pass"], "error": (rec.get("holdout") or {}).get("error"),
               "auc": (rec.get("holdout") or {}).get("auc"), "density": sc["nnz"] / p, **sc,
               "median_abs_w_true": float(np.median(aw[tidx])),
               "median_abs_w_noise_nz": float(np.median(aw[(aw > 0) & ~is_true])) if sc["nnz"] > sc["kept"] else 0.0,
               "seconds": round(time.time() - t0, 1)}
        for k in ("g0", "beta", "stable", "purged", "d", "rejection"):
            if k in rec:
                row[k] = rec[k]
        if isinstance(decision, dict) and "purged" in decision and decision["purged"].any():
            purged = np.flatnonzero(np.unpackbits(decision["purged"], count=p))  # stsgd: packed bits
            pt = purged[is_true[purged]]
            row["true_purged"] = int(pt.size)
            row["true_purged_rank_median"] = int(np.median(rank[pt])) if pt.size else None
        out(json.dumps(row))
        rows.append(row)
        if alg.finished(gstate) or min(int(s["cursor"][0]) for s in states) >= passes:
            break
    return rows


def main(argv=None):
    from pipeline.algorithms import parse_setting

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("truth")
    ap.add_argument("--algo", default="stsgd")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--paths", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage-blocks", type=int, default=0)
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args(argv)
    opts = dict(parse_setting(a.algo, s) for s in a.set)
    diagnose(a.store, a.truth, a.algo, opts, a.passes, a.paths, a.seed, a.stage_blocks)


if __name__ == "__main__":
    main()
