"""SGD / Truncated Gradient kernels (pipeline/kernels/sgd.py) against pure-NumPy dense references.

The references below implement ALGORITHMS.md §1 (TG-1), (TG-2), (C-2) literally: dense weights, every
coordinate truncated when t % K == 0, explicit (1 − η_t·l2) decay. No numba code is used by them.
"""
import importlib.util
import math
import os
import sys
import time

if importlib.util.find_spec("pipeline") is None:  # allow a plain `pytest` without an installed package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.kernels.losses import HINGE, LOGISTIC, SQUARED
from pipeline.kernels.sgd import (
    FOLD_THRESHOLD,
    check_tg_params,
    new_tg_state,
    predict_block,
    sgd_tg_block,
    tg_flush,
)

INF = math.inf
LOSSES = [LOGISTIC, HINGE, SQUARED]


# ----------------------------------------------------------------------------------------------------
# pure-NumPy references
# ----------------------------------------------------------------------------------------------------

def ref_dloss(f, y, code, hinge_at_one=False):
    """ℓ'(f, y) of ALGORITHMS.md §0, written independently of pipeline.kernels.losses."""
    if code == LOGISTIC:
        m = y * f
        # −y·σ(−m), stable
        if m >= 0:
            z = math.exp(-m)
            return -y * z / (1.0 + z)
        return -y / (1.0 + math.exp(m))
    if code == HINGE:
        m = y * f
        return -y if (m < 1.0 or (hinge_at_one and m == 1.0)) else 0.0
    return f - y


def ref_T1(v, a, theta):
    """(C-2) elementwise on a vector."""
    out = v.copy()
    mask = np.abs(v) <= theta
    out[mask] = np.sign(v[mask]) * np.maximum(np.abs(v[mask]) - a, 0.0)
    return out + 0.0  # −0.0 → +0.0


def ref_tg(X, y, rows, eta, schedule, power_t, l2, g, K, theta, loss, hinge_at_one, fit_bias,
           u0=None, b0=0.0, t0=0, bias_delta=0.0):
    """Dense TG recursion: returns (true weights u, bias b, t). ``bias_delta`` > 0: AdaGrad step for the bias
    (n_b += d², b -= η_t·d/(δ_b + √n_b))."""
    X = np.asarray(X.todense() if sp.issparse(X) else X, dtype=np.float64)
    u = np.zeros(X.shape[1]) if u0 is None else np.array(u0, dtype=np.float64)
    b, t = float(b0), int(t0)
    nb = 0.0
    for i in rows:
        t += 1
        e = eta if schedule == 0 else eta / t ** power_t
        x = X[i]
        f = float(u @ x) + b
        d = ref_dloss(f, y[i], loss, hinge_at_one)
        if l2:
            u = (1.0 - e * l2) * u
        u = u - e * d * x                                   # (TG-1)
        if fit_bias and bias_delta > 0:
            nb += d * d
            b -= e * d / (bias_delta + math.sqrt(nb))
        elif fit_bias:
            b -= e * d
        if g > 0 and t % K == 0:
            u = ref_T1(u, e * K * g, theta)                 # (TG-2)
    return u, b, t


def ref_plain_sgd(X, y, rows, eta, loss, fit_bias):
    """Plain SGD (no gravity, no decay), row by row on the CSR arrays."""
    X = sp.csr_matrix(X)
    w = np.zeros(X.shape[1])
    b = 0.0
    for i in rows:
        lo, hi = X.indptr[i], X.indptr[i + 1]
        idx, val = X.indices[lo:hi], X.data[lo:hi]
        f = float(w[idx] @ val) + b
        d = ref_dloss(f, y[i], loss)
        w[idx] -= eta * d * val
        if fit_bias:
            b -= eta * d
    return w, b


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------

def make_block(n=60, p=40, density=0.12, loss=LOGISTIC, seed=0, p_store=None):
    rng = np.random.default_rng(seed)
    p_store = p if p_store is None else p_store
    X = sp.random(n, p_store, density=density, format="csr", random_state=rng,
                  data_rvs=lambda k: rng.uniform(-1.0, 1.0, k))
    X.sort_indices()
    if loss == SQUARED:
        wtrue = rng.normal(size=p_store) * (rng.random(p_store) < 0.3)
        y = X @ wtrue + 0.1 * rng.normal(size=n)
    else:
        y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return X, y.astype(np.float64)


