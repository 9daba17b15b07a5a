"""Sparse stage-end exchange (issue 13 §1): a TG path's weights travel as their non-zeros when that is smaller,
and the mix is bit for bit the one of dense vectors."""
import numpy as np
import pytest

from pipeline.algorithms import make_algorithm
from pipeline.algorithms.base import add_packed, is_dense_form, pack_nonzero, unpack_nonzero
from pipeline.algorithms.sgd import TruncatedGradient
from pipeline.engine import train
from tests.conftest import ingest_shared


@pytest.fixture(scope="module")
def store(tmp_path_factory, client):
    return ingest_shared(tmp_path_factory, client, "rcv1_subset/rcv1_vw_small_train.svm", "xchg", block_mb=0.05,
                         holdout=0.2)


def _vector(rng, n, density):
    """Random values at ``density`` with −0.0 entries and values that cancel another vector's."""
    v = np.where(rng.random(n) < density, rng.normal(size=n), 0.0)  # (a product would leave −0.0 everywhere)
    v[rng.integers(0, n, 3)] = -0.0
    return v


@pytest.mark.parametrize("da,db", [(0.01, 0.02), (0.3, 0.05), (0.9, 0.01), (0.9, 0.8), (0.0, 0.0)])
def test_add_packed_is_the_dense_sum_bit_for_bit(da, db):
    rng = np.random.default_rng(int(da * 100 + db * 10))
    n = 5000
    a, b = _vector(rng, n, da), _vector(rng, n, db)
    b[np.flatnonzero(a)[:5]] = -a[np.flatnonzero(a)[:5]]  # exact cancellations: +0.0 in the dense sum
    b[np.flatnonzero(a == 0)[:3]] = -0.0  # −0.0 + +0.0 is +0.0
    a[7] = b[7] = -0.0  # −0.0 + −0.0 is −0.0
    ia, _ = pack_nonzero(a)
    assert (ia.shape[0] > 0) == (da < 0.5)  # both forms are exercised
    idx, val = add_packed(pack_nonzero(a), pack_nonzero(b), n)
    got = unpack_nonzero(idx, val, n)
    assert got.tobytes() == (a + b).tobytes()
    # the compact form: packed exactly when the union's entries take fewer bytes than the dense vector
    union = np.count_nonzero(a.view(np.int64) | b.view(np.int64))
    assert is_dense_form(idx, val) == (union * 16 >= n * 8)


class _DenseExchange(TruncatedGradient):
    """The exchange before it was sparse: dense weight vectors summed and averaged (the oracle)."""

    def summarize(self, state):
        out = super().summarize(state)
        return {**{k: v for k, v in out.items() if k not in ("w_idx", "width")}, "w": state["w"]}

    def combine(self, a, b):
        return {k: a[k] + b[k] for k in a}

    def decide(self, total, gstate, n_paths):
        dec, gstate, diag = super().decide({**total, "w_idx": np.zeros(0, np.int64),
                                            "width": np.array([total["w"].shape[0]])}, gstate, n_paths)
        return {k: v for k, v in dec.items() if k not in ("w_idx", "width")}, gstate, diag

    def _mixed(self, decision):  # the dense mixed weights (TG's weights and apply read them through this)
        return decision["w"]


@pytest.mark.parametrize("opts", [{"gravity": 3e-3}, {"gravity": 1e-3, "adagrad": True}, {}])
def test_tg_mix_with_sparse_exchange_equals_dense_exchange(store, opts):
    """3 paths, 3 passes: the same weights, bias and path states bit for bit as dense summaries; with TG's
    gravity the summaries are packed (fewer bytes than the dense vector)."""
    algo = make_algorithm("tg", opts)
    ref = train(store, _DenseExchange(algo.params), passes=3, paths=3, seed=4)
    new = train(store, TruncatedGradient(algo.params), passes=3, paths=3, seed=4)
    assert new.w.tobytes() == ref.w.tobytes() and new.bias == ref.bias
    for s, r in zip(new.states, ref.states):
        assert all(np.asarray(s[k]).tobytes() == np.asarray(r[k]).tobytes() for k in r)
    assert [h["nnz"] for h in new.history] == [h["nnz"] for h in ref.history]
    summary = algo.summarize(new.states[0])
    packed = not is_dense_form(summary["w_idx"], summary["w"])
    assert packed == (np.count_nonzero(new.states[0]["w"]) * 2 < new.w.shape[0])
    if opts:
        assert packed and summary["w"].nbytes + summary["w_idx"].nbytes < new.w.nbytes
