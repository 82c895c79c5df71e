"""The closed loop, framework-neutral: gradient buckets in, futures out, plans switched on every rank at once.

**The interface the framework adapters use.** A training framework hands the loop each gradient
bucket when it is ready, ``loop.all_reduce_bucket(tensor, index, last)``, and gets a
``torch.futures.Future`` that completes with the same tensor, averaged (``op="avg"``) or summed
over the group, in place. ``index`` names the bucket across steps (the plan is per index);
``last=True`` on the step's final bucket ends the step. Every rank hands over the same buckets in
the same order within a step. ``loop.synchronize()`` waits for every bucket handed over since the
previous call and raises the loop's :class:`~stragglerkit.errors.PeerError` if one failed.

* PyTorch DDP (:mod:`stragglerkit.integrations.ddp`): the comm hook passes ``bucket.buffer()``,
  ``bucket.index()``, ``bucket.is_last()`` and returns the future; at the last bucket it queues
  ``synchronize`` as an autograd callback, so ``loss.backward()`` raises the ``PeerError``.
* Horovod's optimizer wrap: its per-parameter hooks fill fused buffers (one per group of
  parameters, in a fixed order); each full buffer goes to ``all_reduce_bucket`` as it fills, in
  buffer order, the last one with ``last=True`` (Horovod's ``op`` maps to ``"avg"``/``"sum"``,
  its pre/post-divide factors scale around the call); ``optimizer.synchronize()`` hands over
  what is left, calls ``loop.synchronize()`` and copies the buffers back.
* megatron-core: each bucket group's ``start_grad_sync`` hands over each bucket's contiguous
  ``grad_data`` (index = the bucket's position in the model's buckets; ``op`` from
  ``average_in_collective``; the last bucket of the last group ends the step), and keeps the
  futures as its handle; ``finish_grad_sync`` waits on them, the last one with
  ``loop.synchronize()``.

**What happens per step** (a *step* ends at the bucket handed over with ``last=True``):

1. **Warm-up** (``ControllerConfig.warmup_steps``): every bucket goes to the process group's own
   ``all_reduce`` (pre-divided by the world size, like DDP without a hook). Arrivals are recorded
   already, so the detector's window fills during warm-up.
2. **Plans**: then each bucket runs the controller's current plan. While nothing is wrong that is
   the baseline, by default the process group's own ``all_reduce`` (``ControllerConfig.baseline``),
   so the loop costs only its bookkeeping. Every ``probe_every``-th step the largest bucket runs
   stragglerkit's ring instead (a *probe*): its per-op timings give each link's achieved rate (NIC
   health) and a cost-model sample; the interval backs off while the links read healthy and under
   an OptCC plan (``quiet_probe_every``, ``plan_probe_every``; :mod:`~stragglerkit.detect.probe_schedule`).
   Buckets whose plan names one of stragglerkit's algorithms (StragglAR, OptCC, ...) go to the
   executor (``Runtime.start``), which returns at once; the future completes after this
   rank's bookkeeping (span, per-peer rates) is done.
3. **Stats exchange**: every ``K``-th step, right after its first bucket was handed to its
   AllReduce, the loop issues an async gather of the last ``K`` steps' figures to rank 0 and a
   broadcast of rank 0's decision on the session's gloo side group, and waits for them at the next
   step's first bucket (they are complete by then). Rank 0 digests the figures on a background
   thread (cost model fit, detector, plan); its decision rides on the next exchange and every rank
   adopts it at the same step (the runtime's rank map with it). Every ``clock_sync_every`` steps
   the clock offsets to rank 0 are measured again at the start of the step.

Gradients come out identical on every rank. The controller verifies each switch and rolls it
back if it did not pay (:mod:`stragglerkit.detect.controller`).

**Records** (``Config.report``; docs/event_log.md): with an event log, each writing rank starts
its file with a ``run`` header at its first step (a ``run_id`` that every rank of the job agrees
on through the rendezvous store, the adapter's name, each rank's host), the decisions follow as
they are adopted, and rank 0 adds a ``window`` line per exchange, queued by the controller's
thread and written by the loop's once per exchange, after the step's first bucket went to its
AllReduce. With Weights & Biases on (``report.wandb``) rank 0 hands the same records to
:mod:`stragglerkit.telemetry.wandb`.

**Profiling** (docs/profiling.md): with NVTX or torch.profiler looking (telemetry/nvtx.py), each
step's arrival is marked (``stragglerkit/step <s>``), and the baseline's AllReduce, probes, the
stats exchange and ``synchronize``'s wait are ranges, and each adopted decision's events are marked
(``stragglerkit/decision <kind>``); otherwise each costs an attribute check.

**Faults**: a rank that dies or stalls makes the step fail on every other rank within
``executor.timeout`` plus the notes of :mod:`stragglerkit.loop.faults`, with a ``PeerError``
naming it (``.peer``). The bucket's future fails with it, ``synchronize()`` and every later call
raise it, so the loop never hands on a gradient that was not averaged.

**Checkpoints**: the loop pickles (``pickle``, ``torch.save``) without its session: the step, the
controller (plan, intervals, decisions, events, detector window, cost-model fit and a decision
not yet shipped), the exchange schedule and the last step's bucket sizes. Pickling a running loop
first finishes the exchange in flight (every rank issued it; nothing new is collective). A
restored loop is bound to a session with :meth:`StragglerLoop.bind` and resumes the plan from its
next step; the figures of the steps since the last exchange are not kept (times taken in another
process mean nothing here). A rank that restores another rank's state (every rank loading rank
0's checkpoint) keeps the plan, the step and the events, and starts its own records afresh.
A restored loop keeps its run's ``run_id`` and appends to its event log.

Example::

    session = stragglerkit.session.session_for(None)   # after stragglerkit.init()
    loop = StragglerLoop(session)
    future = loop.all_reduce_bucket(flat_grads, index=0, last=True)
    loop.synchronize()                                           # raises PeerError on a fault
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import os
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from stragglerkit.config import Config
from stragglerkit.detect.arrival import ArrivalProfiler, BucketTiming, ClockOffsets, estimate_clock_offsets
from stragglerkit.detect.controller import Controller, Decision, log_path_for
from stragglerkit.detect.controller_config import ControllerConfig, controller_config
from stragglerkit.detect.exchange import PendingExchange, StatsExchange, host_id
from stragglerkit.detect.nic_health import local_link_speed, ring_link_messages
from stragglerkit.errors import ConfigError, NotInitializedError, PeerError, StragglerKitError
from stragglerkit.loop.faults import FaultReport, compare_notes, peer_error, report_store
from stragglerkit.runtime.runtime import AllReduceCall, RunRecord, Runtime
from stragglerkit.schedules.registry import NIC_ALGORITHMS
from stragglerkit.session import Session
from stragglerkit.telemetry import nvtx
from stragglerkit.telemetry.records import FRAMEWORKS, new_run_id, run_record
from stragglerkit.telemetry.wandb import WandbLogger, wandb_logger

__all__ = ["LOOP_OPS", "Baseline", "StragglerLoop"]

LOOP_OPS = ("avg", "sum")

Baseline = Callable[[torch.Tensor, str], "torch.futures.Future[Any]"]
"""A framework's own AllReduce as the loop's baseline: ``baseline(tensor, op)`` (op ``"avg"`` or
``"sum"``) reduces ``tensor`` in place; the future completes when it is done."""
"""What ``all_reduce_bucket`` can do to a bucket."""
_STATE_VERSION = 1
_RUN_ID_KEY = "stragglerkit/run_id"
"""The rendezvous store's key under which the first rank to create a loop leaves the run's id."""
HOSTS_WAIT_S = 30.0
"""How long a rank waits at its first step for every rank's host id for its log's header (they
are all there once every rank reached that step's AllReduce; after this the header says null)."""


class StragglerLoop:
    """The closed loop over one process group's gradient buckets (see the module docstring).

    ``session``: what :func:`stragglerkit.init` set up for the group (not collective: creating a
    loop only reads it). ``config``: overrides the session's detection configuration for this
    loop (a :class:`stragglerkit.Config`, or the controller's full ``ControllerConfig``); the
    timeout is always the session's ``executor.timeout``. ``framework``: the adapter that feeds
    the loop (``ddp``, ``horovod``, ``megatron``), as its records name it; ``loop`` when used directly.

    Example::

        loop = StragglerLoop(session_for(None))
        futures = [loop.all_reduce_bucket(b, i, i == len(buckets) - 1) for i, b in enumerate(buckets)]
        loop.synchronize()
    """

    __slots__ = (  # noqa: RUF023 (grouped: what users tune, then internal state)
        # user-tuned
        "config",
        "framework",
        # internal: the loop's own state (what a checkpoint keeps)
        "_algorithm",
        "_decision_in_flight",
        "_last_exchange",
        "_previous_sizes",
        "_saved_rank",
        "_step",
        "clock_syncs",
        "controller",
        "run_id",
        # internal: the session's, and what is in flight
        "_failure",
        "_fault_report",
        "_header_due",
        "_host",
        "_lock",
        "_observer",
        "_observing",
        "_pending",
        "_probe_bucket",
        "_session",
        "_shipped",
        "_speed",
        "_step_open",
        "_store",
        "_unsynced",
        "_wandb",
        "baseline",
        "clock_offsets",
        "exchange",
        "profiler",
    )

    def __init__(
        self, session: Session, config: Config | ControllerConfig | None = None, *, framework: str = "loop"
    ) -> None:
        if not isinstance(session, Session):
            raise ConfigError(
                f"session must be a stragglerkit Session (from stragglerkit.init), got {type(session).__name__}"
            )
        if isinstance(config, Config):
            cfg = controller_config(config)
        elif isinstance(config, ControllerConfig) or config is None:
            cfg = config if config is not None else controller_config(session.config)
        else:
            raise ConfigError(
                f"config must be a stragglerkit.Config or a ControllerConfig, got {type(config).__name__}"
            )
        if framework not in FRAMEWORKS:
            raise ConfigError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
        self.config = dataclasses.replace(cfg, timeout=session.config.executor.timeout)
        """The controller's configuration (``ControllerConfig``)."""
        self.framework = framework
        """What feeds the loop, as its records say: ``ddp``, ``horovod``, ``megatron`` or ``loop``."""
        report = (config if isinstance(config, Config) else session.config).report
        self.controller = Controller(
            session.world_size, session.rank, self.config, log_path_for(report.event_log, session.rank)
        )
        self.run_id = _shared_run_id()
        """The run's id in the records, the same on every rank (kept by a restored loop)."""
        self.clock_syncs: deque[dict[str, Any]] = deque(maxlen=64)
        """The latest clock re-measurements: ``{"step", "largest_shift_ms", "largest_rtt_ms"}``."""
        self._step = 0
        self._algorithm = "allreduce"
        self._last_exchange = 0
        self._decision_in_flight: Decision | None = None
        self._previous_sizes: list[tuple[int, int]] = []
        self._saved_rank = session.rank
        self.baseline: Baseline | None = None
        """What runs the ``allreduce`` baseline: ``baseline(tensor, op)`` starts it in place and returns a
        future that completes once the tensor holds the result (a framework's own AllReduce, e.g.
        Horovod's); ``None``: the process group's own ``all_reduce``. Not saved with the state."""
        self._reset_in_flight()
        self._attach(session, report.wandb)

    # -- binding and checkpoints ----------------------------------------------------------------
    def _reset_in_flight(self) -> None:
        self._session: Session | None = None
        self._step_open = False
        self._probe_bucket = -1
        self._pending: PendingExchange | None = None
        self._shipped: Decision | None = None
        self._observer: concurrent.futures.ThreadPoolExecutor | None = None
        self._observing: concurrent.futures.Future[Decision | None] | None = None
        self._unsynced: list[torch.futures.Future[torch.Tensor]] = []
        self._failure: PeerError | None = None
        self._fault_report: tuple[int, FaultReport] | None = None
        self._lock = threading.Lock()
        self._header_due = False
        self._wandb: WandbLogger | None = None

    def _attach(self, session: Session, wandb: bool | None) -> None:
        """Use ``session``'s groups and runtime (local: the session was set up collectively);
        ``wandb``: ``report.wandb`` (rank 0 logs to Weights & Biases)."""
        session.loops += 1  # numbers the loops of a group the same on every rank
        self._session = session
        self._store = report_store(session.loops - 1, session.group)
        self.exchange = StatsExchange(session.side_group, session.world_size, session.rank, self.config.max_buckets)
        self.clock_offsets: ClockOffsets = session.clock_offsets
        """Per rank: add to its wall clock (ns) for rank 0's; re-measured every ``clock_sync_every`` steps."""
        self.exchange.offsets = self.clock_offsets
        longest = max(self.config.exchange_every, self.config.quiet_exchange_every)
        self.profiler = ArrivalProfiler(keep_steps=4 * longest + 4)
        self._speed = local_link_speed()
        self._host = host_id()
        self._start_records(wandb)

    def _start_records(self, wandb: bool | None) -> None:
        """Leave this rank's host id for the others' headers, and the W&B logger on rank 0; the
        header itself is written at the first step (:meth:`_write_header`)."""
        records = self.controller.records
        self._header_due = records.path is not None
        if self._store is not None:
            try:
                self._store.set(f"host/{self.rank}", str(self._host))
            except Exception as err:  # a header without hosts: not worth failing the set-up for
                warnings.warn(f"stragglerkit could not share this rank's host id: {err!r}", stacklevel=3)
        if self.rank == 0 and self.world_size > 1:
            self._wandb = wandb_logger(wandb)
            records.consumer = self._wandb

    def bind(self, session: Session) -> None:
        """Bind a restored loop to ``session`` (every rank, before its first bucket; not collective).

        The group must have as many ranks as the one the loop was saved on."""
        if self._session is not None:
            if self._session is session:
                return
            raise ConfigError("this loop is bound to a session already; restore a copy to bind it to another")
        if session.world_size != self.controller.world_size:
            raise ConfigError(
                f"the loop was saved on {self.controller.world_size} ranks and cannot resume on "
                f"{session.world_size}: create a new one (its warm-up learns the plan again)"
            )
        report = session.config.report
        event_log = log_path_for(report.event_log, session.rank)
        if session.rank != self._saved_rank:  # another rank's state: keep what every rank shares
            saved = self.controller
            controller = Controller(session.world_size, session.rank, self.config, event_log)
            controller.apply(Decision(0, saved.plan_start, saved.plan, [], saved.probe_every, saved.exchange_every))
            controller.events = list(saved.events)
            self.controller = controller
            self._decision_in_flight = None
        else:
            self.controller.log_path = event_log  # this run's log (the saved path may be gone)
        self._saved_rank = session.rank
        self._attach(session, report.wandb)

    @property
    def bound(self) -> bool:
        """Is the loop bound to a session (false after unpickling until :meth:`bind`)?"""
        return self._session is not None

    def __getstate__(self) -> dict[str, Any]:
        if self._session is not None:
            if self._step_open:
                raise StragglerKitError(
                    f"stragglerkit: the loop's state was saved in the middle of step {self._step}; "
                    "save it between steps (after the optimizer step)"
                )
            if self._pending is not None:  # finish the exchange in flight, as the next step would
                self._receive(self._pending)
                self._pending = None
            self._join_observer()
            self._flush_records()
            self._previous_sizes = [(t.bucket, t.nbytes) for t in self.profiler.buckets(self._step - 1)]
        return {
            "version": _STATE_VERSION,
            "config": self.config,
            "controller": self.controller,
            "clock_syncs": list(self.clock_syncs),
            "step": self._step,
            "algorithm": self._algorithm,
            "last_exchange": self._last_exchange,
            "decision_in_flight": self._decision_in_flight,
            "previous_sizes": self._previous_sizes,
            "rank": self._saved_rank,
            "run_id": self.run_id,
            "framework": self.framework,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ConfigError(
                f"a stragglerkit loop state of version {state.get('version')!r}; this version reads {_STATE_VERSION}"
            )
        self.config = state["config"]
        self.controller = state["controller"]
        self.clock_syncs = deque(state["clock_syncs"], maxlen=64)
        self._step = state["step"]
        self._algorithm = state["algorithm"]
        self._last_exchange = state["last_exchange"]
        self._decision_in_flight = state["decision_in_flight"]
        self._previous_sizes = list(state["previous_sizes"])
        self._saved_rank = state["rank"]
        self.run_id = state.get("run_id") or _shared_run_id()
        self.framework = state.get("framework", "loop")
        self.baseline = None
        self._reset_in_flight()

    # -- what the training loop reads -----------------------------------------------------------
    @property
    def session(self) -> Session:
        if self._session is None:
            raise NotInitializedError(
                "this stragglerkit loop was restored from a checkpoint and is not bound yet: call "
                "stragglerkit.init() on every rank, then bind it (DDPState.bind(process_group))"
            )
        return self._session

    @property
    def runtime(self) -> Runtime:
        return self.session.runtime

    @property
    def rank(self) -> int:
        return self.controller.rank

    @property
    def world_size(self) -> int:
        return self.controller.world_size

    @property
    def step(self) -> int:
        """Completed steps (a step ends at the bucket handed over with ``last=True``)."""
        return self._step

    @property
    def rank_map(self) -> list[int]:
        """``ranks[logical] = group rank`` of the plan in force (the identity when it remaps nothing)."""
        return self.controller.plan.rank_map(self.world_size) or list(range(self.world_size))

    @property
    def algorithm(self) -> str:
        """The algorithm of the step in progress, or of the last completed one between steps
        (``allreduce`` during warm-up; a plan's straggler-aware algorithm if any bucket runs one)."""
        return self._algorithm

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every controller decision: ``{"step", "kind", "algorithm", "evidence"}`` (as in the JSONL log)."""
        return self.controller.events

    @property
    def failure(self) -> PeerError | None:
        """The fault that stopped the loop (``None`` while all is well)."""
        return self._failure

    # -- the interface the adapters call ----------------------------------------------------------
    def all_reduce_bucket(
        self, tensor: torch.Tensor, index: int, last: bool, op: str = "avg"
    ) -> torch.futures.Future[torch.Tensor]:
        """Start ``tensor``'s AllReduce (in place, ``op`` = ``"avg"`` or ``"sum"``) with this
        step's plan; ``last`` ends the step. The future completes with ``tensor``, or fails with
        a :class:`~stragglerkit.errors.PeerError`."""
        if self._failure is not None:
            raise self._failure
        if op not in LOOP_OPS:
            raise ConfigError(f"op must be one of {', '.join(LOOP_OPS)}, got {op!r}")
        session = self.session
        first = not self._step_open
        step = self._step
        if first:
            nvtx.mark(nvtx.STEP, step)  # this rank's arrival at the step's AllReduce
            self._begin_step(session)
        future = self._hand_off(session, tensor, index, last, op)
        self._unsynced.append(future)
        if first:
            self._start_exchange(step)
            self._after_first_bucket(step)
        return future

    def synchronize(self) -> None:
        """Wait for every bucket handed over since the last call; raise the fault if one failed."""
        futures, self._unsynced = self._unsynced, []
        error: BaseException | None = None
        with nvtx.range(nvtx.WAIT):
            for future in futures:
                try:
                    future.wait()
                except Exception as err:
                    error = error or err
        if self._failure is not None:
            raise self._failure
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the exchange in flight and stop the controller's thread (call on every rank
        before ``stragglerkit.destroy``; the loop must not run afterwards)."""
        if self._pending is not None:
            try:
                self.exchange.wait(self._pending)
            except Exception:
                if self._failure is None:
                    raise
            self._pending = None
        if self._observer is not None:
            self._join_observer()
            self._observer.shutdown()
            self._observer = None
        self._flush_records()
        if self._wandb is not None:
            self._wandb.close()

    # -- per step ---------------------------------------------------------------------------------
    def _begin_step(self, session: Session) -> None:
        """First bucket of a step, before it is handed off: receive the previous exchange (adopting
        rank 0's decision) and fix this step's plan and probe bucket."""
        self._step_open = True
        self._unsynced = [f for f in self._unsynced if not f.done()]
        if self._pending is not None:
            pending, self._pending = self._pending, None
            with nvtx.range(nvtx.EXCHANGE):
                self._receive(pending)
        every = self.config.clock_sync_every
        if every and self.world_size > 1 and self._step > 0 and self._step % every == 0:
            self._sync_clocks(session)  # nothing is in flight on the side group now
        self._algorithm = "allreduce" if self._step < self.config.warmup_steps else self.controller.plan.algorithm
        self._probe_bucket = self._bucket_to_probe()

    def _sync_clocks(self, session: Session) -> None:
        """Measure the clock offsets to rank 0 again (every rank, the same step)."""
        try:
            offsets = estimate_clock_offsets(session.side_group)
        except Exception as err:
            raise self._fail("stragglerkit clock sync", self._step, err) from err
        shift = max(abs(a - b) for a, b in zip(offsets.offset_ns, self.clock_offsets.offset_ns))
        self.clock_syncs.append(
            {"step": self._step, "largest_shift_ms": shift / 1e6, "largest_rtt_ms": max(offsets.rtt_ns) / 1e6}
        )
        self.clock_offsets = offsets
        self.exchange.offsets = offsets

    @property
    def _next_exchange(self) -> int:
        """The step the next exchange is issued at: the last one's plus the interval in force (a
        decision that changes the interval counts it from the exchange that carried it)."""
        return self._last_exchange + self.controller.exchange_every

    def _start_exchange(self, step: int) -> None:
        """After the first bucket of ``step`` was handed to its AllReduce: every ``K``-th step, issue
        the exchange of the last ``K`` steps' figures (complete since this step's first bucket).
        Issued here, it runs while that AllReduce is on the wire instead of delaying it."""
        if self.world_size > 1 and step == self._next_exchange:
            first = self._last_exchange
            buckets = self.config.max_buckets
            arrivals = [self.profiler.step_arrival(s, buckets) for s in range(first, step)]
            self._join_observer()
            decision, self._decision_in_flight = self._decision_in_flight, None
            with nvtx.range(nvtx.EXCHANGE):
                payload = self.exchange.pack(first, arrivals, self._speed, self._host, decision)
                self._pending = self.exchange.start(payload, first)
            self._shipped = decision
            self._last_exchange = step

    def _after_first_bucket(self, step: int) -> None:
        """The records' turn, once the step's first bucket is on its way: the header at the first
        step, what the controller queued at an exchange step, and a row for W&B on rank 0."""
        if self._header_due:
            self._header_due = False
            self._write_header()
        if step == self._last_exchange:
            self._flush_records()
        if self._wandb is not None:
            self._wandb.pump()

    def _write_header(self) -> None:
        hosts = None
        if self._store is not None:
            keys = [f"host/{r}" for r in range(self.world_size)]
            try:  # every rank left its id before its first step: only a rank far behind is waited for
                self._store.wait(keys, datetime.timedelta(seconds=HOSTS_WAIT_S))
                hosts = [int(self._store.get(key)) for key in keys]
            except Exception:
                hosts = None  # a rank that never comes fails the step with its own error
        header = run_record(
            self.run_id,
            rank=self.rank,
            world_size=self.world_size,
            framework=self.framework,
            hosts=hosts if hosts is not None else ([self._host] if self.world_size == 1 else None),
            config=self.config,
        )
        try:
            self.controller.records.start(header)
        except OSError as err:
            self._records_failed(err)

    def _flush_records(self) -> None:
        try:
            self.controller.records.flush()
        except OSError as err:
            self._records_failed(err)

    def _records_failed(self, err: OSError) -> None:
        """An event log that cannot be written must not stop training: say so once, write no more."""
        records = self.controller.records
        warnings.warn(
            f"stragglerkit: the event log {records.path} cannot be written, no more records go there: {err}",
            stacklevel=3,
        )
        records.path = None

    def _bucket_to_probe(self) -> int:
        """This step's probe: the largest bucket of the previous step (-1: none). The same on every
        rank: the step number, the buckets and the adopted plan and interval are. Under a plan for
        degraded NICs not before the switch's settle and verification steps are over (the probe
        would lengthen a step that the verification measures)."""
        cfg = self.config
        controller = self.controller
        if self.world_size < 3 or self._step < max(cfg.warmup_steps, 1):
            return -1
        if controller.plan.runs_nic_plan:
            if self._step < controller.plan_start + cfg.settle_steps + cfg.verify_steps:
                return -1
        elif cfg.baseline != "allreduce":
            return -1  # another baseline measures the links in every run
        every = controller.probe_every  # the same on every rank: adopted from the last decision
        if every == 0 or self._step % every != 0:
            return -1
        previous = [(t.bucket, t.nbytes) for t in self.profiler.buckets(self._step - 1)]
        previous = previous or self._previous_sizes  # the step before a restore
        if not previous:
            return -1
        bucket, nbytes = max(previous, key=lambda sized: (sized[1], -sized[0]))
        return bucket if nbytes >= cfg.min_bucket_bytes else -1

    def _receive(self, pending: PendingExchange) -> None:
        try:
            rows = self.exchange.wait(pending)
        except Exception as err:
            raise self._fail(
                f"stragglerkit stats exchange (issued at step {self._last_exchange})", self._step, err
            ) from err
        decision = self._shipped if self.rank == 0 else self.exchange.decision(rows)
        if decision is not None:
            for event in decision.events:  # marks where this rank adopts each
                nvtx.mark(nvtx.DECISION, event.get("kind"))
            self.controller.apply(decision)
        if self.rank == 0:
            steps = range(pending.first_step, pending.first_step + int(rows[0, 3]))
            sizes, algorithms = self._own_buckets(steps)
            apply_step = self._next_exchange + 1  # the decision travels with the next exchange
            if self._observer is None:
                self._observer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stragglerkit-controller")
            # off the critical path: the decision is needed only when the next exchange is issued
            self._observing = self._observer.submit(self._observe, rows, sizes, algorithms, apply_step, self._step)

    def _observe(
        self, rows: np.ndarray, sizes: list[int], algorithms: list[list[str]], apply_step: int, step: int
    ) -> Decision | None:
        try:
            return self.controller.observe(self.exchange.stats(rows, sizes, algorithms), apply_step)
        except Exception as err:  # a controller fault must not stop training: keep the plan, say so
            warnings.warn(f"stragglerkit controller failed at step {step}, plan kept: {err!r}", stacklevel=2)
            return None

    def _join_observer(self) -> None:
        """Rank 0: wait for the controller's digest of the last exchange (its decision ships next)."""
        if self._observing is not None:
            self._decision_in_flight = self._observing.result()
            self._observing = None

    def _own_buckets(self, steps: range) -> tuple[list[int], list[list[str]]]:
        sizes: dict[int, int] = {}
        algorithms = []
        for s in steps:
            per_step = [""] * self.config.max_buckets
            for t in self.profiler.buckets(s):
                if t.bucket < self.config.max_buckets:
                    per_step[t.bucket] = t.algorithm
                    sizes[t.bucket] = t.nbytes
            algorithms.append(per_step)
        count = max(sizes) + 1 if sizes else 0
        return [sizes.get(b, 0) for b in range(count)], algorithms

    def _finish(self, timing: BucketTiming, algorithm: str, record: RunRecord | None, *, queued: bool = True) -> None:
        end = None
        links = None
        link_start = None
        if record is not None and len(record.timings):
            first_post, end = record.timings.span_ns()
            if algorithm == "ring":  # one successor and one predecessor: its links' messages (see nic_health)
                link_start = first_post  # the executor's entry: its first post
                links = ring_link_messages(record.timings.records(), link_start)
        self.profiler.finish(timing, algorithm, end, links, link_start, queued=queued)

    # -- one bucket ---------------------------------------------------------------------------------
    def _hand_off(
        self, session: Session, tensor: torch.Tensor, index: int, last: bool, op: str
    ) -> torch.futures.Future[torch.Tensor]:
        """Start the bucket's AllReduce with this step's plan; the future the framework waits for."""
        timing = self.profiler.begin(self._step, index, tensor.numel() * tensor.element_size())
        if last:
            self._step += 1
            self._step_open = False
        if self.world_size == 1:
            self._finish(timing, "none", None)
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(tensor)
            return done
        if timing.step < self.config.warmup_steps:
            return self._plain(session, tensor, timing, op)
        plan = self.controller.plan
        algorithm = plan.algorithm_for(index)
        probe = None
        if index == self._probe_bucket and (algorithm == "allreduce" or algorithm in NIC_ALGORITHMS):
            algorithm = "ring"  # a probe: its links' timings re-measure each rank's NIC
            probe = nvtx.start(nvtx.PROBE, cross_thread=True)
        elif algorithm == "allreduce":
            return self._plain(session, tensor, timing, op)
        slowdowns = dict(plan.slowdowns) if algorithm in NIC_ALGORITHMS else None
        straggler = plan.straggler if algorithm == "stragglar" else None
        # the plan's rank map goes with each call: the runtime's own stays the user's calls'
        handle = session.runtime.start(
            AllReduceCall(tensor, algorithm, op, straggler, slowdowns, plan.rank_map(self.world_size))
        )
        result = _future_for(tensor)

        def finish(_: torch.futures.Future[torch.Tensor]) -> None:
            nvtx.end(probe)
            try:
                record = handle.wait(0)
            except Exception as err:  # the executor's error (naming a rank), and who stalled
                failure = self._fail(f"stragglerkit all_reduce (algorithm {algorithm}", timing.step, err, timing)
                result.set_exception(failure)  # type: ignore[arg-type]
                return
            try:
                self._finish(timing, record.algorithm, record)
            except Exception as err:  # bookkeeping must not hold the gradient back
                warnings.warn(
                    f"stragglerkit could not record bucket {timing.bucket} of step {timing.step}: {err!r}", stacklevel=1
                )
            result.set_result(tensor)

        handle.future.add_done_callback(finish)
        return result

    def _plain(
        self, session: Session, tensor: torch.Tensor, timing: BucketTiming, op: str
    ) -> torch.futures.Future[torch.Tensor]:
        """The baseline: :attr:`baseline`, else the process group's own all_reduce (on the session's
        group with the timeout)."""
        baseline_range = None  # a framework's baseline names its own range (horovod.py, megatron/adapter.py)
        if self.baseline is not None:
            started = self.baseline(tensor, op)
        else:
            baseline_range = nvtx.start(nvtx.ALL_REDUCE, "process_group", cross_thread=True)
            if op == "avg":
                tensor.div_(self.world_size)
            work = dist.all_reduce(tensor, group=session.allreduce_group, async_op=True)
            assert work is not None
            started = work.get_future()
        result = _future_for(tensor)

        def finish(fut: torch.futures.Future[Any]) -> None:
            nvtx.end(baseline_range)
            try:
                fut.wait()
            except Exception as err:
                what = "stragglerkit all_reduce (the process group's own"
                result.set_exception(self._fail(what, timing.step, err, timing))  # type: ignore[arg-type]
                return
            try:
                self.profiler.finish(timing, "allreduce", queued=False)  # gloo may run it next to the others
            except Exception as err:  # bookkeeping must not hold the gradient back
                warnings.warn(
                    f"stragglerkit could not record bucket {timing.bucket} of step {timing.step}: {err!r}", stacklevel=1
                )
            result.set_result(tensor)

        started.then(finish)
        return result

    def _fail(self, what: str, step: int, cause: BaseException, timing: BucketTiming | None = None) -> PeerError:
        """The loop's fault: who did not reach ``step`` (faults.compare_notes, once per step), as a
        :class:`PeerError` that every later call raises too."""
        if timing is not None:
            what = f"{what}, bucket {timing.bucket} of step {step})"
        with self._lock:
            known = self._fault_report
        if known is not None and known[0] == step:
            report = known[1]
        else:
            entries = [t.hook_wall_ns for t in self.profiler.buckets(step)]
            entered = (min(entries) if entries else time.time_ns()) + self.clock_offsets.offset_ns[self.rank]
            report = compare_notes(self._store, self.rank, self.world_size, step, entered, self.config.timeout)
        error = peer_error(what, self.rank, report, cause)
        with self._lock:
            self._fault_report = (step, report)
            if self._failure is None:
                self._failure = error
        return error


def _shared_run_id() -> str:
    """The run's id: the first rank to ask leaves a fresh one in the rendezvous store and every
    rank gets that one (``compare_set`` neither waits nor is collective); without a reachable
    store, torchrun's ``TORCHELASTIC_RUN_ID`` or else a fresh one of this rank's own."""
    candidate = new_run_id()
    try:
        store = dist.distributed_c10d._get_default_store()
        return bytes(store.compare_set(_RUN_ID_KEY, "", candidate)).decode()
    except Exception:
        elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
        return elastic if elastic and elastic != "none" else candidate


def _future_for(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future for ``tensor``'s result (CUDA-aware on a GPU, so consumers wait on its streams)."""
    if tensor.is_cuda:
        return torch.futures.Future(devices=[tensor.device])
    return torch.futures.Future()
