"""stragglerkit: fast data-parallel AllReduce when some ranks are slow."""

from __future__ import annotations

from stragglerkit.errors import NotApplicableError, ScheduleError, StragglerKitError

__all__ = ["NotApplicableError", "ScheduleError", "StragglerKitError", "__version__"]
__version__ = "0.1.0"
