#!/usr/bin/env bash
# Weak scaling of `train --algo stsgd` on the 16-core device machine (issue 13 §4), in one call of the device
# tool. That machine has no package registry; its image's python3 (3.12) has numpy, scipy, numba, rich, psutil,
# ... but not dask, distributed, zarr, sparse and their needs, so they travel as wheels:
#
#   make device-wheels                                        # here: those wheels, into .whl/ (16 MB)
#   device run, carry [".whl"]: bash benchmarks/device_scaling.sh [ROWS] ["WORKERS ..."]
#
# It installs the wheels and this project (no index, no deps) into that python3, then runs benchmarks.webspam
# with $(nproc) workers for synth and ingest: synth -> ingest -> verify -> `train --algo stsgd --no-refit` with
# `--workers N` (N paths) for each N of WORKERS (default "1 16 32"), each model scored on the holdout against
# the true weights. The target: N = 16 within 1.3x the train wall of N = 1. Each train is the learner alone
# (`--no-refit`): the refit's model is the one `--paths N --workers 2` gives here, measured in docs/results.md.
# THREADS="1,8,16" adds benchmarks.contention on the same store (T kernels at once, no engine: the machine's own
# limit on weak scaling); VERIFY=0 skips the verify step (~40 s at full size there); BACKGROUND=N adds
# benchmarks.background with N workers on the same store (Dask's background CPU, idle and during a 3-pass stsgd fit,
# with Dask's defaults against pipeline.cluster.QUIET, which every `--workers N` train uses since fcbbe61).
# Results (webspam.json, webspam.md) go to $OUT (bench-out/ without it); the data (24 GB of text and its store,
# under .scaling-work/ on the machine's 64 GB disk) is deleted at the end. Measured there (twentieth session):
# 350,000 rows take ~40 s to install and warm up, synth ~21 s, ingest ~25 s, verify 37 s, and the trains 114 s
# (1 worker), 175 s (16) and 381 s (32). So "1 16 32" does not fit in one call's 10 minutes: run "1 16" in one
# call and "32" in another (each call starts a bare machine and makes its own data). 175,000 rows with
# "1 15 16" and THREADS=1,15,16 take 6.3 minutes.
set -euo pipefail
rows=${1:-350000}
workers=${2:-"1 16 32"}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl
if ! python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .; then
    # an image whose setuptools cannot build the editable install: run from the tree, with the same entry point
    echo "editable install failed: sparsepipe runs from this tree"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    bin=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
    printf '#!/bin/sh\nexec "%s" -m cli.main "$@"\n' "$bin/python3" > "$bin/sparsepipe"
    chmod +x "$bin/sparsepipe"
fi
python3 -c "import sys, numpy, scipy, numba, dask, zarr; print('python', sys.version.split()[0], 'numpy', numpy.__version__,
      'scipy', scipy.__version__, 'numba', numba.__version__, 'dask', dask.__version__, 'zarr', zarr.__version__)"
echo "cores $(nproc), $(free -g | awk '/Mem:/ {print $2}') GB memory, $(df -h . | awk 'NR==2 {print $4}') free here"
export SPARSEPIPE_BENCH_OUT="${OUT:-bench-out}" PYTHONUNBUFFERED=1
# numba compiles the kernels into its cache on first use: do that on a tiny store first, so no timed run pays it
warm=$(mktemp -d)
sparsepipe synth "$warm/w.svm" --rows 300 --seed 1 >/dev/null
sparsepipe ingest "$warm/w.svm" --out "$warm/w.zarr" >/dev/null
sparsepipe train "$warm/w.zarr" --algo stsgd --passes 1 --no-refit --out "$warm/m.npz" >/dev/null
rm -rf "$warm"
extra=()
for n in $workers; do extra+=(--extra "stsgd:--no-refit --workers $n"); done
work="$PWD/.scaling-work"
common=(--rows "$rows" --workers "$(nproc)" --algos "" --vw-l1 --work "$work")
# the data first (synth -> ingest -> verify, skipped with VERIFY=0), kept for the steps below
python3 -m benchmarks.webspam "${common[@]}" --keep $([ "${VERIFY:-1}" = 0 ] && echo --no-verify)
# the machine alone, with THREADS (e.g. "1,8,16") set: T kernels at once in one process, no engine (contention.py)
if [ -n "${THREADS:-}" ]; then
    sync; sleep 10  # the store's writes settled first: the probe's one thread must have the machine to itself
    python3 -m benchmarks.contention "$work/ws_${rows}_7.zarr" --threads "$THREADS"
fi
if [ -n "${BACKGROUND:-}" ]; then
    python3 -m benchmarks.background --workers "$BACKGROUND" --seconds 20 --store "$work/ws_${rows}_7.zarr" --passes 3
fi
# the trains, each scored; the data is deleted at the end
python3 -m benchmarks.webspam "${common[@]}" --no-verify "${extra[@]}"
python3 - "$SPARSEPIPE_BENCH_OUT/webspam.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps = {s["step"]: s for s in r["steps"]}
runs = [m for m in r["models"] if m["model"].startswith("stsgd")]
for m in runs:
    s = steps[f"train {m['model']}"]
    print(f"{m['model']}: train {m['train_wall_s']} s = {m['train_wall_s'] / runs[0]['train_wall_s']:.2f}x the first "
          f"(learner {s['train_s']} s), peak USS of a worker {s['peak_worker_uss_gb']} GB, of the client "
          f"{s['peak_client_uss_gb']} GB, "
          f"all {s['processes']} processes together {s['peak_total_pss_gb']} GB PSS; holdout error {m['error']:.4f}, "
          f"recall {m['recall']:.3f}")
PY