def csr_arrays(X, idx_dtype=np.int64, data_dtype=np.float64):
    return (np.ascontiguousarray(X.indptr, dtype=np.int64), np.ascontiguousarray(X.indices, dtype=idx_dtype),
            np.ascontiguousarray(X.data, dtype=data_dtype))


def run_kernel(X, y, rows, state=None, *, eta=0.2, schedule=0, power_t=0.5, l2=0.0, g=0.0, K=1, theta=INF,
               loss=LOGISTIC, hinge_at_one=False, fit_bias=True, idx_dtype=np.int64, data_dtype=np.float64,
               flush=True, bias_delta=0.0):
    indptr, indices, data = csr_arrays(X, idx_dtype, data_dtype)
    if state is None:
        state = new_tg_state(X.shape[1], bias_adagrad=bias_delta > 0)
    w, Gl, istate, fstate = state
    sgd_tg_block(indptr, indices, data, y, np.asarray(rows, dtype=np.int64), w, Gl, istate, fstate,
                 eta, schedule, power_t, l2, g, K, theta, loss, hinge_at_one, fit_bias, bias_delta)
    if flush:
        tg_flush(w, Gl, fstate, theta)
    return state


def two_passes(n, seed=1):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(n), rng.permutation(n)]).astype(np.int64)


# ----------------------------------------------------------------------------------------------------
# lazy kernel + flush == dense TG recursion
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fit_bias", [False, True])
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("schedule", [0, 1])
@pytest.mark.parametrize("theta", [INF, 0.05])
@pytest.mark.parametrize("K", [1, 3])
def test_lazy_equals_dense(K, theta, schedule, loss, fit_bias):
    X, y = make_block(loss=loss, seed=K * 7 + schedule)
    rows = two_passes(X.shape[0])
    hp = dict(eta=0.2, schedule=schedule, power_t=0.5, l2=0.0, g=0.02, K=K, theta=theta, loss=loss,
              hinge_at_one=False, fit_bias=fit_bias)
    w, Gl, istate, fstate = run_kernel(X, y, rows, **hp)
    u, b, t = ref_tg(X, y, rows, **hp)
    np.testing.assert_allclose(w, u, rtol=1e-12, atol=1e-12)
    assert abs(fstate[2] - b) <= 1e-12
    assert istate[0] == t == len(rows)
    assert fstate[0] == 0.0 and fstate[1] == 1.0 and not Gl.any()
    if not fit_bias:
        assert fstate[2] == 0.0
    # the test must exercise truncation: some but not all weights are zero
    assert 0 < np.count_nonzero(w) < w.size or theta < INF


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("schedule", [0, 1])
def test_l2_equals_dense_with_decay(loss, K, schedule):
    X, y = make_block(loss=loss, seed=11 + K)
    rows = two_passes(X.shape[0], seed=5)
    hp = dict(eta=0.2, schedule=schedule, power_t=0.5, l2=0.05, g=0.02, K=K, theta=INF, loss=loss,
              hinge_at_one=True, fit_bias=True)
    check_tg_params(hp["l2"], hp["theta"], hp["g"], hp["K"], eta=hp["eta"])
    w, Gl, istate, fstate = run_kernel(X, y, rows, **hp)
    u, b, _ = ref_tg(X, y, rows, **hp)
    np.testing.assert_allclose(w, u, rtol=1e-12, atol=1e-12)
    assert abs(fstate[2] - b) <= 1e-12


@pytest.mark.parametrize("g", [0.0, 0.02])
def test_l2_scale_fold(g):
    """A strong decay drives wscale below FOLD_THRESHOLD several times within one call: still exact."""
    X, y = make_block(loss=SQUARED, seed=3)
    rows = two_passes(X.shape[0], seed=9)
    hp = dict(eta=0.5, schedule=0, power_t=0.5, l2=1.6, g=g, K=1, theta=INF, loss=SQUARED,
              hinge_at_one=False, fit_bias=True)
    # (1 − 0.8)^13 < 1e-9: a fold every ~13 steps, about 9 folds over 120 rows
    assert (1 - hp["eta"] * hp["l2"]) ** 13 < FOLD_THRESHOLD
    w, Gl, istate, fstate = run_kernel(X, y, rows, flush=False, **hp)
    assert FOLD_THRESHOLD <= fstate[1] <= 1.0
    tg_flush(w, Gl, fstate, INF)
    u, b, _ = ref_tg(X, y, rows, **hp)
    np.testing.assert_allclose(w, u, rtol=1e-12, atol=1e-12)
    assert abs(fstate[2] - b) <= 1e-12


