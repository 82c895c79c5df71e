"""Turning termination signals into exceptions while a resource that must be cleaned up is held.

While an emulated cluster is up, SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` and SIGINT
raises ``KeyboardInterrupt`` in the main thread, so that the ``with`` block unwinds through the
clean-up instead of the process dying with namespaces left behind. During the clean-up itself the
signals are held back (a second Ctrl-C cannot cut it short), then delivered to the handlers the
program had before.

Only the main thread may set signal handlers; from any other thread these calls do nothing and
the owner must make sure to clean up.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["TERMINATING", "SignalGuard"]

TERMINATING = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_for(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


class SignalGuard:
    """Installs the raising handlers (``install``), and restores the previous ones (``restore``)."""

    __slots__ = ("_saved",)

    handler: Callable[[int, FrameType | None], None] = staticmethod(_raise_for)

    def __init__(self) -> None:
        self._saved: dict[int, Any] = {}

    def install(self) -> None:
        if not _in_main_thread():
            return
        for sig in TERMINATING:
            self._saved[sig] = signal.signal(sig, self.handler)

    def restore(self) -> None:
        """Puts the previous handlers back (main thread only; from another thread a later call does)."""
        if not _in_main_thread():
            return
        for sig, previous in self._saved.items():
            signal.signal(sig, previous)
        self._saved.clear()

    @staticmethod
    def hold() -> set[int | signal.Signals] | None:
        """Blocks the terminating signals; returns the mask to give to ``release``."""
        if not _in_main_thread():
            return None
        return signal.pthread_sigmask(signal.SIG_BLOCK, set(TERMINATING))

    @staticmethod
    def release(previous: set[int | signal.Signals] | None) -> None:
        """Unblocks; a signal that came while held is delivered now."""
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
