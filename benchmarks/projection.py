"""Benchmark of the L1 projections of pipeline.kernels.projection (ALGORITHMS.md §4).

* dense: time vs n for the sort kernel (Fig. 1), the randomized-pivot kernel (Fig. 2) and a plain NumPy
  full-sort reference; log-log slope over n ≥ 1e4 (pivot should be ≈ 1, sort slightly above 1);
* tree: time per sparse step ``w ← P_{L1,z}(w + g)`` vs k (non-zeros of g) at fixed p and vs p at fixed k,
  with the tree pre-populated with p live coordinates; slope vs k ≈ 1, vs p ≈ 0 (log p, plus cache misses).

Usage: ``python benchmarks/projection.py [--max-n 1e7] [--max-p 1e7] [--json out.json]``.
Prints one JSON object and markdown tables.
"""
import argparse
import json
import math
import os
import sys
import time

import numba
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pipeline.kernels import projection as P  # noqa: E402


def numpy_l1_reference(v, z):
    """Plain full-sort NumPy projection (Duchi Fig. 1 vectorised)."""
    u = np.abs(v)
    if u.sum() <= z:
        return v.copy()
    mu = np.sort(u)[::-1]
    cs = np.cumsum(mu)
    j = np.arange(1, u.size + 1)
    rho = np.nonzero(mu - (cs - z) / j > 0)[0][-1] + 1
    th = (cs[rho - 1] - z) / rho
    return np.sign(v) * np.maximum(u - th, 0.0)


def best_time(fn, reps):
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def slope(xs, ys):
    lx = np.log(np.asarray(xs, float))
    ly = np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0]) if len(xs) >= 2 else float("nan")


