"""Refit of a selected support (relaxed lasso; Meinshausen 2007; ALGORITHMS.md §8).

After a sparse learner has chosen S = {j : w_j ≠ 0}, :func:`refit` minimises the L2-regularised mean loss over
weights supported on S only, plus an unregularised bias:

    F(w, b) = (1/n) Σ_{training rows} ℓ(x_S·w + b, y) + (l2/2)·‖w‖²

Every function evaluation is exact and full-batch: a map over the store's training blocks (holdout blocks are
never read), each task computing the block's loss sum and gradient restricted to S with a numba kernel
(:mod:`pipeline.kernels.refit`), the results tree-reduced (the engine's executors and ``tree``, as in
:mod:`pipeline.evaluate`); scipy's L-BFGS-B runs on the client in |S| + 1 dimensions, started from the sparse
model's own weights. Each worker compacts a block to the columns of S once and keeps it (keyed by store,
manifest version, block and a hash of S, bounded in bytes), so later evaluations cost O(non-zeros in S).

Loss: the model's training loss when it is smooth (logistic, squared); a model trained with hinge loss (or
without a loss, e.g. nssl) is refitted with logistic loss on binary labels (smooth, and its log-loss is a
calibrated score); regression stores always use squared loss.

The refitted model keeps the original metadata plus ``meta["refit"]`` (l2, loss, iterations, evaluations,
objective, gradient norm, seconds, support size, pre-refit holdout metrics and non-zeros). Its support is S
(a weight that comes out exactly 0 is dropped; no column outside S can become non-zero). The sparse
algorithm's optimiser state is dropped: it describes the pre-refit weights, so a refitted model used as
``--init-model`` warm-starts from the refitted weights instead of resuming the old state.
"""
from __future__ import annotations

import hashlib
import threading
import time

import numpy as np

from pipeline.kernels import refit as K
from pipeline.kernels.losses import LOGISTIC, SQUARED

# l2 (on the mean loss) for L2-normalised rows, measured on synthetic webspam-like stores (20k features, 100
# non-zeros per row, 2k-16k rows, TG-selected supports of 250-1,500 columns): 1e-5 gave the lowest holdout
# log-loss among 1e-6..1e-2 at every size (1e-6 overfits the larger supports at 2k rows; 1e-4 and above shrink
# the weights back, undoing what the refit is for). On a small, clean support (the true one) 1e-6 is better.
# At webspam width (35k rows x 16.6M features, supports of 1.8k-12k columns chosen by ftrl/stsgd defaults) the
# lowest holdout error was at 1e-7 (stsgd: 1e-5 17.2%, 1e-6 13.5%, 1e-7 12.9%, 1e-8 13.1%; ftrl: 1e-6 12.7%,
# 1e-7 11.7%). So the default is relative to the training rows, L2_PER_ROW / n: 1e-7 at 31k rows, 1.5e-6 at 2k.
DEFAULT_L2 = None
L2_PER_ROW = 3e-3
DEFAULT_MAX_ITER = 100
DEFAULT_TOL = 1e-6
# Compacted blocks are cached per worker between evaluations; when a worker's share does not fit, every
# evaluation re-reads and re-compacts its blocks (at webspam scale a 1 GiB budget made each evaluation a full
# decode of the store). 4 GiB holds a 2-worker share of a 16.6M-feature store's compaction to ~20k columns.
DEFAULT_CACHE_BYTES = 4 << 30
SCATTER_BYTES = 1 << 16  # a larger weight vector goes to the workers scattered, once per evaluation


def refit_loss(model, label_kind: str | None = None, loss: str | None = None) -> str:
    """The loss the refit uses: ``loss`` if given, else the model's when smooth, else logistic (squared for
    regression stores)."""
    kind = label_kind or model.meta.get("label_kind", "binary")
    if loss is None:
        loss = (model.meta.get("hyper") or {}).get("loss")
        loss = loss if loss in ("logistic", "squared") else "logistic"
        if kind == "regression":
            loss = "squared"
    if loss not in ("logistic", "squared"):
        raise ValueError(f"refit loss must be logistic or squared, got {loss!r}")
    if loss == "logistic" and kind == "regression":
        raise ValueError("refit: logistic loss needs binary labels; this store has regression targets")
    return loss


