"""When the closed loop probes the links and how often it exchanges statistics.

:class:`ProbeSchedule` is the component of :class:`~stragglerkit.detect.controller.Controller` that
sets the probe interval (busy, backed off while the links prove healthy, the plan's own under OptCC
and the balanced ring) and the exchange interval (short while anything is in question, long once
all is quiet), and says why each changed as ``probing`` and ``exchange`` events. It owns its state;
what it reads of the others (the plan in force, the detector's beliefs, the latest link reading)
comes in as arguments.

Example::

    probes = ProbeSchedule(settings)
    probes.record_plain_tail(step, 0.012)               # each step without a probe or a plan
    probes.probing(step, slowdowns, plan, detector)     # after each exchange
    probes.interval_for(plan), probes.take_events(plan)  # shipped with the next decision
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from stragglerkit.detect.detector import Detector
from stragglerkit.detect.settings import Settings
from stragglerkit.plans import Plan

__all__ = ["ProbeSchedule", "off_plan"]


class ProbeSchedule:
    """Probe and exchange intervals (see the module docstring)."""

    __slots__ = (
        "_checking",
        "_exchange_event",
        "_exchange_target",
        "_last_doubt",
        "_plain_tails",
        "_plan_checking",
        "_probe_event",
        "_probe_maxima",
        "_probe_target",
        "_quiet_since",
        "_tail_medians",
        "_tail_reference",
        "exchange_every",
        "probe_every",
        "settings",
    )

    def __init__(self, settings: Settings) -> None:
        """Start with the intervals of ``settings`` and nothing measured."""
        self.settings = settings
        detection = settings.detection
        self.probe_every = settings.probe_every
        """The probe interval in force (every rank: the last decision's; 0 while the loop observes only)."""
        self._probe_target = settings.probe_every  # rank 0: the interval it ships
        self._probe_event: dict[str, Any] | None = None
        self._probe_maxima: deque[float] = deque(maxlen=settings.quiet_after)
        self._plain_tails: deque[tuple[int, float]] = deque(maxlen=4 * max(settings.alarm_steps, detection.probe_every))
        self._tail_reference = math.nan
        self._tail_medians: deque[tuple[int, float]] = deque(maxlen=settings.healthy_memory_steps)
        """(step, median AllReduce of the last ``alarm_steps`` plain steps up to it), per plain step."""
        self._quiet_since = -1
        self._checking = False  # busy probing because one quiet probe read a slow link: check it
        self._plan_checking = False  # under OptCC: probing every probe_every, a probe read l off the plan's
        self.exchange_every = detection.exchange_every
        """The exchange interval in force (every rank: the last decision's)."""
        self._exchange_target = detection.exchange_every  # rank 0: the interval it ships
        self._exchange_event: dict[str, Any] | None = None
        self._last_doubt = -1  # rank 0: the last step with a reason for short exchanges

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    # -- every rank -----------------------------------------------------------------------------
    def adopt(self, probe_every: int | None, exchange_every: int | None) -> None:
        """The intervals of a decision every rank adopts (``None``: unchanged)."""
        if probe_every is not None:
            self.probe_every = probe_every
        if exchange_every is not None:
            self.exchange_every = exchange_every

    # -- rank 0 ---------------------------------------------------------------------------------
    @property
    def probe_target(self) -> int:
        """The probe interval rank 0 ships with its next decision for the baseline."""
        return self._probe_target

    @property
    def exchange_target(self) -> int:
        """The exchange interval rank 0 ships with its next decision."""
        return self._exchange_target

    @property
    def news(self) -> bool:
        """Is an interval change waiting to be shipped?"""
        return self._probe_event is not None or self._exchange_event is not None

    def record_plain_tail(self, step: int, tail: float) -> None:
        """The AllReduce part of a step that ran the group's own AllReduce alone (no probe, no plan)."""
        alarm = self.settings.alarm_steps
        self._plain_tails.append((step, tail))
        if len(self._plain_tails) >= alarm:
            last = [t for _, t in self._plain_tails][-alarm:]
            self._tail_medians.append((step, float(np.median(last))))

    def new_plan(self) -> None:
        """A decision for another plan: it starts at its own probe interval."""
        self._plan_checking = False

    def interval_for(self, plan: Plan) -> int:
        """The probe interval shipped with a decision for ``plan`` (every rank adopts it)."""
        if plan.runs_nic_plan:
            return self.settings.probe_every if self._plan_checking else self.settings.plan_probe_every
        return self._probe_target

    def take_events(self, plan: Plan) -> list[dict[str, Any]]:
        """The ``probing`` and ``exchange`` events to ship with a decision for ``plan`` (once each)."""
        events = []
        if self._probe_event is not None:
            if self._probe_event["every"] == self.interval_for(plan):  # else: the baseline's while OptCC runs
                events.append({"kind": "probing", "evidence": self._probe_event})
            self._probe_event = None
        if self._exchange_event is not None:
            events.append({"kind": "exchange", "evidence": self._exchange_event})
            self._exchange_event = None
        return events

    def _plan_probing(self, slowdowns: np.ndarray, plan: Plan, degraded: dict[int, float]) -> None:
        """Under OptCC: probe every ``probe_every`` steps while a probe reads a planned rank's ``l``
        off the plan's, every ``plan_probe_every`` otherwise (``defaults.PLAN_PROBE_EVERY``)."""
        cfg = self.settings
        probe_every = cfg.probe_every
        if cfg.plan_probe_every == 0 or probe_every in (0, cfg.plan_probe_every) or np.isnan(slowdowns).all():
            return
        threshold, ratio = cfg.detection.degraded_threshold, cfg.replan_ratio
        off = {
            rank: (float(slowdowns[rank]), planned)
            for rank, planned in plan.slowdowns
            if rank in degraded
            and math.isfinite(slowdowns[rank])
            and (slowdowns[rank] < threshold or any(off_plan(slowdowns[rank], planned, ratio)))
        }
        readings = ", ".join(f"rank {r} at l = {now:.3g} (planned {was:.3g})" for r, (now, was) in sorted(off.items()))
        if off and not self._plan_checking:
            self._plan_checking = True
            self._probe_event = {
                "every": probe_every,
                "under": plan.algorithm,
                "reason": f"a probe under {plan.algorithm} read {readings}: probing every "
                f"{probe_every} steps until the readings settle",
            }
        elif not off and self._plan_checking:
            self._plan_checking = False
            self._probe_event = {
                "every": cfg.plan_probe_every,
                "under": plan.algorithm,
                "reason": "the check probe read the degraded ranks as planned: the reading before was noise",
            }

    def exchanging(
        self,
        plan: Plan,
        detector: Detector,
        critical: Callable[[int], float],
        steps: list[int],
        latest_reading: np.ndarray | None,
    ) -> None:
        """Lengthen the exchange interval once all has been quiet for a window (``W`` steps), shorten
        it on the first doubt.

        Sets ``_exchange_target`` and, when it changes, ``_exchange_event`` (shipped with the next
        decision as an ``exchange`` event). See ``DetectionConfig.quiet_exchange_every``;
        ``latest_reading``: the latest exchange's per-rank ``l`` that measured links (``None``: none yet)."""
        cfg, detection = self.settings, self.settings.detection
        quiet, busy = detection.quiet_exchange_every, detection.exchange_every
        if quiet in (0, busy):
            return
        reasons = []
        if plan != Plan(cfg.baseline):
            reasons.append(f"a plan other than the baseline runs ({plan.algorithm})")
        if detector.straggler is not None or detector.degraded:
            reasons.append("a straggler or degraded rank is believed")
        if "candidate" not in detector.last_evidence:
            reasons.append("the detector's window is not full yet")
        # a straggler suspect: last in clear_fraction of the window, or (while the exchanges are
        # long) in half of the latest one's steps, late by enough to matter; the short interval is
        # then back before the window holds the fraction that detects it
        latest = len(steps) if self._exchange_target == quiet else 0
        for span, share in ((None, cfg.clear_fraction), (latest, 0.5)):
            last = detector.most_often_last(span) if span != 0 else None
            if last is None:
                continue
            rank, fraction, delay = last
            if fraction >= share and delay >= cfg.clear_delay_ratio * float(critical(rank)):
                where = "the window's steps" if span is None else f"the last {span} steps"
                reasons.append(
                    f"rank {rank} was last in {fraction:.0%} of {where} with a median delay of {delay * 1e3:.3g} ms"
                )
                break
        if cfg.probes_back_off and self._probe_target != cfg.quiet_probe_every:
            reasons.append("the probes have not backed off (the links are in question)")
        if latest_reading is not None:
            top = float(np.nanmax(latest_reading))
            if top >= detection.degraded_threshold:
                reasons.append(f"the latest link reading has l = {top:.3g} (>= {detection.degraded_threshold:g})")
        step = steps[-1] if steps else self._last_doubt
        if reasons:
            self._last_doubt = step
        elif step - self._last_doubt < detection.window:
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
                "reason": f"all quiet for {detection.window} steps: the baseline runs, nothing is believed "
                "wrong, no straggler suspect" + (", the probes have backed off" if cfg.probes_back_off else ""),
            }

    def _slower_than_healthy(self, step: int) -> bool:
        """Is the AllReduce (median of the last ``alarm_steps`` plain steps) over ``probe_alarm`` times
        its lowest such median within ``healthy_memory_steps``? (``defaults.HEALTHY_MEMORY_STEPS``)"""
        cfg = self.settings
        recent = [t for _, t in self._plain_tails][-cfg.alarm_steps :]
        since = step - cfg.healthy_memory_steps
        healthy = min((m for s, m in self._tail_medians if s > since), default=math.inf)
        return bool(recent) and float(np.median(recent)) > cfg.probe_alarm * healthy

    def probing(self, step: int, slowdowns: np.ndarray, plan: Plan, detector: Detector) -> None:
        """Back the probes off once the links have proven healthy; bring them back on an alarm.

        Sets ``_probe_target`` and, when it changes, ``_probe_event`` (shipped with the next
        decision as a ``probing`` event). See ``defaults.QUIET_PROBE_EVERY``.
        """
        cfg = self.settings
        quiet, busy = cfg.quiet_probe_every or 0, cfg.probe_every
        if plan.runs_nic_plan:  # the plan's own interval; the baseline's resumes busy after it
            self._plan_probing(slowdowns, plan, detector.degraded)
            self._probe_target, self._checking = busy, False
            self._probe_maxima.clear()
            return
        if not cfg.probes_back_off:
            return
        threshold = cfg.detection.degraded_threshold
        measured = not np.isnan(slowdowns).all()
        top = float(np.nanmax(slowdowns)) if measured else math.nan
        calm = plan == Plan(cfg.baseline) and detector.straggler is None and not detector.degraded
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


def off_plan(readings: Any, planned: float, ratio: float) -> tuple[Any, Any]:
    """Readings of a rank's ``l`` more than ``ratio`` above / below the plan's ``planned`` (one
    reading, or elementwise for an array)."""
    return readings > ratio * planned, readings * ratio < planned
