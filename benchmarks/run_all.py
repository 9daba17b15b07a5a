"""`make bench`: run every benchmark in turn; each writes bench-out/<name>.json (and .md where it has a table).

    python benchmarks/run_all.py [--only ingest train ...]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = {
    "synth": ["--rows", "2850"],
    "ingest": ["--mb", "200", "--big-factor", "5"],
    "train": ["--section", "all"],
    "projection": [],
    "stsgd": [],
    "two_stage": [],
    "instability": [],
    "throughput": [],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    a = ap.parse_args()
    failed = []
    for name, args in BENCHMARKS.items():
        if a.only and name not in a.only:
            continue
        t0 = time.time()
        print(f"== {name}", flush=True)
        r = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=ROOT)
        print(f"== {name}: {'ok' if r.returncode == 0 else 'FAILED'} in {time.time() - t0:.0f}s", flush=True)
        if r.returncode:
            failed.append(name)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
