"""Memory accounting of every algorithm's path state at a given width (issue: bounded memory per path), and the
measured per-process memory of a real training run.

    python -m benchmarks.memory [--features 16609143]
    python -m benchmarks.memory --train STORE [--algo stsgd] [--workers 2] [--passes 3] [--every 0.2] [--cache]
    python -m benchmarks.memory --covering DIR --algo two-stage --passes 2   # the worst case: every weight non-zero

``--train`` runs ``sparsepipe train STORE --algo ALGO --workers N --passes P`` as its own process and samples RSS,
PSS and USS of that process (the client, which also hosts the Dask scheduler) and of every worker process every
``--every`` seconds (psutil); it reports each process's peak and, per stage (the JSON lines ``--json`` writes to
stderr, time stamped as they appear), each process's peak RSS, with the model's non-zeros and holdout error; every
sample goes to bench-out/memory_train<tag>.timeline.json. Without ``--cache`` the
block cache is off (``pipeline.engine.cache_budget`` patched to 0 in the command's process, whose ``DataRef`` the
workers use), as it is at webspam scale: a 35k-row store at full width would otherwise fit the 1 GiB cache and its
blocks would add up to 1 GB to each worker.

For each algorithm (defaults): every array of one path's state (``path``: what it keeps between stages, fresh;
``path, all non-zero``: the same state at its largest, :meth:`Algorithm.full_state`, where a compact state grows with
the features a path has seen, as two-stage's and l1proj's do), of the working state a stage's task advances when it
differs from a private copy (``work``: STSGD, l1proj and two-stage expand their compact states) and of the global
state, its dtype and bytes; then the per-worker estimate with one path per worker (pipeline.memory.worker_need, the
one ``train`` checks against the workers' memory_limit): the state the task receives at its largest
(``path_state_MB``; ``path_fresh_MB`` the fresh one) plus what the task's working copy adds (tasks are pure: they
advance a copy; read-only arrays are shared), the task's scratch (``scratch_MB``: two-stage's projection), the global
state, the stage-end merge and a process baseline of 0.3 GB. The block cache is 0 at webspam scale
(see pipeline.engine.cache_budget) and the decoded blocks of one shuffle window (4 x 64 MB blocks) come on
top. Measured per-process peaks of whole runs are in benchmarks/webspam.py's output.

``--covering DIR`` trains (as ``--train``) on a store whose rows cover every feature: :func:`covering_store` writes
(once) DIR/covering.svm, 3,000 rows of ~28,000 uniformly drawn columns of the full width (84M non-zeros, 1.6 GB
of text; 1 − e^(−4.6) = 99% of the columns in the training rows) and ingests it. webspam-like rows reach few columns
(Zipf: 10M of 16.6M in 35k rows), so a compact state (two-stage, l1proj) stays far below its largest there; here it
reaches it (two-stage: 96.5% of the weights non-zero after 2 passes).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import out_dir, report


def account(name: str, p: int) -> tuple[list[dict], dict]:
    from pipeline.algorithms import make_algorithm
    from pipeline.memory import worker_need

    from pipeline.algorithms.base import copy_state

    algo = make_algorithm(name, {})
    rows = []
    state = algo.init_path(p, 0)
    full = algo.full_state(p)  # the largest state kept between stages (a compact one, every feature non-zero)
    work = algo.working_state(copy_state(full))
    for where, st in (("path", state), ("path, all non-zero", full), ("work", work)):
        if where == "work" and st.keys() == full.keys():
            continue  # the task's private copy of the path state
        if where == "path, all non-zero" and full.keys() == state.keys() and \
                all(v.nbytes == state[k].nbytes for k, v in full.items()):
            continue  # does not grow
        for k, v in st.items():
            if where == "work" and any(np.may_share_memory(v, u) for u in full.values()):
                continue  # the path state's own array (read-only, shared: pipeline.algorithms.base.frozen)
            rows.append({"algo": name, "where": where, "array": k, "dtype": str(v.dtype), "shape": str(v.shape),
                         "MB": round(v.nbytes / 1e6, 1)})
    g = algo.init_global(p)
    for k, v in g.items():
        v = np.asarray(v)
        if v.nbytes > 1 << 16:
            rows.append({"algo": name, "where": "global", "array": k, "dtype": str(v.dtype), "shape": str(v.shape),
                         "MB": round(v.nbytes / 1e6, 1)})
    del state, full, work, g
    need = worker_need(algo, p, 1)  # the estimate train checks against the workers' memory_limit
    return rows, {"algo": name, "path_fresh_MB": round(need["path_fresh"] / 1e6, 1),
                  "path_state_MB": round(need["path"] / 1e6, 1),
                  "working_MB": round(need["work"] / 1e6, 1), "scratch_MB": round(need["scratch"] / 1e6, 1),
                  "exchange_MB": round(need["exchange"] / 1e6, 1),
                  "global_MB": round(need["global"] / 1e6, 1),
                  "worker_estimate_MB": round(need["total"] / 1e6, 1)}


NO_CACHE = "import pipeline.engine as E; E.cache_budget = lambda *a: 0; from cli.main import app; app()"
WITH_CACHE = "from cli.main import app; app()"


class ProcessSampler:
    """RSS, PSS and USS of a process and its descendants every ``every`` seconds, per process (psutil).

    ``role(proc)`` names a process (None: not sampled); ``marks`` are (time, label) events added from outside."""

    def __init__(self, pid: int, role, every: float = 0.2):
        import psutil

        self.root = psutil.Process(pid)
        self.role, self.every = role, every
        self.t0 = time.perf_counter()
        self.samples: dict[int, list] = {}  # pid -> [(t, rss, pss, uss)]
        self.totals: list[tuple] = []  # per sweep over the tree: (t, sum of rss, sum of pss, sum of uss)
        self.names: dict[int, str] = {}
        self.marks: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _run(self):
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except psutil.Error:
                break
            total = np.zeros(3)
            for p in procs:
                try:
                    if p.pid not in self.names:
                        name = self.role(p)
                        if name is None:
                            continue
                        self.names[p.pid] = name
                    mi = p.memory_full_info()
                except psutil.Error:
                    continue
                self.samples.setdefault(p.pid, []).append((self.now(), mi.rss, getattr(mi, "pss", 0), mi.uss))
                total += (mi.rss, getattr(mi, "pss", 0), mi.uss)
            self.totals.append((self.now(), *total))
            self._stop.wait(self.every)

    def stop(self):
        self._stop.set()
        self._t.join()

    def peaks(self) -> list[dict]:
        """Per process: peak RSS / PSS / USS (GB) and when (seconds from the start)."""
        out = []
        for pid, rows in self.samples.items():
            a = np.array(rows)
            i = int(np.argmax(a[:, 1]))
            out.append({"process": self.names[pid], "pid": pid, "samples": len(rows),
                        "peak_rss_gb": round(a[:, 1].max() / 1e9, 3), "peak_pss_gb": round(a[:, 2].max() / 1e9, 3),
                        "peak_uss_gb": round(a[:, 3].max() / 1e9, 3), "at_s": round(float(a[i, 0]), 1)})
        return out

    def windows(self) -> list[dict]:
        """Per window between consecutive marks (and the tail after the last): each process's peak RSS (GB)."""
        edges = [0.0] + [t for t, _ in self.marks] + [float("inf")]
        labels = [lab for _, lab in self.marks] + ["after the last stage (gather, save)"]
        out = []
        for lo, hi, lab in zip(edges[:-1], edges[1:], labels):
            row = {"until": lab}
            for pid, rows in self.samples.items():
                r = [x[1] for x in rows if lo <= x[0] < hi]
                row[self.names[pid]] = round(max(r) / 1e9, 3) if r else None
            out.append(row)
        return out


