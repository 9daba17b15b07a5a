"""SMIDAS: stochastic mirror descent made sparse (Shalev-Shwartz & Tewari; ALGORITHMS.md §5, (E-4)–(E-6)).

Mirror descent with the p-norm link, p = c·ln(d) (``c`` = 2 is the paper's, 0.5 the ECML variant; clamped
to ≥ 2), soft-thresholding of the dual vector θ by ηλ after every step, w = f⁻¹(θ) evaluated stably with
M = max|θ_j| (the paper's Lemma-1 spread of exponents is what the instability study measures). θ, its active
list (the non-zero θ_j, so the all-coordinate shrink costs O(nnz(θ)) per step) and [M, S] live in the path
state. No bias (as in the paper). Run it with one path (the paper's setting; ``placement="single"`` for small
data); with several paths the duals θ are averaged at pass end (parameter mixing in the dual).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import Algorithm, check_choice, check_nonnegative, check_positive
from pipeline.algorithms.nssl import nnz_diag, path_mean
from pipeline.kernels import ecml as K
from pipeline.kernels.losses import LOSS_CODES


@dataclass(frozen=True)
class SMIDASParams:
    loss: str = "logistic"
    eta: float = 0.1
    lam: float = 1e-4
    c: float = 2.0                  # p = c·ln(d)  (paper 2, ECML also 0.5)
    p: float = 0.0                  # explicit p (> 0 overrides c)
    hinge_at_one: bool = False

    def __post_init__(self):
        check_choice("loss", self.loss, LOSS_CODES)
        check_positive("eta", self.eta)
        check_nonnegative("lam", self.lam)
        check_positive("c", self.c)
        if self.p != 0 and not (math.isfinite(self.p) and self.p >= 2):
            raise ValueError(f"p must be >= 2 (or 0 to use c·ln(d)), got {self.p!r}")

    def p_norm(self, d: int) -> float:
        return float(self.p) if self.p > 0 else max(2.0, self.c * math.log(max(d, 2)))


def weights_from_theta(theta: np.ndarray, p: float) -> np.ndarray:
    w = np.empty_like(theta)
    K.smidas_weights(theta, p, w)
    return w


class SMIDAS(Algorithm):
    name = "smidas"
    path_mode = "split"
    Params = SMIDASParams
    feature_keys = ("theta", "active")

    def init_path(self, n_features, path):
        return {"theta": np.zeros(n_features), "active": np.zeros(n_features, dtype=np.int64),
                "istate": np.zeros(2, dtype=np.int64), "fstate": np.zeros(2)}

    def _reset_active(self, state):
        theta = state["theta"]
        nz = np.flatnonzero(theta)
        state["active"] = np.zeros(theta.shape[0], dtype=np.int64)
        state["active"][:nz.size] = nz
        state["istate"][0] = nz.size
        K.smidas_norm(theta, state["active"], nz.size, self.params.p_norm(theta.shape[0]), state["fstate"])
        return state

    def warm_start(self, state, w, bias):
        """θ = f(w), the p-norm link's forward map with q = p/(p−1) (scaled by max|w| for stability)."""
        n = min(len(w), state["theta"].shape[0])
        w = np.asarray(w[:n], dtype=np.float64)
        Mw = np.abs(w).max() if n else 0.0
        if Mw > 0:
            p = self.params.p_norm(state["theta"].shape[0])
            q = p / (p - 1)
            r = np.abs(w) / Mw
            state["theta"][:n] = np.sign(w) * Mw * r ** (q - 1) / np.sum(r ** q) ** ((q - 2) / q)
        return self._reset_active(state)

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        pr = self.params
        K.smidas_block(indptr, indices, data, y, rows[start:], state["theta"], state["active"], state["istate"],
                       state["fstate"], pr.eta, pr.lam, pr.p_norm(state["theta"].shape[0]), LOSS_CODES[pr.loss],
                       pr.hinge_at_one)
        return rows.shape[0] - start, False

    def summarize(self, state):
        return {"theta": state["theta"]}

    def decide(self, total, gstate, n_paths):
        theta = path_mean(total["theta"], n_paths)
        if not np.isfinite(theta).all():  # the link maps θ = ±inf to w = 0: finite weights, a diverged run
            gstate = {**(gstate or {}), "overflow": np.ones(1)}
        p = self.params.p_norm(theta.shape[0])
        w = weights_from_theta(theta, p)
        nnz_theta = int(np.count_nonzero(theta))
        return ({"theta": theta, "w": w, "bias": np.zeros(1)}, gstate,
                nnz_diag(w, nnz_theta=float(nnz_theta), underflow=float(nnz_theta - np.count_nonzero(w)), p=p))

    def diverged(self, gstate):
        return bool(np.asarray((gstate or {}).get("overflow", np.zeros(1)))[0])

    def apply(self, state, decision):
        return self._reset_active({**state, "theta": decision["theta"].copy(), "istate": state["istate"].copy(),
                                   "fstate": state["fstate"].copy()})
