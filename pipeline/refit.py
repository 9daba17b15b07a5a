"""Refit of a selected support (relaxed lasso; Meinshausen 2007; ALGORITHMS.md §8).

After a sparse learner has chosen S = {j : w_j ≠ 0}, :func:`refit` minimises the elastic-net mean loss over
weights supported on S only, plus an unregularised bias:

    F(w, b) + l1·‖w‖₁,   F(w, b) = (1/n) Σ_{training rows} ℓ(x_S·w + b, y) + (l2/2)·‖w‖²

Meinshausen's relaxed lasso: the second lasso on S, with its own penalty. ``l1 = "auto"`` (the default) chooses
it, and l2 among L2_GRID / n, on a seeded 20% of the training rows along warm-started paths (:func:`l1_path`: lasso
points λ; Zou's adaptive lasso on the chosen lasso's support (default); with ``relax``, relaxed points φ·λ on the
lasso's support at λ; one-standard-error rule) and refits on all rows;
``l1 = 0`` is the plain L2 refit. S is screened by the online learner; the refit is the
exact solver on it (an L1 solve on S equals the one on all columns whenever S holds that solution's support).

Every function evaluation is exact and full-batch: a map over the store's training blocks (holdout blocks are
never read), each task computing the block's loss sum and gradient restricted to S with a numba kernel
(:mod:`pipeline.kernels.refit`), one task per chunk of blocks on the engine's executors, the chunks' vectors
added on the client in the engine tree's fixed order (:func:`tree_sum`: deterministic); scipy's L-BFGS-B runs on
the client in |S| + 1 dimensions (an L1 solve: on a working set of S's columns grown by KKT checks,
:func:`_working_set_solve`), started from the sparse model's own weights. Each worker compacts a block to the
columns of S once and keeps it (keyed by store, manifest version, block and a hash of S: up to a budget in
memory, the rest in spill files on the worker's disk, :mod:`pipeline.spill`), so later evaluations cost O(non-zeros in S), or in a working set W ⊆ S (:func:`restricted`). The validated path's l2 segments run in threads of their own
(:func:`_lasso_segments`), each evaluation's waits on the workers filled by the other's. On a cluster started by
this process, a refit whose compacted blocks fit in one cache budget runs on this process's threads instead
(:func:`refit_client`: the same sums, no round trip per evaluation).

Loss: the model's training loss when it is smooth (logistic, squared); a model trained with hinge loss (or
without a loss, e.g. nssl) is refitted with logistic loss on binary labels (smooth, and its log-loss is a
calibrated score); regression stores always use squared loss.

The refitted model keeps the original metadata plus ``meta["refit"]`` (l1 and the path, l2, iterations,
evaluations, objective, gradient norm, seconds, support size, pre-refit holdout metrics and non-zeros). Its support
is within S (no column outside S can become non-zero). It also keeps the sparse learner's optimiser state, which
describes the online learner, not the refitted weights: ``--init-model`` of the same algorithm resumes the online
learner exactly where it stopped (then refits again: "2 passes + 3 passes" equals "5 passes", refit included), any
other warm start begins at the sparse learner's weights, which the refitted model keeps too (``Model.learner``,
:meth:`pipeline.model.Model.warm_weights`).
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import threading
import time
from collections import OrderedDict

import numpy as np

from pipeline.cluster import in_order
from pipeline.kernels import refit as K
from pipeline.kernels.losses import LOGISTIC, SQUARED
from pipeline.store.readlock import reads_store

# l2 (on the mean loss) for L2-normalised rows, measured on synthetic webspam-like stores (20k features, 100
# non-zeros per row, 2k-16k rows, TG-selected supports of 250-1,500 columns): 1e-5 gave the lowest holdout
# log-loss among 1e-6..1e-2 at every size (1e-6 overfits the larger supports at 2k rows; 1e-4 and above shrink
# the weights back, undoing what the refit is for). On a small, clean support (the true one) 1e-6 is better.
# At webspam width (35k rows x 16.6M features, supports of 1.8k-12k columns chosen by ftrl/stsgd defaults) the
# lowest holdout error was at 1e-7 (stsgd: 1e-5 17.2%, 1e-6 13.5%, 1e-7 12.9%, 1e-8 13.1%; ftrl: 1e-6 12.7%,
# 1e-7 11.7%). So the default is relative to the training rows, L2_PER_ROW / n: 1e-7 at 31k rows, 1.5e-6 at 2k.
# With an L1 penalty the L2 term is only there to keep the problem strictly convex, and L2_PER_ROW shrank the
# largest weights by a third again as much as the L1 did (35k rows, stsgd's S, λ = 6.4e-6, l2·|w| = 1.4e-6 at the
# 90th percentile |w| = 15): holdout error l2 = 1e-7 10.05%, 1e-8 9.74%, 0 9.79% (LIBLINEAR's exact L1-LR at that
# λ: 9.82%); the validated path chose λ = 4.5e-6 -> 10.37% with 1e-7 and λ = 5.8e-6 -> 9.84% with 1e-8 or 0.
# But on small text sets the L2 term is the regulariser that matters (rcv1's 1,000 rows, 5,299 columns: with
# 3e-4 / n the path's validation loss bottoms out at 0.294 and its choice has 17.0% test error; with 3e-3 / n it
# keeps falling to a near-ridge fit, 0.197, chosen 12.8%). So the validated path ("auto") runs at both, L2_GRID / n,
# and the validation rows choose (l1_path); a given l1 refits at L2_PER_ROW / n unless l2 is given.
DEFAULT_L2 = None
L2_PER_ROW = 3e-3
L2_GRID = (L2_PER_ROW, 3e-4)  # a tenth of it (3e-3 / 10 would not be the same float)
# The final fit runs L-BFGS-B to its tolerance: at 35k webspam-like rows (stsgd's S, λ = 4.5e-6) 100 iterations
# stopped short (projected gradient 7.7e-5 > λ; holdout 10.42%, 4,367 non-zeros), 166 converged (10.37%, 4,371).
DEFAULT_MAX_ITER = 300
DEFAULT_TOL = 1e-6
# L-BFGS-B's memory (scipy's maxcor: curvature pairs kept), LBFGS_ENTRIES / variables within [20, 60]. At 350k
# webspam-like rows (stsgd's S of 7,047 columns, the plain L2 refit from the learner's weights, seed 7) the solve
# to gtol 1e-6 took 166 evaluations with 20 pairs, 107 with 40, 85 with 60, 88 with 100 (the same objective to 1e-10,
# holdout error 5.84% each): the objective is flat along a valley the short memory kept re-learning. The store of
# pairs is 16·maxcor bytes a variable and each iteration costs O(maxcor·variables), so wide problems (where an
# evaluation is cheap next to it: 0.5M columns of S at 2k rows) keep 20.
LBFGS_MEMORY = (20, 60)
LBFGS_ENTRIES = 1 << 22
# Compacted blocks are kept per worker between evaluations: DEFAULT_CACHE_BYTES of them in memory, the rest in
# spill files read back at each evaluation (pipeline.spill: rebuilding them cost 15x evaluating them). At 350k
# webspam-like rows stsgd's S (7,047 columns) holds 450M of the 1.17 billion training non-zeros: 1.39 GB per
# worker at --workers 2, which made the worker peak at 1.71 GB USS; with 1 GiB in memory (the rest, 0.3 GB, read
# back in ~35 ms per evaluation) it peaked at 1.40-1.45 GB USS, 1.44-1.49 GB PSS; 900 MiB leaves a margin.
DEFAULT_CACHE_BYTES = 900 << 20
REFIT_WORKER_BASE = 600 << 20  # a worker's process, one decoded block and the KKT pass's width-sized scratch
DEFAULT_L1 = "auto"
VALIDATION_FRACTION = 0.2  # training rows set aside to choose the refit's L1 penalty
# The L1 path: 3 penalties a decade over 4 decades below λ_max, stopped 2 points past the best; each point gets at
# most PATH_MAX_ITER L-BFGS-B iterations from the previous point's solution (glmnet's warm starts), the chosen one
# is then refitted on all training rows with up to max_iter. At 35k webspam-like rows x 16.6M features (stsgd's
# support of 12,385 columns) the path took 9 points, 560 evaluations, and chose λ = 2.7e-6: holdout error 11.0%
# at 5,224 non-zeros (the L2-only refit: 12.9% at 12,385; LIBLINEAR's best L1-LR on all columns: 10.2%).
# With 60 curvature pairs (LBFGS_MEMORY) 40 iterations a point choose as 60 did: 35k rows, seeds 11 / 12 / 13 (stsgd's
# learner, S of 17.9k-18.4k columns), the same λ on each, 9.42 / 8.62 / 8.76% against 9.42 / 8.65 / 8.76%, for 1,288-
# 1,306 evaluations instead of 1,770-1,835 (45-47 s against 65-69 s in process); 30 changed seed 11's choice (9.53%).
# The whole `train --workers 2` on seed 11: 9.21% at 1,880 non-zeros in 47.3 s against 9.45% at 1,672 in 61.5 s.
PATH_PER_DECADE, PATH_DECADES, PATH_PATIENCE, PATH_MAX_ITER = 3, 4.0, 2, 40
PATH_REFINE = 2  # points added between the chosen λ and the next larger λ (glmnet's grid is ~25 a decade)
# The relaxed lasso's φ (penalty on S_λ as a share of λ; `relax=True`, off by default). Measured in memory
# (scikit-learn's liblinear on stsgd's S at 35k webspam-like rows, 80/20 split as here): the lasso's best validation
# loss 0.2575 (C = 5, holdout 11.1%); relaxed φ = 1/2 at the same λ 0.2403 (holdout 10.3%); φ = 1/4 was best one
# step sparser (C = 3: holdout 10.1%); φ = 1/10 overfits at C >= 3. Through the refit (stsgd's S, 35k rows): 10.81%
# at 3,544 non-zeros, recall 0.76 (lasso path 11.05% at 5,228, recall 0.83) for twice the evaluations; on the
# shared sets (benchmarks/defaults.py) mixed: dexter's 60 validation rows let the one-SE rule pick far sparser
# relaxed fits (ftrl+refit 9.0% -> 14.0%, 10.3% -> 17.0%), news20 ftrl+refit 6.04 -> 5.45% / 6.16 -> 6.83%.
RELAX = (0.5, 0.25, 0.125)
ADAPTIVE = (1.0,)  # the adaptive lasso's γ (:func:`l1_path`)
DEFAULT_ADAPTIVE = True
# How the validation rows choose among the path's fits (the sparsest the rule accepts): "min" the lowest validation
# loss; "one-se" within one standard error of it (glmnet's lambda.1se; the mean loss's standard error is mostly the
# rows' spread, which every model shares); "paired" not worse than it by more than the standard error of the two
# models' per-row differences on the same rows. Measured (stsgd --no-refit models, the same refit otherwise;
# holdout error at non-zeros): 35k webspam-like rows, seeds 11 / 12 / 13: paired 9.19 / 8.62 / 8.71% at 1,886 /
# 1,950 / 1,909, min 9.34 / 8.62 / 8.71%, one-se 9.92 / 8.62 / 8.86% at 1,451 / 1,950 / 1,870 (LIBLINEAR's best
# over C: 9.79 / 9.53 / 9.73%); 3k rows (2k fit rows for 0.4M columns of S, 540 validation rows) paired 32.2% at
# 159, min 30.4% at 396, one-se 34.9% at 88 (LIBLINEAR 28.7%). On the shared sets paired and min keep 1.5-3x
# one-se's columns at about its error or lower (docs/results.md).
SELECT_RULES = ("paired", "min", "one-se")
DEFAULT_SELECT = "paired"
# "auto" takes l1 = 0 (the plain L2 refit, no path) when the training rows are at least AUTO_ROWS_PER_COLUMN
# times |S|: with that many rows per selected column the penalty's choice no longer moves the solution. Measured:
# 35k rows (2.5 rows per column of stsgd's S): L2 12.9%, L1 path 11.05%; 350k rows (55 per column): L2 5.90% in
# 152 s, L1 path 5.88% in 1,056 s (869 evaluations).
AUTO_ROWS_PER_COLUMN = 20
# "auto" also takes the L2 refit when the validation share would hold fewer rows than this: the path's choice
# needs a loss and its standard error (a 4-row store gave an empty share, a NaN loss and a crash).
MIN_VALIDATION_ROWS = 30
# KKT check after an L1 refit (off by default: a pass over the full rows): kkt_rounds = 0 only reports, N > 0 lets
# columns outside S whose gradient exceeds the penalty join S (at most |S|/2 + 100 a round, largest first) and
# solves again. At 35k rows x 16.6M (stsgd's S, λ = 2.7e-6): 5,979 violators, max ratio 5.2; after 2 rounds
# (+6,097 columns) 9 violators at ratio 1.02, holdout error 11.05% -> 10.97% at 5,226 -> 8,120 non-zeros, for 3x
# the evaluations of the final fit. GRADIENT_WINDOW block results in flight.
KKT_ROUNDS, KKT_TOL, GRADIENT_WINDOW = None, 1e-3, 16


# Algorithms whose `train` refits by default (`--no-refit` turns it off; the nightly job's [refit] enabled too).
# STSGD's truncation selects well and shrinks what it keeps: at 35k webspam-like rows x 16.6M features its model
# alone has 17.7% holdout error, refitted 11.05% (the validated L1 path: docs/results.md); at 350k rows 10.81%
# against 5.90% (+157 s on 133 s of training); on the shared sets it is within 1 point of tg's best at half its
# density on 9 of 12 (set, loss) pairs refitted, 3 of 12 alone (benchmarks/defaults.py). TG's supports are ~4%
# dense at that width (a refit there is a full-width solve), the others are off by default.
REFIT_BY_DEFAULT = frozenset({"stsgd"})


def refit_by_default(algo: str) -> bool:
    return algo in REFIT_BY_DEFAULT


PROGRESS_EVERY_S = 10.0  # a log's refit line at most this often (a refit at 350k rows: ~40-55 s, 86 passes)


def every_few_seconds(report, every: float | None = None):
    """A ``progress(n)`` for :func:`refit` that calls ``report(n, seconds since its first call)`` at most once every
    ``every`` seconds (None: :data:`PROGRESS_EVERY_S`): a line in a log, not one per pass over the support."""
    every = PROGRESS_EVERY_S if every is None else every
    clock = []  # [first call, last report]

    def progress(n: int) -> None:
        now = time.monotonic()
        if not clock:
            clock[:] = [now, now]
        if now - clock[1] >= every:
            clock[1] = now
            report(n, now - clock[0])
    return progress


def parse_l1(text) -> float | str:
    """An L1 setting as users write it: "auto" or a number >= 0 (ValueError otherwise)."""
    if text == "auto":
        return "auto"
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = -1.0
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"the refit's L1 penalty must be 'auto' or a finite number >= 0, got {text!r}")
    return v


def parse_select(name) -> str:
    """A selection rule of the validated path as users write it: one of :data:`SELECT_RULES` (ValueError
    otherwise)."""
    if name not in SELECT_RULES:
        raise ValueError(f"{name!r} is not one of {', '.join(SELECT_RULES)}")
    return name


def refit_loss(model, label_kind: str | None = None, loss: str | None = None) -> str:
    """The loss the refit uses: ``loss`` if given, else the model's when smooth, else logistic (squared for
    regression stores)."""
    kind = label_kind or model.meta.get("label_kind", "binary")
    if loss is None:
        loss = (model.meta.get("hyper") or {}).get("loss")
        loss = loss if loss in ("logistic", "squared") else "logistic"
        if kind == "regression":
            loss = "squared"
    if loss not in ("logistic", "squared"):
        raise ValueError(f"refit loss must be logistic or squared, got {loss!r}")
    if loss == "logistic" and kind == "regression":
        raise ValueError("refit: logistic loss needs binary labels; this store has regression targets")
    return loss


def support_signature(support: np.ndarray, n_features: int) -> str:
    return hashlib.blake2b(np.ascontiguousarray(support, dtype=np.int64).tobytes() + str(n_features).encode(),
                           digest_size=12).hexdigest()


# ------------------------------------------------------------------------------------- worker side

_BITS: dict = {}
_BITS_LOCK = threading.Lock()
_BLOCKS = None  # the worker's SpillCache of compacted and restricted blocks: one budget (``cache_bytes``) for both
_RECENT: OrderedDict = OrderedDict()  # signatures of the last RESTRICT_KEEP working sets, most recent last
_WANTED = None  # (signature of S, _RECENT's signatures) when the cache last dropped what they do not name
RESTRICT_KEEP = 4  # working sets a worker keeps: each l2 segment's current one and the one before


def _index(support, sig, n_features):
    """The support's (bits, rank) at the width (:func:`K.support_index`), once per worker process and support (the
    last two kept)."""
    with _BITS_LOCK:
        hit = _BITS.get(sig)
    if hit is None:
        hit = K.support_index(np.asarray(support, dtype=np.int64), int(n_features),
                              np.zeros(0, np.int32 if n_features < 2**31 else np.int64))
        with _BITS_LOCK:
            while len(_BITS) >= 2:
                _BITS.pop(next(iter(_BITS)))
            _BITS[sig] = hit
    return hit


def _cached(key, build, cache_bytes: int):
    """``build()``'s arrays under ``key`` = (signature of S, signature of W or None, ...) in the worker's
    :class:`pipeline.spill.SpillCache`: ``cache_bytes`` of them in memory, the rest spilled to local disk. Entries
    of other supports, and restricted blocks of working sets older than the last RESTRICT_KEEP, are dropped."""
    global _BLOCKS, _WANTED
    from pipeline.spill import SpillCache

    sig = key[0]
    with _BITS_LOCK:
        if _BLOCKS is None:
            _BLOCKS = SpillCache()
        recent = frozenset(_RECENT)
        changed, _WANTED = _WANTED != (sig, recent), (sig, recent)

    if changed:  # a new S or W: what is no longer wanted goes now, not when room is needed
        _BLOCKS.drop(lambda k: k[0] != sig or (k[1] is not None and k[1] not in recent))
    return _BLOCKS.get(key, build, cache_bytes)


def release_blocks() -> tuple[int, int]:
    """Empty this process's refit cache (called on every worker when a refit ends); returns the bytes it held in
    memory and in spill files."""
    from pipeline.memory import trim_heap

    if _BLOCKS is None:
        return 0, 0
    held = (_BLOCKS.memory.nbytes, _BLOCKS.spilled_bytes)
    _BLOCKS.drop()
    trim_heap()
    return held


def compacted(data, b: int, support, sig: str, cache_bytes: int = DEFAULT_CACHE_BYTES, split=(0.0, 0)):
    """Training block ``b`` of ``data`` (an engine DataRef) restricted to S: (cindptr, cidx, cval, y), cached per
    worker process by (signature of S, store, manifest version, block key) within ``cache_bytes`` (:func:`_cached`).
    With ``split = (fraction, seed)``, fraction > 0, the block's rows are divided into a fitting part and a
    validation part (a seeded Bernoulli choice per row, the same on every worker): two such 4-tuples, concatenated
    (fit first)."""
    fraction, seed = float(split[0]), int(split[1])

    def build():
        indptr, indices, values, y = data.load(b)
        ci, cj, cv = K.compact_block(indptr, indices, values, *_index(support, sig, data.n_features),
                                     np.zeros(0, K.position_dtype(len(support))))
        y = np.asarray(y, dtype=np.float64)
        if fraction <= 0:
            return ci, cj, cv, y
        val = validation_rows(y.shape[0], fraction, seed, b)
        parts = ()
        for rows in (np.flatnonzero(~val), np.flatnonzero(val)):
            parts += (*K.take_rows(ci, cj, cv, rows.astype(np.int64)), y[rows])
        return parts

    key = (sig, None, data.store, data.version, data.keys[b]) + ((fraction, seed) if fraction > 0 else ())
    return _cached(key, build, cache_bytes)


def validation_rows(n_rows: int, fraction: float, seed: int, b: int) -> np.ndarray:
    """bool[n_rows]: the rows of training block number ``b`` set aside to validate the L1 path."""
    return np.random.default_rng([int(seed), int(b), 0x5e1ec7]).random(n_rows) < fraction


def _pieces(arrays, part: str) -> list:
    """The (cindptr, cidx, cval, y) 4-tuples of a compacted block (:func:`compacted`) holding the rows of ``part``:
    "fit", "val" (with a split) or "all" (without a split every part is all rows)."""
    if len(arrays) == 4:
        return [arrays]
    return {"fit": [arrays[:4]], "val": [arrays[4:]], "all": [arrays[:4], arrays[4:]]}[part]


def restricted(data, b: int, support, sig: str, cols, csig: str, cache_bytes: int, split, part: str) -> list:
    """:func:`_pieces` of block ``b``'s compaction to S restricted further to the columns at positions ``cols`` of S
    (a working set W, :func:`K.restrict_columns`), cached beside the compacted blocks for the last RESTRICT_KEEP
    working sets (an L1 solve's rounds and the path's points each have their W, the two l2 segments run side by
    side; an older W is not asked for again)."""
    with _BITS_LOCK:
        _RECENT[csig] = None
        _RECENT.move_to_end(csig)
        while len(_RECENT) > RESTRICT_KEEP:
            _RECENT.popitem(last=False)

    def build():
        pos = np.full(len(support), -1, dtype=np.int32)
        pos[np.asarray(cols, dtype=np.int64)] = np.arange(len(cols), dtype=np.int32)
        return tuple(a for ci, cj, cv, y in _pieces(compacted(data, b, support, sig, cache_bytes, split), part)
                     for a in (*K.restrict_columns(ci, cj, cv, pos), y))

    key = (sig, csig, data.store, data.version, data.keys[b], part, float(split[0]), int(split[1]))
    arrays = _cached(key, build, cache_bytes)
    return [arrays[i:i + 4] for i in range(0, len(arrays), 4)]


def block_task(data, b: int, support, sig: str, w, bias: float, code: int, cache_bytes: int,
               split=(0.0, 0), part: str = "all", cols=None, csig: str | None = None) -> np.ndarray:
    """One block's partial sums as one vector: [Σ loss, Σ ℓ' (bias gradient), rows, Σ loss², Σ ℓ'·x_S (s entries)], over
    the block's rows of ``part``: "fit", "val" (with a split) or "all". With ``cols`` (positions in S, signature
    ``csig``): w and the gradient are on those columns only, the others held at 0 (:func:`restricted`)."""
    if cols is None:
        pieces = _pieces(compacted(data, b, support, sig, cache_bytes, split), part)
    else:
        pieces = restricted(data, b, support, sig, cols, csig, cache_bytes, split, part)
    w = np.asarray(w, dtype=np.float64)
    out = np.zeros(4 + len(w), dtype=np.float64)
    grad = np.empty(len(w), dtype=np.float64)
    for ci, cj, cv, y in pieces:
        total, gbias, total_sq = K.loss_grad(ci, cj, cv, y, w, float(bias), code, grad)
        out[:4] += (total, gbias, y.shape[0], total_sq)
        out[4:] += grad
    return out


def tree_sum(items):
    """Σ ``items`` in :func:`pipeline.engine.tree`'s fixed order (pairs (0,1), (2,3), ..., an odd last one carried
    up), streamed: at most log2(n) + 1 partial sums are held."""
    stack = []  # (leaves, partial sum), leaves strictly decreasing powers of two
    for v in items:
        size = 1
        while stack and stack[-1][0] == size:
            v = stack.pop()[1] + v
            size *= 2
        stack.append((size, v))
    v = stack.pop()[1]
    while stack:
        v = stack.pop()[1] + v
    return v


def chunk_task(data, lo: int, hi: int, *args) -> np.ndarray:
    """:func:`block_task`'s vectors of blocks lo..hi−1 summed: with lo a multiple of a power of two C ≥ hi − lo,
    bit for bit the node of the fixed tree over all blocks that covers them, so one task per chunk of C blocks
    gives the tree's sum exactly (a task per block cost ~2 ms of scheduling each, more than its arithmetic)."""
    return tree_sum(block_task(data, b, *args) for b in range(lo, hi))


