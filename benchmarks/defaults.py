"""Defaults study (issue 12 §4): do stsgd's and ftrl's defaults hold on every small real set?

Run: ``python -m benchmarks.defaults [--sets dexter,a9a] [--losses logistic,hinge]``. Serial, one process,
every fit in-process (``client=None``), 3 passes (``--passes``), 1 path, seed 0.

Data: every train/test pair in ../shared/data (README there). The training file is ingested into a store
(16 blocks, so the shuffle window and the block holdout have something to work with) and the test file into
a second store of the same width; a set without a test file (news20, w8a) is evaluated on its training
store's block holdout (20% of the blocks). w8a is sorted by label (all 1,479 positives in the first 3k
rows) and news20 in runs of 500 per label, so for those two a seeded line-shuffled copy of the file is
ingested: the block holdout is then a random row sample (otherwise w8a's holdout has no positive row).
Stores are cached under bench-out/defaults/.

Per set and loss (logistic, hinge):
- ``tg``: grid eta x gravity (TG_ETAS x TG_GRAVITIES) -> best error (ties: sparser) and its density, and
  the sparsest model within 1 point of the best error;
- ``stsgd`` with its current defaults (``STSGDParams()`` read at run time; only ``loss`` is passed), and a
  grid over l1 x K (STSGD_L1 x STSGD_K) for the leave-one-set-out check;
- ``ftrl`` with its defaults, and a grid over l1 (FTRL_L1);
- ``stsgd+refit``, ``ftrl+refit``: the defaults followed by ``train --refit``'s defaults (the L1 refit on the
  support with its penalty chosen on 20% of the training rows);
- LIBLINEAR exact L1-regularised logistic regression (scikit-learn's L1 ``LogisticRegression(solver="liblinear")``,
  ``benchmarks.common.l1_logistic``) over C in LL_C on the very training rows of the store (its training blocks, read
  back, in memory) -> best error, and the error at the C whose density is closest (in log) to a default's
  density ("matched density"). LIBLINEAR is logistic only; hinge rows are compared with the same L1-LR.

Checks (issue 12 Targets, "On every set in ../shared/data"):
- ``stsgd<=tg``: stsgd default error <= tg best error + 1 point, at density <= half of tg best's density;
- ``stsgd+refit<=tg``: the same for stsgd with ``--refit``;
- ``ours~LL``: among the stsgd, ftrl, stsgd+refit and ftrl+refit defaults whose density is <= 2%, the one with
  the lower error is
  within 1 point of LIBLINEAR's error at matched density (no default at <= 2%: "no").

Leave-one-set-out: for each set S, the stsgd (l1, K) grid point that, on all other sets (both losses),
has the most (set, loss) pairs with density <= half of tg best's density and, among those, the smallest mean
(error - tg best error); its result on S is reported.

Writes bench-out/defaults.{json,md} (the main table) and bench-out/defaults_loso.{json,md}.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import time

import numpy as np

from benchmarks.common import DATA, l1_logistic, out_dir, report

SETS = {  # name: (train file, test file or None)
    "dexter": ("dexter/dexter_train.svm", "dexter/dexter_valid.svm"),
    "svmlight1": ("svmlight_example1/train.dat", "svmlight_example1/test.dat"),
    "rcv1": ("rcv1_subset/rcv1_vw_small_train.svm", "rcv1_subset/rcv1_vw_small_test.svm"),
    "a9a": ("a9a/a9a", "a9a/a9a.t"),
    "w8a": ("w8a/w8a", None),
    "news20": ("news20_binary/news20_binary.svm", None),
}
SHUFFLE = {"w8a", "news20"}  # sorted by label: ingest a seeded shuffled copy (block holdout = random rows)
LOSSES = ("logistic", "hinge")
TG_ETAS = (0.05, 0.1, 0.5, 1.0)
TG_GRAVITIES = (0.0, 1e-6, 1e-5, 1e-4, 1e-3)
TG_LITERAL = {"scale": "none", "bias_adagrad": False}  # the grid is of the literal TG (absolute eta and g)
STSGD_L1 = (3e-4, 1e-3, 3e-3)
STSGD_K = (100, 1000)
FTRL_L1 = (0.1, 0.3, 1.0, 3.0)
LL_C = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
PASSES, PATHS, SEED = 3, 1, 0
TRAIN_SEED = SEED  # the training order's seed (--train-seed); the stores, holdouts and LIBLINEAR use SEED
BLOCKS, HOLDOUT = 16, 0.2


# ---------------------------------------------------------------------------------------------- data
def _max_index(path: str) -> int:
    m = 0
    with open(path, "rb") as f:
        for line in f:
            toks = line.split()
            if len(toks) > 1:
                m = max(m, max(int(t.split(b":", 1)[0]) for t in toks[1:]))
    return m


def _shuffled(src: str, dst: str, seed: int = 0) -> str:
    if not os.path.exists(dst):
        with open(src, "rb") as f:
            lines = [ln if ln.endswith(b"\n") else ln + b"\n" for ln in f if ln.strip()]
        random.Random(seed).shuffle(lines)
        with open(dst + ".tmp", "wb") as g:
            g.writelines(lines)
        os.rename(dst + ".tmp", dst)
    return dst


def prepare(name: str) -> dict:
    """Ingest (once) the training store and the evaluation store of a set; returns where to evaluate."""
    from pipeline.ingest import IngestOptions, ingest

    d = out_dir() / "defaults"
    d.mkdir(parents=True, exist_ok=True)
    train, test = (os.path.join(DATA, p) if p else None for p in SETS[name])
    if name in SHUFFLE:
        train = _shuffled(train, str(d / f"{name}.shuffled.svm"))
    tr_store, te_store = str(d / f"{name}-train.zarr"), str(d / f"{name}-test.zarr")
    width_file = d / f"{name}.width"
    if not width_file.exists():
        width_file.write_text(str(max(_max_index(train), _max_index(test) if test else 0)))
    p = int(width_file.read_text())
    block_mb = max(os.path.getsize(train) / BLOCKS / 1e6, 0.005)
    if not os.path.exists(tr_store):
        ingest([train], tr_store, IngestOptions(block_mb=block_mb, holdout=0.0 if test else HOLDOUT, seed=SEED,
                                               n_features=p), client=None)
    if test and not os.path.exists(te_store):
        ingest([test], te_store, IngestOptions(block_mb=64.0, holdout=0.0, n_features=p), client=None)
    if test:
        return {"train": tr_store, "eval_store": te_store, "split": "all", "evaluated_on": "test file"}
    return {"train": tr_store, "eval_store": tr_store, "split": "holdout", "evaluated_on": f"holdout ({HOLDOUT:.0%} of blocks)"}


def _rows(store: str, split: str):
    import scipy.sparse as sp

    from pipeline.store.reader import open_store

    st = open_store(store)
    blocks = list(st.blocks(split))
    return sp.vstack([b.X for b in blocks]).tocsr(), np.concatenate([b.y for b in blocks])


# ---------------------------------------------------------------------------------------------- runs
_CACHE: dict = {}


def run_fit(where: dict, algo: str, opts: dict, refit: dict | None = None) -> dict:
    """Train in-process (then refit on the support when ``refit`` is a dict: ``train --refit``) and evaluate;
    identical resolved options are trained once."""
    from pipeline.algorithms import make_algorithm
    from pipeline.evaluate import evaluate_store
    from pipeline.train import fit

    key = (where["train"], algo, json.dumps(dataclasses.asdict(make_algorithm(algo, dict(opts)).params),
                                           sort_keys=True, default=str), json.dumps(refit, sort_keys=True))
    if key in _CACHE:
        return {**_CACHE[key], "options": dict(opts)}
    c0, t0 = time.process_time(), time.perf_counter()
    m = fit(where["train"], algo, dict(opts), passes=PASSES, paths=PATHS, seed=TRAIN_SEED, client=None,
            evaluate=False, refit=refit)
    r = evaluate_store(m, where["eval_store"], where["split"])
    res = {"algo": algo, "options": dict(opts), "error": r["error"], "auc": r["auc"], "logloss": r["logloss"],
           "density": m.density, "nnz": m.nnz, "resolved": m.meta["hyper"].get("resolved"),
           "cpu_s": round(time.process_time() - c0, 3), "wall_s": round(time.perf_counter() - t0, 3)}
    _CACHE[key] = res
    return res


def liblinear(where: dict) -> list[dict]:
    X, y = _rows(where["train"], "train")
    Xt, yt = _rows(where["eval_store"], where["split"])
    out = []
    for C in LL_C:
        c0 = time.process_time()
        clf = l1_logistic(C, random_state=0)  # max_iter 100 (the default)
        clf.fit(X, y)
        f = clf.decision_function(Xt)
        nnz = int(np.count_nonzero(clf.coef_))
        out.append({"C": C, "error": float(np.mean(yt * f <= 0)), "density": nnz / X.shape[1], "nnz": nnz,
                    "n_iter": int(np.max(clf.n_iter_)), "cpu_s": round(time.process_time() - c0, 3)})
    return out


def liblinear_cached(name: str, where: dict) -> list[dict]:
    """:func:`liblinear` of a set, cached in bench-out/defaults/NAME.liblinear.json (keyed by the C grid; delete the
    file to recompute)."""
    cached = out_dir() / "defaults" / f"{name}.liblinear.json"
    ll = json.loads(cached.read_text()) if cached.exists() else None
    if not ll or [r["C"] for r in ll] != list(LL_C):
        ll = liblinear(where)
        cached.write_text(json.dumps(ll))
    return ll


def penalty_units(store: str, best_C: float) -> dict:
    """LIBLINEAR's best penalty λ = 1/(C·n) on a store's training rows against stsgd's default penalty in the unit
    it is resolved in (λ_eff = l1·rms(x), scale "data") and glmnet's λ_max = max_j |Σ_i x_ij (y_i − ȳ)| / n."""
    from pipeline.algorithms.stsgd import STSGDParams
    from pipeline.store.reader import open_store
    from pipeline.store.stats import data_scale

    X, y = _rows(store, "train")
    n = X.shape[0]
    y01 = (y > 0).astype(np.float64)
    lam_max = float(np.abs(X.T @ (y01 - y01.mean())).max() / n)
    x_rms = data_scale(open_store(store))["x_rms"]
    lam_eff, best = STSGDParams().l1 * x_rms, 1.0 / (best_C * n)
    return {"rows": n, "lambda_eff": lam_eff, "liblinear_C": best_C, "lambda_best": best,
            "eff_over_best": lam_eff / best, "best_over_lambda_max": best / lam_max, "best_over_x_rms": best / x_rms}


