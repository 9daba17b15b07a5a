"""TG's baselines (ALGORITHMS.md §1): the rounding rule (TG-3) and the naive L1 subgradient (TG-4),
``--algo tg --set rule=rounding|subgradient``: the kernel against a dense NumPy reference, exact zeros, resume."""
import math

import numpy as np
import pytest

from pipeline.kernels import tg_baselines as B
from pipeline.kernels.losses import HINGE, LOGISTIC, dloss
from pipeline.model import load_model
from pipeline.train import fit
from tests.test_nssl import random_csr, store  # noqa: F401  (the shared dexter store fixture)


def dense_reference(X, y, rows, rule, eta, schedule, g, K, theta, loss, bias_delta):
    """The dense rules: every K steps T0(w, θ) on every coordinate (TG-3), or −η_t·g·sign(w_t) on every coordinate
    each step (TG-4); the bias's plain or AdaGrad step."""
    D = X.toarray()
    w, b, nb = np.zeros(X.shape[1]), 0.0, 0.0
    for t, i in enumerate(rows, start=1):
        e = eta / math.sqrt(t) if schedule == 1 else eta
        f = float(sum(w[j] * D[i, j] for j in X.indices[X.indptr[i]:X.indptr[i + 1]])) + b
        d = dloss(f, y[i], loss, False)
        if rule == B.SUBGRADIENT:
            w = w - e * g * np.sign(w)
        w = w - e * d * D[i]
        if rule == B.ROUNDING and t % K == 0:
            w[np.abs(w) <= theta] = 0.0
        if bias_delta > 0:
            nb += d * d
            b -= e * d / (bias_delta + math.sqrt(nb))
        else:
            b -= e * d
    return w, b


@pytest.mark.parametrize("rule", [B.ROUNDING, B.SUBGRADIENT])
@pytest.mark.parametrize("schedule,K,loss,bias_delta", [(0, 1, LOGISTIC, 0.0), (1, 3, HINGE, 1.0), (0, 4, LOGISTIC, 1.0)])
def test_kernel_equals_the_dense_rule_across_calls(rule, schedule, K, loss, bias_delta):
    X, y = random_csr(n=60, d=25, density=0.3, seed=4)
    rows = np.random.default_rng(1).permutation(np.tile(np.arange(60), 2)).astype(np.int64)
    w, Gl = np.zeros(25), np.zeros(25)
    ist, fst = np.zeros(1, np.int64), np.array([0.0, 1.0, 0.0, 0.0])
    for part in (rows[:47], rows[47:]):  # state carried in the arrays only
        B.tg_baseline_block(X.indptr.astype(np.int64), X.indices, X.data, y, part, w, Gl, ist, fst, 0.3, schedule,
                            0.5, 0.02, K, 0.2, rule, loss, False, True, bias_delta)
    B.rounding_flush(w, Gl, fst, 0.2) if rule == B.ROUNDING else None
    wr, br = dense_reference(X, y, rows, rule, 0.3, schedule, 0.02, K, 0.2, loss, bias_delta)
    np.testing.assert_allclose(w, wr, rtol=1e-12, atol=1e-14)
    assert math.isclose(fst[2], br, rel_tol=1e-12, abs_tol=1e-14) and ist[0] == rows.size
    if rule == B.ROUNDING:
        assert np.array_equal(w == 0, wr == 0) and np.count_nonzero(w) < w.size
        assert np.all(np.abs(w[w != 0]) > 0.2)  # the final flush rounded every coordinate
    else:
        assert np.count_nonzero(w) == w.size  # oscillating near 0, never exactly 0


@pytest.mark.parametrize("rule,opts", [("rounding", {"theta": 1e-5, "K": 5}), ("subgradient", {"theta": 1e-5})])
def test_through_train_exact_zeros_and_two_plus_three_passes_equal_five(rule, opts, store, tmp_path):  # noqa: F811
    run = dict(paths=2, seed=3, client=None)
    o = {"rule": rule, "eta": 0.5, **opts}
    full = fit(store, "tg", o, passes=5, **run)
    w = full.dense_weights()
    assert 0 < full.nnz < full.n_features and np.all(np.abs(w[w != 0]) > opts["theta"])
    part = fit(store, "tg", o, passes=2, **run)
    part.save(tmp_path / "m.npz")
    back = fit(store, "tg", o, passes=3, init_model=load_model(tmp_path / "m.npz"), **run)
    assert back.meta["provenance"]["resumed"]
    np.testing.assert_array_equal(back.dense_weights(), w)
    assert back.bias == full.bias


def test_the_baselines_refuse_what_they_cannot_run():
    from pipeline.algorithms import make_algorithm

    for opts, word in [({"rule": "rounding"}, "finite theta"), ({"rule": "subgradient", "theta": 0.1, "l2": 1e-3}, "no l2"),
                       ({"rule": "rounding", "theta": 0.1, "gravity": 0.1}, "gravity has no effect"),
                       ({"rule": "subgradient", "theta": 0.1, "K": 3}, "K has no effect"), ({"rule": "x"}, "rule")]:
        with pytest.raises(ValueError, match=word):
            make_algorithm("tg", opts)
    with pytest.raises(ValueError, match="rule, theta has no effect: --algo sgd never truncates"):
        make_algorithm("sgd", {"rule": "rounding", "theta": 0.1})
    for key, value in (("K", 3), ("theta", 0.5), ("rule", "tg")):  # sgd's truncation options are all refused
        with pytest.raises(ValueError, match=f"{key} has no effect"):
            make_algorithm("sgd", {key: value})
