"""`sparsepipe reorder` (pipeline/reorder.py): a store in the input's order copied with its features numbered by
frequency; and the order-free sum its step sizes start from (pipeline/kernels/exact_sum.py)."""
import json
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction

import numpy as np
import pytest

from pipeline.ingest import IngestOptions, ingest
from pipeline.kernels.exact_sum import exact_sum
from pipeline.reorder import ReorderError, reorder
from pipeline.store import order
from pipeline.store.format import StoreCorruptError
from pipeline.store.reader import open_store
from pipeline.store.verify import verify_store
from tests.conftest import data_file, same_model

NEWS20 = "news20_binary/news20_binary.svm"


# ------------------------------------------------------------------------------------------------- the exact sum
@pytest.mark.parametrize("seed", range(4))
def test_the_exact_sum_is_the_correctly_rounded_sum_in_any_order(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    v = rng.lognormal(0.0, 30.0, n) * rng.choice([-1.0, 1.0], n)  # exponents over ~±100 decades
    v[rng.integers(0, n, 5)] = rng.choice([5e-324, 1e-310, -2e-320, 1e300, 0.0], 5)  # subnormals, large, zero
    want = float(sum((Fraction(float(x)) for x in v), Fraction(0)))  # the reference: exact rationals, rounded once
    assert exact_sum(v) == want
    assert exact_sum(rng.permutation(v)) == want
    assert exact_sum(np.zeros(0)) == 0.0
    assert exact_sum(np.array([1e308, 1e308, -1e308])) == 1e308  # no intermediate overflow
    assert np.isnan(exact_sum(np.array([1.0, np.nan]))) and exact_sum(np.array([1.0, np.inf])) == np.inf


# ------------------------------------------------------------------------------------------------- reorder
@pytest.fixture(scope="module")
def pair(tmp_path_factory, client):
    """news20 ingested in the input's order (1 MiB blocks), and its reordered copy."""
    d = tmp_path_factory.mktemp("reorder")
    g, r = str(d / "g.zarr"), str(d / "r.zarr")
    ingest([str(data_file(NEWS20))], g, IngestOptions(block_mb=1.0, feature_order="given"), client=client)
    before = open_store(g).manifest
    summary = reorder(g, r, client=client)
    return g, r, before, summary


def test_a_reordered_copy_holds_the_same_rows_with_the_most_frequent_features_first(pair):
    g, r, before, summary = pair
    sg, sr = open_store(g), open_store(r)
    assert sg.manifest == before  # the source is not changed
    fo = sr.feature_order
    assert fo["kind"] == "frequency" and fo["source"] == "statistics" and fo["digest"] == summary["digest"]
    assert sr.manifest["store_id"] == before["store_id"]
    assert sr.manifest["manifest_version"] == before["manifest_version"] + 1
    assert [e["key"] for e in sr.entries("holdout")] == [e["key"] for e in sg.entries("holdout")]
    for bg, br in zip(sg.blocks("all"), sr.blocks("all")):
        Xr = sr.external_X(br)
        assert not np.array_equal(bg.indices, br.indices)
        assert np.array_equal(Xr.indptr, bg.X.indptr) and np.array_equal(Xr.indices, bg.X.indices)
        assert np.array_equal(Xr.data, bg.X.data) and np.array_equal(br.y, bg.y)
    fg, fr = sg.feature_stats(), sr.feature_stats()
    to_int = sr.order_maps[0]
    for k in ("col_nnz", "col_sumsq"):  # each feature's sums moved, unchanged
        assert np.array_equal(order.dense_external(fr[k], to_int), fg[k])
    # exact counts: the training split's features in descending count, ties by the lower input id
    hot = order.read_hot(f"{sr.path}/{fo['path']}")
    assert hot.shape[0] == summary["hot"] == np.count_nonzero(fg["col_nnz"])
    c = fg["col_nnz"][hot]
    assert np.all(np.diff(c) <= 0) and np.all(np.diff(hot)[np.diff(c) == 0] > 0)
    rep = verify_store(r)
    assert rep["ok"] and rep["stats_checked"], rep


@pytest.mark.parametrize("algo", ["tg", "ftrl"])
def test_models_on_a_reordered_copy_are_the_same_bit_for_bit(algo, pair, client):
    """Rows keep their order and the step sizes start from an order-free sum: the same model, in the input's ids."""
    from pipeline.train import fit

    g, r, _, _ = pair
    mg = fit(g, algo, {}, passes=2, paths=2, client=client)
    mr = fit(r, algo, {}, passes=2, paths=2, client=client)
    assert same_model(mg, mr) and mr.nnz > 0


def test_reorder_refuses_what_it_cannot_do_and_leaves_nothing(pair, tmp, client):
    g, r, _, _ = pair
    with pytest.raises(ReorderError, match="already numbered by frequency"):
        reorder(r, str(tmp / "again.zarr"), client=client)
    with pytest.raises(ReorderError, match="already exists"):
        reorder(g, r, client=client)
    with pytest.raises(ReorderError, match="does not exist"):
        reorder(g, str(tmp / "no" / "such.zarr"), client=client)
    # a damaged block of the source: named, and no copy or temporary left
    src = tmp / "src.zarr"
    ingest([str(data_file("rcv1_subset/rcv1_vw_small_train.svm"))], str(src),
           IngestOptions(block_mb=0.2, feature_order="given"), client=client)
    key = open_store(str(src)).manifest["blocks"][1]["key"]
    chunk = src / "blocks" / key / "data" / "c" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptError, match=f"block {key}"):
        reorder(str(src), str(tmp / "out.zarr"), client=client)
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("out")) == []


