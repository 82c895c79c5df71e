"""Profiler ranges that cost nothing unless someone is looking: NVTX and torch.profiler.

Every range is named by the scheme of docs/profiling.md (``stragglerkit/step 12``,
``stragglerkit/all_reduce stragglar``, ``stragglerkit/stragglar/round 3``, ``stragglerkit/send 2``, ...)
and goes to two sinks:

* **NVTX** (Nsight Systems), in the ``stragglerkit`` domain, when a backend *and* a profiler are
  present: the ``nvtx`` package (``pip install nvtx``) or, for CUDA builds of torch,
  ``torch.cuda.nvtx``; and a profiler that set its injection variables (nsys sets
  ``NSYS_PROFILING_SESSION_ID``; any NVTX tool sets ``NVTX_INJECTION64_PATH``).
  ``Config.report.nvtx`` (or ``STRAGGLERKIT_NVTX``) forces NVTX on (e.g. for another tool) or
  off; :func:`stragglerkit.init` applies it through :func:`configure`.
* **torch.profiler**: while a torch profiler runs (``torch.autograd.profiler._is_profiler_enabled``,
  the flag every torch profiler sets while it records), ranges also open a
  ``torch.profiler.record_function``, so they appear in the exported chrome trace under the same
  names. torch records on the threads it watches: the one that started the profiler and those
  torch hands its state to (autograd's); the runtime hands it to its worker thread
  (runtime/runtime.py), so the executor's ranges appear too.

With neither, :func:`range` returns one shared do-nothing context manager after two attribute
reads (its name's parts are formatted only when a sink is on), and the executor is given no range
callback at all: the hot path pays those reads and nothing else (docs/profiling.md has the cost).

Ranges that overlap without nesting (the executor's messages), or end on another thread (an
AllReduce that a completion callback sees finish), use :func:`start` and :func:`end`: NVTX process
ranges, and record functions whose end is recorded under the profiler state of the thread that
started them (:func:`thread_state`, :func:`call_under`).

The runtime imports nothing from here: it opens its ranges (each AllReduce, round, reduction and
message) through the hooks of :mod:`stragglerkit.runtime.hooks`, which this module installs when
it is imported (:func:`install`; ``import stragglerkit`` imports it).

Example::

    from stragglerkit.telemetry import nvtx
    with nvtx.range(nvtx.ALL_REDUCE, "ring"):  # "stragglerkit/all_reduce ring"
        ...
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import torch
import torch.autograd.profiler as _autograd_profiler

from stragglerkit.runtime import hooks
from stragglerkit.runtime.hooks import ALL_REDUCE, RECV, REDUCTION, SEND

__all__ = [
    "ALL_REDUCE",
    "DECISION",
    "DOMAIN",
    "EXCHANGE",
    "PROBE",
    "PROFILER_ENV_VARS",
    "RECV",
    "REDUCTION",
    "SEND",
    "STEP",
    "WAIT",
    "Started",
    "active",
    "backend",
    "call_under",
    "configure",
    "enabled",
    "end",
    "install",
    "mark",
    "pop",
    "push",
    "range",
    "refresh",
    "start",
    "thread_state",
    "torch_profiling",
]

PROFILER_ENV_VARS = ("NSYS_PROFILING_SESSION_ID", "NVTX_INJECTION64_PATH")
DOMAIN = "stragglerkit"

# -- the names (docs/profiling.md); a name with a detail reads "<name> <detail>" --------------------
STEP = "stragglerkit/step"
"""Detail: the step. A zero-length range where a rank hands over its step's first bucket (its arrival)."""
# ALL_REDUCE, SEND, RECV and REDUCTION: the runtime's own ranges (runtime/hooks.py)
PROBE = "stragglerkit/probe"
"""A probe's bucket (the loop runs stragglerkit's ring to measure the links), around its AllReduce."""
EXCHANGE = "stragglerkit/exchange"
"""The loop issuing or receiving its stats exchange with rank 0."""
DECISION = "stragglerkit/decision"
"""Detail: an event's kind (``switch``, ``rollback``, ...). A zero-length range per event of a decision
of rank 0's, where a rank adopts it."""
WAIT = "stragglerkit/wait"
"""Waiting for buckets to finish (``synchronize``)."""

