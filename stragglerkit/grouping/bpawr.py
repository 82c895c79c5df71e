"""BPAWR, bandwidth- and progress-aware waiting and replacement: launch a group now, or wait ``dt``?

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Section III-D-2 and Algorithm 2; the ring time of Eq. (2).

How it works. Given a ready group ``g`` of at least ``p`` workers, its bottleneck ``b^ = min b_i``:

1. PREDICTWORKERS: every worker still in training (``S``, with its elapsed time ``t_i``) that is
   faster than ``b^`` gets ``p_i``, the probability that it finishes within ``dt`` (the progress
   model). These candidates ``C`` are removed from ``S`` so that later groups do not count on them too.
2. ``k = floor(sum p_i)`` workers are expected; they get the ``p_i``-weighted mean bandwidth of ``C``.
3. BAG over ``g`` plus ``k`` stand-ins gives ``g*``, its first group: ``g`` improved by waiting.
   ``g_delta = g \\ g*`` are the slow workers that the expected ones would replace.
4. The time saved, ``t_X = 2v / min_g b - 2v / min_g* b`` (Eq. (2) without its latency term, line
   15), is weighed against the wait: wait only if ``t_X > theta x dt``.

Nomenclature: ``training`` is ``S`` (worker -> seconds into its iteration), ``group`` is ``g``,
``bandwidth`` is ``{b_i}`` in bytes/s, ``model_bytes`` is ``v``; times are seconds.

*Where the paper is vague.* Algorithm 2 returns ``False`` both for "fewer than p, wait" (line 3) and
for "not worth waiting" (line 19), and the text calls its Boolean "waiting (True) or not (False)",
while Algorithm 3 launches the group when it is ``True`` (line 17). We follow the text and lines
16-17: :class:`BpawrDecision` says ``wait``, and the controller launches a group only when it has
at least ``p`` workers and BPAWR does not wait. With ``k = 0`` the comparison still runs, as
written: a group that received slow workers from the group before it (Algorithm 3, line 15) may be
split by BAG, and then waits one slot like any other. Stand-ins sort after real workers of equal
bandwidth (a worker already ready is preferred to one only expected).

Example::

    d = bpawr({5: 0.9}, [0, 1], p=2, eta=0.0, dt=0.1, model_bytes=10.0,
              bandwidth={0: 10.0, 1: 1.0, 5: 10.0}, theta=1.0, progress=ProgressModel.warm([1.0]))
    d.wait, d.excluded      # True, (1,): worker 5 is due, and replacing worker 1 saves 18 s > 0.1 s
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stragglerkit.errors import ConfigError
from stragglerkit.grouping.bag import bag
from stragglerkit.grouping.progress import ProgressModel

__all__ = ["BpawrDecision", "Expected", "bpawr", "ring_time"]


@dataclass(frozen=True, slots=True)
class Expected:
    """A stand-in for a worker expected to become ready within ``dt`` (``index``: 0..k-1)."""

    index: int


@dataclass(frozen=True, slots=True)
class BpawrDecision:
    """BPAWR's verdict on one group."""

    wait: bool
    """Hold the group for ``dt`` (too small, or worth waiting for faster workers); else launch it."""
    excluded: tuple[int, ...]
    """``g_delta``: the group's slow workers that the expected ones would replace (empty unless waiting)."""
    remaining: dict[int, float]
    """``S`` without the candidates this group examined: what the next group may still count on."""
    expected: int = 0
    """``k``: the whole number of workers expected within ``dt``."""
    expected_bandwidth: float = math.nan
    """``b``: the probability-weighted mean bandwidth of the candidates (NaN: none)."""
    saved: float = 0.0
    """``t_X``: the seconds of synchronisation that waiting and replacing would save."""


def ring_time(group: Sequence[int], bandwidth: Mapping[int, float], model_bytes: float, alpha: float = 0.0) -> float:
    """Eq. (2): ``2(m-1) alpha + 2 (m-1)/m x v / min b`` seconds for a ring AllReduce of ``m`` workers.

    Example::

        ring_time([0, 1], {0: 10.0, 1: 5.0}, model_bytes=10.0)    # 2 x 1/2 x 10 / 5 = 2.0
    """
    m = len(group)
    if m < 2:
        return 0.0
    slowest = min(bandwidth[worker] for worker in group)
    return 2 * (m - 1) * alpha + 2 * (m - 1) / m * model_bytes / slowest


def bpawr(
    training: Mapping[int, float],
    group: Sequence[int],
    p: int,
    eta: float,
    dt: float,
    model_bytes: float,
    bandwidth: Mapping[int, float],
    theta: float,
    progress: ProgressModel,
) -> BpawrDecision:
    """Algorithm 2 for one group ``g``; ``training`` is ``S`` (worker -> seconds into its iteration)."""
    remaining = dict(training)
    if len(group) < p:
        return BpawrDecision(wait=True, excluded=(), remaining=remaining)
    missing = [worker for worker in (*group, *training) if worker not in bandwidth]
    if missing:
        raise ConfigError(f"no bandwidth for workers {missing!r}; give one (bytes/s) for every worker")
    slowest = min(bandwidth[worker] for worker in group)
    # PREDICTWORKERS: faster workers in training, with their chance to be ready within dt.
    candidates = [
        (worker, bandwidth[worker], progress.finish_within(elapsed, dt))
        for worker, elapsed in training.items()
        if bandwidth[worker] > slowest
    ]
    for worker, _, _ in candidates:
        del remaining[worker]
    total = sum(chance for _, _, chance in candidates)
    k = math.floor(total + 1e-12)  # CALCEXPECTEDNEWWORKERNUM, floored; the nudge keeps 3 x (1/3) at 1
    expected_bw = sum(chance * b for _, b, chance in candidates) / total if total > 0 else math.nan
    pool: list[int | Expected] = [*group, *(Expected(i) for i in range(k))]
    rates: dict[int | Expected, float] = {worker: bandwidth[worker] for worker in group}
    rates.update({Expected(i): expected_bw for i in range(k)})
    best = bag(pool, p, eta, rates)[0]
    kept = set(best)
    excluded = tuple(worker for worker in group if worker not in kept)
    saved = 2 * model_bytes / slowest - 2 * model_bytes / min(rates[worker] for worker in best)
    wait = saved > theta * dt
    return BpawrDecision(
        wait=wait,
        excluded=excluded if wait else (),
        remaining=remaining,
        expected=k,
        expected_bandwidth=expected_bw,
        saved=saved,
    )
