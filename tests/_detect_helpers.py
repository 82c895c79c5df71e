"""Synthetic statistics for the detection tests: AllReduce spans, ring link rates, one exchange's
:class:`~stragglerkit.plans.WindowStats` as rank 0 sees it, and a controller with a fixed model."""

from __future__ import annotations

import random
from collections import deque

import numpy as np

from stragglerkit.detect.controller import Controller
from stragglerkit.plans import WindowStats
from stragglerkit.sim.cost_model import CostModel

__all__ = ["T", "fix_the_model", "quiet_window", "ring_rates", "spans_for", "window"]

T = 0.010  # time of the AllReduce from the last arrival (s)


def spans_for(arrivals: list[float]) -> list[float]:
    """Every rank finishes at max(arrival) + T; its span is finish - its arrival."""
    finish = max(arrivals) + T
    return [finish - a for a in arrivals]


def ring_rates(n: int, healthy: float, slow: dict[int, float]) -> np.ndarray:
    """A ring's observed links: i -> i+1 at the slower end's rate."""
    rates = np.full((n, n), np.nan)
    for i in range(n):
        j = (i + 1) % n
        rates[i, j] = healthy / max(slow.get(i, 1.0), slow.get(j, 1.0))
    return rates


def fix_the_model(controller: Controller) -> None:
    """20 us and 1 GB/s, kept: the model takes no samples, so no fitting noise."""
    controller.model.config = CostModel.Config(alpha=20e-6, beta=1 / 1e9)
    controller.model.samples = deque(maxlen=0)


def window(
    n: int,
    steps: range,
    late: int | None,
    delay: float,
    sizes: list[int],
    slow: dict[int, float] | None = None,
    late_from: int = 0,
) -> WindowStats:
    """Rank 0's view of one exchange: rank ``late`` arrives ``delay`` late in the steps from ``late_from``."""
    rng = random.Random(steps.start)
    totals, buckets = [], []
    for step in steps:
        arrivals = [rng.uniform(0, 0.0005) for _ in range(n)]
        if late is not None and step >= late_from:
            arrivals[late] += delay
        per_bucket = np.array([spans_for(arrivals) if b == 0 else [T] * n for b in range(len(sizes))]).T
        buckets.append(np.pad(per_bucket, ((0, 0), (0, 32 - len(sizes))), constant_values=np.nan))
        totals.append(per_bucket.sum(axis=1))
    rates = ring_rates(n, 1e9, slow or {})
    return WindowStats(
        steps=list(steps),
        totals=np.array(totals),
        bucket_spans=np.array(buckets),
        bucket_bytes=sizes,
        algorithms=[["ring"] * len(sizes) for _ in steps],
        link_rates=rates,
        speeds=np.full(n, np.nan),
    )


def quiet_window(
    n: int,
    steps: range,
    tail: float,
    probe_every: int,
    slow: dict[int, float] | None = None,
    late: int | None = None,
    late_from: int = 0,
) -> WindowStats:
    """An exchange of a run on the group's own all_reduce: its steps' AllReduce takes ``tail``; a
    step that is a multiple of ``probe_every`` is a ring probe with link figures. Fault-free unless
    rank ``late`` arrives 50 ms late from ``late_from`` on."""
    stats = window(n, steps, late, 0.05, [8 << 20], slow, late_from)
    probe = [s for s in steps if s > 0 and s % probe_every == 0]  # none in step 0 (warm-up)
    stats.algorithms = [["ring" if s in probe else "allreduce"] for s in steps]
    stats.tails = np.array([tail] * len(steps))
    if not probe:
        stats.link_rates = np.full((n, n), np.nan)
    return stats
