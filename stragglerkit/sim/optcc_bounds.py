"""Lower bounds and closed-form times for AllReduce with degraded NICs.

From the OptCC paper (Chen et al., "Don't Let a Few Network Failures Slow the Entire AllReduce"),
§3, §4.3 and App. B-E.

Bandwidth-only model: a healthy NIC moves one element per time unit, a NIC with slowdown ``l``
one element per ``l`` units; ``n`` is the buffer size in elements, so ``n`` is also the time a
healthy NIC needs for the whole buffer. All functions return times in those units (multiply by
``bytes / healthy bandwidth`` for seconds). ``p`` is the number of ranks (GPUs), ``g`` GPUs per
server, ``q = p / g`` servers, ``k`` pipeline segments.

Lower bounds (any correct algorithm):

* :func:`fault_free_time` ``T0 = 2(p-1)/(g p) · n`` (ring, no fault);
* :func:`theorem1_bound` one straggler: ``max{2l(p-1)/(l(p-1)+1), l} · n``;
* :func:`theorem6_bound` its tight form: ``max{2l(p-1)/(l(p-2)+2), l} · n``;
* :func:`theorem2_bound` m stragglers: ``max{2(p-1)/(p-m+Σ 1/l_i), max l_i} · n``;
* :func:`theorem3_bound` g GPUs per server: ``n/g · max{2l(q-1)/(1+l(q-1)), l}``;
* :func:`theorem13_bound` its tight form: ``n/g · max{2l(q-1)/(l(q-2)+2), l}``;
* :func:`all_links_bound` g GPUs per server with NVLink counted (ours, from Lemma 4):
  ``2(p-1) n / (g(q-1) + g/l + p v)``, ``v`` = NVLink per GPU in NIC units (``g-1`` by default).

Closed forms of the OptCC schedules (the paper's analysis, what the simulator is compared with):

* :func:`optcc_single_time` eq. (1)/(2): ``l n (k+1)/k`` (l >= 2), ``2(p-1) l n/((p-2)l+2) · (k+l-1)/k``;
* :func:`optcc_multi_time` App. D.3: ``(k+4)/k · max{2(p-1), l_1(p-m)+2(m-1)}/(p-m) · n``;
* :func:`attached_limit` our several-straggler timetable (``stragglerkit.schedules.optcc``) as
  ``k -> inf``: ``max{2(q-1) + Σ l_i, q l_1}/q · n``, ``q = p - m``;
* :func:`optcc_multigpu_time` App. E.4: ``max{l, 2} n/g · (k+5.5)/k``;
* :func:`ring_degraded_time`: plain ring with the slowest NIC on its path, ``2(p-1)/p · max l · n``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "all_links_bound",
    "attached_limit",
    "fault_free_time",
    "lower_bound",
    "optcc_multi_time",
    "optcc_multigpu_time",
    "optcc_single_time",
    "ring_degraded_time",
    "theorem1_bound",
    "theorem2_bound",
    "theorem3_bound",
    "theorem6_bound",
    "theorem13_bound",
]


def _check(p: int, slowdowns: Sequence[float], g: int = 1) -> None:
    if p < 3:
        raise ValueError(f"the bounds are stated for p >= 3 ranks, got p={p}")
    if g < 1 or p % g:
        raise ValueError(f"g={g} GPUs per server must divide p={p}")
    if p // g < 2:
        raise ValueError(f"need at least 2 servers, got p/g={p // g}")
    for slowdown in slowdowns:
        if not slowdown >= 1.0:
            raise ValueError(f"a slowdown l must be >= 1 (the NIC is l times slower), got {slowdown}")


def fault_free_time(p: int, n: float = 1.0, g: int = 1) -> float:
    """``T0 = 2(p-1) n / (g p)``: the ring's time with no fault (optimal)."""
    _check(p, (), g)
    return 2.0 * (p - 1) * n / (g * p)


def theorem1_bound(p: int, slowdown: float, n: float = 1.0) -> float:
    """Theorem 1: ``max{2l(p-1)/(l(p-1)+1), l} · n``."""
    _check(p, (slowdown,))
    lv = slowdown
    return max(2.0 * lv * (p - 1) / (lv * (p - 1) + 1.0), lv) * n


def theorem6_bound(p: int, slowdown: float, n: float = 1.0) -> float:
    """Theorem 6 (tight single-straggler bound): ``max{2l(p-1)/(l(p-2)+2), l} · n``."""
    _check(p, (slowdown,))
    lv = slowdown
    return max(2.0 * lv * (p - 1) / (lv * (p - 2) + 2.0), lv) * n


def theorem2_bound(p: int, slowdowns: Sequence[float], n: float = 1.0) -> float:
    """Theorem 2 (m stragglers): ``max{2(p-1)/(p-m+Σ 1/l_i), max l_i} · n``."""
    _check(p, slowdowns)
    m = len(slowdowns)
    if not 1 <= m < p:
        raise ValueError(f"need between 1 and p-1 stragglers, got {m} for p={p}")
    balanced = 2.0 * (p - 1) / (p - m + sum(1.0 / lv for lv in slowdowns))
    return max(balanced, max(slowdowns)) * n


def theorem3_bound(p: int, g: int, slowdown: float, n: float = 1.0) -> float:
    """Theorem 3 (g GPUs per server): ``n/g · max{2l(q-1)/(1+l(q-1)), l}``, ``q = p/g``."""
    _check(p, (slowdown,), g)
    q, lv = p // g, slowdown
    return max(2.0 * lv * (q - 1) / (1.0 + lv * (q - 1)), lv) * n / g


