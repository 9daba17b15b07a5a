"""The nightly job end to end: real stores, real registry directories, real kill -9 of real processes.

Days are small synth files of one concept (--model-seed 7) with different row seeds. The fault matrix kills a
`sparsepipe retrain` subprocess at a named point (SPARSEPIPE_FAULT), re-runs the night, and compares registry
and store with an uninterrupted night: same versions, pointer, weights (bit for bit), blocks and sources.
"""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from pipeline.model import load_model
from pipeline.registry import open_registry
from pipeline.retrain import EXIT_LOCKED, EXIT_OK, EXIT_REFUSED, TRAIN_RUN_KEYS, load_job, run_job
from pipeline.store.format import read_manifest
from pipeline.synth import synth

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = """store = "{d}/store.zarr"
registry = "{d}/models"
[train]
algo = "tg"
passes = 3
workers = 0
eta = 0.5
gravity = 0.001
scale = "none"
[gate]
metric = "error"
max_change = 0.01
[ingest]
block_mb = 0.1
holdout = 0.2
[retention]
keep = 1
"""


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    d = tmp_path_factory.mktemp("days")
    files = {}
    for k in range(1, 5):
        synth(str(d / f"day{k}.svm"), rows=2000, features=5000, nnz_per_row=30, seed=k, model_seed=7)
        files[k] = str(d / f"day{k}.svm")
    text = open(files[4]).read().splitlines()
    with open(d / "flipped.svm", "w") as f:  # day 4 with every label flipped
        f.write("\n".join(("-1" if ln.split(" ", 1)[0] in ("1", "+1") else "+1") + " " + ln.split(" ", 1)[1]
                          for ln in text) + "\n")
    with open(d / "newfeat.svm", "w") as f:  # day 4 on features no earlier day has
        f.write("\n".join(ln.split(" ")[0] + " " + " ".join(f"{int(t.split(':')[0]) + 5000}:{t.split(':')[1]}"
                                                            for t in ln.split(" ")[1:]) for ln in text) + "\n")
    open(d / "empty.svm", "w").close()
    files.update(flipped=str(d / "flipped.svm"), newfeat=str(d / "newfeat.svm"), empty=str(d / "empty.svm"))
    return files


def _job(d, extra=""):
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "job.toml")
    with open(p, "w") as f:
        f.write(JOB.format(d=d) + extra)
    return p


def _run(d, inputs, **kw):
    return run_job(load_job(os.path.join(d, "job.toml")), inputs, **kw)


@pytest.fixture(scope="module")
def base2(tmp_path_factory, days):
    """Nights 1 and 2 done (first run, then a warm-started promotion)."""
    d = str(tmp_path_factory.mktemp("base2"))
    _job(d)
    r1 = _run(d, [days[1]])
    r2 = _run(d, [days[2]])
    return d, r1, r2


def _copy(base, dst):
    dst = str(dst)
    shutil.copytree(base, dst, dirs_exist_ok=True)
    _job(dst)
    return dst


@pytest.fixture(scope="module")
def ref3(tmp_path_factory, base2, days):
    """Night 3 uninterrupted on a copy of base2 (the reference of the fault matrix)."""
    d = _copy(base2[0], tmp_path_factory.mktemp("ref3"))
    code, res = _run(d, [days[3]])
    assert code == EXIT_OK
    return d, res


def snapshot(d):
    reg = open_registry(os.path.join(d, "models"))
    meta = reg.meta()
    out = {"production": meta["production"], "previous": meta["previous"], "refused": meta["refused"],
           "last_version": meta["last_version"]}
    keep = ("version", "run", "parent", "decision", "reason", "metrics", "production_metrics", "generations", "nnz",
            "passes", "paths", "warm_start", "manifest_version")
    out["index"] = [{k: r.get(k) for k in keep} for r in reg.versions()]
    out["model_files"] = sorted(os.listdir(reg.models_dir))
    out["weights"] = {}
    for name in out["model_files"]:
        m = load_model(os.path.join(reg.models_dir, name))
        out["weights"][name] = (m.coef_indices.tobytes(), m.coef_values.tobytes(), m.bias,
                                tuple((k, v.tobytes()) for s in m.states or () for k, v in sorted(s.items())))
    man = read_manifest(os.path.join(d, "store.zarr"))
    out["store"] = {"version": man["manifest_version"], "n_features": man["n_features"],
                    "blocks": [(b["key"], b["rows"], b["nnz"], b["checksum"], b["split"], b["generation"])
                               for b in man["blocks"]],
                    "sources": [(s["fingerprint"], s["generation"], s["rows"]) for s in man["sources"]]}
    out["leftovers"] = sorted(p for p in os.listdir(d) if ".tmp-" in p) + \
        sorted(os.path.join(r, f) for r, _, fs in os.walk(reg.runs_dir) for f in fs if f != "state.json")
    return out


