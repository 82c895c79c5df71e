"""The closed loop's side-group traffic: the stats exchange every ``K`` steps and the clock sync.

:class:`Exchange` issues the exchange of the last ``K`` steps' figures right after a step's first
bucket went to its AllReduce (the gather to rank 0 and the broadcast of rank 0's decision, on the
session's gloo side group; :class:`~stragglerkit.detect.exchange.StatsExchange` packs the
vector), receives it when the next step begins, and on rank 0 runs the controller's
:meth:`~stragglerkit.detect.controller.Controller.observe` on a background thread, off the
critical path: its decision rides on the next exchange. Every ``clock_sync_every`` steps it
measures the clock offsets to rank 0 again, at the start of a step, when nothing else is on the
side group.

What a checkpoint keeps of it: the step of the last exchange, the decision not yet shipped and
the latest clock re-measurements. A restored one is bound to a session with :meth:`Exchange.bind`.

Example::

    exchange = Exchange()
    exchange.bind(session, controller, buckets=32, fail=loop_fail)
    if exchange.due(step): exchange.start(step, arrivals, speed, host)
    decision = exchange.receive(step, adopt, own_buckets)    # the next step's first bucket
"""

from __future__ import annotations

import concurrent.futures
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from stragglerkit.detect.arrival import ClockOffsets, StepArrival, estimate_clock_offsets
from stragglerkit.detect.controller import Controller
from stragglerkit.detect.exchange import PendingExchange, StatsExchange
from stragglerkit.errors import PeerError
from stragglerkit.plans import Decision
from stragglerkit.session import Session
from stragglerkit.sim.cost_model import CostModelParams
from stragglerkit.telemetry import nvtx

__all__ = ["Exchange"]

Fail = Callable[[str, int, BaseException], PeerError]
"""The loop's fault: ``fail(what, step, cause)`` names who did not reach ``step``."""
OwnBuckets = Callable[[range], tuple[list[int], list[list[str]]]]
"""Rank 0's own bucket sizes and per-step algorithms of those steps (the loop's profiler)."""


