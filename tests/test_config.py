"""stragglerkit.Config: defaults, the YAML presets, validation that names the field, the
environment's overrides, misspelt variables, and the check that every rank has the same one."""

from __future__ import annotations

import re
from pathlib import Path

import api_bodies
import pytest
from _dist import run_group

from stragglerkit import Config, ConfigError
from stragglerkit.config import ENVIRONMENT, unknown_variables
from stragglerkit.detect.settings import settings_for

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("default", "short_job", "long_job")


def preset(name: str) -> Config:
    return Config.from_yaml(ROOT / "configs" / f"{name}.yaml")


def test_the_defaults_are_configs_default_yaml() -> None:
    assert preset("default") == Config()
    assert Config.from_dict({}) == Config()
    assert Config().to_dict() == preset("default").to_dict()


@pytest.mark.parametrize("name", PRESETS)
def test_each_preset_loads_and_validates(name: str, tmp_path: Path) -> None:
    config = preset(name)
    assert Config.from_dict(config.to_dict()) == config  # every field passes validation again
    written = tmp_path / f"{name}.yaml"
    written.write_text(config.to_yaml())
    assert Config.from_yaml(written) == config
    settings_for(config).validate()  # the loop's own checks of the internal values against it


def test_short_job_reacts_sooner_and_long_job_later() -> None:
    def latency(config: Config) -> int:
        d = config.detection
        return d.warmup_steps + d.window + d.confirm * d.exchange_every

    short_job, default, long_job = (preset(name) for name in ("short_job", "default", "long_job"))
    assert latency(short_job) < latency(default) < latency(long_job)
    assert long_job.detection.late_fraction > default.detection.late_fraction
    assert short_job.detection.probe_every < default.detection.probe_every < long_job.detection.probe_every
    assert long_job.executor.timeout > default.executor.timeout


@pytest.mark.parametrize(
    ("data", "suggestion"),
    [
        ({"detecton": {"window": 8}}, "unknown section 'detecton' (did you mean 'detection'?)"),
        ({"executor": {"timeot": 60}}, "executor has no field 'timeot' (did you mean 'timeout'?)"),
        ({"detection": {"windw": 8}}, "detection has no field 'windw' (did you mean 'window'?)"),
        ({"optcc": {"sendbuffer": "64KiB"}}, "optcc has no field 'sendbuffer' (did you mean 'send_buffer'?)"),
    ],
)
def test_unknown_names_suggest_the_closest(data: dict, suggestion: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(suggestion)):
        Config.from_dict(data)
    ((section, values),) = data.items()
    with pytest.raises(ConfigError, match=re.escape(suggestion.split(": ")[-1])):
        Config().replace(**{section: values})
    file = tmp_path / "typo.yaml"
    file.write_text(f"{section}:\n" + "".join(f"  {key}: {value}\n" for key, value in values.items()))
    with pytest.raises(ConfigError, match=re.escape(f"{file}: {suggestion}")):
        Config.from_yaml(file)


