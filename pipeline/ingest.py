"""LIBSVM text -> block store: byte-range planning, one Dask task per range, atomic commit.

Plain files are cut into ``block_mb`` byte ranges; a range owns every line whose first byte lies in it,
so ranges are planned without reading the file and each task aligns itself to line starts. Compressed
inputs (.gz .bz2 .xz .zst) stream through one task that cuts the decompressed text into blocks. A block
is one range's rows. Ranges depend only on the file and ``block_mb``, never on the number of workers,
so the store's arrays are identical whatever the cluster.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import glob
import hashlib
import io
import json
import mmap
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np

from pipeline import arena
from pipeline.formats import libsvm
from pipeline.store import checksum
from pipeline.store import format as fmt
from pipeline.store import order as forder
from pipeline.store import stats

COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}
BINARY_ENCODINGS = ((-1.0, 1.0), (0.0, 1.0), (1.0, 2.0))
MIXED_LABEL_SHARE = 0.99
LABEL_MODES = ("auto", "regression", "-1,1", "0,1", "1,2")


class IngestError(Exception):
    """Bad input or a refused ingest; the message names file, line and cause."""


@dataclass(frozen=True)
class IngestOptions:
    """Validated ingest options (recorded in the manifest)."""

    block_mb: float = 64.0
    holdout: float = 0.1
    seed: int = 0
    n_features: int | None = None
    zero_based: bool = False
    on_invalid: str = "error"
    labels: str = "auto"
    dtype: str = "float32"
    feature_order: str = "auto"

    def __post_init__(self):
        if not (self.block_mb > 0):
            raise ValueError(f"block_mb must be > 0, got {self.block_mb}")
        if not (0.0 <= self.holdout < 1.0):
            raise ValueError(f"holdout must be in [0, 1), got {self.holdout}")
        if self.n_features is not None and self.n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {self.n_features}")
        if self.on_invalid not in ("error", "skip"):
            raise ValueError(f"on_invalid must be 'error' or 'skip', got {self.on_invalid!r}")
        if self.labels not in LABEL_MODES:
            raise ValueError(f"labels must be one of {', '.join(LABEL_MODES)}; got {self.labels!r}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if self.feature_order not in forder.ORDERS:
            raise ValueError(f"feature_order must be one of {', '.join(forder.ORDERS)}, got {self.feature_order!r}")

    @property
    def label_pair(self):
        if self.labels in ("auto", "regression"):
            return None
        a, b = self.labels.split(",")
        return float(a), float(b)


@dataclass
class Task:
    """One unit of parsing: a byte range of a plain file, or a whole compressed stream."""

    source: int
    path: str
    index: int  # range number within the source
    start: int
    end: int
    compression: str | None
    keys: list = field(default_factory=list)
    stats: bool = True  # False: a holdout block (known at planning); its feature statistics are not needed


# ----------------------------------------------------------------------------------------- planning

def compression_of(path: str) -> str | None:
    for suffix, name in COMPRESSIONS.items():
        if path.endswith(suffix):
            return name
    return None


class _ZstdStream:
    """Streaming .zst reader (multi-frame) that raises EOFError when the input ends inside a frame."""

    def __init__(self, raw):
        import zstandard

        self.raw, self.zstd = raw, zstandard
        self.dobj = zstandard.ZstdDecompressor().decompressobj()
        self.pending = b""
        self.done = False
        self.started = False

    def read(self, n: int = -1) -> bytes:
        out = [self.pending]
        have = len(self.pending)
        while not self.done and (n < 0 or have < n):
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if not self.dobj.eof and (have or self.started):
                    raise EOFError("zstd stream ended before the end of its last frame")
                self.done = True
                break
            self.started = True
            piece = self.dobj.decompress(chunk)
            while self.dobj.eof and self.dobj.unused_data:  # next frame
                rest = self.dobj.unused_data
                self.dobj = self.zstd.ZstdDecompressor().decompressobj()
                piece += self.dobj.decompress(rest)
            out.append(piece)
            have += len(piece)
        data = b"".join(out)
        if n < 0:
            self.pending = b""
            return data
        self.pending = data[n:]
        return data[:n]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.raw.close()


def _local(path: str) -> bool:
    """A plain local path (no URL, no fsspec chain): read with the os directly, fsspec is not imported."""
    return "://" not in path and "::" not in path


def _open(path: str, compression: str | None = None):
    if compression is None and _local(path):
        return open(os.path.expanduser(path), "rb")
    import fsspec

    if compression == "zstd":
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise IngestError(f"{path}: .zst input needs the 'zstandard' package (pip install zstandard)") from None
        return _ZstdStream(fsspec.open(path, "rb").open())
    return fsspec.open(path, "rb", compression=compression).open()


def file_size(path: str) -> int:
    try:
        if _local(path):
            local = os.path.expanduser(path)
            if os.path.isdir(local):
                raise IngestError(f"{path}: is a directory; give the LIBSVM files in it (e.g. {path}/*.svm)")
            if os.path.exists(local) and not os.access(local, os.R_OK):
                raise IngestError(f"{path}: cannot read the file (permission denied)")
            return os.path.getsize(local)
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        return int(fs.size(p))
    except FileNotFoundError:
        raise IngestError(f"{path}: no such file") from None


def fingerprint(path: str, size: int) -> str:
    """sha256 of the size, the first and last MiB and 32 evenly spaced 64 KiB samples of the raw file.

    Cheap enough for a 24 GB file, and any append/truncation/rewrite of real data changes it.
    """
    h = hashlib.sha256(str(size).encode())
    with _open(path) as f:
        offsets = [0, max(0, size - (1 << 20))] + [int(size * k / 33) for k in range(1, 33)]
        for k, off in enumerate(offsets):
            f.seek(off)
            h.update(f.read((1 << 20) if k < 2 else (1 << 16)))
    return h.hexdigest()


def plan(sources: list[dict], block_bytes: int, generation: int) -> list[Task]:
    tasks = []
    for s_idx, src in enumerate(sources):
        comp = src["compression"]
        if comp is not None or src["size"] <= block_bytes:
            tasks.append(Task(s_idx, src["path"], 0, 0, src["size"], comp))
            continue
        n = -(-src["size"] // block_bytes)
        for i in range(n):
            tasks.append(Task(s_idx, src["path"], i, i * block_bytes, min(src["size"], (i + 1) * block_bytes), None))
    for t in tasks:
        t.keys = [f"{generation:04d}-{t.source:04d}-{t.index:06d}"]
    return tasks


# ------------------------------------------------------------------------------------ worker side

_TAIL = 1 << 20  # read this much past the range end so the last line usually needs no second read


def read_owned_lines(f, start: int, end: int, size: int) -> np.ndarray:
    """uint8 array of every line whose first byte lies in [start, end) of an open seekable file.

    The result is a read-only view of a memory map (local files) or a view of a per-thread buffer that the
    next call overwrites.
    """
    if start >= size:
        return np.zeros(0, np.uint8)
    lo = start - 1 if start > 0 else 0
    want = min(size, end + _TAIL) - lo
    buf = _map_range(f, lo, want)
    if buf is None:
        f.seek(lo)
        buf = arena.buffer("ingest.read", want, np.uint8)
        got = f.readinto(memoryview(buf))
        buf = buf[:got]
    head = 0
    if start > 0:
        nl = _first_newline(buf, 0)
        if nl < 0:
            return np.zeros(0, np.uint8)  # a line longer than the range started before it
        head = nl + 1
    if end >= size:
        return buf[head:]
    stop = _first_newline(buf, end - 1 - lo)  # the line holding byte end-1 ends at the next newline
    if stop >= 0:
        return buf[head:stop + 1]
    parts = [buf.copy()]  # a very long last line: keep reading until its newline
    f.seek(lo + buf.shape[0])
    while True:
        piece = f.read(1 << 20)
        if not piece:
            break
        k = piece.find(b"\n")
        if k >= 0:
            parts.append(np.frombuffer(piece[: k + 1], np.uint8))
            break
        parts.append(np.frombuffer(piece, np.uint8))
    return np.concatenate(parts)[head:]


def _map_range(f, lo: int, n: int) -> np.ndarray | None:
    """Bytes [lo, lo + n) of a local file as a read-only uint8 array over a memory map (pages come straight
    from the page cache: no copy, no read buffer); None when ``f`` is not a local file. The map lives as
    long as the array."""
    try:
        fd = f.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    if n <= 0:
        return np.zeros(0, np.uint8)
    a = lo - lo % mmap.ALLOCATIONGRANULARITY
    _advise(f, a, lo + n - a, "POSIX_FADV_WILLNEED")  # the whole range's reads in flight, not a window at a time
    try:
        m = mmap.mmap(fd, lo + n - a, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                      prot=mmap.PROT_READ, offset=a)
    except (OSError, ValueError):
        return None
    return np.frombuffer(m, np.uint8)[lo - a:]


def _first_newline(buf: np.ndarray, start: int) -> int:
    """Index of the first newline at or after ``start``, or -1."""
    step = 1 << 16
    for off in range(max(0, start), buf.shape[0], step):
        hit = np.flatnonzero(buf[off:off + step] == 10)
        if hit.shape[0]:
            return int(hit[0]) + off
    return -1


def _block_result(key: str, parsed: libsvm.Parsed, nbytes: int) -> dict:
    """Metadata of one parsed block plus the arrays to write (indices/data already in store dtypes)."""
    res = {"key": key, "rows": parsed.n_rows, "nnz": parsed.nnz, "n_lines": parsed.n_lines,
           "max_index": parsed.max_index, "bytes": nbytes, "errors": parsed.errors, "zeros": parsed.zeros}
    labels = parsed.labels
    vals, first, counts = np.unique(labels, return_index=True, return_counts=True)
    res["label_values"] = vals.tolist()
    res["label_counts"] = counts.tolist()
    res["label_first_line"] = parsed.row_line[first].tolist()
    labels32 = labels.astype(np.float32)
    res["checksum"] = checksum.checksum(parsed.indptr, parsed.indices, parsed.data, labels32)
    res["_arrays"] = {"indptr": parsed.indptr, "indices": parsed.indices, "data": parsed.data,
                      "labels": labels32}
    if parsed.stats_idx is not None:
        res["_arrays"].update(zip(stats.BLOCK_STATS, (parsed.stats_idx, parsed.stats_nnz, parsed.stats_sumsq)))
    return res


def write_block(root: str, res: dict) -> dict:
    """Write the block of :func:`_block_result` ``res`` (its ``_arrays``, popped) under ``root/blocks``; returns
    ``res``."""
    arrays = res.pop("_arrays")
    g = f"{root}/blocks/{res['key']}"
    fmt.make_group(g, {"encoding-type": "csr_matrix", "encoding-version": "0.1.0",
                       "shape": [int(arrays["labels"].shape[0]), int(res["max_index"])]})
    for name, arr in arrays.items():  # the statistics live until the commit has summed them: raw
        fmt.write_array(g, name, arr, compress=False if name in stats.BLOCK_STATS else None)
    return res


def parse_task(root: str, task: Task, opts: dict, order: str | None = None) -> list[dict]:
    """Dask task: parse one range (or a whole compressed stream) and write its block(s); ``order``: the digest of
    the store's feature order (at ``root/features``), whose ids the blocks hold."""
    o = IngestOptions(**opts)
    fmt.one_codec_thread()
    skip = o.on_invalid == "skip"
    kw = dict(zero_based=o.zero_based, width=o.n_features if o.n_features else -1, skip_invalid=skip,
              label_pair=o.label_pair, index_dtype=np.int32, value_dtype=np.dtype(o.dtype), column_stats=task.stats,
              reuse=True,  # each block is written before the next is parsed
              relabel=forder.cached_maps(f"{root}/{forder.PATH}", order)[0] if order else None)
    if task.compression is None:
        with _open(task.path) as f:
            size = file_size(task.path)
            buf = read_owned_lines(f, task.start, task.end, size)
            _read_ahead(f, task.end, task.end - task.start, size)
            parsed = libsvm.parse_buffer(buf, **kw)
            del buf
            _drop_cached(f, task.start, task.end, size)
        res = _block_result(task.keys[0], parsed, task.end - task.start)
        res["line_offset"] = None
        if parsed.errors and not skip:
            res.pop("_arrays")
            return [res]
        return [write_block(root, res)]
    return _stream_task(root, task, o, kw)


