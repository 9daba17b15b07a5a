"""The two-stage method's three comparisons (ALGORITHMS.md §3 "What was measured", §7 items 12-13).

(a) stage 1: Epoch-GD vs averaged SGD (L1 ball only, η1/√t) on noisy least squares with known truth:
    excess risk (w−w*)ᵀΣ(w−w*) and RMSE against the number of samples; log-log slopes (≈ −1 vs ≈ −½ claimed);
(b) stage 2: DD vs MG sparsification of the same ŵ at equal support size (nnz_mode "distinct"), heterogeneous
    feature scales, holdout RMSE averaged over seeds;
(c) RMSE against support size: two-stage (Epoch-GD + DD) vs truncated gradient (squared loss, gravity grid),
    on synthetic regression data and on a real set from ../shared/data (a9a, ±1 labels as regression targets).

Every model is trained through the engine (``pipeline.train.fit``) on stores ingested with labels=regression.
Usage: ``python benchmarks/two_stage.py [--small]``; prints JSON and markdown tables, writes
bench-out/two_stage.json. ``run(small=True)`` is what notebooks/two_stage.ipynb calls.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.evaluate import evaluate_store  # noqa: E402
from pipeline.ingest import IngestOptions, ingest  # noqa: E402
from pipeline.sparsify import sparsify_vector  # noqa: E402
from pipeline.store.reader import open_store  # noqa: E402
from pipeline.train import fit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


# ------------------------------------------------------------------------------------------ data

def regression_data(n, p, m, *, seed=0, noise=0.5, hetero=True, decay=0.0):
    """Rows with m random non-zeros out of p, x_j = scale_j·N(0,1), y = w*·x + noise·N(0,1).

    scale_j log-uniform on [0.1, 10] when ``hetero`` (else 1) and w*_j = N(0,1)·r_j^(−decay)/scale_j (r_j a
    random rank), so the contributions w*_j x_j do not follow |w*_j|. Σ = E[xxᵀ] = diag(m/p · scale²).
    Returns (indptr, indices, data, y, truth dict).
    """
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.uniform(np.log(0.1), np.log(10.0), p)) if hetero else np.ones(p)
    w = rng.normal(size=p) * rng.permutation(np.arange(1, p + 1)) ** (-decay) / scale
    idx = np.argsort(rng.random((n, p)), axis=1)[:, :m]
    idx.sort(axis=1)
    val = rng.normal(size=(n, m)) * scale[idx]
    y = np.einsum("ij,ij->i", val, w[idx]) + noise * rng.normal(size=n)
    indptr = np.arange(0, n * m + 1, m, dtype=np.int64)
    return indptr, idx.ravel(), val.ravel(), y, {"w": w, "sigma_diag": m / p * scale ** 2, "noise": noise}


def write_libsvm(path, indptr, indices, data, y):
    with open(path, "w") as f:
        for i in range(y.shape[0]):
            lo, hi = indptr[i], indptr[i + 1]
            f.write(f"{y[i]:.9g} " + " ".join(f"{j + 1}:{v:.9g}" for j, v in zip(indices[lo:hi], data[lo:hi]))
                    + "\n")


def make_store(workdir, name, n, p, m, *, holdout=0.2, client=None, **kw):
    """Generate, write LIBSVM and ingest with labels=regression; returns (store path, truth)."""
    *csr, truth = regression_data(n, p, m, **kw)
    svm = Path(workdir) / f"{name}.svm"
    write_libsvm(svm, *csr)
    out = Path(workdir) / f"{name}.zarr"
    shutil.rmtree(out, ignore_errors=True)
    ingest([str(svm)], str(out), IngestOptions(block_mb=max(0.05, svm.stat().st_size / 2 ** 20 / 8),
                                               holdout=holdout, labels="regression", dtype="float64"),
           client=client, workers=1)
    return str(out), truth


def holdout_xy(store):
    import scipy.sparse as sp

    st = open_store(store)
    blocks = list(st.blocks("holdout"))
    return sp.vstack([b.X for b in blocks]).tocsr(), np.concatenate([b.y for b in blocks])


def rmse(X, y, w, b=0.0):
    r = X @ w + b - y
    return float(np.sqrt(np.mean(r * r)))


def slope(xs, ys):
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


# ------------------------------------------------------------------------------------------ (a)

def epoch_vs_sgd(workdir, *, T1=250, n_epochs=7, p=20, m=10, B=None, eta1=0.02, client=None):
    """Excess risk and holdout RMSE after n = T1(2^k − 1) samples (k = 1..n_epochs), one pass, one path."""
    n_max = T1 * (2 ** n_epochs - 1)
    store, truth = make_store(workdir, "ls", int(n_max / 0.6) + 50, p, m, hetero=False, noise=1.0, seed=3,
                              client=client)
    w_star, S = truth["w"], truth["sigma_diag"]
    B = B if B is not None else 1.0 * float(np.abs(w_star).sum())
    rows = []
    for k in range(1, n_epochs + 1):
        n = T1 * (2 ** k - 1)
        rec = {"samples": n}
        for label, opts in (("epoch_gd", {"stage1": "epoch-gd", "epochs": k}),
                            ("avg_sgd", {"stage1": "averaged-sgd", "budget": n})):
            mdl = fit(store, "two-stage", {"l1_radius": B, "eta1": eta1, "T1": T1, "fit_bias": False, **opts},
                      passes=1, paths=1, seed=0, client=None)
            d = mdl.dense_weights() - w_star
            rec[f"{label}_excess"] = float(d @ (S * d))
            rec[f"{label}_rmse"] = mdl.meta["holdout"]["rmse"]
        rows.append(rec)
    n = [r["samples"] for r in rows]
    slopes = {k: slope(n, [r[f"{k}_excess"] for r in rows]) for k in ("epoch_gd", "avg_sgd")}
    return rows, {"B": B, "eta1": eta1, "T1": T1, "p": p, "noise_rmse": truth["noise"], "slopes": slopes}


# ------------------------------------------------------------------------------------------ (b), (c)

def sparse_curve(w_hat, b_hat, s, X, y, sizes, method, seeds):
    """Mean holdout RMSE (and mean nnz) of sparsify(ŵ) at each support size, over ``seeds`` draws."""
    out = []
    for N in sizes:
        r, z = [], []
        for sd in range(seeds):
            wt, info = sparsify_vector(w_hat, s, method=method, nnz=N, nnz_mode="distinct", seed=sd)
            r.append(rmse(X, y, wt, b_hat))
            z.append(info["nnz"])
        out.append((float(np.mean(z)), float(np.mean(r)), float(np.std(r))))
    return out


def stage1_model(store, opts, passes):
    mdl = fit(store, "two-stage", opts, passes=passes, paths=1, seed=0, client=None)
    g = mdl.gstate
    st = open_store(store).feature_stats()
    s = np.asarray(st["col_sumsq"], float) / st["n_rows"]
    return np.asarray(g["w_hat"], float), float(g["b_hat"][0]), s, mdl


def dd_vs_mg(store, opts, passes, sizes, seeds):
    w_hat, b_hat, s, mdl = stage1_model(store, opts, passes)
    X, y = holdout_xy(store)
    dd = sparse_curve(w_hat, b_hat, s, X, y, sizes, "dd", seeds)
    mg = sparse_curve(w_hat, b_hat, s, X, y, sizes, "mg", seeds)
    rows = [{"nnz": N, "dd_rmse": a[1], "dd_sd": a[2], "mg_rmse": b[1], "mg_sd": b[2]}
            for N, a, b in zip(sizes, dd, mg)]
    return rows, {"dense_rmse": rmse(X, y, w_hat, b_hat), "dense_nnz": int(np.count_nonzero(w_hat))}


def two_stage_vs_tg(store, opts, passes, sizes, gravities, tg_eta, seeds):
    w_hat, b_hat, s, mdl = stage1_model(store, opts, passes)
    X, y = holdout_xy(store)
    ts = sparse_curve(w_hat, b_hat, s, X, y, sizes, "dd", seeds)
    rows = [{"method": "two-stage", "param": f"N={N}", "nnz": a[0], "rmse": a[1]} for N, a in zip(sizes, ts)]
    for g in gravities:
        m = fit(store, "tg", {"loss": "squared", "eta": tg_eta, "schedule": "sqrt", "gravity": g}, passes=passes,
                paths=1, seed=0, client=None)
        rows.append({"method": "tg", "param": f"g={g:g}", "nnz": float(m.nnz),
                     "rmse": evaluate_store(m, store)["rmse"]})
    return rows, {"dense_rmse": rmse(X, y, w_hat, b_hat), "dense_nnz": int(np.count_nonzero(w_hat))}


def a9a_store(workdir, rows, client=None):
    src = DATA / "a9a" / "a9a"
    if not src.exists():
        return None
    dst = Path(workdir) / "a9a_sub.svm"
    with open(src) as f, open(dst, "w") as g:
        for i, line in enumerate(f):
            if i >= rows:
                break
            g.write(line)
    out = Path(workdir) / "a9a.zarr"
    shutil.rmtree(out, ignore_errors=True)
    ingest([str(dst)], str(out), IngestOptions(block_mb=0.2, holdout=0.2, labels="regression", n_features=123),
           client=client, workers=1)
    return str(out)


# ------------------------------------------------------------------------------------------ driver

def md_table(rows, cols):
    def f(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def run(small=False, workdir=None, client=None):
    """All three comparisons; returns the result dict (tables as lists of rows)."""
    t0 = time.time()
    if client is None:
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
                Client(cl) as c:
            return run(small, workdir, c)
    tmp = workdir or tempfile.mkdtemp(prefix="two_stage_bench_")
    res = {"small": small}
    a_rows, a_info = epoch_vs_sgd(tmp, T1=100 if small else 250, n_epochs=6 if small else 8, client=client)
    res["a_epoch_vs_sgd"] = {"rows": a_rows, **a_info}
    n, p, m = (6000, 100, 15) if small else (40000, 300, 30)
    seeds = 5 if small else 20
    store, truth = make_store(tmp, "het", n, p, m, hetero=True, noise=0.5, decay=0.5, seed=7, client=client)
    B = float(np.abs(truth["w"]).sum())
    opts = {"l1_radius": B, "eta1": 0.005, "T1": 200 if small else 500}
    sizes = [5, 10, 20, 40, 70] if small else [5, 10, 20, 40, 80, 150, 250]
    b_rows, b_info = dd_vs_mg(store, opts, 2 if small else 3, sizes, seeds)
    res["b_dd_vs_mg"] = {"rows": b_rows, **b_info}
    grav = [1e-3, 1e-2, 0.1, 0.3, 1.0] if small else [1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0]
    c_rows, c_info = two_stage_vs_tg(store, opts, 2 if small else 3, sizes, grav, 0.005, seeds)
    res["c_synthetic"] = {"rows": c_rows, **c_info}
    a9a = a9a_store(tmp, 8000 if small else 32561, client=client)
    if a9a is not None:
        opts9 = {"l1_radius": 20.0, "eta1": 0.05, "T1": 200 if small else 500}
        r9, i9 = two_stage_vs_tg(a9a, opts9, 2, [5, 10, 20, 40, 80], [1e-3, 3e-3, 1e-2, 3e-2, 0.1], 0.05,
                                 seeds)
        res["c_a9a"] = {"rows": r9, **i9}
    res["seconds"] = round(time.time() - t0, 1)
    if workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def print_tables(res):
    a = res["a_epoch_vs_sgd"]
    print(f"\n(a) Epoch-GD vs averaged SGD, noisy least squares (noise sd {a['noise_rmse']}), excess risk "
          f"(w-w*)'S(w-w*); log-log slopes: Epoch-GD {a['slopes']['epoch_gd']:.3f}, averaged SGD "
          f"{a['slopes']['avg_sgd']:.3f}\n")
    print(md_table(a["rows"], ["samples", "epoch_gd_excess", "avg_sgd_excess", "epoch_gd_rmse", "avg_sgd_rmse"]))
    b = res["b_dd_vs_mg"]
    print(f"\n(b) DD vs MG sparsification at equal support (holdout RMSE, mean/sd over seeds); dense w_hat: "
          f"nnz {b['dense_nnz']}, RMSE {b['dense_rmse']:.4g}\n")
    print(md_table(b["rows"], ["nnz", "dd_rmse", "dd_sd", "mg_rmse", "mg_sd"]))
    for key, title in (("c_synthetic", "synthetic"), ("c_a9a", "a9a (+-1 labels as targets)")):
        if key in res:
            c = res[key]
            print(f"\n(c) RMSE vs support size, two-stage (Epoch-GD + DD) vs TG, {title}; dense w_hat: nnz "
                  f"{c['dense_nnz']}, RMSE {c['dense_rmse']:.4g}\n")
            print(md_table(c["rows"], ["method", "param", "nnz", "rmse"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="small sizes (what the notebook runs)")
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "two_stage.json"))
    args = ap.parse_args(argv)
    res = run(small=args.small)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    print_tables(res)


if __name__ == "__main__":
    main()
