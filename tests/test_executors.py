"""Executors: the in-process thread executor (the CLI's default) and a real LocalCluster give bit-identical
models and identical stores; a worker SIGKILLed in the middle of a training stage changes nothing."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.cluster import ThreadClient, dask_client
from pipeline.ingest import IngestOptions, ingest
from pipeline.store.reader import open_store
from pipeline.train import fit
from tests.conftest import data_file, ingest_shared
from tests.conftest import same_model as same_weights

TG = {"eta": 0.3, "gravity": 2e-4, "K": 3, "schedule": "sqrt", "decay": 0.8}
RCV1 = "rcv1_subset/rcv1_vw_small_train.svm"


@pytest.fixture(scope="module")
def store(tmp_path_factory, client):
    return ingest_shared(tmp_path_factory, client, RCV1, "exec", block_mb=0.05, holdout=0.2)


def same_model(a, b):
    """Same weights, bias and holdout metrics, after every stage too (with workers each scores its share of the
    holdout blocks with its own copy of the weights)."""
    def stages(m):
        return [h.get("holdout") for h in m.meta["history"]]

    return (same_weights(a, b) and a.meta["holdout"] == b.meta["holdout"] and stages(a) == stages(b)
            and all(h is not None for h in stages(a)))


def test_default_executor_is_threads_in_this_process():
    with dask_client() as c:
        assert isinstance(c, ThreadClient) and c.threads >= 1
        assert c.submit(sum, [c.submit(lambda: 2), 3]).result() == 5


def same_states(a, b):
    """Every path's training state (what a resume starts from), array by array, bit for bit."""
    return (len(a.states) == len(b.states) and all(
        sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa) for sa, sb in zip(a.states, b.states))
        and a.gstate.keys() == b.gstate.keys() and all(np.array_equal(a.gstate[k], b.gstate[k]) for k in a.gstate))


@pytest.mark.parametrize("algo,opts,paths", [("tg", TG, 2), ("stsgd", {}, 3), ("ftrl", {}, 3)])
def test_threads_and_local_cluster_train_bit_identical_models(store, client, algo, opts, paths):
    """The same model and the same path states (a cluster's shared keys are fetched from one path only,
    ``gather_states``) whatever the executor."""
    ref = fit(store, algo, opts, passes=3, paths=paths, seed=5, client=client)
    with ThreadClient(2) as tc:
        threads = fit(store, algo, opts, passes=3, paths=paths, seed=5, client=tc)
    inproc = fit(store, algo, opts, passes=3, paths=paths, seed=5, client=None)
    assert ref.nnz > 0 and same_model(ref, threads) and same_model(ref, inproc)
    assert same_states(ref, threads) and same_states(ref, inproc)


def _store_content(path: str) -> dict:
    """Every file of the store but the root metadata, and the manifest less its id, times and paths."""
    files = {}
    for p in sorted(Path(path).rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_file() and rel != "zarr.json":
            files[rel] = p.read_bytes()
    man = json.loads((Path(path) / "zarr.json").read_text())["attributes"]["sparsepipe"]
    for k in ("store_id", "updated_at"):
        man.pop(k)
    for s in man["sources"]:
        s.pop("ingested_at")
    return {"files": files, "manifest": man}


def test_threads_and_local_cluster_ingest_identical_stores(tmp_path, client):
    src = str(data_file(RCV1))
    opts = IngestOptions(block_mb=0.05, holdout=0.2, seed=3)
    ingest([src], str(tmp_path / "cluster.zarr"), opts, client=client)
    ingest([src], str(tmp_path / "threads.zarr"), opts)  # no client, no workers: the default thread executor
    a, b = _store_content(str(tmp_path / "cluster.zarr")), _store_content(str(tmp_path / "threads.zarr"))
    assert len(a["manifest"]["blocks"]) > 4 and a == b


def test_thread_executor_reports_a_bad_line_and_commits_nothing(tmp_path):
    from pipeline.ingest import IngestError

    good = "+1 1:0.5 3:1\n" * 2000
    src = tmp_path / "bad.svm"
    src.write_text(good + "-1 2:1 2:3\n" + good)
    with pytest.raises(IngestError, match=r"bad.svm:2001:"):
        ingest([str(src)], str(tmp_path / "s.zarr"), IngestOptions(block_mb=0.01))
    assert not list(tmp_path.glob("s.zarr*"))


def _here_after(seconds: float) -> str:
    from distributed import get_worker

    time.sleep(seconds)
    return get_worker().address


def test_embedded_cluster_keeps_pinned_tasks_on_their_worker():
    """Tasks the engine pins to a busy worker wait for it instead of being stolen by an idle one (Dask's work
    stealing is off in the embedded cluster): a stolen ``weights`` task takes its 133 MB dense vector to the
    thief at webspam width. With stealing on, the idle worker takes most of these tasks."""
    from distributed import Client

    from pipeline.cluster import local_cluster
    from pipeline.engine import DaskExec

    with local_cluster(2, "1GB") as cluster, Client(cluster) as c:
        ex = DaskExec(c)
        first = ex.workers()[0]
        busy = c.submit(_here_after, 3.0, workers=[first], pure=False)
        time.sleep(0.5)  # it runs
        pinned = [ex.submit_pinned(0, _here_after, 0.05) for _ in range(8)]
        assert c.gather(pinned) == [first] * 8
        assert busy.result() == first


def test_worker_sigkilled_during_a_stage_gives_the_same_model(tmp_path):
    """A real SIGKILL of a real worker process of a real LocalCluster while training runs: Dask recomputes
    the lost (pure) tasks and the model equals an uninterrupted run's, bit for bit."""
    src = str(data_file(RCV1))
    st = str(tmp_path / "s.zarr")
    ingest([src], st, IngestOptions(block_mb=0.02, holdout=0.1))
    kw = dict(passes=40, paths=2, seed=11)
    ref = fit(st, "tg", TG, **kw)  # uninterrupted, in this process
    killed = {}
    with dask_client(workers=2) as c:
        pids = c.run(os.getpid)  # worker address -> pid
        victim = sorted(pids)[0]
        running = threading.Event()

        def kill_in_a_stage():
            # wait until the victim holds a stage's task (a path advancing over its blocks), then SIGKILL it
            running.wait()
            while "pid" not in killed:
                if any(str(k).startswith("advance_task") for k in c.processing().get(victim, ())):
                    os.kill(pids[victim], signal.SIGKILL)
                    killed["pid"] = pids[victim]
                time.sleep(0.001)

        def progress(rec):
            if rec["stage"] == 2:
                running.set()

        t = threading.Thread(target=kill_in_a_stage, daemon=True)
        t.start()
        got = fit(st, "tg", TG, client=c, progress=progress, **kw)
        t.join(timeout=1)
        after = c.run(os.getpid)
    assert killed.get("pid") and killed["pid"] not in after.values()  # killed during training, replaced
    assert got.meta["passes"] == 40 and same_model(ref, got)
    assert len(got.meta["history"]) == 40 and open_store(st).n_rows > 0
