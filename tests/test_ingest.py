"""Ingest: round trips against scikit-learn, worker invariance, atomicity, append, bad input, compression."""
import bz2
import glob
import gzip
import io
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

from pipeline.ingest import _TAIL, IngestError, IngestOptions, _choose_holdout, ingest, plan, read_owned_lines
from pipeline.store import format as fmt
from pipeline.store.reader import open_store
from tests.conftest import DATA, data_file

SHARED = ["rcv1_subset/rcv1_vw_small_train.svm", "rcv1_subset/rcv1_vw_small_test.svm",
          "rcv1_subset/rcv1_vw_smaller_extra.svm", "dexter/dexter_train.svm", "dexter/dexter_valid.svm",
          "svmlight_example1/train.dat", "svmlight_example1/test.dat", "news20_binary/news20_binary.svm",
          "a9a/a9a", "a9a/a9a.t", "w8a/w8a"]


def store_matrix(path, split="all"):
    st = open_store(path)
    blocks = list(st.blocks(split))
    return sp.vstack([b.X for b in blocks]).tocsr(), np.concatenate([b.y for b in blocks]), st


def all_arrays(path):
    st = open_store(path)
    return {b.key: (b.indptr, b.indices, b.data, b.raw_labels) for b in st.blocks("all")}


def write(path, text):
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


def lines(n, seed=0, width=50):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        idx = np.sort(rng.choice(width, size=rng.integers(0, 8), replace=False)) + 1
        out.append(("+1" if rng.random() < 0.6 else "-1") + "".join(f" {i}:{rng.normal():.5g}" for i in idx))
    return out


def assert_stats_of_training_rows(st):
    """The store's feature statistics equal the counts and sums of squares of its training rows."""
    stats = st.feature_stats()
    Xt = sp.vstack([b.X for b in st.blocks("train")]).tocsr().astype(np.float64)
    assert np.array_equal(stats["col_nnz"], np.diff(Xt.tocsc().indptr))
    np.testing.assert_allclose(stats["col_sumsq"], np.asarray(Xt.multiply(Xt).sum(axis=0)).ravel(), rtol=1e-12)
    assert stats["n_rows"] == Xt.shape[0]


@pytest.mark.parametrize("rel", SHARED)
def test_round_trip_equals_sklearn(rel, tmp, client):
    f = data_file(rel)
    out = tmp / "s.zarr"
    s = ingest([str(f)], str(out), IngestOptions(block_mb=0.25, holdout=0.2), client=client)
    X, y, st = store_matrix(out)
    Xr, yr = load_svmlight_file(str(f), n_features=st.n_features)
    assert X.shape == Xr.shape and s["n_rows"] == Xr.shape[0] and s["nnz"] == Xr.nnz
    assert np.array_equal(X.indptr, Xr.indptr) and np.array_equal(X.indices, Xr.indices)
    assert np.array_equal(X.data, Xr.data.astype(np.float32))
    assert np.array_equal(y, np.where(yr > 0, 1.0, -1.0))
    assert all(b.verify() for b in st.blocks("all"))
    assert_stats_of_training_rows(st)


def test_store_identical_whatever_runs_the_parse_tasks(tmp, client, monkeypatch):
    """The test cluster's two one-thread workers, one worker process running two parse tasks at once
    (``PARSE_TASKS_PER_CORE``, as for an input too large for the page cache: forced here), and this process's threads
    (two per core): the same arrays, checksums and holdout."""
    import pipeline.ingest as ing

    f = data_file("news20_binary/news20_binary.svm")
    ingest([str(f)], str(tmp / "a"), IngestOptions(block_mb=0.5), client=client)
    monkeypatch.setattr(ing, "DROP_CACHED_SHARE", 0.0)
    ingest([str(f)], str(tmp / "b"), IngestOptions(block_mb=0.5), workers=1)
    ingest([str(f)], str(tmp / "c"), IngestOptions(block_mb=0.5))
    a = all_arrays(tmp / "a")
    ma = open_store(tmp / "a").manifest
    for other in ("b", "c"):
        b = all_arrays(tmp / other)
        assert list(a) == list(b) and len(a) > 5
        for k in a:
            for x, z in zip(a[k], b[k]):
                assert x.dtype == z.dtype and np.array_equal(x, z)
        mb = open_store(tmp / other).manifest
        assert ma["holdout"] == mb["holdout"]
        assert [e["checksum"] for e in ma["blocks"]] == [e["checksum"] for e in mb["blocks"]]