# An input larger than this share of the machine's memory cannot stay in the page cache anyway: each range is
# dropped from it once parsed, so that the text passing through does not push out what was just written (the
# blocks and their statistics, which the commit and the first training pass read next).
DROP_CACHED_SHARE = 0.25


def _uncacheable(size: int) -> bool:
    """Whether an input of ``size`` bytes is larger than :data:`DROP_CACHED_SHARE` of the physical memory (False
    where the platform does not say)."""
    try:
        return size > DROP_CACHED_SHARE * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return False


def _drop_cached(f, start: int, end: int, size: int) -> None:
    """Tell the kernel the bytes [start, end) of the input ``f`` will not be read again (local files larger than
    :data:`DROP_CACHED_SHARE` of the physical memory only; nothing elsewhere)."""
    if _uncacheable(size):
        _advise(f, start, end - start, "POSIX_FADV_DONTNEED")


READ_AHEAD_RANGES = 2
"""A parse task that has read its range asks the kernel for this many next ranges of the file while it parses:
the task that takes them (on this worker or another) then finds their pages there or on their way. Measured on
the 24 GB file, `--workers 2` with one task each, page cache dropped, runs alternated: 42.2–42.5 s against
41.4–44.1 s without; 6 ranges no better."""


PARSE_TASKS_PER_CORE = 2
"""Parse tasks each embedded worker process (or each core, in this process) runs at once when the input is read from
the disk (inputs larger than :data:`DROP_CACHED_SHARE` of the memory; one for smaller ones, which the page cache may
hold: a cached 200 MB file took 0.954 s with two, 0.915 s with one, means of 10 alternated runs): a task waits on
the disk for its range and its writes (the workers' CPU was ~70% busy with one), during which the other parses. Measured
on the 24 GB file, `--workers 2`, page cache dropped, runs alternated: with the read-ahead 37.0–40.0 s against
39.5–42.5 s with one task (the command's own time); both changes against neither, whole commands, 36.9–38.4 s
against 39.7–41.3 s (and one at 51.6 s); in this process (no `--workers`) 35.0–36.4 against 37.3–37.4 s, at
1.32–1.36 GB peak RSS against 1.04 GB."""


