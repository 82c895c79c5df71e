"""The ready-made configurations in configs/ load, validate and differ as documented."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stragglerkit import Config
from stragglerkit.detect.controller_config import ControllerConfig, controller_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESETS = ("default", "short_job", "long_job")


def preset(name: str) -> ControllerConfig:
    return controller_config(Config.from_yaml(CONFIGS / f"{name}.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_each_config_is_a_valid_controller_config(name: str) -> None:
    config = preset(name)
    assert isinstance(config, ControllerConfig)
    dataclasses.replace(config)  # re-runs the validation


def test_short_job_reacts_sooner_and_long_job_later() -> None:
    def latency(c: ControllerConfig) -> int:
        return c.warmup_steps + c.detector.window + c.detector.confirm * c.exchange_every

    short_job, default, long_job = (preset(name) for name in ("short_job", "default", "long_job"))
    assert latency(short_job) < latency(default) < latency(long_job)
    assert long_job.detector.fraction > default.detector.fraction
    # links are measured more often when the job must react sooner
    assert short_job.probe_every < default.probe_every < long_job.probe_every
    assert default == ControllerConfig()


def test_bad_override_is_refused() -> None:
    with pytest.raises(ValueError, match="exchange_every"):
        dataclasses.replace(preset("short_job"), exchange_every=0)
