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
