"""The ready-made configurations in configs/ construct, validate and differ as documented."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs.detection import CONFIGS, default, long_job, short_job
from stragglerkit.detect.controller_config import ControllerConfig


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_config_is_a_valid_controller_config(name: str) -> None:
    config = CONFIGS[name]()
    assert isinstance(config, ControllerConfig)
    dataclasses.replace(config)  # re-runs the validation


def test_short_job_reacts_sooner_and_long_job_later() -> None:
    def latency(c: ControllerConfig) -> int:
        return c.warmup_steps + c.detector.window + c.detector.confirm * c.exchange_every

    assert latency(short_job()) < latency(default()) < latency(long_job())
    assert long_job().detector.fraction > default().detector.fraction
    # links are measured more often when the job must react sooner
    assert short_job().probe_every < default().probe_every < long_job().probe_every
    assert default() == ControllerConfig()


def test_bad_override_is_refused() -> None:
    with pytest.raises(ValueError, match="exchange_every"):
        dataclasses.replace(short_job(), exchange_every=0)
