"""The selective-reduce paper's experiment: trace-driven, event-driven training of n workers.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Section IV-A (setting, metrics) and IV-B-1 (results, Figs. 5-7).

How it works. Each worker loops: compute one iteration (a time drawn from the workload's
distribution), report ready, wait until the controller puts it in a group, take part in that
group's ring AllReduce, compute again. A discrete-event loop (a heap of timed events) drives one
controller per method with the library's own event types (``WorkerReady``, ``SyncDone``, ``Tick``):

* ``selective``: :class:`~stragglerkit.selective.SelectiveReduceController` (BAG, BPAWR, Algorithm 3)
  with a warm-start progress model (the paper's main results assume the distribution is known);
* ``partial``: :class:`~stragglerkit.selective.PartialReduceController`, the queue of ``p``;
* ``allreduce``: the same queue with ``p = n`` (everyone waits for the slowest).

A group's synchronisation takes Eq. (2) exactly (:func:`~stragglerkit.selective.ring_time`):
``2(m-1) alpha + 2 (m-1)/m x v / min b`` for ``m`` workers. Groups are disjoint and the paper's
switch is non-blocking with contention only at the edges, so concurrent groups never share a link
and the flow-level simulator's max-min sharing reduces to this formula; it is not run per flow.

The setting (Section IV-A): bandwidth ``round(20u, 3)`` Gbit/s with ``u ~ U[0.05, 1]`` per worker
(uplink = downlink), ``alpha = 1 ms``, ``v = 500 MB`` (500e6 bytes), ``p = 0.3 n``, ``eta = 0.3``,
``theta = 1``, 100 s of training. Each trial draws one set of bandwidths and one matrix of compute
times (worker x iteration) and runs all three methods on them (common random numbers), so the
ratios between methods are paired. Everything comes from ``numpy.random.default_rng((seed, n,
trial))``: a result is a function of its arguments.

What the paper leaves open, and the choices here:

* *The compute-time distributions.* Fig. 1 is described, not tabulated. ``resnet50`` (cloud
  performance variability on a fixed workload): a tight body, ``0.4 s x lognormal(sigma 0.05)``,
  plus, in 10 % of iterations, an extra ``Exp(mean 0.3 s)`` (a disturbed server). ``transformer``
  (sentences of varying length): a broad unimodal spread, ``Gamma(shape 4, mean 0.5 s)``, floored at
  0.1 s. ``--compute-scale`` multiplies either; docs/selective.md shows how results move with it.
* *The waiting slot* ``dt``: not given; 10 ms (the library's default, ``SelectiveConfig.dt``).
* *Full rounds* ``c``: not used in the experiment's description; ``None`` (every round partial).
* *Eq. (4)*: ``progress="paper"`` (default here) uses ``F(t + dt)`` as the paper writes it;
  ``"conditional"`` the conditional probability the library defaults to.
* *Metrics* (Section IV-A). Average sync time: mean duration of the synchronisations that finished
  within the run (the AllReduce itself, not the wait before it; ``ready_wait_s`` reports that).
  Average sync scale: their mean group size. Total sync: their number. Total iterations: training
  iterations finished by all workers within the run. Wasted wait time: a worker in a group of at
  least ``p`` that BPAWR holds waits, slot by slot, until its group launches; if no worker that
  became ready after its first hold is in the group it finally launches with ("no newly ready
  workers join finally"), all that held time was wasted. Summed over workers, reported per worker
  (total / n), in seconds; workers still held when the run ends are not counted.

Example::

    from stragglerkit.sim.selective import SimSetting, run_trial
    metrics = run_trial(SimSetting(world_size=40), trial=0)
    metrics["selective"].avg_sync_time < metrics["partial"].avg_sync_time    # usually
"""

from __future__ import annotations

import heapq
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from stragglerkit.errors import ConfigError
from stragglerkit.grouping import (
    PartialReduceController,
    ProgressModel,
    SelectiveConfig,
    SelectiveReduceController,
    Sync,
    SyncDone,
    Tick,
    WorkerReady,
    ring_time,
)

__all__ = [
    "METHODS",
    "METRICS",
    "PAPER_RATIOS",
    "WORKLOADS",
    "Metrics",
    "SimSetting",
    "run_method",
    "run_table",
    "run_trial",
    "summarise",
]

METHODS = ("selective", "partial", "allreduce")
"""The three synchronisation schemes of the paper's Figs. 5-7."""

