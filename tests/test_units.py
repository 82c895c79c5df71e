from __future__ import annotations

import pytest

from stragglerkit.units import parse_bandwidth, parse_size, parse_switch, parse_time, switch_from_env


def test_sizes() -> None:
    assert parse_size("1GiB") == 2**30
    assert parse_size("32MiB") == 32 * 2**20
    assert parse_size("4KB") == 4000
    assert parse_size("1000") == 1000
    assert parse_size("0") == 0


def test_times_and_bandwidths() -> None:
    assert parse_time("3us") == pytest.approx(3e-6)
    assert parse_time("5ms") == pytest.approx(5e-3)
    assert parse_bandwidth("450GB/s") == pytest.approx(450e9)
    assert parse_bandwidth("1Gbit") == pytest.approx(1.25e8)
    assert parse_bandwidth("10Gbps") == pytest.approx(1.25e9)


@pytest.mark.parametrize(
    ("parser", "text", "message"),
    [
        (parse_size, "1GX", "unknown size unit 'GX'"),
        (parse_size, "lots", "cannot read 'lots' as a size"),
        (parse_size, "0.5B", "not a whole number of bytes"),
        (parse_time, "3 fortnights", "cannot read|unknown time unit"),
        (parse_time, "3", "unknown time unit .. in .3."),
        (parse_bandwidth, "450GB", "unknown bandwidth unit 'GB'"),
        (parse_bandwidth, "0GB/s", "must be positive"),
    ],
)
def test_bad_units(parser, text: str, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        parser(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("on", True), (" YES ", True), ("1", True), ("true", True), ("Off", False), ("0", False), ("no", False)],
)
def test_parse_switch(text: str, expected: bool) -> None:
    assert parse_switch(text) is expected


@pytest.mark.parametrize("text", ["", "auto", "sometimes", "2"])
def test_parse_switch_leaves_other_words_to_the_caller(text: str) -> None:
    assert parse_switch(text) is None


def test_switch_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRAGGLERKIT_TEST_SWITCH", raising=False)
    assert switch_from_env("STRAGGLERKIT_TEST_SWITCH", None) is None
    monkeypatch.setenv("STRAGGLERKIT_TEST_SWITCH", "  ")
    assert switch_from_env("STRAGGLERKIT_TEST_SWITCH", True) is True
    monkeypatch.setenv("STRAGGLERKIT_TEST_SWITCH", " Off ")
    assert switch_from_env("STRAGGLERKIT_TEST_SWITCH", True) is False
    monkeypatch.setenv("STRAGGLERKIT_TEST_SWITCH", "maybe")
    with pytest.raises(ValueError, match=r"STRAGGLERKIT_TEST_SWITCH='maybe': give on or off"):
        switch_from_env("STRAGGLERKIT_TEST_SWITCH", True)
