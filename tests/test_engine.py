"""Engine: determinism across workers and placements, holdout never read, resume equivalence, mixing."""
import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from pipeline.algorithms import make_algorithm
from pipeline.engine import path_blocks, row_order
from pipeline.ingest import IngestOptions, ingest
from pipeline.kernels import sgd as K
from pipeline.model import load_model
from pipeline.store import format as fmt
from pipeline.store.reader import open_store
from pipeline.train import fit
from tests.conftest import data_file, ingest_shared, same_model

TG = {"eta": 0.3, "gravity": 2e-4, "K": 3, "schedule": "sqrt", "decay": 0.8}


@pytest.fixture(scope="module")
def store(tmp_path_factory, client):
    return ingest_shared(tmp_path_factory, client, "rcv1_subset/rcv1_vw_small_train.svm", "eng", block_mb=0.05, holdout=0.2)


def test_same_weights_with_one_or_two_workers_and_any_placement(store, client, one_worker_client):
    ref = fit(store, "tg", TG, passes=3, paths=2, seed=7, client=client)
    m1 = fit(store, "tg", TG, passes=3, paths=2, seed=7, client=one_worker_client)
    m_inproc = fit(store, "tg", TG, passes=3, paths=2, seed=7, client=None)
    m_single = fit(store, "tg", TG, passes=3, paths=2, seed=7, client=client, placement="single")
    assert ref.nnz > 0 and same_model(ref, m1) and same_model(ref, m_inproc) and same_model(ref, m_single)
    other = fit(store, "tg", TG, passes=3, paths=2, seed=8, client=None)
    assert not same_model(ref, other)


def test_stage_seconds_account_for_the_whole_stage_loop(store, client):
    """Each stage's ``seconds`` run from the previous stage's record, so the waits between stages (the previous
    stage's holdout metrics) are counted: they add up to the last record's ``elapsed``."""
    m = fit(store, "tg", TG, passes=4, paths=2, seed=7, client=client)
    h = m.meta["history"]
    assert len(h) == 4 and all(r.get("holdout") for r in h)
    assert abs(sum(r["seconds"] for r in h) - h[-1]["elapsed"]) < 1e-3 * len(h)


def test_holdout_blocks_are_never_read_by_training(store, tmp_path, client):
    import shutil

    poisoned = tmp_path / "p.zarr"
    shutil.copytree(store, poisoned)
    st = open_store(poisoned)
    for e in st.entries("holdout"):
        g = f"{poisoned}/blocks/{e['key']}"
        fmt.write_array(g, "data", np.full(e["nnz"], np.nan, dtype=np.float32))
        fmt.write_array(g, "labels", np.full(e["rows"], 7.0, dtype=np.float32))
    clean = fit(store, "tg", TG, passes=2, paths=2, client=None, evaluate=False)
    dirty = fit(str(poisoned), "tg", TG, passes=2, paths=2, client=None, evaluate=False)
    assert np.isfinite(dirty.coef_values).all() and same_model(clean, dirty)


@pytest.mark.parametrize("algo,opts", [("sgd", {"eta": 0.2, "l2": 1e-4, "schedule": "invscaling", "decay": 0.9}),
                                       ("tg", TG), ("tg", {**TG, "theta": 0.05, "loss": "hinge"})])
def test_two_passes_saved_and_resumed_for_three_equals_five(algo, opts, store, tmp_path, client):
    full = fit(store, algo, opts, passes=5, paths=2, seed=3, client=client)
    part = fit(store, algo, opts, passes=2, paths=2, seed=3, client=client)
    part.save(tmp_path / "m.npz")
    back = load_model(tmp_path / "m.npz")
    resumed = fit(store, algo, opts, passes=3, paths=2, seed=3, client=client, init_model=back)
    assert resumed.meta["provenance"]["resumed"] and resumed.meta["passes"] == 5
    assert same_model(full, resumed)


