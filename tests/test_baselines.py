"""Baselines of the ECML study: SMIDAS, SCD, GraDes, RDA, FOBOS (ALGORITHMS.md §2, §5, §7 items 15-17)."""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.algorithms.grades import spectral_radius
from pipeline.kernels import ecml as K
from pipeline.kernels import rda as R
from pipeline.kernels.losses import LOGISTIC
from pipeline.model import load_model
from pipeline.store.reader import open_store
from pipeline.train import fit
from tests.test_nssl import random_csr, store  # noqa: F401  (shared dexter store fixture)

RUNS = {
    "smidas": ({"eta": 0.5, "lam": 1e-5, "c": 0.5}, 2),
    "scd": ({"lam": 1e-4, "scan": 0.5}, 1),
    "grades": ({"gamma": 100.0, "s": 300}, 2),
    "rda": ({"lam": 1e-4, "gamma": 500.0}, 2),
    "fobos": ({"lam": 1e-4}, 2),
}


def sigmoid_dloss(f, y):
    return -y / (1.0 + math.exp(y * f))


def train_matrix(store):
    st = open_store(store)
    blocks = [st.block(e) for e in st.entries("train")]
    return sp.vstack([b.X for b in blocks]).astype(np.float64).tocsr(), np.concatenate([b.y for b in blocks])


# ------------------------------------------------------------------------------------------- SMIDAS

def test_smidas_kernel_matches_naive_numpy_reference():
    X, y = random_csr()
    d, p, eta, lam = X.shape[1], 4.0, 0.3, 0.01
    theta, active = np.zeros(d), np.zeros(d, dtype=np.int64)
    ist, fst = np.zeros(2, dtype=np.int64), np.zeros(2)
    rows = np.tile(np.arange(X.shape[0]), 2)
    K.smidas_block(X.indptr.astype(np.int64), X.indices, X.data, y, rows, theta, active, ist, fst, eta, lam, p,
                   LOGISTIC, False)
    ref = np.zeros(d)
    D = X.toarray()
    for i in rows:                                      # (E-4)-(E-6), dense and naive
        nrm = np.sum(np.abs(ref) ** p) ** (1 / p)
        w = np.sign(ref) * np.abs(ref) ** (p - 1) / nrm ** (p - 2) if nrm > 0 else np.zeros(d)
        t = ref - eta * sigmoid_dloss(float(D[i] @ w), y[i]) * D[i]
        ref = np.sign(t) * np.maximum(np.abs(t) - eta * lam, 0.0)
    np.testing.assert_allclose(theta, ref, rtol=1e-10, atol=1e-14)
    assert ist[1] == rows.size and sorted(active[:ist[0]]) == list(np.flatnonzero(theta))
    w = np.empty(d)
    K.smidas_weights(theta, p, w)
    nrm = np.sum(np.abs(ref) ** p) ** (1 / p)
    np.testing.assert_allclose(w, np.sign(ref) * np.abs(ref) ** (p - 1) / nrm ** (p - 2), rtol=1e-12)


def test_smidas_link_is_stable_where_the_naive_formula_overflows():
    theta = np.array([1e200, -3e199, 1e-100, 0.0])
    w = np.empty(4)
    K.smidas_weights(theta, 30.0, w)
    assert np.all(np.isfinite(w)) and w[0] > 0 > w[1] and w[3] == 0
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.sum(np.abs(theta) ** 30.0))
    assert K.exponent_stats(np.array([1.0, 2.0 ** -60, 0.0]))["within52"] == 0.5


# ------------------------------------------------------------------------------------------- SCD

