"""Per-feature statistics of the training split: non-zero counts and sums of squares (E[x_j²] = sumsq/rows).

Every block carries the statistics of the features it touches, sorted by feature (``stats_idx``,
``stats_nnz``, ``stats_sumsq``). The commit merges the training blocks' sorted lists along a tree fixed
by the block order (a binary counter, as in a bottom-up merge sort), so every sum is added in the same
order whatever the number of workers, at most log2(blocks) lists are held at once, and the work is
sequential streaming instead of scattered adds into a width-sized array. The store keeps the result
sparsely — the features that occur, in feature order — so its cost follows the distinct features, not
the declared width.
"""
from __future__ import annotations

import numba
import numpy as np

from pipeline.store import format as fmt

STATS_CHUNK = 1 << 22


@numba.njit(cache=True, nogil=True)
def merge_stats(ia, ca, sa, ib, cb, sb):
    """Union of two sorted sparse statistics; a feature in both gets ca + cb and sa + sb (a first)."""
    na, nb = ia.shape[0], ib.shape[0]
    idx = np.empty(na + nb, np.int64)
    cnt = np.empty(na + nb, np.int64)
    ss = np.empty(na + nb, np.float64)
    i = k = t = 0
    while i < na and k < nb:
        ja, jb = np.int64(ia[i]), np.int64(ib[k])
        if ja < jb:
            idx[t], cnt[t], ss[t] = ja, ca[i], sa[i]
            i += 1
        elif jb < ja:
            idx[t], cnt[t], ss[t] = jb, cb[k], sb[k]
            k += 1
        else:
            idx[t], cnt[t], ss[t] = ja, ca[i] + cb[k], sa[i] + sb[k]
            i += 1
            k += 1
        t += 1
    while i < na:
        idx[t], cnt[t], ss[t] = ia[i], ca[i], sa[i]
        i += 1
        t += 1
    while k < nb:
        idx[t], cnt[t], ss[t] = ib[k], cb[k], sb[k]
        k += 1
        t += 1
    return idx[:t], cnt[:t], ss[:t]


class TreeSum:
    """Sum of sorted sparse statistics pushed in order, along a tree fixed by that order."""

    def __init__(self):
        self.stack = []  # (rank, (idx, cnt, ss)); ranks strictly decrease towards the top

    def push(self, stats) -> None:
        rank = 0
        while self.stack and self.stack[-1][0] == rank:
            _, left = self.stack.pop()
            stats = merge_stats(*left, *stats)
            rank += 1
        self.stack.append((rank, stats))

    def result(self):
        """(feature int64, col_nnz int64, col_sumsq float64) of everything pushed."""
        if not self.stack:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
        _, acc = self.stack.pop()
        while self.stack:
            _, left = self.stack.pop()
            acc = merge_stats(*left, *acc)
        return tuple(np.asarray(a, dt) for a, dt in zip(acc, (np.int64, np.int64, np.float64)))


def write_stats(group: str, feature: np.ndarray, count: np.ndarray, sumsq: np.ndarray, width: int) -> None:
    """Write sparse statistics (``feature`` int32 while width < 2**31) to the zarr group ``group``."""
    fmt.make_group(group, {"layout": "sparse", "n_features": int(width)})
    fdt = np.int32 if width < 2**31 else np.int64
    fmt.write_array(group, "feature", feature.astype(fdt, copy=False), STATS_CHUNK)
    fmt.write_array(group, "col_nnz", count, STATS_CHUNK)
    fmt.write_array(group, "col_sumsq", sumsq, STATS_CHUNK)


def read_stats(group: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(feature, col_nnz, col_sumsq) of the non-zero features; reads the sparse layout and the dense one
    of format version 1."""
    import zarr

    g = zarr.open_group(store=group, mode="r")
    if "feature" in g:
        return (g["feature"][...].astype(np.int64), g["col_nnz"][...].astype(np.int64),
                g["col_sumsq"][...].astype(np.float64))
    nnz = g["col_nnz"][...]
    f = np.flatnonzero(nnz)
    return f, nnz[f].astype(np.int64), g["col_sumsq"][...][f].astype(np.float64)


def dense_stats(group: str, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(col_nnz int64[width], col_sumsq float64[width]); features beyond the stored ones are zero."""
    f, c, s = read_stats(group)
    keep = f < width
    col_nnz = np.zeros(width, np.int64)
    col_sumsq = np.zeros(width, np.float64)
    col_nnz[f[keep]] = c[keep]
    col_sumsq[f[keep]] = s[keep]
    return col_nnz, col_sumsq