def test_parameter_mixing_equals_hand_computed_average(store):
    """One pass, 2 paths: the model is the mean of two kernel runs over each path's blocks and row orders."""
    st = open_store(store)
    keys = [e["key"] for e in st.entries("train")]
    opts = {"eta": 0.2, "gravity": 1e-3, "scale": "none", "bias_adagrad": False}  # the literal TG of the kernel
    algo = make_algorithm("tg", opts)
    ws, bs = [], []
    for m in range(2):
        w, Gl, ist, fst = K.new_tg_state(st.n_features)
        for b in path_blocks(11, 0, m, 2, len(keys), "split"):
            blk = st.block(keys[b])
            rows = row_order(11, 0, m, int(b), blk.n_rows)
            K.sgd_tg_block(blk.indptr, blk.indices, blk.data, blk.y, rows, w, Gl, ist, fst, 0.2, 0, 0.5, 0.0,
                           1e-3, 1, np.inf, 0, False, True)
        K.tg_flush(w, Gl, fst, np.inf)
        ws.append(w)
        bs.append(fst[2])
    model = fit(store, "tg", opts, passes=1, paths=2, seed=11, client=None, evaluate=False, shuffle_window=1)
    np.testing.assert_array_equal(model.dense_weights(), (ws[0] + ws[1]) / 2)
    assert model.bias == (bs[0] + bs[1]) / 2 and algo.name == "tg"


def test_truncation_gives_exact_zeros_and_sparser_models(store):
    dense = fit(store, "sgd", {"eta": 0.3}, passes=2, paths=1, client=None)
    sparse_ = fit(store, "tg", {"eta": 0.3, "gravity": 3e-4, "scale": "none"}, passes=2, paths=1, client=None)
    assert sparse_.nnz < 0.6 * dense.nnz and np.all(sparse_.coef_values != 0)
    h = sparse_.meta["holdout"]
    assert 0 <= h["error"] < 0.35 and 0.7 < h["auc"] <= 1
    # the defaults truncate (gravity in units of the data's rms value): sparser than SGD, and still learn
    default = fit(store, "tg", {}, passes=2, paths=1, client=None)
    assert default.nnz < 0.8 * dense.nnz and default.meta["holdout"]["error"] < 0.35
    assert default.meta["hyper"]["resolved"]["gravity"] > 0


def test_model_file_has_no_pickle_and_predicts_like_the_weights(store, tmp_path):
    m = fit(store, "tg", TG, passes=2, paths=1, client=None)
    m.save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    back = load_model(tmp_path / "m.npz")
    X = open_store(store).block(open_store(store).entries("holdout")[0]).X
    np.testing.assert_allclose(back.decision_function(X), X @ m.dense_weights() + m.bias, rtol=1e-12)
    assert back.meta["hyper"]["gravity"] == TG["gravity"] and back.meta["provenance"]["store_id"]
    wider = X.copy()
    wider.resize((X.shape[0], X.shape[1] + 50))
    np.testing.assert_allclose(back.decision_function(wider), back.decision_function(X))


def test_warm_start_from_a_model_with_other_paths(store):
    opts = {"eta": 0.3, "gravity": 1e-4}
    base = fit(store, "tg", opts, passes=2, paths=1, client=None)
    warm = fit(store, "tg", opts, passes=1, paths=2, client=None, init_model=base)
    cold = fit(store, "tg", opts, passes=1, paths=2, client=None)
    assert not warm.meta["provenance"]["resumed"] and warm.meta["holdout"]["error"] <= 0.35
    assert warm.meta["holdout"]["logloss"] < cold.meta["holdout"]["logloss"]


def test_cli_train_evaluate_predict(store, tmp_path):
    r = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "m.npz"), "--algo", "tg", "--passes", "2",
                                 "--gravity", "1e-4", "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert {"model", "algo", "passes", "seconds", "nnz", "density", "holdout"} <= set(s)
    assert {"error", "auc", "logloss"} <= set(s["holdout"]) and 0 <= s["density"] <= 1
    r = CliRunner().invoke(app, ["evaluate", str(tmp_path / "m.npz"), store, "--split", "all", "--json"])
    e = json.loads(r.stdout)
    assert r.exit_code == 0 and e["n_rows"] == open_store(store).n_rows and 0 <= e["error"] <= 1
    assert {"n_rows", "error", "auc", "logloss", "hinge", "nnz", "density"} <= set(e)
    f = data_file("rcv1_subset/rcv1_vw_small_test.svm")
    r = CliRunner().invoke(app, ["predict", str(tmp_path / "m.npz"), str(f), "--out", str(tmp_path / "p.txt")])
    assert r.exit_code == 0, r.output
    pred = np.loadtxt(tmp_path / "p.txt")
    assert pred.shape == (500, 2) and set(np.unique(pred[:, 0])) <= {-1, 1}
    np.testing.assert_array_equal(pred[:, 0], np.where(pred[:, 1] > 0, 1, -1))


