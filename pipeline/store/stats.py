"""Per-feature statistics of the training split: non-zero counts and sums of squares (E[x_j²] = sumsq/rows).

An ingest writes each block's statistics of the features it touches beside it (``stats_idx`` ascending,
``stats_nnz``, ``stats_sumsq``; raw, short-lived), except for holdout blocks chosen when the ingest was
planned (never summed; :func:`block_stats` computes a block's statistics from its arrays should they be
needed). The commit adds the training blocks' statistics in block order, so the sums do not depend
on the number of workers (a feature's sum is added in block order): sets that fit in memory together are
read side by side and summed band by band in the cache (one kernel with the per-block statistics,
:mod:`pipeline.kernels.colstats`); more go one by one through a float64[W, 2] accumulator (count and sum of
squares side by side: one cache line per feature) with a bitmap of the touched features; the commit then
removes the blocks' statistics (a third of a block's bytes on disk). The store's
statistics are written sparsely: the features that occur, in feature order, so reading and writing them
costs what the distinct features cost, not the declared width.
"""
from __future__ import annotations

import functools
import json
import os
import threading

import numba
import math

import numpy as np

from pipeline import arena
from pipeline.kernels import colstats
from pipeline.kernels.exact_sum import exact_sum
from pipeline.kernels.intrinsics import base
from pipeline.store import format as fmt

DAMAGED = "the store is damaged: `sparsepipe verify` checks it, ingesting its sources again rebuilds it"
VERSION_STATS = ("feature", "col_nnz", "col_sumsq")  # a store version's statistics (sparse layout)
BLOCK_STATS = ("stats_idx", "stats_nnz", "stats_sumsq")  # a block's statistics while an ingest runs
_SCRATCH = threading.local()  # a thread's accumulator (band tasks of one commit may run on threads side by side)


