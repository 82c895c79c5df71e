"""Provenance recorded with every benchmark result: command, settings, machine, versions, date."""

from __future__ import annotations

import os
from typing import Any

from _env import command_line, machine_info, utc_now

__all__ = ["provenance"]


def provenance() -> dict[str, Any]:
    """The command, the ``STRAGGLERKIT_*`` settings it ran with, the machine and the date."""
    environment = {name: value for name, value in sorted(os.environ.items()) if name.startswith("STRAGGLERKIT_")}
    return {"command": command_line(), "environment": environment, "machine": machine_info(), "date": utc_now()}
