"""One training option set (train, stability) and `sparsepipe algorithms`: per-algorithm flags work as written
and are refused for algorithms without that parameter; the listing is generated from the registry."""
import dataclasses
import importlib
import json

import numpy as np
import pytest
import typer.main
from typer.testing import CliRunner

from cli.main import app
from cli.train_options import OPTIONS
from pipeline.algorithms import ALGORITHMS
from pipeline.model import load_model


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("opts")
    assert run("synth", d / "s.svm", "--rows", "800", "--features", "3000", "--nnz-per-row", "20").exit_code == 0
    r = run("ingest", d / "s.svm", "--out", d / "st.zarr", "--block-mb", "0.02")
    assert r.exit_code == 0, r.output
    return d / "st.zarr"


def _params(cmd):
    return {p.name for p in typer.main.get_command(app).commands[cmd].params}


def test_train_and_stability_take_the_same_training_options():
    shared = {o.name for o in OPTIONS}
    assert shared <= _params("train")
    assert shared - {"evaluate_every"} <= _params("stability")  # stability does not evaluate per stage
    for flag in ("--loss", "--radius", "--l1-radius", "--nnz", "--epsilon", "--sparsify", "--config", "--set",
                 "--max-density", "--no-verify"):
        for cmd in ("train", "stability"):
            r = run(cmd, "--help")
            assert flag in r.output, (cmd, flag)


def test_per_algorithm_flags_work_as_written(store, tmp_path):
    r = run("train", store, "--out", tmp_path / "l1.npz", "--algo", "l1proj", "--radius", "0.5", "--passes", "1")
    assert r.exit_code == 0, r.output
    m = load_model(tmp_path / "l1.npz")
    assert m.meta["hyper"]["radius"] == 0.5 and np.abs(m.coef.data).sum() <= 0.5 + 1e-6
    r = run("train", store, "--out", tmp_path / "ts.npz", "--algo", "two-stage", "--l1-radius", "3", "--nnz", "25",
            "--sparsify", "mg", "--passes", "1")
    assert r.exit_code == 0, r.output
    h = load_model(tmp_path / "ts.npz").meta["hyper"]
    assert (h["l1_radius"], h["nnz"], h["sparsify"]) == (3.0, 25, "mg")
    assert load_model(tmp_path / "ts.npz").nnz <= 25
    r = run("train", store, "--out", tmp_path / "te.npz", "--algo", "two-stage", "--epsilon", "0.5", "--passes", "1")
    assert r.exit_code == 0, r.output
    assert load_model(tmp_path / "te.npz").meta["hyper"]["epsilon"] == 0.5


@pytest.mark.parametrize("algo,flag,value,owner", [("tg", "--radius", "5", "l1proj"), ("l1proj", "--nnz", "20", "two-stage"),
                                                   ("sgd", "--epsilon", "0.1", "two-stage"),
                                                   ("nssl", "--loss", "hinge", "sgd"),
                                                   ("ftrl", "--sparsify", "dd", "two-stage"),
                                                   ("tg", "--l1-radius", "3", "two-stage")])
def test_a_flag_is_refused_for_an_algorithm_without_that_parameter(store, tmp_path, algo, flag, value, owner):
    r = run("train", store, "--out", tmp_path / "m.npz", "--algo", algo, flag, value)
    assert r.exit_code == 2 and not (tmp_path / "m.npz").exists()
    assert f"{flag} is not a hyper-parameter of --algo {algo}" in r.output and owner in r.output


