"""The plan for what the detector believes, and the cost model's prediction of a plan's step.

Pure functions over the online model (:class:`~stragglerkit.detect.model.OnlineModel`), the
settings and what the controller measured; the controller calls them (its module docstring says
why a plan is chosen this way).

Example::

    delays = bucket_delays(np.stack(window), straggler=3)
    plan = best_plan(settings, model, 8, 3, {}, delays, [4 << 20, 1 << 20], step=40, blocked=never)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stragglerkit.detect.model import OnlineModel
from stragglerkit.detect.settings import Settings
from stragglerkit.planner.choice import choose
from stragglerkit.plans import Plan
from stragglerkit.schedules.registry import NIC_ALGORITHMS, Situation, why_not

__all__ = ["best_plan", "bucket_delays", "predicted_total"]

Blocked = Callable[[str, "int | None", dict[int, float], int], bool]
"""``blocked(algorithm, straggler, slowdowns, step)``: was such a plan rolled back lately?"""


def bucket_delays(window: np.ndarray, straggler: int) -> np.ndarray:
    """Per bucket: median of (fastest other rank's span - straggler's span), >= 0, over the
    window's steps (``window[step, rank, bucket]``) in which ``straggler`` arrived last (as the
    detector's delay; all steps if none): right after a straggler moved, the steps of the previous
    one say nothing about it."""
    totals = np.where(np.isnan(window), 0.0, window).sum(axis=2)  # [step, rank]
    last = totals.argmin(axis=1) == straggler
    if last.any():
        window = window[last]
    others = np.delete(window, straggler, axis=1)
    fastest_other = np.where(np.isnan(others), np.inf, others).min(axis=1)
    gaps = np.where(np.isinf(fastest_other), np.nan, fastest_other) - window[:, straggler, :]
    gaps = np.where(np.isnan(gaps), 0.0, np.maximum(gaps, 0.0))
    return np.asarray(np.median(gaps, axis=0))


def best_plan(
    settings: Settings,
    model: OnlineModel,
    world_size: int,
    straggler: int | None,
    slow: dict[int, float],
    delays: np.ndarray | None,
    bucket_bytes: list[int],
    step: int,
    blocked: Blocked,
) -> Plan:
    """The plan for a believed ``straggler`` and degraded ranks ``slow`` (``{rank: l}``), bucket by
    bucket; ``delays``: :func:`bucket_delays` of the straggler (``None``: unknown)."""
    baseline, min_gain = settings.baseline, settings.detection.min_gain
    slow = dict(sorted(slow.items()))
    candidates = []
    situation = Situation(world_size=world_size, straggler=straggler, slowdowns=slow)
    if straggler is not None and why_not("stragglar", situation) is None:
        candidates.append("stragglar")
    if slow:
        candidates += [name for name in NIC_ALGORITHMS if why_not(name, situation) is None]
    chosen = []
    # when stragglerkit's queue of runs is free again, in seconds after the punctual ranks
    # handed their buckets over (None: nothing queued yet)
    queue_free: float | None = None
    for b, nbytes in enumerate(bucket_bytes[: settings.max_buckets]):
        arrival = float(delays[b]) if delays is not None and b < delays.size else 0.0
        # The delays were measured while the group's own all_reduce ran the buckets side by
        # side: how much later than the punctual ranks the straggler hands bucket b over.
        # stragglerkit's runs are queued, so after one of them this bucket starts only when
        # the queue is free; the straggler is late for it by what is left of its delay then.
        # A straggler that sleeps before its backward hands every bucket over late by the same
        # delay: the first run's end covers it and the later buckets see none. A slow GPU
        # computes every bucket's gradients late: each later bucket is later still.
        starts = 0.0 if queue_free is None else queue_free
        delay = max(0.0, arrival - starts)
        kwargs: dict[str, Any] = {"straggler": straggler, "delay": delay, "slowdowns": slow}
        # the planner's rule, as all_reduce(algorithm="auto") asks it (planner/choice.py)
        choice = choose(
            situation,
            nbytes,
            model,
            baseline=baseline,
            min_gain=min_gain,
            min_bytes=settings.min_bucket_bytes,
            delay=delay,
            blocked=lambda algorithm: blocked(algorithm, straggler, slow, step),
        )
        best = choice.algorithm
        best_time = math.inf if math.isnan(choice.predicted_s) else choice.predicted_s
        chosen.append(best)
        if best != baseline or queue_free is not None:  # predictions count from the last arrival
            after = best_time if math.isfinite(best_time) else model.predict(best, nbytes, **kwargs)
            queue_free = starts + delay + after
    if not any(a != baseline for a in chosen):
        return Plan(baseline)
    used = set(chosen)
    return Plan(
        baseline,
        tuple(chosen),
        straggler if "stragglar" in used else None,
        tuple(slow.items()) if used & set(NIC_ALGORITHMS) else (),
    )


def predicted_total(
    model: OnlineModel,
    plan: Plan,
    bucket_bytes: list[int],
    straggler: int | None,
    slow: dict[int, float],
    delays: np.ndarray | None,
    ran: Sequence[str] | None = None,
) -> float:
    """The cost model's AllReduce part of a step under ``plan``, summed over the buckets; with
    ``ran``, of a step whose buckets ran those algorithms (the first ``len(ran)`` buckets; a
    bucket that ran another algorithm than ``plan`` names is predicted without the plan's
    straggler and slowdowns). ``straggler``, ``slow``, ``delays``: what the detector believes."""
    total = 0.0
    for b, nbytes in enumerate(bucket_bytes if ran is None else bucket_bytes[: len(ran)]):
        if nbytes <= 0:
            continue
        delay = float(delays[b]) if delays is not None and b < delays.size else 0.0
        algorithm = plan.algorithm_for(b) if ran is None else ran[b]
        planned = algorithm == plan.algorithm_for(b)
        total += model.predict(
            algorithm,
            nbytes,
            straggler=straggler,
            delay=delay,
            slowdowns=slow,
            planned_slowdowns=dict(plan.slowdowns) if planned and plan.slowdowns else None,
            planned_straggler=plan.straggler if planned else None,
        )
    return total
