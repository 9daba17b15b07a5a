"""Tests of pipeline.kernels.projection (ALGORITHMS.md §3 L1∩L2 projection, §4 L1-ball projections)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pipeline.kernels import projection as P

SETTINGS = settings(max_examples=60, deadline=None)

# ------------------------------------------------------------------------------------------------
# pure-NumPy references
# ------------------------------------------------------------------------------------------------


def ref_simplex_theta(u, z):
    """Duchi Fig. 1 in NumPy."""
    mu = np.sort(u)[::-1]
    cs = np.cumsum(mu)
    j = np.arange(1, u.size + 1)
    rho = np.nonzero(mu - (cs - z) / j > 0)[0][-1] + 1
    return (cs[rho - 1] - z) / rho


def ref_l1(v, z):
    v = np.asarray(v, float)
    if np.abs(v).sum() <= z:
        return v.copy(), 0.0
    if z == 0:
        return np.zeros_like(v), float(np.abs(v).max())
    th = ref_simplex_theta(np.abs(v), z)
    return np.sign(v) * np.maximum(np.abs(v) - th, 0.0), th


def ref_simplex_bisect(v, z, iters=200):
    """θ by bisection on Σ max(v − θ, 0) = z (independent of the sort/pivot logic)."""
    lo, hi = v.min() - z, v.max()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if np.maximum(v - mid, 0).sum() > z:
            lo = mid
        else:
            hi = mid
    return np.maximum(v - 0.5 * (lo + hi), 0.0)


def ref_l1l2_dykstra(v, B, c, rho, iters=20000):
    """Dykstra's alternating projections onto the L1 ball and the L2 ball (slow, reference only)."""
    x = v.copy()
    p = np.zeros_like(v)
    q = np.zeros_like(v)
    for _ in range(iters):
        y, _ = ref_l1(x + p, B)
        p_old = p
        p = x + p - y
        d = y + q - c
        nd = np.linalg.norm(d)
        xn = c + d * (rho / nd) if nd > rho else y + q
        qn = y + q - xn
        # x alone can stall while p, q still move: stop only when the whole Dykstra state is stable
        done = max(np.abs(xn - x).max(), np.abs(qn - q).max(), np.abs(p - p_old).max()) < 1e-15
        x, q = xn, qn
        if done:
            break
    return x


def l1_kkt_residual(v, z, w):
    """Max violation of the L1-ball KKT conditions of ALGORITHMS.md §4, relative to max(1, ‖v‖∞, z).

    The ‖w‖₁ = z entry is divided by the length n: with w_j = |v_j| − θ, ‖w‖₁ can only hit z to within
    about n·ulp(θ) (e.g. n equal entries), so float precision for that entry is n·eps.
    """
    scale = max(1.0, float(np.abs(v).max(initial=0.0)), z)
    if np.abs(v).sum() <= z:
        return float(np.abs(w - v).max(initial=0.0)) / scale
    res = abs(np.abs(w).sum() - z) / scale / max(1, v.size)
    nz = w != 0
    assert nz.any()
    th_all = (v[nz] - w[nz]) * np.sign(w[nz])
    th = th_all.mean()
    res = max(res, float(np.abs(th_all - th).max()) / scale)
    assert th > -1e-12 * scale
    if (~nz).any():
        res = max(res, max(float(np.abs(v[~nz]).max()) - th, 0.0) / scale)
    return res


vectors = hnp.arrays(
    np.float64,
    st.integers(1, 300),
    elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, allow_subnormal=False),
)
radii = st.floats(1e-3, 1e3, allow_nan=False)
small_int_vectors = hnp.arrays(np.float64, st.integers(1, 200), elements=st.integers(-5, 5).map(float))

# ------------------------------------------------------------------------------------------------
# dense L1 / simplex
# ------------------------------------------------------------------------------------------------


@SETTINGS
@given(v=vectors, z=radii, seed=st.integers(0, 2**40))
def test_l1_kkt_sort_and_pivot(v, z, seed):
    for w in (P.project_l1_sort(v, z), P.project_l1_pivot(v, z, seed=seed)):
        assert l1_kkt_residual(v, z, w) < 1e-12
        # feasible up to the cancellation in |v_j| − θ (≈ n·eps·‖v‖∞)
        slack = z * 1e-12 + 4 * v.size * np.finfo(float).eps * np.abs(v).max()
        assert np.abs(w).sum() <= z + slack or np.array_equal(w, v)
        # no sign flips, never larger in magnitude
        assert np.all(w * v >= 0)
        assert np.all(np.abs(w) <= np.abs(v))


