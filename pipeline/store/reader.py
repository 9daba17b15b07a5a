"""Reading a block store: manifest, blocks as CSR arrays / scipy matrices, feature statistics, dask.array."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from pipeline.store import checksum
from pipeline.store import format as fmt
from pipeline.store import stats

SPLITS = ("train", "holdout", "all")


@dataclass
class Block:
    """One block: a contiguous run of rows, CSR arrays plus labels (mapped to ±1 for binary stores)."""

    key: str
    path: str
    entry: dict
    n_features: int

    @cached_property
    def _arrays(self):
        return tuple(fmt.read_array(self.path, n) for n in ("indptr", "indices", "data", "labels"))

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
    def X(self) -> sp.csr_matrix:
        return sp.csr_matrix((self.data, self.indices, self.indptr), shape=(self.n_rows, self.n_features))

    def verify(self) -> bool:
        """True when the arrays' checksum equals the manifest's (XXH64, or crc32 in older stores)."""
        return checksum.matches(self.entry["checksum"], self.indptr, self.indices, self.data, self.raw_labels)


class Store:
    """A committed block store; everything is read through the manifest."""

    def __init__(self, path: str):
        self.path = os.fspath(path).rstrip("/")
        self.manifest = fmt.read_manifest(self.path)

    @property
    def n_features(self) -> int:
        return int(self.manifest["n_features"])

    @property
    def n_rows(self) -> int:
        return int(self.manifest["n_rows"])

    @property
    def label_kind(self) -> str:
        return self.manifest["labels"]["kind"]

    def entries(self, split: str = "train") -> list[dict]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return [e for e in self.manifest["blocks"] if split == "all" or e["split"] == split]

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

    def block(self, entry_or_key) -> Block:
        e = entry_or_key
        if isinstance(e, str):
            e = next((b for b in self.manifest["blocks"] if b["key"] == e), None)
            if e is None:
                raise KeyError(f"{self.path}: no block {entry_or_key!r} in the manifest")
        return Block(e["key"], f"{self.path}/blocks/{e['key']}", e, self.n_features)

    def blocks(self, split: str = "train"):
        """Yield the blocks of ``split`` in row order."""
        for e in self.entries(split):
            yield self.block(e)

    def feature_stats(self) -> dict:
        """Per-feature non-zero counts and sums of squares over the training split (length n_features)."""
        col_nnz, col_sumsq = stats.dense_stats(f"{self.path}/{self.manifest['stats']}", self.n_features)
        return {"col_nnz": col_nnz, "col_sumsq": col_sumsq, "n_rows": sum(e["rows"] for e in self.entries("train"))}

    def to_dask(self, split: str = "all"):
        """dask.array of shape (rows, n_features) whose chunks are ``sparse.GCXS`` blocks."""
        import dask
        import dask.array as da
        import sparse

        p = self.n_features
        parts = []
        for e in self.entries(split):
            blk = self.block(e)
            d = dask.delayed(_gcxs)(blk.path, e["rows"], p)
            meta = sparse.GCXS.from_numpy(np.zeros((0, p), dtype=np.dtype(self.manifest["data_dtype"])))
            parts.append(da.from_delayed(d, shape=(e["rows"], p), dtype=meta.dtype, meta=meta))
        return da.concatenate(parts, axis=0) if parts else da.zeros((0, p))

    def to_dask_labels(self, split: str = "all"):
        import dask
        import dask.array as da

        return da.concatenate([da.from_delayed(dask.delayed(lambda b: b.y)(self.block(e)), shape=(e["rows"],),
                                               dtype=np.float64) for e in self.entries(split)])


def _gcxs(path: str, rows: int, p: int):
    import sparse

    indptr, indices, data = (fmt.read_array(path, n) for n in ("indptr", "indices", "data"))
    return sparse.GCXS((data, indices, indptr), shape=(rows, p), compressed_axes=(0,))


def open_store(path) -> Store:
    """Open a committed store for reading (raises StoreError naming the path when it is not one)."""
    if not os.path.isdir(path):
        raise fmt.StoreError(f"{path}: no such store")
    return Store(path)
