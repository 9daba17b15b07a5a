"""AdaGrad steps in SGD / TG (pipeline/kernels/sgd.py ``sgd_tg_ada_block``, ``--set adagrad=true``).

The reference below is DENSE: every coordinate is truncated every K steps with its own rate
η_t / (δ + √n_j) (ALGORITHMS.md §8), no lazy bookkeeping, no numba. Pipeline tests use real stores on disk
and real LocalClusters.
"""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.kernels.losses import HINGE, LOGISTIC, SQUARED
from pipeline.kernels.sgd import new_tg_state, sgd_tg_ada_block, sgd_tg_block, tg_ada_flush, tg_flush
from pipeline.model import load_model
from pipeline.train import fit
from tests.conftest import ingest_shared, same_model
from tests.test_kernels_sgd import csr_arrays, make_block, ref_dloss

INF = math.inf


def ref_T1(v, a, theta):
    """(C-2) elementwise, with a per-coordinate amount a (a vector)."""
    out = np.where(np.abs(v) <= theta, np.sign(v) * np.maximum(np.abs(v) - a, 0.0), v)
    return out + 0.0  # -0.0 -> +0.0


def ref_tg_ada(X, y, rows, eta, schedule, power_t, l2, g, K, theta, loss, fit_bias, delta):
    """Dense TG with AdaGrad steps: returns (true weights u, bias b, n, n_bias)."""
    X = np.asarray(X.todense(), dtype=np.float64)
    u = np.zeros(X.shape[1])
    n = np.zeros(X.shape[1])
    b = nb = 0.0
    t = 0
    for i in rows:
        t += 1
        e = eta if schedule == 0 else eta / t ** power_t
        x = X[i]
        f = float(u @ x) + b
        d = ref_dloss(f, y[i], loss)
        n += (d * x) ** 2                                   # loss gradient only
        rate = e / (delta + np.sqrt(n))                     # η_{t,j}
        if l2:
            u = (1.0 - e * l2) * u                          # L2 keeps the global rate
        u = u - rate * d * x
        if fit_bias:
            nb += d * d
            b -= e / (delta + math.sqrt(nb)) * d
        if g > 0 and t % K == 0:
            u = ref_T1(u, rate * K * g, theta)              # every coordinate, its own rate
    return u, b, n, nb


def run_ada(X, y, rows, state=None, *, eta=0.5, schedule=0, power_t=0.5, l2=0.0, g=0.0, K=1, theta=INF,
            loss=LOGISTIC, fit_bias=True, delta=0.1, flush=True):
    indptr, indices, data = csr_arrays(X)
    if state is None:
        state = new_tg_state(X.shape[1], adagrad=True)
    w, Gl, n, istate, fstate = state
    sgd_tg_ada_block(indptr, indices, data, y, np.asarray(rows, dtype=np.int64), w, Gl, n, istate, fstate,
                     eta, schedule, power_t, l2, g, K, theta, delta, loss, False, fit_bias)
    if flush:
        tg_ada_flush(w, Gl, n, fstate, theta, delta)
    return state


def passes(n, k, seed=1):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(n) for _ in range(k)]).astype(np.int64)


@pytest.mark.parametrize("loss", [LOGISTIC, HINGE, SQUARED])
@pytest.mark.parametrize("schedule", [0, 1])
@pytest.mark.parametrize("theta", [INF, 0.05])
@pytest.mark.parametrize("K", [1, 3])
def test_lazy_adagrad_equals_dense(K, theta, schedule, loss):
    X, y = make_block(n=150, p=60, density=0.1, loss=loss, seed=K + 7 * schedule)
    rows = passes(150, 4)
    g = 0.03
    w, Gl, n, istate, fstate = run_ada(X, y, rows, g=g, K=K, theta=theta, schedule=schedule, loss=loss)
    u, b, nr, nbr = ref_tg_ada(X, y, rows, 0.5, schedule, 0.5, 0.0, g, K, theta, loss, True, 0.1)
    assert istate[0] == len(rows)
    np.testing.assert_allclose(w, u, rtol=0, atol=1e-12)
    np.testing.assert_allclose(n, nr, rtol=1e-12, atol=0)
    assert abs(fstate[2] - b) < 1e-12 and abs(fstate[3] - nbr) <= 1e-12 * nbr
    assert np.array_equal(w == 0.0, u == 0.0) and np.count_nonzero(w) > 0                # exact zeros
    if theta == INF:
        assert np.count_nonzero(w) < w.size


def test_lazy_adagrad_with_l2_equals_dense():
    X, y = make_block(n=120, p=50, density=0.12, seed=3)
    rows = passes(120, 3)
    w, *_ , fstate = run_ada(X, y, rows, g=0.003, K=3, l2=0.05)
    u, b, _, _ = ref_tg_ada(X, y, rows, 0.5, 0, 0.5, 0.05, 0.003, 3, INF, LOGISTIC, True, 0.1)
    np.testing.assert_allclose(w, u, rtol=0, atol=1e-12)
    assert abs(fstate[2] - b) < 1e-12


def test_exact_zeros_with_large_gravity():
    X, y = make_block(n=80, p=40, density=0.15, seed=5)
    w, Gl, n, istate, fstate = run_ada(X, y, passes(80, 2), g=10.0, K=1)
    assert np.all(w == 0.0) and not np.signbit(w).any() and np.all(Gl == 0.0) and fstate[0] == 0.0


