"""Refit of a selected support (relaxed lasso): kernel vs NumPy, objective and optimum vs scipy/scikit-learn on a
real store, support kept, holdout never read, recovery of a known sparse model, train --refit end to end."""
import json
import shutil

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

from benchmarks.common import l1_logistic
from cli.main import app
from pipeline.ingest import IngestOptions, ingest
from pipeline.kernels import refit as K
from pipeline.kernels.losses import LOGISTIC, SQUARED
from pipeline.model import Model, load_model
from pipeline.refit import RefitProblem, refit
from pipeline.store import format as fmt
from pipeline.store.reader import open_store
from pipeline.synth import synth
from pipeline.train import fit

FTRL = {"l1": 3.0}


def np_loss_grad(X, y, w, b, loss, squares=False):
    """Pure-NumPy reference: (Σ ℓ, Σ ℓ', Σ ℓ'·x[, Σ ℓ²]) over the rows of X (dense or scipy.sparse)."""
    f = np.asarray(X @ w).ravel() + b
    if loss == "logistic":
        m = y * f
        ell = np.logaddexp(0.0, -m)
        d = -y / (1.0 + np.exp(m))
    else:
        ell = 0.5 * (f - y) ** 2
        d = f - y
    out = ell.sum(), d.sum(), np.asarray(X.T @ d).ravel()
    return out + ((ell ** 2).sum(),) if squares else out


@pytest.fixture(scope="module")
def synth_stores(tmp_path_factory):
    """Synthetic data from a known sparse model (20,000 features, 100 non-zeros per row), 2k and 16k rows."""
    d = tmp_path_factory.mktemp("refit")
    out = {}
    for rows in (2000, 16000):
        svm = d / f"s{rows}.svm"
        synth(str(svm), rows, features=20000, nnz_per_row=100, seed=1)
        ingest([str(svm)], str(d / f"s{rows}.zarr"), IngestOptions(block_mb=0.3, holdout=0.2))
        out[rows] = (str(d / f"s{rows}.zarr"), np.load(f"{svm}.truth.npz"),
                     json.loads(open(f"{svm}.truth.json").read())["noise_scale"])
    return out


@pytest.fixture(scope="module")
def wide(synth_stores):
    """The 2k-row store and an FTRL model with a wider support (fewer than 20 training rows per column, so the
    default refit runs its validated L1 path)."""
    store = synth_stores[2000][0]
    return store, fit(store, "ftrl", {"l1": 0.3}, passes=3, paths=1, evaluate=False)


@pytest.fixture(scope="module")
def small(synth_stores):
    """The 2k-row store and an FTRL model trained on it (a support of ~140 columns)."""
    store = synth_stores[2000][0]
    return store, fit(store, "ftrl", FTRL, passes=3, paths=1, evaluate=False)


def train_matrix(store, support):
    st = open_store(store)
    blocks = list(st.blocks("train"))
    X = sp.vstack([b.X for b in blocks]).tocsc()[:, support].tocsr()
    return X.astype(np.float64), np.concatenate([b.y for b in blocks])


@pytest.mark.parametrize("loss,code", [("logistic", LOGISTIC), ("squared", SQUARED)])
def test_kernel_loss_and_gradient_equal_numpy_reference(loss, code):
    rng = np.random.default_rng(0)
    X = sp.random(300, 1000, density=0.05, random_state=1, format="csr", dtype=np.float32)
    X.data[:] = rng.random(X.nnz).astype(np.float32) + 0.1
    y = np.where(rng.random(300) < 0.6, 1.0, -1.0)
    support = np.sort(rng.choice(1200, 80, replace=False)).astype(np.int64)  # some ids beyond the width
    ci, cj, cv = K.compact_block(X.indptr.astype(np.int64), X.indices, X.data, *K.support_index(support, 1000))
    in_width = support[support < 1000]
    XS = X[:, in_width].toarray().astype(np.float64)
    dense = np.zeros((300, support.size))
    dense[:, :in_width.size] = XS
    assert ci.shape == (301,) and cj.dtype == np.int32
    np.testing.assert_array_equal(sp.csr_matrix((cv, cj, ci), shape=(300, support.size)).toarray(), dense)
    w = rng.standard_normal(support.size)
    g = np.full(support.size, 7.0)
    tot, gb, sq = K.loss_grad(ci, cj, cv, y, w, 0.3, code, g)
    rt, rb, rg, rsq = np_loss_grad(dense, y, w, 0.3, loss, squares=True)
    np.testing.assert_allclose([tot, gb, sq], [rt, rb, rsq], rtol=1e-12)
    np.testing.assert_allclose(g, rg, rtol=1e-12, atol=1e-12)