def test_holdout_is_chosen_by_seed(tmp, client):
    f = data_file("a9a/a9a")
    keys = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        ingest([str(f)], str(tmp / name), IngestOptions(block_mb=0.1, holdout=0.3, seed=seed), client=client)
        keys.append(open_store(tmp / name).manifest["holdout"]["blocks"])
    assert keys[0] == keys[1] != keys[2] and len(keys[0]) == round(0.3 * len(open_store(tmp / "a").manifest["blocks"]))


def test_statistics_exact_when_empty_ranges_move_the_planned_holdout(tmp, client):
    """Holdout blocks of plain text are planned ahead and parsed without statistics. Ranges inside a long
    line hold no rows, so the commit's holdout (among blocks with rows) can differ from the plan: the
    commit then computes the statistics of training blocks parsed without them, and the store's equal its
    training rows' exactly. The committed blocks keep no statistics of their own."""
    text = lines(60, seed=3)
    text[20] = "+1 " + " ".join(f"{i}:0.{i:04d}" for i in range(1, 400))  # ~4 kB: several empty ranges
    f = write(tmp / "long.svm", "\n".join(text) + "\n")
    o = IngestOptions(block_mb=0.0005, holdout=0.3)
    planned = [t.keys[0] for t in plan([{"path": f, "size": os.path.getsize(f), "compression": None}],
                                       int(o.block_mb * (1 << 20)), 1)]
    moved = 0
    for seed in range(6):
        out = tmp / f"s{seed}"
        ingest([f], str(out), replace(o, seed=seed), client=client)
        st = open_store(out)
        assert_stats_of_training_rows(st)
        hold = st.manifest["holdout"]["blocks"]
        moved += hold != _choose_holdout(planned, o.holdout, seed, 1)
        assert not list(out.glob("blocks/*/stats_*"))
    assert moved > 0


BAD = [("1 1:1 3:2 2:1", "not increasing"), ("1 0:1", "index 0"), ("1 1:1 1:2", "duplicate"),
       ("1 1:nan", "non-finite"), ("1 x:1", "bad token"), ("one 1:1", "bad label"), ("1 99:1", "beyond")]


@pytest.mark.parametrize("bad,reason", BAD)
def test_malformed_line_stops_with_file_line_and_reason(bad, reason, tmp, client):
    body = lines(300)
    body.insert(217, bad)
    f = write(tmp / "in.svm", "\n".join(body) + "\n")
    with pytest.raises(IngestError) as e:
        ingest([f], str(tmp / "s"), IngestOptions(block_mb=0.001, n_features=60), client=client)
    assert f"in.svm:218:" in str(e.value) and reason in str(e.value)
    assert not (tmp / "s").exists() and not list(tmp.glob("s.tmp-*"))


def test_skip_mode_drops_and_lists_bad_lines(tmp, client):
    body = lines(200)
    body.insert(10, "1 2:1 2:3")
    body.insert(150, "1 5:inf")
    f = write(tmp / "in.svm", "\n".join(body))
    s = ingest([f], str(tmp / "s"), IngestOptions(block_mb=0.001, on_invalid="skip"), client=client)
    assert s["n_rows"] == 200 and s["skipped_lines"] == 2
    rec = [json.loads(x) for x in open(tmp / "s" / s["skipped_file"])]
    assert [(r["line"], r["reason"].split()[0]) for r in rec] == [(11, "duplicate"), (151, "non-finite")]
    assert open_store(tmp / "s").manifest["skipped"]["count"] == 2


def test_mixed_binary_and_real_labels_is_an_error(tmp, client):
    body = lines(400)
    body[333] = "0.5 1:1"
    f = write(tmp / "in.svm", "\n".join(body))
    with pytest.raises(IngestError, match=r"in.svm:334: binary labels mixed with non-binary"):
        ingest([f], str(tmp / "s"), client=client)
    s = ingest([f], str(tmp / "t"), IngestOptions(labels="-1,1", on_invalid="skip"), client=client)
    assert s["n_rows"] == 399 and s["skipped_lines"] == 1


