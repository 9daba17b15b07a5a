"""Integrity: every block read is checked against its manifest checksum; damage of any kind (bit flips in raw and
compressed arrays of every kind, truncated chunks, deleted blocks, a manifest listing a missing block) is one
clean error line naming the store and the block, exit code 5, no traceback, no model; `sparsepipe verify`
lists every bad block. Real stores, real subprocesses of the CLI."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from pipeline.store import format as fmt
from pipeline.store.reader import StoreCorruptError, open_store

ARRAYS = ("indptr", "indices", "data", "labels")
ENV = {k: v for k, v in os.environ.items() if k not in ("SPARSEPIPE_VERIFY", "SPARSEPIPE_DEBUG")}


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], capture_output=True, text=True,
                          env={**ENV, **(env or {})}, timeout=300)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("verify")
    r = cli("synth", d / "s.svm", "--rows", "1500", "--features", "3000", "--nnz-per-row", "20", "--seed", "3")
    assert r.returncode == 0, r.stderr
    r = cli("ingest", d / "s.svm", "--out", d / "good.zarr", "--block-mb", "0.03", "--holdout", "0.2")
    assert r.returncode == 0, r.stderr
    st = open_store(d / "good.zarr")
    assert len(st.entries("train")) >= 10
    return d / "good.zarr"


def _copy(good, tmp_path, name="s.zarr"):
    dst = tmp_path / name
    shutil.copytree(good, dst)
    return dst


def _flip(path, where=0.5, mask=0x5A):
    b = bytearray(open(path, "rb").read())
    i = min(len(b) - 1, max(0, int(len(b) * where)))
    b[i] ^= mask
    open(path, "wb").write(bytes(b))


def _damage(store, key, kind):
    """Apply one kind of damage to block ``key``; returns a word the error message should contain."""
    blk = f"{store}/blocks/{key}"
    what, _, name = kind.partition(":")
    if what == "raw":  # store the array raw (same values, same checksum), then flip a byte of its payload
        fmt.write_array(blk, name, fmt.read_array(blk, name), compress=False)
        with open(f"{blk}/{name}/zarr.json") as f:
            assert [c["name"] for c in json.load(f)["codecs"]] == ["bytes"]
        _flip(f"{blk}/{name}/c/0", 0.6)
    elif what == "compressed":
        with open(f"{blk}/{name}/zarr.json") as f:
            assert [c["name"] for c in json.load(f)["codecs"]][-1] == "blosc"
        _flip(f"{blk}/{name}/c/0", 0.7)
    elif what == "truncated":
        p = f"{blk}/{name}/c/0"
        os.truncate(p, os.path.getsize(p) // 2)
    elif what == "chunk-deleted":
        os.remove(f"{blk}/{name}/c/0")
    elif kind == "block-deleted":
        shutil.rmtree(blk)
    else:
        raise AssertionError(kind)


KINDS = [f"{w}:{n}" for w in ("raw", "compressed") for n in ARRAYS] + ["truncated:data", "truncated:indptr",
                                                                        "chunk-deleted:labels", "block-deleted"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_damage_is_a_store_corrupt_error_naming_the_block(good, tmp_path, kind):
    st_path = _copy(good, tmp_path)
    key = open_store(st_path).entries("train")[3]["key"]
    _damage(st_path, key, kind)
    st = open_store(st_path)
    with pytest.raises(StoreCorruptError) as e:
        for b in st.blocks("all"):
            b.indptr
    msg = str(e.value)
    assert str(st_path) in msg and key in msg and "bytes " in msg and "re-ingest" in msg and "\n" not in msg
    # the other blocks still read and verify
    assert all(b.verify() for b in st.blocks("all") if b.key != key)


def test_train_evaluate_predict_stability_refuse_a_corrupt_store(good, tmp_path):
    st_path = _copy(good, tmp_path)
    st = open_store(st_path)
    key = st.entries("train")[2]["key"]
    _damage(st_path, key, "raw:data")  # values change silently without verification
    hkey = st.entries("holdout")[0]["key"]
    _damage(st_path, hkey, "compressed:indices")
    model = tmp_path / "m.npz"
    r = cli("train", st_path, "--out", model, "--passes", "1", "--algo", "sgd")
    assert r.returncode == 5, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0] and str(st_path) in lines[0]
    assert "Traceback" not in r.stderr and not model.exists() and not list(tmp_path.glob("m.npz*"))
    # with --no-verify the damaged training block is read as it is (the holdout is damaged too: skip evaluation
    # by training a copy whose holdout is intact)
    good_model = tmp_path / "g.npz"
    assert cli("train", good, "--out", good_model, "--passes", "1", "--algo", "sgd").returncode == 0
    for args in (("evaluate", good_model, st_path, "--split", "holdout"),
                 ("predict", good_model, st_path, "--out", tmp_path / "p.txt"),
                 ("stability", st_path, "--algo", "sgd", "--runs", "2", "--passes", "1")):
        r = cli(*args)
        assert r.returncode == 5, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert (key in r.stderr or hkey in r.stderr) and "corrupt" in r.stderr
    assert not (tmp_path / "p.txt").exists()
    r = cli("evaluate", good_model, st_path, "--split", "train", "--no-verify")
    assert r.returncode == 0, r.stderr


def test_a_resumed_run_verifies_the_blocks_again(good, tmp_path):
    """A run checks each block on its first read only (its later passes read what it verified); a resumed run is
    a new run: a block damaged between the two is caught by the second, with the model file left as it was."""
    st_path = _copy(good, tmp_path)
    model = tmp_path / "m.npz"
    assert cli("train", st_path, "--out", model, "--passes", "1", "--algo", "sgd").returncode == 0
    before = model.read_bytes()
    key = open_store(st_path).entries("train")[-1]["key"]
    _damage(st_path, key, "raw:data")
    r = cli("train", st_path, "--out", model, "--init-model", model, "--passes", "1", "--algo", "sgd")
    assert r.returncode == 5 and key in r.stderr and "corrupt" in r.stderr, r.stderr
    assert model.read_bytes() == before


@pytest.mark.parametrize("cursors, until", [([(0, 0, 0)], 1), ([(2, 0, 0), (2, 0, 0)], 3), ([(2, 0, 0), (2, 3, 0)], 4),
                                            ([(1, 0, 5)], 3), ([(1, 0, 0), (2, 0, 0)], 4)])
def test_a_run_verifies_until_it_has_read_every_block(cursors, until):
    """The pass from which training reads skip the checksum: the next when every path starts a pass, else the
    one after the furthest path's (the blocks before a cursor are read only in the next pass)."""
    from pipeline.engine import CURSOR, first_pass_end

    assert first_pass_end([{CURSOR: np.array(c, dtype=np.int64)} for c in cursors]) == until


