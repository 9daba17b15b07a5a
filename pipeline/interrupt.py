"""Interrupts that must not be lost: a command records Ctrl-C and SIGTERM here as well as raising
KeyboardInterrupt, because Python drops an exception raised inside a garbage-collection callback (Dask installs
one), and a night that lost its Ctrl-C there ran to its end. Long work calls :func:`check` at its steps."""
from __future__ import annotations

RECEIVED: list = []  # the signals received since the command started (set by the command's handlers)


def check() -> None:
    """Raise KeyboardInterrupt again if a signal was received and its first exception was swallowed."""
    if RECEIVED:
        raise KeyboardInterrupt()
