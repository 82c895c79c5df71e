"""Verifying each switch against the measured steps, with rollback.

:class:`SwitchVerifier` is the component of :class:`~stragglerkit.detect.controller.Controller`
that keeps the measured steps (the AllReduce part and the step period of each), takes the
measurements before a switch, judges the switch once ``verify_steps`` steps ran under the new plan
(by the step period, or the AllReduce part where the step ends are missing), and rolls back a
switch that did not pay, blocking the rejected plan for ``cooldown_steps``. It owns its state;
the predictions in a switch's evidence come from the controller.

Example::

    verifier = SwitchVerifier(settings)
    verifier.record(step, allreduce=0.012, end=1000.25)       # every step the exchanges bring
    verifier.start(step, previous, target, evidence)          # with the decision that switches
    verdict = verifier.judge(step, plan)                      # ("verified" | "rollback", evidence, plan)
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from stragglerkit.detect.settings import Settings
from stragglerkit.plans import ALLREDUCE_PART, STEP_PERIOD, Plan
from stragglerkit.schedules.registry import NIC_ALGORITHMS

__all__ = ["SwitchVerifier"]


class SwitchVerifier:
    """Measure, verify, roll back (see the module docstring)."""

    __slots__ = ("_blocked", "_ends", "_periods", "_step_times", "_verify", "settings")

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        keep = max(settings.detection.window, settings.detection.verify_steps) * 4
        self._step_times: deque[tuple[int, float]] = deque(maxlen=keep)
        """(step, AllReduce part s): last arrival to last finish (or the smallest total over the ranks)."""
        self._periods: deque[tuple[int, float]] = deque(maxlen=keep)
        """(step, step period s): half the time from the last finish of step - 2 to that of step."""
        self._ends: deque[tuple[int, float]] = deque(maxlen=2)
        """(step, last finish) of the last two steps with one, for the step period."""
        self._blocked: dict[tuple[object, ...], int] = {}
        """(algorithm, straggler, degraded ranks) -> the step until which a rolled-back plan is not tried."""
        self._verify: dict[str, Any] | None = None
        """The switch being verified: ``{"previous", "target", "step", "evidence"}``."""

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    @property
    def pending(self) -> Plan | None:
        """The plan whose switch is waiting for its verdict (``None``: none)."""
        return None if self._verify is None else self._verify["target"]

    def cancel(self) -> None:
        """Forget the switch being verified (it counts as verified)."""
        self._verify = None

    # -- measurements ---------------------------------------------------------------------------
    def record(self, step: int, allreduce: float, end: float) -> None:
        """One step's measurements: its AllReduce part (s; NaN: unknown) and its end (the last
        finish on rank 0's clock, s; NaN: unknown), steps in order."""
        if math.isfinite(allreduce):
            self._step_times.append((step, allreduce))
        if math.isfinite(end):
            if self._ends and self._ends[-1][0] != step - 1:
                self._ends.clear()  # a step without a finish: start the pairs again
            if len(self._ends) == 2 and end > self._ends[0][1]:
                self._periods.append((step, (end - self._ends[0][1]) / 2))
            self._ends.append((step, end))

    def recent(self, since: int, until: int, measure: str = ALLREDUCE_PART) -> tuple[float, int]:
        """Median and count of ``measure`` over steps ``since <= step < until``."""
        series = self._periods if measure == STEP_PERIOD else self._step_times
        times = [t for s, t in series if since <= s < until]
        return (float(np.median(times)) if times else math.nan), len(times)

    def measured_before(self, step: int, exchange_every: int) -> dict[str, Any]:
        """The measurements a switch at ``step`` is judged against: the last window's (and the
        exchange's) steps, by the step period where known."""
        since = step - self.settings.detection.window - exchange_every
        allreduce_before, allreduce_count = self.recent(since, step)
        period_before, period_count = self.recent(since, step, STEP_PERIOD)
        measure = STEP_PERIOD if period_count > 0 else ALLREDUCE_PART
        before, count = (period_before, period_count) if measure == STEP_PERIOD else (allreduce_before, allreduce_count)
        return {
            "measure": measure,
            "measured_before_s": before,
            "measured_steps": count,
            "allreduce_before_s": allreduce_before,
        }

    # -- switches -------------------------------------------------------------------------------
    def is_blocked(self, algorithm: str, straggler: int | None, slow: dict[int, float], step: int) -> bool:
        """Was a plan of ``algorithm`` for this straggler / these degraded ranks rolled back lately?"""
        late = straggler if algorithm == "stragglar" else None
        key = (algorithm, late, tuple(sorted(slow)) if algorithm in NIC_ALGORITHMS else ())
        return self._blocked.get(key, -1) > step

    def start(self, step: int, previous: Plan, target: Plan, evidence: dict[str, Any]) -> None:
        """A switch from ``previous`` to ``target`` at ``step`` (a switch to the baseline is not verified)."""
        if target.algorithm != self.settings.baseline:
            self._verify = {"previous": previous, "target": target, "step": step, "evidence": evidence}
        else:
            self._verify = None

    def judge(self, step: int, plan: Plan) -> tuple[str, dict[str, Any], Plan] | None:
        """Once enough steps ran under the switch's plan (still ``plan``): ``("verified", evidence,
        plan)`` or ``("rollback", evidence, the previous plan)``; ``None`` before."""
        cfg, detection = self.settings, self.settings.detection
        if self._verify is None or plan != self._verify["target"]:
            return None
        start = self._verify["step"] + cfg.settle_steps
        switch = self._verify["evidence"]
        measure = switch["measure"]
        after, count = self.recent(start, step, measure)
        allreduce_after, allreduce_count = self.recent(start, step)
        if count < detection.verify_steps and measure == STEP_PERIOD and step - start >= 4 * detection.verify_steps:
            # the step ends stopped coming (a rank's figures missing): judge the AllReduce part
            measure, after, count = ALLREDUCE_PART, allreduce_after, allreduce_count
            switch = dict(switch, measured_before_s=switch["allreduce_before_s"])
        if count < detection.verify_steps:
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
            return "verified", dict(measured, kept=plan.describe()), plan
        target: Plan = record["target"]
        previous: Plan = record["previous"]
        key = (target.algorithm, target.straggler, tuple(sorted(r for r, _ in target.slowdowns)))
        self._blocked[key] = step + detection.cooldown_steps
        evidence = {
            "rejected": target.describe(),
            "restored": previous.describe(),
            **measured,
            "blocked_until_step": step + detection.cooldown_steps,
        }
        return "rollback", evidence, previous