def process_role(root_pid: int, workers: dict):
    """A ``role(proc)`` for :class:`ProcessSampler` over a `sparsepipe` command's tree: "client" (the command's
    own process, ``root_pid``), "worker0", "worker1", ... (Dask worker processes, recorded in ``workers``), None
    (multiprocessing's resource tracker: not sampled)."""

    def role(p):
        if p.pid == root_pid:
            return "client"
        cmd = " ".join(p.cmdline())
        if "spawn_main" in cmd:  # a Dask worker process (the nannies live in the client process)
            workers[p.pid] = f"worker{len(workers)}"
            return workers[p.pid]
        return None  # multiprocessing's resource tracker

    return role


def sample_train(store: str, algo: str, workers: int, passes: int, every: float, cache: bool,
                 extra: list[str], keep: str | None = None) -> dict:
    """Run ``sparsepipe train`` on ``store`` and sample its processes (see the module docstring); the model is
    written to ``keep`` when given."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        model = Path(keep) if keep else Path(d) / "model.npz"
        cmd = [sys.executable, "-c", WITH_CACHE if cache else NO_CACHE, "train", store, "--algo", algo,
               "--workers", str(workers), "--passes", str(passes), "--out", str(model), "--json", *extra]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        smp = ProcessSampler(p.pid, process_role(p.pid, {}), every)
        err = []

        def read_stderr():  # with --json and a pipe, one JSON line per stage on stderr, after its evaluation
            for ln in p.stderr:
                err.append(ln)
                if ln.startswith("{") and '"event": "pass"' in ln.replace('":"', '": "'):
                    rec = json.loads(ln)
                    smp.marks.append((smp.now(), f"stage {rec.get('stage')} (pass {rec.get('pass')}) evaluated"))

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        out = p.stdout.read()
        p.wait()
        reader.join()
        smp.stop()
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"train failed ({p.returncode}): {''.join(err)[-3000:]}")
        res = json.loads(out[out.index("{"):])
    peaks = smp.peaks()
    wpk = [r for r in peaks if r["process"].startswith("worker")]
    return {"store": store, "algo": algo, "workers": workers, "passes": passes, "every_s": every,
            "block_cache": "on" if cache else "off", "wall_s": round(wall, 1),
            "worker_peak_rss_gb": max((r["peak_rss_gb"] for r in wpk), default=None),
            "worker_peak_pss_gb": max((r["peak_pss_gb"] for r in wpk), default=None),
            "worker_peak_uss_gb": max((r["peak_uss_gb"] for r in wpk), default=None),
            "nnz": res.get("nnz"), "holdout": res.get("holdout"), "processes": peaks, "stages": smp.windows(),
            "timeline": {"marks": smp.marks, "rss_gb": {smp.names[pid]: [(round(t, 2), round(r / 1e9, 3))
                                                                         for t, r, _, _ in rows]
                                                        for pid, rows in smp.samples.items()}}}


def covering_store(d: str, rows: int = 3000, nnz_per_row: int = 28_000, features: int = 16_609_143,
                   seed: int = 5) -> str:
    """(Once) DIR/covering.svm, rows of ``nnz_per_row`` uniform random columns (value 1/√nnz; label the sign of a
    1%-dense random w's score plus noise), ingested to DIR/covering.zarr; returns the store."""
    os.makedirs(d, exist_ok=True)
    src, store = os.path.join(d, "covering.svm"), os.path.join(d, "covering.zarr")
    if not os.path.exists(src):
        rng = np.random.default_rng(seed)
        w = rng.standard_normal(features) * (rng.random(features) < 0.01)
        with open(src + ".tmp", "w") as f:
            for _ in range(rows):
                idx = np.unique(rng.integers(0, features, nnz_per_row))
                v = f"{1.0 / np.sqrt(idx.size):.6g}"
                y = 1 if w[idx].sum() / np.sqrt(idx.size) + 0.1 * rng.standard_normal() > 0 else -1
                f.write(f"{y:+d} " + f":{v} ".join(map(str, (idx + 1).tolist())) + f":{v}\n")
        os.replace(src + ".tmp", src)
    if not os.path.exists(store):
        subprocess.run([str(Path(sys.executable).with_name("sparsepipe")), "ingest", src, "--out", store,
                        "--workers", "2"], check=True, capture_output=True)
    return store


def main(argv=None):
    from pipeline.algorithms import ALGORITHMS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", type=int, default=16_609_143)
    ap.add_argument("--train", metavar="STORE", help="sample the processes of a real `sparsepipe train` on STORE")
    ap.add_argument("--covering", metavar="DIR", help="as --train, on covering_store(DIR): every feature in the rows")
    ap.add_argument("--algo", default="stsgd")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--every", type=float, default=0.2, help="sampling interval, seconds")
    ap.add_argument("--cache", action="store_true", help="leave the block cache as train sets it (default: off)")
    ap.add_argument("--model", help="keep the trained model in this file (to compare models before/after)")
    ap.add_argument("--tag", default="", help="suffix of the report name (bench-out/memory_train<tag>.json)")
    ap.add_argument("--algos", default=",".join(a for a in ALGORITHMS if a != "scd"),
                    help="comma-separated (scd keeps an in-memory column copy of the data: not a path state)")
    a, extra = ap.parse_known_args(argv)
    if a.covering:
        a.train = covering_store(a.covering)
    if a.train:
        r = sample_train(a.train, a.algo, a.workers, a.passes, a.every, a.cache, extra, a.model)
        (out_dir() / f"memory_train{a.tag}.timeline.json").write_text(json.dumps(r.pop("timeline")))
        report("memory_train" + a.tag, r, r["processes"], ["process", "pid", "samples", "peak_rss_gb",
                                                           "peak_pss_gb", "peak_uss_gb", "at_s"])
        for row in r["stages"]:
            print(row)
        return
    if extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    arrays, totals = [], []
    for name in a.algos.split(","):
        r, t = account(name, a.features)
        arrays += r
        totals.append(t)
        print(t, flush=True)
    report("memory", {"features": a.features, "arrays": arrays, "totals": totals}, totals,
           ["algo", "path_fresh_MB", "path_state_MB", "working_MB", "scratch_MB", "global_MB", "exchange_MB",
            "worker_estimate_MB"])


if __name__ == "__main__":
    main()
