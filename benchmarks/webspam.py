"""End to end at webspam scale, side by side with Vowpal Wabbit, whole commands (issue: webspam scale for real).

    python -m benchmarks.webspam [--rows 350000] [--workers 2] [--passes 3] [--algos tg,stsgd,ftrl]
                                 [--extra "stsgd:--refit"] [--refit "stsgd:--l1 0"] [--vw-l1 1e-6] [--work DIR]
                                 [--keep] [--no-verify]

Steps, each a whole `sparsepipe` command in its own process (what a user waits for): synth (16,609,143
features, ~3,700 non-zeros per row, the true weights saved beside the file) -> ingest -> verify -> train
each algorithm with its defaults -> evaluate on the holdout blocks (-> `sparsepipe refit` of a trained model with
--refit ALGO:OPTIONS, each its own whole command). Vowpal Wabbit (logistic, --l1, -b 24:
16.7M slots, so VW's numeric feature names map to their own slot and never collide) trains on exactly the
training blocks' rows (their byte ranges of the same file, streamed through a FIFO): one text pass that
writes its cache, then the cache passes; it predicts the same holdout rows. Reported per step: wall
seconds, the peak RSS and USS of the largest process (sampled every second over the command's process
tree), the free and page-cached memory it started from, holdout error, AUC, density, the share of the true
support kept, and the truth's own holdout error (the floor). Everything written goes under --work and is deleted
at the end unless --keep: the directory itself when the run made it, else only what the run added (a file
synthesized earlier, with its truth, is reused and kept).
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import algo_spec, algo_specs, memory_state, out_dir, report, spec_name
from benchmarks.diagnose import load_truth, support_scores
from benchmarks.memory import ProcessSampler, process_role


class PeakMemory(ProcessSampler):
    """The largest RSS and USS of one process among a process and its descendants, the largest USS of the client
    (the command's own process) and of any Dask worker, and the largest sum of their PSS (the whole tree at once),
    sampled every ``every`` seconds."""

    def __init__(self, pid: int, every: float = 1.0):
        super().__init__(pid, role=process_role(pid, {}), every=every)

    def stop(self) -> dict:
        super().stop()
        rows = [r for per_pid in self.samples.values() for r in per_pid]

        def uss(prefix):
            return round(max((r[3] for pid, rs in self.samples.items() if self.names[pid].startswith(prefix)
                              for r in rs), default=0) / 2**30, 2)

        return {"peak_rss_gb": round(max((r[1] for r in rows), default=0) / 2**30, 2),
                "peak_uss_gb": round(max((r[3] for r in rows), default=0) / 2**30, 2),
                "peak_client_uss_gb": uss("client"), "peak_worker_uss_gb": uss("worker"),
                "peak_total_pss_gb": round(max((r[2] for r in self.totals), default=0) / 2**30, 2),
                "processes": len(self.samples)}


class Steps(list):
    """The steps' figures; each is printed as a JSON line when added, so a run cut off still shows what it did."""

    def append(self, row: dict):
        super().append(row)
        print(json.dumps(row), flush=True)


def command(args: list[str], json_out: bool = True, events: bool = False) -> tuple[dict, dict]:
    """Run `sparsepipe ARGS` as its own process; returns (its --json output, wall/memory figures); with
    ``events`` the figures hold the JSON lines the command wrote on stderr (train: one per pass) as "events"."""
    exe = str(Path(sys.executable).with_name("sparsepipe"))
    state = memory_state()
    t0 = time.perf_counter()
    p = subprocess.Popen([exe, *args, *(["--json"] if json_out else [])], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    mem = PeakMemory(p.pid)
    out, err = p.communicate()
    fig = {"wall_s": round(time.perf_counter() - t0, 1), **mem.stop(), "before": state}
    if p.returncode != 0:
        raise RuntimeError(f"sparsepipe {' '.join(args)} failed ({p.returncode}): {err[-3000:]}")
    warn = [ln for ln in err.splitlines() if "Warning" in ln or "warning" in ln]
    if warn:
        fig["warnings"] = warn[:5]
    if events:
        fig["events"] = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    return (json.loads(out[out.index("{"):]) if json_out else {}), fig


def owned_range(mm, start: int, end: int) -> tuple[int, int]:
    """Byte span of the lines that START in [start, end) (the ingest's rule for a block's range)."""
    s = start if start == 0 or mm[start - 1:start] == b"\n" else mm.find(b"\n", start) + 1
    e = mm.find(b"\n", end - 1) + 1 if end < len(mm) else len(mm)
    return s, (e if e > 0 else len(mm))


_LABEL = re.compile(rb"(?m)^(\S+)")


def vw_lines(path: Path, entries: list[dict], fifo: str) -> int:
    """Write the rows of ``entries`` (blocks of one source file) to ``fifo`` in VW's text format."""
    rows = 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm, open(fifo, "wb") as out:
        for e in entries:
            s, t = owned_range(mm, *e["byte_range"])
            chunk = mm[s:t]
            rows += chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)
            out.write(_LABEL.sub(rb"\1 |", chunk) + (b"" if chunk.endswith(b"\n") else b"\n"))
    return rows


def vw_run(opts: str, feed: tuple | None = None) -> float:
    """One vowpalwabbit.Workspace run; ``feed = (path, entries)``: those blocks' rows reach VW through a FIFO
    written by a child process (VW's constructor holds the GIL while it opens its input).

    ``--cache_file`` alone names the cache: with ``-c`` as well VW adds the default cache ``<data>.cache``, which
    without ``-d`` is ``.cache`` in the working directory, written as a copy on a first run and read as a second
    input on the next (a 3-pass run then trained on every row twice a pass; measured on 2,000 rows: 12,000
    examples instead of 6,000). So ``-c`` is refused here."""
    import vowpalwabbit

    if re.search(r"(^|\s)-c(\s|$)", opts) and "--cache_file" in opts:
        raise ValueError("vw: give --cache_file without -c (VW would add ./.cache as a second cache)")

    with tempfile.TemporaryDirectory() as d:
        fifo = os.path.join(d, "in.vw")
        t0 = time.perf_counter()
        writer = None
        if feed is not None:
            os.mkfifo(fifo)
            spec = os.path.join(d, "feed.json")
            Path(spec).write_text(json.dumps({"path": str(feed[0]), "entries": feed[1], "fifo": fifo}))
            writer = subprocess.Popen([sys.executable, "-m", "benchmarks.webspam", "--feed", spec],
                                      cwd=Path(__file__).resolve().parents[1])
            opts = f"-d {fifo} " + opts
        ws = vowpalwabbit.Workspace("--quiet " + opts)
        ws.finish()
        if writer is not None and writer.wait() != 0:
            raise RuntimeError("the VW input writer failed")
        return time.perf_counter() - t0


def vw(store, src: Path, work: Path, passes: int, l1: float, truth_idx) -> dict:
    """VW on the store's training rows: text pass (writes the cache), cache passes, holdout predictions."""
    train = store.entries("train")
    hold = store.entries("holdout")
    cache, model, readable, preds = (work / f"vw.{x}" for x in ("cache", "model", "txt", "preds"))
    base = f"--loss_function logistic -b 24 --holdout_off --l1 {l1:g}"
    text_s = vw_run(f"--cache_file {cache} --passes 1 {base} --noop", (src, train))
    t0, c0 = time.perf_counter(), time.process_time()
    vw_run(f"--cache_file {cache} --passes {passes} {base} -f {model} --readable_model {readable}")
    cache_s, cache_cpu = time.perf_counter() - t0, time.process_time() - c0
    vw_run(f"-t -i {model} -p {preds}", (src, hold))
    f = np.loadtxt(preds, usecols=0, ndmin=1)
    y = np.concatenate([b.y for b in store.blocks("holdout")])
    from pipeline.evaluate import auc

    # readable model: "slot:weight" lines after the header; numeric names hash to their own value, so with
    # 2^24 >= 16.6M slots feature j (0-based column) sits in slot j + 1 (the file is 1-based)
    w = np.zeros(store.n_features + 2)
    with open(readable) as fh:
        for line in fh:
            m = re.match(r"^(\d+):(\S+)", line)
            if m and int(m.group(1)) <= store.n_features:
                w[int(m.group(1))] = float(m.group(2))
    wj = w[1:store.n_features + 1]
    nnz_data = int(sum(e["nnz"] for e in train))
    for p in (cache, model, readable, preds):
        p.unlink(missing_ok=True)
    return {"model": f"vw --l1 {l1:g}", "error": float(np.mean(y * f <= 0)), "auc": auc(f, y),
            "density": float(np.count_nonzero(wj)) / store.n_features, **support_scores(wj, truth_idx),
            "text_pass_s": round(text_s, 1), "cache_passes_s": round(cache_s, 1),
            "cache_s_per_pass_per_bnnz": round(cache_s / passes / (nnz_data / 1e9), 2),
            "vw_cpu_s": round(cache_cpu, 1)}


def truth_floor(store_path: str, truth: str) -> dict:
    from pipeline.evaluate import evaluate_store
    from pipeline.model import Model
    from pipeline.store.reader import open_store

    z = np.load(truth, allow_pickle=False)
    st = open_store(store_path)
    m = Model(st.n_features, np.asarray(z["indices"], np.int64), np.asarray(z["values"], np.float64),
              float(np.asarray(z["bias"]).ravel()[0]))
    r = evaluate_store(m, store_path, "holdout")
    return {"model": "truth", "error": r["error"], "auc": r["auc"], "density": m.density, "nnz": m.nnz,
            "recall": 1.0, "precision": 1.0}


def scored(name: str, out: Path, store: Path, tidx, fig: dict, steps: list) -> dict:
    """Evaluate the model file ``out`` (a whole `sparsepipe evaluate`) against the holdout and the truth."""
    from pipeline.model import load_model

    ev, efig = command(["evaluate", str(out), str(store)])
    steps.append({"step": f"evaluate {name}", **efig})
    m = load_model(out)
    row = {"model": name, "error": ev["error"], "auc": ev["auc"], "density": m.density,
           **support_scores(m.dense_weights(), tidx), "train_wall_s": fig["wall_s"],
           "train_peak_rss_gb": fig["peak_rss_gb"], "train_peak_uss_gb": fig["peak_uss_gb"]}
    before = (m.meta.get("refit") or {}).get("holdout_before") or {}
    if before:  # the sparse model before its refit: same support, its own weights
        row.update({"error_before_refit": before.get("error"), "auc_before_refit": before.get("auc"),
                    "refit_s": m.meta["refit"].get("seconds"), "refit_evaluations": m.meta["refit"].get("evaluations")})
    print(json.dumps(row), flush=True)
    return row


def main(argv=None):
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--feed":  # the VW input writer (see vw_run)
        spec = json.loads(Path(sys.argv[2]).read_text())
        vw_lines(Path(spec["path"]), spec["entries"], spec["fifo"])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=350_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--algos", default="tg,stsgd,ftrl")
    ap.add_argument("--extra", action="append", default=[],
                    help="ALGO:OPTIONS, an extra run with these train options, e.g. 'stsgd:--refit'")
    ap.add_argument("--refit", action="append", default=[],
                    help="ALGO:OPTIONS, `sparsepipe refit` of ALGO's trained model with these options, e.g. "
                         "'stsgd:--l1 0'")
    ap.add_argument("--vw-l1", type=float, nargs="*", default=[1e-6])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-verify", action="store_true", help="skip `sparsepipe verify` (reads every block: slow)")
    a = ap.parse_args(argv)
    from pipeline.store.reader import open_store

    work = a.work or out_dir() / "webspam"
    made = not work.exists()
    work.mkdir(parents=True, exist_ok=True)
    before = set(work.iterdir())  # a given --work keeps what it held (an input synthesized earlier, other files)
    src, store = work / f"ws_{a.rows}_{a.seed}.svm", work / f"ws_{a.rows}_{a.seed}.zarr"
    truth = str(src) + ".truth.npz"
    steps, models = Steps(), []
    W = ["--workers", str(a.workers)]
    try:
        if not src.exists():
            _, fig = command(["synth", str(src), "--rows", str(a.rows), "--seed", str(a.seed), *W], json_out=False)
            steps.append({"step": "synth", "gb": round(src.stat().st_size / 1e9, 2), **fig})
        if not store.exists():
            res, fig = command(["ingest", str(src), "--out", str(store), *W])
            steps.append({"step": "ingest", "mb_per_s": round(src.stat().st_size / 1e6 / fig["wall_s"], 1),
                          "mb_per_s_per_core": round(src.stat().st_size / 1e6 / fig["wall_s"] / a.workers, 1), **fig,
                          "startup_s": res.get("startup_seconds"), "phase_s": res.get("phase_seconds")})
        if not a.no_verify:
            _, fig = command(["verify", str(store)])
            steps.append({"step": "verify", **fig})
        tidx, _ = load_truth(truth)
        st = open_store(str(store))
        models.append(truth_floor(str(store), truth))
        for algo, extra in algo_specs(a.algos) + [algo_spec(e) for e in a.extra]:
            name = spec_name(algo, extra)
            out = work / f"{name.replace(' ', '_').replace('-', '')}.npz"
            res, fig = command(["train", str(store), "--out", str(out), "--algo", algo, "--passes", str(a.passes),
                                *W, *extra])
            steps.append({"step": f"train {name}", **fig, "kernel_nnz_per_s": res.get("nnz_per_s_kernel"),
                          "train_s": res.get("seconds")})
            models.append(scored(name, out, store, tidx, fig, steps))
        for spec in a.refit:
            algo, _, opts = spec.partition(":")
            name = f"{algo} + refit {opts}".strip()
            out = work / f"{name.replace(' ', '_').replace('-', '').replace('+', '')}.npz"
            _, fig = command(["refit", str(work / f"{algo}.npz"), str(store), "--out", str(out), *W, *opts.split()])
            steps.append({"step": f"refit {name}", **fig})
            models.append(scored(name, out, store, tidx, fig, steps))
        for l1 in a.vw_l1:
            t0 = time.perf_counter()
            models.append(vw(st, src, work, a.passes, l1, tidx))
            steps.append({"step": f"vw --l1 {l1:g}", "wall_s": round(time.perf_counter() - t0, 1)})
            print(json.dumps(models[-1]), flush=True)
    finally:
        leftovers = sorted(str(p) for p in work.glob("*.tmp*")) + sorted(str(p) for p in work.parent.glob("*.tmp-*"))
        if not a.keep:
            for p in [work] if made else sorted(set(work.iterdir()) - before):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    report("webspam", {"rows": a.rows, "workers": a.workers, "passes": a.passes, "steps": steps,
                       "models": models, "temporary_files_left": leftovers}, models,
           ["model", "error", "auc", "density", "nnz", "recall", "precision", "error_before_refit", "train_wall_s",
            "train_peak_rss_gb", "train_peak_uss_gb"])
    print(json.dumps(steps, indent=1))


if __name__ == "__main__":
    main()
