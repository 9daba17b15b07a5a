"""sparsepipe: out-of-core sparse linear learning (LIBSVM -> zarr block store -> Dask + numba learners).

Public API (imported lazily so ``import pipeline`` stays cheap):
``open_store``, ``load_model``, ``IngestOptions``; ingest with ``pipeline.ingest.ingest``.
"""
_EXPORTS = {
    "open_store": ("pipeline.store.reader", "open_store"),
    "Store": ("pipeline.store.reader", "Store"),
    "IngestOptions": ("pipeline.ingest", "IngestOptions"),
    "IngestError": ("pipeline.ingest", "IngestError"),
    "StoreError": ("pipeline.store.format", "StoreError"),
    "load_model": ("pipeline.model", "load_model"),
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        mod, attr = _EXPORTS[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
