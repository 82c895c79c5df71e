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
* **Events.** Every decision is an event dict ``{"step", "kind", "algorithm", "evidence"}``
  (``step``: the first step under the resulting plan) on ``Controller.events`` and, on rank 0,
  in the JSONL log; ranks other than 0 record the same kinds with the plan as evidence.

Example::

    controller = Controller(world_size=4, rank=dist.get_rank(), config=ControllerConfig())
    decision = controller.observe(stats, apply_step=step + config.exchange_every)   # rank 0
    controller.apply(decision, step)                                               # every rank
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from typing import Any

import numpy as np

from stragglerkit.detect.controller_config import BASELINE_CHOICES, ControllerConfig
from stragglerkit.detect.detector import Detector, Finding
from stragglerkit.detect.model import OnlineModel
from stragglerkit.detect.nic_health import server_slowdowns, slowdowns_from_links, slowdowns_from_speeds
from stragglerkit.detect.probe_schedule import ProbeSchedule, off_plan
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
from stragglerkit.schedules.registry import NIC_ALGORITHMS, Situation, why_not
from stragglerkit.telemetry.records import RecordLog, window_record

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


class Controller(ProbeSchedule, SwitchVerifier):
    """Plans, decisions and events; rank 0 decides (see the module docstring)."""

    __slots__ = ()

    def __init__(self, world_size: int, rank: int, config: ControllerConfig, log_path: str | None = None) -> None:
        self.world_size = world_size
        self.rank = rank
        self.config = config
        self.plan = Plan(config.baseline)
        self.events: list[dict[str, Any]] = []
        self.model = OnlineModel(world_size, config.prior, config.fit_samples)
        self.detector = Detector(config.detector)
        self.records = RecordLog(log_path)
        """The JSONL log's records (decisions on every writing rank, rank 0's windows); the loop
        writes the header and flushes it (:mod:`stragglerkit.telemetry.records`)."""
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
        self._last_finish: tuple[int, np.ndarray] | None = None
        """rank 0: (step, each rank's own-clock finish) of the latest step the exchanges brought."""
        self._init_probe_schedule(config)

    # -- every rank -----------------------------------------------------------------------------
    @property
    def log_path(self) -> str | None:
        """This rank's JSONL log (``None``: it writes none)."""
        return self.records.path

    @log_path.setter
    def log_path(self, path: str | None) -> None:
        self.records.path = path

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
            if self.records.wanted:
                self.records.put(event)
        self.records.flush()  # a decision is written when adopted (with rank 0's windows queued before it)

    # -- rank 0 ---------------------------------------------------------------------------------
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
        # the time each rank spent in the step's AllReduces: a rank that computes its buckets
        # slowly is idle between them, and that is not time in the AllReduce
        busy = np.asarray(stats.totals, dtype=np.float64) - _idle(stats)
        findings = self.detector.update(stats.steps, busy, slowdowns, critical, per_estimate, gaps=self._gaps(stats))
        if not np.isnan(slowdowns).all():
            self._readings.append((tuple(stats.steps), slowdowns))
        self._rescale_samples(findings)
        self._probing(stats.steps[-1] if stats.steps else apply_step, slowdowns)
        self._exchanging(critical, stats.steps)
        if self.records.wanted:
            self._record_window(stats, slowdowns)
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

    def _record_window(self, stats: WindowStats, slowdowns: np.ndarray) -> None:
        """Queue the exchange's ``window`` record (rank 0, the controller's thread; the loop writes it)."""
        try:
            cache: dict[tuple[str, ...], float | None] = {}  # the window's steps mostly ran the same
            predicted = [self._predicted_step(algorithms, stats.bucket_bytes, cache) for algorithms in stats.algorithms]
            self.records.put(window_record(stats, slowdowns, predicted))
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
            cache[ran] = self._predicted_total(self.plan, bucket_bytes, ran)
        return cache[ran]

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
        # when stragglerkit's queue of runs is free again, in seconds after the punctual ranks
        # handed their buckets over (None: nothing queued yet)
        queue_free: float | None = None
        for b, nbytes in enumerate(bucket_bytes[: cfg.max_buckets]):
            arrival = float(delays[b]) if delays is not None and b < delays.size else 0.0
            # The delays were measured while the group's own all_reduce ran the buckets side by
            # side: how much later than the punctual ranks the straggler hands bucket b over.
            # stragglerkit's runs are queued, so after one of them this bucket starts only when
            # the queue is free; the straggler is late for it by what is left of its delay then.
            # A straggler that sleeps before its backward hands every bucket over late by the same
            # delay: the first run's end covers it and the later buckets see none. A slow GPU
            # computes every bucket's gradients late: each later bucket is later still.
            starts = 0.0 if queue_free is None else queue_free
            delay = max(0.0, arrival - starts)
            kwargs: dict[str, Any] = {"straggler": straggler, "delay": delay, "slowdowns": slow}
            best, best_time = cfg.baseline, math.inf
            if nbytes >= cfg.min_bucket_bytes and candidates:
                base_time = self.model.predict(cfg.baseline, nbytes, **kwargs)
                best_time = base_time
                for algorithm in candidates:
                    if self._is_blocked(algorithm, straggler, slow, step):
                        continue
                    predicted = self.model.predict(algorithm, nbytes, **kwargs)
                    if predicted <= (1 - cfg.min_gain) * base_time and predicted < best_time:
                        best, best_time = algorithm, predicted
            chosen.append(best)
            if best != cfg.baseline or queue_free is not None:  # predictions count from the last arrival
                after = best_time if math.isfinite(best_time) else self.model.predict(best, nbytes, **kwargs)
                queue_free = starts + delay + after
        if not any(a != cfg.baseline for a in chosen):
            return Plan(cfg.baseline)
        used = {a for a in chosen}
        return Plan(
            cfg.baseline,
            tuple(chosen),
            straggler if "stragglar" in used else None,
            tuple(slow.items()) if used & set(NIC_ALGORITHMS) else (),
        )

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


def _idle(stats: WindowStats) -> np.ndarray:
    """[step, rank]: :attr:`WindowStats.idle`, 0 where it is unknown."""
    shape = np.shape(stats.totals)
    if stats.idle is None:
        return np.zeros(shape)
    idle = np.asarray(stats.idle, dtype=np.float64)
    return np.where(np.isnan(idle), 0.0, idle)
