"""stragglerkit.runtime: plans for real buckets, the C++ executor binding, the runtime and its policy."""

from __future__ import annotations

from stragglerkit.planner.choice import choose_algorithm
from stragglerkit.planner.lowering import RankPlan, lower
from stragglerkit.planner.remap import RankMap
from stragglerkit.runtime.calls import AllReduceHandle, FallbackWarning, RunRecord
from stragglerkit.runtime.executor import OpTiming, OpTimings
from stragglerkit.runtime.runtime import Runtime

__all__ = [
    "AllReduceHandle",
    "FallbackWarning",
    "OpTiming",
    "OpTimings",
    "RankMap",
    "RankPlan",
    "RunRecord",
    "Runtime",
    "choose_algorithm",
    "lower",
]
