"""Two-stage sparse learning (ALGORITHMS.md §3, §7 items 11-13): Epoch-GD schedule and feasibility, the L1∩L2
projection's KKT certificate, randomized sparsification, determinism, resume, regression end to end."""
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks.two_stage import make_store, regression_data
from cli.main import app
from pipeline.algorithms import make_algorithm
from pipeline.algorithms.base import unpack_nonzero
from pipeline.algorithms.two_stage import epoch_schedule
from pipeline.kernels import two_stage as K
from pipeline.kernels.losses import LOSS_CODES
from pipeline.kernels.projection import l1l2_kkt_residual, project_l1_l2
from pipeline.model import load_model
from pipeline.sparsify import bound_constant, draws_for_epsilon, sparsify_vector
from pipeline.train import fit
from tests.test_engine import same_model

OPTS = {"l1_radius": 30.0, "eta1": 0.01, "T1": 150}


@pytest.fixture(scope="module")
def store(tmp_path_factory, client):
    path, truth = make_store(tmp_path_factory.mktemp("ts"), "r", 3000, 40, 8, seed=1, client=client)
    return path


def test_epoch_schedule_values():
    for k in range(1, 8):
        T, eta, rho = epoch_schedule(k, 100, 0.4, 8.0)
        assert T == 100 * 2 ** (k - 1) and eta == pytest.approx(0.4 / 2 ** (k - 1))
        assert rho == pytest.approx(8.0 / np.sqrt(2) ** (k - 1))


def test_every_iterate_feasible_and_centre_is_the_epoch_average():
    """Row by row through the algorithm hooks: each iterate lies in the L1∩L2 domain of its epoch, equals the
    dense reference Π_k(w − η_k ℓ' x) and the next centre is the average of w_1..w_{T_k}; the schedule advances."""
    indptr, indices, data, y, _ = regression_data(700, 12, 5, seed=4)
    B, T1, eta1 = 2.0, 40, 0.05
    algo = make_algorithm("two-stage", {"l1_radius": B, "rho1": 1.0, "T1": T1, "eta1": eta1, "fit_bias": False})
    st = algo.working_state(algo.init_path(12, 0))
    g = algo.init_global(12)
    r, n_proj = 0, 0
    for k in range(1, 4):
        T, eta, rho = epoch_schedule(k, T1, eta1, 1.0)
        assert st["istate"][K.IS_TK] == T and st["fstate"][K.FS_ETA] == eta and st["fstate"][K.FS_RHO] == rho
        c = st["c"].copy()
        iterates = [st["w"].copy()]
        for t in range(T):
            x = np.zeros(12)
            x[indices[indptr[r]:indptr[r + 1]]] = data[indptr[r]:indptr[r + 1]]
            ref = project_l1_l2(iterates[-1] - eta * (iterates[-1] @ x - y[r]) * x, B, c, rho)
            consumed, done = algo.advance(st, indptr, indices, data, y, np.array([r]), 0, 0)
            r += 1
            w = st["w"]
            assert consumed == 1 and done == (t == T - 1)
            assert np.abs(w).sum() <= B * (1 + 1e-9) and np.linalg.norm(w - c) <= rho * (1 + 1e-9)
            np.testing.assert_allclose(w, ref, atol=1e-9)
            iterates.append(w.copy())
        assert algo.advance(st, indptr, indices, data, y, np.array([r]), 0, 0) == (0, True)  # waits
        n_proj = st["istate"][K.IS_NPROJ]
        dec, g, diag = algo.decide(algo.summarize({k2: v.copy() for k2, v in st.items()}), g, 1)
        w_hat = algo.weights(dec)[0]  # no stage 2: ŵ
        np.testing.assert_allclose(w_hat, np.mean(iterates[:-1], axis=0), atol=1e-12)
        st = algo.working_state(algo.apply(algo.settle(st), dec))
        np.testing.assert_array_equal(st["c"], w_hat)
        assert diag["epochs_done"] == k
    assert n_proj > 20  # the constraints did bind


