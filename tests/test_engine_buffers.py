"""The engine's reused memory: blocks decoded into reused group buffers, holdout blocks too."""
import numpy as np
import pytest

from pipeline import engine as E
from pipeline.evaluate import block_partial
from pipeline.store.reader import open_store
from pipeline.train import fit
from tests.conftest import ingest_shared

TG = {"eta": 0.3, "gravity": 2e-4, "K": 3, "schedule": "sqrt", "decay": 0.8}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ingest_shared(tmp_path_factory, None, "rcv1_subset/rcv1_vw_small_train.svm", "buf", block_mb=0.05,
                         holdout=0.2)


def data_ref(st, cache_bytes):
    entries = st.entries("train")
    return E.DataRef(st.path, st.manifest["manifest_version"], tuple(e["key"] for e in entries),
                     tuple(e["rows"] for e in entries), st.n_features, cache_bytes)


def fresh(st, key):
    b = st.block(key)
    return b.indptr, b.indices, b.data, b.y


@pytest.mark.parametrize("cache_bytes", [0, 1 << 30])
def test_group_load_equals_the_concatenated_blocks_and_reuses_its_buffers(store, cache_bytes):
    st = open_store(store)
    ref = data_ref(st, cache_bytes)
    bufs = {}
    for group in ([2, 0, 3], [1], [3, 1]):
        want = E.merge_blocks([fresh(st, ref.keys[g]) for g in group])
        got = ref.load_group(np.array(group), bufs)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        if len(group) > 1:  # the group's indices and data are the heads of the reused arrays
            assert got[1].base is bufs[1].base or got[1].base is bufs[1]
    held = bufs[1]
    ref.load_group(np.array([0, 1]), bufs)
    assert bufs[1] is held  # smaller groups reuse the grown arrays


def test_block_decodes_into_given_arrays(store):
    st = open_store(store)
    e = st.entries("train")[0]
    out = (None, np.empty(e["nnz"] + 5, np.int32), np.empty(e["nnz"], np.float32), None)
    b = st.block(e, out)
    assert np.shares_memory(b.indices, out[1]) and np.shares_memory(b.data, out[2])
    assert np.array_equal(b.indices, fresh(st, e["key"])[1]) and b.verify()


def test_eval_task_equals_the_fresh_blocks_partial(store):
    st = open_store(store)
    w = np.random.default_rng(0).normal(size=st.n_features)
    for e in st.entries("holdout"):
        got = E.eval_task(st.path, st.manifest["manifest_version"], e["key"], w, 0.5)
        want = block_partial(st.block(e["key"]), w, 0.5)
        assert np.array_equal(got["f"], want["f"]) and np.array_equal(got["y"], want["y"])


def test_models_with_and_without_the_block_cache_are_identical(store):
    a = fit(store, "tg", TG, passes=3, paths=2, seed=3)
    from pipeline.engine import train
    from pipeline.algorithms import make_algorithm

    algo = make_algorithm("tg", dict(TG))
    b = train(store, algo, passes=3, paths=2, seed=3, cache_bytes=1 << 30)  # fit's default: no cache
    assert np.array_equal(a.dense_weights(), b.w) and a.bias == b.bias


def test_keep_columns_equals_numpys_selection_in_place():
    from pipeline.kernels.columns import keep_columns

    rng = np.random.default_rng(5)
    p, rows = 203, 40
    lengths = rng.integers(0, 12, rows)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = rng.integers(0, p, indptr[-1]).astype(np.int32)
    data = rng.normal(size=indptr[-1]).astype(np.float32)
    alive = rng.random(p) < 0.4
    bits = np.packbits(alive)
    keep = alive[indices]  # the reference: the same rows, each keeping its entries of alive columns, in order
    want_indptr = np.concatenate([[0], np.cumsum([keep[a:b].sum() for a, b in zip(indptr[:-1], indptr[1:])])])
    for aliased in (False, True):
        ip, ix, x = indptr.copy(), indices.copy(), data.copy()
        out = ip if aliased else np.full(rows + 1, -7, np.int64)
        k = keep_columns(ip, ix, x, bits, out)
        assert k == keep.sum() and np.array_equal(out, want_indptr)
        assert np.array_equal(ix[:k], indices[keep]) and np.array_equal(x[:k], data[keep])
        assert aliased or np.array_equal(ip, indptr)  # the row pointers as read are kept


@pytest.mark.parametrize("cache_bytes,window", [(0, 4), (0, 1), (1 << 30, 1)])
def test_stsgd_drops_purged_entries_before_its_kernel_with_the_same_model(store, monkeypatch, cache_bytes, window):
    """The entries of features out of Ω (ST-8) are dropped from each block group before STSGD's kernel
    (pipeline.kernels.columns): the same model and path states bit for bit as reading them; a block cache's
    arrays (window 1: the cached block itself reaches the filter) are left as they were."""
    import pipeline.algorithms.stsgd as S
    from pipeline.algorithms import make_algorithm

    def run(share):
        monkeypatch.setattr(S, "KEEP_COLUMNS_BELOW", share)
        return E.train(store, make_algorithm("stsgd", {}), passes=3, paths=2, seed=4, cache_bytes=cache_bytes,
                       shuffle_window=window)

    reading, dropping = run(0.0), run(1.0)
    alive = np.unpackbits(dropping.states[0]["alive"], count=open_store(store).n_features)
    assert 0 < alive.sum() < alive.size  # purges happened: the filter had entries to drop
    assert np.array_equal(reading.w, dropping.w) and reading.bias == dropping.bias
    for a, b in zip(reading.states, dropping.states):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert reading.timing["nnz_processed"] == dropping.timing["nnz_processed"]  # every entry read is counted
