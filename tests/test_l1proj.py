"""--algo l1proj: projected SGD onto {‖w‖₁ ≤ Z} with the sparse tree projection (ALGORITHMS.md §4, §7 item 10)."""
import numpy as np
import pytest

from benchmarks.two_stage import make_store, regression_data
from pipeline.algorithms import make_algorithm
from pipeline.kernels.losses import LOSS_CODES
from pipeline.kernels.l1proj import clip_to_l1_ball
from pipeline.kernels.projection import l1tree_dense, l1tree_from_dense, l1tree_init, project_l1_sort
from pipeline.model import load_model
from pipeline.train import fit
from tests.conftest import data_file

KEYS = ("fnode", "inode", "sgn", "fsc", "isc")


def dense_reference(indptr, indices, data, y, rows, p, z, eta, loss, power_t):
    """Plain NumPy projected SGD: w ← P_{L1,z}(w − η_t ℓ'(w·x + b, y) x), b ← b − η_t ℓ'."""
    w, b = np.zeros(p), 0.0
    for t, i in enumerate(rows, start=1):
        x = np.zeros(p)
        x[indices[indptr[i]:indptr[i + 1]]] += data[indptr[i]:indptr[i + 1]]
        f = w @ x + b
        d = f - y[i] if loss == "squared" else -y[i] / (1 + np.exp(y[i] * f))
        e = eta / t ** power_t
        w = project_l1_sort(w - e * d * x, z)
        b -= e * d
    return w, b


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_kernel_equals_dense_reference(loss):
    indptr, indices, data, y, _ = regression_data(400, 60, 6, seed=2)
    if loss == "logistic":
        y = np.where(y > 0, 1.0, -1.0)
    z, eta = 1.5, 0.05
    algo = make_algorithm("l1proj", {"radius": z, "eta": eta, "loss": loss, "schedule": "sqrt"})
    st = algo.working_state(algo.init_path(60, 0))
    rows = np.random.default_rng(0).permutation(400).astype(np.int64)
    algo.advance(st, indptr, indices, data, y, rows, 0, 0)
    w_ref, b_ref = dense_reference(indptr, indices, data, y, rows, 60, z, eta, loss, 0.5)
    w = l1tree_dense(*(st[k] for k in KEYS))
    np.testing.assert_allclose(w, w_ref, atol=1e-9)
    assert st["fstate"][0] == pytest.approx(b_ref, abs=1e-9)
    assert np.abs(w).sum() <= z * (1 + 1e-12) and st["isc"][2] > 0  # projected, and feasible


def test_saved_weights_feasible_deterministic_and_resumable(tmp_path, client):
    from pipeline.ingest import IngestOptions, ingest

    store = str(tmp_path / "rcv1.zarr")
    ingest([str(data_file("rcv1_subset/rcv1_vw_small_train.svm"))], store,
           IngestOptions(block_mb=0.05, holdout=0.2), client=client)
    Z = 100.0
    opts = {"radius": Z, "eta": 0.3, "schedule": "constant"}
    full = fit(store, "l1proj", opts, passes=3, paths=2, seed=1, client=client)
    full.save(tmp_path / "f.npz")
    back = load_model(tmp_path / "f.npz")
    assert np.abs(back.coef_values).sum() <= Z and 0 < back.nnz < back.n_features
    assert full.meta["holdout"]["auc"] > 0.85  # ranking quality (the 0/1 error swings with the last rows seen)
    sgd = fit(store, "l1proj", {**opts, "radius": 1e9}, passes=3, paths=2, seed=1, client=None)
    assert sgd.nnz > full.nnz  # the constraint binds; with a huge radius l1proj is plain SGD
    m_inproc = fit(store, "l1proj", opts, passes=3, paths=2, seed=1, client=None)
    np.testing.assert_array_equal(full.dense_weights(), m_inproc.dense_weights())
    part = fit(store, "l1proj", opts, passes=1, paths=2, seed=1, client=client)
    part.save(tmp_path / "p.npz")
    res = fit(store, "l1proj", opts, passes=2, paths=2, seed=1, client=client, init_model=load_model(tmp_path / "p.npz"))
    assert res.meta["provenance"]["resumed"]
    np.testing.assert_array_equal(full.dense_weights(), res.dense_weights())
    assert full.bias == res.bias


def test_regression_store_squared_loss(tmp_path, client):
    store, truth = make_store(tmp_path, "r", 2000, 30, 6, seed=3, hetero=False, client=client)
    Z = 0.5 * float(np.abs(truth["w"]).sum())
    m = fit(store, "l1proj", {"radius": Z, "eta": 0.05, "loss": "squared"}, passes=2, paths=1, client=None)
    assert np.abs(m.coef_values).sum() <= Z and "rmse" in m.meta["holdout"]
    with pytest.raises(ValueError, match=r"labels are real numbers \(regression\); --algo tg with logistic loss "
                                         r"needs binary labels: use --loss squared"):
        fit(store, "tg", {}, passes=1, paths=1, client=None)
    # stsgd has no squared loss: the advice names the algorithms that have one
    with pytest.raises(ValueError, match=r"--algo stsgd has no squared loss; use --algo sgd or tg or .*ftrl.* with "
                                         r"--loss squared"):
        fit(store, "stsgd", {}, passes=1, paths=1, client=None)
    # stability measures the RMSE on a regression store
    from pipeline.stability import stability_runs

    res = stability_runs(store, "l1proj", {"radius": Z, "eta": 0.05, "loss": "squared"}, runs=2, passes=1)
    assert res["metric"] == "rmse" and res["rmse_mean"] > 0 and "error_mean" not in res
    assert [set(r) >= {"rmse", "seed"} for r in res["per_run"]] == [True, True]