def test_label_encodings_and_regression(tmp, client):
    f01 = write(tmp / "a.svm", "1 1:1\n0 2:1\n1 3:1\n")
    f12 = write(tmp / "b.svm", "2 1:1\n1 2:1\n")
    freg = write(tmp / "c.svm", "0.5 1:1\n-2.25 2:1\n3 1:1\n")
    ingest([f01, f12], str(tmp / "s"), IngestOptions(holdout=0), client=client)
    _, y, st = store_matrix(tmp / "s")
    assert y.tolist() == [1, -1, 1, 1, -1] and st.manifest["labels"]["counts"] == {"+1": 3, "-1": 2}
    ingest([freg], str(tmp / "r"), IngestOptions(holdout=0), client=client)
    _, y, st = store_matrix(tmp / "r")
    assert y.tolist() == [0.5, -2.25, 3.0] and st.label_kind == "regression"


def test_a_file_whose_every_label_is_1_takes_the_stores_encoding_whatever_the_order(tmp, client):
    """Label 1 is +1 of {-1,+1} and {0,1} but -1 of {1,2}: a file holding only 1s follows the other files of the
    ingest (either order) or the store's; with nothing to go by it is read as +1 with a note, and a later {1,2}
    file that would read 1 as -1 is refused instead of flipping the class of the same raw label."""
    only1 = write(tmp / "only1.svm", "1 1:1\n1 2:1\n1 3:1\n")
    mix12 = write(tmp / "mix12.svm", "2 1:1\n1 2:1\n")
    for name, files in [("ab", [only1, mix12]), ("ba", [mix12, only1])]:
        s = ingest(files, str(tmp / name), IngestOptions(holdout=0), client=client)
        st = open_store(tmp / name)
        assert st.manifest["labels"]["counts"] == {"+1": 1, "-1": 4} and s["notes"] == [], name
    s = ingest([only1], str(tmp / "g"), IngestOptions(holdout=0), client=client)
    assert s["notes"] == [f"{only1}: every label is 1, read as +1 ({{-1,+1}} or {{0,1}}); if 1 is the negative class "
                          f"({{1,2}}), ingest with --labels 1,2"]
    before = open_store(tmp / "g").manifest
    with pytest.raises(IngestError, match=r"mix12.svm: label 1 would be -1 .*only1.svm, whose every label is 1"):
        ingest([mix12], str(tmp / "g"), IngestOptions(holdout=0), append=True, client=client)
    assert open_store(tmp / "g").manifest == before
    s = ingest([write(tmp / "more1.svm", "1 4:1\n-1 5:1\n")], str(tmp / "g"), IngestOptions(holdout=0),
               append=True, client=client)
    assert open_store(tmp / "g").manifest["labels"]["counts"] == {"+1": 4, "-1": 1}


def test_a_one_class_holdout_is_noted(tmp, client):
    sorted_ = write(tmp / "sorted.svm", "\n".join(["1 1:1"] * 200 + ["-1 2:1"] * 200))
    s = ingest([sorted_], str(tmp / "s"), IngestOptions(block_mb=0.0005, holdout=0.25, seed=2), client=client)
    classes = {float(v) for b in open_store(tmp / "s").blocks("holdout") for v in b.y}
    n = sum(e["rows"] for e in open_store(tmp / "s").entries("holdout"))
    assert len(classes) == 1 and s["notes"] == [
        f"every one of the {n} new holdout rows is {'+1' if classes == {1.0} else '-1'}: holdout error says little "
        f"and AUC is undefined; is the input sorted by label? (a shuffled copy, or a smaller --block-mb for more "
        f"holdout blocks)"]
    mixed = write(tmp / "mixed.svm", "\n".join(["1 1:1", "-1 2:1"] * 200))
    assert ingest([mixed], str(tmp / "m"), IngestOptions(block_mb=0.0005, holdout=0.25, seed=2),
                  client=client)["notes"] == []


def test_explicit_zeros_are_not_stored_and_are_noted(tmp, client):
    """j:0 and a float32 underflow: checked, counted for the width and noted, but the store holds non-zeros only
    (scikit-learn's loader keeps them as stored entries); blocks cut anywhere count each once."""
    rows = ["1 1:1 3:0 5:0.5", "-1 2:1 9:1e-50", "1 1:0.5 2:-0", "-1 4:2"] * 50
    f = write(tmp / "z.svm", "\n".join(rows))
    s = ingest([f], str(tmp / "s"), IngestOptions(block_mb=0.001, holdout=0), client=client)
    X, _, st = store_matrix(tmp / "s")
    Xr, _ = load_svmlight_file(f, n_features=9)
    Xr.data = Xr.data.astype(np.float32)
    Xr.eliminate_zeros()
    assert st.n_features == 9 and len(st.entries("all")) > 1
    assert X.nnz == Xr.nnz == 5 * 50 and (X != Xr).nnz == 0 and np.all(X.data != 0)
    assert s["notes"] == ["150 explicit zero value(s) (j:0, or below float32) were checked but not stored: the "
                          "store holds non-zeros only"]