@pytest.mark.parametrize("hp", [
    dict(eta=0.2, schedule=1, l2=0.0, g=0.02, K=3, theta=0.05, loss=LOGISTIC, bias_delta=0.0, ada=False),
    dict(eta=0.5, schedule=0, l2=1.6, g=0.02, K=1, theta=INF, loss=SQUARED, bias_delta=0.0, ada=False),  # folds
    dict(eta=0.2, schedule=0, l2=0.0, g=0.05, K=2, theta=INF, loss=HINGE, bias_delta=1.0, ada=False),
    dict(eta=0.3, schedule=1, l2=0.01, g=0.01, K=1, theta=INF, loss=LOGISTIC, bias_delta=0.0, ada=True),
])
def test_interleaved_layout_is_bit_identical(hp):
    """w and Gl as one interleaved array (stride 2, goff 1: one cache line per coordinate) give the same bits as
    two arrays, mid-stream (pending gravity, scale not folded in) and after the flush, folds included."""
    from pipeline.kernels.sgd import sgd_tg_ada_block, tg_ada_flush

    X, y = make_block(loss=hp["loss"], seed=4)
    indptr, indices, data = csr_arrays(X)
    rows = two_passes(X.shape[0], seed=2)
    p = X.shape[1]
    out = []
    for stride in (1, 2):
        w, Gl = np.zeros(p * stride), np.zeros(p * stride)
        if stride == 2:
            Gl = w  # one array, passed as both
        n = np.zeros(p)
        istate = np.zeros(1, np.int64)
        fstate = np.array([0.0, 1.0, 0.0, 0.0])
        goff = stride - 1
        args = (hp["eta"], hp["schedule"], 0.5, hp["l2"], hp["g"], hp["K"], hp["theta"])
        snaps = []
        for part in (rows[:70], rows[70:]):
            if hp["ada"]:
                sgd_tg_ada_block(indptr, indices, data, y, part, w, Gl, n, istate, fstate, *args, 0.5, hp["loss"],
                                 False, True, stride, goff)
            else:
                sgd_tg_block(indptr, indices, data, y, part, w, Gl, istate, fstate, *args, hp["loss"], False, True,
                             hp["bias_delta"], stride, goff)
            snaps.append((w[::stride].tobytes(), Gl[goff::stride].tobytes(), fstate.tobytes(), n.tobytes()))
        if hp["ada"]:
            tg_ada_flush(w, Gl, n, fstate, hp["theta"], 0.5, stride, goff)
        else:
            tg_flush(w, Gl, fstate, hp["theta"], stride, goff)
        snaps.append((w[::stride].tobytes(), Gl[goff::stride].tobytes(), fstate.tobytes(), istate.tobytes()))
        out.append(snaps)
    assert out[0] == out[1]
    assert np.frombuffer(out[0][0][1]).any()  # mid-stream state with gravity owed: the interesting case


def test_schedule_power_t():
    """schedule 1 with power_t ≠ 0.5 and a start at t0 > 0 (η_t uses the global step counter)."""
    X, y = make_block(seed=21)
    rows = two_passes(X.shape[0], seed=2)
    hp = dict(eta=0.3, schedule=1, power_t=0.7, l2=0.0, g=0.01, K=2, theta=INF, loss=LOGISTIC,
              hinge_at_one=False, fit_bias=True)
    state = new_tg_state(X.shape[1])
    state[2][0] = 17
    w, _, istate, fstate = run_kernel(X, y, rows, state, **hp)
    u, b, t = ref_tg(X, y, rows, t0=17, **hp)
    np.testing.assert_allclose(w, u, rtol=1e-12, atol=1e-12)
    assert istate[0] == t == 17 + len(rows)


# ----------------------------------------------------------------------------------------------------
# g = 0, resumability, input dtypes
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("fit_bias", [False, True])
def test_g0_is_plain_sgd(loss, fit_bias):
    X, y = make_block(loss=loss, seed=4)
    rows = two_passes(X.shape[0])
    w, Gl, _, fstate = run_kernel(X, y, rows, eta=0.2, g=0.0, K=3, theta=0.05, loss=loss, fit_bias=fit_bias,
                                  flush=False)
    assert fstate[0] == 0.0 and fstate[1] == 1.0 and not Gl.any()  # nothing pending: no flush needed
    u, b = ref_plain_sgd(X, y, rows, 0.2, loss, fit_bias)
    np.testing.assert_allclose(w, u, rtol=1e-12, atol=1e-12)
    assert abs(fstate[2] - b) <= 1e-12


