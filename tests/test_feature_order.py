"""A store whose features are numbered by frequency (pipeline/store/order.py): the same rows, statistics, models and
metrics as the input's order, in the input's ids wherever a user sees them."""
import gzip
import shutil

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.formats.libsvm import relabel_ids
from pipeline.ingest import IngestError, IngestOptions, ingest
from pipeline.kernels import colstats
from pipeline.model import load_model
from pipeline.store import order
from pipeline.store.reader import open_store
from tests.conftest import data_file, same_model

NEWS20 = "news20_binary/news20_binary.svm"


@pytest.fixture(scope="module")
def stores(tmp_path_factory, client):
    """news20 ingested twice, in 1 MiB blocks: the input's order and frequency order."""
    out = {}
    for name in ("given", "frequency"):
        path = tmp_path_factory.mktemp(name) / "s.zarr"
        ingest([str(data_file(NEWS20))], str(path), IngestOptions(block_mb=1.0, feature_order=name), client=client)
        out[name] = str(path)
    return out


# ------------------------------------------------------------------------------------------------- the map
@pytest.mark.parametrize("seed", range(6))
def test_the_map_is_a_bijection_that_puts_the_hot_features_first(seed):
    rng = np.random.default_rng(seed)
    width = int(rng.integers(1, 400))
    hot = rng.permutation(width)[: int(rng.integers(0, width + 1))].astype(np.int32)
    to_int, to_ext = order.maps(hot)
    n = to_int.shape[0]
    assert np.array_equal(np.sort(to_int), np.arange(n)) and np.array_equal(to_ext[to_int], np.arange(n))
    assert np.array_equal(to_int[hot], np.arange(hot.shape[0]))  # hot[i] -> i
    moved = to_int != np.arange(n)
    assert not moved[hot.shape[0]:][~np.isin(np.arange(hot.shape[0], n), hot)].any()  # others keep their number
    ids = rng.integers(0, n + 50, size=300).astype(np.int32)
    ref = np.where(ids < n, to_int[np.minimum(ids, n - 1)], ids)  # the identity past the map
    got = ids.copy()
    assert relabel_ids(got, to_int) == (int(ref.max()) + 1) and np.array_equal(got, ref)
    assert np.array_equal(order.ids_external(order.ids_internal(ids, to_int), to_ext), ids)