def test_kkt_of_the_l1_l2_projection_inside_epoch_gd():
    rng = np.random.default_rng(0)
    statuses = set()
    for _ in range(60):
        n = int(rng.integers(5, 60))
        c = rng.normal(size=n)
        B = float(np.abs(c).sum()) * rng.uniform(1.0, 1.5)
        v = c + rng.normal(size=n) * rng.uniform(0.1, 3)
        rho = float(rng.uniform(0.05, 2.0))
        w, mu, lam, status = project_l1_l2(v, B, c, rho, return_multipliers=True)
        statuses.add(status)
        res = l1l2_kkt_residual(v, B, c, rho, w, mu, lam)
        scale = 1 + np.abs(v).max()
        assert res["l1_violation"] <= 1e-9 * B and res["ball_violation"] <= 1e-9 * rho
        assert res["dual_negative"] == 0 and res["stationarity"] <= 1e-6 * scale * (1 + mu)
        assert res["off_support"] <= 1e-6 * scale * (1 + mu)
        np.testing.assert_allclose(project_l1_l2(w, B, c, rho), w, atol=1e-9)  # idempotent
    assert {1, 2, 3} <= statuses  # L1 only, ball only, both active


def test_sparsifier_unbiased_sparse_and_bounds():
    rng = np.random.default_rng(1)
    w = rng.normal(size=30) * (rng.random(30) < 0.7)
    s = np.exp(rng.uniform(-3, 3, 30))
    assert bound_constant(w, s, "dd") <= bound_constant(w, s, "mg")
    assert bound_constant(w, np.full(30, 2.0), "dd") == pytest.approx(bound_constant(w, np.full(30, 2.0), "mg"))
    for method in ("dd", "mg"):
        K_, reps = 12, 4000
        draws = np.array([sparsify_vector(w, s, method=method, draws=K_, seed=i)[0] for i in range(reps)])
        assert (np.count_nonzero(draws, axis=1) <= K_).all()
        sd = draws.std(axis=0) / np.sqrt(reps)
        assert np.all(np.abs(draws.mean(axis=0) - w) <= 5 * sd + 1e-12)
        err = np.mean(np.sum(s * (draws - w) ** 2, axis=1))
        assert err <= bound_constant(w, s, method) / K_ * 1.05
    a, info = sparsify_vector(w, s, nnz=7, nnz_mode="distinct", seed=3)
    assert np.count_nonzero(a) == 7 == info["nnz"]
    b, _ = sparsify_vector(w, s, nnz=7, nnz_mode="distinct", seed=3)
    np.testing.assert_array_equal(a, b)
    _, info = sparsify_vector(w, s, epsilon=0.5, delta=0.2)
    assert info["K"] == draws_for_epsilon(w, s, 0.5, 0.2, "dd") == int(np.ceil(bound_constant(w, s, "dd") / 0.1))
    # features the store never has (E[x_j^2] = 0) cannot be drawn: a target at or above the rest keeps only them,
    # so the result never holds more than the target
    s0 = np.where(np.arange(30) < 10, 0.0, s)
    drawable = np.count_nonzero(w[10:])
    for target in (drawable, drawable + 3):
        c, info = sparsify_vector(w, s0, nnz=target)
        assert info["K"] == 0 and np.count_nonzero(c) == drawable == info["nnz"] <= target
        np.testing.assert_array_equal(c, np.where(np.arange(30) < 10, 0.0, w))


def test_one_or_two_workers_bit_identical(store, client, one_worker_client):
    opts = {**OPTS, "nnz": 15}
    ref = fit(store, "two-stage", opts, passes=2, paths=2, seed=5, client=client)
    m1 = fit(store, "two-stage", opts, passes=2, paths=2, seed=5, client=one_worker_client)
    assert same_model(ref, m1) and 0 < ref.nnz <= 15
    assert ref.meta["history"][-1]["epochs_done"] >= 2


def test_resume_equals_continuous(store, tmp_path, client):
    full = fit(store, "two-stage", OPTS, passes=3, paths=2, seed=2, client=client)
    part = fit(store, "two-stage", OPTS, passes=1, paths=2, seed=2, client=client)
    part.save(tmp_path / "m.npz")
    back = fit(store, "two-stage", OPTS, passes=2, paths=2, seed=2, client=client,
               init_model=load_model(tmp_path / "m.npz"))
    assert back.meta["provenance"]["resumed"] and same_model(full, back)
    np.testing.assert_array_equal(full.gstate["w_hat"], back.gstate["w_hat"])


