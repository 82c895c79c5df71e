"""Ready-made configurations of the detection loop (``stragglerkit.DDPState(..., config=...)``).

Each function returns a :class:`~stragglerkit.detect.controller.ControllerConfig`; start from the
one that fits the job and change single fields with ``dataclasses.replace``. docs/detection.md
explains every field and how the detection latency follows from them.

Example::

    import dataclasses, stragglerkit
    from configs.detection import long_job

    config = dataclasses.replace(long_job(), timeout=600.0)
    state = stragglerkit.DDPState(None, config=config)
"""

from __future__ import annotations

from stragglerkit.detect.controller import ControllerConfig
from stragglerkit.detect.detector import DetectorConfig

__all__ = ["CONFIGS", "default", "long_job", "short_job"]


def default() -> ControllerConfig:
    """The library defaults: a straggler that appears at step s is acted on by about s + 20."""
    return ControllerConfig()


def short_job() -> ControllerConfig:
    """Benchmarks and short fine-tuning runs: react within about 10 steps, at some risk of flapping.

    Half the window and warm-up of the defaults, an exchange every step (every 2nd while all is
    quiet), one confirmation, a link probe every 4th step (a degraded NIC is then found within
    about 12 steps).
    """
    return ControllerConfig(
        warmup_steps=5,
        exchange_every=1,
        quiet_exchange_every=2,
        probe_every=4,
        detector=DetectorConfig(window=8, fraction=0.75, confirm=1),
        verify_steps=4,
    )


def long_job() -> ControllerConfig:
    """Multi-day pre-training on a shared cluster: switch only on strong, lasting evidence.

    A window of 64 steps, 85 % of them with the same last rank, three confirmations, a 10 % gain
    required, a rolled-back plan left alone for 2000 steps, a link probe every 16th step (the
    probes' cost halved; a degraded NIC is found within about 112 steps) and an exchange every 4th
    step (every 16th while all is quiet).
    """
    return ControllerConfig(
        warmup_steps=20,
        exchange_every=4,
        quiet_exchange_every=16,
        probe_every=16,
        detector=DetectorConfig(window=64, fraction=0.85, confirm=3),
        min_gain=0.10,
        verify_steps=16,
        cooldown_steps=2000,
    )


CONFIGS = {"default": default, "short_job": short_job, "long_job": long_job}
"""Name -> configuration function, for command lines that take ``--config NAME``."""
