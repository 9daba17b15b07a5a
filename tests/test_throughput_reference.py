"""benchmarks.throughput.logistic_sgd (the tight-loop reference of the throughput benchmark) against a pure-NumPy
plain logistic SGD."""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from benchmarks.throughput import logistic_sgd


def ref_logistic_sgd(X, y, rows, w, b, eta):
    """Row by row: f = w·x + b, d = −y / (1 + exp(y f)), w ← w − η·d·x, b ← b − η·d (NumPy, no numba)."""
    w = w.astype(np.float64)
    for i in rows:
        lo, hi = X.indptr[i], X.indptr[i + 1]
        idx, val = X.indices[lo:hi], X.data[lo:hi].astype(np.float64)
        f = float(np.dot(w[idx], val)) + b
        d = -y[i] / (1.0 + math.exp(y[i] * f))
        w[idx] -= eta * d * val
        b -= eta * d
    return w, b


def data(seed=0, n=60, p=500, density=0.05):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, format="csr", random_state=rng, dtype=np.float64)
    X.data = (rng.normal(size=X.nnz) * 3).astype(np.float32)
    X = sp.csr_matrix((X.data, X.indices.astype(np.int32), X.indptr.astype(np.int64)), shape=X.shape)
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return X, y, rng.permutation(n).astype(np.int64)


@pytest.mark.parametrize("seed,ahead", [(0, 0), (1, 0), (2, 0), (0, 4), (1, 1000)])
def test_float64_equals_reference(seed, ahead):
    X, y, rows = data(seed)
    w, b = np.zeros(X.shape[1]), np.zeros(1)
    for _ in range(3):  # three passes: scores large enough to reach both branches of the stable loss
        logistic_sgd(X.indptr, X.indices, X.data, y, rows, w, b, 0.5, ahead)
    wr, br = np.zeros(X.shape[1]), 0.0
    for _ in range(3):
        wr, br = ref_logistic_sgd(X, y, rows, wr, br, 0.5)
    assert np.abs(wr).max() > 0.1
    np.testing.assert_allclose(w, wr, rtol=1e-12, atol=1e-12)
    assert b[0] == pytest.approx(br, rel=1e-12, abs=1e-12)


def test_float32_weights_close_to_reference():
    X, y, rows = data(3)
    w, b = np.zeros(X.shape[1], np.float32), np.zeros(1)
    logistic_sgd(X.indptr, X.indices, X.data, y, rows, w, b, 0.5)
    wr, br = ref_logistic_sgd(X, y, rows, np.zeros(X.shape[1]), 0.0, 0.5)
    assert w.dtype == np.float32
    np.testing.assert_allclose(w, wr, rtol=1e-5, atol=1e-6)
    assert b[0] == pytest.approx(br, rel=1e-5, abs=1e-6)


def test_renumber_by_frequency_is_a_column_permutation_in_frequency_order():
    """The layout probe's renumbering: the same matrix with its columns permuted (NumPy oracle), every row's ids
    increasing, and column counts non-increasing in the new ids."""
    from benchmarks.throughput import renumber_by_frequency

    X, y, _ = data(4, n=80, p=300, density=0.08)
    halves = [X[:50], X[50:]]
    blocks = [(h.indptr.copy(), h.indices.copy(), h.data.copy(), y[:h.shape[0]]) for h in halves]
    renumber_by_frequency(blocks, X.shape[1])
    R = sp.vstack([sp.csr_matrix((x, ix, ip), shape=(ip.shape[0] - 1, X.shape[1])) for ip, ix, x, _ in blocks])
    counts = np.bincount(X.indices, minlength=X.shape[1])
    old_of_new = np.argsort(-counts, kind="stable")
    np.testing.assert_array_equal(R.toarray(), X.toarray()[:, old_of_new])
    assert all(np.all(np.diff(ix[ip[i]:ip[i + 1]]) > 0) for ip, ix, _, _ in blocks for i in range(ip.shape[0] - 1))
    assert np.all(np.diff(np.bincount(R.indices, minlength=X.shape[1])) <= 0)
