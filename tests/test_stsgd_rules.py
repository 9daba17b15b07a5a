"""STSGD stage-end rules (pipeline.algorithms.stsgd_rules), ALGORITHMS.md §2 (ST-6)-(ST-13) and
§7 properties 4-8, against hand-computed numbers and NumPy references."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pipeline.algorithms import stsgd_rules as R
from pipeline.kernels.sparse_sets import sorted_member, union_positions


# ------------------------------------------------------------------------------------------------
# hand example: M = 2 paths, n_K = 3 bursts, p = 4
# per path, per burst: k̃ (evidence count) and survival after truncation
#   path 1: f0 k̃=(2,1,3) surv=(1,0,1); f1 k̃=(1,0,0) surv=(0,-,-); f2 never;
#           f3 k̃=(0,2,1) surv=(-,1,1)
#   path 2: f0 k̃=(0,1,1) surv=(-,1,1); f1 k̃=(0,0,4) surv=(-,-,1); f2 never;
#           f3 k̃=(5,0,0) surv=(0,-,-)
P1 = dict(evid=np.array([3, 1, 0, 2]), surv=np.array([2, 0, 0, 2]), upd=np.array([6, 1, 0, 3]))
P2 = dict(evid=np.array([2, 1, 0, 1]), surv=np.array([2, 1, 0, 0]), upd=np.array([2, 4, 0, 5]))
# pooled: f0 b/c = 4/5 = 0.8 ; f1 1/2 = 0.5 ; f2 no evidence -> 1 ; f3 2/3
POOLED_PROB = np.array([0.8, 0.5, 1.0, 2.0 / 3.0])
PATH1_PROB = np.array([2.0 / 3.0, 0.0, 1.0, 1.0])  # eq. (7), M = 1


def test_selection_probability_by_hand_dense():
    evid = P1["evid"] + P2["evid"]
    surv = P1["surv"] + P2["surv"]
    np.testing.assert_allclose(R.selection_probability(evid, surv), POOLED_PROB)
    np.testing.assert_allclose(R.selection_probability(P1["evid"], P1["surv"]), PATH1_PROB)


def test_selection_probability_by_hand_sparse_pipeline():
    sets = [R.sparse_counters(P["evid"], P["surv"], P["upd"]) for P in (P1, P2)]
    assert list(sets[0][0]) == [0, 1, 3] and list(sets[1][0]) == [0, 1, 3]
    merged = R.tree_merge(sets)
    assert list(merged[0]) == [0, 1, 3]
    assert list(merged[1]) == [5, 2, 3] and list(merged[2]) == [4, 1, 2]
    assert list(merged[3]) == [8, 5, 8]
    idx, prob, carry = R.carried_selection_probability(None, merged, delta_K=0)
    assert list(idx) == [0, 1, 3]
    np.testing.assert_allclose(prob, [0.8, 0.5, 2.0 / 3.0])
    assert len(carry[0]) == 0
    alive = np.ones(4, bool)
    new_alive, purged = R.stable_set(alive, prob, 0.6, idx=idx)
    assert list(purged) == [1] and list(new_alive) == [True, False, True, True]
    new_alive, purged = R.stable_set(alive, prob, 0.7, idx=idx)
    assert list(purged) == [1, 3] and list(new_alive) == [True, False, True, False]
    # π0 = 0: nothing purged; dense prob gives the same sets
    assert len(R.stable_set(alive, prob, 0.0, idx=idx)[1]) == 0
    assert list(R.stable_set(alive, POOLED_PROB, 0.7)[1]) == [1, 3]
    # stable set monotone: an already purged feature is never "purged again" nor revived
    a2, p2 = R.stable_set(np.array([True, False, True, True]), POOLED_PROB, 0.7)
    assert list(p2) == [3] and list(a2) == [True, False, True, False]


def test_purge_zeroes_paths():
    ws = [np.array([1.0, -2.0, 3.0, 4.0]), np.array([0.5, 0.0, -1.0, 2.0])]
    for w in ws:
        R.purge(w, np.array([1, 3]))
    assert list(ws[0]) == [1.0, 0.0, 3.0, 0.0] and list(ws[1]) == [0.5, 0.0, -1.0, 0.0]


# ------------------------------------------------------------------------------------------------
# carried-over counters (ST-11)


def test_carry_by_hand_delta_2():
    # one feature; stage 1: κ=1 (c=1,b=0) -> κ̃=1 <= 2: Π̂ = 1, carry kept
    s1 = (np.array([7]), np.array([1]), np.array([0]), np.array([1]))
    idx, prob, carry = R.carried_selection_probability(None, s1, delta_K=2)
    assert list(idx) == [7] and list(prob) == [1.0]
    assert [list(a) for a in carry] == [[7], [1], [0], [1]]
    # stage 2: κ=2 (c=1,b=1) -> κ̃ = 3 > 2: Π̂ = b̃/c̃ = 1/2 ; paper: b̃/κ̃ = 1/3 ; carry dropped
    s2 = (np.array([7]), np.array([1]), np.array([1]), np.array([2]))
    idx, prob, carry2 = R.carried_selection_probability(carry, s2, delta_K=2)
    assert list(prob) == [0.5] and len(carry2[0]) == 0
    _, prob_p, _ = R.carried_selection_probability(carry, s2, delta_K=2, ratio="paper")
    assert prob_p[0] == pytest.approx(1.0 / 3.0)
    # stage 3 starts afresh: κ=1 -> carry again, Π̂ = 1
    idx, prob, carry3 = R.carried_selection_probability(carry2, s1, delta_K=2)
    assert list(prob) == [1.0] and list(carry3[3]) == [1]
    # dense element-wise form agrees
    pr, c, b, k = R.carried_counters_elementwise(np.array([1]), np.array([0]), np.array([1]),
                                                 np.array([1]), np.array([1]), np.array([2]), 2)
    assert list(pr) == [0.5] and (c[0], b[0], k[0]) == (2, 1, 3)


def test_carry_feature_absent_from_stage_keeps_prob_one():
    carry = (np.array([2]), np.array([1]), np.array([1]), np.array([1]))
    s = (np.array([5]), np.array([2]), np.array([0]), np.array([9]))
    idx, prob, new_carry = R.carried_selection_probability(carry, s, delta_K=3)
    assert list(idx) == [2, 5]
    assert list(prob) == [1.0, 0.0]
    assert list(new_carry[0]) == [2] and list(new_carry[3]) == [1]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["c", "paper"]))
def test_delta_zero_reproduces_eq8(seed, ratio):
    rng = np.random.default_rng(seed)
    p = 30
    carry = None
    carry_dense = [np.zeros(p, np.int64)] * 3
    for _ in range(4):  # several stages
        evid = rng.integers(0, 4, p) * (rng.random(p) < 0.6)
        surv = np.minimum(rng.integers(0, 4, p), evid)
        upd = evid * rng.integers(1, 5, p)
        s = R.sparse_counters(evid, surv, upd)
        idx, prob, carry = R.carried_selection_probability(carry, s, delta_K=0, ratio=ratio)
        assert len(carry[0]) == 0
        dense = np.ones(p)
        dense[idx] = prob
        pr, *carry_dense = R.carried_counters_elementwise(*carry_dense, evid, surv, upd, 0,
                                                          ratio=ratio)
        if ratio == "c":  # (16) with δ_K = 0 is (8), bit for bit
            ref = R.selection_probability(evid, surv)
        else:  # paper's ratio b/κ where there was evidence
            ref = np.ones(p)
            ref[evid > 0] = surv[evid > 0] / upd[evid > 0]
        np.testing.assert_array_equal(dense, ref)
        np.testing.assert_array_equal(pr, ref)


def test_m1_eq8_equals_eq7():
    s = R.sparse_counters(P1["evid"], P1["surv"], P1["upd"])
    idx, prob, _ = R.carried_selection_probability(None, s)
    dense = np.ones(4)
    dense[idx] = prob
    np.testing.assert_allclose(dense, PATH1_PROB)


# ------------------------------------------------------------------------------------------------
# sparse exchange


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 9))
def test_sparse_merge_equals_dense_sum(seed, M):
    rng = np.random.default_rng(seed)
    p = 50
    dense = [rng.integers(0, 3, p) * (rng.random(p) < 0.3) for _ in range(M)]
    sets = [R.sparse_counters(d, d // 2, 3 * d) for d in dense]
    merged = R.tree_merge(sets)
    tot = np.sum(dense, axis=0)
    assert np.all(np.diff(merged[0]) > 0)
    np.testing.assert_array_equal(merged[0], np.flatnonzero(tot))
    np.testing.assert_array_equal(R.densify(merged, p, 1), tot)
    np.testing.assert_array_equal(R.densify(merged, p, 2), np.sum([d // 2 for d in dense], 0))
    np.testing.assert_array_equal(R.densify(merged, p, 3), 3 * tot)
    # order / grouping independence for integer counters
    rev = R.tree_merge(sets[::-1])
    for a, b in zip(merged, rev):
        np.testing.assert_array_equal(a, b)
    seq = R.empty_sparse(3)
    for s in sets:
        seq = R.merge_sparse(seq, s)
    for a, b in zip(merged, seq):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------------
# annealing (ST-10)


def test_anneal_beta_endpoints_and_examples():
    for g in (-9, -5, -3, -1, -0.01, 0, 0.01, 1, 3, 5, 7):
        assert R.anneal_beta(0.7, g, 1.0) == pytest.approx(0.7, abs=1e-12)
        assert R.anneal_beta(0.7, g, 0.0) == pytest.approx(0.0, abs=1e-12)
        assert R.anneal_beta(0.0, g, 0.4) == 0.0  # β0 = 0 ⇒ β ≡ 0
    assert R.anneal_beta(0.7, -5, 0.5) == pytest.approx(0.7 * math.log(3.5) / math.log(6.0))
    assert round(R.anneal_beta(0.7, -5, 0.5), 2) == 0.49
    assert R.anneal_beta(0.7, 0, 0.5) == pytest.approx(0.35)
    assert R.anneal_beta(0.7, 5, 0.5) == pytest.approx(0.7 * (math.exp(-2.5) - 0.5 * math.exp(-5)))
    assert round(R.anneal_beta(0.7, 5, 0.5), 2) == 0.06
    # γ = 0 is linear
    for d in np.linspace(0, 1, 11):
        assert R.anneal_beta(0.8, 0, d) == pytest.approx(0.8 * d)


def test_anneal_beta_monotone():
    ds = np.linspace(0, 1, 101)
    gammas = [-9, -5, -3, -1, 0, 1, 3, 5, 9]
    for g in gammas:
        b = [R.anneal_beta(0.7, g, d) for d in ds]
        assert np.all(np.diff(b) >= -1e-15)  # increasing in d
    for d in ds[1:-1]:
        b = [R.anneal_beta(0.7, g, d) for g in gammas]
        assert np.all(np.diff(b) <= 1e-15)  # decreasing in γ
    # continuity at γ = 0 between the two branches
    assert R.anneal_beta(0.7, -1e-9, 0.3) == pytest.approx(R.anneal_beta(0.7, 0, 0.3), abs=1e-8)


# ------------------------------------------------------------------------------------------------
# adaptive gravity (ST-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 400), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_adaptive_gravity_hits_target(N, beta, seed):
    r = np.random.default_rng(seed).exponential(size=N)  # distinct a.s.
    g0 = R.adaptive_gravity(r, beta)
    if beta == 0.0:
        assert g0 == 0.0
        return
    k = R.quantile_rank(beta, N)
    assert k == min(max(math.ceil(round(beta * N, 9)), 1), N)
    assert g0 == np.sort(r)[k - 1]
    assert np.mean(r <= g0) == k / N


def test_adaptive_gravity_edge_cases():
    assert R.adaptive_gravity([], 0.5) == 0.0
    assert R.adaptive_gravity([0.3, 0.1], 0.0) == 0.0
    r = np.arange(1, 11) / 10.0
    assert R.quantile_rank(0.7, 10) == 7  # 0.7·10 = 7.000000000000001 in floating point
    assert R.adaptive_gravity(r[::-1], 0.7) == 0.7
    assert R.adaptive_gravity(r, 1.0) == 1.0
    assert R.adaptive_gravity(r, 0.01) == 0.1
    # β0 = 0 ⇒ β_s = 0 for every stage ⇒ g0 = 0
    for d in (1.0, 0.5, 0.1):
        assert R.adaptive_gravity(r, R.anneal_beta(0.0, -3, d)) == 0.0


def test_pooled_ratios_keep_alive_features_only():
    b1 = np.array([[0, 0.1], [1, 0.2], [2, 0.3], [9, 9.9]])
    b2 = np.array([[1, 0.4], [3, 0.5]])
    alive = np.array([True, False, True, True])
    got = R.pooled_ratios([(b1, 3), (b2, 2)], alive)
    np.testing.assert_array_equal(got, [0.1, 0.3, 0.5])


def test_realized_rejection_rate():
    assert R.realized_rejection_rate(np.array([4, 6]), np.array([1, 4])) == pytest.approx(0.5)
    assert R.realized_rejection_rate(np.array([0]), np.array([0])) == 0.0


# ------------------------------------------------------------------------------------------------
# burst size (ST-12)


def test_burst_size():
    for K0 in range(1, 60):
        for a in (0.1, 0.3, 0.5, 0.9):
            assert R.burst_size(K0, a, 1.0) == max(1, math.ceil(K0 * math.log(1 / a)))
            ks = [R.burst_size(K0, a, d) for d in np.linspace(1.0, 0.001, 60)]
            assert min(ks) >= 1
            assert np.all(np.diff(ks) >= 0)  # non-decreasing as d shrinks
    assert R.burst_size(5, 0.5, 1.0) == 4   # ⌈5·0.693⌉
    assert R.burst_size(20, 0.5, 1.0) == 14  # ⌈13.86⌉
    assert R.burst_size(5, 0.5, 0.25) == 11  # ⌈5·log 8⌉ = ⌈10.4⌉
    assert R.burst_size(1, 0.9, 1.0) == 1    # clamp: ⌈0.105⌉ = 1
    for bad in ((5, 1.0, 1.0), (5, 0.0, 1.0), (5, 0.5, 0.0), (5, 0.5, 1.5)):
        with pytest.raises(ValueError):
            R.burst_size(*bad)


# ------------------------------------------------------------------------------------------------
# aggregation and stopping (ST-13)


def test_aggregate_and_sparse_aggregate():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(5, 30)) * (rng.random((5, 30)) < 0.3)
    wbar = R.aggregate(list(W))
    np.testing.assert_allclose(wbar, W.mean(axis=0), rtol=1e-15, atol=1e-16)
    idx, v = R.aggregate_sparse([R.sparse_weights(w) for w in W], 5)
    dense = np.zeros(30)
    dense[idx] = v
    np.testing.assert_allclose(dense, wbar, rtol=1e-14, atol=1e-16)
    assert R.aggregate([0.5, 1.5]) == 1.0  # biases


def test_should_stop():
    a = np.array([1.0, 0.0])
    b = np.array([1.0005, 0.0])
    assert R.converged(b, a, 1e-3) and not R.converged(b, a, 1e-4)
    assert not R.should_stop(b, None, 1e-3, 0.5, 20)
    assert not R.should_stop(b, a, 1e-3, 0.5, 20)   # before one full pass
    assert R.should_stop(b, a, 1e-3, 1.0, 20)
    assert not R.should_stop(b + 1, a, 1e-3, 3, 20)
    assert R.should_stop(b + 1, a, 1e-3, 20, 20)    # passes exhausted
    # relative: large norms use the relative scale
    big = np.array([1000.0, 0.0])
    assert R.converged(big + 0.5, big, 1e-3) and not R.converged(big + 2, big, 1e-3)


# ------------------------------------------------------------------------------------------------
# a tiny in-memory STSGD loop (kernel + rules), checking properties 4-7 end to end


def _mini_stsgd(beta0, pi0, stages=6, M=3, p=40, n=150, K=5, n_K=5, seed=0):
    import scipy.sparse as sp

    from pipeline.kernels import stsgd as KS

    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.2, format="csr", random_state=seed)
    wt = np.zeros(p)
    wt[:5] = 2.0
    y = np.where(X @ wt - 0.2 + 0.1 * rng.normal(size=n) >= 0, 1.0, -1.0)
    indptr, indices, data = X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data
    paths = [KS.new_path_state(p, ratio_capacity=10_000, seed=m) for m in range(M)]
    pos = [0] * M
    perms = [np.random.default_rng(100 + m).permutation(n) for m in range(M)]
    alive = np.ones(p, bool)
    beta, g0, carry = beta0, 0.0, None
    log = []
    for s in range(stages):
        for m, stt in enumerate(paths):
            KS.reset_stage(stt["istate"], stt["rec"])
            KS.purge_features(stt["rec"], np.flatnonzero(~alive))  # Ω of the stage (w is already 0 there)
            while stt["istate"][KS.I_STAGE_BURSTS] < n_K:
                if pos[m] == n:
                    perms[m], pos[m] = np.random.default_rng(m + 7 * s).permutation(n), 0
                pos[m] += KS.stsgd_block(
                    indptr, indices, data, y, perms[m], pos[m], stt["rec"], KS.int_view(stt["rec"]),
                    stt["touched"], stt["istate"], stt["fstate"], stt["ratios"], 0.5, 1, K,
                    g0, 0, False, KS.TRUNC_INFORMATIVE, False, False, n_K, s == 0, beta, stt["acc"], KS.ADA_OFF,
                    1.0)
        views = [KS.views(t) for t in paths]
        counters = R.tree_merge([R.sparse_counters(v["cnt_evid"], v["cnt_surv"], v["cnt_upd"])
                                 for v in views])
        rate = R.realized_rejection_rate(counters[1], counters[2])
        idx, prob, carry = R.carried_selection_probability(carry, counters, 0)
        new_alive, purged = R.stable_set(alive, prob, pi0, idx=idx)
        assert np.all(new_alive <= alive)  # Ω_s ⊆ Ω_{s−1}
        alive = new_alive
        for v in views:
            R.purge(v["w"], purged)
        d = alive.sum() / p
        beta = R.anneal_beta(beta0, -3, d)
        ratios = R.pooled_ratios([(t["ratios"], t["istate"][KS.I_NRATIOS]) for t in paths], alive)
        g0 = R.adaptive_gravity(ratios, beta)
        if len(ratios) and beta > 0:
            assert np.mean(ratios <= g0) == R.quantile_rank(beta, len(ratios)) / len(ratios)
        log.append((alive.copy(), beta, g0, rate))
        for t in paths:
            assert np.all(KS.views(t)["w"][~alive] == 0.0)
    return paths, log


def test_mini_stsgd_loop_properties():
    paths, log = _mini_stsgd(beta0=0.7, pi0=0.8)
    alive_final = log[-1][0]
    assert alive_final.sum() < 40  # something was purged
    for a_prev, a_next in zip([x[0] for x in log], [x[0] for x in log][1:]):
        assert np.all(a_next <= a_prev)  # never re-enters
    from pipeline.kernels import stsgd as KS

    for t in paths:
        assert np.all(KS.views(t)["w"][~alive_final] == 0.0)
    # stage 1 (per-burst quantile at β0): realized rejection close to β0 (bursts mostly start at 0)
    assert 0.5 <= log[0][3] <= 0.8


def test_mini_stsgd_beta0_zero_is_sgd_without_purging():
    paths, log = _mini_stsgd(beta0=0.0, pi0=0.8, stages=3)
    for alive, beta, g0, rate in log:
        assert beta == 0.0 and g0 == 0.0
        assert alive.all()  # nothing ever truncated ⇒ Π̂ = 1 ⇒ nothing purged


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_linear_merges_equal_numpy_sorting_references(seed):
    """union_positions / sorted_member (two-pointer passes over sorted ids) == np.union1d + searchsorted / np.isin."""
    rng = np.random.default_rng(seed)
    for na, nb in [(0, 0), (0, 5), (7, 0), (50, 300), (1000, 1000)]:
        ia = np.unique(rng.integers(0, 2000, na)).astype(np.int64)
        ib = np.unique(rng.integers(0, 2000, nb)).astype(np.int64)
        u, pa, pb = union_positions(ia, ib)
        ref = np.union1d(ia, ib)
        np.testing.assert_array_equal(u, ref)
        np.testing.assert_array_equal(pa, np.searchsorted(ref, ia))
        np.testing.assert_array_equal(pb, np.searchsorted(ref, ib))
        np.testing.assert_array_equal(sorted_member(ia, ib), np.isin(ia, ib))
        np.testing.assert_array_equal(sorted_member(ib, ia), np.isin(ib, ia))
