"""The ECML 2010 instability study (ALGORITHMS.md §5, §7 items 14-17) on the shared real sets and synthetic data.

1. error vs density per pass for nssl, TG, SMIDAS (p = 2 ln d and 0.5 ln d), SCD; table of the test error of
   the last pass-end model whose density is ≤ 10% and ≤ 40% (what ``--max-density`` would return);
2. SMIDAS binary-exponent table (the paper's Table 3 columns) on the models at density ≤ 40% (synthetic
   webspam-like data: ≤ 0.1%, the paper's bound), plus the mass absorbed by naive float64 summation of w·x;
3. GraDes Ψ(w) per iteration for γ = 3 and 100 on news20 reduced to its 5000 most frequent features
   (unnormalised counts, s = 2000) and the spectral radius ρ(M_JJ) by power iteration; control: rows
   L2-normalised and γ = λ_max(XᵀX) (> λ_max/2), which converges.

Train on the train files, evaluate on the test/valid files (ingested as their own store, --holdout 0,
split "all"); news20 has one file: its block-level holdout (20%) is the test set. Hyper-parameters are fixed
(no tuning on the test sets). Usage: ``python benchmarks/instability.py [--quick] [--out bench-out]``.
Prints one JSON object and markdown tables, writes OUT/instability.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
DATA = os.path.join(ROOT, "..", "shared", "data")

from pipeline.algorithms.grades import spectral_radius  # noqa: E402
from pipeline.evaluate import evaluate_store  # noqa: E402
from pipeline.kernels.ecml import exponent_stats  # noqa: E402
from pipeline.store.reader import open_store  # noqa: E402
from pipeline.train import fit  # noqa: E402

# name: (train file, test file or None (block holdout), block MiB)
DATASETS = {
    "dexter": ("dexter/dexter_train.svm", "dexter/dexter_valid.svm", 0.05),
    "rcv1_subset": ("rcv1_subset/rcv1_vw_small_train.svm", "rcv1_subset/rcv1_vw_small_test.svm", 0.1),
    "news20_binary": ("news20_binary/news20_binary.svm", None, 1.0),
    "svmlight_example1": ("svmlight_example1/train.dat", "svmlight_example1/test.dat", 0.05),
}
ALGOS = {
    "nssl": ("nssl", {"eta": 0.1, "tau": 0.01, "lam": 1e-3, "density_bound": 0.4}),
    "tg": ("tg", {"eta": 0.1, "gravity": 1e-3}),
    "smidas_2ln": ("smidas", {"eta": 0.5, "lam": 1e-4, "c": 2.0}),
    "smidas_0.5ln": ("smidas", {"eta": 0.5, "lam": 1e-4, "c": 0.5}),
    "scd": ("scd", {"lam": 1e-5, "scan": 0.25}),
}


def sparsepipe() -> str:
    exe = os.path.join(ROOT, ".venv", "bin", "sparsepipe")
    return exe if os.path.exists(exe) else shutil.which("sparsepipe")


def ingest_cli(src: str, out: str, block_mb: float, holdout: float) -> str:
    if not os.path.exists(out):
        subprocess.run([sparsepipe(), "ingest", src, "--out", out, "--block-mb", str(block_mb), "--holdout",
                        str(holdout), "--workers", "1"], check=True, capture_output=True)
    return out


def prepare(name: str, work: str):
    """(train store, evaluation store, evaluation split) of a data set."""
    train, test, mb = DATASETS[name]
    tr = ingest_cli(os.path.join(DATA, train), os.path.join(work, f"{name}_train.zarr"), mb, 0.0 if test else 0.2)
    if test is None:
        return tr, tr, "holdout"
    return tr, ingest_cli(os.path.join(DATA, test), os.path.join(work, f"{name}_test.zarr"), mb, 0.0), "all"


def curve(train: str, ev: str, split: str, algo: str, opts: dict, passes: int):
    """(density, test error) after every pass (resumed pass by pass: the same model as one long run)."""
    model, pts, models = None, [], []
    for q in range(passes):
        model = fit(train, algo, opts, passes=1, paths=1, seed=0, client=None, init_model=model, evaluate=False)
        e = evaluate_store(model, ev, split)
        pts.append({"pass": q + 1, "density": model.density, "error": e["error"], "nnz": model.nnz})
        models.append(model)
        if model.gstate and int(np.asarray(model.gstate.get("stopped", [0]))[0]):
            break
    return pts, models


def at_density(pts: list, bound: float):
    """Index of the last point before the first one whose density exceeds ``bound`` (None if the first does)."""
    best = None
    for k, p in enumerate(pts):
        if p["density"] > bound:
            break
        best = k
    return best


def absorbed_mass(w: np.ndarray, store: str, split: str, rows: int = 200) -> float:
    """max over test rows of |naive left-to-right float64 Σ w_j x_j − math.fsum| (§5.2)."""
    st = open_store(store)
    worst, seen = 0.0, 0
    for e in st.entries(split):
        X = st.block(e).X
        for i in range(X.shape[0]):
            lo, hi = X.indptr[i], X.indptr[i + 1]
            terms = [float(w[j]) * float(v) for j, v in zip(X.indices[lo:hi], X.data[lo:hi]) if j < w.shape[0]]
            naive = 0.0
            for t in terms:
                naive += t
            worst = max(worst, abs(naive - math.fsum(terms)))
            seen += 1
            if seen >= rows:
                return worst
    return worst


def error_density_study(names, work, passes, news20_smidas_passes):
    curves, table, exps = {}, [], []
    for name in names:
        tr, ev, split = prepare(name, work)
        curves[name] = {}
        row = {"data": name, "d": open_store(tr).n_features}
        for key, (algo, opts) in ALGOS.items():
            n = passes * 4 if algo == "scd" else passes
            if algo == "smidas" and name == "news20_binary":
                n = news20_smidas_passes
            t0 = time.time()
            pts, models = curve(tr, ev, split, algo, opts, n)
            curves[name][key] = pts
            for b in (0.1, 0.4):
                k = at_density(pts, b)
                row[f"{key}@{int(b * 100)}%"] = None if k is None else round(pts[k]["error"], 4)
            row[f"{key}_s"] = round(time.time() - t0, 1)
            if algo == "smidas":
                k = at_density(pts, 0.4)
                k = len(pts) - 1 if k is None else k
                m = models[k]
                theta_nnz = int(np.count_nonzero(m.states[0]["theta"]))
                ex = exponent_stats(m.dense_weights())
                exps.append({"data": name, "p": key, "p_value": round(float(m.meta["history"][-1]["p"]), 2),
                             "density": round(m.density, 4), **ex, "underflow": theta_nnz - m.nnz,
                             "absorbed_max": absorbed_mass(m.dense_weights(), ev, split),
                             "error": round(pts[k]["error"], 4)})
        table.append(row)
    return curves, table, exps


def synthetic_exponents(work, rows, features, nnz, passes):
    src = os.path.join(work, "synth.svm")
    if not os.path.exists(src):
        subprocess.run([sparsepipe(), "synth", src, "--rows", str(rows), "--features", str(features),
                        "--nnz-per-row", str(nnz)], check=True, capture_output=True)
    st = ingest_cli(src, os.path.join(work, "synth.zarr"), 2.0, 0.2)
    out = []
    for key in ("smidas_2ln", "smidas_0.5ln"):
        algo, opts = ALGOS[key]
        pts, models = curve(st, st, "holdout", algo, {**opts, "lam": 1e-3}, passes)
        k = at_density(pts, 0.001)
        k = len(pts) - 1 if k is None else k
        m = models[k]
        ex = exponent_stats(m.dense_weights())
        out.append({"data": f"synth {rows}x{features}", "p": key, "p_value": round(float(m.meta["history"][-1]["p"]), 2),
                    "density": round(m.density, 5), **ex,
                    "underflow": int(np.count_nonzero(m.states[0]["theta"])) - m.nnz,
                    "absorbed_max": absorbed_mass(m.dense_weights(), st, "holdout"), "error": round(pts[k]["error"], 4)})
    return out


def reduced_news20(work, n_keep=5000, normalise=False):
    """news20 binary restricted to its n_keep most frequent features (optionally rows L2-normalised)."""
    from sklearn.datasets import dump_svmlight_file, load_svmlight_file

    out = os.path.join(work, f"news20_r{n_keep}{'_norm' if normalise else ''}.svm")
    if not os.path.exists(out):
        X, y = load_svmlight_file(os.path.join(DATA, DATASETS["news20_binary"][0]))
        keep = np.argsort(-np.diff(X.tocsc().indptr), kind="stable")[:n_keep]
        X = X[:, np.sort(keep)].tocsr()
        if normalise:
            nrm = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
            nrm[nrm == 0] = 1.0
            X = X.multiply(1.0 / nrm[:, None]).tocsr()
        dump_svmlight_file(X, y, out, zero_based=False)
    return ingest_cli(out, out.replace(".svm", ".zarr"), 1.0, 0.0)


def train_matrix(store):
    import scipy.sparse as sp

    st = open_store(store)
    return sp.vstack([st.block(e).X for e in st.entries("train")]).astype(np.float64).tocsr()


def grades_study(work, iters, s=2000):
    raw = reduced_news20(work)
    X = train_matrix(raw)
    res = {"data": "news20_binary, 5000 most frequent features", "s": s, "runs": []}
    for gamma in (3.0, 100.0):
        m = fit(raw, "grades", {"gamma": gamma, "s": s}, passes=iters, paths=1, client=None, evaluate=False)
        psi = [float(v) for v in m.gstate["psi"]]
        J = m.coef_indices if m.nnz else None
        first = fit(raw, "grades", {"gamma": gamma, "s": s}, passes=1, paths=1, client=None, evaluate=False)
        res["runs"].append({"gamma": gamma, "psi": psi,
                            "rho_iter1": spectral_radius(X, gamma, first.coef_indices, iters=60)["rho"],
                            "rho_last": spectral_radius(X, gamma, J, iters=60)["rho"] if J is not None else None,
                            "log10_psi_slope": float(np.polyfit(np.arange(len(psi)), np.log10(psi), 1)[0])
                            if all(np.isfinite(psi)) and len(psi) > 1 else None})
    norm = reduced_news20(work, normalise=True)
    Xn = train_matrix(norm)
    lmax = spectral_radius(Xn, 1.0, iters=100)["lambda_max"]
    m = fit(norm, "grades", {"gamma": lmax, "s": s}, passes=iters, paths=1, client=None, evaluate=False)
    psi = [float(v) for v in m.gstate["psi"]]
    res["control"] = {"gamma": lmax, "lambda_max": lmax, "psi": psi,
                      "rho_last": spectral_radius(Xn, lmax, m.coef_indices, iters=60)["rho"]}
    return res


def fmt(v):
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown(result):
    lines = ["### Test error at density ≤ 10% / ≤ 40% (last pass-end model within the bound; — = first pass already above)", ""]
    keys = list(ALGOS)
    lines.append("| data | d | " + " | ".join(f"{k} ≤10% | {k} ≤40%" for k in keys) + " |")
    lines.append("|---|---|" + "---|---|" * len(keys))
    for r in result["table"]:
        lines.append(f"| {r['data']} | {r['d']} | " + " | ".join(f"{fmt(r[f'{k}@10%'])} | {fmt(r[f'{k}@40%'])}"
                                                              for k in keys) + " |")
    lines += ["", "### SMIDAS weight exponents (frexp): within 52 of the largest, mean ± sd, underflow", "",
              "| data | p | p value | density | within52 | mean ± sd | e_max | underflow to 0 | max absorbed in w·x | error |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for e in result["exponents"]:
        lines.append(f"| {e['data']} | {e['p']} | {e['p_value']} | {e['density']} | {fmt(e['within52'])} | "
                     f"{e['mean']:.1f} ± {e['sd']:.1f} | {e['e_max']} | {e['underflow']} | {e['absorbed_max']:.3g} | "
                     f"{e['error']} |")
    g = result["grades"]
    lines += ["", f"### GraDes on {g['data']}, s = {g['s']}: log10 Ψ(w) per iteration", "",
              "| run | ρ(M_JJ) iter 1 | ρ(M_JJ) last | slope of log10 Ψ | log10 Ψ per iteration |", "|---|---|---|---|---|"]
    for r in g["runs"]:
        lines.append(f"| γ = {r['gamma']:g} | {fmt(r['rho_iter1'])} | {fmt(r['rho_last'])} | {fmt(r['log10_psi_slope'])} | "
                     + " ".join(f"{math.log10(p):.2f}" if p > 0 and math.isfinite(p) else str(p) for p in r["psi"]) + " |")
    c = g["control"]
    lines.append(f"| control: rows L2-normalised, γ = λ_max = {c['gamma']:.4g} | — | {fmt(c['rho_last'])} | — | "
                 + " ".join(f"{math.log10(p):.2f}" for p in c["psi"]) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out"))
    ap.add_argument("--quick", action="store_true", help="dexter only, few passes, no synthetic data")
    ap.add_argument("--passes", type=int, default=6)
    a = ap.parse_args(argv)
    work = os.path.join(a.out, "stores")
    os.makedirs(work, exist_ok=True)
    t0 = time.time()
    names = ["dexter"] if a.quick else list(DATASETS)
    curves, table, exps = error_density_study(names, work, 3 if a.quick else a.passes, 2)
    if not a.quick:
        exps += synthetic_exponents(work, 2000, 1_000_000, 300, 2)
    result = {"curves": curves, "table": table, "exponents": exps,
              "grades": grades_study(work, 6 if a.quick else 10), "seconds": round(time.time() - t0, 1),
              "algorithms": {k: {"algo": v[0], **v[1]} for k, v in ALGOS.items()}}
    with open(os.path.join(a.out, "instability.json"), "w") as f:
        json.dump(result, f, indent=1, default=float)
    print(json.dumps({k: result[k] for k in ("table", "exponents", "seconds")}, default=float))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