def test_append_adds_rows_widens_and_refuses_the_same_file(tmp, client):
    a = write(tmp / "a.svm", "\n".join(lines(100, 1, width=20)))
    b = write(tmp / "b.svm", "\n".join(lines(80, 2, width=40)))
    ingest([a], str(tmp / "s"), IngestOptions(block_mb=0.001), client=client)
    before = open_store(tmp / "s").manifest
    s = ingest([b], str(tmp / "s"), IngestOptions(block_mb=0.001), append=True, client=client)
    X, y, st = store_matrix(tmp / "s")
    Xa, _ = load_svmlight_file(a, n_features=st.n_features)
    Xb, _ = load_svmlight_file(b, n_features=st.n_features)
    assert s["n_rows"] == 180 and st.n_features == max(Xb.indices.max() + 1, before["n_features"])
    assert (X != sp.vstack([Xa, Xb]).astype(np.float32)).nnz == 0
    assert st.manifest["manifest_version"] == before["manifest_version"] + 1
    assert [e["key"] for e in st.manifest["blocks"][: len(before["blocks"])]] == [e["key"] for e in before["blocks"]]
    assert_stats_of_training_rows(st)
    with pytest.raises(IngestError, match="already ingested"):
        ingest([b], str(tmp / "s"), append=True, client=client)
    assert open_store(tmp / "s").manifest == st.manifest
    assert len(os.listdir(tmp / "s" / "stats")) == 2  # zarr.json + the current version only


@pytest.mark.parametrize("executor", ["threads", "cluster"])
def test_statistics_summed_in_feature_bands_equal_one_task_bit_for_bit(executor, tmp, client, monkeypatch):
    """A commit with many statistics entries sums them in feature bands, side by side on the workers (in this
    process: a band's blocks in groups of a few, added group after group); the store's statistics are those of the
    one-task sum byte for byte, also for an append onto a version of them. The blocks' own statistics are removed,
    and the summary's phases add up to its seconds."""
    from pipeline.store import stats

    a, b = data_file("news20_binary/news20_binary.svm"), data_file("rcv1_subset/rcv1_vw_small_train.svm")
    run = {"client": client} if executor == "cluster" else {}
    got = {}
    for name, entries in (("one", 1 << 40), ("banded", 5_000)):
        monkeypatch.setattr(stats, "BAND_ENTRIES", entries)
        if name == "banded":
            monkeypatch.setattr(stats, "GATHER_BYTES", 0)
            monkeypatch.setattr(stats, "GROUP_BYTES", 16 * 4_000)
        out = str(tmp / name)
        s1 = ingest([str(a)], out, IngestOptions(block_mb=0.5, holdout=0.2), **run)
        s2 = ingest([str(b)], out, IngestOptions(block_mb=0.5, holdout=0.2), append=True, **run)
        assert not glob.glob(os.path.join(out, "blocks", "*", "stats_*"))
        for s in (s1, s2):
            ph = s["phase_seconds"]
            assert set(ph) == {"order", "parse", "statistics", "commit"} and min(ph.values()) >= 0
            assert abs(sum(ph.values()) - s["seconds"]) < 0.01
        g = os.path.join(out, open_store(out).manifest["stats"])
        got[name] = ([s1["stats_bands"], s2["stats_bands"]],
                     [fmt.read_array(g, n).tobytes() for n in ("feature", "col_nnz", "col_sumsq")])
        assert_stats_of_training_rows(open_store(out))
    assert got["one"][0] == [1, 1] and min(got["banded"][0]) > 2  # at most 2 per worker or thread: 4 here
    assert got["banded"][1] == got["one"][1]


