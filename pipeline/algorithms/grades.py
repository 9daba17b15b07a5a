"""GraDes: L0-constrained full-batch gradient descent for squared loss (Garg & Khandekar; ALGORITHMS.md §5, E-10).

    w ← H( w + (1/γ)·Xᵀ(y − Xw), s )  from w = 0,   potential Ψ(w) = ½‖y − Xw‖²

Out of core and parallel by construction: one stage = one iteration = one pass over the training blocks
(``path_mode = "split"``: paths split the blocks and accumulate the partial gradient Xᵀ(y − Xw) and Ψ over
their blocks; the sums are combined in the engine's fixed tree, so any number of paths gives the same model
up to that fixed summation order). ``decide`` applies the step and the hard threshold H (C-4), and appends
Ψ(w_k) of the iterate that was just read to ``gstate["psi"]`` (one value per iteration: the divergence
curve of the study). Training stops (``finished``) once Ψ is not finite. Labels ±1 are the regression targets.

Support size: ``s`` (> 0) or ``s_frac``·p; both 0 means no thresholding (plain gradient descent).
``spectral_radius`` estimates ρ(D_J M) = ρ(M_JJ) of the thresholded iteration matrix (§5, phenomenon 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import Algorithm, check_positive
from pipeline.algorithms.nssl import nnz_diag
from pipeline.kernels import ecml as K


@dataclass(frozen=True)
class GraDesParams:
    gamma: float = 3.0              # step 1/γ (ECML: γ = 3 and 100)
    s: int = 0                      # support size |J| (ECML: 2000)
    s_frac: float = 0.0             # support size as a fraction of p (used when s = 0)

    def __post_init__(self):
        check_positive("gamma", self.gamma)
        if self.s < 0:
            raise ValueError(f"s must be >= 0, got {self.s!r}")
        if not (0 <= self.s_frac <= 1):
            raise ValueError(f"s_frac must be in [0, 1], got {self.s_frac!r}")

    def support(self, p: int) -> int:
        if self.s > 0:
            return min(self.s, p)
        return max(1, math.ceil(self.s_frac * p)) if self.s_frac > 0 else p


class GraDes(Algorithm):
    name = "grades"
    path_mode = "split"
    Params = GraDesParams
    shared_keys = ("w",)
    feature_keys = ("w", "g")

    def init_path(self, n_features, path):
        return {"w": np.zeros(n_features), "g": np.zeros(n_features), "fstate": np.zeros(1)}

    def warm_start(self, state, w, bias):
        n = min(len(w), state["w"].shape[0])
        state["w"][:n] = w[:n]
        return state

    def init_global(self, n_features):
        return {"psi": np.zeros(0)}

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        K.grades_block(indptr, indices, data, y, rows[start:], state["w"], state["g"], state["fstate"])
        return rows.shape[0] - start, False

    def summarize(self, state):
        return {"g": state["g"], "psi": state["fstate"], "w": state["w"]}

    def combine(self, a, b):
        return {"g": a["g"] + b["g"], "psi": a["psi"] + b["psi"], "w": a["w"]}

    def decide(self, total, gstate, n_paths):
        with np.errstate(over="ignore", invalid="ignore"):
            v = total["w"] + total["g"] / self.params.gamma
        w = K.hard_threshold(v, self.params.support(v.shape[0]))
        psi = float(total["psi"][0])
        gstate = dict(gstate)
        gstate["psi"] = np.append(np.asarray(gstate.get("psi", np.zeros(0)), dtype=np.float64), psi)
        return {"w": w, "bias": np.zeros(1)}, gstate, nnz_diag(w, psi=psi)

    def apply(self, state, decision):
        return {**state, "w": decision["w"], "g": np.zeros_like(state["g"]), "fstate": np.zeros(1)}

    def finished(self, gstate):
        return self.diverged(gstate)

    def diverged(self, gstate):
        psi = np.asarray(gstate.get("psi", np.zeros(0)))
        return bool(psi.size and not np.isfinite(psi[-1]))


def spectral_radius(X, gamma: float, support=None, iters: int = 100, seed: int = 0) -> dict:
    """ρ(M_JJ), M = I − (1/γ)XᵀX restricted to the columns J (all if None), by power iteration.

    ρ = max(|1 − λ_max/γ|, |1 − λ_min/γ|) over the eigenvalues of X_JᵀX_J; λ_max by power iteration on
    X_Jᵀ X_J, λ_min = 0 when X_J is rank deficient (rows < |J|), else by power iteration on λ_max·I − X_JᵀX_J.
    """
    import scipy.sparse as sp

    X = sp.csr_matrix(X, dtype=np.float64)
    if support is not None:
        X = X[:, np.asarray(support)]
    rng = np.random.default_rng(seed)

    def power(op, n):
        v = rng.normal(size=n)
        v /= np.linalg.norm(v)
        lam = 0.0
        for _ in range(iters):
            u = op(v)
            lam = float(v @ u)
            nu = np.linalg.norm(u)
            if nu == 0:
                return 0.0
            v = u / nu
        return lam

    n = X.shape[1]
    gram = lambda v: X.T @ (X @ v)  # noqa: E731
    lmax = power(gram, n)
    lmin = 0.0 if X.shape[0] < n else lmax - power(lambda v: lmax * v - gram(v), n)
    rho = max(abs(1 - lmax / gamma), abs(1 - lmin / gamma))
    return {"lambda_max": lmax, "lambda_min": lmin, "rho": rho, "gamma": gamma, "support": n}
