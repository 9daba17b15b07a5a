"""SCD: stochastic coordinate descent for (1/m)Σℓ(w·x_i, y_i) + λ‖w‖₁ (ALGORITHMS.md §5, (E-7)–(E-9)).

Column access, out of core — how it is provided: the engine streams *row* blocks, so every pass (= one stage, one
path, ``path_mode = "split"``) ``advance`` only collects copies of the training blocks it is handed into private
``_blk*`` keys of the path's private copy (copies: :meth:`Algorithm.advance`). In
``end_stage`` (same task, once the whole training set has been seen) the rows are stacked, put in a canonical order
(sorted by a content hash, so the row order does not depend on the pass's block order or the engine's grouping) and
converted to an in-memory CSC copy (cached per process, keyed by the hashes), ``scan`` × d coordinate steps run on
it, and the collected blocks are dropped from the state (they never travel or get saved). So SCD needs the *training
set* to fit in memory twice (the collected rows and their CSC copy, until ``end_stage`` drops the rows): it is meant
for the real sets of the study, not for webspam-scale stores. An out-of-memory variant would write a transposed
column-block store once and stream column blocks (an engine "column pass" would be the engine change).

State (all saved, so resume is exact): ``w``, the cached margins ``z = Xw`` (canonical row order), the scan
counter (the coordinate draws of scan k come from ``default_rng([seed, k])``). No bias (as in the paper).
One path only. Hinge is not smooth and is rejected.

Curvature (the step is 1/β_j on coordinate j, the threshold λ/β_j). ℓ'' ≤ β with β = 1/4 (logistic) or 1
(squared), so the second derivative of the mean loss along coordinate j is (1/m)·Σ_i ℓ''(z_i)·x_ij² ≤
β·(1/m)·Σ_i x_ij² =: β_j, and the prox step on the quadratic majoriser with β_j never increases the objective.
* ``curvature = "column"`` (default): β_j = β·mean_i x_ij² over the training rows (zeros included), the
  tightest bound of this form (the curvature of the loss itself is only known to be ≤ β); β·max_i x_ij² would
  also be a bound, but it is looser by a factor of at least m/nnz_j (a column with few non-zeros, e.g. a rare
  word, would get a step m/nnz_j times shorter), so it is not offered.
  Why it is the default: when |x_ij| ≤ 1 (the paper's assumption) β_j ≤ β, so the quadratic majoriser is never
  looser than the paper's and the guaranteed decrease per step is at least as large; when |x_ij| > 1 (dexter's
  raw counts) the paper's β is not a bound at all (the step overshoots and the objective can increase, see
  tests/test_baselines.py) while β_j still is. Measured (dexter, λ = 1e-3, 3 scans of d steps): objective 0.0158 vs 1.156
  with the paper's β. Cost: one pass over the column values when the CSC copy is built (cached with it). An
  empty column has β_j = 0 and w_j is set to 0 (λ > 0).
* ``curvature = "paper"``: β_j = β for every j, the ECML/Shalev-Shwartz–Tewari step (assumes |x_ij| ≤ 1).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from pipeline.algorithms.base import Algorithm, check_choice, check_nonnegative, check_positive
from pipeline.algorithms.nssl import nnz_diag
from pipeline.kernels import ecml as K
from pipeline.kernels.losses import LOSS_CODES

PAPER = "Shalev-Shwartz & Tewari, ICML 2009"  # the baseline ALGORITHMS.md §5 names (the section's paper is Xie et al.)

BETA = {"logistic": 0.25, "squared": 1.0}
CURVATURES = ("column", "paper")
_CSC_CACHE: "OrderedDict[tuple, tuple]" = OrderedDict()


@dataclass(frozen=True)
class SCDParams:
    loss: str = "logistic"
    lam: float = 1e-4
    scan: float = 1.0               # coordinate steps per stage, as a multiple of d
    seed: int = 0
    curvature: str = "column"       # "column": β_j = β·mean_i x_ij² | "paper": β_j = β (assumes |x_ij| ≤ 1)

    def __post_init__(self):
        if self.loss not in BETA:
            raise ValueError(f"loss must be one of {', '.join(BETA)} (SCD needs a smooth loss), got {self.loss!r}")
        check_nonnegative("lam", self.lam)
        check_positive("scan", self.scan)
        check_choice("curvature", self.curvature, CURVATURES)


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def row_hashes(indptr, indices, data, y) -> np.ndarray:
    """uint64[m, 2]: two independent 64-bit hashes of each row's content {(j, x_ij)} and label, vectorised.

    Each non-zero (j, bits of x_ij as float64) is mixed into a 64-bit value, the values of a row are summed
    (mod 2⁶⁴: a hash of the row's set of pairs, so the order of the row's entries does not matter) and the
    label's bits are mixed in; the second hash uses other seeds. 128 bits: equal hashes mean equal rows."""
    j = np.asarray(indices).astype(np.uint64)
    v = np.asarray(data, dtype=np.float64).view(np.uint64)
    lab = np.asarray(y, dtype=np.float64).view(np.uint64)
    ptr = np.asarray(indptr, dtype=np.int64)
    out = np.empty((ptr.shape[0] - 1, 2), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for c, seed in enumerate((np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03))):
            pair = _mix(_mix(j ^ seed) + v)
            cs = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(pair, dtype=np.uint64)])
            out[:, c] = _mix((cs[ptr[1:]] - cs[ptr[:-1]]) ^ _mix(lab + seed))
    return out


