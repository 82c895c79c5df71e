"""Provenance recorded with every benchmark result: command, settings, machine, versions, date."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _env import command_line, machine_info, settings, utc_now

__all__ = ["provenance", "write_record"]


def provenance() -> dict[str, Any]:
    """The command, the ``STRAGGLERKIT_*`` settings it ran with, the source (version, commit), the
    machine and the date."""
    from stragglerkit.bench.results import source_revision

    return {
        "command": command_line(),
        "environment": settings(),
        "source": source_revision(),
        "machine": machine_info(),
        "date": utc_now(),
    }


def write_record(path: Path, fields: dict[str, Any]) -> None:
    """Write ``fields`` after the provenance as indented JSON to ``path`` and say so."""
    record = {**provenance(), **fields}
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
