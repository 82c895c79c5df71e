"""Where the runtime lets a layer above it look in: profiler ranges, through a registered handle.

The runtime opens ranges around each AllReduce, each phase or round of a plan, each reduction and
each message (docs/profiling.md names them), but it knows nothing of NVTX or torch.profiler and
imports nothing above itself. :mod:`stragglerkit.telemetry.nvtx` implements :class:`RangeHooks`
and installs it with :func:`set_range_hooks` when it is imported (importing :mod:`stragglerkit`
does that). Until then :data:`ranges` is :class:`NullRanges`: every range costs an attribute read
and a call that does nothing, and the executor is given no range callback at all.

Example::

    from stragglerkit.runtime import hooks
    with hooks.ranges.range(hooks.ALL_REDUCE, "ring"):   # "stragglerkit/all_reduce ring" when on
        ...
    previous = hooks.set_range_hooks(my_hooks)            # e.g. a test's recorder
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, TypeVar

__all__ = ["ALL_REDUCE", "RECV", "REDUCTION", "SEND", "NullRanges", "RangeHooks", "ranges", "set_range_hooks"]

# -- the names of the ranges the runtime opens (docs/profiling.md) ---------------------------------
ALL_REDUCE = "stragglerkit/all_reduce"
"""Detail: the algorithm (``process_group`` for the process group's own all_reduce). One bucket's AllReduce."""
SEND = "stragglerkit/send"
"""Detail: the peer's group rank. One executor message, from its posting to its observed completion."""
RECV = "stragglerkit/recv"
"""Detail: the peer's group rank."""
REDUCTION = "stragglerkit/reduction"
"""The executor adding a received chunk into the buffer."""

_T = TypeVar("_T")


class RangeHooks(Protocol):
    """What the runtime calls to open and close ranges (telemetry/nvtx.py implements it)."""

    def active(self) -> bool:
        """Do ranges go anywhere now? (The executor gets a range callback only then.)"""
        ...

    def range(self, name: str, detail: object = None) -> AbstractContextManager[None]:
        """A nested range ``"<name> <detail>"`` around a block."""
        ...

    def start(self, name: str, detail: object = None, *, cross_thread: bool = False) -> object | None:
        """Open a range that may overlap others; :meth:`end` closes it (``None``: nothing opened)."""
        ...

    def end(self, started: object | None) -> None:
        """Close a range that :meth:`start` opened."""
        ...

    def thread_state(self) -> object | None:
        """This thread's profiler state, for :meth:`call_under` on the runtime's worker thread."""
        ...

    def call_under(self, state: object, fn: Callable[[], _T]) -> _T:
        """``fn()`` on this thread, recorded under ``state`` (from :meth:`thread_state`)."""
        ...


_NULL_RANGE: AbstractContextManager[None] = nullcontext()


class NullRanges:
    """No ranges: what the runtime uses until telemetry installs its own."""

    __slots__ = ()

    def active(self) -> bool:
        return False

    def range(self, name: str, detail: object = None) -> AbstractContextManager[None]:
        return _NULL_RANGE

    def start(self, name: str, detail: object = None, *, cross_thread: bool = False) -> object | None:
        return None

    def end(self, started: object | None) -> None:
        return None

    def thread_state(self) -> object | None:
        return None

    def call_under(self, state: object, fn: Callable[[], _T]) -> _T:
        return fn()


ranges: RangeHooks = NullRanges()
"""The installed hooks (read it at each use: :func:`set_range_hooks` replaces it)."""


def set_range_hooks(hooks: RangeHooks | None) -> RangeHooks:
    """Install ``hooks`` (``None``: :class:`NullRanges`); returns the ones installed before."""
    global ranges
    previous, ranges = ranges, hooks if hooks is not None else NullRanges()
    return previous
