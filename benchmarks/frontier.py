"""The refit's error–recall frontier: every point of several penalised paths on the fit rows, scored on the holdout.

Issue 12 asks, at 35k webspam-like rows, for holdout error ≤ LIBLINEAR's best AND ≥ 80% of the true support kept.
This benchmark asks whether any refit family gets both: on the support S of a sparse model (default: stsgd's
learner without refit), the validated path's fit rows (80% of the training rows, the refit's own split), it fits

- the lasso path at each l2 of ``refit.L2_GRID`` / n (:func:`pipeline.refit._lasso_path`);
- Zou's adaptive lasso (γ = 1) from the one-SE lasso entry (the default refit), from the lowest-loss lasso entry,
  and (γ = 1, 0.5) from a ridge fit on all of S (Zou's own start), λ from the start's λ (ridge: from the weighted
  λ_max) down by the path's steps;
- mixtures α·lasso + (1 − α)·adaptive of each lasso start and its best adaptive fit;
- the MCP penalty (Zhang 2010) by one local linear approximation step (Zou & Li 2008) from each lasso entry at the
  one-SE entry's l2, γ in ``MCP_GAMMAS``: a weighted lasso that leaves the large weights unpenalised and the others
  as the lasso's (where the adaptive lasso penalises the small ones more);

and scores every point: holdout error, non-zeros, recall and precision of the true support. The report gives, per
family, the lowest error, the lowest error with recall ≥ 0.8, and the highest recall at error ≤ ``--error-cap``.

    python -m benchmarks.frontier --store bench-out/learning/ws_35000_11.zarr \\
        --truth bench-out/learning/ws_35000_11.svm.truth.npz --model bench-out/learning/stsgd_--no-refit.npz
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks.common import report
from benchmarks.diagnose import load_truth
from benchmarks.learning import _matrix

MCP_GAMMAS = (1.0, 3.0, 10.0)
STEPS = 40  # at most this many λ points a path; each stops PATH_PATIENCE points after its best validation loss


def mcp_weights(theta, lam: float, h, gamma: float) -> np.ndarray:
    """One local linear approximation step of the MCP penalty (Zhang 2010; Zou & Li 2008) from w̃ = theta[:-1] at
    λ: weights a_j = p'(|w̃_j|)/λ = max(0, 1 − h_j·|w̃_j|/(γλ)), h_j the loss's curvature in w_j (λ/h_j is the
    lasso's shrinkage of w_j): a weight γ times its own shrinkage or more is not penalised, a zero one is
    penalised as by the lasso (a_j = 1)."""
    return np.maximum(0.0, 1.0 - np.asarray(h) * np.abs(np.asarray(theta)[:-1]) / (gamma * lam))


def main(argv=None):
    from distributed import Client

    from pipeline import refit as R
    from pipeline.cluster import local_cluster
    from pipeline.model import load_model
    from pipeline.store.reader import open_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--model", required=True, help="the sparse model whose support S is refitted")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--error-cap", type=float, default=0.10)
    a = ap.parse_args(argv)
    from pipeline.store.order import model_internal

    st = open_store(a.store)  # everything in the blocks' ids: the refit's problems use them
    tidx, _ = load_truth(a.truth, st)
    truth = np.zeros(st.n_features, dtype=bool)
    truth[tidx] = True
    m = model_internal(load_model(a.model), st)
    sup = np.sort(np.asarray(m.coef_indices, dtype=np.int64))
    Xho, yho = _matrix(a.store, "holdout", external=False)
    Xs = Xho[:, sup].tocsr()
    rows = sum(int(e["rows"]) for e in open_store(a.store).entries("train"))
    points = []

    def score(theta, family, **extra):
        nz = sup[theta[:-1] != 0]
        kept = int(truth[nz].sum())
        points.append({"family": family, "error": float(np.mean(yho * (Xs @ theta[:-1] + theta[-1]) <= 0)),
                       "nnz": int(nz.size), "recall": kept / tidx.size, "precision": kept / max(1, nz.size), **extra})
        print(json.dumps(points[-1]), flush=True)

    with local_cluster(a.workers, "auto") as cl, Client(cl) as client:
        l2s = [c / rows for c in R.L2_GRID]
        prob = R.RefitProblem(a.store, sup, l2=l2s[0], client=client, split=(R.VALIDATION_FRACTION,
                                                                              int(m.meta.get("seed", 0) or 0)))
        path, thetas, null = [], [], R._null_start(prob)
        for l2 in l2s:
            R._lasso_path(prob, path, thetas, l2, null, R.PATH_MAX_ITER, R.DEFAULT_TOL, R.PATH_PER_DECADE,
                          R.PATH_DECADES, R.PATH_PATIENCE, R.PATH_REFINE, "one-se")
        for e, th in zip(path, thetas):
            score(th, f"lasso, l2 = {e['l2'] * rows:g}/n", l1=e["l1"], val_loss=e["val_loss"])
        lasso = list(range(len(path)))
        starts = {"one-SE lasso": R._choose(prob, path, thetas, lasso, "one-se"),
                  "lowest-loss lasso": min(lasso, key=lambda i: path[i]["val_loss"])}

        def adaptive(start, a, lam0, l2, gamma, family):
            """The adaptive path (pipeline.refit.adaptive_path) scored point by point; its best theta."""
            seg, ths = [], []
            top = R.adaptive_path(prob, seg, ths, start, a, lam0, l2, gamma, R.PATH_MAX_ITER, R.DEFAULT_TOL,
                                  R.PATH_PER_DECADE, STEPS, R.PATH_PATIENCE)
            for e, th in zip(seg, ths):
                score(th, family, val_loss=e["val_loss"])
            return ths[top]

        for name, i in starts.items():
            best = adaptive(thetas[i], R.adaptive_weights(thetas[i], 1.0), path[i]["l1"], path[i]["l2"], 1.0,
                            f"adaptive γ = 1 from the {name}")
            for alpha in (0.25, 0.5, 0.75):
                score(alpha * thetas[i] + (1 - alpha) * best, f"mixture with the {name}", alpha=alpha)
        l2 = path[starts["one-SE lasso"]]["l2"]
        s2 = prob.precondition() ** 2  # the Hessian's diagonal at its largest: the lasso shrinks w_j by ~λ/s_j²
        for i in lasso:
            if path[i]["l2"] != l2 or path[i].get("refined") or not np.any(thetas[i][:-1]):
                continue
            lam = path[i]["l1"]
            for gamma in MCP_GAMMAS:
                a_m = mcp_weights(thetas[i], lam, s2, gamma)
                th, _ = R.solve(prob, thetas[i], lam, "fit", R.PATH_MAX_ITER, R.DEFAULT_TOL, weights=a_m, l2=l2)
                tot = prob.sums(th[:-1], th[-1], "val")
                score(th, f"MCP γ = {gamma:g}, one LLA step from the lasso", l1=lam, val_loss=float(tot[0] / tot[2]))
        ridge, _ = R.solve(prob, null[0], 0.0, "fit", R.PATH_MAX_ITER, R.DEFAULT_TOL, l2=l2)
        g = np.abs(prob.evaluate(null[0], "fit", l2)[1][:-1])
        for gamma in (1.0, 0.5):
            a_r = R.adaptive_weights(ridge, gamma)
            lam_max = float(np.max(g[a_r > 0] / a_r[a_r > 0]))  # the weighted lasso's λ_max at w = 0
            adaptive(null[0], a_r, lam_max * 10.0 ** (-1 / R.PATH_PER_DECADE), l2, gamma,
                     f"adaptive γ = {gamma:g} from a ridge fit on S")
    summary = []
    for fam in dict.fromkeys(p["family"] for p in points):
        ps = [p for p in points if p["family"] == fam]
        hi = [p for p in ps if p["recall"] >= 0.8]
        capped = [p for p in ps if p["error"] <= a.error_cap]
        best = min(ps, key=lambda p: p["error"])
        summary.append({"family": fam, "points": len(ps), "lowest_error": best["error"], "nnz": best["nnz"],
                        "recall": best["recall"],
                        "lowest_error_recall_0.8": min((p["error"] for p in hi), default=None),
                        "max_recall": max(p["recall"] for p in ps),
                        "max_recall_at_error_cap": max((p["recall"] for p in capped), default=None)})
    report("frontier", {"store": a.store, "model": a.model, "support": int(sup.size), "fit_rows_share":
                        1 - R.VALIDATION_FRACTION, "points": points}, summary,
           ["family", "points", "lowest_error", "nnz", "recall", "lowest_error_recall_0.8", "max_recall",
            "max_recall_at_error_cap"])


if __name__ == "__main__":
    main()