def test_support_index_and_full_gradient_kernel_equal_numpy_reference():
    """K.support_index: the bitmap is membership in S and rank + the bits below give np.searchsorted's position
    (ids beyond the width ignored); K.full_gradient_block adds Σ ℓ'·x over every column of the block with the
    margins on S only, as NumPy computes it on the dense rows."""
    rng = np.random.default_rng(4)
    width = 5003  # not a multiple of 8
    support = np.sort(rng.choice(width + 40, 700, replace=False)).astype(np.int64)
    bits, rank = K.support_index(support, width)
    inside = support[support < width]
    member = np.unpackbits(bits, bitorder="little")[:width].astype(bool)
    np.testing.assert_array_equal(np.flatnonzero(member), inside)
    pop = np.unpackbits(bits, bitorder="little").reshape(-1, 8)
    j = np.arange(width)
    below = np.array([pop[c >> 3, :c & 7].sum() for c in j])
    np.testing.assert_array_equal((rank[j >> 3] + below)[inside], np.arange(inside.size))
    X = sp.random(150, width, density=0.02, random_state=3, format="csr", dtype=np.float32)
    y = np.where(rng.random(150) < 0.5, 1.0, -1.0)
    w = rng.standard_normal(support.size)
    acc = np.zeros(width)
    K.full_gradient_block(X.indptr.astype(np.int64), X.indices, X.data, y, bits, rank, w, 0.2, LOGISTIC, acc)
    XD = X.toarray().astype(np.float64)
    d = np_loss_grad(XD[:, inside], y, w[:inside.size], 0.2, "logistic")[2]  # only to check the margin's columns
    f = XD[:, inside] @ w[:inside.size] + 0.2
    ref = XD.T @ (-y / (1.0 + np.exp(y * f)))
    np.testing.assert_allclose(acc, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(acc[inside], d, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss,code", [("logistic", LOGISTIC), ("squared", SQUARED)])
def test_row_losses_kernel_equals_numpy_reference(loss, code):
    """K.row_losses: every row's loss under every model (a column of W), against NumPy on the dense rows; their
    column sums are loss_grad's totals."""
    rng = np.random.default_rng(3)
    X = sp.random(200, 60, density=0.1, random_state=2, format="csr", dtype=np.float32)
    y = np.where(rng.random(200) < 0.5, 1.0, -1.0)
    W = rng.standard_normal((60, 4))
    biases = rng.standard_normal(4)
    out = np.full((200, 4), np.nan)
    K.row_losses(X.indptr.astype(np.int64), X.indices, X.data, y, W, biases, code, out)
    f = X.toarray().astype(np.float64) @ W + biases
    ref = np.logaddexp(0.0, -y[:, None] * f) if loss == "logistic" else 0.5 * (f - y[:, None]) ** 2
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)
    g = np.empty(60)
    for c in range(4):
        tot = K.loss_grad(X.indptr.astype(np.int64), X.indices, X.data, y, W[:, c].copy(), biases[c], code, g)[0]
        assert out[:, c].sum() == pytest.approx(tot, rel=1e-12)


def test_narrow_column_positions_give_the_same_sums_bit_for_bit():
    """A support of at most 65,536 columns is compacted with uint16 positions: the same entries and the same
    loss, bias gradient and gradient bits as with int32 positions (the evaluation only reads fewer bytes)."""
    assert K.position_dtype(1 << 16) == np.uint16 and K.position_dtype((1 << 16) + 1) == np.int32
    rng = np.random.default_rng(5)
    X = sp.random(400, 90_000, density=0.002, random_state=2, format="csr", dtype=np.float32)
    y = np.where(rng.random(400) < 0.5, 1.0, -1.0)
    support = np.sort(rng.choice(90_000, 1 << 16, replace=False)).astype(np.int64)  # positions up to 65,535
    args = (X.indptr.astype(np.int64), X.indices, X.data, *K.support_index(support, 90_000))
    wide = K.compact_block(*args)
    narrow = K.compact_block(*args, np.zeros(0, K.position_dtype(support.size)))
    assert wide[1].dtype == np.int32 and narrow[1].dtype == np.uint16 and narrow[1].max() > 60_000
    np.testing.assert_array_equal(narrow[0], wide[0])
    np.testing.assert_array_equal(narrow[1], wide[1])
    w = rng.standard_normal(support.size)
    g_wide, g_narrow = np.empty(support.size), np.empty(support.size)
    assert K.loss_grad(*narrow, y, w, 0.1, LOGISTIC, g_narrow) == K.loss_grad(*wide, y, w, 0.1, LOGISTIC, g_wide)
    np.testing.assert_array_equal(g_narrow, g_wide)


def test_restrict_columns_equals_numpy_column_selection():
    """K.restrict_columns keeps the entries of a compacted block whose position is in W and renumbers them to W's
    positions: scipy's column selection X[:, W] (same rows, same entries in the same order)."""
    rng = np.random.default_rng(7)
    X = sp.random(60, 40, density=0.3, random_state=4, format="csr", dtype=np.float32)
    ip = X.indptr.astype(np.int64)
    for cols in (np.array([], dtype=np.int64), np.array([0, 39]), np.flatnonzero(rng.random(40) < 0.4)):
        for like in (np.int32, np.uint16):
            pos = np.full(40, -1, dtype=np.int32)
            pos[cols] = np.arange(cols.size, dtype=np.int32)
            rp, ri, rv = K.restrict_columns(ip, X.indices.astype(like), X.data, pos)
            ref = X[:, cols].tocsr()
            ref.sort_indices()
            np.testing.assert_array_equal(rp, ref.indptr)
            np.testing.assert_array_equal(ri, ref.indices)
            np.testing.assert_array_equal(rv, ref.data)
            assert ri.dtype == like


def test_an_evaluation_restricted_to_columns_equals_the_full_one_with_zeros_elsewhere(small, client):
    """evaluate(theta_W, cols=W) (the L1 solve's working set) sums over W's non-zeros only: the loss and the
    gradient on W equal the evaluation over all of S with w = 0 outside W to rounding (a row's dot product sums its
    entries in four interleaved partial sums, K._dot, and dropping the columns outside W regroups them), the row
    count exactly, on the cluster and in process, with and without the validation split."""
    store, model = small
    S = model.coef_indices
    rng = np.random.default_rng(11)
    cols = np.flatnonzero(rng.random(S.size) < 0.3)
    theta = np.zeros(S.size + 1)
    theta[cols] = rng.standard_normal(cols.size)
    theta[-1] = -0.3
    for c in (client, None):
        for split, part in (((0.0, 0), "all"), ((0.2, 3), "fit"), ((0.2, 3), "val")):
            prob = RefitProblem(store, S, l2=1e-3, client=c, split=split)
            full = prob.sums(theta[:-1], theta[-1], part)
            sub = prob.sums(theta[cols], theta[-1], part, cols)
            assert sub[2] == full[2] > 0
            np.testing.assert_allclose(sub[[0, 1, 3]], full[[0, 1, 3]], rtol=1e-13)
            np.testing.assert_allclose(sub[4:], full[4:][cols], rtol=1e-12, atol=1e-15)
            f, g = prob.evaluate(np.append(theta[cols], theta[-1]), part, cols=cols)
            f_full, g_full = prob.evaluate(theta, part)
            np.testing.assert_allclose(f, f_full, rtol=1e-14)
            np.testing.assert_allclose(g, np.append(g_full[:-1][cols], g_full[-1]), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("loss", ["logistic", "squared"])
def test_objective_and_gradient_over_the_store_equal_numpy(small, client, loss):
    store, model = small
    S = model.coef_indices
    X, y = train_matrix(store, S)
    rng = np.random.default_rng(3)
    theta = np.append(rng.standard_normal(S.size), 0.2)
    l2 = 1e-3
    for c in (client, None):
        prob = RefitProblem(store, S, l2=l2, loss=loss, client=c)
        f, g = prob.evaluate(theta)
        t, tb, tg = np_loss_grad(X, y, theta[:-1], theta[-1], loss)
        n = y.size
        assert prob.n_rows == n
        np.testing.assert_allclose(f, t / n + 0.5 * l2 * theta[:-1] @ theta[:-1], rtol=1e-10)
        np.testing.assert_allclose(g, np.append(tg / n + l2 * theta[:-1], tb / n), rtol=1e-9, atol=1e-12)


def test_chunked_sums_equal_the_per_block_tree_bit_for_bit(small, client):
    """An evaluation task sums a chunk of C blocks (C a power of two) in the block tree's own order: the same bits
    for every chunk size, worker count and executor as one task per block (the fixed tree over all blocks)."""
    from pipeline.engine import LocalExec, tree
    from pipeline.refit import chunk_blocks, tree_sum

    rng = np.random.default_rng(5)
    for n in range(1, 40):  # tree_sum is tree()'s order, an odd last item carried at every level
        items = [rng.standard_normal(7) * 10.0 ** rng.integers(-8, 8) for _ in range(n)]
        assert tree_sum(iter(items)).tobytes() == tree(LocalExec(), items, np.add).tobytes()
    store, model = small
    S = model.coef_indices
    theta = np.append(rng.standard_normal(S.size), 0.2)
    got = set()
    for c, chunk in ((client, None), (None, None), (client, 1), (client, 2), (None, 1 << 10)):
        prob = RefitProblem(store, S, l2=1e-3, client=c)
        n_blocks = len(prob.data.keys)
        assert n_blocks >= 5 and prob.chunk == chunk_blocks(n_blocks, 2 if c is not None else 1)
        prob.chunk = chunk or prob.chunk
        got.add(prob.sums(theta[:-1], theta[-1]).tobytes())
    assert len(got) == 1
    assert [chunk_blocks(n, 2) for n in (1, 5, 33, 330)] == [1, 4, 16, 32]


def test_cli_process_runs_blas_on_one_thread():
    """The refit's L-BFGS-B calls BLAS, whose multithreaded sums depend on the thread count: the command sets one
    thread before NumPy loads (a value the user exported is kept)."""
    import os
    import subprocess
    import sys

    code = "import cli.main, os; print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['OMP_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split() == ["1", "1"]
    env["OPENBLAS_NUM_THREADS"] = "3"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split() == ["3", "1"]


def test_logistic_optimum_equals_scikit_learn(small):
    from sklearn.linear_model import LogisticRegression

    store, model = small
    l2 = 1e-4
    r = refit(model, store, l2=l2, l1=0, max_iter=500, tol=1e-9)
    X, y = train_matrix(store, model.coef_indices)
    sk = LogisticRegression(C=1.0 / (y.size * l2), tol=1e-12, max_iter=20000).fit(X, y)
    w = r.dense_weights()[model.coef_indices]
    np.testing.assert_allclose(w, sk.coef_.ravel(), rtol=2e-4, atol=2e-4 * np.abs(w).max())
    assert abs(r.bias - sk.intercept_[0]) < 1e-4 * max(1.0, abs(r.bias))
    info = r.meta["refit"]
    assert info["converged"] and info["grad_max"] < 1e-6 and info["objective"] < info["objective_start"]


def test_take_rows_equals_scipy_row_selection():
    rng = np.random.default_rng(5)
    X = sp.random(50, 30, density=0.2, random_state=2, format="csr", dtype=np.float32)
    for rows in (np.array([], dtype=np.int64), np.array([0, 3, 4, 49]), np.flatnonzero(rng.random(50) < 0.3)):
        ip, ix, v = K.take_rows(X.indptr.astype(np.int64), X.indices, X.data, rows.astype(np.int64))
        ref = X[rows]
        np.testing.assert_array_equal(ip, ref.indptr)
        np.testing.assert_array_equal(ix, ref.indices)
        np.testing.assert_array_equal(v, ref.data)


def test_l1_solve_equals_scikit_learn_l1_logistic_with_exact_zeros(small):
    """With an L1 penalty the refit on S is L1-regularised logistic regression restricted to S: the optimum of
    scikit-learn's saga solver (unpenalised intercept) at C = 1/(n·l1), exact zeros included."""
    from pipeline.refit import solve

    store, model = small
    S = model.coef_indices
    X, y = train_matrix(store, S)
    l1 = 2e-3
    prob = RefitProblem(store, S, l2=0.0)
    theta, res = solve(prob, np.zeros(S.size + 1), l1, max_iter=2000, tol=1e-10)
    sk = l1_logistic(1.0 / (y.size * l1), "saga", tol=1e-10, max_iter=100000)
    sk.fit(X, y)

    def objective(w, b):
        return np.mean(np.logaddexp(0.0, -y * (X @ w + b))) + l1 * np.abs(w).sum()

    w_sk = sk.coef_.ravel()
    assert objective(theta[:-1], theta[-1]) <= objective(w_sk, sk.intercept_[0]) + 1e-9
    np.testing.assert_allclose(theta[:-1], w_sk, atol=2e-3 * np.abs(w_sk).max())
    zeros = theta[:-1] == 0.0
    assert 0 < zeros.sum() < S.size                       # exact zeros, and not all of them
    assert (zeros == (np.abs(w_sk) < 1e-6)).mean() > 0.97  # the same support, up to saga's tolerance


def test_l1_solve_on_a_working_set_reaches_the_optimum_over_all_of_S(small):
    """The L1 solve runs on a working set (supp(x0) and the KKT violators at x0, grown by the violators after each
    round): from a start whose support misses most of the solution's (a larger λ's solution), it still reaches
    scikit-learn's optimum over all of S, it did take more than one round, and every column of S it holds at 0
    passes the KKT test |∂F/∂w_j| ≤ l1 (to the solve's tolerance)."""
    from pipeline import refit as R
    from pipeline.refit import solve

    store, model = small
    S = model.coef_indices
    X, y = train_matrix(store, S)
    prob = RefitProblem(store, S, l2=0.0)
    start, _ = solve(prob, np.zeros(S.size + 1), 2e-2, max_iter=2000, tol=1e-10)
    l1 = 1e-3
    theta, res = solve(prob, start, l1, max_iter=3000, tol=1e-10)
    assert np.count_nonzero(start[:-1]) < 0.5 * np.count_nonzero(theta[:-1])
    assert res.rounds > 1 and res.working_set < S.size
    assert 0 < len(R._RECENT) <= R.RESTRICT_KEEP  # the worker (here: this process) keeps the last few W only
    sk = l1_logistic(1.0 / (y.size * l1), "saga", tol=1e-10, max_iter=100000).fit(X, y)

    def objective(w, b):
        return np.mean(np.logaddexp(0.0, -y * (X @ w + b))) + l1 * np.abs(w).sum()

    w_sk = sk.coef_.ravel()
    assert objective(theta[:-1], theta[-1]) <= objective(w_sk, sk.intercept_[0]) + 1e-9
    np.testing.assert_allclose(theta[:-1], w_sk, atol=2e-3 * np.abs(w_sk).max())
    _, g = prob.evaluate(theta)
    zero = theta[:-1] == 0.0
    assert zero.any() and np.all(np.abs(g[:-1][zero]) <= l1 + 1e-10 * prob.precondition()[zero])


def test_a_working_set_solve_reported_converged_passes_the_kkt_test_on_all_of_S(small):
    """Whatever the iteration budget, an L1 solve that reports success satisfies the KKT conditions on every column
    of S (not only on its working set), and one that does not is never reported converged."""
    from pipeline.refit import solve

    store, model = small
    S = model.coef_indices
    prob = RefitProblem(store, S, l2=0.0)
    start, _ = solve(prob, np.zeros(S.size + 1), 2e-2, max_iter=2000, tol=1e-8)
    l1, tol, sc = 1e-3, 1e-6, prob.precondition()
    seen = set()
    for budget in (1, 3, 10, 30, 100, 1000):
        theta, res = solve(prob, start, l1, max_iter=budget, tol=tol)
        g = prob.evaluate(theta)[1][:-1]
        zero = theta[:-1] == 0.0
        kkt = bool(np.all(np.abs(g[zero]) / sc[zero] - l1 / sc[zero] <= tol))
        assert not res.success or kkt
        assert res.nit <= budget
        seen.add(bool(res.success))
    assert seen == {False, True}


def test_kkt_rounds_reach_the_l1_optimum_over_all_columns(small, client):
    """From a support that misses columns of the L1 solution, the KKT check finds violators (report only: the
    model is the restricted one) and the expansion rounds reach the optimum over every column: scikit-learn's on
    the full width (the objective, the non-zeros), with no violator left."""
    store, model = small
    l1 = 2e-3
    narrow = Model(model.n_features, model.coef_indices[::3], model.coef_values[::3], model.bias, meta=model.meta)
    kw = dict(l1=l1, l2=0.0, max_iter=3000, tol=1e-10)
    only = refit(narrow, store, kkt_rounds=0, **kw)
    plain = refit(narrow, store, **kw)
    np.testing.assert_array_equal(only.coef_values, plain.coef_values)
    assert only.meta["refit"]["kkt"]["violators"] > 0 and only.meta["refit"]["kkt"]["max_ratio"] > 1.1
    full = refit(narrow, store, kkt_rounds=10, client=client, **kw)
    info = full.meta["refit"]["kkt"]
    assert info["rounds"] >= 1 and info["violators"] == 0 and info["max_ratio"] <= 1.0 + 1e-3
    st = open_store(store)
    blocks = list(st.blocks("train"))
    X = sp.vstack([b.X for b in blocks]).tocsr().astype(np.float64)
    y = np.concatenate([b.y for b in blocks])
    sk = l1_logistic(1.0 / (y.size * l1), "saga", tol=1e-10, max_iter=100000).fit(X, y)

    def objective(w, b):
        return np.mean(np.logaddexp(0.0, -y * (X @ w + b))) + l1 * np.abs(w).sum()

    ours, theirs = objective(full.dense_weights(), full.bias), objective(sk.coef_.ravel(), sk.intercept_[0])
    assert ours <= theirs + 1e-7 and objective(plain.dense_weights(), plain.bias) > ours + 1e-4
    assert set(np.flatnonzero(np.abs(sk.coef_.ravel()) > 1e-4)) <= set(full.coef_indices.tolist())


def accepted(cands: list, select: str) -> list:
    """The entries the rule accepts: the lowest validation loss ("min"), within one standard error of it
    ("one-se"), or not worse than it by more than the standard error of their paired differences ("paired", as
    recorded for the final choice's candidates)."""
    if select == "paired":
        assert min(p["val_gap"] for p in cands) == 0.0
        return [p for p in cands if p["val_gap"] <= p["val_gap_se"]]
    best = min(cands, key=lambda p: p["val_loss"])
    return [p for p in cands if p["val_loss"] <= best["val_loss"] + (best["val_se"] if select == "one-se" else 0)]


@pytest.mark.parametrize("select", ["min", "one-se", "paired"])
def test_auto_l1_is_chosen_on_training_rows_only_and_keeps_a_subset_of_s(wide, select):
    """The validated path: the chosen penalty is a path point (the lowest validation loss, or the sparsest within
    one standard error of it), the path's validation losses come from training rows (never the holdout), the
    result is supported on S with exact zeros, and the split is seeded."""
    from pipeline.refit import L2_GRID

    store, model = wide
    r = refit(model, store, relax=True, adaptive=False, select=select)
    info = r.meta["refit"]
    path = info["l1_path"]
    chosen = [p for p in path if p.get("chosen")]
    assert len(chosen) == 1 and info["l1"] == chosen[0]["l1"] > 0 and info["validation"] == 0.2
    assert info["l2"] == chosen[0]["l2"] and info["adaptive"] is None and info["select"] == select
    within = accepted(path, select)
    assert chosen[0] in within and chosen[0]["nnz"] == min(p["nnz"] for p in within)
    rows = sum(e["rows"] for e in open_store(store).entries("train"))
    assert sorted({p["l2"] for p in path}) == sorted(c / rows for c in L2_GRID)  # a lasso path at each l2
    for l2 in L2_GRID:
        seg = [p for p in path if p["l2"] == l2 / rows]
        lasso = [p for p in seg if p["phi"] == 1.0 and not p.get("refined")]
        assert all(p["l1"] > q["l1"] for p, q in zip(lasso, lasso[1:]))  # decreasing penalties
        refined = [p for p in seg if p.get("refined")]  # between the coarse choice and the next larger λ
        assert len(refined) == 2 and any(a["l1"] > refined[1]["l1"] > refined[0]["l1"] > b["l1"]
                                         for a, b in zip(lasso, lasso[1:]))
    relaxed = [p for p in path if p["phi"] < 1.0]
    assert relaxed and info["relax"] == chosen[0]["phi"]
    for p in relaxed:  # φ·λ_k on the support of the lasso at λ_k: never more columns
        point = next(q for q in path if q["phi"] == 1.0 and q["l1"] == p["l1_select"] and q["l2"] == p["l2"])
        assert p["l1"] == pytest.approx(p["phi"] * point["l1"]) and p["nnz"] <= point["nnz"]
    assert set(r.coef_indices.tolist()) <= set(model.coef_indices.tolist()) and r.nnz < model.nnz
    again = refit(model, store, relax=True, adaptive=False, select=select)
    np.testing.assert_array_equal(again.coef_values, r.coef_values)
    plain = refit(model, store).meta["refit"]  # the default path: lasso and adaptive points, none relaxed
    assert plain["relax"] == 1.0 and all(p["phi"] == 1.0 for p in plain["l1_path"])


def test_a_failing_l2_segment_stops_the_other_and_raises(small):
    """The validated path's l2 segments run in threads: when one fails, the other stops at its next evaluation (a
    whole segment is hundreds) and the failure reaches the caller; the problem then refuses to evaluate."""
    from pipeline.refit import PATH_DECADES, PATH_PATIENCE, PATH_PER_DECADE, PATH_REFINE, _lasso_segments

    store, model = small
    prob = RefitProblem(store, model.coef_indices, l2=1e-3, split=(0.2, 0))
    args = (60, 1e-6, PATH_PER_DECADE, PATH_DECADES, PATH_PATIENCE, PATH_REFINE, "min")
    whole = RefitProblem(store, model.coef_indices, l2=1e-3, split=(0.2, 0))
    _lasso_segments(whole, (1e-3,), *args)
    assert whole.evaluations > 100
    with pytest.raises(ValueError, match="could not convert"):
        _lasso_segments(prob, (1e-3, "not a penalty"), *args)
    assert prob.evaluations < whole.evaluations / 4
    with pytest.raises(RuntimeError, match="cancelled"):
        prob.evaluate(np.zeros(model.coef_indices.size + 1))


def test_adaptive_solve_equals_the_lasso_on_rescaled_columns(small):
    """solve(..., weights=a): λ·Σ a_j|w_j| is the lasso on the columns x_j / a_j (Zou 2006, §3.5): the optimum of
    scikit-learn's saga on the rescaled columns, mapped back (w_j = v_j / a_j), exact zeros included; columns
    outside ``active`` stay exactly 0."""
    from pipeline.refit import solve

    store, model = small
    S = model.coef_indices
    X, y = train_matrix(store, S)
    rng = np.random.default_rng(5)
    active = rng.random(S.size) < 0.8
    a = np.where(active, rng.uniform(1.0, 4.0, S.size), 0.0)
    l1 = 1e-3
    prob = RefitProblem(store, S, l2=0.0)
    theta, _ = solve(prob, np.zeros(S.size + 1), l1, max_iter=3000, tol=1e-10, active=active, weights=a)
    assert np.all(theta[:-1][~active] == 0.0)
    Xa = X[:, np.flatnonzero(active)] @ sp.diags(1.0 / a[active])
    sk = l1_logistic(1.0 / (y.size * l1), "saga", tol=1e-10, max_iter=100000)
    sk.fit(Xa, y)
    w_sk = np.zeros(S.size)
    w_sk[active] = sk.coef_.ravel() / a[active]

    def objective(w, b):
        return np.mean(np.logaddexp(0.0, -y * (X @ w + b))) + l1 * (a * np.abs(w)).sum()

    assert objective(theta[:-1], theta[-1]) <= objective(w_sk, sk.intercept_[0]) + 1e-9
    np.testing.assert_allclose(theta[:-1], w_sk, atol=2e-3 * np.abs(w_sk).max())
    zeros = theta[:-1][active] == 0.0
    assert 0 < zeros.sum() < active.sum()


@pytest.mark.parametrize("select", ["min", "one-se", "paired"])
def test_adaptive_path_stays_on_the_chosen_lassos_support_and_must_beat_it(wide, select):
    """The adaptive entries: penalties decreasing from the chosen lasso's λ (chosen by the rule), at its l2, never
    more columns than it; they are candidates only when their best beats the lasso's best by its standard error;
    the model is the final fit at the entry the rule chooses among the candidates (weights recorded),
    deterministic."""
    store, model = wide
    r = refit(model, store, select=select)
    info = r.meta["refit"]
    path = info["l1_path"]
    lasso = [p for p in path if "adaptive" not in p]
    ada = [p for p in path if "adaptive" in p]
    assert ada and all(p["adaptive"] == 1.0 for p in ada)
    init = next(p for p in lasso if p["l1"] == ada[0]["l1_select"] and p["l2"] == ada[0]["l2"])
    if select != "paired":  # (the paired statistics recorded are the final choice's, over all candidates)
        assert init in accepted(lasso, select) and init["nnz"] == min(p["nnz"] for p in accepted(lasso, select))
    assert ada[0]["l1"] == init["l1"] and all(p["l1"] > q["l1"] for p, q in zip(ada, ada[1:]))
    assert all(p["nnz"] <= init["nnz"] and p["l2"] == init["l2"] for p in ada)
    lbest = min(lasso, key=lambda p: p["val_loss"])
    admitted = min(p["val_loss"] for p in ada) + lbest["val_se"] < lbest["val_loss"]
    cands = lasso + (ada if admitted else [])
    within = accepted(cands, select)
    chosen = next(p for p in path if p.get("chosen"))
    assert chosen in within and chosen["nnz"] == min(p["nnz"] for p in within)
    assert info["adaptive"] == chosen.get("adaptive") and info["l2"] == chosen["l2"]
    assert info["l1_rule"] == "validated path (adaptive)"
    assert set(r.coef_indices.tolist()) <= set(model.coef_indices.tolist())
    np.testing.assert_array_equal(refit(model, store, select=select).coef_values, r.coef_values)


def test_relaxed_solve_holds_inactive_columns_at_zero_and_equals_the_solve_on_the_subset(wide):
    """solve(..., active): the columns outside the mask stay exactly 0 and the rest equal the L1 solve of the
    problem built on the subset of S (the relaxed lasso's refit on S_λ)."""
    from pipeline.refit import RefitProblem, solve

    store, model = wide
    support = np.sort(model.coef_indices)
    prob = RefitProblem(store, support, l2=1e-4)
    active = np.zeros(support.size, dtype=bool)
    active[::3] = True
    x, res = solve(prob, np.zeros(support.size + 1), 1e-3, active=active, max_iter=500, tol=1e-9)
    assert np.all(x[:-1][~active] == 0.0) and np.count_nonzero(x[:-1]) > 0
    sub = RefitProblem(store, support[active], l2=1e-4)
    y, _ = solve(sub, np.zeros(active.sum() + 1), 1e-3, max_iter=500, tol=1e-9)
    def objective(pr, t):
        return pr.evaluate(t)[0] + 1e-3 * np.abs(t[:-1]).sum()

    assert objective(prob, x) == pytest.approx(objective(sub, y), rel=1e-7)
    np.testing.assert_allclose(x[np.append(active, True)], y, atol=1e-4)


def test_auto_is_the_l2_refit_when_rows_are_many_per_selected_column(small, wide):
    """With at least AUTO_ROWS_PER_COLUMN training rows per column of S, "auto" skips the validated path: the
    result is the plain L2 refit's, bit for bit, and the rule is recorded."""
    from pipeline.refit import AUTO_ROWS_PER_COLUMN

    store, model = small
    rows = sum(e["rows"] for e in open_store(store).entries("train"))
    k = rows // AUTO_ROWS_PER_COLUMN
    few = Model(model.n_features, model.coef_indices[:k], model.coef_values[:k], model.bias, meta=model.meta)
    auto, l2 = refit(few, store, max_iter=40), refit(few, store, l1=0, max_iter=40)
    assert auto.meta["refit"]["l1"] == 0.0 and auto.meta["refit"]["l1_path"] is None
    assert auto.meta["refit"]["l1_rule"].startswith("rows >=")
    np.testing.assert_array_equal(auto.coef_values, l2.coef_values)
    assert wide[1].nnz * AUTO_ROWS_PER_COLUMN > rows
    assert refit(wide[1], store, max_iter=5).meta["refit"]["l1_rule"] == "validated path (adaptive)"


def test_a_store_too_small_to_validate_gets_the_l2_refit(tmp_path):
    """`train --algo stsgd` (refit "auto") on a 4-row store: its validation share would be empty (a NaN loss made
    the path crash); the refit is the plain L2 one on the learner's support, and the rule says why."""
    from pipeline.refit import MIN_VALIDATION_ROWS

    svm = tmp_path / "tiny.svm"
    svm.write_text("1 1:0.5 3:1\n-1 2:1\n1 1:1 4:2\n-1 3:1\n")
    ingest([str(svm)], str(tmp_path / "tiny.zarr"))
    out = tmp_path / "m.npz"
    r = CliRunner().invoke(app, ["train", str(tmp_path / "tiny.zarr"), "--algo", "stsgd", "--out", str(out)])
    assert r.exit_code == 0, r.output
    m = load_model(str(out))
    assert m.meta["refit"]["l1"] == 0.0 and m.meta["refit"]["l1_path"] is None
    assert m.meta["refit"]["l1_rule"].startswith(f"4 training rows: fewer than {MIN_VALIDATION_ROWS}")
    assert set(m.coef_indices) <= {0, 1, 2, 3} and np.isfinite(m.coef_values).all() and np.isfinite(m.bias)


def test_paired_differences_over_the_validation_rows_equal_numpy(small):
    """RefitProblem.paired: mean and standard error of ℓ(model c) − ℓ(model ref) over the seeded validation rows of
    every training block, against NumPy on the store's rows restricted to S; the reference's own gap is exactly 0."""
    from pipeline.refit import validation_rows

    store, model = small
    support = np.sort(np.asarray(model.coef_indices, dtype=np.int64))
    prob = RefitProblem(store, support, l2=1e-4, split=(0.2, 5))
    rng = np.random.default_rng(0)
    thetas = [np.append(rng.standard_normal(support.size) * k, b) for k, b in ((1.0, 0.0), (0.5, 0.7), (0.1, -0.2))]
    mean, se = prob.paired(thetas, 1)
    rows, ys = [], []
    for b, blk in enumerate(open_store(store).blocks("train")):
        keep = validation_rows(blk.y.shape[0], 0.2, 5, b)
        rows.append(blk.X.tocsc()[:, support].tocsr()[keep])
        ys.append(blk.y[keep])
    X, y = sp.vstack(rows).toarray().astype(np.float64), np.concatenate(ys)
    losses = np.stack([np.logaddexp(0.0, -y * (X @ t[:-1] + t[-1])) for t in thetas], axis=1)
    d = losses - losses[:, [1]]
    np.testing.assert_allclose(mean, d.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(se, d.std(axis=0, ddof=1) / np.sqrt(y.size), rtol=1e-7, atol=1e-12)
    assert mean[1] == 0.0 and se[1] == 0.0 and y.size > 0
    assert losses[:, 0].mean() == pytest.approx(prob.evaluate(thetas[0], "val", l2=0.0)[0], rel=1e-10)


def test_validation_rows_are_seeded_per_block():
    from pipeline.refit import validation_rows

    a = validation_rows(10000, 0.2, 3, 1)
    assert a.dtype == bool and abs(a.mean() - 0.2) < 0.02
    np.testing.assert_array_equal(a, validation_rows(10000, 0.2, 3, 1))
    assert (a != validation_rows(10000, 0.2, 3, 2)).any() and (a != validation_rows(10000, 0.2, 4, 1)).any()


def test_squared_optimum_equals_closed_form_ridge(small):
    store, model = small
    l2 = 1e-3
    r = refit(model, store, l2=l2, l1=0, loss="squared", max_iter=1000, tol=1e-10)
    X, y = train_matrix(store, model.coef_indices)
    n, s = X.shape
    A = np.hstack([X.toarray(), np.ones((n, 1))])
    P = np.diag(np.append(np.full(s, n * l2), 0.0))  # the bias is not penalised
    ref = np.linalg.solve(A.T @ A + P, A.T @ y)
    np.testing.assert_allclose(r.dense_weights()[model.coef_indices], ref[:-1], rtol=1e-4, atol=1e-5)
    assert abs(r.bias - ref[-1]) < 1e-5


def test_support_is_kept_metadata_recorded_and_learner_state_kept(small, tmp_path):
    store, model = small
    assert model.states is not None
    r = refit(model, store, l1=0, max_iter=30)
    S = set(model.coef_indices.tolist())
    assert r.nnz > 0 and set(r.coef_indices.tolist()) <= S and r.nnz >= model.nnz - 1
    assert r.n_features == model.n_features and r.states is model.states and r.gstate is model.gstate
    assert r.meta["algorithm"] == "ftrl" and r.meta["hyper"] == model.meta["hyper"]
    info = r.meta["refit"]
    assert {"l1", "l2", "loss", "iterations", "evaluations", "objective", "grad_norm", "seconds"} <= set(info)
    assert info["support"] == model.nnz and info["loss"] == "logistic" and info["iterations"] <= 30
    r.save(tmp_path / "r.npz")
    back = load_model(tmp_path / "r.npz")
    assert back.meta["refit"]["l2"] == info["l2"] and len(back.states) == len(model.states)
    for a, b in zip(back.states, model.states):  # the sparse learner's optimiser state, saved with the refit
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    np.testing.assert_array_equal(back.coef_indices, r.coef_indices)
    # the file keeps the weights the refit started from: the sparse learner's, also through a refit of the refit
    for m in (back, refit(back, store, l1=0, max_iter=5)):
        idx, val, bias = m.learner
        np.testing.assert_array_equal(idx, model.coef_indices)
        np.testing.assert_array_equal(val, model.coef_values)
        assert bias == model.bias
    assert load_model(tmp_path / "r.npz", state=False).learner is None  # scoring reads the weights only
    # as --init-model: the same algorithm resumes the learner; another warm-starts from the learner's weights
    assert fit(store, "ftrl", FTRL, passes=1, paths=1, init_model=back, evaluate=False).meta["provenance"]["resumed"]
    warm = fit(store, "sgd", {}, passes=1, paths=1, init_model=back, evaluate=False)
    assert not warm.meta["provenance"]["resumed"] and warm.meta["provenance"]["warm_from"] == "learner"
    from_learner = fit(store, "sgd", {}, passes=1, paths=1, init_model=model, evaluate=False)
    assert from_learner.meta["provenance"]["warm_from"] == "model"
    np.testing.assert_array_equal(warm.coef_values, from_learner.coef_values)
    np.testing.assert_array_equal(warm.coef_indices, from_learner.coef_indices)
    assert warm.bias == from_learner.bias
    r_only = load_model(tmp_path / "r.npz")
    r_only.learner = None  # a model without its learner (a file from before) warm-starts from its own weights
    other = fit(store, "sgd", {}, passes=1, paths=1, init_model=r_only, evaluate=False)
    assert not np.array_equal(other.dense_weights(), warm.dense_weights())


def test_hinge_model_is_refitted_with_logistic_loss(small):
    store, _ = small
    m = fit(store, "tg", {"loss": "hinge", "gravity": 3e-3}, passes=2, paths=1, evaluate=False)
    r = refit(m, store, max_iter=5)
    assert r.meta["refit"]["loss"] == "logistic"
    with pytest.raises(ValueError, match="logistic or squared"):
        refit(m, store, loss="hinge")


def test_holdout_blocks_are_never_read(small, tmp_path):
    store, model = small
    poisoned = tmp_path / "p.zarr"
    shutil.copytree(store, poisoned)
    st = open_store(poisoned)
    assert st.entries("holdout")
    for e in st.entries("holdout"):
        g = f"{poisoned}/blocks/{e['key']}"
        fmt.write_array(g, "data", np.full(e["nnz"], np.nan, dtype=np.float32))
        fmt.write_array(g, "labels", np.full(e["rows"], 7.0, dtype=np.float32))
    clean = refit(model, store, max_iter=20)
    dirty = refit(model, str(poisoned), max_iter=20)
    assert np.isfinite(dirty.coef_values).all()
    np.testing.assert_array_equal(clean.coef_indices, dirty.coef_indices)
    np.testing.assert_array_equal(clean.coef_values, dirty.coef_values)
    assert clean.bias == dirty.bias


def test_refit_recovers_the_true_weights_as_rows_grow(synth_stores):
    """Known sparse model w* (logistic noise of scale s: the logistic regression's target is w*/s): on the true
    support the refit's correlation with w* rises with the rows and its error falls, and it is closer to w*
    than the sparse (FTRL) model it starts from."""
    res = {}
    for rows, (store, truth, s) in synth_stores.items():
        t = truth["values"] / s
        m = fit(store, "ftrl", FTRL, passes=5, paths=1, evaluate=False)
        r = refit(m, store, l2=1e-6, l1=0)

        def score(model):
            w = model.dense_weights()[truth["indices"]]
            return np.corrcoef(w, t)[0, 1], np.linalg.norm(w - t) / np.linalg.norm(t)

        res[rows] = score(m), score(r)
    (c_m2, e_m2), (c_r2, e_r2) = res[2000]
    (c_m16, e_m16), (c_r16, e_r16) = res[16000]
    assert c_r16 > c_r2 + 0.1 and e_r16 < e_r2 - 0.1     # measured: 0.74 -> 0.99, 0.74 -> 0.36
    assert c_r2 > c_m2 and c_r16 > c_m16                  # measured: 0.62 vs 0.74, 0.979 vs 0.991
    assert e_r2 < e_m2 and e_r16 < e_m16                  # measured: 0.92 vs 0.74, 0.61 vs 0.36


def test_resume_through_a_refitted_model_equals_the_uninterrupted_run(small):
    """The refitted model keeps the learner's state: 2 passes (refit) + 3 passes (refit) == 5 passes (refit)."""
    store, _ = small
    opts = {"l1": 0, "max_iter": 20}
    five = fit(store, "ftrl", FTRL, passes=5, paths=2, evaluate=False, refit=opts)
    two = fit(store, "ftrl", FTRL, passes=2, paths=2, evaluate=False, refit=opts)
    more = fit(store, "ftrl", FTRL, passes=3, paths=2, evaluate=False, refit=opts, init_model=two)
    assert more.meta["provenance"]["resumed"] and more.meta["passes"] == five.meta["passes"] == 5
    assert not np.array_equal(two.coef_values, more.coef_values)
    np.testing.assert_array_equal(more.coef_indices, five.coef_indices)
    np.testing.assert_array_equal(more.coef_values, five.coef_values)
    assert more.bias == five.bias


def test_a_refit_that_fits_in_one_budget_runs_on_threads_here_with_the_workers_bits(small, client):
    """On a cluster started in this process (``--workers N``) a refit whose compacted blocks fit in one cache
    budget runs on this process's threads (no round trip to the workers per evaluation); one byte less of budget
    keeps it on the workers; a client of the same cluster joined by address (``--scheduler``) keeps the workers
    too. The model is the same bit for bit everywhere."""
    from distributed import Client

    from pipeline.refit import compacted_bytes

    store, model = small
    need = compacted_bytes(open_store(store), np.sort(model.coef_indices))
    kw = dict(l1=0, max_iter=40)
    here = refit(model, store, client=client, cache_bytes=need, **kw)
    there = refit(model, store, client=client, cache_bytes=need - 1, **kw)
    with Client(client.scheduler.address) as joined:
        joined_fit = refit(model, store, client=joined, cache_bytes=need, **kw)
    assert here.meta["refit"]["cache"]["executor"] == "threads"
    assert there.meta["refit"]["cache"]["executor"] == joined_fit.meta["refit"]["cache"]["executor"] == "workers"
    for other in (there, joined_fit):
        np.testing.assert_array_equal(other.coef_indices, here.coef_indices)
        np.testing.assert_array_equal(other.coef_values, here.coef_values)
        assert other.bias == here.bias


def test_fit_with_refit_reports_the_refitted_holdout_metrics(small, client):
    from pipeline.evaluate import evaluate_store

    store, _ = small
    m = fit(store, "ftrl", FTRL, passes=3, paths=2, client=client, refit={"l2": 1e-5, "max_iter": 8})
    before = m.meta["refit"]["holdout_before"]
    now = evaluate_store(m, store, "holdout")
    assert before["n_rows"] == now["n_rows"] and m.meta["holdout"]["error"] == now["error"]
    assert m.meta["holdout"]["logloss"] == pytest.approx(now["logloss"], rel=1e-12)
    assert m.meta["refit"]["l2"] == 1e-5 and len(m.states) == 2


def test_passes_default_to_three_when_the_model_is_refitted_else_five(small, tmp_path):
    """`train` without --passes: 3 when the model is refitted (stsgd by default, any --refit), else 5; the library's
    fit() the same; a given --passes wins."""
    store, _ = small
    runs = {"stsgd": ([], 3), "stsgd-own": (["--no-refit"], 5), "sgd": (["--algo", "sgd"], 5),
            "sgd-refit": (["--algo", "sgd", "--refit", "--refit-l1", "0"], 3),
            "given": (["--no-refit", "--passes", "2"], 2)}
    for name, (extra, passes) in runs.items():
        r = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / f"{name}.npz"), *extra])
        assert r.exit_code == 0, r.output
        assert load_model(tmp_path / f"{name}.npz").meta["passes"] == passes, name
    assert fit(store, "sgd", evaluate=False).meta["passes"] == 5
    assert fit(store, "sgd", evaluate=False, refit={"l1": 0.0}).meta["passes"] == 3