def test_config_rejects_unknown_keys_and_supplies_options(store, tmp_path):
    (tmp_path / "bad.toml").write_text('algo = "tg"\ngravty = 0.1\n')
    r = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "m.npz"), "--config", str(tmp_path / "bad.toml")])
    assert r.exit_code != 0 and "gravty" in r.output and "bad.toml" in r.output
    (tmp_path / "ok.toml").write_text('[train]\nalgo = "sgd"\npasses = 1\neta = 0.05\nworkers = 1\n')
    r = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "m.npz"), "--config", str(tmp_path / "ok.toml"),
                                 "--json"])
    assert r.exit_code == 0, r.output
    m = load_model(tmp_path / "m.npz")
    assert m.algorithm == "sgd" and m.meta["hyper"]["eta"] == 0.05 and m.meta["passes"] == 1


def test_real_subprocess_reports_bad_store_cleanly(tmp_path):
    r = subprocess.run([sys.executable, "-m", "cli.main", "train", str(tmp_path / "nope"), "--out",
                        str(tmp_path / "m.npz"), "--workers", "1"], capture_output=True, text=True)
    assert r.returncode == 1 and "nope" in r.stderr and "Traceback" not in r.stderr


def test_shuffle_window_visits_every_row_once_and_fixes_label_sorted_files(tmp_path, client):
    """SVMlight example 1 is sorted by label: single-class blocks bias a block-shuffled learner."""
    out = tmp_path / "sorted.zarr"
    ingest([str(data_file("svmlight_example1/train.dat"))], str(out), IngestOptions(block_mb=0.05, holdout=0.2),
           client=client)
    st = open_store(out)
    train_nnz = sum(e["nnz"] for e in st.entries("train"))
    errs = {}
    for w in (1, 8):
        m = fit(str(out), "sgd", {"eta": 1.0}, passes=4, paths=1, client=None, shuffle_window=w)
        assert m.meta["provenance"]["timing"]["nnz_processed"] == 4 * train_nnz
        errs[w] = m.meta["holdout"]["error"]
    assert errs[8] < errs[1]


def test_predict_reads_compressed_text_as_ingest_does(tmp_path):
    import gzip

    from pipeline.predict import predict_to_file

    text = "".join(f"{'+1' if i % 3 else '-1'} {i % 7 + 1}:0.5 {i % 11 + 8}:-1.25\n" for i in range(200))
    (tmp_path / "x.svm").write_text(text)
    with gzip.open(tmp_path / "x.svm.gz", "wt") as f:
        f.write(text)
    from pipeline.model import Model

    m = Model.from_dense(np.linspace(-1, 1, 20), 0.1)
    assert predict_to_file(m, str(tmp_path / "x.svm.gz"), str(tmp_path / "gz.txt")) == 200
    predict_to_file(m, str(tmp_path / "x.svm"), str(tmp_path / "plain.txt"))
    assert (tmp_path / "gz.txt").read_text() == (tmp_path / "plain.txt").read_text()


def test_evaluate_counts_the_labels_predict_writes(store, tmp_path):
    """A score of exactly 0 is label -1 for predict, so evaluate's error is predict's: an all-zero model's error is
    the positive fraction (y·f <= 0 would call every row an error)."""
    from pipeline.evaluate import evaluate_store
    from pipeline.model import Model
    from pipeline.predict import predict_to_file

    st = open_store(store)
    zero = Model.from_dense(np.zeros(st.n_features), 0.0)
    res = evaluate_store(zero, store, "all")
    predict_to_file(zero, store, str(tmp_path / "p.txt"))
    pred = np.loadtxt(tmp_path / "p.txt")[:, 0]
    y = np.concatenate([b.y for b in st.blocks("all")])
    assert res["error"] == np.mean(pred != y) == np.mean(y > 0) and 0 < res["error"] < 1
