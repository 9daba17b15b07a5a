"""Throughput at scale (issue 13 §2): seconds per pass per billion non-zeros, tight loop vs kernel vs command vs VW.

    python -m benchmarks.throughput [--store S] [--src S.svm] [--workers 2] [--algos tg,stsgd] [--reps 2]
                                    [--command-reps 1] [--skip tight,kernel,command,vw] [--vw-l1 1e-6] [--work DIR]

Four measurements on the same training rows of one store (default: the learning benchmark's 35k-row
full-width webspam-like store, bench-out/learning/ws_35000_11.zarr: ~115M training non-zeros over 16,609,143
features). At that width the weight vector (133 MB in float64) is far larger than any cache, so the random
access of each non-zero into it costs what it costs at the full 350k rows: per non-zero figures carry over
to full scale.

1. tight loop: :func:`logistic_sgd`, a plain logistic SGD (constant step, plain bias, no truncation) in one
   numba loop in one process over the training blocks' CSR arrays (indptr int64, indices int32, data float32,
   labels), dense weights over the full width, float64 and float32; the blocks are decoded into memory once
   first, so only the arithmetic and the memory traffic are timed: the physical limit of one core here (a
   third variant prefetches w ahead in the scoring sweep, as TG's kernel does since this benchmark found
   that the plain loops leave most of the memory parallelism unused); with ``--workers`` W > 1 also the float64
   loop on W threads at once, each over every W-th block with its own w (:func:`tight_every_core`): the per-core
   limit when every core works, as in the W-worker command (the target's ratio stays against the loop alone);
2. our kernel alone: each algorithm of ``--algos`` with its default hyper-parameters (scale "data", resolved
   on the store), one path, through ``Algorithm.advance`` exactly as the engine calls it, on the same
   in-memory blocks, in one process, rows in block order and (second figure) in the engine's order (shuffle
   window of 4 blocks, merged beforehand); the working state's pages are touched before timing and the
   end-of-stage flush (O(p)) is timed on its own;
3. the whole command: ``sparsepipe train STORE --algo A --passes P --workers W`` for P = 1 and 3 (``--no-refit``
   where the algorithm refits by default: the refit is not a pass, benchmarks.webspam times it); the marginal
   pass is (t3 − t1) / 2, wall and core-seconds (W workers: ×W); beside it the seconds the command itself
   reports for its passes 2 and 3 (one process each, so free of the start-up noise of two runs; holdout
   metrics included) and for its pass 1 (STSGD's later passes read only the entries of features still in Ω, so
   its first pass is the dearest), and the engine's copy / read / kernel split per worker;
4. Vowpal Wabbit (logistic, --l1, -b 24) on the same training rows (benchmarks.webspam's FIFO feed): one
   text pass writing the cache, then ``--passes 1`` and ``--passes 3`` from the cache; marginal (t3 − t1) / 2;
   VW counts as one core (its CPU time, parser thread included, is reported beside it);
5. the layout probe (``--skip layout`` to leave it out): the same blocks with feature ids renumbered by
   descending frequency (:func:`renumber_by_frequency`, in place, after 1 and 2: each row's entries re-sorted),
   then the f64 tight loop and each kernel again in block order. What a store written in that order would gain:
   the hot features share cache lines and fit the last-level cache; a weight vector in ingest's order scatters
   them over the whole width. The renumbering's own time is reported (a per-pass remap at read time would cost
   at least its gather).

Reported: non-zeros per second per core of each, and the ratios to the targets (ours per core ≥ 3x VW per
core, ≥ 60% of the tight loop per core). The 1-minute load average is recorded with every measurement.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

from benchmarks.common import algo_specs, out_dir, report, spec_name
from pipeline.kernels.intrinsics import base, prefetch
from pipeline.kernels.losses import LOGISTIC, dloss
from pipeline.kernels.sgd import PREFETCH_DISTANCE, row_dot

@numba.njit(nogil=True, cache=True)
def logistic_sgd(indptr, indices, data, y, rows, w, bstate, eta, ahead=0):
    """Plain logistic SGD over the rows ``rows`` of one CSR block: per row f = w·x + b, d = ℓ'(f, y), w_j ← w_j −
    η·d·x_j on nz(x), b ← b − η·d (constant η; ``bstate`` = [b], float64[1]). ``w`` float64 or float32,
    C-contiguous (the product w_j·x_j in w's type, the sum in float64). The reference the other figures are
    compared with: two passes over the row's entries, one random access into w per entry and pass. ``ahead`` > 0:
    the scoring sweep prefetches w of the entry that many positions ahead (as TG's kernel does,
    pipeline.kernels.sgd.PREFETCH_DISTANCE); the arithmetic is the same. The entries and w are read through raw
    pointers (here and in ``row_dot``), as the kernels it is compared with read theirs (numba's array indexing
    wraps a negative index around at every access; until the twenty-eighth session this loop paid that and ours
    did not, which flattered the ratios against it)."""
    b = bstate[0]
    wp = base(w)
    ip = base(indices)
    vp = base(data)
    for r in range(rows.shape[0]):
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        if ahead > 0:
            for k in range(lo, min(lo + ahead, hi)):
                prefetch(wp, ip[k])
            acc = 0.0
            for k in range(lo, hi):
                if k + ahead < hi:
                    prefetch(wp, ip[k + ahead])
                acc += wp[ip[k]] * vp[k]
        else:
            acc = row_dot(w, indices, data, lo, hi)
        d = dloss(acc + b, y[i], LOGISTIC, False)
        step = eta * d
        for k in range(lo, hi):
            wp[ip[k]] -= step * vp[k]
        b -= step
    bstate[0] = b


@numba.njit(nogil=True, cache=True)
def _renumber_rows(indptr, indices, data, new_id):
    """indices ← new_id[indices] in place, each row's entries (and their values) re-sorted by the new ids."""
    for i in range(indptr.shape[0] - 1):
        lo, hi = indptr[i], indptr[i + 1]
        ix = new_id[indices[lo:hi]]
        o = np.argsort(ix)
        dx = data[lo:hi][o]
        indices[lo:hi] = ix[o]
        data[lo:hi] = dx


def renumber_by_frequency(blocks, p: int, count=None) -> float:
    """Renumber the feature ids of ``blocks`` in place so that id 0 is the most frequent feature, 1 the next, ...
    (ties in id order) by ``count`` (per feature; counted over the blocks when None: a store's training blocks
    have theirs in its statistics); returns the seconds the counting (if any) and renumbering took."""
    t0 = time.perf_counter()
    if count is None:
        count = np.zeros(p, np.int64)
        for b in blocks:
            count += np.bincount(b[1], minlength=p)
    new_id = np.empty(p, np.int32)
    new_id[np.argsort(-count, kind="stable")] = np.arange(p, dtype=np.int32)
    for ip, ix, x, _ in blocks:
        _renumber_rows(ip, ix, x, new_id)
    return time.perf_counter() - t0


def load(store_path: str):
    """The store's training blocks decoded into memory: [(indptr, indices, data, y)], the store, and nnz."""
    from pipeline.store.reader import open_store

    st = open_store(store_path)
    blocks = [(b.indptr, b.indices, b.data, b.y) for b in st.blocks("train")]
    return blocks, st, int(sum(b[0][-1] for b in blocks))


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def _sweep(blocks, w, b, eta: float, ahead: int = 0) -> None:
    """:func:`logistic_sgd` over every row of ``blocks`` in block order, into ``w`` and ``b``."""
    for ip, ix, x, y in blocks:
        logistic_sgd(ip, ix, x, y, np.arange(y.shape[0], dtype=np.int64), w, b, eta, ahead)


def _loop_row(what: str, run, reps: int, nnz: int, cores: int, ws: list) -> dict:
    """``run()`` timed ``reps`` times (the best counts) as a row of the table: a pass over ``nnz`` entries on
    ``cores`` cores, whose weights ``ws`` must stay finite."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    s = min(times)
    return {"what": what, "seconds": round(s, 3), "runs_s": [round(t, 3) for t in times],
            **per_pass(nnz, s, cores), "load1": load1(), "finite": bool(all(np.isfinite(w).all() for w in ws))}


def tight(blocks, nnz: int, p: int, eta: float, reps: int) -> list[dict]:
    """The tight loop over every training row in block order: float64 and float32 weights, and float64 with the
    prefetch TG's kernel uses (best of ``reps``)."""
    out = []
    small = blocks[0][0][:3]
    for dt, ahead in ((np.float64, 0), (np.float32, 0), (np.float64, PREFETCH_DISTANCE)):
        w = np.zeros(p, dt)  # every page touched before timing
        b = np.zeros(1)
        logistic_sgd(small, blocks[0][1], blocks[0][2], blocks[0][3], np.arange(2, dtype=np.int64), w, b, eta, ahead)
        what = f"tight loop, w {np.dtype(dt).name}" + (f", prefetch {ahead} ahead" if ahead else "")
        out.append(_loop_row(what, lambda: _sweep(blocks, w, b, eta, ahead), reps, nnz, 1, [w]))
    return out


def tight_every_core(blocks, nnz: int, p: int, eta: float, reps: int, cores: int) -> dict:
    """The float64 tight loop on ``cores`` threads at once, each with its own w over every ``cores``-th block (the
    split the paths of ``train --workers cores`` make; the loop releases the GIL): the per-core limit when every
    core works, as in the command it is compared with. The single-thread figure has the machine's shared cache and
    memory bandwidth to itself; this one shows what sharing them costs (best of ``reps``)."""
    from concurrent.futures import ThreadPoolExecutor

    ws, bs = [np.zeros(p) for _ in range(cores)], [np.zeros(1) for _ in range(cores)]
    with ThreadPoolExecutor(cores) as pool:
        return _loop_row(f"tight loop, w float64, {cores} cores at once",
                         lambda: list(pool.map(lambda c: _sweep(blocks[c::cores], ws[c], bs[c], eta), range(cores))),
                         reps, nnz, cores, ws)


def _touched(algo, state: dict) -> dict:
    """The stage's working arrays of ``state`` with every page written once (bits unchanged), so the timing
    leaves out the first-touch page faults the engine counts as its copy."""
    state = algo.working_state(state)
    for a in state.values():
        if isinstance(a, np.ndarray) and a.nbytes >= 1 << 20:
            a.reshape(-1).view(np.uint8)[::4096] |= 0
    return state


def kernel(blocks, st, nnz: int, reps: int, name: str = "tg", window: int = 4,
           orders=("block order", "engine order (window 4)"), tag: str = "") -> tuple[list[dict], float]:
    """The algorithm's kernel (defaults, one path) through ``Algorithm.advance`` as the engine calls it, one
    process; each rep is a first pass (a fresh state) over every training row as one stage, timed without the
    stage end (flush, timed apart)."""
    from pipeline.algorithms import make_algorithm
    from pipeline.engine import merge_blocks, path_blocks, row_order
    from pipeline.store.stats import calibrate

    algo = make_algorithm(name, {})
    calibrate(algo, st)
    p = st.n_features
    # the engine's order for path 0 of 1, pass 0: groups of `window` blocks merged, rows permuted across them
    order = path_blocks(0, 0, 0, 1, len(blocks), algo.path_mode)
    groups = [merge_blocks([blocks[int(g)] for g in order[i:i + window]]) for i in range(0, len(order), window)]
    rows_eng = [row_order(0, 0, 0, int(order[i]), g[3].shape[0], window)
                for i, g in zip(range(0, len(order), window), groups)]
    out = []
    for label, data, rows in (("block order", blocks, [np.arange(b[3].shape[0], dtype=np.int64) for b in blocks]),
                              ("engine order (window 4)", groups, rows_eng)):
        if label not in orders:
            continue
        times, flush = [], []
        for _ in range(reps):
            state = _touched(algo, algo.init_path(p, 0))
            t0 = time.perf_counter()
            for (ip, ix, x, y), r in zip(data, rows):
                algo.advance(state, ip, ix, x, y, r, 0, 0)
            t1 = time.perf_counter()
            algo.end_stage(state)
            times.append(t1 - t0)
            flush.append(time.perf_counter() - t1)
            state = algo.settle(state)
        nnz_w = np.count_nonzero(state["w"]) if "w" in state else len(state.get("w_idx", ()))
        s = min(times)
        out.append({"what": f"{name} kernel alone, {label}{tag}", "seconds": round(s, 3),
                    "runs_s": [round(t, 3) for t in times], "flush_s": round(min(flush), 3),
                    **per_pass(nnz, s, 1), "load1": load1(),
                    "density": nnz_w / p, "eta": algo.eta})
    return out, algo.eta


def warm(store: str) -> float:
    """Read every file of ``store`` once (into the OS page cache); returns the seconds it took. Before each timed
    command, so the 1-pass and 3-pass runs start alike: at full scale an earlier step (the kernels' decoded
    blocks in memory) had evicted the store, and the 1-pass run alone read it from disk."""
    from benchmarks.ingest import cache_file

    t0 = time.perf_counter()
    for root, _, files in os.walk(store):
        for name in files:
            cache_file(os.path.join(root, name))
    return time.perf_counter() - t0


def command_runs(store: str, algo: str, extra: list[str], workers: int, work: Path, nnz: int, reps: int = 1) -> dict:
    """``sparsepipe train --algo ALGO EXTRA...`` with --passes 1 and 3 (each the fastest of ``reps`` runs, alternating,
    each after :func:`warm`): wall, the engine's own copy/read/kernel split, marginal pass (and whether it is valid)."""
    from benchmarks.webspam import command
    from pipeline.model import load_model
    from pipeline.refit import refit_by_default

    runs = {}
    for _ in range(reps):
        for passes in (1, 3):
            out = work / f"{algo}_{passes}.npz"
            warm_s = warm(store)
            l0 = load1()
            res, fig = command(["train", store, "--out", str(out), "--algo", algo, "--passes", str(passes),
                                "--workers", str(workers), *extra] + ["--no-refit"] * refit_by_default(algo),
                               events=True)
            tim = load_model(out).meta["provenance"]["timing"]
            run = {"wall_s": fig["wall_s"], "train_s": res["seconds"], "warm_s": round(warm_s, 2),
                   "load1_before": l0, "load1": load1(),
                   "peak_rss_gb": fig["peak_rss_gb"], "stage_s": [e.get("seconds") for e in fig["events"]],
                   **{k: round(tim[k], 3) for k in ("copy_s", "read_s", "kernel_s")},
                   "kernel_nnz_per_s": tim["nnz_per_s_kernel"], "nnz_processed": tim["nnz_processed"]}
            if passes not in runs or run["wall_s"] < runs[passes]["wall_s"]:
                runs[passes] = {**run, "walls_s": runs.get(passes, {}).get("walls_s", []) + [run["wall_s"]]}
            else:
                runs[passes]["walls_s"].append(run["wall_s"])
            out.unlink(missing_ok=True)
    m = (runs[3]["wall_s"] - runs[1]["wall_s"]) / 2
    m_train = (runs[3]["train_s"] - runs[1]["train_s"]) / 2
    stages = runs[3]["stage_s"][1:]  # passes 2 and 3 as the command itself timed them (holdout metrics included)
    per = {k: (runs[3][k] - runs[1][k]) / 2 / workers for k in ("copy_s", "read_s", "kernel_s")}
    # the 1-pass run's reading is the 3-pass run's first pass; when it took longer than all three passes of the
    # other, it read cold and (t3 − t1) / 2 leaves a pass out: reported, and kept out of the ratios. Likewise
    # when the marginal pass comes out shorter than 0.9x the fastest of the 3-pass run's own passes 2 and 3
    # (a slow 1-pass run: seen with 2 s of page faults in its one stage after the store had been re-read)
    valid = runs[1]["read_s"] <= runs[3]["read_s"] and not (stages and m < 0.9 * min(stages))
    return {"what": f"sparsepipe train --algo {spec_name(algo, extra)} --workers {workers}, marginal pass",
            "runs": runs, "marginal_valid": bool(valid),
            "seconds": round(m, 2), "train_seconds": round(m_train, 2), "core_s": round(m * workers, 2),
            "stage_s_passes_2_3": round(float(np.mean(stages)), 2) if stages else None,
            "stage_s_pass_1": runs[3]["stage_s"][0] if runs[3]["stage_s"] else None,
            "per_worker_marginal": {k: round(v, 3) for k, v in per.items()},
            **per_pass(nnz, m, workers), "load1": load1()}


def per_pass(nnz: int, seconds: float, cores: int) -> dict:
    """Non-zeros per second per core and seconds per pass per billion non-zeros of a pass taking ``seconds`` on
    ``cores`` cores (None when the difference of two noisy runs is not positive)."""
    ok = seconds > 0
    return {"nnz_per_s_per_core": nnz / (seconds * cores) if ok else None,
            "s_per_pass_per_bnnz": seconds / (nnz / 1e9) if ok else None,
            "s_per_pass_per_bnnz_core": seconds * cores / (nnz / 1e9) if ok else None}


def vw_runs(st, src: Path, work: Path, l1: float, nnz: int) -> dict:
    """VW on the training rows: text pass writing the cache, then 1 and 3 passes from the cache."""
    from benchmarks.webspam import vw_run

    cache = work / "vw.cache"
    base = f"--loss_function logistic -b 24 --holdout_off --l1 {l1:g}"
    l0 = load1()
    text_s = vw_run(f"--cache_file {cache} --passes 1 {base} --noop", (src, st.entries("train")))
    runs = {}
    for passes in (1, 3):
        t0, c0 = time.perf_counter(), time.process_time()
        vw_run(f"--cache_file {cache} --passes {passes} {base}")
        runs[passes] = {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.process_time() - c0, 2),
                        "load1": load1()}
    cache.unlink(missing_ok=True)
    m = (runs[3]["wall_s"] - runs[1]["wall_s"]) / 2
    m_cpu = (runs[3]["cpu_s"] - runs[1]["cpu_s"]) / 2
    return {"what": f"vw --l1 {l1:g} -b 24, marginal cache pass", "text_pass_s": round(text_s, 1),
            "load1_before": l0, "runs": runs, "seconds": round(m, 2), "core_s": round(m, 2), "cpu_s": round(m_cpu, 2),
            **per_pass(nnz, m, 1), "load1": load1()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="default: the learning benchmark's 35k-row store (made on first use)")
    ap.add_argument("--src", default=None, help="the store's source text (for VW; default: STORE with .svm)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--algos", default="tg,stsgd",
                    help='comma list of ALGO or "ALGO:EXTRA ARGS" for train (e.g. "stsgd:--set path_mode=split")')
    ap.add_argument("--reps", type=int, default=2, help="in-process runs of the tight loop and the kernel")
    ap.add_argument("--command-reps", type=int, default=1, help="runs of each train command (the fastest counts)")
    ap.add_argument("--skip", default="", help="comma list of tight,kernel,command,vw,layout")
    ap.add_argument("--vw-l1", type=float, default=1e-6)
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args(argv)
    skip = set(a.skip.split(",")) - {""}
    specs = algo_specs(a.algos)
    algos = list(dict.fromkeys(algo for algo, _ in specs))  # the kernels: extra train arguments do not change them
    if not a.store:
        from benchmarks.learning import default_store

        a.store = default_store(workers=a.workers)[0]
    src = Path(a.src or str(Path(a.store).with_suffix(".svm")))
    if a.work:
        Path(a.work).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="throughput-", dir=a.work or out_dir()))
    rows = []
    try:
        blocks, st, nnz = load(a.store)
        print(f"{len(blocks)} training blocks, {nnz:,} non-zeros, {st.n_features:,} features", flush=True)
        eta = None
        if "kernel" not in skip:
            for name in algos:
                got, e = kernel(blocks, st, nnz, a.reps, name)
                eta = e if name == "tg" else eta
                rows += got
                print(got, flush=True)
        if "tight" not in skip:
            if eta is None:
                from pipeline.algorithms import make_algorithm
                from pipeline.store.stats import calibrate

                algo = make_algorithm("tg", {})
                calibrate(algo, st)
                eta = algo.eta
            got = tight(blocks, nnz, st.n_features, eta, a.reps)
            if a.workers > 1:
                got.append(tight_every_core(blocks, nnz, st.n_features, eta, a.reps, a.workers))
            rows += got
            print(got, flush=True)
        if "layout" not in skip:
            tag = ", feature ids by frequency"
            secs = renumber_by_frequency(blocks, st.n_features, st.feature_stats()["col_nnz"])
            print(f"renumbered by frequency in {secs:.1f} s", flush=True)
            w, b = np.zeros(st.n_features), np.zeros(1)
            rows.append({**_loop_row(f"tight loop, w float64{tag}", lambda: _sweep(blocks, w, b, eta or 1.0),
                                     a.reps, nnz, 1, [w]), "renumber_s": round(secs, 2)})
            for name in algos:
                rows += kernel(blocks, st, nnz, a.reps, name, orders=("block order",), tag=tag)[0]
            print(rows[-1 - len(algos):], flush=True)
        del blocks
        if "command" not in skip:
            for algo, extra in specs:
                rows.append(command_runs(a.store, algo, extra, a.workers, work, nnz, a.command_reps))
                print(rows[-1], flush=True)
        if "vw" not in skip:
            rows.append(vw_runs(st, src, work, a.vw_l1, nnz))
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by = {r["what"]: r["nnz_per_s_per_core"] for r in rows}

    def get(prefix):
        return next((v for k, v in by.items() if k.startswith(prefix)), None)

    def ratio(x, y):
        return round(x / y, 3) if x and y else None

    tl, vw = by.get("tight loop, w float64"), get("vw ")
    tlp = get("tight loop, w float64, prefetch")
    tla = get(f"tight loop, w float64, {a.workers} cores at once")
    ratios = {}
    for algo in (spec_name(*s) for s in specs):
        ours = get(f"sparsepipe train --algo {algo} --workers")
        row = next((r for r in rows if r["what"].startswith(f"sparsepipe train --algo {algo} --workers")), None)
        if row and not row.get("marginal_valid", True):
            ours = None  # a cold run: the difference leaves a pass out (see command_runs)
        ratios[f"{algo} vs vw per core (target >= 3)"] = ratio(ours, vw)
        ratios[f"{algo} vs tight loop f64 per core (target >= 0.6)"] = ratio(ours, tl)
        ratios[f"{algo} vs tight loop f64 on every core at once, per core"] = ratio(ours, tla)
        if row and row.get("stage_s_passes_2_3"):  # the same from the command's own pass 2/3 timings
            staged = per_pass(nnz, row["stage_s_passes_2_3"], a.workers)["nnz_per_s_per_core"]
            ratios[f"{algo} (passes 2-3 as timed by the command) vs vw per core"] = ratio(staged, vw)
            ratios[f"{algo} (passes 2-3 as timed by the command) vs tight loop f64 per core"] = ratio(staged, tl)
            ratios[f"{algo} (passes 2-3 as timed by the command) vs tight loop f64 on every core"] = ratio(staged, tla)
        if row and row.get("stage_s_pass_1"):  # the first pass: STSGD's purges make the later passes cheaper
            first = per_pass(nnz, row["stage_s_pass_1"], a.workers)["nnz_per_s_per_core"]
            ratios[f"{algo} (pass 1 as timed by the command) vs vw per core"] = ratio(first, vw)
    for algo in algos:
        stored = by.get(f"{algo} kernel alone, block order")  # exact: a prefix would also match the layout probe's
        ratios[f"{algo} kernel (block order) vs tight loop f64"] = ratio(stored, tl)
        ratios[f"{algo} kernel (engine order) vs tight loop f64"] = ratio(get(f"{algo} kernel alone, engine order"),
                                                                         tl)
        ratios[f"{algo} kernel (block order) vs tight loop f64 with prefetch"] = ratio(stored, tlp)
        ratios[f"{algo} kernel, feature ids by frequency vs as stored"] = ratio(
            by.get(f"{algo} kernel alone, block order, feature ids by frequency"), stored)
    ratios["tight loop f64, feature ids by frequency vs as stored"] = ratio(
        get("tight loop, w float64, feature ids by frequency"), tl)
    ratios["tight loop f32 vs f64"] = ratio(get("tight loop, w float32"), tl)
    ratios["tight loop f64 with prefetch vs without"] = ratio(tlp, tl)
    ratios["tight loop f64 on every core at once vs alone, per core"] = ratio(tla, tl)
    for r in rows:
        if r["nnz_per_s_per_core"]:
            r["M_nnz_per_s_per_core"] = round(r["nnz_per_s_per_core"] / 1e6, 2)
            r["s_per_pass_per_bnnz_core"] = round(r["s_per_pass_per_bnnz_core"], 2)
    report("throughput", {"store": a.store, "workers": a.workers, "training_nnz": nnz, "n_features": st.n_features,
                          "rows": rows, "ratios": ratios}, rows,
           ["what", "seconds", "stage_s_passes_2_3", "M_nnz_per_s_per_core", "s_per_pass_per_bnnz_core", "load1"])
    print(ratios)


if __name__ == "__main__":
    main()