@pytest.mark.parametrize("hp", [
    dict(g=0.02, K=3, theta=0.05, schedule=1, l2=0.0, loss=HINGE),
    dict(g=0.02, K=1, theta=INF, schedule=0, l2=0.05, loss=LOGISTIC),
    dict(g=0.02, K=2, theta=INF, schedule=0, l2=1.6, eta=0.5, loss=SQUARED),  # folds inside both calls
])
def test_split_equals_single_call(hp):
    X, y = make_block(loss=hp["loss"], seed=8)
    rows = two_passes(X.shape[0], seed=3)
    one = run_kernel(X, y, rows, flush=False, **hp)
    cut = 47
    two = run_kernel(X, y, rows[:cut], flush=False, **hp)
    two = run_kernel(X, y, rows[cut:], two, flush=False, **hp)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    # also across a flush in the middle (pass end), which changes the representation, not the model
    three = run_kernel(X, y, rows[:cut], **hp)
    three = run_kernel(X, y, rows[cut:], three, **hp)
    tg_flush(one[0], one[1], one[3], hp["theta"])
    np.testing.assert_allclose(three[0], one[0], rtol=1e-12, atol=1e-12)
    assert three[2][0] == one[2][0]
    assert abs(three[3][2] - one[3][2]) <= 1e-12


@pytest.mark.parametrize("theta", [INF, 0.05])
def test_float32_int32_inputs(theta):
    X, y = make_block(seed=12)
    X.data = X.data.astype(np.float32).astype(np.float64)  # values representable in float32
    rows = two_passes(X.shape[0])
    hp = dict(g=0.02, K=3, theta=theta, schedule=1, loss=LOGISTIC, flush=False)
    a = run_kernel(X, y, rows, idx_dtype=np.int32, data_dtype=np.float32, **hp)
    b = run_kernel(X, y, rows, idx_dtype=np.int64, data_dtype=np.float64, **hp)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_unsorted_indices():
    """Rows whose feature indices are not sorted behave like the dense rows (indices never repeat within a row:
    the parser refuses a duplicate, tests/test_libsvm.py)."""
    rng = np.random.default_rng(17)
    n, p, nnz_row = 40, 12, 6
    indptr = np.arange(0, (n + 1) * nnz_row, nnz_row, dtype=np.int64)
    indices = np.concatenate([rng.permutation(p)[:nnz_row] for _ in range(n)]).astype(np.int64)  # unsorted
    data = rng.uniform(-1, 1, n * nnz_row)
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    X = sp.csr_matrix((data, indices, indptr), shape=(n, p))
    assert not all((np.diff(indices[indptr[i]:indptr[i + 1]]) > 0).all() for i in range(n))  # unsorted rows exist
    rows = two_passes(n, seed=4)
    hp = dict(eta=0.2, schedule=1, power_t=0.5, l2=0.0, g=0.03, K=2, theta=0.08, loss=HINGE,
              hinge_at_one=True, fit_bias=True)
    w, Gl, istate, fstate = new_tg_state(p)
    sgd_tg_block(indptr, indices, data, y, rows, w, Gl, istate, fstate, hp["eta"], hp["schedule"], hp["power_t"],
                 hp["l2"], hp["g"], hp["K"], hp["theta"], hp["loss"], hp["hinge_at_one"], hp["fit_bias"])
    tg_flush(w, Gl, fstate, hp["theta"])
    u, b, _ = ref_tg(X, y, rows, **hp)
    np.testing.assert_allclose(w, u, rtol=1e-12, atol=1e-12)
    assert abs(fstate[2] - b) <= 1e-12


# ----------------------------------------------------------------------------------------------------
# exact zeros, laziness
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("l2", [0.0, 0.05])
def test_exact_zeros_with_large_gravity(l2):
    X, y = make_block(n=200, p=80, seed=13)
    rows = two_passes(X.shape[0])
    w, *_ = run_kernel(X, y, rows, eta=0.2, g=0.2, K=1, theta=INF, l2=l2, loss=LOGISTIC)
    zero = w == 0.0
    assert zero.sum() >= 0.5 * w.size
    assert not np.signbit(w[zero]).any()  # +0.0, not −0.0
    u, _, _ = ref_tg(X, y, rows, eta=0.2, schedule=0, power_t=0.5, l2=l2, g=0.2, K=1, theta=INF,
                     loss=LOGISTIC, hinge_at_one=False, fit_bias=True)
    np.testing.assert_allclose(w, u, rtol=1e-12, atol=1e-12)


