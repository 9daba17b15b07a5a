"""Dask's own background CPU in an embedded cluster, with Dask's defaults against ``pipeline.cluster.QUIET``.

    python -m benchmarks.background [--workers 2,16] [--seconds 30] [--store STORE --passes 3]

Idle: starts ``local_cluster(N)`` and counts the CPU-seconds of this process (scheduler, nannies, client) and of
the worker processes over ``--seconds`` with nothing submitted: what a run pays on every core beside its kernels.
With ``--store``: also ``fit`` of stsgd (``--no-refit``, one path per worker) on each cluster, alternating,
its wall and every process's CPU-seconds (the engine's own work included).
"""
from __future__ import annotations

import argparse
import os
import time

from benchmarks.common import report


def _cpu(procs) -> list[float]:
    out = []
    for p in procs:
        try:
            t = p.cpu_times()
            out.append(t.user + t.system)
        except Exception:  # noqa: BLE001  (a process gone: counts nothing)
            out.append(0.0)
    return out


def _measure(workers: int, quiet: bool, seconds: float, store: str | None, passes: int) -> dict:
    import psutil
    from distributed import Client

    from pipeline.cluster import local_cluster
    from pipeline.train import fit

    with local_cluster(workers, "auto", quiet=quiet) as cl, Client(cl) as client:
        me = psutil.Process()
        procs = [me] + [psutil.Process(p) for p in sorted(client.run(os.getpid).values())]
        time.sleep(2.0)
        row = {"workers": workers, "dask config": "QUIET" if quiet else "Dask defaults"}
        if seconds:
            c0 = _cpu(procs)
            time.sleep(seconds)
            c1 = _cpu(procs)
            row["idle: client process, cores"] = round((c1[0] - c0[0]) / seconds, 4)
            row["idle: workers, cores"] = round(sum(c1[1:]) / seconds - sum(c0[1:]) / seconds, 4)
        if store:
            c0, t0 = _cpu(procs), time.perf_counter()
            fit(store, "stsgd", {}, passes=passes, paths=workers, client=client, evaluate=True)
            wall = time.perf_counter() - t0
            c1 = _cpu(procs)
            row["fit wall s"] = round(wall, 2)
            row["fit: client CPU-s"] = round(c1[0] - c0[0], 2)
            row["fit: workers CPU-s"] = round(sum(c1[1:]) - sum(c0[1:]), 2)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,16")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--store", default=None)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args(argv)
    rows = []
    for n in [int(x) for x in a.workers.split(",") if x]:
        for _ in range(a.reps):
            for quiet in (False, True):
                rows.append(_measure(n, quiet, a.seconds, a.store, a.passes))
                print(rows[-1], flush=True)
    report("background", {"seconds": a.seconds, "store": a.store, "passes": a.passes, "rows": rows}, rows)


if __name__ == "__main__":
    main()
