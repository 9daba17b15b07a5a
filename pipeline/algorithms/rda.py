"""ℓ1-regularised dual averaging (Xiao 2010; the STSGD paper's RDA baseline, ALGORITHMS.md §2 "what was measured").

Closed form of pipeline.kernels.rda: λ_t = λ + γρ/√t, w_{t+1,j} = 0 if |ḡ_{t,j}| ≤ λ_t, else
−(√t/γ)(ḡ_{t,j} − λ_t·sign(ḡ_{t,j})). Defaults γ = 5000, ρ = 0.005 (the STSGD paper's values).

Parallel (``path_mode = "split"``): paths split each pass's blocks and add their gradients to the same
dual sum, pooled at pass end: G ← Σ_m G_m − (M − 1)·G_base, t ← Σ_m t_m − (M − 1)·t_base (the exact dual
average over every example seen by any path; identity for one path). G_base is in the global state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import Algorithm, check_choice, check_positive
from pipeline.algorithms.nssl import nnz_diag
from pipeline.kernels import rda as K
from pipeline.kernels.losses import LOSS_CODES


@dataclass(frozen=True)
class RDAParams:
    loss: str = "logistic"
    lam: float = 1e-3               # STSGD grid {5e-5, ..., 10}
    gamma: float = 5000.0
    rho: float = 0.005
    fit_bias: bool = True
    hinge_at_one: bool = False

    def __post_init__(self):
        check_choice("loss", self.loss, LOSS_CODES)
        for name in ("lam", "rho"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
        check_positive("gamma", self.gamma)


class RDA(Algorithm):
    name = "rda"
    path_mode = "split"
    Params = RDAParams
    shared_keys = ()
    feature_keys = ("G",)

    def init_path(self, n_features, path):
        return {"G": np.zeros(n_features), "istate": np.zeros(1, dtype=np.int64), "fstate": np.zeros(1)}

    def init_global(self, n_features):
        return {"G": np.zeros(n_features), "t": np.zeros(1, dtype=np.int64), "Gb": np.zeros(1)}

    def warm_start(self, state, w, bias):
        raise ValueError("--algo rda cannot warm-start from weights (its state is a gradient sum); "
                         "resume a saved rda model with the same paths and seed instead")

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        p = self.params
        K.rda_block(indptr, indices, data, y, rows[start:], state["G"], state["istate"], state["fstate"], p.lam,
                    p.gamma, p.rho, LOSS_CODES[p.loss], p.hinge_at_one, p.fit_bias)
        return rows.shape[0] - start, False

    def summarize(self, state):
        return {"G": state["G"], "t": state["istate"], "Gb": state["fstate"]}

    def decide(self, total, gstate, n_paths):
        k = n_paths - 1
        G = total["G"] - k * gstate["G"] if k else total["G"]
        t = int(total["t"][0] - k * gstate["t"][0])
        Gb = float(total["Gb"][0] - k * gstate["Gb"][0]) if k else float(total["Gb"][0])
        p = self.params
        w = np.empty_like(G)
        K.rda_weights(G, t, p.lam, p.gamma, p.rho, w)
        bias = K.rda_weight(Gb, t, 0.0, p.gamma, 0.0) if p.fit_bias else 0.0
        gstate = {"G": G, "t": np.array([t], dtype=np.int64), "Gb": np.array([Gb])}
        return {"G": G, "t": gstate["t"], "Gb": gstate["Gb"], "w": w, "bias": np.array([bias])}, gstate, \
            nnz_diag(w, t=float(t))

    def apply(self, state, decision):
        return {**state, "G": decision["G"].copy(), "istate": decision["t"].copy(), "fstate": decision["Gb"].copy()}
