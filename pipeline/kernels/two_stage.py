"""Stage-1 kernel of two-stage sparse learning (ALGORITHMS.md §3): Epoch-GD on {‖w‖₁ ≤ B} ∩ {‖w − c‖₂ ≤ ρ_k}.

Per step (one row (x, y); current iterate w_t of epoch k, centre c = w^k_1):

    f = w·x + b ;  d = ℓ'(f, y) ;  v = w − η_k d x ;  w ← Π_k(v)                      (TS-1)
    b ← b − η_k d   (bias: unconstrained, averaged like w; only if fit_bias)

Π_k is skipped when neither constraint is violated: ‖w‖₁ and ‖w − c‖² are tracked incrementally in
O(nnz(x)) per step and recomputed exactly after each dense projection (``l1l2_project_kernel``, exact,
O(p) per evaluation). The epoch sum Σ_{t=1..T_k} w_t is kept lazily: ``last[j]`` is the index of the
first iterate that holds the current value of w_j, and ``wsum[j] += w_j·(t' − last[j])`` when w_j changes
(t' = index of the new iterate), flushed before every dense projection and at the epoch end; so a row costs
O(nnz(x)) unless a constraint binds. The epoch ends after T_k steps (``IS_DONE`` = 1); from then on the
kernel consumes nothing until the algorithm starts the next epoch (paths wait for each other).

Mode ``MODE_SGD`` is the stage-1 baseline of §3: projection onto the L1 ball only (ρ = ∞),
η_t = η1/√t over the path's total step count, averaged iterate, and an epoch that never ends.

State (all arrays mutated in place but c, which is only read; nothing survives in locals between calls):
    w, c, wsum          float64[p]   iterate, centre, lazy epoch sum
    sumsq               float64[p]   Σ x_j² over the rows seen (stage 2's s); float64[0]: not accumulated
    last                int32 or int64[p]   lazy stamps (iterate index; where w_j = 0 any stamp ≤ the next
                                     iterate's gives the same sums: its terms are ±0.0)
    istate              int64[8]     see IS_*
    fstate              float64[8]   see FS_*
"""
import numba
import numpy as np

from .losses import dloss
from .projection import l1l2_project_kernel

IS_T = 0       # steps done in this epoch (the current iterate is w_{t+1})
IS_TK = 1      # epoch length T_k (steps)
IS_DONE = 2    # 1 once the epoch's T_k steps are done (waiting for the cross-path average)
IS_STEPS = 3   # total steps of this path
IS_NPROJ = 4   # dense projections done
IS_NROWS = 5   # rows accumulated into sumsq
IS_EPOCH = 6   # epoch index k (1-based)
IS_BUDGET = 7  # total steps allowed on this path (0: unlimited); a path stops (epoch done) when reached
N_IS = 8

FS_ETA = 0     # η_k (MODE_SGD: η1)
FS_RHO = 1     # ρ_k (inf: no ball)
FS_L1 = 2      # tracked ‖w‖₁
FS_D2 = 3      # tracked ‖w − c‖²
FS_BIAS = 4    # bias b
FS_BSUM = 5    # Σ_{t ≤ T} b_t (epoch sum of the bias iterates)
N_FS = 8

MODE_EPOCH = 0
MODE_SGD = 1
NEVER = 2 ** 62  # epoch length of MODE_SGD


@numba.njit(cache=True, nogil=True)
def _norms(w, c):
    l1 = 0.0
    d2 = 0.0
    for j in range(w.shape[0]):
        l1 += abs(w[j])
        d = w[j] - c[j]
        d2 += d * d
    return l1, d2


@numba.njit(cache=True, nogil=True)
def begin_epoch(c_values, istate, fstate, T, eta, rho):
    """Begin an epoch with w = c (the caller resets w, wsum and last): schedule (T, η, ρ), exact norms
    ‖w‖₁ = Σ|c_j| summed in index order over ``c_values`` (c's non-zeros, in index order: the sum over all of c
    bit for bit) and ‖w − c‖² = 0."""
    l1 = 0.0
    for j in range(c_values.shape[0]):
        l1 += abs(c_values[j])
    istate[IS_T] = 0
    istate[IS_TK] = T
    istate[IS_DONE] = 0
    fstate[FS_ETA] = eta
    fstate[FS_RHO] = rho
    fstate[FS_L1] = l1
    fstate[FS_D2] = 0.0
    fstate[FS_BSUM] = 0.0


