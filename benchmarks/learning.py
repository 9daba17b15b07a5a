"""Learning at webspam width against the ground truth and LIBLINEAR, in one run (issue: models that learn at scale).

    python -m benchmarks.learning [--rows 35000] [--seed 11] [--passes 3] [--workers 2] [--algos stsgd,tg,ftrl]
                                  [--C 1,3,10,30] [--store S --truth T.npz]

Synthesises a webspam-like file (16,609,143 features; its true weights are saved beside it), ingests it
with the CLI, trains each algorithm with its DEFAULTS through the CLI (the command a user runs, whole
process timed), and fits LIBLINEAR's exact L1-regularised logistic regression (scikit-learn's liblinear
solver) on the same training rows in memory over a grid of C. Every model is scored on the same holdout
blocks: error, AUC, density, the share of the true support kept (recall), the share of the true features the rows
identify (detectable recall: oracle |z| ≥ 3, benchmarks.diagnose.oracle_z; benchmarks.oracle says why) and precision.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import algo_specs, l1_logistic, out_dir, report, spec_name, synth_file
from benchmarks.diagnose import band_recall, load_truth, oracle_z, support_scores, truth_columns


def _matrix(store: str, split: str, external: bool = True):
    """(X, y) of a store's split; X in the input's feature ids (as the peers read the text and the truth names them)
    unless ``external`` is False (the blocks' own ids)."""
    import scipy.sparse as sp

    from pipeline.store.reader import open_store

    st = open_store(store)
    blocks = list(st.blocks(split))
    return (sp.vstack([st.external_X(b) if external else b.X for b in blocks]).tocsr(),
            np.concatenate([b.y for b in blocks]))


def _metrics(f, y):
    from pipeline.evaluate import auc

    return {"error": float(np.mean(y * f <= 0)), "auc": auc(f, y)}


def sparsepipe_cmd(args: list[str]) -> tuple[dict, float]:
    exe = str(Path(sys.executable).with_name("sparsepipe"))
    t0 = time.perf_counter()
    r = subprocess.run([exe, *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"sparsepipe {' '.join(args)} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout), time.perf_counter() - t0


def ours(store: str, algo: str, extra: list[str], passes: int, workers: int, Xho, yho, tidx, work: Path,
         z_true=None) -> dict:
    """Train ``algo`` with its defaults (and ``extra`` arguments) through the CLI; its row of the table (with the
    recall per band of the oracle |z| when ``z_true`` is given: :func:`benchmarks.diagnose.band_recall`)."""
    from pipeline.model import load_model

    name = spec_name(algo, extra)
    out = work / (name.replace(" ", "_").replace("=", "-").replace("/", "_") + ".npz")
    summary, wall = sparsepipe_cmd(["train", store, "--out", str(out), "--algo", algo, "--passes", str(passes),
                                    "--workers", str(workers), *extra])
    m = load_model(out)
    w = m.dense_weights()
    f = m.decision_function(Xho)
    return {"model": name, **_metrics(f, yho), "density": m.density, **support_scores(w, tidx),
            "wall_s": round(wall, 1), **(band_recall(w, tidx, z_true) if z_true is not None else {})}


def liblinear(Xtr, ytr, Xho, yho, tidx, C: float, z_true=None) -> dict:
    """LIBLINEAR's L1-LR at C on the training rows: its row of the table on the holdout (as :func:`ours`)."""
    t0 = time.perf_counter()
    clf = l1_logistic(C, tol=1e-3, max_iter=100, random_state=0)
    clf.fit(Xtr, ytr)
    w = np.asarray(clf.coef_).ravel()
    f = Xho @ w + float(clf.intercept_[0])
    return {"model": f"LIBLINEAR L1-LR C={C:g}", **_metrics(f, yho), "density": np.count_nonzero(w) / w.size,
            **support_scores(w, tidx), "wall_s": round(time.perf_counter() - t0, 1),
            **(band_recall(w, tidx, z_true) if z_true is not None else {})}


def default_store(rows: int = 35000, seed: int = 11, workers: int = 2) -> tuple[str, str]:
    """(store, truth file) of the webspam-like rows x 16.6M features under bench-out/learning, synthesised and
    ingested on first use (the text beside the store: same name, .svm)."""
    work = out_dir() / "learning"
    work.mkdir(parents=True, exist_ok=True)
    src = synth_file(work / f"ws_{rows}_{seed}.svm", rows, seed=seed)
    store = str(work / f"ws_{rows}_{seed}.zarr")
    if not Path(store).exists():
        sparsepipe_cmd(["ingest", str(src), "--out", store, "--workers", str(workers)])
    return store, str(src) + ".truth.npz"


def store_arguments(ap: argparse.ArgumentParser, algos: str, C: str) -> None:
    """The arguments of the benchmarks that train ours beside LIBLINEAR on a webspam-like store with its truth."""
    ap.add_argument("--rows", type=int, default=35000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--algos", default=algos,
                    help="comma-separated ('' for none); an entry may carry options after a colon: 'ftrl:--refit'")
    ap.add_argument("--C", default=C, help="LIBLINEAR's C grid ('' skips LIBLINEAR)")
    ap.add_argument("--store", help="use this store (with --truth) instead of synthesising one")
    ap.add_argument("--truth")


def store_of(a: argparse.Namespace) -> tuple[str, str]:
    """(store, truth file) of :func:`store_arguments`: the given ones or :func:`default_store`."""
    return (a.store, a.truth) if a.store else default_store(a.rows, a.seed, a.workers)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_arguments(ap, "stsgd,tg,ftrl", "1,3,10,30")
    a = ap.parse_args(argv)
    work = out_dir() / "learning"
    work.mkdir(parents=True, exist_ok=True)
    store, truth = store_of(a)
    tidx, _ = load_truth(truth)
    Xho, yho = _matrix(store, "holdout")
    z_true = oracle_z(*truth_columns(store, tidx))[0]
    rows = []
    for algo, extra in algo_specs(a.algos):
        rows.append(ours(store, algo, extra, a.passes, a.workers, Xho, yho, tidx, work, z_true))
        print(json.dumps(rows[-1]), flush=True)
    if a.C:
        Xtr, ytr = _matrix(store, "train")
        for C in (float(c) for c in a.C.split(",")):
            rows.append(liblinear(Xtr, ytr, Xho, yho, tidx, C, z_true))
            print(json.dumps(rows[-1]), flush=True)
        del Xtr
    ll = [r for r in rows if r["model"].startswith("LIBLINEAR")]
    best = min(ll, key=lambda r: r["error"]) if ll else None
    report("learning", {"store": store, "rows": a.rows, "passes": a.passes, "workers": a.workers,
                        "liblinear_best": best, "results": rows}, rows,
           ["model", "error", "auc", "density", "nnz", "recall", "detectable_recall", "precision", "wall_s"])


if __name__ == "__main__":
    main()