def paired_task(data, lo: int, hi: int, support, sig: str, W, biases, ref: int, code: int, cache_bytes: int,
                split) -> np.ndarray:
    """Over the validation rows of blocks lo..hi−1, with d_c = ℓ(model c) − ℓ(model ``ref``) per row (models: the
    columns of W with their biases, :func:`K.row_losses`): float64[3, models] of (rows, Σ d_c, Σ d_c²), block by
    block in :func:`tree_sum`'s order. The rows' losses stay on the worker."""
    W = np.ascontiguousarray(W, dtype=np.float64)
    biases = np.asarray(biases, dtype=np.float64)

    def block(b):
        ci, cj, cv, y = compacted(data, b, support, sig, cache_bytes, split)[4:]
        losses = np.empty((y.shape[0], W.shape[1]), dtype=np.float64)
        K.row_losses(ci, cj, cv, y, W, biases, code, losses)
        d = losses - losses[:, [ref]]
        return np.stack([np.full(W.shape[1], float(y.shape[0])), d.sum(axis=0), (d * d).sum(axis=0)])

    return tree_sum(block(b) for b in range(lo, hi))


TASK_BLOCKS = 1.5  # a Dask task's scheduling cost in blocks' arithmetic (35k full-width rows: ~2 ms vs ~1.4 ms)