def theorem13_bound(p: int, g: int, slowdown: float, n: float = 1.0) -> float:
    """Theorem 13 (tight form of Theorem 3): ``n/g · max{2l(q-1)/(l(q-2)+2), l}``."""
    _check(p, (slowdown,), g)
    q, lv = p // g, slowdown
    return max(2.0 * lv * (q - 1) / (lv * (q - 2) + 2.0), lv) * n / g


def all_links_bound(p: int, g: int, slowdown: float, n: float = 1.0, nvlink: float | None = None) -> float:
    """g GPUs per server, NVLink counted too: ``2(p-1) n / (g(q-1) + g/l + p v)``.

    Lemma 4 (at least ``2(p-1) n`` element transfers over all links) divided by the total send rate
    of all links: the ``g`` NICs of each of the ``q-1`` healthy servers at 1, the ``g`` NICs of the
    degraded server at ``1/l``, and the ``p`` NVLink ports at ``v = nvlink`` (in NIC units; the
    paper's assumption ``v = g-1`` by default). With ``v = g-1`` it is
    ``(2n/g)(p-1)/(p-1+1/l)``, above Theorem 13 for ``l < 2`` and large ``q``: NVLink, not the NICs,
    then sets the limit (the paper's Remark 14 puts the NVLink term at ``2n/g`` but assumes the
    NIC traffic at its minimum). With ``g = 1`` it is Theorem 1's first branch.
    """
    _check(p, (slowdown,), g)
    q = p // g
    v = float(g - 1) if nvlink is None else nvlink
    if not v >= 0:
        raise ValueError(f"nvlink = {v} must be >= 0 (NVLink bandwidth per GPU in healthy-NIC units)")
    return 2.0 * (p - 1) * n / (g * (q - 1) + g / slowdown + p * v)


def attached_limit(p: int, slowdowns: Sequence[float], n: float = 1.0) -> float:
    """Our several-straggler timetable as ``k -> inf``: ``max{2(q-1) + Σ l_i, q l_1}/q · n``, ``q = p-m``.

    Per body (one segment of ``q`` sections of ``n/(kq)``) a healthy rank sends and receives
    ``2(q-1)`` ring sections, one section to/from the slowest straggler (``l_1`` each) and one
    exchange with every other straggler (``l_a``); the slowest straggler moves ``q`` sections each
    way at ``l_1``. No bubble filling (see :mod:`stragglerkit.schedules.optcc`).
    """
    _check(p, slowdowns)
    m = len(slowdowns)
    q = p - m
    if not 1 <= m <= q:
        raise ValueError(f"need between 1 and p/2 stragglers, got {m} for p={p}")
    return max(2.0 * (q - 1) + sum(slowdowns), q * max(slowdowns)) / q * n


def optcc_single_time(p: int, slowdown: float, k: int, n: float = 1.0) -> float:
    """OptCC with one straggler, k segments (OptCC paper, eq. (1) and (2), App. C)."""
    _check(p, (slowdown,))
    lv = slowdown
    if lv >= 2.0:
        return lv * n * (k + 1) / k
    return 2.0 * (p - 1) * lv * n / ((p - 2) * lv + 2.0) * (k + lv - 1.0) / k


def optcc_multi_time(p: int, slowdowns: Sequence[float], k: int, n: float = 1.0) -> float:
    """OptCC with m stragglers (App. D.3): ``(k+4)/k · max{2(p-1), l_1(p-m)+2(m-1)}/(p-m) · n``."""
    _check(p, slowdowns)
    m, worst = len(slowdowns), max(slowdowns)
    body = max(2.0 * (p - 1), worst * (p - m) + 2.0 * (m - 1))
    return body / (p - m) * n * (k + 4) / k


def optcc_multigpu_time(p: int, g: int, slowdown: float, k: int, n: float = 1.0) -> float:
    """OptCC with g GPUs per server (App. E.4, no bubble filling): ``max{l, 2} n/g · (k+5.5)/k``."""
    _check(p, (slowdown,), g)
    return max(slowdown, 2.0) * n / g * (k + 5.5) / k


def ring_degraded_time(p: int, slowdowns: Sequence[float], n: float = 1.0) -> float:
    """Plain ring when its slowest NIC runs ``max l`` times slower: every step waits for it."""
    _check(p, slowdowns)
    return 2.0 * (p - 1) / p * max(slowdowns, default=1.0) * n


def lower_bound(p: int, slowdowns: dict[int, float], healthy_time: float, gpus_per_server: int = 1) -> float:
    """The applicable lower bound in seconds, for a buffer a healthy NIC moves in ``healthy_time`` s.

    One degraded rank: Theorem 1; several: Theorem 2; several GPUs per server: Theorem 3 with the
    slowest server (more degraded servers can only raise the true bound). With no degraded rank
    it is the fault-free ring time.

    Example::

        lower_bound(16, {3: 2.0}, healthy_time=2**30 / 12.5e9)
    """
    degraded = [slow for slow in slowdowns.values() if slow > 1.0]
    if not degraded:
        return fault_free_time(p, healthy_time, gpus_per_server) * gpus_per_server
    if gpus_per_server > 1:
        return theorem3_bound(p, gpus_per_server, max(degraded), healthy_time)
    if len(degraded) == 1:
        return theorem1_bound(p, degraded[0], healthy_time)
    return theorem2_bound(p, degraded, healthy_time)