def support_signature(support: np.ndarray, n_features: int) -> str:
    return hashlib.blake2b(np.ascontiguousarray(support, dtype=np.int64).tobytes() + str(n_features).encode(),
                           digest_size=12).hexdigest()


# ------------------------------------------------------------------------------------- worker side

_BITS: dict = {}
_BITS_LOCK = threading.Lock()
_COMPACT = None


def _bitmap(support, sig, n_features):
    """The support's bitmap of the width, once per worker process and support (the last two kept)."""
    with _BITS_LOCK:
        hit = _BITS.get(sig)
    if hit is None:
        hit = K.support_bitmap(np.asarray(support, dtype=np.int64), int(n_features))
        with _BITS_LOCK:
            while len(_BITS) >= 2:
                _BITS.pop(next(iter(_BITS)))
            _BITS[sig] = hit
    return hit


def compacted(data, b: int, support, sig: str, cache_bytes: int = DEFAULT_CACHE_BYTES):
    """Training block ``b`` of ``data`` (an engine DataRef) restricted to S: (cindptr, cidx, cval, y), cached per
    worker process by (store, manifest version, block key, signature of S)."""
    global _COMPACT
    from pipeline.engine import BlockCache

    if _COMPACT is None:
        with _BITS_LOCK:
            if _COMPACT is None:
                _COMPACT = BlockCache()

    def build():
        indptr, indices, values, y = data.load(b)
        bits = _bitmap(support, sig, data.n_features)
        ci, cj, cv = K.compact_block(indptr, indices, values, np.asarray(support, dtype=np.int64), bits)
        return ci, cj, cv, np.asarray(y, dtype=np.float64)

    return _COMPACT.get((data.store, data.version, data.keys[b], sig), build, cache_bytes)


def block_task(data, b: int, support, sig: str, w, bias: float, code: int, cache_bytes: int) -> np.ndarray:
    """One block's partial sums as one vector: [Σ loss, Σ ℓ' (bias gradient), rows, Σ ℓ'·x_S (s entries)]."""
    ci, cj, cv, y = compacted(data, b, support, sig, cache_bytes)
    out = np.empty(3 + len(w), dtype=np.float64)
    total, gbias = K.loss_grad(ci, cj, cv, y, np.asarray(w, dtype=np.float64), float(bias), code, out[3:])
    out[0], out[1], out[2] = total, gbias, y.shape[0]
    return out


def _add(a, b):
    return a + b


# ------------------------------------------------------------------------------------- client side

class RefitProblem:
    """F(w, b) and its gradient over the training blocks of a store, for weights on ``support``."""

    def __init__(self, store_path: str, support, *, l2: float, loss: str = "logistic", client=None,
                 blocks=None, cache_bytes: int = DEFAULT_CACHE_BYTES):
        from pipeline.engine import DataRef, DaskExec, LocalExec
        from pipeline.store.reader import open_store

        st = open_store(store_path)
        keep = None if blocks is None else set(blocks)
        entries = [e for e in st.entries("train") if keep is None or e["key"] in keep]  # never the holdout
        if not entries:
            raise ValueError(f"{store_path}: no training blocks")
        if l2 is None:
            l2 = L2_PER_ROW / max(1, sum(int(e["rows"]) for e in entries))
        if l2 < 0:
            raise ValueError(f"refit l2 must be >= 0, got {l2}")
        self.support = np.ascontiguousarray(support, dtype=np.int64)
        if self.support.size and (np.any(np.diff(self.support) <= 0) or self.support[0] < 0):
            raise ValueError("support must be sorted, unique, non-negative column ids")
        self.l2, self.loss, self.code = float(l2), loss, {"logistic": LOGISTIC, "squared": SQUARED}[loss]
        self.data = DataRef(st.path, st.manifest["manifest_version"], tuple(e["key"] for e in entries),
                            tuple(e["rows"] for e in entries), st.n_features, int(cache_bytes))
        self.n_rows = int(sum(e["rows"] for e in entries))
        self.label_kind = st.label_kind
        self.sig = support_signature(self.support, st.n_features)
        self.cache_bytes = int(cache_bytes)
        self.client = client
        self.ex = DaskExec(client) if client is not None else LocalExec()
        self.sup_ref = client.scatter(self.support, broadcast=True) if client is not None else self.support
        self.evaluations = 0
        self.eval_seconds = 0.0

    def sums(self, w, bias) -> np.ndarray:
        """Sum over all training blocks of :func:`block_task`'s vector (a fixed tree: deterministic)."""
        from pipeline.engine import tree

        w = np.asarray(w, dtype=np.float64)
        if self.client is not None and w.nbytes > SCATTER_BYTES:  # once per evaluation, not once per block task
            w = self.client.scatter(w, broadcast=True, hash=False)
        parts = [self.ex.submit_pinned(b, block_task, self.data, b, self.sup_ref, self.sig, w, float(bias),
                                       self.code, self.cache_bytes) for b in range(len(self.data.keys))]
        return self.ex.result(tree(self.ex, parts, _add))

    def evaluate(self, theta) -> tuple[float, np.ndarray]:
        """F and ∇F at theta = [w (|S| entries), bias]."""
        t0 = time.perf_counter()
        theta = np.asarray(theta, dtype=np.float64)
        w, bias = theta[:-1], theta[-1]
        tot = self.sums(w, bias)
        n = tot[2]
        f = tot[0] / n + 0.5 * self.l2 * float(w @ w)
        g = np.empty_like(theta)
        g[:-1] = tot[3:] / n + self.l2 * w
        g[-1] = tot[1] / n
        self.evaluations += 1
        self.eval_seconds += time.perf_counter() - t0
        return float(f), g


