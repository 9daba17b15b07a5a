"""Executors for ingest and training: threads in this process (the default), an embedded LocalCluster on
loopback (``--workers N``), or an existing Dask scheduler (``--scheduler ADDR``).

The kernels are nogil numba functions, so threads of one process run them in parallel; the in-process
executor starts in microseconds where a process cluster costs seconds (interpreter, imports and numba
caches per worker). It runs the same pure task functions in the same reduction order, so the results are
bit-identical to a cluster's (tested).
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def slots(client) -> int:
    """How many tasks ``client`` runs at once: a Dask cluster's workers, or a ThreadClient's threads."""
    info = getattr(client, "scheduler_info", None)
    return max(1, len(info()["workers"]) if info is not None else getattr(client, "threads", 1))


def in_order(submit, n: int, window: int, result=lambda fut: fut.result()):
    """The results of ``submit(i)`` for i = 0..n-1, yielded in order of i, with the next ones submitted ahead so that
    ``window`` stay in flight while the caller handles one (the workers kept busy, memory bounded). ``result``
    waits for what ``submit`` returned (a future's ``result()`` by default). A failed task's error is raised once
    the others in flight have ended and no new one has started, so that none still writes where the caller cleans
    up."""
    pending = deque()
    try:
        for i in range(n):
            pending.append(submit(i))
            if len(pending) > window:
                yield result(pending.popleft())
        while pending:
            yield result(pending.popleft())
    except Exception:
        while pending:
            with contextlib.suppress(Exception):
                result(pending.popleft())
        raise


class ThreadClient:
    """The part of ``distributed.Client``'s interface the engine and the ingest use, on a thread pool of
    this process: ``submit`` (futures among the arguments, also inside lists and tuples, are replaced by
    their results), ``scatter``, ``gather``, ``as_completed``.

    Tasks are queued first in, first out and a task's future arguments were submitted before it, so a
    thread waiting for an argument always waits for a task that is already running: no deadlock.
    """

    def __init__(self, threads: int | None = None):
        self.threads = threads or default_workers()
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="sparsepipe")
        self._n = 0
        self._lock = threading.Lock()

    def submit(self, fn, *args, key=None, pure=None, priority=0, **kwargs):
        """``fn(*args, **kwargs)`` on the pool; ``priority`` is accepted and ignored (first in, first out)."""
        fut = self.pool.submit(_call, fn, args, kwargs)
        with self._lock:
            self._n += 1
            fut.key = key or f"{getattr(fn, '__name__', 'task')}-{self._n}"
        return fut

    def scatter(self, data, broadcast=False, hash=True):
        def done(x):
            f = Future()
            f.set_result(x)
            f.key = f"scattered-{id(f)}"
            return f

        return [done(x) for x in data] if isinstance(data, list) else done(data)

    def gather(self, futures):
        if isinstance(futures, (list, tuple)):
            return [_resolve(f) for f in futures]
        return _resolve(futures)

    @staticmethod
    def as_completed(futures):
        from concurrent.futures import as_completed

        return as_completed(futures)

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _resolve(x):
    if isinstance(x, Future):
        return x.result()
    if isinstance(x, (list, tuple)) and any(isinstance(v, Future) for v in x):
        return type(x)(_resolve(v) for v in x)
    return x


def _call(fn, args, kwargs):
    return fn(*[_resolve(a) for a in args], **{k: _resolve(v) for k, v in kwargs.items()})


def as_completed(client, futures):
    """Futures of ``client`` in the order they finish (a ThreadClient's or a Dask client's)."""
    if isinstance(client, ThreadClient):
        return client.as_completed(futures)
    from distributed import as_completed as dask_as_completed

    return dask_as_completed(futures)


def wait(client, futures) -> None:
    """Return once every one of ``futures`` (of ``client``) has ended, done or failed, fetching nothing (their
    errors surface where their results are used)."""
    if isinstance(client, ThreadClient):
        from concurrent.futures import wait as wait_all
    else:
        from distributed import wait as wait_all
    wait_all(futures)


@contextlib.contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None, client=None, threads: int = 1):
    """Yield a client: ``distributed.Client`` or :class:`ThreadClient`.

    ``client`` is used as is (tests share one cluster); ``scheduler`` joins an existing cluster (a worker paused
    there is reported, :func:`pause_watch`); ``workers`` starts :func:`local_cluster` with that many processes,
    closed on exit; neither: threads in this process (one per core). ``threads``: tasks each embedded worker
    process (or, in this process, each core) runs at once; more than one for tasks that wait on the disk.
    """
    if client is not None:
        yield client
        return
    if workers and scheduler:
        from pipeline.config import UsageError

        raise UsageError(f"--workers {workers} and --scheduler {scheduler}: give one (--workers starts a local "
                         f"cluster, --scheduler joins an existing one)")
    if not workers and not scheduler:
        with ThreadClient(default_workers() * threads) as c:
            yield c
        return
    import dask
    from distributed import Client

    if scheduler:
        timeout = connect_timeout()  # outside the try: its own error names the variable, not the address
        try:
            c = Client(scheduler, timeout=timeout)
        except (OSError, TimeoutError) as e:
            raise OSError(f"{scheduler}: no Dask scheduler answers ({' '.join(str(e).split())}); check the "
                          f"address or drop --scheduler") from None
        except (ValueError, TypeError) as e:  # "127.0.0.1:notaport", "foo://x"
            from pipeline.config import UsageError

            raise UsageError(f"--scheduler {scheduler}: not a scheduler address ({' '.join(str(e).split())}); "
                             f"give tcp://HOST:PORT") from None
        with _client_errors_quiet(), c, pause_watch(c):
            try:
                yield c
            except Exception as e:
                if c.status == "running" and "connection-lost" not in str(e) and _answers(c.scheduler.address):
                    raise
                raise OSError(f"{scheduler}: lost the Dask scheduler mid-run ({type(e).__name__}); nothing was "
                              f"written; check the cluster and run again") from None
        return
    env = {**worker_environ(), "DASK_LOGGING__DISTRIBUTED": logging.getLevelName(worker_log_level()).lower()}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": env}), \
            local_cluster(workers, local_memory_limit(workers), worker_log_level(), threads=threads) as cluster, \
            Client(cluster) as c:
        yield c


def _answers(address: str, timeout: float = 2.0) -> bool:
    """Whether a TCP scheduler ``address`` still accepts a connection (other protocols: assumed so)."""
    import socket

    from distributed.comm import parse_address, parse_host_port

    proto, loc = parse_address(address)
    if proto != "tcp":
        return True
    try:
        socket.create_connection(parse_host_port(loc), timeout=timeout).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _client_errors_quiet():
    """While joined to a ``--scheduler``: Dask's own log records (a lost scheduler logs tracebacks of tens of lines,
    from the client and its batched sends, before the run's exception) are not printed; the run's one-line error
    says what happened. ``SPARSEPIPE_DEBUG=1`` keeps them."""
    if os.environ.get("SPARSEPIPE_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off"):
        yield
        return
    names = ["distributed"] + [n for n in logging.root.manager.loggerDict if n.startswith("distributed.")]
    old = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for n, level in old.items():
            logging.getLogger(n).setLevel(level)


NO_PAUSE = {"distributed": {"worker": {"memory": {"pause": False}}}}
# Dask's background work per process that an embedded cluster does not need, measured on a 16-worker LocalCluster
# left idle (2-core machine): 14.6 CPU-s per 30 s with Dask's defaults, 2.1 with these (0.49 -> 0.07 of a core;
# benchmarks/background.py). The statistical profiler samples every thread's stack every 10 ms (for the
# dashboard's profile page); the event-loop tick runs every 20 ms (to warn of a loop blocked for 3 s); the system
# monitor reads the process's CPU, memory, network and disk counters every 500 ms (dashboard plots); the memory
# monitor reads a worker's RSS every 100 ms in the worker (spilling) and in its nanny (terminate at 95%): 250 ms
# still reacts within a quarter second. With one kernel per core every cycle of it is taken from a path.
QUIET = {"distributed.worker.profile.enabled": False, "distributed.worker.memory.monitor-interval": "250ms",
         "distributed.admin.tick.interval": "1s", "distributed.admin.system-monitor.interval": "5s"}
PAUSE_WARN_SECONDS = 30.0
# Dask's work stealing moves a queued task to an idle worker when its inputs are cheap to send. The engine pins each
# path's tasks and the holdout's to a worker on purpose (``DaskExec.submit_pinned``, loosely, so a lost worker's
# tasks move on), and the cheapest tasks to move are those whose output is large: a ``weights`` task gets the
# sparse decision and makes the dense 133 MB vector at webspam width. With 12 workers on the 350k-row store the
# idle workers at the run's end stole the other workers' weights tasks and their scoring: one worker held several
# dense vectors and peaked at 1.47 GB RSS against 1.03 GB for the rest; without stealing every worker peaked at
# 0.97-1.04 GB in the same wall time. The refit's pinned block tasks, seen now and then on the other worker (which
# then built and spilled those blocks a second time), were the same stealing. A ``--scheduler`` cluster keeps its
# own setting (:func:`stealing_note`).
NO_STEALING = {"distributed.scheduler.work-stealing": False}


@contextlib.contextmanager
def local_cluster(workers: int, memory_limit, silence_logs: int = logging.ERROR, quiet: bool = True,
                  threads: int = 1):
    """A LocalCluster of ``workers`` processes with ``threads`` threads each (one unless asked), scheduler and dashboard
    on 127.0.0.1 only, and no pause: a Dask worker pauses (runs nothing) while its process uses more than 80% of
    ``memory_limit`` and resumes when that falls, but a sparsepipe worker's memory is its own working arrays, module
    caches and pages the allocator keeps, which pausing does not free, so a paused worker waited forever, silently
    (measured: a worker holding 250 MB of a 400 MB limit ran no task for as long as it was watched). Without the pause a
    worker past the limit is restarted by its nanny (95%), and one that keeps dying stops the run with the engine's
    WorkerMemoryError; Dask's spilling of stored results (60–70%) stays on. Dask's periodic background work is thinned
    out (:data:`QUIET`) in the workers and in this process (scheduler, nannies); ``quiet=False`` keeps Dask's defaults
    (benchmarks/background.py compares the two). Its scheduler does not steal work (:data:`NO_STEALING`): tasks stay on
    the worker the engine pins them to."""
    import dask
    from distributed import LocalCluster

    # the nannies' own configuration, which they give every worker they start or restart (a dask.config.set
    # around the cluster's start alone would reach the first workers only: a nanny's copy shares the nested dicts)
    with dask.config.set({**(QUIET if quiet else {}), **NO_STEALING}):  # and the scheduler's and nannies' here
        config = dask.config.update(copy.deepcopy(dask.config.config), NO_PAUSE)
        with _children_ignore_sigint():
            cluster = LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True, host="127.0.0.1",
                                   dashboard_address="127.0.0.1:0", silence_logs=silence_logs,
                                   memory_limit=memory_limit, config=config)
        with cluster:
            yield cluster


@contextlib.contextmanager
def _children_ignore_sigint():
    """Worker processes started in the body ignore SIGINT: a terminal's Ctrl-C reaches every process of its
    group, and a worker that raised KeyboardInterrupt printed its traceback; the command's own process stops the
    work and closes the cluster. (An ignored signal is inherited through exec and Python keeps it ignored; a
    Ctrl-C during the cluster's start, a second or two, is ignored too.)"""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


STEALING_NOTE_BYTES = 32 << 20  # dense float64 weights from this size (4.2M features) make stealing cost memory


def stealing_note(client, n_features: int) -> str | None:
    """The note a run prints on a Dask cluster whose scheduler steals work, with two or more workers, at a width
    whose dense weight vector (the holdout scoring's per-worker copy) is :data:`STEALING_NOTE_BYTES` or more; else
    None (threads, the embedded cluster, narrow stores). See :data:`NO_STEALING`."""
    if getattr(client, "run_on_scheduler", None) is None or 8 * n_features < STEALING_NOTE_BYTES:
        return None
    try:
        if slots(client) < 2 or not client.run_on_scheduler(_steals):
            return None
    except Exception:  # noqa: BLE001  (a scheduler that refuses run_on_scheduler: no note, the run goes on)
        return None
    return (f"sparsepipe: note: the Dask scheduler steals work (distributed.scheduler.work-stealing); sparsepipe pins "
            f"each worker's tasks, and a stolen one can put several dense copies of the weights "
            f"({8 * n_features / 1e6:.0f} MB each at {n_features:,} features) on one worker: set it to false in that "
            f"scheduler's configuration")


def _steals(dask_scheduler=None) -> bool:
    return "stealing" in dask_scheduler.extensions


@contextlib.contextmanager
def pause_watch(client, after: float = PAUSE_WARN_SECONDS, every: float = 5.0):
    """While the body runs, warn on stderr (once per worker) about a worker of a ``--scheduler`` cluster that has
    been paused for ``after`` seconds: a cluster we did not start keeps Dask's pause (see :func:`local_cluster`),
    and a worker paused by sparsepipe's own memory runs nothing again, so the run would wait without a word."""
    import sys

    stop = threading.Event()
    since: dict[str, float] = {}
    told: set[str] = set()

    def watch():
        import time

        while not stop.wait(every):
            try:
                workers = client.scheduler_info()["workers"]
            except Exception:  # noqa: BLE001  (closing client, lost scheduler: the run reports those itself)
                continue
            now = time.monotonic()
            for addr, w in workers.items():
                if w.get("status") != "paused":
                    since.pop(addr, None)
                    continue
                if now - since.setdefault(addr, now) >= after and addr not in told:
                    told.add(addr)
                    used, limit = (w.get("metrics") or {}).get("memory", 0), w.get("memory_limit") or 0
                    print(f"sparsepipe: warning: Dask worker {addr} has been paused for {now - since[addr]:.0f} s "
                          f"(its process uses {used / 1e9:.2f} GB of its {limit / 1e9:.2f} GB memory_limit, above "
                          f"distributed.worker.memory.pause) and runs no task until that falls, which sparsepipe's "
                          f"working memory does not: give the workers a larger memory_limit, fewer paths each "
                          f"(more workers), or set distributed.worker.memory.pause: false", file=sys.stderr,
                          flush=True)

    t = threading.Thread(target=watch, name="sparsepipe-pause-watch", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def local_memory_limit(workers: int) -> int:
    """The memory_limit of each of ``workers`` embedded worker processes: this machine's memory (or its cgroup's
    limit) divided among them, as Dask's "auto" gives a LocalCluster's workers."""
    from distributed.system import MEMORY_LIMIT

    return int(MEMORY_LIMIT // max(1, int(workers)))


def worker_environ() -> dict:
    """Dask's environment for new worker processes, less its MALLOC_TRIM_THRESHOLD_: setting that turns
    off glibc's adaptive mmap threshold, so every array above 128 KiB is a fresh mapping that page-faults
    again on every block (a 200 MB ingest: ~0.43 s instead of ~0.47 s warm). glibc's defaults still
    give freed memory back, above a threshold that adapts to the allocations (at most 64 MiB). A value the
    user exported is inherited as usual; so is the one a Dask cluster started earlier in the same process
    wrote into os.environ (Dask's nanny sets it there)."""
    import dask

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    return env


def worker_log_level() -> int:
    """Log level of the embedded cluster's processes: CRITICAL, so a task's error reaches the user once, as the
    command's one-line message, not also as a worker's 'Compute Failed' traceback; ERROR with
    ``SPARSEPIPE_DEBUG=1`` (bug reports)."""
    debug = os.environ.get("SPARSEPIPE_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")
    return logging.ERROR if debug else logging.CRITICAL


def connect_timeout() -> float:
    """Seconds to wait for a ``--scheduler`` to answer (``SPARSEPIPE_CONNECT_TIMEOUT``, default 10)."""
    text = os.environ.get("SPARSEPIPE_CONNECT_TIMEOUT", "10")
    try:
        return max(0.1, float(text))
    except ValueError:
        from pipeline.config import UsageError

        raise UsageError(f"SPARSEPIPE_CONNECT_TIMEOUT={text!r}: not a number of seconds") from None
