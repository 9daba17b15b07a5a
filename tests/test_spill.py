"""The refit's bounded block cache (pipeline.spill): what does not fit the memory budget is spilled to local disk
and read back, the model is the same bit for bit, nothing is left on disk afterwards, and a killed process's
spill directory is purged by the next one (real SIGKILL)."""
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from pipeline import spill
from pipeline.ingest import IngestOptions, ingest
from pipeline.refit import refit
from pipeline.synth import synth
from pipeline.train import fit

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 40_000  # bytes: about half of each worker's compacted share (~18 KB per block)


@pytest.fixture(scope="module")
def model_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("spill")
    svm = d / "s.svm"
    synth(str(svm), 2000, features=20000, nnz_per_row=100, seed=2)
    store = str(d / "s.zarr")
    ingest([str(svm)], store, IngestOptions(block_mb=0.3, holdout=0.2))
    return fit(store, "ftrl", {"l1": 3.0}, passes=2, paths=1, evaluate=False), store


def spill_files(base) -> list:
    return sorted(str(p) for p in Path(base).glob(spill.PREFIX + "*/*"))


def test_spill_cache_keeps_what_fits_spills_the_rest_and_drops_what_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    c = spill.SpillCache()
    blocks = {k: (np.arange(100, dtype=np.int64) + k, np.full(50, k, np.float32)) for k in range(10)}  # 1 KB each
    built = []

    def get(k):
        return c.get(("s", k), lambda: built.append(k) or blocks[k], 2500)

    for sweep in range(3):
        for k in range(6):
            a, b = get(k)
            np.testing.assert_array_equal(a, blocks[k][0])
            np.testing.assert_array_equal(b, blocks[k][1])
    assert built == list(range(6))  # each built once: 2 in memory, 4 read back from their spill files
    assert not get(5)[0].flags.writeable and get(0)[0].flags.writeable  # spilled: mapped read-only, not copied
    assert c.memory.nbytes == 2 * 1000 and len(spill_files(tmp_path)) == 4
    c.drop(lambda key: key[1] < 4)  # entries 0-3 no longer wanted: out of memory and off the disk
    get(9)
    assert len(spill_files(tmp_path)) == 2 and ("s", 9) in c.memory.items
    c.drop()
    assert spill_files(tmp_path) == [] and c.memory.nbytes == 0


def test_refit_that_spills_gives_the_same_model_and_leaves_no_files(model_store, client, tmp_path, monkeypatch):
    """On a real 2-process cluster and in process: a refit whose cache holds a few blocks (the rest spilled)
    equals, bit for bit, the refit that holds them all; its meta says what was spilled, and afterwards no spill
    file is left on the workers or here."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    m, store = model_store
    kw = dict(l1=0, max_iter=40)
    full = refit(m, store, client=client, **kw)
    assert full.meta["refit"]["cache"]["spilled_bytes"] == 0
    for c in (client, None):
        small = refit(m, store, client=c, cache_bytes=BUDGET, **kw)
        np.testing.assert_array_equal(small.coef_indices, full.coef_indices)
        np.testing.assert_array_equal(small.coef_values, full.coef_values)
        assert small.bias == full.bias
        held = small.meta["refit"]["cache"]
        assert held["spilled_bytes"] > 0 and 0 < held["memory_bytes"] <= held["budget_bytes"] == BUDGET
    left = client.run(lambda dask_worker: spill_files(dask_worker.local_directory))
    assert all(v == [] for v in left.values()) and spill_files(tmp_path) == []


def test_the_spill_directory_of_a_killed_process_is_purged_by_the_next(tmp_path, monkeypatch):
    code = ("import sys, time, numpy as np; from pipeline.spill import SpillCache\n"
            "c = SpillCache(); c.get('k', lambda: (np.ones(1000),), 0)\n"
            "print(c.dir, flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)})
    d = Path(p.stdout.readline().strip())
    assert d.parent == tmp_path and list(d.glob("*.npy"))
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert d.is_dir()  # a killed process cannot clean up
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = spill._new_dir()
    assert not d.exists() and mine.is_dir() and mine.parent == tmp_path
