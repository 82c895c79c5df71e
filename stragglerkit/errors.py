"""The exceptions stragglerkit raises: one root, :class:`StragglerKitError`, and a subclass per kind.

Each subclass is also the builtin exception a Python user would expect for its kind, so code that
catches ``ValueError`` around a bad argument, or ``RuntimeError`` around a failed collective, keeps
working:

* :class:`ConfigError` (``ValueError``): a bad configuration, setting or argument; the message names
  the field or argument and what to give instead.
* :class:`ScheduleError` (``ValueError``): a schedule that is malformed or wrong (the checker's verdict).
* :class:`NotApplicableError` (``ValueError``): an algorithm asked for a situation it does not handle.
* :class:`NotInitializedError` (``RuntimeError``): the library was used before :func:`stragglerkit.init`.
* :class:`CollectiveError` (``RuntimeError``): a collective failed at run time; the message says on
  which rank, in which call, and why.
* :class:`PeerError` (a :class:`CollectiveError`): a named peer died, stalled, timed out or sent
  something else than this rank expected; ``peer`` is its rank in the group.

Example::

    try:
        stragglerkit.all_reduce(grad)
    except stragglerkit.PeerError as err:
        print("rank", err.peer, "failed:", err)
"""

from __future__ import annotations

__all__ = [
    "CollectiveError",
    "ConfigError",
    "NotApplicableError",
    "NotInitializedError",
    "PeerError",
    "ScheduleError",
    "StragglerKitError",
]


class StragglerKitError(Exception):
    """The root of every exception stragglerkit raises on purpose."""


class ConfigError(StragglerKitError, ValueError):
    """A bad configuration value, setting or argument; the message names it and what to give."""


class ScheduleError(StragglerKitError, ValueError):
    """A schedule is malformed or incorrect (raised by the IR loader and the checker)."""


class NotApplicableError(StragglerKitError, ValueError):
    """An algorithm was asked for a situation it does not handle (for example StragglAR with odd n).

    The message names the algorithms that do apply.
    """


class NotInitializedError(StragglerKitError, RuntimeError):
    """stragglerkit was used on a group before ``stragglerkit.init`` was called for it."""


class CollectiveError(StragglerKitError, RuntimeError):
    """A collective failed at run time (executor, exchange, timeout), with rank context in the message."""


class PeerError(CollectiveError):
    """A peer failed: it died, stalled past the timeout, or disagreed (size, dtype, plan).

    ``peer`` is that rank in the group, or ``None`` where the failure could not be pinned on one rank.
    """

    def __init__(self, message: str, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer

    def __reduce__(self) -> tuple[type[PeerError], tuple[str, int | None]]:
        return (type(self), (str(self), self.peer))
