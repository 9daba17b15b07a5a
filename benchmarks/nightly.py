"""Nightly retraining: seven nights of webspam-like data through `retrain`; per-night wall time by step, and the
cost of the warm-started night against retraining from scratch on the same window to the same holdout error.

    python -m benchmarks.nightly --mb-per-night 300            # the lead's size (a few hundred MB a night)
    python -m benchmarks.nightly --mb-per-night 20 --nights 3  # a quick check

Each night is `synth --model-seed 7 --seed NIGHT` (one concept, a new sample per night). The job trains what
the shipped job (configs/nightly.toml) trains: `--algo` (default: the default algorithm, stsgd) with that
algorithm's defaults and its default refit, `--passes` per night (2, as shipped), warm-started / resumed from
production, on the whole window, and evaluates candidate and production on the newest night's holdout blocks.
`--algo tg --eta 0.5 --gravity 1e-6 --scale none` is the run of the first version of this benchmark.

From night 2 on, a scratch model is trained on the same window's training blocks, pass by pass (each pass
resumes the previous one exactly), until its error on the same evaluation blocks is at most the warm
candidate's (or `--max-scratch-passes`); with the refit on, each pass's learner is refitted as the job refits
and the refitted model is the one evaluated. scratch_train_s = the learner's seconds through that pass + the
last refit's (what a k-pass `train` from scratch costs); ratio = scratch_train_s / the warm night's training
seconds (refit included, its per-pass checkpoint writes reported apart; > 1: the warm start saves that factor).
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

BYTES_PER_NNZ = 18.8  # synth's text at webspam width: 24,374.9 MB for 1,295,940,050 non-zeros (350k rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb-per-night", type=float, default=300.0)
    ap.add_argument("--nights", type=int, default=7)
    ap.add_argument("--features", type=int, default=16_609_143)
    ap.add_argument("--nnz-per-row", type=int, default=3700)
    ap.add_argument("--passes", type=int, default=2, help="passes per night (warm-started)")
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="0: train in this process")
    ap.add_argument("--block-mb", type=float, default=16.0)
    ap.add_argument("--algo", default=None, help="default: the default algorithm (the shipped job's)")
    ap.add_argument("--eta", type=float, default=None, help="default: the algorithm's")
    ap.add_argument("--gravity", type=float, default=None, help="tg/sgd; default: the algorithm's")
    ap.add_argument("--scale", default=None, help="'data' or 'none'; default: the algorithm's")
    ap.add_argument("--refit", default=None, action=argparse.BooleanOptionalAction,
                    help="refit the candidate (default: the algorithm's default, as the job does)")
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
    hyper = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in
                    (("algo", a.algo), ("eta", a.eta), ("gravity", a.gravity), ("scale", a.scale)) if v is not None)
    job = work / "job.toml"
    job.write_text(f"""store = "{work}/store.zarr"
registry = "{work}/models"
[train]
passes = {a.passes}
workers = {a.workers}
{hyper}[refit]
{"" if a.refit is None else f"enabled = {str(a.refit).lower()}"}
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
        cand = res["candidate"]
        row = {"night": night, "mb": round(s["bytes"] / 1e6, 1), "rows": s["rows"], "decision": res["decision"],
               "error": cand["metrics"].get("error"), "nnz": cand["nnz"],
               "refit_s": (cand.get("refit") or {}).get("seconds"),
               "prod_error": (res["production"]["metrics"] or {}).get("error"),
               **{f"{k}_s": secs.get(k, 0.0) for k in ("append", "validate", "train", "evaluate", "promote",
                                                       "retention", "total")}}
        if night > 1:
            row.update(_scratch(cfg, res, a, fit, evaluate_store, open_store, open_registry))
        table.append(row)
        nights.append({"night": night, "synth_seconds": round(synth_s, 3), "result": res, **row})
        print(f"night {night}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    ratios = [r["scratch_over_warm"] for r in table if r.get("scratch_over_warm")]
    summary = {"algo": cfg.algo, "refit": cfg.refits, "job": job.read_text(), "mb_per_night": a.mb_per_night,
               "rows_per_night": rows, "features": a.features,
               "nnz_per_row": a.nnz_per_row, "passes_per_night": a.passes, "workers": a.workers,
               "median_scratch_over_warm": sorted(ratios)[len(ratios) // 2] if ratios else None,
               "nights": nights}
    report("nightly", summary, table, ["night", "mb", "decision", "error", "nnz", "prod_error", "append_s",
                                        "validate_s", "train_s", "refit_s", "evaluate_s", "promote_s", "retention_s", "total_s",
                                        "warm_fit_s", "checkpoint_s", "scratch_passes", "scratch_error", "scratch_train_s", "scratch_over_warm"])
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


def _scratch(cfg, res, a, fit, evaluate_store, open_store, open_registry):
    """Train from scratch on the night's window, pass by pass (refitting each pass's learner when the job refits),
    until the warm candidate's holdout error."""
    from pipeline.cluster import dask_client
    from pipeline.refit import refit

    st = open_store(cfg.store)
    window = res["window"]["generations"]
    train_keys = st.keys("train", window)
    eval_keys = st.keys("holdout", res["window"]["evaluation_generations"])
    target = res["candidate"]["metrics"]["error"]
    paths = res["candidate"]["paths"]
    t_learn, t_refit, model, err, k = 0.0, 0.0, None, None, 0
    with dask_client(a.workers) if a.workers else _null() as client:
        for k in range(1, a.max_scratch_passes + 1):
            t0 = time.time()
            model = fit(st.path, cfg.algo, cfg.hyper(), passes=1, paths=paths, seed=0, client=client,
                        init_model=model, evaluate=False, blocks=train_keys)
            t_learn += time.time() - t0  # training only, as the warm night's train step (which also checkpoints)
            t0 = time.time()
            final = refit(model, st.path, client=client, blocks=train_keys, **cfg.refit_options()) if cfg.refits \
                else model
            t_refit = time.time() - t0  # a k-pass run refits once: the last refit's seconds count
            err = evaluate_store(final, st.path, "holdout", client, blocks=eval_keys)["error"]
            if err <= target:
                break
    t_train = t_learn + t_refit
    cand = res["candidate"]  # the warm night's training (refit included), without its per-pass checkpoints
    warm = cand["fit_seconds"] + ((cand.get("refit") or {}).get("seconds") or 0.0)
    return {"warm_fit_s": round(warm, 3), "checkpoint_s": cand["checkpoint_seconds"], "scratch_passes": k,
            "scratch_error": err, "scratch_reached": err <= target, "scratch_train_s": round(t_train, 3),
            "scratch_over_warm": round(t_train / warm, 3) if warm else None}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *e):
        return False


if __name__ == "__main__":
    main()