def test_a_logged_refit_reports_its_passes_every_few_seconds(small, tmp_path, monkeypatch):
    """Not on a terminal, `train` reports a refit's progress on stderr (a JSON event with --json, else a line) at
    most every PROGRESS_EVERY_S seconds; 0 here: every pass over the support."""
    import pipeline.refit as R

    store, _ = small
    assert [c for c in _reports(3600.0, 5)] == [] and [n for n, _ in _reports(0.0, 5)] == [1, 2, 3, 4, 5]
    monkeypatch.setattr(R, "PROGRESS_EVERY_S", 0.0)
    r = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "m.npz"), "--passes", "1", "--json"])
    assert r.exit_code == 0, r.output
    events = [e for e in map(json.loads, filter(lambda x: x.startswith("{"), r.stderr.splitlines()))
              if e["event"] == "refit"]
    assert [e["passes"] for e in events] == list(range(1, len(events) + 1))  # the final evaluation's pass too
    assert len(events) >= load_model(tmp_path / "m.npz").meta["refit"]["evaluations"] > 1
    r = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "m.npz"), "--passes", "1"])
    assert r.exit_code == 0 and "refit on the support: 1 pass in " in r.stderr, r.output


def _reports(every: float, calls: int) -> list:
    from pipeline.refit import every_few_seconds

    got = []
    progress = every_few_seconds(lambda n, s: got.append((n, s)), every)
    for n in range(1, calls + 1):
        progress(n)
    return got


