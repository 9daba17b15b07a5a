"""Feature order: a store whose feature ids are numbered by frequency, so that the hot features share cache lines.

At webspam width (16.6M features) the features that hold most of the non-zeros are spread over the whole id range:
each sits alone on a cache line of every per-feature array a kernel touches. Numbered by descending frequency, the
~1M features that hold 83% of the non-zeros pack into the first ids and their weights fit the last-level cache. At 350k
webspam-like rows the whole `train --algo tg --workers 2` took 27.2 s against 39.7 s, `--algo stsgd` 78.7 s against
96.7 s, the same models to the last digit (docs/results.md, "A store in frequency order").

The order is fixed by the store's first ingest, from a sample of its inputs (:func:`pipeline.ingest.sample_task`),
before any block is parsed: each parse task renumbers its block as it parses it
(:func:`pipeline.formats.libsvm.relabel_ids`), so the store is written once. ``hot`` (STORE/features/hot, int32[K])
holds the external ids of the K features seen in the sample, the most frequent first (ties: the lower id):

* internal id i < K  <->  external id hot[i];
* the external ids e < K not in ``hot`` take the internal ids that the hot ids >= K left free, both in increasing
  order;
* every other id keeps its number.

So the map is a bijection on [0, L), L = max(K, max(hot) + 1), and the identity beyond L: a later append with ids past
the store's width needs no new map. Blocks, statistics and a model's optimiser state use the internal ids; a saved
model's weights always use the input's (external) ids (:func:`model_external`, :func:`model_internal`).
"""
from __future__ import annotations

import hashlib
import os
import threading

import numpy as np

ORDERS = ("auto", "given", "frequency")
# `auto` numbers a store's features by frequency when its inputs hold at least this much uncompressed text and the
# sample's width reaches ORDER_MIN_WIDTH: a model's per-feature arrays past ~8 MB (2^20 float64) no longer fit the
# cache, and below a gigabyte of input the training passes are short anyway.
ORDER_MIN_BYTES = 1 << 30
ORDER_MIN_WIDTH = 1 << 20
SAMPLE_BYTES = 64 << 20  # the sample: 64 windows of 1 MiB spread evenly over the inputs
SAMPLE_WINDOWS = 64
PATH = "features"  # STORE/features/hot


def maps(hot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(to_internal, to_external), int32[L] (int64 past 2^31 ids), of the order ``hot`` (the module docstring's
    rule)."""
    hot = np.asarray(hot, dtype=np.int64)
    k = hot.shape[0]
    n = max(k, int(hot.max()) + 1 if k else 0)
    dt = np.int32 if n < 2**31 else np.int64
    is_hot = np.zeros(n, dtype=bool)
    is_hot[hot] = True
    to_int = np.arange(n, dtype=dt)
    to_int[hot] = np.arange(k, dtype=dt)
    to_int[np.flatnonzero(~is_hot[:k])] = np.sort(hot[hot >= k])  # the displaced take the vacated ids
    to_ext = np.empty(n, dtype=dt)
    to_ext[to_int] = np.arange(n, dtype=dt)
    return to_int, to_ext


def by_frequency(feature: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hot, at): the features of ``feature`` (ascending) with a count above 0, the most frequent first, ties by the
    lower id, as the ``hot`` array (int32 below 2^31 ids), and their positions in ``feature``."""
    count = np.asarray(count)
    present = np.flatnonzero(count > 0)
    at = present[np.argsort(-count[present].astype(np.int64), kind="stable")]
    hot = np.asarray(feature)[at]
    return hot.astype(np.int32 if not hot.shape[0] or hot.max() < 2**31 else np.int64), at


def digest(hot: np.ndarray) -> str:
    """A short digest naming the order (recorded in the manifest and in the models trained on the store)."""
    return hashlib.sha256(np.ascontiguousarray(hot, dtype=np.int64).tobytes()).hexdigest()[:16]


def ids_external(idx: np.ndarray, to_ext: np.ndarray) -> np.ndarray:
    """External ids of internal ``idx`` (int64)."""
    return _apply(idx, to_ext)


def ids_internal(idx: np.ndarray, to_int: np.ndarray) -> np.ndarray:
    """Internal ids of external ``idx`` (int64)."""
    return _apply(idx, to_int)


def _apply(idx, m):
    idx = np.asarray(idx, dtype=np.int64)
    out = idx.copy()
    inside = idx < m.shape[0]
    out[inside] = m[idx[inside]]
    return out


def dense_external(v: np.ndarray, to_int: np.ndarray) -> np.ndarray:
    """A per-feature vector in internal ids (a store's statistics, an optimiser's dense weights) in external ids."""
    out = np.array(v, copy=True)
    n = min(to_int.shape[0], out.shape[0])
    out[:n] = np.asarray(v)[to_int[:n]]
    return out


_CACHE: dict = {}
_LOCK = threading.Lock()


def read_hot(group: str) -> np.ndarray:
    from pipeline.store import format as fmt

    return fmt.read_array(group, "hot")


def cached_maps(group: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`maps` of the order ``name`` (its :func:`digest`) stored at ``group`` (STORE/features), read, checked
    and built once per process: every parse task of an ingest, and every store opened on it (``train`` opens it for
    the learner, the refit and the evaluation)."""
    with _LOCK:
        got = _CACHE.get(name)
    if got is None:
        hot = read_hot(group)
        if digest(hot) != name:
            from pipeline.store.format import StoreCorruptError

            store, part = os.path.split(os.path.normpath(group))
            raise StoreCorruptError(f"{store}: its feature order ({part}/hot) does not match the manifest; "
                                    f"ingesting its sources again rebuilds it")
        got = maps(hot)
        with _LOCK:
            _CACHE.clear()  # one order at a time is the common case: keep one (at webspam width 2 x 133 MB)
            _CACHE[name] = got
    return got


# ------------------------------------------------------------------------------- models at the store's boundary
STORE_IDS = "store_ids"  # meta key: the model's weights use this order's internal ids (a model in training)


def _renumbered(idx, val, m):
    new = _apply(idx, m)
    o = np.argsort(new, kind="stable")
    return new[o], np.asarray(val)[o]


def model_internal(model, st):
    """``model`` with its weights (and a refitted model's learner) in the internal ids of store ``st``; the model
    itself when ``st`` keeps the input's order or the model already uses its ids. The optimiser state is left as
    it is: it is in the order it was trained in (``meta["feature_order"]``)."""
    fo = st.feature_order
    if fo is None or model.meta.get(STORE_IDS) == fo["digest"]:
        return model
    return _convert(model, st.order_maps[0], {**model.meta, STORE_IDS: fo["digest"]})


def model_external(model, st):
    """``model`` with its weights in the input's ids (what a saved model holds); the inverse of
    :func:`model_internal`, and a no-op for a model already in them."""
    fo = st.feature_order
    if fo is None or model.meta.get(STORE_IDS) != fo["digest"]:
        return model
    meta = {k: v for k, v in model.meta.items() if k != STORE_IDS}
    return _convert(model, st.order_maps[1], meta)


def _convert(model, m, meta):
    import dataclasses

    idx, val = _renumbered(model.coef_indices, model.coef_values, m)
    learner = None
    if model.learner is not None:
        li, lv = _renumbered(model.learner[0], model.learner[1], m)
        learner = (li, lv, model.learner[2])
    return dataclasses.replace(model, coef_indices=idx, coef_values=val, learner=learner, meta=meta)
