"""Parsing of human units on the command line: sizes (1GiB), times (3us) and bandwidths (450GB/s),
and the on/off switches of ``STRAGGLERKIT_*`` settings.

Conventions follow nccl-tests: GB = 1e9 bytes, GiB = 2^30 bytes; bandwidth in bytes per second,
``Gbit``/``Gbps`` in bits per second (divided by 8).
"""

from __future__ import annotations

import os
import re
from typing import TypeVar

__all__ = [
    "format_bytes",
    "format_seconds",
    "parse_bandwidth",
    "parse_size",
    "parse_switch",
    "parse_time",
    "switch_from_env",
]

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}
_SWITCH_WORDS = {
    **dict.fromkeys(("on", "1", "true", "yes"), True),
    **dict.fromkeys(("off", "0", "false", "no"), False),
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_BYTE_RATE_UNITS = {
    "b/s": 1,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "tb/s": 1e12,
    "kib/s": 2**10,
    "mib/s": 2**20,
    "gib/s": 2**30,
}
_BIT_RATE_UNITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 1,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
    "bit/s": 1,
    "kbit/s": 1e3,
    "mbit/s": 1e6,
    "gbit/s": 1e9,
}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")


def _split(text: str, what: str, example: str) -> tuple[float, str]:
    match = _NUMBER.match(text)
    if not match:
        raise ValueError(f"cannot read {text!r} as a {what}; write a number and a unit, e.g. {example}")
    return float(match.group(1)), match.group(2)


def parse_size(text: str) -> int:
    """``"1GiB"`` -> 1073741824, ``"32MiB"``, ``"1000"`` (bytes), ``"4KB"`` (4000)."""
    value, unit = _split(text, "size", "1GiB, 32MiB, 4KB or 1000")
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}; use B, KB, MB, GB, KiB, MiB or GiB")
    size = value * factor
    if size != int(size):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(size)


def parse_time(text: str) -> float:
    """``"3us"`` -> 3e-6 seconds; ``"5ms"``, ``"0.2s"``, ``"100ns"``."""
    value, unit = _split(text, "time", "3us, 5ms or 0.2s")
    if value == 0 and not unit:
        return 0.0
    factor = _TIME_UNITS.get(unit.lower() if unit != "µs" else unit)
    if factor is None:
        raise ValueError(f"unknown time unit {unit!r} in {text!r}; use s, ms, us or ns")
    return value * factor


def parse_bandwidth(text: str) -> float:
    """Bytes per second: ``"450GB/s"`` -> 4.5e11, ``"1Gbit"`` -> 1.25e8, ``"10Gbps"`` -> 1.25e9."""
    value, unit = _split(text, "bandwidth", "450GB/s or 1Gbit")
    lowered = unit.lower()
    if lowered in _BYTE_RATE_UNITS:
        rate = value * _BYTE_RATE_UNITS[lowered]
    elif lowered in _BIT_RATE_UNITS:
        rate = value * _BIT_RATE_UNITS[lowered] / 8
    else:
        raise ValueError(
            f"unknown bandwidth unit {unit!r} in {text!r}; use bytes per second (GB/s, MB/s, GiB/s) "
            "or bits per second (Gbit, Mbit, Gbps)"
        )
    if rate <= 0:
        raise ValueError(f"bandwidth must be positive, got {text!r}")
    return rate


def parse_switch(text: str) -> bool | None:
    """``on``/``1``/``true``/``yes`` -> True, ``off``/``0``/``false``/``no`` -> False (any case,
    surrounding blanks ignored), anything else -> None: the caller names the setting in its error.

    Example::

        parse_switch(" Off ")  # False
    """
    return _SWITCH_WORDS.get(text.strip().lower())


_Default = TypeVar("_Default")


def switch_from_env(name: str, default: _Default) -> bool | _Default:
    """The on/off setting ``name`` from the environment (:func:`parse_switch`), ``default`` when it
    is unset or blank; ValueError names the variable and a bad value.

    Example::

        switch_from_env("MY_FEATURE", True)  # True unless MY_FEATURE is set to off (or 0, false, no)
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    switch = parse_switch(text)
    if switch is None:
        raise ValueError(f"{name}={text!r}: give on or off (1 or 0)")
    return switch


def format_bytes(size: float) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:g}{unit}"
    return f"{size:g}B"


def format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"