def test_input_dropped_from_the_page_cache_as_parsed_gives_the_same_store(tmp, monkeypatch):
    """An input too large to stay cached is dropped from the page cache range by range once parsed (a hint to the
    kernel, forced here for a small file): the store is the one an ingest without it writes, array for array."""
    import pipeline.ingest as ing

    f = data_file("news20_binary/news20_binary.svm")
    ingest([str(f)], str(tmp / "a"), IngestOptions(block_mb=0.5))
    monkeypatch.setattr(ing, "DROP_CACHED_SHARE", 0.0)
    ingest([str(f)], str(tmp / "b"), IngestOptions(block_mb=0.5))
    a, b = all_arrays(tmp / "a"), all_arrays(tmp / "b")
    assert list(a) == list(b) and len(a) > 5
    assert all(np.array_equal(x, z) for k in a for x, z in zip(a[k], b[k]))
    assert open_store(tmp / "a").manifest["blocks"] == open_store(tmp / "b").manifest["blocks"]


def test_format_1_dense_statistics_are_read_and_appended_to(tmp, client):
    """Stores written before the sparse statistics layout (format 1: dense col_nnz/col_sumsq) still read,
    and an append to one sums the old statistics with the new blocks'."""
    a = write(tmp / "a.svm", "\n".join(lines(60, 4, width=20)))
    ingest([a], str(tmp / "s"), IngestOptions(block_mb=0.001), client=client)
    st = open_store(tmp / "s")
    want = st.feature_stats()
    g = str(tmp / "s" / st.manifest["stats"])
    shutil.rmtree(g)
    fmt.make_group(g)
    fmt.write_array(g, "col_nnz", want["col_nnz"])
    fmt.write_array(g, "col_sumsq", want["col_sumsq"])
    got = open_store(tmp / "s").feature_stats()
    assert np.array_equal(got["col_nnz"], want["col_nnz"]) and np.array_equal(got["col_sumsq"], want["col_sumsq"])
    b = write(tmp / "b.svm", "\n".join(lines(40, 5, width=30)))
    ingest([b], str(tmp / "s"), IngestOptions(block_mb=0.001), append=True, client=client)
    assert_stats_of_training_rows(open_store(tmp / "s"))


def test_existing_store_is_not_overwritten(tmp, client):
    a = write(tmp / "a.svm", "1 1:1\n")
    ingest([a], str(tmp / "s"), client=client)
    with pytest.raises(IngestError, match="already exists"):
        ingest([a], str(tmp / "s"), client=client)