def _read_ahead(f, end: int, span: int, size: int) -> None:
    """Ask the kernel to start reading the :data:`READ_AHEAD_RANGES` ranges of ``span`` bytes after ``end`` of
    the input ``f`` (local files; a hint, nothing elsewhere)."""
    _advise(f, end, min(size, end + READ_AHEAD_RANGES * span) - end, "POSIX_FADV_WILLNEED")


def _advise(f, lo: int, n: int, advice: str) -> None:
    """``posix_fadvise(f.fileno(), lo, n, os.<advice>)`` for a local file where the platform has it; a hint, so a
    stream without a descriptor (fsspec, compressed) or a refusal is ignored."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None or n <= 0:
        return
    try:
        advise(f.fileno(), lo, n, getattr(os, advice))
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass


def _stream_task(root: str, task: Task, o: IngestOptions, kw: dict) -> list[dict]:
    block_bytes = int(o.block_mb * (1 << 20))
    out = []
    lines_before = 0
    seq = 0
    try:
        with _open(task.path, task.compression) as f:
            for buf in libsvm.line_chunks(f, block_bytes):
                parsed = libsvm.parse_buffer(buf, **kw)
                key = f"{task.keys[0][:-6]}{seq:06d}"
                res = _block_result(key, parsed, len(buf))
                res["line_offset"] = lines_before
                lines_before += parsed.n_lines
                seq += 1
                if parsed.errors and o.on_invalid == "error":
                    res.pop("_arrays")
                    out.append(res)
                    return out
                out.append(write_block(root, res))
    except (EOFError, OSError) as e:
        raise IngestError(f"{task.path}: compressed input is truncated or corrupt ({e}); "
                          f"nothing was committed") from None
    except Exception as e:  # zstandard raises its own error type
        if type(e).__module__.startswith("zstandard"):
            raise IngestError(f"{task.path}: compressed input is truncated or corrupt ({e}); "
                              f"nothing was committed") from None
        raise
    return out


def sample_task(sources: list[dict], opts: dict) -> tuple[np.ndarray, int, int]:
    """Dask task: (hot, bytes sampled, sampled width) of the inputs' feature ids for a feature order by frequency
    (:mod:`pipeline.store.order`): ``SAMPLE_WINDOWS`` windows of whole lines spread evenly over the (uncompressed)
    inputs, in proportion to their sizes. Lines that do not parse are left out here; the ingest reports them."""
    o = IngestOptions(**opts)
    total = sum(s["size"] for s in sources)
    ids, done = [], 0
    for src in sources:
        n = max(1, round(forder.SAMPLE_WINDOWS * src["size"] / total)) if src["size"] else 0
        win = forder.SAMPLE_BYTES // forder.SAMPLE_WINDOWS
        if n * win >= src["size"]:  # the whole file
            n, win = min(n, 1), src["size"]
        with _open(src["path"]) as f:
            for i in range(n):
                lo = i * src["size"] // n
                f.seek(lo)
                buf = np.frombuffer(f.read(win), dtype=np.uint8)
                first = 0 if lo == 0 else _first_newline(buf, 0) + 1  # whole lines only
                if lo and not first:
                    continue
                if lo + buf.shape[0] >= src["size"]:
                    end = buf.shape[0]
                else:
                    nl = np.flatnonzero(buf[first:] == 10)
                    if not nl.shape[0]:
                        continue
                    end = first + int(nl[-1]) + 1
                parsed = libsvm.parse_buffer(buf[first:end], zero_based=o.zero_based,
                                             width=o.n_features if o.n_features else -1, skip_invalid=True)
                ids.append(parsed.indices.copy())
                done += end - first
    ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    feature, counts = np.unique(ids, return_counts=True)
    hot = forder.by_frequency(feature, counts)[0]
    return hot, done, int(feature[-1]) + 1 if feature.shape[0] else 0


def _choose_order(c, root: str, old: dict | None, sources: list[dict], o: IngestOptions) -> dict | None:
    """The store's feature order: an append keeps the store's; a new store samples its inputs when ``o`` asks
    (``frequency``) or when ``auto`` finds them large and wide (:data:`forder.ORDER_MIN_BYTES`,
    :data:`forder.ORDER_MIN_WIDTH`), writes ``hot`` to ``root/features`` and returns the manifest's entry."""
    if old is not None:
        return old.get("feature_order")
    if o.feature_order == "given" or not sources:
        return None
    plain = all(s["compression"] is None for s in sources)
    if o.feature_order == "frequency" and not plain:
        raise IngestError(f"{', '.join(s['path'] for s in sources if s['compression'])}: --feature-order frequency "
                          f"samples its inputs before parsing them, which needs uncompressed files; decompress "
                          f"them first or use --feature-order given")
    total = sum(s["size"] for s in sources)
    if o.feature_order == "auto" and (not plain or total < forder.ORDER_MIN_BYTES):
        return None
    hot, sampled, width = c.submit(sample_task, sources, asdict(o), pure=False).result()
    if o.feature_order == "auto" and width < forder.ORDER_MIN_WIDTH or not hot.shape[0]:
        return None
    fmt.make_group(f"{root}/{forder.PATH}")
    fmt.write_array(f"{root}/{forder.PATH}", "hot", hot)
    return {"kind": "frequency", "path": forder.PATH, "hot": int(hot.shape[0]), "digest": forder.digest(hot),
            "sample_bytes": int(sampled), "sample_width": int(width)}