def test_stability_takes_loss_and_the_other_training_options(store):
    r = run("stability", store, "--algo", "stsgd", "--loss", "hinge", "--runs", "2", "--passes", "1", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["options"]["loss"] == "hinge" and res["runs"] == 2
    lines = [json.loads(ln) for ln in r.stderr.strip().splitlines()]  # not a terminal: one JSON line per run
    assert [ln["event"] for ln in lines] == ["run", "run"] and [ln["seed"] for ln in lines] == [0, 1]


def test_algorithms_lists_every_registered_algorithm_from_its_params():
    r = run("algorithms", "--json")
    assert r.exit_code == 0, r.output
    docs = {d["name"]: d for d in json.loads(r.stdout)}
    assert list(docs) == list(ALGORITHMS)
    for name, (mod, _, params) in ALGORITHMS.items():
        d = docs[name]
        assert d["description"] and d["paper"] and d["section"].startswith("§")
        fields = dataclasses.fields(getattr(importlib.import_module(mod), params))
        assert [p["name"] for p in d["params"]] == [f.name for f in fields]
        for p in d["params"]:
            assert p["type"] and p["meaning"] and p["tag"] and "default" in p
    assert docs["ftrl"]["paper"].startswith("McMahan")
    assert any(p["name"] == "radius" and p["default"] == 10.0 for p in docs["l1proj"]["params"])
    assert {p["name"]: p["tag"] for p in docs["stsgd"]["params"]}["pi0"] == "ST-7"
    # an option the defaults never read says so (and a given one is refused: tests/test_tg_baselines.py)
    no_effect = {n: {p["name"] for p in docs[n]["params"] if "no effect at the defaults" in p["meaning"]}
                 for n in ("sgd", "tg", "stsgd")}
    assert no_effect == {"sgd": {"K", "theta", "rule"}, "tg": set(), "stsgd": {"beta0", "gamma", "g0_init"}}
    one = run("algorithms", "nssl")
    assert one.exit_code == 0 and one.output.startswith("nssl: ") and "density_bound" in one.output
    bad = run("algorithms", "nope")
    assert bad.exit_code == 2 and "unknown algorithm" in bad.output


def test_train_help_names_the_algorithms_and_points_to_the_listing():
    out = run("train", "--help").output
    for name in ALGORITHMS:
        assert name in out
    assert "sparsepipe algorithms" in out


@pytest.mark.parametrize("text, cause", [
    ('[trian]\nalgo = "tg"\n', "unknown table(s) trian"),
    ('algo = "tg"\n[train]\npasses = 2\n', "algo outside the [train] table"),
    ('[train]\npasses = 2\n[train.refit]\nenabled = false\n', "unknown table(s) refit"),
    ('[train]\nalgo = "tg"\nK = 0\n', "K must be >= 1, got 0"),
    ('[train]\nalgo = "tg"\neta = "fast"\n', "'eta' must be a number, got 'fast'"),
])
def test_a_config_is_refused_naming_the_file_and_the_cause(store, tmp_path, text, cause):
    (tmp_path / "c.toml").write_text(text)
    r = run("train", store, "--out", tmp_path / "m.npz", "--config", tmp_path / "c.toml")
    assert r.exit_code == 2 and "c.toml" in r.output and cause in r.output, r.output
    assert not (tmp_path / "m.npz").exists()


@pytest.mark.parametrize("args, cause", [
    (["--set", "K=0"], "K must be >= 1, got 0"), (["--set", "eta=abc"], "--set eta: expected a number, got 'abc'"),
    (["--set", "K=1.5"], "--set K: expected an integer, got '1.5'"), (["--loss", "foo"], "loss must be"),
    (["--algo", "tg", "--schedule", "foo"], "schedule"), (["--algo", "tg", "--set", "eta=-1"], "eta"),
])
def test_a_bad_value_is_a_usage_error_before_any_work(store, tmp_path, args, cause):
    r = run("train", store, "--out", tmp_path / "m.npz", *args)
    assert r.exit_code == 2 and cause in r.output, r.output


def test_default_paths_respect_the_algorithm(store, tmp_path):
    from pipeline.algorithms import default_paths

    assert default_paths("scd", 16, 40) == 1 and default_paths("tg", 16, 40) == 16 and default_paths("tg", 16, 3) == 3
    r = run("train", store, "--algo", "scd", "--passes", "1", "--out", tmp_path / "m.npz")  # no --paths
    assert r.exit_code == 0, r.output
    assert load_model(tmp_path / "m.npz").meta["paths"] == 1


def test_a_run_whose_weights_overflow_is_an_error_and_saves_nothing(store, tmp_path):
    r = run("train", store, "--algo", "grades", "--set", "gamma=0.02", "--passes", "80", "--out", tmp_path / "m.npz")
    assert r.exit_code == 1 and "--algo grades diverged" in r.output, r.output
    assert not (tmp_path / "m.npz").exists()
