"""Reading a block store: manifest, blocks as CSR arrays / scipy matrices, feature statistics, dask.array."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from pipeline.store import format as fmt

# scipy.sparse, the numba checksum and statistics modules are imported where they are used: a command
# that reads only the manifest (info) or only raw arrays does not pay for them.

SPLITS = ("train", "holdout", "all")
ARRAYS = ("indptr", "indices", "data", "labels")
VERIFY_ENV = "SPARSEPIPE_VERIFY"


StoreCorruptError = fmt.StoreCorruptError


def verify_default() -> bool:
    """Whether blocks are checked against their manifest checksum on read: yes unless the environment has
    ``SPARSEPIPE_VERIFY=0`` (set by ``--no-verify``; inherited by the workers of an embedded cluster)."""
    return os.environ.get(VERIFY_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def set_verify(on: bool) -> None:
    """Turn read verification on or off for this process and the worker processes it starts afterwards."""
    os.environ[VERIFY_ENV] = "1" if on else "0"


def corrupt(store: str, entry: dict, cause: str, sources: list | None = None,
            readable: bool = False) -> StoreCorruptError:
    """A :class:`StoreCorruptError` naming the store, the block, its source (file and byte range or first
    line), the cause and the remedy (``readable``: arrays that decode but fail the checksum, which the
    command's ``--no-verify`` reads anyway)."""
    src = entry.get("source")
    name = sources[src]["path"] if sources and isinstance(src, int) and 0 <= src < len(sources) else f"source {src}"
    rng = entry.get("byte_range")
    where = (f"bytes {rng[0]}-{rng[1]} of {name}" if rng else f"{name} from line {entry.get('first_line')}")
    return StoreCorruptError(
        f"{store}: block {entry.get('key')} ({where}) is corrupt: {cause}; re-ingest that source or restore "
        f"the store from a copy (`sparsepipe verify {store}` lists every bad block"
        + ("; the command's --no-verify reads it anyway)" if readable else ")"))


@dataclass
class Block:
    """One block: a contiguous run of rows, CSR arrays plus labels (mapped to ±1 for binary stores)."""

    key: str
    path: str
    entry: dict
    n_features: int
    store: str = ""
    sources: list | None = None
    check: bool | None = None  # verify the checksum on read (None: :func:`verify_default`)
    out: tuple | None = None  # arrays to decode indptr, indices, data, labels into (their heads; see _raw)

    def error(self, cause: str, readable: bool = False) -> StoreCorruptError:
        return corrupt(self.store or os.path.dirname(os.path.dirname(self.path)), self.entry, cause, self.sources,
                       readable)

    @cached_property
    def _raw(self):
        """The four arrays as stored, with their lengths checked against the manifest (rows, nnz); a missing
        or undecodable array is a :class:`StoreCorruptError`. With ``out``, each array is decoded into the head
        of its given array where dtype and length allow (a view of it; :func:`pipeline.store.format.read_array`),
        so a reader reusing memory pays no page faults for a fresh array per block."""
        if not os.path.isdir(self.path) and "://" not in self.path:
            raise self.error("its directory is missing")
        arrays = []
        for i, n in enumerate(ARRAYS):
            try:
                arrays.append(fmt.read_array(self.path, n, None if self.out is None else self.out[i]))
            except Exception as e:  # a blosc, zarr or OS error: all mean the chunk cannot be read back
                raise self.error(f"array '{n}' cannot be read ({type(e).__name__}: {str(e) or 'no detail'})") from e
        indptr, indices, data, labels = arrays
        rows, nnz = int(self.entry["rows"]), int(self.entry["nnz"])
        for n, a, want in (("indptr", indptr, rows + 1), ("indices", indices, nnz), ("data", data, nnz),
                           ("labels", labels, rows)):
            chunks = os.path.join(self.path, n, "c")
            if want and not (os.path.isdir(chunks) and os.listdir(chunks)):  # zarr would read the fill value
                raise self.error(f"array '{n}' has no chunk file")
            if a.ndim != 1 or a.shape[0] != want:
                raise self.error(f"array '{n}' has {a.shape[0] if a.ndim == 1 else a.shape} entries, the manifest "
                                 f"says {want}")
        return tuple(arrays)

    @cached_property
    def _arrays(self):
        arrays = self._raw
        if (verify_default() if self.check is None else self.check) and "checksum" in self.entry:
            from pipeline.store import checksum

            if not checksum.matches(self.entry["checksum"], *arrays):
                raise self.error("its arrays do not match the manifest checksum", readable=True)
        return arrays

    @property
    def indptr(self) -> np.ndarray:
        return self._arrays[0]

    @property
    def indices(self) -> np.ndarray:
        return self._arrays[1]

    @property
    def data(self) -> np.ndarray:
        return self._arrays[2]

    @property
    def raw_labels(self) -> np.ndarray:
        return self._arrays[3]

    @property
    def y(self) -> np.ndarray:
        """Labels as float64: ±1 for binary blocks (recorded mapping), raw values for regression."""
        raw = self._arrays[3].astype(np.float64)
        m = self.entry.get("label_map")
        if m is None:
            return raw
        return np.where(raw == m[1], 1.0, -1.0)

    @property
    def n_rows(self) -> int:
        return int(self.entry["rows"])

    @property
    def X(self):
        """scipy.sparse.csr_matrix of the block (full width)."""
        import scipy.sparse as sp

        return sp.csr_matrix((self.data, self.indices, self.indptr), shape=(self.n_rows, self.n_features))

    def verify(self) -> bool:
        """True when the arrays' checksum equals the manifest's (XXH64, or crc32 in older stores); raises
        :class:`StoreCorruptError` when an array is missing, undecodable or of the wrong length."""
        from pipeline.store import checksum

        return checksum.matches(self.entry["checksum"], *self._raw)


class Store:
    """A committed block store; everything is read through the manifest."""

    def __init__(self, path: str, verify: bool | None = None):
        self.path = os.fspath(path).rstrip("/")
        self.manifest = fmt.read_manifest(self.path)
        self.verify = verify  # checksum every block read (None: :func:`verify_default`, i.e. yes)

    @property
    def n_features(self) -> int:
        return int(self.manifest["n_features"])

    @property
    def n_rows(self) -> int:
        return int(self.manifest["n_rows"])

    @property
    def label_kind(self) -> str:
        return self.manifest["labels"]["kind"]

    @cached_property
    def indices_dtype(self) -> np.dtype:
        return np.dtype(self.manifest.get("indices_dtype", "int32"))

    @cached_property
    def data_dtype(self) -> np.dtype:
        return np.dtype(self.manifest.get("data_dtype", "float32"))

    @property
    def feature_order(self) -> dict | None:
        """The manifest's feature order (:mod:`pipeline.store.order`), None when the blocks hold the input's ids."""
        return self.manifest.get("feature_order")

    @property
    def order_maps(self) -> tuple[np.ndarray, np.ndarray]:
        """(to_internal, to_external) of :attr:`feature_order` (:func:`pipeline.store.order.maps`)."""
        from pipeline.store.order import cached_maps

        return cached_maps(*self._order_ref)

    @property
    def _order_ref(self) -> tuple[str, str]:
        """(the order's group, its digest): what :func:`pipeline.store.order.cached_maps` takes."""
        fo = self.feature_order
        return f"{self.path}/{fo['path']}", fo["digest"]

    def external_X(self, block):
        """scipy CSR of ``block`` in the input's feature ids, ascending within each row (what a peer reading the
        LIBSVM text sees); the block's own matrix when the store keeps the input's order."""
        return _external(block.X, self.order_maps[1] if self.feature_order else None)

    @cached_property
    def _by_key(self) -> dict:
        return {b["key"]: b for b in self.manifest["blocks"]}

    def entry(self, key: str) -> dict:
        """The manifest entry of block ``key`` (KeyError naming the store when there is none)."""
        e = self._by_key.get(key)
        if e is None:
            raise KeyError(f"{self.path}: no block {key!r} in the manifest")
        return e

    def entries(self, split: str = "train", keys=None) -> list[dict]:
        """The manifest entries of ``split`` in row order; only those whose block key is in ``keys`` when given."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        keep = None if keys is None else set(keys)
        return [e for e in self.manifest["blocks"] if (split == "all" or e["split"] == split)
                and (keep is None or e["key"] in keep)]

    def generations(self) -> list[int]:
        """Generation numbers (one per ingest or append), oldest first."""
        return sorted({int(e.get("generation", 1)) for e in self.manifest["blocks"]})

    def window(self, last: int = 0, exclude=()) -> list[int]:
        """The newest ``last`` generations (0: all), leaving out those in ``exclude``, oldest first."""
        gens = [g for g in self.generations() if g not in set(exclude)]
        return gens[-last:] if last else gens

    def keys(self, split: str = "train", generations=None) -> list[str]:
        """Block keys of ``split`` in row order, restricted to ``generations`` when given."""
        gens = None if generations is None else set(generations)
        return [e["key"] for e in self.entries(split) if gens is None or int(e.get("generation", 1)) in gens]

    def block(self, entry_or_key, out: tuple | None = None, verify: bool | None = None) -> Block:
        """The block of a manifest entry or key; ``out``: see :attr:`Block.out`. ``verify=False`` reads it without
        its checksum (training's later passes: the run checked it on its first read); None: the store's setting."""
        e = self.entry(entry_or_key) if isinstance(entry_or_key, str) else entry_or_key
        return Block(e["key"], f"{self.path}/blocks/{e['key']}", e, self.n_features, self.path,
                     self.manifest.get("sources"), self.verify if verify is None else verify, out)

    def expect_reads(self, entries) -> None:
        """Before reading the blocks of ``entries``: their decoded size, for the checksum's choice between its
        Python hash and the numba kernel (:func:`pipeline.store.checksum.expect`)."""
        from pipeline.store import checksum

        per_nnz = self.indices_dtype.itemsize + self.data_dtype.itemsize
        checksum.expect(sum(12 * int(e["rows"]) + per_nnz * int(e["nnz"]) for e in entries))

    def blocks(self, split: str = "train"):
        """Yield the blocks of ``split`` in row order."""
        for e in self.entries(split):
            yield self.block(e)

    def feature_stats(self) -> dict:
        """Per-feature non-zero counts and sums of squares over the training split (length n_features)."""
        from pipeline.store import stats

        col_nnz, col_sumsq = stats.dense_stats(f"{self.path}/{self.manifest['stats']}", self.n_features)
        return {"col_nnz": col_nnz, "col_sumsq": col_sumsq, "n_rows": sum(e["rows"] for e in self.entries("train"))}

    def to_dask(self, split: str = "all"):
        """dask.array of shape (rows, n_features) whose chunks are ``sparse.GCXS`` blocks."""
        import dask
        import dask.array as da
        import sparse

        p = self.n_features
        # the chunks' type and dtype; zero-sized in both axes, as dask's metas are: dask slices a meta to
        # [0:0, 0:0], and on a (0, p) GCXS that compiles ~10 s of pydata-sparse's numba code in every new process
        meta = sparse.GCXS.from_numpy(np.zeros((0, 0), dtype=self.data_dtype))
        parts = []
        order = self._order_ref if self.feature_order else None
        for e in self.entries(split):
            d = dask.delayed(_gcxs)(self.block(e), order)
            parts.append(da.from_delayed(d, shape=(e["rows"], p), dtype=meta.dtype, meta=meta))
        return da.concatenate(parts, axis=0) if parts else da.zeros((0, p))

    def to_dask_labels(self, split: str = "all"):
        import dask
        import dask.array as da

        return da.concatenate([da.from_delayed(dask.delayed(lambda b: b.y)(self.block(e)), shape=(e["rows"],),
                                               dtype=np.float64) for e in self.entries(split)])


def _external(X, to_ext):
    """CSR ``X`` with its ids mapped by ``to_ext`` (None: as it is) and sorted within each row."""
    if to_ext is None:
        return X
    from pipeline.store.order import ids_external

    X = X.copy()
    X.indices = ids_external(X.indices, to_ext).astype(X.indices.dtype)
    X.has_sorted_indices = False
    X.sort_indices()
    return X


def _gcxs(block: Block, order: tuple | None = None):
    """The block as a GCXS in the input's feature ids (``order``: the store's (features group, digest))."""
    import sparse

    if order is not None:
        from pipeline.store.order import cached_maps

        return sparse.GCXS.from_scipy_sparse(_external(block.X, cached_maps(*order)[1]))
    return sparse.GCXS((block.data, block.indices, block.indptr), shape=(block.n_rows, block.n_features),
                       compressed_axes=(0,))


def open_store(path, verify: bool | None = None) -> Store:
    """Open a committed store for reading (raises StoreError naming the path when it is not one). Its blocks
    are checked against the manifest checksums as they are read unless ``verify`` is False (None: yes, unless
    ``SPARSEPIPE_VERIFY=0``)."""
    if not os.path.isdir(path):
        raise fmt.StoreError(f"{path}: no such store" if not os.path.exists(path) else f"{path}: not a store "
                             "(a file; a store is a directory made by `sparsepipe ingest`)")
    return Store(path, verify)