@pytest.mark.parametrize("opener,suffix", [(gzip.open, ".gz"), (bz2.open, ".bz2"), (lzma.open, ".xz")])
def test_compressed_inputs_stream_and_truncation_is_an_error(opener, suffix, tmp, client):
    text = "\n".join(lines(3000, 3)) + "\n"
    plain = write(tmp / "p.svm", text)
    comp = tmp / ("c.svm" + suffix)
    with opener(comp, "wb") as f:
        f.write(text.encode())
    ingest([plain], str(tmp / "p"), IngestOptions(block_mb=0.01), client=client)
    ingest([str(comp)], str(tmp / "c"), IngestOptions(block_mb=0.01), client=client)
    Xp, yp, _ = store_matrix(tmp / "p")
    Xc, yc, st = store_matrix(tmp / "c")
    assert (Xp != Xc).nnz == 0 and np.array_equal(yp, yc) and len(st.manifest["blocks"]) > 2
    rows = [[(e["rows"], e["first_line"], e["split"]) for e in open_store(tmp / k).manifest["blocks"]] for k in "pc"]
    assert rows[0] == rows[1]  # the same blocks, so the same holdout and the same model
    raw = comp.read_bytes()
    trunc = write(tmp / ("t.svm" + suffix), raw[: len(raw) * 2 // 3])
    with pytest.raises(IngestError, match="truncated or corrupt"):
        ingest([trunc], str(tmp / "t"), client=client)
    assert not (tmp / "t").exists()


def test_errors_in_compressed_input_name_the_line(tmp, client):
    body = lines(2000, 4)
    body[1500] = "1 3:1 2:1"
    comp = tmp / "c.svm.gz"
    with gzip.open(comp, "wb") as f:
        f.write("\n".join(body).encode())
    with pytest.raises(IngestError, match=r"c.svm.gz:1501:"):
        ingest([str(comp)], str(tmp / "s"), IngestOptions(block_mb=0.005), client=client)


def test_to_dask_matmul_and_reader_api(tmp, client):
    f = data_file("svmlight_example1/train.dat")
    ingest([str(f)], str(tmp / "s"), IngestOptions(block_mb=0.1), client=client)
    st = open_store(tmp / "s")
    Xr, yr = load_svmlight_file(str(f), n_features=st.n_features)
    w = np.random.default_rng(0).normal(size=st.n_features)
    x = st.to_dask()
    import sparse
    assert isinstance(x._meta, sparse.GCXS) and isinstance(x.blocks[0].compute(scheduler="sync"), sparse.GCXS)
    got = (x @ w).compute(scheduler="sync")
    np.testing.assert_allclose(got, Xr.astype(np.float32) @ w, rtol=1e-10)
    b = next(st.blocks("train"))
    assert b.X.shape[1] == st.n_features and b.indptr.dtype == np.int64 and b.indices.dtype == np.int32
    assert set(e["split"] for e in st.entries("all")) == {"train", "holdout"}


KILL_SCRIPT = """
import sys
from pipeline.ingest import ingest, IngestOptions
ingest(sys.argv[1:-1], sys.argv[-1], IngestOptions(block_mb=0.2), append={append}, workers=1)
"""


@pytest.mark.parametrize("append", [False, True])
def test_kill_minus_nine_leaves_old_state_and_rerun_works(append, tmp):
    big = write(tmp / "big.svm", "\n".join(lines(120000, 5, width=5000)) + "\n")
    small = write(tmp / "small.svm", "\n".join(lines(50, 6)) + "\n")
    out = tmp / "s"
    if append:
        ingest([small], str(out), IngestOptions(block_mb=0.2), workers=1)
    before = open_store(out).manifest if append else None
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT.format(append=append), big, str(out)],
                            start_new_session=True)
    deadline = time.time() + 120
    blocks_dir = out / "blocks"
    while time.time() < deadline:  # wait until block directories are being written
        tmps = list(tmp.glob("s.tmp-*/blocks/*")) if not append else [
            d for d in blocks_dir.iterdir() if not d.name.startswith("0001")] if blocks_dir.exists() else []
        if len(tmps) >= 2:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if append:
        assert open_store(out).manifest == before
    else:
        assert not out.exists()
    s = ingest([big], str(out), IngestOptions(block_mb=0.2), append=append, workers=1)
    Xs, _, st = store_matrix(out)
    assert s["n_rows"] == 120000 + (50 if append else 0)
    assert len({e["key"] for e in st.manifest["blocks"]}) == len(os.listdir(out / "blocks")) - 1


def test_fsspec_url_input_equals_local_path(tmp, client):
    f = data_file("dexter/dexter_train.svm")
    ingest([str(f)], str(tmp / "a"), IngestOptions(block_mb=0.2), client=client)
    ingest([f"file://{f}"], str(tmp / "b"), IngestOptions(block_mb=0.2), client=client)
    a, b = all_arrays(tmp / "a"), all_arrays(tmp / "b")
    assert list(a) == list(b) and all(np.array_equal(x, z) for k in a for x, z in zip(a[k], b[k]))


