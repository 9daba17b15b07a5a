"""Euclidean projections: L1 ball / simplex (ALGORITHMS.md §4) and the L1∩L2 domain of Epoch-GD (§3).

Dense projections
    ``project_l1_sort`` / ``project_simplex_sort``    sort-based O(n log n)            [§4 (P-1), (P-2), Fig. 1]
    ``project_l1_pivot`` / ``project_simplex_pivot``  randomized pivot, expected O(n)  [§4 Fig. 2]
    ``project_l1_l2``                                 {‖w‖₁ ≤ B} ∩ {‖w − c‖₂ ≤ ρ}       [§3 (TS-4), PROJ_L1L2]

Numba kernels behind them (arrays and scalars only, no allocation on the hot path) are public too, so that
learner kernels can call them: ``l1_project_sort_kernel``, ``l1_project_pivot_kernel``,
``simplex_theta_sort``, ``simplex_theta_sorted``, ``simplex_theta_pivot``, ``l1l2_project_kernel``.
Both θ routines finish with one Newton step on Σ(u_j − θ)_+ = z ([R] numerical polish, ``_refine_theta``).

Sparse online L1 projection (§4 "Sparse online version" + "Without a red-black tree" [R])
    A treap keyed by ``(r_j, j)``; node id = coordinate id; ``w_j = σ_j·max(r_j − Θ, 0)``; dead nodes
    (``r_j ≤ Θ``) stay in the tree until their coordinate is touched again (or until a rebase).
    ``w ← P_{L1,z}(w + g)`` for a g with k non-zeros costs expected O(k log p).

    State (``L1TreeState``, a namedtuple of five arrays, all mutated in place; node/coordinate j is row j,
    packed per node so one tree step touches ~2 cache lines per visited node; save with
    ``np.savez(f, **st._asdict())`` and resume with ``L1TreeState(**np.load(f))``):

    ======  ============  ===================================================================
    fnode   float64[p,2]  [:, F_KEY] raw key r_j = |w_j| + Θ at (re)insertion of j;
                          [:, F_KSUM] subtree sum of keys (recomputed from children, never ± updated)
    inode   int32[p,4]    [:, I_LEFT], [:, I_RIGHT] child ids (−1 = nil); [:, I_SIZE] subtree count,
            (int64[p,4]   0 ⇔ j not in the tree; [:, I_PRIO] the top bits of the treap priority
            when p ≥ 2³¹) π_j = splitmix64(seed, j) >> 1 (63 bits): π_j itself in int64, π_j >> 32 in int32
    sgn     int8[p]       σ_j ∈ {−1, 0, +1}; 0 ⇒ w_j = 0
    fsc     float64[4]    [FSC_THETA] Θ, [FSC_L1] tracked ‖w‖₁, [FSC_REBASE] rebase factor, [3] spare
    isc     int64[5]      [ISC_ROOT] root id (−1 = empty), [ISC_NNZ] nnz(w), [ISC_NPROJ] #projections,
                          [ISC_NREBASE] #rebases, [ISC_SEED] the priority seed
    ======  ============  ===================================================================

    Index dtype: node ids, child links and subtree counts are < p, so ``inode`` is int32 whenever
    p < 2³¹ (half the bytes; 266 MB instead of 531 MB at p = 16.6M) and int64 otherwise (``l1tree_init``
    chooses from p; ``index_dtype`` forces one). Priorities compare as the full 63-bit π in both: the
    stored column decides when it differs, and equal columns (a tie of the top 31 bits in int32, ~never in
    int64) fall back to π recomputed from (isc[ISC_SEED], id). So both dtypes build the same trees, and every
    result is bit-identical between them. The kernels are generic in the dtype (numba specialises).

    All ``l1tree_*`` numba functions take the five state arrays first, so from Python write
    ``l1tree_add_project(*st, idx, vals, z)``. Inside a learner kernel that received
    ``(fnode, inode, sgn, fsc, isc)``, read the current weight of feature j with the inline
    ``l1tree_value(fnode, sgn, fsc, j)`` (= ``sgn[j]·max(fnode[j, 0] − fsc[0], 0)``, O(1)), or the score of
    one example with ``l1tree_dot(fnode, inode, sgn, fsc, isc, indices, data)``; ``l1tree_get(*st, j)`` is
    the same as ``l1tree_value``. A projected SGD step ``w ← P(w − η ℓ' x)`` is
    ``l1tree_axpy_project(fnode, inode, sgn, fsc, isc, indices, data, -eta * dl, z)`` (no temporary for g).

    Θ only grows; to keep ``r_j − Θ`` accurate the tree is rebased (keys shifted by −Θ, dead nodes
    dropped, O(#nodes)) whenever Θ > rebase_factor · z (default 64). This changes no weight.
    Path stacks have a fixed capacity of 4096 (expected treap depth ≈ 2 ln n); exceeding it raises.
"""
from collections import namedtuple

import numba
import numpy as np

from .splitmix import GOLDEN as _GOLDEN, MIX2 as _MIX2, splitmix64 as _splitmix64

