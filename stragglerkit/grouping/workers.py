"""What the partial-synchronisation controllers share: events in, decisions out, the workers' states.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Sections II-C and III-E: a logical central controller learns when each worker finished its local
training (it is then *ready*), launches weighted AllReduces over groups of ready workers, and the
workers of a finished synchronisation go back to training.

The controllers are pure and deterministic: no threads, no sockets, no clock of their own. Whoever
drives them (the simulator, or the training loop's coordinator) passes each event with its time:

* :class:`WorkerReady` ``(worker, time)``: the worker finished an iteration and waits to synchronise;
* :class:`SyncDone` ``(sync, time)``: the weighted AllReduce of :class:`Sync` ``sync`` finished;
* :class:`Tick` ``(time)``: no event came; call it at ``controller.next_deadline`` at the latest.

and gets back the :class:`Sync` decisions to launch now. Times are seconds on one clock and must not
go backwards.

Weights. Partial reduce averages the models of a group "with dynamic weights concerning the relative
iteration counts of the involved workers" (Section II-C); the paper gives no formula. We use
``weight_i = iterations_i / sum_j iterations_j`` over the group, where ``iterations_i`` counts the
training iterations worker ``i`` has finished: the weights sum to 1 (a weighted average of models)
and a worker that fell behind (a staler model) counts less.

A worker that never reports. Each worker in training has ``worker_timeout`` seconds to report; once
any event or tick passes that point the controller raises :class:`~stragglerkit.PeerError` naming
the worker, its time in training and the timeout, rather than holding a full round for it forever.
``next_deadline`` includes that instant, so a driver that ticks on time learns of it promptly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from stragglerkit.errors import ConfigError, PeerError

__all__ = ["Event", "Sync", "SyncDone", "Tick", "WorkerReady", "WorkerState", "iteration_weights"]


@dataclass(frozen=True, slots=True)
class WorkerReady:
    """Worker ``worker`` finished a training iteration at ``time`` and is ready to synchronise."""

    worker: int
    time: float


@dataclass(frozen=True, slots=True)
class SyncDone:
    """The synchronisation with id ``sync`` finished at ``time``; its workers go back to training."""

    sync: int
    time: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed to ``time`` without another event (the paper's ``GetReadyWorkerID`` timing out)."""

    time: float


Event = WorkerReady | SyncDone | Tick


@dataclass(frozen=True, slots=True)
class Sync:
    """A decision: these workers run a weighted AllReduce of their models now."""

    id: int
    """Unique per controller, increasing; report its end with :class:`SyncDone`."""
    workers: tuple[int, ...]
    """The group, in rank order."""
    weights: tuple[float, ...]
    """One weight per worker (same order), summing to 1: each model's share of the average."""
    full: bool
    """True for a round of all workers (selective reduce's every ``c``-th round)."""
    time: float
    """When the decision was made."""


class WorkerState(StrEnum):
    """Where a worker is in its cycle: training -> ready -> syncing -> training."""

    TRAINING = "training"
    READY = "ready"
    SYNCING = "syncing"


def iteration_weights(iterations: Sequence[float]) -> tuple[float, ...]:
    """Each worker's share ``iterations_i / sum(iterations)``; equal shares if all are 0.

    Example::

        iteration_weights([3, 1])    # (0.75, 0.25)
    """
    total = sum(iterations)
    if total <= 0:
        return tuple(1.0 / len(iterations) for _ in iterations)
    return tuple(count / total for count in iterations)


def check_bandwidth(bandwidth: Mapping[int, float], world_size: int, *, complete: bool) -> dict[int, float]:
    """A copy of ``bandwidth`` (bytes/s per worker) with every value checked; ``complete``: all workers."""
    out: dict[int, float] = {}
    for worker, rate in bandwidth.items():
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < world_size:
            raise ConfigError(f"bandwidth given for worker {worker!r}, not one of 0..{world_size - 1}")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
            raise ConfigError(f"bandwidth of worker {worker} must be positive bytes/s, got {rate!r}")
        out[worker] = float(rate)
    if complete:
        missing = [worker for worker in range(world_size) if worker not in out]
        if missing:
            raise ConfigError(f"no bandwidth for workers {missing}; give bytes/s for each of 0..{world_size - 1}")
    return out


