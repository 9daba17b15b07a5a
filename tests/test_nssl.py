"""nssl (ECML 2010 soft-thresholded perceptron, ALGORITHMS.md §5 and §7 item 14)."""
import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.kernels import ecml as K
from pipeline.model import load_model
from pipeline.train import fit
from tests.conftest import ingest_shared

OPTS = {"eta": 0.2, "tau": 0.01, "lam": 1e-3}


@pytest.fixture(scope="module")
def store(tmp_path_factory, client):
    return ingest_shared(tmp_path_factory, client, "dexter/dexter_train.svm", "nssl", block_mb=0.05, holdout=0.2)


def random_csr(n=40, d=30, density=0.2, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, random_state=rng, format="csr", dtype=np.float64)
    X.data = rng.normal(size=X.data.shape)
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return X, y


def reference(X, y, rows, w, eta, tau, a):
    """Pure-NumPy (E-1)–(E-3); the dot product is summed left to right like the kernel."""
    w = w.copy()
    for i in rows:
        lo, hi = X.indptr[i], X.indptr[i + 1]
        idx, val = X.indices[lo:hi], X.data[lo:hi]
        f = 0.0
        for j, v in zip(idx, val):
            f += w[j] * v
        if y[i] * f <= tau:
            u = w[idx] + eta * y[i] * val
            w[idx] = np.sign(u) * np.maximum(np.abs(u) - a, 0.0)
    return w


def run(X, y, rows, w, eta, tau, a, max_nnz=10**9):
    ist = np.array([0, np.count_nonzero(w), 0], dtype=np.int64)
    used = K.nssl_block(X.indptr.astype(np.int64), X.indices, X.data, y, np.asarray(rows, dtype=np.int64), w,
                        ist, eta, tau, a, max_nnz)
    return used, ist


@pytest.mark.parametrize("tau,a", [(0.01, 1e-3), (0.1, 0.05), (0.5, 0.0)])
def test_kernel_matches_numpy_reference(tau, a):
    X, y = random_csr()
    rows = np.random.default_rng(1).permutation(np.tile(np.arange(X.shape[0]), 3))
    w = np.zeros(X.shape[1])
    used, ist = run(X, y, rows, w, 0.3, tau, a)
    np.testing.assert_allclose(w, reference(X, y, rows, np.zeros(X.shape[1]), 0.3, tau, a), rtol=1e-13, atol=0)
    assert used == rows.size and ist[1] == np.count_nonzero(w) and ist[2] == rows.size


def test_margin_gate_and_only_the_examples_coordinates_change():
    X = sp.csr_matrix(np.array([[1.0, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, 0.0]]))
    y = np.array([1.0, -1.0])
    w = np.array([0.3, 0.7, 0.1, -0.4])          # margin of row 0 = 0.5 > τ: no update
    before = w.copy()
    run(X, y, [0], w, 0.5, 0.4, 0.01)
    np.testing.assert_array_equal(w, before)
    run(X, y, [0], w, 0.5, 0.5, 0.01)              # margin 0.5 ≤ τ = 0.5: update of columns 0 and 2 only
    changed = np.flatnonzero(w != before)
    assert set(changed) == {0, 2}
    np.testing.assert_allclose(w[[0, 2]], [0.3 + 0.5 - 0.01, 0.1 + 1.0 - 0.01])


def test_soft_threshold_gives_exact_zeros():
    X, y = random_csr(d=50, seed=3)
    w = np.zeros(X.shape[1])
    _, ist = run(X, y, np.arange(X.shape[0]), w, 0.1, 0.01, 0.5)     # λ above every step: all exactly 0
    assert np.all(w == 0) and not np.any(np.signbit(w)) and ist[0] > 0 and ist[1] == 0
    w = np.zeros(X.shape[1])
    _, ist = run(X, y, np.arange(X.shape[0]), w, 0.1, 0.01, 0.05)
    assert 0 < ist[1] == np.count_nonzero(w) < X.shape[1]


