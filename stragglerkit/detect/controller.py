"""The closed loop: from gathered statistics to one plan, the same on every rank, verified after use.

What it decides and why.

* **One decider.** Rank 0 fits the cost model (:mod:`stragglerkit.detect.model`), runs the
  detector (:mod:`stragglerkit.detect.detector`) and chooses the plan. Its decision travels in
  the next stats exchange, so every rank receives it at the same step and switches there.
  Deterministic recomputation on every rank would also agree -- until two machines round one
  float differently; one decider cannot disagree with itself.
* **The plan** names an algorithm per bucket (by DDP bucket index) plus who is late or slow. For
  a confirmed straggler ``s`` every bucket of at least ``min_bucket_bytes`` gets StragglAR if the
  model, given that bucket's measured delay, predicts it at least ``min_gain`` faster than the
  baseline; for degraded ranks OptCC or the balanced ring likewise (the faster in the model),
  given their ``l``. Only algorithms whose predicate accepts the situation are considered
  (StragglAR: even n >= 4; OptCC: n >= 3 with more healthy than degraded ranks), so the plan
  never names one that does not apply.
* **Remapping.** StragglAR is built with the straggler as logical rank n-1, OptCC and the
  balanced ring with the degraded ranks last: the plan's rank map says which group rank plays
  each logical rank, so the schedule (and its cache entry) is the same whoever is late.
* **Verification.** ``settle_steps`` after a switch the controller measures ``verify_steps``
  steps by the *step period*: from the last rank's finish of one step's AllReduce to the last
  rank's finish of the next (wall clocks made comparable by the start-up offsets). That is the
  training step as the user sees it, compute and overlap included: a plan whose AllReduce is
  faster but whose CPU work slows the ranks' backward pass does not pass. The AllReduce part (last
  arrival to last finish) is recorded next to it, as the figure the predictions are about.
  Without wall-clock figures the AllReduce part is judged (the smallest step time over the
  ranks). If the median after the switch is not below the median of the window before it by
  ``rollback_margin``, the switch did not pay: the previous plan comes back (``rollback``) and the
  rejected plan is not tried again for ``cooldown_steps``; otherwise the plan stays and a
  ``verified`` event records the same measurements.
* **Events.** Every decision is an event dict ``{"step", "kind", "algorithm", "evidence"}``
  (``step``: the first step under the resulting plan) on ``Controller.events`` and, on rank 0,
  in the JSONL log; ranks other than 0 record the same kinds with the plan as evidence.

Example::

    controller = Controller(world_size=4, rank=dist.get_rank(), config=ControllerConfig())
    decision = controller.observe(stats, apply_step=step + config.exchange_every)   # rank 0
    controller.apply(decision, step)                                               # every rank
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stragglerkit.detect.detector import Detector, DetectorConfig, Finding
from stragglerkit.detect.model import BASELINES, OnlineModel
from stragglerkit.detect.nic_health import server_slowdowns, slowdowns_from_links, slowdowns_from_speeds
from stragglerkit.schedules.registry import NIC_ALGORITHMS, Situation, why_not
from stragglerkit.sim.cost_model import CostModel

__all__ = [
    "ALGORITHM_CODES",
    "ALLREDUCE_PART",
    "BASELINE_CHOICES",
    "EVENT_KINDS",
    "STEP_PERIOD",
    "Controller",
    "ControllerConfig",
    "Decision",
    "Plan",
    "WindowStats",
    "log_path_for",
]

ALGORITHM_CODES = ("allreduce", "ring", "rhd", "direct", "stragglar", "optcc", "balanced_ring")
"""Algorithms as numbers for the stats exchange (``allreduce``: the process group's own)."""
BASELINE_CHOICES = ("allreduce", *BASELINES)
"""What ``ControllerConfig.baseline`` may name (``allreduce``: the process group's own)."""
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
)


