"""Projected SGD onto the L1 ball {‖w‖₁ ≤ z} with the sparse online projection (ALGORITHMS.md §4).

Per step t (one row (x, y)): f = w·x + b, d = ℓ'(f, y), η_t = eta (schedule 0) or eta / t**power_t
(schedule 1), ``w ← P_{L1,z}(w − η_t d x)`` by ``l1tree_axpy_project`` (expected O(nnz(x) log p)), and
b ← b − η_t d (bias unconstrained, only if fit_bias). The weights live in the treap state of
``pipeline.kernels.projection`` (``fnode, inode, sgn, fsc, isc``), so a row never costs O(p).

State: the five tree arrays plus istate int64[1] = [t] and fstate float64[1] = [bias].
"""
import numba
import numpy as np

from .losses import dloss
from .projection import _STACK, l1tree_axpy_project_stk, l1tree_dot, project_l1_sort
from .sgd import step_size


@numba.njit(cache=True, nogil=True)
def l1proj_block(indptr, indices, data, y, rows, fnode, inode, sgn, fsc, isc, istate, fstate, eta, schedule,
                 power_t, z, loss, hinge_at_one, fit_bias):
    """Advance projected SGD over ``rows`` of one CSR block (cost O(Σ nnz(row)·log p) expected)."""
    t = istate[0]
    b = fstate[0]
    stk = np.empty(_STACK, np.int64)  # the treap's scratch stack, shared by every row of the block
    for r in range(rows.shape[0]):
        i = rows[r]
        lo = indptr[i]
        hi = indptr[i + 1]
        t += 1
        e = step_size(eta, schedule, power_t, t)
        idx = indices[lo:hi]
        val = data[lo:hi]
        f = l1tree_dot(fnode, inode, sgn, fsc, isc, idx, val) + b
        d = dloss(f, y[i], loss, hinge_at_one)
        if d != 0.0:
            l1tree_axpy_project_stk(fnode, inode, sgn, fsc, isc, idx, val, -e * d, z, stk)
            if fit_bias:
                b -= e * d
    istate[0] = t
    fstate[0] = b


def clip_to_l1_ball(w: np.ndarray, z: float) -> np.ndarray:
    """w itself when ‖w‖₁ ≤ z; else its projection, shrunk by ulps until ‖w‖₁ ≤ z holds in floating point.

    Averages of feasible points are feasible in exact arithmetic; this removes the rounding excess so the
    saved weights satisfy the constraint exactly as computed by ``np.abs(w).sum()``.
    """
    if not np.isfinite(z) or float(np.abs(w).sum()) <= z:
        return w
    w = project_l1_sort(w, z)
    f = 1.0
    while float(np.abs(w).sum()) > z:
        f *= 1.0 - 2.0 ** -50
        w = w * f
    return w