@pytest.mark.parametrize("seed", range(4))
def test_statistics_of_rows_in_any_order_equal_those_of_ascending_rows_bit_for_bit(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(colstats, "STATS_BAND", 1 << 6)  # several bands on a small width
    X = sp.random(200, 1000, density=0.02, random_state=seed, format="csr", dtype=np.float32)
    X.data = rng.normal(size=X.nnz).astype(np.float32)
    shuffled = X.indices.copy(), X.data.copy()
    for r in range(X.shape[0]):
        lo, hi = X.indptr[r], X.indptr[r + 1]
        p = rng.permutation(hi - lo) + lo
        shuffled[0][lo:hi], shuffled[1][lo:hi] = X.indices[p], X.data[p]
    ref = colstats.column_stats(X.indptr.astype(np.int64), X.indices, X.data, 1000)
    got = colstats.column_stats(X.indptr.astype(np.int64), *shuffled, 1000)
    assert not colstats.rows_ascending(X.indptr.astype(np.int64), shuffled[0])
    dense = X.toarray().astype(np.float64)  # the NumPy reference: counts and sums of squares per column
    assert np.array_equal(got[0], np.flatnonzero((dense != 0).any(axis=0)))
    assert np.array_equal(got[1], (dense != 0).sum(axis=0)[got[0]])
    assert np.allclose(got[2], (dense ** 2).sum(axis=0)[got[0]], rtol=1e-12)
    for a, b in zip(ref, got):
        assert np.array_equal(a, b)


# ------------------------------------------------------------------------------------------------- the store
def test_a_frequency_store_holds_the_same_rows_and_statistics_in_its_own_ids(stores):
    g, f = open_store(stores["given"]), open_store(stores["frequency"])
    assert g.feature_order is None and f.feature_order["kind"] == "frequency"
    assert [e["key"] for e in g.entries("holdout")] == [e["key"] for e in f.entries("holdout")]
    for bg, bf in zip(g.blocks("all"), f.blocks("all")):
        assert not np.array_equal(bg.indices, bf.indices)  # renumbered ...
        Xf = f.external_X(bf)
        assert np.array_equal(Xf.indptr, bg.X.indptr) and np.array_equal(Xf.indices, bg.X.indices)  # ... the same rows
        assert np.array_equal(Xf.data, bg.X.data) and np.array_equal(bf.y, bg.y)
    sg, sf = g.feature_stats(), f.feature_stats()
    to_int = f.order_maps[0]
    for k in ("col_nnz", "col_sumsq"):
        assert np.array_equal(order.dense_external(sf[k], to_int), sg[k])
    # the feature seen most often in the sample is feature 0, and the counts fall with the id among the hot ones
    hot = order.read_hot(f"{f.path}/{f.feature_order['path']}")
    assert sf["col_nnz"][0] == sg["col_nnz"][hot[0]] == sg["col_nnz"].max()
    assert np.corrcoef(np.arange(hot.shape[0]), sf["col_nnz"][: hot.shape[0]])[0, 1] < -0.2
    Xd = f.to_dask("holdout").compute()  # the library's view: the input's ids
    Xg = sp.vstack([b.X for b in g.blocks("holdout")]).tocsr()
    assert (Xd.to_scipy_sparse().tocsr() != Xg).nnz == 0


def test_the_order_does_not_depend_on_the_number_of_workers(tmp, one_worker_client, stores):
    out = tmp / "one.zarr"
    ingest([str(data_file(NEWS20))], str(out), IngestOptions(block_mb=1.0, feature_order="frequency"),
           client=one_worker_client)
    a, b = open_store(str(out)), open_store(stores["frequency"])
    assert a.feature_order == b.feature_order
    for x, y in zip(a.blocks("all"), b.blocks("all")):
        assert np.array_equal(x.indices, y.indices) and np.array_equal(x.data, y.data)


def test_auto_keeps_the_input_order_of_a_small_input_and_frequency_needs_plain_files(tmp, client):
    src = data_file("rcv1_subset/rcv1_vw_smaller_extra.svm")
    ingest([str(src)], str(tmp / "auto.zarr"), IngestOptions(), client=client)
    assert open_store(str(tmp / "auto.zarr")).feature_order is None
    gz = tmp / "x.svm.gz"
    with open(src, "rb") as fi, gzip.open(gz, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    with pytest.raises(IngestError, match=r"x\.svm\.gz: --feature-order frequency samples its inputs.*decompress"):
        ingest([str(gz)], str(tmp / "gz.zarr"), IngestOptions(feature_order="frequency"), client=client)
    assert not (tmp / "gz.zarr").exists()


def test_an_append_keeps_the_stores_order(tmp, client):
    a, b = data_file("rcv1_subset/rcv1_vw_small_train.svm"), data_file("rcv1_subset/rcv1_vw_small_test.svm")
    out, ref = str(tmp / "f.zarr"), str(tmp / "g.zarr")
    ingest([str(a)], out, IngestOptions(feature_order="frequency"), client=client)
    ingest([str(a)], ref, IngestOptions(feature_order="given"), client=client)
    with pytest.raises(IngestError, match="frequency order .*an append keeps it"):
        ingest([str(b)], out, IngestOptions(feature_order="given"), append=True, client=client)
    before = open_store(out).feature_order
    ingest([str(b)], out, IngestOptions(), append=True, client=client)
    ingest([str(b)], ref, IngestOptions(), append=True, client=client)
    f, g = open_store(out), open_store(ref)
    assert f.feature_order == before
    for bf, bg in zip(f.blocks("all"), g.blocks("all")):
        Xf = f.external_X(bf)
        assert np.array_equal(Xf.indices, bg.X.indices) and np.array_equal(Xf.data, bg.X.data)


# ------------------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("algo", ["sgd", "tg", "ftrl"])
def test_models_are_the_same_bit_for_bit_in_the_inputs_ids(algo, stores, client, tmp):
    """Rows keep their input order, so every dot product adds in the same order: the same model."""
    from pipeline.evaluate import evaluate_store
    from pipeline.train import fit

    mg = fit(stores["given"], algo, {}, passes=2, paths=2, client=client)
    mf = fit(stores["frequency"], algo, {}, passes=2, paths=2, client=client)
    assert same_model(mg, mf) and mf.nnz > 0
    assert "store_ids" not in mf.meta and mf.meta["feature_order"] == open_store(stores["frequency"]).feature_order[
        "digest"]
    eg, ef = evaluate_store(mg, stores["given"], client=client), evaluate_store(mf, stores["frequency"], client=client)
    assert eg["error"] == ef["error"] and eg["logloss"] == ef["logloss"]
    assert evaluate_store(mf, stores["given"], client=client)["error"] == eg["error"]  # a model goes to either store
    from pipeline.predict import predict_to_file

    for name, path in stores.items():
        predict_to_file(mf, path, str(tmp / f"{name}.txt"))
    text = (tmp / "given.txt").read_text()
    assert text == (tmp / "frequency.txt").read_text() and text.count("\n") == open_store(path).n_rows


def test_stsgd_keeps_the_same_learner_and_its_refit_the_same_model(stores, client):
    """The refit's vectors over S are in the input's id order (refit.support_positions): every sum its L-BFGS makes
    adds in the same order on either store, so even on these nearly separable rows, where it stops at its iteration
    cap, it ends at the same iterate."""
    from pipeline.train import fit

    mg = fit(stores["given"], "stsgd", {}, passes=2, paths=2, client=client, refit={})
    mf = fit(stores["frequency"], "stsgd", {}, passes=2, paths=2, client=client, refit={})
    assert np.array_equal(mg.learner[0], mf.learner[0]) and np.array_equal(mg.learner[1], mf.learner[1])  # learner
    assert same_model(mg, mf) and mf.nnz > 0
    assert mg.meta["refit"]["objective"] == mf.meta["refit"]["objective"]
    assert mg.meta["holdout"]["error"] == mf.meta["holdout"]["error"]


def test_resume_on_a_frequency_store_and_a_warm_start_from_the_other_order(tmp, stores, client):
    from pipeline.train import fit

    f = stores["frequency"]
    five = fit(f, "tg", {}, passes=5, paths=2, client=client)
    two = fit(f, "tg", {}, passes=2, paths=2, client=client)
    two.save(tmp / "two.npz")
    more = fit(f, "tg", {}, passes=3, paths=2, client=client, init_model=str(tmp / "two.npz"))  # 2 + 3
    assert more.meta["provenance"]["resumed"] and same_model(more, five)
    # a model trained on the input's order holds no state in this store's ids: it warm-starts, from its weights
    g2 = fit(stores["given"], "tg", {}, passes=2, paths=2, client=client)
    g2.save(tmp / "g2.npz")
    warm = fit(f, "tg", {}, passes=5, paths=2, client=client, init_model=str(tmp / "g2.npz"))
    warm_g = fit(stores["given"], "tg", {}, passes=5, paths=2, client=client, init_model=load_model(tmp / "g2.npz",
                                                                                                     state=False))
    assert not warm.meta["provenance"]["resumed"] and warm.meta["provenance"]["warm_from"] == "model"
    assert same_model(warm, warm_g)


def test_sparsify_reads_the_stores_statistics_and_a_stage_one_state_in_the_inputs_ids(tmp, client):
    import dataclasses

    from pipeline.sparsify import sparsify_model
    from pipeline.train import fit

    stores = {}
    for name in ("given", "frequency"):  # a small set: two-stage's stage 1 is dense
        stores[name] = str(tmp / f"{name}.zarr")
        ingest([str(data_file("rcv1_subset/rcv1_vw_small_train.svm"))], stores[name],
               IngestOptions(block_mb=0.25, feature_order=name), client=client)
    mf = fit(stores["frequency"], "two-stage", {}, passes=1, paths=1, client=client)
    f = open_store(stores["frequency"])
    # the same model with its stage-1 output in the input's ids, as if trained on the input's order
    gs = {**mf.gstate, "w_hat": order.dense_external(mf.gstate["w_hat"], f.order_maps[0])}
    meta = {k: v for k, v in mf.meta.items() if k != "feature_order"}
    mg = dataclasses.replace(mf, gstate=gs, meta=meta)
    a = sparsify_model(mg, stores["given"], nnz=200, seed=1)
    b = sparsify_model(mf, stores["frequency"], nnz=200, seed=1)
    assert same_model(a, b) and a.nnz > 0
    # weights only (no stage-1 state): the store's statistics are what must be in the input's ids
    plain = fit(stores["given"], "sgd", {}, passes=1, paths=1, client=client)
    assert same_model(sparsify_model(plain, stores["given"], nnz=300, seed=2),
                      sparsify_model(plain, stores["frequency"], nnz=300, seed=2))
    with pytest.raises(ValueError, match="stage-1 output is in the feature order of the store it was trained on"):
        sparsify_model(mf, stores["given"], nnz=200, seed=1)
