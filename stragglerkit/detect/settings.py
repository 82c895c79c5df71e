"""What the closed loop runs with: the user's ``Config.detection`` plus the internal constants.

:class:`Settings` is built from a :class:`stragglerkit.Config` by :func:`settings_for` and is no
input of any public signature: a user sets ``Config`` (its ``detection`` fields, under their
own names), and every other value comes from :mod:`stragglerkit.defaults`. The detection fields
are not copied: ``settings.detection`` *is* the user's ``DetectionConfig``.

Tests and the benchmark lab change an internal constant for the loops they create with
:func:`tuned` (``with tuned(settle_steps=0): DDPState(None, config)``), or construct a
component with ``Settings.of(...)`` directly.

Example::

    settings = settings_for(stragglerkit.Config())
    settings.detection.window, settings.min_bucket_bytes       # 16, 65536
    Settings.of(window=8, settle_steps=0)                       # a unit test's
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from stragglerkit import defaults
from stragglerkit.config import ACT_CHOICES, Config, DetectionConfig, ExecutorConfig, restore_fields
from stragglerkit.detect.model import BASELINES
from stragglerkit.errors import ConfigError
from stragglerkit.sim.cost_model import CostModelParams

__all__ = [
    "BASELINE_CHOICES",
    "PROVEN_BACKENDS",
    "TUNABLE",
    "ActDecision",
    "Settings",
    "act_decision",
    "settings_for",
    "tuned",
]

BASELINE_CHOICES = ("allreduce", *BASELINES)
"""What ``Settings.baseline`` may name (``allreduce``: the process group's own)."""

_AT_LEAST_0 = ("settle_steps", "plan_probe_every", "clock_sync_every")
_AT_LEAST_1 = ("max_buckets", "fit_samples", "quiet_after", "alarm_steps", "healthy_memory_steps")


def _prior() -> CostModelParams:
    return CostModelParams(alpha=defaults.PRIOR_ALPHA, beta=defaults.PRIOR_BETA)


@dataclass(kw_only=True, slots=True)
class Settings:
    """The closed loop's settings; each internal one is documented where its default is
    (:mod:`stragglerkit.defaults`, the same name in capitals)."""

    detection: DetectionConfig = field(default_factory=DetectionConfig)
    """The user's ``Config.detection`` (the same object, not a copy)."""
    timeout: float = field(default_factory=lambda: ExecutorConfig().timeout)
    """``Config.executor.timeout``: seconds a rank waits for a peer."""
    acting: bool = True
    """Does the loop switch plans and probe (:func:`act_decision` of ``detection.act`` and the
    group's backend)? ``False``: it observes only, as with ``probe_every`` 0 and a controller
    whose plans are recorded as ``would_switch`` instead of adopted."""
    baseline: str = defaults.BASELINE
    quiet_probe_every: int | None = None
    """``None``: ``defaults.QUIET_PROBE_EVERY`` rounded up to a multiple of ``detection.probe_every``;
    0: the probes never back off."""
    plan_probe_every: int = defaults.PLAN_PROBE_EVERY
    replan_ratio: float = defaults.REPLAN_RATIO
    clock_sync_every: int = defaults.CLOCK_SYNC_EVERY
    quiet_after: int = defaults.QUIET_AFTER
    probe_alarm: float = defaults.PROBE_ALARM
    alarm_steps: int = defaults.ALARM_STEPS
    healthy_memory_steps: int = defaults.HEALTHY_MEMORY_STEPS
    min_bucket_bytes: int = defaults.MIN_BUCKET_BYTES
    settle_steps: int = defaults.SETTLE_STEPS
    rollback_margin: float = defaults.ROLLBACK_MARGIN
    max_buckets: int = defaults.MAX_BUCKETS
    fit_samples: int = defaults.FIT_SAMPLES
    clear_fraction: float = defaults.CLEAR_FRACTION
    clear_delay_ratio: float = defaults.CLEAR_DELAY_RATIO
    clear_degraded_threshold: float = defaults.CLEAR_DEGRADED
    prior: CostModelParams = field(default_factory=_prior)
    """The cost model until the first fit (``defaults.PRIOR_ALPHA``, ``defaults.PRIOR_BETA``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.detection, DetectionConfig):
            raise TypeError(f"Settings.detection must be a DetectionConfig, got {type(self.detection).__name__}")
        if self.quiet_probe_every is None:
            probe = self.detection.probe_every
            self.quiet_probe_every = probe * -(-defaults.QUIET_PROBE_EVERY // probe) if probe > 0 else 0
        self.validate()

    def validate(self) -> None:
        """Check the internal values against each other and the detection fields (:class:`ConfigError`)."""
        for least, names in ((0, _AT_LEAST_0), (1, _AT_LEAST_1)):
            for name in names:
                if getattr(self, name) < least:
                    raise ConfigError(f"Settings.{name} must be >= {least}, got {getattr(self, name)}")
        if self.baseline not in BASELINE_CHOICES:
            raise ConfigError(f"Settings.baseline must be one of {', '.join(BASELINE_CHOICES)}, got {self.baseline!r}")
        if not 0 <= self.rollback_margin < 1:
            raise ConfigError(f"Settings.rollback_margin must be in [0, 1), got {self.rollback_margin}")
        quiet, busy = self.quiet_probe_every or 0, self.detection.probe_every
        if quiet < 0 or (quiet and busy and (quiet % busy or quiet < busy)):
            raise ConfigError(
                f"Settings.quiet_probe_every ({quiet}) must be a multiple of probe_every ({busy}) "
                "that is at least as large, or 0 to never back off"
            )
        if not self.replan_ratio > 1:
            raise ConfigError(f"Settings.replan_ratio must be above 1 (a factor), got {self.replan_ratio}")
        if not self.probe_alarm > 1:
            raise ConfigError(f"Settings.probe_alarm must be above 1 (a factor), got {self.probe_alarm}")
        if not self.timeout > 0:
            raise ConfigError(f"Settings.timeout must be positive seconds, got {self.timeout}")
        if not 0 < self.clear_fraction < self.detection.late_fraction <= 1:
            raise ConfigError(
                f"need 0 < clear_fraction ({self.clear_fraction}) < late_fraction ({self.detection.late_fraction}) "
                "<= 1 for hysteresis"
            )
        if not 0 <= self.clear_delay_ratio <= 1:
            raise ConfigError(f"clear_delay_ratio must be in [0, 1], got {self.clear_delay_ratio}")
        if not 1 < self.clear_degraded_threshold <= self.detection.degraded_threshold:
            raise ConfigError(
                f"need 1 < clear_degraded_threshold ({self.clear_degraded_threshold}) <= degraded_threshold "
                f"({self.detection.degraded_threshold})"
            )

    @property
    def probe_every(self) -> int:
        """The probe interval the loop starts with: ``detection.probe_every`` while acting, 0 (no
        probes) while it observes only. A probe runs stragglerkit's ring on a real gradient bucket,
        so a loop that observes only runs none: "never switch" then holds for every bucket of every
        step, and its NIC findings come from sysfs link speeds, as with ``probe_every`` 0."""
        return self.detection.probe_every if self.acting else 0

    @property
    def probes_back_off(self) -> bool:
        """Do the baseline's probes back off (``allreduce`` baseline, probes on, a longer quiet interval)?"""
        quiet, busy = self.quiet_probe_every, self.probe_every
        return self.baseline == "allreduce" and busy > 0 and quiet not in (0, busy)

    @classmethod
    def of(cls, **fields: Any) -> Settings:
        """Settings from field names of both kinds: ``DetectionConfig``'s (``window=8``) and the
        internal ones (``settle_steps=0``), the rest at their defaults (unit tests)."""
        names = {f.name for f in dataclasses.fields(DetectionConfig)}
        detection = {k: fields.pop(k) for k in list(fields) if k in names}
        if "detection" in fields and detection:
            raise TypeError("give either detection= or detection fields, not both")
        if "detection" not in fields:
            fields["detection"] = DetectionConfig(**detection)
        return cls(**fields)

    def header(self) -> dict[str, Any]:
        """Plain data for the event log's ``run`` header (docs/event_log.md)."""
        return dataclasses.asdict(self)

    def __setstate__(self, state: Any) -> None:
        restore_fields(self, state)  # a checkpoint's settings from before ``acting`` existed: True


TUNABLE = tuple(f.name for f in dataclasses.fields(Settings) if f.name not in ("detection", "timeout", "acting"))
"""The internal settings :func:`tuned` may change."""

_TUNING: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("stragglerkit_tuning", default=None)


@contextlib.contextmanager
def tuned(**values: Any) -> Iterator[None]:
    """Loops created inside the block run with these internal settings changed (tests, the lab).

    Example::

        with tuned(min_bucket_bytes=1024, settle_steps=0):
            state = stragglerkit.DDPState(None, config)
    """
    unknown = sorted(set(values) - set(TUNABLE))
    if unknown:
        public = [name for name in unknown if name in {f.name for f in dataclasses.fields(DetectionConfig)}]
        hint = f"; {', '.join(public)}: set it on the Config (config.replace(detection={{...}}))" if public else ""
        raise ConfigError(f"not an internal setting: {', '.join(unknown)}{hint}; known: {', '.join(TUNABLE)}")
    token = _TUNING.set({**(_TUNING.get() or {}), **values})
    try:
        yield
    finally:
        _TUNING.reset(token)


def settings_for(config: Config, acting: bool = True) -> Settings:
    """The loop's settings for ``config``: its ``detection`` section, ``executor.timeout``, and the
    internal constants (changed where a :func:`tuned` block says so); ``acting``: does the loop
    switch plans on its group (:func:`act_decision`)?"""
    tuning = _TUNING.get() or {}
    return Settings(detection=config.detection, timeout=config.executor.timeout, acting=acting, **tuning)


PROVEN_BACKENDS = ("gloo",)
"""Process-group backends over which stragglerkit's executor has run with several ranks, in the
tests and the benchmarks. NCCL is not among them: its tests need a GPU per rank."""


@dataclass(frozen=True, slots=True)
class ActDecision:
    """Whether the loop switches plans on a group, and why (what the ``observing`` event says)."""

    acts: bool
    reason: str


def act_decision(act: str, backend: str) -> ActDecision:
    """Does a loop with ``detection.act`` = ``act`` switch plans on a process group of ``backend``
    (``dist.get_backend``'s name: ``gloo``, ``nccl``, ``cpu:gloo,cuda:nccl``, ...)? Pure.

    Example::

        act_decision("auto", "nccl")     # ActDecision(acts=False, reason="NCCL process group: ...")
        act_decision("always", "nccl")   # ActDecision(acts=True, reason="act='always' ...")
    """
    if act not in ACT_CHOICES:
        raise ConfigError(f"detection.act must be one of {', '.join(ACT_CHOICES)}, got {act!r}")
    name = str(backend).lower()
    if act == "never":
        return ActDecision(
            False,
            "act='never': stragglerkit observes only (detects, reports, logs) and never switches; every "
            "bucket runs the group's own AllReduce (or the framework's) and no probe runs stragglerkit's ring",
        )
    if act == "always":
        return ActDecision(True, f"act='always': stragglerkit switches on this {name} process group")
    if name in PROVEN_BACKENDS:
        return ActDecision(True, f"act='auto' on a {name} process group, where stragglerkit's executor is proven")
    if "nccl" in name:
        why = "NCCL process group: stragglerkit's executor is not yet proven over NCCL with several ranks"
    else:
        why = f"{name} process group: stragglerkit's executor is proven on gloo process groups only"
    return ActDecision(
        False,
        f"{why}, so the group's own AllReduce runs every bucket; set detection.act='always' "
        "(or STRAGGLERKIT_ACT=always) to let it switch",
    )
