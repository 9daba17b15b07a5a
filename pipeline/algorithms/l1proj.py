"""Projected SGD onto {‖w‖₁ ≤ radius} (ALGORITHMS.md §4) with parameter mixing across paths.

Each path runs ``w ← P_{L1,Z}(w − η_t ℓ' x)`` with the sparse tree projection (O(nnz(x) log p) per row);
paths split the training blocks of a pass and are averaged at the pass end. An average of points of the
L1 ball lies in the ball, so the mixed model stays feasible (the last rounding excess is removed by
``clip_to_l1_ball``): the saved weights satisfy ‖w‖₁ ≤ radius, bias excluded.

State. Between stages a path keeps its weights in the smaller of two forms (``w_idx``, ``w_val``:
:func:`pipeline.algorithms.base.compact_sparse`): the non-zero weights (16 bytes each) while fewer than half the
weights are non-zero, else the dense vector (8 bytes a feature, an empty ``w_idx``; 133 MB at 16.6M features:
:meth:`full_state`, the memory estimate's); with ``width``, ``istate`` = [t] and ``fstate`` = [bias]
(:meth:`L1Projection.settle`). A stage's task builds the treap from the non-zeros (:meth:`working_state`,
``l1tree_from_sparse``: the tree ``apply`` built from the dense mixed weights before, bit for bit), so the 33 bytes
per feature of the tree (548 MB at 16.6M features) live only inside the task. Summaries carry the non-zero weights
(``l1tree_support``), merged like STSGD's; the decision, which becomes the paths' state, the state's form.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import (Algorithm, check_choice, check_nonnegative, check_positive, compact_sparse,
                                      nonzero_entries, unpack_nonzero)
from pipeline.algorithms.sgd import SCHEDULES
from pipeline.algorithms.stsgd_rules import merge_sparse, sparse_weights
from pipeline.kernels import l1proj as K
from pipeline.kernels import projection as P
from pipeline.kernels.losses import LOSS_CODES

TREE_KEYS = ("fnode", "inode", "sgn", "fsc", "isc")
COMPACT_KEYS = ("w_idx", "w_val", "width")


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
        return {"w_idx": np.zeros(0, np.int64), "w_val": np.zeros(0), "width": np.array([n_features], np.int64),
                "istate": np.zeros(1, np.int64), "fstate": np.zeros(1)}

    def _set_weights(self, state, w, bias):
        """A new settled state holding ``w`` (clipped to the ball) and ``bias``."""
        out = dict(state)
        w = K.clip_to_l1_ball(np.asarray(w, np.float64), self.params.radius)
        out["w_idx"], out["w_val"] = compact_sparse(*sparse_weights(w), w.shape[0])
        out["fstate"] = np.array([float(bias)])
        return out

    def warm_start(self, state, w, bias):
        p = int(state["width"][0])
        wp = np.zeros(p)
        n = min(p, len(w))
        wp[:n] = w[:n]
        return self._set_weights(state, wp, bias)

    def resize(self, state, n_features):
        state = self.settle(state)  # a tree state (saved before the compact form) too
        if int(state["width"][0]) >= n_features:
            return state
        return {**state, "width": np.array([n_features], np.int64)}

    def working_state(self, state):
        """The treap of the settled state's weights (a tree state is used as it is)."""
        if "fnode" in state:
            return state
        tree = P.l1tree_from_sparse(*nonzero_entries(state["w_idx"], state["w_val"]), int(state["width"][0]),
                                    index_dtype=self.index_dtype)
        out = {k: v for k, v in state.items() if k not in COMPACT_KEYS}
        out.update(_tree_state(tree))
        return out

    def settle(self, state):
        """The non-zero weights of a tree state (``l1tree_support``), ``width`` and the small arrays."""
        if "fnode" not in state:
            return state
        out = {k: v for k, v in state.items() if k not in TREE_KEYS}
        p = state["sgn"].shape[0]
        out["w_idx"], out["w_val"] = compact_sparse(*P.l1tree_support(state["fnode"], state["sgn"], state["fsc"]), p)
        out["width"] = np.array([p], np.int64)
        return out

    def full_state(self, n_features):
        """The settled state when every weight is non-zero: the dense weights."""
        return self._set_weights(self.init_path(n_features, 0), np.full(n_features, 0.5 * self.params.radius
                                                                        / max(1, n_features)), 0.0)

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        p = self.params
        power_t = 0.5 if p.schedule == "sqrt" else p.power_t
        K.l1proj_block(indptr, indices, data, y, rows[start:], *(state[k] for k in TREE_KEYS), state["istate"],
                       state["fstate"], p.eta, SCHEDULES[p.schedule], power_t, p.radius, LOSS_CODES[p.loss],
                       p.hinge_at_one, p.fit_bias)
        return rows.shape[0] - start, False

    def summarize(self, state):
        return {"w": P.l1tree_support(state["fnode"], state["sgn"], state["fsc"]),
                "bias": state["fstate"][:1].copy(), "width": np.array([state["sgn"].shape[0]], np.int64)}

    def combine(self, a, b):
        """Sparse sum: at every index the dense sum's operation (absent = 0.0), so the same bits."""
        return {"w": merge_sparse(a["w"], b["w"]), "bias": a["bias"] + b["bias"],
                "width": np.maximum(a["width"], b["width"])}

    def decide(self, total, gstate, n_paths):
        n = int(total["width"][0])
        w = np.zeros(n)
        w[total["w"][0]] = total["w"][1]
        w = K.clip_to_l1_ball(w / n_paths if n_paths > 1 else w, self.params.radius)
        bias = total["bias"] / n_paths if n_paths > 1 else total["bias"]
        nnz = int(np.count_nonzero(w))
        widx, wval = compact_sparse(*sparse_weights(w), n)
        return ({"w_idx": widx, "w_val": wval, "bias": bias, "width": total["width"]}, gstate,
                {"nnz": nnz, "density": nnz / max(1, n), "l1": float(np.abs(w).sum())})

    def apply(self, state, decision):
        """The mixed weights (already in the ball: ``decide`` clipped them) and bias as the path's settled state."""
        return {**state, "w_idx": decision["w_idx"], "w_val": decision["w_val"],
                "fstate": np.array([float(decision["bias"][0])])}

    def weights(self, decision):
        return unpack_nonzero(decision["w_idx"], decision["w_val"], int(decision["width"][0])), \
            float(decision["bias"][0])
