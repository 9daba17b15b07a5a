"""Crash-safe file writes: a temporary file in the target's directory, fsync, os.replace, fsync of the directory.

A reader sees the old file or the new one, never a part (models, the registry's index and pointer, store
metadata). No third-party imports: every command loads this.
"""
from __future__ import annotations

import os
import tempfile


def fsync_dir(path: str) -> None:
    """Flush a directory entry (a rename inside it) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path, fill, prefix: str | None = None, suffix: str = ".tmp", durable: bool = True) -> str:
    """``fill(f)`` writes the content into a binary file object; it becomes ``path`` only once complete.
    ``durable``: fsync the file and its directory (False for scratch files that no later run reads)."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=prefix or "." + os.path.basename(path) + ".", suffix=suffix, dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(d)
    return path
