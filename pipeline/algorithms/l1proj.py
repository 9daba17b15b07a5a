"""Projected SGD onto {‖w‖₁ ≤ radius} (ALGORITHMS.md §4) with parameter mixing across paths.

Each path runs ``w ← P_{L1,Z}(w − η_t ℓ' x)`` with the sparse tree projection (O(nnz(x) log p) per row);
paths split the training blocks of a pass and are averaged at the pass end. An average of points of the
L1 ball lies in the ball, so the mixed model stays feasible (the last rounding excess is removed by
``clip_to_l1_ball``): the saved weights satisfy ‖w‖₁ ≤ radius, bias excluded.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import Algorithm, check_choice, check_nonnegative, check_positive
from pipeline.algorithms.sgd import SCHEDULES
from pipeline.kernels import l1proj as K
from pipeline.kernels import projection as P
from pipeline.kernels.losses import LOSS_CODES

TREE_KEYS = ("fnode", "inode", "sgn", "fsc", "isc")


@dataclass(frozen=True)
class L1ProjParams:
    """Hyper-parameters of ``--algo l1proj``; ``radius`` is Z of {‖w‖₁ ≤ Z}."""

    radius: float = 10.0
    loss: str = "logistic"
    eta: float = 0.1
    schedule: str = "sqrt"          # constant | invscaling (eta / t**power_t) | sqrt (power_t = 0.5)
    power_t: float = 0.5
    fit_bias: bool = True
    hinge_at_one: bool = False

    def __post_init__(self):
        check_positive("radius", self.radius)
        check_choice("loss", self.loss, LOSS_CODES)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_positive("eta", self.eta)
        check_nonnegative("power_t", self.power_t)


def _tree_state(st: P.L1TreeState) -> dict:
    return dict(st._asdict())


class L1Projection(Algorithm):
    name = "l1proj"
    path_mode = "split"
    Params = L1ProjParams
    # dtype of the tree's node links (``inode``): None = int32 below 2**31 features, int64 above
    # (``projection.l1tree_index_dtype``); both give bit-identical models, int32 in half the bytes
    index_dtype = None

    def init_path(self, n_features, path):
        tree = P.l1tree_init(n_features, index_dtype=self.index_dtype)
        return {**_tree_state(tree), "istate": np.zeros(1, np.int64), "fstate": np.zeros(1)}

    def _set_weights(self, state, w, bias):
        w = K.clip_to_l1_ball(np.asarray(w, np.float64), self.params.radius)
        state.update(_tree_state(P.l1tree_from_dense(w, index_dtype=self.index_dtype)))
        state["fstate"] = np.array([float(bias)])
        return state

    def warm_start(self, state, w, bias):
        p = state["sgn"].shape[0]
        wp = np.zeros(p)
        n = min(p, len(w))
        wp[:n] = w[:n]
        return self._set_weights(state, wp, bias)

    def resize(self, state, n_features):
        p = state["sgn"].shape[0]
        if p >= n_features:
            return state
        w = np.zeros(n_features)
        w[:p] = P.l1tree_dense(*(state[k] for k in TREE_KEYS))
        return self._set_weights(dict(state), w, state["fstate"][0])

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        p = self.params
        power_t = 0.5 if p.schedule == "sqrt" else p.power_t
        K.l1proj_block(indptr, indices, data, y, rows[start:], *(state[k] for k in TREE_KEYS), state["istate"],
                       state["fstate"], p.eta, SCHEDULES[p.schedule], power_t, p.radius, LOSS_CODES[p.loss],
                       p.hinge_at_one, p.fit_bias)
        return rows.shape[0] - start, False

    def summarize(self, state):
        return {"w": P.l1tree_dense(*(state[k] for k in TREE_KEYS)), "bias": state["fstate"][:1].copy()}

    def decide(self, total, gstate, n_paths):
        w = K.clip_to_l1_ball(total["w"] / n_paths if n_paths > 1 else total["w"], self.params.radius)
        bias = total["bias"] / n_paths if n_paths > 1 else total["bias"]
        nnz = int(np.count_nonzero(w))
        return ({"w": w, "bias": bias}, gstate,
                {"nnz": nnz, "density": nnz / max(1, w.shape[0]), "l1": float(np.abs(w).sum())})

    def apply(self, state, decision):
        return self._set_weights(state, decision["w"], decision["bias"][0])
