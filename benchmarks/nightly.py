"""Nightly retraining: seven nights of webspam-like data through `retrain`; per-night wall time by step, and the
cost of the warm-started night against retraining from scratch on the same window to the same holdout error.

    python -m benchmarks.nightly --mb-per-night 300            # the lead's size (a few hundred MB a night)
    python -m benchmarks.nightly --mb-per-night 20 --nights 3  # a quick check

Each night is `synth --model-seed 7 --seed NIGHT` (one concept, a new sample per night). The job trains TG
(`--passes` per night, warm-started / resumed from production) on the whole window and evaluates candidate and
production on the newest night's holdout blocks. From night 2 on, a scratch model is trained pass by pass on
the same window's training blocks until its error on the same evaluation blocks is at most the warm
candidate's (or `--max-scratch-passes`); ratio = scratch training seconds / the warm night's training seconds
(its per-pass checkpoint writes reported apart; > 1: the warm start saves that factor).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import out_dir, report  # noqa: E402

BYTES_PER_NNZ = 14.5  # synth's text: "index:value " at webspam width, measured


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb-per-night", type=float, default=300.0)
    ap.add_argument("--nights", type=int, default=7)
    ap.add_argument("--features", type=int, default=16_609_143)
    ap.add_argument("--nnz-per-row", type=int, default=3700)
    ap.add_argument("--passes", type=int, default=2, help="passes per night (warm-started)")
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="0: train in this process")
    ap.add_argument("--block-mb", type=float, default=16.0)
    ap.add_argument("--eta", type=float, default=0.5)
    ap.add_argument("--gravity", type=float, default=1e-6)
    ap.add_argument("--max-scratch-passes", type=int, default=20)
    ap.add_argument("--work", default=None, help="work folder (default bench-out/nightly-work; removed first)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args(argv)

    from pipeline.evaluate import evaluate_store
    from pipeline.registry import open_registry
    from pipeline.retrain import load_job, run_job
    from pipeline.store.reader import open_store
    from pipeline.synth import synth
    from pipeline.train import fit

    work = Path(a.work) if a.work else out_dir() / "nightly-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows = max(20, int(a.mb_per_night * 1e6 / (a.nnz_per_row * BYTES_PER_NNZ)))
    job = work / "job.toml"
    job.write_text(f"""store = "{work}/store.zarr"
registry = "{work}/models"
[train]
algo = "tg"
passes = {a.passes}
workers = {a.workers}
eta = {a.eta}
gravity = {a.gravity}
scale = "none"
[gate]
metric = "error"
max_change = 0.005
[ingest]
block_mb = {a.block_mb}
holdout = 0.2
[retention]
keep = 10
""")
    cfg = load_job(job)
    table, nights = [], []
    for night in range(1, a.nights + 1):
        f = work / f"night{night}.svm"
        t0 = time.time()
        s = synth(str(f), rows=rows, features=a.features, nnz_per_row=a.nnz_per_row, seed=night, model_seed=7,
                  workers=max(1, os.cpu_count() or 1))
        synth_s = time.time() - t0
        code, res = run_job(cfg, [str(f)])
        if code != 0:
            raise SystemExit(f"night {night}: exit {code}: {res.get('reason') or res.get('error')}")
        secs = res["seconds"]
        row = {"night": night, "mb": round(s["bytes"] / 1e6, 1), "rows": s["rows"], "decision": res["decision"],
               "error": res["candidate"]["metrics"].get("error"),
               "prod_error": (res["production"]["metrics"] or {}).get("error"),
               **{f"{k}_s": secs.get(k, 0.0) for k in ("append", "validate", "train", "evaluate", "promote",
                                                       "retention", "total")}}
        if night > 1:
            row.update(_scratch(cfg, res, a, fit, evaluate_store, open_store, open_registry))
        table.append(row)
        nights.append({"night": night, "synth_seconds": round(synth_s, 3), "result": res, **row})
        print(f"night {night}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    ratios = [r["scratch_over_warm"] for r in table if r.get("scratch_over_warm")]
    summary = {"mb_per_night": a.mb_per_night, "rows_per_night": rows, "features": a.features,
               "nnz_per_row": a.nnz_per_row, "passes_per_night": a.passes, "workers": a.workers,
               "median_scratch_over_warm": sorted(ratios)[len(ratios) // 2] if ratios else None,
               "nights": nights}
    report("nightly", summary, table, ["night", "mb", "decision", "error", "prod_error", "append_s", "validate_s",
                                        "train_s", "evaluate_s", "promote_s", "retention_s", "total_s",
                                        "warm_fit_s", "checkpoint_s", "scratch_passes", "scratch_error", "scratch_train_s", "scratch_over_warm"])
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


def _scratch(cfg, res, a, fit, evaluate_store, open_store, open_registry):
    """Train from scratch on the night's window, pass by pass, until the warm candidate's holdout error."""
    from pipeline.cluster import dask_client

    st = open_store(cfg.store)
    window = res["window"]["generations"]
    train_keys = st.keys("train", window)
    eval_keys = st.keys("holdout", res["window"]["evaluation_generations"])
    target = res["candidate"]["metrics"]["error"]
    paths = res["candidate"]["paths"]
    t_train, model, err, k = 0.0, None, None, 0
    with dask_client(a.workers) if a.workers else _null() as client:
        for k in range(1, a.max_scratch_passes + 1):
            t0 = time.time()
            model = fit(st.path, "tg", cfg.hyper(), passes=1, paths=paths, seed=0, client=client, init_model=model,
                        evaluate=False, blocks=train_keys)
            t_train += time.time() - t0  # training only, as the warm night's train step (which also checkpoints)
            err = evaluate_store(model, st.path, "holdout", client, blocks=eval_keys)["error"]
            if err <= target:
                break
    warm = res["candidate"]["fit_seconds"]  # the warm night's training, without its per-pass checkpoints
    return {"warm_fit_s": warm, "checkpoint_s": res["candidate"]["checkpoint_seconds"], "scratch_passes": k,
            "scratch_error": err, "scratch_reached": err <= target, "scratch_train_s": round(t_train, 3),
            "scratch_over_warm": round(t_train / warm, 3) if warm else None}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *e):
        return False


if __name__ == "__main__":
    main()
