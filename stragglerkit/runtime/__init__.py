"""stragglerkit.runtime: plans for real buckets, the C++ executor binding, and all_reduce."""

from __future__ import annotations

from stragglerkit.runtime.api import (
    AllReduceHandle,
    FallbackWarning,
    RunRecord,
    Runtime,
    all_reduce,
    all_reduce_async,
    choose_algorithm,
    runtime_for,
)
from stragglerkit.runtime.executor import OpTiming, OpTimings
from stragglerkit.runtime.plan import RankPlan, lower
from stragglerkit.runtime.remap import RankMap

__all__ = [
    "AllReduceHandle",
    "FallbackWarning",
    "OpTiming",
    "OpTimings",
    "RankMap",
    "RankPlan",
    "RunRecord",
    "Runtime",
    "all_reduce",
    "all_reduce_async",
    "choose_algorithm",
    "lower",
    "runtime_for",
]