def test_untouched_coordinates_bit_identical_before_flush():
    X, y = make_block(n=80, p=60, density=0.1, seed=14)
    rows_a = np.arange(40, dtype=np.int64)
    hp = dict(eta=0.2, g=0.05, K=2, theta=INF, l2=0.05, loss=LOGISTIC, flush=False)
    state = run_kernel(X, y, rows_a, **hp)
    w0, Gl0 = state[0].copy(), state[1].copy()
    assert (w0 != 0).any() and (Gl0 != state[3][0]).any()  # pending truncation exists
    rows_b = np.arange(40, 80, dtype=np.int64)
    touched = np.unique(X[rows_b].indices)
    untouched = np.setdiff1d(np.arange(X.shape[1]), touched)
    assert untouched.size > 0
    state = run_kernel(X, y, rows_b, state, **hp)
    assert state[3][1] >= FOLD_THRESHOLD and state[3][1] < 1.0  # no fold happened
    np.testing.assert_array_equal(state[0][untouched], w0[untouched])
    np.testing.assert_array_equal(state[1][untouched], Gl0[untouched])


def test_cost_independent_of_p():
    """Same rows over p = 1e3 vs p = 1e6 features: the lazy kernel touches only nnz (print, loose check)."""
    rng = np.random.default_rng(0)
    n, nnz_row = 2000, 20
    indptr = np.arange(0, (n + 1) * nnz_row, nnz_row, dtype=np.int64)
    indices = rng.integers(0, 1000, n * nnz_row).astype(np.int64)
    data = rng.uniform(-1, 1, n * nnz_row)
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    rows = np.arange(n, dtype=np.int64)
    times = {}
    for p in (1000, 1_000_000):
        best = INF
        for _ in range(3):
            w, Gl, istate, fstate = new_tg_state(p)
            w.fill(0.0)
            Gl.fill(0.0)
            t0 = time.perf_counter()
            sgd_tg_block(indptr, indices, data, y, rows, w, Gl, istate, fstate, 0.1, 0, 0.5, 0.0, 0.01, 1, INF,
                         LOGISTIC, False, True)
            best = min(best, time.perf_counter() - t0)
        times[p] = best
    print(f"\nlazy TG, {n * nnz_row} nnz: p=1e3 {times[1000] * 1e3:.2f} ms, p=1e6 {times[1_000_000] * 1e3:.2f} ms")
    assert times[1_000_000] < 50 * times[1000] + 0.05  # an O(p)-per-row kernel would be ~1000x slower


# ----------------------------------------------------------------------------------------------------
# predict_block, flush, parameter checks
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("idx_dtype,data_dtype", [(np.int64, np.float64), (np.int32, np.float32)])
def test_predict_block_wider_store(idx_dtype, data_dtype):
    p, p_store = 30, 45
    X, _ = make_block(n=50, p=p, p_store=p_store, density=0.2, seed=15)
    rng = np.random.default_rng(1)
    w = rng.normal(size=p) * (rng.random(p) < 0.5)
    indptr, indices, data = csr_arrays(X, idx_dtype, data_dtype)
    out = np.empty(X.shape[0])
    predict_block(indptr, indices, data, w, 0.25, out)
    Xd = np.asarray(X.todense(), dtype=np.float64)
    if data_dtype == np.float32:
        Xd = Xd.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(out, Xd[:, :p] @ w + 0.25, rtol=1e-12, atol=1e-12)
    assert (X.indices >= p).any()  # the wider-store rule is exercised
    # empty block
    predict_block(np.zeros(1, np.int64), indices[:0], data[:0], w, 0.25, out[:0])


