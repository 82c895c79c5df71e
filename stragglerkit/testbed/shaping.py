"""Measured link rates of the emulated cluster and the error raised when shaping is not effective."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stragglerkit.testbed.iproute import TestbedError

__all__ = ["LinkRate", "ShapingError", "ShapingReport"]


class ShapingError(TestbedError):
    """The shaped link rates measured differently from the configured ones."""

    def __init__(self, message: str, report: ShapingReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True, slots=True)
class LinkRate:
    """One direction of one host's link: what was configured and what a transfer measured."""

    host: int
    direction: str
    """``"send"`` (host to probe endpoint, alone), ``"recv"`` (probe endpoint to host, alone) or
    ``"ring"`` (host to host + 1 while every host sends at once) or ``"to PEER"`` (host to PEER
    while it sends to other peers too: EmulatedCluster.measure_fan_out)."""
    configured: float
    """Shaper rate in bytes/s (whole frames), i.e. bandwidth / slowdown."""
    expected: float
    """TCP payload rate in bytes/s that the shaper allows (configured minus header overhead)."""
    measured: float
    """Payload rate in bytes/s of the attempt reported (see ``attempts``)."""
    attempts: tuple[float, ...]
    """Every attempt's payload rate; a later attempt is made only if the earlier one was off."""

    @property
    def relative_error(self) -> float:
        return self.measured / self.expected - 1.0

    def within(self, tolerance: float) -> bool:
        return abs(self.relative_error) <= tolerance

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "direction": self.direction,
            "configured_Bps": self.configured,
            "expected_payload_Bps": self.expected,
            "measured_payload_Bps": self.measured,
            "attempts_Bps": list(self.attempts),
            "relative_error": self.relative_error,
        }


@dataclass(frozen=True, slots=True)
class ShapingReport:
    """The measured rates of a set of links, and the tolerance they were judged with."""

    links: tuple[LinkRate, ...]
    tolerance: float

    @property
    def ok(self) -> bool:
        return all(link.within(self.tolerance) for link in self.links)

    def rate(self, host: int, direction: str) -> LinkRate:
        for link in self.links:
            if link.host == host and link.direction == direction:
                return link
        raise KeyError(f"no measurement for host {host} direction {direction!r}")

    def describe(self) -> str:
        lines = []
        for link in self.links:
            flag = "ok" if link.within(self.tolerance) else "OFF"
            tries = ", ".join(f"{a / 1e6:.1f}" for a in link.attempts)
            what = f"host {link.host} {link.direction}" + (
                " to next host, all at once" if link.direction == "ring" else ""
            )
            lines.append(
                f"{what}: configured {link.configured * 8 / 1e6:.0f} Mbit/s, "
                f"expected payload {link.expected / 1e6:.1f} MB/s, measured {link.measured / 1e6:.1f} MB/s "
                f"({link.relative_error:+.1%}; attempts {tries} MB/s) {flag}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "ok": self.ok, "links": [link.to_dict() for link in self.links]}