def penalty_report(names, extra: list[str]) -> None:
    """``--penalty-units``: :func:`penalty_units` of each set (its LIBLINEAR best C from the study's grid) and of each
    ``STORE:C`` in ``extra`` (e.g. benchmarks.learning's 35k store at its best C)."""
    rows = []
    for name in names:
        where = prepare(name)
        rows.append({"set": name, **penalty_units(where["train"], _best(liblinear_cached(name, where))["C"])})
    for spec in extra:
        store, _, C = spec.rpartition(":")
        rows.append({"set": store, **penalty_units(store, float(C))})
    report("defaults_penalty_units", {"results": rows}, rows)


def _best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: (r["error"], r["density"]))


def _matched(ll: list[dict], density: float) -> dict:
    lg = lambda d: math.log(max(d, 1e-9))  # noqa: E731
    return min(ll, key=lambda r: (abs(lg(r["density"]) - lg(density)), r["error"]))


def study_set(name: str, losses, log) -> dict:
    where = prepare(name)
    from pipeline.store.reader import open_store

    st = open_store(where["train"])
    info = {"set": name, **where, "train_rows": sum(e["rows"] for e in st.entries("train")),
            "n_features": st.n_features}
    c0 = time.process_time()
    info["liblinear"] = liblinear_cached(name, where)
    info["liblinear_cpu_s"] = round(time.process_time() - c0, 2)
    ll_best = _best(info["liblinear"])
    log(f"{name}: LIBLINEAR best {ll_best['error']:.4f} at C={ll_best['C']} density {ll_best['density']:.4f}")
    info["losses"] = {}
    for loss in losses:
        c0 = time.process_time()
        r = {}
        r["tg"] = [run_fit(where, "tg", {"loss": loss, "eta": e, "gravity": g, **TG_LITERAL}) for e in TG_ETAS for g in TG_GRAVITIES]
        tg_best = _best(r["tg"])
        r["tg_best"] = tg_best
        r["tg_sparse"] = min((x for x in r["tg"] if x["error"] <= tg_best["error"] + 0.01),
                             key=lambda x: (x["density"], x["error"]))
        r["tg_default"] = run_fit(where, "tg", {"loss": loss})  # tg's own defaults (scale "data")
        r["stsgd_default"] = run_fit(where, "stsgd", {"loss": loss})
        r["stsgd_grid"] = [run_fit(where, "stsgd", {"loss": loss, "l1": l1, "K": K}) for l1 in STSGD_L1 for K in STSGD_K]
        r["ftrl_default"] = run_fit(where, "ftrl", {"loss": loss})
        r["ftrl_grid"] = [run_fit(where, "ftrl", {"loss": loss, "l1": l1}) for l1 in FTRL_L1]
        r["stsgd_refit"] = run_fit(where, "stsgd", {"loss": loss}, refit={})
        r["ftrl_refit"] = run_fit(where, "ftrl", {"loss": loss}, refit={})
        sd, fd = r["stsgd_default"], r["ftrl_default"]
        for k in ("stsgd", "ftrl", "stsgd_refit", "ftrl_refit"):
            r[f"ll_matched_{k}"] = _matched(info["liblinear"], r.get(k + "_default", r.get(k))["density"])
        cands = tuple((k.replace("_refit", "+refit"), r.get(k + "_default", r.get(k)), r[f"ll_matched_{k}"])
                      for k in ("stsgd", "ftrl", "stsgd_refit", "ftrl_refit"))
        sparse = [c for c in cands if c[1]["density"] <= 0.02]  # "at matched density (<= 2%)"
        ours = min(sparse or cands, key=lambda t: (t[1]["error"], t[1]["density"]))
        r["best_default"] = ours[0] if sparse else "none <= 2%"
        r["check_stsgd_vs_tg"] = bool(sd["error"] <= tg_best["error"] + 0.01 and sd["density"] <= tg_best["density"] / 2)
        sr = r["stsgd_refit"]
        r["check_stsgd_refit_vs_tg"] = bool(sr["error"] <= tg_best["error"] + 0.01
                                            and sr["density"] <= tg_best["density"] / 2)
        r["check_ours_vs_ll"] = bool(sparse and ours[1]["error"] <= ours[2]["error"] + 0.01)
        # the default --algo (stsgd, refitted) against the former one (tg), both with their defaults
        r["check_default_algo"] = bool(sr["error"] <= r["tg_default"]["error"])
        r["cpu_s"] = round(time.process_time() - c0, 2)
        info["losses"][loss] = r
        log(f"{name}/{loss}: tg best {tg_best['error']:.4f} d={tg_best['density']:.4f} | stsgd {sd['error']:.4f} "
            f"d={sd['density']:.4f} | ftrl {fd['error']:.4f} d={fd['density']:.4f} | stsgd+refit "
            f"{sr['error']:.4f} d={sr['density']:.4f} | ftrl+refit {r['ftrl_refit']['error']:.4f} "
            f"d={r['ftrl_refit']['density']:.4f} | {r['cpu_s']} s CPU")
    return info