@pytest.mark.parametrize("idx_dtype,data_dtype", [(np.int64, np.float64), (np.int32, np.float32)])
def test_numpy_scores_equal_predict_block_bit_for_bit(idx_dtype, data_dtype, monkeypatch):
    """evaluate.csr_scores without numba (np.bincount, what evaluate and predict use in a process that has not
    started numba) gives the kernel's scores to the bit: wider store, empty rows, long rows, a row range."""
    import pipeline.evaluate as ev

    monkeypatch.setattr(ev, "numba_started", lambda: False)
    rng = np.random.default_rng(21)
    p, p_store, n = 300, 420, 400
    X = sp.random(n, p_store, density=0.2, format="csr", random_state=rng,
                  data_rvs=lambda k: rng.normal(size=k) * 10.0 ** rng.integers(-6, 6, k))
    X = sp.vstack([X, sp.csr_matrix((3, p_store)), sp.random(2, p_store, density=1.0, format="csr",
                                                                random_state=rng)]).tocsr()
    w = rng.normal(size=p) * 10.0 ** rng.integers(-4, 4, p) * (rng.random(p) < 0.6)
    indptr, indices, data = csr_arrays(X, idx_dtype, data_dtype)
    want = np.empty(X.shape[0])
    predict_block(indptr, indices, data, w, -0.3, want)
    got = ev.csr_scores(indptr, indices, data, w, -0.3)
    assert got.dtype == np.float64 and np.array_equal(got.view(np.int64), want.view(np.int64))
    dense = X.toarray().astype(data_dtype).astype(np.float64)[:, :p] @ w - 0.3  # BLAS: another order of the sums
    assert np.allclose(got, dense) and not np.array_equal(got, dense)  # ... which the test can tell
    sub = slice(100, 260)  # rows of a larger CSR (indptr not starting at 0)
    got = ev.csr_scores(indptr[sub.start:sub.stop + 1], indices, data, w, -0.3)
    assert np.array_equal(got.view(np.int64), want[sub.start:sub.stop].view(np.int64))
    assert ev.csr_scores(np.zeros(1, np.int64), indices[:0], data[:0], w, 0.5).shape == (0,)


def test_flush_idempotent_and_resets_state():
    X, y = make_block(seed=16)
    rows = two_passes(X.shape[0])
    w, Gl, istate, fstate = run_kernel(X, y, rows, g=0.03, K=3, l2=0.05, flush=False)
    assert fstate[0] > 0 and fstate[1] < 1
    tg_flush(w, Gl, fstate, INF)
    w1 = w.copy()
    assert fstate[0] == 0.0 and fstate[1] == 1.0 and not Gl.any()
    tg_flush(w, Gl, fstate, INF)
    np.testing.assert_array_equal(w, w1)


def test_empty_rows_count_as_steps():
    X = sp.csr_matrix((3, 5))
    y = np.array([1.0, -1.0, 1.0])
    w, Gl, istate, fstate = run_kernel(X, y, np.arange(3), g=0.1, loss=SQUARED)
    assert istate[0] == 3 and not w.any()
    _, b, _ = ref_tg(X, y, np.arange(3), eta=0.2, schedule=0, power_t=0.5, l2=0.0, g=0.1, K=1, theta=INF,
                     loss=SQUARED, hinge_at_one=False, fit_bias=True)
    assert abs(fstate[2] - b) <= 1e-15


@pytest.mark.parametrize("kw", [
    dict(l2=0.0, theta=INF, g=-0.1, K=1),
    dict(l2=0.0, theta=INF, g=0.1, K=0),
    dict(l2=0.0, theta=INF, g=0.1, K=1.5),
    dict(l2=0.0, theta=-1.0, g=0.1, K=1),
    dict(l2=0.0, theta=math.nan, g=0.1, K=1),
    dict(l2=-0.1, theta=INF, g=0.1, K=1),
    dict(l2=0.1, theta=0.05, g=0.1, K=1),
    dict(l2=0.1, theta=0.05, g=0.0, K=1),
    dict(l2=0.5, theta=INF, g=0.1, K=1, eta=2.0),
    dict(l2=0.0, theta=INF, g=0.1, K=1, eta=0.0),
    dict(l2=0.0, theta=INF, g=0.1, K=1, schedule=2),
    dict(l2=0.0, theta=INF, g=0.1, K=1, power_t=-1.0),
])
def test_check_tg_params_rejects(kw):
    with pytest.raises(ValueError):
        check_tg_params(**kw)


@pytest.mark.parametrize("kw", [
    dict(l2=0.0, theta=INF, g=0.0, K=1),
    dict(l2=0.0, theta=0.05, g=0.01, K=10),
    dict(l2=0.01, theta=INF, g=0.01, K=5, eta=0.5, schedule=1, power_t=0.5),
    dict(l2=0.0, theta=0.0, g=0.0, K=np.int64(2)),
])
def test_check_tg_params_accepts(kw):
    check_tg_params(**kw)