@SETTINGS
@given(v=st.one_of(vectors, small_int_vectors), z=radii, seed=st.integers(0, 2**40))
def test_sort_pivot_reference_agree(v, z, seed):
    w1, t1 = P.project_l1_sort(v, z, return_theta=True)
    w2, t2 = P.project_l1_pivot(v, z, seed=seed, return_theta=True)
    w3, t3 = ref_l1(v, z)
    w4 = np.empty_like(v)
    t4 = P.l1_project_sort_kernel(v, z, w4)  # numba-sort kernel (the wrapper sorts with NumPy)
    scale = max(1.0, float(np.abs(v).max()))
    assert np.array_equal(w1, w4) and t1 == t4
    assert np.abs(w1 - w2).max() <= 1e-12 * scale
    assert np.abs(w1 - w3).max() <= 1e-12 * scale
    assert abs(t1 - t2) <= 1e-12 * scale and abs(t1 - t3) <= 1e-12 * scale


def test_inside_ball_and_edge_cases():
    v = np.array([0.5, -0.25, 0.0])
    for f in (P.project_l1_sort, P.project_l1_pivot):
        w, th = f(v, 1.0, return_theta=True)
        assert np.array_equal(w, v) and th == 0.0
        assert w is not v
        w, th = f(v, 0.0, return_theta=True)
        assert np.array_equal(w, np.zeros(3)) and th == 0.5
        assert f(np.zeros(0), 1.0).shape == (0,)
        # all ties
        w = f(np.full(1000, -2.0), 10.0)
        np.testing.assert_allclose(w, -0.01, rtol=0, atol=1e-15)
    with pytest.raises(ValueError):
        P.project_l1_sort(np.array([1.0, np.nan]), 1.0)
    with pytest.raises(ValueError):
        P.project_l1_pivot(np.ones(3), -1.0)
    with pytest.raises(ValueError):
        P.project_l1_sort(np.ones((2, 2)), 1.0)
    with pytest.raises(ValueError):
        P.project_simplex_sort(np.ones(3), 0.0)


