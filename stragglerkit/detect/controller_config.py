"""The closed loop's configuration: :class:`ControllerConfig`, every knob of detection and planning."""

from __future__ import annotations

from dataclasses import dataclass, field

from stragglerkit.config import Config
from stragglerkit.detect.detector import DetectorConfig
from stragglerkit.detect.model import BASELINES
from stragglerkit.sim.cost_model import CostModel

__all__ = ["BASELINE_CHOICES", "ControllerConfig", "controller_config"]

BASELINE_CHOICES = ("allreduce", *BASELINES)
"""What ``ControllerConfig.baseline`` may name (``allreduce``: the process group's own)."""

_AT_LEAST_0 = (
    "warmup_steps",
    "settle_steps",
    "cooldown_steps",
    "probe_every",
    "quiet_probe_every",
    "plan_probe_every",
    "clock_sync_every",
    "quiet_exchange_every",
)
_AT_LEAST_1 = (
    "exchange_every",
    "verify_steps",
    "max_buckets",
    "fit_samples",
    "quiet_after",
    "alarm_steps",
    "healthy_memory_steps",
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
    collectives run (each exchange costs CPU on every rank) and how soon rank 0 hears of a
    change. A straggler that appears while quiet is
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
    costs more than a plain one (the ring is slower than gloo's own AllReduce): this is the interval while
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
    some 15 %, so a smaller factor would rebuild on noise."""
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
        for least, names in ((0, _AT_LEAST_0), (1, _AT_LEAST_1)):
            for name in names:
                if getattr(self, name) < least:
                    raise ValueError(f"ControllerConfig.{name} must be >= {least}, got {getattr(self, name)}")
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


def controller_config(config: Config) -> ControllerConfig:
    """The controller's full configuration for ``config``: its ``detection`` fields and the
    executor's timeout, the internal tuning at its defaults (quiet probes every multiple of
    ``probe_every`` from 64 steps on)."""
    detection = config.detection
    probe = detection.probe_every
    return ControllerConfig(
        warmup_steps=detection.warmup_steps,
        exchange_every=detection.exchange_every,
        quiet_exchange_every=detection.quiet_exchange_every,
        probe_every=probe,
        quiet_probe_every=probe * -(-64 // probe) if probe > 0 else 0,
        detector=DetectorConfig(
            window=detection.window,
            fraction=detection.late_fraction,
            confirm=detection.confirm,
            degraded_threshold=detection.degraded_threshold,
        ),
        min_gain=detection.min_gain,
        verify_steps=detection.verify_steps,
        cooldown_steps=detection.cooldown_steps,
        timeout=config.executor.timeout,
    )