def scratch(width: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's zeroed accumulator: float64[width, 2] and a bitmap of the features touched
    (uint64[ceil(width / 64)]). Kept between calls; callers hand it back zeroed (see :func:`harvest`)."""
    sc = getattr(_SCRATCH, "cols", None)
    if sc is None or sc[0].shape[0] < width:
        _SCRATCH.cols = None
        sc = (np.zeros((width, 2), np.float64), np.zeros((width + 63) >> 6, np.uint64))
        _SCRATCH.cols = sc
    return sc


def release_scratch() -> None:
    """Free this thread's accumulator (266 MB at webspam width)."""
    _SCRATCH.cols = None


@numba.njit(cache=True, nogil=True)
def harvest(acc, bits):
    """(touched features in increasing order, their counts, their sums of squares); reads only the
    marked rows of ``acc`` and hands ``acc`` and ``bits`` back zeroed."""
    one = np.uint64(1)
    n = 0
    for w in range(bits.shape[0]):
        b = bits[w]
        while b != 0:
            n += 1
            b &= b - one
    feature = np.empty(n, np.int64)
    count = np.empty(n, np.int64)
    sumsq = np.empty(n, np.float64)
    flat = acc.reshape(-1)  # (count, sum of squares) pairs, as colstats.drain reads them
    colstats.drain(base(bits), bits.shape[0], base(flat), 0, feature, count, sumsq, 0)
    return feature, count, sumsq


# The concatenated sets of the banded sum cost 16 bytes per entry; they may take this much, or as much as
# the dense accumulator (16 bytes per feature of the width) would, whichever is larger.
GATHER_BYTES = 128 << 20
# More sets than GATHER_BYTES allows are read in groups of this many bytes (16 per entry) and each group is added
# into the width-sized accumulator band by band: at 350k webspam-like rows ~15 blocks' share of a commit's band.
GROUP_BYTES = 64 << 20
# A commit whose gathered sets take at most this much may keep them in the worker thread's reusable buffers
# (pipeline.arena): a long-lived worker's next small commit then pays no page faults for them.
REUSE_BYTES = 64 << 20


def sum_stats(loaders: list, sizes: list[int], width: int, reuse: bool = False, lo: int = 0):
    """(feature - lo, col_nnz, col_sumsq) of the statistics sets that ``loaders`` return (features lo <= j <
    lo + width), added in list order.

    ``loaders[k](out=(idx, cnt, ss))`` returns set k as three arrays, read into the heads of the given
    arrays where it can (see :func:`read_stats`); ``sizes[k]`` bounds its length. Sets that fit in memory
    together (see :data:`GATHER_BYTES`) are read side by side and summed band by band in the cache
    (:func:`pipeline.kernels.colstats.band_sums`, one "row" per set); more are read in such groups and added
    group after group into the width-sized accumulator, band by band (:func:`pipeline.kernels.colstats.band_adds`;
    its first touch costs ~0.3 s at webspam width on a fresh worker). Both add each feature's values in list
    order: bit-identical results. ``reuse``: sets of at most :data:`REUSE_BYTES` are gathered in, and summed
    into, this thread's :mod:`pipeline.arena` buffers (the results are then views of them, valid until its next
    ``reuse`` work)."""
    total = sum(sizes)
    idx_dtype = np.int32 if width < 2**31 else np.int64
    if total * 16 <= max(GATHER_BYTES, 16 * width):
        keep = reuse and total * 16 <= REUSE_BYTES
        bufs = (arena.empty("stats.idx", total, idx_dtype, keep), arena.empty("stats.cnt", total, np.int32, keep),
                arena.empty("stats.ss", total, np.float64, keep))  # block counts are int32; widened past 2**31
        ptr, (idx, cnt, ss) = _gather(loaders, sizes, bufs, lo)
        n = ptr[-1]
        return colstats.column_stats(ptr, idx[:n], ss[:n], width, counts=cnt[:n],
                                     count_dtype=cnt.dtype, reuse=keep, ascending=True)  # sets: sorted
    acc, bits = scratch(width)
    try:
        cap = max(GROUP_BYTES // 16, max(sizes))
        bufs = np.empty(cap, idx_dtype), np.empty(cap, np.int32), np.empty(cap, np.float64)
        k = 0
        while k < len(loaders):  # groups of sets that fill the buffers
            end, used = k + 1, sizes[k]
            while end < len(loaders) and used + sizes[end] <= cap:
                used += sizes[end]
                end += 1
            ptr, (idx, cnt, ss) = _gather(loaders[k:end], sizes[k:end], bufs, lo)
            n = ptr[-1]
            colstats.band_adds(ptr, idx[:n], ss[:n], cnt[:n], width, colstats.SETS_BAND, acc.reshape(-1), bits,
                               np.empty(end - k, np.int64))
            k = end
        return harvest(acc, bits)
    except BaseException:
        release_scratch()  # not known to be zero any more
        raise


def _gather(loaders: list, sizes: list[int], bufs: tuple, lo: int) -> tuple:
    """(ptr, (idx, cnt, ss)): the sets of ``loaders`` read one after another into the buffers ``bufs`` (counts
    widened to int64 where their sum could pass int32), ids shifted by -``lo``; set k at ptr[k]:ptr[k + 1]."""
    idx, cnt, ss = bufs
    ptr, most = [0], 0  # most: a bound on any feature's summed count
    for load, size in zip(loaders, sizes):
        at = ptr[-1]
        got = load(out=(idx[at:at + size], cnt[at:at + size], ss[at:at + size]))
        n = got[0].shape[0]
        most += int(got[1].max(initial=0))
        if most > np.iinfo(cnt.dtype).max:
            cnt = cnt.astype(np.int64)
        for dst, src in zip((idx, cnt, ss), got):
            if not np.may_share_memory(dst, src):
                dst[at:at + n] = src
        if lo:
            idx[at:at + n] -= lo
        ptr.append(at + n)
    return np.array(ptr, np.int64), (idx, cnt, ss)


# A commit whose statistics sets hold more entries than this sums them in feature bands, one task per band
# (at most two per worker): 355M entries at 350k webspam-like rows took 8.5 s on one worker thread, a quarter of
# the ingest, and a serial step that more workers do not shorten. Below it one task is as fast (35M entries:
# 0.8-1.1 s either way; the bands' parts are then copied into one array, fresh memory).
BAND_ENTRIES = 64 << 20


def band_edges(sample: np.ndarray, width: int, bands: int) -> list[int]:
    """Feature boundaries 0 = e_0 < ... < e_k = width of at most ``bands`` bands holding about as many entries
    each as the sorted feature ids ``sample`` (one block's statistics) put in them."""
    if bands <= 1 or sample.shape[0] == 0:
        return [0, width]
    cut = np.asarray(sample[np.linspace(0, sample.shape[0] - 1, bands + 1)[1:-1].astype(np.int64)], np.int64)
    return [0, *sorted({int(e) for e in cut if 0 < e < width}), width]


def _band_bounds(group: str, lo: int, hi: int) -> tuple | None:
    """(a, b, dtypes): positions [a, b) of the features lo <= j < hi in a block's raw statistics (two binary
    searches over a memory map of its feature ids, unmapped on return) and the arrays' dtypes; None for statistics
    stored otherwise (a store version's, compressed)."""
    layouts = [fmt.raw_layout(group, n) for n in BLOCK_STATS]
    if any(got is None for got in layouts):
        return None
    a, b = _positions(fmt.raw_map(group, BLOCK_STATS[0], layouts[0]), lo, hi)
    return a, b, [dtype for dtype, _ in layouts]


def _positions(ids: np.ndarray, lo: int, hi: int) -> tuple[int, int]:
    """[a, b): the positions of lo <= id < hi in the ascending ``ids``, searched in their own dtype (an int32 array
    searched for Python ints was first copied to int64 whole: 0.23-0.25 ms against 0.027 ms for a 64 MB block's
    set, 1,312 times a commit at 350k webspam-like rows)."""
    top = np.iinfo(ids.dtype).max
    a, b = np.searchsorted(ids, np.array([min(lo, top), min(hi, top)], ids.dtype))
    return int(a), int(b)


def _band_read(group: str, lo: int, hi: int, bounds, out=None):
    """The statistics of ``group`` for the features lo <= j < hi: read from its raw arrays (into the heads of
    ``out`` where the dtypes match), or sliced from all its statistics read. Read, not mapped: a band's pages
    mapped for the whole sum stayed in the worker's resident set (3.7 GB at webspam scale)."""
    if bounds is None:
        f, c, s = read_stats(group)
        a, b = _positions(f, lo, hi)
        return f[a:b], c[a:b], s[a:b]
    a, b, dtypes = bounds
    return tuple(fmt.read_raw(group, n, dt, a, b, o) for n, dt, o in zip(BLOCK_STATS, dtypes, out or (None,) * 3))


def band_sum(groups: list[str], lo: int, hi: int):
    """(feature, col_nnz, col_sumsq) of the features lo <= j < hi over the statistics of ``groups`` added in
    list order (:func:`sum_stats` on the band): the bands of a commit side by side give its whole sum bit for
    bit, each feature's values being added in the same order."""
    bounds = [_band_bounds(g, lo, hi) for g in groups]
    sizes = [stats_size(g) if b is None else b[1] - b[0] for g, b in zip(groups, bounds)]
    loaders = [functools.partial(_band_read, g, lo, hi, b) for g, b in zip(groups, bounds)]
    f, c, s = sum_stats(loaders, sizes, hi - lo, reuse=True, lo=lo)  # results copied out of the reused buffers
    f = np.asarray(f).astype(np.int32 if hi < 2**31 else np.int64)  # as write_stats stores them
    f += lo
    return f, np.asarray(c).astype(np.int32 if c.max(initial=0) < 2**31 else np.int64), np.array(s)


def stats_size(group: str) -> int:
    """Number of features in the statistics of ``group`` (a block's or a store version's), from metadata; for
    a block without statistics, its number of entries (a bound)."""
    for name in (BLOCK_STATS[0], "feature", "col_nnz", "indices"):
        try:
            with open(os.path.join(group, name, "zarr.json"), encoding="utf-8") as f:
                return int(json.load(f)["shape"][0])
        except FileNotFoundError:
            continue
    return 0


def write_stats(group: str, feature: np.ndarray, count: np.ndarray, sumsq: np.ndarray, width: int) -> None:
    """Write sparse statistics to the zarr group ``group``: ``feature`` int32 while width < 2**31, ``col_nnz``
    int32 while the counts fit (readers take any integer dtype)."""
    from pipeline.store import checksum

    fdt = np.int32 if width < 2**31 else np.int64
    cdt = np.int32 if count.max(initial=0) < 2**31 else np.int64
    arrays = feature.astype(fdt, copy=False), count.astype(cdt, copy=False), sumsq
    fmt.make_group(group, {"layout": "sparse", "n_features": int(width), "checksum": checksum.checksum(*arrays)})
    for name, arr in zip(VERSION_STATS, arrays):
        fmt.write_array(group, name, arr)


def read_stats(group: str, out: tuple | None = None, check: bool | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                                        np.ndarray]:
    """(feature, count, sum of squares) of the features present: a block's statistics
    (``stats_idx/stats_nnz/stats_sumsq``), a store version's (``feature/col_nnz/col_sumsq``), or the dense
    ``col_nnz/col_sumsq`` of format 1. ``out``: three arrays to read the sparse layouts into where the
    dtypes match (see :func:`pipeline.store.format.read_array`). A damaged array is a
    :class:`pipeline.store.format.StoreCorruptError` naming the group, and so are a store version's statistics
    that do not match their checksum when ``check`` (None: when reads are verified,
    :func:`pipeline.store.reader.verify_default`)."""
    if check is None:
        from pipeline.store.reader import verify_default

        check = verify_default()
    try:
        return _read_stats(group, out, check)
    except (fmt.StoreError, MemoryError):
        raise
    except Exception as e:  # a chunk that does not decode (blosc, zarr, lengths) or is missing
        raise fmt.StoreCorruptError(f"{group}: feature statistics cannot be read ({type(e).__name__}: {e}); "
                                    f"{DAMAGED}") from None


def _read_stats(group: str, out: tuple | None, check: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if os.path.exists(os.path.join(group, BLOCK_STATS[0], "zarr.json")):
        return tuple(fmt.read_array(group, n, o) for n, o in zip(BLOCK_STATS, out or (None,) * 3))
    if os.path.exists(os.path.join(group, VERSION_STATS[0], "zarr.json")):
        arrays = tuple(fmt.read_array(group, n, o) for n, o in zip(VERSION_STATS, out or (None,) * 3))
        key = _written(group) if check else None
        if key is not None and key not in _CHECKED:
            if not checksum_ok(group, arrays):
                raise fmt.StoreCorruptError(f"{group}: feature statistics do not match their checksum; {DAMAGED}")
            _CHECKED.add(key)
        return arrays
    if os.path.exists(os.path.join(group, "indices", "zarr.json")):  # a block written without them
        return block_stats(group)
    nnz = fmt.read_array(group, "col_nnz")
    f = np.flatnonzero(nnz)
    return f, nnz[f], fmt.read_array(group, "col_sumsq")[f]


# Statistics groups (as written: path, inode, mtime) whose checksum this process has verified: a run reads them twice
# (the calibration, the refit's support statistics) and a commit's band tasks once each; they are hashed once
# (~265 MB at 16.6M features). A store version's statistics are never rewritten in place.
_CHECKED: set = set()


def _written(group: str) -> tuple:
    st = os.stat(os.path.join(group, "zarr.json"))
    return os.path.realpath(group), st.st_ino, st.st_mtime_ns


def checksum_ok(group: str, arrays: tuple) -> bool:
    """A store version's statistics against the checksum recorded beside them (stores written since
    2026-11-26; lz4 has no checksum of its own). True when none is recorded."""
    with open(os.path.join(group, "zarr.json"), encoding="utf-8") as f:
        recorded = json.load(f).get("attributes", {}).get("checksum")
    if not recorded:
        return True
    from pipeline.store import checksum

    return checksum.matches(recorded, *arrays)


def block_stats(group: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The statistics of a block's CSR arrays, as the ingest computes them when it parses the block (a
    holdout block is written without them)."""
    with open(os.path.join(group, "zarr.json"), encoding="utf-8") as f:
        width = json.load(f)["attributes"]["shape"][1]
    arrays = [fmt.read_array(group, n) for n in ("indptr", "indices", "data")]
    return colstats.column_stats(*arrays, width)


def dense_stats(group: str, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(col_nnz int64[width], col_sumsq float64[width]); features beyond the stored ones are zero."""
    f, c, s = read_stats(group)
    keep = f < width
    col_nnz = np.zeros(width, np.int64)
    col_sumsq = np.zeros(width, np.float64)
    col_nnz[f[keep]] = c[keep]
    col_sumsq[f[keep]] = s[keep]
    return col_nnz, col_sumsq



def data_scale(store) -> dict:
    """Scalars of a store's training split that make steps and gravity scale-free: rows, non-zeros, the
    mean squared row norm E‖x‖² = Σ col_sumsq / rows and the rms non-zero value √(Σ col_sumsq / nnz)."""
    _, count, sumsq = read_stats(f"{store.path}/{store.manifest['stats']}")
    rows = int(sum(e["rows"] for e in store.entries("train")))
    nnz = int(count.sum())
    ss = exact_sum(sumsq)  # correctly rounded: the same in every feature order (pipeline/kernels/exact_sum.py)
    if not math.isfinite(ss):  # values past ~1e154: their squares overflow float64, no step or scale is finite
        raise ValueError(f"{store.path}: the squares of its values overflow float64 (the largest |x| is past "
                         f"~1e154): no step size is finite on such data; rescale the features before ingesting")
    return {"rows": rows, "nnz": nnz, "mean_sq_norm": ss / max(rows, 1) or 1.0,
            "x_rms": math.sqrt(ss / nnz) if nnz and ss > 0 else 1.0}


def calibrate(algo, store) -> None:
    """``algo.calibrate(data_scale(store))`` once per store version (fit and the engine both ask for it)."""
    key = (store.path, store.manifest["manifest_version"])
    if getattr(algo, "_scale_key", None) != key:
        algo.calibrate(data_scale(store))
        algo._scale_key = key