def test_no_verify_reads_a_block_with_a_wrong_value(good, tmp_path):
    st_path = _copy(good, tmp_path)
    key = open_store(st_path).entries("train")[0]["key"]
    _damage(st_path, key, "raw:data")
    r = cli("train", st_path, "--out", tmp_path / "m.npz", "--passes", "1", "--algo", "sgd", "--no-refit")
    assert r.returncode == 5 and "--no-verify reads it anyway" in r.stderr, r.stderr  # a checksum mismatch
    r = cli("train", st_path, "--out", tmp_path / "m.npz", "--passes", "1", "--algo", "sgd", "--no-verify")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m.npz").exists()
    # the environment's SPARSEPIPE_VERIFY=0 is --no-verify for every command (docs/engine.md)
    r = cli("evaluate", tmp_path / "m.npz", st_path, "--split", "train", env={"SPARSEPIPE_VERIFY": "0"})
    assert r.returncode == 0, r.stderr
    # the library: Store(verify=False) reads it, the default refuses it, to_dask() too
    assert open_store(st_path, verify=False).block(key).data.shape[0] > 0
    with pytest.raises(StoreCorruptError):
        open_store(st_path).block(key).data
    with pytest.raises(StoreCorruptError):
        open_store(st_path).to_dask("train").sum().compute(scheduler="synchronous")


