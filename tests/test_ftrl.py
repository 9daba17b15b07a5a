"""FTRL-Proximal (McMahan et al. 2013, Algorithm 1; ALGORITHMS.md §8): kernel vs a dense NumPy reference,
exact zeros, resume, determinism across workers, both mixing rules, validation."""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.algorithms import make_algorithm
from pipeline.kernels import ftrl as K
from pipeline.kernels.losses import LOSS_CODES
from pipeline.model import load_model
from pipeline.train import fit
from tests.conftest import ingest_shared

OPTS = {"alpha": 0.5, "beta": 1.0, "l1": 0.5, "l2": 1.0}


@pytest.fixture(scope="module")
def store(tmp_path_factory, client):
    # RCV1 tf-idf rows are L2-normalised, like the data the defaults target; ~6 blocks
    return ingest_shared(tmp_path_factory, client, "rcv1_subset/rcv1_vw_small_train.svm", "ftrl", block_mb=0.1,
                         holdout=0.2)


def random_csr(n=60, d=40, density=0.15, seed=0, regression=False):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, random_state=rng, format="csr", dtype=np.float64)
    X.data = rng.normal(size=X.data.shape)
    y = rng.normal(size=n) if regression else np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return X, y


def reference(X, y, rows, alpha, beta, l1, l2, loss, fit_bias):
    """Algorithm 1 of McMahan et al. (2013), dense over every coordinate, the bias as coordinate 0 of an
    augmented x with constant feature 1 and no L1/L2. Logistic in the paper's form p − y with y ∈ {0, 1}."""
    D = X.toarray()
    d = D.shape[1] + 1
    z, n = np.zeros(d), np.zeros(d)
    lam1 = np.r_[0.0, np.full(d - 1, l1)]
    lam2 = np.r_[0.0, np.full(d - 1, l2)]
    for i in rows:
        x = np.r_[1.0 if fit_bias else 0.0, D[i]]
        w = np.where(np.abs(z) <= lam1, 0.0, -(z - np.sign(z) * lam1) / ((beta + np.sqrt(n)) / alpha + lam2))
        f = float(w @ x)
        if loss == "logistic":
            g = (1.0 / (1.0 + math.exp(-f)) - (y[i] + 1) / 2) * x
        elif loss == "hinge":
            g = (-y[i] if y[i] * f < 1 else 0.0) * x
        else:
            g = (f - y[i]) * x
        sigma = (np.sqrt(n + g * g) - np.sqrt(n)) / alpha
        z = z + g - sigma * w
        n = n + g * g
    return z, n


def run_kernel(X, y, rows, alpha, beta, l1, l2, loss, fit_bias, state=None):
    z, n, ist, fst = state if state is not None else K.new_ftrl_state(X.shape[1])
    K.ftrl_block(X.indptr.astype(np.int64), X.indices, X.data, y, np.asarray(rows, dtype=np.int64), z, n, ist, fst,
                 alpha, beta, l1, l2, LOSS_CODES[loss], False, fit_bias)
    return z, n, ist, fst


@pytest.mark.parametrize("loss,l1,l2,fit_bias", [("logistic", 0.3, 0.5, True), ("logistic", 0.0, 0.0, False),
                                                 ("hinge", 0.2, 0.1, True), ("squared", 0.5, 1.0, True)])