def test_regression_end_to_end_cli(store, tmp_path):
    run = CliRunner().invoke
    r = run(app, ["train", store, "--out", str(tmp_path / "m.npz"), "--algo", "two-stage", "--passes", "2",
                  "--workers", "1", "--set", "l1_radius=30", "--set", "eta1=0.01", "--set", "T1=150", "--json"])
    assert r.exit_code == 0, r.output
    ev = json.loads(run(app, ["evaluate", str(tmp_path / "m.npz"), store, "--json"]).stdout)
    y = np.concatenate([b.y for b in __import__("pipeline.store.reader", fromlist=["x"]).open_store(store)
                        .blocks("holdout")])
    assert "rmse" in ev and "error" not in ev and ev["rmse"] < 0.8 * y.std()
    for method in ("dd", "mg"):
        r = run(app, ["sparsify", str(tmp_path / "m.npz"), "--store", store, "--nnz", "10", "--method", method,
                      "--out", str(tmp_path / f"s_{method}.npz"), "--json"])
        assert r.exit_code == 0, r.output
        sm = load_model(tmp_path / f"s_{method}.npz")
        assert sm.nnz <= 10 and sm.meta["sparsify"]["method"] == method and sm.meta["sparsify"]["K"] == 10
        assert sm.meta["sparsify"]["source"] == "stage-1 output w_hat"
    r = run(app, ["sparsify", str(tmp_path / "m.npz"), "--store", store, "--out", str(tmp_path / "x.npz")])
    assert r.exit_code == 2 and "exactly one" in r.output


class _DenseStates:
    """Two-stage with the kernel's dense arrays kept between stages (the layout before the compact settled state)
    and the epoch start written out in NumPy: the reference for bit-identity of the compact state."""

    def init_path(self, n_features, path):
        st = super().working_state(super().init_path(n_features, path))
        st["last"] = st["last"].astype(np.int64)
        return st

    def working_state(self, state):
        return state

    def settle(self, state):
        return state

    def apply(self, state, decision):
        if not int(decision["sync"][0]):
            return state
        k = int(decision["epoch"][0])
        T, eta, rho = self._schedule(k)
        c = unpack_nonzero(decision["w_hat_idx"], decision["w_hat_val"], state["w"].shape[0])  # either form
        ist, fst = state["istate"].copy(), state["fstate"].copy()
        l1 = 0.0
        for x in c:  # ‖w‖₁ summed in index order, as the kernel does
            l1 += abs(x)
        ist[[K.IS_T, K.IS_TK, K.IS_DONE, K.IS_EPOCH]] = 0, T, 0, k
        fst[[K.FS_ETA, K.FS_RHO, K.FS_L1, K.FS_D2, K.FS_BSUM, K.FS_BIAS]] = eta, rho, l1, 0.0, 0.0, decision["b_hat"][0]
        return {**state, "c": c, "w": c.copy(), "wsum": np.zeros_like(c), "last": np.ones(c.shape[0], np.int64),
                "istate": ist, "fstate": fst}


@pytest.mark.parametrize("opts", [{**OPTS, "nnz": 15, "l1_radius": 2.0}, {**OPTS, "stage1": "averaged-sgd", "l1_radius": 2.0}])
def test_compact_state_bit_identical_to_dense_states(store, monkeypatch, opts):
    """Non-zeros between stages instead of the dense arrays (issue 13 §1): the same model and ŵ bit for bit as
    dense states between stages, over 3 passes of 3 paths; also when the int32 stamps are widened mid-epoch."""
    import pipeline.algorithms.two_stage as TS
    from pipeline.algorithms.base import is_dense_form
    from pipeline.engine import train

    dense_cls = type("DenseTwoStage", (_DenseStates, TS.TwoStage), {})
    params = make_algorithm("two-stage", opts).params
    ref = train(store, dense_cls(params), passes=3, paths=3, seed=2)
    for int32_max in (TS.INT32_MAX, 200):
        monkeypatch.setattr(TS, "INT32_MAX", int32_max)
        new = train(store, TS.TwoStage(params), passes=3, paths=3, seed=2)
        assert new.w.tobytes() == ref.w.tobytes() and new.bias == ref.bias
        assert new.gstate["w_hat"].tobytes() == ref.gstate["w_hat"].tobytes()
        assert not {"w", "c", "wsum", "sumsq", "last"} & set(new.states[0])
        if "nnz" in opts:  # sumsq has seen every feature: kept dense (no more bytes than the dense array)
            assert is_dense_form(new.states[0]["sumsq_idx"], new.states[0]["sumsq_val"])
        else:  # without stage 2 sumsq is neither kept nor accumulated
            assert "sumsq_idx" not in new.states[0] and new.history[-1]["projections"] > 0
    assert ref.history[-1]["projections"] > 0 and (ref.history[-1]["epochs_done"] >= 2) == ("stage1" not in opts)