def test_lambda_tau_zero_is_the_classic_perceptron():
    X, y = random_csr(n=60, seed=5)
    rows = np.tile(np.arange(60), 4)
    w = np.zeros(X.shape[1])
    run(X, y, rows, w, 0.7, 0.0, 0.0)
    ref = np.zeros(X.shape[1])
    D = X.toarray()
    for i in rows:
        f = 0.0
        for j in X.indices[X.indptr[i]:X.indptr[i + 1]]:
            f += ref[j] * D[i, j]
        if y[i] * f <= 0:
            ref += 0.7 * y[i] * D[i]
    np.testing.assert_allclose(w, ref, rtol=1e-13, atol=1e-15)


def test_kernel_stops_at_the_density_bound():
    X, y = random_csr(n=80, d=40, density=0.3, seed=2)
    w = np.zeros(40)
    used, ist = run(X, y, np.arange(80), w, 0.5, 0.01, 1e-4, max_nnz=10)
    assert used < 80 and ist[1] >= 10 and ist[2] == used


def test_density_stop_in_training(store, client):
    m = fit(store, "nssl", {**OPTS, "density_bound": 0.05}, passes=10, paths=1, seed=1, client=client)
    assert m.meta["history"][-1]["bound_hit"] == 1.0 and m.meta["passes"] < 10
    assert 0.05 <= m.density < 0.06
    e = fit(store, "nssl", OPTS, passes=10, paths=1, seed=1, client=client, max_density=0.152)
    assert 0.14 < e.density <= 0.152 and e.meta["stopped"] == "max_density"


def test_same_weights_with_one_or_two_workers(store, client, one_worker_client):
    ref = fit(store, "nssl", OPTS, passes=3, paths=2, seed=4, client=client)
    one_w = fit(store, "nssl", OPTS, passes=3, paths=2, seed=4, client=one_worker_client)
    single = fit(store, "nssl", OPTS, passes=3, paths=2, seed=4, client=client, placement="single")
    for m in (one_w, single):
        np.testing.assert_array_equal(m.dense_weights(), ref.dense_weights())
    assert ref.nnz > 0


def test_two_passes_saved_and_resumed_for_three_equals_five(store, tmp_path, client):
    opts = {**OPTS, "shrink": "eta_lambda"}
    full = fit(store, "nssl", opts, passes=5, paths=2, seed=3, client=client)
    part = fit(store, "nssl", opts, passes=2, paths=2, seed=3, client=client)
    part.save(tmp_path / "m.npz")
    back = fit(store, "nssl", opts, passes=3, paths=2, seed=3, client=client, init_model=load_model(tmp_path / "m.npz"))
    assert back.meta["provenance"]["resumed"] and back.meta["passes"] == 5
    np.testing.assert_array_equal(back.dense_weights(), full.dense_weights())


@pytest.mark.parametrize("eta", [1.0, 10.0, 100.0, 1000.0])
def test_never_diverges_for_large_learning_rates(store, eta):
    m = fit(store, "nssl", {"eta": eta, "tau": 0.01, "lam": 1e-3}, passes=5, paths=1, seed=0, client=None)
    assert np.all(np.isfinite(m.coef_values)) and m.nnz > 0
    h = [r["holdout"]["error"] for r in m.meta["history"]]
    assert all(np.isfinite(h)) and h[-1] < 0.35


def test_holdout_error_stays_low_over_passes(store):
    """Dexter's 66 holdout rows are too few for a monotone curve (the error moves by 1/66 steps); it must end low."""
    m = fit(store, "nssl", OPTS, passes=6, paths=1, seed=0, client=None)
    err = [r["holdout"]["error"] for r in m.meta["history"]]
    assert err[-1] <= err[0] and err[-1] < 0.15


def test_options_are_validated():
    from pipeline.algorithms import make_algorithm

    with pytest.raises(ValueError, match="shrink"):
        make_algorithm("nssl", {"shrink": "eta"})
    with pytest.raises(ValueError, match="density_bound"):
        make_algorithm("nssl", {"density_bound": 0})
