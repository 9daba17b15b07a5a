"""Model files: written as a deflate-level-1 .npz that np.load reads without pickle, every array round-trips."""
import zipfile

import numpy as np

from pipeline.model import Model, load_model


def test_model_file_is_a_level_1_npz_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    w = np.where(rng.random(50_000) < 0.1, rng.normal(size=50_000), 0.0)
    states = [{"w": rng.normal(size=50_000), "Gl": np.zeros(50_000), "cursor": np.array([3, 0, 0], np.int64),
               "_timing": np.zeros(4)} for _ in range(2)]
    gstate = {"seen": rng.random(50_000) < 0.5, "stage": np.array(7, np.int64)}
    m = Model.from_dense(w, -0.25, meta={"algorithm": "tg", "shared_keys": []}, states=states, gstate=gstate)
    path = tmp_path / "m.npz"
    m.save(path)
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        assert infos and all(i.compress_type == zipfile.ZIP_DEFLATED for i in infos)
        assert {i.filename for i in infos} >= {"coef_indices.npy", "meta.npy", "state/path1/w.npy",
                                                "state/global/seen.npy"}
    with np.load(path, allow_pickle=False) as z:
        assert np.array_equal(z["coef_values"], w[w != 0])
    got = load_model(path)
    assert got.n_features == 50_000 and got.bias == -0.25
    assert np.array_equal(got.coef_indices, np.flatnonzero(w)) and np.array_equal(got.coef_values, w[w != 0])
    for a, b in zip(got.states, states):
        assert set(a) == {"w", "Gl", "cursor"} and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype
                                                       for k in a)
    assert all(np.array_equal(got.gstate[k], gstate[k]) and got.gstate[k].dtype == gstate[k].dtype for k in gstate)


def test_loading_without_state_gives_the_same_weights_and_reads_no_state_array(tmp_path, monkeypatch):
    """``load_model(path, state=False)`` (what ``evaluate`` and ``predict`` use) reads the weights, bias and meta
    and none of the paths' state arrays."""
    rng = np.random.default_rng(1)
    w = np.where(rng.random(20_000) < 0.1, rng.normal(size=20_000), 0.0)
    states = [{"w": rng.normal(size=20_000), "Gl": np.zeros(20_000)} for _ in range(2)]
    m = Model.from_dense(w, 0.5, meta={"algorithm": "tg", "shared_keys": ["Gl"]}, states=states,
                         gstate={"stage": np.array(3, np.int64)})
    path = tmp_path / "m.npz"
    m.save(path)
    full = load_model(path)
    read = []
    getitem = np.lib.npyio.NpzFile.__getitem__
    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", lambda z, k: read.append(k) or getitem(z, k))
    lean = load_model(path, state=False)
    assert read and not [k for k in read if k.startswith("state/")]
    assert lean.states is None and lean.gstate is None
    assert lean.n_features == full.n_features and lean.bias == full.bias and lean.meta == full.meta
    assert np.array_equal(lean.coef_indices, full.coef_indices) and np.array_equal(lean.coef_values, full.coef_values)


KILLED_SAVE = """
import sys, time
from pipeline.atomic import write_atomically
def fill(f):
    f.write(b"part of a model")
    f.flush()
    open(sys.argv[2], "w").close()
    time.sleep(60)
write_atomically(sys.argv[1], fill, suffix=".npz")
"""


def test_a_saved_model_has_the_umask_permissions_and_a_killed_save_leaves_nothing_behind(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    m = Model.from_dense(np.array([0.0, 1.5, 0.0]), 0.25)
    old = os.umask(0o022)
    try:
        m.save(tmp_path / "m.npz")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "m.npz").st_mode & 0o777 == 0o644  # readable by a serving process of another user
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(tmp_path / "m.npz"), str(ready)])
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".m.npz.")]
    assert len(left) == 1 and str(proc.pid) in left[0]  # the dead writer's part
    m.save(tmp_path / "m.npz")  # the next save of that file removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz", "ready"]
    assert np.array_equal(load_model(tmp_path / "m.npz").coef_values, [1.5])