def _grown_past_order_thresholds(old: dict | None, order: dict | None, sources: list[dict], width: int) -> bool:
    """Whether this append takes a store in the input's order (not asked for with ``given``) past ``auto``'s
    thresholds for a feature order by frequency: said once, when it crosses them."""
    if old is None or order or (old.get("options", {}).get("history") or [{}])[0].get("feature_order") == "given":
        return False
    before = sum(int(s.get("size") or 0) for s in old.get("sources", []))
    after = before + sum(int(s.get("size") or 0) for s in sources)

    def past(size, w):
        return size >= forder.ORDER_MIN_BYTES and w >= forder.ORDER_MIN_WIDTH

    return past(after, width) and not past(before, int(old.get("n_features", 0)))


def _stats_groups(root: str, keys: list[str], base: str | None) -> list[str]:
    """The statistics sets a commit adds, in order: a previous version's (``base``), then the blocks'."""
    return ([f"{root}/{base}"] if base is not None else []) + [f"{root}/blocks/{k}" for k in keys]


def source_stats_task(root: str, keys: list[str], n_features: int, base: str | None, out: str) -> None:
    """Dask task: add the per-block feature statistics of ``keys`` (after those of a previous version
    ``base``) in block order and write them to ``root/out`` on the worker (they never travel to the client)."""
    fmt.one_codec_thread()
    groups = _stats_groups(root, keys, base)
    loaders = [functools.partial(stats.read_stats, g) for g in groups]
    sizes = [stats.stats_size(g) for g in groups]
    feature, count, sumsq = stats.sum_stats(loaders, sizes, n_features, reuse=True)  # written at once
    _write_source_stats(root, out, n_features, (feature, count, sumsq))


def band_stats_task(root: str, keys: list[str], base: str | None, lo: int, hi: int) -> tuple:
    """Dask task: :func:`source_stats_task`'s sum for the features lo <= j < hi (:func:`stats.band_sum`)."""
    fmt.one_codec_thread()
    return stats.band_sum(_stats_groups(root, keys, base), lo, hi)


def _write_source_stats(root: str, out: str, n_features: int, *parts) -> None:
    """Write the statistics ``parts`` ((feature, count, sumsq) of consecutive feature bands) as one version."""
    feature, count, sumsq = (np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k]
                             for k in range(3))
    fmt.make_group(f"{root}/stats")
    stats.write_stats(f"{root}/{out}", feature, count, sumsq, n_features)


# ------------------------------------------------------------------------------------ client side

