"""What the rows allow: the oracle bound on holdout error at a given recall of the true support (issue 12).

Issue 12 asks, at 35k webspam-like rows, for holdout error ≤ LIBLINEAR's best over C AND ≥ 80% of the true support
kept. This benchmark measures what any selector could reach on the same rows, using the generator's ground truth:

1. **Oracle fit**: L2 logistic regression on the truth's columns only (the training rows; scikit-learn, best C of
   ``L2_C`` on the holdout). Its holdout error is the estimation floor with a perfect support; its Wald statistics
   z_j = w_j / se_j (se from the inverse of the full Hessian over the truth's columns) say how far each true feature
   stands out of the noise these rows leave.
2. **Score statistics of every other column at the oracle fit** (:func:`score_z`), ~N(0, 1) for a column without
   signal.
3. **The ideal thresholding selector at recall r**: the true columns with |z| ≥ q_r (q_r the (1 − r) quantile of the
   true |z|) and every other column whose score |z| ≥ q_r, refitted by L2 logistic regression on the union (best C of
   ``L2_C`` on the holdout). It is handed the true model's fit, so no selector that thresholds per-column evidence
   at a fitted model does better. The other columns come from all columns, from those seen ≥ ``MIN_COUNT`` times, and
   from those at least as frequent as the rarest true one (the generator draws the truth among its most frequent
   ranks: knowledge no method has). Rare columns cost little holdout error (they seldom occur there) but count in
   the density: a variant past issue 12's 0.1% (``MAX_DENSITY``) does not meet the target whatever its error.
4. **Each model** (ours through the CLI with defaults, LIBLINEAR's L1-LR at ``--C``): holdout error, non-zeros, recall,
   and recall per band of the oracle |z|; "detectable recall" is the recall of the true features with |z| ≥ 3.

    python -m benchmarks.oracle [--rows 35000] [--seed 11] [--algos stsgd] [--C 5,7] [--recalls ...]
                                [--store S --truth T]

The oracle fit reads only the true columns, block by block; the ideal selector (``--recalls``) and LIBLINEAR (``--C``)
need the whole training matrix in memory: at 350k rows give ``--C '' --recalls ''``.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks.common import algo_specs, out_dir, report
from benchmarks.diagnose import DETECTABLE_Z, ORACLE_C, Z_BANDS, load_truth, oracle_fit, oracle_z, truth_columns
from benchmarks.learning import _matrix, _metrics, liblinear, ours, store_arguments, store_of
from benchmarks.webspam import truth_floor

L2_C = (10.0, 100.0, ORACLE_C)     # C grid of the L2 refits (scikit-learn's C: 1 / (λ·n))
MAX_DENSITY = 1e-3                 # issue 12's density limit at 35k rows (0.1%)
MIN_COUNT = 100                    # a frequency floor any user could set (the score z of rarer columns is not normal)


def _l2_fit(Xtr, ytr, Xho, yho) -> dict:
    """L2 logistic regression over ``L2_C``: the C with the lowest holdout error, its metrics, and every C's fit
    ("fits")."""
    best, fits = None, {}
    for C in L2_C:
        m = fits[C] = oracle_fit(Xtr, ytr, C)
        r = {"C": C, **_metrics(Xho @ m.coef_.ravel() + m.intercept_[0], yho)}
        best = r if best is None or r["error"] < best["error"] else best
    return {**best, "fits": fits}


def score_z(Xtr, ytr, p) -> np.ndarray:
    """|score z| of every column at a fit with probabilities ``p``:
    |Σ_i x_ij (y_i − p_i)| / sqrt(Σ_i x_ij² p_i (1 − p_i)) (0 for a column without entries)."""
    Xc = Xtr.tocsc()
    u = np.asarray(Xc.T @ ((ytr > 0) - p)).ravel()
    v = np.asarray(Xc.multiply(Xc).T @ (p * (1.0 - p))).ravel()
    z = np.zeros(Xtr.shape[1])
    seen = v > 0
    z[seen] = np.abs(u[seen]) / np.sqrt(v[seen])
    return z


def ideal_selector(Xtr, ytr, Xho, yho, tidx, z_true, z_all, recall: float, pool: np.ndarray | None) -> dict:
    """The ideal thresholding selector at ``recall`` (module docstring, 3.), other columns restricted to ``pool``."""
    q = float(np.quantile(z_true, 1.0 - recall))
    other = z_all >= q
    other[tidx] = False
    if pool is not None:
        other &= pool
    cols = np.union1d(tidx[z_true >= q], np.flatnonzero(other))
    fit = _l2_fit(Xtr[:, cols], ytr, Xho[:, cols], yho)
    return {"threshold_z": round(q, 3), "true_kept": int((z_true >= q).sum()), "others": int(other.sum()),
            "density": cols.size / Xtr.shape[1], "within_density": cols.size <= MAX_DENSITY * Xtr.shape[1],
            "error": fit["error"], "auc": fit["auc"], "C": fit["C"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_arguments(ap, "stsgd", "5,7")
    ap.add_argument("--recalls", default="0.67,0.75,0.8,0.85", help="recalls of the ideal selector")
    a = ap.parse_args(argv)
    store, truth = store_of(a)
    tidx = np.sort(load_truth(truth)[0])
    Xho, yho = _matrix(store, "holdout")
    recalls = [float(x) for x in a.recalls.split(",") if x]
    Cs = [float(c) for c in a.C.split(",") if c]
    if recalls or Cs:  # the whole training matrix (in memory: at 35k rows, not at 350k)
        Xtr, ytr = _matrix(store, "train")
        A = Xtr[:, tidx]
    else:
        Xtr, (A, ytr) = None, truth_columns(store, tidx)
    oracle = _l2_fit(A, ytr, Xho[:, tidx], yho)
    z_true, p = oracle_z(A, ytr, oracle["fits"][ORACLE_C])
    del A
    rows = [{**truth_floor(store, truth), "model": "truth's own weights"},
            {"model": f"oracle: L2 fit on the true columns (C={oracle['C']:g})", "error": oracle["error"],
             "auc": oracle["auc"], "nnz": int(tidx.size), "recall": 1.0}]
    bound = []
    if recalls:
        z_all = score_z(Xtr, ytr, p)
        col_nnz = np.diff(Xtr.tocsc().indptr)
        pools = (("all columns", None), (f"columns seen ≥ {MIN_COUNT} times", col_nnz >= MIN_COUNT),
                 ("generator's pool", col_nnz >= col_nnz[tidx].min()))
        for r in recalls:
            for name, pool in pools:
                bound.append({"recall": r, "others_from": name,
                              **ideal_selector(Xtr, ytr, Xho, yho, tidx, z_true, z_all, r, pool)})
                print(json.dumps(bound[-1]), flush=True)
    work = out_dir() / "oracle"
    work.mkdir(parents=True, exist_ok=True)
    for algo, extra in algo_specs(a.algos):
        rows.append(ours(store, algo, extra, a.passes, a.workers, Xho, yho, tidx, work, z_true))
        print(json.dumps(rows[-1]), flush=True)
    for C in Cs:
        rows.append(liblinear(Xtr, ytr, Xho, yho, tidx, C, z_true))
        print(json.dumps(rows[-1]), flush=True)
    bands = {f"z{lo:g}-{hi:g}": int(((z_true >= lo) & (z_true < hi)).sum())
             for lo, hi in zip(Z_BANDS[:-1], Z_BANDS[1:])}
    report("oracle", {"store": store, "truth": truth, "true_per_z_band": bands,
                      "detectable": int((z_true >= DETECTABLE_Z).sum()), "bound": bound, "results": rows},
           rows, ["model", "error", "auc", "nnz", "recall", "detectable_recall", *bands])
    if not bound:
        return
    print("\nThe ideal thresholding selector (handed the oracle fit):")
    report("oracle_bound", {"store": store, "bound": bound}, bound,
           ["recall", "others_from", "threshold_z", "true_kept", "others", "density", "within_density", "error", "C"])


if __name__ == "__main__":
    main()
