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
from tests.conftest import ingest_shared
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

def scd_reference_run(X, y, coords, lam, beta_j, w0):
    """Pure-NumPy (E-7)-(E-8) from scratch, with a per-coordinate curvature β_j (an empty column: w_j = 0)."""
    w = w0.copy()
    D = X.toarray()
    for j in coords:
        if beta_j[j] <= 0:
            w[j] = 0.0 if lam > 0 else w[j]
            continue
        f = D @ w
        g = np.mean([sigmoid_dloss(f[i], y[i]) * D[i, j] for i in range(D.shape[0])])
        u = w[j] - g / beta_j[j]
        w[j] = np.sign(u) * max(abs(u) - lam / beta_j[j], 0.0)
    return w


def logistic_objective(X, y, w, lam):
    m = y * (X @ w)
    return np.mean(np.maximum(-m, 0) + np.log1p(np.exp(-np.abs(m)))) + lam * np.abs(w).sum()


@pytest.mark.parametrize("curvature, scale", [("paper", 1.0), ("column", 1.0), ("column", 30.0)])
def test_scd_kernel_matches_reference_and_objective_never_increases(curvature, scale):
    X, y = random_csr(n=40, d=15, density=0.4, seed=1)
    keep = np.ones(15)
    keep[7] = 0.0                                       # column 7 empty, with a warm non-zero weight below
    X = sp.csr_matrix(X @ sp.diags(scale * keep))       # scale 30: |x_ij| ≫ 1, like dexter's raw counts
    X.eliminate_zeros()
    C = X.tocsc()
    lam = 0.01
    cindptr, rowidx = C.indptr.astype(np.int64), C.indices.astype(np.int64)
    if curvature == "column":
        beta_j = np.empty(15)
        K.column_curvature(cindptr, C.data, 40, 0.25, beta_j)
        np.testing.assert_allclose(beta_j, 0.25 * np.mean(X.toarray() ** 2, axis=0), rtol=1e-13, atol=0)
        assert beta_j[7] == 0.0
    else:
        beta_j = np.full(15, 0.25)
    w0 = np.zeros(15)
    w0[7] = 0.5
    w, z = w0.copy(), X @ w0
    coords = np.random.default_rng(2).integers(0, 15, size=60)
    objs = [logistic_objective(X, y, w, lam)]
    for j in coords:
        K.scd_steps(cindptr, rowidx, C.data, y, z, w, np.array([j]), beta_j, lam, LOGISTIC)
        objs.append(logistic_objective(X, y, w, lam))
    np.testing.assert_allclose(w, scd_reference_run(X, y, coords, lam, beta_j, w0), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(z, X @ w, atol=1e-12 * scale)
    assert np.all(np.diff(objs) <= 1e-15) and objs[-1] < objs[0]


def test_scd_paper_step_can_increase_the_objective_when_features_exceed_one():
    """Why β_j = β·mean x_ij² is the default: with |x_ij| > 1 the paper's β is no bound and SCD overshoots."""
    X, y = random_csr(n=40, d=15, density=0.4, seed=1)
    X = sp.csr_matrix(X.multiply(30.0))
    C = X.tocsc()
    coords = np.random.default_rng(2).integers(0, 15, size=60)
    final = {}
    for curvature in ("paper", "column"):
        beta_j = np.full(15, 0.25)
        if curvature == "column":
            K.column_curvature(C.indptr.astype(np.int64), C.data, 40, 0.25, beta_j)
        w, z = np.zeros(15), np.zeros(40)
        objs = [logistic_objective(X, y, w, 0.01)]
        for j in coords:
            K.scd_steps(C.indptr.astype(np.int64), C.indices.astype(np.int64), C.data, y, z, w, np.array([j]), beta_j,
                        0.01, LOGISTIC)
            objs.append(logistic_objective(X, y, w, 0.01))
        final[curvature] = (np.max(np.diff(objs)), objs[-1])
    assert final["paper"][0] > 0 and final["column"][0] <= 1e-15 and final["column"][1] < final["paper"][1]


def test_scd_column_copy_does_not_depend_on_row_order_or_grouping():
    from pipeline.algorithms.scd import column_copy, row_hashes

    X, y = random_csr(n=30, d=12, density=0.3, seed=3)
    X = sp.vstack([X, X[:2], sp.csr_matrix((1, 12))]).tocsr()       # duplicated rows and an empty row
    y = np.concatenate([y, y[:2], [1.0]])

    def blocks(order, cuts):
        Z, z = X[order], y[order]
        return [(Z[a:b].indptr.astype(np.int64), Z[a:b].indices, Z[a:b].data, z[a:b])
                for a, b in zip([0, *cuts], [*cuts, len(order)])]

    ref = column_copy(blocks(np.arange(33), [10]), 12)
    other = column_copy(blocks(np.random.default_rng(4).permutation(33), [5, 21]), 12)
    for a, b in zip(ref, other):
        np.testing.assert_array_equal(a, b)
    h = row_hashes(X.indptr, X.indices, X.data, y)
    rows = {(tuple(X[i].indices), tuple(X[i].data), y[i]) for i in range(33)}
    assert len({tuple(r) for r in h}) == len(rows) and tuple(h[0]) == tuple(h[30])  # equal only for equal rows
    np.testing.assert_allclose(ref[4], np.mean(X.toarray() ** 2, axis=0), rtol=1e-13)


def test_scd_cached_margins_equal_Xw_after_a_run(store):
    m = fit(store, "scd", {"lam": 1e-4}, passes=4, paths=1, client=None)
    X, _ = train_matrix(store)
    z = m.states[0]["z"]
    assert z.shape == (X.shape[0],) and not any(k.startswith("_blk") for k in m.states[0])
    # z is in the cache's canonical row order: compare as sorted vectors (a row permutation of X @ w)
    assert np.max(np.abs(np.sort(z) - np.sort(X @ m.dense_weights()))) < 1e-9
    objs = [h["objective"] for h in m.meta["history"]]
    assert np.all(np.diff(objs) <= 0) and m.nnz > 0


def test_scd_collects_every_block_when_the_pass_has_several_block_groups(tmp_path_factory, client):
    """The engine hands a pass's blocks in groups (the shuffle window) decoded into arrays it reuses: SCD must keep
    copies. With views, every collected block held the last group's entries (on this store z was off by 9.1)."""
    many = ingest_shared(tmp_path_factory, client, "dexter/dexter_train.svm", "scd_groups", block_mb=0.01,
                         holdout=0.2)
    assert len(open_store(many).entries("train")) > 8  # more than two groups of the default window (4 blocks)
    m = fit(many, "scd", {"lam": 1e-4}, passes=2, paths=1, client=None)
    X, _ = train_matrix(many)
    z = m.states[0]["z"]
    assert z.shape == (X.shape[0],)
    assert np.max(np.abs(np.sort(z) - np.sort(X @ m.dense_weights()))) < 1e-9


def test_scd_column_curvature_beats_the_paper_step_on_raw_counts(store):
    """dexter holds raw counts (|x_ij| up to hundreds): with the paper's β = 1/4 SCD barely moves; the per-column
    bound reaches a lower objective in the same scans and still never increases it."""
    objs = {}
    for curvature in ("paper", "column"):
        m = fit(store, "scd", {"lam": 1e-3, "scan": 0.5, "curvature": curvature}, passes=3, paths=1, client=None,
                evaluate=False)
        objs[curvature] = [h["objective"] for h in m.meta["history"]]
    assert np.all(np.diff(objs["column"]) <= 0)
    assert objs["column"][-1] < 0.1 * objs["paper"][-1]


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


def test_fobos_literal_scale_is_the_literal_tg_and_the_default_records_its_resolved_steps(store):
    """``scale = "none"``, ``bias_adagrad = false``: η and λ as given (the literal FOBOS of ALGORITHMS.md §2, i.e. the
    literal TG with K = 1, θ = ∞, which tests/test_engine.py checks against its NumPy reference); the data-scaled
    default differs from it and saves the η and λ it ran with."""
    lit = {"scale": "none", "bias_adagrad": False}
    a = fit(store, "fobos", {"eta": 0.5, "lam": 1e-2, **lit}, passes=2, paths=1, seed=1, client=None)
    b = fit(store, "tg", {"eta": 0.5, "gravity": 1e-2, "K": 1, "schedule": "sqrt", **lit}, passes=2, paths=1, seed=1,
            client=None)
    np.testing.assert_array_equal(a.dense_weights(), b.dense_weights())
    assert a.bias == b.bias and "resolved" not in a.meta["hyper"]
    d = fit(store, "fobos", {"eta": 0.5, "lam": 1e-2}, passes=2, paths=1, seed=1, client=None)
    r = d.meta["hyper"]["resolved"]
    assert r["eta"] != 0.5 and r["lam"] != 1e-2 and not np.array_equal(d.dense_weights(), a.dense_weights())


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

    for algo, bad, word in [("smidas", {"p": 1.5}, "p must"), ("scd", {"loss": "hinge"}, "smooth"), ("scd", {"curvature": "max"}, "curvature"),
                            ("grades", {"gamma": 0}, "gamma"), ("rda", {"lam": -1}, "lam"),
                            ("fobos", {"schedule": "x"}, "schedule"), ("fobos", {"scale": "x"}, "scale")]:
        with pytest.raises(ValueError, match=word):
            make_algorithm(algo, bad)
    with pytest.raises(ValueError, match="one path"):
        make_algorithm("scd", {}).init_path(10, 1)


def test_scd_refuses_stage_blocks(store):  # noqa: F811
    with pytest.raises(ValueError, match=r"--stage-blocks: --algo scd runs whole passes"):
        fit(store, "scd", {}, passes=1, paths=1, stage_blocks=1)


@pytest.mark.parametrize("algo", sorted(__import__("pipeline.algorithms", fromlist=["ALGORITHMS"]).ALGORITHMS))
def test_a_store_of_labels_without_features_gives_a_bias_only_model(algo, tmp_path):
    """Rows with a label and no feature (a store 0 columns wide): every algorithm returns a model with no
    non-zero weight instead of failing inside its kernel (SCD drew coordinates from an empty range)."""
    from pipeline.ingest import ingest

    (tmp_path / "z.svm").write_text("1\n-1\n1\n1\n")
    ingest([str(tmp_path / "z.svm")], str(tmp_path / "z.zarr"))
    m = fit(str(tmp_path / "z.zarr"), algo, {}, passes=1, paths=1, evaluate=False)
    assert m.n_features == 0 and m.nnz == 0 and math.isfinite(m.bias)
