"""Memory accounting of every algorithm's path state at a given width (issue: bounded memory per path).

    python -m benchmarks.memory [--features 16609143]

For each algorithm (defaults): every array of one path's state and of the global state, its dtype and bytes;
then the per-worker estimate with one path per worker (pipeline.memory.worker_need, the one ``train`` checks
against the workers' memory_limit): the state the task receives plus the task's private copy (tasks are pure:
they advance a copy), plus the global state and a process baseline of 0.3 GB. The block cache is 0 at webspam scale
(see pipeline.engine.cache_budget) and the decoded blocks of one shuffle window (4 x 64 MB blocks) come on
top. Measured per-process peaks of whole runs are in benchmarks/webspam.py's output.
"""
from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import report


def account(name: str, p: int) -> tuple[list[dict], dict]:
    from pipeline.algorithms import make_algorithm
    from pipeline.memory import worker_need

    algo = make_algorithm(name, {})
    rows = []
    state = algo.init_path(p, 0)
    for k, v in state.items():
        rows.append({"algo": name, "where": "path", "array": k, "dtype": str(v.dtype), "shape": str(v.shape),
                     "MB": round(v.nbytes / 1e6, 1)})
    g = algo.init_global(p)
    for k, v in g.items():
        v = np.asarray(v)
        if v.nbytes > 1 << 16:
            rows.append({"algo": name, "where": "global", "array": k, "dtype": str(v.dtype), "shape": str(v.shape),
                         "MB": round(v.nbytes / 1e6, 1)})
    del state, g
    need = worker_need(algo, p, 1)  # the estimate train checks against the workers' memory_limit
    return rows, {"algo": name, "path_state_MB": round(need["path"] / 1e6, 1),
                  "global_MB": round(need["global"] / 1e6, 1),
                  "worker_estimate_MB": round(need["total"] / 1e6, 1)}


def main(argv=None):
    from pipeline.algorithms import ALGORITHMS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", type=int, default=16_609_143)
    ap.add_argument("--algos", default=",".join(a for a in ALGORITHMS if a != "scd"),
                    help="comma-separated (scd keeps an in-memory column copy of the data: not a path state)")
    a = ap.parse_args(argv)
    arrays, totals = [], []
    for name in a.algos.split(","):
        r, t = account(name, a.features)
        arrays += r
        totals.append(t)
        print(t, flush=True)
    report("memory", {"features": a.features, "arrays": arrays, "totals": totals}, totals,
           ["algo", "path_state_MB", "global_MB", "worker_estimate_MB"])


if __name__ == "__main__":
    main()
