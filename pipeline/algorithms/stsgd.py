"""Stabilized Truncated SGD (STSGD, ALGORITHMS.md §2) on the engine: M full paths, sparse stage-end exchange.

Every path reads every training block in its own seeded order (``path_mode = "full"``, the paper's design;
``"split"`` [R]: paths split each pass's blocks as TG's do, a stage is then at most one pass over the path's
share, and the stage-end selection pools the paths' fits on disjoint halves, thirds, ... of the pass) and runs the
burst kernel ``pipeline.kernels.stsgd.stsgd_block`` (ST-1..ST-5, the ST-9 movement ratios). At each stage
end the engine calls, per path, :meth:`STSGD.summarize` (touched features' counters c, b, κ, the
stage's ratio buffer and the path's non-zero weights — all sparse), combines them pairwise in its fixed
tree (:meth:`combine`: sparse merges, ratio buffers concatenated in path order), and :meth:`decide`
computes Π̂ (ST-6, or ST-11 with carried counters), the purge list (ST-7), the next β (ST-10), K
(ST-12) and g0 (ST-9), and the aggregated model w̄ (ST-13). :meth:`apply` purges (ST-8) and starts the
next stage on every path.

Stage length [R]. A stage ends at the first of: ``n_K`` bursts of the path (n_K = 0: no limit), the
engine's ``stage_blocks`` blocks (``--stage-blocks``), the end of a pass, or the end of training. The pass
boundary rule makes stages identical whether training runs 5 passes at once or 2 + 3 (resume): the
engine always ends the last stage at the pass boundary, so every run must. A stage that ends inside a
burst (pass end, stage_blocks, end of training) closes that burst early with its actual counts
(informative amount g0·k̃_j; uniform g0·updates) in :meth:`end_stage`, on the engine's working copy.

State. Between stages (what ``apply`` receives and returns, what the next stage's task receives, what the model
saves) a path keeps a compact, settled state (:meth:`STSGD.settle`): its non-zero weights (``w_idx``, ``w_val``),
the stable set Ω as packed bits (``alive``, p/8 bytes), ``width``, ``istate``, ``fstate``, ``acc``, ``ctrl`` =
[g0, β, K, stage-1 quantile mode] and ``stage_pass``; 2 MB at webspam width. A stage's task expands it
(:meth:`working_state`) into the kernel arrays of ``new_path_state`` — ``rec`` float64[p, 4], one 32-byte record
per feature holding w, w_start and the int32 k̃ (−1 = purged, so Ω is ``k̃ ≥ 0``), c, b, κ, so a non-zero costs
one cache line (:meth:`STSGD.views` gives column views and ``alive``) — plus ``touched`` and ``ratios``, and
settles it again after the stage's summary: the 599 MB of working arrays (at 16.6M features) live only inside
the task, once per path, and the stage's input is 2 MB instead of a second record. ``apply`` removes the purged
features from Ω and from the weights (ST-8) and marks the stage start (``stage_pass`` = −1). ``ctrl`` is
identical on all paths after ``apply`` (shared key, saved once); Ω is too, but it lives in each path's state.
Global (gstate, saved with the model): stage count, |Ω|, β, g0, K, the carried counters of (ST-11), the
previous w̄ (sparse) for the stopping rule, and the ``done`` flag.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.algorithms import stsgd_rules as R
from pipeline.algorithms.base import Algorithm, check_choice, check_nonnegative, check_positive
from pipeline.kernels import stsgd as KS
from pipeline.kernels.losses import LOSS_CODES
from pipeline.kernels.sparse_sets import sorted_member

SCHEDULES = {"sqrt": KS.SCHEDULE_INVSQRT, "invsqrt": KS.SCHEDULE_INVSQRT, "constant": KS.SCHEDULE_CONSTANT}
RATIOS = ("c", "paper")
TRUNCATIONS = {"touched": KS.TRUNC_TOUCHED, "informative": KS.TRUNC_INFORMATIVE, "uniform": KS.TRUNC_UNIFORM}
# A stage drops the purged features' entries before the kernel (STSGD.read_columns) when at most this share of the
# columns is in Ω. 35k webspam-like rows x 16.6M features, one path, a pass over every entry against the filter plus
# the kernel over the kept ones (pipeline.kernels.columns): Ω of stage 2 (41% of the columns) 2.18-2.27 s against
# 0.70-0.78 s; a random Ω of 71% 2.21-2.33 s against 1.32-1.41 s; of 94% 1.86-1.88 s against 1.82-1.99 s (a wash).
# Real purges drop the rarely seen features first, whose cold records are what the filter saves.
KEEP_COLUMNS_BELOW = 0.9
# ctrl slots (float64[4], shared by all paths)
C_G0, C_BETA, C_K, C_QUANT = 0, 1, 2, 3


def _opt_float(v, name):
    """None, 'none' or a number (``--set`` passes strings for fields whose default is None)."""
    if v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "null")):
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number or none, got {v!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    return v


@dataclass(frozen=True)
class STSGDParams:
    """Hyper-parameters of STSGD (ALGORITHMS.md §2). M (paths) and passes come from the engine/CLI.

    Stage length (``n_K``). The default is 0: no burst limit, so a stage is one pass of each path, or
    ``--stage-blocks N`` blocks per path when the engine is given that (for example one block per path per
    stage when paths are spread over workers on a large store). The paper's n_K = 5 (stages of 5 bursts of
    K = 5 updates) is kept as an option but is not the default, in one process or on workers: Π̂_j (ST-6)
    is a fraction over the bursts in which j had evidence, and with 25 updates per path per stage a
    typical feature of a sparse data set has 0 or 1 such bursts, so Π̂ ∈ {0, 1} and purging is close to
    random. Measured (benchmarks/stsgd.py data, 10 passes, error on the test split, 4 orderings):
    dexter hinge η = 0.1, β0 = 0.3, M = 16 (the paper's M, all paths in one process): n_K = 5 20.3% error,
    κ 0.47; n_K = 0 11.1%, κ 0.76. M = 4: n_K = 5 18.2%, n_K = 20 13.0%, n_K = 0 11.3% (κ 0.18, 0.35,
    0.52). rcv1 subset hinge η = 10, β0 = 0.1, M = 4: n_K = 5 17.4% (κ 0.40), n_K = 0 12.6% (κ 0.74);
    longer stages are also several times faster (fewer stage-end exchanges).
    """

    loss: str = "logistic"          # logistic | hinge
    eta: float = 1.0                # η; η_t = η/√t with schedule "sqrt" (the R code), η with "constant";
                                    # with scale "data" in units of 1/E‖x‖² (the store's mean squared row norm)
    schedule: str = "constant"      # constant | sqrt (1/sqrt(t), t = per-path update count; the R code; alias invsqrt)
    K: int = 1000                   # K0, burst size (ST-2/ST-3); the paper's 5 is an option. With scale "data"
                                    # at most rows/20, so a stage holds at least ~20 bursts
    n_K: int = 0                    # bursts per stage; 0 = no limit (stage = a pass / --stage-blocks blocks);
                                    # the paper's 5 is an option (see the class docstring)
    beta0: float = 0.7              # gravity "adaptive": maximal (initial) rejection rate (ST-9/ST-10)
    gamma: float = -3.0             # gravity "adaptive": annealing rate of β (ST-10)
    pi0: float = 0.8                # purging threshold (ST-7); 0 = never purge
    delta_K: float = 0.0            # carry-over evidence threshold (ST-11); 0 = plain eq. (8)
    ratio: str = "c"                # ST-11 denominator: "c" (bursts with evidence, [R]) | "paper" (updates)
    alpha: float = 0.0              # burst-size annealing (ST-12); 0 = off, else in (0, 1) (code: 0.5)
    tol: float = 1e-3               # stopping rule (ST-13) on ‖w̄_s − w̄_{s−1}‖ relative; 0 = passes only
    g0_init: float | None = None    # gravity "adaptive": base gravity of stage 1; None = per-burst quantile
                                    # rule at β0 [R]
    truncation: str = "uniform"     # uniform: every alive coordinate loses g0 per update (ST-2 as in TG, lazy)
                                    # [R]; informative: S(w_j, g0·k̃_j) on touched j (ST-4, the paper);
                                    # touched: g0·K on the burst's touched coordinates only
    gravity: str = "l1"             # base gravity g0: "l1" = η·l1 per update (the L1 strength of TG) [R];
                                    # "adaptive" = the paper's rejection-rate quantile rule (ST-9/ST-10)
    l1: float = 8.5e-4              # λ of gravity "l1": g0 = η_t·λ per update (η_t at the stage start for
                                    # "sqrt"); with scale "data" in units of the rms non-zero value, so a burst
                                    # of K = 1/λ updates truncates by one typical gradient step; the default
                                    # was chosen at 350k x 16.6M on two generated files (docs/results.md)
    scale: str = "data"             # "data": eta, l1 and K relative to the store's statistics [R]; "none": literal
    adagrad: bool = False           # per-coordinate steps η_t/(δ + √Σg_j²) (ALGORITHMS.md §8); gravity scales too
    adagrad_delta: float = 1.0      # δ of AdaGrad
    bias_adagrad: bool = True       # AdaGrad step for the bias alone (its value 1 dwarfs a normalised row's) [R]
    stability: bool = True          # False: no purging (no stable set)
    fixed_gravity: float | None = None  # constant g0 for every stage (no ST-9/ST-10); None/0 = adaptive
    count_violations_only: bool = False  # k̃ counts only rows with ℓ' ≠ 0 (the R hinge code)
    hinge_at_one: bool = False      # hinge ℓ' = −y also at y·f = 1 (the R code)
    fit_bias: bool = True
    ratio_capacity: int = 65536     # per-path ratio buffer (uniform reservoir beyond it)
    d_base: str = "seen"            # d_s = |Ω_s| / (features seen so far) [R, as the R code drops empty
                                    # columns] | "p" = |Ω_s| / p (all declared columns)
    path_mode: str = "full"         # "full": every path reads every training block in its own order (the
                                    # paper's multi-path design); "split": paths split each pass's blocks, so
                                    # a pass costs one read of the data whatever the number of paths, and the
                                    # stage's selection pools fits on disjoint subsamples [R] (docs/results.md)
    ratio_pool: str = "stage"       # ST-9 pool: "stage" = every feature alive during the stage (Ω_{s-1}) [R];
                                    # "stable" = only the survivors Ω_s (literal reading of eq. 11)

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "g0_init", _opt_float(self.g0_init, "g0_init"))
        fg = _opt_float(self.fixed_gravity, "fixed_gravity")
        set_(self, "fixed_gravity", None if fg == 0 else fg)
        if self.loss not in ("logistic", "hinge"):
            raise ValueError(f"loss must be logistic or hinge for stsgd, got {self.loss!r}")
        check_choice("schedule", self.schedule, SCHEDULES)
        if not (math.isfinite(self.eta) and self.eta > 0):
            raise ValueError(f"eta must be > 0, got {self.eta}")
        for name in ("K", "n_K", "ratio_capacity"):
            v = getattr(self, name)
            if isinstance(v, bool) or not float(v).is_integer():
                raise ValueError(f"{name} must be an integer, got {v!r}")
            set_(self, name, int(v))
        if self.K < 1:
            raise ValueError(f"K must be >= 1, got {self.K}")
        if self.n_K < 0:
            raise ValueError(f"n_K must be >= 0 (0 = no burst limit), got {self.n_K}")
        if self.ratio_capacity < 1:
            raise ValueError(f"ratio_capacity must be >= 1, got {self.ratio_capacity}")
        for name in ("beta0", "pi0"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        if not math.isfinite(self.gamma):
            raise ValueError(f"gamma must be finite, got {self.gamma}")
        if not (self.delta_K >= 0):
            raise ValueError(f"delta_K must be >= 0, got {self.delta_K}")
        if self.d_base not in ("seen", "p"):
            raise ValueError(f"d_base must be 'seen' or 'p', got {self.d_base!r}")
        if self.ratio_pool not in ("stage", "stable"):
            raise ValueError(f"ratio_pool must be 'stage' or 'stable', got {self.ratio_pool!r}")
        check_choice("truncation", self.truncation, TRUNCATIONS)
        check_choice("gravity", self.gravity, ("l1", "adaptive"))
        check_choice("scale", self.scale, ("data", "none"))
        check_choice("path_mode", self.path_mode, ("full", "split"))
        check_nonnegative("l1", self.l1)
        check_positive("adagrad_delta", self.adagrad_delta)
        if self.ratio not in RATIOS:
            raise ValueError(f"ratio must be 'c' or 'paper', got {self.ratio!r}")
        if not (self.alpha == 0 or 0.0 < self.alpha < 1.0):
            raise ValueError(f"alpha must be 0 (off) or in (0, 1), got {self.alpha}")
        if not (self.tol >= 0):
            raise ValueError(f"tol must be >= 0, got {self.tol}")

    def inert(self) -> dict:
        """{option: why} of the base-gravity options this setting never reads (given ones are refused)."""
        if self.fixed_gravity is not None:
            return dict.fromkeys(("beta0", "gamma", "g0_init", "l1"), "fixed_gravity sets g0 for every stage")
        if self.gravity == "l1":
            return dict.fromkeys(("beta0", "gamma", "g0_init"), "with gravity = 'l1' (the default) g0 = η·l1; "
                                 "the paper's rejection-rate rule (ST-9/ST-10) is --set gravity=adaptive")
        return {"l1": "with gravity = 'adaptive' the rejection-rate rule (ST-9/ST-10) sets g0; l1 is read by gravity 'l1' only"}


class STSGD(Algorithm):
    name = "stsgd"
    Params = STSGDParams
    shared_keys = ("ctrl",)
    feature_keys = ()  # rec is padded along axis 0 by resize below
    # what comes on top of the stage's working state at a worker's peak. The stage-end merge no longer meets the
    # working state (settled and freed inside the advance task): two summaries of ~all features touched in stage 1
    # (6 bytes each at the defaults, 8 beyond 255 bursts a stage), their union and merge positions, ≤ 32 bytes per
    # feature; the peak is in the stage, with the decoded blocks of a shuffle window. 35k rows x 16.6M features, 2
    # workers, cache off: measured 1.16 GB against this estimate's 1.25 GB (benchmarks/memory.py --train)
    exchange_bytes_per_feature = 20

    def __init__(self, params):
        super().__init__(params)
        self.eta, self.l1, self.K = params.eta, params.l1, params.K  # resolved by calibrate (scale "data")

    @property
    def path_mode(self) -> str:
        """The engine's reading of the paths: the ``path_mode`` parameter ("full" by default)."""
        return self.params.path_mode

    def calibrate(self, scale):
        """Scale "data": η = eta / E‖x‖², λ = l1·rms(x_ij), K = min(K, rows // 20) (at least 1)."""
        p = self.params
        if p.scale == "data":
            self.eta = p.eta / scale["mean_sq_norm"]
            self.l1 = p.l1 * scale["x_rms"]
            self.K = max(1, min(p.K, scale["rows"] // 20))

    def hyper(self):
        h = super().hyper()
        if self.params.scale == "data":
            h["resolved"] = {"eta": self.eta, "l1": self.l1, "K": self.K}
        return h

    # --- per path -----------------------------------------------------------------------------
    def _initial_ctrl(self):
        p = self.params
        quant = 0.0
        if p.fixed_gravity is not None:
            g0 = p.fixed_gravity
        elif p.gravity == "l1":
            g0 = self._l1_gravity(0)
        elif p.g0_init is not None:
            g0 = p.g0_init
        else:
            g0, quant = 0.0, 1.0
        K0 = self.K if p.alpha == 0 else R.burst_size(self.K, p.alpha, 1.0)
        return np.array([g0, p.beta0, float(K0), quant], dtype=np.float64)

    def _l1_gravity(self, updates: int) -> float:
        """g0 of gravity "l1": η_t·λ per update, TG's gravity per step (η_t at ``updates`` done)."""
        p = self.params
        eta = self.eta / math.sqrt(updates + 1) if p.schedule != "constant" else self.eta
        return eta * self.l1

    @property
    def _ada(self) -> int:
        p = self.params
        return KS.ADA_ALL if p.adagrad else KS.ADA_BIAS if p.bias_adagrad else KS.ADA_OFF

    def init_path(self, n_features, path):
        s = KS.new_path_state(n_features, ratio_capacity=1, seed=1 + path, adagrad=self.params.adagrad)
        s["ctrl"] = self._initial_ctrl()
        s["stage_pass"] = np.array([-1], dtype=np.int64)
        return self.settle(s)

    def resize(self, state, n_features):
        state = self.settle(state) if "rec" in state else dict(state)
        old = int(state["width"][0])
        if n_features > old:  # new columns enter the stable set (k̃ = 0), with w = 0 and zero counters
            alive = np.unpackbits(state["alive"], count=old).view(np.bool_)
            state["alive"] = np.packbits(np.concatenate([alive, np.ones(n_features - old, dtype=np.bool_)]))
            state["width"] = np.array([n_features], dtype=np.int64)
            if state["acc"].shape[0] > 1:
                state["acc"] = np.pad(state["acc"], (0, n_features - old))
        return state

    @staticmethod
    def settle(state):
        """The compact state a path keeps between stages (and saves): its non-zero weights ``w_idx`` (int64) /
        ``w_val`` (float64), the stable set Ω as packed bits ``alive`` (uint8[⌈p/8⌉], ``np.packbits``), ``width``
        and the small arrays (istate, fstate, acc, ctrl, stage_pass, cursor). At a stage end nothing else of the
        record is state: w_start is 0 after :func:`pipeline.kernels.stsgd.stsgd_end_stage` (uniform truncation) or
        rewritten at a feature's first touch in a burst (the other modes), k̃ is 0 on Ω, the counters c, b, κ
        and the ratio buffer are the stage's (summarized, zeroed at the next stage start) and ``touched`` is
        empty; :meth:`working_state` rebuilds the same record, so training is bit-identical. A full state
        (``rec``, as saved before the compact form, with a pending ``purge``) is settled with that purge."""
        rec = state["rec"]
        v = KS.views(state)
        alive = v["alive"]
        purge = state.get("purge", ())
        if len(purge):
            alive[np.asarray(purge, dtype=np.int64)] = False
        idx = v["w"].nonzero()[0]  # on the strided column itself: np.flatnonzero would copy it first
        idx = idx[alive[idx]].astype(np.int64)
        out = {k: x for k, x in state.items() if k not in ("rec", "touched", "ratios", "purge")}
        out.update(w_idx=idx, w_val=v["w"][idx], alive=np.packbits(alive),
                   width=np.array([rec.shape[0]], dtype=np.int64))
        return out

    @staticmethod
    def _expand(state, ratio_capacity):
        """The kernel arrays of a settled state (a new dict; ``state``'s arrays are shared, not modified)."""
        if "rec" in state:
            state = STSGD.settle(state)
        p = int(state["width"][0])
        work = KS.new_path_state(p, ratio_capacity=ratio_capacity)  # c = b = κ = 0, w_start = 0, k̃ = 0
        rec = work["rec"]
        rec[state["w_idx"], KS.R_W] = state["w_val"]
        np.subtract(np.unpackbits(state["alive"], count=p), 1, out=KS.int_view(rec)[:, KS.RI_KT],
                    dtype=np.int32)  # k̃ = −1 off Ω (ST-8)
        out = {k: x for k, x in state.items() if k not in ("w_idx", "w_val", "alive", "width")}
        out.update(rec=rec, touched=work["touched"], ratios=work["ratios"])
        return out

    def read_columns(self, state):
        """Ω (``alive``) when at most :data:`KEEP_COLUMNS_BELOW` of the columns are in it: the kernel skips a purged
        feature's entries (ST-8), so the engine drops them before :meth:`advance` (:mod:`pipeline.kernels.columns`)."""
        bits = state.get("alive")
        if bits is None or np.bitwise_count(bits).sum() > KEEP_COLUMNS_BELOW * int(state["width"][0]):
            return None
        return bits

    @property
    def reads_ratios(self) -> bool:
        """Whether the next stage's g0 comes from the (ST-9) movement ratios: gravity "adaptive" without a fixed
        g0. Otherwise the stage's ratio buffer is empty and the kernel skips computing and sampling them (with
        the default gravity "l1" that was ~8% of the kernel's time at webspam width, for nothing)."""
        return self.params.gravity != "l1" and self.params.fixed_gravity is None

    def working_state(self, state):
        """The stage's record (w, Ω, zero counters), ``touched`` and ratio buffer (empty unless
        :attr:`reads_ratios`) from the settled ``state`` (the engine's private copy); the kernel's stage burst
        count and ratio fill are reset."""
        out = self._expand(state, self.params.ratio_capacity if self.reads_ratios else 0)
        KS.reset_stage(out["istate"])
        return out

    @staticmethod
    def views(state):
        """Column views of a path state's record: w, w_start, kt, the stage counters c, b, κ, and ``alive``
        (a bool copy; see :func:`pipeline.kernels.stsgd.views`); of an expanded copy for a settled state."""
        if "rec" not in state or len(state.get("purge", ())):
            state = STSGD._expand(state, 1)
        return KS.views(state)

    def warm_start(self, state, w, bias):
        n = min(len(w), int(state["width"][0]))
        idx = np.flatnonzero(w[:n]).astype(np.int64)
        state["w_idx"], state["w_val"] = idx, np.asarray(w, dtype=np.float64)[idx]
        state["fstate"][KS.F_BIAS] = bias
        return state

    def advance(self, state, indptr, indices, data, y, rows, start, pass_index):
        sp = state["stage_pass"]
        if sp[0] < 0:  # first call of the stage (on the working state)
            sp[0] = pass_index
        elif sp[0] != pass_index:
            return 0, True  # stages end at pass boundaries (see module docstring)
        p = self.params
        c = state["ctrl"]
        rec = state["rec"]
        consumed = KS.stsgd_block(
            indptr, indices, data, y, rows, start, rec, KS.int_view(rec), state["touched"], state["istate"],
            state["fstate"], state["ratios"], self.eta, SCHEDULES[p.schedule], int(c[C_K]), c[C_G0],
            LOSS_CODES[p.loss], p.hinge_at_one, TRUNCATIONS[p.truncation], p.count_violations_only, p.fit_bias,
            p.n_K, bool(c[C_QUANT]), c[C_BETA], state["acc"], self._ada, p.adagrad_delta)
        done = p.n_K > 0 and state["istate"][KS.I_STAGE_BURSTS] >= p.n_K
        return int(consumed), bool(done)

    def end_stage(self, state):
        """Close a burst left open by a stage that ended inside it (pass end, stage_blocks, end of training);
        a stage that read no row at all (the engine's last stage at the end of the passes) reports zeros."""
        if state["stage_pass"][0] < 0:
            return
        c = state["ctrl"]
        rec = state["rec"]
        p = self.params
        KS.stsgd_end_stage(rec, KS.int_view(rec), state["touched"], state["istate"], state["fstate"],
                           state["ratios"], c[C_G0], int(c[C_K]), TRUNCATIONS[p.truncation], bool(c[C_QUANT]),
                           c[C_BETA], state["acc"], self._ada, p.adagrad_delta)

    # --- stage end ----------------------------------------------------------------------------
    def summarize(self, state):
        ist = state["istate"]
        v = self.views(state)
        p = self.params  # κ only where the decision reads it: carried counters (ST-11) or the paper's ratio
        cnt = R.sparse_counters(v["cnt_evid"], v["cnt_surv"],
                                v["cnt_upd"] if p.delta_K > 0 or p.ratio == "paper" else None)
        widx, wval = R.sparse_weights(v["w"])
        return {"cnt": cnt, "ratios": state["ratios"][: int(ist[KS.I_NRATIOS])].copy(),
                "w": (widx, wval), "bias": state["fstate"][KS.F_BIAS:KS.F_BIAS + 1].copy(),
                "g0_last": state["fstate"][KS.F_G0_LAST:KS.F_G0_LAST + 1].copy(),
                "pass_min": state["cursor"][:1].copy(), "updates": ist[KS.I_T:KS.I_T + 1].copy(),
                "width": np.array([state["rec"].shape[0]], dtype=np.int64)}

    def combine(self, a, b):
        return {"cnt": R.merge_sparse(a["cnt"], b["cnt"]),
                "ratios": np.concatenate([a["ratios"], b["ratios"]]),
                "w": R.merge_sparse(a["w"], b["w"]),
                "bias": a["bias"] + b["bias"], "g0_last": a["g0_last"] + b["g0_last"],
                "pass_min": np.minimum(a["pass_min"], b["pass_min"]), "updates": a["updates"] + b["updates"],
                "width": np.maximum(a["width"], b["width"])}

    def init_global(self, n_features):
        p = self.params
        c = self._initial_ctrl()
        z = np.zeros(0, dtype=np.int64)
        return {"n_features": np.array(n_features, dtype=np.int64), "stage": np.array(0, dtype=np.int64),
                "n_alive": np.array(n_features, dtype=np.int64), "seen": np.zeros(n_features, dtype=np.bool_),
                "n_seen": np.array(0, dtype=np.int64), "beta": np.array(p.beta0),
                "g0": np.array(c[C_G0]), "K": np.array(c[C_K]), "quant": np.array(c[C_QUANT]),
                "carry_idx": z, "carry_evid": z, "carry_surv": z, "carry_upd": z,
                "wprev_idx": z, "wprev_val": np.zeros(0), "wprev_set": np.array(False),
                "done": np.array(False)}

    def decide(self, total, gstate, n_paths):
        p = self.params
        g = {k: np.asarray(v) for k, v in gstate.items()}
        nf = int(g["n_features"])
        width = int(total["width"][0])
        if width > nf:  # a resumed model met a wider store: the new columns enter Ω unseen
            g["n_alive"] = np.array(int(g["n_alive"]) + width - nf)
            g["seen"] = np.concatenate([g["seen"], np.zeros(width - nf, dtype=np.bool_)])
            nf = width
        M = n_paths
        cnt = tuple(np.asarray(x) for x in total["cnt"])
        carry = (g["carry_idx"], g["carry_evid"], g["carry_surv"], g["carry_upd"])
        # (ST-6)/(ST-11) selection probabilities of the stage's touched features (all alive during the stage)
        idx, prob, new_carry = R.carried_selection_probability(carry, cnt, p.delta_K, p.ratio)
        if p.stability and p.pi0 > 0:
            purged = idx[prob < p.pi0]  # (ST-7); stage features are alive; idx is strictly increasing
        else:
            purged = np.zeros(0, dtype=np.int64)
        if purged.size and new_carry[0].size:
            keep = ~sorted_member(new_carry[0], purged)
            new_carry = tuple(x[keep] for x in new_carry)
        n_alive = int(g["n_alive"]) - int(purged.size)
        seen = g["seen"].copy()
        seen[idx] = True
        n_seen = int(g["n_seen"]) + int(np.count_nonzero(~g["seen"][idx]))
        if p.d_base == "p":
            d = n_alive / nf
        else:  # fraction of the features seen so far that are still stable (1 before any evidence)
            d = 1.0 - (nf - n_alive) / n_seen if n_seen else 1.0
        rejection = R.realized_rejection_rate(cnt[1], cnt[2])
        beta_used, g0_used, K_used = float(g["beta"]), float(g["g0"]), float(g["K"])
        if bool(g["quant"]):
            g0_used = float(total["g0_last"][0]) / M  # per-burst quantile: last burst's value, path mean
        # (ST-10) β, (ST-12) K, (ST-9) g0 for the next stage
        if p.fixed_gravity is not None:
            beta_next, g0_next = beta_used, p.fixed_gravity
        elif p.gravity == "l1":
            beta_next, g0_next = beta_used, self._l1_gravity(int(total["updates"][0]) // M)
        else:
            beta_next = R.anneal_beta(p.beta0, p.gamma, d) if p.stability else p.beta0
            ratios = np.asarray(total["ratios"])
            if p.ratio_pool == "stable" and purged.size and ratios.shape[0]:
                ratios = ratios[~np.isin(ratios[:, 0].astype(np.int64), purged)]
            g0_next = R.adaptive_gravity(ratios[:, 1], beta_next) if ratios.shape[0] else g0_used
        K_next = R.burst_size(self.K, p.alpha, max(d, 1e-300)) if p.alpha > 0 else self.K
        # (ST-13) aggregation of the purged paths
        widx, wsum = total["w"]
        keep = ~sorted_member(widx, purged) if purged.size else np.ones(widx.shape[0], dtype=bool)
        widx, wbar = widx[keep], wsum[keep] / M
        nz = wbar != 0.0
        widx, wbar = widx[nz], wbar[nz]
        bias = total["bias"] / M
        stage = int(g["stage"]) + 1
        passes_done = int(total["pass_min"][0])
        done = False
        if p.tol > 0 and bool(g["wprev_set"]) and passes_done >= 1 and cnt[0].size:
            diff = R.merge_sparse((widx, wbar), (g["wprev_idx"], -g["wprev_val"]))[1]
            done = bool(np.linalg.norm(diff) <= p.tol * max(1.0, float(np.linalg.norm(g["wprev_val"]))))
        quant_next = False  # the per-burst quantile rule is for stage 1 only
        ctrl = np.array([g0_next, beta_next, float(K_next), float(quant_next)], dtype=np.float64)
        gnew = {"n_features": np.array(nf, dtype=np.int64), "stage": np.array(stage, dtype=np.int64),
                "n_alive": np.array(n_alive, dtype=np.int64), "seen": seen,
                "n_seen": np.array(n_seen, dtype=np.int64), "beta": np.array(beta_next),
                "g0": np.array(g0_next), "K": np.array(float(K_next)), "quant": np.array(quant_next),
                "carry_idx": new_carry[0], "carry_evid": new_carry[1], "carry_surv": new_carry[2],
                "carry_upd": new_carry[3], "wprev_idx": widx, "wprev_val": wbar, "wprev_set": np.array(True),
                "done": np.array(done)}
        purged_bits = np.zeros(nf, dtype=np.bool_)
        purged_bits[purged] = True
        decision = {"w_idx": widx, "w_val": wbar, "bias": bias, "purged": np.packbits(purged_bits), "ctrl": ctrl,
                    "n_features": nf}
        nnz = int(widx.shape[0])
        diag = {"nnz": nnz, "density": nnz / max(1, nf), "stable": n_alive, "purged": int(purged.size), "d": d,
                "beta": beta_used, "g0": g0_used, "K": K_used, "rejection": rejection,
                "beta_next": beta_next, "g0_next": g0_next,
                "updates": int(total["updates"][0]) // M}
        return decision, gnew, diag

    def apply(self, state, decision):
        """(ST-8) on the settled state: the decision's purged features (``purged``, packed bits like ``alive``)
        leave Ω and their weights are dropped; the shared ``ctrl`` is the decision's; ``stage_pass`` = −1 marks
        the stage start. A new dict; nothing per-feature is copied but the packed Ω (p/8 bytes)."""
        out = dict(state)
        alive = state["alive"]
        purged = np.asarray(decision["purged"], dtype=np.uint8)[:alive.shape[0]]
        purged = np.pad(purged, (0, alive.shape[0] - purged.shape[0]))
        out["alive"] = alive & ~purged
        idx = state["w_idx"]
        keep = ((purged[idx >> 3] >> (7 - (idx & 7)).astype(np.uint8)) & 1) == 0
        out["w_idx"], out["w_val"] = idx[keep], state["w_val"][keep]
        out["ctrl"] = decision["ctrl"]
        out["stage_pass"] = np.array([-1], dtype=np.int64)
        return out

    def weights(self, decision):
        w = np.zeros(int(decision["n_features"]), dtype=np.float64)
        w[decision["w_idx"]] = decision["w_val"]
        return w, float(decision["bias"][0])

    def finished(self, gstate):
        return bool(np.asarray(gstate.get("done", False)))