def test_cli_train_refit_end_to_end(small, tmp_path):
    store, _ = small
    out = tmp_path / "m.npz"
    r = CliRunner().invoke(app, ["train", store, "--out", str(out), "--algo", "ftrl", "--set", "l1=0.3",
                                 "--passes", "2", "--refit", "--refit-l2", "1e-4", "--refit-iters", "40", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    m = load_model(out)
    assert summary["refit"]["l2"] == 1e-4 and summary["refit"]["iterations"] <= 40
    assert summary["holdout"]["error"] == m.meta["holdout"]["error"]
    assert summary["refit"]["holdout_before"]["n_rows"] == m.meta["holdout"]["n_rows"]
    assert m.meta["refit"]["l2"] == 1e-4 and m.states is not None
    assert summary["refit"]["l1"] > 0 and summary["refit"]["nnz_before"] >= m.nnz
    # --init-model with another algorithm warm-starts from the refitted model's sparse learner, and says so
    rw = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "w0.npz"), "--algo", "sgd", "--passes", "1",
                                  "--init-model", str(out), "--json"])
    assert rw.exit_code == 0, rw.output
    assert json.loads(rw.stdout[rw.stdout.index("{"):])["warm_from"] == "learner"
    r2 = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "x.npz"), "--algo", "tg", "--refit-l2",
                                  "1e-3"])
    assert r2.exit_code == 2 and "--refit" in r2.output
    # without --algo: stsgd (pipeline.algorithms.DEFAULT_ALGO), which refits by default and so takes --refit-l2
    r2 = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "x.npz"), "--passes", "2", "--refit-l2",
                                  "1e-3"])
    assert r2.exit_code == 0, r2.output
    m2 = load_model(tmp_path / "x.npz")
    assert m2.algorithm == "stsgd" and m2.meta["refit"]["l2"] == 1e-3
    r3 = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "y.npz"), "--refit", "--refit-l1", "x"])
    assert r3.exit_code == 2 and "--refit-l1" in r3.output and not (tmp_path / "y.npz").exists()
    r4 = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "z.npz"), "--algo", "ftrl", "--set", "l1=3",
                                  "--passes", "2", "--refit", "--refit-l1", "0", "--json"])
    assert r4.exit_code == 0, r4.output
    assert json.loads(r4.stdout[r4.stdout.index("{"):])["refit"]["l1"] == 0.0
    # stsgd refits by default; --no-refit returns the learner's weights; --refit-relax needs a refit
    on, off = tmp_path / "on.npz", tmp_path / "off.npz"
    for out, extra in ((on, ["--refit-l1", "0"]), (off, ["--no-refit"])):
        r5 = CliRunner().invoke(app, ["train", store, "--out", str(out), "--algo", "stsgd", "--passes", "1", *extra])
        assert r5.exit_code == 0, r5.output
    assert load_model(on).meta["refit"]["l1"] == 0.0 and "refit" not in load_model(off).meta
    assert load_model(on).meta["refit"]["nnz_before"] == load_model(off).nnz
    r6 = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "w.npz"), "--algo", "tg", "--refit-relax"])
    assert r6.exit_code == 2 and "--refit-relax" in r6.output and not (tmp_path / "w.npz").exists()


