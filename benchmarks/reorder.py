"""`sparsepipe reorder` against re-ingesting, whole commands: what a store that keeps the input's ids costs to bring
into frequency order, and what training gains from it.

    python -m benchmarks.reorder SRC.svm [--work DIR] [--workers 2] [--algo tg] [--passes 3] [--reps 2] [--keep]

On one LIBSVM file: `ingest --feature-order given` (the store a user has), `reorder` of it, and `ingest` with the
default (`auto`: the same file ingested again, numbered from a sample; the alternative when the inputs are still at
hand), each with its wall time and peak memory; then `train --algo ALGO` on the given store and on the reordered
copy, alternated ``--reps`` times, each model compared bit for bit. The page cache is not dropped (the reorder
reads the store the ingest just wrote, as a user's would); the ingest's input is read cold only if the machine's
memory cannot hold it: at 350k rows the `auto` ingest pushes the reordered store out of it, so the first train on
that store reads it from the disk. Results: bench-out/reorder.{json,md}; the stores are deleted unless ``--keep``.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import report
from benchmarks.webspam import command


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--work", type=Path, default=None, help="where the stores go (default: a folder beside SRC)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--algo", default="tg")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2, help="train runs on each store, alternated")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="reorder-", dir=a.work or a.src.parent))
    w = ["--workers", str(a.workers)]
    rows, res = [], {"src": str(a.src), "bytes": a.src.stat().st_size, "workers": a.workers}
    try:
        g, r, f = (str(work / n) for n in ("given.zarr", "reordered.zarr", "auto.zarr"))
        s, fig = command(["ingest", str(a.src), "--out", g, "--feature-order", "given", *w])
        rows.append({"step": "ingest --feature-order given", **fig})
        s, fig = command(["reorder", g, "--out", r, *w])
        rows.append({"step": "reorder (from the given store)", **fig, "hot": s["hot"]})
        s, fig = command(["ingest", str(a.src), "--out", f, *w])
        rows.append({"step": "ingest (auto: frequency from a sample)", **fig})
        shutil.rmtree(f)
        models = {}
        for rep in range(a.reps):
            for name, store in (("given", g), ("reordered", r)):
                m = str(work / f"{name}-{rep}.npz")
                s, fig = command(["train", store, "--algo", a.algo, "--passes", str(a.passes), "--out", m, *w])
                rows.append({"step": f"train --algo {a.algo} on the {name} store", **fig,
                             "train_s": s.get("seconds"), "error": (s.get("holdout") or {}).get("error")})
                models.setdefault(name, m)
        from pipeline.model import load_model

        mg, mr = load_model(models["given"]), load_model(models["reordered"])
        res["same_model"] = bool(np.array_equal(mg.coef_indices, mr.coef_indices) and mg.bias == mr.bias
                                 and np.array_equal(mg.coef_values, mr.coef_values))
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    report("reorder", {**res, "steps": rows}, rows,
           ["step", "wall_s", "train_s", "peak_rss_gb", "peak_uss_gb", "error"])


if __name__ == "__main__":
    main()