def refit(model, store_path: str, client=None, l2: float = DEFAULT_L2, max_iter: int = DEFAULT_MAX_ITER,
          loss: str | None = None, tol: float = DEFAULT_TOL, blocks=None,
          cache_bytes: int = DEFAULT_CACHE_BYTES):
    """The model refitted on its own support S with an L2 penalty (see the module docstring); returns a new
    :class:`pipeline.model.Model` (no optimiser state; ``meta["refit"]`` records the refit)."""
    from scipy.optimize import minimize

    from pipeline.model import Model

    t0 = time.time()
    if max_iter < 1:
        raise ValueError(f"refit max_iter must be >= 1, got {max_iter}")
    support = np.asarray(model.coef_indices, dtype=np.int64)
    order = np.argsort(support, kind="stable")
    support, w0 = support[order], np.asarray(model.coef_values, dtype=np.float64)[order]
    from pipeline.store.reader import open_store

    loss = refit_loss(model, open_store(store_path).label_kind, loss)
    prob = RefitProblem(store_path, support, l2=l2, loss=loss, client=client, blocks=blocks, cache_bytes=cache_bytes)
    x0 = np.append(w0, float(model.bias))
    f0, g0 = prob.evaluate(x0)
    res = minimize(prob.evaluate, x0, jac=True, method="L-BFGS-B",
                   options={"maxiter": int(max_iter), "gtol": float(tol), "ftol": 1e-12, "maxcor": 20})
    x = res.x
    f, g = (float(res.fun), np.asarray(res.jac)) if res.jac is not None else prob.evaluate(x)
    w, bias = x[:-1], float(x[-1])
    keep = w != 0.0
    secs = time.time() - t0
    meta = dict(model.meta)
    meta["refit"] = {
        "l2": prob.l2, "loss": loss, "support": int(support.size), "iterations": int(res.nit),
        "evaluations": int(prob.evaluations), "objective": f, "objective_start": f0,
        "grad_norm": float(np.linalg.norm(g)), "grad_max": float(np.max(np.abs(g))),
        "grad_norm_start": float(np.linalg.norm(g0)), "converged": bool(res.success),
        "message": str(res.message), "seconds": round(secs, 3),
        "seconds_per_evaluation": round(prob.eval_seconds / max(1, prob.evaluations), 4),
        "n_rows": prob.n_rows, "nnz_before": model.nnz,
        "holdout_before": model.meta.get("holdout"), "bias_before": float(model.bias),
    }
    meta.pop("n_paths_saved", None)
    meta["holdout"] = None  # the sparse model's metrics are in meta["refit"]["holdout_before"]; fit() re-measures
    return Model(model.n_features, support[keep], w[keep], bias, meta=meta, states=None, gstate=None)