# ----------------------------------------------------------------------------------------------------
# throughput (printed, not asserted)
# ----------------------------------------------------------------------------------------------------

def _random_csr(n, p, nnz_row, seed=0):
    rng = np.random.default_rng(seed)
    indptr = np.arange(0, (n + 1) * nnz_row, nnz_row, dtype=np.int64)
    indices = rng.integers(0, p, n * nnz_row, dtype=np.int64).astype(np.int32)
    data = rng.random(n * nnz_row, dtype=np.float32)
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return indptr, indices, data, y


def measure_throughput(n=20_000, p=1_000_000, nnz_row=100, repeats=5):
    """nnz/s of sgd_tg_block (several settings), tg_flush and predict_block on one ~2M-nnz block."""
    indptr, indices, data, y = _random_csr(n, p, nnz_row)
    nnz = n * nnz_row
    rows = np.random.default_rng(1).permutation(n).astype(np.int64)
    results = {}
    settings = {
        "plain SGD (g=0)": dict(l2=0.0, g=0.0, K=1, theta=INF, schedule=0),
        "TG K=1 theta=inf": dict(l2=0.0, g=1e-3, K=1, theta=INF, schedule=0),
        "TG K=5 theta=0.1 1/sqrt(t)": dict(l2=0.0, g=1e-3, K=5, theta=0.1, schedule=1),
        "TG K=1 + l2": dict(l2=1e-6, g=1e-3, K=1, theta=INF, schedule=0),
    }
    for name, s in settings.items():
        best = INF
        for _ in range(repeats):
            w, Gl, istate, fstate = new_tg_state(p)
            w.fill(0.0)  # commit the pages outside the timed region
            Gl.fill(0.0)
            t0 = time.perf_counter()
            sgd_tg_block(indptr, indices, data, y, rows, w, Gl, istate, fstate, 0.1, s["schedule"], 0.5, s["l2"],
                         s["g"], s["K"], s["theta"], LOGISTIC, False, True)
            best = min(best, time.perf_counter() - t0)
        results[name] = nnz / best
    best = INF
    for _ in range(repeats):
        t0 = time.perf_counter()
        tg_flush(w, Gl, fstate, INF)
        best = min(best, time.perf_counter() - t0)
    results["tg_flush (coords/s)"] = p / best
    out = np.empty(n)
    best = INF
    for _ in range(repeats):
        t0 = time.perf_counter()
        predict_block(indptr, indices, data, w, 0.0, out)
        best = min(best, time.perf_counter() - t0)
    results["predict_block"] = nnz / best
    return results


def test_throughput_printed():
    res = measure_throughput()
    print("\nthroughput on a 20000 x 1e6 CSR block, 2.0M nnz (float32 data, int32 indices), rows shuffled:")
    for k, v in res.items():
        print(f"  {k:32s} {v / 1e6:8.1f} M/s")


if __name__ == "__main__":
    for k, v in measure_throughput().items():
        print(f"{k:32s} {v / 1e6:8.1f} M/s")


@pytest.mark.parametrize("loss", LOSSES)
def test_bias_adagrad_equals_dense_reference(loss):
    """bias_delta > 0 (tg's default): the bias takes AdaGrad steps, the weights the global rate and lazy
    truncation, all equal to the dense recursion; the accumulator n_b = Σ d² is kept in fstate[3]."""
    X, y = make_block(loss=loss, seed=5)
    rows = np.random.default_rng(2).permutation(X.shape[0])
    hp = dict(eta=0.3, schedule=1, power_t=0.5, l2=0.01, g=0.02, K=2, theta=INF, loss=loss, hinge_at_one=False,
              fit_bias=True)
    w, Gl, istate, fstate = run_kernel(X, y, rows, bias_delta=0.5, **hp)
    u, b, t = ref_tg(X, y, rows, bias_delta=0.5, **hp)
    np.testing.assert_allclose(w * fstate[1], u, rtol=1e-10, atol=1e-12)
    assert abs(fstate[2] - b) <= 1e-10 * max(1.0, abs(b)) and istate[0] == t and fstate.shape[0] == 4
    assert fstate[3] > 0 and np.count_nonzero(w) < X.shape[1]  # exact zeros from the truncation
    plain = run_kernel(X, y, rows, **hp)
    assert plain[3][2] != fstate[2]  # the bias rule is really switched
