"""stragglerkit: fast data-parallel AllReduce when some ranks are slow."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stragglerkit.errors import NotApplicableError, ScheduleError, StragglerKitError
from stragglerkit.runtime.api import all_reduce, all_reduce_async

if TYPE_CHECKING:
    from stragglerkit.integrations.ddp import DDPState, ddp_hook

__all__ = [
    "DDPState",
    "NotApplicableError",
    "ScheduleError",
    "StragglerKitError",
    "__version__",
    "all_reduce",
    "all_reduce_async",
    "ddp_hook",
]
__version__ = "0.1.0"

_LAZY = {"DDPState": "stragglerkit.integrations.ddp", "ddp_hook": "stragglerkit.integrations.ddp"}


if not TYPE_CHECKING:  # (hidden from type checkers, which see the imports above)

    def __getattr__(name: str) -> Any:
        """The DDP hook loads on first use (it pulls in the cost model, scipy and the simulator)."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'stragglerkit' has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
