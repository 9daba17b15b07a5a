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
