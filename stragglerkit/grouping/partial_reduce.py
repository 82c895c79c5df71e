"""Partial reduce, the baseline: the first ``p`` ready workers synchronise together, at once.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Section II-C (describing partial reduce, Miao et al., SIGMOD 2021): the controller keeps the ready
workers in a queue and, each time the queue holds ``p``, pops them and launches a weighted AllReduce.
It looks at neither bandwidth nor progress; selective reduce is measured against it.

Same events, decisions, weights and worker timeout as the selective controller
(:mod:`~stragglerkit.grouping.workers`); ticks only serve the timeout.

Example::

    ctl = PartialReduceController(world_size=4, p=2)
    ctl.step(WorkerReady(2, 0.5))     # []
    ctl.step(WorkerReady(0, 0.7))     # [Sync(id=0, workers=(0, 2), weights=(0.5, 0.5), full=False, time=0.7)]
"""

from __future__ import annotations

import math

from stragglerkit.errors import ConfigError
from stragglerkit.grouping.workers import Event, Sync, WorkerTable

__all__ = ["PartialReduceController"]


class PartialReduceController:
    """The queue of ``p``: launch the first ``p`` ready workers (in arrival order) whenever there are ``p``."""

    __slots__ = ("_table", "p")

    def __init__(self, world_size: int, p: int, *, worker_timeout: float | None = 300.0, start: float = 0.0) -> None:
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ConfigError(f"partial reduce's p must be a whole number of workers >= 1, got {p!r}")
        if isinstance(world_size, int) and not isinstance(world_size, bool) and p > world_size:
            raise ConfigError(
                f"partial reduce's p = {p} is larger than the number of workers ({world_size}); give p <= {world_size}"
            )
        if worker_timeout is not None and not (
            isinstance(worker_timeout, int | float) and math.isfinite(worker_timeout) and worker_timeout > 0
        ):
            raise ConfigError(f"worker_timeout must be positive seconds or None, got {worker_timeout!r}")
        self.p = p
        self._table = WorkerTable(world_size, start, None if worker_timeout is None else float(worker_timeout))

    @property
    def ready(self) -> tuple[int, ...]:
        """The queue: ready workers in the order they became ready."""
        return tuple(self._table.queue)

    @property
    def next_deadline(self) -> float:
        """When the longest-running worker would time out (inf: never); tick then if nothing else comes."""
        return self._table.timeout_at()

    def step(self, event: Event) -> list[Sync]:
        """Apply one event; returns the synchronisations to launch now."""
        table = self._table
        table.apply(event)
        table.check_timeouts()
        launched: list[Sync] = []
        while len(table.queue) >= self.p:
            launched.append(table.launch(table.queue[: self.p], full=False))
        return launched
