"""stragglerkit: fast data-parallel AllReduce when some ranks are slow."""

from __future__ import annotations

from stragglerkit.errors import NotApplicableError, ScheduleError, StragglerKitError
from stragglerkit.integrations.ddp import DDPState, ddp_hook
from stragglerkit.runtime.api import all_reduce, all_reduce_async

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