def test_cli_refit_command_equals_the_api_and_leaves_the_input(small, tmp_path):
    store, model = small
    src = tmp_path / "m.npz"
    model.save(src)
    before = src.read_bytes()
    out = tmp_path / "r.npz"
    r = CliRunner().invoke(app, ["refit", str(src), store, "--out", str(out), "--l1", "auto", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    got = load_model(out)
    ref = refit(model, store)
    np.testing.assert_array_equal(got.coef_indices, ref.coef_indices)
    np.testing.assert_array_equal(got.coef_values, ref.coef_values)
    assert summary["nnz"] == got.nnz and summary["holdout"]["error"] == got.meta["holdout"]["error"]
    assert got.meta["refit"]["input_model"] == str(src) and src.read_bytes() == before
    # --workers 2 for a refit that runs on this process's threads anyway starts no cluster: the same model
    import distributed

    def no_cluster(*a, **k):
        raise AssertionError("a LocalCluster was started")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed, "LocalCluster", no_cluster)
        r2 = CliRunner().invoke(app, ["refit", str(src), store, "--out", str(tmp_path / "w.npz"), "--workers", "2"])
    assert r2.exit_code == 0, r2.output
    w = load_model(tmp_path / "w.npz")
    np.testing.assert_array_equal(w.coef_values, got.coef_values)
    assert w.meta["refit"]["cache"]["executor"] == "threads"
    bad = CliRunner().invoke(app, ["refit", str(src), store, "--out", str(tmp_path / "b.npz"), "--l1", "-1"])
    assert bad.exit_code == 2 and "--l1" in bad.output and not (tmp_path / "b.npz").exists()
    missing = CliRunner().invoke(app, ["refit", str(tmp_path / "none.npz"), store, "--out", str(tmp_path / "c.npz")])
    assert missing.exit_code == 1 and "none.npz" in missing.output and "Traceback" not in missing.output


def test_cli_no_adaptive_flags_equal_the_api_and_need_the_refit(wide, tmp_path):
    """`refit --no-adaptive` is refit(adaptive=False) (no adaptive entries in the path); train's
    --no-refit-adaptive without a refit is a usage error that writes nothing."""
    store, model = wide
    src, out = tmp_path / "m.npz", tmp_path / "r.npz"
    model.save(src)
    r = CliRunner().invoke(app, ["refit", str(src), store, "--out", str(out), "--no-adaptive", "--json"])
    assert r.exit_code == 0, r.output
    got, ref = load_model(out), refit(model, store, adaptive=False)
    np.testing.assert_array_equal(got.coef_values, ref.coef_values)
    assert got.meta["refit"]["adaptive"] is None and not any("adaptive" in p for p in got.meta["refit"]["l1_path"])
    bad = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "t.npz"), "--algo", "tg", "--passes", "1",
                                   "--no-refit-adaptive"])
    assert bad.exit_code == 2 and "--no-refit-adaptive" in bad.output and not (tmp_path / "t.npz").exists()


