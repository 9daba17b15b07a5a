"""Plain SGD and truncated gradient (ALGORITHMS.md §1) with iterative parameter mixing across paths.

Paths split the training blocks of each pass and are averaged at the pass end (McDonald et al.'s
iterative parameter mixing, the way VW's cluster mode averages once per pass); each path keeps its own
step counter t for the learning-rate schedule. The lazy truncation state is flushed before averaging.

``adagrad=true`` (ALGORITHMS.md §8) uses per-coordinate steps η_t / (δ + √n_j), n_j = Σ (ℓ'·x_j)² (the loss
gradient only; L2 keeps the global rate), with the lazy truncation kept exact (pipeline.kernels.sgd).
At a pass end the paths' accumulators are mixed by ``adagrad_mix``: ``mean`` (default) averages n like
the weights; ``sum`` gives n ← n_base + Σ_m (n_m − n_base), the accumulator of one learner that saw every
row of the pass (the base is the previous mix, a p-vector kept in the global state and the model file).
With parameter mixing the averaged weights move per pass about as far as one path does on 1/M of the rows,
and ``mean`` keeps n consistent with that; ``sum`` shrinks the steps as if the weights had taken M times
more updates. Measured (3 passes, gravity 1e-4, holdout error sum / mean, 2-4 paths; synthetic 20k x 200k,
news20, rcv1 small): equal at the best eta of each (0.2027/0.2030, 0.0422/0.0406, 0.1270/0.1270), mean
better at the smaller eta (0.2576/0.2370, 0.1534/0.1481) — so ``mean``, which also needs no global copy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import (Algorithm, add_packed, check_choice, dense_of, frozen, interleave,
                                     pack_nonzero)
from pipeline.kernels import sgd as K
from pipeline.kernels import tg_baselines as B
from pipeline.kernels.losses import LOSS_CODES, SQUARED_FULL

SCHEDULES = {"constant": K.SCHEDULE_CONSTANT, "invscaling": K.SCHEDULE_INVSCALING, "sqrt": K.SCHEDULE_INVSCALING}
ADAGRAD_MIX = ("mean", "sum")
ADAGRAD_KEYS = ("adagrad", "adagrad_delta", "adagrad_mix")
RULES = {"tg": 0, "rounding": B.ROUNDING, "subgradient": B.SUBGRADIENT}


@dataclass(frozen=True)
class TGParams:
    """Hyper-parameters of TG. ``gravity`` = 0 is plain SGD (TG-1); > 0 truncates every K steps (TG-2).

    Defaults [R]: ``scale = "data"`` reads ``eta`` in units of 1/E‖x‖² and ``gravity`` in units of the rms
    non-zero value (the store's statistics, as STSGD's), so g = 1e-3·rms(x) per step makes the model sparse
    on data of any scale, and the bias takes AdaGrad steps (``bias_adagrad``): with a constant step the bias
    (value 1, against normalised rows whose entries are ~1/60) random-walks by ~η per row. Measured (35k
    webspam-like rows x 16.6M features, 3 passes, 2 paths, eta 1, gravity 1e-3 relative): plain bias 32.6%
    holdout error at AUC 0.886 (18.6% at the best threshold). ``scale = "none"`` and ``bias_adagrad = false``
    give the literal TG of ALGORITHMS.md §1."""

    loss: str = "logistic"
    eta: float = 1.0                # with scale "data" in units of 1/E‖x‖² (the store's mean squared row norm)
    schedule: str = "constant"      # constant | invscaling (eta / t**power_t) | sqrt (power_t = 0.5)
    power_t: float = 0.5
    decay: float = 1.0              # per-pass multiplier of eta: eta_pass = eta * decay**pass
    l2: float = 0.0
    gravity: float = 1e-3           # g per step (truncation η_t·K·g every K steps); scale "data": × rms(x)
    K: int = 1
    scale: str = "data"             # "data": eta and gravity relative to the store's statistics; "none": literal
    bias_adagrad: bool = True       # AdaGrad step for the bias alone: η_t / (bias_delta + √Σd²)
    bias_delta: float = 1.0         # δ of the bias's AdaGrad step
    theta: float = math.inf
    fit_bias: bool = True
    hinge_at_one: bool = False
    adagrad: bool = False           # per-coordinate steps eta_t / (adagrad_delta + sqrt(sum of g_j^2))
    # δ: ~ one gradient of a typical entry (|x| ~ 1/60 on L2-normalised rows): FTRL's β = 1 rescaled to such
    # features; steps of coordinates with Σg² << δ² stay ≈ eta/δ
    adagrad_delta: float = 0.01
    adagrad_mix: str = "mean"       # pass-end mixing of the accumulators across paths: mean | sum (of increments)
    squared_half: bool = True       # squared loss ½(f − y)²; false: TG's (f − y)², gradient 2(f − y) (§0)
    rule: str = "tg"                # tg (TG-2) | rounding: T0(w, θ) every K steps (TG-3) | subgradient: the
                                    # naive L1 step −η·g·sign(w) on every coordinate (TG-4); the baselines'
                                    # model (the paths' mix) is rounded by T0(·, θ); they need a finite θ, no
                                    # l2, no adagrad

    def __post_init__(self):
        check_choice("loss", self.loss, LOSS_CODES)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("adagrad_mix", self.adagrad_mix, ADAGRAD_MIX)
        check_choice("scale", self.scale, ("data", "none"))
        if not isinstance(self.bias_adagrad, bool):
            raise ValueError(f"bias_adagrad must be true or false, got {self.bias_adagrad!r}")
        if not (math.isfinite(self.bias_delta) and self.bias_delta > 0):
            raise ValueError(f"bias_delta must be finite and > 0, got {self.bias_delta!r}")
        check_choice("rule", self.rule, RULES)
        if self.rule != "tg":
            if not (math.isfinite(self.theta) and self.theta > 0):
                raise ValueError(f"rule {self.rule} rounds with T0(w, theta): give a finite theta > 0, got "
                                 f"{self.theta!r}")
            if self.l2 or self.adagrad:
                raise ValueError(f"rule {self.rule} (a TG baseline) takes no l2 and no adagrad")
        if not isinstance(self.squared_half, bool):
            raise ValueError(f"squared_half must be true or false, got {self.squared_half!r}")
        if not isinstance(self.adagrad, bool):
            raise ValueError(f"adagrad must be true or false, got {self.adagrad!r}")
        if not (math.isfinite(self.adagrad_delta) and self.adagrad_delta > 0):
            raise ValueError(f"adagrad_delta must be finite and > 0, got {self.adagrad_delta!r}")
        if not (0 < self.decay <= 1):
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        power_t = 0.5 if self.schedule == "sqrt" else self.power_t
        K.check_tg_params(self.l2, self.theta, self.gravity, self.K, eta=self.eta,
                          schedule=SCHEDULES[self.schedule], power_t=power_t)

    def inert(self) -> dict:
        """The rounding baseline (TG-3) reads no gravity, the subgradient one (TG-4) no K."""
        return {"rounding": {"gravity": "rule rounding (TG-3) rounds with theta and has no gravity"},
                "subgradient": {"K": "rule subgradient (TG-4) takes its gravity step at every row"}}.get(self.rule, {})


@dataclass(frozen=True)
class SGDParams(TGParams):
    """Plain SGD: no gravity, literal scale, plain bias step (the baseline of ALGORITHMS.md §1)."""

    eta: float = 0.1                # learning rate (step size) η
    gravity: float = 0.0            # no truncation (use --algo tg)
    scale: str = "none"             # "none": eta literal; "data": in units of 1/E‖x‖²
    bias_adagrad: bool = False      # AdaGrad step for the bias alone: η_t / (bias_delta + √Σd²)

    def inert(self) -> dict:
        """Plain SGD never truncates: TG's truncation options (and its baselines' rule) read nothing here."""
        why = "--algo sgd never truncates (its gravity is 0); truncation and its baselines are --algo tg"
        return dict.fromkeys(("K", "theta", "rule"), why)


class TruncatedGradient(Algorithm):
    name = "tg"
    path_mode = "split"
    Params = TGParams
    shared_keys = ("w", "Gl", "fstate", "n")
    feature_keys = ("w", "Gl", "n")

    def __init__(self, params):
        super().__init__(params)
        self.eta, self.gravity = params.eta, params.gravity  # resolved by calibrate (scale "data")

    def calibrate(self, scale):
        """Scale "data": η = eta / E‖x‖², g = gravity·rms(x_ij)."""
        if self.params.scale == "data":
            self.eta = self.params.eta / scale["mean_sq_norm"]
            self.gravity = self.params.gravity * scale["x_rms"]

    @property
    def _loss(self) -> int:
        """The kernels' loss code: SQUARED_FULL for the squared loss without the ½ (``squared_half = false``)."""
        if self.params.loss == "squared" and not self.params.squared_half:
            return SQUARED_FULL
        return LOSS_CODES[self.params.loss]

    @property
    def _bias_delta(self) -> float:
        """δ of the bias's AdaGrad step; 0 = plain step (the kernel's switch)."""
        return self.params.bias_delta if self.params.bias_adagrad else 0.0

    def init_path(self, n_features, path):
        p = self.params
        if p.adagrad:
            w, Gl, n, istate, fstate = K.new_tg_state(n_features, adagrad=True)
            return {"w": w, "Gl": Gl, "n": n, "istate": istate, "fstate": fstate}
        w, Gl, istate, fstate = K.new_tg_state(n_features, bias_adagrad=p.bias_adagrad)
        return {"w": w, "Gl": Gl, "istate": istate, "fstate": fstate}

    def init_global(self, n_features):
        if self.params.adagrad and self.params.adagrad_mix == "sum":
            return {"n": np.zeros(n_features), "nb": np.zeros(1)}
        return {}

    def hyper(self):
        h = super().hyper()
        if not self.params.adagrad:  # models saved before the option existed still resume exactly
            for k in ADAGRAD_KEYS:
                h.pop(k)
        if self.params.scale == "data":
            h["resolved"] = {"eta": self.eta, "gravity": self.gravity}
        return h

    def warm_start(self, state, w, bias):
        n = min(len(w), state["w"].shape[0])
        state["w"][:n] = w[:n]
        state["fstate"][2] = bias
        return state

    def working_state(self, state):
        """The stage's weights and applied gravity interleaved in one array ``wg`` (w_j at 2j, Gl_j at 2j + 1): the
        kernel then touches one cache line per coordinate instead of two (``sgd_tg_block``'s ``stride``). The
        baselines' kernel (``rule`` rounding or subgradient) takes the two arrays."""
        if self.params.rule == "tg":
            state["wg"] = interleave(state.pop("w"), state.pop("Gl"))
        else:
            state["w"], state["Gl"] = state["w"].copy(), state["Gl"].copy()
        return state

    def _layout(self, state):
        """(w, Gl, stride, goff) for the kernels: the interleaved working array, or a state's two arrays."""
        if "wg" in state:
            return state["wg"], state["wg"], 2, 1
        return state["w"], state["Gl"], 1, 0

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        p = self.params
        power_t = 0.5 if p.schedule == "sqrt" else p.power_t
        w, Gl, stride, goff = self._layout(state)
        if p.adagrad:
            K.sgd_tg_ada_block(indptr, indices, data, y, rows[start:], w, Gl, state["n"],
                               state["istate"], state["fstate"], self.eta * p.decay ** pass_index,
                               SCHEDULES[p.schedule], power_t, p.l2, self.gravity, int(p.K), p.theta, p.adagrad_delta,
                               self._loss, p.hinge_at_one, p.fit_bias, stride, goff)
            return rows.shape[0] - start, False
        if self._bias_delta and state["fstate"].shape[0] < 4:  # a state saved without the bias accumulator
            state["fstate"] = np.append(state["fstate"][:3], 0.0)
        if p.rule != "tg":
            B.tg_baseline_block(indptr, indices, data, y, rows[start:], w, Gl, state["istate"], state["fstate"],
                                self.eta * p.decay ** pass_index, SCHEDULES[p.schedule], power_t, self.gravity,
                                int(p.K), p.theta, RULES[p.rule], self._loss, p.hinge_at_one, p.fit_bias,
                                self._bias_delta)
            return rows.shape[0] - start, False
        K.sgd_tg_block(indptr, indices, data, y, rows[start:], w, Gl, state["istate"],
                       state["fstate"], self.eta * p.decay ** pass_index, SCHEDULES[p.schedule], power_t, p.l2,
                       self.gravity, int(p.K), p.theta, self._loss, p.hinge_at_one, p.fit_bias,
                       self._bias_delta, stride, goff)
        return rows.shape[0] - start, False

    def end_stage(self, state):
        """Flush the lazy truncation; an interleaved working array goes back to ``w`` and ``Gl`` (all zero after the
        flush), both read-only: the next stage's task shares them instead of copying (it interleaves anyway)."""
        w, Gl, stride, goff = self._layout(state)
        if self.params.rule != "tg":
            if self.params.rule == "rounding":
                B.rounding_flush(w, Gl, state["fstate"], self.params.theta)
        elif self.params.adagrad:
            K.tg_ada_flush(w, Gl, state["n"], state["fstate"], self.params.theta, self.params.adagrad_delta,
                           stride, goff)
        else:
            K.tg_flush(w, Gl, state["fstate"], self.params.theta, stride, goff)
        if "wg" in state:
            wg = state.pop("wg")
            state["w"] = frozen(wg[0::2].copy())
            state["Gl"] = frozen(np.zeros(wg.shape[0] // 2))

    def summarize(self, state):
        """The path's weights for the mix, as their non-zeros when that is smaller (``w_idx``, ``w``: the forms of
        :func:`pipeline.algorithms.base.pack_nonzero`; at webspam width a TG path's 3% non-zeros travel as 16 B
        each instead of the 133 MB dense vector), its bias, and AdaGrad's accumulators (dense)."""
        w = state["w"]
        idx, val = pack_nonzero(w, copy=False)
        out = {"w_idx": idx, "w": val, "width": np.array([w.shape[0]], dtype=np.int64), "bias": state["fstate"][2:3]}
        if self.params.adagrad:
            out["n"] = state["n"]
        if self.params.adagrad or self.params.bias_adagrad:
            out["nb"] = state["fstate"][3:4]
        return out

    def combine(self, a, b):
        """The sum of two summaries (sparse where both weight vectors are; bit for bit the dense sum)."""
        idx, w = add_packed((a["w_idx"], a["w"]), (b["w_idx"], b["w"]), int(a["width"][0]))
        out = {k: a[k] + b[k] for k in a if k not in ("w_idx", "w", "width")}
        return {**out, "w_idx": idx, "w": w, "width": a["width"]}

    def decide(self, total, gstate, n_paths):
        """Parameter mixing: the paths' mean weights (in the summary's form) and bias."""
        w = total["w"] / n_paths if n_paths > 1 else total["w"]
        bias = total["bias"] / n_paths if n_paths > 1 else total["bias"]
        nnz = int(np.count_nonzero(w))
        width = int(total["width"][0])
        decision = {"w_idx": total["w_idx"], "w": w, "width": total["width"], "bias": bias}
        if self.params.adagrad:
            n, nb = total["n"], total["nb"]
            if n_paths > 1 and self.params.adagrad_mix == "mean":
                n, nb = n / n_paths, nb / n_paths
            elif n_paths > 1:  # sum of the paths' increments over the previous mix (the base)
                base = gstate["n"]
                if base.shape[0] < n.shape[0]:  # resumed on a wider store
                    base = np.pad(base, (0, n.shape[0] - base.shape[0]))
                n = np.maximum(n - (n_paths - 1) * base, base)   # never below the base (rounding)
                nb = np.maximum(nb - (n_paths - 1) * gstate["nb"], gstate["nb"])
            if self.params.adagrad_mix == "sum":
                gstate = {**gstate, "n": n, "nb": nb}
            decision.update(n=n, nb=nb)
        elif self.params.bias_adagrad:  # the bias's accumulator is mixed like the weights
            decision["nb"] = total["nb"] / n_paths if n_paths > 1 else total["nb"]
        return decision, gstate, {"nnz": nnz, "density": nnz / max(1, width)}

    def _mixed(self, decision):
        return dense_of(decision["w_idx"], decision["w"], int(decision["width"][0]))

    def weights(self, decision):
        """The model; the baselines' (TG-3, TG-4) rounded by T0(·, θ) after the paths' mix (their iterates are not)."""
        w = self._mixed(decision)
        if self.params.rule != "tg":
            w = np.where(np.abs(w) <= self.params.theta, 0.0, w)
        return w, float(decision["bias"][0])

    def apply(self, state, decision):
        # after the flush Gl == 0 and G == 0 on every path; a dense w is shared (advance copies before mutating)
        fstate = [0.0, 1.0, float(decision["bias"][0])] + ([float(decision["nb"][0])] if "nb" in decision else [])
        out = {**state, "w": frozen(self._mixed(decision)), "fstate": np.array(fstate)}
        if self.params.adagrad:
            out["n"] = decision["n"]
        return out


class SGD(TruncatedGradient):
    """Plain SGD: TG with gravity fixed at 0 (optional L2)."""

    name = "sgd"
    Params = SGDParams


def sgd_params(**kw):
    if kw.get("gravity", 0.0) != 0.0:
        raise ValueError("--algo sgd has no gravity; use --algo tg")
    return SGDParams(**kw)