class WorkerTable:
    """Each worker's state, since when, its finished iterations; the ready queue; the running syncs."""

    __slots__ = ("_next_id", "iterations", "now", "queue", "running", "since", "state", "timeout", "world_size")

    def __init__(self, world_size: int, start: float, timeout: float | None) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"the number of workers must be a whole number >= 1, got {world_size!r}")
        if not math.isfinite(start):
            raise ConfigError(f"the start time must be finite seconds, got {start!r}")
        self.world_size = world_size
        self.timeout = timeout
        self.now = float(start)
        self.state = [WorkerState.TRAINING] * world_size
        self.since = [float(start)] * world_size
        self.iterations = [0] * world_size
        self.queue: list[int] = []
        """Ready workers in the order they became ready (the paper's ``Q``)."""
        self.running: dict[int, Sync] = {}
        self._next_id = 0

    def advance(self, time: float) -> float:
        """Check ``time`` (finite, not before the latest event) and return it; the clock moves in
        :meth:`move`, once the event proved valid, so a rejected event changes nothing."""
        if isinstance(time, bool) or not isinstance(time, int | float) or not math.isfinite(time):
            raise ConfigError(f"an event's time must be finite seconds, got {time!r}")
        if time < self.now:
            raise ConfigError(f"events must come in time order: got time {time} after {self.now}")
        return float(time)

    def move(self, time: float) -> None:
        """Set the clock to ``time`` (checked by :meth:`advance`)."""
        self.now = time

    def ready(self, worker: int, time: float) -> float:
        """Mark ``worker`` ready at ``time``; returns the iteration time it just finished."""
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < self.world_size:
            raise ConfigError(f"worker {worker!r} is not one of 0..{self.world_size - 1}")
        if self.state[worker] is not WorkerState.TRAINING:
            raise ConfigError(
                f"worker {worker} reported ready while {self.state[worker].value}; "
                "a worker reports ready once per iteration, after its synchronisation finished"
            )
        self.move(time)
        elapsed = self.now - self.since[worker]
        self.state[worker] = WorkerState.READY
        self.since[worker] = self.now
        self.iterations[worker] += 1
        self.queue.append(worker)
        return elapsed

    def launch(self, workers: Sequence[int], full: bool) -> Sync:
        """Take ``workers`` (all ready) off the queue into a new :class:`Sync`."""
        group = tuple(sorted(workers))
        chosen = set(group)
        self.queue = [worker for worker in self.queue if worker not in chosen]
        for worker in group:
            self.state[worker] = WorkerState.SYNCING
            self.since[worker] = self.now
        sync = Sync(
            id=self._next_id,
            workers=group,
            weights=iteration_weights([self.iterations[worker] for worker in group]),
            full=full,
            time=self.now,
        )
        self._next_id += 1
        self.running[sync.id] = sync
        return sync

    def done(self, sync_id: int, time: float) -> Sync:
        """The synchronisation finished at ``time``: its workers start training."""
        sync = self.running.pop(sync_id, None)
        if sync is None:
            raise ConfigError(f"sync {sync_id!r} is not running (never launched, or already reported done)")
        self.move(time)
        for worker in sync.workers:
            self.state[worker] = WorkerState.TRAINING
            self.since[worker] = self.now
        return sync

    def training(self) -> dict[int, float]:
        """The paper's ``S``: each worker in training, with the seconds since its iteration began."""
        return {
            worker: self.now - self.since[worker]
            for worker in range(self.world_size)
            if self.state[worker] is WorkerState.TRAINING
        }

    def timeout_at(self) -> float:
        """When the longest-running worker in training exceeds the timeout (inf: none, or no timeout)."""
        if self.timeout is None:
            return math.inf
        starts = [self.since[w] for w in range(self.world_size) if self.state[w] is WorkerState.TRAINING]
        return min(starts) + self.timeout if starts else math.inf

    def apply(self, event: Event) -> float | None:
        """Apply one event (nothing changes if it is invalid); a finished iteration's time for a
        :class:`WorkerReady`, else ``None``."""
        if not isinstance(event, WorkerReady | SyncDone | Tick):
            raise TypeError(f"not a controller event: {event!r}; give WorkerReady, SyncDone or Tick")
        time = self.advance(event.time)
        if isinstance(event, WorkerReady):
            return self.ready(event.worker, time)
        if isinstance(event, SyncDone):
            self.done(event.sync, time)
        else:
            self.move(time)
        return None

    def check_timeouts(self) -> None:
        """Raise :class:`~stragglerkit.PeerError` for the first worker past the timeout, if any."""
        if self.timeout is None or self.now - min(self.since) < self.timeout:
            return  # even the earliest start of any worker is within the timeout
        late = [
            worker
            for worker in range(self.world_size)
            if self.state[worker] is WorkerState.TRAINING and self.now - self.since[worker] >= self.timeout
        ]
        if late:
            worker = min(late, key=lambda w: (self.since[w], w))
            raise PeerError(
                f"worker {worker} has not reported ready for {self.now - self.since[worker]:.3f} s "
                f"(worker_timeout {self.timeout} s; {len(late)} worker(s) late: {late}); check that it is alive, "
                "or raise selective.worker_timeout if its iterations can take that long",
                peer=worker,
            )