# ---------------------------------------------------------------------------------------------- LOSO
def loso(sets: dict) -> list[dict]:
    grid = [(l1, K) for l1 in STSGD_L1 for K in STSGD_K]

    def units(names):
        for n in names:
            for loss, r in sets[n]["losses"].items():
                tb = r["tg_best"]
                by = {(g["options"]["l1"], g["options"]["K"]): g for g in r["stsgd_grid"]}
                yield n, loss, tb, by

    def score(setting, names):
        feas, gaps = 0, []
        for _, _, tb, by in units(names):
            g = by[setting]
            feas += g["density"] <= tb["density"] / 2
            gaps.append(g["error"] - tb["error"])
        return (-feas, float(np.mean(gaps)))

    out = []
    names = list(sets)
    for left in names:
        rest = [n for n in names if n != left]
        if not rest:
            continue
        scores = {s: score(s, rest) for s in grid}
        choice = min(grid, key=lambda s: scores[s])
        n_units = sum(1 for _ in units(rest))
        for n, loss, tb, by in units([left]):
            g = by[choice]
            out.append({"left_out": left, "loss": loss, "l1": choice[0], "K": choice[1],
                        "feasible_on_rest": f"{-scores[choice][0]}/{n_units}",
                        "mean_gap_rest_pt": round(100 * scores[choice][1], 2),
                        "error_%": round(100 * g["error"], 2), "density_%": round(100 * g["density"], 3),
                        "tg_best_error_%": round(100 * tb["error"], 2), "tg_best_density_%": round(100 * tb["density"], 3),
                        "within_1pt": "yes" if g["error"] <= tb["error"] + 0.01 else "no",
                        "half_density": "yes" if g["density"] <= tb["density"] / 2 else "no"})
    # every grid setting on all sets, then the choice on all sets (the recommendation)
    for s_ in grid:
        sc = score(s_, names)
        out.append({"left_out": "(none: all sets)", "loss": "both", "l1": s_[0], "K": s_[1],
                    "feasible_on_rest": f"{-sc[0]}/{sum(1 for _ in units(names))}",
                    "mean_gap_rest_pt": round(100 * sc[1], 2)})
    if names:
        scores = {s: score(s, names) for s in grid}
        choice = min(grid, key=lambda s: scores[s])
        out.append({"left_out": "chosen on all sets", "loss": "both", "l1": choice[0], "K": choice[1],
                    "feasible_on_rest": f"{-scores[choice][0]}/{sum(1 for _ in units(names))}",
                    "mean_gap_rest_pt": round(100 * scores[choice][1], 2)})
    return out