def bench_dense(ns, rng):
    rows = []
    for n in ns:
        v = rng.normal(size=n)
        z = 0.1 * float(np.abs(v).sum())
        out = np.empty(n)
        scratch = np.empty(n)
        reps = max(2, min(50, int(2e6 // n)))
        t_sort = best_time(lambda: P.l1_project_sort_kernel(v, z, out), reps)
        t_piv = best_time(lambda: P.l1_project_pivot_kernel(v, z, out, scratch, 1), reps)
        t_wrap = best_time(lambda: P.project_l1_sort(v, z), reps)
        t_np = best_time(lambda: numpy_l1_reference(v, z), reps)
        rows.append({"n": n, "sort_s": t_sort, "sort_wrapper_s": t_wrap, "pivot_s": t_piv, "numpy_sort_s": t_np})
        print(f"  dense n={n:.0e}: sort {t_sort:.3e}s wrapper {t_wrap:.3e}s pivot {t_piv:.3e}s numpy {t_np:.3e}s",
              file=sys.stderr)
    big = [r for r in rows if r["n"] >= 1e4]
    slopes = {k: slope([r["n"] for r in big], [r[k] for r in big]) for k in ("sort_s", "sort_wrapper_s", "pivot_s", "numpy_sort_s")}
    return rows, slopes


@numba.njit(nogil=True)
def _drive(fnode, inode, sgn, fsc, isc, IDX, VALS, z):
    nproj = 0
    for s in range(IDX.shape[0]):
        nproj += P.l1tree_add_project(fnode, inode, sgn, fsc, isc, IDX[s], VALS[s], z)
    return nproj


def tree_step_time(p, k, rng, budget_steps):
    """Seconds per sparse step on a tree pre-populated with all p coordinates live (‖w‖₁ = z)."""
    z = 100.0
    w0 = rng.exponential(size=p) * rng.choice([-1.0, 1.0], size=p)
    w0 *= z / np.abs(w0).sum()
    st = P.l1tree_from_dense(w0, seed=3)
    mean_mag = z / p
    steps = int(max(200, min(20000, budget_steps // k)))
    IDX = rng.integers(0, p, size=(steps, k)).astype(np.int64)
    VALS = rng.normal(size=(steps, k)) * mean_mag  # steps of the size of a typical weight
    _drive(*st, IDX[:10], VALS[:10], z)  # warm caches of this state
    t0 = time.perf_counter()
    nproj = _drive(*st, IDX[10:], VALS[10:], z)
    dt = (time.perf_counter() - t0) / (steps - 10)
    root = int(st.isc[P.ISC_ROOT])
    return {
        "p": p,
        "k": k,
        "steps": steps - 10,
        "step_s": dt,
        "projected_frac": nproj / (steps - 10),
        "tree_nodes": int(st.inode[root, P.I_SIZE]) if root >= 0 else 0,
        "nnz": int(st.isc[P.ISC_NNZ]),
        "ns_per_k_log2p": dt / (k * math.log2(p)) * 1e9,
    }


def bench_tree(ps, ks, p_fixed, k_fixed, rng):
    by_k = []
    for k in ks:
        r = tree_step_time(p_fixed, k, rng, budget_steps=400_000)
        by_k.append(r)
        print(f"  tree p={p_fixed:.0e} k={k}: {r['step_s']:.3e}s/step", file=sys.stderr)
    by_p = []
    for p in ps:
        r = tree_step_time(p, k_fixed, rng, budget_steps=400_000)
        by_p.append(r)
        print(f"  tree p={p:.0e} k={k_fixed}: {r['step_s']:.3e}s/step", file=sys.stderr)
    slopes = {
        "vs_k": slope([r["k"] for r in by_k], [r["step_s"] for r in by_k]),
        "vs_p": slope([r["p"] for r in by_p], [r["step_s"] for r in by_p]),
    }
    return by_k, by_p, slopes


def markdown(res):
    out = ["### Dense projection onto the L1 ball (best of reps, seconds)", ""]
    out.append(
        "| n | sort kernel (numba np.sort, Fig. 1) | project_l1_sort (NumPy sort + numba scan) "
        "| pivot kernel (Fig. 2) | NumPy full-sort reference | NumPy / pivot |"
    )
    out.append("|---:|---:|---:|---:|---:|---:|")
    for r in res["dense"]:
        out.append(
            f"| {r['n']:.0e} | {r['sort_s']:.3e} | {r['sort_wrapper_s']:.3e} | {r['pivot_s']:.3e} "
            f"| {r['numpy_sort_s']:.3e} | {r['numpy_sort_s'] / r['pivot_s']:.1f}× |"
        )
    s = res["dense_slopes"]
    out.append(
        f"| **log-log slope (n ≥ 1e4)** | {s['sort_s']:.2f} | {s['sort_wrapper_s']:.2f} | {s['pivot_s']:.2f} "
        f"| {s['numpy_sort_s']:.2f} | |"
    )
    out += ["", f"### Sparse online tree: seconds per step w ← P(w + g), p = {res['p_fixed']:.0e}, varying k", ""]
    out.append("| k | s/step | ns / (k·log₂p) | projected | tree nodes | nnz(w) |")
    out.append("|---:|---:|---:|---:|---:|---:|")
    for r in res["tree_by_k"]:
        out.append(
            f"| {r['k']} | {r['step_s']:.3e} | {r['ns_per_k_log2p']:.1f} | {r['projected_frac']:.2f} "
            f"| {r['tree_nodes']} | {r['nnz']} |"
        )
    out.append(f"| **log-log slope vs k** | {res['tree_slopes']['vs_k']:.2f} | | | | |")
    out += ["", f"### Sparse online tree: varying p, k = {res['k_fixed']} (dense pivot on p for comparison)", ""]
    out.append("| p | s/step | ns / (k·log₂p) | dense pivot s | dense / tree | tree nodes | nnz(w) |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|")
    dense = {r["n"]: r["pivot_s"] for r in res["dense"]}
    for r in res["tree_by_p"]:
        d = dense.get(r["p"])
        ds = f"{d:.3e}" if d else "–"
        ratio = f"{d / r['step_s']:.0f}×" if d else "–"
        out.append(
            f"| {r['p']:.0e} | {r['step_s']:.3e} | {r['ns_per_k_log2p']:.1f} | {ds} | {ratio} "
            f"| {r['tree_nodes']} | {r['nnz']} |"
        )
    out.append(f"| **log-log slope vs p** | {res['tree_slopes']['vs_p']:.2f} | | | | | |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-n", type=float, default=1e7)
    ap.add_argument("--max-p", type=float, default=1e7)
    ap.add_argument("--p-fixed", type=float, default=1e6)
    ap.add_argument("--k-fixed", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the JSON result here")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    # compile / load the kernels outside the timings
    v = rng.normal(size=100)
    P.l1_project_sort_kernel(v, 1.0, np.empty(100))
    P.l1_project_pivot_kernel(v, 1.0, np.empty(100), np.empty(100), 0)
    tree_step_time(1000, 4, rng, 1000)

    t0 = time.perf_counter()
    ns = [int(10**e) for e in range(3, int(round(math.log10(args.max_n))) + 1)]
    dense, dense_slopes = bench_dense(ns, rng)
    ps = [int(10**e) for e in range(3, int(round(math.log10(args.max_p))) + 1)]
    ks = [1, 4, 16, 64, 256, 1024]
    by_k, by_p, tree_slopes = bench_tree(ps, ks, int(args.p_fixed), args.k_fixed, rng)
    res = {
        "machine": {"cpus": os.cpu_count(), "numba": numba.__version__, "numpy": np.__version__},
        "dense": dense,
        "dense_slopes": dense_slopes,
        "p_fixed": int(args.p_fixed),
        "k_fixed": args.k_fixed,
        "tree_by_k": by_k,
        "tree_by_p": by_p,
        "tree_slopes": tree_slopes,
        "wall_s": time.perf_counter() - t0,
    }
    print(json.dumps(res, indent=1))
    print()
    print(markdown(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