__all__ = [
    "project_l1_sort",
    "project_l1_pivot",
    "project_simplex_sort",
    "project_simplex_pivot",
    "project_l1_l2",
    "l1l2_kkt_residual",
    "l1_project_sort_kernel",
    "l1_project_pivot_kernel",
    "simplex_theta_sort",
    "simplex_theta_sorted",
    "simplex_theta_pivot",
    "l1l2_project_kernel",
    "L1TreeState",
    "l1tree_init",
    "l1tree_index_dtype",
    "l1tree_from_dense",
    "l1tree_from_sparse",
    "l1tree_support",
    "l1tree_update",
    "l1tree_add_project",
    "l1tree_axpy_project",
    "l1tree_get",
    "l1tree_value",
    "l1tree_dot",
    "l1tree_dense",
    "l1tree_rebase",
    "FSC_THETA",
    "FSC_L1",
    "FSC_REBASE",
    "ISC_ROOT",
    "ISC_NNZ",
    "ISC_NPROJ",
    "ISC_NREBASE",
    "ISC_SEED",
    "F_KEY",
    "F_KSUM",
    "I_LEFT",
    "I_RIGHT",
    "I_SIZE",
    "I_PRIO",
    "L1L2_INSIDE",
    "L1L2_L1_ONLY",
    "L1L2_BALL_ONLY",
    "L1L2_BOTH",
    "L1L2_POINT",
]

_JIT = dict(cache=True, nogil=True)

# ------------------------------------------------------------------------------------------------
# small helpers
# ------------------------------------------------------------------------------------------------


