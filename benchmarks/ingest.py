"""Ingest throughput (MB/s per core) of `sparsepipe ingest --workers 1` vs scikit-learn's load_svmlight_file on
the same synthetic webspam-like file, in one run; plus peak worker memory on a file several times larger.

    python benchmarks/ingest.py [--mb 200] [--big-factor 5]
"""
from __future__ import annotations

import argparse
import shutil
import threading
import time

from benchmarks.common import out_dir, report, synth_file


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


def ingest_once(path, store, block_mb, sample_memory=False):
    from distributed import Client, LocalCluster

    from pipeline.ingest import IngestOptions, ingest

    shutil.rmtree(store, ignore_errors=True)
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0",
                      silence_logs=40) as cl, Client(cl) as c:
        warm = store.parent / "warm.svm"
        warm.write_text("+1 1:0.5 7:1\n-1 3:2\n")
        shutil.rmtree(str(warm) + ".zarr", ignore_errors=True)
        ingest([str(warm)], str(warm) + ".zarr", IngestOptions(holdout=0), client=c)  # load numba caches
        stop, peak = threading.Event(), []
        th = threading.Thread(target=peak_worker_rss, args=(c, stop, peak)) if sample_memory else None
        if th:
            th.start()
        cpu0, t0 = cpu_seconds(c), time.perf_counter()
        s = ingest([str(path)], str(store), IngestOptions(block_mb=block_mb), client=c)
        secs = time.perf_counter() - t0
        s["cpu_seconds"] = cpu_seconds(c) - cpu0
        if th:
            stop.set()
            th.join()
    return s, secs, (peak[0] if peak else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=float, default=200, help="size of the comparison file in MB")
    ap.add_argument("--big-factor", type=float, default=5, help="memory run on a file this many times larger")
    ap.add_argument("--block-mb", type=float, default=64)
    a = ap.parse_args()
    d = out_dir() / "data"
    d.mkdir(exist_ok=True)
    rows = int(a.mb * 1e6 / 70_000)  # ~70 kB of text per 3700-nnz row
    small = synth_file(d / f"webspam_{rows}.svm", rows)
    size = small.stat().st_size
    s, secs, _ = ingest_once(small, d / "ingest_small.zarr", a.block_mb)
    ours = size / secs / 1e6
    ours_cpu = size / s["cpu_seconds"] / 1e6
    from sklearn.datasets import load_svmlight_file

    t0, c0 = time.perf_counter(), time.process_time()
    X, y = load_svmlight_file(str(small))
    sk_secs, sk_cpu = time.perf_counter() - t0, time.process_time() - c0
    sk = size / sk_secs / 1e6
    big_rows = int(rows * a.big_factor)
    big = synth_file(d / f"webspam_{big_rows}.svm", big_rows, seed=1)
    sb, big_secs, peak = ingest_once(big, d / "ingest_big.zarr", a.block_mb, sample_memory=True)
    s2, small_secs2, peak_small = ingest_once(small, d / "ingest_small.zarr", a.block_mb, sample_memory=True)
    res = {"file_mb": size / 1e6, "rows": s["n_rows"], "nnz": s["nnz"], "block_mb": a.block_mb,
           "sparsepipe_seconds": secs, "sparsepipe_mb_per_s_per_core": ours,
           "sparsepipe_cpu_seconds": s["cpu_seconds"], "sparsepipe_mb_per_cpu_second": ours_cpu,
           "sklearn_seconds": sk_secs, "sklearn_cpu_seconds": sk_cpu, "sklearn_mb_per_s": sk, "speedup_vs_sklearn": ours / sk,
           "big_file_mb": big.stat().st_size / 1e6, "big_seconds": big_secs,
           "big_mb_per_s_per_core": big.stat().st_size / big_secs / 1e6,
           "peak_worker_rss_mb_small": (peak_small or 0) / 1e6, "peak_worker_rss_mb_big": (peak or 0) / 1e6,
           "targets": {"mb_per_s_per_core": 300, "speedup_vs_sklearn": 15, "peak_worker_rss_mb": 1000}}
    table = [{"tool": "sparsepipe ingest --workers 1", "MB/s per core": ours, "seconds": secs,
              "MB per CPU-second": ours_cpu, "CPU seconds": s["cpu_seconds"]},
             {"tool": "sklearn load_svmlight_file", "MB/s per core": sk, "seconds": sk_secs,
              "MB per CPU-second": size / sk_cpu / 1e6, "CPU seconds": sk_cpu},
             {"tool": "ratio", "MB/s per core": ours / sk, "MB per CPU-second": ours_cpu / (size / sk_cpu / 1e6)}]
    report("ingest", res, table)


if __name__ == "__main__":
    main()
