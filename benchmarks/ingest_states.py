"""The whole `sparsepipe ingest` command under three states of the machine's memory, runs alternated.

    sudo python -m benchmarks.ingest_states INPUT [--filler FILE] [--repeats 2] [--workers 2] [--work DIR]

- ``dropped``: ``sync; echo 3 > /proc/sys/vm/drop_caches`` just before the command (the protocol of most cold
  runs in docs/results.md). On a virtual machine with free page reporting (virtio-balloon; this machine's boot
  line asks ``page_reporting.page_reporting_order=11``, and the module reads 9) this also hands the freed memory
  back to the host, and every page the command then writes is first faulted in again by the host.
- ``filled``: the input not cached, the memory in use: the page cache dropped, then filled by reading
  ``--filler`` (a file of about the memory's size, not the input), then the input's own pages dropped. New
  pages are then reclaimed from that cache. This is a machine that has been in use and reads an input it has
  not seen.
- ``cached``: the input read once into the page cache first, as right after `sparsepipe synth` wrote it (the
  webspam benchmark's ingest step).

Reported per run: the command's wall seconds, its process tree's user and system CPU seconds, the ingest's own
``phase_seconds`` and MB/s per core (input bytes / wall / workers). Needs root (drop_caches). The store is written
under --work (default: beside the input) and removed after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
from pathlib import Path

from benchmarks.common import cache_file, report
from benchmarks.webspam import command

STATES = ("dropped", "filled", "cached")
_DROP = "/proc/sys/vm/drop_caches"


def _drop_caches() -> None:
    os.sync()
    with open(_DROP, "w") as f:
        f.write("3\n")


def _uncache(path: Path) -> None:
    """Drop ``path``'s own pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def prepare(state: str, src: Path, filler: Path | None) -> None:
    if state == "dropped":
        _drop_caches()
    elif state == "filled":
        _drop_caches()
        cache_file(filler)
        _uncache(src)
    else:
        cache_file(src)


def page_reporting() -> str | None:
    """The kernel's free page reporting order when it is set (the host takes back free blocks of 2^order pages)."""
    try:
        return Path("/sys/module/page_reporting/parameters/page_reporting_order").read_text().strip()
    except OSError:
        pass
    try:
        words = Path("/proc/cmdline").read_text().split()
    except OSError:
        return None
    return next((w.split("=", 1)[1] for w in words if w.startswith("page_reporting.page_reporting_order=")), None)


def ingest_run(src: Path, store: Path, workers: int) -> dict:
    """One whole `sparsepipe ingest` command (:func:`benchmarks.webspam.command`): the memory it started from, its
    wall time, its process tree's CPU seconds, its summary's times."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out, fig = command(["ingest", str(src), "--out", str(store), "--workers", str(workers)])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {**fig["before"], "wall_s": fig["wall_s"], "user_s": round(after.ru_utime - before.ru_utime, 2),
            "sys_s": round(after.ru_stime - before.ru_stime, 2), "own_s": out["seconds"],
            **{f"{k}_s": v for k, v in out["phase_seconds"].items()},
            "mb_s_per_core": round(src.stat().st_size / 1e6 / fig["wall_s"] / workers, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", type=Path)
    ap.add_argument("--filler", type=Path, help="a file of about the memory's size, not the input (state 'filled')")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--states", default=",".join(STATES), help="a comma list of " + ", ".join(STATES))
    ap.add_argument("--work", type=Path, help="where the store is written (default: beside the input)")
    a = ap.parse_args(argv)
    states = [s for s in a.states.split(",") if s]
    bad = [s for s in states if s not in STATES]
    if bad:
        ap.error(f"--states: unknown {', '.join(bad)} (known: {', '.join(STATES)})")
    if "filled" in states and a.filler is None:
        ap.error("state 'filled' needs --filler FILE (a file of about the memory's size, not the input)")
    if not os.access(_DROP, os.W_OK):
        sys.exit(f"{_DROP} is not writable: run as root")
    store = (a.work or a.input.parent) / "ingest_states.zarr"
    rows = []
    for rep in range(a.repeats):
        for state in states:  # alternated, so that a slow stretch of the machine falls on every state
            shutil.rmtree(store, ignore_errors=True)
            prepare(state, a.input, a.filler)
            row = {"state": state, "run": rep + 1, **ingest_run(a.input, store, a.workers)}
            shutil.rmtree(store, ignore_errors=True)
            rows.append(row)
            print(json.dumps(row), flush=True)
    report("ingest_states", {"input": str(a.input), "bytes": a.input.stat().st_size, "workers": a.workers,
                             "page_reporting_order": page_reporting(), "runs": rows}, rows)


if __name__ == "__main__":
    main()