def _decide_labels(mode: str, counts: dict, first_line: dict, path: str, prefer: list) -> tuple | None:
    """Binary encoding (neg, pos) of one source, or None for real-valued labels."""
    if mode == "regression":
        return None
    if mode != "auto":
        a, b = (float(v) for v in mode.split(","))
        return (a, b)
    values = set(counts)
    for enc in list(prefer) + [e for e in BINARY_ENCODINGS if e not in prefer]:
        if values <= set(enc):
            return tuple(enc)
    total = sum(counts.values())
    best = max(BINARY_ENCODINGS, key=lambda e: sum(counts.get(v, 0) for v in e))
    covered = sum(counts.get(v, 0) for v in best)
    if all(v in counts for v in best) and covered >= MIXED_LABEL_SHARE * total:
        odd = min((first_line[v], v) for v in values - set(best))
        raise IngestError(
            f"{path}:{odd[0]}: binary labels mixed with non-binary: label {odd[1]:g} in a file whose "
            f"labels are otherwise {best[0]:g}/{best[1]:g} ({total - covered} such rows). Use "
            f"--labels {best[0]:g},{best[1]:g} with --on-invalid skip to drop them, or --labels regression")
    return None


def _check_label_meaning(old: dict | None, sources: list, label_map: dict) -> None:
    """A file of the store whose every label was 1 was read as +1 with nothing to go by (``label_guess``): a new
    file under ``--labels auto`` that reads 1 as -1 ({1,2}) is refused, naming both, instead of giving the same raw
    label opposite classes in one store."""
    guessed = [s["path"] for s in (old["sources"] if old else []) if s.get("label_guess")]
    for i, src in enumerate(sources):
        m = label_map.get(i)
        if guessed and m and m[0] == 1.0:
            raise IngestError(
                f"{src['path']}: label 1 would be -1 (labels 1/2) but {guessed[0]}, whose every label is 1, was read "
                f"as +1 in this store; nothing was committed: ingest the files again into a new store with the "
                f"encoding they share given (--labels 1,2)")


def _lock_path(out: str) -> str:
    """``STORE.lock`` beside the store's real path: two spellings of one store (a symlink, ``a/../b``) take the
    same lock (a second mount of the same directory is not recognised)."""
    return os.path.realpath(os.path.abspath(out).rstrip("/")) + ".lock"


