"""NVTX ranges that cost nothing unless someone is looking.

Ranges are emitted only when an NVTX backend *and* a profiler are present: the ``nvtx`` package
(``pip install nvtx``) or, for CUDA builds of torch, ``torch.cuda.nvtx``; and a profiler that set
its injection variables (nsys sets ``NSYS_PROFILING_SESSION_ID``; any NVTX tool sets
``NVTX_INJECTION64_PATH``). Otherwise :func:`enabled` is ``False``, :func:`range` returns a shared
do-nothing context manager and the executor is given no range callback at all, so the hot path
has no extra work. Set ``STRAGGLERKIT_NVTX=1`` to force ranges on (e.g. for another tool) or ``=0``
to force them off.

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

from stragglerkit.units import switch_from_env

__all__ = ["PROFILER_ENV_VARS", "backend", "enabled", "forced_setting", "pop", "push", "range", "refresh"]

PROFILER_ENV_VARS = ("NSYS_PROFILING_SESSION_ID", "NVTX_INJECTION64_PATH")
DOMAIN = "stragglerkit"

_push: Callable[[str], Any] | None = None
_pop: Callable[[], Any] | None = None
_backend = "none"


def forced_setting() -> bool | None:
    """``STRAGGLERKIT_NVTX``: True (on), False (off) or None (unset: ranges when a profiler is
    attached); ValueError names a bad value."""
    return switch_from_env("STRAGGLERKIT_NVTX", None)


def _profiler_present() -> bool:
    try:
        forced = forced_setting()
    except ValueError:  # reported by the runtime's settings check (runtime/settings.py) at the first call
        forced = None
    if forced is not None:
        return forced
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
