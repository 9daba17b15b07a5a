"""FTRL-Proximal (McMahan et al., KDD 2013, Algorithm 1; ALGORITHMS.md §8) with parameter mixing across paths.

Kernel: pipeline.kernels.ftrl (per-coordinate z, n; the weight is the closed form of (z, n), exact zeros where
|z| <= l1; per-coordinate rate α/(β + √n); the bias is an unregularised FTRL coordinate).

Parallel (``path_mode = "split"``): paths split each pass's blocks and are mixed at the pass end, ``mix``:

* ``"zn"`` (default): average z and n over the paths (bias accumulators too); every path continues from the
  averaged (z̄, n̄), and the model is exactly the closed form of (z̄, n̄).
* ``"w"``: average the paths' closed-form weights w̄ (and biases), then give each path m a z consistent with
  w̄ under its own n_m, by inverting the closed form: for w̄_i ≠ 0,
  z_i = −w̄_i·((β + √n_m,i)/α + l2) − sgn(w̄_i)·l1 (so sgn z_i = −sgn w̄_i and |z_i| > l1); for w̄_i = 0 any
  |z_i| <= l1 is consistent and the path keeps its own z clipped to [−l1, l1]. n_m is kept. The model is w̄
  (a path's (z, n) reproduces it up to rounding).

The defaults (α = 5, β = 1, l1 = 1, l2 = 0.1, mix "zn") target L2-normalised rows (webspam-like: ~3,700 values
of ~1/60 per row): with such rows g_i = ℓ'·x_i is small, √n_i stays below β for most coordinates, and the step
α/(β + √n_i) ≈ α moves the margin of a row by about α·ℓ' (Σ x_i² = 1); a large α with little L2 learned best on
the normalised sets (rcv1, synthetic), l1 = 1 gave ~1% density there. l1 acts on the z sums, which grow with the
rows seen (batch equivalent: λ ≈ l1 / rows), and with mix "zn" each path's z covers 1/M of the data, so the same
l1 is effectively M times stronger with M paths. Measured grid: README "FTRL".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import (Algorithm, check_choice, check_nonnegative, check_positive, frozen,
                                     interleave)
from pipeline.kernels import ftrl as K
from pipeline.kernels.losses import LOSS_CODES

MIXES = ("zn", "w")


@dataclass(frozen=True)
class FTRLParams:
    """Hyper-parameters of FTRL-Proximal: per-coordinate rate alpha / (beta + sqrt(n_i)), L1 l1, L2 l2."""

    alpha: float = 5.0
    beta: float = 1.0
    l1: float = 1.0
    l2: float = 0.1
    loss: str = "logistic"
    fit_bias: bool = True
    mix: str = "zn"                 # zn: average z and n across paths | w: average the weights, re-derive z
    hinge_at_one: bool = False
    inclusion_p: float = 1.0        # Poisson inclusion (the paper's §4.2): a feature not yet in the model takes
                                    # a row's update with this probability (1: always)
    round_bits: int = 0             # the paper's rounding for memory (§4.3): the model's weights to multiples of
                                    # 2^-round_bits, rounded up or down at random, unbiased (0: off; 13 = q2.13)
    draw_seed: int = 0              # seed of the inclusion and rounding draws

    def __post_init__(self):
        if not 0.0 < self.inclusion_p <= 1.0:
            raise ValueError(f"inclusion_p must be in (0, 1], got {self.inclusion_p!r}")
        if isinstance(self.draw_seed, bool) or not isinstance(self.draw_seed, int) or self.draw_seed < 0:
            raise ValueError(f"draw_seed must be an integer >= 0, got {self.draw_seed!r}")
        if isinstance(self.round_bits, bool) or not (isinstance(self.round_bits, int) and 0 <= self.round_bits <= 52):
            raise ValueError(f"round_bits must be an integer in 0..52, got {self.round_bits!r}")
        check_choice("loss", self.loss, LOSS_CODES)
        check_choice("mix", self.mix, MIXES)
        check_positive("alpha", self.alpha)
        check_positive("beta", self.beta)
        check_nonnegative("l1", self.l1)
        check_nonnegative("l2", self.l2)


class FTRL(Algorithm):
    name = "ftrl"
    path_mode = "split"
    Params = FTRLParams
    feature_keys = ("z", "n")

    def __init__(self, params):
        super().__init__(params)
        # after apply: mix="zn" gives every path the same (z, n, bias accumulators); mix="w" keeps each path's n
        self.shared_keys = ("z", "n", "fstate") if params.mix == "zn" else ()

    def _args(self):
        p = self.params
        return p.alpha, p.beta, p.l1, p.l2

    def init_path(self, n_features, path):
        z, n, istate, fstate = K.new_ftrl_state(n_features)
        return {"z": z, "n": n, "istate": istate, "fstate": fstate}

    def warm_start(self, state, w, bias):
        """Start from weights: n = 0 and z from the inverse of the closed form (so the closed form gives w)."""
        a, b, l1, l2 = self._args()
        w = np.asarray(w, dtype=np.float64)
        K.ftrl_z_from_weights(w, state["n"], state["z"], a, b, l1, l2, state["z"])
        if self.params.fit_bias:
            state["fstate"][0] = K.ftrl_z_for(float(bias), 0.0, 0.0, a, b, 0.0, 0.0)
        return state

    def working_state(self, state):
        """The stage's z and n interleaved in one array ``zn`` (z_j at 2j, n_j at 2j + 1): the kernel then touches
        one cache line per coordinate instead of two (``ftrl_block``'s ``S``, ``O``); :meth:`end_stage` splits it."""
        state["zn"] = interleave(state.pop("z"), state.pop("n"))
        return state

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        p = self.params
        z, n, S, O = (state["zn"], state["zn"], 2, 1) if "zn" in state else (state["z"], state["n"], 1, 0)
        K.ftrl_block(indptr, indices, data, y, rows[start:], z, n, state["istate"], state["fstate"], p.alpha, p.beta,
                     p.l1, p.l2, LOSS_CODES[p.loss], p.hinge_at_one, p.fit_bias, S, O, p.inclusion_p, p.draw_seed)
        return rows.shape[0] - start, False

    def end_stage(self, state):
        """The interleaved working array goes back to ``z`` and ``n``, read-only: nothing changes them until the
        next stage's task, which interleaves them again instead of copying them first."""
        if "zn" in state:
            zn = state.pop("zn")
            state["z"], state["n"] = frozen(zn[0::2].copy()), frozen(zn[1::2].copy())

    def _bias(self, fstate) -> float:
        if not self.params.fit_bias:
            return 0.0
        return K.ftrl_weight(float(fstate[0]), float(fstate[1]), self.params.alpha, self.params.beta, 0.0, 0.0)

    # --- stage end ----------------------------------------------------------------------------
    def summarize(self, state):
        if self.params.mix == "zn":
            return {"z": state["z"], "n": state["n"], "fstate": state["fstate"]}
        w = np.empty_like(state["z"])
        K.ftrl_weights(state["z"], state["n"], *self._args(), w)
        return {"w": w, "bias": np.array([self._bias(state["fstate"])])}

    def decide(self, total, gstate, n_paths):
        M = n_paths
        if self.params.mix == "zn":
            dec = {k: (v / M if M > 1 else v) for k, v in total.items()}
            nnz = int(K.ftrl_nnz(dec["z"], dec["n"], *self._args()))
            p = dec["z"].shape[0]
        else:
            dec = {k: (v / M if M > 1 else v) for k, v in total.items()}
            nnz = int(np.count_nonzero(dec["w"]))
            p = dec["w"].shape[0]
        return dec, gstate, {"nnz": nnz, "density": nnz / max(1, p)}

    def apply(self, state, decision):
        if self.params.mix == "zn":
            # shared, read-only: the next stage's task interleaves them into its own working array
            return {**state, "z": frozen(decision["z"]), "n": frozen(decision["n"]), "fstate": decision["fstate"]}
        a, b, l1, l2 = self._args()
        z = np.empty_like(state["z"])
        K.ftrl_z_from_weights(decision["w"], state["n"], state["z"], a, b, l1, l2, z)
        z = frozen(z)
        fstate = state["fstate"].copy()
        if self.params.fit_bias:
            fstate[0] = K.ftrl_z_for(float(decision["bias"][0]), float(fstate[1]), float(fstate[0]), a, b, 0.0, 0.0)
        return {**state, "z": z, "fstate": fstate}

    def weights(self, decision):
        """The model: the closed form of the mixed (z, n) (or the mixed weights), rounded to the 2^-round_bits grid
        when asked (the paths keep the exact state)."""
        if self.params.mix == "w":
            w, bias = decision["w"], float(decision["bias"][0])
        else:
            w = np.empty_like(decision["z"])
            K.ftrl_weights(decision["z"], decision["n"], *self._args(), w)
            bias = self._bias(decision["fstate"])
        if self.params.round_bits:
            out = np.empty_like(w)
            K.round_to_grid(w, self.params.round_bits, self.params.draw_seed, out)
            w = out
        return w, bias
