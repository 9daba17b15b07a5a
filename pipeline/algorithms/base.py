"""What an algorithm supplies to the engine. No Dask here: these are plain functions on numpy state.

A *path* is one model replica with its own RNG stream; its state is a ``dict[str, np.ndarray]`` (scalars
as 1-element arrays) so it can be copied, shipped to workers and saved without pickle. A *stage* is the
unit between cross-path reductions: one pass for parameter mixing (``path_mode = "split"``: paths split the
blocks), or an algorithm-defined length (``path_mode = "full"``: every path reads every block).

A stage, for every algorithm::

    state_m   = working_state(copy of state_m)      on the path's worker, one task: ...
    advance(state_m, block), ...; end_stage(state_m)
    summary_m = summarize(state_m)
    state_m   = settle(state_m)                     ... (state_m, summary_m)
    total     = combine(combine(s_0, s_1), ...)     fixed pairwise tree over paths (deterministic)
    decision, gstate, diag = decide(total, gstate)  one task
    state_m   = apply(state_m, decision)            on the path's worker
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np


def copy_state(state: dict) -> dict:
    """Private copy of a path state (tasks are pure: they advance a copy); a read-only array (:func:`frozen`: one
    that no task changes) is shared, not copied."""
    return {k: v.copy() if v.flags.writeable else v for k, v in state.items()}


def frozen(v: np.ndarray) -> np.ndarray:
    """A read-only view of ``v`` (``v`` itself when read-only already): :func:`copy_state` shares it instead of
    copying it (Dask keeps the flag)."""
    if not v.flags.writeable:
        return v
    v = v.view()
    v.flags.writeable = False
    return v


def interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One float64 working array holding a_j at 2j and b_j at 2j + 1: a kernel that reads both of a coordinate
    touches one cache line instead of two (a stage's layout: TG's w and Gl, FTRL's z and n; the kernels take the
    stride 2 and offset 1). The even and odd slices give the two arrays back."""
    ab = np.empty(2 * a.shape[0])
    ab[0::2], ab[1::2] = a, b
    return ab


def packed_is_smaller(nnz: int, n: int, itemsize: int, idx_itemsize: int = 8) -> bool:
    """Whether ``nnz`` (index, value) pairs take fewer bytes than the dense ``n``-vector: nnz·(idx_itemsize +
    itemsize) < n·itemsize (float64 with int64 indices: fewer than half the entries non-zero)."""
    return nnz * (idx_itemsize + itemsize) < n * itemsize


def _bits(v: np.ndarray) -> np.ndarray:
    """``v`` viewed as signed integers of its item size: an entry is "non-zero" when its bits are (−0.0 too)."""
    return v.view(np.dtype(f"i{v.dtype.itemsize}"))


def pack_nonzero(v: np.ndarray, copy: bool = True) -> tuple:
    """A settled state's form of a per-feature array, the smaller of two, both flat arrays that
    :func:`unpack_nonzero` restores bit for bit: packed, (idx int64, values) of the entries whose bits are not all
    zero (−0.0 is kept) in increasing idx, when :func:`packed_is_smaller`; else dense, (an empty idx, a copy of
    ``v``, or ``v`` itself without ``copy``: for a summary that nothing modifies). A dense-ish array therefore
    never costs more than itself between stages."""
    v = np.asarray(v)
    bits = _bits(v)
    if not packed_is_smaller(int(np.count_nonzero(bits)), v.shape[0], v.dtype.itemsize):
        return np.zeros(0, np.int64), v.copy() if copy else v
    idx = np.flatnonzero(bits).astype(np.int64, copy=False)
    return idx, v[idx]


def compact_sparse(idx: np.ndarray, values: np.ndarray, n: int) -> tuple:
    """:func:`pack_nonzero`'s rule for a vector already given by its non-zeros (``idx`` increasing): ``(idx, values)``
    when that is smaller than the dense ``n``-vector, else (an empty idx, the dense vector)."""
    if packed_is_smaller(idx.shape[0], n, values.dtype.itemsize, idx.dtype.itemsize):
        return idx, values
    return np.zeros(0, idx.dtype), unpack_nonzero(idx, values, n, values.dtype)