# ---------------------------------------------------------------------------------------------- table
def _e(r):
    return f"{100 * r['error']:.2f}"


def _d(r):
    return f"{100 * r['density']:.3g}"


def table(sets: dict) -> list[dict]:
    rows = []
    for n, info in sets.items():
        llb = _best(info["liblinear"])
        for loss, r in info["losses"].items():
            sd, fd, tb, ts = r["stsgd_default"], r["ftrl_default"], r["tg_best"], r["tg_sparse"]
            ms, mf = r["ll_matched_stsgd"], r["ll_matched_ftrl"]
            rows.append({
                "set": n, "eval": "test" if info["split"] == "all" else "holdout", "loss": loss,
                "stsgd def err% (dens%)": f"{_e(sd)} ({_d(sd)})",
                "tg def err% (dens%)": f"{_e(r['tg_default'])} ({_d(r['tg_default'])})",
                "tg best err% (dens%) [eta, g]": f"{_e(tb)} ({_d(tb)}) [{tb['options']['eta']:g}, {tb['options']['gravity']:g}]",
                "tg sparsest ≤1pt [eta, g]": f"{_e(ts)} ({_d(ts)}) [{ts['options']['eta']:g}, {ts['options']['gravity']:g}]",
                "ftrl def err% (dens%)": f"{_e(fd)} ({_d(fd)})",
                "stsgd+refit err% (dens%)": f"{_e(r['stsgd_refit'])} ({_d(r['stsgd_refit'])})",
                "ftrl+refit err% (dens%)": f"{_e(r['ftrl_refit'])} ({_d(r['ftrl_refit'])})",
                "LL best err% (dens%) [C]": f"{_e(llb)} ({_d(llb)}) [{llb['C']:g}]",
                "LL@stsgd dens": f"{_e(ms)} ({_d(ms)})",
                "LL@ftrl dens": f"{_e(mf)} ({_d(mf)})",
                "stsgd≤tg+1 at ≤½ dens": "yes" if r["check_stsgd_vs_tg"] else "no",
                "stsgd+refit≤tg+1 at ≤½ dens": "yes" if r["check_stsgd_refit_vs_tg"] else "no",
                "best def at ≤2% ≤ LL@dens+1": ("yes" if r["check_ours_vs_ll"] else "no") + f" ({r['best_default']})",
                "stsgd+refit ≤ tg def": "yes" if r["check_default_algo"] else "no",
            })
    return rows


