"""Memory a training worker needs, and a clear refusal before (or after) a worker runs out of its limit.

Estimate per worker, with its share of the paths: each path's state and the task's working copy of it (tasks are
pure: they advance a private copy, :meth:`Algorithm.working_state` of it), the global state, the stage-end merge of
two paths' summaries, the block cache budget and a process baseline (a Dask worker with NumPy, numba and the kernels
loaded: ~0.3 GB measured). State sizes are linear in the width; they are measured from the algorithm's own
``init_path``/``working_state``/``init_global`` at two small widths and extrapolated, so nothing of the real width is
allocated. The path state is the largest one kept between stages (:meth:`Algorithm.full_state`): l1proj's and
two-stage's compact states grow with the features a path has seen, so theirs is the state with every feature
non-zero, which :func:`pipeline.algorithms.base.pack_nonzero` keeps dense (a packed array is kept only while
smaller than dense). At webspam width (16,609,143 features) tg's path state is 266 MB (twice: 1.10 GB per worker,
measured 1.08 GB); stsgd keeps 2 MB between stages (its settled state, ``STSGD.settle``: Ω as bits, the non-zero
weights) and works on 599 MB during a stage: 1.25 GB per worker, measured 1.16 GB; l1proj keeps its weights (0 fresh,
at most the dense 133 MB) and builds its 548 MB treap inside the task: 1.25 GB at worst (1.11 GB fresh; 1.66 GB
with the treap kept), measured 0.86 GB (was 1.82 GB) on 3,000 rows; two-stage keeps its arrays (0 fresh, at most
the dense 465 MB; 598 MB with stage 2's sumsq), adds 332 MB inside the task (c is shared read-only) and its
L1∩L2 projection's scratch, 266 MB (``Algorithm.scratch_bytes_per_feature``): 1.76 GB at worst (2.29 GB with stage
2; was 1.89 GB without the scratch, 2.29 GB with its 3 x 133 MB), measured 1.36 GB RSS per worker with 96.5% of the
weights non-zero. benchmarks/memory.py lists every array, fresh and at its largest, ``--train`` samples a real run and
``--covering`` one whose rows cover every feature (a compact state at its largest).
"""
from __future__ import annotations

import math

import numpy as np

PROCESS_BASELINE = 300_000_000  # bytes: an idle Dask worker process with NumPy, numba and the kernels loaded


class WorkerMemoryError(MemoryError):
    """Training does not fit in the workers' ``memory_limit``; the message names what would fit."""


def _nbytes(state: dict) -> int:
    return sum(np.asarray(v).nbytes for v in state.values())


def _new_bytes(state: dict, of: dict) -> int:
    """Bytes of the arrays of ``state`` that are not (views of) arrays of ``of``."""
    return sum(v.nbytes for v in state.values() if not any(np.may_share_memory(v, u) for u in of.values()))


def _state_bytes(algo, p: int) -> tuple[int, int, int, int]:
    from pipeline.algorithms.base import copy_state

    full = algo.full_state(p)
    return (_nbytes(full), _new_bytes(algo.working_state(copy_state(full)), full), _nbytes(algo.init_global(p)),
            _nbytes(algo.init_path(p, 0)))


def _extrapolate(algo, n_features: int) -> tuple:
    one, two = _state_bytes(algo, 1000), _state_bytes(algo, 2000)
    return tuple(max(0, int(a + (b - a) * (n_features - 1000) / 1000)) for a, b in zip(one, two))


def state_bytes(algo, n_features: int, fresh: bool = False) -> tuple[int, int, int]:
    """(path state, a stage's working state, global state) bytes of ``algo`` at ``n_features``: linear fit through
    widths 1,000 and 2,000. The path state is the largest one kept between stages (:meth:`Algorithm.full_state`:
    a compact state that grows with its non-zeros, all of them non-zero), or with ``fresh`` the state
    :meth:`Algorithm.init_path` starts from. The working state is what the task's private copy adds to the state it
    received (the path state's size, unless the algorithm expands a compact state, :meth:`Algorithm.working_state`,
    or shares read-only arrays with it, :func:`pipeline.algorithms.base.frozen`)."""
    full, work, glob, new = _extrapolate(algo, n_features)
    return (new if fresh else full), work, glob


def worker_need(algo, n_features: int, paths_per_worker: int, cache_bytes: int = 0) -> dict:
    """Bytes one worker needs: ``paths_per_worker`` x (path state at its largest + working state + a task's scratch,
    ``algo.scratch_bytes_per_feature``) + global + the stage-end merge (``algo.exchange_bytes_per_feature``) + cache
    + process baseline; ``path_fresh``: a fresh path state (the same as ``path`` for states that do not grow)."""
    path, work, glob, fresh = _extrapolate(algo, n_features)
    exchange = algo.exchange_bytes_per_feature * n_features
    scratch = algo.scratch_bytes_per_feature * n_features
    total = (path + work + scratch) * paths_per_worker + glob + exchange + int(cache_bytes) + PROCESS_BASELINE
    return {"total": total, "path": path, "work": work, "scratch": scratch, "global": glob, "exchange": exchange,
            "cache": int(cache_bytes), "paths": paths_per_worker, "path_fresh": fresh}


