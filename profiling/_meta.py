"""Provenance recorded with every benchmark result: command, machine, versions, date."""

from __future__ import annotations

from typing import Any

from _env import command_line, machine_info, utc_now

__all__ = ["provenance"]


def provenance() -> dict[str, Any]:
    return {"command": command_line(), "machine": machine_info(), "date": utc_now()}
