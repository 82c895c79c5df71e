"""The STRAGGLERKIT_* settings table (runtime/settings.py): every setting known, bad values named.

The checks across ranks run on real gloo groups in tests/test_executor_faults.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stragglerkit.runtime import settings

ROOT = Path(__file__).resolve().parents[1]
GOOD = {
    "STRAGGLERKIT_TCP_SEND_BUFFER": "256KiB",
    "STRAGGLERKIT_OPTCC_SEND_BUFFER": "64KiB",
    "STRAGGLERKIT_DUPLEX": "0",
    "STRAGGLERKIT_OPTCC_MESSAGE_BYTES": "128KiB",
    "STRAGGLERKIT_OPTCC_SIZING": "lp",
    "STRAGGLERKIT_OPTCC_BUBBLE_FILLING": "off",
    "STRAGGLERKIT_POST_AHEAD": "off",
    "STRAGGLERKIT_WAIT_MODE": "ordered",
    "STRAGGLERKIT_NVTX": "0",
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for setting in settings.SETTINGS:
        monkeypatch.delenv(setting.name, raising=False)
    return monkeypatch


def test_every_setting_the_package_reads_is_in_the_table() -> None:
    """A new STRAGGLERKIT_* variable must be registered, or the checks would not know it."""
    used: set[str] = set()
    for path in (ROOT / "stragglerkit").rglob("*.py"):
        used.update(re.findall(r"STRAGGLERKIT_[A-Z][A-Z_]*[A-Z]", path.read_text()))
    used.discard("STRAGGLERKIT_WAITMODE")  # runtime/settings.py's example of a misspelt name
    assert used, "found no STRAGGLERKIT_* names in the package"
    assert used == {setting.name for setting in settings.SETTINGS}
    assert set(GOOD) == used


def test_the_readme_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [setting.name for setting in settings.SETTINGS if f"`{setting.name}`" not in readme]
    assert not missing, f"README's settings table lacks {missing}"


@pytest.mark.parametrize("name", list(GOOD))
def test_a_bad_value_is_named(name: str, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(name, "maybe")
    with pytest.raises(ValueError, match=re.escape(f"{name}='maybe'")):
        settings.check_local()


def test_good_values_pass(clean_env: pytest.MonkeyPatch) -> None:
    settings.check_local()  # nothing set
    for name, value in GOOD.items():
        clean_env.setenv(name, value)
    settings.check_local()
    assert settings.check_local({"STRAGGLERKIT_POST_AHEAD": "sometimes"}) is None  # only the mapping given


def test_duplex_switch(clean_env: pytest.MonkeyPatch) -> None:
    assert settings.duplex_enabled()
    for text, expected in (("off", False), ("0", False), ("No", False), ("on", True), ("1", True)):
        clean_env.setenv("STRAGGLERKIT_DUPLEX", text)
        assert settings.duplex_enabled() is expected, text


def test_nvtx_switch(clean_env: pytest.MonkeyPatch) -> None:
    from stragglerkit.report import nvtx

    assert nvtx.forced_setting() is None
    clean_env.setenv("STRAGGLERKIT_NVTX", "off")
    assert nvtx.forced_setting() is False
    clean_env.setenv("STRAGGLERKIT_NVTX", "yes")
    assert nvtx.forced_setting() is True
    clean_env.setenv("STRAGGLERKIT_NVTX", "perhaps")
    with pytest.raises(ValueError, match="STRAGGLERKIT_NVTX='perhaps'"):
        nvtx.forced_setting()
    nvtx.refresh()  # a bad value does not break detection (the runtime's check reports it)


def test_unknown_names_get_the_closest_setting() -> None:
    env = {
        "STRAGGLERKIT_WAITMODE": "ordered",
        "STRAGGLERKIT_SEND_BUFFER": "1MiB",
        "STRAGGLERKIT_COLOUR": "blue",
        "STRAGGLERKIT_POST_AHEAD": "on",
        "PATH": "/usr/bin",
    }
    assert settings.unknown(env) == [
        ("STRAGGLERKIT_COLOUR", None),
        ("STRAGGLERKIT_SEND_BUFFER", "STRAGGLERKIT_TCP_SEND_BUFFER"),
        ("STRAGGLERKIT_WAITMODE", "STRAGGLERKIT_WAIT_MODE"),
    ]
