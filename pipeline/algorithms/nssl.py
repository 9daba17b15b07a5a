"""Numerically stable sparse learning (Xie et al., ECML PKDD 2010; ALGORITHMS.md §5, (E-1)–(E-3)).

Soft-thresholded perceptron with a margin gate: a row updates w only when y·w·x ≤ τ (w before the update),
and only the row's coordinates are touched: w_j ← S(w_j + η·y·x_j, a) with a = λ (``shrink="lambda"``, the
paper) or ηλ (``shrink="eta_lambda"``). No bias (the paper has none). λ = τ = 0 is the classic perceptron.

Stopping: after ``max_passes`` (the engine's pass limit) and, as in the paper, as soon as a path's
density nnz(w)/p reaches ``density_bound`` (s): the kernel stops before the next row, the path ends its
stage early and ``finished`` stops training after that stage's mixing. The engine's ``--max-density`` bound
is checked on the aggregated model at every pass end (it keeps the last model within the bound).

Parallel: iterative parameter mixing like TG (``path_mode = "split"``: paths split each pass's blocks and
are averaged at pass end; with several paths the average's support is the union of the paths' supports,
so it can exceed ``density_bound``). All state (w, counters, stop flag) lives in the path state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import Algorithm, check_nonnegative, check_positive
from pipeline.kernels import ecml as K


@dataclass(frozen=True)
class NSSLParams:
    eta: float = 0.1                # η, paper grid {0.1, ..., 0.5}
    tau: float = 0.01               # τ, paper grid {0.001, 0.01, 0.1}
    lam: float = 1e-3               # λ, paper grid {1e-4, 5e-4, 1e-3, 1e-2, 1e-1}
    shrink: str = "lambda"          # "lambda" (paper, E-3) | "eta_lambda"
    density_bound: float = 0.4      # s: stop once nnz/p ≥ s (the paper's 0.4; 1.0 = off)

    def __post_init__(self):
        check_positive("eta", self.eta)
        if not math.isfinite(self.tau):
            raise ValueError(f"tau must be finite, got {self.tau!r}")
        check_nonnegative("lam", self.lam)
        if self.shrink not in ("lambda", "eta_lambda"):
            raise ValueError(f"shrink must be 'lambda' or 'eta_lambda', got {self.shrink!r}")
        if not (0 < self.density_bound <= 1):
            raise ValueError(f"density_bound must be in (0, 1], got {self.density_bound!r}")

    @property
    def threshold(self) -> float:
        return self.lam if self.shrink == "lambda" else self.eta * self.lam


def path_mean(x: np.ndarray, n_paths: int) -> np.ndarray:
    """Parameter mixing: a summed path summary divided by the number of paths (identity for 1 path)."""
    return x / n_paths if n_paths > 1 else x


def nnz_diag(w: np.ndarray, **extra) -> dict:
    nnz = int(np.count_nonzero(w))
    return {"nnz": nnz, "density": nnz / max(1, w.shape[0]), **extra}


class NSSL(Algorithm):
    name = "nssl"
    path_mode = "split"
    Params = NSSLParams
    shared_keys = ("w",)
    feature_keys = ("w",)

    def init_path(self, n_features, path):
        return {"w": np.zeros(n_features), "istate": np.zeros(3, dtype=np.int64),
                "stopped": np.zeros(1, dtype=np.int64)}

    def max_nnz(self, n_features: int) -> int:
        s = self.params.density_bound
        return n_features + 1 if s >= 1 else max(1, math.ceil(s * n_features))

    def warm_start(self, state, w, bias):
        n = min(len(w), state["w"].shape[0])
        state["w"][:n] = w[:n]
        state["istate"][1] = np.count_nonzero(state["w"])
        return state

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        p = self.params
        w = state["w"]
        n = rows.shape[0] - start
        used = K.nssl_block(indptr, indices, data, y, rows[start:], w, state["istate"], p.eta, p.tau,
                            p.threshold, self.max_nnz(w.shape[0]))
        if used < n:
            state["stopped"][0] = 1
        return used, used < n

    def summarize(self, state):
        return {"w": state["w"], "stopped": state["stopped"].astype(np.float64),
                "updates": state["istate"][:1].astype(np.float64)}  # w shared read-only (advance copies)

    def decide(self, total, gstate, n_paths):
        w = path_mean(total["w"], n_paths)
        gstate = dict(gstate)
        gstate["stopped"] = np.array([1 if total["stopped"][0] > 0 else 0], dtype=np.int64)
        return ({"w": w, "bias": np.zeros(1)}, gstate,
                nnz_diag(w, updates=float(total["updates"][0]), bound_hit=float(gstate["stopped"][0])))

    def apply(self, state, decision):
        istate = state["istate"].copy()
        istate[1] = np.count_nonzero(decision["w"])
        return {**state, "w": decision["w"], "istate": istate}

    def init_global(self, n_features):
        return {"stopped": np.zeros(1, dtype=np.int64)}

    def finished(self, gstate):
        return bool(np.asarray(gstate.get("stopped", [0]))[0])
