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

1. **Warm-up** (``Config.detection.warmup_steps``): every bucket goes to the process group's own
   ``all_reduce`` (pre-divided by the world size, like DDP without a hook). Arrivals are recorded
   already, so the detector's window fills during warm-up.
2. **Plans**: then each bucket runs the controller's current plan. While nothing is wrong that is
   the baseline, the process group's own ``all_reduce`` (``stragglerkit.defaults.BASELINE``),
   so the loop costs only its bookkeeping. Every ``probe_every``-th step the largest bucket runs
   stragglerkit's ring instead (a *probe*): its per-op timings give each link's achieved rate (NIC
   health) and a cost-model sample; the interval backs off while the links read healthy and under
   an OptCC plan (``defaults.QUIET_PROBE_EVERY``, ``defaults.PLAN_PROBE_EVERY``;
   :mod:`~stragglerkit.detect.probe_schedule`).
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

**Parts.** The loop is a dispatcher (this module: each bucket to the plan's algorithm, the plan
switched at one step on every rank) plus the side-group traffic (:mod:`stragglerkit.loop.exchange`:
the stats exchange, rank 0's controller thread, the clock sync), the records
(:mod:`stragglerkit.loop.records`: the run's id and header, when queued records are written) and
their sinks (:mod:`stragglerkit.loop.sinks`: event log, W&B, NVTX), the fault reports
(:mod:`stragglerkit.loop.faults`) and its checkpoint state (:mod:`stragglerkit.loop.state`).

Gradients come out identical on every rank. The controller verifies each switch and rolls it
back if it did not pay (:mod:`stragglerkit.detect.controller`).

**Observing only** (``Config.detection.act``, :func:`~stragglerkit.detect.settings.act_decision`):
where the loop may not switch (``never``, or ``auto`` on a backend where stragglerkit's executor
is not proven, NCCL), every bucket takes the baseline's path and no probe runs; the controller
still detects and reports, and records the switch it would have made as ``would_switch``. The
loop says so once: an ``observing`` event on every rank and a warning on rank 0
(:mod:`stragglerkit.loop.observing`).

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

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from stragglerkit.config import Config
from stragglerkit.detect.arrival import ArrivalProfiler, BucketTiming, ClockOffsets
from stragglerkit.detect.controller import Controller
from stragglerkit.detect.exchange import host_id
from stragglerkit.detect.nic_health import local_link_speed
from stragglerkit.detect.settings import Settings, act_decision, settings_for
from stragglerkit.errors import ConfigError, NotInitializedError, PeerError, StragglerKitError
from stragglerkit.loop.dispatch import hand_off, own_buckets, probe_bucket
from stragglerkit.loop.exchange import Exchange
from stragglerkit.loop.faults import FaultReport, compare_notes, peer_error, report_store
from stragglerkit.loop.observing import act_on, say_observing
from stragglerkit.loop.records import after_first_bucket, flush_records, shared_run_id, start_records, take_outbox
from stragglerkit.loop.sinks import EventLogSink, Sinks
from stragglerkit.loop.state import loop_state, restore
from stragglerkit.planner.model import Predictor
from stragglerkit.plans import Decision, log_path_for
from stragglerkit.runtime.runtime import Runtime
from stragglerkit.session import Session
from stragglerkit.sim.cost_model import CostModelParams
from stragglerkit.telemetry import nvtx
from stragglerkit.telemetry.records import FRAMEWORKS

__all__ = ["LOOP_OPS", "Baseline", "StragglerLoop"]

LOOP_OPS = ("avg", "sum")
"""What ``all_reduce_bucket`` can do to a bucket."""

Baseline = Callable[[torch.Tensor, str], "torch.futures.Future[Any]"]
"""A framework's own AllReduce as the loop's baseline: ``baseline(tensor, op)`` (op ``"avg"`` or
``"sum"``) reduces ``tensor`` in place; the future completes when it is done."""


class StragglerLoop:
    """The closed loop over one process group's gradient buckets (see the module docstring).

    ``session``: what :func:`stragglerkit.init` set up for the group (not collective: creating a
    loop only reads it). ``config``: a :class:`stragglerkit.Config` whose ``detection`` and
    ``report`` sections this loop uses instead of the session's; the timeout is always the
    session's ``executor.timeout``. ``framework``: the adapter that feeds the loop (``ddp``,
    ``horovod``, ``megatron``), as its records name it; ``loop`` when used directly.

    Example::

        loop = StragglerLoop(session_for(None))
        futures = [loop.all_reduce_bucket(b, i, i == len(buckets) - 1) for i, b in enumerate(buckets)]
        loop.synchronize()
    """

    __slots__ = (  # noqa: RUF023 (grouped: what users tune, then internal state)
        # user-tuned
        "framework",
        # internal: what a checkpoint keeps
        "_algorithm",
        "_previous_sizes",
        "_saved_rank",
        "_step",
        "controller",
        "event_log",
        "exchange",
        "run_id",
        "settings",
        # internal: the session's, and what is in flight
        "_failure",
        "_fault_report",
        "_header_due",
        "_host",
        "_lock",
        "_probe_bucket",
        "_session",
        "_sinks",
        "_speed",
        "_step_open",
        "_store",
        "_unsynced",
        "baseline",
        "profiler",
    )

    def __init__(self, session: Session, config: Config | None = None, *, framework: str = "loop") -> None:
        if not isinstance(session, Session):
            raise ConfigError(
                f"session must be a stragglerkit Session (from stragglerkit.init), got {type(session).__name__}"
            )
        if config is not None and not isinstance(config, Config):
            raise ConfigError(
                f"config must be a stragglerkit.Config (its detection section holds what may be tuned), "
                f"got {type(config).__name__}"
            )
        if framework not in FRAMEWORKS:
            raise ConfigError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
        chosen = config if config is not None else session.config
        acts = act_decision(chosen.detection.act, session.backend).acts
        timed = chosen.replace(executor={"timeout": session.config.executor.timeout})
        self.settings: Settings = settings_for(timed, acting=acts)
        """What the loop runs with: ``config.detection`` and the internal constants (:mod:`stragglerkit.defaults`)."""
        self.framework = framework
        """What feeds the loop, as its records say: ``ddp``, ``horovod``, ``megatron`` or ``loop``."""
        self.controller = Controller(session.world_size, session.rank, self.settings)
        self.event_log = EventLogSink(log_path_for(chosen.report.event_log, session.rank))
        """This rank's JSONL event log (its ``path`` is ``None`` where this rank writes none)."""
        self.run_id = shared_run_id()
        """The run's id in the records, the same on every rank (kept by a restored loop)."""
        self.exchange = Exchange()
        """The stats exchange, rank 0's controller thread and the clock sync."""
        self._step = 0
        self._algorithm = "allreduce"
        self._previous_sizes: list[tuple[int, int]] = []
        self._saved_rank = session.rank
        self.baseline: Baseline | None = None
        """What runs the ``allreduce`` baseline: ``baseline(tensor, op)`` starts it in place and returns a
        future that completes once the tensor holds the result (a framework's own AllReduce, e.g.
        Horovod's); ``None``: the process group's own ``all_reduce``. Not saved with the state."""
        self._reset_in_flight()
        self._attach(session, chosen.report.wandb)

    # -- binding and checkpoints ----------------------------------------------------------------
    def _reset_in_flight(self) -> None:
        self._session: Session | None = None
        self._step_open = False
        self._probe_bucket = -1
        self._unsynced: list[torch.futures.Future[torch.Tensor]] = []
        self._failure: PeerError | None = None
        self._fault_report: tuple[int, FaultReport] | None = None
        self._lock = threading.Lock()
        self._header_due = False
        self._sinks = Sinks()

    def _attach(self, session: Session, wandb: bool | None) -> None:
        """Use ``session``'s groups and runtime (local: the session was set up collectively);
        ``wandb``: ``report.wandb`` (rank 0 logs to Weights & Biases)."""
        acting = act_decision(self.settings.detection.act, session.backend)
        act_on(self, acting)
        session.loops += 1  # numbers the loops of a group the same on every rank
        self._session = session
        self._store = report_store(session.loops - 1, session.group)
        self.exchange.bind(session, self.controller, self.settings.max_buckets, self._fail)
        detection = self.settings.detection
        longest = max(detection.exchange_every, detection.quiet_exchange_every)
        self.profiler = ArrivalProfiler(keep_steps=4 * longest + 4)
        self._speed = local_link_speed()
        self._host = host_id()
        start_records(self, wandb)
        if not acting.acts:
            say_observing(self, acting.reason, session.backend)

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
            controller = Controller(session.world_size, session.rank, self.settings)
            controller.apply(Decision(0, saved.plan_start, saved.plan, [], saved.probe_every, saved.exchange_every))
            controller.events = list(saved.events)
            self.controller = controller
            self.exchange.decision_in_flight = None
            self.event_log = EventLogSink(event_log)
        else:
            self.event_log.path = event_log  # this run's log (the saved path may be gone)
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
            if self.exchange.in_flight:  # finish the exchange in flight, as the next step would
                self.exchange.receive(self._step, self.adopt, self._buckets_of, self.adopt_model)
            self.exchange.join()
            take_outbox(self)  # written by this loop, not again by the one restored from the state
            flush_records(self)
            self._previous_sizes = [(t.bucket, t.nbytes) for t in self.profiler.buckets(self._step - 1)]
        return loop_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        _, run_id = restore(self, state)
        self.run_id = run_id or shared_run_id()
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

    @property
    def clock_offsets(self) -> ClockOffsets:
        """Per rank: add to its wall clock (ns) for rank 0's (re-measured every ``clock_sync_every`` steps)."""
        return self.exchange.clock_offsets

    @property
    def clock_syncs(self) -> deque[dict[str, Any]]:
        """The latest clock re-measurements: ``{"step", "largest_shift_ms", "largest_rtt_ms"}``."""
        return self.exchange.clock_syncs

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
        future = hand_off(self, session, tensor, index, last, op)
        self._unsynced.append(future)
        if first:
            self._start_exchange(step)
            after_first_bucket(self, step)
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
        self.exchange.close(failed=self._failure is not None)
        take_outbox(self)  # the windows the last exchange queued: nothing observed is lost
        flush_records(self)
        self._sinks.close()

    # -- per step ---------------------------------------------------------------------------------
    def _begin_step(self, session: Session) -> None:
        """First bucket of a step, before it is handed off: receive the previous exchange (adopting
        rank 0's decision) and fix this step's plan and probe bucket."""
        self._step_open = True
        self._unsynced = [f for f in self._unsynced if not f.done()]
        if self.exchange.in_flight:
            with nvtx.range(nvtx.EXCHANGE):
                self.exchange.receive(self._step, self.adopt, self._buckets_of, self.adopt_model)
        every = self.settings.clock_sync_every
        if every and self.world_size > 1 and self._step > 0 and self._step % every == 0:
            self.exchange.sync_clocks(session, self._step)  # nothing is in flight on the side group now
        warm = self._step < self.settings.detection.warmup_steps
        observing = not self.settings.acting  # runs the baseline, whatever plan it holds
        self._algorithm = "allreduce" if warm or observing else self.controller.plan.algorithm
        self._probe_bucket = probe_bucket(self)

    def adopt(self, decision: Decision) -> None:
        """Adopt rank 0's decision (every rank, the same step) and hand its events to the sinks,
        after the windows rank 0's controller queued before it."""
        events = self.controller.apply(decision)
        take_outbox(self)
        self._sinks.add_all(events)
        flush_records(self)  # a decision is written when adopted

    def adopt_model(self, params: CostModelParams) -> None:
        """Adopt rank 0's fitted cost model for ``all_reduce(algorithm="auto")`` (every rank, the
        same step): the planner then chooses with the model the controller chooses with."""
        runtime = self.session.runtime
        current = runtime.model
        if not (isinstance(current, Predictor) and current.config == params):
            runtime.adopt_model(params)

    def _start_exchange(self, step: int) -> None:
        """After the first bucket of ``step`` was handed to its AllReduce: every ``K``-th step, issue
        the exchange of the last ``K`` steps' figures (complete since this step's first bucket).
        Issued here, it runs while that AllReduce is on the wire instead of delaying it."""
        exchange = self.exchange
        if exchange.due(step):
            buckets = self.settings.max_buckets
            arrivals = [self.profiler.step_arrival(s, buckets) for s in range(exchange.last_exchange, step)]
            self.controller.records_wanted = self._sinks.wanted
            exchange.start(step, arrivals, self._speed, self._host)

    def _buckets_of(self, steps: range) -> tuple[list[int], list[list[str]]]:
        return own_buckets(self, steps)

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
            report = compare_notes(self._store, self.rank, self.world_size, step, entered, self.settings.timeout)
        error = peer_error(what, self.rank, report, cause)
        with self._lock:
            self._fault_report = (step, report)
            if self._failure is None:
                self._failure = error
        return error