@dataclass(kw_only=True, slots=True)
class ControllerConfig:
    """Everything the loop can be tuned by; the defaults are documented in docs/detection.md."""

    warmup_steps: int = 10
    """Steps run with the process group's own all_reduce before the controller's plans."""
    exchange_every: int = 2
    """K: steps between stats exchanges (a small gather to rank 0 and a broadcast, off the critical
    path) while anything is in question; ``quiet_exchange_every`` once all is quiet."""
    quiet_exchange_every: int = 6
    """The exchange interval once all is quiet: the baseline runs, nothing is believed wrong, no
    rank was last in ``detector.clear_fraction`` of the window's steps with a median delay of
    ``detector.clear_delay_ratio`` times the critical delay (no straggler suspect), and, with the
    ``allreduce`` baseline, the probes have backed off (``quiet_probe_every``). Any of these ending
    brings back ``exchange_every`` with rank 0's next decision. Each exchange carries the figures
    of every step since the previous one, so nothing goes unseen: the interval sets how often the
    collectives run (on 8 ranks sharing 2 cores the exchange every 2nd step cost about 1.2 % of the
    training step) and how soon rank 0 hears of a change. A straggler that appears while quiet is
    a suspect at the first quiet exchange that carries ``clear_fraction`` of a window of its late
    steps, and the short interval is back before the window holds the ``fraction`` that detects
    it, for intervals up to about ``(fraction - clear_fraction) x window`` (6 for the defaults; the
    detection test covers every phase). 0, or equal to ``exchange_every``: never lengthen."""
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    """W, q, hysteresis and the degraded thresholds."""
    baseline: str = "allreduce"
    """Algorithm used when nothing is detected: ``allreduce`` (the process group's own, what plain
    DDP runs, so the hook costs nothing when nothing is wrong), or stragglerkit's ring, rhd or direct."""
    probe_every: int = 8
    """With the ``allreduce`` baseline: every ``probe_every``-th step after warm-up the largest
    bucket runs stragglerkit's ring instead, whose per-op timings measure each link's rate (NIC
    health, degraded ranks) and feed the cost model. 0: no probes (degraded NICs are then found
    from sysfs link speeds only). Ignored with another baseline (every run measures). A probe step
    costs about 10-20 % more on a gloo CPU cluster (bench --mode train): this is the interval while
    the links are in question (from warm-up on, and whenever the alarm below goes off); once they
    have proven healthy the probes back off to ``quiet_probe_every``."""
    quiet_probe_every: int = 64
    """The probe interval once the links have proven healthy: over the last ``quiet_after`` probes
    the median of each probe's largest ``l`` is below ``detector.degraded_threshold`` (a median,
    because one probe on a loaded host can read a healthy link as slow), nothing is believed wrong
    and the baseline runs. A multiple of ``probe_every`` (the probe steps stay aligned); 0: never
    back off. A quiet probe that reads a slow link brings back ``probe_every``; if the next probe
    reads the links healthy, the probes back off again at once (the reading was noise)."""
    plan_probe_every: int = 64
    """While a plan for degraded NICs runs (OptCC, the balanced ring): every
    ``plan_probe_every``-th step the largest bucket runs stragglerkit's ring instead (after the
    switch's settle and verification steps), so that ``l`` is measured again: a NIC that recovers
    is cleared by the detector (median ``l`` below ``detector.clear_degraded_threshold``) and the
    plan returns to the baseline. Each probe costs what the ring loses to the plan on that bucket,
    once per this many steps. 0: no probes while such a plan runs (a NIC that recovers is then
    never noticed). A probe that reads a planned rank's ``l`` off the plan's (by
    ``replan_ratio``, or below ``detector.degraded_threshold``) brings the probes to
    ``probe_every`` until the readings settle: a recovered NIC is cleared, and one that changed
    gets a plan for its new ``l``, within a few short intervals instead of a few long ones."""
    replan_ratio: float = 1.25
    """While a plan for degraded NICs runs: it is rebuilt for the ranks' current ``l`` when every
    estimate in the detector's window reads a planned rank's ``l`` more than this factor above or
    below the plan's (a NIC that degraded further, or recovered in part). Single readings of one NIC vary by
    about 15 % (docs/detection.md), so a smaller factor would rebuild on noise."""
    clock_sync_every: int = 256
    """Steps between re-measurements of the clock offsets to rank 0 (the start-up ping-pong again,
    at the start of the step, on the hook's side group: about ``8(n-1)`` round trips, a few ms on
    8 hosts). Hosts' clocks drift apart and NTP may step them, and the busy-period NIC estimate
    pairs a send on one host with a receive on another: an offset that is off by a fraction of one
    message's time (3 ms for a 400 KB piece at 1 Gbit/s) reads the link wrong. 0: start-up only."""
    quiet_after: int = 4
    """Probes (none of them while something was believed wrong) judged before the probes back off."""
    probe_alarm: float = 1.3
    """While backed off, probing returns to ``probe_every`` when the median AllReduce time (last
    arrival to last finish) of the last ``alarm_steps`` steps without a probe exceeds this times
    its median when the probes backed off: a NIC that degrades slows every step's AllReduce."""
    alarm_steps: int = 4
    """Steps (without a probe) whose median the alarm compares."""
    healthy_memory_steps: int = 256
    """The probes do not back off while the AllReduce (median of the last ``alarm_steps`` steps
    without a probe) takes over ``probe_alarm`` times the lowest such median of the last this many
    steps: links that the probes read as healthy while every AllReduce got that much slower are not
    trusted (single probes on a loaded host read a NIC at 1/2 as l = 1.3-1.6). After this many
    steps a lasting slowdown that no probe can pin down becomes the new normal and the probes may
    back off."""
    min_gain: float = 0.05
    """A plan must be predicted to save at least this fraction of the baseline's time."""
    min_bucket_bytes: int = 64 * 1024
    """Smaller buckets keep the baseline (straggler-aware plans do not pay on latency-bound buckets)."""
    settle_steps: int = 2
    """Steps after a switch that are not measured (plan generation, first use of connections)."""
    verify_steps: int = 8
    """Steps measured after a switch before judging it."""
    rollback_margin: float = 0.0
    """Roll back unless the measured time after a switch is below (1 - margin) x the time before."""
    cooldown_steps: int = 200
    """A rolled-back plan is not tried again for this many steps."""
    max_buckets: int = 32
    """Bucket indices tracked per step (later buckets always run the plan's default algorithm)."""
    timeout: float = 300.0
    """Seconds a rank waits for a peer before the step fails with an error naming it."""
    prior: CostModel.Config = field(default_factory=lambda: CostModel.Config(alpha=50e-6, beta=1 / 1.25e9))
    """Cost model until the first fit (alpha 50 us, 10 Gbit/s)."""
    fit_samples: int = 256
    """Most recent baseline AllReduces kept for fitting."""

    @property
    def probes_back_off(self) -> bool:
        """Do the baseline's probes back off (``allreduce`` baseline, probes on, a longer quiet interval)?"""
        quiet, busy = self.quiet_probe_every, self.probe_every
        return self.baseline == "allreduce" and busy > 0 and quiet not in (0, busy)

    def __post_init__(self) -> None:
        for name in (
            "warmup_steps",
            "settle_steps",
            "cooldown_steps",
            "probe_every",
            "quiet_probe_every",
            "plan_probe_every",
            "clock_sync_every",
            "quiet_exchange_every",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"ControllerConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "exchange_every",
            "verify_steps",
            "max_buckets",
            "fit_samples",
            "quiet_after",
            "alarm_steps",
            "healthy_memory_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ControllerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.baseline not in BASELINE_CHOICES:
            raise ValueError(
                f"ControllerConfig.baseline must be one of {', '.join(BASELINE_CHOICES)}, got {self.baseline!r}"
            )
        if not 0 <= self.min_gain < 1 or not 0 <= self.rollback_margin < 1:
            raise ValueError("ControllerConfig.min_gain and rollback_margin must be in [0, 1)")
        if self.quiet_exchange_every and self.quiet_exchange_every < self.exchange_every:
            raise ValueError(
                f"ControllerConfig.quiet_exchange_every ({self.quiet_exchange_every}) must be at least "
                f"exchange_every ({self.exchange_every}), or 0 to never lengthen the interval"
            )
        quiet, busy = self.quiet_probe_every, self.probe_every
        if quiet and busy and (quiet % busy or quiet < busy):
            raise ValueError(
                f"ControllerConfig.quiet_probe_every ({quiet}) must be a multiple of probe_every ({busy}) "
                "that is at least as large, or 0 to never back off"
            )
        if not self.replan_ratio > 1:
            raise ValueError(f"ControllerConfig.replan_ratio must be above 1 (a factor), got {self.replan_ratio}")
        if not self.probe_alarm > 1:
            raise ValueError(f"ControllerConfig.probe_alarm must be above 1 (a factor), got {self.probe_alarm}")
        if not self.timeout > 0:
            raise ValueError(f"ControllerConfig.timeout must be positive seconds, got {self.timeout}")


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


class Controller:
    """Plans, decisions and events; rank 0 decides (see the module docstring)."""

    __slots__ = (
        "_blocked",
        "_bucket_window",
        "_checking",
        "_ends",
        "_exchange_event",
        "_exchange_target",
        "_last_doubt",
        "_last_finish",
        "_last_sizes",
        "_lateness",
        "_log_path",
        "_periods",
        "_plain_tails",
        "_plan_checking",
        "_plan_start",
        "_planned_for",
        "_probe_event",
        "_probe_maxima",
        "_probe_target",
        "_quiet_since",
        "_readings",
        "_seq",
        "_step_times",
        "_tail_medians",
        "_tail_reference",
        "_verify",
        "config",
        "detector",
        "events",
        "exchange_every",
        "model",
        "plan",
        "probe_every",
        "rank",
        "world_size",
    )

    def __init__(self, world_size: int, rank: int, config: ControllerConfig, log_path: str | None = None) -> None:
        self.world_size = world_size
        self.rank = rank
        self.config = config
        self.plan = Plan(config.baseline)
        self.events: list[dict[str, Any]] = []
        self.model = OnlineModel(world_size, config.prior, config.fit_samples)
        self.detector = Detector(config.detector)
        self._log_path = log_path
        self._seq = 0
        self._plan_start = config.warmup_steps
        self._blocked: dict[tuple[object, ...], int] = {}
        self._verify: dict[str, Any] | None = None
        self._last_sizes: list[int] = []
        self._planned_for: tuple[int | None, tuple[int, ...]] = (None, ())
        window = config.detector.window
        self._bucket_window: deque[np.ndarray] = deque(maxlen=window)
        self._lateness: deque[np.ndarray] = deque(maxlen=window)
        self._step_times: deque[tuple[int, float]] = deque(maxlen=max(window, config.verify_steps) * 4)
        """(step, AllReduce part s): last arrival to last finish (or the smallest total over the ranks)."""
        self._periods: deque[tuple[int, float]] = deque(maxlen=max(window, config.verify_steps) * 4)
        """(step, step period s): half the time from the last finish of step - 2 to that of step."""
        self._ends: deque[tuple[int, float]] = deque(maxlen=2)
        """(step, last finish) of the last two steps with one, for the step period."""
        self._readings: deque[tuple[tuple[int, ...], np.ndarray]] = deque(maxlen=config.fit_samples)
        """(steps, per-rank l read by the links) of the recent exchanges that measured links."""
        self.probe_every = config.probe_every
        """The probe interval in force (every rank: the last decision's); see ``ControllerConfig``."""
        self._probe_target = config.probe_every  # rank 0: the interval it ships
        self._probe_event: dict[str, Any] | None = None
        self._probe_maxima: deque[float] = deque(maxlen=config.quiet_after)
        self._plain_tails: deque[tuple[int, float]] = deque(maxlen=4 * max(config.alarm_steps, config.probe_every))
        self._tail_reference = math.nan
        self._tail_medians: deque[tuple[int, float]] = deque(maxlen=config.healthy_memory_steps)
        """(step, median AllReduce of the last ``alarm_steps`` plain steps up to it), per plain step."""
        self._quiet_since = -1
        self._checking = False  # busy probing because one quiet probe read a slow link: check it
        self._plan_checking = False  # under OptCC: probing every probe_every, a probe read l off the plan's
        self.exchange_every = config.exchange_every
        """The exchange interval in force (every rank: the last decision's); see ``ControllerConfig``."""
        self._exchange_target = config.exchange_every  # rank 0: the interval it ships
        self._exchange_event: dict[str, Any] | None = None
        self._last_doubt = -1  # rank 0: the last step with a reason for short exchanges
        self._last_finish: tuple[int, np.ndarray] | None = None
        """rank 0: (step, each rank's own-clock finish) of the latest step the exchanges brought."""

    # -- every rank -----------------------------------------------------------------------------
    @property
    def plan_start(self) -> int:
        """The first step under the plan in force (on every rank: from the decisions it adopted)."""
        return self._plan_start

    def apply(self, decision: Decision) -> None:
        """Adopt ``decision`` (the same one on every rank) and record its events."""
        if decision.plan != self.plan:
            self._plan_start = decision.step
        self.plan = decision.plan
        if decision.probe_every is not None:
            self.probe_every = decision.probe_every
        if decision.exchange_every is not None:
            self.exchange_every = decision.exchange_every
        for event in decision.events:
            event = dict(event, step=decision.step, algorithm=decision.plan.algorithm)
            self.events.append(event)
            if self._log_path is not None:
                with open(self._log_path, "a", encoding="utf-8") as log:
                    log.write(json.dumps(event, sort_keys=True) + "\n")

    # -- rank 0 ---------------------------------------------------------------------------------
    def _gaps(self, stats: WindowStats) -> np.ndarray | None:
        """[step, rank]: seconds from the end of the rank's previous step's AllReduce to its first
        hand-over of this one, both on its own clock (NaN where either is missing); ``None`` without
        wall clocks. The previous step of the exchange's first is remembered from the last exchange.
        """
        if stats.arrival_wall is None or stats.finish_wall is None or not stats.steps:
            return None
        arrivals = np.asarray(stats.arrival_wall, dtype=np.float64)
        finishes = np.asarray(stats.finish_wall, dtype=np.float64)
        gaps = np.full(arrivals.shape, np.nan)
        gaps[1:] = arrivals[1:] - finishes[:-1]
        previous = self._last_finish
        if previous is not None and previous[0] == stats.steps[0] - 1:
            gaps[0] = arrivals[0] - previous[1]
        self._last_finish = (stats.steps[-1], finishes[-1].copy())
        return gaps

    def observe(self, stats: WindowStats, apply_step: int) -> Decision | None:
        """Digest one exchange; return a decision to ship (effective at ``apply_step``) or ``None``."""
        cfg = self.config
        # the fit is of a healthy NIC: samples of a degraded cluster count their slowest NIC, as
        # confirmed by the detector (one exchange's link figures are too noisy: a healthy link
        # read 1.9 once in an 8-rank run)
        slowest = max(self.detector.degraded.values(), default=1.0)
        for i, step in enumerate(stats.steps):
            spans = stats.bucket_spans[i]
            self._bucket_window.append(spans)
            tail = float(stats.tails[i]) if stats.tails is not None else math.nan
            if math.isfinite(tail) and tail > 0:
                self._step_times.append((step, tail))
                if all(a in ("", "allreduce") for a in stats.algorithms[i]):  # no probe, no plan of ours
                    self._plain_tails.append((step, tail))
                    if len(self._plain_tails) >= cfg.alarm_steps:
                        last = [t for _, t in self._plain_tails][-cfg.alarm_steps :]
                        self._tail_medians.append((step, float(np.median(last))))
            elif stats.tails is None and not np.isnan(stats.totals[i]).all():
                self._step_times.append((step, float(np.nanmin(stats.totals[i]))))
            end = float(stats.ends[i]) if stats.ends is not None else math.nan
            if math.isfinite(end):
                if self._ends and self._ends[-1][0] != step - 1:
                    self._ends.clear()  # a step without a finish: start the pairs again
                if len(self._ends) == 2 and end > self._ends[0][1]:
                    self._periods.append((step, (end - self._ends[0][1]) / 2))
                self._ends.append((step, end))
            if step < self._plan_start + cfg.settle_steps:
                continue
            for b, algorithm in enumerate(stats.algorithms[i]):
                if b < len(stats.bucket_bytes) and not np.isnan(spans[:, b]).any():
                    self.model.add(algorithm, stats.bucket_bytes[b], float(np.min(spans[:, b])), slowest, step)
        self.model.refit()
        self._last_sizes = list(stats.bucket_bytes)
        from_links = slowdowns_from_links(stats.link_rates)
        from_speeds = slowdowns_from_speeds(stats.speeds)
        if np.isnan(from_links).all() and not (from_speeds > 1.0).any():
            slowdowns = from_links  # nothing measured in this exchange (no probe): no estimate, not "healthy"
        else:
            slowdowns = np.fmax(from_links, from_speeds)
        if 1 < len(set(stats.hosts)) < len(stats.hosts):  # ranks share servers: each gets its server's l
            per_server = server_slowdowns(slowdowns.tolist(), stats.hosts)
            known = ~np.isnan(slowdowns)
            slowdowns = np.where(known, [per_server[h] for h in stats.hosts], np.nan)
        if stats.lateness is not None:
            self._lateness.extend(stats.lateness)
        sizes = [b for b in stats.bucket_bytes if b > 0]
        first_bucket = stats.bucket_bytes[0] if stats.bucket_bytes else 0

        def critical(rank: int) -> float:
            return self._critical_delay(rank, first_bucket)

        per_estimate = len(stats.steps)
        if cfg.baseline == "allreduce" and cfg.probe_every > 0:
            per_estimate = max(per_estimate, cfg.probe_every)
        findings = self.detector.update(
            stats.steps, stats.totals, slowdowns, critical, per_estimate, gaps=self._gaps(stats)
        )
        if not np.isnan(slowdowns).all():
            self._readings.append((tuple(stats.steps), slowdowns))
        self._rescale_samples(findings)
        self._probing(stats.steps[-1] if stats.steps else apply_step, slowdowns)
        self._exchanging(critical, stats.steps)
        if self._lateness:  # finer figures: how late each rank is, from the offset-corrected wall clocks
            lateness = np.median(np.stack(self._lateness), axis=0)
            for f in findings:
                if f.kind == "detected_straggler":
                    f.evidence["wall_clock_lateness_s"] = [round(float(x), 6) for x in lateness]
        if apply_step < cfg.warmup_steps or not sizes:  # nothing to plan yet: report findings only
            return self._decision(apply_step, self.plan, findings, {}) if self._news(findings) else None
        verdict = self._judge_switch(apply_step, findings)
        if verdict is not None:
            return verdict
        believed = (self.detector.straggler, tuple(sorted(self.detector.degraded)))
        in_use = self.plan.algorithm != cfg.baseline
        if believed == self._planned_for and in_use and not self._plan_outdated(apply_step):
            target = None  # same situation, plan in use: keep it (no per-bucket flapping)
        else:
            target = self._best_plan(stats.bucket_bytes, apply_step)
            self._planned_for = believed
        if target is None or target == self.plan:
            return self._decision(apply_step, self.plan, findings, {}) if self._news(findings) else None
        cleared = any(f.kind == "cleared" for f in findings) and target.algorithm == cfg.baseline
        return self._switch(apply_step, target, findings, cleared)

    def _plan_outdated(self, step: int) -> bool:
        """Under OptCC: does every estimate in the detector's window read a planned rank that is
        still believed degraded more than ``replan_ratio`` off the plan's ``l`` (see
        ``ControllerConfig.replan_ratio``)? Not while a rebuild for these ranks was rolled back
        (``cooldown_steps``): the plan in use is then the best one verified."""
        if not self.plan.runs_nic_plan or not self.plan.slowdowns:
            return False
        if self._is_blocked(self.plan.algorithm, None, dict(self.plan.slowdowns), step):
            return False
        window = self.detector.l_window
        if window is None:
            return False
        ratio = self.config.replan_ratio
        for rank, planned in self.plan.slowdowns:
            if rank not in self.detector.degraded:
                continue  # cleared (the plan is rebuilt anyway) or never detected (a plan set by hand)
            readings = window[:, rank]
            if np.isnan(readings).any():
                continue
            above, below = _off_plan(readings, planned, ratio)
            if bool(above.all()) or bool(below.all()):
                return True
        return False

    def _plan_probing(self, slowdowns: np.ndarray) -> None:
        """Under OptCC: probe every ``probe_every`` steps while a probe reads a planned rank's ``l``
        off the plan's, every ``plan_probe_every`` otherwise (``ControllerConfig.plan_probe_every``)."""
        cfg = self.config
        if cfg.plan_probe_every == 0 or cfg.probe_every in (0, cfg.plan_probe_every) or np.isnan(slowdowns).all():
            return
        threshold, ratio = cfg.detector.degraded_threshold, cfg.replan_ratio
        off = {
            rank: (float(slowdowns[rank]), planned)
            for rank, planned in self.plan.slowdowns
            if rank in self.detector.degraded
            and math.isfinite(slowdowns[rank])
            and (slowdowns[rank] < threshold or any(_off_plan(slowdowns[rank], planned, ratio)))
        }
        readings = ", ".join(f"rank {r} at l = {now:.3g} (planned {was:.3g})" for r, (now, was) in sorted(off.items()))
        if off and not self._plan_checking:
            self._plan_checking = True
            self._probe_event = {
                "every": cfg.probe_every,
                "under": self.plan.algorithm,
                "reason": f"a probe under {self.plan.algorithm} read {readings}: probing every "
                f"{cfg.probe_every} steps until the readings settle",
            }
        elif not off and self._plan_checking:
            self._plan_checking = False
            self._probe_event = {
                "every": cfg.plan_probe_every,
                "under": self.plan.algorithm,
                "reason": "the check probe read the degraded ranks as planned: the reading before was noise",
            }

    def _probe_interval(self, plan: Plan) -> int:
        """The probe interval shipped with a decision for ``plan`` (every rank adopts it)."""
        cfg = self.config
        if plan.runs_nic_plan:
            return cfg.probe_every if self._plan_checking else cfg.plan_probe_every
        return self._probe_target

    def _rescale_samples(self, findings: list[Finding]) -> None:
        """On a ``detected_degraded`` finding: the samples of the exchanges whose own link readings
        saw a now-confirmed rank slow (``l`` at least ``clear_degraded_threshold``) were taken on
        the degraded cluster before it was confirmed, and added as healthy; re-tag them with the
        confirmed slowest ``l`` and refit (see :mod:`stragglerkit.detect.model`)."""
        confirmed = [f for f in findings if f.kind == "detected_degraded"]
        if not confirmed:
            return
        degraded = self.detector.degraded
        slowest = max(degraded.values(), default=1.0)
        threshold = self.config.detector.clear_degraded_threshold
        ranks = sorted(degraded)
        steps = {
            step
            for exchange_steps, readings in self._readings
            if np.nan_to_num(readings[ranks], nan=1.0).max() >= threshold
            for step in exchange_steps
        }
        changed = self.model.rescale(steps, slowest)
        if changed:
            self.model.refit()
        for finding in confirmed:
            finding.evidence["rescaled_samples"] = changed

    def _news(self, findings: list[Finding]) -> bool:
        return bool(findings) or self._probe_event is not None or self._exchange_event is not None

    def _exchanging(self, critical: Callable[[int], float], steps: list[int]) -> None:
        """Lengthen the exchange interval once all has been quiet for a window (``W`` steps), shorten
        it on the first doubt.

        Sets ``_exchange_target`` and, when it changes, ``_exchange_event`` (shipped with the next
        decision as an ``exchange`` event). See ``ControllerConfig.quiet_exchange_every``."""
        cfg = self.config
        quiet, busy = cfg.quiet_exchange_every, cfg.exchange_every
        if quiet in (0, busy):
            return
        detector = self.detector
        reasons = []
        if self.plan != Plan(cfg.baseline):
            reasons.append(f"a plan other than the baseline runs ({self.plan.algorithm})")
        if detector.straggler is not None or detector.degraded:
            reasons.append("a straggler or degraded rank is believed")
        if "candidate" not in detector.last_evidence:
            reasons.append("the detector's window is not full yet")
        # a straggler suspect: last in clear_fraction of the window, or (while the exchanges are
        # long) in half of the latest one's steps, late by enough to matter; the short interval is
        # then back before the window holds the fraction that detects it
        latest = len(steps) if self._exchange_target == quiet else 0
        for span, share in ((None, cfg.detector.clear_fraction), (latest, 0.5)):
            last = detector.most_often_last(span) if span != 0 else None
            if last is None:
                continue
            rank, fraction, delay = last
            if fraction >= share and delay >= cfg.detector.clear_delay_ratio * float(critical(rank)):
                where = "the window's steps" if span is None else f"the last {span} steps"
                reasons.append(
                    f"rank {rank} was last in {fraction:.0%} of {where} with a median delay of {delay * 1e3:.3g} ms"
                )
                break
        if cfg.probes_back_off and self._probe_target != cfg.quiet_probe_every:
            reasons.append("the probes have not backed off (the links are in question)")
        if self._readings:
            top = float(np.nanmax(self._readings[-1][1]))
            if top >= cfg.detector.degraded_threshold:
                reasons.append(f"the latest link reading has l = {top:.3g} (>= {cfg.detector.degraded_threshold:g})")
        step = steps[-1] if steps else self._last_doubt
        if reasons:
            self._last_doubt = step
        elif step - self._last_doubt < cfg.detector.window:
            return  # quiet for less than a window since the last doubt: no flapping on one calm exchange
        target = busy if reasons else quiet
        if target == self._exchange_target:
            return
        self._exchange_target = target
        if reasons:
            self._exchange_event = {"every": busy, "reason": "; ".join(reasons)}
        else:
            self._exchange_event = {
                "every": quiet,
                "reason": f"all quiet for {cfg.detector.window} steps: the baseline runs, nothing is believed "
                "wrong, no straggler suspect" + (", the probes have backed off" if cfg.probes_back_off else ""),
            }

    def _slower_than_healthy(self, step: int) -> bool:
        """Is the AllReduce (median of the last ``alarm_steps`` plain steps) over ``probe_alarm`` times
        its lowest such median within ``healthy_memory_steps``? (See that field.)"""
        cfg = self.config
        recent = [t for _, t in self._plain_tails][-cfg.alarm_steps :]
        since = step - cfg.healthy_memory_steps
        healthy = min((m for s, m in self._tail_medians if s > since), default=math.inf)
        return bool(recent) and float(np.median(recent)) > cfg.probe_alarm * healthy

    def _probing(self, step: int, slowdowns: np.ndarray) -> None:
        """Back the probes off once the links have proven healthy; bring them back on an alarm.

        Sets ``_probe_target`` and, when it changes, ``_probe_event`` (shipped with the next
        decision as a ``probing`` event). See ``ControllerConfig.quiet_probe_every``.
        """
        cfg = self.config
        quiet, busy = cfg.quiet_probe_every, cfg.probe_every
        if self.plan.runs_nic_plan:  # the plan's own interval; the baseline's resumes busy after it
            self._plan_probing(slowdowns)
            self._probe_target, self._checking = busy, False
            self._probe_maxima.clear()
            return
        if not cfg.probes_back_off:
            return
        threshold = cfg.detector.degraded_threshold
        measured = not np.isnan(slowdowns).all()
        top = float(np.nanmax(slowdowns)) if measured else math.nan
        calm = self.plan == Plan(cfg.baseline) and self.detector.straggler is None and not self.detector.degraded
        if self._probe_target == busy:
            if self._checking and calm and measured:
                # the first probe after one quiet probe read a slow link: a healthy reading means
                # that one was noise (single probes on loaded hosts read healthy links up to
                # l ~ 2.6), so back off again at once instead of after quiet_after probes
                self._checking = False
                if top < threshold and not self._slower_than_healthy(step):
                    self._probe_target, self._quiet_since = quiet, step
                    self._probe_event = {
                        "every": quiet,
                        "reason": f"the check probe read the links healthy (largest l: {top:.3g} < {threshold:g}); "
                        "the slow reading before it was noise",
                        "largest_l": [round(top, 4)],
                        "reference_allreduce_s": round(self._tail_reference, 6),
                    }
                    return
            if not calm:
                self._probe_maxima.clear()
                self._checking = False
            elif measured:
                self._probe_maxima.append(top)
            recent = [t for _, t in self._plain_tails][-2 * cfg.alarm_steps :]
            if len(self._probe_maxima) < cfg.quiet_after or len(recent) < cfg.alarm_steps:
                return
            typical = float(np.median(self._probe_maxima))
            if typical >= threshold:
                return
            if self._slower_than_healthy(step):
                return  # the links read healthy, but every AllReduce got slower: keep probing
            self._tail_reference = float(np.median(recent))
            self._probe_target, self._quiet_since = quiet, step
            self._probe_event = {
                "every": quiet,
                "reason": f"the last {len(self._probe_maxima)} probes found the links healthy (median of their "
                f"largest l: {typical:.3g} < {threshold:g})",
                "largest_l": [round(v, 4) for v in self._probe_maxima],
                "reference_allreduce_s": round(self._tail_reference, 6),
            }
            self._probe_maxima.clear()
            return
        reason = None
        if not calm:
            reason = "a plan other than the baseline runs, or a straggler or degraded rank is believed"
        elif measured and top >= threshold:
            reason = f"a probe read l = {top:.3g} (>= {threshold:g}); the next probe checks it"
            self._checking = True
        else:
            recent = [t for s, t in self._plain_tails if s > self._quiet_since][-cfg.alarm_steps :]
            if len(recent) >= cfg.alarm_steps and float(np.median(recent)) > cfg.probe_alarm * self._tail_reference:
                reason = (
                    f"the AllReduce took {float(np.median(recent)):.4g} s (median of {len(recent)} steps), over "
                    f"{cfg.probe_alarm:g} x the {self._tail_reference:.4g} s of when the probes backed off"
                )
        if reason is None:
            return
        self._probe_target = busy
        self._probe_event = {"every": busy, "reason": reason}

    def _critical_delay(self, rank: int, nbytes: int) -> float:
        cfg = self.config
        if why_not("stragglar", Situation(world_size=self.world_size, straggler=rank)) is not None:
            return math.inf
        if nbytes < cfg.min_bucket_bytes:
            return math.inf
        return self.model.critical_delay(rank, nbytes, cfg.baseline, cfg.min_gain)

    def _bucket_delays(self, straggler: int) -> np.ndarray:
        """Per bucket: median of (fastest other rank's span - straggler's span), >= 0, over the
        window's steps in which ``straggler`` arrived last (as the detector's delay; all steps if
        none): right after a straggler moved, the steps of the previous one say nothing about it."""
        window = np.stack(self._bucket_window)  # [step, rank, bucket]
        totals = np.where(np.isnan(window), 0.0, window).sum(axis=2)  # [step, rank]
        last = totals.argmin(axis=1) == straggler
        if last.any():
            window = window[last]
        others = np.delete(window, straggler, axis=1)
        fastest_other = np.where(np.isnan(others), np.inf, others).min(axis=1)
        gaps = np.where(np.isinf(fastest_other), np.nan, fastest_other) - window[:, straggler, :]
        gaps = np.where(np.isnan(gaps), 0.0, np.maximum(gaps, 0.0))
        return np.asarray(np.median(gaps, axis=0))

    def _best_plan(self, bucket_bytes: list[int], step: int) -> Plan | None:
        """The plan for what the detector believes (``None`` when nothing can be predicted)."""
        cfg = self.config
        straggler = self.detector.straggler
        slow = dict(sorted(self.detector.degraded.items()))
        candidates = []
        situation = Situation(world_size=self.world_size, straggler=straggler, slowdowns=slow)
        if straggler is not None and why_not("stragglar", situation) is None:
            candidates.append("stragglar")
        if slow:
            candidates += [name for name in NIC_ALGORITHMS if why_not(name, situation) is None]
        delays = self._bucket_delays(straggler) if straggler is not None and self._bucket_window else None
        chosen = []
        for b, nbytes in enumerate(bucket_bytes[: cfg.max_buckets]):
            delay = float(delays[b]) if delays is not None and b < delays.size else 0.0
            if "stragglar" in chosen:
                # stragglerkit's runs are queued: this bucket starts once the earlier StragglAR run
                # ended, which is after the straggler arrived (its delay was measured while the
                # group's own all_reduce ran the buckets side by side)
                delay = 0.0
            best, best_time = cfg.baseline, math.inf
            if nbytes >= cfg.min_bucket_bytes and candidates:
                kwargs: dict[str, Any] = {"straggler": straggler, "delay": delay, "slowdowns": slow}
                base_time = self.model.predict(cfg.baseline, nbytes, **kwargs)
                best_time = base_time
                for algorithm in candidates:
                    if self._is_blocked(algorithm, straggler, slow, step):
                        continue
                    predicted = self.model.predict(algorithm, nbytes, **kwargs)
                    if predicted <= (1 - cfg.min_gain) * base_time and predicted < best_time:
                        best, best_time = algorithm, predicted
            chosen.append(best)
        if not any(a != cfg.baseline for a in chosen):
            return Plan(cfg.baseline)
        used = {a for a in chosen}
        return Plan(
            cfg.baseline,
            tuple(chosen),
            straggler if "stragglar" in used else None,
            tuple(slow.items()) if used & set(NIC_ALGORITHMS) else (),
        )

    def _predicted_total(self, plan: Plan, bucket_bytes: list[int]) -> float:
        straggler = self.detector.straggler
        delays = self._bucket_delays(straggler) if straggler is not None and self._bucket_window else None
        slow = dict(self.detector.degraded)
        total = 0.0
        for b, nbytes in enumerate(bucket_bytes):
            if nbytes <= 0:
                continue
            delay = float(delays[b]) if delays is not None and b < delays.size else 0.0
            planned = dict(plan.slowdowns) if plan.slowdowns else None
            total += self.model.predict(
                plan.algorithm_for(b),
                nbytes,
                straggler=straggler,
                delay=delay,
                slowdowns=slow,
                planned_slowdowns=planned,
                planned_straggler=plan.straggler,
            )
        return total

    def _is_blocked(self, algorithm: str, straggler: int | None, slow: dict[int, float], step: int) -> bool:
        late = straggler if algorithm == "stragglar" else None
        key = (algorithm, late, tuple(sorted(slow)) if algorithm in NIC_ALGORITHMS else ())
        return self._blocked.get(key, -1) > step

    def _recent_time(self, since: int, until: int, measure: str = ALLREDUCE_PART) -> tuple[float, int]:
        """Median and count of ``measure`` over steps ``since <= step < until``."""
        series = self._periods if measure == STEP_PERIOD else self._step_times
        times = [t for s, t in series if since <= s < until]
        return (float(np.median(times)) if times else math.nan), len(times)

    def _switch(self, step: int, target: Plan, findings: list[Finding], cleared: bool) -> Decision:
        cfg = self.config
        sizes = self._last_sizes
        since = step - cfg.detector.window - self.exchange_every
        allreduce_before, allreduce_count = self._recent_time(since, step)
        period_before, period_count = self._recent_time(since, step, STEP_PERIOD)
        measure = STEP_PERIOD if period_count > 0 else ALLREDUCE_PART
        before, count = (period_before, period_count) if measure == STEP_PERIOD else (allreduce_before, allreduce_count)
        evidence = {
            "from": self.plan.describe(),
            "to": target.describe(),
            "predicted_before_s": self._predicted_total(self.plan, sizes),
            "predicted_after_s": self._predicted_total(target, sizes),
            "measure": measure,
            "measured_before_s": before,
            "measured_steps": count,
            "allreduce_before_s": allreduce_before,
            "model": dict(self.model.fit_info),
            "detector": self.detector.last_evidence,
        }
        if target.algorithm != cfg.baseline:
            self._verify = {"previous": self.plan, "target": target, "step": step, "evidence": evidence}
        else:
            self._verify = None
        extra = {} if cleared else {"switch": evidence}
        return self._decision(step, target, findings, extra)

    def _judge_switch(self, step: int, findings: list[Finding]) -> Decision | None:
        """Roll back a switch that did not pay, or record that it did (see the module docstring)."""
        cfg = self.config
        if self._verify is None or self.plan != self._verify["target"]:
            return None
        start = self._verify["step"] + cfg.settle_steps
        switch = self._verify["evidence"]
        measure = switch["measure"]
        after, count = self._recent_time(start, step, measure)
        allreduce_after, allreduce_count = self._recent_time(start, step)
        if count < cfg.verify_steps and measure == STEP_PERIOD and step - start >= 4 * cfg.verify_steps:
            # the step ends stopped coming (a rank's figures missing): judge the AllReduce part
            measure, after, count = ALLREDUCE_PART, allreduce_after, allreduce_count
            switch = dict(switch, measured_before_s=switch["allreduce_before_s"])
        if count < cfg.verify_steps:
            return None
        record, self._verify = self._verify, None
        before = switch["measured_before_s"]
        measured = {
            "switched_at_step": record["step"],
            "predicted_before_s": switch["predicted_before_s"],
            "predicted_after_s": switch["predicted_after_s"],
            "measure": measure,
            "measured_before_s": before,
            "measured_after_s": after,
            "measured_after_steps": count,
            "allreduce_before_s": switch["allreduce_before_s"],
            "allreduce_after_s": allreduce_after,
            "rollback_margin": cfg.rollback_margin,
        }
        if not math.isfinite(before) or after < (1 - cfg.rollback_margin) * before:
            kept = dict(measured, kept=self.plan.describe())
            return self._decision(step, self.plan, findings, {"verified": kept})
        target: Plan = record["target"]
        previous: Plan = record["previous"]
        key = (target.algorithm, target.straggler, tuple(sorted(r for r, _ in target.slowdowns)))
        self._blocked[key] = step + cfg.cooldown_steps
        evidence = {
            "rejected": target.describe(),
            "restored": previous.describe(),
            **measured,
            "blocked_until_step": step + cfg.cooldown_steps,
        }
        return self._decision(step, previous, findings, {"rollback": evidence})

    def _decision(self, step: int, plan: Plan, findings: list[Finding], extra: dict[str, dict[str, Any]]) -> Decision:
        events = [
            {"kind": f.kind, "evidence": dict(f.evidence, ranks={str(r): v for r, v in f.ranks.items()})}
            for f in findings
        ]
        events += [{"kind": kind, "evidence": evidence} for kind, evidence in extra.items()]
        if plan != self.plan:
            self._plan_checking = False  # a new plan starts at its own interval (also on rank 0 before apply)
        interval = self._probe_interval(plan)
        if self._probe_event is not None:
            if self._probe_event["every"] == interval:  # else: the baseline's interval while OptCC runs
                events.append({"kind": "probing", "evidence": self._probe_event})
            self._probe_event = None
        if self._exchange_event is not None:
            events.append({"kind": "exchange", "evidence": self._exchange_event})
            self._exchange_event = None
        self._seq += 1
        return Decision(self._seq, step, plan, events, interval, self._exchange_target)


def _off_plan(readings: Any, planned: float, ratio: float) -> tuple[Any, Any]:
    """Readings of a rank's ``l`` more than ``ratio`` above / below the plan's ``planned`` (one
    reading, or elementwise for an array)."""
    return readings > ratio * planned, readings * ratio < planned


def log_path_for(path: str | os.PathLike[str] | None, rank: int) -> str | None:
    """Where ``rank`` writes its JSONL log: ``path`` on rank 0 (or each rank if it contains ``{rank}``)."""
    if path is None:
        return None
    text = os.fspath(path)
    if "{rank}" in text:
        return text.format(rank=rank)
    return text if rank == 0 else None