def test_scd_kernel_matches_reference_and_objective_never_increases():
    X, y = random_csr(n=40, d=15, density=0.4, seed=1)
    C = X.tocsc()
    lam, beta = 0.01, 0.25
    w, z = np.zeros(15), np.zeros(40)
    ref_w = np.zeros(15)
    coords = np.random.default_rng(2).integers(0, 15, size=60)

    def objective(w):
        m = y * (X @ w)
        return np.mean(np.maximum(-m, 0) + np.log1p(np.exp(-np.abs(m)))) + lam * np.abs(w).sum()

    objs = [objective(w)]
    for j in coords:
        K.scd_steps(C.indptr.astype(np.int64), C.indices.astype(np.int64), C.data, y, z, w, np.array([j]), beta,
                    lam, LOGISTIC)
        f = X @ ref_w                                   # (E-7)-(E-8) from scratch
        g = np.mean([sigmoid_dloss(f[i], y[i]) * X[i, j] for i in range(40)])
        u = ref_w[j] - g / beta
        ref_w[j] = np.sign(u) * max(abs(u) - lam / beta, 0.0)
        objs.append(objective(w))
    np.testing.assert_allclose(w, ref_w, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(z, X @ w, atol=1e-12)
    assert np.all(np.diff(objs) <= 1e-15) and objs[-1] < objs[0]


def test_scd_cached_margins_equal_Xw_after_a_run(store):
    m = fit(store, "scd", {"lam": 1e-4}, passes=4, paths=1, client=None)
    X, _ = train_matrix(store)
    z = m.states[0]["z"]
    assert z.shape == (X.shape[0],) and not any(k.startswith("_blk") for k in m.states[0])
    # z is in the cache's canonical row order: compare as sorted vectors (a row permutation of X @ w)
    assert np.max(np.abs(np.sort(z) - np.sort(X @ m.dense_weights()))) < 1e-9
    objs = [h["objective"] for h in m.meta["history"]]
    assert np.all(np.diff(objs) <= 0) and m.nnz > 0


# ------------------------------------------------------------------------------------------- GraDes

def test_grades_block_kernel_and_hard_threshold():
    X, y = random_csr(seed=4)
    w = np.random.default_rng(0).normal(size=X.shape[1])
    g, fst = np.zeros(X.shape[1]), np.zeros(1)
    K.grades_block(X.indptr.astype(np.int64), X.indices, X.data, y, np.arange(X.shape[0], dtype=np.int64), w, g,
                   fst)
    r = y - X @ w
    np.testing.assert_allclose(g, X.T @ r, rtol=1e-12, atol=1e-12)
    assert np.isclose(fst[0], 0.5 * r @ r)
    np.testing.assert_array_equal(K.hard_threshold(np.array([1.0, -3.0, 3.0, 0.5]), 2), [0.0, -3.0, 3.0, 0.0])
    np.testing.assert_array_equal(K.hard_threshold(np.array([2.0, -2.0, 2.0]), 2), [2.0, -2.0, 0.0])


def test_grades_equals_dense_iteration_and_records_psi(store):
    gamma, s = 100.0, 300
    m = fit(store, "grades", {"gamma": gamma, "s": s}, passes=4, paths=1, client=None)
    X, y = train_matrix(store)
    w, psi = np.zeros(X.shape[1]), []
    for _ in range(4):
        r = y - X @ w
        psi.append(0.5 * r @ r)
        w = K.hard_threshold(w + X.T @ r / gamma, s)
    np.testing.assert_allclose(m.dense_weights(), w, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(m.gstate["psi"], psi, rtol=1e-9)
    assert m.nnz == s


def test_grades_diverges_for_small_gamma_and_radius_matches_eigenvalues(store):
    m = fit(store, "grades", {"gamma": 0.01, "s": 500}, passes=6, paths=1, client=None)
    psi = np.asarray(m.gstate["psi"])
    assert np.all(np.diff(np.log10(psi[1:])) > 0.5)            # exponential growth of Ψ
    A = random_csr(n=20, d=8, density=0.6, seed=7)[0]
    ev = np.linalg.eigvalsh((A.T @ A).toarray())
    est = spectral_radius(A, 3.0, iters=500)
    assert np.isclose(est["lambda_max"], ev[-1], rtol=1e-6)
    assert np.isclose(est["rho"], max(abs(1 - ev[-1] / 3), abs(1 - ev[0] / 3)), rtol=1e-4)


# ------------------------------------------------------------------------------------------- RDA / FOBOS

def test_rda_kernel_matches_reference():
    X, y = random_csr(seed=6)
    lam, gamma, rho = 0.01, 5.0, 0.005
    G, ist, fst = np.zeros(X.shape[1]), np.zeros(1, dtype=np.int64), np.zeros(1)
    rows = np.tile(np.arange(X.shape[0]), 2)
    R.rda_block(X.indptr.astype(np.int64), X.indices, X.data, y, rows, G, ist, fst, lam, gamma, rho, LOGISTIC,
                False, False)
    D, Gr = X.toarray(), np.zeros(X.shape[1])

    def wref(Gs, t):
        if t == 0:
            return np.zeros_like(Gs)
        gb, lt = Gs / t, lam + gamma * rho / math.sqrt(t)
        return np.where(np.abs(gb) <= lt, 0.0, -(math.sqrt(t) / gamma) * (gb - lt * np.sign(gb)))

    for t, i in enumerate(rows):
        Gr += sigmoid_dloss(float(D[i] @ wref(Gr, t)), y[i]) * D[i]
    np.testing.assert_allclose(G, Gr, rtol=1e-12, atol=1e-14)
    w = np.empty_like(G)
    R.rda_weights(G, int(ist[0]), lam, gamma, rho, w)
    np.testing.assert_allclose(w, wref(Gr, rows.size), rtol=1e-12, atol=1e-15)
    assert np.count_nonzero(w) < w.size


def test_fobos_is_tg_with_k1_and_gravity_lambda(store):
    a = fit(store, "fobos", {"eta": 0.5, "lam": 1e-4}, passes=2, paths=2, seed=1, client=None)
    b = fit(store, "tg", {"eta": 0.5, "gravity": 1e-4, "K": 1, "schedule": "sqrt"}, passes=2, paths=2, seed=1,
            client=None)
    np.testing.assert_array_equal(a.dense_weights(), b.dense_weights())
    assert a.meta["hyper"]["lam"] == 1e-4 and a.nnz < a.n_features


# ------------------------------------------------------------------------------------------- engine contract

def test_same_weights_with_one_or_two_workers(store, client, one_worker_client):
    refs = {a: fit(store, a, o, passes=2, paths=n, seed=5, client=client) for a, (o, n) in RUNS.items()}
    for a, (o, n) in RUNS.items():
        m = fit(store, a, o, passes=2, paths=n, seed=5, client=one_worker_client)
        np.testing.assert_array_equal(m.dense_weights(), refs[a].dense_weights(), err_msg=a)
        assert m.bias == refs[a].bias and refs[a].nnz > 0


@pytest.mark.parametrize("algo", list(RUNS))
def test_two_passes_saved_and_resumed_for_three_equals_five(algo, store, tmp_path, client):
    opts, n = RUNS[algo]
    full = fit(store, algo, opts, passes=5, paths=n, seed=3, client=client)
    part = fit(store, algo, opts, passes=2, paths=n, seed=3, client=client)
    part.save(tmp_path / "m.npz")
    back = fit(store, algo, opts, passes=3, paths=n, seed=3, client=client, init_model=load_model(tmp_path / "m.npz"))
    assert back.meta["provenance"]["resumed"] and back.meta["passes"] == 5
    np.testing.assert_array_equal(back.dense_weights(), full.dense_weights())
    assert back.bias == full.bias


def test_options_are_validated():
    from pipeline.algorithms import make_algorithm

    for algo, bad, word in [("smidas", {"p": 1.5}, "p must"), ("scd", {"loss": "hinge"}, "smooth"),
                            ("grades", {"gamma": 0}, "gamma"), ("rda", {"lam": -1}, "lam"),
                            ("fobos", {"schedule": "x"}, "schedule")]:
        with pytest.raises(ValueError, match=word):
            make_algorithm(algo, bad)
    with pytest.raises(ValueError, match="one path"):
        make_algorithm("scd", {}).init_path(10, 1)