def column_copy(blocks: list, n_features: int):
    """CSC (indptr, row indices, values, y, mean_i x_ij²) of the collected training rows in canonical order.

    ``blocks`` are (indptr, indices, data, y) as the engine handed them (its grouping and order change from
    pass to pass), so rows are sorted by a 128-bit hash of their content (indices, values, label, see
    ``row_hashes``): the row order, and so the cached margins z, do not depend on the pass. Rows with equal
    hashes are identical (x, y), hence interchangeable. Cached per process (LRU of 2), keyed by the digest of
    the sorted row hashes.
    """
    X = sp.vstack([sp.csr_matrix((b[2], b[1], b[0]), shape=(b[0].shape[0] - 1, n_features)) for b in blocks],
                  format="csr")
    y = np.concatenate([b[3] for b in blocks]).astype(np.float64)
    h = row_hashes(X.indptr, X.indices, X.data, y)
    order = np.lexsort((h[:, 1], h[:, 0])).astype(np.int64)
    key = (n_features, hashlib.blake2b(np.ascontiguousarray(h[order]).tobytes()).hexdigest())
    if key in _CSC_CACHE:
        _CSC_CACHE.move_to_end(key)
        return _CSC_CACHE[key]
    C = X[order].astype(np.float64).tocsc()
    C.sort_indices()
    cindptr = C.indptr.astype(np.int64)
    msq = np.empty(n_features)
    K.column_curvature(cindptr, C.data, C.shape[0], 1.0, msq)
    out = (cindptr, C.indices.astype(np.int64), C.data, y[order], msq)
    _CSC_CACHE[key] = out
    while len(_CSC_CACHE) > 2:
        _CSC_CACHE.popitem(last=False)
    return out


def margins(cindptr, rowidx, cdata, w, m) -> np.ndarray:
    return np.asarray(sp.csc_matrix((cdata, rowidx, cindptr), shape=(m, w.shape[0])) @ w).ravel()


class SCD(Algorithm):
    name = "scd"
    path_mode = "split"
    Params = SCDParams
    feature_keys = ("w",)
    max_paths = 1
    stage_blocks_allowed = False

    def init_path(self, n_features, path):
        if path > 0:
            raise ValueError("--algo scd runs on one path (use --paths 1)")
        return {"w": np.zeros(n_features), "z": np.zeros(0), "istate": np.zeros(2, dtype=np.int64),
                "objective": np.zeros(1)}

    def warm_start(self, state, w, bias):
        n = min(len(w), state["w"].shape[0])
        state["w"][:n] = w[:n]
        state["z"] = np.zeros(0)  # recomputed from w at the first scan
        return state

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        k = int(state["istate"][1])
        for name, a in (("indptr", indptr), ("indices", indices), ("data", data), ("y", y)):
            # copies: the arrays are valid during this call only (:meth:`Algorithm.advance`)
            state[f"_blk{k}_{name}"] = np.array(a)
        state["istate"][1] = k + 1
        return rows.shape[0] - start, False

    def end_stage(self, state):
        """The stage's scan, on the path's private copy once all training blocks of the pass are collected."""
        n_blk = int(state["istate"][1])
        blocks = [tuple(state.pop(f"_blk{k}_{n}") for n in ("indptr", "indices", "data", "y")) for k in range(n_blk)]
        state["istate"][1] = 0
        if not blocks:
            return
        w = state["w"]
        cindptr, rowidx, cdata, y, msq = column_copy(blocks, w.shape[0])
        m = y.shape[0]
        if state["z"].shape[0] != m:
            state["z"] = margins(cindptr, rowidx, cdata, w, m)
        scan = int(state["istate"][0])
        d = w.shape[0]
        code = LOSS_CODES[self.params.loss]
        if d:  # a store without columns (rows of labels only) leaves nothing to scan
            rng = np.random.default_rng([self.params.seed, scan])
            coords = rng.integers(0, d, size=max(1, round(self.params.scan * d)))
            beta = BETA[self.params.loss] * (msq if self.params.curvature == "column" else np.ones(d))
            K.scd_steps(cindptr, rowidx, cdata, y, state["z"], w, coords.astype(np.int64), beta, self.params.lam, code)
        state["istate"][0] = scan + 1
        state["objective"] = np.array([K.mean_loss(state["z"], y, code) + self.params.lam * float(np.abs(w).sum())])

    def summarize(self, state):
        return {"w": state["w"], "objective": state["objective"]}

    def decide(self, total, gstate, n_paths):
        if n_paths != 1:
            raise ValueError("--algo scd runs on one path (use --paths 1)")
        return ({"w": total["w"], "bias": np.zeros(1)}, gstate,
                nnz_diag(total["w"], objective=float(total["objective"][0])))

    def apply(self, state, decision):
        return state  # one path: the scan already left w and z in the state