def test_first_run_promote_warm_start_and_noop(base2, days):
    d, (c1, r1), (c2, r2) = base2
    assert c1 == EXIT_OK and r1["status"] == "promoted" and r1["reason"].startswith("first model")
    assert r1["production"]["version"] is None and r1["validation"]["ok"]
    assert c2 == EXIT_OK and r2["status"] == "promoted" and r2["versions"]["production"] == 2
    # night 2 resumed production's optimiser state exactly (same algorithm, hyper-parameters, paths, seed)
    assert r2["candidate"]["warm_start"] == 1 and r2["candidate"]["exact_resume"] is True
    assert r2["window"]["generations"] == [1, 2] and r2["window"]["evaluation_generations"] == [2]
    assert set(r2["candidate"]["metrics"]) >= {"error", "auc", "logloss"} and r2["production"]["metrics"]["error"] > 0
    assert r2["rows_appended"] == 2000 and r2["inputs"][0]["fingerprint"]
    assert set(r2["seconds"]) >= {"lock", "append", "validate", "train", "evaluate", "promote", "retention", "total"}
    reg = open_registry(os.path.join(d, "models"))
    assert reg.production().meta["passes"] == 6  # 3 + 3, resumed
    # re-running a completed night: a no-op that reports the earlier decision
    before = snapshot(d)
    code, res = _run(d, [days[2]])
    assert code == EXIT_OK and res["noop"] and res["earlier_status"] == "promoted" and res["versions"]["candidate"] == 2
    assert snapshot(d) == before


def test_retention_and_cluster_determinism(ref3, base2, days, tmp_path, client):
    d, res = ref3
    assert res["versions"]["deleted"] == [1]  # keep = 1: v3 newest, v2 previous production, v1 goes
    assert snapshot(d)["model_files"] == ["v000002.npz", "v000003.npz"]
    # the same night on a real 2-worker cluster ends with the same registry and store, bit for bit
    d2 = _copy(base2[0], tmp_path / "cluster")
    code, _ = _run(d2, [days[3]], client=client)
    assert code == EXIT_OK and snapshot(d2) == snapshot(d)


@pytest.mark.parametrize("point", ["during_append", "during_train:2", "after_train", "during_promote",
                                   "during_retention"])