def test_cli_select_flag_equals_the_api_and_refuses_unknown_rules(wide, tmp_path):
    """`refit --select one-se` is refit(select="one-se"); an unknown rule, or train's --refit-select without a
    refit, is a usage error naming the flag that writes nothing."""
    store, model = wide
    src, out = tmp_path / "m.npz", tmp_path / "r.npz"
    model.save(src)
    r = CliRunner().invoke(app, ["refit", str(src), store, "--out", str(out), "--select", "one-se", "--json"])
    assert r.exit_code == 0, r.output
    got = load_model(out)
    np.testing.assert_array_equal(got.coef_values, refit(model, store, select="one-se").coef_values)
    assert got.meta["refit"]["select"] == "one-se"
    for args, flag in ((["refit", str(src), store, "--out", str(tmp_path / "x.npz"), "--select", "best"], "--select"),
                       (["train", store, "--out", str(tmp_path / "x.npz"), "--algo", "tg", "--passes", "1",
                         "--refit-select", "min"], "--refit-select"),
                       # the path's options with one given penalty: nothing they could change
                       (["refit", str(src), store, "--out", str(tmp_path / "x.npz"), "--l1", "1e-4", "--select",
                         "min"], "--select"),
                       (["refit", str(src), store, "--out", str(tmp_path / "x.npz"), "--l1", "0", "--relax"],
                        "--relax"),
                       (["train", store, "--out", str(tmp_path / "x.npz"), "--passes", "1", "--refit-l1", "0",
                         "--no-refit-adaptive"], "--no-refit-adaptive")):
        bad = CliRunner().invoke(app, args)
        assert bad.exit_code == 2 and flag in bad.output and not (tmp_path / "x.npz").exists()


