"""PyTorch DDP communication hook: the straggler-aware loop inside ``model.register_comm_hook``.

What it does, step by step (a *step* ends at the bucket that DDP marks ``is_last()``):

1. **Warm-up** (``ControllerConfig.warmup_steps``): every bucket goes to the process group's own
   ``all_reduce`` (pre-divided by the world size, like DDP without a hook). Arrivals are recorded
   already, so the detector's window fills during warm-up.
2. **Plans**: then each bucket runs the controller's current plan. While nothing is wrong that is
   the baseline, by default the process group's own ``all_reduce`` (``ControllerConfig.baseline``):
   what plain DDP runs, so the hook costs only its bookkeeping. Every ``probe_every``-th step the
   largest bucket runs stragglerkit's ring instead (a *probe*): its per-op timings give each
   link's achieved rate (NIC health) and a cost-model sample. Once the last ``quiet_after``
   probes found the links healthy (the median of their largest ``l``), probes come every
   ``quiet_probe_every`` steps, and again every ``probe_every`` when the AllReduce slows down
   (``probe_alarm``) or a probe reads a slow link. While an OptCC plan runs, every
   ``plan_probe_every``-th step (outside the switch's verification) probes its largest bucket the
   same way, so that a NIC that recovers is noticed and the plan returns to the baseline; while a
   probe reads a planned rank's ``l`` off the plan's, every ``probe_every``-th step, until the
   plan is cleared, rebuilt for the new ``l`` or the reading proves to be noise. Buckets
   whose plan names one of stragglerkit's
   algorithms (StragglAR, OptCC, ...) go to the executor
   (``Runtime.all_reduce_async(..., op="avg")``), which returns at once; the hook returns a
   ``torch.futures.Future`` completed after this rank's bookkeeping (span, per-peer rates) is done.
3. **Stats exchange**: every ``K``-th step, right after its first bucket was handed to its
   AllReduce, the state issues an async gather of the last ``K`` steps' figures to rank 0, and a
   broadcast of rank 0's decision, on a side gloo group, and waits for them at the next step's
   first bucket (they are complete by then). Rank 0 digests the figures on a background thread
   (cost model fit, detector, plan; joined when the next exchange is issued, so with ``K >= 2`` it
   overlaps a whole step); its decision rides on the next exchange and every rank adopts it at the
   same step. Every ``clock_sync_every`` steps the clock offsets to rank 0 are measured again at
   the start of the step (hosts' clocks drift apart; the NIC estimate pairs times across hosts).

Gradients are averaged (sum, then divided once by the world size), identically on every rank.
With NCCL the executor sends over the NCCL group and the exchange stays on a gloo side group
(CPU tensors). Lateness injection is not part of the hook.

Faults: a rank that dies or stalls makes the step fail on every other rank with a
:class:`~stragglerkit.errors.StragglerKitError` naming it, after at most ``ControllerConfig.timeout``
seconds. The group's own ``all_reduce`` runs (with gloo) on a group of the hook's own with that
timeout. When a bucket's AllReduce fails, each surviving rank reports the step it reached in the
rendezvous store and waits up to 2 s for the others' reports: the ranks that do not report,
report an earlier step, or entered the step at least half the timeout after the first rank are
named as stalled or dead. Nothing is reported or waited for while
all is well. (With NCCL the group's own AllReduce runs on the NCCL group, under its timeout.)

Example::

    import stragglerkit
    state = stragglerkit.DDPState(None, event_log="events.jsonl")
    model.register_comm_hook(state, stragglerkit.ddp_hook)
    ...                                   # train; state.algorithm, state.events, state.step
"""

from __future__ import annotations

import concurrent.futures
import datetime
import itertools
import os
import time
import warnings
from collections import deque
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from stragglerkit.detect.arrival import ArrivalProfiler, BucketTiming, ClockOffsets, estimate_clock_offsets
from stragglerkit.detect.controller import Controller, ControllerConfig, Decision, log_path_for
from stragglerkit.detect.exchange import PendingExchange, StatsExchange, host_id
from stragglerkit.detect.nic_health import local_link_speed, ring_link_messages
from stragglerkit.errors import StragglerKitError
from stragglerkit.runtime.api import RunRecord, Runtime
from stragglerkit.schedules.registry import NIC_ALGORITHMS

