"""Tests for pipeline.synth: the synthetic webspam-like LIBSVM generator."""
import json
import os

import numpy as np
import pytest
from sklearn.datasets import load_svmlight_file
from sklearn.linear_model import LogisticRegression

from pipeline import synth as S
from pipeline.synth import format_rows, synth

ROWS, FEATURES, NNZ = 2000, 20_000, 100


def _parse(path):
    """Plain-Python LIBSVM reader: labels (as text), list of index arrays, list of value arrays."""
    labels, idx, val = [], [], []
    with open(path, "rb") as f:
        for line in f.read().decode("ascii").split("\n")[:-1]:
            toks = line.split(" ")
            labels.append(toks[0])
            pairs = [t.split(":") for t in toks[1:]]
            idx.append(np.array([int(i) for i, _ in pairs], np.int64))
            val.append(np.array([float(v) for _, v in pairs]))
    return labels, idx, val


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "data.svm"
    summary = synth(out, ROWS, features=FEATURES, nnz_per_row=NNZ, seed=7)
    return out, summary


def test_summary_matches_file(gen):
    out, s = gen
    assert s["path"] == str(out) and s["rows"] == ROWS and s["features"] == FEATURES
    assert s["bytes"] == os.path.getsize(out)
    X, y = load_svmlight_file(str(out), n_features=FEATURES, zero_based=False)
    assert X.shape == (ROWS, FEATURES)
    assert X.nnz == s["nnz"]
    assert s["positive_fraction"] == pytest.approx(np.mean(y > 0))
    assert s["seconds"] > 0 and s["mb_per_s"] > 0
    assert not [p for p in os.listdir(out.parent) if "partial" in p]


def test_text_format(gen):
    out, _ = gen
    raw = out.read_bytes()
    assert raw.endswith(b"\n") and b"\r" not in raw and b"\t" not in raw
    labels, idx, val = _parse(out)
    assert len(labels) == ROWS and set(labels) <= {"+1", "-1"}
    for ind, v in zip(idx, val):
        assert ind.size >= 1
        assert np.all(np.diff(ind) > 0), "indices sorted and unique"
        assert ind[0] >= 1 and ind[-1] <= FEATURES
        assert np.all(v > 0)


@pytest.mark.parametrize("features", [300, 3_000_000])  # dense-ish rows; 3-pass radix sort
def test_sorted_unique_indices_other_widths(tmp_path, features):
    out = tmp_path / "w.svm"
    synth(out, 200, features=features, nnz_per_row=300 if features > 300 else 100, seed=5)
    _, idx, _ = _parse(out)
    assert max(len(i) for i in idx) > 256
    for ind in idx:
        assert np.all(np.diff(ind) > 0) and ind[0] >= 1 and ind[-1] <= features


def test_rows_normalised_and_long_tailed(gen):
    out, _ = gen
    X, _ = load_svmlight_file(str(out), n_features=FEATURES, zero_based=False)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    np.testing.assert_allclose(norms, 1.0, atol=1e-4)
    lengths = np.diff(X.indptr)
    assert abs(lengths.mean() - NNZ) < 0.1 * NNZ
    assert lengths.max() > 2.5 * NNZ and lengths.min() < 0.5 * NNZ


def test_positive_fraction(gen):
    _, s = gen
    assert abs(s["positive_fraction"] - 0.6) <= 0.05


def test_heavy_tailed_feature_frequencies(gen):
    out, _ = gen
    X, _ = load_svmlight_file(str(out), n_features=FEATURES, zero_based=False)
    counts = np.sort(np.bincount(X.indices, minlength=FEATURES))[::-1]
    top = counts[: FEATURES // 100].sum() / counts.sum()
    assert top > 0.25, f"top 1% of features hold {top:.1%} of non-zeros (uniform would be 1%)"
    assert counts[0] > 0.5 * ROWS          # the most frequent feature is in most rows
    assert np.count_nonzero(counts) > FEATURES // 4  # and the tail is still populated


def test_labels_learnable(gen):
    out, _ = gen
    X, y = load_svmlight_file(str(out), n_features=FEATURES, zero_based=False)
    n = int(0.7 * ROWS)
    model = LogisticRegression(C=10.0, max_iter=2000).fit(X[:n], y[:n])
    err = np.mean(model.predict(X[n:]) != y[n:])
    majority = min(np.mean(y[n:] > 0), np.mean(y[n:] < 0))
    assert err < majority - 0.1, (err, majority)


def test_truth_files(gen):
    out, s = gen
    with np.load(f"{out}.truth.npz", allow_pickle=False) as t:
        ind, val, bias = t["indices"], t["values"], t["bias"]
    assert ind.dtype == np.int64 and val.dtype == np.float64 and bias.dtype == np.float64
    assert bias.shape == (1,) and ind.shape == val.shape and 1 <= ind.size <= 2000
    assert np.all(np.diff(ind) > 0) and ind[0] >= 0 and ind[-1] < FEATURES
    meta = json.loads(open(f"{out}.truth.json").read())
    assert meta["seed"] == 7 and meta["features"] == FEATURES and meta["truth_index_base"] == 0
    assert meta["nnz"] == s["nnz"] and meta["bias"] == pytest.approx(bias[0])
    # the noiseless rule sign(w*.x + b) explains most labels
    X, y = load_svmlight_file(str(out), n_features=FEATURES, zero_based=False)
    w = np.zeros(FEATURES)
    w[ind] = val
    agree = np.mean(np.where(X @ w + bias[0] > 0, 1, -1) == y)
    assert agree > 0.85, agree


def test_deterministic_and_independent_of_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "CHUNK_BYTES", 20_000)  # many small chunks
    kw = dict(features=5000, nnz_per_row=40)
    a, b, c, d = (tmp_path / n for n in "abcd")
    synth(a, 300, seed=1, **kw)
    synth(b, 300, seed=1, workers=3, **kw)
    synth(c, 300, seed=2, **kw)
    synth(d, 200, seed=1, **kw)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    # fixed-size chunks with their own seeds: a shorter file is a prefix of a longer one
    assert a.read_bytes().startswith(d.read_bytes())
    assert open(f"{a}.truth.npz", "rb").read() == open(f"{b}.truth.npz", "rb").read()


