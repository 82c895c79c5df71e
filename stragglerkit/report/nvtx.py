"""NVTX ranges that cost nothing unless someone is looking.

Ranges are emitted only when an NVTX backend *and* a profiler are present: the ``nvtx`` package
(``pip install nvtx``) or, for CUDA builds of torch, ``torch.cuda.nvtx``; and a profiler that set
its injection variables (nsys sets ``NSYS_PROFILING_SESSION_ID``; any NVTX tool sets
``NVTX_INJECTION64_PATH``). Otherwise :func:`enabled` is ``False``, :func:`range` returns a shared
do-nothing context manager and the executor is given no range callback at all, so the hot path
has no extra work. ``Config.report.nvtx`` (or ``STRAGGLERKIT_NVTX``) forces ranges on (e.g. for
another tool) or off; :func:`stragglerkit.init` applies it through :func:`configure`.

Example::

    from stragglerkit.report import nvtx
    with nvtx.range("stragglerkit/all_reduce ring"):
        ...
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["PROFILER_ENV_VARS", "backend", "configure", "enabled", "pop", "push", "range", "refresh"]

PROFILER_ENV_VARS = ("NSYS_PROFILING_SESSION_ID", "NVTX_INJECTION64_PATH")
DOMAIN = "stragglerkit"

_push: Callable[[str], Any] | None = None
_pop: Callable[[], Any] | None = None
_backend = "none"


_forced: bool | None = None
"""``Config.report.nvtx``: True (on), False (off) or None (when a profiler is attached)."""


def configure(forced: bool | None) -> bool:
    """Force ranges on (``True``) or off (``False``), or follow the profiler (``None``); return :func:`enabled`."""
    global _forced
    _forced = forced
    return refresh()


def _profiler_present() -> bool:
    if _forced is not None:
        return _forced
    return any(os.environ.get(name) for name in PROFILER_ENV_VARS)


def _find_backend() -> tuple[str, Callable[[str], Any] | None, Callable[[], Any] | None]:
    try:
        module: Any = importlib.import_module("nvtx")
        if hasattr(module, "push_range") and hasattr(module, "pop_range"):

            def push_nvtx(name: str) -> None:
                module.push_range(message=name, domain=DOMAIN)

            def pop_nvtx() -> None:
                module.pop_range(domain=DOMAIN)

            return "nvtx", push_nvtx, pop_nvtx
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return "torch.cuda.nvtx", torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    except (ImportError, RuntimeError):
        pass
    return "none", None, None


def refresh() -> bool:
    """Re-detect the backend and profiler (call after changing the environment); return :func:`enabled`."""
    global _push, _pop, _backend
    _push = _pop = None
    _backend = "none"
    if _profiler_present():
        _backend, _push, _pop = _find_backend()
    return enabled()


def enabled() -> bool:
    """Whether ranges are really emitted."""
    return _push is not None


def backend() -> str:
    """``"nvtx"``, ``"torch.cuda.nvtx"`` or ``"none"``."""
    return _backend


def push(name: str) -> None:
    if _push is not None:
        _push(name)


def pop() -> None:
    if _pop is not None:
        _pop()


_NULL = contextlib.nullcontext()


@contextlib.contextmanager
def _active_range(name: str) -> Iterator[None]:
    push(name)
    try:
        yield
    finally:
        pop()


def range(name: str) -> contextlib.AbstractContextManager[None]:
    """A context manager that brackets an NVTX range, or a no-op one when disabled."""
    return _active_range(name) if _push is not None else _NULL


refresh()
