"""The state of the :class:`~stragglerkit.detect.controller.Controller`, declared once.

The controller's parts (:class:`~stragglerkit.detect.probe_schedule.ProbeSchedule`,
:class:`~stragglerkit.detect.verification.SwitchVerifier` and the controller itself) share one set
of attributes; :class:`ControllerState` declares them, with their types, as the slots that all
three build on.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from stragglerkit.detect.controller_config import ControllerConfig
from stragglerkit.detect.detector import Detector
from stragglerkit.detect.model import OnlineModel
from stragglerkit.detect.plans import Plan
from stragglerkit.report.records import RecordLog

__all__ = ["ControllerState"]


class ControllerState:
    """The controller's attributes (set in ``Controller.__init__`` and the parts' ``_init_*``)."""

    __slots__ = (
        "_blocked",
        "_bucket_window",
        "_checking",
        "_ends",
        "_exchange_event",
        "_exchange_target",
        "_last_doubt",
        "_last_finish",
        "_last_sizes",
        "_lateness",
        "_periods",
        "_plain_tails",
        "_plan_checking",
        "_plan_start",
        "_planned_for",
        "_probe_event",
        "_probe_maxima",
        "_probe_target",
        "_quiet_since",
        "_readings",
        "_seq",
        "_step_times",
        "_tail_medians",
        "_tail_reference",
        "_verify",
        "config",
        "detector",
        "events",
        "exchange_every",
        "model",
        "plan",
        "probe_every",
        "rank",
        "records",
        "world_size",
    )

    # every rank
    world_size: int
    rank: int
    config: ControllerConfig
    plan: Plan
    events: list[dict[str, Any]]
    model: OnlineModel
    detector: Detector
    probe_every: int
    exchange_every: int
    records: RecordLog
    _seq: int
    _plan_start: int
    # rank 0: what the exchanges brought
    _bucket_window: deque[np.ndarray]
    _lateness: deque[np.ndarray]
    _step_times: deque[tuple[int, float]]
    _periods: deque[tuple[int, float]]
    _ends: deque[tuple[int, float]]
    _readings: deque[tuple[tuple[int, ...], np.ndarray]]
    _last_finish: tuple[int, np.ndarray] | None
    _last_sizes: list[int]
    _planned_for: tuple[int | None, tuple[int, ...]]
    # rank 0: switch verification
    _blocked: dict[tuple[object, ...], int]
    _verify: dict[str, Any] | None
    # rank 0: probe and exchange intervals
    _probe_target: int
    _probe_event: dict[str, Any] | None
    _probe_maxima: deque[float]
    _plain_tails: deque[tuple[int, float]]
    _tail_reference: float
    _tail_medians: deque[tuple[int, float]]
    _quiet_since: int
    _checking: bool
    _plan_checking: bool
    _exchange_target: int
    _exchange_event: dict[str, Any] | None
    _last_doubt: int
