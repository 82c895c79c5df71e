"""Measuring the emulated links: short TCP transfers, each compared with what its shaper lets through.

:func:`measure_link` sends from one host to the probe endpoint or back, so that the transfer
crosses exactly one shaper (:func:`link_pair`); :func:`measure_ring` has every host send to the
next at once and :func:`measure_fan_out` one host to several. :func:`measure_pairs` repeats the
transfers (up to :data:`MAX_MEASURE_ATTEMPTS` times) until every rate is within the cluster's
tolerance of the TCP payload rate its shapers allow, since another process can slow a transfer
down; :func:`shaping_error` says what a report that is not within it means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from stragglerkit.testbed.probing import Pair, ProbeRunner
from stragglerkit.testbed.shaping import LinkRate, ShapingError, ShapingReport

if TYPE_CHECKING:
    from stragglerkit.testbed.netns import EmulatedCluster

__all__ = [
    "MAX_MEASURE_ATTEMPTS",
    "link_pair",
    "measure_fan_out",
    "measure_link",
    "measure_pairs",
    "measure_ring",
    "shaping_error",
    "within",
]

MAX_MEASURE_ATTEMPTS = 4  # a busy machine can slow a transfer down; shaping errors persist


def link_pair(cluster: EmulatedCluster, host: int, direction: str) -> Pair:
    """The transfer that crosses exactly one shaper: host to probe endpoint, or back."""
    if direction == "send":
        return Pair(cluster.bridge_namespace, cluster.namespace(host), cluster._probe_address)
    if direction == "recv":
        return Pair(cluster.namespace(host), cluster.bridge_namespace, cluster.address(host))
    raise ValueError(f"direction must be 'send' or 'recv', got {direction!r}")


def measure_pairs(
    cluster: EmulatedCluster, pairs: list[Pair], expected: list[float]
) -> list[tuple[float, tuple[float, ...]]]:
    """Runs the transfers (together) up to four times, until every rate is within tolerance.

    Another process can slow a transfer down (CPU contention), hence the retries. Returns per
    pair the figure reported (the first attempt within tolerance, else the median) and all
    attempts.
    """
    skip = 256 * 1024  # past the bucket's initial burst and TCP slow start
    nbytes = skip + min(8 << 20, max(1 << 20, int(max(expected) * cluster.config.measure_seconds)))
    timeout = max(5.0, 20 * nbytes / min(expected))
    runner = ProbeRunner(cluster._processes)
    attempts: list[list[float]] = [[] for _ in pairs]
    for _ in range(MAX_MEASURE_ATTEMPTS):
        for rates, rate in zip(attempts, runner.transfer_rates(pairs, nbytes, skip, timeout)):
            rates.append(rate)
        if all(within(cluster, rates[-1], e) for rates, e in zip(attempts, expected)):
            break
    reported = []
    for rates, e in zip(attempts, expected):
        good = [r for r in rates if within(cluster, r, e)]
        reported.append((good[0] if good else sorted(rates)[len(rates) // 2], tuple(rates)))
    return reported


def within(cluster: EmulatedCluster, measured: float, expected: float) -> bool:
    """Is ``measured`` within the cluster's tolerance of ``expected``?"""
    return abs(measured / expected - 1) <= cluster.config.tolerance


def measure_link(cluster: EmulatedCluster, host: int, direction: str) -> LinkRate:
    """:meth:`EmulatedCluster.measure_link` (its docstring says what is measured)."""
    cluster._check_host(host)
    pair = link_pair(cluster, host, direction)
    cluster._require_active()
    expected = cluster.expected_payload_rate(host)
    [(measured, attempts)] = measure_pairs(cluster, [pair], [expected])
    return LinkRate(host, direction, cluster.link_rate(host), expected, measured, attempts)


def measure_ring(cluster: EmulatedCluster) -> tuple[LinkRate, ...]:
    """:meth:`EmulatedCluster.measure_ring` (its docstring says what is measured)."""
    cluster._require_active()
    n = cluster.hosts
    pairs = [Pair(cluster.namespace((h + 1) % n), cluster.namespace(h), cluster.address((h + 1) % n)) for h in range(n)]
    configured = [min(cluster.link_rate(h), cluster.link_rate((h + 1) % n)) for h in range(n)]
    expected = [min(cluster.expected_payload_rate(h), cluster.expected_payload_rate((h + 1) % n)) for h in range(n)]
    results = measure_pairs(cluster, pairs, expected)
    return tuple(
        LinkRate(h, "ring", configured[h], expected[h], measured, attempts)
        for h, (measured, attempts) in enumerate(results)
    )


def measure_fan_out(cluster: EmulatedCluster, host: int, peers: Sequence[int]) -> tuple[LinkRate, ...]:
    """:meth:`EmulatedCluster.measure_fan_out` (its docstring says what is measured)."""
    cluster._check_host(host)
    for peer in peers:
        cluster._check_host(peer)
    if not peers or host in peers or len(set(peers)) != len(peers):
        raise ValueError(f"peers must be distinct hosts other than {host}, got {list(peers)}")
    cluster._require_active()
    pairs = [Pair(cluster.namespace(p), cluster.namespace(host), cluster.address(p)) for p in peers]
    share = cluster.link_rate(host) / len(peers)
    configured = [min(share, cluster.link_rate(p)) for p in peers]
    expected = [min(cluster.expected_payload_rate(host) / len(peers), cluster.expected_payload_rate(p)) for p in peers]
    results = measure_pairs(cluster, pairs, expected)
    return tuple(
        LinkRate(host, f"to {p}", rate, e, measured, attempts)
        for p, rate, e, (measured, attempts) in zip(peers, configured, expected, results)
    )


def shaping_error(report: ShapingReport) -> ShapingError:
    """The :class:`ShapingError` of a report that is not ok: what the links measured and the likely cause."""
    slow = any(link.relative_error < -report.tolerance for link in report.links)
    cause = (
        "a link measured slower than shaped, so something else (usually the CPU) limits the rate; "
        "lower Config.bandwidth or free CPU cores"
        if slow
        else "a link measured faster than shaped, so the shaping is not in effect"
    )
    return ShapingError(
        f"the emulated links are not shaped as configured (tolerance {report.tolerance:.0%}): {cause}; "
        f"a benchmark on them would not measure what it claims.\n{report.describe()}",
        report,
    )