_T = TypeVar("_T")

_push: Callable[[str], Any] | None = None
_pop: Callable[[], Any] | None = None
_start: Callable[[str], Any] | None = None
_end: Callable[[Any], Any] | None = None
_backend = "none"

_forced: bool | None = None
"""``Config.report.nvtx``: True (on), False (off) or None (when a profiler is attached)."""


def configure(forced: bool | None) -> bool:
    """Force NVTX on (``True``) or off (``False``), or follow the profiler (``None``); return :func:`enabled`."""
    global _forced
    _forced = forced
    return refresh()


def _profiler_present() -> bool:
    if _forced is not None:
        return _forced
    return any(os.environ.get(name) for name in PROFILER_ENV_VARS)


_Backend = tuple[
    str,
    Callable[[str], Any] | None,
    Callable[[], Any] | None,
    Callable[[str], Any] | None,
    Callable[[Any], Any] | None,
]


def _find_backend() -> _Backend:
    try:
        module: Any = importlib.import_module("nvtx")
        if all(hasattr(module, f) for f in ("push_range", "pop_range", "start_range", "end_range")):

            def push_nvtx(name: str) -> None:
                module.push_range(message=name, domain=DOMAIN)

            def pop_nvtx() -> None:
                module.pop_range(domain=DOMAIN)

            def start_nvtx(name: str) -> Any:
                return module.start_range(message=name, domain=DOMAIN)

            return "nvtx", push_nvtx, pop_nvtx, start_nvtx, module.end_range
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            cuda_nvtx = torch.cuda.nvtx
            return (
                "torch.cuda.nvtx",
                cuda_nvtx.range_push,
                cuda_nvtx.range_pop,
                cuda_nvtx.range_start,
                cuda_nvtx.range_end,
            )
    except (ImportError, RuntimeError):
        pass
    return "none", None, None, None, None


def refresh() -> bool:
    """Re-detect the NVTX backend and profiler (call after changing the environment); return :func:`enabled`."""
    global _push, _pop, _start, _end, _backend
    _push = _pop = _start = _end = None
    _backend = "none"
    if _profiler_present():
        _backend, _push, _pop, _start, _end = _find_backend()
    return enabled()


def enabled() -> bool:
    """Whether NVTX ranges are really emitted."""
    return _push is not None


def backend() -> str:
    """The NVTX backend: ``"nvtx"``, ``"torch.cuda.nvtx"`` or ``"none"``."""
    return _backend


def torch_profiling() -> bool:
    """Whether a torch profiler is recording (somewhere in this process)."""
    return bool(_autograd_profiler._is_profiler_enabled)


def active() -> bool:
    """Whether ranges go anywhere (NVTX or torch.profiler)."""
    return _push is not None or bool(_autograd_profiler._is_profiler_enabled)


def push(name: str) -> None:
    """Open an NVTX thread range (no torch.profiler range: those are :func:`range`'s and :func:`start`'s)."""
    if _push is not None:
        _push(name)


def pop() -> None:
    """Close the innermost NVTX thread range of this thread."""
    if _pop is not None:
        _pop()


def _full_name(name: str, detail: object) -> str:
    return name if detail is None else f"{name} {detail}"


class _Range:
    """An open range in whichever sinks were on when it opened (it closes in the same ones)."""

    __slots__ = ("name", "nvtx", "record")

    def __init__(self, name: str) -> None:
        self.name = name
        self.nvtx = False
        self.record: _autograd_profiler.record_function | None = None

    def __enter__(self) -> None:
        if _push is not None:
            _push(self.name)
            self.nvtx = True
        if _autograd_profiler._is_profiler_enabled:
            self.record = _autograd_profiler.record_function(self.name)
            self.record.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.record is not None:
            self.record.__exit__(None, None, None)
            self.record = None
        if self.nvtx and _pop is not None:
            _pop()
        self.nvtx = False


class _NullRange:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        return None


_NULL = _NullRange()


