"""Partial synchronisation on real ranks: a coordinator that drives a controller, and each rank's side.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Section II-C: "a logical central controller" learns when each worker is ready and launches weighted
AllReduces over groups of ready workers; the workers of a finished group go back to training.

How it runs. The control messages travel through the rendezvous store that ``torch.distributed``
already has (a :class:`~torch.distributed.PrefixStore` of its own per run); the data moves in
:func:`~stragglerkit.selective.weighted_group_all_reduce` over the process group's existing
point-to-point connections.

* A rank that finished an iteration appends ``ready RANK ITERATIONS LAST`` to the event queue
  (``store.add`` gives it a sequence number, ``event/<n>`` holds it) and waits; ``LAST`` is the
  sync it last took part in. The first member of a finished group appends ``done SYNC``. Another
  member's next ``ready`` can come first (the reports race): the coordinator then ends ``LAST``
  itself before the ready report, and drops the late ``done``.
* :class:`SyncCoordinator` (a thread on one rank) reads the queue in order, stamps each event with
  its own clock, steps the controller (:class:`~stragglerkit.selective.SelectiveReduceController`,
  :class:`~stragglerkit.selective.PartialReduceController`, or the latter with ``p = n`` for
  all-reduce), ticks it at ``next_deadline`` when nothing comes, and publishes every decision
  pass as ``decision/<k>`` (the groups launched together, their weights). When the run's time is
  up it publishes ``stop``; an error (a worker that never reports) is published too, so that every
  rank raises it.
* :class:`RankSync` (every rank) follows the decisions in order on a thread of its own and makes
  one ``weighted_group_all_reduce`` call per decision, as every rank of the group must: ranks in
  none of its groups return at once, the members average their models. A member's
  :meth:`RankSync.ready` returns when its group has finished.

Because every rank takes the decisions in the same order and a decision only names ranks that wait
for it, each group's members all reach its AllReduce: decisions never deadlock, and groups that
share no rank run at the same time.

What the times mean: an event's time is when the coordinator read it (the queue is polled every
``poll_s``, 1 ms by default); a sync's time is the longest of its members' AllReduce calls (from the
member's entry to its return, so it includes waiting for the group's last member to arrive).

Example (every rank)::

    sync = RankSync(store, rank, world_size, flat_params)
    if rank == 0:
        coordinator = SyncCoordinator(store, PartialReduceController(world_size, 2), duration=60.0).start()
    while True:
        train_one_iteration(); flat_params.copy_(flatten(model))
        if sync.ready(iterations) is None:
            break                                   # the run is over
        unflatten(flat_params, model)
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

from stragglerkit.errors import ConfigError, PeerError, StragglerKitError
from stragglerkit.grouping.workers import Event, Sync, SyncDone, Tick, WorkerReady
from stragglerkit.selective.group_reduce import weighted_group_all_reduce

__all__ = ["Controller", "RankSync", "SyncCoordinator", "SyncRecord", "run_store"]

_STOP = "stop"
_ERROR = "error"


class Controller(Protocol):
    """What the coordinator drives: either controller of this package."""

    @property
    def next_deadline(self) -> float: ...

    def step(self, event: Event) -> list[Sync]: ...


def run_store(name: str, store: dist.Store | None = None) -> dist.Store:
    """The store of run ``name`` (a prefix of the default group's rendezvous store, or of ``store``)."""
    base = store if store is not None else dist.distributed_c10d._get_default_store()
    return dist.PrefixStore(f"stragglerkit/selective/{name}", base)


@dataclass(slots=True)
class SyncRecord:
    """One launched synchronisation, as the coordinator saw it."""

    id: int
    members: tuple[int, ...]
    weights: tuple[float, ...]
    full: bool
    decided_s: float
    """Seconds from the coordinator's start."""
    done_s: float | None = None
    """When its first member reported it done (None: not within the run)."""


@dataclass(slots=True)
class _Decision:
    index: int
    kind: str  # "sync", "stop" or "error"
    syncs: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    peer: int | None = None


class SyncCoordinator:
    """Drives ``controller`` from the ranks' reports in ``store`` until ``duration`` seconds have
    passed (see the module docstring); :attr:`records` lists every launched synchronisation.

    ``clock``: seconds (the controller's events are stamped with ``clock() - start``)."""

    def __init__(
        self,
        store: dist.Store,
        controller: Controller,
        duration: float,
        *,
        poll_s: float = 0.001,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not duration > 0:
            raise ValueError(f"duration must be > 0 seconds, got {duration!r}")
        self.store = _own_connection(store)
        self.controller = controller
        self.duration = float(duration)
        self.poll_s = poll_s
        self.clock = clock
        self.records: list[SyncRecord] = []
        self.holds = 0
        """Decision passes in which BPAWR held a group back to wait for a faster worker (selective only)."""
        self.error: BaseException | None = None
        self._by_id: dict[int, SyncRecord] = {}
        self._start = 0.0
        self._thread = threading.Thread(target=self._serve, name="stragglerkit-selective", daemon=True)

    def start(self) -> SyncCoordinator:
        self._start = self.clock()
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _now(self) -> float:
        return self.clock() - self._start

    def _serve(self) -> None:
        decisions = 0
        events = 0
        try:
            while True:
                now = self._now()
                if now >= self.duration:
                    break
                if self.store.check([f"event/{events}"]):
                    text = self.store.get(f"event/{events}").decode()
                    events += 1
                    launched = []
                    for event in self._events(text, self._now()):
                        launched += self.controller.step(event)
                else:
                    if now >= self.controller.next_deadline:
                        launched = self.controller.step(Tick(now))
                    else:
                        time.sleep(self.poll_s)
                        continue
                verdicts = getattr(self.controller, "last_verdicts", ())
                if any(verdict.wait for _, verdict in verdicts):
                    self.holds += 1
                if launched:
                    for sync in launched:
                        record = SyncRecord(sync.id, sync.workers, sync.weights, sync.full, self._now())
                        self._by_id[sync.id] = record
                        self.records.append(record)
                    self._publish(_Decision(decisions, "sync", [_sync_json(s) for s in launched]))
                    decisions += 1
            self._publish(_Decision(decisions, _STOP))
        except Exception as err:  # the controller's PeerError, or the store failing
            self.error = err
            peer = err.peer if isinstance(err, PeerError) else None
            self._publish(_Decision(decisions, _ERROR, message=str(err), peer=peer), quiet=True)

    def _events(self, text: str, now: float) -> list[Event]:
        """The controller's events for one report. ``ready RANK ITERATIONS LAST``: a member of sync
        ``LAST`` may report ready before that sync's first member reported it done (the reports
        race), so its ready report first ends ``LAST`` if nothing else has; ``done SYNC`` is then
        left out."""
        kind, *fields = text.split()
        if kind == "ready":
            rank, last = int(fields[0]), int(fields[2])
            return [*self._done(last, now), WorkerReady(rank, now)]
        if kind == "done":
            return self._done(int(fields[0]), now)
        raise StragglerKitError(f"selective coordinator: unknown event {text!r} in the store (internal error)")

    def _done(self, sync_id: int, now: float) -> list[Event]:
        record = self._by_id.get(sync_id)
        if record is None or record.done_s is not None:  # none yet (-1), or already ended
            return []
        record.done_s = now
        return [SyncDone(sync_id, now)]

    def _publish(self, decision: _Decision, quiet: bool = False) -> None:
        body = {"kind": decision.kind, "syncs": decision.syncs, "message": decision.message, "peer": decision.peer}
        try:
            self.store.set(f"decision/{decision.index}", json.dumps(body))
        except Exception:
            if not quiet:
                raise


def _sync_json(sync: Sync) -> dict[str, Any]:
    return {"id": sync.id, "members": list(sync.workers), "weights": list(sync.weights), "full": sync.full}


@dataclass(slots=True)
class _Done:
    sync_id: int | None
    """None: the run is over."""
    seconds: float = 0.0
    error: BaseException | None = None


class RankSync:
    """This rank's side (module docstring): reports readiness, follows the decisions on a thread,
    and averages ``buffer`` with its group whenever a decision names it. Needs
    :func:`stragglerkit.init` with ``sync.partial`` allowed (:class:`~stragglerkit.config.SyncConfig`):
    otherwise a :class:`~stragglerkit.ConfigError` says how.

    ``buffer``: the flat model this rank synchronises (the caller copies its parameters in before
    :meth:`ready` and out after). ``timeout``: seconds to wait for the next decision or for this
    rank's group before raising a :class:`~stragglerkit.PeerError`."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        buffer: torch.Tensor,
        *,
        process_group: dist.ProcessGroup | None = None,
        timeout: float = 300.0,
    ) -> None:
        from stragglerkit import session as _session

        if not _session.session_for(process_group).config.sync.partial:
            raise ConfigError(
                "partial synchronisation averages groups' models instead of summing every rank's gradients, which "
                "changes what training computes (docs/selective.md); allow it explicitly with "
                "stragglerkit.init(config=Config().replace(sync={'partial': True})) or sync.partial: true in the "
                "configuration file"
            )
        self.store = store
        self._follow_store = _own_connection(store)  # its waits must not hold the reports back
        self.rank = rank
        self.world_size = world_size
        self.buffer = buffer
        self.process_group = process_group
        self.timeout = float(timeout)
        self.sync_s: list[tuple[int, float]] = []
        """(sync id, seconds) of every AllReduce call this rank made as a member."""
        self.stopped = threading.Event()
        """Set once the coordinator said the run is over (or failed)."""
        self.error: BaseException | None = None
        self._mine: queue.Queue[_Done] = queue.Queue()
        self._last_sync = -1
        """The latest sync this rank took part in (-1: none yet); set before :meth:`ready` returns."""
        self._thread = threading.Thread(target=self._follow, name=f"stragglerkit-selective-{rank}", daemon=True)
        self._thread.start()

    def ready(self, iterations: int) -> _Done | None:
        """Report that this rank finished iteration ``iterations`` and wait until its group has
        averaged ``buffer`` (the record of that sync), or ``None`` once the run is over."""
        if self.stopped.is_set():
            self._raise_if_failed()
            return None
        _append_event(self.store, f"ready {self.rank} {iterations} {self._last_sync}")
        try:
            done = self._mine.get(timeout=self.timeout)
        except queue.Empty:
            raise PeerError(
                f"rank {self.rank} waited {self.timeout:g} s for its group's synchronisation: the coordinator or a "
                "member stalled",
                None,
            ) from None
        if done.error is not None:
            raise done.error
        return None if done.sync_id is None else done

    def close(self, timeout: float | None = None) -> None:
        """Wait for the decision thread to end (after the coordinator's ``stop``)."""
        self._thread.join(timeout)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _follow(self) -> None:
        index = 0
        try:
            while True:
                key = f"decision/{index}"
                self._follow_store.wait([key], _timedelta(self.timeout))
                body = json.loads(self._follow_store.get(key).decode())
                index += 1
                if body["kind"] == _ERROR:
                    raise PeerError(f"the selective-reduce coordinator failed: {body['message']}", body["peer"])
                if body["kind"] == _STOP:
                    break
                self._run(body["syncs"])
        except BaseException as err:  # every error reaches the training thread
            self.error = err if isinstance(err, StragglerKitError) else PeerError(f"{type(err).__name__}: {err}", None)
            self.stopped.set()
            self._mine.put(_Done(None, error=self.error))
            return
        self.stopped.set()
        self._mine.put(_Done(None))

    def _run(self, syncs: Sequence[dict[str, Any]]) -> None:
        groups = [s["members"] for s in syncs]
        weights = [s["weights"] for s in syncs]
        mine = next((s for s in syncs if self.rank in s["members"]), None)
        start = time.perf_counter()
        weighted_group_all_reduce(self.buffer, groups, weights, self.process_group)
        if mine is None:
            return
        seconds = time.perf_counter() - start
        self.sync_s.append((mine["id"], seconds))
        if mine["members"][0] == self.rank:
            _append_event(self._follow_store, f"done {mine['id']}")
        self._last_sync = mine["id"]
        self._mine.put(_Done(mine["id"], seconds))


def _own_connection(store: dist.Store) -> dist.Store:
    """A client of ``store`` with a connection of its own: a TCP store's client serves one request
    at a time, so a thread blocked in ``wait`` on a shared one would hold every other thread's
    request back (here: the decision thread's wait, the training thread's ``ready`` report)."""
    clone = getattr(store, "clone", None)
    try:
        own: dist.Store = clone() if clone is not None else store
    except (RuntimeError, NotImplementedError):  # a store that cannot clone itself
        return store
    return own


def _append_event(store: dist.Store, text: str) -> None:
    number = store.add("events", 1) - 1
    store.set(f"event/{number}", text)


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)
