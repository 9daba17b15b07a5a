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

# The modules with numba kernels. numba's on-disk cache checks only the stamp of a kernel's own file, so a kernel
# that inlines a function of another file (the losses, xxh64) would keep its stale machine code after that file
# changed; the cache lives in a directory named by the stamps of all of them instead (tests/test_numba_cache.py
# checks that this list holds every file that compiles with numba).
NUMBA_SOURCES = ("formats/libsvm.py", "store/stats.py", "synth.py", "kernels")


def _numba_cache_dir() -> str:
    import os
    import zlib

    here = os.path.dirname(os.path.abspath(__file__))
    stamps = []
    for rel in NUMBA_SOURCES:
        path = os.path.join(here, rel)
        names = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".py")) \
            if os.path.isdir(path) else [path]
        for name in names:
            st = os.stat(name)
            stamps.append(f"{name}\0{st.st_mtime_ns}\0{st.st_size}")
    return os.path.join(here, "__pycache__", f"numba-{zlib.crc32(chr(10).join(stamps).encode()):08x}")


def _set_numba_cache_dir() -> None:
    import os
    import sys

    if os.environ.get("NUMBA_CACHE_DIR"):  # the user's own choice
        return
    try:
        d = _numba_cache_dir()
    except OSError:
        return
    os.environ["NUMBA_CACHE_DIR"] = d
    if "numba" in sys.modules:  # imported before us: its configuration was read already
        sys.modules["numba"].config.CACHE_DIR = d


_set_numba_cache_dir()


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        mod, attr = _EXPORTS[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
