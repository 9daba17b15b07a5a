"""The block store on disk: zarr v3 group, one self-contained CSR group per block, manifest in the root.

Layout::

    STORE/zarr.json                      root attrs {"sparsepipe": manifest}
    STORE/blocks/<key>/{indptr,indices,data,labels}   (while an ingest runs, also its statistics
                                         stats_idx/stats_nnz/stats_sumsq, raw; the commit sums and removes them)
    STORE/stats/v<manifest_version>/{feature,col_nnz,col_sumsq}   training-split feature statistics (sparse:
                                         the features with a non-zero count, in feature order)
    STORE/skipped/<generation>.jsonl     lines dropped by --on-invalid skip
    STORE/features/hot                   a store in frequency order: the sampled features' input ids in their new
                                         order (pipeline/store/order.py); the blocks and statistics use the new ids

Blocks are written once and never modified; readers trust only the manifest, so a block directory not
listed there does not exist. The manifest is replaced atomically (write + os.replace) as the last step of
an append; a new store is built under a temporary sibling name and renamed into place.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np

from pipeline.atomic import fsync_dir as _fsync_dir
from pipeline.store import codec

FORMAT = "sparsepipe-store"
FORMAT_VERSION = 2  # 2: sparse feature statistics (version 1 stores, dense, are still read)
ATTR = "sparsepipe"

# Block arrays: blosc-lz4 with byte shuffle. pipeline.store.codec's settings serve zarr's codec, the direct
# writer's encoder and its zarr.json entry. zarr itself is imported only where it is used (the direct
# reader and writer cover the store's own arrays): importing it costs a short command ~0.3 s.
def _compressors() -> tuple:
    from zarr.codecs import BloscCodec

    return (BloscCodec(cname=codec.CNAME, clevel=codec.CLEVEL, shuffle="shuffle"),)  # the enum is deprecated


def __getattr__(name):
    if name == "_COMPRESSORS":
        return _compressors()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class StoreError(Exception):
    """A store that cannot be opened or committed; the message names the path and the cause."""


class StoreCorruptError(StoreError):
    """A block whose arrays do not match the manifest (checksum, lengths) or cannot be decoded, or damaged store
    metadata or statistics; the message names the store, the part, (for a block) the source lines it holds and
    what to do. The CLI exits with code 5."""


def one_codec_thread() -> None:
    """Compress on the calling thread only: a Dask worker thread is one core (blosc defaults to all cores)."""
    import numcodecs.blosc

    if numcodecs.blosc.get_nthreads() != 1:
        numcodecs.blosc.set_nthreads(1)


# An array whose sample gains less than this from compression is stored raw. Real-valued features (tf-idf,
# normalised counts) compress ~1.1x with lz4 and cost a third of a block's write time to do it. Feature indices
# at webspam width (16.6M: three significant bytes of four) compress 1.75x, and every training pass decodes them:
# lz4 with shuffle decodes at ~5 GB/s per core against ~10 GB/s for a copy, and a block's indices read at 0.9G
# against ~1.9G entries/s from the page cache. Stored raw, the 350k-row store grows from 7.8 to 9.9 GB (read cold
# from this machine's disk in 6.9 s against 6.3 s) and the later passes of `train --algo tg` are 7% shorter; narrow
# indices (< 65,536 features: two bytes of four) still halve and stay compressed.
MIN_RATIO = 2.0
_SAMPLE = 1 << 18
MAX_CHUNK_BYTES = 1 << 30  # blosc compresses at most 2 GB in one buffer


def _worth_compressing(arr: np.ndarray) -> bool:
    """lz4 (the store's settings) on a 256 KiB slice from the middle of ``arr`` saves >= 1 - 1/MIN_RATIO."""
    if arr.nbytes <= 4 * _SAMPLE:
        return True
    k = max(1, _SAMPLE // arr.itemsize)
    mid = arr.shape[0] // 2
    sample = np.ascontiguousarray(arr[mid: mid + k])
    return sample.nbytes >= MIN_RATIO * len(codec.encode(sample))


def write_array(group_path: str, name: str, arr: np.ndarray, chunk: int | None = None,
                compress: bool | None = None) -> None:
    """Write ``arr`` as zarr v3 array ``group_path/name``, one chunk (up to 1 GiB) unless ``chunk``: blosc-lz4
    with byte shuffle, or raw when a sample shows compression would not pay (:data:`MIN_RATIO`) or when
    ``compress`` is False (short-lived arrays)."""
    if compress is None:
        compress = _worth_compressing(arr)
    if chunk is None and arr.nbytes > MAX_CHUNK_BYTES:
        chunk = MAX_CHUNK_BYTES // arr.itemsize
    if chunk is None or chunk >= arr.shape[0]:
        _write_one_chunk(os.path.join(group_path, name), np.ascontiguousarray(arr), compress)
        return
    import zarr

    z = zarr.create_array(store=group_path, name=name, shape=arr.shape, dtype=arr.dtype, chunks=(chunk,),
                          compressors=_compressors() if compress else None, overwrite=True)
    z[:] = arr


def _write_one_chunk(path: str, arr: np.ndarray, compress: bool) -> None:
    """A one-chunk 1-D zarr v3 array written directly: the same zarr.json and chunk ``c/0`` (bytes codec,
    little endian, then blosc) that zarr writes, without its per-array overhead (~4 ms, a sixth of a
    64 MB block's write). Tested against zarr's own output."""
    codecs = [{"name": "bytes", "configuration": {"endian": "little"}} if arr.dtype.itemsize > 1 else {"name": "bytes"}]
    if compress:
        codecs.append({"name": "blosc", "configuration": {"typesize": arr.dtype.itemsize, "cname": codec.CNAME,
                                                           "clevel": codec.CLEVEL, "shuffle": "shuffle", "blocksize": 0}})
    meta = {"shape": [int(arr.shape[0])], "data_type": arr.dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [max(1, int(arr.shape[0]))]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0.0 if arr.dtype.kind == "f" else 0, "codecs": codecs, "attributes": {},
            "zarr_format": 3, "node_type": "array", "storage_transformers": []}
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.mkdir(path)
    _write_json(os.path.join(path, "zarr.json"), meta)
    if arr.shape[0]:
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        if compress:
            data = codec.encode(data)
        os.mkdir(os.path.join(path, "c"))
        with open(os.path.join(path, "c", "0"), "wb") as f:
            f.write(data)


def read_array(group_path: str, name: str, out: np.ndarray | None = None) -> np.ndarray:
    """The whole zarr array ``group_path/name``; one-chunk arrays in the layout of :func:`_write_one_chunk`
    are read directly (no zarr overhead), anything else through zarr. A given ``out`` of the stored dtype
    and at least the stored length receives the array in its head (the result is then that view);
    otherwise it is ignored."""
    arr = _read_one_chunk(os.path.join(group_path, name), out)
    if arr is None:
        import zarr

        arr = zarr.open_array(store=group_path, path=name, mode="r")[...]
    return arr


def _one_chunk_meta(path: str) -> tuple[dict, bool, np.dtype, list] | None:
    """(metadata, compressed, dtype, shape) of a 1-D one-chunk array in the layout of :func:`_write_one_chunk`;
    None for anything else."""
    try:
        with open(os.path.join(path, "zarr.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    codecs = meta.get("codecs", [])
    names = [c.get("name") for c in codecs]
    shape = meta.get("shape", [])
    if (meta.get("node_type") != "array" or len(shape) != 1 or names not in (["bytes"], ["bytes", "blosc"])
            or codecs[0].get("configuration", {}).get("endian", "little") != "little"
            or meta.get("chunk_key_encoding") != {"name": "default", "configuration": {"separator": "/"}}
            or meta.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape", [0])[0] < shape[0]
            or meta.get("storage_transformers")):
        return None
    return meta, names[-1] == "blosc", np.dtype(meta["data_type"]).newbyteorder("<"), shape


def raw_layout(group_path: str, name: str) -> tuple[np.dtype, int] | None:
    """(dtype, length) of the raw (uncompressed) one-chunk array ``group_path/name``, whose elements lie in its
    chunk file from offset 0; None when it is compressed, empty or in another layout."""
    got = _one_chunk_meta(os.path.join(group_path, name))
    if got is None or got[1] or not got[3][0]:
        return None
    return got[2], got[3][0]


def raw_map(group_path: str, name: str, layout: tuple | None = None) -> np.ndarray | None:
    """A read-only memory map of the raw (uncompressed) one-chunk array ``group_path/name``, to read parts of it;
    None when it is compressed, empty or in another layout. ``layout``: its :func:`raw_layout`, when known."""
    got = layout or raw_layout(group_path, name)
    if got is None:
        return None
    return np.memmap(os.path.join(group_path, name, "c", "0"), dtype=got[0], mode="r", shape=(got[1],))


def _head(out: np.ndarray | None, dtype: np.dtype, n: int) -> np.ndarray:
    """The first ``n`` elements of ``out`` when it is a contiguous 1-D array of ``dtype`` with room for them (a reader
    decodes into reused memory), else a new array."""
    fits = out is not None and out.dtype == dtype and out.ndim == 1 and out.shape[0] >= n and out.flags.c_contiguous
    return out[:n] if fits else np.empty(n, dtype=dtype)


def read_raw(group_path: str, name: str, dtype: np.dtype, a: int, b: int, out: np.ndarray | None = None) -> np.ndarray:
    """Elements [a, b) of the raw one-chunk array ``group_path/name`` of ``dtype`` (see :func:`raw_layout`), read into
    the head of ``out`` when it is a contiguous array of that dtype with room for them, else into a new array."""
    out = _head(out, dtype, max(0, b - a))
    path = os.path.join(group_path, name, "c", "0")
    buf, got = memoryview(out.view(np.uint8)), 0
    with open(path, "rb", buffering=0) as f:
        while got < out.nbytes:
            k = os.preadv(f.fileno(), [buf[got:]], a * dtype.itemsize + got)
            if k <= 0:
                break
            got += k
    if got != out.nbytes:
        raise StoreError(f"{path}: {got} bytes where [{a}, {b}) of {dtype} should be")
    return out


def _read_one_chunk(path: str, out: np.ndarray | None = None) -> np.ndarray | None:
    got = _one_chunk_meta(path)
    if got is None:
        return None
    meta, compressed, dtype, shape = got
    out = _head(out, dtype, shape[0])
    try:
        with open(os.path.join(path, "c", "0"), "rb") as f:
            if compressed:
                codec.decode_file(f, out.view(np.uint8))
            elif f.readinto(out.view(np.uint8)) != out.nbytes or f.read(1):
                raise StoreError(f"{path}: chunk size does not match the metadata shape {shape}")
    except FileNotFoundError:  # never written: all fill value
        out[:] = meta.get("fill_value", 0)
    return out


def make_group(path: str, attrs: dict | None = None) -> None:
    """Create the zarr v3 group ``path`` with ``attrs`` (a new one directly, as zarr writes it)."""
    meta = os.path.join(path, "zarr.json")
    if "://" not in path and os.path.exists(meta):
        with open(meta, encoding="utf-8") as f:
            if json.load(f).get("node_type") == "group":
                return  # zarr's open_group(mode="a") would open it and leave its attributes as they are
    if os.path.exists(meta) or "://" in path:
        import zarr

        zarr.open_group(store=path, mode="a", zarr_format=3, attributes=attrs or {})
        return
    os.makedirs(path, exist_ok=True)
    _write_json(meta, {"attributes": attrs or {}, "zarr_format": 3, "node_type": "group"})


def _write_json(path: str, obj: dict) -> None:
    """Metadata as compact JSON (json.dumps: the C encoder; json.dump with an indent is pure Python)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj))


def read_manifest(path: str) -> dict:
    meta_path = os.path.join(path, "zarr.json")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise StoreError(f"{path}: not a sparsepipe store (no zarr.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StoreCorruptError(f"{meta_path}: the store's manifest is damaged ({e}); restore the store from a "
                                f"backup or ingest its sources again") from None
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
        f.write(json.dumps(meta))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, meta_path)
    _fsync_dir(path)




def dir_size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
