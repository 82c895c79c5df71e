"""Balanced ring: a ring AllReduce whose chunks are sized so that a slow NIC carries less.

Why. In a ring every link carries ``(n-1)/n`` of the buffer per phase, so one NIC at ``1/l`` of
the bandwidth makes the whole AllReduce ``l`` times slower. OptCC (optcc.py) takes the slow rank
out of the ring and pays a pipeline head and tail instead: at ``l`` just above 1 (a NIC that lost
an eighth of its rate) that costs more than the NIC does unless the pipeline is deep (p = 8,
l = 8/7: 11 % over the fault-free ring at 9 segments, 6 % at 36). A ring keeps its few large
messages and loses only what the slow links must carry, if the chunks are not equal.

Which link carries what (ring.py's order, rank ``i`` owns chunk ``i`` after the reduce-scatter):
in the reduce-scatter rank ``i`` sends every chunk but chunk ``i`` and receives every chunk but
chunk ``i-1``; in the all-gather it sends every chunk but chunk ``i+1`` and receives every chunk
but chunk ``i``. With chunk shares ``c_j`` (summing to 1) and NIC slowdowns ``l_i`` each phase
therefore takes at least ``T = max_i l_i (1 - min(c_{i-1}, c_i, c_{i+1}))`` (in units of the
buffer's time at full rate), and ``T`` is smallest when every chunk ``j`` is just large enough
for the slowest of ranks ``j-1, j, j+1``: ``c_j = max(0, 1 - T / m_j)`` with
``m_j = max(l_{j-1}, l_j, l_{j+1})``, ``T`` solving ``sum_j c_j = 1`` (:func:`balanced_shares`,
by bisection). Healthy: ``c_j = 1/n``, the ring. One slow rank ``s`` among ``n``: the chunks
``s-1, s, s+1`` get ``x`` and the others ``y = (3 - 2l) / (3 + (n-3)l)``, ``x = (1 - (n-3)y) / 3``,
so each phase takes ``1 - y`` instead of ``(n-1)/n``: at p = 8, l = 8/7, ``x = 0.197, y = 0.082``
and the AllReduce is 4.9 % over the fault-free ring (the plain ring: 14.3 %). ``y`` shrinks to 0
at ``l = 3/2``; from about ``l = 1.3`` on OptCC is faster in the simulator, and the runtime picks
between the two by the cost model.

Slices. Without pipelining the largest chunk crosses ``n-1`` links one after another, which
costs more than the balance gains, so the buffer is cut into ``k`` slices and the ring runs on
each, interleaved step by step (chunk ``(slice, j)`` is ``slice·n + j``, shares as above). The
chain of a large chunk's slice then overlaps with the other slices' traffic; ``k =
ceil(max c / min c)`` (at most :data:`MAX_SLICES`) reaches the bound ``2T`` in the simulator
(p = 8: l = 8/7 at 3 slices; ``tests/test_balanced_ring.py``). The ops carry no rounds: the
executor runs them as dataflow, each message as soon as its chunk is there, and so does the
simulator. In lockstep rounds each round would last as long as its largest chunk's message
(simulated at p = 8, l = 8/7: 67 % over the fault-free ring instead of 4.9 %).

Example::

    sched = balanced_ring(8, {3: 8 / 7})          # 3 slices of 8 chunks; chunks 2, 3, 4 larger
    shares = balanced_shares([1, 1, 1, 8 / 7, 1, 1, 1, 1])
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules.ir import Schedule, ScheduleBuilder

__all__ = [
    "MAX_SLICES",
    "WEIGHT_RESOLUTION",
    "balanced_ring",
    "balanced_shares",
    "default_slices",
    "per_rank_slowdowns",
    "phase_time",
]

MAX_SLICES = 8
"""The most slices :func:`default_slices` picks (each slice costs ``2(n-1)`` messages per rank)."""

WEIGHT_RESOLUTION = 10_000
"""Chunk weights are integers: a share ``c`` becomes ``round(c · WEIGHT_RESOLUTION)`` (at least 1)."""


def _neighbourhood_slowdowns(slowdowns: Sequence[float]) -> list[float]:
    """``m_j = max(l_{j-1}, l_j, l_{j+1})`` (cyclic)."""
    n = len(slowdowns)
    return [max(slowdowns[(j - 1) % n], slowdowns[j], slowdowns[(j + 1) % n]) for j in range(n)]


def phase_time(shares: Sequence[float], slowdowns: Sequence[float]) -> float:
    """The bound on one phase with chunk ``shares``: the busiest link's load times its slowdown
    (units of the whole buffer at full rate)."""
    n = len(shares)
    return max(slowdowns[i] * (1.0 - min(shares[(i - 1) % n], shares[i], shares[(i + 1) % n])) for i in range(n))


def balanced_shares(slowdowns: Sequence[float]) -> list[float]:
    """Chunk shares (summing to 1) that minimise :func:`phase_time` for per-rank ``slowdowns``.

    Example::

        balanced_shares([1, 1, 1, 1])            # [0.25, 0.25, 0.25, 0.25]
    """
    n = len(slowdowns)
    if n < 2:
        raise ValueError(f"a ring needs at least 2 ranks, got {n}")
    for rank, slowdown in enumerate(slowdowns):
        if not (slowdown >= 1.0 and math.isfinite(slowdown)):
            raise ValueError(f"slowdown of rank {rank} is {slowdown!r}; use a finite l >= 1 (1 = healthy)")
    m = _neighbourhood_slowdowns(slowdowns)
    m_array = np.array(m)

    def total(t: float) -> float:  # as array operations: 100 steps at p = 1,024 in 1 ms, not 80
        return float(np.maximum(0.0, 1.0 - t / m_array).sum())

    low, high = 0.0, max(m)  # total(0) = n >= 1, total(max m) = 0 <= 1
    for _ in range(100):
        mid = (low + high) / 2
        if total(mid) > 1.0:
            low = mid
        else:
            high = mid
    shares = [max(0.0, 1.0 - high / mj) for mj in m]
    scale = sum(shares)
    return [s / scale for s in shares]


def default_slices(shares: Sequence[float]) -> int:
    """``ceil(max / min)`` of the shares, between 1 and :data:`MAX_SLICES` (module docstring)."""
    smallest = min(shares)
    if smallest <= 0:
        return MAX_SLICES
    return max(1, min(MAX_SLICES, math.ceil(max(shares) / smallest - 1e-9)))


def per_rank_slowdowns(world_size: int, slowdowns: Mapping[int, float] | None) -> list[float]:
    """``slowdowns`` (rank -> ``l``) as a list over the ranks, 1 for the unnamed ones."""
    per_rank = [1.0] * world_size
    for rank, slowdown in (slowdowns or {}).items():
        if not 0 <= rank < world_size:
            raise NotApplicableError(f"slowdowns name rank {rank}, which is not a rank of 0..{world_size - 1}")
        per_rank[rank] = float(slowdown)
    return per_rank


def balanced_ring(
    world_size: int,
    slowdowns: Mapping[int, float] | None = None,
    slices: int | None = None,
    ranks: Collection[int] | None = None,
) -> Schedule:
    """A ring over ``world_size >= 2`` ranks with chunks sized by :func:`balanced_shares`.

    ``slowdowns``: rank -> ``l`` (1 = healthy; unnamed ranks are healthy). ``slices``: default
    :func:`default_slices`. With no slowdown it is the ring in one slice. ``ranks``: build only
    these ranks' ops (the others' lists stay empty: one rank's plan at scale,
    planner/rank_lowering.py); each rank gets a send and then a receive per phase, step and
    slice, in that order.

    Example::

        sched = balanced_ring(8, {3: 8 / 7})
        assert sched.params["slices"] == 3 and sched.num_chunks == 24
    """
    n = world_size
    if n < 2:
        raise NotApplicableError(
            f"balanced_ring needs at least 2 ranks, got world_size={n}; with one rank the AllReduce is a no-op"
        )
    per_rank = per_rank_slowdowns(n, slowdowns)
    shares = balanced_shares(per_rank)
    k = default_slices(shares) if slices is None else slices
    if k < 1:
        raise ValueError(f"slices must be at least 1, got {k}")
    weights = [max(1, round(c * WEIGHT_RESOLUTION)) for c in shares]
    builder = ScheduleBuilder(n, n * k)
    members = range(n) if ranks is None else sorted(ranks)
    for phase in ("reduce_scatter", "allgather"):  # no rounds: dataflow (module docstring)
        for step in range(n - 1):
            for piece in range(k):
                base = piece * n
                for i in members:
                    if phase == "reduce_scatter":
                        send, receive = base + (i - 1 - step) % n, base + (i - 2 - step) % n
                        builder.send(i, (i + 1) % n, (send, send + 1), phase=phase)
                        builder.recv_reduce(i, (i - 1) % n, (receive, receive + 1), phase=phase)
                    else:
                        send, receive = base + (i - step) % n, base + (i - 1 - step) % n
                        builder.send(i, (i + 1) % n, (send, send + 1), phase=phase)
                        builder.recv(i, (i - 1) % n, (receive, receive + 1), phase=phase)
    return builder.build(
        "balanced_ring",
        chunk_sizes=weights * k,
        params={
            "slowdowns": {str(rank): slow for rank, slow in sorted((slowdowns or {}).items())},
            "slices": k,
            "shares": [round(c, 6) for c in shares],
            "phase_time": round(phase_time(shares, per_rank), 6),
        },
    )