def _two_stage_working(p, density, seed):
    """A two-stage working state (stage 2 on: sumsq kept) at width ``p`` whose w, c, wsum, sumsq have about
    ``density`` of their entries non-zero (−0.0 among them), with int32 stamps everywhere."""
    algo = make_algorithm("two-stage", {**OPTS, "nnz": 15})
    rng = np.random.default_rng(seed)
    st = algo.working_state(algo.init_path(p, 0))
    del st["c_idx"], st["c_val"]  # c is changed here: settle packs it again
    for k in ("w", "c", "wsum", "sumsq"):
        v = np.where(rng.random(p) < density, rng.normal(size=p), 0.0)  # (a product leaves −0.0 everywhere)
        v[rng.integers(0, p, 3)] = -0.0
        st[k] = v
    st["last"] = rng.integers(1, 10_000, p).astype(np.int32)
    return algo, st


@pytest.mark.parametrize("density", [0.9, 0.55, 0.3, 0.02])
def test_settled_state_no_larger_than_dense_and_exact(density):
    """A settled state never takes more bytes than the dense arrays (a mostly non-zero array is kept dense, a
    mostly zero one packed) and expands bit for bit: the stamps off w's support as 1, as from the packed form."""
    from pipeline.algorithms.base import is_dense_form

    p = 5000
    algo, st = _two_stage_working(p, density, seed=int(density * 100))
    dense = sum(st[k].nbytes for k in ("w", "c", "wsum", "sumsq", "last"))
    settled = algo.settle(copy_state_of(st))
    per_feature = sum(v.nbytes for k, v in settled.items() if k not in ("istate", "fstate", "width"))
    assert per_feature <= dense
    assert is_dense_form(settled["w_idx"], settled["w_val"]) == (density > 0.5)  # both forms are exercised
    for k in ("w", "c", "wsum", "sumsq"):
        nnz = np.count_nonzero(st[k].view(np.int64))
        assert is_dense_form(settled[f"{k}_idx"], settled[f"{k}_val"]) == (nnz * 16 >= p * 8)
        if nnz * 16 < p * 8:
            assert settled[f"{k}_idx"].shape[0] == nnz  # packed: the non-zeros only
    back = algo.working_state(settled)
    for k in ("w", "c", "wsum", "sumsq"):
        assert back[k].tobytes() == st[k].tobytes(), k
    on = st["w"].view(np.int64) != 0
    assert back["last"].dtype == np.int32
    assert back["last"].tobytes() == np.where(on, st["last"], 1).astype(np.int32).tobytes()
    # widened after it was settled: the new features are 0, their stamps 1
    wide = algo.working_state(algo.resize(settled, p + 7))
    assert wide["w"].tobytes() == np.concatenate([st["w"], np.zeros(7)]).tobytes()
    assert wide["last"].tobytes() == np.concatenate([back["last"], np.ones(7, np.int32)]).tobytes()
    if density > 0.5:  # the case that cost 72 bytes a feature before: now the dense arrays' 36
        assert per_feature == dense


def copy_state_of(st):
    return {k: v.copy() for k, v in st.items()}


def test_old_packed_layout_still_expands():
    """A state saved in the packed-only layout (every array as non-zeros, int64 stamps on w's support, also when
    nearly every entry is non-zero) expands to the same arrays."""
    algo, st = _two_stage_working(3000, 0.8, seed=4)
    old = {k: v for k, v in st.items() if k not in ("w", "c", "wsum", "sumsq", "last")}
    for k in ("w", "c", "wsum", "sumsq"):
        idx = np.flatnonzero(st[k].view(np.int64))
        old[f"{k}_idx"], old[f"{k}_val"] = idx, st[k][idx]
    old["last_val"] = st["last"][old["w_idx"]].astype(np.int64)
    old["width"] = np.array([3000], np.int64)
    new = algo.working_state(old)
    for k in ("w", "c", "wsum", "sumsq"):
        assert new[k].tobytes() == st[k].tobytes()
    assert np.array_equal(new["last"], np.where(st["w"].view(np.int64) != 0, st["last"], 1))


def test_memory_estimate_is_the_full_state():
    """The estimate's path state is the settled state with every feature non-zero (the dense arrays), not the
    fresh one (no per-feature array)."""
    from pipeline.memory import state_bytes, worker_need

    p = 123_457
    for opts, floats in (({}, 3), ({"nnz": 15}, 4)):  # sumsq only with stage 2
        algo = make_algorithm("two-stage", opts)
        path, work, _ = state_bytes(algo, p)
        small = sum(v.nbytes for k, v in algo.init_path(10, 0).items() if k in ("istate", "fstate"))
        # the task adds w, wsum (, sumsq) and int32 stamps; c is shared read-only
        assert path == (8 * floats + 4) * p + small + 8 and work == (8 * floats - 4) * p + small  # + width
        need = worker_need(algo, p, 1)
        assert state_bytes(algo, p, fresh=True)[0] < 1000 and need["path"] == path
        assert need["scratch"] == 16 * p and need["exchange"] == 8 * (floats - 2) * 2 * p


