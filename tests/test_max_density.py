"""--max-density (any algorithm; nssl as in its paper) stops when the bound is reached, inside a pass if need
be, and returns the model at that point; a bound the first updates already cross is never an error."""
import json
import subprocess
import sys

import pytest

from pipeline.model import load_model
from pipeline.train import fit


def cli(*args):
    return subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("md")
    assert cli("synth", d / "s.svm", "--rows", "1500", "--features", "4000", "--nnz-per-row", "25").returncode == 0
    r = cli("ingest", d / "s.svm", "--out", d / "st.zarr", "--block-mb", "0.05")
    assert r.returncode == 0, r.stderr
    return str(d / "st.zarr")


def test_nssl_stops_inside_the_first_pass_at_the_bound(store, tmp_path):
    r = cli("train", store, "--out", tmp_path / "m.npz", "--algo", "nssl", "--max-density", "0.02", "--passes", "3",
            "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    m = load_model(tmp_path / "m.npz")
    assert s["stopped"] == "max_density" and 0.015 < m.density <= 0.02 and m.meta["passes"] == 0
    last = [h for h in m.meta["history"] if "stopped" not in h][-1]
    assert last["rows_in_stage"] > 0 and last["holdout"]["error"] < 0.5


@pytest.mark.parametrize("algo,paths", [("nssl", 1), ("tg", 2), ("sgd", 1)])
def test_the_model_at_the_bound_for_any_algorithm(store, algo, paths):
    free = fit(store, algo, {}, passes=1, paths=paths, seed=0)
    bound = free.density / 4
    m = fit(store, algo, {}, passes=3, paths=paths, seed=0, max_density=bound)
    assert m.meta["stopped"] == "max_density" and 0.5 * bound < m.density <= bound
    rows = [h for h in m.meta["history"] if "rows_in_stage" in h][-1]["rows_in_stage"]
    assert rows > 0 and m.meta["passes"] == 0  # stopped inside the first pass
    again = fit(store, algo, {}, passes=3, paths=paths, seed=0, max_density=bound)  # deterministic
    assert (again.coef != m.coef).nnz == 0


def test_a_bound_the_first_updates_cross_is_not_an_error(store, tmp_path):
    r = cli("train", store, "--out", tmp_path / "m.npz", "--algo", "nssl", "--max-density", "0.00001")
    assert r.returncode == 0, r.stderr
    m = load_model(tmp_path / "m.npz")
    assert m.meta["stopped"] == "max_density" and 0 < m.nnz <= 60  # the model after its first row
