"""The planner's one cache of schedules: generated once per algorithm and situation.

The cost model (:class:`~stragglerkit.planner.model.Predictor`) simulates a generated schedule; the
runtime runs it with each rank's rounds in order (:func:`~stragglerkit.planner.ordering.in_round_order`),
proven by :func:`stragglerkit.schedules.check` first. Both come from here, so a schedule is built
once per process whoever asks first, and checked once before its first run. Thread-safe (the
runtime's worker thread and the loop's decision thread both ask). The runtime caches its compiled
plans (one per bucket size, dtype, rank map and op) on top of this.

Example::

    schedule_for("stragglar", Situation(world_size=8, straggler=7))      # generated
    checked_schedule("stragglar", Situation(world_size=8, straggler=7))  # rounds in order, checked
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from stragglerkit.planner.ordering import in_round_order
from stragglerkit.schedules.check import check
from stragglerkit.schedules.ir import Schedule
from stragglerkit.schedules.registry import Situation, generate

__all__ = ["CACHE_SIZE", "checked_schedule", "clear", "schedule_for"]

CACHE_SIZE = 128
"""Schedules kept (least recently used first out): a job uses a handful of situations."""


class _Entry:
    __slots__ = ("checked", "generated")

    def __init__(self, generated: Schedule) -> None:
        self.generated = generated
        self.checked: Schedule | None = None


_cache: OrderedDict[tuple[object, ...], _Entry] = OrderedDict()
_lock = threading.Lock()


def _entry(algorithm: str, situation: Situation) -> _Entry:
    key = (algorithm, situation.key())
    with _lock:
        entry = _cache.get(key)
        if entry is not None:
            _cache.move_to_end(key)
            return entry
    entry = _Entry(generate(algorithm, situation))  # outside the lock: generating may take a second
    with _lock:
        entry = _cache.setdefault(key, entry)
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return entry


def schedule_for(algorithm: str, situation: Situation) -> Schedule:
    """``algorithm``'s schedule for ``situation`` (:func:`stragglerkit.schedules.registry.generate`)."""
    return _entry(algorithm, situation).generated


def checked_schedule(algorithm: str, situation: Situation) -> Schedule:
    """The schedule as the runtime runs it: rounds in order, proven by the checker."""
    entry = _entry(algorithm, situation)
    if entry.checked is None:
        ordered = in_round_order(entry.generated)
        check(ordered)
        entry.checked = ordered
    return entry.checked


def clear() -> None:
    """Forget every cached schedule."""
    with _lock:
        _cache.clear()