def test_working_state_shares_the_private_copy_and_c():
    """A task expands a dense settled state without a second array: w, wsum and the stamps are its private copy's
    (copy_state), c the received state's own, read-only (no task changes it); settle keeps them, and the stage's
    c_idx/c_val as they came."""
    from pipeline.algorithms.base import copy_state

    algo, st = _two_stage_working(2000, 0.9, seed=5)
    settled = algo.settle(copy_state_of(st))
    assert not settled["c_val"].flags.writeable
    mine = copy_state(settled)
    assert mine["c_val"] is settled["c_val"] and not np.shares_memory(mine["w_val"], settled["w_val"])
    work = algo.working_state(mine)
    assert work["c"] is settled["c_val"]
    for k, key in (("w", "w_val"), ("wsum", "wsum_val"), ("sumsq", "sumsq_val"), ("last", "last_val")):
        assert work[k] is mine[key] and work[k].flags.writeable, k
    again = algo.settle(work)
    assert again["c_val"] is settled["c_val"] and again["w_val"] is mine["w_val"]
    assert not {"w", "c", "wsum", "sumsq", "last"} & set(work)  # each left the working state as it was settled
    assert all(again[k].tobytes() == settled[k].tobytes() for k in settled)


def test_kernel_without_sumsq_same_iterates():
    """Stage 2 off: the kernel skips sumsq (an empty array) and the iterates, sums and stamps are the same bits."""
    indptr, indices, data, y, _ = regression_data(400, 30, 6, seed=7)
    rows = np.arange(y.shape[0], dtype=np.int64)
    out, kept = [], np.zeros(30)
    for sumsq in (kept, np.zeros(0)):
        w, c, wsum = np.zeros(30), np.zeros(30), np.zeros(30)
        last = np.ones(30, np.int32)
        ist, fst = np.zeros(K.N_IS, np.int64), np.zeros(K.N_FS)
        K.begin_epoch(c, ist, fst, 10_000, 0.05, 1.0)
        K.epoch_gd_block(indptr, indices, data, y, rows, w, c, wsum, last, sumsq, ist, fst, np.empty(60), 2.0,
                         K.MODE_EPOCH, 0.05, LOSS_CODES["squared"], False, True, 1e-10, 100, 1)
        out.append((w, wsum, last, ist, fst))
        assert ist[K.IS_NPROJ] > 0
    for a, b in zip(*out):
        assert a.tobytes() == b.tobytes()
    ref = np.zeros(30)  # Σ x_j² in row order (NumPy reference of the kept sumsq)
    np.add.at(ref, indices[:indptr[-1]], data[:indptr[-1]] ** 2)
    assert kept.tobytes() == ref.tobytes()


def test_the_practical_defaults_resolve_from_the_store_and_equal_the_same_values_given(store):
    """ALGORITHMS.md §3 practical defaults [R]: T1 = ⌊T/(2^n_ep − 1)⌋ (T = the training rows, or budget) and
    η1 = 1/(2R√T1), R² = the store's mean squared row norm; the model records them, and giving them explicitly
    trains the same model bit for bit."""
    import math

    from pipeline.store.reader import open_store
    from pipeline.store.stats import data_scale

    scale = data_scale(open_store(store))
    m = fit(store, "two-stage", {"l1_radius": 30.0}, passes=2, paths=1, seed=2, client=None)
    T1 = scale["rows"] // 63
    eta1 = 1 / (2 * math.sqrt(scale["mean_sq_norm"]) * math.sqrt(T1))
    assert m.meta["hyper"]["resolved"] == {"T1": T1, "eta1": eta1} and T1 > 1
    same = fit(store, "two-stage", {"l1_radius": 30.0, "T1": T1, "eta1": eta1}, passes=2, paths=1, seed=2, client=None)
    assert same_model(m, same) and "resolved" not in same.meta["hyper"]
    b = fit(store, "two-stage", {"l1_radius": 30.0, "budget": 700, "n_ep": 3}, passes=2, paths=1, seed=2, client=None)
    assert b.meta["hyper"]["resolved"]["T1"] == 100
