"""A worker's cache of derived blocks, bounded in memory, that spills what does not fit to local disk.

The refit sweeps every one of a worker's compacted blocks at each of its 100-300 evaluations. Rebuilding a block
(decode it, compact it to S) costs ~20x evaluating it, and an LRU smaller than the sweep hits nothing, so the blocks
that fit the memory budget stay (:meth:`pipeline.engine.BlockCache.get` with ``pin``) and the others are written
once to a spill directory and mapped from it at each sweep (350k webspam-like rows, stsgd's S: ~0.3 ms per 8 MB
block from the OS page cache, ~1 ms when it was copied, against ~2 ms to evaluate it and ~40 ms to rebuild it). That
is what keeps a worker's memory bounded whatever the rows: the page cache holding the spill files is the kernel's to
reclaim, and under pressure they are read from disk, as the store itself is.

Spill files are NumPy's .npy records (no pickle), written to a temporary name and renamed, in a directory of the
process's own: the Dask worker's local directory (removed when the worker closes, purged by the next worker if it
was killed), or, outside a worker, ``sparsepipe-spill-<pid>-*`` in the temporary directory (removed at exit, and
by the next process when the one that made it is gone).
"""
from __future__ import annotations

import atexit
import mmap
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
from numpy.lib import format as npformat

from pipeline.atomic import write_atomically
from pipeline.registry import pid_alive

PREFIX = "sparsepipe-spill-"


def _purge_orphans(base: Path) -> None:
    """Remove spill directories in ``base`` whose process is gone (a killed process cannot remove its own)."""
    for d in base.glob(PREFIX + "*"):
        try:
            pid = int(d.name[len(PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


def _new_dir() -> Path:
    try:
        from distributed import get_worker

        return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=get_worker().local_directory))
    except (ImportError, ValueError):  # not in a Dask worker
        base = Path(tempfile.gettempdir())
        _purge_orphans(base)
        d = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
        atexit.register(shutil.rmtree, d, True)
        return d


class SpillCache:
    """Tuples of arrays under hashable keys: the first ``budget`` bytes of them in memory (pinned), the rest in
    files of a spill directory. The owner drops the entries it no longer wants (:meth:`drop`)."""

    def __init__(self):
        from pipeline.engine import BlockCache

        self.memory = BlockCache()
        self.files: dict = {}  # key -> path of its spill file
        self.lock = threading.Lock()
        self.dir: Path | None = None
        self.serial = 0

    def get(self, key, build, budget: int):
        spilled = self.files.get(key)
        if spilled is not None:
            return self._read(spilled, build)
        value = self.memory.get(key, build, budget, pin=True)
        if key not in self.memory.items:
            self._spill(key, value)
        return value

    @staticmethod
    def _read(path: Path, build):
        """The arrays of a spill file, mapped read-only from it: no copy into fresh memory (np.load's copy of 420
        MB of compacted blocks per worker took 0.06-0.08 s of every refit evaluation at 350k webspam-like rows,
        the mapping 0.02 s). The mapping ends when the last of its arrays is released (one block at a time);
        unlinking the file meanwhile does not affect it."""
        try:
            with open(path, "rb") as f:
                layout = []
                for _ in range(int(np.load(f, allow_pickle=False))):
                    version = npformat.read_magic(f)
                    read_header = npformat.read_array_header_1_0 if version == (1, 0) else \
                        npformat.read_array_header_2_0
                    shape, fortran, dtype = read_header(f)
                    if fortran or dtype.hasobject:
                        raise ValueError(f"{path}: not a spill file of this process (array layout {dtype})")
                    count = int(np.prod(shape, dtype=np.int64))
                    layout.append((shape, dtype, count, f.tell()))
                    f.seek(count * dtype.itemsize, os.SEEK_CUR)
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:  # dropped meanwhile by another thread
            return build()
        return tuple(np.frombuffer(buf, dtype, count, offset).reshape(shape) for shape, dtype, count, offset in layout)

    def _spill(self, key, value) -> None:
        with self.lock:
            if key in self.files:
                return
            if self.dir is None or not self.dir.is_dir():
                self.dir = _new_dir()
            self.serial += 1
            path = self.dir / f"{self.serial}.npy"

        def fill(f):
            np.save(f, np.int64(len(value)), allow_pickle=False)
            for a in value:
                np.save(f, a, allow_pickle=False)

        write_atomically(path, fill, durable=False)
        with self.lock:
            if key in self.files:  # another thread spilled it meanwhile
                path.unlink()
            else:
                self.files[key] = path

    def drop(self, unwanted=lambda key: True) -> None:
        """Drop the entries whose key ``unwanted`` accepts (default: all), in memory and on disk."""
        with self.lock:
            self.memory.drop(unwanted)
            files = [self.files.pop(k) for k in [k for k in self.files if unwanted(k)]]
        for p in files:
            p.unlink(missing_ok=True)

    @property
    def spilled_bytes(self) -> int:
        return sum(p.stat().st_size for p in list(self.files.values()) if p.exists())
