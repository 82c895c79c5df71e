"""The closed loop: from gathered statistics to one plan, the same on every rank, verified after use.

What it decides and why.

* **One decider.** Rank 0 fits the cost model (:mod:`stragglerkit.detect.model`), runs the
  detector (:mod:`stragglerkit.detect.detector`) and chooses the plan. Its decision travels in
  the next stats exchange, so every rank receives it at the same step and switches there.
  Deterministic recomputation on every rank would also agree -- until two machines round one
  float differently; one decider cannot disagree with itself.
* **The plan** names an algorithm per bucket (by DDP bucket index) plus who is late or slow. For
  a confirmed straggler ``s`` every bucket of at least ``min_bucket_bytes`` gets StragglAR if the
  model, given the delay left for that bucket, predicts it at least ``min_gain`` faster than the
  baseline. That delay is the bucket's measured one (how much later ``s`` hands it over) less
  the time stragglerkit's queue of runs is predicted to be busy with the earlier buckets: a rank
  that sleeps before its backward leaves no delay after the first bucket, a slow GPU (every
  bucket's gradients computed late) leaves some for each. For degraded ranks OptCC or the
  balanced ring likewise (the faster in the model), given their ``l``. Only algorithms whose
  predicate accepts the situation are considered (StragglAR: even n >= 4; OptCC: n >= 3 with
  more healthy than degraded ranks), so the plan never names one that does not apply.
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
* **Observing only** (``settings.acting`` false: ``Config.detection.act``). Everything above runs
  but the switch: the plan every rank adopts stays the baseline, and the switch the controller
  would have made is a ``would_switch`` event with a switch's evidence (once per change of the plan
  it would run), so nothing is verified or rolled back.
* **Events.** Every decision is an event dict ``{"step", "kind", "algorithm", "evidence"}``
  (``step``: the first step under the resulting plan) on ``Controller.events``; ranks other than
  0 record the same kinds with the plan as evidence. :meth:`Controller.apply` returns them for the
  loop's record sinks (event log, W&B, NVTX), and rank 0's ``window`` records wait in
  :attr:`Controller.outbox` for the loop's thread.

**Composition.** The controller holds four components, each owning its state and tested alone:
the :class:`~stragglerkit.detect.detector.Detector`, the online cost model
(:class:`~stragglerkit.detect.model.OnlineModel`), the
:class:`~stragglerkit.detect.probe_schedule.ProbeSchedule` (probe and exchange intervals) and the
:class:`~stragglerkit.detect.verification.SwitchVerifier` (measurements, verdicts, rollback
blocks). :meth:`Controller.observe` feeds them an exchange's figures and builds the decision from
what they say; the plan itself is chosen by :mod:`stragglerkit.detect.choice`. Its settings
(:class:`~stragglerkit.detect.settings.Settings`) are ``Config.detection`` plus the constants of
:mod:`stragglerkit.defaults`.

Example::

    controller = Controller(world_size=4, rank=dist.get_rank(), settings=settings_for(config))
    decision = controller.observe(stats, apply_step=step + config.detection.exchange_every)   # rank 0
    controller.apply(decision)                                                               # every rank
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from typing import Any

import numpy as np

from stragglerkit.detect import controller_state
from stragglerkit.detect.choice import best_plan, bucket_delays, predicted_total
from stragglerkit.detect.detector import Detector, Finding
from stragglerkit.detect.model import OnlineModel
from stragglerkit.detect.nic_health import server_slowdowns, slowdowns_from_links, slowdowns_from_speeds
from stragglerkit.detect.probe_schedule import ProbeSchedule, off_plan
from stragglerkit.detect.settings import Settings
from stragglerkit.detect.verification import SwitchVerifier
from stragglerkit.plans import (
    ALGORITHM_CODES,
    ALLREDUCE_PART,
    EVENT_KINDS,
    STEP_PERIOD,
    Decision,
    Plan,
    WindowStats,
    log_path_for,
)
from stragglerkit.schedules.registry import Situation, why_not
from stragglerkit.telemetry.records import window_record

__all__ = [
    "ALGORITHM_CODES",
    "ALLREDUCE_PART",
    "EVENT_KINDS",
    "STEP_PERIOD",
    "Controller",
    "Decision",
    "Plan",
    "WindowStats",
    "log_path_for",
]


class Controller:
    """Plans, decisions and events; rank 0 decides (see the module docstring)."""

    __slots__ = (  # noqa: RUF023 (grouped: components, every rank's, rank 0's memory)
        # the components
        "detector",
        "model",
        "probes",
        "verifier",
        # every rank
        "settings",
        "world_size",
        "rank",
        "plan",
        "events",
        "outbox",
        "records_wanted",
        "restored_records",
        "_plan_start",
        "_seq",
        # rank 0: what the exchanges brought
        "_bucket_window",
        "_lateness",
        "_readings",
        "_last_finish",
        "_last_sizes",
        "_planned_for",
        "_would_run",
    )

    def __init__(self, world_size: int, rank: int, settings: Settings) -> None:
        self.settings = settings
        """``Config.detection`` and the internal constants (:mod:`stragglerkit.detect.settings`)."""
        self.world_size = world_size
        self.rank = rank
        self.detector = Detector(settings)
        self.model = OnlineModel(world_size, settings.prior, settings.fit_samples)
        self.probes = ProbeSchedule(settings)
        self.verifier = SwitchVerifier(settings)
        self.plan = Plan(settings.baseline)
        self.events: list[dict[str, Any]] = []
        self.outbox: deque[dict[str, Any]] = deque()
        """Rank 0's ``window`` records, put by the controller's thread, taken by the loop's."""
        self.records_wanted = False
        """Does any record sink take records (set by the loop; ``window`` records cost predictions)?"""
        self.restored_records: Any = None
        """The event log of a controller pickled by an earlier version (the loop takes it over)."""
        self._plan_start = settings.detection.warmup_steps
        self._seq = 0
        window = settings.detection.window
        self._bucket_window: deque[np.ndarray] = deque(maxlen=window)
        self._lateness: deque[np.ndarray] = deque(maxlen=window)
        self._readings: deque[tuple[tuple[int, ...], np.ndarray]] = deque(maxlen=settings.fit_samples)
        """(steps, per-rank l read by the links) of the recent exchanges that measured links."""
        self._last_finish: tuple[int, np.ndarray] | None = None
        """(step, each rank's own-clock finish) of the latest step the exchanges brought."""
        self._last_sizes: list[int] = []
        self._planned_for: tuple[int | None, tuple[int, ...]] = (None, ())
        self._would_run: Plan | None = None
        """Observing only (``settings.acting`` false): the plan the last ``would_switch`` named
        (``None``: the baseline), which a loop that acts would be running now."""

    # -- checkpoints ----------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return controller_state.controller_state(self)

    def __setstate__(self, state: Any) -> None:
        controller_state.restore(self, state, Controller.__slots__)

    # -- every rank -----------------------------------------------------------------------------
    @property
    def probe_every(self) -> int:
        """The probe interval in force (every rank: the last decision's)."""
        return self.probes.probe_every

    @property
    def exchange_every(self) -> int:
        """The exchange interval in force (every rank: the last decision's)."""
        return self.probes.exchange_every

    @property
    def plan_start(self) -> int:
        """The first step under the plan in force (on every rank: from the decisions it adopted)."""
        return self._plan_start

    def apply(self, decision: Decision) -> list[dict[str, Any]]:
        """Adopt ``decision`` (the same one on every rank); return its events as recorded."""
        if decision.plan != self.plan:
            self._plan_start = decision.step
        self.plan = decision.plan
        self.probes.adopt(decision.probe_every, decision.exchange_every)
        adopted = [dict(e, step=decision.step, algorithm=decision.plan.algorithm) for e in decision.events]
        self.events.extend(adopted)
        return adopted

    # -- rank 0 ---------------------------------------------------------------------------------
    def observe(self, stats: WindowStats, apply_step: int) -> Decision | None:
        """Digest one exchange; return a decision to ship (effective at ``apply_step``) or ``None``."""
        cfg = self.settings
        detector, probes, verifier = self.detector, self.probes, self.verifier
        # the fit is of a healthy NIC: samples of a degraded cluster count their slowest NIC, as
        # confirmed by the detector (one exchange's link figures are too noisy: a healthy link
        # read 1.9 once in an 8-rank run)
        slowest = max(detector.degraded.values(), default=1.0)
        for i, step in enumerate(stats.steps):
            spans = stats.bucket_spans[i]
            self._bucket_window.append(spans)
            tail = float(stats.tails[i]) if stats.tails is not None else math.nan
            allreduce = math.nan
            if math.isfinite(tail) and tail > 0:
                allreduce = tail
                if all(a in ("", "allreduce") for a in stats.algorithms[i]):  # no probe, no plan of ours
                    probes.record_plain_tail(step, tail)
            elif stats.tails is None and not np.isnan(stats.totals[i]).all():
                allreduce = float(np.nanmin(stats.totals[i]))
            verifier.record(step, allreduce, float(stats.ends[i]) if stats.ends is not None else math.nan)
            if step < self._plan_start + cfg.settle_steps:
                continue
            for b, algorithm in enumerate(stats.algorithms[i]):
                if b < len(stats.bucket_bytes) and not np.isnan(spans[:, b]).any():
                    self.model.add(algorithm, stats.bucket_bytes[b], float(np.min(spans[:, b])), slowest, step)
        self.model.refit()
        self._last_sizes = list(stats.bucket_bytes)
        slowdowns = self._slowdowns(stats)
        if stats.lateness is not None:
            self._lateness.extend(stats.lateness)
        sizes = [b for b in stats.bucket_bytes if b > 0]
        first_bucket = stats.bucket_bytes[0] if stats.bucket_bytes else 0

        def critical(rank: int) -> float:
            return self._critical_delay(rank, first_bucket)

        per_estimate = len(stats.steps)
        if cfg.baseline == "allreduce" and cfg.probe_every > 0:
            per_estimate = max(per_estimate, cfg.probe_every)
        # the time each rank spent in the step's AllReduces: a rank that computes its buckets
        # slowly is idle between them, and that is not time in the AllReduce
        busy = np.asarray(stats.totals, dtype=np.float64) - _idle(stats)
        findings = detector.update(stats.steps, busy, slowdowns, critical, per_estimate, gaps=self._gaps(stats))
        if not np.isnan(slowdowns).all():
            self._readings.append((tuple(stats.steps), slowdowns))
        self._rescale_samples(findings)
        probes.probing(stats.steps[-1] if stats.steps else apply_step, slowdowns, self.plan, detector)
        latest = self._readings[-1][1] if self._readings else None
        probes.exchanging(self.plan, detector, critical, stats.steps, latest)
        if self.records_wanted:
            self._record_window(stats, slowdowns)
        if self._lateness:  # finer figures: how late each rank is, from the offset-corrected wall clocks
            lateness = np.median(np.stack(self._lateness), axis=0)
            for f in findings:
                if f.kind == "detected_straggler":
                    f.evidence["wall_clock_lateness_s"] = [round(float(x), 6) for x in lateness]
        if apply_step < cfg.detection.warmup_steps or not sizes:  # nothing to plan yet: report findings only
            return self._decision(apply_step, self.plan, findings, {}) if self._news(findings) else None
        verdict = verifier.judge(apply_step, self.plan) if cfg.acting else None  # observing: nothing to judge
        if verdict is not None:
            kind, evidence, plan = verdict
            return self._decision(apply_step, plan, findings, {kind: evidence})
        believed = (detector.straggler, tuple(sorted(detector.degraded)))
        current = self.plan if cfg.acting or self._would_run is None else self._would_run
        in_use = current.algorithm != cfg.baseline
        if believed == self._planned_for and in_use and not self._plan_outdated(apply_step, current):
            target = None  # same situation, plan in use: keep it (no per-bucket flapping)
        else:
            target = best_plan(
                cfg,
                self.model,
                self.world_size,
                detector.straggler,
                detector.degraded,
                self._delays(),
                stats.bucket_bytes,
                apply_step,
                verifier.is_blocked,
            )
            self._planned_for = believed
        if target is None or target == current:
            return self._decision(apply_step, self.plan, findings, {}) if self._news(findings) else None
        cleared = any(f.kind == "cleared" for f in findings) and target.algorithm == cfg.baseline
        if not cfg.acting:
            return self._would_switch(apply_step, target, findings, cleared)
        return self._switch(apply_step, target, findings, cleared)

    def _slowdowns(self, stats: WindowStats) -> np.ndarray:
        """Per rank ``l`` of this exchange (NaN: not measured), per server where ranks share one."""
        from_links = slowdowns_from_links(stats.link_rates)
        from_speeds = slowdowns_from_speeds(stats.speeds)
        if np.isnan(from_links).all() and not (from_speeds > 1.0).any():
            return from_links  # nothing measured in this exchange (no probe): no estimate, not "healthy"
        slowdowns = np.fmax(from_links, from_speeds)
        if 1 < len(set(stats.hosts)) < len(stats.hosts):  # ranks share servers: each gets its server's l
            per_server = server_slowdowns(slowdowns.tolist(), stats.hosts)
            known = ~np.isnan(slowdowns)
            slowdowns = np.where(known, [per_server[h] for h in stats.hosts], np.nan)
        return slowdowns

    def _gaps(self, stats: WindowStats) -> np.ndarray | None:
        """[step, rank]: the rank's compute time in the step, on its own clock: from the end of its
        previous step's AllReduce to its first hand-over of this one, plus the step's idle time
        (after the first hand-over, computing the next bucket's gradients with nothing in an
        AllReduce). NaN where a figure is missing; ``None`` without wall clocks. The previous step
        of the exchange's first is remembered from the last exchange."""
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
        return gaps + _idle(stats)

    def _delays(self) -> np.ndarray | None:
        """The believed straggler's per-bucket delays over the window (``None``: none believed)."""
        straggler = self.detector.straggler
        if straggler is None or not self._bucket_window:
            return None
        return bucket_delays(np.stack(self._bucket_window), straggler)

    def _predicted_total(self, plan: Plan, bucket_bytes: list[int], ran: list[str] | None = None) -> float:
        detector = self.detector
        return predicted_total(
            self.model, plan, bucket_bytes, detector.straggler, dict(detector.degraded), self._delays(), ran
        )

    def _record_window(self, stats: WindowStats, slowdowns: np.ndarray) -> None:
        """Queue the exchange's ``window`` record (rank 0, the controller's thread; the loop writes it)."""
        try:
            cache: dict[tuple[str, ...], float | None] = {}  # the window's steps mostly ran the same
            predicted = [self._predicted_step(algorithms, stats.bucket_bytes, cache) for algorithms in stats.algorithms]
            self.outbox.append(window_record(stats, slowdowns, predicted))
        except Exception as err:  # a record must not cost a decision
            warnings.warn(f"stragglerkit could not record the window of steps {stats.steps}: {err!r}", stacklevel=2)

    def _predicted_step(
        self, algorithms: list[str], bucket_bytes: list[int], cache: dict[tuple[str, ...], float | None]
    ) -> float | None:
        """The cost model's AllReduce part of a step whose buckets ran ``algorithms`` (``None``
        when a bucket's algorithm is unknown), summed over the buckets as a switch's prediction is."""
        ran = tuple(algorithms[: len(bucket_bytes)])
        if not ran or "" in ran:
            return None
        if ran not in cache:
            cache[ran] = self._predicted_total(self.plan, bucket_bytes, list(ran))
        return cache[ran]

    def _plan_outdated(self, step: int, plan: Plan) -> bool:
        """Under OptCC (``plan``: the one in use, or the one a loop that observes would run): does
        every estimate in the detector's window read a planned rank that is still believed
        degraded more than ``replan_ratio`` off the plan's ``l`` (see ``defaults.REPLAN_RATIO``)?
        Not while a rebuild for these ranks was rolled back (``cooldown_steps``): the plan in use
        is then the best one verified."""
        if not plan.runs_nic_plan or not plan.slowdowns:
            return False
        if self.verifier.is_blocked(plan.algorithm, None, dict(plan.slowdowns), step):
            return False
        window = self.detector.l_window
        if window is None:
            return False
        ratio = self.settings.replan_ratio
        for rank, planned in plan.slowdowns:
            if rank not in self.detector.degraded:
                continue  # cleared (the plan is rebuilt anyway) or never detected (a plan set by hand)
            readings = window[:, rank]
            if np.isnan(readings).any():
                continue
            above, below = off_plan(readings, planned, ratio)
            if bool(above.all()) or bool(below.all()):
                return True
        return False

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
        threshold = self.settings.clear_degraded_threshold
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
        return bool(findings) or self.probes.news

    def _critical_delay(self, rank: int, nbytes: int) -> float:
        cfg = self.settings
        if why_not("stragglar", Situation(world_size=self.world_size, straggler=rank)) is not None:
            return math.inf
        if nbytes < cfg.min_bucket_bytes:
            return math.inf
        return self.model.critical_delay(rank, nbytes, cfg.baseline, cfg.detection.min_gain)

    def _switch(self, step: int, target: Plan, findings: list[Finding], cleared: bool) -> Decision:
        sizes = self._last_sizes
        evidence = {
            "from": self.plan.describe(),
            "to": target.describe(),
            "predicted_before_s": self._predicted_total(self.plan, sizes),
            "predicted_after_s": self._predicted_total(target, sizes),
            **self.verifier.measured_before(step, self.probes.exchange_every),
            "model": dict(self.model.fit_info),
            "detector": self.detector.last_evidence,
        }
        self.verifier.start(step, self.plan, target, evidence)
        return self._decision(step, target, findings, {} if cleared else {"switch": evidence})

    def _would_switch(self, step: int, target: Plan, findings: list[Finding], cleared: bool) -> Decision:
        """Observing only: the switch to ``target`` that a loop that acts would make, as a
        ``would_switch`` event with the evidence a ``switch`` carries (and the gain predicted
        against the baseline that runs); the plan in use stays the baseline. Back to the baseline
        because the situation cleared, the ``cleared`` finding says it alone, as when acting."""
        would_run = self._would_run if self._would_run is not None else self.plan
        self._would_run = None if target.algorithm == self.settings.baseline else target
        if cleared:
            return self._decision(step, self.plan, findings, {})
        sizes = self._last_sizes
        running = self._predicted_total(self.plan, sizes)
        after = self._predicted_total(target, sizes)
        evidence = {
            "act": self.settings.detection.act,
            "from": would_run.describe(),
            "to": target.describe(),
            "running": self.plan.describe(),
            "predicted_before_s": self._predicted_total(would_run, sizes),
            "predicted_after_s": after,
            "predicted_running_s": running,
            "predicted_gain": 1.0 - after / running if running > 0 and math.isfinite(running) else None,
            **self.verifier.measured_before(step, self.probes.exchange_every),
            "model": dict(self.model.fit_info),
            "detector": self.detector.last_evidence,
        }
        return self._decision(step, self.plan, findings, {"would_switch": evidence})

    def _decision(self, step: int, plan: Plan, findings: list[Finding], extra: dict[str, dict[str, Any]]) -> Decision:
        events = [
            {"kind": f.kind, "evidence": dict(f.evidence, ranks={str(r): v for r, v in f.ranks.items()})}
            for f in findings
        ]
        events += [{"kind": kind, "evidence": evidence} for kind, evidence in extra.items()]
        if plan != self.plan:
            self.probes.new_plan()  # a new plan starts at its own interval (also on rank 0 before apply)
        interval = self.probes.interval_for(plan)
        events += self.probes.take_events(plan)
        self._seq += 1
        return Decision(self._seq, step, plan, events, interval, self.probes.exchange_target)


def _idle(stats: WindowStats) -> np.ndarray:
    """[step, rank]: :attr:`WindowStats.idle`, 0 where it is unknown."""
    shape = np.shape(stats.totals)
    if stats.idle is None:
        return np.zeros(shape)
    idle = np.asarray(stats.idle, dtype=np.float64)
    return np.where(np.isnan(idle), 0.0, idle)
