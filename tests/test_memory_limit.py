"""Training that cannot fit in the workers' memory_limit is refused before it starts, with a message naming the
algorithm, the width and a limit that would fit (issue 13 §1); a real LocalCluster with a small limit."""
import os
import re
import signal
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.algorithms import make_algorithm
from pipeline.cluster import local_cluster
from pipeline.ingest import IngestOptions, ingest
from pipeline.memory import PROCESS_BASELINE, WorkerMemoryError, refuse, state_bytes, usable, worker_need
from pipeline.train import fit

WIDE = 3_000_000  # tg: 2 x 48 MB of path state + 0.3 GB process > a 350 MB limit


def _store(tmp_path, name, width):
    rng = np.random.default_rng(0)
    lines = []
    for i in range(200):
        idx = np.unique(np.r_[rng.integers(1, 50, 8), [width] if i == 0 else []]).astype(int)
        lines.append(("+1 " if i % 2 else "-1 ") + " ".join(f"{j}:{rng.uniform(0.1, 1):.3f}" for j in idx))
    src = tmp_path / f"{name}.svm"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / f"{name}.zarr"
    ingest([str(src)], str(out), IngestOptions(holdout=0.2, block_mb=0.002), client=None)
    return str(out)


@pytest.fixture(scope="module")
def small_limit_cluster():
    from distributed import Client

    with local_cluster(1, "350MB") as cluster, Client(cluster) as c:
        yield c


def test_state_estimate_is_the_algorithms_own_arrays():
    """The linear extrapolation equals the bytes init_path/working_state/init_global allocate at the real width."""
    from pipeline.algorithms.base import copy_state

    for name in ("tg", "stsgd", "ftrl"):
        algo = make_algorithm(name, {})
        path, work, glob = state_bytes(algo, 123_457)
        st = algo.init_path(123_457, 0)
        slack = 1 if name == "stsgd" else 0  # stsgd's Ω is packed bits: ⌈p/8⌉ bytes, linear to within a byte
        assert abs(path - sum(v.nbytes for v in st.values())) <= slack
        assert abs(work - sum(v.nbytes for v in algo.working_state(copy_state(st)).values())) <= slack
        assert glob == sum(np.asarray(v).nbytes for v in algo.init_global(123_457).values())
        if name != "stsgd":
            assert work == path  # the task's private copy
    # stsgd keeps Ω as bits and its non-zero weights between stages; a stage works on the 32-byte record + touched
    path, work, _ = state_bytes(make_algorithm("stsgd", {}), 10_000_000)
    assert path < 1.5e6 and 36e7 <= work < 36e7 + 2e6
    need = worker_need(make_algorithm("tg", {}), WIDE, 2)
    assert need["total"] == 4 * need["path"] + need["global"] + 16 * WIDE + PROCESS_BASELINE


def test_too_wide_for_the_limit_is_refused_with_what_would_fit(tmp_path, small_limit_cluster):
    wide = _store(tmp_path, "wide", WIDE)
    with pytest.raises(WorkerMemoryError) as e:
        fit(wide, "tg", {}, passes=1, paths=1, client=small_limit_cluster)
    msg = str(e.value)
    assert "--algo tg" in msg and f"{WIDE:,} features" in msg and "memory_limit is 0.35 GB" in msg
    fits = float(re.search(r"memory_limit >= ([0-9.]+) GB", msg).group(1))
    assert fits * 1e9 > worker_need(make_algorithm("tg", {}), WIDE, 1)["total"]
    # the same cluster trains a narrow store: the check refuses what cannot fit, not everything
    narrow = _store(tmp_path, "narrow", 60)
    m = fit(narrow, "tg", {}, passes=1, paths=1, client=small_limit_cluster)
    assert m.n_features == 60 and np.isfinite(m.meta["holdout"]["error"])


def test_cli_reports_one_line_and_exit_1(tmp_path, small_limit_cluster):
    from cli.main import app

    wide = _store(tmp_path, "wide", WIDE)
    addr = small_limit_cluster.scheduler.address
    r = CliRunner().invoke(app, ["train", wide, "--out", str(tmp_path / "m.npz"), "--algo", "tg",
                                 "--scheduler", addr])
    assert r.exit_code == 1, r.output
    assert "error: --algo tg at 3,000,000 features needs about" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "m.npz").exists()


