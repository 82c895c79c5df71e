"""Switching plans and verifying each switch against the measured steps, with rollback.

:class:`SwitchVerifier` is the part of :class:`~stragglerkit.detect.controller.Controller` that
ships a switch with the predictions and the measurements before it, judges it once
``verify_steps`` steps ran under the new plan (by the step period, or the AllReduce part where the
step ends are missing), and rolls back a switch that did not pay, blocking the rejected plan for
``cooldown_steps``. Its state is declared in
:class:`~stragglerkit.detect.controller_state.ControllerState`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from stragglerkit.detect.controller_state import ControllerState

from stragglerkit.detect.detector import Finding
from stragglerkit.plans import ALLREDUCE_PART, STEP_PERIOD, Decision, Plan
from stragglerkit.schedules.registry import NIC_ALGORITHMS

__all__ = ["SwitchVerifier"]


class SwitchVerifier(ControllerState):
    """Switch, verify, roll back (a mixin: the controller holds the state)."""

    __slots__ = ()

    if TYPE_CHECKING:

        def _bucket_delays(self, straggler: int) -> np.ndarray: ...

        def _decision(
            self, step: int, plan: Plan, findings: list[Finding], extra: dict[str, dict[str, Any]]
        ) -> Decision: ...

    def _predicted_total(self, plan: Plan, bucket_bytes: list[int], ran: Sequence[str] | None = None) -> float:
        """The cost model's AllReduce part of a step under ``plan``, summed over the buckets; with
        ``ran``, of a step whose buckets ran those algorithms (the first ``len(ran)`` buckets; a
        bucket that ran another algorithm than ``plan`` names is predicted without the plan's
        straggler and slowdowns)."""
        straggler = self.detector.straggler
        delays = self._bucket_delays(straggler) if straggler is not None and self._bucket_window else None
        slow = dict(self.detector.degraded)
        total = 0.0
        for b, nbytes in enumerate(bucket_bytes if ran is None else bucket_bytes[: len(ran)]):
            if nbytes <= 0:
                continue
            delay = float(delays[b]) if delays is not None and b < delays.size else 0.0
            algorithm = plan.algorithm_for(b) if ran is None else ran[b]
            planned = algorithm == plan.algorithm_for(b)
            total += self.model.predict(
                algorithm,
                nbytes,
                straggler=straggler,
                delay=delay,
                slowdowns=slow,
                planned_slowdowns=dict(plan.slowdowns) if planned and plan.slowdowns else None,
                planned_straggler=plan.straggler if planned else None,
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
