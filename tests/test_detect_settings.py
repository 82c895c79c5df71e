"""The loop's settings alone: built from a Config under its public names and the defaults module's
values, changed for a scope by ``tuned``, refused with a ConfigError naming the field; and no public
signature takes the old ControllerConfig."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from _dist import run_group

from stragglerkit import Config, ConfigError, defaults
from stragglerkit.config import DetectionConfig
from stragglerkit.detect.legacy import ControllerConfig
from stragglerkit.detect.settings import TUNABLE, Settings, settings_for, tuned

DEFAULT_NAME = {"clear_degraded_threshold": "CLEAR_DEGRADED"}
"""A setting whose constant in stragglerkit.defaults is not its own name in capitals."""


# -- from a Config -----------------------------------------------------------------------------
def test_settings_hold_the_configs_detection_section_itself() -> None:
    config = Config().replace(detection={"window": 32, "late_fraction": 0.9}, executor={"timeout": 42})
    settings = settings_for(config)
    assert settings.detection is config.detection  # the user's object, not a copy under other names
    assert settings.detection.late_fraction == 0.9 and settings.timeout == 42.0
    header = settings.header()
    assert header["detection"] == dataclasses.asdict(config.detection)
    assert set(header["detection"]) == {f.name for f in dataclasses.fields(DetectionConfig)}
    assert "fraction" not in header["detection"] and "detector" not in header  # the old names are gone
    assert settings_for(Config()) == Settings()


def test_every_internal_value_is_the_defaults_modules() -> None:
    settings = settings_for(Config())
    used = set()
    for name in TUNABLE:
        if name in ("prior", "quiet_probe_every"):
            continue
        constant = DEFAULT_NAME.get(name, name.upper())
        assert getattr(settings, name) == getattr(defaults, constant), name
        used.add(constant)
    assert settings.prior.alpha == defaults.PRIOR_ALPHA and settings.prior.beta == defaults.PRIOR_BETA
    assert settings.quiet_probe_every == defaults.QUIET_PROBE_EVERY  # a multiple of probe_every (8) already
    used |= {"PRIOR_ALPHA", "PRIOR_BETA", "QUIET_PROBE_EVERY"}
    assert set(defaults.__all__) - used == {"HOSTS_WAIT_S"}  # the loop's own wait, no setting


def test_the_quiet_probe_interval_follows_the_configured_probe_interval() -> None:
    assert settings_for(Config().replace(detection={"probe_every": 12})).quiet_probe_every == 72
    assert settings_for(Config().replace(detection={"probe_every": 64})).quiet_probe_every == 64
    no_probes = settings_for(Config().replace(detection={"probe_every": 0}))
    assert no_probes.quiet_probe_every == 0 and not no_probes.probes_back_off


def test_settings_of_takes_both_kinds_of_name_and_not_the_old_ones() -> None:
    settings = Settings.of(window=8, late_fraction=0.8, settle_steps=0)
    assert (settings.detection.window, settings.detection.late_fraction, settings.settle_steps) == (8, 0.8, 0)
    assert settings.detection == DetectionConfig(window=8, late_fraction=0.8)
    with pytest.raises(TypeError, match="fraction"):
        Settings.of(fraction=0.8)  # ControllerConfig's name for late_fraction
    with pytest.raises(TypeError, match="either detection= or detection fields"):
        Settings.of(detection=DetectionConfig(), window=8)
    with pytest.raises(TypeError, match="must be a DetectionConfig"):
        Settings(detection=ControllerConfig())  # type: ignore[arg-type]


# -- tuned -------------------------------------------------------------------------------------
def test_tuned_changes_an_internal_value_only_inside_its_scope() -> None:
    config = Config()
    with tuned(settle_steps=0, min_bucket_bytes=1024):
        inside = settings_for(config)
        with tuned(settle_steps=5):  # nested: merged, the inner value wins
            nested = settings_for(config)
        after_nested = settings_for(config)
        assert Settings().settle_steps == defaults.SETTLE_STEPS  # only settings_for reads the scope
    outside = settings_for(config)
    assert (inside.settle_steps, inside.min_bucket_bytes) == (0, 1024)
    assert (nested.settle_steps, nested.min_bucket_bytes) == (5, 1024)
    assert (after_nested.settle_steps, after_nested.min_bucket_bytes) == (0, 1024)
    assert (outside.settle_steps, outside.min_bucket_bytes) == (defaults.SETTLE_STEPS, defaults.MIN_BUCKET_BYTES)
    assert inside.detection is config.detection  # the public values are the Config's


def test_tuned_ends_with_its_block_also_on_an_error() -> None:
    with pytest.raises(RuntimeError, match="inside"), tuned(quiet_probe_every=0):
        assert settings_for(Config()).quiet_probe_every == 0
        raise RuntimeError("inside")
    assert settings_for(Config()).quiet_probe_every == defaults.QUIET_PROBE_EVERY


@pytest.mark.parametrize("name", ["window", "timeout", "detection", "fraction"])
def test_tuned_refuses_what_is_not_an_internal_setting(name: str) -> None:
    with pytest.raises(ConfigError, match=f"not an internal setting: {name}") as caught, tuned(**{name: 1}):
        pass
    assert "known: baseline, quiet_probe_every" in str(caught.value)
    if name == "window":  # a detection field: the message says where it is set
        assert "window: set it on the Config (config.replace(detection={...}))" in str(caught.value)


# -- invalid values ----------------------------------------------------------------------------
BAD: list[tuple[dict[str, Any], str]] = [
    ({"settle_steps": -1}, "Settings.settle_steps must be >= 0, got -1"),
    ({"fit_samples": 0}, "Settings.fit_samples must be >= 1, got 0"),
    ({"baseline": "stragglar"}, "Settings.baseline must be one of allreduce, ring"),
    ({"rollback_margin": 1.0}, "Settings.rollback_margin must be in [0, 1), got 1.0"),
    ({"quiet_probe_every": 12}, "Settings.quiet_probe_every (12) must be a multiple of probe_every (8)"),
    ({"replan_ratio": 1.0}, "Settings.replan_ratio must be above 1 (a factor), got 1.0"),
    ({"probe_alarm": 0.9}, "Settings.probe_alarm must be above 1 (a factor), got 0.9"),
    ({"clear_fraction": 0.8}, "need 0 < clear_fraction (0.8) < late_fraction (0.75) <= 1 for hysteresis"),
    ({"clear_delay_ratio": 1.5}, "clear_delay_ratio must be in [0, 1], got 1.5"),
    ({"clear_degraded_threshold": 1.6}, "need 1 < clear_degraded_threshold (1.6) <= degraded_threshold (1.5)"),
]


@pytest.mark.parametrize(("values", "message"), BAD, ids=[next(iter(v)) for v, _ in BAD])
def test_a_bad_internal_value_is_a_config_error_naming_it(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.of(**values)
    with tuned(**values), pytest.raises(ConfigError, match=re.escape(message)):
        settings_for(Config())  # what DDPState or StragglerLoop would build in the block
    settings_for(Config())  # and nothing is left over after it


def test_internal_values_are_checked_against_the_configs_detection() -> None:
    """quiet_probe_every = 12 suits probes every 4 steps, not every 8."""
    with tuned(quiet_probe_every=12):
        assert settings_for(Config().replace(detection={"probe_every": 4})).quiet_probe_every == 12
        with pytest.raises(ConfigError, match=re.escape("probe_every (8)")):
            settings_for(Config())


def test_a_bad_detection_value_is_refused_by_the_config_under_its_public_name() -> None:
    with pytest.raises(ConfigError, match=re.escape("detection.window must be an integer >= 2, got 1")):
        Config().replace(detection={"window": 1})
    with pytest.raises(ConfigError, match=re.escape("detection has no field 'fraction'")):
        Config().replace(detection={"fraction": 0.8})


# -- no public signature takes a ControllerConfig ----------------------------------------------
def refused_controller_configs(rank: int, world_size: int) -> dict[str, str]:
    """On each rank of a group: what DDPState, StragglerLoop and straggler_aware say to a ControllerConfig."""
    import torch

    import stragglerkit
    from stragglerkit.session import session_for

    stragglerkit.init()
    old = ControllerConfig()
    calls = {
        "DDPState": lambda: stragglerkit.DDPState(None, old),  # type: ignore[arg-type]
        "StragglerLoop": lambda: stragglerkit.StragglerLoop(session_for(None), old),  # type: ignore[arg-type]
        "straggler_aware": lambda: stragglerkit.straggler_aware(
            torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1),
            config=old,  # type: ignore[arg-type]
        ),
    }
    said = {}
    for name, call in calls.items():
        try:
            call()
        except Exception as err:
            said[name] = f"{type(err).__name__}: {err}"
        else:
            said[name] = "accepted"
    stragglerkit.destroy()
    return said


def test_ddp_state_the_loop_and_straggler_aware_refuse_a_controller_config() -> None:
    for rank, said in run_group(2, refused_controller_configs, timeout=60).items():
        for name, message in said.items():
            assert "config must be a stragglerkit.Config" in message and message.startswith("ConfigError"), message
            assert "got ControllerConfig" in message, (rank, name, message)


def test_straggler_aware_refuses_a_controller_config_before_any_group_exists() -> None:
    """Refused when wrapped, not later: also an optimizer class, a builder, and one rank alone."""
    import torch

    from stragglerkit import straggler_aware

    for target in (torch.optim.SGD, lambda: torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), None):
        expected = "straggler_aware: config must be a stragglerkit.Config or None"
        with pytest.raises(ConfigError, match=re.escape(expected)):
            straggler_aware(target, config=ControllerConfig())  # type: ignore[arg-type]


def test_megatron_install_refuses_a_controller_config() -> None:
    from stragglerkit.megatron import MegatronConfig, install

    with pytest.raises(ConfigError, match=r"install's settings must be .* got ControllerConfig"):
        install(object(), ControllerConfig())  # type: ignore[arg-type]
    expected = "MegatronConfig.config must be a stragglerkit.Config or None, got ControllerConfig"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        MegatronConfig(straggler_aware_allreduce=True, config=ControllerConfig())  # type: ignore[arg-type]
