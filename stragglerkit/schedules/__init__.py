"""Schedules as data: the IR, the symbolic checker and one generator per algorithm."""

from __future__ import annotations

from stragglerkit.schedules.balanced_ring import balanced_ring
from stragglerkit.schedules.check import CheckReport, check
from stragglerkit.schedules.direct import direct
from stragglerkit.schedules.group_ring import group_ring
from stragglerkit.schedules.ir import Op, OpKind, Schedule, ScheduleBuilder
from stragglerkit.schedules.rhd import rhd
from stragglerkit.schedules.ring import ring
from stragglerkit.schedules.stragglar import stragglar

__all__ = [
    "CheckReport",
    "Op",
    "OpKind",
    "Schedule",
    "ScheduleBuilder",
    "balanced_ring",
    "check",
    "direct",
    "group_ring",
    "rhd",
    "ring",
    "stragglar",
]