def _as_vec(v, name="v"):
    a = np.ascontiguousarray(v, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains non-finite values")
    return a


def _as_radius(z, name="z", positive=False):
    z = float(z)
    if not np.isfinite(z) or z < 0.0 or (positive and z == 0.0):
        raise ValueError(f"{name} must be finite and {'> 0' if positive else '>= 0'}, got {z}")
    return z


def _as_seed(seed):
    seed = int(seed)
    if seed < 0 or seed >= 2**63:
        raise ValueError("seed must be in [0, 2**63)")
    return seed


# ------------------------------------------------------------------------------------------------
# dense simplex / L1-ball projections (§4)
# ------------------------------------------------------------------------------------------------


@numba.njit(**_JIT)
def _refine_theta(u, z, th, use_abs):
    """One Newton step on the piecewise-linear Σ_j (u_j − θ)_+ = z [R: numerical polish, not in the paper].

    The running sums of Fig. 1/2 carry O(n·eps·Σu) error; the residual evaluated term by term is accurate,
    so one correction brings θ to within a few ulps (‖w‖₁ − z ≈ n·ulp(θ) at worst).
    """
    r = -z
    m = 0
    for i in range(u.shape[0]):
        x = abs(u[i]) if use_abs else u[i]
        if x > th:
            r += x - th
            m += 1
    if m > 0:
        th += r / m
    return th


@numba.njit(**_JIT)
def simplex_theta_sorted(u, mu, z):
    """θ of (P-2) given ``mu`` = u sorted ascending (any sort); Fig. 1 scan + one Newton polish."""
    n = mu.shape[0]
    s = 0.0
    rho = 0
    s_rho = 0.0
    for j in range(n):
        m = mu[n - 1 - j]
        s += m
        if m - (s - z) / (j + 1) > 0.0:
            rho = j + 1
            s_rho = s
    return _refine_theta(u, z, (s_rho - z) / rho, False)


@numba.njit(**_JIT)
def simplex_theta_sort(u, z):
    """θ of (P-2) for min ½‖β−u‖² s.t. Σβ = z, β ≥ 0 (z > 0), sort-based [§4 Fig. 1].

    ρ = max{j : μ_j − (Σ_{r≤j} μ_r − z)/j > 0} on μ = u sorted descending; θ = (Σ_{r≤ρ} μ_r − z)/ρ,
    then one Newton polish of θ (``_refine_theta``). Sorts with numba's np.sort (allocates a copy).
    """
    return simplex_theta_sorted(u, np.sort(u), z)


@numba.njit(**_JIT)
def _theta_pivot_inplace(a, n, z, seed):
    # Fig. 2 on a[:n] (permuted in place); see simplex_theta_pivot
    state = np.uint64(seed)
    lo = 0
    hi = n
    s = 0.0
    rho = 0
    while lo < hi:
        state, r = _splitmix64(state)
        k = lo + np.int64(r % np.uint64(hi - lo))
        x = a[k]
        i = lo
        gt = lo
        lt = hi
        sg = 0.0
        while i < lt:
            ai = a[i]
            if ai > x:
                a[i] = a[gt]
                a[gt] = ai
                gt += 1
                i += 1
                sg += ai
            elif ai < x:
                lt -= 1
                a[i] = a[lt]
                a[lt] = ai
            else:
                i += 1
                sg += ai
        cg = lt - lo
        if (s + sg) - (rho + cg) * x < z:
            s += sg
            rho += cg
            lo = lt
        else:
            hi = gt
    return (s - z) / rho


@numba.njit(**_JIT)
def simplex_theta_pivot(u, z, scratch, seed):
    """θ of (P-2) by the randomized pivot of §4 Fig. 2 (expected O(n)), z > 0.

    ``scratch`` (len ≥ n) receives a permuted copy of u. Three-way partition [> x | = x | < x] so that ties
    cost nothing: value x is at or above the cut iff Σ_{u_j ≥ x}(u_j − x) < z; accepted ⇒ continue on
    {< x}, rejected ⇒ continue on {> x}. ``seed`` ≥ 0 seeds a splitmix64 stream (deterministic).
    θ = (s − z)/ρ, then one Newton polish (``_refine_theta``).
    """
    n = u.shape[0]
    for i in range(n):
        scratch[i] = u[i]
    return _refine_theta(u, z, _theta_pivot_inplace(scratch, n, z, seed), False)


@numba.njit(**_JIT)
def _l1_norm(v):
    s = 0.0
    for i in range(v.shape[0]):
        s += abs(v[i])
    return s


@numba.njit(**_JIT)
def _l1_apply(v, theta, out):
    """out = sign(v)·max(|v| − θ, 0) (safe when out is v)."""
    for i in range(v.shape[0]):
        x = v[i]
        m = abs(x) - theta
        if m > 0.0:
            out[i] = m if x > 0.0 else -m
        else:
            out[i] = 0.0


@numba.njit(**_JIT)
def l1_project_sort_kernel(v, z, out):
    """out = P_{L1,z}(v) (§4 (P-1), Fig. 1); returns θ (0 when ‖v‖₁ ≤ z). ``out`` may alias v; z ≥ 0."""
    n = v.shape[0]
    if _l1_norm(v) <= z:
        for i in range(n):
            out[i] = v[i]
        return 0.0
    if z == 0.0:
        th = 0.0
        for i in range(n):
            th = max(th, abs(v[i]))
            out[i] = 0.0
        return th
    th = simplex_theta_sort(np.abs(v), z)
    _l1_apply(v, th, out)
    return th


@numba.njit(**_JIT)
def l1_project_pivot_kernel(v, z, out, scratch, seed):
    """out = P_{L1,z}(v) with the Fig. 2 pivot on |v|; returns θ (0 when ‖v‖₁ ≤ z).

    ``scratch`` has length ≥ len(v); ``out`` may alias v; z ≥ 0. No allocation.
    """
    n = v.shape[0]
    if _l1_norm(v) <= z:
        for i in range(n):
            out[i] = v[i]
        return 0.0
    if z == 0.0:
        th = 0.0
        for i in range(n):
            th = max(th, abs(v[i]))
            out[i] = 0.0
        return th
    for i in range(n):
        scratch[i] = abs(v[i])
    th = _refine_theta(v, z, _theta_pivot_inplace(scratch, n, z, seed), True)
    _l1_apply(v, th, out)
    return th


def project_l1_sort(v, z, return_theta=False):
    """Euclidean projection onto {‖w‖₁ ≤ z}, sort-based O(n log n) [ALGORITHMS.md §4 (P-1), Fig. 1].

    Returns w (new array), or (w, θ) with θ the soft threshold (0 when ‖v‖₁ ≤ z). Same result as
    ``l1_project_sort_kernel``, but sorts with NumPy's (SIMD) sort, several times faster than numba's.
    """
    v = _as_vec(v)
    z = _as_radius(z)
    out = np.empty_like(v)
    if _l1_norm(v) <= z or z == 0.0:
        th = l1_project_sort_kernel(v, z, out)
    else:
        u = np.abs(v)
        th = simplex_theta_sorted(u, np.sort(u), z)
        _l1_apply(v, th, out)
    return (out, th) if return_theta else out


def project_l1_pivot(v, z, seed=0, return_theta=False):
    """Euclidean projection onto {‖w‖₁ ≤ z}, randomized pivot, expected O(n) [ALGORITHMS.md §4 Fig. 2]."""
    v = _as_vec(v)
    z = _as_radius(z)
    out = np.empty_like(v)
    scratch = np.empty_like(v)
    th = l1_project_pivot_kernel(v, z, out, scratch, _as_seed(seed))
    return (out, th) if return_theta else out


@numba.njit(**_JIT)
def _simplex_apply(v, th, out):
    for i in range(v.shape[0]):
        m = v[i] - th
        out[i] = m if m > 0.0 else 0.0


def project_simplex_sort(v, z=1.0, return_theta=False):
    """Euclidean projection onto {w ≥ 0, Σw = z} (z > 0), sort-based [§4 (P-2), Fig. 1]."""
    v = _as_vec(v)
    z = _as_radius(z, positive=True)
    if v.size == 0:
        raise ValueError("simplex projection of an empty vector")
    th = simplex_theta_sorted(v, np.sort(v), z)
    out = np.empty_like(v)
    _simplex_apply(v, th, out)
    return (out, th) if return_theta else out


def project_simplex_pivot(v, z=1.0, seed=0, return_theta=False):
    """Euclidean projection onto {w ≥ 0, Σw = z} (z > 0), randomized pivot [§4 Fig. 2]."""
    v = _as_vec(v)
    z = _as_radius(z, positive=True)
    if v.size == 0:
        raise ValueError("simplex projection of an empty vector")
    th = simplex_theta_pivot(v, z, np.empty_like(v), _as_seed(seed))
    out = np.empty_like(v)
    _simplex_apply(v, th, out)
    return (out, th) if return_theta else out


# ------------------------------------------------------------------------------------------------
# L1 ∩ L2 projection (§3)
# ------------------------------------------------------------------------------------------------

L1L2_INSIDE = 0  # v already feasible: w = v, μ = λ = 0
L1L2_L1_ONLY = 1  # step 2: w = P_L1(v), μ = 0
L1L2_BALL_ONLY = 2  # step 3: w = c + ρ(v−c)/‖v−c‖, λ = 0
L1L2_BOTH = 3  # step 4: both constraints active, root finding on θ
L1L2_POINT = 4  # ρ = 0: w = c, μ = +inf


@numba.njit(**_JIT)
def _dist(a, c):
    s = 0.0
    for i in range(a.shape[0]):
        d = a[i] - c[i]
        s += d * d
    return np.sqrt(s)


@numba.njit(**_JIT)
def _phi(v, c, t, B, trial, scratch, seed):
    """φ(t) = ‖w(t) − c‖ with w(t) = P_L1((1−t)v + t c, B) left in ``trial``; returns (φ, τ)  (TS-4)."""
    n = v.shape[0]
    for i in range(n):
        trial[i] = (1.0 - t) * v[i] + t * c[i]
    tau = l1_project_pivot_kernel(trial, B, trial, scratch, seed)
    return _dist(trial, c), tau


@numba.njit(**_JIT)
def l1l2_project_kernel(v, B, c, rho, out, work, seed, tol, max_iter):
    """out = argmin ½‖w−v‖² s.t. ‖w‖₁ ≤ B, ‖w−c‖₂ ≤ ρ  [ALGORITHMS.md §3, PROJ_L1L2 and (TS-4)].

    Requires ‖c‖₁ ≤ B (checked by the wrapper). ``work`` has length ≥ 2n; ``out`` may alias ``v`` (every
    candidate is built in ``work`` and ``out`` written once, at the end). Returns (μ, λ, status, n_eval):
    μ ≥ 0 is the ball multiplier, λ = (1+μ)τ ≥ 0 the L1 multiplier (τ = soft threshold of (TS-4)), so that
    v_j − w_j − μ(w_j − c_j) = λ·sign(w_j) on the support and |v_j + μ c_j| ≤ λ off it.
    Step 4 is a safeguarded Illinois (regula falsi) search on φ(θ) − ρ, φ(θ) = ‖P_L1((1−θ)v + θc) − c‖,
    which is non-increasing with φ(1) = 0; it keeps the bracket [lo, hi] with φ(lo) > ρ ≥ φ(hi), stops when
    ρ(1 − tol) ≤ φ(hi) ≤ ρ or hi − lo < 1e-15, and returns w(hi) (the feasible side).
    """
    n = v.shape[0]
    trial = work[:n]
    scratch = work[n : 2 * n]
    if rho == 0.0:
        for i in range(n):
            out[i] = c[i]
        return np.inf, 0.0, L1L2_POINT, 0
    l1v = _l1_norm(v)
    dvc = _dist(v, c)
    # 1. v feasible
    if l1v <= B and dvc <= rho:
        for i in range(n):
            out[i] = v[i]
        return 0.0, 0.0, L1L2_INSIDE, 0
    # 2. ball inactive
    tau = l1_project_pivot_kernel(v, B, trial, scratch, seed)
    d_a = _dist(trial, c)
    if d_a <= rho:
        out[:] = trial
        return 0.0, tau, L1L2_L1_ONLY, 1
    # 3. L1 inactive (here ‖v − c‖ ≥ ‖P_L1(v) − c‖ > ρ > 0)
    s = rho / dvc
    l1b = 0.0
    for i in range(n):
        x = c[i] + s * (v[i] - c[i])
        trial[i] = x
        l1b += abs(x)
    if l1b <= B:
        out[:] = trial
        return dvc / rho - 1.0, 0.0, L1L2_BALL_ONLY, 1
    # 4. both active: root of f(θ) = φ(θ) − ρ on (0, 1); f(0) > 0, f(1) = −ρ (w(1) = c)
    lo = 0.0
    flo = d_a - rho
    hi = 1.0
    fhi = -rho
    tau_hi = 0.0
    side = 0
    n_eval = 1
    width_old = 1.0
    at_hi = False
    for it in range(max_iter):
        if hi - lo < 1e-15:
            break
        t = (lo * fhi - hi * flo) / (fhi - flo)
        # safeguard: bisect when outside the bracket, or every third step if the bracket shrank by < 1/2
        if not (lo < t < hi) or (it % 3 == 2 and hi - lo > 0.5 * width_old):
            t = 0.5 * (lo + hi)
        if it % 3 == 2:
            width_old = hi - lo
        phi, tau_t = _phi(v, c, t, B, trial, scratch, seed)
        n_eval += 1
        ft = phi - rho
        at_hi = ft <= 0.0  # trial holds w(hi)
        if ft <= 0.0:
            hi = t
            fhi = ft
            tau_hi = tau_t
            if ft >= -tol * rho:
                break
            if side == -1:
                flo *= 0.5
            side = -1
        else:
            lo = t
            flo = ft
            if side == 1:
                fhi *= 0.5
            side = 1
    if hi >= 1.0:
        for i in range(n):
            out[i] = c[i]
        return np.inf, 0.0, L1L2_POINT, n_eval
    if not at_hi:  # w(hi) again, bit for bit (φ is deterministic in θ): no third vector to keep it in
        _phi(v, c, hi, B, trial, scratch, seed)
    out[:] = trial
    mu = hi / (1.0 - hi)
    return mu, (1.0 + mu) * tau_hi, L1L2_BOTH, n_eval


def project_l1_l2(v, B, c, rho, return_multipliers=False, tol=1e-10, max_iter=100, seed=0):
    """Projection onto {‖w‖₁ ≤ B} ∩ {‖w − c‖₂ ≤ ρ} by PROJ_L1L2 of ALGORITHMS.md §3 [R], (TS-4).

    Needs ‖c‖₁ ≤ B (up to 1e-9 relative; c is an average of feasible points in Epoch-GD).
    Returns w, or with ``return_multipliers=True`` the tuple (w, μ, λ, status): μ ≥ 0 on the ball, λ ≥ 0
    on the L1 ball (KKT as in §3; check with ``l1l2_kkt_residual``); status is one of L1L2_INSIDE,
    L1L2_L1_ONLY, L1L2_BALL_ONLY, L1L2_BOTH, L1L2_POINT (ρ = 0 ⇒ w = c, μ = inf).
    ``tol``: relative tolerance |φ − ρ| ≤ tol·ρ of step 4 (the returned w is always feasible).
    """
    v = _as_vec(v)
    c = _as_vec(c, "c")
    if c.shape != v.shape:
        raise ValueError(f"c has shape {c.shape}, v has shape {v.shape}")
    B = _as_radius(B, "B")
    rho = _as_radius(rho, "rho")
    if not (tol > 0.0):
        raise ValueError("tol must be > 0")
    l1c = float(np.abs(c).sum())
    if l1c > B * (1.0 + 1e-9) + 1e-300:
        raise ValueError(f"centre outside the L1 ball: ||c||_1 = {l1c} > B = {B}; the intersection may be empty")
    out = np.empty_like(v)
    work = np.empty(2 * v.size, dtype=np.float64)
    mu, lam, status, _ = l1l2_project_kernel(v, B, c, rho, out, work, _as_seed(seed), float(tol), int(max_iter))
    if return_multipliers:
        return out, float(mu), float(lam), int(status)
    return out


def l1l2_kkt_residual(v, B, c, rho, w, mu, lam):
    """KKT residuals of w for the §3 problem with multipliers (μ, λ); all entries ≈ 0 at a solution.

    Keys: ``stationarity`` max_j |v_j − w_j − μ(w_j − c_j) − λ sign(w_j)| on w_j ≠ 0; ``off_support``
    max(|v_j + μ c_j| − λ, 0) on w_j = 0; ``l1_violation`` max(‖w‖₁ − B, 0); ``ball_violation``
    max(‖w − c‖ − ρ, 0); ``slack_l1`` λ|‖w‖₁ − B|; ``slack_ball`` μ|‖w − c‖ − ρ|; ``dual_negative``
    max(−μ, −λ, 0). For μ = inf (ρ = 0) only the primal entries are meaningful.
    """
    v = np.asarray(v, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    nz = w != 0
    r = v - w - mu * (w - c)
    stat = np.abs(r[nz] - lam * np.sign(w[nz]))
    off = np.abs(v[~nz] + mu * c[~nz]) - lam
    l1w = float(np.abs(w).sum())
    dwc = float(np.linalg.norm(w - c))
    return {
        "stationarity": float(stat.max()) if stat.size else 0.0,
        "off_support": float(max(off.max(), 0.0)) if off.size else 0.0,
        "l1_violation": max(l1w - B, 0.0),
        "ball_violation": max(dwc - rho, 0.0),
        "slack_l1": float(lam * abs(l1w - B)),
        "slack_ball": float(mu * abs(dwc - rho)) if np.isfinite(mu) else 0.0,
        "dual_negative": float(max(-mu, -lam, 0.0)),
    }


# ------------------------------------------------------------------------------------------------
# sparse online L1 projection: treap with lazy global threshold and dead nodes (§4, [R])
# ------------------------------------------------------------------------------------------------

FSC_THETA = 0
FSC_L1 = 1
FSC_REBASE = 2
ISC_ROOT = 0
ISC_NNZ = 1
ISC_NPROJ = 2
ISC_NREBASE = 3
ISC_SEED = 4
# columns of fnode (float64[p, 2]) and inode (int32 or int64 [p, 4]); one row per node = per coordinate
F_KEY = 0
F_KSUM = 1
I_LEFT = 0
I_RIGHT = 1
I_SIZE = 2
I_PRIO = 3

L1TreeState = namedtuple("L1TreeState", ["fnode", "inode", "sgn", "fsc", "isc"])
L1TreeState.__doc__ = "State of the sparse online L1 projection; see the module docstring for the layout."


def l1tree_index_dtype(p, index_dtype=None):
    """dtype of ``inode`` for p coordinates: int32 when p < 2³¹ (ids, links and counts fit), else int64.

    ``index_dtype`` (np.int32 or np.int64) forces one; int32 for p ≥ 2³¹ is refused.
    """
    if index_dtype is None:
        return np.dtype(np.int32) if p <= np.iinfo(np.int32).max else np.dtype(np.int64)
    dt = np.dtype(index_dtype)
    if dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"index_dtype must be int32 or int64, got {dt}")
    if p > np.iinfo(dt).max:
        raise ValueError(f"index_dtype {dt} cannot hold node ids of p = {p} coordinates")
    return dt


def l1tree_init(p, seed=0, rebase_factor=64.0, index_dtype=None):
    """Empty state (w = 0) for p coordinates; layout in the module docstring (§4 sparse online, [R]).

    ``inode`` is int32 for p < 2³¹ and int64 above (``l1tree_index_dtype``; ``index_dtype`` forces one);
    both give bit-identical results.
    """
    p = int(p)
    if p < 0:
        raise ValueError("p must be >= 0")
    rebase_factor = float(rebase_factor)
    if not rebase_factor > 0.0:
        raise ValueError("rebase_factor must be > 0 (use np.inf to never rebase)")
    seed = _as_seed(seed)
    dt = l1tree_index_dtype(p, index_dtype)
    inode = np.empty((p, 4), dt)
    inode[:, I_LEFT] = -1
    inode[:, I_RIGHT] = -1
    inode[:, I_SIZE] = 0
    _fill_prio(inode, seed, np.uint64(64 - 8 * dt.itemsize))
    st = L1TreeState(
        fnode=np.zeros((p, 2), np.float64),
        inode=inode,
        sgn=np.zeros(p, np.int8),
        fsc=np.zeros(4, np.float64),
        isc=np.zeros(5, np.int64),
    )
    st.fsc[FSC_REBASE] = rebase_factor
    st.isc[ISC_ROOT] = -1
    st.isc[ISC_SEED] = seed
    return st


@numba.njit(inline="always", **_JIT)
def _prio_full(seed, j):
    """Treap priority π_j = splitmix64(seed, j) >> 1 (63 bits, as uint64)."""
    _, h = _splitmix64(np.uint64(seed) * _MIX2 + np.uint64(j) * _GOLDEN)
    return h >> np.uint64(1)


@numba.njit(**_JIT)
def _fill_prio(inode, seed, shift):
    """inode[:, I_PRIO] = π >> shift (0 for int64, 32 for int32: the top 31 bits, ≥ 0)."""
    for j in range(inode.shape[0]):
        inode[j, I_PRIO] = np.int64(_prio_full(seed, j) >> shift)


@numba.njit(inline="always", **_JIT)
def _prio_gt(inode, seed, a, b):
    """π_a > π_b: the stored (top) bits decide unless equal, then the full 63-bit priorities do."""
    pa = inode[a, I_PRIO]
    pb = inode[b, I_PRIO]
    if pa != pb:
        return pa > pb
    return _prio_full(seed, a) > _prio_full(seed, b)


@numba.njit(inline="always", **_JIT)
def _less(fnode, a, b):
    """(key_a, a) < (key_b, b)."""
    ka = fnode[a, F_KEY]
    kb = fnode[b, F_KEY]
    return ka < kb or (ka == kb and a < b)


@numba.njit(inline="always", **_JIT)
def _pull(n, fnode, inode):
    """Recompute size and key-sum of n from its children (no incremental drift)."""
    l = inode[n, I_LEFT]
    r = inode[n, I_RIGHT]
    s = 1
    ks = fnode[n, F_KEY]
    if l >= 0:
        s += inode[l, I_SIZE]
        ks += fnode[l, F_KSUM]
    if r >= 0:
        s += inode[r, I_SIZE]
        ks += fnode[r, F_KSUM]
    inode[n, I_SIZE] = s
    fnode[n, F_KSUM] = ks


_STACK = 4096  # path-stack capacity; a treap is deeper than this with probability ~0 (expected 2 ln n)


@numba.njit(inline="always", **_JIT)
def _push(stk, sp, x):
    if sp == stk.shape[0]:
        raise RuntimeError("l1tree: tree depth exceeds the path stack (re-init with another seed)")
    stk[sp] = x
    return sp + 1


@numba.njit(**_JIT)
def _merge(a, b, fnode, inode, seed, stk, sp0):
    """Merge treaps a < b (all keys); path nodes are pushed above sp0 and re-pulled bottom-up."""
    if a < 0:
        return b
    if b < 0:
        return a
    sp = sp0
    root = -1
    par = -1
    par_right = False
    while a >= 0 and b >= 0:
        if _prio_gt(inode, seed, a, b):
            cur = a
            a = inode[a, I_RIGHT]
            nxt_right = True
        else:
            cur = b
            b = inode[b, I_LEFT]
            nxt_right = False
        if par < 0:
            root = cur
        elif par_right:
            inode[par, I_RIGHT] = cur
        else:
            inode[par, I_LEFT] = cur
        sp = _push(stk, sp, cur)
        par = cur
        par_right = nxt_right
    rest = a if a >= 0 else b
    if par_right:
        inode[par, I_RIGHT] = rest
    else:
        inode[par, I_LEFT] = rest
    for i in range(sp - 1, sp0 - 1, -1):
        _pull(stk[i], fnode, inode)
    return root


@numba.njit(**_JIT)
def _split(t, j, fnode, inode, stk, sp0):
    """Split treap t into (< node j, > node j) in (key, id) order; j itself must not be in t."""
    lroot = -1
    rroot = -1
    lpar = -1
    rpar = -1
    sp = sp0
    n = t
    while n >= 0:
        sp = _push(stk, sp, n)
        if _less(fnode, n, j):
            if lpar < 0:
                lroot = n
            else:
                inode[lpar, I_RIGHT] = n
            lpar = n
            n = inode[n, I_RIGHT]
        else:
            if rpar < 0:
                rroot = n
            else:
                inode[rpar, I_LEFT] = n
            rpar = n
            n = inode[n, I_LEFT]
    if lpar >= 0:
        inode[lpar, I_RIGHT] = -1
    if rpar >= 0:
        inode[rpar, I_LEFT] = -1
    for i in range(sp - 1, sp0 - 1, -1):
        _pull(stk[i], fnode, inode)
    return lroot, rroot


@numba.njit(**_JIT)
def _insert(j, root, fnode, inode, seed, stk):
    """Insert node j (its key already set); returns the new root. Expected O(log n)."""
    sp = 0
    par = -1
    par_right = False
    n = root
    while n >= 0 and _prio_gt(inode, seed, n, j):
        sp = _push(stk, sp, n)
        par = n
        if _less(fnode, n, j):
            par_right = True
            n = inode[n, I_RIGHT]
        else:
            par_right = False
            n = inode[n, I_LEFT]
    l, r = _split(n, j, fnode, inode, stk, sp)
    inode[j, I_LEFT] = l
    inode[j, I_RIGHT] = r
    _pull(j, fnode, inode)
    if par < 0:
        root = j
    elif par_right:
        inode[par, I_RIGHT] = j
    else:
        inode[par, I_LEFT] = j
    for i in range(sp - 1, -1, -1):
        _pull(stk[i], fnode, inode)
    return root


@numba.njit(**_JIT)
def _delete(j, root, fnode, inode, seed, stk):
    """Remove node j (must be in the tree, with its insertion key); returns the new root."""
    sp = 0
    par = -1
    par_right = False
    n = root
    while n != j:
        if n < 0:
            raise RuntimeError("l1tree: node not found (corrupted state)")
        sp = _push(stk, sp, n)
        par = n
        if _less(fnode, j, n):
            par_right = False
            n = inode[n, I_LEFT]
        else:
            par_right = True
            n = inode[n, I_RIGHT]
    m = _merge(inode[j, I_LEFT], inode[j, I_RIGHT], fnode, inode, seed, stk, sp)
    if par < 0:
        root = m
    elif par_right:
        inode[par, I_RIGHT] = m
    else:
        inode[par, I_LEFT] = m
    for i in range(sp - 1, -1, -1):
        _pull(stk[i], fnode, inode)
    inode[j, I_LEFT] = -1
    inode[j, I_RIGHT] = -1
    inode[j, I_SIZE] = 0
    fnode[j, F_KSUM] = 0.0
    return root


@numba.njit(**_JIT)
def _find_threshold(root, z, fnode, inode):
    """Root-to-leaf pivot search of §4: largest set {keys ≥ x} with Σ(r − x) < z; returns (count, keysum)."""
    n = root
    cnt = 0
    s = 0.0
    bc = 0
    bs = 0.0
    while n >= 0:
        r = inode[n, I_RIGHT]
        x = fnode[n, F_KEY]
        c2 = cnt + 1
        s2 = s + x
        if r >= 0:
            c2 += inode[r, I_SIZE]
            s2 += fnode[r, F_KSUM]
        if s2 - c2 * x < z:
            bc = c2
            bs = s2
            cnt = c2
            s = s2
            n = inode[n, I_LEFT]
        else:
            n = r
    return bc, bs


@numba.njit(**_JIT)
def _build_sorted(order, m, fnode, inode, seed):
    """Treap from nodes order[:m] sorted by (key, id) in O(m) (Cartesian tree on prio); returns root."""
    if m == 0:
        return -1
    st = np.empty(m, np.int64)
    sp = 0
    for i in range(m):
        n = order[i]
        inode[n, I_RIGHT] = -1
        last = -1
        while sp > 0 and _prio_gt(inode, seed, n, st[sp - 1]):
            sp -= 1
            last = st[sp]
        inode[n, I_LEFT] = last
        if sp > 0:
            inode[st[sp - 1], I_RIGHT] = n
        st[sp] = n
        sp += 1
    root = st[0]
    # aggregates: reverse pre-order visits children before parents
    cnt = 0
    pre = np.empty(m, np.int64)
    st[0] = root
    sp = 1
    while sp > 0:
        sp -= 1
        n = st[sp]
        pre[cnt] = n
        cnt += 1
        if inode[n, I_LEFT] >= 0:
            st[sp] = inode[n, I_LEFT]
            sp += 1
        if inode[n, I_RIGHT] >= 0:
            st[sp] = inode[n, I_RIGHT]
            sp += 1
    for i in range(cnt - 1, -1, -1):
        _pull(pre[i], fnode, inode)
    return root


@numba.njit(**_JIT)
def l1tree_rebase(fnode, inode, sgn, fsc, isc):
    """Shift all keys by −Θ, set Θ = 0, drop dead nodes, rebuild; O(#nodes). Weights are unchanged.

    Also resets the tracked ‖w‖₁ to the exact sum of live magnitudes (removes incremental drift).
    """
    theta = fsc[FSC_THETA]
    root = isc[ISC_ROOT]
    ntree = inode[root, I_SIZE] if root >= 0 else 0
    order = np.empty(ntree, np.int64)
    m = 0
    stk = np.empty(_STACK, np.int64)
    sp = 0
    n = root
    while sp > 0 or n >= 0:
        while n >= 0:
            sp = _push(stk, sp, n)
            n = inode[n, I_LEFT]
        sp -= 1
        n = stk[sp]
        r = inode[n, I_RIGHT]
        inode[n, I_LEFT] = -1
        inode[n, I_RIGHT] = -1
        inode[n, I_SIZE] = 0
        fnode[n, F_KSUM] = 0.0
        if fnode[n, F_KEY] > theta:
            fnode[n, F_KEY] = fnode[n, F_KEY] - theta
            order[m] = n
            m += 1
        else:
            sgn[n] = 0
            fnode[n, F_KEY] = 0.0
        n = r
    # the shift is monotone but may create ties that break the (key, id) order: insertion-sort fix-up
    for i in range(1, m):
        x = order[i]
        k = i - 1
        while k >= 0 and _less(fnode, x, order[k]):
            order[k + 1] = order[k]
            k -= 1
        order[k + 1] = x
    l1 = 0.0
    for i in range(m):
        l1 += fnode[order[i], F_KEY]
    isc[ISC_ROOT] = _build_sorted(order, m, fnode, inode, isc[ISC_SEED])
    isc[ISC_NNZ] = m
    isc[ISC_NREBASE] += 1
    fsc[FSC_THETA] = 0.0
    fsc[FSC_L1] = l1


@numba.njit(**_JIT)
def l1tree_axpy_project(fnode, inode, sgn, fsc, isc, idx, data, alpha, z):
    """w ← P_{L1,z}(w + α·g), g_{idx[t]} = data[t] (duplicates allowed, summed), expected O(k log p).

    §4 sparse online version with the [R] treap and dead nodes: each touched j is deleted and re-inserted
    with raw key r_j = |w_j + α g_j| + Θ; if the tracked ‖w‖₁ exceeds z the pivot search sets
    Θ = (s − z)/c and ‖w‖₁ = z. Validates idx/data before mutating. Returns True if it projected.
    Learners calling this per row should use ``l1tree_axpy_project_stk`` with one reused stack.
    """
    return l1tree_axpy_project_stk(fnode, inode, sgn, fsc, isc, idx, data, alpha, z, np.empty(_STACK, np.int64))


@numba.njit(**_JIT)
def l1tree_axpy_project_stk(fnode, inode, sgn, fsc, isc, idx, data, alpha, z, stk):
    """``l1tree_axpy_project`` with a caller-provided scratch stack (no allocation per call)."""
    p = sgn.shape[0]
    k = idx.shape[0]
    if data.shape[0] != k:
        raise ValueError("l1tree: idx and data lengths differ")
    if not (z > 0.0 and z < np.inf):
        raise ValueError("l1tree: z must be finite and > 0")
    for t in range(k):
        j = idx[t]
        if j < 0 or j >= p:
            raise IndexError("l1tree: index out of range")
        if not np.isfinite(alpha * data[t]):
            raise ValueError("l1tree: non-finite update")
    theta = fsc[FSC_THETA]
    l1 = fsc[FSC_L1]
    root = isc[ISC_ROOT]
    nnz = isc[ISC_NNZ]
    seed = isc[ISC_SEED]
    for t in range(k):
        g = alpha * data[t]
        if g == 0.0:
            continue
        j = idx[t]
        old = 0.0
        if inode[j, I_SIZE] > 0:
            mag = fnode[j, F_KEY] - theta
            if mag > 0.0:
                old = mag if sgn[j] > 0 else -mag
            root = _delete(j, root, fnode, inode, seed, stk)
        new = old + g
        l1 += abs(new) - abs(old)
        if old != 0.0:
            nnz -= 1
        if new != 0.0:
            fnode[j, F_KEY] = abs(new) + theta
            sgn[j] = 1 if new > 0.0 else -1
            root = _insert(j, root, fnode, inode, seed, stk)
            nnz += 1
        else:
            fnode[j, F_KEY] = 0.0
            sgn[j] = 0
    projected = False
    if l1 > z:
        bc, bs = _find_threshold(root, z, fnode, inode)
        if bc > 0:
            theta = (bs - z) / bc
            l1 = z
            nnz = bc
            isc[ISC_NPROJ] += 1
            projected = True
    if l1 < 0.0:
        l1 = 0.0
    fsc[FSC_THETA] = theta
    fsc[FSC_L1] = l1
    isc[ISC_ROOT] = root
    isc[ISC_NNZ] = nnz
    if theta > fsc[FSC_REBASE] * z:
        l1tree_rebase(fnode, inode, sgn, fsc, isc)
    return projected


@numba.njit(**_JIT)
def l1tree_add_project(fnode, inode, sgn, fsc, isc, idx, vals, z):
    """w ← P_{L1,z}(w + g) for sparse g (g_{idx[t]} = vals[t]); see ``l1tree_axpy_project``. [§4 sparse online]"""
    return l1tree_axpy_project(fnode, inode, sgn, fsc, isc, idx, vals, 1.0, z)


@numba.njit(inline="always", **_JIT)
def l1tree_value(fnode, sgn, fsc, j):
    """Current w_j = σ_j·max(r_j − Θ, 0) (O(1); valid for every j, in the tree or not)."""
    m = fnode[j, F_KEY] - fsc[FSC_THETA]
    if m > 0.0:
        return sgn[j] * m
    return 0.0


@numba.njit(**_JIT)
def l1tree_get(fnode, inode, sgn, fsc, isc, j):
    """Current w_j (O(1))."""
    return l1tree_value(fnode, sgn, fsc, j)


@numba.njit(**_JIT)
def l1tree_dot(fnode, inode, sgn, fsc, isc, indices, data):
    """w·x for a sparse x (indices, data) in O(nnz(x))."""
    f = 0.0
    for t in range(indices.shape[0]):
        f += l1tree_value(fnode, sgn, fsc, indices[t]) * data[t]
    return f


@numba.njit(**_JIT)
def l1tree_dense(fnode, inode, sgn, fsc, isc):
    """Dense copy of w (O(p))."""
    p = sgn.shape[0]
    w = np.empty(p, np.float64)
    for j in range(p):
        w[j] = l1tree_value(fnode, sgn, fsc, j)
    return w


def l1tree_update(state, idx, vals, z, alpha=1.0):
    """Validating Python wrapper: ``w ← P_{L1,z}(w + α g)`` on an ``L1TreeState``; returns True if projected."""
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    vals = np.ascontiguousarray(vals, dtype=np.float64)
    if idx.ndim != 1 or vals.shape != idx.shape:
        raise ValueError("idx and vals must be 1-D of equal length")
    z = _as_radius(z, positive=True)
    return bool(l1tree_axpy_project(*state, idx, vals, float(alpha), z))


@numba.njit(**_JIT)
def l1tree_support(fnode, sgn, fsc):
    """(idx int64, values float64) of the non-zero w_j in increasing j: ``l1tree_dense`` without the dense
    vector (O(p), two scans)."""
    p = sgn.shape[0]
    n = 0
    for j in range(p):
        if l1tree_value(fnode, sgn, fsc, j) != 0.0:
            n += 1
    idx = np.empty(n, np.int64)
    val = np.empty(n, np.float64)
    n = 0
    for j in range(p):
        x = l1tree_value(fnode, sgn, fsc, j)
        if x != 0.0:
            idx[n] = j
            val[n] = x
            n += 1
    return idx, val


def l1tree_from_dense(w, seed=0, rebase_factor=64.0, index_dtype=None):
    """State holding the given w (Θ = 0, no projection applied), built in O(p log p)."""
    w = _as_vec(w, "w")
    nz = np.flatnonzero(w)
    return l1tree_from_sparse(nz, w[nz], w.size, seed, rebase_factor, index_dtype)


def l1tree_from_sparse(nz, values, p, seed=0, rebase_factor=64.0, index_dtype=None):
    """``l1tree_from_dense`` of the p-vector with non-zeros ``values`` at the strictly increasing ``nz`` (the same
    state bit for bit, without the dense vector)."""
    st = l1tree_init(p, seed=seed, rebase_factor=rebase_factor, index_dtype=index_dtype)
    nz = np.asarray(nz, dtype=np.int64)
    mag = np.abs(np.asarray(values, dtype=np.float64))
    order = nz[np.argsort(mag, kind="stable")].astype(np.int64)  # ties ordered by id
    st.fnode[nz, F_KEY] = mag
    st.sgn[nz] = np.sign(values).astype(np.int8)
    st.isc[ISC_ROOT] = _build_sorted(order, order.size, st.fnode, st.inode, st.isc[ISC_SEED])
    st.isc[ISC_NNZ] = nz.size
    st.fsc[FSC_L1] = float(mag.sum())
    return st
