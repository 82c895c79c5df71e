"""The configuration classes that checkpoints of earlier versions hold, for unpickling only.

A ``DDPState`` (or loop) pickled by an earlier version holds the controller's configuration as a
``ControllerConfig`` (``stragglerkit.detect.controller_config``) with a ``DetectorConfig``
(``stragglerkit.detect.detector``) inside. Nothing constructs them any more: they exist so that
such a pickle loads, and :meth:`ControllerConfig.settings` turns one into the
:class:`~stragglerkit.detect.settings.Settings` the loop runs with now. Their slots are the
fields of those classes (a slotted dataclass pickles as its slots).
"""

from __future__ import annotations

from typing import Any

from stragglerkit.config import DetectionConfig
from stragglerkit.detect.settings import Settings
from stragglerkit.errors import ConfigError

__all__ = ["ControllerConfig", "DetectorConfig", "restore_slots"]


class DetectorConfig:
    """The detector's configuration as pickled before (``fraction`` is ``late_fraction``)."""

    __slots__ = (
        "clear_degraded_threshold",
        "clear_delay_ratio",
        "clear_fraction",
        "confirm",
        "degraded_threshold",
        "fraction",
        "window",
    )

    window: int
    fraction: float
    clear_fraction: float
    clear_delay_ratio: float
    confirm: int
    degraded_threshold: float
    clear_degraded_threshold: float

    def settings(self) -> Settings:
        """The settings it stands for (the rest at their defaults)."""
        return ControllerConfig.of_detector(self).settings()


class ControllerConfig:
    """The controller's configuration as pickled before: the detection fields (the detector's
    under other names), the executor's timeout and the internal values."""

    __slots__ = (
        "alarm_steps",
        "baseline",
        "clock_sync_every",
        "cooldown_steps",
        "detector",
        "exchange_every",
        "fit_samples",
        "healthy_memory_steps",
        "max_buckets",
        "min_bucket_bytes",
        "min_gain",
        "plan_probe_every",
        "prior",
        "probe_alarm",
        "probe_every",
        "quiet_after",
        "quiet_exchange_every",
        "quiet_probe_every",
        "replan_ratio",
        "rollback_margin",
        "settle_steps",
        "timeout",
        "verify_steps",
        "warmup_steps",
    )

    detector: DetectorConfig

    @classmethod
    def of_detector(cls, detector: DetectorConfig) -> ControllerConfig:
        config = cls()
        config.detector = detector
        return config

    def settings(self) -> Settings:
        """The settings it stands for: the detection fields under their public names, the
        internal values as they were (missing ones at today's defaults)."""
        known = {name: getattr(self, name) for name in self.__slots__ if hasattr(self, name)}
        detector = known.pop("detector", None)
        detection: dict[str, Any] = {
            name: known.pop(name)
            for name in ("warmup_steps", "exchange_every", "quiet_exchange_every", "probe_every", "min_gain")
            if name in known
        }
        detection.update({name: known.pop(name) for name in ("verify_steps", "cooldown_steps") if name in known})
        if detector is not None:
            for old, new in (("window", "window"), ("fraction", "late_fraction"), ("confirm", "confirm")):
                if hasattr(detector, old):
                    detection[new] = getattr(detector, old)
            if hasattr(detector, "degraded_threshold"):
                detection["degraded_threshold"] = detector.degraded_threshold
            for name in ("clear_fraction", "clear_delay_ratio"):
                if hasattr(detector, name):
                    known[name] = getattr(detector, name)
            if hasattr(detector, "clear_degraded_threshold"):
                known["clear_degraded_threshold"] = detector.clear_degraded_threshold
        return Settings(detection=_detection(detection), **known)


def _detection(values: dict[str, Any]) -> DetectionConfig:
    """A ``DetectionConfig`` of ``values``; one that today's checks reject (a threshold below
    what the public configuration allows, set through the old internal class) is kept as it was."""
    try:
        return DetectionConfig(**values)
    except ConfigError:
        detection = DetectionConfig()
        for name, value in values.items():
            setattr(detection, name, value)
        return detection


def restore_slots(obj: object, state: Any) -> dict[str, Any]:
    """The slots of a pickled slotted object: ``state`` as pickled by default (``(None, slots)``)
    or as a ``__getstate__`` dict."""
    if isinstance(state, tuple):
        state = {**(state[0] or {}), **(state[1] or {})}
    if not isinstance(state, dict):
        raise TypeError(f"cannot restore a {type(obj).__name__} from {type(state).__name__}")
    return dict(state)