def chunk_blocks(n_blocks: int, n_workers: int) -> int:
    """Blocks per evaluation task, a power of two: the fewest blocks' time on the busiest worker (chunk k on
    worker k mod n) plus TASK_BLOCKS per task a worker runs. Any choice gives the same sums (:func:`chunk_task`)."""
    w = max(1, n_workers)
    best, c = (np.inf, 1), 1
    while c <= max(1, n_blocks):
        k = -(-n_blocks // c)
        sizes = np.minimum(c, n_blocks - c * np.arange(k))
        busiest = max(int(sizes[i::w].sum()) for i in range(min(w, k)))
        best = min(best, (busiest + TASK_BLOCKS * -(-k // w), c))
        c *= 2
    return best[1]


_SCRATCH = threading.local()


def full_gradient_task(data, b: int, support, sig: str, w, bias: float, code: int):
    """Block b's Σ ℓ'·x over every column it touches, as (column ids, sums): :func:`K.full_gradient_block` into a
    width-sized scratch vector kept per worker thread, read back at its non-zeros and cleared."""
    indptr, indices, values, y = data.load(b)
    acc = getattr(_SCRATCH, "acc", None)
    if acc is None or acc.shape[0] != data.n_features:
        acc = _SCRATCH.acc = np.zeros(data.n_features, dtype=np.float64)
    K.full_gradient_block(indptr, indices, values, np.asarray(y, dtype=np.float64),
                          *_index(support, sig, data.n_features), np.asarray(w, dtype=np.float64), float(bias),
                          code, acc)
    idx = np.flatnonzero(acc)
    vals = acc[idx]
    acc[idx] = 0.0
    return (idx.astype(np.int32) if data.n_features < 2**31 else idx), vals


# ------------------------------------------------------------------------------------- client side

def everywhere(client, fn) -> list:
    """``fn()`` on every worker process of a Dask ``client`` and in this one (the in-process executors' worker)."""
    run = getattr(client, "run", None)  # the embedded thread executor has no worker processes
    return (list(run(fn).values()) if run is not None else []) + [fn()]


def support_stats(st, support) -> tuple[np.ndarray, np.ndarray]:
    """(non-zero count, sum of squares) over the training split of the store ``st`` of each column of ``support``
    (sorted ids), from the store's statistics."""
    from pipeline.store.stats import read_stats

    f, cnt, sumsq = read_stats(f"{st.path}/{st.manifest['stats']}")
    count, ss = np.zeros(support.size, dtype=np.int64), np.zeros(support.size)
    if f.size:
        pos = np.minimum(np.searchsorted(f, support), f.size - 1)
        hit = f[pos] == support
        count[hit], ss[hit] = cnt[pos[hit]], sumsq[pos[hit]]
    return count, ss


def support_positions(st, support) -> np.ndarray | None:
    """For a store in frequency order (:mod:`pipeline.store.order`): rank_at[p] = the rank in the ascending
    ``support`` (store ids) of the column at position p of the optimiser's vectors, which list S by its input ids
    ascending; None when the two orders agree. Every sum over S (L-BFGS's dot products, norms, the line search) then
    adds in the same order as on the input's order, so the refit is the same bit for bit; the workers keep their
    positions."""
    if not st.feature_order or not support.size:
        return None
    from pipeline.store.order import ids_external

    rank_at = np.argsort(ids_external(support, st.order_maps[1]), kind="stable")
    return None if np.array_equal(rank_at, np.arange(support.size)) else rank_at


def compacted_bytes(st, support, blocks=None, counts=None) -> int:
    """The training blocks compacted to ``support`` (:func:`compacted`), in bytes: its non-zeros over the whole
    training split (``counts``, or the store's statistics read here; an upper bound for a window of ``blocks``) as
    (position, value) pairs, and a row pointer per row."""
    nnz = int((support_stats(st, support)[0] if counts is None else counts).sum())
    rows = sum(int(e["rows"]) for e in st.entries("train", blocks))
    return nnz * (K.position_dtype(support.size).itemsize + st.data_dtype.itemsize) + 8 * rows


def fits_here(st, support, blocks=None, cache_bytes: int = DEFAULT_CACHE_BYTES, counts=None) -> bool:
    """Whether the training blocks compacted to ``support`` fit in one cache budget: then a refit on a cluster
    started by this process runs on this process's threads (:func:`refit_client`)."""
    return compacted_bytes(st, np.asarray(support, dtype=np.int64), blocks, counts) <= cache_bytes


@contextlib.contextmanager
def refit_client(client, st, support, blocks=None, cache_bytes: int = DEFAULT_CACHE_BYTES, counts=None):
    """The refit's executor: ``client``, or threads of this process (:class:`pipeline.cluster.ThreadClient`) in
    place of the worker processes of a cluster started here (``--workers N``: ``client.cluster`` is set) when the
    compacted blocks fit in one cache budget. Its L-BFGS makes hundreds of passes, each a round trip to the
    workers; on threads a pass costs no serialisation or scheduling (35k webspam-like rows, 2 cores, S of 14,362
    columns, 355 MB compacted: 40.2 s on threads against 67.1 s on 2 worker processes, the same bits, since any
    executor gives the same sums, :func:`chunk_task`). A ``--scheduler`` cluster, maybe on other machines, and
    larger supports keep the workers and their memory."""
    from pipeline.cluster import ThreadClient

    local = (getattr(client, "cluster", None) is not None and hasattr(client, "run")
             and fits_here(st, support, blocks, cache_bytes, counts))
    if not local:
        yield client
        return
    with ThreadClient() as threads:
        yield threads


class RefitProblem:
    """F(w, b) and its gradient over the training blocks of a store, for weights on ``support``."""

    def __init__(self, store_path: str, support, *, l2: float, loss: str = "logistic", client=None,
                 blocks=None, cache_bytes: int = DEFAULT_CACHE_BYTES, split=(0.0, 0), progress=None, stats=None):
        from pipeline.engine import DataRef, DaskExec, LocalExec
        from pipeline.store.reader import open_store

        st = open_store(store_path)
        entries = st.entries("train", blocks)  # never the holdout
        if not entries:
            raise ValueError(f"{store_path}: no training blocks")
        if l2 is None:
            l2 = L2_PER_ROW / max(1, sum(int(e["rows"]) for e in entries))
        if l2 < 0:
            raise ValueError(f"refit l2 must be >= 0, got {l2}")
        self.support = np.ascontiguousarray(support, dtype=np.int64)
        if self.support.size and (np.any(np.diff(self.support) <= 0) or self.support[0] < 0):
            raise ValueError("support must be sorted, unique, non-negative column ids")
        self.l2, self.loss, self.code = float(l2), loss, {"logistic": LOGISTIC, "squared": SQUARED}[loss]
        # raw blocks are read once per compaction (and per KKT pass): not kept in the engine's block cache
        self.data = DataRef(st.path, st.manifest["manifest_version"], tuple(e["key"] for e in entries),
                            tuple(e["rows"] for e in entries), st.n_features, 0)
        self.n_rows = int(sum(e["rows"] for e in entries))
        self.label_kind = st.label_kind
        self.sig = support_signature(self.support, st.n_features)
        self.rank_at = support_positions(st, self.support)
        self.perm = None  # the inverse: rank -> position
        if self.rank_at is not None:
            self.perm = np.empty_like(self.rank_at)
            self.perm[self.rank_at] = np.arange(self.rank_at.size)
        # the columns of S in the order of the optimiser's vectors: the input's ids ascending (self.support is
        # ascending in the store's ids, which the workers' compacted blocks use)
        self.ids = self.support if self.perm is None else self.support[self.rank_at]
        self.cache_bytes = int(cache_bytes)
        self.split = (float(split[0]), int(split[1]))
        self.client = client
        self.ex = DaskExec(client) if client is not None else LocalExec()
        self.chunk = chunk_blocks(len(entries), self.ex.slots() if client is not None else 1)
        # a key of its own: with a content hash, a just-released problem's scatter of the same support raced
        # this one ("Could not find data" on a worker, then a task that never ran)
        self.sup_ref = client.scatter(self.support, broadcast=True, hash=False) if client is not None else self.support
        self.evaluations = 0
        self.eval_seconds = 0.0
        self._count_lock = threading.Lock()  # the validated path's l2 segments evaluate from threads of their own
        self.cancelled = threading.Event()  # set: every evaluation raises (a segment failed or was interrupted)
        self.progress = progress  # called with the evaluation count after every evaluation
        # stats: :func:`support_stats` when known (in the store's id order, like ``support``)
        self._store, self._scale = st, None
        self._stats = None if stats is None else tuple(self.placed(a) for a in stats)
        self.cache_bytes = self.fitting_cache(self.cache_bytes)

    def support_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """(non-zero count, sum of squares) of each column of S over the training split (store statistics), in
        the vectors' order."""
        if self._stats is None:
            self._stats = tuple(self.placed(a) for a in support_stats(self._store, self.support))
        return self._stats

    def placed(self, v) -> np.ndarray:
        """A vector over S in the store's id order (the workers') in the order of the optimiser's vectors."""
        v = np.asarray(v)
        if self.perm is None:
            return v
        out = np.empty_like(v)
        out[self.perm] = v
        return out

    def ranked(self, v) -> np.ndarray:
        """The inverse of :meth:`placed` (along the first axis)."""
        return np.asarray(v) if self.perm is None else np.asarray(v)[self.perm]

    def position_of(self, ids) -> np.ndarray:
        """Positions in the optimiser's vectors of the columns ``ids`` (store ids, all in S)."""
        r = np.searchsorted(self.support, np.asarray(ids, dtype=np.int64))
        return r if self.perm is None else self.perm[r]

    def fitting_cache(self, cache_bytes: int) -> int:
        """The block cache per worker (:func:`_cached`): ``cache_bytes``, or what the workers' smallest memory_limit
        leaves beside REFIT_WORKER_BASE when that is less (the blocks beyond it are spilled to the worker's disk)."""
        from pipeline.memory import worker_limits

        limits = [x for x in (worker_limits(self.client) if self.client is not None else []) if x > 0]
        return max(0, min(cache_bytes, min(limits) - REFIT_WORKER_BASE)) if limits else cache_bytes

    def release(self) -> dict:
        """Empty the refit cache of every worker (and of this process: the in-process executor's); returns the
        budget per worker and what they held at the end: the most in one worker's memory, the spill files' total
        (bytes)."""
        held = everywhere(self.client, release_blocks)
        return {"budget_bytes": self.cache_bytes, "memory_bytes": max(m for m, _ in held),
                "spilled_bytes": sum(d for _, d in held)}

    def full_gradient(self, theta) -> np.ndarray:
        """∂/∂w_j of the mean loss at theta (w on S) for every column j of the width: one pass over the training
        blocks' full rows, partial sums added on the client in block order (deterministic)."""
        theta = np.asarray(theta, dtype=np.float64)
        w = self._ship(self.ranked(theta[:-1]), len(self.data.keys))
        g = np.zeros(self.data.n_features, dtype=np.float64)
        for idx, vals in in_order(lambda b: self.ex.submit_pinned(b, full_gradient_task, self.data, b, self.sup_ref,
                                                                  self.sig, w, float(theta[-1]), self.code),
                                  len(self.data.keys), GRADIENT_WINDOW, self.ex.result):
            g[idx] += vals
        return g / self.n_rows

    def precondition(self) -> np.ndarray:
        """s_j = sqrt(c·Σ_i x_ij²/n + l2) for j in S (c = 1/4, the largest ℓ'' of the logistic loss; 1 squared),
        from the store's training statistics; 1 for a column without any."""
        if self._scale is None:
            st = self._store
            ss = self.support_stats()[1]
            c = 0.25 if self.loss == "logistic" else 1.0
            n = max(1, sum(int(e["rows"]) for e in st.entries("train")))
            self._scale = np.where(ss > 0, np.sqrt(c * ss / n + self.l2), 1.0)
        return self._scale

    def _ship(self, w, copies: int):
        """w for ``copies`` block tasks: inside their graphs while that is at most LARGE_ARG bytes in all (35k rows,
        |S| = 12k: 3 chunk tasks of 99 KB each; a scatter first is one more round trip per evaluation, ~11 ms of
        ~80 on 2 workers), else scattered to the workers once."""
        from pipeline.engine import LARGE_ARG

        w = np.ascontiguousarray(w)
        if self.client is not None and w.nbytes * copies > LARGE_ARG:
            w = self.client.scatter(w, broadcast=True, hash=False)
        return w

    def sums(self, w, bias, part: str = "all", cols=None) -> np.ndarray:
        """Sum over all training blocks of :func:`block_task`'s vector, one task per chunk of ``self.chunk`` blocks
        (:func:`chunk_task`), the chunks' vectors added on the client in the fixed tree's order (:func:`tree_sum`,
        the engine's ``tree``: deterministic), not by more tasks (each one more round trip). ``cols``: w is on
        those positions of S only (sorted), the others 0; :meth:`columns`' handle, or the positions themselves."""
        if cols is not None:  # w and the result are per column of W, in its order
            extra = cols if isinstance(cols, tuple) else self.columns(cols)
            return self._over_chunks(chunk_task, w, float(bias), self.code, self.cache_bytes, self.split, part, *extra)
        tot = self._over_chunks(chunk_task, self.ranked(w), float(bias), self.code, self.cache_bytes, self.split, part)
        tot[4:] = self.placed(tot[4:])
        return tot

    def columns(self, cols) -> tuple:
        """A working set W ⊆ S (sorted positions in S) for :meth:`sums` / :meth:`evaluate`: (positions, shipped
        as :meth:`_ship` ships w, and their signature), prepared once for the evaluations of an L1 solve's round."""
        cols = np.asarray(cols, dtype=np.int64)
        if self.perm is not None:  # the workers' positions of the same columns, in the same order
            cols = self.rank_at[cols]
        cols = np.ascontiguousarray(cols)
        return self._ship(cols, self._tasks()), support_signature(cols, self.support.size)

    def _tasks(self) -> int:
        return -(-len(self.data.keys) // self.chunk)

    def _over_chunks(self, task, w, *args) -> np.ndarray:
        """``task(data, lo, hi, S, sig, w, *args)`` for each chunk of ``self.chunk`` blocks, pinned to its worker,
        with ``w`` shipped once (:meth:`_ship`); the chunks' arrays added in the fixed tree order (:func:`tree_sum`)."""
        n, c, k = len(self.data.keys), self.chunk, self._tasks()
        w = self._ship(np.asarray(w, dtype=np.float64), k)
        return tree_sum(self.ex.gather([self.ex.submit_pinned(i, task, self.data, i * c, min(n, (i + 1) * c),
                                                              self.sup_ref, self.sig, w, *args) for i in range(k)]))

    def paired(self, thetas: list, ref: int) -> tuple[np.ndarray, np.ndarray]:
        """(mean, standard error) over the validation rows of d_c = ℓ(thetas[c]) − ℓ(thetas[ref]) per row, for every
        c: one pass over the training blocks (needs a split), sums in the fixed tree order (:func:`paired_task`)."""
        W = self.ranked(np.stack([np.asarray(t, dtype=np.float64)[:-1] for t in thetas], axis=1))
        biases = np.array([float(t[-1]) for t in thetas])
        rows, s1, s2 = self._over_chunks(paired_task, W, biases, int(ref), self.code, self.cache_bytes, self.split)
        m = rows[0]  # every column counts the same rows
        mean = s1 / max(m, 1.0)
        var = np.maximum(s2 - m * mean * mean, 0.0) / max(m - 1.0, 1.0)
        return mean, np.sqrt(var / max(m, 1.0))

    def evaluate(self, theta, part: str = "all", l2: float | None = None, cols=None) -> tuple[float, np.ndarray]:
        """F and ∇F at theta = [w (|S| entries), bias], over the rows of ``part`` (see :func:`block_task`), with
        the problem's l2 or the given one (the validated path tries several). With ``cols`` (sorted positions in
        S, or :meth:`columns`' handle of them): w has an entry per column of ``cols``, every other column of S is
        0, and ∇F is on ``cols`` only, at the cost of their non-zeros (:func:`restricted`)."""
        if self.cancelled.is_set():
            raise RuntimeError("refit cancelled")
        t0 = time.perf_counter()
        theta = np.asarray(theta, dtype=np.float64)
        w, bias = theta[:-1], theta[-1]
        tot = self.sums(w, bias, part, cols)
        n = tot[2]
        l2 = self.l2 if l2 is None else l2
        f = tot[0] / n + 0.5 * l2 * float(w @ w)
        g = np.empty_like(theta)
        g[:-1] = tot[4:] / n + l2 * w
        g[-1] = tot[1] / n
        with self._count_lock:
            self.evaluations += 1
            self.eval_seconds += time.perf_counter() - t0
            if self.progress is not None:
                self.progress(self.evaluations)
        return float(f), g


def lbfgs_memory(variables: int) -> int:
    """L-BFGS-B's maxcor for a problem of ``variables``: LBFGS_ENTRIES / variables within LBFGS_MEMORY."""
    lo, hi = LBFGS_MEMORY
    return int(min(hi, max(lo, LBFGS_ENTRIES // max(1, int(variables)))))


def solve(prob: RefitProblem, x0, l1: float = 0.0, part: str = "all", max_iter: int = DEFAULT_MAX_ITER,
          tol: float = DEFAULT_TOL, active=None, weights=None, l2: float | None = None):
    """argmin over theta = [w, b] of F_part(w, b) + l1·Σ_j a_j·|w_j| by L-BFGS-B, from ``x0`` (a_j = ``weights``,
    default 1: the lasso; the adaptive lasso's weights otherwise; F at ``l2``, default the problem's); returns
    (theta, scipy result; with l1 > 0 its ``nit`` summed over the working-set rounds, ``rounds`` and the final
    ``working_set`` size added).

    The variables are z = s ⊙ w with s = :meth:`RefitProblem.precondition` (the square root of the Hessian's
    diagonal at its largest): L-BFGS-B is not scale-invariant, and columns of S differ by orders of magnitude in
    frequency. l1 > 0 (Meinshausen's relaxed lasso keeps an L1 penalty on S): the split z = u − v with u, v ≥ 0
    makes the objective F((u − v)/s, b) + l1·Σ a_j(u + v)/s smooth on a box, ∂/∂u = ∇_w F/s + l1·a/s,
    ∂/∂v = −∇_w F/s + l1·a/s; at the optimum at most one of u_j, v_j is positive, and L-BFGS-B's projection leaves
    the others at exactly 0. ``active`` (bool over S, l1 > 0): the other columns are held at exactly 0 (the
    relaxed lasso's refit on a lasso solution's support, the adaptive lasso's on w̃'s), and so are the columns
    outside the working set (:func:`_working_set_solve`).
    """
    from scipy.optimize import minimize

    x0 = np.asarray(x0, dtype=np.float64)
    sc = prob.precondition()
    opts = {"maxiter": int(max_iter), "gtol": float(tol), "ftol": 1e-12}
    if l1 <= 0:
        def smooth(z):
            f, g = prob.evaluate(np.append(z[:-1] / sc, z[-1]), part, l2)
            g[:-1] /= sc
            return f, g

        res = minimize(smooth, np.append(x0[:-1] * sc, x0[-1]), jac=True, method="L-BFGS-B",
                       options={**opts, "maxcor": lbfgs_memory(x0.size)})
        return np.append(res.x[:-1] / sc, res.x[-1]), res
    pen = l1 / sc if weights is None else l1 * np.asarray(weights, dtype=np.float64) / sc
    allowed = np.ones(x0.size - 1, dtype=bool) if active is None else np.asarray(active, dtype=bool)
    return _working_set_solve(prob, x0, pen, allowed, sc, part, l2, opts)


def _working_set_solve(prob: RefitProblem, x0, pen, allowed, sc, part, l2, opts):
    """The L1 solve of :func:`solve` on a working set W ⊆ ``allowed`` (glmnet's and celer's active-set strategy):
    L-BFGS-B over the 2|W| + 1 variables of W only, each evaluation restricted to W's columns (the others at
    exactly 0: :meth:`RefitProblem.evaluate` with ``cols``, the cost of W's non-zeros); then one evaluation over
    all of S at the solution checks the KKT conditions of every allowed column outside W, and the violators join
    W until there are none. W starts as supp(x0) and the columns violating the KKT conditions at x0. A column j
    outside W at w_j = 0 violates them when (|∂F/∂w_j| − l1·a_j)/s_j > tol: its projected gradient in the
    z-variables, L-BFGS-B's own stopping test. So the solution passes the test the solve over all of ``allowed``
    stops on, while L-BFGS-B's cost per iteration (O(maxcor·variables), and scipy's per-call bounds conversion)
    and each evaluation's follow the ~|supp| columns that matter, not |S| (0.5M columns of S at 2k rows: 24 ms an
    iteration in L-BFGS-B alone against ~8 ms for the evaluation over S).
    ``pen`` = l1·a/s per column of S; iterations (``opts["maxiter"]``) are shared by the rounds."""
    from scipy.optimize import Bounds, minimize

    tol, budget = opts["gtol"], opts["maxiter"]

    def violation(x):
        g = prob.evaluate(x, part, l2)[1]
        return (np.abs(g[:-1]) / sc - pen > tol) & allowed

    x = x0.copy()
    x[:-1][~allowed] = 0.0
    work = allowed & ((x[:-1] != 0) | violation(x))
    nit, rounds = 0, 0
    while True:
        rounds += 1
        idx = np.flatnonzero(work)
        k, s_w, p_w, cols = idx.size, sc[idx], pen[idx], prob.columns(idx)

        def fun(z):
            f, g = prob.evaluate(np.append((z[:k] - z[k:2 * k]) / s_w, z[-1]), part, l2, cols=cols)
            gw = g[:-1] / s_w
            return f + float(p_w @ (z[:k] + z[k:2 * k])), np.concatenate([gw + p_w, p_w - gw, g[-1:]])

        w = x[idx] * s_w
        z0 = np.concatenate([np.maximum(w, 0.0), np.maximum(-w, 0.0), x[-1:]])
        bounds = Bounds(np.append(np.zeros(2 * k), -np.inf), np.full(2 * k + 1, np.inf))
        res = minimize(fun, z0, jac=True, method="L-BFGS-B", bounds=bounds,
                       options={**opts, "maxiter": max(1, budget - nit), "maxcor": lbfgs_memory(z0.size)})
        nit += int(res.nit)
        x = np.zeros_like(x)
        x[idx] = (res.x[:k] - res.x[k:2 * k]) / s_w
        x[-1] = res.x[-1]
        if nit >= budget and not res.success:
            break
        viol = violation(x) & ~work
        if not viol.any():
            break
        if nit >= budget:  # converged on W with the last iteration, but W was not the whole support
            res.success, res.message = False, "ITERATION LIMIT REACHED WITH KKT VIOLATORS OUTSIDE THE WORKING SET"
            break
        work |= viol
    res.nit, res.rounds, res.working_set = nit, rounds, int(work.sum())
    return x, res


def _scored(prob: RefitProblem, theta, res, l1: float, l1_select: float, phi: float = 1.0) -> dict:
    """A path entry: the validation rows' mean loss at theta and its standard error."""
    tot = prob.sums(theta[:-1], theta[-1], "val")
    mean = tot[0] / tot[2]
    se = float(np.sqrt(max(tot[3] / tot[2] - mean * mean, 0.0) / max(tot[2] - 1, 1)))
    return {"l1": l1, "l1_select": l1_select, "phi": phi, "val_loss": float(mean), "val_se": se,
            "nnz": int(np.count_nonzero(theta[:-1])), "iterations": int(res.nit)}


def _acceptable(prob, path: list, thetas: list, among: list, select: str, record: bool = False) -> list:
    """Positions in ``among`` (indices into ``path``) of the entries the rule ``select`` accepts among them: the
    lowest validation loss ("min"); within one standard error of it ("one-se"); "paired": not worse than it by
    more than the standard error of their per-row differences on the same validation rows (one pass for all:
    :meth:`RefitProblem.paired`; ``record`` writes each entry's "val_gap" and "val_gap_se")."""
    sub = [path[i] for i in among]
    if select == "paired":
        best = min(range(len(sub)), key=lambda p: sub[p]["val_loss"])
        gap, se = prob.paired([thetas[i] for i in among], best)
        if record:
            for e, g, s in zip(sub, gap, se):
                e["val_gap"], e["val_gap_se"] = float(g), float(s)
        return [p for p in range(len(sub)) if gap[p] <= se[p]]
    best = min(sub, key=lambda e: e["val_loss"])
    bound = best["val_loss"] + (best["val_se"] if select == "one-se" else 0.0)
    return [p for p, e in enumerate(sub) if e["val_loss"] <= bound]


def _null_start(prob: RefitProblem) -> tuple[np.ndarray, float]:
    """(theta at w = 0 with the bias fitted, λ_max = max_j |∂F_fit/∂w_j| there: the smallest λ giving w = 0; the
    same at every l2, as l2·w = 0)."""
    s = prob.support.size
    tot = prob.sums(np.zeros(s), 0.0, "fit")  # ℓ'(0, y): logistic −y/2, squared −y
    ybar = -tot[1] / tot[2] * (2.0 if prob.loss == "logistic" else 1.0)
    b0 = float(np.log((1 + ybar) / (1 - ybar))) if prob.loss == "logistic" and abs(ybar) < 1 else float(ybar)
    theta = np.append(np.zeros(s), b0)
    return theta, float(np.max(np.abs(prob.evaluate(theta, "fit")[1][:-1]))) if s else 0.0


def _lasso_path(prob: RefitProblem, path, thetas, l2, null, max_iter, tol, per_decade, decades, patience, refine,
                select):
    """Appends glmnet's warm-started path at ``l2`` from ``null`` (:func:`_null_start`) to ``path``/``thetas``
    (see :func:`l1_path`); returns the index of its best coarse point."""
    s, start = prob.support.size, len(path)
    theta, lam_max = null
    entry = {"phi": 1.0, "l2": l2}
    for k in range(1, int(decades * per_decade) + 1):
        lam = lam_max * 10.0 ** (-k / per_decade)
        theta, res = solve(prob, theta, lam, "fit", max_iter, tol, l2=l2)
        path.append({**_scored(prob, theta, res, lam, lam), **entry})
        thetas.append(theta)
        best = min(range(start, len(path)), key=lambda i: path[i]["val_loss"])
        if len(path) - 1 - best >= patience or path[-1]["nnz"] == s:
            break
    pick = start + _acceptable(prob, path, thetas, list(range(start, len(path))), select)[0]  # the largest λ accepted
    for j in range(1, refine + 1) if pick > start else ():  # between that choice and the next larger λ
        lam = path[pick]["l1"] * 10.0 ** (j / (per_decade * (refine + 1)))
        theta, res = solve(prob, thetas[-1] if j > 1 else thetas[pick], lam, "fit", max_iter, tol, l2=l2)
        path.append({**_scored(prob, theta, res, lam, lam), **entry, "refined": True})
        thetas.append(theta)
    return best


def _lasso_segments(prob: RefitProblem, l2s, *args):
    """:func:`_lasso_path` at each l2 of ``l2s`` from w = 0 (:func:`_null_start`), in a thread each: the segments
    are independent, so they fill each other's waits on the workers (an evaluation's scheduling and transfers)
    and give the same entries as one after the other. Returns (path, thetas, the index of each segment's best
    coarse point), the segments in ``l2s``'s order. When one fails (or the caller is interrupted) the others stop
    at their next evaluation (:attr:`RefitProblem.cancelled`) and the error is raised."""
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    null = _null_start(prob)

    def segment(l2):
        path, thetas = [], []
        return path, thetas, _lasso_path(prob, path, thetas, float(l2), null, *args)

    pool = ThreadPoolExecutor(len(l2s))
    futures = [pool.submit(segment, l2) for l2 in l2s]
    try:
        for f in wait(futures, return_when=FIRST_EXCEPTION).done:
            f.result()  # raises a failed segment's error while the others still run
        parts = [f.result() for f in futures]
    except BaseException:  # a failed segment or a Ctrl-C: the others stop at their next evaluation, not at their end
        prob.cancelled.set()
        raise
    finally:
        pool.shutdown(wait=True)
    path, thetas, bests = [], [], []
    for p, t, best in parts:
        bests.append(len(path) + best)
        path += p
        thetas += t
    return path, thetas, bests


def _choose(prob, path, thetas, among, select: str, record: bool = False) -> int:
    """The entry of ``among`` (indices into ``path``) with the fewest non-zeros (then the largest penalty) that the
    rule ``select`` accepts among them (:func:`_acceptable`)."""
    ok = _acceptable(prob, path, thetas, among, select, record)
    return among[min(ok, key=lambda p: (path[among[p]]["nnz"], -path[among[p]]["l1"]))]


def adaptive_weights(theta, gamma: float) -> np.ndarray:
    """Zou's penalty weights from w̃ = theta[:-1]: a_j = (max|w̃| / |w̃_j|)^γ on supp(w̃), 0 (held at 0) elsewhere."""
    mag = np.abs(np.asarray(theta)[:-1])
    a = np.zeros(mag.size)
    on = mag > 0
    a[on] = (mag.max() / mag[on]) ** gamma
    return a


def adaptive_path(prob: RefitProblem, path, thetas, theta, a, lam0: float, l2: float, gamma: float, max_iter: int,
                  tol: float, per_decade: int, steps: int, patience: int) -> int:
    """Appends the adaptive lasso's warm-started path to ``path``/``thetas``: λ = lam0·10^(−k/per_decade), k = 0 ..
    steps − 1, from ``theta``, weights ``a`` (:func:`adaptive_weights`; columns with a_j = 0 held at 0), at ``l2``,
    stopped ``patience`` points after the best validation loss; returns the index of that best entry."""
    active, start = a > 0, len(path)
    for k in range(steps):
        lam = lam0 * 10.0 ** (-k / per_decade)
        theta, res = solve(prob, theta, lam, "fit", max_iter, tol, active, a, l2)
        path.append({**_scored(prob, theta, res, lam, lam0, 1.0), "l2": l2, "adaptive": gamma})
        thetas.append(theta)
        top = min(range(start, len(path)), key=lambda i: path[i]["val_loss"])
        if len(path) - 1 - top >= patience:
            break
    return top


def l1_path(prob: RefitProblem, max_iter: int, tol: float, per_decade: int = PATH_PER_DECADE,
            decades: float = PATH_DECADES, patience: int = PATH_PATIENCE, relax=RELAX, refine: int = PATH_REFINE,
            adaptive=ADAPTIVE, l2s=None, select: str = DEFAULT_SELECT):
    """The elastic net's penalties chosen on held-out training rows: glmnet's path with one validation split instead
    of cross-validation and a rule that picks among its fits (``select``, :data:`SELECT_RULES`: paired standard
    errors, the lowest loss, or glmnet's one-standard-error rule), Meinshausen's relaxed lasso (2007, eq. 3) and
    Zou's adaptive lasso (2006, eq. 4).

    For each l2 in ``l2s`` (default: ``prob.l2`` alone): λ_max = max_j |∂F_fit/∂w_j| at w = 0 with the bias fitted
    (the smallest λ giving w = 0); then λ_k = λ_max·10^(−k/per_decade), each fitted on the "fit" rows from the
    previous solution (warm start), scored by the mean loss of the "val" rows and its standard error; the path stops
    ``patience`` points after the best, or when every column of S is active. Then ``refine`` penalties evenly spaced
    (in log) between the largest λ the rule accepts and the next larger point of the path, fitted the same way:
    the coarse grid's step (a factor 2.15) is wide where the validation loss rises steeply.

    Relaxation (at the l2 of the best lasso entry): the lasso at λ_k selects S_k = supp(w_λk); the relaxed fit
    minimises F_fit + φ·λ_k·‖w‖₁ over w supported on S_k (φ < 1: less shrinkage of the selected weights), for φ in
    ``relax`` while the validation loss falls, at the lasso's best point and then at larger λ_k while the best
    relaxed loss improves.

    Adaptive lasso, for each γ in ``adaptive``: w̃ = the lasso entry chosen by the rule below among the lasso
    entries; minimise F_fit + λ·Σ_j a_j·|w_j| (at w̃'s l2) over w supported on supp(w̃), a_j = (max|w̃| / |w̃_j|)^γ
    (≥ 1: the largest weight is penalised as the lasso's, smaller ones more), at λ = λ̃·10^(−k/per_decade), k = 0,
    1, ... from w̃'s own λ̃ down (warm-started), stopped ``patience`` points after the best. It shrinks the large
    weights less and drops the small ones the lasso keeps to explain them. Its entries are candidates only when
    their best validation loss is below the lasso's best by more than the latter's standard error (a family of
    models added to the choice must earn its place: on dexter's 60 validation rows, an adaptive fit 0.015 better
    than the lasso's 0.306 ± 0.077 would have let the one-SE rule pick an 11-column model, test error 11% -> 15%).

    The choice over the candidates: the sparsest that ``select`` accepts (:func:`_acceptable`).
    Returns (the chosen entry: its "l1" (φ·λ_k for a relaxed one),
    "l2", "phi", "adaptive" γ if any; theta on the fit rows; the support it is restricted to as a bool mask over S,
    or None for a lasso entry; the penalty weights a or None; the path as a list of dicts)."""
    path, thetas, bests = _lasso_segments(prob, l2s or (prob.l2,), max_iter, tol, per_decade, decades, patience,
                                          refine, select)
    best = min(bests, key=lambda i: path[i]["val_loss"])
    masks, weights = [None] * len(path), [None] * len(path)
    lasso = list(range(len(path)))
    lasso_best = path[min(lasso, key=lambda i: path[i]["val_loss"])]
    l2 = path[best]["l2"]
    relaxed_best = np.inf
    for k in range(best, -1, -1):  # coarse lasso points at the best's l2, from the best to larger λ
        if path[k]["l2"] != l2 or path[k].get("refined"):
            break
        active = thetas[k][:-1] != 0
        if not active.any():
            break
        theta, point_best, lam = thetas[k], np.inf, path[k]["l1"]
        for phi in relax:
            theta, res = solve(prob, theta, phi * lam, "fit", max_iter, tol, active, l2=l2)
            path.append({**_scored(prob, theta, res, phi * lam, lam, phi), "l2": l2})
            thetas.append(theta)
            masks.append(active)
            weights.append(None)
            if path[-1]["val_loss"] >= point_best:
                break
            point_best = path[-1]["val_loss"]
        if point_best >= relaxed_best:
            break
        relaxed_best = point_best
    candidates = list(range(len(path)))
    init = _choose(prob, path, thetas, lasso, select)
    for gamma in adaptive:
        a = adaptive_weights(thetas[init], gamma)
        if not a.any():
            break
        start = len(path)
        top = adaptive_path(prob, path, thetas, thetas[init], a, path[init]["l1"], path[init]["l2"], gamma,
                            max_iter, tol, per_decade, int(decades * per_decade) + 1, patience)
        masks += [a > 0] * (len(path) - start)
        weights += [a] * (len(path) - start)
        if path[top]["val_loss"] + lasso_best["val_se"] < lasso_best["val_loss"]:
            candidates += range(start, len(path))
    pick = _choose(prob, path, thetas, candidates, select, record=True)
    path[pick]["chosen"] = True
    return path[pick], thetas[pick], masks[pick], weights[pick], path


def kkt_expand(prob: RefitProblem, x, res, l1: float, rounds: int, max_iter: int, tol: float):
    """KKT check of the L1 solve on S against all columns: w_j = 0 is optimal for j outside S iff |∂F/∂w_j| ≤ l1.
    Up to ``rounds`` times, the violating columns (largest first, at most |S|/2 + 100) join S and the problem is
    solved again from the current weights (working-set expansion, as glmnet's strong-rule checks). Returns (problem,
    theta, scipy result, report, evaluations); the report's max_ratio = max_{j ∉ S} |∂F/∂w_j| / l1 (≤ 1 + tol:
    the solution is the L1 optimum over every column)."""
    report, evaluations = {"rounds": 0, "added": 0, "checks": []}, prob.evaluations
    while True:
        g = np.abs(prob.full_gradient(x))
        g[prob.support] = 0.0
        ratio = g / l1
        viol = np.flatnonzero(ratio > 1.0 + KKT_TOL)
        report["checks"].append({"max_ratio": float(ratio.max(initial=0.0)), "violators": int(viol.size)})
        if viol.size == 0 or report["rounds"] >= rounds:
            break
        take = viol[np.argsort(-ratio[viol], kind="stable")[:prob.support.size // 2 + 100]]
        support = np.union1d(prob.support, take)
        old = prob
        prob = RefitProblem(prob._store.path, support, l2=prob.l2, loss=prob.loss, client=prob.client,
                            blocks=prob.data.keys, cache_bytes=prob.cache_bytes, progress=prob.progress)
        theta = np.zeros(support.size + 1)
        theta[prob.position_of(old.ids)] = x[:-1]
        theta[-1] = x[-1]
        x, res = solve(prob, theta, l1, "all", max_iter, tol)
        evaluations += prob.evaluations
        report["rounds"] += 1
        report["added"] += int(take.size)
    report.update(report["checks"][-1])
    return prob, x, res, report, evaluations


@reads_store("store_path")
def refit(model, store_path: str, client=None, l2: float = DEFAULT_L2, max_iter: int = DEFAULT_MAX_ITER,
          loss: str | None = None, tol: float = DEFAULT_TOL, blocks=None,
          cache_bytes: int = DEFAULT_CACHE_BYTES, l1: float | str = DEFAULT_L1,
          validation: float = VALIDATION_FRACTION, kkt_rounds: int | None = KKT_ROUNDS, progress=None,
          relax: bool = False, adaptive: bool = DEFAULT_ADAPTIVE, select: str = DEFAULT_SELECT, stats=None):
    """The model refitted on its own support S (see the module docstring); returns a new
    :class:`pipeline.model.Model` (the sparse learner's optimiser state kept; ``meta["refit"]`` records the refit).

    ``l1``: the L1 penalty on S (0: L2 only); "auto" picks it on a ``validation`` share of the training rows
    (:func:`l1_path`), then refits on all of them at that penalty. ``kkt_rounds`` (l1 > 0; None: off): 0 checks the
    KKT conditions of the L1 problem on all columns (one pass over the training blocks' full rows,
    :func:`kkt_expand`), N > 0 also lets columns outside S that violate them join the support (up to N rounds).
    ``progress(n)`` is called after the n-th evaluation of the objective (a pass over the training blocks).
    ``relax`` (l1 "auto", no KKT check): the path also scores Meinshausen's relaxed fits; ``adaptive`` (the
    default; l1 "auto", no KKT check) Zou's adaptive lasso (:func:`l1_path`); ``select`` how the validation rows
    choose among the path's fits (:data:`SELECT_RULES`). With l1 "auto" and ``l2`` None the
    path runs at each l2 of L2_GRID / rows and the validation rows choose. ``stats``: :func:`support_stats` of the
    sorted support when the caller has read them (else read here)."""
    from pipeline.model import Model

    t0 = time.time()
    if max_iter < 1:
        raise ValueError(f"refit max_iter must be >= 1, got {max_iter}")
    if not (l1 == "auto" or (isinstance(l1, (int, float)) and 0 <= l1 < math.inf)):
        raise ValueError(f"refit l1 must be 'auto' or a finite number >= 0, got {l1!r}")
    parse_select(select)
    if kkt_rounds is not None and l1 == 0:
        raise ValueError("the refit's KKT check needs an L1 penalty (l1 'auto' or > 0): its conditions are the L1 "
                         "problem's; with l1 = 0 there is nothing to check")
    if l1 == "auto" and not 0 < validation < 1:
        raise ValueError(f"refit validation share must be in (0, 1), got {validation}")
    from pipeline.store.order import model_external, model_internal
    from pipeline.store.reader import open_store

    st = open_store(store_path)
    given = model
    model = model_internal(model, st)  # the support in the blocks' ids; the result goes back to the caller's
    support = np.asarray(model.coef_indices, dtype=np.int64)
    order = np.argsort(support, kind="stable")
    support, w0 = support[order], np.asarray(model.coef_values, dtype=np.float64)[order]
    loss = refit_loss(model, st.label_kind, loss)
    rows = sum(int(e["rows"]) for e in st.entries("train", blocks))
    path, rule = None, None
    if l1 == "auto" and rows >= AUTO_ROWS_PER_COLUMN * max(1, support.size):
        l1, rule = 0.0, f"rows >= {AUTO_ROWS_PER_COLUMN} x |S|: L2 only"
    elif l1 == "auto" and rows * validation < MIN_VALIDATION_ROWS:
        l1, rule = 0.0, f"{rows} training rows: fewer than {MIN_VALIDATION_ROWS} to validate an L1 path; L2 only"
    split = (validation, int(model.meta.get("seed", 0) or 0)) if l1 == "auto" else (0.0, 0)
    l2s = tuple(c / max(1, rows) for c in L2_GRID) if l2 is None and l1 == "auto" else None
    from pipeline.memory import trim_heap

    everywhere(client, trim_heap)  # the learner's freed pages, before the cache takes its budget
    if stats is None:  # read once (16.6M features: three arrays of the store's width)
        stats = support_stats(st, support)
    with refit_client(client, st, support, blocks, cache_bytes, stats[0]) as client:
        prob = RefitProblem(store_path, support, l2=l2, loss=loss, client=client, blocks=blocks,
                            cache_bytes=cache_bytes, split=split, progress=progress, stats=stats)
        try:
            x0 = np.append(prob.placed(w0), float(model.bias))
            f0, g0 = prob.evaluate(x0)
            active, phi, gamma, a = None, None, None, None
            if l1 == "auto":
                # the KKT check certifies the lasso's optimum: not the relaxed or adaptive fits'
                relax = RELAX if relax and kkt_rounds is None else ()
                adaptive = ADAPTIVE if adaptive and kkt_rounds is None else ()
                chosen, x0, active, a, path = l1_path(prob, min(max_iter, PATH_MAX_ITER), tol, relax=relax,
                                                      adaptive=adaptive, l2s=l2s, select=select)
                l1, phi, gamma = chosen["l1"], chosen["phi"], chosen.get("adaptive")
                prob.l2 = chosen["l2"]  # the final fit (and the KKT check) at the chosen penalties
                rule = "validated path" + (" (relaxed)" if relax else "") + (" (adaptive)" if adaptive else "")
            x, res = solve(prob, x0, float(l1), "all", max_iter, tol, active, a)
            kkt, evaluations = None, prob.evaluations
            if float(l1) > 0 and kkt_rounds is not None:
                prob, x, res, kkt, evaluations = kkt_expand(prob, x, res, float(l1), kkt_rounds, max_iter, tol)
            f, g = prob.evaluate(x)
        except BaseException:
            with contextlib.suppress(Exception):  # the error that stopped the refit is the one to see
                prob.release()
            raise
        cache = prob.release()
        cache["executor"] = "workers" if hasattr(client, "run") else "threads"  # Dask's worker processes or ours
    w, bias = x[:-1], float(x[-1])
    keep = w != 0.0
    secs = time.time() - t0
    meta = dict(model.meta)
    meta["refit"] = {
        "l2": prob.l2, "l1": float(l1), "l1_rule": rule, "l1_path": path, "relax": phi, "adaptive": gamma,
        "validation": split[0] if path else None, "select": select if path else None,
        "kkt": kkt, "cache": cache,
        "loss": loss, "support": int(support.size), "iterations": int(res.nit),
        "evaluations": int(evaluations),
        "objective": f + float(l1) * float(np.abs(w).sum() if a is None else np.abs(w) @ a),
        "objective_start": f0, "grad_norm": float(np.linalg.norm(g)), "grad_max": float(np.max(np.abs(g))),
        "grad_norm_start": float(np.linalg.norm(g0)), "converged": bool(res.success),
        "message": str(res.message), "seconds": round(secs, 3),
        "seconds_per_evaluation": round(prob.eval_seconds / max(1, prob.evaluations), 4),
        "n_rows": prob.n_rows, "nnz_before": model.nnz, "nnz": int(keep.sum()),
        "holdout_before": model.meta.get("holdout"), "bias_before": float(model.bias),
    }
    meta.pop("n_paths_saved", None)
    meta["holdout"] = None  # the sparse model's metrics are in meta["refit"]["holdout_before"]; fit() re-measures
    learner = model.learner or (model.coef_indices, model.coef_values, float(model.bias))  # a refit of a refit: the first
    kept = prob.ranked(keep)  # in the store's id order, as a model lists its weights
    out = Model(model.n_features, prob.support[kept], prob.ranked(w)[kept], bias, meta=meta, states=model.states,
                gstate=model.gstate, learner=learner)
    return out if given is model else model_external(out, st)