__all__ = ["DDPState", "ddp_hook"]

_STATES = itertools.count()
"""Numbers DDPStates in creation order (the same on every rank): their keys in the store."""
REPORT_WAIT_S = 2.0
"""After a failed AllReduce, how long a rank waits for the others' reports before naming the missing."""


class DDPState:
    """State of :func:`ddp_hook` for one DDP model; construct it on every rank at the same point.

    ``process_group``: the group DDP reduces over (``None``: the default group). Construction is
    collective: it creates the runtime's groups and a gloo side group for the stats exchange and
    measures clock offsets with rank 0. ``event_log``: JSONL file of the controller's events,
    written by rank 0 (by every rank if the path contains ``{rank}``).

    Example::

        state = DDPState(None, ControllerConfig(warmup_steps=20), event_log="events.jsonl")
        ddp_model.register_comm_hook(state, ddp_hook)
    """

    __slots__ = (
        "_algorithm",
        "_allreduce_group",
        "_decision_in_flight",
        "_host",
        "_last_exchange",
        "_observer",
        "_observing",
        "_pending",
        "_probe_bucket",
        "_shipped",
        "_speed",
        "_step_open",
        "_store",
        "clock_offsets",
        "clock_syncs",
        "config",
        "controller",
        "exchange",
        "process_group",
        "profiler",
        "rank",
        "runtime",
        "step",
        "world_size",
    )

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        config: ControllerConfig | None = None,
        *,
        event_log: str | os.PathLike[str] | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise ValueError("DDPState needs torch.distributed: call dist.init_process_group(...) first")
        if config is not None and not isinstance(config, ControllerConfig):
            raise ValueError(f"config must be a stragglerkit ControllerConfig, got {type(config).__name__}")
        # user-tuned
        self.config = config if config is not None else ControllerConfig()
        self.process_group = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
        # internal
        self.world_size = self.process_group.size()
        self.rank = self.process_group.rank()
        self.step = 0
        """Completed training steps (a step ends at the bucket with ``is_last()``)."""
        self.runtime = Runtime(self.process_group, timeout=self.config.timeout)
        ranks = dist.get_process_group_ranks(self.process_group)
        timeout = datetime.timedelta(seconds=self.config.timeout)
        side = dist.new_group(ranks, backend="gloo", timeout=timeout)
        self._allreduce_group = self.process_group
        """Where the group's own all_reduce runs: with gloo a group of the hook's, with its timeout."""
        if dist.get_backend(self.process_group) == "gloo":
            self._allreduce_group = dist.new_group(ranks, backend="gloo", timeout=timeout)
        self._store = _report_store(next(_STATES))
        self.exchange = StatsExchange(side, self.world_size, self.rank, self.config.max_buckets)
        self.clock_offsets = estimate_clock_offsets(side) if self.world_size > 1 else ClockOffsets.zero(1)
        """Per rank: add to its wall clock (ns) for rank 0's; re-measured every ``clock_sync_every`` steps."""
        self.exchange.offsets = self.clock_offsets
        self.clock_syncs: deque[dict[str, Any]] = deque(maxlen=64)
        """The latest re-measurements: ``{"step", "largest_shift_ms", "largest_rtt_ms"}`` (the most
        any rank's offset moved since the previous one, and the longest best round trip)."""
        self.controller = Controller(self.world_size, self.rank, self.config, log_path_for(event_log, self.rank))
        longest = max(self.config.exchange_every, self.config.quiet_exchange_every)
        self.profiler = ArrivalProfiler(keep_steps=4 * longest + 4)
        self._last_exchange = 0
        """The step the last exchange was issued at (its figures are of the steps before it)."""
        self._speed = local_link_speed()
        self._host = host_id()
        self._pending: PendingExchange | None = None
        self._decision_in_flight: Decision | None = None
        self._shipped: Decision | None = None
        self._observer: concurrent.futures.ThreadPoolExecutor | None = None
        self._observing: concurrent.futures.Future[Decision | None] | None = None
        self._step_open = False
        self._algorithm = "allreduce"
        self._probe_bucket = -1

    # -- the interface the training loop reads ---------------------------------------------------
    @property
    def algorithm(self) -> str:
        """The algorithm of the step in progress, or of the last completed one between steps
        (``allreduce`` during warm-up; a plan's straggler-aware algorithm if any bucket runs one)."""
        return self._algorithm

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every controller decision: ``{"step", "kind", "algorithm", "evidence"}`` (as in the JSONL log)."""
        return self.controller.events

    def close(self) -> None:
        """Wait for the exchange in flight and stop the controller's thread (call on every rank
        before destroying the process group; the hook must not run afterwards)."""
        if self._pending is not None:
            self.exchange.wait(self._pending)
            self._pending = None
        if self._observer is not None:
            self._decision_to_ship()
            self._observer.shutdown()
            self._observer = None

    # -- per step ---------------------------------------------------------------------------------
    def _begin_step(self) -> None:
        """First bucket of a step, before it is handed off: receive the previous exchange (adopting
        rank 0's decision) and fix this step's plan and probe bucket. The next exchange starts
        after the hand-off (:meth:`_start_exchange`)."""
        self._step_open = True
        if self._pending is not None:
            self._receive(self._pending)
            self._pending = None
        every = self.config.clock_sync_every
        if every and self.world_size > 1 and self.step > 0 and self.step % every == 0:
            self._sync_clocks()  # nothing is in flight on the side group now
        self._algorithm = "allreduce" if self.step < self.config.warmup_steps else self.controller.plan.algorithm
        self._probe_bucket = self._bucket_to_probe()

    def _sync_clocks(self) -> None:
        """Measure the clock offsets to rank 0 again (every rank, the same step); rank 0's exchange
        uses them from now on (see ``ControllerConfig.clock_sync_every``)."""
        try:
            offsets = estimate_clock_offsets(self.exchange.group)
        except Exception as err:
            raise StragglerKitError(
                f"stragglerkit clock sync at step {self.step} failed on rank {self.rank}: "
                f"{self.explain_failure(self.step)}; cause: {err}"
            ) from err
        shift = max(abs(a - b) for a, b in zip(offsets.offset_ns, self.clock_offsets.offset_ns))
        self.clock_syncs.append(
            {"step": self.step, "largest_shift_ms": shift / 1e6, "largest_rtt_ms": max(offsets.rtt_ns) / 1e6}
        )
        self.clock_offsets = offsets
        self.exchange.offsets = offsets

    @property
    def _next_exchange(self) -> int:
        """The step the next exchange is issued at: the last one's plus the interval in force. A
        decision that changes the interval therefore counts it from the exchange that carried it
        (every rank adopts it at the same step, and the next exchange is at least a step away)."""
        return self._last_exchange + self.controller.exchange_every

    def _start_exchange(self, step: int) -> None:
        """After the first bucket of ``step`` was handed to its AllReduce: every ``K``-th step, issue
        the exchange of the last ``K`` steps' figures (complete since this step's first bucket).
        Issuing the two collectives took 0.3-3 ms of this thread's time (median about 1 ms, mostly
        waiting for a core: 8 ranks on 2 cores); done before the first bucket's AllReduce it
        delayed that AllReduce, here it runs while that AllReduce is on the wire. (What the
        exchange costs a step comes from the CPU its collectives take, not from where they are
        issued: before or after the first bucket, or from a thread of their own (a throwaway
        variant), single runs of ``profiling/bench_hook_overhead.py`` measured the same.)"""
        if self.world_size > 1 and step == self._next_exchange:
            first = self._last_exchange
            buckets = self.config.max_buckets
            arrivals = [self.profiler.step_arrival(s, buckets) for s in range(first, step)]
            decision = self._decision_to_ship()
            payload = self.exchange.pack(first, arrivals, self._speed, self._host, decision)
            self._pending = self.exchange.start(payload, first)
            self._shipped = decision
            self._last_exchange = step

    def explain_failure(self, step: int) -> str:
        """After a failed AllReduce at ``step``: which ranks did not reach it in time (module docstring).

        Each rank reports the step and when it entered that step's first AllReduce (rank 0's clock,
        through the start-up clock offsets). Named: ranks that do not report within
        ``REPORT_WAIT_S``, report an earlier step, or entered at least half the timeout after the
        first rank (they woke from a stall and failed in turn).
        """
        store = self._store
        if store is None or self.world_size == 1:
            return "no store to compare notes in: the rank at fault is unknown"
        keys = [f"reached/{r}" for r in range(self.world_size)]
        entries = [t.hook_wall_ns for t in self.profiler.buckets(step)]
        entered = (min(entries) if entries else time.time_ns()) + self.clock_offsets.offset_ns[self.rank]
        try:
            store.set(keys[self.rank], f"{step} {entered}")
            deadline = time.monotonic() + min(REPORT_WAIT_S, self.config.timeout)
            while True:
                reported = [r for r in range(self.world_size) if store.check([keys[r]])]
                if len(reported) == self.world_size or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            reports = {r: store.get(keys[r]).decode().split() for r in reported}
        except Exception as err:  # the store went down too (e.g. with rank 0, which usually hosts it)
            return f"the rendezvous store did not answer ({err}): the rank at fault is unknown"
        first = min(int(entered_ns) for _, entered_ns in reports.values())
        late_ns = self.config.timeout / 2 * 1e9
        named = [f"rank {r}" for r in range(self.world_size) if r not in reports]
        for r, (reached, entered_ns) in sorted(reports.items()):
            if int(reached) < step or int(entered_ns) - first >= late_ns:
                named.append(f"rank {r}")
        if not named:
            return f"every rank reached step {step} in time: the fault is in the network or the process group"
        return (
            f"{', '.join(named)} did not reach step {step}'s AllReduce in time (no report within "
            f"{REPORT_WAIT_S:g} s, or entered it {late_ns / 1e9:g} s or more after the first rank): "
            "stalled or dead; check its log"
        )

    def _bucket_to_probe(self) -> int:
        """This step's probe: the largest bucket of the previous step (-1: none). The same on every
        rank: the step number, DDP's buckets and the adopted plan and interval are.

        The probes come every ``controller.probe_every`` steps: rank 0 ships the interval with
        each decision, for the baseline (``allreduce`` only) and for a plan for degraded NICs
        (OptCC, the balanced ring) alike. Under such a plan not before the switch's settle and
        verification steps are over: the probe would lengthen a step that the verification
        measures."""
        cfg = self.config
        controller = self.controller
        plan = controller.plan
        if self.world_size < 3 or self.step < max(cfg.warmup_steps, 1):
            return -1
        if plan.runs_nic_plan:
            if self.step < controller.plan_start + cfg.settle_steps + cfg.verify_steps:
                return -1
        elif cfg.baseline != "allreduce":
            return -1  # another baseline measures the links in every run
        every = controller.probe_every  # the same on every rank: adopted from the last decision
        if every == 0 or self.step % every != 0:
            return -1
        previous = self.profiler.buckets(self.step - 1)
        if not previous:
            return -1
        largest = max(previous, key=lambda t: (t.nbytes, -t.bucket))
        return largest.bucket if largest.nbytes >= cfg.min_bucket_bytes else -1

    def _receive(self, pending: PendingExchange) -> None:
        rows = self.exchange.wait(pending)
        decision = self._shipped if self.rank == 0 else self.exchange.decision(rows)
        if decision is not None:
            self.controller.apply(decision)
            self.runtime.set_rank_map(decision.plan.rank_map(self.world_size))
        if self.rank == 0:
            steps = range(pending.first_step, pending.first_step + int(rows[0, 3]))
            sizes, algorithms = self._own_buckets(steps)
            apply_step = self._next_exchange + 1  # the decision travels with the next exchange
            if self._observer is None:
                self._observer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stragglerkit-controller")
            # off the critical path: the decision is needed only when the next exchange is issued
            self._observing = self._observer.submit(self._observe, rows, sizes, algorithms, apply_step, self.step)

    def _observe(
        self, rows: np.ndarray, sizes: list[int], algorithms: list[list[str]], apply_step: int, step: int
    ) -> Decision | None:
        try:
            return self.controller.observe(self.exchange.stats(rows, sizes, algorithms), apply_step)
        except Exception as err:  # a controller fault must not stop training: keep the plan, say so
            warnings.warn(f"stragglerkit controller failed at step {step}, plan kept: {err!r}", stacklevel=2)
            return None

    def _decision_to_ship(self) -> Decision | None:
        if self._observing is not None:
            self._decision_in_flight = self._observing.result()
            self._observing = None
        decision, self._decision_in_flight = self._decision_in_flight, None
        return decision

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


def ddp_hook(state: DDPState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` across the ranks with the controller's plan; see the module docstring.

    Example::

        ddp_model.register_comm_hook(stragglerkit.DDPState(None), stragglerkit.ddp_hook)
    """
    first = not state._step_open
    step = state.step
    if first:
        state._begin_step()
    future = _hand_off(state, bucket)
    if first:
        state._start_exchange(step)
    return future