def _lock(out: str):
    """An flock on ``STORE.lock``, held while the ingest runs and removed by :func:`_unlock`: no lock file stays
    beside the store. A holder that finds the path removed or replaced after taking the lock (its file was
    unlinked by the previous holder's release) takes the new file's lock instead, so two writers never hold
    locks on different files."""
    lock_path = _lock_path(out)
    for _ in range(100):
        try:
            fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as e:
            raise IngestError(f"{out}: cannot create the lock file {lock_path} ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise IngestError(f"{out}: another sparsepipe process is writing this store (lock {lock_path})") from None
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise IngestError(f"{out}: could not take the lock {lock_path}")


def _unlock(out: str, fd: int) -> None:
    """Remove ``STORE.lock`` while still holding it, then release it."""
    try:
        os.unlink(_lock_path(out))
    except OSError:
        pass
    os.close(fd)


def _choose_holdout(keys: list[str], fraction: float, seed: int, generation: int) -> list[str]:
    n = len(keys)
    if fraction <= 0 or n < 2:
        return []
    k = min(n - 1, max(1, int(round(fraction * n))))
    rng = np.random.default_rng([seed, generation])
    return sorted(keys[i] for i in rng.choice(n, size=k, replace=False))


def _format_error(path: str, line: int, col: int, code: int) -> str:
    return f"{path}:{line}:{col}: {libsvm.ERROR_MESSAGES[code]}"


def ingest(inputs: list[str], out: str, options: IngestOptions | None = None, *, append: bool = False,
           workers: int | None = None, scheduler: str | None = None, client=None, progress=None) -> dict:
    """Ingest LIBSVM files into the block store at ``out`` (new, or ``append`` to an existing one).

    Returns the summary dict (n_rows, n_features, nnz, n_blocks, holdout_blocks, seconds, bytes_read, ...);
    ``seconds`` is the ingest itself, ``startup_seconds`` the cluster start before it; ``phase_seconds`` splits
    ``seconds`` into choosing the feature order (sampling the inputs), parsing and writing the blocks, adding
    their statistics, and the rest of the commit.
    ``progress(bytes_done, rows_done, bytes_total)`` is called as blocks finish.
    """
    from pipeline.cluster import dask_client

    t0 = time.time()
    o = IngestOptions(**options) if isinstance(options, dict) else options or IngestOptions()
    if isinstance(inputs, (str, os.PathLike)):  # one file
        inputs = [inputs]
    inputs = [os.fspath(p) for p in inputs]
    if not inputs:
        raise IngestError("no input files given")
    out = os.fspath(out).rstrip("/")
    lock_fd = _lock(out)
    try:
        old = None
        if append:
            if not os.path.exists(out):
                raise IngestError(f"{out}: --append needs an existing store (it does not exist)")
            old = fmt.read_manifest(out)
            _check_append_options(out, old, o)
        elif os.path.exists(out):
            raise IngestError(f"{out}: already exists; use --append to add data or remove it first")
        sources = []
        known = {s["fingerprint"]: s for s in (old["sources"] if old else [])}
        for path in inputs:
            size = file_size(path)
            fp = fingerprint(path, size)
            if fp in known and known[fp]["generation"] == "this run":
                raise IngestError(f"{path}: given twice (the same content as {known[fp]['path']}); give each input "
                                  f"once")
            if fp in known:
                raise IngestError(f"{path}: already ingested into {out} (same fingerprint as "
                                  f"{known[fp]['path']}, generation {known[fp]['generation']}); refusing to append twice")
            known[fp] = {"path": path, "generation": "this run"}
            sources.append({"path": path, "size": size, "fingerprint": fp, "compression": compression_of(path)})
        if old is None and all(src["size"] == 0 for src in sources):
            raise IngestError(f"{', '.join(inputs)}: empty input (0 bytes); nothing to ingest")
        generation = (old["generation"] + 1) if old else 1
        if old:
            _clean_orphans(out, old)
            root = out
        else:
            for stale in glob.glob(glob.escape(out) + ".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            root = f"{out}.tmp-{uuid.uuid4().hex[:12]}"
            fmt.make_group(root)
            fmt.make_group(f"{root}/blocks")
        try:
            tasks = plan(sources, int(o.block_mb * (1 << 20)), generation)
            if all(t.compression is None for t in tasks):  # every block known now: the holdout too, unless a
                # range turns out empty (then the commit computes a training block's statistics itself)
                hold = set(_choose_holdout([t.keys[0] for t in tasks], o.holdout, o.seed, generation))
                for t in tasks:
                    t.stats = t.keys[0] not in hold
            total = sum(s["size"] for s in sources)
            with dask_client(workers, scheduler, client,
                             threads=PARSE_TASKS_PER_CORE if _uncacheable(total) else 1) as c:
                t_ready = time.time()
                order = _choose_order(c, root, old, sources, o)
                phases = {"order": time.time() - t_ready}
                results = _run_tasks(c, root, tasks, o, total, progress, order["digest"] if order else None)
                phases["parse"] = time.time() - t_ready - phases["order"]
                summary = _commit(c, root, out, old, sources, tasks, results, o, generation, t_ready, order, phases)
                summary["startup_seconds"] = round(t_ready - t0, 3)
        except BaseException as e:
            if old is None:
                shutil.rmtree(root, ignore_errors=True)
            else:
                _clean_orphans(out, fmt.read_manifest(out))
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS):
                raise IngestError(f"{out}: cannot write the store ({e.strerror}); nothing was committed") from None
            raise
        return summary
    finally:
        _unlock(out, lock_fd)


def _check_append_options(out: str, old: dict, o: IngestOptions) -> None:
    """An append reads its inputs as the store's first ingest did: the same index base and value dtype (rows with
    columns shifted by one, or blocks of two dtypes, would be a different store under the same manifest)."""
    base = 0 if o.zero_based else 1
    if old.get("index_base", 1) != base:
        flag = "with" if old.get("index_base", 1) == 0 else "without"
        raise IngestError(f"{out}: the store's feature indices are {old.get('index_base', 1)}-based; append "
                          f"{flag} --zero-based (these inputs were read as {base}-based)")
    have = (old.get("feature_order") or {}).get("kind", "given")
    if o.feature_order != "auto" and o.feature_order != have:
        raise IngestError(f"{out}: the store's features are in {have} order (set by its first ingest, or by "
                          f"`sparsepipe reorder`); an append keeps it: leave out --feature-order or give "
                          f"--feature-order {have}")
    if old.get("data_dtype", "float32") != o.dtype:
        raise IngestError(f"{out}: the store's values are {old.get('data_dtype')}; append with --dtype "
                          f"{old.get('data_dtype')} (got --dtype {o.dtype})")


def _run_tasks(c, root, tasks, o, total_bytes, progress, order=None):
    from pipeline.cluster import as_completed

    opts = asdict(o)
    futs = [c.submit(parse_task, root, t, opts, order, key=f"parse-{t.keys[0]}-{uuid.uuid4().hex[:6]}", pure=False)
            for t in tasks]
    pos = {f.key: i for i, f in enumerate(futs)}
    results = [None] * len(futs)
    done_bytes = done_rows = 0
    for fut in as_completed(c, futs):
        try:
            res = fut.result()
        except IngestError:
            for f2 in futs:
                f2.cancel()
            raise
        results[pos[fut.key]] = res
        done_bytes += sum(r["bytes"] for r in res)
        done_rows += sum(r["rows"] for r in res)
        if progress:
            progress(done_bytes, done_rows, total_bytes)
    return results


def _sum_source_stats(c, root: str, keys: list[str], width: int, base: str | None, out: str,
                      drop: list[str]) -> int:
    """The training split's statistics, on the workers: one task, or (more than :data:`stats.BAND_ENTRIES`
    entries to add) one task per feature band, at most two per worker, and one that writes their parts in
    feature order. The bands' edges follow the largest block's features; the sums are the same either way.
    Then the statistics of the blocks ``drop`` are removed, while the parts are written. Returns the number of
    bands."""
    from pipeline.cluster import slots, wait

    groups = _stats_groups(root, keys, base)
    sizes = [stats.stats_size(g) for g in groups]
    bands = min(2 * slots(c), -(-sum(sizes) // stats.BAND_ENTRIES))
    sample = None
    if keys and bands > 1:  # a whole block's features: the last one (the input's tail) may hold a few rows
        first = len(groups) - len(keys)
        sample = fmt.raw_map(groups[first + int(np.argmax(sizes[first:]))], stats.BLOCK_STATS[0])
    edges = stats.band_edges(sample if sample is not None else np.zeros(0, np.int64), width, bands)
    if len(edges) <= 2:
        c.submit(source_stats_task, root, keys, width, base, out, pure=False).result()
        c.gather(_drop_block_stats(c, root, drop))
        return 1
    parts = [c.submit(band_stats_task, root, keys, base, lo, hi, pure=False) for lo, hi in zip(edges, edges[1:])]
    wait(c, parts)
    c.gather([c.submit(_write_source_stats, root, out, width, *parts, pure=False), *_drop_block_stats(c, root, drop)])
    return len(parts)


def _drop_block_stats(c, root: str, keys: list[str]) -> list:
    """Futures removing the statistics of the blocks ``keys`` (summed), two tasks per worker: at 350k webspam-like
    rows 5.7 GB in 1,092 files, 1.5-1.9 s on the client alone."""
    from pipeline.cluster import slots

    step = -(-len(keys) // (2 * slots(c))) or 1
    return [c.submit(drop_block_stats_task, root, keys[i:i + step], pure=False) for i in range(0, len(keys), step)]


def drop_block_stats_task(root: str, keys: list[str]) -> None:
    """Dask task: remove the statistics of the blocks ``keys`` once the commit has added them."""
    for k in keys:
        for name in stats.BLOCK_STATS:
            shutil.rmtree(f"{root}/blocks/{k}/{name}", ignore_errors=True)


def _clean_orphans(out: str, manifest: dict) -> None:
    """Remove block and stats directories a killed append left behind (not listed in the manifest)."""
    listed = {b["key"] for b in manifest["blocks"]}
    for d in glob.glob(os.path.join(glob.escape(out), "blocks", "*")):
        if os.path.isdir(d) and os.path.basename(d) not in listed:
            shutil.rmtree(d, ignore_errors=True)
    for d in glob.glob(os.path.join(glob.escape(out), "stats", "v*")):
        if os.path.basename(d) != os.path.basename(manifest.get("stats", "")):
            shutil.rmtree(d, ignore_errors=True)


def _commit(c, root, out, old, sources, tasks, results, o, generation, t0, order=None, phases=None):
    """Check and commit the parsed blocks; returns the summary. ``phases``: the seconds of the steps before the
    commit since ``t0`` (order, parse), completed with its own (statistics, commit) as ``phase_seconds``."""
    phases = dict(phases or {})
    t_commit = time.time()
    # absolute line numbers and errors, in row order
    errors, skipped = [], []
    per_source_lines = {}
    blocks = []
    for task, res_list in zip(tasks, results):
        src = sources[task.source]
        for r in res_list:
            base = r["line_offset"] if r["line_offset"] is not None else per_source_lines.get(task.source, 0)
            for (ln, col, code) in r["errors"]:
                item = (src["path"], base + ln + 1, col, code)
                (skipped if o.on_invalid == "skip" else errors).append(item)
            r["first_line"] = base + 1
            r["source"] = task.source
            r["byte_range"] = [task.start, task.end] if task.compression is None else None
            if r["line_offset"] is None:
                per_source_lines[task.source] = base + r["n_lines"]
            blocks.append(r)
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more range(s) with errors)" if len(errors) > 1 else ""
        raise IngestError(_format_error(*first) + more + "; nothing was committed")
    # labels, per source; under "auto" a file whose every label is 1 (+1 of {-1,+1} and {0,1}, -1 of {1,2}) takes
    # the encoding of the store or of this ingest's other files, decided first
    prev_maps = [tuple(b["label_map"]) for b in (old["blocks"] if old else []) if b.get("label_map")]
    kinds = {old["labels"]["kind"]} if old and old["n_rows"] else set()
    label_map, notes, seen, guessed = {}, [], {}, set()
    for s_idx, src in enumerate(sources):
        counts, first = {}, {}
        for b in blocks:
            if b["source"] != s_idx:
                continue
            for v, n, ln in zip(b["label_values"], b["label_counts"], b["label_first_line"]):
                counts[v] = counts.get(v, 0) + n
                first[v] = min(first.get(v, 1 << 62), b["first_line"] + ln)
        seen[s_idx] = (counts, first)
    ambiguous = [i for i, (counts, _) in seen.items() if o.labels == "auto" and set(counts) == {1.0}]
    for s_idx in [i for i in seen if i not in ambiguous] + ambiguous:
        counts, first = seen[s_idx]
        src = sources[s_idx]
        if not counts:
            label_map[s_idx] = None
            continue
        if s_idx in ambiguous and not prev_maps:
            guessed.add(s_idx)
            notes.append(f"{src['path']}: every label is 1, read as +1 ({{-1,+1}} or {{0,1}}); if 1 is the "
                         f"negative class ({{1,2}}), ingest with --labels 1,2")
        enc = _decide_labels(o.labels, counts, first, src["path"], prev_maps)
        kind = "binary" if enc else "regression"
        if kinds and kind not in kinds:
            bad = min(first.items(), key=lambda kv: kv[1])
            raise IngestError(f"{src['path']}:{bad[1]}: labels are {kind} but the store's are "
                              f"{kinds.pop()}; nothing was committed")
        kinds.add(kind)
        label_map[s_idx] = enc
        if enc:
            prev_maps.append(enc)
    _check_label_meaning(old if o.labels == "auto" else None, sources, label_map)
    kind = kinds.pop() if kinds else "binary"
    zeros = sum(b.get("zeros", 0) for b in blocks)
    if zeros:
        notes.append(f"{zeros:,} explicit zero value(s) (j:0{', or below float32' if o.dtype == 'float32' else ''}) "
                     f"were checked but not stored: the store holds non-zeros only")
    # width
    width = max([o.n_features or 0, old["n_features"] if old else 0] + [b["max_index"] for b in blocks])
    if _grown_past_order_thresholds(old, order, sources, width):
        notes.append(f"{out} keeps the input's feature ids and has grown past what `--feature-order auto` numbers by "
                     f"frequency (1 GiB of input, 2^20 features): `sparsepipe reorder {out} --out NEW` copies it in "
                     f"frequency order, for faster training at this width")
    new_keys = [b["key"] for b in blocks if b["rows"] > 0]
    hold = set(_choose_holdout(new_keys, o.holdout, o.seed, generation))
    entries = list(old["blocks"]) if old else []
    for b in blocks:
        if b["rows"] == 0:
            continue
        enc = label_map[b["source"]]
        entries.append({"key": b["key"], "rows": b["rows"], "nnz": b["nnz"], "max_index": b["max_index"],
                        "source": len(old["sources"]) + b["source"] if old else b["source"],
                        "byte_range": b["byte_range"], "first_line": b["first_line"],
                        "checksum": b["checksum"], "split": "holdout" if b["key"] in hold else "train",
                        "label_map": list(enc) if enc else None, "generation": generation,
                        "_labels": (b["label_values"], b["label_counts"])})
    # feature statistics over the training split
    version = (old["manifest_version"] + 1) if old else 1
    stats_path = f"stats/v{version:06d}"
    new_train = [e["key"] for e in entries if e.get("generation") == generation and e["split"] == "train"]
    # summed, the blocks' own statistics go before the manifest lists the blocks
    t_stats = time.time()
    stats_bands = _sum_source_stats(c, root, new_train, width, old.get("stats") if old else None, stats_path,
                                    [b["key"] for b in blocks])
    phases["statistics"] = time.time() - t_stats
    # skipped lines, beside the blocks
    skipped_file = None
    if skipped:
        os.makedirs(f"{root}/skipped", exist_ok=True)
        skipped_file = f"skipped/{generation:04d}.jsonl"
        with open(f"{root}/{skipped_file}", "w", encoding="utf-8") as f:
            for path, line, col, code in skipped:
                f.write(json.dumps({"file": path, "line": line, "column": col,
                                    "reason": libsvm.ERROR_MESSAGES[code]}) + "\n")
    # label counts
    label_counts = dict(old["labels"]["counts"]) if old else {}
    new_holdout = {}  # class counts of the new holdout blocks (binary)
    for e in entries:
        lab = e.pop("_labels", None)
        if lab is None:
            continue
        for v, n in zip(*lab):
            name = ("+1" if v == e["label_map"][1] else "-1") if e["label_map"] else f"{v:g}"
            label_counts[name] = label_counts.get(name, 0) + n
            if e["split"] == "holdout" and e["label_map"]:
                new_holdout[name] = new_holdout.get(name, 0) + n
    if len(new_holdout) == 1:
        (cls, n), = new_holdout.items()
        notes.append(f"every one of the {n:,} new holdout rows is {cls}: holdout error says little and AUC is "
                     f"undefined; is the input sorted by label? (a shuffled copy, or a smaller --block-mb for "
                     f"more holdout blocks)")
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    src_entries = list(old["sources"]) if old else []
    for s_idx, src in enumerate(sources):
        n_rows = sum(b["rows"] for b in blocks if b["source"] == s_idx)
        n_skip = sum(1 for s in skipped if s[0] == src["path"])
        src_entries.append({**src, "rows": n_rows, "skipped": n_skip, "generation": generation,
                            "ingested_at": now,
                            "label_map": list(label_map[s_idx]) if label_map.get(s_idx) else None,
                            **({"label_guess": True} if s_idx in guessed else {})})
    manifest = {
        "format": fmt.FORMAT, "format_version": fmt.FORMAT_VERSION,
        "store_id": old["store_id"] if old else uuid.uuid4().hex,
        "manifest_version": version, "generation": generation, "updated_at": now,
        "n_rows": int(sum(e["rows"] for e in entries)), "n_features": int(width),
        "nnz": int(sum(e["nnz"] for e in entries)),
        "index_base": 0 if o.zero_based else 1,
        "indices_dtype": "int32" if width < 2**31 else "int64", "data_dtype": o.dtype,
        "labels": {"kind": kind, "counts": label_counts},
        "blocks": entries,
        "holdout": {"fraction": o.holdout, "seed": o.seed,
                    "blocks": [e["key"] for e in entries if e["split"] == "holdout"]},
        "stats": stats_path, "stats_split": "train",
        **({"feature_order": order} if order else {}),
        "sources": src_entries,
        "skipped": {"count": int((old["skipped"]["count"] if old else 0) + len(skipped)),
                    "files": (old["skipped"]["files"] if old else []) + ([skipped_file] if skipped_file else [])},
        "options": {**asdict(o), "history": (old["options"]["history"] if old else []) + [
            {"generation": generation, **asdict(o)}]},
    }
    if old is None:
        fmt.make_group(root, {fmt.ATTR: {"format": fmt.FORMAT}})
        fmt.write_manifest(root, manifest)
        os.rename(root, out)
        fmt._fsync_dir(os.path.dirname(os.path.abspath(out)))
    else:
        from pipeline.store.readlock import committing

        with committing(out):  # no run reads the old version meanwhile (pipeline/store/readlock.py)
            fmt.write_manifest(out, manifest)
            old_stats = old.get("stats")
            if old_stats and old_stats != stats_path:
                shutil.rmtree(os.path.join(out, old_stats), ignore_errors=True)
    t_end = time.time()
    phases["commit"] = t_end - t_commit - phases["statistics"]
    return {
        "store": out, "n_rows": manifest["n_rows"], "n_features": manifest["n_features"],
        "nnz": manifest["nnz"], "n_blocks": len(entries),
        "holdout_blocks": len(manifest["holdout"]["blocks"]),
        "new_blocks": sum(1 for e in entries if e["generation"] == generation),
        "new_rows": int(sum(e["rows"] for e in entries if e["generation"] == generation)),
        "new_holdout_rows": int(sum(e["rows"] for e in entries if e["generation"] == generation
                                    and e["split"] == "holdout")),
        "skipped_lines": len(skipped), "skipped_file": skipped_file,
        "seconds": round(t_end - t0, 3),
        "phase_seconds": {k: round(v, 3) for k, v in phases.items()},
        "bytes_read": int(sum(s["size"] for s in sources)),
        "generation": generation, "labels": manifest["labels"], "stats_bands": stats_bands,
        "notes": notes,
    }