class Exchange:
    """The stats exchange and clock sync of one loop (see the module docstring)."""

    __slots__ = (  # noqa: RUF023 (grouped: what a checkpoint keeps, then the binding's)
        "clock_syncs",
        "decision_in_flight",
        "last_exchange",
        "_controller",
        "_fail",
        "_observer",
        "_observing",
        "_pending",
        "_shipped",
        "_shipped_model",
        "clock_offsets",
        "stats",
    )

    def __init__(self, last_exchange: int = 0, decision_in_flight: Decision | None = None) -> None:
        self.last_exchange = last_exchange
        """The step the last exchange was issued at."""
        self.decision_in_flight = decision_in_flight
        """Rank 0: the controller's decision that the next exchange ships."""
        self.clock_syncs: deque[dict[str, Any]] = deque(maxlen=64)
        """The latest clock re-measurements: ``{"step", "largest_shift_ms", "largest_rtt_ms"}``."""
        self._controller: Controller | None = None
        self._observer: concurrent.futures.ThreadPoolExecutor | None = None
        self._observing: concurrent.futures.Future[Decision | None] | None = None
        self._pending: PendingExchange | None = None
        self._shipped: Decision | None = None
        self._shipped_model: CostModelParams | None = None

    def bind(self, session: Session, controller: Controller, buckets: int, fail: Fail) -> None:
        """Use ``session``'s side group and clock offsets for ``controller``'s figures."""
        self._controller = controller
        self._fail = fail
        self.stats = StatsExchange(session.side_group, session.world_size, session.rank, buckets)
        self.clock_offsets: ClockOffsets = session.clock_offsets
        """Per rank: add to its wall clock (ns) for rank 0's; re-measured every ``clock_sync_every`` steps."""
        self.stats.offsets = self.clock_offsets

    @property
    def controller(self) -> Controller:
        assert self._controller is not None, "the exchange is not bound"
        return self._controller

    @property
    def in_flight(self) -> bool:
        """Was an exchange issued that was not received yet?"""
        return self._pending is not None

    @property
    def next_step(self) -> int:
        """The step the next exchange is issued at: the last one's plus the interval in force (a
        decision that changes the interval counts it from the exchange that carried it)."""
        return self.last_exchange + self.controller.exchange_every

    def due(self, step: int) -> bool:
        return self.stats.world_size > 1 and step == self.next_step

    def start(self, step: int, arrivals: list[StepArrival | None], speed: float, host: int) -> None:
        """Issue the exchange of ``arrivals`` (the steps since the last one) with rank 0's decision."""
        self.join()
        decision, self.decision_in_flight = self.decision_in_flight, None
        model = self._fitted_model()
        with nvtx.range(nvtx.EXCHANGE):
            payload = self.stats.pack(self.last_exchange, arrivals, speed, host, decision, model)
            self._pending = self.stats.start(payload, self.last_exchange)
        self._shipped = decision
        self._shipped_model = model
        self.last_exchange = step

    def _fitted_model(self) -> CostModelParams | None:
        """Rank 0: the controller's fitted cost model (its thread is joined), ``None`` before a fit."""
        if self.stats.rank != 0:
            return None
        model = self.controller.model
        return model.config if model.fit_info.get("fitted") else None

    def receive(
        self,
        step: int,
        adopt: Callable[[Decision], None],
        own_buckets: OwnBuckets,
        adopt_model: Callable[[CostModelParams], None] | None = None,
    ) -> None:
        """Wait for the exchange in flight (complete by now), ``adopt`` rank 0's decision and
        ``adopt_model`` its fitted cost model on every rank, and on rank 0 hand the figures to the
        controller's thread."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            rows = self.stats.wait(pending)
        except Exception as err:
            raise self._fail(f"stragglerkit stats exchange (issued at step {self.last_exchange})", step, err) from err
        rank0 = self.stats.rank == 0
        decision = self._shipped if rank0 else self.stats.decision(rows)
        if decision is not None:
            adopt(decision)
        model = self._shipped_model if rank0 else self.stats.fitted_model(rows)
        if model is not None and adopt_model is not None:
            adopt_model(model)
        if rank0:
            steps = range(pending.first_step, pending.first_step + int(rows[0, 3]))
            sizes, algorithms = own_buckets(steps)
            apply_step = self.next_step + 1  # the decision travels with the next exchange
            if self._observer is None:
                self._observer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stragglerkit-controller")
            # off the critical path: the decision is needed only when the next exchange is issued
            self._observing = self._observer.submit(self._observe, rows, sizes, algorithms, apply_step, step)

    def _observe(
        self, rows: np.ndarray, sizes: list[int], algorithms: list[list[str]], apply_step: int, step: int
    ) -> Decision | None:
        try:
            return self.controller.observe(self.stats.stats(rows, sizes, algorithms), apply_step)
        except Exception as err:  # a controller fault must not stop training: keep the plan, say so
            warnings.warn(f"stragglerkit controller failed at step {step}, plan kept: {err!r}", stacklevel=2)
            return None

    def join(self) -> None:
        """Rank 0: wait for the controller's digest of the last exchange (its decision ships next)."""
        if self._observing is not None:
            self.decision_in_flight = self._observing.result()
            self._observing = None

    def sync_clocks(self, session: Session, step: int) -> None:
        """Measure the clock offsets to rank 0 again (every rank, the same step)."""
        try:
            offsets = estimate_clock_offsets(session.side_group)
        except Exception as err:
            raise self._fail("stragglerkit clock sync", step, err) from err
        shift = max(abs(a - b) for a, b in zip(offsets.offset_ns, self.clock_offsets.offset_ns))
        self.clock_syncs.append(
            {"step": step, "largest_shift_ms": shift / 1e6, "largest_rtt_ms": max(offsets.rtt_ns) / 1e6}
        )
        self.clock_offsets = offsets
        self.stats.offsets = offsets

    def close(self, failed: bool) -> None:
        """Wait for the exchange in flight (its error unless the loop ``failed`` already) and stop
        the controller's thread."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            try:
                self.stats.wait(pending)
            except Exception:
                if not failed:
                    raise
        if self._observer is not None:
            self.join()
            self._observer.shutdown()
            self._observer = None