def test_zstd_input_and_truncation(tmp, client):
    import zstandard as zstd  # a test dependency (pyproject [test])
    text = "\n".join(lines(2000, 8)) + "\n"
    comp = tmp / "c.svm.zst"
    comp.write_bytes(zstd.ZstdCompressor().compress(text.encode()))
    plain = write(tmp / "p.svm", text)
    ingest([plain], str(tmp / "p"), IngestOptions(block_mb=0.01), client=client)
    ingest([str(comp)], str(tmp / "c"), IngestOptions(block_mb=0.01), client=client)
    assert (store_matrix(tmp / "p")[0] != store_matrix(tmp / "c")[0]).nnz == 0
    raw = comp.read_bytes()
    trunc = write(tmp / "t.svm.zst", raw[: len(raw) * 2 // 3])
    with pytest.raises(IngestError, match="truncated or corrupt"):
        ingest([trunc], str(tmp / "t"), client=client)
    assert not (tmp / "t").exists()


def test_memory_mapped_and_buffered_range_reads_agree(tmp):
    """Local files are memory-mapped, other file objects read into a buffer: same owned lines either way,
    including ranges that start mid-line and a last line longer than the read-ahead."""
    text = ("\n".join(lines(400, 9)) + "\n" + "1 " + " ".join(f"{i}:1" for i in range(1, _TAIL // 4)) + "\n"
            + "\n".join(lines(50, 10))).encode()
    path = tmp / "r.svm"
    path.write_bytes(text)
    size = len(text)
    step = size // 7 + 13
    mapped, buffered = [], []
    for start in range(0, size, step):
        with open(path, "rb") as f:
            mapped.append(bytes(read_owned_lines(f, start, start + step, size)))
        buffered.append(bytes(read_owned_lines(io.BytesIO(text), start, start + step, size)))
    assert mapped == buffered and b"".join(mapped) == text


def test_embedded_cluster_is_loopback_and_keeps_glibc_malloc_defaults(tmp):
    """The cluster `sparsepipe ingest --workers N` starts (in a fresh process, like the CLI): scheduler and
    workers on 127.0.0.1, and workers without Dask's MALLOC_TRIM_THRESHOLD_ (it turns off glibc's adaptive
    mmap threshold: page faults on every block)."""
    code = """
import json, os
from pipeline.cluster import dask_client
if __name__ == "__main__":
    with dask_client(workers=1) as c:
        print(json.dumps({"scheduler": c.scheduler.address, "workers": list(c.scheduler_info()["workers"]),
                          "trim": list(c.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_").values())}))
"""
    script = tmp / "cluster_env.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}  # as a fresh shell has it
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["scheduler"].startswith("tcp://127.0.0.1:")
    assert got["workers"] and all(w.startswith("tcp://127.0.0.1:") for w in got["workers"])
    assert got["trim"] == [None]


def test_append_reads_its_inputs_as_the_store_was_made(tmp, client):
    a = write(tmp / "a.svm", "\n".join(lines(60, 1, width=20)))
    b = write(tmp / "b.svm", "\n".join(lines(40, 2, width=20)))
    ingest([a], str(tmp / "s"), IngestOptions(block_mb=0.001), client=client)
    before = open_store(tmp / "s").manifest
    with pytest.raises(IngestError, match=r"indices are 1-based; append without --zero-based"):
        ingest([b], str(tmp / "s"), IngestOptions(block_mb=0.001, zero_based=True), append=True, client=client)
    with pytest.raises(IngestError, match=r"values are float32; append with --dtype float32"):
        ingest([b], str(tmp / "s"), IngestOptions(block_mb=0.001, dtype="float64"), append=True, client=client)
    assert open_store(tmp / "s").manifest == before


OVERLAP_SCRIPT = """
import sys, time
from pipeline.train import fit
store, out, marker = sys.argv[1:]
def progress(rec):
    open(marker + ".last", "w").write(repr(time.time()))  # the run's last stage ends inside fit (and its lock)
    if rec["pass"] == 1:  # hold the run open in its first pass until the test's append is waiting to commit
        open(marker, "w").close()
        time.sleep(3.0)
fit(store, "stsgd", {}, passes=2, paths=1, refit={}, progress=progress).save(out)
"""


def test_an_append_commits_after_a_training_run_that_reads_the_store(tmp, client, capsys):
    """A run that overlaps an append reads one version of the store from its start to its end (training blocks,
    statistics, refit rows, holdout): the append waits for it and commits afterwards."""
    from pipeline.model import load_model
    from pipeline.train import fit

    a = write(tmp / "a.svm", "\n".join(lines(3000, 1, width=40)))
    b = write(tmp / "b.svm", "\n".join(lines(1000, 2, width=60)))
    ingest([a], str(tmp / "s"), IngestOptions(block_mb=0.01), client=client)
    alone = fit(str(tmp / "s"), "stsgd", {}, passes=2, paths=1, refit={})
    marker = tmp / "first-pass"
    proc = subprocess.Popen([sys.executable, "-c", OVERLAP_SCRIPT, str(tmp / "s"), str(tmp / "m.npz"), str(marker)])
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert marker.exists(), "the training run did not start"
    s = ingest([b], str(tmp / "s"), IngestOptions(block_mb=0.01), append=True, client=client)
    committed = time.time()
    assert proc.wait(timeout=120) == 0
    assert float((tmp / "first-pass.last").read_text()) <= committed  # the append waited for the run
    assert "is reading this store; the append commits when it ends" in capsys.readouterr().err
    m = load_model(tmp / "m.npz")
    assert np.array_equal(m.coef_indices, alone.coef_indices) and np.array_equal(m.coef_values, alone.coef_values)
    assert m.meta["refit"]["n_rows"] == alone.meta["refit"]["n_rows"] and m.meta["holdout"] == alone.meta["holdout"]
    assert s["n_rows"] == 4000 and open_store(tmp / "s").n_rows == 4000