def test_params_validated():
    for bad in ({"radius": 0.0}, {"radius": float("inf")}, {"loss": "nope"}, {"schedule": "x"}, {"eta": -1.0}):
        with pytest.raises(ValueError):
            make_algorithm("l1proj", bad)
    assert set(LOSS_CODES) >= {"squared"}


def test_int32_tree_state_bit_identical_to_int64(tmp_path, monkeypatch):
    """The int32 node links (default below 2**31 features, issue 13) give the int64 state's model bit for bit."""
    from pipeline.algorithms.l1proj import L1Projection
    from pipeline.kernels import projection as P
    from pipeline.kernels.l1proj import l1proj_block

    assert P.l1tree_init(10).inode.dtype == np.int32 and P.l1tree_index_dtype(2**31).type is np.int64
    with pytest.raises(ValueError):
        P.l1tree_index_dtype(2**31, np.int32)
    # whole fits (3 passes, 2 mixed paths, a warm start every stage): same weights and bias, bit for bit
    store, truth = make_store(tmp_path, "r", 1500, 80, 8, seed=5, hetero=False, client=None)
    opts = {"radius": 0.3 * float(np.abs(truth["w"]).sum()), "eta": 0.1, "loss": "squared"}
    models = {}
    for dt in (np.int32, np.int64):
        monkeypatch.setattr(L1Projection, "index_dtype", dt)
        algo = make_algorithm("l1proj", {})
        assert algo.working_state(algo.init_path(80, 0))["inode"].dtype == dt
        models[dt] = fit(store, "l1proj", opts, passes=3, paths=2, seed=1, client=None)
    w32, w64 = models[np.int32].dense_weights(), models[np.int64].dense_weights()
    assert w32.tobytes() == w64.tobytes() and models[np.int32].bias == models[np.int64].bias
    assert 0 < models[np.int32].nnz < 80  # the constraint binds
    # kernel with rebases, and every int32 priority comparison a tie of the stored top bits (column zeroed):
    # the full 63-bit priorities then decide, so the trees (links, sizes, key sums) match the int64 ones
    indptr, indices, data, y, _ = regression_data(2000, 300, 10, seed=6)
    rows = np.random.default_rng(2).permutation(2000).astype(np.int64)
    states = {}
    for dt in (np.int32, np.int64):
        s = P.l1tree_init(300, seed=9, rebase_factor=2.0, index_dtype=dt)
        if dt is np.int32:
            s.inode[:, P.I_PRIO] = 0
        ist, fst = np.zeros(1, np.int64), np.zeros(1)
        l1proj_block(indptr, indices, data, y, rows, *s, ist, fst, 0.1, 1, 0.5, 1.0, LOSS_CODES["squared"],
                     False, True)
        states[dt] = (s, ist, fst)
    (s32, i32, f32), (s64, i64, f64) = states[np.int32], states[np.int64]
    assert s64.isc[P.ISC_NREBASE] > 0 and s64.isc[P.ISC_NPROJ] > 0
    for k in ("fnode", "sgn", "fsc", "isc"):
        assert getattr(s32, k).tobytes() == getattr(s64, k).tobytes(), k
    np.testing.assert_array_equal(s32.inode[:, :P.I_PRIO], s64.inode[:, :P.I_PRIO])
    assert i32.tobytes() == i64.tobytes() and f32.tobytes() == f64.tobytes()


def test_tree_support_and_sparse_build_reference():
    """``l1tree_support`` is the non-zeros of ``l1tree_dense``; ``l1tree_from_sparse`` builds ``l1tree_from_dense``'s
    state bit for bit (NumPy references)."""
    from pipeline.kernels import projection as P

    indptr, indices, data, y, _ = regression_data(500, 200, 8, seed=3)
    s = P.l1tree_init(200, seed=4, rebase_factor=2.0)
    for i in range(500):
        lo, hi = indptr[i], indptr[i + 1]
        P.l1tree_update(s, indices[lo:hi], data[lo:hi] * y[i], 3.0, alpha=0.2)
    w = P.l1tree_dense(*s)
    idx, val = P.l1tree_support(s.fnode, s.sgn, s.fsc)
    assert 0 < idx.size < 200 and idx.dtype == np.int64
    np.testing.assert_array_equal(idx, np.flatnonzero(w))
    assert val.tobytes() == w[idx].tobytes()
    a, b = P.l1tree_from_dense(w, seed=4), P.l1tree_from_sparse(idx, val, 200, seed=4)
    for k in KEYS:
        assert getattr(a, k).tobytes() == getattr(b, k).tobytes(), k


