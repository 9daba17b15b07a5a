"""Model registry: versions, atomic production pointer, rollback, retention, orphans, format, lock."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pipeline.model import Model
from pipeline.registry import LockedError, RegistryError, open_registry


def _model(seed: int) -> Model:
    rng = np.random.default_rng(seed)
    w = np.where(rng.random(50) < 0.3, rng.standard_normal(50), 0.0)
    return Model.from_dense(w, 0.1 * seed, meta={"algorithm": "tg", "hyper": {"eta": 0.1}})


def _add(reg, seed, decision="promoted"):
    v = reg.next_version()
    reg.add_version(_model(seed), {"version": v, "run": f"r{seed}", "decision": decision, "reason": "test",
                                   "metrics": {"error": 0.1 * seed}, "parent": reg.production_version})
    if decision == "promoted":
        reg.promote(v)
    return v


def test_versions_promote_rollback_and_production(tmp_path):
    reg = open_registry(tmp_path / "reg", create=True)
    assert reg.production() is None and reg.versions() == []
    for s in (1, 2, 3):
        _add(reg, s)
    _add(reg, 4, decision="rejected")
    vs = reg.versions()
    assert [v["version"] for v in vs] == [1, 2, 3, 4]
    assert [v["production"] for v in vs] == [False, False, True, False]
    assert all(os.path.isabs(v["path"]) and os.path.exists(v["path"]) for v in vs)
    m = open_registry(tmp_path / "reg").production()
    np.testing.assert_array_equal(m.coef_values, _model(3).coef_values)
    assert reg.rollback() == {"production": 2, "from": 3}
    assert reg.rollback() == {"production": 1, "from": 2}
    with pytest.raises(RegistryError, match="no previous production"):
        reg.rollback()
    reg.promote(4)
    assert reg.production_version == 4 and reg.previous_production == 1
    events = [r["event"] for r in reg.run_log()]
    assert events.count("rollback") == 2 and events.count("promote") == 4


def test_retention_keeps_production_and_previous_and_cleans_orphans(tmp_path):
    reg = open_registry(tmp_path / "reg", create=True)
    _add(reg, 1)
    _add(reg, 2)
    for s in (3, 4, 5):
        _add(reg, s, decision="rejected")
    gone = reg.retention(keep=2)
    assert gone == [3]
    assert [v["version"] for v in reg.versions()] == [1, 2, 4, 5]  # 2 production, 1 previous, 4-5 newest
    assert sorted(os.listdir(reg.models_dir)) == ["v000001.npz", "v000002.npz", "v000004.npz", "v000005.npz"]
    # an unlisted model file (a kill between model file and index) is removed; numbering stays dense
    open(os.path.join(reg.models_dir, "v000006.npz"), "wb").write(b"partial")
    assert reg.clean_orphans() == ["v000006.npz"]
    assert reg.next_version() == 6


def test_format_and_missing_or_corrupt_production(tmp_path):
    reg = open_registry(tmp_path / "reg", create=True)
    _add(reg, 1)
    path = reg.model_file(1)
    with open(path, "wb") as f:
        f.write(b"not a zip")
    with pytest.raises(RegistryError, match="v000001.npz.*unreadable"):
        reg.production()
    os.unlink(path)
    with pytest.raises(RegistryError, match="v000001.npz.*missing"):
        reg.production()
    meta = json.load(open(reg.meta_path))
    meta["format_version"] = 99
    json.dump(meta, open(reg.meta_path, "w"))
    with pytest.raises(RegistryError, match="registry format 99 is newer"):
        open_registry(tmp_path / "reg")
    with pytest.raises(RegistryError, match="no such registry"):
        open_registry(tmp_path / "nothing")


def test_torn_run_log_line_is_skipped_and_closed(tmp_path):
    reg = open_registry(tmp_path / "reg", create=True)
    reg.log({"event": "a"})
    with open(reg.log_path, "a") as f:
        f.write('{"event": "tor')  # a kill in the middle of an append
    reg.log({"event": "b"})
    assert [r["event"] for r in reg.run_log()] == ["a", "b"]


def test_lock_concurrent_process_and_stale_takeover(tmp_path):
    reg = open_registry(tmp_path / "reg", create=True)
    code = ("import sys, time; from pipeline.registry import open_registry; "
            "l = open_registry(sys.argv[1]).lock('holder'); l.__enter__(); print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "reg")], stdout=subprocess.PIPE, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(LockedError, match=f"pid {p.pid}"):
            with reg.lock("second"):
                pass
    finally:
        p.kill()
        p.wait()
    # the killed holder left its record: the next taker records the takeover
    with reg.lock("third") as lk:
        assert lk.stale["pid"] == p.pid
    rec = [r for r in reg.run_log() if r["event"] == "stale_lock_taken_over"]
    assert rec and rec[0]["holder"]["run"] == "holder" and rec[0]["holder_process"] == "gone"
    with reg.lock("fourth") as lk:  # released cleanly: nothing stale
        assert lk.stale is None
