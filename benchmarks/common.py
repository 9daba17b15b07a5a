"""Shared helpers for the benchmark scripts: output folder, JSON + markdown reporting, synthetic inputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("SPARSEPIPE_BENCH_OUT", ROOT / "bench-out"))
DATA = ROOT.parent / "shared" / "data"


def out_dir() -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    return OUT


def report(name: str, result: dict, table: list[dict] | None = None, columns: list[str] | None = None) -> None:
    """Write bench-out/<name>.json and print it plus a markdown table."""
    result = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), **result}
    (out_dir() / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))
    if table:
        cols = columns or list(table[0])
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for row in table:
            lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in cols) + " |")
        md = "\n".join(lines)
        (out_dir() / f"{name}.md").write_text(md + "\n")
        print(md)


def algo_spec(spec: str) -> tuple[str, list[str]]:
    """ALGO or "ALGO:EXTRA ARGS" (extra ``train`` arguments) -> (algo, [args...])."""
    algo, _, extra = spec.partition(":")
    return algo, extra.split()


def algo_specs(text: str) -> list[tuple[str, list[str]]]:
    """A comma list of :func:`algo_spec` strings."""
    return [algo_spec(s) for s in text.split(",") if s]


def spec_name(algo: str, extra: list[str]) -> str:
    """How a run of ``algo`` with extra arguments is named in tables: "stsgd --set path_mode=split"."""
    return " ".join([algo, *extra])


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def machine() -> dict:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cores": os.cpu_count(), "python": sys.version.split()[0], "load1": load}


def l1_logistic(C: float, solver: str = "liblinear", **kw):
    """scikit-learn's L1-regularised logistic regression (the LIBLINEAR / saga oracle) at C, spelled for the
    installed version: ``penalty="l1"`` is deprecated from 1.8 on, where ``l1_ratio=1`` says the same."""
    import sklearn
    from sklearn.linear_model import LogisticRegression

    major, minor = (int(x) for x in sklearn.__version__.split(".")[:2])
    how = {"l1_ratio": 1.0} if (major, minor) >= (1, 8) else {"penalty": "l1"}
    return LogisticRegression(**how, solver=solver, C=C, **kw)


def synth_file(path: Path, rows: int, features: int = 16_609_143, nnz_per_row: int = 3700, seed: int = 0) -> Path:
    """Generate (once) a webspam-like LIBSVM file with `sparsepipe synth`."""
    if not path.exists():
        from pipeline.synth import synth

        synth(str(path), rows=rows, features=features, nnz_per_row=nnz_per_row, seed=seed)
    return path


def cache_file(path) -> None:
    """Read ``path`` once so every tool is timed on text in the page cache (parsing speed, not the disk's)."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def memory_state() -> dict:
    """The machine's free and page-cached memory (GB, /proc/meminfo; empty elsewhere): what a command starts from. On
    a virtual machine that hands free memory back to its host, a command that must fill free memory runs up to ~20%
    slower than one that reclaims cache (docs/results.md, "Forty-fourth session")."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        kb = {k: int(v.split()[0]) for k, v in (ln.split(":", 1) for ln in lines)}
    except OSError:
        return {}
    return {"mem_free_gb": round(kb["MemFree"] / 2**20, 1), "cached_gb": round(kb["Cached"] / 2**20, 1)}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)
