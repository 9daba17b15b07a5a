"""Benchmark the synthetic webspam-like generator; prints JSON with MB/s and the full-size estimate.

steady_mb_per_s excludes the fixed setup (pilot sample), which a full-size run amortises.

    python benchmarks/synth.py --rows 2850 --out /tmp/synth_bench.svm   # ~200 MB at webspam width
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import synth as S  # noqa: E402
from pipeline.synth import WEBSPAM_FEATURES, synth  # noqa: E402

FULL_ROWS, FULL_NNZ = 350_000, 3700


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2850)
    ap.add_argument("--features", type=int, default=WEBSPAM_FEATURES)
    ap.add_argument("--nnz-per-row", type=int, default=FULL_NNZ)
    ap.add_argument("--out", default="synth_bench.svm")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    a = ap.parse_args(argv)
    # warm-up: compile (or load cached) kernels outside the timed run
    warm = f"{a.out}.warmup"
    synth(warm, 10, features=a.features, nnz_per_row=min(a.nnz_per_row, 50), seed=a.seed)
    for suffix in ("", ".truth.npz", ".truth.json"):
        os.remove(warm + suffix)
    cpu0 = time.process_time()
    r = synth(a.out, a.rows, features=a.features, nnz_per_row=a.nnz_per_row, seed=a.seed,
              workers=a.workers)
    cpu = time.process_time() - cpu0
    steady = r["bytes"] / 1e6 / (r["seconds"] - r["setup_seconds"])
    # per-core kernel rate in CPU seconds (robust to other load on a shared machine): 3 chunks
    model = S._Model(a.seed, a.features, a.nnz_per_row)
    rows = S._chunk_rows(a.features, a.nnz_per_row)
    pool, cpu_k, nbytes = S.queue.SimpleQueue(), 0.0, 0
    for k in range(3):
        c0 = time.thread_time()
        buf, n, _, _ = S._make_chunk(model, a.seed, k, rows, pool)
        cpu_k += time.thread_time() - c0
        nbytes += n
        pool.put(buf)
    kernel_rate = nbytes / 1e6 / cpu_k
    full_bytes = r["bytes"] / max(r["nnz"], 1) * FULL_ROWS * FULL_NNZ
    r.update(
        workers=a.workers,
        cpu_seconds=cpu,
        mb_per_cpu_s=r["bytes"] / 1e6 / cpu if cpu > 0 else None,
        steady_mb_per_s=steady,
        kernel_mb_per_cpu_s=kernel_rate,
        mean_nnz_per_row=r["nnz"] / max(r["rows"], 1),
        bytes_per_nnz=r["bytes"] / max(r["nnz"], 1),
        full_rows=FULL_ROWS,
        full_nnz_per_row=FULL_NNZ,
        full_bytes_est=full_bytes,
        full_minutes_est=(full_bytes / 1e6 / steady + r["setup_seconds"]) / 60,
    )
    if not a.keep:
        for suffix in ("", ".truth.npz", ".truth.json"):
            os.remove(a.out + suffix)
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