def test_kernel_matches_dense_reference_of_algorithm_1(loss, l1, l2, fit_bias):
    X, y = random_csr(regression=loss == "squared")
    rows = np.random.default_rng(1).permutation(np.tile(np.arange(X.shape[0]), 3))
    alpha, beta = 0.7, 1.0
    z, n, ist, fst = run_kernel(X, y, rows, alpha, beta, l1, l2, loss, fit_bias)
    zr, nr = reference(X, y, rows, alpha, beta, l1, l2, loss, fit_bias)
    np.testing.assert_allclose(z, zr[1:], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(n, nr[1:], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fst, [zr[0], nr[0]], rtol=1e-12, atol=1e-12)
    assert ist[0] == rows.size and np.count_nonzero(n) > 0


def test_state_in_arrays_so_split_calls_equal_one_call():
    X, y = random_csr(seed=3)
    rows = np.random.default_rng(2).permutation(np.tile(np.arange(X.shape[0]), 2))
    one = run_kernel(X, y, rows, 0.5, 1.0, 0.2, 0.3, "logistic", True)
    st = run_kernel(X, y, rows[:37], 0.5, 1.0, 0.2, 0.3, "logistic", True)
    two = run_kernel(X, y, rows[37:], 0.5, 1.0, 0.2, 0.3, "logistic", True, state=st)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("loss,fit_bias", [("logistic", True), ("hinge", False), ("squared", True)])
def test_interleaved_layout_equals_two_arrays_bit_for_bit(loss, fit_bias):
    """z and n interleaved in one array (the stage layout: z_j at 2j, n_j at 2j + 1) give the two-array kernel's
    bits, mid-stream (from a non-zero state) too; the algorithm's stage splits them back the same."""
    X, y = random_csr(seed=4, regression=loss == "squared")
    rows = np.random.default_rng(3).permutation(np.tile(np.arange(X.shape[0]), 2))
    two = run_kernel(X, y, rows[:50], 0.5, 1.0, 0.2, 0.3, loss, fit_bias)
    zn = np.empty(2 * X.shape[1])
    zn[0::2], zn[1::2] = two[0], two[1]
    ist, fst = two[2].copy(), two[3].copy()
    run_kernel(X, y, rows[50:], 0.5, 1.0, 0.2, 0.3, loss, fit_bias, state=two)
    K.ftrl_block(X.indptr.astype(np.int64), X.indices, X.data, y, rows[50:].astype(np.int64), zn, zn, ist, fst,
                 0.5, 1.0, 0.2, 0.3, LOSS_CODES[loss], False, fit_bias, 2, 1)
    np.testing.assert_array_equal(zn[0::2], two[0])
    np.testing.assert_array_equal(zn[1::2], two[1])
    np.testing.assert_array_equal(fst, two[3])
    assert ist[0] == two[2][0]
    algo = make_algorithm("ftrl", {"alpha": 0.5, "l1": 0.2, "l2": 0.3, "loss": loss, "fit_bias": fit_bias})
    st = algo.working_state({"z": two[0].copy(), "n": two[1].copy(), "istate": two[2], "fstate": two[3]})
    assert set(st) == {"zn", "istate", "fstate"}
    algo.end_stage(st)
    np.testing.assert_array_equal(st["z"], two[0])
    np.testing.assert_array_equal(st["n"], two[1])
    assert not st["z"].flags.writeable and not st["n"].flags.writeable  # shared by the next task, not copied


def test_exact_zeros_where_abs_z_at_most_l1_and_inverse_of_the_closed_form():
    rng = np.random.default_rng(0)
    z = rng.normal(size=2000)
    n = rng.random(2000) * 5
    alpha, beta, l1, l2 = 0.5, 1.0, 0.8, 0.3
    w = np.empty_like(z)
    nnz = K.ftrl_weights(z, n, alpha, beta, l1, l2, w)
    small = np.abs(z) <= l1
    assert np.all(w[small] == 0.0) and np.all(w[~small] != 0.0) and nnz == np.count_nonzero(~small)
    assert K.ftrl_nnz(z, n, alpha, beta, l1, l2) == nnz
    assert np.all(np.sign(w[~small]) == -np.sign(z[~small]))
    np.testing.assert_allclose(w[~small], -(z - np.sign(z) * l1)[~small] / ((beta + np.sqrt(n[~small])) / alpha + l2),
                               rtol=1e-15)
    # the inverse: non-zero weights come back (to rounding), zero weights keep z clipped into [-l1, l1]
    z2 = np.empty_like(z)
    K.ftrl_z_from_weights(w, n, z, alpha, beta, l1, l2, z2)
    w2 = np.empty_like(z)
    K.ftrl_weights(z2, n, alpha, beta, l1, l2, w2)
    np.testing.assert_allclose(w2, w, rtol=1e-13, atol=0)
    assert np.all((w2 == 0) == (w == 0))
    np.testing.assert_array_equal(z2[small], np.clip(z[small], -l1, l1))
    np.testing.assert_array_equal(z2[~small], -w[~small] * ((beta + np.sqrt(n[~small])) / alpha + l2)
                                  - np.sign(w[~small]) * l1)


def test_warm_start_reproduces_the_given_weights():
    algo = make_algorithm("ftrl", OPTS)
    w = np.array([0.0, 1.5, -0.25, 0.0, 3.0])
    st = algo.warm_start(algo.init_path(7, 0), w, -0.4)
    got, bias = algo.weights({"z": st["z"], "n": st["n"], "fstate": st["fstate"]})
    np.testing.assert_allclose(got[:5], w, rtol=1e-14)
    assert np.all(got[[0, 3, 5, 6]] == 0.0) and bias == pytest.approx(-0.4, rel=1e-14)


# ------------------------------------------------------------------------------------------- engine

@pytest.mark.parametrize("mix", ["zn", "w"])
def test_two_passes_saved_and_resumed_for_three_equals_five(mix, store, tmp_path, client):
    opts = {**OPTS, "mix": mix}
    full = fit(store, "ftrl", opts, passes=5, paths=2, seed=3, client=client)
    part = fit(store, "ftrl", opts, passes=2, paths=2, seed=3, client=client)
    part.save(tmp_path / "m.npz")
    back = fit(store, "ftrl", opts, passes=3, paths=2, seed=3, client=client, init_model=load_model(tmp_path / "m.npz"))
    assert back.meta["provenance"]["resumed"] and back.meta["passes"] == 5
    np.testing.assert_array_equal(back.dense_weights(), full.dense_weights())
    assert back.bias == full.bias and 0 < full.nnz < full.n_features
    for a, b in zip(back.states, full.states):
        for k in ("z", "n", "fstate", "istate"):
            np.testing.assert_array_equal(a[k], b[k])


def test_same_weights_with_one_or_two_workers(store, client, one_worker_client):
    for mix in ("zn", "w"):
        a = fit(store, "ftrl", {**OPTS, "mix": mix}, passes=2, paths=2, seed=5, client=client)
        b = fit(store, "ftrl", {**OPTS, "mix": mix}, passes=2, paths=2, seed=5, client=one_worker_client)
        c = fit(store, "ftrl", {**OPTS, "mix": mix}, passes=2, paths=2, seed=5, client=None)
        np.testing.assert_array_equal(a.dense_weights(), b.dense_weights(), err_msg=mix)
        np.testing.assert_array_equal(a.dense_weights(), c.dense_weights(), err_msg=mix)
        assert a.bias == b.bias == c.bias and a.nnz > 0


def test_both_mixes_learn_and_the_model_is_the_closed_form_of_the_mixed_state(store):
    errs = {}
    for mix in ("zn", "w"):
        m = fit(store, "ftrl", {**OPTS, "mix": mix}, passes=3, paths=2, seed=1, client=None)
        errs[mix] = m.meta["holdout"]["error"]
        w = m.dense_weights()
        assert 0 < m.nnz < m.n_features
        algo = make_algorithm("ftrl", OPTS)     # its weights() is the closed form of a (z, n, fstate)
        for s in m.states:
            ws, b = algo.weights({"z": s["z"], "n": s["n"], "fstate": s["fstate"]})
            if mix == "zn":     # every path holds the averaged (z, n): the model is exactly its closed form
                np.testing.assert_array_equal(ws, w)
                assert b == m.bias
                assert np.all(w[np.abs(s["z"]) <= OPTS["l1"]] == 0.0)
            else:               # each path's own (z, n) reproduces the averaged weights up to rounding
                # (z = −w·D − sgn(w)·l1 rounds at the scale of l1: absolute error ~ ulp(l1) / D)
                np.testing.assert_allclose(ws, w, rtol=1e-12, atol=1e-15)
                assert np.array_equal(ws == 0, w == 0) and b == pytest.approx(m.bias, rel=1e-12)
        if mix == "w":
            assert not np.array_equal(m.states[0]["n"], m.states[1]["n"])
    assert errs["zn"] < 0.3 and errs["w"] < 0.3, errs     # chance: 0.46


def test_warm_start_from_another_algorithm(store, tmp_path):
    tg = fit(store, "tg", {"eta": 0.5, "gravity": 1e-4}, passes=1, paths=1, seed=0, client=None)
    m = fit(store, "ftrl", {}, passes=1, paths=1, seed=0, client=None, init_model=tg)   # the defaults
    assert not m.meta["provenance"]["resumed"] and 0 < m.nnz < m.n_features


def test_options_are_validated():
    for bad, word in [({"alpha": 0}, "alpha must be finite and > 0"), ({"beta": -1.0}, "beta must"),
                      ({"l1": -0.1}, "l1 must be finite and >= 0"), ({"l2": math.nan}, "l2 must"),
                      ({"mix": "avg"}, "mix must be one of zn, w"), ({"loss": "huber"}, "loss must be one of"),
                      ({"gamma": 1.0}, "unknown option")]:
        with pytest.raises(ValueError, match=word):
            make_algorithm("ftrl", bad)


M64 = (1 << 64) - 1


def uniform_ref(a, b, c):
    """splitmix64's finaliser of a·φ ^ b·C1 ^ c·C2 (Python integers), the reference of ``K.uniform_hash``."""
    x = ((a * 0x9E3779B97F4A7C15) ^ (b * 0xBF58476D1CE4E5B9) ^ (c * 0x94D049BB133111EB)) & M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    x ^= x >> 31
    return (x >> 11) / 2.0 ** 53


def test_poisson_inclusion_equals_its_dense_reference_and_keeps_features_out():
    """inclusion_p (the paper's §4.2): a coordinate with z = n = 0 takes a row's update only when its draw
    uniform(salt, t, j) < p; the kernel equals Algorithm 1 with that gate, and fewer coordinates enter."""
    X, y = random_csr(n=80, d=60, density=0.2, seed=5)
    rows = np.random.default_rng(2).permutation(np.tile(np.arange(80), 2)).astype(np.int64)
    alpha, beta, l1, l2, p, salt = 0.7, 1.0, 0.1, 0.2, 0.3, 11
    assert all(math.isclose(float(K.uniform_hash(salt, t, j)), uniform_ref(salt, t, j), rel_tol=0, abs_tol=0)
               for t in (1, 7, 99) for j in (0, 5, 59))
    z, n, ist, fst = K.new_ftrl_state(60)
    K.ftrl_block(X.indptr.astype(np.int64), X.indices, X.data, y, rows, z, n, ist, fst, alpha, beta, l1, l2,
                 LOSS_CODES["logistic"], False, True, 1, 0, p, salt)
    D = X.toarray()
    zr, nr, zb, nb = np.zeros(60), np.zeros(60), 0.0, 0.0
    for t, i in enumerate(rows, start=1):
        w = np.where(np.abs(zr) <= l1, 0.0, -(zr - np.sign(zr) * l1) / ((beta + np.sqrt(nr)) / alpha + l2))
        b = -zb / ((beta + math.sqrt(nb)) / alpha)
        f = float(w @ D[i]) + b
        d = 1.0 / (1.0 + math.exp(-f)) - (y[i] + 1) / 2
        for j in X.indices[X.indptr[i]:X.indptr[i + 1]]:
            if nr[j] == 0.0 and zr[j] == 0.0 and uniform_ref(salt, t, int(j)) >= p:
                continue
            g = d * D[i, j]
            sig = (math.sqrt(nr[j] + g * g) - math.sqrt(nr[j])) / alpha
            zr[j], nr[j] = zr[j] + g - sig * w[j], nr[j] + g * g
        sig = (math.sqrt(nb + d * d) - math.sqrt(nb)) / alpha
        zb, nb = zb + d - sig * b, nb + d * d
    np.testing.assert_allclose(z, zr, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(n, nr, rtol=1e-12, atol=1e-12)
    gated, full = K.new_ftrl_state(60), K.new_ftrl_state(60)
    for state, q in ((gated, p), (full, 1.0)):  # over the first 20 rows, fewer coordinates enter the model
        K.ftrl_block(X.indptr.astype(np.int64), X.indices, X.data, y, rows[:20], *state, alpha, beta, l1, l2,
                     LOSS_CODES["logistic"], False, True, 1, 0, q, salt)
    assert 0 < np.count_nonzero(gated[1]) < np.count_nonzero(full[1])


def test_rounding_for_memory_is_an_unbiased_grid_and_the_options_resume_on_any_executor(store, client, tmp_path):
    """round_bits (the paper's §4.3): the model's weights on the 2^-bits grid, within one step of the exact ones
    and unbiased over draws; with both options a run is the same on threads and on 1 or 2 workers, and 2 + 3
    passes equal 5."""
    w = np.random.default_rng(0).normal(size=20000) * 0.01
    out = np.empty_like(w)
    K.round_to_grid(w, 6, 3, out)
    step = 2.0 ** -6
    assert np.all(np.abs(out - w) < step) and np.all(out * 64 == np.round(out * 64))
    assert abs(float(np.mean(out - w))) < 4 * step / math.sqrt(w.size)  # unbiased: E[out] = w
    opts = {**OPTS, "inclusion_p": 0.5, "round_bits": 10, "draw_seed": 4}
    exact = fit(store, "ftrl", {**OPTS, "inclusion_p": 0.5, "draw_seed": 4}, passes=2, paths=2, seed=3, client=None)
    a = fit(store, "ftrl", opts, passes=2, paths=2, seed=3, client=None)
    b = fit(store, "ftrl", opts, passes=2, paths=2, seed=3, client=client)
    wa, we = a.dense_weights(), exact.dense_weights()
    np.testing.assert_array_equal(wa, b.dense_weights())
    assert np.all(wa * 1024 == np.round(wa * 1024)) and np.all(np.abs(wa - we) < 2.0 ** -10)
    full = fit(store, "ftrl", opts, passes=5, paths=2, seed=3, client=client)
    a.save(tmp_path / "m.npz")
    back = fit(store, "ftrl", opts, passes=3, paths=2, seed=3, client=client, init_model=load_model(tmp_path / "m.npz"))
    assert back.meta["provenance"]["resumed"]
    np.testing.assert_array_equal(back.dense_weights(), full.dense_weights())
