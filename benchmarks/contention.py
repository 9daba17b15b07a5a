"""How a kernel's speed per path holds up when T paths run at once on one machine (issue 13 §4: weak scaling).

    python -m benchmarks.contention STORE [--threads 1,8,16] [--algo stsgd] [--max-nnz 2e8]

Loads the store's first training blocks (up to --max-nnz non-zeros) into memory once, then for each T runs T
threads at the same time (the kernels release the GIL), each advancing its own full-width path state over those
blocks in block order: the algorithm's kernel through ``Algorithm.advance`` as the engine calls it, and the tight
loop (:func:`benchmarks.throughput.logistic_sgd`, one float64 weight vector per thread). No Dask, no store reads,
no stage ends: what is left is the machine (cores, caches, memory bandwidth) under T random-access sweeps over
T states of the declared width. The kernel's slowdown at T = C (the machine's cores) is what the machine itself
takes from the weak-scaling ratio of `train --workers C` against `--workers 1` there, whatever the engine does.
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time

import numpy as np

from benchmarks.common import report
from benchmarks.throughput import _touched, logistic_sgd


def _run_threads(n: int, work) -> list[float]:
    """Start ``n`` threads running ``work(i)`` together (released by one barrier); each one's seconds."""
    gate, secs = threading.Barrier(n), [0.0] * n

    def one(i):
        gate.wait()
        t0 = time.perf_counter()
        work(i)
        secs[i] = time.perf_counter() - t0

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return secs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--threads", default="1,8,16")
    ap.add_argument("--algo", default="stsgd")
    ap.add_argument("--max-nnz", type=float, default=2e8)
    a = ap.parse_args(argv)
    from pipeline.algorithms import make_algorithm
    from pipeline.store.reader import open_store
    from pipeline.store.stats import calibrate

    st = open_store(a.store)
    blocks, nnz = [], 0
    for b in st.blocks("train"):
        blocks.append((b.indptr, b.indices, b.data, b.y, np.arange(b.y.shape[0], dtype=np.int64)))
        nnz += int(b.indptr[-1])
        if nnz >= a.max_nnz:
            break
    p = st.n_features
    algo = make_algorithm(a.algo, {})
    calibrate(algo, st)
    ip, ix, x, y, r = blocks[0]  # load both kernels' compiled code before anything is timed
    algo.advance(algo.working_state(algo.init_path(p, 0)), ip, ix, x, y, r[:2], 0, 0)
    logistic_sgd(ip, ix, x, y, r[:2], np.zeros(p), np.zeros(1), 0.1, 0)
    rows = []
    for n in (int(t) for t in a.threads.split(",")):
        states = [_touched(algo, algo.init_path(p, i)) for i in range(n)]
        ws = [np.zeros(p) for _ in range(n)]
        for w in ws:
            w[::512] = 0.0  # every page written before timing
        done = np.zeros(n, np.int64)  # non-zeros each thread went through (a stage may end before the blocks do)

        def algo_run(i):
            for ip, ix, x, y, r in blocks:
                used, _ = algo.advance(states[i], ip, ix, x, y, r, 0, 0)
                done[i] += int(ip[used])

        def tight_run(i):
            for ip, ix, x, y, r in blocks:
                logistic_sgd(ip, ix, x, y, r, ws[i], np.zeros(1), 0.1, 0)
                done[i] += int(ip[-1])

        for name, work in ((f"{a.algo} kernel", algo_run), ("tight loop f64", tight_run)):
            done[:] = 0
            secs = np.array(_run_threads(n, work))
            rate = done / secs
            row = {"what": name, "threads": n, "nnz_per_thread": int(done.mean()), "slowest_s": round(secs.max(), 3),
                   "slowest_vs_mean": round(float(secs.max() / secs.mean()), 2),
                   "per_thread_mnnz_per_s": round(float(rate.mean()) / 1e6, 2),
                   "all_threads_mnnz_per_s": round(float(rate.sum()) / 1e6, 1), "load1": round(os.getloadavg()[0], 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del states, ws
    one = {r["what"]: r["per_thread_mnnz_per_s"] for r in rows if r["threads"] == 1}
    for r in rows:
        if r["what"] in one:
            r["slowdown_vs_1_thread"] = round(one[r["what"]] / r["per_thread_mnnz_per_s"], 2)
    report("contention", {"store": a.store, "cores": os.cpu_count(), "rows": rows}, rows,
           ["what", "threads", "per_thread_mnnz_per_s", "all_threads_mnnz_per_s", "slowdown_vs_1_thread", "slowest_s",
            "slowest_vs_mean"])


if __name__ == "__main__":
    main()
