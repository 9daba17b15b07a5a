"""`sparsepipe reorder`: a copy of a store with its features numbered by frequency (:mod:`pipeline.store.order`).

For a store whose ingest kept the input's ids: one ingested before `--feature-order` existed, or one that began small
(`auto` leaves inputs under 1 GiB in their own order) and grew by nightly appends. Re-ingesting would need every input
again; the store itself holds the rows. The order comes from the store's own feature statistics: the exact non-zero
counts of its training split, the most frequent first (ties: the lower id), where an ingest samples 64 MiB.

Each block is read (its checksum checked), its ids renumbered (rows keep their order and values, so every model is
the same to the last bit, in the input's ids: tested for sgd, tg, ftrl and stsgd with its refit) and written with a
new checksum, one task per block.
The statistics keep their sums: each feature's entry moves to its new id. The copy is written beside ``out`` and
renamed into place when complete, so ``out`` is the whole store or absent, as after an ingest. The source store is
read under the shared lock (an append waits) and is not changed. The copy keeps the store's id, its blocks, holdout,
sources and generations; it is the store's next manifest version.
"""
from __future__ import annotations

import copy
import glob
import os
import shutil
import time
import uuid

import numpy as np

from pipeline.cluster import in_order, slots
from pipeline.store import format as fmt
from pipeline.store import order as forder
from pipeline.store import stats


class ReorderError(ValueError):
    """A store that cannot be reordered, or an output that cannot be written; nothing was written."""


def reorder_block_task(src: str, key: str, root: str, digest: str) -> dict:
    """Dask task: block ``key`` of the store ``src`` (read under the caller's shared lock: no append commits
    meanwhile) written to ``root`` in the order named by ``digest`` (at ``root/features``); returns the manifest
    entry's new fields (checksum, max_index)."""
    from pipeline.ingest import write_block
    from pipeline.formats.libsvm import relabel_ids
    from pipeline.store import checksum
    from pipeline.store.reader import open_store

    st = open_store(src)
    entry = st.entry(key)
    blk = st.block(entry, verify=True)
    indices = blk.indices.copy()
    top = relabel_ids(indices, forder.cached_maps(f"{root}/{forder.PATH}", digest)[0])
    indptr, data, labels = blk.indptr, blk.data, blk.raw_labels
    res = {"key": key, "max_index": max(int(entry["max_index"]), int(top)),
           "checksum": checksum.checksum(indptr, indices, data, labels),
           "_arrays": {"indptr": indptr, "indices": indices, "data": data, "labels": labels}}
    write_block(root, res)
    return {"key": key, "max_index": res["max_index"], "checksum": res["checksum"]}


def reorder(store: str, out: str, *, workers: int | None = None, scheduler: str | None = None, client=None,
            progress=None) -> dict:
    """Write ``out``: a copy of ``store`` with its features numbered by frequency (the module docstring).
    ``progress(blocks_done, blocks)``. Returns a summary (store, out, blocks, hot, seconds, manifest_version)."""
    from pipeline.cluster import dask_client
    from pipeline.store.reader import open_store
    from pipeline.store.readlock import reading

    t0 = time.time()
    store, out = os.fspath(store).rstrip("/"), os.fspath(out).rstrip("/")
    if os.path.realpath(store) == os.path.realpath(out):
        raise ReorderError(f"{out}: give a new path for the reordered copy (the store {store} is not changed)")
    if os.path.lexists(out):
        raise ReorderError(f"{out}: already exists; give a new path for the reordered copy")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ReorderError(f"{out}: the directory {parent} does not exist")
    with reading(store):
        st = open_store(store)
        old = st.manifest
        if st.feature_order:
            raise ReorderError(f"{store}: its features are already numbered by frequency (manifest "
                               f"feature_order {st.feature_order['digest']}); nothing to do")
        feature, count, sumsq = stats.read_stats(f"{st.path}/{old['stats']}")
        hot, at = forder.by_frequency(feature, count)
        if not hot.shape[0]:
            raise ReorderError(f"{store}: its training split holds no feature; nothing to order")
        for stale in glob.glob(glob.escape(out) + ".tmp-*"):  # a killed reorder's
            shutil.rmtree(stale, ignore_errors=True)
        root = f"{out}.tmp-{uuid.uuid4().hex[:12]}"
        try:
            fmt.make_group(root)
            fmt.make_group(f"{root}/blocks")
            fmt.make_group(f"{root}/{forder.PATH}")
            fmt.write_array(f"{root}/{forder.PATH}", "hot", hot)
            digest = forder.digest(hot)
            keys = [e["key"] for e in old["blocks"]]
            with dask_client(workers, scheduler, client) as c:
                new = _blocks(c, st.path, keys, root, digest, progress)
            manifest = _manifest(old, new, hot, digest, store)
            stats.write_stats(f"{root}/{manifest['stats']}", np.arange(at.shape[0]), count[at], sumsq[at],
                              int(old["n_features"]))
            if os.path.isdir(f"{st.path}/skipped"):
                shutil.copytree(f"{st.path}/skipped", f"{root}/skipped")
            fmt.make_group(root, {fmt.ATTR: {"format": fmt.FORMAT}})
            fmt.write_manifest(root, manifest)
            os.rename(root, out)
            fmt._fsync_dir(parent)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
    return {"store": store, "out": out, "blocks": len(keys), "hot": int(hot.shape[0]), "digest": digest,
            "manifest_version": manifest["manifest_version"], "seconds": round(time.time() - t0, 3)}


def _blocks(c, src: str, keys: list, root: str, digest: str, progress) -> dict:
    """{key: reorder_block_task's result} of every block, two tasks per worker in flight (:func:`in_order`: after a
    failed task, the running ones end before its error is raised, so none writes into ``root`` once the caller has
    removed it)."""
    out = {}
    for r in in_order(lambda i: c.submit(reorder_block_task, src, keys[i], root, digest,
                                         key=f"reorder-{keys[i]}-{uuid.uuid4().hex[:6]}", pure=False),
                      len(keys), 2 * slots(c)):
        out[r["key"]] = r
        if progress:
            progress(len(out), len(keys))
    return out


def _manifest(old: dict, new: dict, hot: np.ndarray, digest: str, store: str) -> dict:
    """``old``'s manifest for the reordered copy: the blocks' new checksums and widths, the order, the next
    version's statistics."""
    m = copy.deepcopy(old)
    for e in m["blocks"]:
        e.update(checksum=new[e["key"]]["checksum"], max_index=new[e["key"]]["max_index"])
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    m["manifest_version"] = version = int(old["manifest_version"]) + 1
    m["updated_at"] = now
    m["stats"] = f"stats/v{version:06d}"
    m["feature_order"] = {"kind": "frequency", "path": forder.PATH, "hot": int(hot.shape[0]), "digest": digest,
                          "source": "statistics", "reordered_from": {"store": os.path.abspath(store),
                                                                     "manifest_version": old["manifest_version"],
                                                                     "at": now}}
    return m
