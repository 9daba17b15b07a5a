"""Metrics on held-out blocks: per block partials, merged in a tree, then reduced to numbers (ALGORITHMS.md §6).

The error counts rows whose predicted label (the one `predict` writes: +1 where f > 0, else −1) is not y.
AUC is exact (average ranks over all scores of the split); log-loss and hinge use the raw score f = w·x + b.
Regression stores get RMSE.
"""
from __future__ import annotations

import os

import numpy as np

from pipeline.kernels import numba_started
from pipeline.store.readlock import reads_store


def scores(block, w: np.ndarray, bias: float) -> np.ndarray:
    """f = w·x + b for every row of a block; features the model has never seen (j >= len(w)) count 0."""
    return csr_scores(block.indptr, block.indices, block.data, w, bias)


def csr_scores(indptr, indices, data, w: np.ndarray, bias: float) -> np.ndarray:
    """f_i = bias + Σ_k w[indices[k]]·data[k] over the entries of CSR row i; indices >= len(w) count 0.

    With numba started in this process, the kernel (:func:`pipeline.kernels.sgd.predict_block`); otherwise NumPy:
    ``np.bincount`` adds each row's products in entry order starting from 0.0, the kernel's sums bit for bit
    (tested), ~2.5x slower per non-zero but without numba's ~0.6 s start."""
    w = np.ascontiguousarray(w, dtype=np.float64)
    n = indptr.shape[0] - 1
    if numba_started():
        from pipeline.kernels.sgd import predict_block

        out = np.empty(n, dtype=np.float64)
        predict_block(indptr, indices, data, w, float(bias), out)
        return out
    lo, hi = indptr[0], indptr[-1]
    rows = np.repeat(np.arange(n), np.diff(indptr))
    indices, data = indices[lo:hi], data[lo:hi]
    keep = indices < w.shape[0]
    if not keep.all():
        rows, indices, data = rows[keep], indices[keep], data[keep]
    return float(bias) + np.bincount(rows, weights=w[indices] * data, minlength=n)


def block_partial(block, w, bias) -> dict:
    return {"f": scores(block, w, bias), "y": block.y}


def merge_partials(a: dict, b: dict) -> dict:
    return {"f": np.concatenate([a["f"], b["f"]]), "y": np.concatenate([a["y"], b["y"]])}


def auc(f: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney with average ranks for ties); NaN with one class only."""
    pos = y > 0
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0 or np.isnan(f).any():
        return float("nan")
    r = average_ranks(f)
    return float((r[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def average_ranks(f: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``f``, ties sharing their average rank: scipy.stats.rankdata(f) without importing
    scipy.stats (~0.5 s of a short command)."""
    n = f.shape[0]
    order = np.argsort(f, kind="mergesort")
    fs = f[order]
    new = np.empty(n, dtype=bool)
    new[:1] = True
    np.not_equal(fs[1:], fs[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n)
    r = np.empty(n, dtype=np.float64)
    r[order] = (0.5 * (starts + ends + 1))[np.cumsum(new) - 1]
    return r


def metrics_from_partial(part: dict, kind: str = "binary") -> dict:
    f, y = part["f"], part["y"]
    n = int(f.shape[0])
    if n == 0:
        return {"n_rows": 0}
    if kind == "regression":
        r = f - y
        return {"n_rows": n, "rmse": float(np.sqrt(np.mean(r * r))), "mae": float(np.mean(np.abs(r)))}
    m = y * f
    logloss = np.maximum(-m, 0.0) + np.log1p(np.exp(-np.abs(m)))
    # error: the labels `predict` writes (+1 where f > 0, else -1) against y; a score of exactly 0 is -1 there
    return {"n_rows": n, "error": float(np.mean(np.where(f > 0, 1.0, -1.0) != y)), "auc": auc(f, y), "logloss": float(np.mean(logloss)),
            "hinge": float(np.mean(np.maximum(0.0, 1.0 - m))),
            "positive_fraction": float(np.mean(y > 0))}


@reads_store("store_path")
def evaluate_store(model, store_path: str, split: str = "holdout", client=None, blocks=None) -> dict:
    """Metrics of ``model`` on a split of a store (map over blocks, tree-merge the partials); ``blocks`` (keys)
    restricts the split to those blocks (e.g. the newest generation's holdout); ``model`` may be a path."""
    from pipeline.engine import DaskExec, LocalExec, eval_task, tree
    from pipeline.model import load_model
    from pipeline.store.order import model_internal
    from pipeline.store.reader import open_store

    if isinstance(model, (str, os.PathLike)):
        model = load_model(model, state=False)
    st = open_store(store_path)
    model = model_internal(model, st)  # the blocks' ids
    entries = st.entries(split, blocks)
    if not entries:
        if blocks:
            why = " among the given ones"
        elif split == "holdout":  # a store of one block (a file under --block-mb) has no holdout
            why = "; evaluate on a test store with --split all, or ingest with a smaller --block-mb"
        else:
            why = ""
        raise ValueError(f"{store_path}: no blocks in split {split!r}{why}")
    st.expect_reads(entries)
    ex = DaskExec(client) if client is not None else LocalExec()
    w = client.scatter(model.dense_weights(), broadcast=True, hash=False) if client is not None else model.dense_weights()
    version = st.manifest["manifest_version"]
    parts = [ex.submit(eval_task, st.path, version, e["key"], w, model.bias) for e in entries]
    res = metrics_from_partial(ex.result(tree(ex, parts, merge_partials)), st.label_kind)
    res.update({"split": split, "store": st.path, "blocks": len(entries), "nnz": model.nnz, "density": model.density,
                "n_features": model.n_features})
    if model.n_features > st.n_features:  # weights on columns the store never has: they score nothing here
        res["nnz_beyond_store"] = int(np.count_nonzero(model.coef_indices >= st.n_features))
        res["n_features_store"] = st.n_features
    return res