def is_dense_form(idx: np.ndarray, values: np.ndarray) -> bool:
    """Whether ``(idx, values)`` is :func:`pack_nonzero`'s dense form (an empty idx beside the values; a packed
    form has one index per value, the layout saved models have had since the compact states)."""
    return idx.shape[0] != values.shape[0]


def unpack_nonzero(idx, values, n: int, dtype=np.float64, fill=0, share: bool = False) -> np.ndarray:
    """The ``n``-vector of ``dtype`` equal to ``fill`` but ``values`` at ``idx`` (inverse of :func:`pack_nonzero`);
    of the dense form, ``values`` then ``fill`` (a state widened since it was settled). With ``share``, a dense form
    that already is that vector is returned itself (``values`` of a task's private copy: no second array; it may be
    read-only, :func:`frozen`)."""
    if share and is_dense_form(idx, values) and values.shape[0] == n and values.dtype == dtype:
        return values
    out = np.full(n, fill, dtype=dtype) if fill else np.zeros(n, dtype=dtype)
    if is_dense_form(idx, values):
        out[:values.shape[0]] = values
    else:
        out[idx] = values
    return out


def dense_of(idx: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """The dense ``n``-vector of either form of :func:`pack_nonzero`: a full-width dense form itself (shared, not
    copied), else :func:`unpack_nonzero`."""
    return unpack_nonzero(idx, values, n, values.dtype, share=True)


def add_packed(a: tuple, b: tuple, n: int) -> tuple:
    """The sum of two ``n``-vectors, each in either form of :func:`pack_nonzero`, in :func:`compact_sparse`'s
    form: bit for bit the dense sum (an entry off a support is +0.0 there too, and +0.0 + +0.0 stays +0.0 off
    the union). A sparse stage-end exchange sums the paths' non-zeros only."""
    (ia, va), (ib, vb) = a, b
    if is_dense_form(ia, va) or is_dense_form(ib, vb):
        return np.zeros(0, np.int64), dense_of(ia, va, n) + dense_of(ib, vb, n)
    from pipeline.kernels.sparse_sets import union_positions

    idx, pa, pb = union_positions(ia, ib)  # a linear merge of the sorted supports
    xa = np.zeros(idx.shape[0], va.dtype)
    xa[pa] = va
    xb = np.zeros(idx.shape[0], vb.dtype)
    xb[pb] = vb
    return compact_sparse(idx, xa + xb, n)


def nonzero_entries(idx: np.ndarray, values: np.ndarray) -> tuple:
    """(idx int64, values) of the entries whose bits are not all zero, of either form of :func:`pack_nonzero`."""
    if not is_dense_form(idx, values):
        return idx, values
    nz = np.flatnonzero(_bits(values)).astype(np.int64, copy=False)
    return nz, values[nz]


def params_from_dict(cls, values: dict, where: str = "config"):
    """Build the frozen hyper-parameter dataclass ``cls`` from ``values``, rejecting unknown keys and given keys
    the resulting setting never reads (the class's optional ``inert()``: {option: why}). Every error is a
    ValueError whose message starts with ``where``."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {', '.join(unknown)} for {cls.__name__}; "
                         f"known: {', '.join(sorted(names))}")
    try:
        p = cls(**values)
    except (ValueError, TypeError) as e:  # the dataclass's own checks, named like the rest: "--algo tg: K must ..."
        raise ValueError(f"{where}: {e}") from None
    inert = {k: why for k, why in (p.inert() if hasattr(p, "inert") else {}).items() if k in values}
    if inert:
        raise ValueError(f"{where}: {', '.join(sorted(inert))} has no effect: {next(iter(inert.values()))}")
    return p


def check_choice(name: str, value, choices) -> None:
    """Validate a hyper-parameter that takes one of ``choices`` (a message naming the option)."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def check_nonnegative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


class Algorithm:
    """Base class; subclasses set ``name``, ``Params`` and implement the hooks below."""

    name = "base"
    path_mode = "split"
    Params: Any = None
    #: most paths the algorithm runs (None: any number)
    max_paths: int | None = None
    #: whether a stage may be cut after --stage-blocks blocks (SCD's coordinate scan needs a whole pass's rows)
    stage_blocks_allowed: bool = True
    #: state keys identical on every path after ``apply`` (saved once in the model, not per path)
    shared_keys: tuple = ()
    #: bytes per feature a stage-end merge holds on the worker that combines two paths' summaries (a memory
    #: estimate, pipeline.memory): two dense float64 vectors by default; STSGD's sparse counters are more
    exchange_bytes_per_feature: int = 16
    #: bytes per feature a stage's task allocates beside its working state at its peak (a memory estimate): none by
    #: default; two-stage's L1∩L2 projection needs two float64 vectors
    scratch_bytes_per_feature: int = 0

    def __init__(self, params):
        self.params = params

    def calibrate(self, scale: dict) -> None:
        """Resolve data-relative hyper-parameters from the training split's ``scale``
        (:func:`pipeline.store.stats.data_scale`); called by the engine before training. Default: none."""

    # --- per path -----------------------------------------------------------------------------
    def init_path(self, n_features: int, path: int) -> dict:
        raise NotImplementedError

    def resize(self, state: dict, n_features: int) -> dict:
        """Widen a (warm-start) state to ``n_features``; per-feature arrays are zero-padded."""
        out = {}
        for k, v in state.items():
            if k in self.feature_keys and v.shape[-1] < n_features:
                pad = [(0, 0)] * (v.ndim - 1) + [(0, n_features - v.shape[-1])]
                v = np.pad(v, pad)
            out[k] = v
        return out

    feature_keys: tuple = ()

    def working_state(self, state: dict) -> dict:
        """The arrays a stage advances, made at the start of the stage's task from the task's private copy of
        the state it received (default: that copy). With :meth:`settle` an algorithm keeps a compact state
        between stages and expands it here, for the task's duration only."""
        return state

    def settle(self, state: dict) -> dict:
        """The state kept between stages, made from the stage's advanced state after :meth:`summarize` (default:
        itself): what :meth:`apply` receives, the next stage starts from, and the model file saves."""
        return state

    def full_state(self, n_features: int) -> dict:
        """The largest path state kept between stages at ``n_features`` (the memory estimate's, pipeline.memory):
        of an algorithm whose settled state grows with its non-zeros, the one with every per-feature entry
        non-zero; default: a fresh state (:meth:`init_path`)."""
        return self.init_path(n_features, 0)

    def read_columns(self, state: dict):
        """The columns whose entries a stage of the settled ``state`` reads, as packed bits (``np.packbits`` order),
        or None (default): all. The engine drops the other entries from each block group before :meth:`advance`
        (:func:`pipeline.engine.keep_columns_of`), so an algorithm returns bits only for columns its kernel skips
        anyway: the model is then the same bit for bit."""
        return None

    def advance(self, state: dict, indptr, indices, data, y, rows, start: int, pass_index: int):
        """Advance ``state`` in place over ``rows[start:]`` of one block; return (rows consumed, stage done).

        The block's arrays are valid during this call only: the engine decodes the next block group into the same
        memory (:func:`pipeline.engine.group_buffers`), so an algorithm that keeps rows past the call copies them."""
        raise NotImplementedError

    # --- stage end ----------------------------------------------------------------------------
    def end_stage(self, state: dict) -> None:
        """In place, on the path's private copy at the end of ``advance`` (e.g. flush lazy truncation)."""

    def summarize(self, state: dict) -> dict:
        """What this path contributes to the stage-end reduction. Must not modify ``state``."""
        raise NotImplementedError

    def combine(self, a: dict, b: dict) -> dict:
        return {k: a[k] + b[k] for k in a}

    def decide(self, total: dict, gstate: dict, n_paths: int):
        raise NotImplementedError

    def apply(self, state: dict, decision: dict) -> dict:
        """The path's next state: a NEW dict; must not modify ``state`` or ``decision`` (they may be shared)."""
        raise NotImplementedError

    def init_global(self, n_features: int) -> dict:
        return {}

    def weights(self, decision: dict):
        """(dense weights float64, bias) of the aggregated model described by ``decision``."""
        return decision["w"], float(decision["bias"][0])

    def finished(self, gstate: dict) -> bool:
        """An algorithm-level stopping rule (e.g. STSGD's convergence, a density bound)."""
        return False

    def diverged(self, gstate: dict) -> bool:
        """The run stopped because its iterates overflowed (GraDes' ψ); non-finite weights count too (fit)."""
        return False

    def hyper(self) -> dict:
        return dataclasses.asdict(self.params)
