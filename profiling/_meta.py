"""Provenance recorded with every benchmark result: command, settings, machine, versions, date."""

from __future__ import annotations

from typing import Any

from _env import command_line, machine_info, settings, utc_now

__all__ = ["provenance"]


def provenance() -> dict[str, Any]:
    """The command, the ``STRAGGLERKIT_*`` settings it ran with, the machine and the date."""
    return {"command": command_line(), "environment": settings(), "machine": machine_info(), "date": utc_now()}