def test_evaluate_and_predict_verify_and_score_without_starting_numba(good, tmp_path):
    """On a small store, evaluate and predict check every block's XXH64 and score in Python/NumPy without
    starting numba (~0.6 s of a short command): the same metrics and predictions as this process's numba
    kernels, and a damaged block is still refused (exit 5)."""
    from pipeline.evaluate import evaluate_store
    from pipeline.model import load_model
    from pipeline.predict import predict_to_file

    run = ("import runpy, sys\nsys.argv = ['sparsepipe', *sys.argv[1:]]\ntry:\n"
           "    runpy.run_module('cli.main', run_name='__main__')\nfinally:\n"
           "    print('numba started' if 'numba' in sys.modules else 'no numba', file=sys.stderr)\n")

    def cli_no_numba(*args, numba="no numba"):
        r = subprocess.run([sys.executable, "-c", run, *map(str, args)], capture_output=True, text=True, env=ENV,
                           timeout=300)
        assert r.stderr.strip().splitlines()[-1] == numba, r.stderr
        return r

    model = tmp_path / "m.npz"
    assert cli("train", good, "--out", model, "--passes", "1", "--algo", "sgd").returncode == 0
    import pipeline.kernels.sgd  # noqa: F401  (numba started here: this process hashes and scores with the kernels)
    assert "numba" in sys.modules
    r = cli_no_numba("evaluate", model, good, "--split", "all", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = evaluate_store(load_model(model), str(good), "all")
    assert {k: got[k] for k in ("n_rows", "error", "auc", "logloss", "hinge")} == \
        {k: want[k] for k in ("n_rows", "error", "auc", "logloss", "hinge")}
    assert cli_no_numba("predict", model, good, "--out", tmp_path / "p.txt").returncode == 0
    predict_to_file(load_model(model), str(good), str(tmp_path / "q.txt"))
    assert (tmp_path / "p.txt").read_bytes() == (tmp_path / "q.txt").read_bytes()
    st_path = _copy(good, tmp_path)
    _damage(st_path, open_store(st_path).entries("holdout")[0]["key"], "raw:data")
    r = cli_no_numba("evaluate", model, st_path)  # the error path names no class of a module it did not import
    assert r.returncode == 5 and "corrupt" in r.stderr, r.stderr


def test_a_manifest_listing_a_missing_block(good, tmp_path):
    st_path = _copy(good, tmp_path)
    man = fmt.read_manifest(str(st_path))
    ghost = dict(man["blocks"][0], key="9999-0000-000000")
    man["blocks"].insert(1, ghost)
    fmt.write_manifest(str(st_path), man)
    r = cli("train", st_path, "--out", tmp_path / "m.npz", "--passes", "1", "--algo", "sgd")
    assert r.returncode == 5 and "9999-0000-000000" in r.stderr and "missing" in r.stderr, r.stderr
    assert "--no-verify" not in r.stderr  # nothing to read anyway: no such advice
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "m.npz").exists()
    r = cli("verify", st_path, "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 5 and [b["key"] for b in rep["bad_blocks"]] == ["9999-0000-000000"]
    assert any("n_rows" in p for p in rep["problems"])  # the totals no longer add up either


def test_verify_lists_every_bad_block_and_passes_a_good_store(good, tmp_path):
    r = cli("verify", good, "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["ok"] and rep["stats_checked"] and rep["blocks"] == len(fmt.read_manifest(
        str(good))["blocks"]) and not rep["bad_blocks"] and not rep["problems"]
    st_path = _copy(good, tmp_path)
    entries = open_store(st_path).entries("all")
    kinds = dict(zip([e["key"] for e in entries], KINDS))
    for key, kind in kinds.items():
        _damage(st_path, key, kind)
    r = cli("verify", st_path, "--json")
    assert r.returncode == 5 and "Traceback" not in r.stderr
    rep = json.loads(r.stdout)
    assert not rep["ok"] and sorted(b["key"] for b in rep["bad_blocks"]) == sorted(kinds)
    for b in rep["bad_blocks"]:
        assert b["problems"] and b["source"].endswith("s.svm") and (b["byte_range"] or b["first_line"])
    r = cli("verify", st_path)  # text: one line per bad block, one error line on stderr
    assert r.returncode == 5 and sum(ln.startswith("bad block ") for ln in r.stdout.splitlines()) == len(kinds)
    assert r.stderr.strip().startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


