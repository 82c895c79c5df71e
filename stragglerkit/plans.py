"""What the closed loop decides and what it decides from: :class:`Plan` (an algorithm per bucket and
who is late or slow), :class:`Decision` (a plan and the events that explain it), :class:`WindowStats`
(what one stats exchange brought), and the vocabulary of its events and measures."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stragglerkit.schedules.registry import NIC_ALGORITHMS

__all__ = [
    "ALGORITHM_CODES",
    "ALLREDUCE_PART",
    "EVENT_KINDS",
    "STEP_PERIOD",
    "Decision",
    "Plan",
    "WindowStats",
    "log_path_for",
]

ALGORITHM_CODES = ("allreduce", "ring", "rhd", "direct", "stragglar", "optcc", "balanced_ring")
"""Algorithms as numbers for the stats exchange (``allreduce``: the process group's own)."""
STEP_PERIOD = "step period"
"""Verification measure: the last finish of one step's AllReduce to the last finish of the next,
taken over two steps (half the time from step s-2's last finish to step s's): a training loop
whose steps alternate between two kinds (``bench --mode train --steps-per-block 1`` alternates the
order of its plain and hooked copies; gradient accumulation can do the same) gives one period per
pair, where the median of single periods would pick one of the two kinds by the parity of the
window. The median also passes over the rare long periods that span a pause in training (in
``bench --mode train``'s default blocks of 10, the other copy's block: 2 periods in 10)."""
ALLREDUCE_PART = "allreduce part"
"""Verification measure: the last rank's arrival to the last rank's finish (the predicted figure)."""
EVENT_KINDS = (
    "detected_straggler",
    "detected_degraded",
    "switch",
    "rollback",
    "cleared",
    "probing",
    "verified",
    "exchange",
    "would_switch",
    "observing",
)
"""The kinds of the decision events (their index is their code in the stats exchange: add new
kinds at the end). ``would_switch`` and ``observing`` come from a loop that observes only
(``Config.detection.act``): the switch it would have made, and, once at its start, why it observes."""


@dataclass(slots=True, frozen=True)
class Plan:
    """What runs: an algorithm per bucket index, and who is late (straggler) or slow (slowdowns)."""

    default: str
    """Algorithm for buckets not listed in ``buckets``."""
    buckets: tuple[str, ...] = ()
    straggler: int | None = None
    slowdowns: tuple[tuple[int, float], ...] = ()

    def algorithm_for(self, bucket: int) -> str:
        return self.buckets[bucket] if 0 <= bucket < len(self.buckets) else self.default

    @property
    def runs_nic_plan(self) -> bool:
        """Does any bucket run a plan for degraded NICs (OptCC or the balanced ring)? Their runs do
        not measure the links as a ring of equal chunks does: the links need probes."""
        return self.default in NIC_ALGORITHMS or any(a in NIC_ALGORITHMS for a in self.buckets)

    @property
    def algorithm(self) -> str:
        """The plan's headline: its straggler-aware algorithm if any bucket runs one, else the default."""
        special = [a for a in self.buckets if a == "stragglar" or a in NIC_ALGORITHMS]
        return special[0] if special else self.default

    def rank_map(self, world_size: int) -> list[int] | None:
        """Logical -> group rank: the straggler (StragglAR) or the degraded ranks (OptCC, the
        balanced ring: next to each other, where they share the ring's larger chunks) last."""
        if self.algorithm == "stragglar" and self.straggler is not None:
            late = [self.straggler]
        elif self.algorithm in NIC_ALGORITHMS and self.slowdowns:
            late = sorted(rank for rank, _ in self.slowdowns)
        else:
            return None
        return [r for r in range(world_size) if r not in late] + late

    def describe(self) -> dict[str, Any]:
        return {
            "default": self.default,
            "buckets": list(self.buckets),
            "straggler": self.straggler,
            "slowdowns": {str(r): round(slowdown, 4) for r, slowdown in self.slowdowns},
        }


@dataclass(slots=True)
class Decision:
    """A plan and the events that explain it, effective from ``step``."""

    seq: int
    step: int
    plan: Plan
    events: list[dict[str, Any]]
    probe_every: int | None = None
    """The probe interval from ``step`` on (``None``: unchanged)."""
    exchange_every: int | None = None
    """The exchange interval after the exchange that ships this decision (``None``: unchanged)."""


@dataclass(slots=True)
class WindowStats:
    """What one exchange brought, as rank 0 sees it."""

    steps: list[int]
    totals: np.ndarray
    """[step, rank]: the step's AllReduce time (s): earliest bucket start to latest finish."""
    bucket_spans: np.ndarray
    """[step, rank, bucket]: span of each bucket (s, NaN: none)."""
    bucket_bytes: list[int]
    """Bytes of each bucket index (rank 0's)."""
    algorithms: list[list[str]]
    """[step][bucket]: the algorithm rank 0 ran."""
    link_rates: np.ndarray
    """[src, dst]: achieved bytes/s (NaN: no sample)."""
    speeds: np.ndarray
    """Per rank: NIC speed from sysfs (bytes/s, NaN unknown)."""
    hosts: list[int] = field(default_factory=list)
    """Per rank: host id (ranks with the same id share a server and its NICs)."""
    lateness: np.ndarray | None = None
    """[step, rank]: wall-clock arrival after the step's first arrival (s, clock offsets applied)."""
    tails: np.ndarray | None = None
    """[step]: from the last rank's arrival to the last rank's finish (s, wall clocks with offsets;
    NaN where a rank's figures are missing): the step's AllReduce part."""
    ends: np.ndarray | None = None
    """[step]: the last rank's finish of the step's AllReduce (s on rank 0's wall clock, offsets
    applied; NaN where a rank's figure is missing). Consecutive ends give the step period, what a
    switch is verified with."""
    arrival_wall: np.ndarray | None = None
    """[step, rank]: when the step's first bucket was handed over (s, each rank's own wall clock)."""
    finish_wall: np.ndarray | None = None
    """[step, rank]: when the step's last bucket finished (s, each rank's own wall clock)."""
    idle: np.ndarray | None = None
    """[step, rank]: seconds of ``totals`` in which none of the rank's buckets was in an AllReduce
    (it was computing its next bucket's gradients; NaN: unknown)."""


def log_path_for(path: str | os.PathLike[str] | None, rank: int) -> str | None:
    """Where ``rank`` writes its JSONL log: ``path`` on rank 0 (or each rank if it contains ``{rank}``)."""
    if path is None:
        return None
    text = os.fspath(path)
    if "{rank}" in text:
        return text.format(rank=rank)
    return text if rank == 0 else None
