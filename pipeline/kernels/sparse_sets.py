"""Linear-time set operations on strictly increasing integer feature ids (STSGD's sparse stage-end exchange).

``np.union1d``/``np.isin`` sort their inputs (O(n log n)); at webspam width a stage's touched set holds ~10^7
features per path and the sorts dominated the stage end. The inputs here are already sorted, so a merge is a
two-pointer pass. References in the tests: ``np.union1d`` + ``np.searchsorted`` and ``np.isin``.
"""
from __future__ import annotations

import numba
import numpy as np


def union_positions(ia, ib):
    """Sorted union u of two strictly increasing id arrays (of one integer dtype, which u keeps), and the positions
    of ia and ib in u (u[pa] == ia, u[pb] == ib); positions are int32 when they fit (half the transient memory of a
    merge)."""
    na, nb = ia.shape[0], ib.shape[0]
    pos = np.int32 if na + nb < 2 ** 31 else np.int64
    u = np.empty(na + nb, dtype=ia.dtype)
    pa = np.empty(na, dtype=pos)
    pb = np.empty(nb, dtype=pos)
    k = _union_into(ia, ib, u, pa, pb)
    return (u[:k].copy() if k < 0.75 * u.shape[0] else u[:k]), pa, pb  # a result that travels: no slack


@numba.njit(cache=True, nogil=True)
def _union_into(ia, ib, u, pa, pb):
    """Two-pointer merge of :func:`union_positions` into preallocated arrays; returns |u|."""
    na, nb = ia.shape[0], ib.shape[0]
    i = j = k = 0
    while i < na and j < nb:
        a, b = ia[i], ib[j]
        if a < b:
            u[k] = a
            pa[i] = k
            i += 1
        elif b < a:
            u[k] = b
            pb[j] = k
            j += 1
        else:
            u[k] = a
            pa[i] = k
            pb[j] = k
            i += 1
            j += 1
        k += 1
    while i < na:
        u[k] = ia[i]
        pa[i] = k
        i += 1
        k += 1
    while j < nb:
        u[k] = ib[j]
        pb[j] = k
        j += 1
        k += 1
    return k


@numba.njit(cache=True, nogil=True)
def sorted_member(ia, ib):
    """Boolean mask over ia: ia[i] occurs in ib (both strictly increasing)."""
    out = np.zeros(ia.shape[0], dtype=np.bool_)
    j = 0
    nb = ib.shape[0]
    for i in range(ia.shape[0]):
        a = ia[i]
        while j < nb and ib[j] < a:
            j += 1
        if j == nb:
            break
        out[i] = ib[j] == a
    return out