def _gb(b: float) -> str:
    return f"{b / 1e9:.2f} GB"


def message(algo, n_features: int, need: dict, limit: int, n_workers: int, cause: str) -> str:
    """The one-line explanation: algorithm, width, the estimate and its parts, the limit, what would fit."""
    room = usable(limit)
    fit = max(0, (room - PROCESS_BASELINE - need["global"] - need["exchange"] - need["cache"])
              // max(1, need["path"] + need["work"] + need["scratch"]))
    advice = (f"start the workers with memory_limit >= {_gb(need['total'] * 1.1)} (Dask's worker memory_limit; "
              f"`--workers N` gives each of N workers 1/N of this machine's memory)")
    if need["paths"] > 1 and fit >= 1:
        advice = f"run at most {fit} path(s) per worker (more workers or fewer --paths), or " + advice
    elif n_workers > 1:
        advice = "use fewer --workers (each gets a larger share of memory), or " + advice
    return (f"--algo {algo.name} at {n_features:,} features needs about {_gb(need['total'])} per worker "
            f"({need['paths']} path(s) x (state {_gb(need['path'])} + working copy {_gb(need['work'])} + scratch "
            f"{_gb(need['scratch'])}), global {_gb(need['global'])}, "
            f"stage-end merge {_gb(need['exchange'])}, block cache {_gb(need['cache'])}, "
            f"process {_gb(PROCESS_BASELINE)}); {cause} "
            + (f"memory_limit is {_gb(limit)} (restarted past {_gb(room)}): " if limit
               else "memory_limit is not set (the machine ran out): ")
            + advice)


def worker_limits(client) -> list[int]:
    """The memory_limit of every worker of a distributed client (0 = none); [] for other executors."""
    info = getattr(client, "scheduler_info", None)
    if info is None:
        return []
    try:
        workers = info()["workers"]
    except (KeyError, TypeError, AttributeError):
        return []
    return [int(w.get("memory_limit") or 0) for w in workers.values()]


def check_fits(client, algo, n_features: int, paths: int, cache_bytes: int) -> int:
    """Raise :class:`WorkerMemoryError` when the state alone exceeds the smallest worker memory_limit; return the
    block cache budget that fits beside it (``cache_bytes``, or 0 when the cache would not fit: it is optional).
    Without a limit (or a Dask cluster) ``cache_bytes`` is returned unchanged."""
    every = worker_limits(client)
    limit = min((x for x in every if x > 0), default=0)
    if not limit:
        return cache_bytes
    need = refuse(algo, n_features, paths, len(every), limit, "the workers'")
    return cache_bytes if need["total"] + cache_bytes <= usable(limit) else 0


def usable(limit: int) -> int:
    """The part of a worker's ``limit`` it can use: its nanny restarts it past ``distributed.worker.memory.terminate``
    (95% by default) of the limit, and the embedded cluster does not pause it before (:func:`pipeline.cluster.
    local_cluster`)."""
    import dask

    f = dask.config.get("distributed.worker.memory.terminate", default=False)
    return int(limit * f) if isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < 1 else int(limit)


def refuse(algo, n_features: int, paths: int, n_workers: int, limit: int, cause: str) -> dict:
    """Raise :class:`WorkerMemoryError` when a worker's share of ``paths`` does not fit in the :func:`usable` part of
    ``limit`` bytes; return the need (:func:`worker_need`) otherwise."""
    need = worker_need(algo, n_features, math.ceil(paths / max(1, n_workers)))
    if need["total"] > usable(limit):
        raise WorkerMemoryError(message(algo, n_features, need, limit, n_workers, cause))
    return need


def check_local(algo, n_features: int, paths: int, workers: int) -> None:
    """Before an embedded cluster of ``workers`` processes starts (``--workers N``): their memory_limit is known
    (:func:`pipeline.cluster.local_memory_limit`), so training that cannot fit is refused at once, not after N
    processes have started."""
    from pipeline.cluster import local_memory_limit

    refuse(algo, n_features, paths, workers, local_memory_limit(workers), f"with --workers {workers} each worker's")


def trim_heap() -> bool:
    """Give the freed pages of this process's malloc heaps back to the OS (glibc's malloc_trim(0)); False where
    there is no glibc. Arrays of a few MB come from the heap once glibc's mmap threshold has risen past them, and
    their pages stay with the process after they are freed: a worker that had dropped the refit's 1 GB block
    cache still held it (RSS 1.51 -> 1.65 GB when the holdout evaluation came next)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False