def test_embedded_workers_that_cannot_fit_are_refused_before_they_start(tmp_path):
    """`train --workers N` knows each worker's memory_limit (the machine's memory / N) before it starts them: with N
    so large that a share is below an idle worker's baseline, training is refused at once with the advice, and no
    cluster of N processes is started (its check would name "the workers'" limit, and the model is not written)."""
    from distributed.system import MEMORY_LIMIT

    from cli.main import app
    from pipeline.cluster import local_memory_limit

    n = int(MEMORY_LIMIT // PROCESS_BASELINE) + 1
    assert local_memory_limit(n) < PROCESS_BASELINE
    store = _store(tmp_path, "narrow", 60)
    r = CliRunner().invoke(app, ["train", store, "--out", str(tmp_path / "m.npz"), "--algo", "stsgd",
                                 "--workers", str(n)])
    assert r.exit_code == 1, r.output
    assert f"with --workers {n} each worker's memory_limit is" in r.output and "use fewer --workers" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "m.npz").exists()


def test_refit_cache_follows_the_workers_memory_limit(small_limit_cluster, tmp_path):
    """The refit's in-memory block cache fits beside a process under the workers' memory_limit: under a 350 MB
    limit it holds nothing in memory (every compacted block is spilled to disk and read back) and the model is
    the same bit for bit. (A refit whose blocks fit in one budget runs on this process's threads instead,
    :func:`pipeline.refit.refit_client`; one budget less than them keeps it on the worker.)"""
    from pipeline.refit import RefitProblem, compacted_bytes, refit
    from pipeline.store.reader import open_store

    store = _store(tmp_path, "refit", 60)
    m = fit(store, "tg", {"gravity": 1e-3}, passes=2, paths=1, evaluate=False)
    S = m.coef_indices
    assert RefitProblem(store, S, l2=1e-4, client=small_limit_cluster).cache_bytes == 0
    assert RefitProblem(store, S, l2=1e-4).cache_bytes > 0  # in process: no limit
    budget = compacted_bytes(open_store(store), np.sort(S)) - 1
    far = refit(m, store, client=small_limit_cluster, l1=0, max_iter=30, cache_bytes=budget)
    near = refit(m, store, l1=0, max_iter=30, cache_bytes=budget)
    held = far.meta["refit"]["cache"]
    assert held["executor"] == "workers" and held["memory_bytes"] == 0 and held["spilled_bytes"] > 0
    np.testing.assert_array_equal(far.coef_values, near.coef_values)
    assert far.bias == near.bias


def _hold(total: int) -> int:
    """On a worker: keep touched memory alive (unmanaged, as a task's working arrays or a cache are) until the
    process's RSS is ``total`` bytes; returns the RSS."""
    import builtins

    import psutil

    more = total - psutil.Process().memory_info().rss
    builtins._sparsepipe_test_hold = np.ones(max(0, more), np.uint8)
    return psutil.Process().memory_info().rss


def _wait_status(client, status: str, seconds: float = 15.0) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = [w["status"] for w in client.scheduler_info()["workers"].values()]
        if got and all(g == status for g in got):
            return status
        time.sleep(0.2)
    return ",".join(got)


def test_embedded_workers_keep_running_above_the_pause_threshold():
    """A Dask worker past 80% of its memory_limit pauses until its memory falls, which a sparsepipe worker's own
    memory does not: the embedded cluster turns the pause off, so a worker at 87% of its limit still runs tasks
    (with Dask's default it runs none: the next test). Its workers also run without Dask's profiler and with
    the other background timers thinned out (``QUIET``), a restarted worker too; this process's config is
    Dask's again afterwards."""
    import dask
    from distributed import Client

    from pipeline.cluster import QUIET, dask_client

    def pause():
        keys = ["distributed.worker.memory.pause", *QUIET]
        got = c.run(lambda: [dask.config.get(k) for k in keys]).values()
        return [False] if all(g == [False, *QUIET.values()] for g in got) else list(got)

    here = dask.config.get("distributed.worker.memory.pause")
    dask_defaults = {"distributed.worker.profile.enabled": True, "distributed.worker.memory.monitor-interval": "100ms",
                     "distributed.admin.tick.interval": "20ms", "distributed.admin.system-monitor.interval": "500ms"}
    assert set(dask_defaults) == set(QUIET)
    with dask.config.set(dask_defaults):  # (the session's cluster may have set QUIET in this process)
        with dask_client(workers=1) as c:
            assert pause() == [False]
            assert {k: dask.config.get(k) for k in QUIET} == QUIET  # this process's scheduler and nannies
            ((old, pid),) = c.run(os.getpid).items()
            os.kill(pid, signal.SIGKILL)  # the worker its nanny starts again keeps the setting
            for _ in range(150):
                if (now := set(c.scheduler_info()["workers"])) and old not in now:
                    break
                time.sleep(0.2)
            assert list(c.run(os.getpid).values()) != [pid] and pause() == [False]
        assert {k: dask.config.get(k) for k in QUIET} == dask_defaults  # Dask's again after the cluster
    assert here is not False and dask.config.get("distributed.worker.memory.pause") == here  # ours is untouched
    with local_cluster(1, "1GB") as cluster, Client(cluster) as c:
        assert c.submit(_hold, 870_000_000, pure=False).result() > 800_000_000
        assert _wait_status(c, "paused", 3.0) == "running"
        assert c.submit(sum, [1, 2]).result(timeout=30) == 3