def test_progress_and_interrupt_leave_no_partial_file(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "CHUNK_BYTES", 20_000)
    calls = []
    out = tmp_path / "p.svm"
    s = synth(out, 300, features=5000, nnz_per_row=40, progress=lambda b, r: calls.append((b, r)))
    assert len(calls) > 3 and calls[-1] == (s["bytes"], 300)
    assert all(b1 > b0 and r1 > r0 for (b0, r0), (b1, r1) in zip(calls, calls[1:]))

    def boom(b, r):
        raise KeyboardInterrupt

    out2 = tmp_path / "q.svm"
    with pytest.raises(KeyboardInterrupt):
        synth(out2, 300, features=5000, nnz_per_row=40, progress=boom, workers=2)
    assert sorted(os.listdir(tmp_path)) == ["p.svm", "p.svm.truth.json", "p.svm.truth.npz"]


@pytest.mark.parametrize("kw, exc", [
    (dict(rows=-1), ValueError), (dict(rows=1.5), TypeError), (dict(features=0), ValueError),
    (dict(nnz_per_row=0), ValueError), (dict(nnz_per_row=6000), ValueError),
    (dict(workers=0), ValueError), (dict(seed=-1), ValueError), (dict(progress=3), TypeError),
])
def test_validation(tmp_path, kw, exc):
    args = dict(rows=10, features=5000, nnz_per_row=20) | kw
    with pytest.raises(exc):
        synth(tmp_path / "v.svm", **args)
    assert not os.listdir(tmp_path)


# ---- formatting kernel vs a pure-NumPy reference ---------------------------------------------

def _reference_text(labels, indptr, indices, values):
    idx = np.char.mod("%d", indices + 1)
    val = np.char.mod("%.6g", values)
    lines = []
    for i in range(len(labels)):
        s = slice(indptr[i], indptr[i + 1])
        toks = np.char.add(np.char.add(idx[s], ":"), val[s])
        lines.append(" ".join(["+1" if labels[i] > 0 else "-1", *toks.tolist()]) + "\n")
    return "".join(lines).encode()


def test_format_kernel_matches_numpy_reference():
    rng = np.random.default_rng(0)
    n_rows = 200
    lengths = rng.integers(0, 60, n_rows)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    nnz = indptr[-1]
    indices = rng.integers(0, 2**31 - 2, nnz).astype(np.int64)
    mags = np.where(rng.random(nnz) < 0.5, 10 ** rng.uniform(-4.5, 0, nnz), 10 ** rng.uniform(-30, 30, nnz))
    values = mags * np.where(rng.random(nnz) < 0.1, -1, 1)
    special = np.array([0.0, 1.0, 0.5, 1e-4, 1e-5, 0.99999951, 0.000999999951, 123456.0, 1234567.0,
                        999999.6, 5e-324, 1.7e308, -2.5, 0.1, 0.0100000])
    values[: special.size] = special
    labels = np.where(rng.random(n_rows) < 0.6, 1, -1).astype(np.int8)

    got = format_rows(labels, indptr, indices, values).tobytes()
    want = _reference_text(labels, indptr, indices, values)
    assert got == want

    parsed = np.array([float(t.split(b":")[1]) for t in got.split() if b":" in t])
    np.testing.assert_allclose(parsed, [float(v) for v in np.char.mod("%.6g", values)], rtol=1e-6)
    # six significant digits: relative error at most 5e-6 (a unit in the 6th digit, halved)
    nz = values != 0
    assert np.all(np.abs(parsed[nz] - values[nz]) <= 5.000001e-6 * np.abs(values[nz]))


def test_format_kernel_typical_values_round_trip():
    rng = np.random.default_rng(1)
    v = 10 ** rng.uniform(-4.2, 0, 50_000)  # the generator's range: L2-normalised row entries
    out = format_rows(np.ones(1, np.int8), np.array([0, v.size]), np.arange(v.size), v).tobytes()
    toks = [t.split(b":")[1].decode() for t in out.split()[1:]]
    assert toks == np.char.mod("%.6g", v).tolist()