def _hand_off(state: DDPState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Start ``bucket``'s AllReduce with this step's plan; the future DDP waits for."""
    tensor = bucket.buffer()
    index = bucket.index()
    timing = state.profiler.begin(state.step, index, tensor.numel() * tensor.element_size())
    if bucket.is_last():
        state.step += 1
        state._step_open = False
    if state.world_size == 1:
        state._finish(timing, "none", None)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(tensor)
        return done
    if timing.step < state.config.warmup_steps:
        return _plain(state, tensor, timing)
    plan = state.controller.plan
    algorithm = plan.algorithm_for(index)
    if index == state._probe_bucket and (algorithm == "allreduce" or algorithm in NIC_ALGORITHMS):
        algorithm = "ring"  # a probe: its links' timings re-measure each rank's NIC
    elif algorithm == "allreduce":
        return _plain(state, tensor, timing)
    slowdowns = dict(plan.slowdowns) if algorithm in NIC_ALGORITHMS else None
    straggler = plan.straggler if algorithm == "stragglar" else None
    handle = state.runtime.all_reduce_async(tensor, algorithm, "avg", straggler, slowdowns)
    result: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def finish(_: torch.futures.Future[torch.Tensor]) -> None:
        try:
            record = handle.wait(0)
            state._finish(timing, record.algorithm, record)
        except BaseException as err:  # the executor's error (naming a rank), and who stalled, go to DDP
            failure = StragglerKitError(f"{err}; {state.explain_failure(timing.step)}")
            result.set_exception(failure)  # type: ignore[arg-type]
            return
        result.set_result(tensor)

    handle.future.add_done_callback(finish)
    return result


# DDP checks the hook's annotations as objects; ``from __future__ import annotations`` made them strings.
ddp_hook.__annotations__ = {"state": DDPState, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def _plain(state: DDPState, tensor: torch.Tensor, timing: BucketTiming) -> torch.futures.Future[torch.Tensor]:
    tensor.div_(state.world_size)
    work = dist.all_reduce(tensor, group=state._allreduce_group, async_op=True)
    assert work is not None

    def finish(fut: torch.futures.Future[Any]) -> torch.Tensor:
        try:
            fut.wait()
        except Exception as err:
            raise StragglerKitError(
                f"stragglerkit all_reduce (the process group's own, bucket {timing.bucket} of step {timing.step}) "
                f"failed on rank {state.rank}: {state.explain_failure(timing.step)}; cause: {err}"
            ) from err
        state._finish(timing, "allreduce", None, queued=False)  # gloo may run it next to the others
        return tensor

    return work.get_future().then(finish)


def _report_store(index: int) -> dist.Store | None:
    """The rendezvous store under a prefix of this DDPState's own (``None`` if there is none)."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # initialised without a store the hook can reach
        return None
    return dist.PrefixStore(f"stragglerkit/ddp{index}", store)