def test_kill_9_then_rerun_equals_uninterrupted(point, base2, ref3, days, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    env = {**os.environ, "SPARSEPIPE_FAULT": point}
    p = subprocess.run([sys.executable, "-m", "cli.main", "retrain", "--config", os.path.join(d, "job.toml"),
                        "--new", days[3]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr[-2000:]
    code, res = _run(d, [days[3]])
    assert code == EXIT_OK and res["resumed"]
    if point.startswith("during_train"):
        assert res["candidate"]["resumed_from_checkpoint_pass"] == 1  # the checkpoint of pass 1 survived
    assert snapshot(d) == snapshot(ref3[0])
    log = open_registry(os.path.join(d, "models")).run_log()
    night = [r for r in log if r.get("run") == res["run"]]
    assert [r["event"] for r in night if r["event"] in ("start", "end")] == ["start", "start", "end"]
    assert any(r["event"] == "stale_lock_taken_over" and r["holder"]["run"] == res["run"] for r in log)


def test_concurrent_run_exits_3_and_touches_nothing(base2, days, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    code = ("import sys, time; from pipeline.registry import open_registry; "
            "l = open_registry(sys.argv[1]).lock('night-other'); l.__enter__(); print('held', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, os.path.join(d, "models")], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(d)
        log_before = open(os.path.join(d, "models", "runs.jsonl")).read()
        t0 = time.time()
        r = CliRunner().invoke(app, ["retrain", "--config", os.path.join(d, "job.toml"), "--new", days[3], "--json"])
        assert r.exit_code == EXIT_LOCKED and time.time() - t0 < 5
        assert json.loads(r.stdout)["status"] == "locked" and str(holder.pid) in json.loads(r.stdout)["error"]
        assert snapshot(d) == before and open(os.path.join(d, "models", "runs.jsonl")).read() == log_before
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_taken_over(base2, days, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(os.path.join(d, "models", "retrain.lock"), "w") as f:
        json.dump({"pid": dead.pid, "host": os.uname().nodename, "run": "night-killed", "since": "x"}, f)
    code, res = _run(d, [days[3]])
    assert code == EXIT_OK
    rec = [r for r in open_registry(os.path.join(d, "models")).run_log() if r["event"] == "stale_lock_taken_over"]
    assert rec[-1]["holder"]["pid"] == dead.pid and rec[-1]["holder_process"] == "gone"


def test_reject_worse_candidate_through_cli_json(base2, days, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    r = CliRunner().invoke(app, ["retrain", "--config", os.path.join(d, "job.toml"), "--new", days[3],
                                 "--set", "train.eta=1000", "--set", "train.gravity=1", "--json"])
    assert r.exit_code == EXIT_OK, r.output
    res = json.loads(r.stdout)
    assert res["status"] == "kept" and res["decision"] == "reject" and "worse by" in res["reason"]
    assert res["candidate"]["exact_resume"] is False  # other hyper-parameters: a warm start
    assert res["candidate"]["metrics"]["error"] > res["production"]["metrics"]["error"]
    reg = open_registry(os.path.join(d, "models"))
    assert reg.production_version == 2 and reg.version(3)["decision"] == "rejected"
    listing = json.loads(CliRunner().invoke(app, ["registry", "list", os.path.join(d, "models"), "--json"]).stdout)
    assert [(v["version"], v["production"], v["decision"]) for v in listing][-2:] == \
        [(2, True, "promoted"), (3, False, "rejected")]
    assert all({"version", "path", "production", "decision", "metrics", "created"} <= set(v) for v in listing)


def test_rollback_and_manual_promote(base2, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    reg_dir = os.path.join(d, "models")
    r = CliRunner().invoke(app, ["registry", "rollback", reg_dir, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == {"production": 1, "from": 2}
    assert open_registry(reg_dir).production().meta["registry_version"] == 1
    r = CliRunner().invoke(app, ["registry", "rollback", reg_dir])
    assert r.exit_code == 1 and "no previous production" in r.output
    r = CliRunner().invoke(app, ["registry", "promote", reg_dir, "2"])
    assert r.exit_code == 0 and open_registry(reg_dir).production_version == 2
    shown = json.loads(CliRunner().invoke(app, ["registry", "show", reg_dir, "2", "--json"]).stdout)
    assert shown["parent"] == 1 and shown["generations"] == [1, 2]
    assert [e["event"] for e in open_registry(reg_dir).run_log()].count("rollback") == 1
    r = CliRunner().invoke(app, ["registry", "promote", reg_dir, "2"])  # already production: says so, logs nothing
    assert r.exit_code == 0 and "production: v2 already; nothing changed" in r.output
    assert [e["event"] for e in open_registry(reg_dir).run_log()].count("promote") == 3  # 2 nights, 1 manual


@pytest.mark.parametrize("bad", ["flipped", "empty", "newfeat"])
def test_validation_refuses_broken_night(bad, base2, days, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    before = snapshot(d)
    r = CliRunner().invoke(app, ["retrain", "--config", os.path.join(d, "job.toml"), "--new", days[bad], "--json"])
    assert r.exit_code == EXIT_REFUSED, r.output
    res = json.loads(r.stdout)
    assert res["status"] == "refused" and not res["validation"]["ok"]
    word = {"flipped": "positive fraction", "empty": "0 rows", "newfeat": "features no earlier generation"}[bad]
    assert word in res["reason"]
    after = snapshot(d)
    assert after["index"] == before["index"] and after["production"] == 2  # nothing trained or promoted
    assert after["refused"][0]["generation"] == 3  # appended, marked, excluded from the window
    if bad == "flipped":
        # a normal night after it trains without the refused generation; --force overrides with a record
        code, res = _run(d, [days[4]])
        assert code == EXIT_OK and res["validation"]["ok"] and 3 not in res["window"]["generations"]
        code, res = _run(d, [days[bad]], force=True)
        assert code == EXIT_OK and res["validation"]["forced"]
        reg = open_registry(os.path.join(d, "models"))
        assert reg.meta()["refused"] == [] and any(e["event"] == "validation_forced" for e in reg.run_log())


def test_corrupt_production_is_an_error_naming_the_file(base2, days, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    path = os.path.join(d, "models", "models", "v000002.npz")
    with open(path, "r+b") as f:
        f.truncate(100)
    r = CliRunner().invoke(app, ["retrain", "--config", os.path.join(d, "job.toml"), "--new", days[3]])
    assert r.exit_code == 1 and "v000002.npz" in r.output and "production model" in r.output
    assert open_registry(os.path.join(d, "models")).versions()[-1]["version"] == 2  # no silent bootstrap


def test_job_file_keys(tmp_path):
    p = _job(str(tmp_path), "[window]\ngenerations = 2\n")
    cfg = load_job(p)
    assert cfg.generations == 2 and cfg.train["eta"] == 0.5 and cfg.keep == 1
    with open(p, "a") as f:
        f.write("[gate2]\nx = 1\n")
    with pytest.raises(ValueError, match=r"job.toml: unknown key 'gate2'"):
        load_job(p)
    p = _job(str(tmp_path / "b"), "[validation]\nmax_unseen = 0.3\n")
    with pytest.raises(ValueError, match=r"job.toml: unknown key validation.max_unseen"):
        load_job(p)
    r = CliRunner().invoke(app, ["retrain", "--config", _job(str(tmp_path / "c")), "--set", "train.nope=1"])
    assert r.exit_code == 2 and "train.nope" in r.output
    for old, new, cause in [("eta = 0.5", 'eta = "abc"', "job.toml: 'train.eta' must be a number, got 'abc'"),
                            ("eta = 0.5", "K = 0", r"job.toml: --algo \w+: K must be >= 1, got 0"),
                            ("passes = 3", 'passes = "two"', "job.toml: 'train.passes' must be an integer")]:
        p = _job(str(tmp_path / "d"))
        with open(p) as f:
            text = f.read()
        with open(p, "w") as f:
            f.write(text.replace(old, new))
        with pytest.raises(ValueError, match=cause):
            load_job(p)
    # a valid file with a bad flag: the error names the command line, not the file
    with pytest.raises(ValueError, match=r"^the command line's settings \(with .*job.toml\): gate.max_change must be a "
                                         r"number, got 'x'"):
        load_job(_job(str(tmp_path / "e")), {"gate": {"max_change": "x"}})
    for bad in ("max_unseen_share = 1.5", "max_nnz_ratio = 0.5", "min_rows = -1"):
        with pytest.raises(ValueError, match=r"job.toml: \[validation\] " + bad.split()[0] + " must be in"):
            load_job(_job(str(tmp_path / "f"), f"[validation]\n{bad}\n"))
    from cli.model_cmds import RUN_KEYS

    # [train] takes what `train --config` takes, but the training window, which is the job's [window] table, and
    # the per-pass evaluation's keys (the job evaluates once a night): refused, not ignored
    assert TRAIN_RUN_KEYS == set(RUN_KEYS) - {"generations", "record_path", "evaluate_every"}
    for key, val in (("record_path", '"x.jsonl"'), ("evaluate_every", "2")):
        p = _job(str(tmp_path / "g"))
        with open(p) as f:
            text = f.read()
        with open(p, "w") as f:
            f.write(text.replace("passes = 3", f"passes = 3\n{key} = {val}"))
        with pytest.raises(ValueError, match=f"job.toml: train.{key}: the job evaluates once a night"):
            load_job(p)


def test_retrain_without_new_trains_on_current_window(base2, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    code, res = _run(d, [])
    assert code == EXIT_OK and res["run"].startswith("manual-") and res["rows_appended"] == 0
    assert res["candidate"]["version"] == 3
    code, again = _run(d, [])
    assert again["noop"]  # nothing changed since: same run
    cfg = load_job(os.path.join(d, "job.toml"), {"train": {"eta": 0.25}, "window": {"generations": 1}})
    code, res = run_job(cfg, [])
    assert code == EXIT_OK and res["candidate"]["version"] == 4 and res["window"]["generations"] == [2]


def test_shipped_nightly_config_loads():
    cfg = load_job(os.path.join(ROOT, "configs", "nightly.toml"))
    assert cfg.algo == "stsgd" and cfg.gate.metric == "error" and cfg.validation.max_unseen_share == 0.5


def test_train_generations_window_reads_only_the_newest_generations(base2, tmp_path):
    """`train --generations 1` trains on the newest generation's training blocks only: the same weights as
    fit() given exactly those blocks, and not the weights of training on both generations."""
    from pipeline.store.reader import open_store
    from pipeline.train import fit

    d = base2[0]
    store = f"{d}/store.zarr"
    st = open_store(store)
    assert len(st.generations()) == 2
    newest = st.window(1)
    out = tmp_path / "m.npz"
    res = CliRunner().invoke(app, ["train", store, "--out", str(out), "--algo", "tg", "--passes", "2",
                                   "--paths", "1", "--generations", "1", "--eta", "0.5", "--gravity", "0.001"])
    assert res.exit_code == 0, res.output
    opts = {"eta": 0.5, "gravity": 0.001}
    only = fit(store, "tg", opts, passes=2, paths=1, client=None,
               blocks=st.keys("train", newest) + st.keys("holdout", newest))
    both = fit(store, "tg", opts, passes=2, paths=1, client=None)
    m = load_model(out)
    assert np.array_equal(m.coef_indices, only.coef_indices) and np.array_equal(m.coef_values, only.coef_values)
    assert not (m.nnz == both.nnz and np.array_equal(m.coef_values, both.coef_values))
    assert m.meta["holdout"]["n_rows"] == only.meta["holdout"]["n_rows"] < both.meta["holdout"]["n_rows"]


REFIT = '[refit]\nenabled = true\nl1 = 1e-3\nmax_iter = 50\n'


@pytest.fixture(scope="module")
def refit1(tmp_path_factory, days):
    """Night 1 of a [refit]-enabled job, uninterrupted."""
    d = str(tmp_path_factory.mktemp("refit1"))
    _job(d, REFIT)
    return d, _run(d, [days[1]])


def test_refit_in_the_nightly_job(refit1, days, tmp_path):
    """[refit] enabled: the candidate that is gated and registered is the refitted model (support within the
    trained one, metrics of the refitted weights); a re-run of the night is a no-op; bad [refit] keys are refused."""
    from pipeline.evaluate import evaluate_store

    d, (code, res) = refit1
    assert code == EXIT_OK and res["status"] == "promoted", res
    prod = open_registry(os.path.join(d, "models")).production()
    info = prod.meta["refit"]
    assert info["l1"] == 1e-3 and info["nnz"] == prod.nnz <= info["nnz_before"] and prod.states is not None
    assert res["candidate"]["refit"]["nnz"] == prod.nnz
    assert prod.learner is not None and prod.learner[0].shape[0] == info["nnz_before"]  # a warm start's weights
    st = os.path.join(d, "store.zarr")
    assert res["candidate"]["metrics"]["error"] == pytest.approx(evaluate_store(prod, st, "holdout")["error"])
    code, again = _run(d, [days[1]])  # the same night again: a no-op reporting the earlier decision
    assert code == EXIT_OK and again["noop"] and again["earlier_status"] == "promoted"
    d2 = _copy(d, tmp_path / "night2")  # a copy: the fixture's night is the kill test's reference
    _job(d2, REFIT)
    code, night2 = _run(d2, [days[2]])  # resumes the learner's state kept in the refitted production
    assert code == EXIT_OK and night2["candidate"]["exact_resume"] is True, night2
    for bad, msg in (('[refit]\nenabled = true\nl3 = 1\n', "refit.l3"), ('[refit]\nl1 = "x"\n', "refit.l1"),
                     ('[refit]\nenabled = 1\n', "refit.enabled"), ('[refit]\nselect = "best"\n', "refit.select")):
        with pytest.raises(ValueError, match=msg):
            load_job(_job(str(tmp_path / "bad"), bad))


def test_kill_9_during_refit_then_rerun_equals_uninterrupted(refit1, days, tmp_path):
    """A [refit]-enabled night SIGKILLed inside the refit (its 3rd objective evaluation, after every pass is
    checkpointed) and run again ends with the registry and store of the uninterrupted night, bit for bit: the
    re-run resumes the checkpoint and refits it again (the unrefitted checkpoint's weights would differ)."""
    d = str(tmp_path / "night")
    _job(d, REFIT)
    env = {**os.environ, "SPARSEPIPE_FAULT": "during_refit:3"}
    p = subprocess.run([sys.executable, "-m", "cli.main", "retrain", "--config", os.path.join(d, "job.toml"),
                        "--new", days[1]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr[-2000:]
    reg = open_registry(os.path.join(d, "models"))
    state = reg.run_state(refit1[1][1]["run"])  # the same night: the same run id
    assert state["parent"] is None and "trained" not in state  # killed inside the refit, nothing registered
    code, res = _run(d, [days[1]])
    assert code == EXIT_OK and res["resumed"] and res["candidate"]["resumed_from_checkpoint_pass"] == 3
    want = dict(refit1[1][1]["candidate"]["refit"], seconds=res["candidate"]["refit"]["seconds"])
    assert res["candidate"]["refit"] == want
    assert snapshot(d) == snapshot(refit1[0])


def test_an_stsgd_job_refits_by_default_like_train(days, tmp_path):
    """[refit] enabled defaults to train's rule: on for stsgd (no [refit] table), off when the table says so."""
    tg_train = 'algo = "tg"\npasses = 3\nworkers = 0\neta = 0.5\ngravity = 0.001\nscale = "none"\n'
    models = {}
    for name, extra in (("default", ""), ("off", "[refit]\nenabled = false\n")):
        d = str(tmp_path / name)
        p = _job(d, extra)
        text = open(p).read()
        assert tg_train in text
        open(p, "w").write(text.replace(tg_train, 'algo = "stsgd"\npasses = 2\nworkers = 0\n'))
        code, res = _run(d, [days[1]])
        assert code == EXIT_OK and res["status"] == "promoted", res
        models[name] = open_registry(os.path.join(d, "models")).production()
    on, off = models["default"], models["off"]
    assert "refit" in on.meta and "refit" not in off.meta
    assert on.meta["refit"]["nnz_before"] == off.nnz and set(on.coef_indices) <= set(off.coef_indices)


def test_a_corrupt_store_is_exit_5_in_the_json_too(base2, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    man = read_manifest(os.path.join(d, "store.zarr"))
    key = next(b["key"] for b in man["blocks"] if b["split"] == "train")
    chunk = os.path.join(d, "store.zarr", "blocks", key, "data", "c", "0")
    raw = bytearray(open(chunk, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(chunk, "wb").write(bytes(raw))
    r = CliRunner().invoke(app, ["retrain", "--config", os.path.join(d, "job.toml"), "--json"])
    assert r.exit_code == 5 and key in r.output, r.output
    assert json.loads(r.stdout)["exit_code"] == 5
    assert open_registry(os.path.join(d, "models")).run_log()[-1]["event"] == "error"


def test_a_bad_train_value_is_refused_before_the_store_changes(base2, days, tmp_path):
    d = _copy(base2[0], tmp_path / "night")
    before = read_manifest(os.path.join(d, "store.zarr"))
    r = CliRunner().invoke(app, ["retrain", "--config", os.path.join(d, "job.toml"), "--new", days[3],
                                 "--set", "train.eta=abc"])
    assert r.exit_code == 2 and "'train.eta' must be a number, got 'abc'" in r.output
    assert read_manifest(os.path.join(d, "store.zarr")) == before
    assert not os.path.exists(os.path.join(d, "models", "runs")) or not any(
        json.load(open(os.path.join(d, "models", "runs", r_, "state.json"))).get("status") == "running"
        for r_ in os.listdir(os.path.join(d, "models", "runs")))


def test_the_nightly_training_stops_where_its_algorithm_stops(days, tmp_path):
    """The job trains pass by pass from checkpoints; when the algorithm's own stopping rule ends the run (STSGD's
    tol), that pass is the night's last: the candidate is the model one uninterrupted fit gives."""
    from pipeline.store.reader import open_store
    from pipeline.train import fit

    d = str(tmp_path / "n")
    os.makedirs(d)
    p = os.path.join(d, "job.toml")
    with open(p, "w") as f:
        f.write(f'store = "{d}/store.zarr"\nregistry = "{d}/models"\n[train]\nalgo = "stsgd"\npasses = 6\n'
                f'workers = 0\nn_K = 0\ntol = 0.3\n[refit]\nenabled = false\n[ingest]\nblock_mb = 0.1\n'
                f'holdout = 0.2\n')
    code, res = run_job(load_job(p), [days[1]])
    assert code == EXIT_OK
    st = open_store(f"{d}/store.zarr")
    one = fit(st.path, "stsgd", {"n_K": 0, "tol": 0.3}, passes=6, paths=1, evaluate=False, blocks=st.keys("train"))
    assert one.meta["stopped"] == "rule" and one.meta["passes"] < 6
    cand = load_model(open_registry(f"{d}/models").model_file(res["candidate"]["version"]))
    assert cand.meta["retrain"]["passes_done"] == one.meta["passes"] and cand.meta["stopped"] == "rule"
    assert np.array_equal(cand.coef_indices, one.coef_indices) and np.array_equal(cand.coef_values, one.coef_values)


def test_a_damaged_index_stops_the_job_and_deletes_no_model(base2, days, tmp_path):
    """index.jsonl that lost the production version's record (cut short) or holds a line that does not parse:
    the next night stops naming the file, and every model file is still there."""
    d = _copy(base2[0], tmp_path / "night")
    reg = os.path.join(d, "models")
    files = sorted(os.listdir(os.path.join(reg, "models")))
    index = os.path.join(reg, "index.jsonl")
    text = open(index).read()
    lines = text.splitlines()
    open(index, "w").write("\n".join(lines[:-1]) + "\n" + lines[-1][:20])  # production's record torn
    r = CliRunner().invoke(app, ["retrain", "--config", os.path.join(d, "job.toml"), "--new", days[3]])
    assert r.exit_code == 1 and "index.jsonl: does not list version 2" in r.output and "nothing was deleted" in r.output
    assert sorted(os.listdir(os.path.join(reg, "models"))) == files
    open(index, "w").write(lines[0][:20] + "\n" + "\n".join(lines[1:]) + "\n")  # a damaged line before others
    r = CliRunner().invoke(app, ["registry", "list", reg])
    assert r.exit_code == 1 and "index.jsonl:1: not a JSON record" in r.output
    open(index, "w").write('{"foo": 1}\n' + text)
    r = CliRunner().invoke(app, ["registry", "list", reg])
    assert r.exit_code == 1 and "index.jsonl:1: a record without version, file" in r.output
    assert sorted(os.listdir(os.path.join(reg, "models"))) == files


def test_a_first_night_of_one_block_is_refused_before_the_append(days, tmp_path):
    """A night's holdout is a share of its blocks: a first night under block_mb would leave the job without an
    evaluation set for good (the night is in the store). Refused before anything is appended, naming block_mb; the
    run log records the error; a smaller block_mb then runs."""
    d = str(tmp_path / "night")
    job = _job(d)
    r = CliRunner().invoke(app, ["retrain", "--config", job, "--new", days[1], "--set", "ingest.block_mb=4"])
    assert r.exit_code == 1 and "block_mb = 4 MB" in r.output and "nothing was appended" in r.output, r.output
    assert not os.path.exists(os.path.join(d, "store.zarr"))
    assert open_registry(os.path.join(d, "models")).run_log()[-1]["event"] == "error"
    code, res = _run(d, [days[1]])
    assert code == EXIT_OK and res["status"] == "promoted"


def _listening_inodes() -> set:
    """Inodes of the TCP sockets in LISTEN state (st 0A) that this process holds open."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                if cols[3] == "0A":
                    listening.add(cols[9])
    return mine & listening


def test_a_job_with_workers_0_opens_no_listening_socket(days, tmp_path):
    """``workers = 0`` runs the night in this process (the append on its threads): no Dask scheduler, so no
    port open to the network while it runs (it had listened on 0.0.0.0 during the append)."""
    import threading

    d = str(tmp_path)
    _job(d)
    seen, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            seen.update(_listening_inodes())
            time.sleep(0.005)

    before = _listening_inodes()
    t = threading.Thread(target=watch)
    t.start()
    try:
        code, res = _run(d, [days[1]])
    finally:
        done.set()
        t.join()
    assert code == EXIT_OK and res["status"] == "promoted"
    assert seen - before == set()