class _TreeStateL1Proj:
    """The tree state kept between stages (the layout before the compact settled state): the reference for
    bit-identity of the compact state."""

    def init_path(self, n_features, path):
        return {**l1tree_init(n_features)._asdict(), "istate": np.zeros(1, np.int64), "fstate": np.zeros(1)}

    def working_state(self, state):
        return state

    def settle(self, state):
        return state

    def summarize(self, state):
        return {"w": l1tree_dense(*(state[k] for k in KEYS)), "bias": state["fstate"][:1].copy()}

    def combine(self, a, b):
        return {k: a[k] + b[k] for k in a}

    def decide(self, total, gstate, n_paths):
        w = clip_to_l1_ball(total["w"] / n_paths if n_paths > 1 else total["w"], self.params.radius)
        return {"w": w, "bias": total["bias"] / n_paths if n_paths > 1 else total["bias"]}, gstate, {}

    def apply(self, state, decision):
        return {**state, **l1tree_from_dense(decision["w"])._asdict(), "fstate": decision["bias"][:1].copy()}

    def weights(self, decision):
        return decision["w"], float(decision["bias"][0])


@pytest.mark.parametrize("frac", [0.05, 0.001])
def test_compact_state_bit_identical_to_tree_state(tmp_path, frac):
    """Non-zero weights between stages instead of the treap (issue 13 §1): the same model bit for bit as the tree
    kept between stages, over 3 passes of 3 mixed paths; the settled state holds no treap, and its weights are
    dense when mostly non-zero (77 of 80 at 0.05), packed when sparse (a small radius)."""
    from pipeline.algorithms.base import is_dense_form
    from pipeline.algorithms.l1proj import L1Projection
    from pipeline.engine import train

    store, truth = make_store(tmp_path, "r", 1500, 80, 8, seed=5, hetero=False, client=None)
    opts = {"radius": frac * float(np.abs(truth["w"]).sum()), "eta": 0.1, "loss": "squared"}
    ref_cls = type("TreeL1", (_TreeStateL1Proj, L1Projection), {})
    new, ref = (train(store, cls(make_algorithm("l1proj", opts).params), passes=3, paths=3, seed=2)
                for cls in (L1Projection, ref_cls))
    assert new.w.tobytes() == ref.w.tobytes() and new.bias == ref.bias and 0 < np.count_nonzero(new.w)
    assert set(new.states[0]) == {"w_idx", "w_val", "width", "istate", "fstate", "cursor"}
    nnz = np.count_nonzero(new.w)
    assert is_dense_form(new.states[0]["w_idx"], new.states[0]["w_val"]) == (2 * nnz >= 80) == (frac > 0.01), nnz


@pytest.mark.parametrize("density", [0.9, 0.02])
def test_settled_weights_no_larger_than_dense_and_exact(density):
    """Mostly non-zero weights are kept dense (8 bytes a feature, not 16 a non-zero), mostly zero ones packed; both
    build the treap of the weights bit for bit and settle back to the same arrays; the decision's weights too."""
    from pipeline.algorithms.base import is_dense_form

    p = 4000
    rng = np.random.default_rng(3)
    w = rng.normal(size=p) * (rng.random(p) < density)
    w /= 2 * np.abs(w).sum()  # inside the ball: the weights as they are
    algo = make_algorithm("l1proj", {"radius": 1.0})
    st = algo._set_weights(algo.init_path(p, 0), w, 0.25)
    kept = st["w_idx"].nbytes + st["w_val"].nbytes
    nnz = np.count_nonzero(w)
    assert is_dense_form(st["w_idx"], st["w_val"]) == (density > 0.5)
    assert kept == (8 * p if density > 0.5 else 16 * nnz) and kept <= 8 * p
    tree = algo.working_state(dict(st))
    ref = l1tree_from_dense(w)
    for k in KEYS:
        assert tree[k].tobytes() == getattr(ref, k).tobytes(), k
    again = algo.settle(tree)
    assert again["w_idx"].tobytes() == st["w_idx"].tobytes() and again["w_val"].tobytes() == st["w_val"].tobytes()
    total = algo.summarize(tree)
    dec, _, _ = algo.decide(total, {}, 1)
    assert dec["w_idx"].nbytes + dec["w_val"].nbytes <= 8 * p
    assert algo.weights(dec)[0].tobytes() == clip_to_l1_ball(l1tree_dense(*(tree[k] for k in KEYS)), 1.0).tobytes()
    # widened after it was settled
    wide = algo.working_state(algo.resize(st, p + 5))
    assert l1tree_dense(*(wide[k] for k in KEYS)).tobytes() == (np.concatenate([w, np.zeros(5)]) + 0.0).tobytes()  # (no −0.0)


def test_memory_estimate_is_the_dense_weights():
    from pipeline.memory import state_bytes

    algo = make_algorithm("l1proj", {})
    assert state_bytes(algo, 123_457)[0] == 8 * 123_457 + 8 + 8 + 8  # + width, istate, fstate
    assert state_bytes(algo, 123_457, fresh=True)[0] == 24
