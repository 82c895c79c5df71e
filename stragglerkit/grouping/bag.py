"""BAG, bandwidth-aware grouping: split the ready workers into groups of similar bandwidth.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Section III-C and Algorithm 1.

How it works. A ring AllReduce of model size ``v`` over a group takes about ``2v / b_min`` (Eq. (2)):
the group's slowest member sets the pace. BAG sorts the ready workers by bandwidth, fastest first,
and walks down the list. It fills a group with ``p`` workers; the ``p``-th (the slowest so far,
bandwidth ``b``) sets the threshold ``b* = b (1 - eta)``. Each further worker with bandwidth
``>= b*`` joins the same group (a larger group, at most ``eta / (1 - eta)`` slower than ``2v/b``);
the first one below ``b*`` closes the group and opens the next. The last group is returned even
when it has fewer than ``p`` workers (it cannot synchronise yet; the controller keeps it waiting).

Nomenclature: ``ready`` is the paper's ``Q``, ``bandwidth`` its ``{b_i}`` (bytes/s), the result its
``G``. Workers are any hashable keys (ranks; BPAWR adds stand-ins for expected workers).

*Where the paper is vague.* Line 6 of Algorithm 1 reads ``if len(g) <= p``, which would admit
``p + 1`` workers before the threshold applies; the text says BAG "tries to select p workers to
generate a group g and records the relaxed bandwidth threshold b*", and the no-waste split it
compares with makes groups of exactly ``p``. We follow the text: ``len(g) < p``. Ties in bandwidth
keep the order of ``ready`` (arrival order in the controller), so the result is deterministic.

Example::

    bag([0, 1, 2, 3], p=2, eta=0.3, bandwidth={0: 10.0, 1: 9.0, 2: 7.0, 3: 5.0})
    # [[0, 1, 2], [3]]: threshold 9 x 0.7 = 6.3 admits worker 2 (7), not worker 3 (5)
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from stragglerkit.errors import ConfigError

__all__ = ["bag"]

K = TypeVar("K", bound=Hashable)


def bag(ready: Sequence[K], p: int, eta: float, bandwidth: Mapping[K, float]) -> list[list[K]]:
    """Algorithm 1: the ready workers in groups, fastest group first, each in bandwidth order.

    ``p`` >= 1 and ``0 <= eta < 1`` (:class:`~stragglerkit.grouping.SelectiveConfig` checks them;
    checked here again because BAG is also a public building block). Every worker in ``ready`` needs
    a bandwidth; a missing one raises :class:`~stragglerkit.ConfigError` naming it.
    """
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ConfigError(f"BAG's p must be a whole number >= 1, got {p!r}")
    if not 0 <= eta < 1:
        raise ConfigError(f"BAG's eta must be in [0, 1), got {eta!r}")
    missing = [worker for worker in ready if worker not in bandwidth]
    if missing:
        raise ConfigError(f"no bandwidth for workers {missing!r}; give one (bytes/s) for every ready worker")
    ordered = sorted(ready, key=bandwidth.__getitem__, reverse=True)  # stable: ties keep arrival order
    groups: list[list[K]] = []
    group: list[K] = []
    threshold = 0.0
    for worker in ordered:
        b = bandwidth[worker]
        if len(group) < p:
            group.append(worker)
            threshold = b * (1.0 - eta)
        elif b >= threshold:
            group.append(worker)
        else:
            groups.append(group)
            group = [worker]
            threshold = b * (1.0 - eta)
    if group:
        groups.append(group)
    return groups
