"""Two-stage sparse learning (Li, Yang, Zhang, Jin, AAAI 2017; ALGORITHMS.md §3).

Stage 1, Epoch-GD on a shrinking L1∩L2 domain: epoch k runs T_k = 2^{k−1}·T1 steps per path with step
η_k = η1/2^{k−1}, each step projected onto {‖w‖₁ ≤ B} ∩ {‖w − w^k_1‖₂ ≤ ρ_k}, ρ_k = ρ1/2^{(k−1)/2} (ρ1 = B by
default); the epoch output is the average iterate and becomes the next centre. An epoch is an engine stage:
paths split the blocks (``split`` mode), the kernel reports ``stage_done`` after the path's T_k steps, and
at the epoch end the paths' averages are averaged (so the centre is shared). Because a stage also ends at a
pass end, a path that has finished its epoch waits (consumes nothing) until every path has; when the paths
still running have no data left the unfinished epoch is discarded (§3: "unused budget is discarded") and
training stops (``finished``).

Stage 2, randomized sparsification (``pipeline.sparsify``): the model's weights are w̃ = sparsify(ŵ) with
ŵ = the last completed epoch average (before the first epoch ends: the paths' running average), K draws
from DD p_j ∝ |ŵ_j|√s_j or MG p_j ∝ |ŵ_j|, K from ``nnz`` or (``epsilon``, ``delta``) by (TS-9). s_j = Ê[x_j²]
is accumulated over the stage-1 rows in O(nnz) per row (§3), because algorithms do not see the store; over
whole passes it equals the store's col_sumsq/n_rows. ŵ, its bias and s stay in the global state so that
``sparsepipe sparsify`` can redo stage 2 with another K. With neither ``nnz`` nor ``epsilon`` the model is ŵ.

State. Between stages a path keeps w, c, wsum (and sumsq, only with stage 2 on: it is s's only use) each in the
smaller of two forms (:func:`pipeline.algorithms.base.pack_nonzero`): its non-zeros (``<key>_idx`` int64 /
``<key>_val``, every entry whose bits are not all zero; 16 bytes a non-zero) while fewer than half the entries are
non-zero, else the dense array (``<key>_val``, an empty ``<key>_idx``); the stamps ``last_val`` in w's form (on w's
support, or dense with 1 off it: elsewhere a stamp does not change any sum), ``width``, ``istate`` and ``fstate``
(:meth:`TwoStage.settle`). c is read-only (:func:`pipeline.algorithms.base.frozen`): a stage's task shares it instead
of copying it. The task expands the rest into the kernel's dense arrays (:meth:`working_state`; a dense form is its
private copy's array itself; ``last`` int32 while the epoch's iterate index fits) and settles them after the summary,
array by array, so training is bit-identical to dense states between stages. The state between stages grows with the
features a path has seen up to the dense arrays, 28 bytes per feature (36 with stage 2: 465 and 598 MB at 16.6M
features, :meth:`full_state`, the memory estimate's), never more; the task adds 20 (28) bytes per feature and the
projection's scratch 16 (``scratch_bytes_per_feature``). The decision carries ŵ (and s, when stage 2 is on) in the
same forms.

``stage1 = "averaged-sgd"`` is §3's stage-1 baseline: projection onto the L1 ball only, η_t = η1/√t,
averaged iterate (paths are not mixed; the output is the mean of the paths' averages).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.algorithms.base import (Algorithm, check_choice, check_positive, copy_state, frozen, is_dense_form,
                                      pack_nonzero, unpack_nonzero)
from pipeline.kernels import two_stage as K
from pipeline.kernels.l1proj import clip_to_l1_ball
from pipeline.kernels.losses import LOSS_CODES
from pipeline.sparsify import METHODS, NNZ_MODES, check_epsilon, sparsify_vector

STAGE1 = {"epoch-gd": K.MODE_EPOCH, "averaged-sgd": K.MODE_SGD}
DENSE_KEYS = ("w", "c", "wsum", "sumsq")  # the kernel's float64[p] arrays, with ``last`` (sumsq: stage 2 only)
COMPACT_KEYS = tuple(f"{k}_{x}" for k in DENSE_KEYS for x in ("idx", "val")) + ("last_val", "width")
INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass(frozen=True)
class TwoStageParams:
    """Hyper-parameters of ``--algo two-stage`` (names as in ALGORITHMS.md §3)."""

    l1_radius: float = 10.0         # B (inf: no L1 constraint)
    loss: str = "squared"           # the paper's setting; logistic | hinge also accepted
    stage1: str = "epoch-gd"        # epoch-gd | averaged-sgd (the §3 baseline)
    eta1: float = 0.0               # η1; 0: the practical default [R] 1/(2R√T1), R² = the store's mean squared
                                    # row norm (its statistics keep no per-row maximum; equal on normalised rows)
    T1: int = 0                     # steps per path in the first epoch; 0: the practical default [R]
                                    # ⌊T/(2^n_ep − 1)⌋, T = budget, else the training rows (one pass)
    n_ep: int = 6                   # epochs the practical T1 fits into T
    rho1: float = 0.0               # 0: rho1 = l1_radius
    epochs: int = 0                 # stop after this many epochs (0: as many as the passes allow)
    budget: int = 0                 # total steps per path, T of §3 (0: the passes); Epoch-GD runs the epochs
                                    # that fit (Σ T_k ≤ budget), averaged-sgd stops after budget steps
    sparsify: str = "dd"            # dd | mg
    nnz: int = 0                    # target support size (0: not used)
    epsilon: float = 0.0            # excess-risk target of (TS-9) (0: not used)
    delta: float = 0.1
    nnz_mode: str = "draws"         # draws: K = nnz (nnz <= K) | distinct: draw until nnz distinct [R]
    sparsify_seed: int = 0
    fit_bias: bool = True
    hinge_at_one: bool = False
    proj_tol: float = 1e-10

    def __post_init__(self):
        if math.isnan(self.l1_radius) or self.l1_radius <= 0:
            raise ValueError(f"l1_radius must be > 0 (inf allowed), got {self.l1_radius!r}")
        check_choice("loss", self.loss, LOSS_CODES)
        check_choice("stage1", self.stage1, STAGE1)
        if not (math.isfinite(self.eta1) and self.eta1 >= 0):
            raise ValueError(f"eta1 must be > 0 (0: 1/(2R√T1)), got {self.eta1!r}")
        if int(self.T1) < 0:
            raise ValueError(f"T1 must be >= 1 (0: ⌊T/(2^n_ep − 1)⌋), got {self.T1!r}")
        if not 1 <= int(self.n_ep) <= 40:
            raise ValueError(f"n_ep must be in 1..40, got {self.n_ep!r}")
        if math.isnan(self.rho1) or self.rho1 < 0:
            raise ValueError(f"rho1 must be >= 0 (0: l1_radius; inf allowed), got {self.rho1!r}")
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0, got {self.budget!r}")
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs!r}")
        check_choice("sparsify", self.sparsify, METHODS)
        check_choice("nnz_mode", self.nnz_mode, NNZ_MODES)
        if self.nnz < 0:
            raise ValueError(f"nnz must be >= 0, got {self.nnz!r}")
        if self.nnz and self.epsilon:
            raise ValueError("give nnz or epsilon, not both")
        if self.epsilon:
            check_epsilon(self.epsilon, self.delta)
        if not (self.proj_tol > 0):
            raise ValueError(f"proj_tol must be > 0, got {self.proj_tol!r}")

    @property
    def rho(self) -> float:
        return self.rho1 if self.rho1 > 0 else self.l1_radius


def epoch_schedule(k: int, T1: int, eta1: float, rho1: float) -> tuple:
    """(T_k, η_k, ρ_k) of (TS-3): T_k = 2^{k−1}T1, η_k = η1/2^{k−1}, ρ_k = ρ1/2^{(k−1)/2}."""
    return int(T1) * 2 ** (k - 1), eta1 / 2.0 ** (k - 1), rho1 / 2.0 ** ((k - 1) / 2)


def _fit(v, n):
    out = np.zeros(n)
    m = min(n, v.shape[0])
    out[:m] = v[:m]
    return out


class TwoStage(Algorithm):
    name = "two-stage"
    path_mode = "split"
    Params = TwoStageParams
    shared_keys = ("c_idx", "c_val")
    scratch_bytes_per_feature = 16  # the L1∩L2 projection's two float64 vectors (epoch_gd_block's ``work``)

    @property
    def exchange_bytes_per_feature(self) -> int:
        """Two paths' summaries at a merge: the average (float64 per feature), and sumsq with stage 2."""
        return 32 if self._stage2_on else 16

    @property
    def _dense_keys(self) -> tuple:
        """The kernel's float64[p] arrays of this configuration: sumsq is accumulated only for stage 2."""
        return DENSE_KEYS if self._stage2_on else DENSE_KEYS[:3]

    @property
    def _changed_keys(self) -> tuple:
        """Those a stage changes: w, wsum (and sumsq); not c."""
        return tuple(k for k in self._dense_keys if k != "c")

    def __init__(self, params):
        super().__init__(params)
        self.T1, self.eta1 = int(params.T1), params.eta1  # 0: resolved by calibrate (the practical defaults)

    def calibrate(self, scale):
        """The practical defaults [R] of ALGORITHMS.md §3 for a zero ``T1`` / ``eta1``: T1 = ⌊T/(2^n_ep − 1)⌋ with
        T = budget (else the training rows), η1 = 1/(2R√T1) with R² = E‖x‖² (the store's mean squared row norm)."""
        p = self.params
        if not p.T1:
            self.T1 = max(1, int(p.budget or scale["rows"]) // (2 ** int(p.n_ep) - 1))
        if not p.eta1:
            self.eta1 = 1.0 / (2.0 * math.sqrt(scale["mean_sq_norm"]) * math.sqrt(self.T1))

    def hyper(self):
        h = super().hyper()
        if not (self.params.T1 and self.params.eta1):
            h["resolved"] = {"T1": self.T1, "eta1": self.eta1}
        return h

    def _schedule(self, k):
        """(T_k, η_k, ρ_k); before calibrate (a memory estimate's path state) a zero T1 or η1 stays 1 / 0."""
        p = self.params
        if p.stage1 == "averaged-sgd":
            return (p.budget or K.NEVER), self.eta1, math.inf
        return epoch_schedule(k, self.T1 or 1, self.eta1, p.rho)

    def _start(self, state, k, bias):
        """A new settled state starting epoch k at its centre c: w = c, wsum = 0, last = 1 (on w's support)."""
        T, eta, rho = self._schedule(k)
        out = dict(state)
        out["c_val"] = frozen(state["c_val"])  # read only in a stage: a task shares it (copy_state)
        out["w_idx"], out["w_val"] = state["c_idx"], out["c_val"]
        out["last_val"] = np.ones(state["c_val"].shape[0], dtype=np.int32)  # in w's (= c's) form
        out["wsum_idx"], out["wsum_val"] = np.zeros(0, dtype=np.int64), np.zeros(0)
        out["istate"], out["fstate"] = state["istate"].copy(), state["fstate"].copy()
        # c's non-zeros or dense c: its zeros add +0.0 to a sum ≥ +0.0, the same bits
        K.begin_epoch(out["c_val"], out["istate"], out["fstate"], T, eta, rho)
        out["istate"][K.IS_EPOCH] = k
        out["fstate"][K.FS_BIAS] = bias
        return out

    def init_path(self, n_features, path):
        st = {f"{k}_{x}": np.zeros(0, dtype=np.int64 if x == "idx" else np.float64)
              for k in self._dense_keys for x in ("idx", "val")}
        istate = np.zeros(K.N_IS, dtype=np.int64)
        istate[K.IS_BUDGET] = self.params.budget
        st.update(width=np.array([n_features], dtype=np.int64), istate=istate, fstate=np.zeros(K.N_FS))
        return self._start(st, 1, 0.0)

    def init_global(self, n_features):
        return {"w_hat": np.zeros(n_features), "b_hat": np.zeros(1), "epochs_done": np.zeros(1, np.int64),
                "last_steps": np.zeros(1, np.int64), "stuck": np.zeros(1, np.int64)}

    def warm_start(self, state, w, bias):
        out = dict(state)
        c = clip_to_l1_ball(_fit(np.asarray(w, np.float64), int(state["width"][0])), self.params.l1_radius)
        out["c_idx"], out["c_val"] = pack_nonzero(c)
        return self._start(out, int(state["istate"][K.IS_EPOCH]), float(bias))

    def resize(self, state, n_features):
        if "w" in state:  # a dense state (saved before the compact form): settle consumes its argument
            state = self.settle(copy_state(state))
        if int(state["width"][0]) >= n_features:
            return state
        return {**state, "width": np.array([n_features], dtype=np.int64)}

    def working_state(self, state):
        """The kernel's dense arrays of a settled state, the task's private copy (a dense state is used as it is):
        an array kept dense is used itself, c even read-only (the kernel only reads it; ``c_idx``/``c_val`` stay
        for :meth:`settle`); sumsq is empty without stage 2; ``last`` is int32 (:meth:`advance` widens it before an
        iterate index could pass 2³¹ − 1)."""
        if "w" in state:
            return state
        p = int(state["width"][0])
        out = {k: v for k, v in state.items() if k not in COMPACT_KEYS}
        out["c_idx"], out["c_val"] = state["c_idx"], state["c_val"]
        out["c"] = unpack_nonzero(state["c_idx"], state["c_val"], p, share=True)
        for k in self._changed_keys:
            out[k] = np.require(unpack_nonzero(state[f"{k}_idx"], state[f"{k}_val"], p, share=True), requirements="W")
        if not self._stage2_on:
            out["sumsq"] = np.zeros(0)
        stamp = np.int32 if int(state["istate"][K.IS_T]) + 2 <= INT32_MAX else np.int64
        out["last"] = np.require(unpack_nonzero(state["w_idx"], state["last_val"], p, stamp, fill=1, share=True),
                                 requirements="W")
        return out

    def settle(self, state):
        """The compact state of a dense one (see the module docstring). It consumes ``state`` (the task's working
        state): each dense array leaves it as it is packed, so at most one packed copy exists beside the dense
        arrays, and an array kept dense is kept itself; c keeps the form it came with (a stage does not change it)."""
        if "w" not in state:
            return state
        p = state["w"].shape[0]
        w, last = state.pop("w"), state.pop("last")
        out = {k: v for k, v in state.items() if k not in DENSE_KEYS}
        out["w_idx"], out["w_val"] = pack_nonzero(w, copy=False)
        if is_dense_form(out["w_idx"], out["w_val"]):  # 1 off w's support, as unpacking the packed form gives
            last[w.view(np.int64) == 0] = 1
            out["last_val"] = last
        else:
            out["last_val"] = last[out["w_idx"]]
        del w, last
        c = state.pop("c")
        if "c_idx" not in out:  # a dense state saved before the compact form
            out["c_idx"], out["c_val"] = pack_nonzero(c)
        out["c_val"] = frozen(out["c_val"])
        del c
        for k in self._changed_keys[1:]:  # wsum (and sumsq)
            out[f"{k}_idx"], out[f"{k}_val"] = pack_nonzero(state.pop(k), copy=False)
        state.pop("sumsq", None)  # not kept without stage 2
        out["width"] = np.array([p], dtype=np.int64)
        return out

    def full_state(self, n_features):
        """The settled state when every feature is non-zero in w, c, wsum and sumsq: the dense arrays."""
        st = self.working_state(self.init_path(n_features, 0))
        del st["c_idx"], st["c_val"]  # c packed again from the dense ones
        for k in self._dense_keys:
            st[k][:] = 1.0
        return self.settle(st)

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        p = self.params
        if not (self.T1 and self.eta1):
            raise ValueError("two-stage: T1 = 0 or eta1 = 0 resolve from the store's statistics before training "
                             "(calibrate)")
        if state["last"].dtype != np.int64 and int(state["istate"][K.IS_T]) + rows.shape[0] - start + 2 > INT32_MAX:
            state["last"] = state["last"].astype(np.int64)  # the stamps (iterate indices ≤ t + 2) would not fit
        work = np.empty(2 * state["w"].shape[0])
        consumed, done = K.epoch_gd_block(
            indptr, indices, data, y, rows[start:], state["w"], state["c"], state["wsum"], state["last"],
            state["sumsq"], state["istate"], state["fstate"], work, p.l1_radius, STAGE1[p.stage1], self.eta1,
            LOSS_CODES[p.loss], p.hinge_at_one, p.fit_bias, p.proj_tol, 100, 1)
        return int(consumed), bool(done)

    def summarize(self, state):
        ist, fst = state["istate"], state["fstate"]
        t = int(ist[K.IS_T])
        avg = np.empty_like(state["w"])
        K.running_average(state["w"], state["wsum"], state["last"], t, avg)
        bavg = fst[K.FS_BSUM] / t if t else fst[K.FS_BIAS]
        out = {"avg": avg, "bavg": np.array([bavg]), "count": ist[[K.IS_DONE, K.IS_STEPS, K.IS_NROWS, K.IS_NPROJ]].copy()}
        if self._stage2_on:
            out["sumsq"] = state["sumsq"]
        return out

    def decide(self, total, gstate, n_paths):
        p = self.params
        g = {k: np.array(v, copy=True) for k, v in gstate.items()}
        n = total["avg"].shape[0]
        n_done, steps, nrows, nproj = (int(x) for x in total["count"])
        progressed = steps != int(g["last_steps"][0])
        g["last_steps"][0] = steps
        sync = n_done == n_paths
        if sync:
            g["w_hat"] = clip_to_l1_ball(total["avg"] / n_paths, p.l1_radius)
            g["b_hat"] = total["bavg"] / n_paths
            g["epochs_done"][0] += 1
            g["stuck"][0] = 0
            w_hat, b_hat = g["w_hat"], g["b_hat"]
        else:
            g["stuck"][0] = 0 if progressed else 1
            if g["epochs_done"][0] == 0:
                w_hat, b_hat = total["avg"] / n_paths, total["bavg"] / n_paths
            else:
                w_hat, b_hat = _fit(g["w_hat"], n), g["b_hat"]
        k = int(g["epochs_done"][0]) + 1
        T, eta, rho = self._schedule(k)
        s = total["sumsq"] / max(1, nrows) if self._stage2_on else None
        w, info = self._stage2(w_hat, s)
        decision = {"b_hat": b_hat, "sync": np.array([int(sync)]), "epoch": np.array([k]), "width": np.array([n])}
        decision["w_hat_idx"], decision["w_hat_val"] = pack_nonzero(w_hat)
        if s is not None:
            decision["s_idx"], decision["s_val"] = pack_nonzero(s)
        nnz = int(np.count_nonzero(w))
        diag = {"nnz": nnz, "density": nnz / max(1, n), "epochs_done": int(g["epochs_done"][0]),
                "next_T": float(T), "next_eta": eta, "next_rho": rho, "nnz_hat": int(np.count_nonzero(w_hat)),
                "l1_hat": float(np.abs(w_hat).sum()), "K": int(info.get("K", 0)), "projections": nproj}
        return decision, g, diag

    def apply(self, state, decision):
        if int(decision["sync"][0]):  # the next epoch starts at the new centre ŵ
            out = {**state, "c_idx": decision["w_hat_idx"], "c_val": decision["w_hat_val"]}
            return self._start(out, int(decision["epoch"][0]), float(decision["b_hat"][0]))
        return state

    @property
    def _stage2_on(self) -> bool:
        return bool(self.params.nnz or self.params.epsilon)

    def _stage2(self, w_hat, s):
        p = self.params
        if not self._stage2_on:
            return w_hat, {}
        return sparsify_vector(w_hat, s, method=p.sparsify, nnz=p.nnz or None,
                               epsilon=p.epsilon or None, delta=p.delta, seed=p.sparsify_seed,
                               nnz_mode=p.nnz_mode)

    def weights(self, decision):
        n = int(decision["width"][0])
        s = unpack_nonzero(decision["s_idx"], decision["s_val"], n) if "s_idx" in decision else None
        return self._stage2(unpack_nonzero(decision["w_hat_idx"], decision["w_hat_val"], n), s)[0], \
            float(decision["b_hat"][0])

    def finished(self, gstate):
        p = self.params
        done = int(gstate["epochs_done"][0])
        if int(gstate["stuck"][0]) or (p.epochs and done >= p.epochs):
            return True
        if p.budget and done:
            if p.stage1 == "averaged-sgd":
                return True
            return self.T1 * (2 ** (done + 1) - 1) > p.budget  # the next epoch would not fit: Σ_{i≤k+1} T_i > T
        return False