@numba.njit(cache=True, nogil=True)
def flush_sum(w, wsum, last, upto):
    """wsum_j += w_j·(upto − last_j) for every j (iterates last_j..upto−1 hold w_j); last_j ← upto."""
    for j in range(w.shape[0]):
        if last[j] < upto:
            wsum[j] += w[j] * (upto - last[j])
            last[j] = upto


@numba.njit(cache=True, nogil=True)
def running_average(w, wsum, last, t, out):
    """out = (1/t) Σ_{s=1..t} w_s without mutating the state (t ≥ 1 steps done); out = w when t = 0."""
    if t == 0:
        for j in range(w.shape[0]):
            out[j] = w[j]
        return
    for j in range(w.shape[0]):
        out[j] = (wsum[j] + w[j] * (t + 1 - last[j])) / t


@numba.njit(cache=True, nogil=True)
def epoch_gd_block(indptr, indices, data, y, rows, w, c, wsum, last, sumsq, istate, fstate, work, B, mode,
                   eta1, loss, hinge_at_one, fit_bias, tol, max_iter, seed):
    """Advance stage 1 over ``rows`` of one CSR block; returns (rows consumed, epoch done).

    ``work`` is float64 scratch of length ≥ 2p (the projection's; w is projected in place). ``B`` may be inf.
    Row cost O(nnz(x)) unless a constraint is violated after the step, then one exact projection (O(p) per
    root-finding evaluation).
    """
    keep_sumsq = sumsq.shape[0] != 0
    if istate[IS_DONE] != 0:
        return 0, True
    t = istate[IS_T]
    T = istate[IS_TK]
    steps = istate[IS_STEPS]
    eta = fstate[FS_ETA]
    rho = fstate[FS_RHO]
    rho2 = rho * rho
    l1 = fstate[FS_L1]
    d2 = fstate[FS_D2]
    b = fstate[FS_BIAS]
    bsum = fstate[FS_BSUM]
    nproj = istate[IS_NPROJ]
    nrows = istate[IS_NROWS]
    consumed = 0
    done = False
    for r in range(rows.shape[0]):
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        steps += 1
        if mode == 1:
            eta = eta1 / np.sqrt(float(steps))
        f = b
        for k in range(lo, hi):
            j = indices[k]
            x = data[k]
            f += w[j] * x
            if keep_sumsq:
                sumsq[j] += x * x
        nrows += 1
        d = dloss(f, y[i], loss, hinge_at_one)
        bsum += b
        nxt = t + 2  # index of the iterate being produced
        if d != 0.0:
            g = eta * d
            for k in range(lo, hi):
                j = indices[k]
                old = w[j]
                if last[j] < nxt:
                    wsum[j] += old * (nxt - last[j])
                    last[j] = nxt
                new = old - g * data[k]
                w[j] = new
                l1 += abs(new) - abs(old)
                e_old = old - c[j]
                e_new = new - c[j]
                d2 += e_new * e_new - e_old * e_old
            if fit_bias:
                b -= g
            if l1 > B or d2 > rho2:
                # the untouched coordinates keep their value up to iterate t+1: flush, then project
                flush_sum(w, wsum, last, nxt)
                l1l2_project_kernel(w, B, c, rho, w, work, seed, tol, max_iter)
                l1, d2 = _norms(w, c)
                nproj += 1
        t += 1
        consumed += 1
        if t >= T or steps == istate[IS_BUDGET]:
            flush_sum(w, wsum, last, t + 1)
            done = True
            break
    istate[IS_T] = t
    istate[IS_STEPS] = steps
    istate[IS_NPROJ] = nproj
    istate[IS_NROWS] = nrows
    istate[IS_DONE] = 1 if done else 0
    fstate[FS_ETA] = eta
    fstate[FS_L1] = l1
    fstate[FS_D2] = d2
    fstate[FS_BIAS] = b
    fstate[FS_BSUM] = bsum
    return consumed, done