def test_a_missing_file_and_bad_yaml_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Config.from_yaml(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("detection: [window\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        Config.from_yaml(bad)


@pytest.mark.parametrize(
    ("data", "field", "what"),
    [
        ({"detection": {"window": "16"}}, "detection.window", "must be an integer"),
        ({"detection": {"window": 16.0}}, "detection.window", "must be an integer"),
        ({"detection": {"confirm": True}}, "detection.confirm", "must be an integer"),
        ({"executor": {"timeout": "fast"}}, "executor.timeout", "must be a number"),
        ({"detection": {"late_fraction": "most"}}, "detection.late_fraction", "must be a number"),
        ({"executor": {"timeout": 0}}, "executor.timeout", "positive"),
        ({"executor": {"timeout": -5.0}}, "executor.timeout", "positive"),
        ({"executor": {"send_buffer": 4096}}, "executor.send_buffer", "at least 8192 bytes"),
        ({"executor": {"send_buffer": "1KiB"}}, "executor.send_buffer", "at least 8192 bytes"),
        ({"executor": {"send_buffer": "lots"}}, "executor.send_buffer", "as a size"),
        ({"optcc": {"send_buffer": 8191}}, "optcc.send_buffer", "at least 8192 bytes"),
        ({"detection": {"late_fraction": 1.5}}, "detection.late_fraction", "at most 1"),
        ({"detection": {"late_fraction": 0.0}}, "detection.late_fraction", "must be above"),
        ({"detection": {"late_fraction": -0.5}}, "detection.late_fraction", "must be above"),
        ({"report": {"nvtx": "perhaps"}}, "report.nvtx", "true, false or auto"),
    ],
)
def test_bad_types_and_values_name_the_field(data: dict, field: str, what: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_dict(data)
    assert field in str(caught.value) and what in str(caught.value), str(caught.value)
    assert isinstance(caught.value, ValueError)
    ((section, values),) = data.items()
    with pytest.raises(ConfigError, match=re.escape(field)):
        Config().replace(**{section: values})


def test_good_values_are_kept() -> None:
    config = Config().replace(
        executor={"timeout": 60, "send_buffer": "256KiB"},
        optcc={"send_buffer": "off"},
        detection={"window": 32, "late_fraction": 1.0},
        report={"nvtx": "auto", "event_log": "events-{rank}.jsonl"},
    )
    assert config.executor.timeout == 60.0 and isinstance(config.executor.timeout, float)
    assert config.executor.send_buffer == 256 * 1024 and config.optcc.send_buffer is None
    assert config.detection.window == 32 and settings_for(config).detection.window == 32
    assert config.report.nvtx is None and config.report.event_log == "events-{rank}.jsonl"
    assert Config().detection.window == 16  # replace made a copy


GOOD_VALUES = {
    "STRAGGLERKIT_TIMEOUT": ("600", ("executor", "timeout"), 600.0),
    "STRAGGLERKIT_TCP_SEND_BUFFER": ("256KiB", ("executor", "send_buffer"), 256 * 1024),
    "STRAGGLERKIT_OPTCC_SEND_BUFFER": ("off", ("optcc", "send_buffer"), None),
    "STRAGGLERKIT_EVENT_LOG": ("events.jsonl", ("report", "event_log"), "events.jsonl"),
    "STRAGGLERKIT_NVTX": ("off", ("report", "nvtx"), False),
    "STRAGGLERKIT_WANDB": ("off", ("report", "wandb"), False),
    "STRAGGLERKIT_ACT": ("never", ("detection", "act"), "never"),
}
BAD_VALUES = {
    "STRAGGLERKIT_TIMEOUT": "soon",
    "STRAGGLERKIT_TCP_SEND_BUFFER": "1KiB",
    "STRAGGLERKIT_OPTCC_SEND_BUFFER": "small",
    "STRAGGLERKIT_NVTX": "perhaps",
    "STRAGGLERKIT_WANDB": "sometimes",
    "STRAGGLERKIT_ACT": "maybe",
}


def test_the_tables_cover_every_variable() -> None:
    assert set(GOOD_VALUES) == {variable.name for variable in ENVIRONMENT}
    for variable in ENVIRONMENT:
        assert GOOD_VALUES[variable.name][1] == (variable.section, variable.field), variable


@pytest.mark.parametrize("name", sorted(GOOD_VALUES))
def test_an_environment_variable_overrides_its_field(name: str) -> None:
    text, (section, field), expected = GOOD_VALUES[name]
    base = preset("long_job")
    config = base.with_env({name: text})
    assert getattr(getattr(config, section), field) == expected
    assert config.replace(**{section: {field: getattr(getattr(base, section), field)}}) == base  # nothing else
    assert Config.from_env({name: text}) == Config().with_env({name: text})
    assert base.with_env({name: "  "}) == base  # blank: not set


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_a_bad_environment_value_names_the_variable(name: str) -> None:
    value = BAD_VALUES[name]
    with pytest.raises(ConfigError, match=re.escape(f"{name}={value!r}")):
        Config().with_env({name: value})


def test_the_config_file_variable_and_overrides_on_top(tmp_path: Path) -> None:
    assert Config.from_env({}) == Config()
    path = str(ROOT / "configs" / "short_job.yaml")
    assert Config.from_env({"STRAGGLERKIT_CONFIG": path}) == preset("short_job")
    both = Config.from_env({"STRAGGLERKIT_CONFIG": path, "STRAGGLERKIT_TIMEOUT": "42"})
    assert both.executor.timeout == 42.0 and both.detection == preset("short_job").detection
    with pytest.raises(ConfigError, match="does not exist"):
        Config.from_env({"STRAGGLERKIT_CONFIG": str(tmp_path / "absent.yaml")})


def test_unknown_variables_get_the_closest_known_name() -> None:
    env = {
        "STRAGGLERKIT_TIME_OUT": "60",
        "STRAGGLERKIT_SEND_BUFFER": "1MiB",
        "STRAGGLERKIT_EVENTLOG": "x.jsonl",
        "STRAGGLERKIT_CONFG": "a.yaml",
        "STRAGGLERKIT_COLOUR": "blue",
        "STRAGGLERKIT_NVTX": "on",  # known
        "STRAGGLERKIT_CONFIG": "a.yaml",  # known
        "PATH": "/usr/bin",
    }
    assert unknown_variables(env) == [
        ("STRAGGLERKIT_COLOUR", None),
        ("STRAGGLERKIT_CONFG", "STRAGGLERKIT_CONFIG"),
        ("STRAGGLERKIT_EVENTLOG", "STRAGGLERKIT_EVENT_LOG"),
        ("STRAGGLERKIT_SEND_BUFFER", "STRAGGLERKIT_TCP_SEND_BUFFER"),
        ("STRAGGLERKIT_TIME_OUT", "STRAGGLERKIT_TIMEOUT"),
    ]
    assert unknown_variables({"STRAGGLERKIT_TIMEOUT": "1"}) == []


def test_removed_settings_are_unknown() -> None:
    """The switches whose winners are now fixed in the code have no effect; init names them."""
    removed = [
        "STRAGGLERKIT_POST_AHEAD",
        "STRAGGLERKIT_DUPLEX",
        "STRAGGLERKIT_WAIT_MODE",
        "STRAGGLERKIT_OPTCC_SIZING",
        "STRAGGLERKIT_OPTCC_BUBBLE_FILLING",
        "STRAGGLERKIT_OPTCC_MESSAGE_BYTES",
    ]
    assert [name for name, _ in unknown_variables(dict.fromkeys(removed, "on"))] == sorted(removed)


def test_every_variable_the_package_reads_is_known() -> None:
    """A STRAGGLERKIT_* name in the package is either an ENVIRONMENT override or the config file."""
    used: set[str] = set()
    for path in (ROOT / "stragglerkit").rglob("*.py"):
        if path.name == "units.py":
            continue  # its docstring's example of switch_from_env names a made-up variable
        used.update(re.findall(r"STRAGGLERKIT_[A-Z][A-Z_]*[A-Z]", path.read_text()))
    assert used, "found no STRAGGLERKIT_* names in the package"
    assert used == {variable.name for variable in ENVIRONMENT} | {"STRAGGLERKIT_CONFIG"}


def test_docs_list_every_environment_variable() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    missing = [name for name in [v.name for v in ENVIRONMENT] + ["STRAGGLERKIT_CONFIG"] if f"`{name}`" not in text]
    assert not missing, f"docs/configuration.md lacks {missing}"


def test_a_rank_with_another_configuration_is_named_on_every_rank() -> None:
    """Rank 1's detection window differs: every rank raises a ConfigError naming rank 1 and the
    field at once (the check is one all-gather in init), and none is left initialised."""
    results = run_group(3, api_bodies.different_window_on_one_rank, timeout=60)
    for rank, out in results.items():
        error = out["error"]
        assert error.startswith("ConfigError") and "ValueError" in out["kinds"], (rank, error)
        assert "detection.window differs" in error and "32 on rank(s) 1" in error, (rank, error)
        assert "16 on rank(s) 0, 2" in error, (rank, error)
        assert out["seconds"] < 30 and not out["initialized"], (rank, out)
