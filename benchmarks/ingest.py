"""Ingest throughput (MB/s per core) of `sparsepipe ingest --workers 1` vs scikit-learn's load_svmlight_file on
the same synthetic webspam-like file, in one run; plus peak worker memory on a file several times larger.

    python benchmarks/ingest.py [--mb 200] [--big-factor 5]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import threading
import time

from benchmarks.common import cache_file, out_dir, report, synth_file


def peak_worker_rss(client, stop: threading.Event, out: list) -> None:
    import psutil

    def rss():
        return psutil.Process().memory_info().rss

    peak = 0
    while not stop.is_set():
        try:
            peak = max([peak, *client.run(rss).values()])
        except Exception:
            pass
        stop.wait(0.1)
    out.append(peak)


def cpu_seconds(client) -> float:
    """user + system CPU seconds used so far by this process (client and scheduler) and every worker."""
    import psutil

    def cpu():
        t = psutil.Process().cpu_times()
        return t.user + t.system

    return cpu() + sum(client.run(cpu).values())


def ingest_runs(path, store, block_mb, repeats=1, sample_memory=False):
    """Ingest ``path`` ``repeats`` times in a fresh one-worker cluster, the one `sparsepipe ingest --workers 1`
    starts (after a tiny ingest that loads the numba caches). Run 1 is a fresh worker (it also pays first-touch allocations); later runs reuse the
    worker. Returns [(summary, wall seconds, CPU seconds)], peak worker RSS (or None)."""
    from pipeline.cluster import dask_client
    from pipeline.ingest import IngestOptions, ingest

    runs = []
    cache_file(path)
    with dask_client(workers=1) as c:  # the cluster `sparsepipe ingest --workers 1` starts
        warm = store.parent / "warm.svm"
        warm.write_text("+1 1:0.5 7:1\n-1 3:2\n")
        shutil.rmtree(str(warm) + ".zarr", ignore_errors=True)
        ingest([str(warm)], str(warm) + ".zarr", IngestOptions(holdout=0), client=c)  # load numba caches
        stop, peak = threading.Event(), []
        th = threading.Thread(target=peak_worker_rss, args=(c, stop, peak)) if sample_memory else None
        if th:
            th.start()
        for _ in range(repeats):
            shutil.rmtree(store, ignore_errors=True)
            cpu0, t0 = cpu_seconds(c), time.perf_counter()
            s = ingest([str(path)], str(store), IngestOptions(block_mb=block_mb), client=c)
            secs = time.perf_counter() - t0
            runs.append((s, secs, cpu_seconds(c) - cpu0))
        if th:
            stop.set()
            th.join()
    return runs, (peak[0] if peak else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=float, default=200, help="size of the comparison file in MB")
    ap.add_argument("--big-factor", type=float, default=5, help="memory run on a file this many times larger")
    ap.add_argument("--block-mb", type=float, default=64)
    ap.add_argument("--repeats", type=int, default=8, help="ingests of the comparison file in one cluster")
    a = ap.parse_args()
    d = out_dir() / "data"
    d.mkdir(exist_ok=True)
    rows = int(a.mb * 1e6 / 70_000)  # ~70 kB of text per 3700-nnz row
    small = synth_file(d / f"webspam_{rows}.svm", rows)
    size = small.stat().st_size
    runs, _ = ingest_runs(small, d / "ingest_small.zarr", a.block_mb, repeats=a.repeats)
    s = runs[0][0]
    fresh_secs, fresh_cpu = runs[0][1], runs[0][2]
    warm_secs = statistics.median(r[1] for r in runs[1:]) if len(runs) > 1 else fresh_secs
    warm_cpu = statistics.median(r[2] for r in runs[1:]) if len(runs) > 1 else fresh_cpu
    from sklearn.datasets import load_svmlight_file

    sk_runs = []
    cache_file(small)
    for _ in range(2):
        t0, c0 = time.perf_counter(), time.process_time()
        X, y = load_svmlight_file(str(small))
        sk_runs.append((time.perf_counter() - t0, time.process_time() - c0))
        del X, y
    sk_secs, sk_cpu = min(sk_runs)
    sk = size / sk_secs / 1e6
    big_rows = int(rows * a.big_factor)
    big = synth_file(d / f"webspam_{big_rows}.svm", big_rows, seed=1)
    big_size = big.stat().st_size
    big_runs, peak = ingest_runs(big, d / "ingest_big.zarr", a.block_mb, repeats=2, sample_memory=True)
    _, peak_small = ingest_runs(small, d / "ingest_small.zarr", a.block_mb, sample_memory=True)
    mbps = lambda secs, n=size: n / secs / 1e6  # noqa: E731
    res = {"file_mb": size / 1e6, "rows": s["n_rows"], "nnz": s["nnz"], "block_mb": a.block_mb,
           "repeats": a.repeats, "seconds_per_run": [r[1] for r in runs], "cpu_seconds_per_run": [r[2] for r in runs],
           "fresh_worker_seconds": fresh_secs, "fresh_worker_mb_per_s_per_core": mbps(fresh_secs),
           "fresh_worker_mb_per_cpu_second": mbps(fresh_cpu),
           "warm_worker_seconds": warm_secs, "warm_worker_mb_per_s_per_core": mbps(warm_secs),
           "warm_worker_mb_per_cpu_second": mbps(warm_cpu),
           "sklearn_seconds": sk_secs, "sklearn_cpu_seconds": sk_cpu, "sklearn_mb_per_s": sk,
           "speedup_vs_sklearn_fresh": mbps(fresh_secs) / sk, "speedup_vs_sklearn_warm": mbps(warm_secs) / sk,
           "big_file_mb": big_size / 1e6, "big_seconds_per_run": [r[1] for r in big_runs],
           "big_fresh_worker_mb_per_s_per_core": mbps(big_runs[0][1], big_size),
           "big_warm_worker_mb_per_s_per_core": mbps(big_runs[1][1], big_size),
           "peak_worker_rss_mb_small": (peak_small or 0) / 1e6, "peak_worker_rss_mb_big": (peak or 0) / 1e6,
           "targets": {"mb_per_s_per_core": 300, "speedup_vs_sklearn": 15, "peak_worker_rss_mb": 1000}}
    table = [{"tool": "sparsepipe ingest --workers 1, fresh worker", "MB/s per core": mbps(fresh_secs),
              "seconds": fresh_secs, "MB per CPU-second": mbps(fresh_cpu), "vs sklearn": mbps(fresh_secs) / sk},
             {"tool": f"sparsepipe ingest --workers 1, warm worker (median of {max(1, len(runs) - 1)})",
              "MB/s per core": mbps(warm_secs), "seconds": warm_secs, "MB per CPU-second": mbps(warm_cpu),
              "vs sklearn": mbps(warm_secs) / sk},
             {"tool": "sklearn load_svmlight_file (best of 2)", "MB/s per core": sk, "seconds": sk_secs,
              "MB per CPU-second": mbps(sk_cpu), "vs sklearn": 1.0},
             {"tool": f"sparsepipe, {big_size / 1e9:.1f} GB file, fresh / warm worker",
              "MB/s per core": f"{mbps(big_runs[0][1], big_size):.1f} / {mbps(big_runs[1][1], big_size):.1f}",
              "seconds": f"{big_runs[0][1]:.2f} / {big_runs[1][1]:.2f}"}]
    report("ingest", res, table)


if __name__ == "__main__":
    main()