def main(argv=None):
    global TRAIN_SEED, PASSES
    from pipeline.algorithms.ftrl import FTRLParams
    from pipeline.algorithms.stsgd import STSGDParams

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--losses", default=",".join(LOSSES))
    ap.add_argument("--name", default="defaults")
    ap.add_argument("--train-seed", type=int, default=SEED,
                    help="seed of our algorithms' block and row orders only (same stores, holdouts, LIBLINEAR)")
    ap.add_argument("--passes", type=int, default=PASSES, help=f"passes of every fit of ours (the study's: {PASSES})")
    ap.add_argument("--penalty-units", nargs="*", metavar="STORE:C",
                    help="only report each set's best penalty in three units (plus these stores at their best C)")
    a = ap.parse_args(argv)
    if a.penalty_units is not None:
        return penalty_report([s for s in a.sets.split(",") if s], a.penalty_units)
    TRAIN_SEED, PASSES = a.train_seed, a.passes
    names = [s for s in a.sets.split(",") if s]
    losses = [s for s in a.losses.split(",") if s]
    c0, t0 = time.process_time(), time.perf_counter()
    stsgd_defaults = dataclasses.asdict(STSGDParams())
    ftrl_defaults = dataclasses.asdict(FTRLParams())
    print("stsgd defaults:", json.dumps(stsgd_defaults), flush=True)
    print("ftrl defaults:", json.dumps(ftrl_defaults), flush=True)
    log = lambda s: print(f"[{time.perf_counter() - t0:7.1f}s] {s}", flush=True)  # noqa: E731
    sets = {n: study_set(n, losses, log) for n in names}
    lo = loso(sets)
    rows = table(sets)
    checks = {n: {loss: {"stsgd_vs_tg": r["check_stsgd_vs_tg"], "stsgd_refit_vs_tg": r["check_stsgd_refit_vs_tg"],
                         "ours_vs_liblinear": r["check_ours_vs_ll"],
                         "default_algo_vs_tg_default": r["check_default_algo"]}
                  for loss, r in info["losses"].items()} for n, info in sets.items()}
    report(a.name, {"settings": {"passes": PASSES, "paths": PATHS, "seed": SEED, "train_seed": a.train_seed,
                                 "tg_etas": TG_ETAS,
                                 "tg_gravities": TG_GRAVITIES, "stsgd_l1": STSGD_L1, "stsgd_K": STSGD_K,
                                 "ftrl_l1": FTRL_L1, "liblinear_C": LL_C, "blocks": BLOCKS, "holdout": HOLDOUT},
                    "stsgd_defaults": stsgd_defaults, "ftrl_defaults": ftrl_defaults, "checks": checks,
                    "loso": lo, "sets": sets, "cpu_s": round(time.process_time() - c0, 1),
                    "wall_s": round(time.perf_counter() - t0, 1)}, rows)
    report(a.name + "_loso", {"loso": lo}, lo)
    print(f"stsgd defaults: {json.dumps(stsgd_defaults)}")
    print(f"CPU {time.process_time() - c0:.1f} s, wall {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
