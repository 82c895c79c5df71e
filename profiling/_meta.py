"""Provenance recorded with every benchmark result: command, machine, versions, date."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from typing import Any

__all__ = ["provenance"]


def provenance() -> dict[str, Any]:
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:  # the simulator does not need torch
        torch_version = None
    return {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch_version,
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
