"""The ready-made configurations in configs/ load, validate and differ as documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from stragglerkit import Config
from stragglerkit.detect.settings import Settings, settings_for

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESETS = ("default", "short_job", "long_job")


def preset(name: str) -> Settings:
    return settings_for(Config.from_yaml(CONFIGS / f"{name}.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_each_config_gives_valid_loop_settings(name: str) -> None:
    settings = preset(name)
    assert isinstance(settings, Settings)
    settings.validate()


def test_short_job_reacts_sooner_and_long_job_later() -> None:
    def latency(s: Settings) -> int:
        d = s.detection
        return d.warmup_steps + d.window + d.confirm * d.exchange_every

    short_job, default, long_job = (preset(name) for name in ("short_job", "default", "long_job"))
    assert latency(short_job) < latency(default) < latency(long_job)
    assert long_job.detection.late_fraction > default.detection.late_fraction
    # links are measured more often when the job must react sooner
    assert short_job.detection.probe_every < default.detection.probe_every < long_job.detection.probe_every
    assert default == Settings()


def test_bad_override_is_refused() -> None:
    with pytest.raises(ValueError, match="exchange_every"):
        Config.from_yaml(CONFIGS / "short_job.yaml").replace(detection={"exchange_every": 0})
