"""The one Dask scheduler for every algorithm: passes, paths, shuffling, stages, reductions, evaluation.

The model is a function of (data, seed, paths, hyper-parameters) only:
* block order of path m in pass q: ``split`` mode — one seeded permutation of the training blocks per pass,
  path m takes every M-th block; ``full`` mode — each path has its own permutation per pass;
* row order inside a block: a permutation seeded by (seed, pass, path, block);
* stage-end reductions combine path summaries in a fixed pairwise tree over path indices.
None of this depends on which worker runs what, so 1 or N workers give bit-identical weights.

Tasks are pure: ``advance_task`` copies the state it receives and returns the advanced copy, so a task
recomputed after a lost worker gives the same result. One task advances a path over *all* of its blocks
in the stage, so the copy is paid once per stage, not per block; the task reports copy / I/O / kernel time.
The same task summarizes the advanced state for the stage-end reduction and returns it settled
(:meth:`Algorithm.settle`: STSGD keeps a compact state between stages and expands it only inside the task,
:meth:`Algorithm.working_state`), so a stage's full working arrays never outlive the task.

Placement: ``placement="paths"`` submits one task per path per stage (paths spread over workers);
``placement="single"`` runs the same stage loop inside one task (short stages on small data, where a
cross-worker reduction per stage would cost more than the work). Both run the same functions in the same
order and give identical models.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from pipeline import interrupt
from pipeline.algorithms.base import Algorithm, copy_state

CURSOR = "cursor"  # int64[3]: pass index, position in this pass's block list, row position in the block
TIMING = "_timing"  # float64[4]: copy s, read s, kernel s, non-zeros processed


# ------------------------------------------------------------------------------------- orders

def path_blocks(seed: int, pass_index: int, path: int, n_paths: int, n_blocks: int, mode: str) -> np.ndarray:
    """Indices of the training blocks path ``path`` reads in pass ``pass_index``, in order."""
    if mode == "split":
        return np.random.default_rng([seed, 1, pass_index]).permutation(n_blocks)[path::n_paths]
    return np.random.default_rng([seed, 2, pass_index, path]).permutation(n_blocks)


def row_order(seed: int, pass_index: int, path: int, block: int, n_rows: int, window: int = 1) -> np.ndarray:
    key = [seed, 3, pass_index, path, block] + ([window] if window > 1 else [])
    return np.random.default_rng(key).permutation(n_rows).astype(np.int64)


def merge_blocks(parts: list, bufs: dict | None = None):
    """Concatenate CSR blocks (indptr, indices, data, y) row-wise (the shuffle window's group).

    ``bufs`` (a dict the caller keeps, e.g. :func:`group_buffers`): indices and data go into arrays kept there
    and reused by the next group (grown when too small), valid until the next call with the same dict. Fresh
    arrays for every group cost their page faults each time: concatenating a pass's groups of the 35k x 16.6M
    store took 0.24-0.32 s into fresh arrays, 0.06 s into reused ones. Parts that already lie in order at the
    head of those arrays (:meth:`DataRef.load_group` decodes them there) are not copied."""
    if len(parts) == 1:
        return parts[0]
    offs = np.cumsum([0] + [p[0][-1] for p in parts[:-1]])
    indptr = np.concatenate([parts[0][0][:1]] + [p[0][1:] + o for p, o in zip(parts, offs)])
    big = []
    for k in (1, 2):
        arrays = [p[k] for p in parts]
        if bufs is None:
            big.append(np.concatenate(arrays))
            continue
        n = sum(a.shape[0] for a in arrays)
        buf = bufs.get(k)
        if _in_place(arrays, buf):
            big.append(buf[:n])
            continue
        big.append(np.concatenate(arrays, out=grow(bufs, k, n, np.result_type(*arrays))))
    return indptr, big[0], big[1], np.concatenate([p[3] for p in parts])


def grow(bufs: dict, k, n: int, dtype) -> np.ndarray:
    """The first ``n`` entries of ``bufs[k]``, replaced by a new array when too small or of another dtype."""
    buf = bufs.get(k)
    if buf is None or buf.shape[0] < n or buf.dtype != dtype:
        buf = bufs[k] = np.empty(n, dtype)
    return buf[:n]


def _in_place(arrays: list, buf) -> bool:
    """Whether ``arrays`` are consecutive runs of ``buf`` from its start (their concatenation is its head)."""
    if buf is None:
        return False
    at = buf.ctypes.data
    for a in arrays:
        if a.dtype != buf.dtype or not a.flags.c_contiguous or (a.shape[0] and a.ctypes.data != at):
            return False
        at += a.nbytes
    return at <= buf.ctypes.data + buf.nbytes


_THREAD = threading.local()


def group_buffers(name: str = "group") -> dict:
    """This thread's dict of reused buffers ``name`` (:func:`merge_blocks`' ``bufs``): kept from task to task,
    so a worker pays the page faults of a stage's group arrays once, not at every stage (fresh memory that
    the kernel must find huge pages for costs up to ~2 s per GB on a machine whose memory is full of page
    cache). Tasks run one at a time per thread, each using the arrays only until its next group."""
    return _THREAD.__dict__.setdefault(name, {})


# ------------------------------------------------------------------------------------- I/O

@lru_cache(maxsize=8)
def _open(store_path: str, manifest_version: int):
    from pipeline.store.reader import open_store

    st = open_store(store_path)
    if st.manifest["manifest_version"] != manifest_version:
        raise RuntimeError(f"{store_path}: store changed during training (manifest v{manifest_version} -> "
                           f"v{st.manifest['manifest_version']})")
    return st


class BlockCache:
    """Worker-local LRU cache of decoded training blocks, bounded in bytes (0 disables it).

    Multi-pass training re-reads every block each pass; blocks that fit in the budget are decoded once per
    worker process. The cache never changes results: blocks are immutable and keyed by store version.
    """

    def __init__(self):
        import threading
        from collections import OrderedDict

        self.items = OrderedDict()
        self.nbytes = 0
        self.lock = threading.Lock()  # tasks of the in-process executor share one cache

    def get(self, key, loader, budget: int, pin: bool = False):
        """The arrays of ``key``, from the cache or ``loader()``. Least recently used entries make room for a new
        one; with ``pin`` nothing is evicted and a new entry that does not fit is returned uncached: for sweeps
        over more blocks than the budget holds, where an LRU would evict each block just before its next use and
        hit nothing, the first blocks stay and budget / share of every sweep hits."""
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
                return hit
        value = loader()
        size = sum(a.nbytes for a in value)
        with self.lock:
            if size <= budget and key not in self.items:
                while not pin and self.nbytes + size > budget and self.items:
                    self._drop(next(iter(self.items)))
                if self.nbytes + size <= budget:
                    self.items[key] = value
                    self.nbytes += size
        return value

    def drop(self, unwanted=lambda key: True) -> None:
        """Drop the entries whose key ``unwanted`` accepts (default: all)."""
        with self.lock:
            for k in [k for k in self.items if unwanted(k)]:
                self._drop(k)

    def _drop(self, key):
        self.nbytes -= sum(a.nbytes for a in self.items.pop(key))


_CACHE = BlockCache()
DEFAULT_CACHE_BYTES = 1 << 30
# Training decodes every block every pass by default (no block cache): decoding into the reused group buffers
# (DataRef.load_group) runs at ~600-800M nnz/s per core from the OS page cache, ~8x the kernel, while a cache
# miss decodes into fresh memory held by the cache (49-85M nnz/s on this machine when the kernel must find huge
# pages). On the 35k x 16.6M store (2 workers, 4 passes) the cache made the run slower (wall 6.9-9.1 s against
# 5.8-5.9 s without) and each worker ~1 GB larger; it still serves callers that pass ``cache_bytes``.
TRAIN_CACHE_BYTES = 0


def cache_budget(entries: list, paths: int, path_mode: str, data_dtype: str, budget: int) -> int:
    """The block cache's budget for one worker: ``budget`` when the blocks one path reads in a pass fit in it,
    else 0. Every pass reads a path's blocks in a new order, so an LRU cache smaller than them hits nothing
    (each block is evicted before it is read again) and only holds memory: at webspam scale (~20 GB of
    decoded blocks per pass) the 1 GiB cache was pure cost."""
    return budget if path_share(entries, paths, path_mode, data_dtype) <= budget else 0


def path_share(entries: list, paths: int, path_mode: str, data_dtype: str) -> int:
    """Bytes of the decoded blocks one path reads in a pass (what a worker's block cache holds at most)."""
    per_nnz = 4 + np.dtype(data_dtype).itemsize
    total = sum(e["nnz"] * per_nnz + e["rows"] * 16 for e in entries)
    return int(total / max(1, paths)) if path_mode == "split" else int(total)


@dataclass(frozen=True)
class DataRef:
    """What a task needs to find the training blocks: store path, manifest version and the train keys."""

    store: str
    version: int
    keys: tuple
    rows: tuple
    n_features: int
    cache_bytes: int = DEFAULT_CACHE_BYTES

    def load(self, b: int, verify: bool | None = None):
        """Block ``b``'s (indptr, indices, data, y), from the block cache or decoded; ``verify``: as for
        :meth:`pipeline.store.reader.Store.block`."""
        def read():
            blk = _open(self.store, self.version).block(self.keys[b], verify=verify)
            return blk.indptr, blk.indices, blk.data, blk.y

        return _CACHE.get((self.store, self.version, self.keys[b]), read, self.cache_bytes)

    def load_group(self, group, bufs: dict, verify: bool | None = None):
        """The blocks ``group`` (indices into ``keys``) as one CSR (:func:`merge_blocks` into ``bufs``). Without
        a block cache each block is decoded straight into its place in ``bufs``: no fresh arrays, no copy."""
        if self.cache_bytes > 0:
            return merge_blocks([self.load(int(g), verify) for g in group], bufs)
        st = _open(self.store, self.version)
        entries = [st.entry(self.keys[int(g)]) for g in group]
        heads = decode_heads(st, bufs, sum(int(e["nnz"]) for e in entries))
        parts, at = [], 0
        for e in entries:
            n = int(e["nnz"])
            blk = st.block(e, (None, heads[0][at:at + n], heads[1][at:at + n], None), verify)
            parts.append((blk.indptr, blk.indices, blk.data, blk.y))
            at += n
        return merge_blocks(parts, bufs)


def keep_columns_of(indptr, indices, data, bits, bufs: dict) -> tuple:
    """(indptr, indices, data) of the group restricted to the columns set in ``bits`` (:meth:`Algorithm.read_columns`,
    :func:`pipeline.kernels.columns.keep_columns`): indices and data compacted in place in this thread's buffers
    ``bufs`` (copied there first when they are not in them, e.g. a block cache's arrays), the row pointers into a
    buffer of their own; ``indptr`` is not changed."""
    from pipeline.kernels.columns import keep_columns

    n = indices.shape[0]
    if not (_in_place([indices], bufs.get(1)) and _in_place([data], bufs.get(2))):
        ix, dx = grow(bufs, 1, n, indices.dtype), grow(bufs, 2, n, data.dtype)
        ix[:], dx[:] = indices, data
        indices, data = ix, dx
    out = grow(bufs, "indptr", indptr.shape[0], np.int64)
    k = keep_columns(indptr, indices, data, bits, out)
    return out, indices[:k], data[:k]


def decode_heads(st, bufs: dict, nnz: int) -> tuple:
    """Arrays of ``nnz`` entries of the store's indices and data dtypes from ``bufs`` (:func:`grow`), for
    :meth:`Store.block`'s ``out``."""
    return grow(bufs, 1, nnz, st.indices_dtype), grow(bufs, 2, nnz, st.data_dtype)


# ------------------------------------------------------------------------------------- tasks

@dataclass(frozen=True)
class RunSpec:
    seed: int
    n_paths: int
    end_pass: int  # exclusive: paths stop at this pass index
    stage_blocks: int = 0  # full mode: blocks per path per stage (0 = until the algorithm ends the stage)
    window: int = 1  # shuffle window: rows are shuffled across this many consecutive blocks of the path order
    max_density: float | None = None  # stop when the aggregated model's density reaches this
    max_rows: int = 0  # > 0: each path advances at most this many rows in the stage (the --max-density search)
    # blocks read in passes >= this one skip their checksum: the run verified each on its read in an earlier pass
    # (:func:`first_pass_end`); the default verifies every read
    verify_until: int = 1 << 62


def advance_task(algo: Algorithm, state: dict, data: DataRef, spec: RunSpec, path: int) -> tuple:
    """Advance a private copy of one path's state by one stage (pure): (the settled state, its summary)."""
    t0 = time.perf_counter()
    keep = algo.read_columns(state)  # of the settled state: the working state may not keep them
    state = algo.working_state(copy_state(state))
    t_copy = time.perf_counter() - t0
    t_read = t_kernel = 0.0
    nnz = 0
    cur = state[CURSOR]
    n_blocks = len(data.keys)
    blocks_done = 0
    rows_done = 0
    W = max(1, spec.window)
    bufs = group_buffers()  # the group's arrays, this thread's (merge_blocks)
    while cur[0] < spec.end_pass:
        if spec.max_rows and rows_done >= spec.max_rows:
            break
        order = path_blocks(spec.seed, int(cur[0]), path, spec.n_paths, n_blocks, algo.path_mode)
        if cur[1] * W >= order.shape[0]:
            cur[0] += 1
            cur[1] = 0
            cur[2] = 0
            if algo.path_mode == "split":
                break  # parameter mixing: a stage is one pass
            continue
        group = order[cur[1] * W:(cur[1] + 1) * W]
        b = int(group[0])
        t1 = time.perf_counter()
        indptr, indices, data_, y = data.load_group(group, bufs, None if cur[0] < spec.verify_until else False)
        t2 = time.perf_counter()
        read = indptr  # the rows as read: the non-zeros processed count every entry, kept or not
        if keep is not None:  # the kernel's time includes this filter
            indptr, indices, data_ = keep_columns_of(indptr, indices, data_, keep, bufs)
        rows = row_order(spec.seed, int(cur[0]), path, b, y.shape[0], W)
        start = int(cur[2])
        if spec.max_rows:  # the stage ends after max_rows rows, inside a block if need be
            rows = rows[:start + spec.max_rows - rows_done]
        consumed, stage_done = algo.advance(state, indptr, indices, data_, y, rows, start, int(cur[0]))
        rows_done += consumed
        t3 = time.perf_counter()
        t_read += t2 - t1
        t_kernel += t3 - t2
        sel = rows[start:start + consumed]
        nnz += int(np.sum(read[sel + 1] - read[sel]))
        cur[2] += consumed
        if cur[2] >= y.shape[0]:  # (rows may be cut by max_rows)
            cur[1] += 1
            cur[2] = 0
            blocks_done += group.shape[0]
            if cur[1] * W >= order.shape[0]:  # the pass is over: the cursor says so now, so a stage that ends
                cur[0] += 1  # here (--stage-blocks) is not followed by an empty one at the run's end
                cur[1] = 0
                if algo.path_mode == "split":
                    break
        if stage_done or (spec.stage_blocks and blocks_done >= spec.stage_blocks):
            break
    indptr = indices = data_ = y = rows = sel = read = None  # the last block group: not held through the summary
    algo.end_stage(state)
    tim = state.get(TIMING, np.zeros(4))
    state[TIMING] = tim + np.array([t_copy, t_read, t_kernel, nnz], dtype=np.float64)
    summary = algo.summarize(state)
    return algo.settle(state), summary


def advance_stage(ex, algo: Algorithm, states: list, data: DataRef, spec: RunSpec) -> tuple[list, object]:
    """Every path's stage (path m on worker m mod n) and the fixed-tree combination of their summaries:
    (the paths' settled states, the combined summary)."""
    out = [ex.submit_pinned(m, advance_task, algo, states[m], data, spec, m) for m in range(spec.n_paths)]
    part = [[ex.submit_pinned(m, _item, o, i) for m, o in enumerate(out)] for i in (0, 1)]  # where the task ran
    return part[0], tree(ex, part[1], _combine, algo)


def apply_task(algo, state, decision):
    return algo.apply(state, decision)


def init_task(algo, n_features, path, warm):
    s = algo.init_path(n_features, path)
    s[CURSOR] = np.zeros(3, dtype=np.int64)
    if warm is not None:
        s = algo.warm_start(s, warm[0], warm[1])
    return s


def decide_task(algo, total, gstate, n_paths):
    return algo.decide(total, gstate, n_paths)


def eval_task(store: str, version: int, key: str, w, bias: float, verify: bool | None = None):
    from pipeline.evaluate import block_partial

    st = _open(store, version)
    heads = decode_heads(st, group_buffers("eval"), int(st.entry(key)["nnz"]))  # the partial keeps neither
    return block_partial(st.block(key, (None, *heads, None), verify), w, bias)


# ------------------------------------------------------------------------------------- executors

class LocalExec:
    """Runs each call immediately in this process (inside one task for placement="single")."""

    def submit(self, fn, *args, priority: int = 0):
        return fn(*args)

    def submit_pinned(self, i: int, fn, *args, priority: int = 0):
        return fn(*args)

    def workers(self) -> list:
        return []

    def result(self, x):
        return x

    def gather(self, xs) -> list:
        return list(xs)

    def first(self, x, i):
        return x[i]

    def put(self, x):
        return x


LARGE_ARG = 1 << 20  # bytes: a larger client-side value goes to the workers as scattered data, not in a graph


class DaskExec:
    def __init__(self, client):
        self.client = client

    def submit(self, fn, *args, priority: int = 0):
        """``fn(*args)`` as a task; a worker runs its ready tasks of higher ``priority`` first (the thread
        executor ignores it: first in, first out)."""
        return self.client.submit(fn, *args, pure=False, priority=priority)

    def submit_pinned(self, i: int, fn, *args, priority: int = 0):
        """As :meth:`submit`, preferring worker i mod n: a task over block i then finds what that worker
        cached for block i in the previous round (the refit's compacted blocks) instead of missing on the
        other workers half of the time. Results do not depend on placement."""
        addrs = self.workers()
        if not addrs:
            return self.submit(fn, *args, priority=priority)
        return self.client.submit(fn, *args, pure=False, workers=[addrs[i % len(addrs)]], allow_other_workers=True,
                                  priority=priority)

    def workers(self) -> list:
        """The workers' addresses, sorted (asked once); empty for a client without workers (the thread executor)."""
        if not hasattr(self, "_addrs"):
            info = getattr(self.client, "scheduler_info", None)
            self._addrs = sorted(info()["workers"]) if info is not None else []
        return self._addrs

    def slots(self) -> int:
        """How many tasks run at once: the workers, or the thread executor's threads."""
        from pipeline.cluster import slots

        return slots(self.client)

    def put(self, x):
        """``x`` (a dict of arrays) as scattered data when large (a 16.6M-feature global state is 16 MB: inside
        a graph it draws Dask's "Sending large graph" warning); broadcast, so a lost worker loses no copy."""
        if isinstance(x, dict) and sum(getattr(v, "nbytes", 0) for v in x.values()) > LARGE_ARG:
            return self.client.scatter([x], broadcast=True, hash=False)[0]
        return x

    def result(self, x):
        return x.result()

    def gather(self, xs) -> list:
        """The results of the futures ``xs``, in their order (one request)."""
        return self.client.gather(list(xs))

    def first(self, x, i):
        return self.client.submit(_item, x, i, pure=False)


def _item(x, i):
    return x[i]


def tree(ex, items: list, fn, *args):
    """Combine ``items`` pairwise in a fixed tree over their indices: ((0,1),(2,3)),... (deterministic)."""
    level = list(items)
    while len(level) > 1:
        nxt = [ex.submit(fn, *args, level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _combine(algo, a, b):
    return algo.combine(a, b)


# ------------------------------------------------------------------------------------- training

@dataclass
class TrainResult:
    w: np.ndarray
    bias: float
    states: list
    gstate: dict
    history: list = field(default_factory=list)
    timing: dict = field(default_factory=dict)


EVAL_PRIORITY = -1  # holdout metrics yield to the stage's own tasks: they fill a worker's idle time instead


def _submit_evaluation(ex, data_holdout, decision, algo, verify: bool | None = None):
    """The merged holdout partial of the model ``decision`` (a future with Dask), or None without holdout.
    ``verify=False``: the blocks are read without their checksum (a run's later evaluations: its first checked them).

    Block i is scored on worker i mod n with that worker's own dense weights (one ``weights`` task per worker:
    at 16.6M features the 133 MB vector would otherwise travel, or every block would queue on one worker), at
    :data:`EVAL_PRIORITY`, so a worker runs them when the stage-end exchange leaves it idle."""
    store, version, keys, kind = data_holdout
    if not keys:
        return None
    from pipeline.evaluate import merge_partials

    n = max(1, min(len(ex.workers()), len(keys)))  # one weights copy per worker process (threads share one)
    wb = [ex.submit_pinned(m, algo.weights, decision, priority=EVAL_PRIORITY) for m in range(n)]
    w = [ex.first(x, 0) for x in wb]
    bias = [ex.first(x, 1) for x in wb]
    parts = [ex.submit_pinned(i % n, eval_task, store, version, k, w[i % n], bias[i % n], verify,
                              priority=EVAL_PRIORITY) for i, k in enumerate(keys)]
    return tree(ex, parts, merge_partials)


def _metrics(ex, data_holdout, total):
    from pipeline.evaluate import metrics_from_partial

    return None if total is None else metrics_from_partial(ex.result(total), data_holdout[3])


def _report(ex, rec: dict, due: bool, evaluation, holdout, history: list, progress) -> None:
    """Record (and pass to ``progress``) a finished stage's ``rec``, with the holdout metrics of ``evaluation``
    (:func:`_submit_evaluation`) when they are ``due``."""
    if due:
        rec["holdout"] = _metrics(ex, holdout, evaluation)
    history.append(rec)
    interrupt.check()  # a Ctrl-C whose exception a garbage-collection callback swallowed stops the run here
    if progress:
        progress(rec)


def run_stages(ex, algo: Algorithm, states: list, gstate: dict, data: DataRef, spec: RunSpec,
               holdout, progress=None, evaluate_every: int = 1, max_stages: int | None = None):
    """The stage loop shared by both placements. Returns (states, gstate, decision, history).

    With ``spec.max_density`` the loop stops when the aggregated model reaches that density, inside a stage
    (a pass) if need be: the stage that crosses it is re-run from its start with each path stopping after r
    rows, r the largest that keeps the mixed model within the bound (:func:`_density_cut`), and that model
    (and its path states, cursors inside the pass) is returned. When even the first row per path of the
    first stage crosses the bound, the model after that row is returned (never an error).
    """
    M = spec.n_paths
    history = []
    # A stage's record waits for the next stage's tasks: its holdout metrics (0.7 s of one worker per pass at
    # webspam scale) are submitted after them, spread over the workers at a lower priority than the stage-end
    # exchange, and the client waits for them only once the mix is on its way to the paths.
    pending = None  # (record, the decision to evaluate or None) of the last stage, not yet reported
    decision = None
    stage = 0
    t_start = t_end = time.time()
    passes = _passes(ex, states)
    gref = ex.put(gstate)
    evaluated = False

    def evaluation_of(decision):
        """:func:`_submit_evaluation` of ``decision``; the run's first checks the holdout blocks' checksums."""
        nonlocal evaluated
        out = _submit_evaluation(ex, holdout, decision, algo, False if evaluated else None)
        evaluated = True
        return out

    while True:
        if min(passes) >= spec.end_pass or (max_stages is not None and stage >= max_stages):
            break
        t0 = t_end  # a stage's seconds run from the previous stage's record: the waits between count too
        # path m's tasks prefer worker m mod n (submit_pinned; loose, so a lost worker's path moves on): left to
        # the scheduler, both states of a 2-path run were seen moved onto one worker (2 x 0.6 GB at webspam
        # width). The stage's inputs are kept only for the --max-density search; otherwise a path's input state is
        # released as soon as its advance has made the private copy's successor (one state per path in memory
        # between stages, two only during the advance)
        before = (states, gstate, gref, decision) if spec.max_density is not None else None
        states, total = advance_stage(ex, algo, states, data, spec)
        asked = _ask_passes(ex, states)  # apply keeps the cursor: asked now, read without waiting for apply
        evaluation = evaluation_of(pending[1]) if pending and pending[1] is not None else None
        out = ex.submit(decide_task, algo, total, gref, M)
        del total  # the summaries are released once decided (they would stay in memory through the next stage)
        decision = ex.first(out, 0)
        gref = ex.first(out, 1)  # the next stage reads it where it was made, not from the client
        # the mix goes to the paths before the client waits for anything: the previous stage's holdout metrics
        # (0.7 s of one worker at webspam scale) then no longer stand between this stage and the next
        applied = ([ex.submit_pinned(m, apply_task, algo, s, decision) for m, s in enumerate(states)]
                   if spec.max_density is None else None)
        gstate = ex.result(gref)
        diag = ex.result(ex.first(out, 2))
        if pending is not None:  # the previous stage's record; its metrics ran beside this stage's end
            _report(ex, pending[0], pending[1] is not None, evaluation, holdout, history, progress)
            pending = None
        if spec.max_density is not None and diag.get("density", 0.0) > spec.max_density:
            # the bound is reached inside this stage: find the most rows per path that keep the mixed model
            # within it (galloping, then bisection, each probe re-running the stage from its start; pure
            # tasks make every probe exact) and stop with the model at that point
            cut = _density_cut(ex, algo, before[0], before[2], data, spec, M)
            history.append({"stage": stage + 1, "stopped": "max_density", **diag})
            if cut is None and before[3] is not None:  # the previous stage's end is the point
                states, gstate, gref, decision = before
                break
            if cut is None:  # the very first rows cross the bound: the model after one row per path
                cut = _partial_stage(ex, algo, before[0], before[2], data, spec, M, 1)
            new_states, decision, gref, gstate, diag, rows_in = cut
            states = [ex.submit_pinned(m, apply_task, algo, s, decision) for m, s in enumerate(new_states)]
            stage += 1
            rec = {"stage": stage, "pass": min(_passes(ex, states)), **diag, "rows_in_stage": rows_in,
                   "seconds": round(time.time() - t0, 4), "elapsed": round(time.time() - t_start, 3)}
            if holdout is not None:
                rec["holdout"] = _metrics(ex, holdout, evaluation_of(decision))
            history.insert(len(history) - 1, rec)
            if progress:
                progress(rec)
            break
        states = applied or [ex.submit_pinned(m, apply_task, algo, s, decision) for m, s in enumerate(states)]
        passes = _read_passes(ex, asked)
        stage += 1
        t_end = time.time()
        rec = {"stage": stage, "pass": min(passes), **diag, "seconds": round(t_end - t0, 4),
               "elapsed": round(t_end - t_start, 3)}
        done = min(passes) >= spec.end_pass or algo.finished(gstate)
        pending = (rec, decision if holdout is not None and (stage % evaluate_every == 0 or done) else None)
        if algo.finished(gstate):
            break
    if pending is not None:  # the last stage: its metrics now
        due = pending[1] is not None
        _report(ex, pending[0], due, evaluation_of(pending[1]) if due else None, holdout,
                history, progress)
    return states, gstate, decision, history


def _cursor_pass(state):
    return state[CURSOR][0]


def _partial_stage(ex, algo, states, gref, data, spec, M, rows: int):
    """The stage from ``states`` with each path stopping after ``rows`` rows: (states, decision, gstate ref,
    gstate, diagnostics, rows)."""
    from dataclasses import replace

    sp = replace(spec, max_rows=rows)
    new, total = advance_stage(ex, algo, states, data, sp)
    out = ex.submit(decide_task, algo, total, gref, M)
    g = ex.first(out, 1)
    return new, ex.first(out, 0), g, ex.result(g), ex.result(ex.first(out, 2)), rows


def _density_cut(ex, algo, states, gref, data, spec, M):
    """The partial stage with the most rows per path whose mixed model is within ``spec.max_density`` (None
    when even one row per path crosses it): rows 1, 2, 4, ... until the bound is crossed, then bisection."""
    lo, hi, best = 0, 1, None
    while True:
        got = _partial_stage(ex, algo, states, gref, data, spec, M, hi)
        if got[4].get("density", 0.0) > spec.max_density:
            break
        lo, best, hi = hi, got, hi * 2
        if hi > 1 << 40:  # never crossed (cannot happen: the whole stage crossed); keep the last probe
            return best
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = _partial_stage(ex, algo, states, gref, data, spec, M, mid)
        if got[4].get("density", 0.0) > spec.max_density:
            hi = mid
        else:
            lo, best = mid, got
    return best


def _passes(ex, states) -> list:
    """Each path's current pass index (its cursor lives with the state, possibly on a worker); all asked at once."""
    return _read_passes(ex, _ask_passes(ex, states))


def _ask_passes(ex, states) -> list:
    return [ex.submit(_cursor_pass, s) for s in states]


def _read_passes(ex, asked) -> list:
    return [int(ex.result(a)) for a in asked]


def _run_single(algo, states, gstate, data, spec, holdout, evaluate_every):
    ex = LocalExec()
    states, gstate, decision, history = run_stages(ex, algo, states, gstate, data, spec, holdout,
                                                   None, evaluate_every)
    return states, gstate, decision, history


def gather_states(client, states: list, shared: tuple) -> list:
    """The paths' settled states, fetched from the workers with the ``shared`` keys (identical on every path after
    ``apply``: :attr:`Algorithm.shared_keys`) taken from path 0 only. Gathering every path's copy cost the client
    M copies of TG's and FTRL's dense vectors: 8.2 GB with 16 paths at 16.6M features, for a model file that saves
    them once."""
    if not shared or len(states) < 2:
        return client.gather(states)
    rest = [client.submit(_without, s, shared, pure=False) for s in states[1:]]  # run where each state is
    first, *others = client.gather([states[0], *rest])
    return [first] + [{k: first[k] if k in shared else o[k] for k in first} for o in others]


def _without(state: dict, keys: tuple) -> dict:
    return {k: v for k, v in state.items() if k not in keys}


def first_pass_end(states: list) -> int:
    """The pass index by which a run from these path states has read every training block once: the next pass
    when every cursor is at the start of the same pass, else the one after the furthest path's (a run resumed
    inside a pass reads the blocks before its cursors only in the next pass). Reads before it check the blocks'
    checksums, later ones do not (:attr:`RunSpec.verify_until`): a run verifies every block it reads once."""
    cur = [s[CURSOR] for s in states]
    last = max(int(c[0]) for c in cur)
    at_start = all(int(c[0]) == last and not int(c[1]) and not int(c[2]) for c in cur)
    return last + (1 if at_start else 2)


def _explain_killed_worker(e: Exception, client, algo, p: int, paths: int, cache_bytes: int) -> None:
    """A task whose workers kept dying (Dask's KilledWorker: the nanny restarts a worker past its memory_limit)
    becomes a WorkerMemoryError naming the algorithm, the width, the estimate and what would fit."""
    from distributed.scheduler import KilledWorker

    from pipeline.memory import WorkerMemoryError, message, worker_limits, worker_need

    if not isinstance(e, KilledWorker):
        return
    limits = [x for x in worker_limits(client) if x > 0]
    n_workers = max(1, len(worker_limits(client)))
    need = worker_need(algo, p, -(-paths // n_workers), cache_bytes)
    raise WorkerMemoryError(message(algo, p, need, min(limits) if limits else 0, n_workers,
                                    "a worker died repeatedly while training (the nanny restarts a worker that "
                                    "exceeds its memory limit); the workers'")) from e


def train(store_path: str, algo: Algorithm, *, passes: int, paths: int, seed: int = 0, client=None,
          init_states: list | None = None, init_gstate: dict | None = None, warm: tuple | None = None,
          placement: str = "paths", stage_blocks: int = 0, evaluate: bool = True, evaluate_every: int = 1,
          max_density: float | None = None, cache_bytes: int = TRAIN_CACHE_BYTES, shuffle_window: int = 4,
          progress=None, blocks=None) -> TrainResult:
    """Train ``algo`` on the training blocks of the store for ``passes`` more passes over ``paths`` paths.

    ``init_states``/``init_gstate`` resume exactly (same paths); ``warm = (w, bias)`` warm-starts every path
    from an aggregated model. ``client`` is a distributed.Client; with None the loop runs in this process.
    ``blocks`` (block keys) restricts training and the per-stage holdout metrics to those blocks (a window
    of generations); None: every block of the store. ``cache_bytes``: each worker's budget for decoded training
    blocks (:class:`BlockCache`; default none, :data:`TRAIN_CACHE_BYTES`).
    """
    from pipeline.store.reader import open_store
    from pipeline.store.stats import calibrate

    st = open_store(store_path)
    p = st.n_features
    calibrate(algo, st)
    train_entries = st.entries("train", blocks)
    if not train_entries:
        raise ValueError(f"{store_path}: no training blocks")
    if paths < 1:
        raise ValueError(f"paths must be >= 1, got {paths}")
    if algo.path_mode == "split" and paths > len(train_entries):
        raise ValueError(f"{store_path}: {paths} paths but only {len(train_entries)} training blocks; with "
                         f"--algo {algo.name} paths split the blocks: use --paths <= {len(train_entries)} "
                         f"or re-ingest with a smaller --block-mb")
    if stage_blocks and not algo.stage_blocks_allowed:  # before any state is made or scattered
        raise ValueError(f"--stage-blocks: --algo {algo.name} runs whole passes (its stage end needs every row "
                         f"of the pass); leave it at 0")
    version = st.manifest["manifest_version"]
    dtype = st.data_dtype
    cache_bytes = cache_budget(train_entries, paths, algo.path_mode, dtype, int(cache_bytes))
    if client is not None:  # refuse what the workers' memory_limit cannot hold; a cache only where it fits
        from pipeline.cluster import stealing_note
        from pipeline.memory import check_fits

        cached = min(cache_bytes, path_share(train_entries, paths, algo.path_mode, dtype))
        cache_bytes = cache_bytes if check_fits(client, algo, p, paths, cached) else 0
        if note := stealing_note(client, p):
            print(note, file=sys.stderr, flush=True)
    data = DataRef(st.path, version, tuple(e["key"] for e in train_entries),
                   tuple(e["rows"] for e in train_entries), p, cache_bytes)
    holdout = (st.path, version, tuple(e["key"] for e in st.entries("holdout", blocks)),
               st.label_kind) if evaluate else None
    if init_states is not None:
        if len(init_states) != paths:
            raise ValueError(f"resume needs the same number of paths as the saved model ({len(init_states)})")
        states = [algo.resize(s, p) for s in init_states]
        gstate = init_gstate if init_gstate is not None else algo.init_global(p)
        start_pass = min(int(s[CURSOR][0]) for s in states)
        verify_until = first_pass_end(states)
        if client is not None and placement != "single":
            states = client.scatter(states)
    else:
        gstate = algo.init_global(p)
        start_pass = 0
        verify_until = 1
        if client is not None and placement != "single":
            w_ref = client.scatter(warm, broadcast=True, hash=False) if warm is not None else None
            ex0 = DaskExec(client)  # path m lives on worker m mod n from the start (see run_stages)
            states = [ex0.submit_pinned(m, init_task, algo, p, m, w_ref) for m in range(paths)]
        else:
            states = [init_task(algo, p, m, warm) for m in range(paths)]
    if shuffle_window < 1:
        raise ValueError(f"shuffle_window must be >= 1, got {shuffle_window}")
    spec = RunSpec(seed=seed, n_paths=paths, end_pass=start_pass + passes, stage_blocks=stage_blocks,
                   max_density=max_density, window=shuffle_window, verify_until=verify_until)
    t0 = time.time()
    if client is None:
        states, gstate, decision, history = run_stages(LocalExec(), algo, states, gstate, data, spec, holdout,
                                                       progress, evaluate_every)
    elif placement == "single":
        fut = client.submit(_run_single, algo, states, gstate, data, spec, holdout, evaluate_every, pure=False)
        states, gstate, decision, history = fut.result()
        if progress:
            for rec in history:
                progress(rec)
    else:
        ex = DaskExec(client)
        try:
            states, gstate, decision, history = run_stages(ex, algo, states, gstate, data, spec, holdout,
                                                           progress, evaluate_every)
            states = gather_states(client, states, algo.shared_keys)
        except Exception as e:
            _explain_killed_worker(e, client, algo, p, paths, cache_bytes)
            raise
        decision = decision.result() if decision is not None and hasattr(decision, "result") else decision
    if decision is None:
        raise ValueError("nothing to train: the saved model already has the requested passes")
    w, bias = algo.weights(decision)
    tim = np.sum([s.get(TIMING, np.zeros(4)) for s in states], axis=0)
    for s in states:
        s.pop(TIMING, None)
    secs = time.time() - t0
    timing = {"seconds": round(secs, 3), "copy_s": float(tim[0]), "read_s": float(tim[1]),
              "kernel_s": float(tim[2]), "nnz_processed": int(tim[3]),
              "nnz_per_s_kernel": float(tim[3] / tim[2]) if tim[2] > 0 else 0.0,
              "copy_over_kernel": float(tim[0] / tim[2]) if tim[2] > 0 else 0.0}
    return TrainResult(np.asarray(w, dtype=np.float64), float(bias), states, gstate, history, timing)