@pytest.mark.parametrize("cuts", [[1], [17, 18, 100], [150, 299]])
def test_split_calls_equal_one_call_bit_for_bit(cuts):
    X, y = make_block(n=150, p=60, density=0.1, seed=2)
    rows = passes(150, 2)
    one = run_ada(X, y, rows, g=0.01, K=3, theta=0.05)
    st = None
    for lo, hi in zip([0] + cuts, cuts + [len(rows)]):
        st = run_ada(X, y, rows[lo:hi], st, g=0.01, K=3, theta=0.05, flush=False)
    tg_ada_flush(st[0], st[1], st[2], st[4], 0.05, 0.1)
    for a, b in zip(one, st):
        assert np.array_equal(a, b)


def test_untouched_coordinates_unchanged_before_flush_then_owe_their_own_rate():
    X, y = make_block(n=60, p=30, density=0.2, seed=4)
    keep = np.ones(30)
    keep[5] = 0.0
    X = sp.csr_matrix(X.multiply(keep[None, :]))            # feature 5 never occurs
    X.eliminate_zeros()
    st = new_tg_state(30, adagrad=True)
    st[0][5] = 0.3                                          # warm start: n_5 = 0, rate η/δ
    st = run_ada(X, y, np.arange(60), st, g=0.001, K=2, flush=False)
    assert st[0][5] == 0.3 and st[2][5] == 0.0
    G = st[4][0]
    tg_ada_flush(st[0], st[1], st[2], st[4], INF, 0.1)
    assert st[0][5] == pytest.approx(0.3 - G / 0.1, abs=1e-15)


def test_plain_kernel_untouched_by_the_option():
    """sgd_tg_block ignores AdaGrad: the same as before (its own dense-reference tests), and a 4th fstate
    entry is neither read nor written."""
    X, y = make_block(n=50, p=20, density=0.2, seed=6)
    indptr, indices, data = csr_arrays(X)
    w, Gl, istate, f3 = new_tg_state(20)
    w2, Gl2, istate2, _ = new_tg_state(20)
    f4 = np.array([0.0, 1.0, 0.0, 123.0])
    rows = np.arange(50, dtype=np.int64)
    sgd_tg_block(indptr, indices, data, y, rows, w, Gl, istate, f3, 0.2, 0, 0.5, 0.0, 0.01, 2, INF, 0, False, True)
    sgd_tg_block(indptr, indices, data, y, rows, w2, Gl2, istate2, f4, 0.2, 0, 0.5, 0.0, 0.01, 2, INF, 0, False,
                 True)
    tg_flush(w, Gl, f3, INF)
    tg_flush(w2, Gl2, f4, INF)
    assert np.array_equal(w, w2) and np.array_equal(f3, f4[:3]) and f4[3] == 123.0


# ------------------------------------------------------------------------------------------ pipeline

ADA = {"eta": 0.5, "gravity": 2e-4, "K": 3, "adagrad": True, "adagrad_delta": 0.01}


@pytest.fixture(scope="module")
def store(tmp_path_factory, client):
    return ingest_shared(tmp_path_factory, client, "rcv1_subset/rcv1_vw_small_train.svm", "ada", block_mb=0.05,
                         holdout=0.2)


@pytest.mark.parametrize("opts", [ADA, {**ADA, "theta": 0.05, "adagrad_mix": "sum"}])
def test_resume_two_plus_three_equals_five(opts, store, tmp_path, client):
    full = fit(store, "tg", opts, passes=5, paths=2, seed=3, client=client)
    part = fit(store, "tg", opts, passes=2, paths=2, seed=3, client=client)
    part.save(tmp_path / "m.npz")
    back = load_model(tmp_path / "m.npz")
    assert "n" in back.states[0] and back.states[0]["fstate"].shape == (4,)
    resumed = fit(store, "tg", opts, passes=3, paths=2, seed=3, client=client, init_model=back)
    assert resumed.meta["provenance"]["resumed"] and resumed.meta["passes"] == 5
    assert same_model(full, resumed) and full.nnz > 0
    for a, b in zip(full.states, resumed.states):
        assert np.array_equal(a["n"], b["n"]) and np.array_equal(a["fstate"], b["fstate"])


def test_one_or_two_workers_bit_identical(store, client, one_worker_client):
    two = fit(store, "tg", ADA, passes=3, paths=2, seed=7, client=client)
    one = fit(store, "tg", ADA, passes=3, paths=2, seed=7, client=one_worker_client)
    inproc = fit(store, "tg", ADA, passes=3, paths=2, seed=7, client=None)
    assert two.nnz > 0 and same_model(two, one) and same_model(two, inproc)
    plain = fit(store, "tg", {k: v for k, v in ADA.items() if not k.startswith("adagrad")}, passes=3, paths=2,
                seed=7, client=None)
    assert not same_model(two, plain)


def test_sum_mixing_is_the_accumulator_of_every_row(store):
    """With adagrad_mix = sum, after one pass with 2 paths n equals Σ over every training row of (ℓ'·x)²
    up to rounding: the paths' increments are added, not averaged."""
    opts = {**ADA, "gravity": 0.0}
    m2 = fit(store, "tg", {**opts, "adagrad_mix": "sum"}, passes=1, paths=2, seed=1, client=None, evaluate=False)
    mean = fit(store, "tg", opts, passes=1, paths=2, seed=1, client=None, evaluate=False)
    n_sum, n_mean = m2.states[0]["n"], mean.states[0]["n"]
    assert np.array_equal(n_sum, m2.states[1]["n"])             # shared after mixing
    assert np.allclose(n_sum, 2 * n_mean, rtol=1e-12, atol=0)  # sum of increments = 2 × their mean here
    assert np.array_equal(m2.gstate["n"], n_sum) and not mean.gstate


def test_params_validation():
    from pipeline.algorithms.sgd import TGParams

    with pytest.raises(ValueError, match="adagrad_delta"):
        TGParams(adagrad=True, adagrad_delta=0.0)
    with pytest.raises(ValueError, match="adagrad_mix"):
        TGParams(adagrad=True, adagrad_mix="max")
