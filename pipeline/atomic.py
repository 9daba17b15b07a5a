"""Crash-safe file writes: a temporary file in the target's directory, fsync, os.replace, fsync of the directory.

A reader sees the old file or the new one, never a part (models, the registry's index and pointer, store
metadata). No third-party imports: every command loads this.
"""
from __future__ import annotations

import contextlib
import os
import socket
import stat
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


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets it process-wide, racing threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _host() -> str:
    return socket.gethostname().replace(".", "_")


def _remove_stale(d: str, stem: str, suffix: str) -> None:
    """Temporary files of ``stem`` left by writers on this host that died (kill -9) before their rename."""
    host = _host()
    for name in os.listdir(d):
        if not (name.startswith(stem) and name.endswith(suffix)):
            continue
        owner = name[len(stem):].split(".", 1)[0]  # HOST-PID
        h, _, pid = owner.rpartition("-")
        if h != host or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(d, name))
        except OSError:
            pass  # alive under another user


def output_target(path) -> tuple[str, bool]:
    """Where a plain write of ``path`` lands, and whether it streams there: ``(path, True)`` for an existing FIFO
    or device (``/dev/stdout``: no rename is possible), else ``(the file, False)`` with a symbolic link resolved
    to its target (the rename replaces the target; the link stays)."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode  # follows links
    except OSError:
        mode = stat.S_IFREG
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return path, True
    return (os.path.realpath(path) if os.path.islink(path) else path), False


def write_atomically(path, fill, suffix: str = ".tmp", durable: bool = True) -> str:
    """``fill(f)`` writes the content into a binary file object; it becomes ``path`` only once complete, with
    the permissions a plain ``open(path, "w")`` would give it (0666 less the umask). The temporary file is
    ``.NAME.HOST-PID.XXXX`` + ``suffix`` beside ``path``; those of dead writers of ``path`` are removed first.
    ``durable``: fsync the file and its directory (False for scratch files that no later run reads).
    Through a symbolic link the link's target is replaced (the link stays); a FIFO or a device (``/dev/stdout``)
    is written directly, as a plain write would."""
    given = os.fspath(path)
    path, streamed = output_target(given)
    if streamed:
        with open(path, "wb") as f:
            fill(f)
        return given
    d = os.path.dirname(os.path.abspath(path)) or "."
    stem = "." + os.path.basename(path) + "."
    _remove_stale(d, stem, suffix)
    fd, tmp = tempfile.mkstemp(prefix=f"{stem}{_host()}-{os.getpid()}.", suffix=suffix, dir=d)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            fill(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a write on the descriptor (ENOSPC): name the file
            raise OSError(e.errno, e.strerror, path) from None
        raise
    if durable:
        fsync_dir(d)
    return path
