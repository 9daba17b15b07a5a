"""The block store on disk: zarr v3 group, one self-contained CSR group per block, manifest in the root.

Layout::

    STORE/zarr.json                      root attrs {"sparsepipe": manifest}
    STORE/blocks/<key>/{indptr,indices,data,labels,stats_idx,stats_nnz,stats_sumsq}
    STORE/stats/v<manifest_version>/{feature,col_nnz,col_sumsq}   training-split feature statistics (sparse:
                                         the features with a non-zero count, in feature order)
    STORE/skipped/<generation>.jsonl     lines dropped by --on-invalid skip

Blocks are written once and never modified; readers trust only the manifest, so a block directory not
listed there does not exist. The manifest is replaced atomically (write + os.replace) as the last step of
an append; a new store is built under a temporary sibling name and renamed into place.
"""
from __future__ import annotations

import json
import os
import zlib

import numpy as np
import zarr
from zarr.codecs import BloscCodec, BloscShuffle

FORMAT = "sparsepipe-store"
FORMAT_VERSION = 2  # 2: sparse feature statistics (version 1 stores, dense, are still read)
ATTR = "sparsepipe"

_COMPRESSORS = (BloscCodec(cname="lz4", clevel=5, shuffle=BloscShuffle.shuffle),)


class StoreError(Exception):
    """A store that cannot be opened or committed; the message names the path and the cause."""


def one_codec_thread() -> None:
    """Compress on the calling thread only: a Dask worker thread is one core (blosc defaults to all cores)."""
    import numcodecs.blosc

    if numcodecs.blosc.get_nthreads() != 1:
        numcodecs.blosc.set_nthreads(1)


# An array whose sample gains less than this from compression is stored raw: real-valued features
# (tf-idf, normalised counts) compress ~1.1x with lz4 and cost a third of a block's write time to do it.
MIN_RATIO = 1.15
_SAMPLE = 1 << 18


def _worth_compressing(arr: np.ndarray) -> bool:
    """lz4 (the store's settings) on a 256 KiB slice from the middle of ``arr`` saves >= 1 - 1/MIN_RATIO."""
    if arr.nbytes <= 4 * _SAMPLE:
        return True
    from numcodecs import Blosc

    k = max(1, _SAMPLE // arr.itemsize)
    mid = arr.shape[0] // 2
    sample = np.ascontiguousarray(arr[mid: mid + k])
    out = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE).encode(sample)
    return sample.nbytes >= MIN_RATIO * len(out)


def write_array(group_path: str, name: str, arr: np.ndarray, chunk: int | None = None) -> None:
    """Write ``arr`` as zarr v3 array ``group_path/name``, one chunk unless ``chunk``: blosc-lz4 with byte
    shuffle, or raw when a sample shows compression would not pay (:data:`MIN_RATIO`)."""
    chunks = (max(1, min(chunk or arr.shape[0], arr.shape[0])),)
    z = zarr.create_array(store=group_path, name=name, shape=arr.shape, dtype=arr.dtype, chunks=chunks,
                          compressors=_COMPRESSORS if _worth_compressing(arr) else None, overwrite=True)
    if arr.shape[0]:
        z[:] = arr


def read_array(group_path: str, name: str) -> np.ndarray:
    return zarr.open_array(store=group_path, path=name, mode="r")[...]


def checksum(*arrays: np.ndarray) -> str:
    """crc32 over the arrays' bytes, hex; recorded per block in the manifest."""
    c = 0
    for a in arrays:
        c = zlib.crc32(np.ascontiguousarray(a).view(np.uint8), c)
    return f"{c:08x}"


def make_group(path: str, attrs: dict | None = None) -> None:
    zarr.open_group(store=path, mode="a", zarr_format=3, attributes=attrs or {})


def read_manifest(path: str) -> dict:
    meta_path = os.path.join(path, "zarr.json")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise StoreError(f"{path}: not a sparsepipe store (no zarr.json)") from None
    except json.JSONDecodeError as e:
        raise StoreError(f"{meta_path}: unreadable metadata ({e})") from None
    man = meta.get("attributes", {}).get(ATTR)
    if not man or man.get("format") != FORMAT:
        raise StoreError(f"{path}: zarr group is not a sparsepipe store (no '{ATTR}' manifest)")
    if man.get("format_version", 0) > FORMAT_VERSION:
        raise StoreError(f"{path}: store format {man['format_version']} is newer than this sparsepipe "
                         f"({FORMAT_VERSION}); upgrade sparsepipe")
    return man


def write_manifest(path: str, manifest: dict) -> None:
    """Replace the root zarr.json atomically with ``manifest`` as its sparsepipe attribute."""
    meta_path = os.path.join(path, "zarr.json")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    meta.setdefault("attributes", {})[ATTR] = manifest
    tmp = meta_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, meta_path)
    _fsync_dir(path)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def dir_size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