def test_a_paused_worker_of_a_users_cluster_is_reported(capsys):
    """On a cluster we did not start (``--scheduler``), Dask's pause stays; a worker paused for ``after`` seconds
    is named on stderr with its memory, its limit and the settings that would let the run go on, once."""
    from distributed import Client, LocalCluster

    from pipeline.cluster import pause_watch

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=50, memory_limit="1GB") as cluster, \
            Client(cluster) as c:
        assert c.submit(_hold, 870_000_000, pure=False).result() > 800_000_000
        assert _wait_status(c, "paused") == "paused"
        (addr,) = c.scheduler_info()["workers"]
        with pause_watch(c, after=1.0, every=0.2):
            time.sleep(2.5)
        err = capsys.readouterr().err
        assert err.count("warning: Dask worker") == 1 and addr in err
        assert "of its 1.00 GB memory_limit" in err and "distributed.worker.memory.pause: false" in err


def test_the_check_leaves_the_nannys_restart_margin():
    """A worker's nanny restarts it past 95% of its memory_limit (Dask's terminate fraction), so a need between 95%
    and 100% of the limit is refused up front, naming both figures, instead of dying mid-run."""
    import dask

    algo = make_algorithm("tg", {})
    need = worker_need(algo, WIDE, 1)["total"]
    assert dask.config.get("distributed.worker.memory.terminate") == 0.95
    assert usable(1_000_000_000) == 950_000_000
    assert refuse(algo, WIDE, 1, 1, int(need / 0.93), "the workers'")["total"] == need
    with pytest.raises(WorkerMemoryError) as e:
        refuse(algo, WIDE, 1, 1, int(need / 0.97), "the workers'")
    assert f"memory_limit is {int(need / 0.97) / 1e9:.2f} GB (restarted past" in str(e.value)
    with dask.config.set({"distributed.worker.memory.terminate": False}):
        assert usable(1_000_000_000) == 1_000_000_000


def test_a_users_cluster_that_steals_work_gets_a_note(tmp_path, capsys):
    """On a cluster whose scheduler steals work (Dask's default; a ``--scheduler`` cluster keeps its own), training
    a store whose dense weights are 32 MB or more says once, on stderr, that stealing can put several copies of them
    on one worker and which setting turns it off; on a narrower store it says nothing, and neither does the
    embedded cluster (it does not steal)."""
    import dask
    from distributed import LocalCluster

    from pipeline.cluster import dask_client

    wide, narrow = _store(tmp_path, "wide", 4_300_000), _store(tmp_path, "narrow", 1000)
    with dask.config.set({"distributed.scheduler.work-stealing": True}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=None) as cluster, dask_client(scheduler=cluster.scheduler_address) as c:
        fit(wide, "tg", passes=1, paths=2, client=c)
        err = capsys.readouterr().err
        assert err.count("steals work") == 1
        assert "34 MB each at 4,300,000 features" in err and "work-stealing" in err and "false" in err
        fit(narrow, "tg", passes=1, paths=2, client=c)
        assert "steals work" not in capsys.readouterr().err
    with dask_client(workers=2) as c:
        fit(wide, "tg", passes=1, paths=2, client=c)
        assert "steals work" not in capsys.readouterr().err