def range(name: str, detail: object = None) -> _Range | _NullRange:
    """A context manager around the range ``name`` (``"<name> <detail>"`` with a detail), or the
    shared no-op one when no sink is on."""
    if _push is None and not _autograd_profiler._is_profiler_enabled:
        return _NULL
    return _Range(_full_name(name, detail))


def mark(name: str, detail: object = None) -> None:
    """A zero-length range: an instant on the timeline (a step's arrival)."""
    if _push is None and not _autograd_profiler._is_profiler_enabled:
        return
    with _Range(_full_name(name, detail)):
        pass


class Started:
    """A range opened by :func:`start`, for :func:`end`."""

    __slots__ = ("nvtx", "record", "state", "thread")

    def __init__(self, nvtx: Any, record: _autograd_profiler.record_function | None, state: object | None) -> None:
        self.nvtx = nvtx
        self.record = record
        self.state = state
        self.thread = threading.get_ident()


def start(name: str, detail: object = None, *, cross_thread: bool = False) -> Started | None:
    """Open a range that may overlap others; close it with :func:`end`. ``None`` when no sink is on.

    ``cross_thread``: :func:`end` may run on another thread (a completion callback). NVTX's process
    ranges allow that; torch.profiler records a range's end only under its own state, so the
    starting thread's is kept for :func:`end` (:func:`thread_state`)."""
    if _push is None and not _autograd_profiler._is_profiler_enabled:
        return None
    full = _full_name(name, detail)
    nvtx_id = _start(full) if _start is not None else None
    record = state = None
    if _autograd_profiler._is_profiler_enabled:
        record = _autograd_profiler.record_function(full)
        record.__enter__()
        if cross_thread:
            state = thread_state()
    return Started(nvtx_id, record, state)


def end(started: Started | None) -> None:
    """Close a range opened by :func:`start` (``None``: nothing to close)."""
    if started is None:
        return
    record = started.record
    if record is not None:
        if started.state is not None and started.thread != threading.get_ident():
            call_under(started.state, lambda: record.__exit__(None, None, None))
        else:
            record.__exit__(None, None, None)
        started.record = None
    if started.nvtx is not None and _end is not None:
        _end(started.nvtx)
        started.nvtx = None


def thread_state() -> object | None:
    """This thread's torch.profiler state while a torch profiler records on this thread, for
    :func:`call_under` on another thread; ``None`` otherwise (or with a native extension that
    predates it)."""
    if not _autograd_profiler._is_profiler_enabled or not torch._C._autograd._profiler_enabled():
        return None
    from stragglerkit.errors import CollectiveError
    from stragglerkit.runtime.executor import native

    try:
        state_type = getattr(native(), "ProfilerThreadState", None)
    except CollectiveError:  # not built: the ranges of other threads stay out of torch's trace
        return None
    return state_type() if state_type is not None else None


def call_under(state: object, fn: Callable[[], _T]) -> _T:
    """``fn()`` on this thread, recorded by the torch profiler whose :func:`thread_state` is ``state``."""
    from stragglerkit.runtime.executor import native

    result: _T = native().call_with_profiler_state(state, fn)
    return result


refresh()


class _RuntimeRanges:
    """This module's ranges as the runtime's :class:`~stragglerkit.runtime.hooks.RangeHooks`."""

    __slots__ = ()

    def active(self) -> bool:
        return active()

    def range(self, name: str, detail: object = None) -> _Range | _NullRange:
        return range(name, detail)

    def start(self, name: str, detail: object = None, *, cross_thread: bool = False) -> Started | None:
        return start(name, detail, cross_thread=cross_thread)

    def end(self, started: object | None) -> None:
        end(started if isinstance(started, Started) else None)

    def thread_state(self) -> object | None:
        return thread_state()

    def call_under(self, state: object, fn: Callable[[], _T]) -> _T:
        return call_under(state, fn)


def install() -> None:
    """Give the runtime these ranges (:func:`stragglerkit.runtime.hooks.set_range_hooks`)."""
    hooks.set_range_hooks(_RuntimeRanges())


install()
