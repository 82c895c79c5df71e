"""SELECTIVEREDUCE, the controller loop: when to synchronise which ready workers, with what weights.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Section III-E and Algorithm 3 (building on BAG, Algorithm 1, and BPAWR, Algorithm 2).

How it works. Workers report when they finish an iteration; the ready ones wait in a queue ``Q``.
The controller counts rounds of synchronisation in ``k``:

* a round with ``k % c == 0`` is a full weighted AllReduce: it waits until all ``n`` workers are
  ready and launches them together (lines 5-7);
* otherwise, once ``len(Q) >= p`` (line 8), BAG splits ``Q`` into groups of similar bandwidth, and
  BPAWR decides for each group in turn whether to launch it now or wait ``dt`` for faster workers
  that are likely to finish, moving the slow workers it would replace into the next group
  (lines 9-22);
* then it waits for the next ready worker, at most ``dt`` (line 24), and decides again.

Here the loop is a step function (module :mod:`~stragglerkit.grouping.workers` describes events,
decisions, weights and timeouts): a decision is made after each :class:`WorkerReady` and after each
:class:`Tick` at or past the deadline ``dt`` after the previous decision. :class:`SyncDone` only
puts the workers back into training (the paper's loop wakes on ready workers and on timeouts only).

*Where the paper is vague, and what we do.*

* BPAWR's Boolean: we launch a group when it has ``>= p`` workers and BPAWR does not decide to wait
  (Algorithm 2's text and lines 16-17; Algorithm 3's line 17 reads the other way; see bpawr.py).
* ``k`` counts every round, full ones included (the text: "k records how many rounds of
  synchronization have been conducted"); Algorithm 3 increments it after partial rounds only, which
  would make every round after the first full one full again.
* Once a partial launch brings ``k`` to a multiple of ``c``, no further group launches in that pass:
  the next round is the full one (launching on would step ``k`` past the multiple and skip it).
* Bandwidths: the paper re-reads every worker's bandwidth each pass (line 9). Here the caller pushes
  updates with :meth:`SelectiveReduceController.set_bandwidth` whenever it has new estimates
  (bytes/s per worker: the closed loop's NIC-health measurement of each rank's slower direction).

Example::

    config = SelectiveConfig(p=2, eta=0.3, theta=1.0, dt=0.01, model_bytes=500e6)
    ctl = SelectiveReduceController(config, 4, bandwidth={0: 2.5e9, 1: 2.4e9, 2: 0.2e9, 3: 2.3e9})
    ctl.step(WorkerReady(0, 1.00))         # []: one ready worker, p = 2
    ctl.step(WorkerReady(1, 1.02))         # [Sync(id=0, workers=(0, 1), weights=(0.5, 0.5), ...)]
                                           #   unless BPAWR expects a faster worker within dt
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from stragglerkit.grouping.bag import bag
from stragglerkit.grouping.bpawr import BpawrDecision, bpawr
from stragglerkit.grouping.config import SelectiveConfig
from stragglerkit.grouping.progress import ProgressModel
from stragglerkit.grouping.workers import (
    Event,
    Sync,
    Tick,
    WorkerReady,
    WorkerTable,
    check_bandwidth,
)

__all__ = ["SelectiveReduceController"]


class SelectiveReduceController:
    """Algorithm 3 as a deterministic, clock-injected state machine over :data:`Event` s.

    ``bandwidth``: bytes/s for every worker ``0..world_size-1``; ``progress``: the iteration-time
    model (default: cold start, learnt from the iterations this controller sees); ``start``: the time
    at which all workers begin their first iteration.
    """

    __slots__ = ("_bandwidth", "_deadline", "_table", "config", "last_verdicts", "progress", "round")

    def __init__(
        self,
        config: SelectiveConfig,
        world_size: int,
        bandwidth: Mapping[int, float],
        progress: ProgressModel | None = None,
        start: float = 0.0,
    ) -> None:
        config.check_world(world_size)
        self.config = config
        self._table = WorkerTable(world_size, start, config.worker_timeout)
        self._bandwidth = check_bandwidth(bandwidth, world_size, complete=True)
        self.progress = progress if progress is not None else ProgressModel.cold()
        self.round = 0
        """``k``: rounds of synchronisation launched so far."""
        self.last_verdicts: list[tuple[tuple[int, ...], BpawrDecision]] = []
        """Each group of the latest decision pass with BPAWR's verdict on it (for traces and metrics)."""
        self._deadline = self._table.now + config.dt

    @property
    def world_size(self) -> int:
        return self._table.world_size

    @property
    def now(self) -> float:
        """The time of the latest event."""
        return self._table.now

    @property
    def ready(self) -> tuple[int, ...]:
        """The queue ``Q``: ready workers in the order they became ready."""
        return tuple(self._table.queue)

    @property
    def running(self) -> tuple[Sync, ...]:
        """The synchronisations launched and not yet reported done."""
        return tuple(self._table.running.values())

    @property
    def iterations(self) -> tuple[int, ...]:
        """Each worker's finished training iterations."""
        return tuple(self._table.iterations)

    @property
    def next_deadline(self) -> float:
        """Call :meth:`step` with a :class:`Tick` at this time if no other event comes first."""
        return min(self._deadline, self._table.timeout_at())

    def set_bandwidth(self, bandwidth: Mapping[int, float]) -> None:
        """Update the bandwidth (bytes/s) of some or all workers; used from the next decision on."""
        self._bandwidth.update(check_bandwidth(bandwidth, self.world_size, complete=False))

    def step(self, event: Event) -> list[Sync]:
        """Apply one event at its time; returns the synchronisations to launch now (often none).

        Raises :class:`~stragglerkit.ConfigError` for an impossible event (unknown worker, a worker
        ready twice, time going backwards) and :class:`~stragglerkit.PeerError` naming a worker that
        has been training longer than ``worker_timeout``.
        """
        table = self._table
        elapsed = table.apply(event)
        if elapsed is not None:
            self.progress.observe(elapsed)
        decide = isinstance(event, WorkerReady) or (isinstance(event, Tick) and table.now >= self._deadline)
        table.check_timeouts()
        if not decide:
            return []
        self._deadline = table.now + self.config.dt
        return self._decide()

    def _full_round_due(self) -> bool:
        return self.config.c is not None and self.round % self.config.c == 0

    def _decide(self) -> list[Sync]:
        table, config = self._table, self.config
        self.last_verdicts = []
        if self._full_round_due():
            if len(table.queue) == table.world_size:
                self.round += 1
                return [table.launch(table.queue, full=True)]
            return []
        if len(table.queue) < config.p:
            return []
        training = table.training()
        groups = bag(table.queue, config.p, config.eta, self._bandwidth)
        launched: list[Sync] = []
        for i, group in enumerate(groups):
            verdict = bpawr(
                training,
                group,
                config.p,
                config.eta,
                config.dt,
                config.model_bytes,
                self._bandwidth,
                config.theta,
                self.progress,
            )
            training = verdict.remaining
            self.last_verdicts.append((tuple(group), verdict))
            if verdict.excluded and i + 1 < len(groups):
                groups[i + 1].extend(verdict.excluded)
            if not verdict.wait:
                launched.append(table.launch(group, full=False))
                self.round += 1
                if self._full_round_due():
                    break
        return launched

    def __repr__(self) -> str:
        deadline = self.next_deadline
        return (
            f"SelectiveReduceController(world_size={self.world_size}, round={self.round}, now={self.now}, "
            f"ready={list(self.ready)}, running={len(self._table.running)}, "
            f"next_deadline={deadline if math.isfinite(deadline) else None})"
        )