def test_verify_recounts_the_feature_statistics(good, tmp_path):
    st_path = _copy(good, tmp_path)
    man = fmt.read_manifest(str(st_path))
    group = f"{st_path}/{man['stats']}"
    cnt = fmt.read_array(group, "col_nnz").copy()
    cnt[len(cnt) // 2] += 1
    fmt.write_array(group, "col_nnz", cnt)
    r = cli("verify", st_path, "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 5 and not rep["bad_blocks"] and any("non-zero counts" in p for p in rep["problems"])
    # the manifest's totals
    man["nnz"] += 1
    fmt.write_manifest(str(st_path), man)
    rep = json.loads(cli("verify", st_path, "--json").stdout)
    assert any(p.startswith("manifest nnz") for p in rep["problems"])


def test_verify_of_something_that_is_not_a_store(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    for target in (tmp_path / "f.txt", tmp_path / "nope", tmp_path):
        r = cli("verify", target)
        assert r.returncode == 1 and r.stderr.startswith("error: ") and str(target) in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_add_sets_kernel_equals_numpy_add_at():
    from pipeline.kernels.colstats import add_sets

    rng = np.random.default_rng(4)
    width = 5000
    acc_c, acc_s = rng.integers(0, 9, width).astype(np.int64), rng.random(width)
    ref_c, ref_s = acc_c.copy(), acc_s.copy()
    for dtype in (np.int32, np.int64):
        for n in (0, 1, 700, width):
            idx = rng.permutation(width)[:n].astype(dtype)  # unique within a set, in any order
            c, s = rng.integers(1, 50, n).astype(np.int32), rng.random(n) * 1e3
            add_sets(acc_c, acc_s, idx, c, s)
            np.add.at(ref_c, idx, c)
            np.add.at(ref_s, idx, s)
            assert np.array_equal(acc_c, ref_c) and np.array_equal(acc_s, ref_s)  # bit for bit


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_verify_gives_the_same_report_on_any_thread_count(good, tmp_path, threads):
    from pipeline.store.verify import verify_store

    def report(path, n):
        rep = verify_store(str(path), threads=n)
        rep.pop("seconds")
        return rep

    assert report(good, threads) == report(good, 1) and report(good, 1)["ok"]
    st_path = _copy(good, tmp_path)
    entries = open_store(st_path).entries("all")
    for e, kind in zip(entries[1::3], ("compressed:data", "truncated:indptr", "block-deleted", "raw:indices")):
        _damage(st_path, e["key"], kind)
    one = report(st_path, 1)
    assert not one["ok"] and len(one["bad_blocks"]) == 4
    assert report(st_path, threads) == one  # the same blocks, problems and order
    # a training-statistics mismatch is found on every thread count
    st2 = _copy(good, tmp_path, "t.zarr")
    man = fmt.read_manifest(str(st2))
    ss = fmt.read_array(f"{st2}/{man['stats']}", "col_sumsq").copy()
    ss[np.flatnonzero(ss)[3]] *= 1.001
    fmt.write_array(f"{st2}/{man['stats']}", "col_sumsq", ss)
    rep = report(st2, threads)
    assert rep == report(st2, 1) and any("sums of squares differ" in p for p in rep["problems"])


def test_damaged_statistics_or_manifest_are_exit_5_naming_the_part(good, tmp_path):
    st_path = _copy(good, tmp_path)
    group = f"{st_path}/{fmt.read_manifest(str(st_path))['stats']}"
    _flip(f"{group}/col_sumsq/c/0", where=0.6)  # inside the lz4 payload: decodes, to other numbers
    r = cli("train", st_path, "--out", tmp_path / "m.npz", "--passes", "1")
    assert r.returncode == 5 and "feature statistics do not match their checksum" in r.stderr and group in r.stderr
    assert not (tmp_path / "m.npz").exists()
    rep = json.loads(cli("verify", st_path, "--json").stdout)
    assert any("do not match their checksum" in p for p in rep["problems"])
    _flip(f"{group}/col_sumsq/c/0", where=0.0, mask=0xFF)  # the blosc header: does not decode
    r = cli("train", st_path, "--out", tmp_path / "m.npz", "--passes", "1")
    assert r.returncode == 5 and "feature statistics cannot be read" in r.stderr and group in r.stderr
    other = _copy(good, tmp_path, "t.zarr")
    with open(f"{other}/zarr.json", "r+") as f:
        f.truncate(50)
    for cmd in ("info", "verify"):
        r = cli(cmd, other)
        assert r.returncode == 5 and "the store's manifest is damaged" in r.stderr and "zarr.json" in r.stderr
