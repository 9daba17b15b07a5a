"""Dask client for ingest and training: an embedded LocalCluster on loopback, or an existing scheduler."""
from __future__ import annotations

import contextlib
import logging
import os

import dask


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None, client=None):
    """Yield a ``distributed.Client``.

    ``client`` is used as is (tests share one cluster); ``scheduler`` joins an existing cluster;
    otherwise a LocalCluster of ``workers`` processes with one thread each is started, with scheduler
    and dashboard bound to 127.0.0.1 only, and closed on exit.
    """
    if client is not None:
        yield client
        return
    from distributed import Client, LocalCluster

    if scheduler:
        with Client(scheduler) as c:
            yield c
        return
    n = workers or default_workers()
    env = {**worker_environ(), "DASK_LOGGING__DISTRIBUTED": logging.getLevelName(worker_log_level()).lower()}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": env}), \
            LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address="127.0.0.1:0", silence_logs=worker_log_level()) as cluster, \
            Client(cluster) as c:
        yield c


def worker_environ() -> dict:
    """Dask's environment for new worker processes, less its MALLOC_TRIM_THRESHOLD_: setting that turns
    off glibc's adaptive mmap threshold, so every array above 128 KiB is a fresh mapping that page-faults
    again on every block (a 200 MB ingest: ~0.43 s instead of ~0.47 s warm). glibc's defaults still
    give freed memory back, above a threshold that adapts to the allocations (at most 64 MiB). A value the
    user exported is inherited as usual; so is the one a Dask cluster started earlier in the same process
    wrote into os.environ (Dask's nanny sets it there)."""
    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    return env

def worker_log_level() -> int:
    """Log level of the embedded cluster's processes: CRITICAL, so a task's error reaches the user once, as the
    command's one-line message, not also as a worker's 'Compute Failed' traceback; ERROR with
    ``SPARSEPIPE_DEBUG=1`` (bug reports)."""
    debug = os.environ.get("SPARSEPIPE_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")
    return logging.ERROR if debug else logging.CRITICAL