KILL_SCRIPT = """
import sys
from pipeline.reorder import reorder
reorder(sys.argv[1], sys.argv[2], workers=1)
"""


def test_a_reorder_killed_midway_leaves_no_store_and_a_rerun_completes(tmp, client):
    src, out = str(tmp / "src.zarr"), tmp / "out.zarr"
    ingest([str(data_file(NEWS20))], src, IngestOptions(block_mb=0.1, feature_order="given"), client=client)
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, src, str(out)], start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # until block directories are being written
        if len(list(tmp.glob("out.zarr.tmp-*/blocks/*"))) >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the reorder ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists() and list(tmp.glob("out.zarr.tmp-*"))  # only the temporary copy, never a store
    summary = reorder(src, str(out), client=client)
    assert not list(tmp.glob("out.zarr.tmp-*")) and summary["blocks"] == len(open_store(src).manifest["blocks"])
    assert verify_store(str(out))["ok"]


def test_the_command_says_what_it_wrote(pair, tmp):
    g, _, _, _ = pair
    out = tmp / "cli.zarr"
    p = subprocess.run([sys.executable, "-m", "cli.main", "reorder", g, "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["out"] == str(out) and s["blocks"] == len(open_store(g).manifest["blocks"])
    info = subprocess.run([sys.executable, "-m", "cli.main", "info", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert "numbered by frequency" in info.stdout and "counted in the training split" in info.stdout
    p = subprocess.run([sys.executable, "-m", "cli.main", "reorder", str(out), "--out", str(tmp / "x.zarr")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "already numbered by frequency" in p.stderr and not (tmp / "x.zarr").exists()


def test_an_append_that_grows_a_store_past_autos_thresholds_points_to_reorder(tmp, client, monkeypatch):
    a, b, c = (data_file(f"rcv1_subset/rcv1_vw_{n}.svm") for n in ("small_train", "small_test", "smaller_extra"))
    out = str(tmp / "grow.zarr")
    first = ingest([str(a)], out, IngestOptions(), client=client)
    assert open_store(out).feature_order is None and not any("reorder" in n for n in first["notes"])
    monkeypatch.setattr(order, "ORDER_MIN_BYTES", os.path.getsize(a) + 1)  # as if the store began just below 1 GiB
    monkeypatch.setattr(order, "ORDER_MIN_WIDTH", 2)
    notes = ingest([str(b)], out, IngestOptions(), append=True, client=client)["notes"]
    assert [n for n in notes if f"sparsepipe reorder {out} --out NEW" in n]  # said when it crosses them ...
    assert not any("reorder" in n for n in ingest([str(c)], out, IngestOptions(), append=True, client=client)["notes"])
    explicit = str(tmp / "given.zarr")  # ... and never to a store asked to keep the input's ids
    ingest([str(a)], explicit, IngestOptions(feature_order="given"), client=client)
    assert not any("reorder" in n for n in ingest([str(b)], explicit, IngestOptions(), append=True,
                                                  client=client)["notes"])


def test_the_nightly_job_passes_the_note_on(tmp, monkeypatch):
    """The store a nightly job grows is the one that begins small: its append's note reaches the job's output."""
    from pipeline.retrain import EXIT_OK, load_job, run_job
    from pipeline.synth import synth
    from tests.test_retrain import JOB

    days = []
    for k in (1, 2):
        days.append(str(tmp / f"day{k}.svm"))
        synth(days[-1], rows=600, features=3000, nnz_per_row=20, seed=k, model_seed=7)
    d = tmp / "job"
    d.mkdir()
    (d / "job.toml").write_text(JOB.format(d=d))
    said = []

    def night(day):
        return run_job(load_job(str(d / "job.toml")), [day], progress=lambda step, msg: said.append(msg))

    code, first = night(days[0])
    assert code == EXIT_OK and not first.get("append_notes")
    monkeypatch.setattr(order, "ORDER_MIN_BYTES", os.path.getsize(days[0]) + 1)
    monkeypatch.setattr(order, "ORDER_MIN_WIDTH", 2)
    code, second = night(days[1])
    assert code == EXIT_OK and any("sparsepipe reorder" in n for n in second["append_notes"])
    assert any(m.startswith("note: ") and "sparsepipe reorder" in m for m in said)


def test_the_refit_and_its_kkt_expansion_are_the_same_on_a_reordered_copy(pair, client):
    """The refit's vectors over S follow the input's ids on either store (refit.support_positions), also when the
    KKT rounds add columns to S."""
    from pipeline.model import Model
    from pipeline.refit import refit
    from pipeline.train import fit

    g, r, _, _ = pair
    m = fit(g, "ftrl", {}, passes=1, paths=1, client=client, evaluate=False)
    narrow = Model(m.n_features, m.coef_indices[::3], m.coef_values[::3], m.bias, meta=m.meta)
    kw = dict(l1=1e-3, l2=1e-6, max_iter=60, kkt_rounds=1, client=client)
    a, b = refit(narrow, g, **kw), refit(narrow, r, **kw)
    assert a.meta["refit"]["kkt"]["rounds"] == 1 and a.meta["refit"]["kkt"]["added"] > 0
    assert same_model(a, b) and a.meta["refit"]["objective"] == b.meta["refit"]["objective"]
