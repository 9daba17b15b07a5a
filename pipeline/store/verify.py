"""`sparsepipe verify`: read every block of a store, check it against the manifest and recount the statistics.

Checks, per block: the directory and its four arrays exist and decode, their lengths match the manifest's
rows and nnz, the XXH64 (or older crc32) checksum matches, ``indptr`` starts at 0 and never decreases,
indices lie in ``[0, n_features)`` and labels are values of the block's recorded label encoding. For the
store: block keys are unique, the manifest's totals (rows, nnz, blocks per split) equal the sums over its
blocks, and the training split's feature statistics (non-zero count and sum of squares per feature) equal a
recount from the blocks. Every problem is listed; nothing stops at the first one.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pipeline.cluster import default_workers, in_order
from pipeline.kernels import colstats
from pipeline.store import checksum
from pipeline.store import stats as stats_mod
from pipeline.store.reader import StoreCorruptError, open_store

SUMSQ_RTOL = 1e-6  # float64 sums of float32 squares in another order


def _block_problems(blk, n_features: int) -> list[str]:
    try:
        indptr, indices, data, labels = blk._raw
    except StoreCorruptError as e:
        return [str(e).split(" is corrupt: ", 1)[-1].split("; re-ingest", 1)[0]]
    out = []
    if "checksum" in blk.entry and not checksum.matches(blk.entry["checksum"], indptr, indices, data, labels):
        out.append("its arrays do not match the manifest checksum")
    if indptr.shape[0] and (indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] != indices.shape[0]):
        out.append("indptr is not a valid row pointer (must start at 0, not decrease and end at nnz)")
    if indices.shape[0] and (int(indices.min()) < 0 or int(indices.max()) >= n_features):
        out.append(f"feature indices outside [0, {n_features})")
    m = blk.entry.get("label_map")
    if m is not None and labels.shape[0] and not np.all(np.isin(labels, np.asarray(m, labels.dtype))):
        out.append(f"labels other than the block's encoding {m}")
    if data.shape[0] and not np.all(np.isfinite(data)):
        out.append("non-finite values")
    return out


def _check_block(st, e: dict, n_features: int) -> tuple:
    """(the entry, its problems, its training statistics set (ids, counts, sums of squares) or None)."""
    blk = st.block(e)
    found = _block_problems(blk, n_features)
    sums = None
    if not found and e.get("split") == "train":
        sums = colstats.column_stats(blk.indptr, blk.indices, blk.data, n_features)
    return e, found, sums


def verify_store(path: str, progress=None, threads: int | None = None) -> dict:
    """A report ``{store, ok, blocks, bad_blocks: [{key, split, source, byte_range, first_line, problems}],
    problems: [...], seconds}``; raises StoreError only when ``path`` is not a readable store. Blocks are
    checked on ``threads`` threads (None: one per core); the report is the same on any number."""
    t0 = time.perf_counter()
    st = open_store(path, verify=False)
    man = st.manifest
    p = st.n_features
    entries = man["blocks"]
    sources = man.get("sources") or []
    bad, problems = [], []
    keys = [e["key"] for e in entries]
    dups = sorted({k for k in keys if keys.count(k) > 1})
    if dups:
        problems.append(f"block keys listed more than once: {', '.join(dups)}")
    # the recount folds each training block into width-sized sums in block order (the same float64 sums on
    # any thread count), ~16 bytes per feature, instead of keeping the blocks' statistics to the end (17 GB at
    # webspam scale). Blocks are read and checked on ``threads`` threads (the decoding, checksums and
    # statistics release the GIL), with at most two blocks more in flight than threads.
    acc_c = np.zeros(p, dtype=np.int64)
    acc_s = np.zeros(p, dtype=np.float64)
    recount_ok = True
    n_threads = max(1, min(threads or default_workers(), len(entries) or 1))
    with ThreadPoolExecutor(n_threads) as pool:
        checked = in_order(lambda i: pool.submit(_check_block, st, entries[i], p), len(entries), n_threads + 1)
        for done, (e, found, sums) in enumerate(checked, 1):
            if found:
                src = e.get("source")
                bad.append({"key": e["key"], "split": e.get("split"),
                            "source": sources[src]["path"] if isinstance(src, int) and 0 <= src < len(sources) else src,
                            "byte_range": e.get("byte_range"), "first_line": e.get("first_line"), "problems": found})
                if e.get("split") == "train":
                    recount_ok = False
            elif sums is not None:
                colstats.add_sets(acc_c, acc_s, *sums)
            if progress is not None:
                progress(done, len(entries))
    for name, total in (("n_rows", sum(int(e["rows"]) for e in entries)), ("nnz", sum(int(e["nnz"]) for e in entries))):
        if int(man.get(name, -1)) != total:
            problems.append(f"manifest {name} is {man.get(name)} but its blocks add up to {total}")
    hold = set(man.get("holdout", {}).get("blocks", []))
    if hold and hold != {e["key"] for e in entries if e.get("split") == "holdout"}:
        problems.append("the manifest's holdout list differs from the blocks marked holdout")
    if man.get("feature_order"):
        try:
            st.order_maps  # its array against the manifest's digest
        except Exception as ex:  # noqa: BLE001  a finding, not a crash
            problems.append(f"feature order {man['feature_order'].get('path')}/hot: {ex}")
    stats_checked = False
    if not recount_ok:
        problems.append("feature statistics not recounted: a training block is bad")
    elif man.get("stats"):
        try:
            sf, sc, ss = stats_mod.read_stats(os.path.join(st.path, man["stats"]), check=False)
            if not stats_mod.checksum_ok(os.path.join(st.path, man["stats"]), (sf, sc, ss)):
                problems.append(f"feature statistics {man['stats']} do not match their checksum")
        except Exception as ex:  # noqa: BLE001  unreadable statistics are a finding, not a crash
            problems.append(f"feature statistics {man['stats']} cannot be read ({type(ex).__name__}: {ex})")
        else:
            rf = np.flatnonzero(acc_c)
            rc, rs = acc_c[rf], acc_s[rf]
            keep = sc != 0
            sf, sc, ss = np.asarray(sf)[keep], np.asarray(sc)[keep], np.asarray(ss)[keep]
            if sf.shape != rf.shape or not np.array_equal(sf, rf):
                problems.append(f"feature statistics list {sf.shape[0]} features, the blocks have {rf.shape[0]}")
            elif not np.array_equal(sc.astype(np.int64), rc.astype(np.int64)):
                problems.append(f"feature non-zero counts differ from a recount for "
                                f"{int(np.sum(sc != rc))} features")
            elif not np.allclose(ss, rs, rtol=SUMSQ_RTOL, atol=0):
                problems.append(f"feature sums of squares differ from a recount for "
                                f"{int(np.sum(~np.isclose(ss, rs, rtol=SUMSQ_RTOL, atol=0)))} features")
            stats_checked = True
    return {"store": st.path, "ok": not bad and not problems, "blocks": len(entries), "bad_blocks": bad,
            "problems": problems, "stats_checked": stats_checked, "rows": sum(int(e["rows"]) for e in entries),
            "seconds": round(time.perf_counter() - t0, 3)}