def test_pivot_seeds_and_large():
    rng = np.random.default_rng(0)
    v = rng.standard_cauchy(200_000)
    w_ref, _ = ref_l1(v, 50.0)
    for seed in (0, 1, 12345):
        np.testing.assert_allclose(P.project_l1_pivot(v, 50.0, seed=seed), w_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(P.project_l1_sort(v, 50.0), w_ref, rtol=0, atol=1e-12)


@SETTINGS
@given(v=st.one_of(vectors, small_int_vectors), z=radii, seed=st.integers(0, 2**40))
def test_simplex(v, z, seed):
    w1, t1 = P.project_simplex_sort(v, z, return_theta=True)
    w2, t2 = P.project_simplex_pivot(v, z, seed=seed, return_theta=True)
    scale = max(1.0, float(np.abs(v).max()), z)
    assert np.abs(w1 - w2).max() <= 1e-12 * scale
    for w, th in ((w1, t1), (w2, t2)):
        assert np.all(w >= 0)
        assert abs(w.sum() - z) <= 1e-12 * scale * max(1, v.size) ** 0.5
        nz = w > 0
        assert np.abs(v[nz] - w[nz] - th).max() <= 1e-12 * scale  # KKT on the support
        assert np.all(v[~nz] <= th + 1e-12 * scale)  # KKT off the support
    w3 = ref_simplex_bisect(v, z)
    assert np.abs(w1 - w3).max() <= 1e-9 * scale


# ------------------------------------------------------------------------------------------------
# sparse online tree
# ------------------------------------------------------------------------------------------------


def check_tree(s):
    """Treap invariants: BST on (key, id), heap on prio, exact size/ksum, reachability, nnz, dead ⇒ key ≤ Θ."""
    key, ksum = s.fnode[:, P.F_KEY], s.fnode[:, P.F_KSUM]
    left, right = s.inode[:, P.I_LEFT], s.inode[:, P.I_RIGHT]
    size, prio = s.inode[:, P.I_SIZE], s.inode[:, P.I_PRIO]
    root = int(s.isc[P.ISC_ROOT])
    theta = s.fsc[P.FSC_THETA]
    seen = []
    if root >= 0:
        stack = [root]
        while stack:
            n = stack.pop()
            seen.append(n)
            for ch in (left[n], right[n]):
                if ch >= 0:
                    assert prio[ch] <= prio[n]
                    stack.append(int(ch))
        order = []

        def rec(n):  # in-order sorted by (key, id), aggregates exact (same summation order as _pull)
            if n < 0:
                return 0, 0.0
            lc, lk = rec(int(left[n]))
            order.append((key[n], n))
            rc, rk = rec(int(right[n]))
            ks = key[n]
            if left[n] >= 0:
                ks += lk
            if right[n] >= 0:
                ks += rk
            assert size[n] == 1 + lc + rc
            assert ksum[n] == ks
            return 1 + lc + rc, ks

        rec(root)
        assert order == sorted(order)
    assert len(seen) == len(set(seen))
    in_tree = np.flatnonzero(size > 0)
    assert sorted(seen) == list(in_tree)
    w = P.l1tree_dense(*s)
    assert np.all(w[size == 0] == 0)
    assert int(s.isc[P.ISC_NNZ]) == int(np.count_nonzero(w))
    live = key[in_tree] > theta
    assert np.all(s.sgn[in_tree[live]] != 0)


def _random_steps(rng, p, k, nsteps, w_scale=1.0):
    for _ in range(nsteps):
        kk = int(rng.integers(1, k + 1))
        idx = rng.integers(0, p, kk)
        vals = rng.normal(size=kk) * w_scale
        if rng.random() < 0.2:  # duplicates in one update
            idx[-1] = idx[0]
        yield idx, vals


@pytest.mark.parametrize("p,k,z,rebase", [(50, 8, 3.0, 64.0), (400, 20, 10.0, 64.0), (300, 12, 2.0, 0.5)])
def test_tree_matches_dense_every_step(p, k, z, rebase):
    rng = np.random.default_rng(p + k)
    s = P.l1tree_init(p, seed=7, rebase_factor=rebase)
    w_traj = np.zeros(p)  # independent dense trajectory
    nproj = 0
    for step, (idx, vals) in enumerate(_random_steps(rng, p, k, 700)):
        w_prev = P.l1tree_dense(*s)
        if rng.random() < 0.1:  # set a live coordinate exactly to zero
            j = int(rng.choice(np.flatnonzero(w_prev))) if np.any(w_prev) else 0
            idx = np.array([j], np.int64)
            vals = np.array([-w_prev[j]])
        g = np.zeros(p)
        np.add.at(g, idx, vals)
        projected = P.l1tree_add_project(*s, idx.astype(np.int64), vals, z)
        nproj += projected
        w_tree = P.l1tree_dense(*s)
        w_step, _ = ref_l1(w_prev + g, z)
        scale = max(1.0, float(np.abs(w_prev + g).max()))
        assert np.abs(w_tree - w_step).max() <= 1e-12 * scale, step
        assert np.all(w_tree * (w_prev + g) >= 0)
        w_traj, _ = ref_l1(w_traj + g, z)
        assert np.abs(w_tree - w_traj).max() <= 1e-10 * scale, step
        assert abs(s.fsc[P.FSC_L1] - np.abs(w_tree).sum()) <= 1e-10 * z
        if step % 50 == 0:
            check_tree(s)
        for j in idx[:3]:
            assert P.l1tree_get(*s, int(j)) == w_tree[j]
    check_tree(s)
    assert nproj > 100
    assert s.isc[P.ISC_NPROJ] == nproj
    if rebase < 1:
        assert s.isc[P.ISC_NREBASE] > 0
        assert s.fsc[P.FSC_THETA] <= rebase * z


def test_tree_dense_warm_start_dot_and_resume(tmp_path):
    rng = np.random.default_rng(3)
    p, z = 2000, 20.0
    w0 = rng.normal(size=p) * (rng.random(p) < 0.3)
    s = P.l1tree_from_dense(w0, seed=1)
    check_tree(s)
    np.testing.assert_array_equal(P.l1tree_dense(*s), w0)
    idx = rng.choice(p, 30, replace=False).astype(np.int64)
    data = rng.normal(size=30)
    assert P.l1tree_dot(*s, idx, data) == pytest.approx(w0[idx] @ data, rel=1e-14)
    # first update projects the large warm start
    P.l1tree_update(s, idx, data, z, alpha=-0.5)
    w1, _ = ref_l1(w0 + np.bincount(idx, -0.5 * data, minlength=p), z)
    np.testing.assert_allclose(P.l1tree_dense(*s), w1, rtol=0, atol=1e-12)
    check_tree(s)
    # save / resume: both continue identically
    np.savez(tmp_path / "st.npz", **s._asdict())
    with np.load(tmp_path / "st.npz") as f:
        s2 = P.L1TreeState(**{k: f[k].copy() for k in f.files})
    for idx, vals in _random_steps(rng, p, 15, 100):
        P.l1tree_add_project(*s, idx, vals, z)
        P.l1tree_add_project(*s2, idx, vals, z)
    for a, b in zip(s, s2):
        np.testing.assert_array_equal(a, b)


def test_tree_validation_does_not_mutate():
    s = P.l1tree_init(10)
    P.l1tree_update(s, [1, 2], [0.5, -0.5], 10.0)
    before = [a.copy() for a in s]
    with pytest.raises(IndexError):
        P.l1tree_add_project(*s, np.array([3, 10], np.int64), np.array([1.0, 1.0]), 10.0)
    with pytest.raises(ValueError):
        P.l1tree_add_project(*s, np.array([3], np.int64), np.array([np.nan]), 10.0)
    with pytest.raises(ValueError):
        P.l1tree_update(s, [3], [1.0], 0.0)
    for a, b in zip(before, s):
        np.testing.assert_array_equal(a, b)


def test_tree_cost_flat_in_p():
    """The tree never holds more nodes than coordinates ever touched; projection keeps ‖w‖₁ = z."""
    rng = np.random.default_rng(5)
    p, z = 100_000, 5.0
    s = P.l1tree_init(p)
    touched = set()
    for idx, vals in _random_steps(rng, p, 10, 300):
        touched.update(idx.tolist())
        P.l1tree_add_project(*s, idx, vals, z)
    root = s.isc[P.ISC_ROOT]
    assert s.inode[root, P.I_SIZE] <= len(touched)
    assert np.abs(P.l1tree_dense(*s)).sum() == pytest.approx(z, rel=1e-12)


# ------------------------------------------------------------------------------------------------
# L1 ∩ L2 (Epoch-GD domain)
# ------------------------------------------------------------------------------------------------


def _l1l2_case(rng, n, regime):
    v = rng.normal(size=n) * rng.choice([0.1, 1.0, 10.0])
    if rng.random() < 0.3:
        v[rng.random(n) < 0.5] = 0.0
    B = float(rng.uniform(0.2, 2.0) * np.sqrt(n))
    c, _ = ref_l1(rng.normal(size=n), B * rng.uniform(0.0, 1.0))
    if regime == "both":
        a, _ = ref_l1(v, B)
        rho = float(rng.uniform(0.05, 0.95) * np.linalg.norm(a - c))
    else:
        rho = float(rng.uniform(0.01, 2.0) * max(np.linalg.norm(v - c), 1e-3))
    return v, B, c, rho


@pytest.mark.parametrize("regime", ["both", "any"])
def test_l1l2_feasible_and_kkt(regime):
    rng = np.random.default_rng(11 if regime == "both" else 12)
    statuses = set()
    tol = 1e-10
    for trial in range(150):
        n = int(rng.integers(1, 120))
        v, B, c, rho = _l1l2_case(rng, n, regime)
        w, mu, lam, status = P.project_l1_l2(v, B, c, rho, return_multipliers=True, tol=tol)
        statuses.add(status)
        r = P.l1l2_kkt_residual(v, B, c, rho, w, mu, lam)
        scale = max(1.0, float(np.abs(v).max()), float(np.abs(c).max())) * (1.0 + mu)
        assert mu >= 0 and lam >= 0
        assert r["l1_violation"] <= 1e-12 * B
        assert r["ball_violation"] <= 1e-14 * rho  # feasible side (up to the norm's rounding)
        assert r["stationarity"] <= 1e-12 * scale, (trial, r)
        assert r["off_support"] <= 1e-12 * scale, (trial, r)
        assert r["slack_l1"] <= 1e-12 * max(1.0, lam) * B
        assert r["slack_ball"] <= 2 * tol * rho * mu + 1e-12 * max(1.0, mu), (trial, r)
        # compare with Dykstra (slow reference) on small problems
        if n <= 12 and trial % 5 == 0:
            np.testing.assert_allclose(w, ref_l1l2_dykstra(v, B, c, rho), atol=1e-6)
    if regime == "both":
        assert P.L1L2_BOTH in statuses
    else:
        assert len(statuses) >= 3


def test_l1l2_reduces_to_single_constraints():
    rng = np.random.default_rng(2)
    for _ in range(50):
        n = int(rng.integers(1, 80))
        v = rng.normal(size=n) * 3
        B = float(rng.uniform(0.1, 1.0) * np.abs(v).sum())
        c, _ = ref_l1(rng.normal(size=n) * 0.1, B)
        # ball inactive (ρ huge) → L1 projection
        w, mu, lam, status = P.project_l1_l2(v, B, c, 1e6, return_multipliers=True)
        w_l1, th = ref_l1(v, B)
        np.testing.assert_allclose(w, w_l1, rtol=0, atol=1e-12 * max(1, np.abs(v).max()))
        assert mu == 0.0 and lam == pytest.approx(th, rel=1e-12, abs=1e-12)
        assert status in (P.L1L2_L1_ONLY, P.L1L2_INSIDE)
        # L1 inactive (B huge) → ball projection
        rho = 0.5 * np.linalg.norm(v - c)
        w, mu, lam, status = P.project_l1_l2(v, 1e6, c, rho, return_multipliers=True)
        np.testing.assert_allclose(w, c + rho * (v - c) / np.linalg.norm(v - c), rtol=0, atol=1e-12)
        assert status == P.L1L2_BALL_ONLY and lam == 0.0
        assert mu == pytest.approx(np.linalg.norm(v - c) / rho - 1.0, rel=1e-12)


def test_l1l2_idempotent_and_edges():
    rng = np.random.default_rng(9)
    for _ in range(40):
        n = int(rng.integers(1, 60))
        v, B, c, rho = _l1l2_case(rng, n, "both")
        w = P.project_l1_l2(v, B, c, rho)
        w2, mu2, lam2, status2 = P.project_l1_l2(w, B, c, rho, return_multipliers=True)
        # w sits on both boundaries up to rounding, so a second pass may move it by ~1 ulp
        np.testing.assert_allclose(w2, w, rtol=0, atol=1e-13 * max(1.0, np.abs(w).max()))
        assert mu2 <= 1e-9 and lam2 <= 1e-9
        w3 = P.project_l1_l2(w2, B, c, rho)
        np.testing.assert_allclose(w3, w2, rtol=0, atol=1e-13 * max(1.0, np.abs(w).max()))
    v = rng.normal(size=5)
    c, _ = ref_l1(rng.normal(size=5), 1.0)
    w, mu, lam, status = P.project_l1_l2(v, 1.0, c, 0.0, return_multipliers=True)
    np.testing.assert_array_equal(w, c)
    assert status == P.L1L2_POINT and mu == np.inf
    with pytest.raises(ValueError):
        P.project_l1_l2(v, 1.0, np.ones(5), 1.0)  # ‖c‖₁ > B
    with pytest.raises(ValueError):
        P.project_l1_l2(v, 1.0, np.zeros(4), 1.0)


def test_l1l2_projection_in_place_is_the_same_bits():
    """``out`` may alias ``v`` (two-stage projects w in place with 2n of scratch): the same bits and multipliers
    as into a separate array, in every case (inside, L1 only, ball only, both, ρ = 0)."""
    from pipeline.kernels.projection import l1l2_project_kernel

    rng = np.random.default_rng(3)
    seen = set()
    for trial in range(300):
        n = int(rng.integers(1, 60))
        v = rng.normal(size=n) * (rng.random(n) < 0.7) * rng.choice([0.1, 1.0, 5.0])
        c = rng.normal(size=n) * (rng.random(n) < 0.5)
        B = float(np.abs(c).sum() * rng.choice([1.0, 1.5, 4.0]) + 1e-3)
        rho = float(rng.choice([0.0, 0.05, 0.5, 2.0, 50.0]))
        out = np.empty(n)
        ref = l1l2_project_kernel(v, B, c, rho, out, np.empty(2 * n), 7, 1e-10, 100)
        w = v.copy()
        got = l1l2_project_kernel(w, B, c, rho, w, np.empty(2 * n), 7, 1e-10, 100)
        assert w.tobytes() == out.tobytes() and got == ref
        seen.add(ref[2])
    assert seen == {0, 1, 2, 3, 4}
