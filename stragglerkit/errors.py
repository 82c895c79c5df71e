"""Exception types shared by every stragglerkit component."""

from __future__ import annotations

__all__ = ["NotApplicableError", "ScheduleError", "StragglerKitError"]


class ScheduleError(ValueError):
    """A schedule is malformed or incorrect (raised by the IR loader and the checker)."""


class NotApplicableError(ValueError):
    """An algorithm was asked for a situation it does not handle (for example StragglAR with odd n).

    The message names the algorithms that do apply.
    """


class StragglerKitError(RuntimeError):
    """A runtime failure (executor, peer fault, timeout), with rank context in the message."""
