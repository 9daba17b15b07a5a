"""Plain SGD and truncated gradient (ALGORITHMS.md §1) with iterative parameter mixing across paths.

Paths split the training blocks of each pass and are averaged at the pass end (McDonald et al.'s
iterative parameter mixing, the way VW's cluster mode averages once per pass); each path keeps its own
step counter t for the learning-rate schedule. The lazy truncation state is flushed before averaging.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import Algorithm, check_choice
from pipeline.kernels import sgd as K
from pipeline.kernels.losses import LOSS_CODES

SCHEDULES = {"constant": K.SCHEDULE_CONSTANT, "invscaling": K.SCHEDULE_INVSCALING, "sqrt": K.SCHEDULE_INVSCALING}


@dataclass(frozen=True)
class TGParams:
    """Hyper-parameters of SGD/TG. ``gravity`` = 0 is plain SGD (TG-1); > 0 truncates every K steps (TG-2)."""

    loss: str = "logistic"
    eta: float = 0.1
    schedule: str = "constant"      # constant | invscaling (eta / t**power_t) | sqrt (power_t = 0.5)
    power_t: float = 0.5
    decay: float = 1.0              # per-pass multiplier of eta: eta_pass = eta * decay**pass
    l2: float = 0.0
    gravity: float = 0.0
    K: int = 1
    theta: float = math.inf
    fit_bias: bool = True
    hinge_at_one: bool = False

    def __post_init__(self):
        check_choice("loss", self.loss, LOSS_CODES)
        check_choice("schedule", self.schedule, SCHEDULES)
        if not (0 < self.decay <= 1):
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        power_t = 0.5 if self.schedule == "sqrt" else self.power_t
        K.check_tg_params(self.l2, self.theta, self.gravity, self.K, eta=self.eta,
                          schedule=SCHEDULES[self.schedule], power_t=power_t)


class TruncatedGradient(Algorithm):
    name = "tg"
    path_mode = "split"
    Params = TGParams
    shared_keys = ("w", "Gl", "fstate")
    feature_keys = ("w", "Gl")

    def init_path(self, n_features, path):
        w, Gl, istate, fstate = K.new_tg_state(n_features)
        return {"w": w, "Gl": Gl, "istate": istate, "fstate": fstate}

    def warm_start(self, state, w, bias):
        n = min(len(w), state["w"].shape[0])
        state["w"][:n] = w[:n]
        state["fstate"][2] = bias
        return state

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        p = self.params
        power_t = 0.5 if p.schedule == "sqrt" else p.power_t
        K.sgd_tg_block(indptr, indices, data, y, rows[start:], state["w"], state["Gl"], state["istate"],
                       state["fstate"], p.eta * p.decay ** pass_index, SCHEDULES[p.schedule], power_t, p.l2,
                       p.gravity, int(p.K), p.theta, LOSS_CODES[p.loss], p.hinge_at_one, p.fit_bias)
        return rows.shape[0] - start, False

    def end_stage(self, state):
        K.tg_flush(state["w"], state["Gl"], state["fstate"], self.params.theta)

    def summarize(self, state):
        return {"w": state["w"], "bias": state["fstate"][2:3]}

    def decide(self, total, gstate, n_paths):
        w = total["w"] / n_paths if n_paths > 1 else total["w"]
        bias = total["bias"] / n_paths if n_paths > 1 else total["bias"]
        nnz = int(np.count_nonzero(w))
        return {"w": w, "bias": bias}, gstate, {"nnz": nnz, "density": nnz / max(1, w.shape[0])}

    def apply(self, state, decision):
        # after the flush Gl == 0 and G == 0 on every path; w is shared (advance copies before mutating)
        return {**state, "w": decision["w"], "fstate": np.array([0.0, 1.0, float(decision["bias"][0])])}


class SGD(TruncatedGradient):
    """Plain SGD: TG with gravity fixed at 0 (optional L2)."""

    name = "sgd"


def sgd_params(**kw):
    if kw.get("gravity", 0.0) != 0.0:
        raise ValueError("--algo sgd has no gravity; use --algo tg")
    return TGParams(**kw)
