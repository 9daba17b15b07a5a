"""One version of a store per reader: a training run, refit or evaluation holds a shared flock on the store's
directory while it reads; an append commits its new manifest (and deletes the previous version's statistics) under
an exclusive one. So a run that overlaps an append reads the version it started on, blocks, statistics and
holdout alike, and the append commits when the run ends. The lock is on the directory itself (nothing is written
beside or inside the store, read-only stores work) and the kernel drops it when its process dies, kill -9
included."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import os
import sys

_HELD: dict = {}  # the store's real path -> shared locks this process holds on it


def _open_dir(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None  # not a directory (yet): opening it as a store says what is wrong


@contextlib.contextmanager
def reading(path: str):
    """Hold a shared lock on the store ``path`` for the block (waits while an append commits: seconds)."""
    real = os.path.realpath(path)
    fd = _open_dir(real)
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        _HELD[real] = _HELD.get(real, 0) + 1
        try:
            yield
        finally:
            _HELD[real] -= 1
    finally:
        os.close(fd)


def reads_store(param: str):
    """Decorator: the function reads the store named by its argument ``param`` under :func:`reading`."""

    def deco(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with reading(str(sig.bind(*args, **kwargs).arguments[param])):
                return fn(*args, **kwargs)

        return wrapper

    return deco


@contextlib.contextmanager
def committing(path: str):
    """Hold the exclusive lock on the store ``path``: wait, saying so once on stderr, until no run reads it."""
    real = os.path.realpath(path)
    if _HELD.get(real):
        raise RuntimeError(f"{path}: this process reads the store; it cannot commit to it at the same time")
    fd = _open_dir(real)
    if fd is None:
        raise FileNotFoundError(f"{path}: no such store")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{path}: a training run or evaluation is reading this store; the append commits when it ends",
                  file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
