"""Feature-selection stability: Cohen's kappa between selected-feature sets — ALGORITHMS.md §2
("Feature-selection stability", STSGD paper eqs. after (17) and (18)).

Sets are given as arrays of feature indices in [0, p) (any order; duplicates ignored), so nothing
of size p is ever allocated: cost O(|S1| log |S1| + |S2| log |S2|).

For S1, S2 ⊆ {0..p−1}: p11 = |S1∩S2|, p12 = |S1∖S2|, p21 = |S2∖S1|, p22 = p − p11 − p12 − p21,
q_o = (p11 + p22)/p, q_e = [(p11+p12)(p11+p21) + (p12+p22)(p21+p22)]/p², κ = (q_o − q_e)/(1 − q_e).
This equals ``sklearn.metrics.cohen_kappa_score`` on the two 0/1 indicator vectors.

Degenerate case [R]: q_e = 1 happens exactly when both sets are empty or both are the full set
{0..p−1}; then the two selections agree perfectly and κ = 1 (sklearn returns its
``replace_undefined_by``, NaN by default). Were q_e = 1 with S1 ≠ S2 (impossible for sets) κ = 0.
One set empty and the other full gives q_e = 0, q_o = 0, κ = 0 (as sklearn).
"""
import numpy as np

from pipeline.store.readlock import reads_store


def _as_set(s, p):
    a = np.unique(np.asarray(s, dtype=np.int64).ravel())
    if a.size and (a[0] < 0 or a[-1] >= p):
        raise ValueError(f"feature index out of range [0, {p})")
    return a


def cohen_kappa(set_a, set_b, p):
    """Cohen's κ of two selected-feature sets (index arrays) over p features; κ ∈ [−1, 1]."""
    p = int(p)
    if p <= 0:
        raise ValueError("p must be positive")
    a = _as_set(set_a, p)
    b = _as_set(set_b, p)
    p11 = int(np.intersect1d(a, b, assume_unique=True).size)
    p12 = int(a.size) - p11
    p21 = int(b.size) - p11
    p22 = p - p11 - p12 - p21
    # exact integer numerators, one division each
    num_e = (p11 + p12) * (p11 + p21) + (p12 + p22) * (p21 + p22)
    den = p * p
    if num_e == den:
        return 1.0 if p12 == 0 and p21 == 0 else 0.0
    # κ = (q_o − q_e)/(1 − q_e) = (p·(p11+p22) − num_e) / (p² − num_e)
    return float((p * (p11 + p22) - num_e) / (den - num_e))


def mean_pairwise_kappa(sets, p):
    """Stability ŝ = (1/(B(B−1))) Σ_i Σ_{j≠i} κ(S_i, S_j) over B ≥ 2 runs (κ is symmetric, so
    this is the mean over the B(B−1)/2 unordered pairs). Lies in [−1, 1]."""
    sets = [_as_set(s, int(p)) for s in sets]
    B = len(sets)
    if B < 2:
        raise ValueError("mean_pairwise_kappa needs at least two sets")
    total = 0.0
    for i in range(B):
        for j in range(i + 1, B):
            total += cohen_kappa(sets[i], sets[j], p)
    return total / (B * (B - 1) / 2)


@reads_store("store")
def stability_runs(store: str, algo: str, options: dict | None = None, *, runs: int = 10, passes: int = 5,
                   paths: int = 1, client=None, test_store: str | None = None, stage_blocks: int = 0,
                   placement: str = "paths", progress=None, seed: int = 0, max_density: float | None = None,
                   shuffle_window: int = 4) -> dict:
    """Train ``runs`` models of ``algo`` on ``store`` with seeds 0..runs−1 (different block and row orders)
    and report mean ± sd (ddof = 1) of the error (the RMSE on a regression store: ``metric``) and density and the
    mean pairwise Cohen's κ of the selected feature sets (non-zero weights). The error is measured on the store's holdout blocks, or on
    every block of ``test_store`` when given. Works for every registered algorithm."""
    from pipeline.evaluate import evaluate_store
    from pipeline.store.reader import open_store
    from pipeline.train import fit

    if runs < 2:
        raise ValueError(f"runs must be >= 2 to measure stability, got {runs}")
    p = open_store(store).n_features
    split = "all" if test_store else "holdout"
    errors, densities, sets, per_run = [], [], [], []
    metric = "error"
    for seed in range(seed, seed + runs):  # run r uses seed + r
        m = fit(store, algo, dict(options or {}), passes=passes, paths=paths, seed=seed, client=client,
                placement=placement, stage_blocks=stage_blocks, evaluate=False, max_density=max_density,
                shuffle_window=shuffle_window)
        res = evaluate_store(m, test_store or store, split, client)
        metric = "error" if "error" in res else "rmse"  # a regression store has no classification error
        errors.append(res[metric])
        densities.append(m.nnz / p)
        sets.append(m.coef_indices)
        tim = m.meta["provenance"]["timing"]
        per_run.append({"seed": seed, metric: res[metric], "density": m.nnz / p, "nnz": m.nnz,
                        "passes": m.meta["passes"], "nnz_per_s_kernel": tim["nnz_per_s_kernel"]})
        if progress:
            progress(per_run[-1])
    e, d = np.asarray(errors), np.asarray(densities)
    return {"algo": algo, "options": dict(options or {}), "store": str(store), "test_store": test_store,
            "split": split, "runs": runs, "passes": passes, "paths": paths, "n_features": p, "metric": metric,
            f"{metric}_mean": float(e.mean()), f"{metric}_sd": float(e.std(ddof=1)),
            "density_mean": float(d.mean()), "density_sd": float(d.std(ddof=1)),
            "kappa": float(mean_pairwise_kappa(sets, p)), "per_run": per_run}