METRICS = ("avg_sync_time", "avg_sync_scale", "total_sync", "total_iterations", "wasted_wait", "ready_wait")
"""The paper's five metrics, plus the mean wait from ready to launch (for explanations)."""

PAPER_RATIOS = {
    "avg_sync_time": (1.89, 2.55),
    "avg_sync_scale": (1.19, 1.25),
    "total_iterations": (1.10, 1.17),
}
"""Section IV-B-1: selective over partial reduce (sync time: partial's / selective's; the others
selective's / partial's), both traces, n = 40..200."""

Sampler = Callable[[np.random.Generator, tuple[int, int]], np.ndarray]


def _resnet50(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    body = 0.4 * rng.lognormal(0.0, 0.05, shape)
    disturbed = rng.random(shape) < 0.10
    return body + disturbed * rng.exponential(0.3, shape)


def _transformer(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return np.maximum(rng.gamma(4.0, 0.5 / 4.0, shape), 0.1)


WORKLOADS: dict[str, tuple[Sampler, str]] = {
    "resnet50": (_resnet50, "0.4 s x lognormal(0, 0.05), +Exp(mean 0.3 s) in 10 % of iterations"),
    "transformer": (_transformer, "Gamma(shape 4, mean 0.5 s), floored at 0.1 s"),
}
"""Compute-time distributions standing in for the paper's Fig. 1 (see the module docstring)."""


@dataclass(kw_only=True, slots=True)
class SimSetting:
    """One point of the experiment; defaults are the paper's Section IV-A."""

    world_size: int
    """``n``, the number of workers."""
    workload: str = "transformer"
    """A key of :data:`WORKLOADS`."""
    compute_scale: float = 1.0
    """Multiplies every compute time (sensitivity to the distribution's scale)."""
    p_fraction: float = 0.3
    """``p = max(1, round(p_fraction x n))``."""
    eta: float = 0.3
    theta: float = 1.0
    dt: float = 0.01
    """The waiting slot, seconds."""
    alpha: float = 1e-3
    """Latency per ring step, seconds."""
    model_bytes: float = 500e6
    bandwidth_floor: float = 0.05
    """``lambda`` of ``u ~ U[lambda, 1]``."""
    max_gbit: float = 20.0
    duration: float = 100.0
    """Seconds of training simulated."""
    seed: int = 0
    progress: Literal["paper", "conditional"] = "paper"
    """Eq. (4) as written (``F(t+dt)``) or the conditional probability."""
    warm_samples: int = 2000
    """Iteration times the warm-start progress model is given."""

    def __post_init__(self) -> None:
        n = self.world_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ConfigError(f"world_size must be a whole number of workers >= 2, got {n!r}")
        if self.workload not in WORKLOADS:
            raise ConfigError(f"unknown workload {self.workload!r}; choose from {', '.join(WORKLOADS)}")
        if not 0 < self.p_fraction <= 1:
            raise ConfigError(
                f"p_fraction must be in (0, 1] (p = p_fraction x n; 0.3 in the paper), got {self.p_fraction!r}"
            )
        for name in ("compute_scale", "duration", "model_bytes", "max_gbit"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be positive, got {value!r}")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ConfigError(f"alpha must be seconds >= 0, got {self.alpha!r}")
        if not 0 < self.bandwidth_floor <= 1:
            raise ConfigError(f"bandwidth_floor (lambda) must be in (0, 1], got {self.bandwidth_floor!r}")
        if self.progress not in ("paper", "conditional"):
            raise ConfigError(f"progress must be 'paper' or 'conditional', got {self.progress!r}")
        self.config()  # eta, theta, dt and p <= n checked by SelectiveConfig

    @property
    def p(self) -> int:
        return max(1, round(self.p_fraction * self.world_size))

    def config(self) -> SelectiveConfig:
        """The controller's parameters (``c = None``, no timeout within the run)."""
        config = SelectiveConfig(
            p=self.p,
            eta=self.eta,
            theta=self.theta,
            dt=self.dt,
            c=None,
            model_bytes=self.model_bytes,
            worker_timeout=max(10.0 * self.duration, 2 * self.dt),
        )
        config.check_world(self.world_size)
        return config


@dataclass(slots=True)
class Metrics:
    """One method's figures for one trial (Section IV-A's metrics)."""

    avg_sync_time: float
    """Mean seconds per finished synchronisation (the AllReduce itself)."""
    avg_sync_scale: float
    """Mean workers per finished synchronisation."""
    total_sync: int
    """Synchronisations finished within the run."""
    total_iterations: int
    """Training iterations finished by all workers within the run."""
    wasted_wait: float
    """Seconds per worker held by BPAWR in vain: no newly ready worker joined (0 for the baselines)."""
    ready_wait: float
    """Mean seconds from a worker's ready report to its group's launch, over launched workers."""
    sync_scales: list[int] = field(default_factory=list, repr=False)
    """Each finished synchronisation's group size (for tests)."""


class _Trace:
    """A trial's bandwidths (bytes/s) and compute times, drawn once and shared by the methods."""

    __slots__ = ("_blocks", "_rng", "_sampler", "bandwidth", "gbit", "setting", "warm")

    def __init__(self, setting: SimSetting, trial: int) -> None:
        self.setting = setting
        rng = np.random.default_rng((setting.seed, setting.world_size, trial))
        n = setting.world_size
        u = rng.uniform(setting.bandwidth_floor, 1.0, n)
        self.gbit = np.round(setting.max_gbit * u, 3)
        self.bandwidth = {w: float(self.gbit[w]) * 1e9 / 8 for w in range(n)}
        sampler = WORKLOADS[setting.workload][0]
        self._sampler: Sampler = lambda r, shape: setting.compute_scale * sampler(r, shape)
        self.warm = [float(x) for x in self._sampler(rng, (1, setting.warm_samples))[0]]
        self._rng = rng
        self._blocks: list[np.ndarray] = []

    def compute(self, worker: int, iteration: int) -> float:
        """Seconds of the worker's ``iteration``-th (0-based) compute; the same for every method."""
        block, row = divmod(iteration, 64)
        while block >= len(self._blocks):
            self._blocks.append(self._sampler(self._rng, (self.setting.world_size, 64)))
        return float(self._blocks[block][worker, row])


_READY, _DONE = 1, 0  # at equal times a finished sync is handled before a ready report


def run_method(
    method: str,
    setting: SimSetting,
    trial: int = 0,
    trace: _Trace | None = None,
    launched: list[Sync] | None = None,
) -> Metrics:
    """Simulate one method for ``setting.duration`` seconds of training; returns its metrics.

    ``launched``: if given, every synchronisation launched is appended to it (for inspection).
    """
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    trace = trace if trace is not None else _Trace(setting, trial)
    n, horizon = setting.world_size, setting.duration
    bandwidth = trace.bandwidth
    config = setting.config()
    selective: SelectiveReduceController | None = None
    controller: SelectiveReduceController | PartialReduceController
    if method == "selective":
        progress = ProgressModel.warm(trace.warm, formula=setting.progress)
        selective = SelectiveReduceController(config, n, bandwidth, progress)
        controller = selective
    else:
        controller = PartialReduceController(n, n if method == "allreduce" else config.p, worker_timeout=None)
    p = config.p

    events: list[tuple[float, int, int, int]] = []  # (time, kind, sequence, worker or sync id)
    sequence = 0
    iterations = [0] * n
    ready_at = [0.0] * n
    for w in range(n):
        heapq.heappush(events, (trace.compute(w, 0), _READY, sequence, w))
        sequence += 1
    running: dict[int, tuple[Sync, float]] = {}
    durations: list[float] = []
    scales: list[int] = []
    waits: list[float] = []
    wasted = 0.0
    held: list[int] = []  # members of the groups BPAWR held at the latest decision
    held_at = 0.0  # when that decision was made
    held_first: dict[int, float] = {}  # worker -> when a held group first included it
    held_for: dict[int, float] = {}  # worker -> seconds it has spent in held groups since then

    def note_decision(now: float) -> None:
        nonlocal held_at
        assert selective is not None
        for w in held:  # the slot since the previous decision, for those held then
            held_for[w] = held_for.get(w, 0.0) + (now - held_at)
        held.clear()
        held_at = now
        for group, verdict in selective.last_verdicts:
            if verdict.wait and len(group) >= p:
                held.extend(group)
                for w in group:
                    held_first.setdefault(w, now)

    def settle_launched(sync: Sync) -> None:
        """A held worker's slots were wasted if no worker ready after its first hold joined its group."""
        nonlocal wasted
        for w in sync.workers:
            first = held_first.pop(w, None)
            if first is None:
                continue
            seconds = held_for.pop(w, 0.0)
            if not any(ready_at[x] > first for x in sync.workers):
                wasted += seconds

    queued = 0  # len(controller.ready), kept here to avoid copying the queue each event
    deadline = math.inf  # the selective controller's next decision without a ready worker

    def launch(syncs: list[Sync], now: float) -> None:
        nonlocal sequence, queued
        for sync in syncs:
            queued -= len(sync.workers)
            if launched is not None:
                launched.append(sync)
            took = ring_time(sync.workers, bandwidth, setting.model_bytes, setting.alpha)
            running[sync.id] = (sync, took)
            waits.extend(now - ready_at[w] for w in sync.workers)
            if selective is not None:
                settle_launched(sync)
            heapq.heappush(events, (now + took, _DONE, sequence, sync.id))
            sequence += 1

    while True:
        next_event = events[0][0] if events else math.inf
        # Below p a decision pass decides nothing, so no tick is needed (it would change nothing).
        tick_at = deadline if selective is not None and queued >= p else math.inf
        now = min(next_event, tick_at)
        if now > horizon:
            break
        if tick_at < next_event:
            launch(controller.step(Tick(now)), now)
            deadline = now + setting.dt
            note_decision(now)
            continue
        _, kind, _, ident = heapq.heappop(events)
        if kind == _READY:
            iterations[ident] += 1
            ready_at[ident] = now
            queued += 1
            launch(controller.step(WorkerReady(ident, now)), now)
            if selective is not None:
                deadline = now + setting.dt
                note_decision(now)
        else:
            sync, took = running.pop(ident)
            durations.append(took)
            scales.append(len(sync.workers))
            launch(controller.step(SyncDone(ident, now)), now)
            for w in sync.workers:
                heapq.heappush(events, (now + trace.compute(w, iterations[w]), _READY, sequence, w))
                sequence += 1
    return Metrics(
        avg_sync_time=statistics.fmean(durations) if durations else math.nan,
        avg_sync_scale=statistics.fmean(scales) if scales else math.nan,
        total_sync=len(durations),
        total_iterations=sum(iterations),
        wasted_wait=wasted / n,
        ready_wait=statistics.fmean(waits) if waits else math.nan,
        sync_scales=scales,
    )


def run_trial(setting: SimSetting, trial: int, methods: Sequence[str] = METHODS) -> dict[str, Metrics]:
    """All ``methods`` on one trial's bandwidths and compute times."""
    trace = _Trace(setting, trial)
    return {method: run_method(method, setting, trial, trace) for method in methods}


def _spread(values: Iterable[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"min": ordered[0], "median": statistics.median(ordered), "max": ordered[-1]}


def summarise(trials: Sequence[dict[str, Metrics]]) -> dict[str, Any]:
    """Minimum / median / maximum over trials of each method's metrics, and of the paired ratios
    selective : partial (sync time as partial / selective, so that > 1 is better, like the paper's)."""
    out: dict[str, Any] = {"methods": {}, "ratios": {}}
    methods = list(trials[0])
    for method in methods:
        out["methods"][method] = {m: _spread(getattr(t[method], m) for t in trials) for m in METRICS}
    if "selective" in methods and "partial" in methods:
        for metric in PAPER_RATIOS:
            pairs = []
            for t in trials:
                s, q = getattr(t["selective"], metric), getattr(t["partial"], metric)
                pairs.append(q / s if metric == "avg_sync_time" else s / q)
            out["ratios"][metric] = _spread(pairs)
    return out


def run_table(
    world_sizes: Sequence[int],
    trials: int,
    base: SimSetting,
    methods: Sequence[str] = METHODS,
    progress_out: Any = sys.stderr,
) -> list[dict[str, Any]]:
    """The experiment's table: one row per ``n``, each summarising ``trials`` trials of ``base`` at that ``n``.

    Prints one progress line per ``n`` to ``progress_out`` (``None``: quiet).
    """
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ConfigError(f"trials must be a whole number >= 1, got {trials!r}")
    rows = []
    for n in world_sizes:
        setting = SimSetting(**{**asdict(base), "world_size": n})
        started = time.perf_counter()
        results = [run_trial(setting, trial, methods) for trial in range(trials)]
        row = {"world_size": n, "p": setting.p, "trials": trials, **summarise(results)}
        rows.append(row)
        if progress_out is not None:
            took = time.perf_counter() - started
            print(f"  {setting.workload} n={n}: {trials} trials in {took:.1f} s", file=progress_out, flush=True)
    return rows