def test_an_infinite_l1_penalty_is_refused_everywhere(tmp_path):
    from pipeline.refit import parse_l1
    from pipeline.retrain import load_job

    for bad in ("inf", "1e400", "-1", "nan"):
        with pytest.raises(ValueError, match="finite number >= 0"):
            parse_l1(bad)
    job = tmp_path / "job.toml"
    job.write_text(f'store = "{tmp_path}/s.zarr"\nregistry = "{tmp_path}/r"\n')
    for key, val in (("l1", float("inf")), ("l2", -1.0), ("max_iter", 0)):
        with pytest.raises(ValueError, match=f"refit.{key} has the wrong type or value"):
            load_job(job, {"refit": {key: val}})


def test_refit_command_on_another_store_and_on_a_training_window(tmp_path):
    """`sparsepipe refit` of a model trained on another store refits on all of this store's training blocks (the
    model's block keys name other rows there) and does not report the other store's "before" metrics; a model
    whose window lists training blocks only (the nightly job's) is still measured on its generations' holdout."""
    from typer.testing import CliRunner

    from cli.main import app
    from pipeline.model import load_model
    from pipeline.store.reader import open_store
    from pipeline.train import fit

    def run(*a):
        return CliRunner().invoke(app, [str(x) for x in a])

    for name, seed in (("a", 1), ("b", 2)):
        assert run("synth", tmp_path / f"{name}.svm", "--rows", "1500", "--features", "2000", "--nnz-per-row", "20",
                   "--seed", seed, "--model-seed", 7).exit_code == 0
        assert run("ingest", tmp_path / f"{name}.svm", "--out", tmp_path / f"{name}.zarr", "--block-mb", "0.02",
                   "--holdout", "0.2").exit_code == 0
    a, b = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    m = fit(a, "tg", {"gravity": 1e-3}, passes=2, paths=1, blocks=open_store(a).keys("train"))
    m.save(tmp_path / "m.npz")
    assert m.meta["provenance"]["blocks"] and m.meta["holdout"] is None  # a window without holdout blocks
    r = run("refit", tmp_path / "m.npz", a, "--out", tmp_path / "ra.npz", "--l1", "0")
    assert r.exit_code == 0, r.output
    assert load_model(tmp_path / "ra.npz").meta["holdout"]["n_rows"] == open_store(a).n_rows - sum(
        e["rows"] for e in open_store(a).entries("train"))
    r = run("refit", tmp_path / "m.npz", b, "--out", tmp_path / "rb.npz", "--l1", "0")
    assert r.exit_code == 0 and f"was trained on {a}" in r.output, r.output
    rb = load_model(tmp_path / "rb.npz")
    assert rb.meta["refit"]["holdout_before"] is None
    assert rb.meta["refit"]["n_rows"] == sum(e["rows"] for e in open_store(b).entries("train"))
