"""What every committed benchmark result records about the machine it ran on."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np


def machine_info() -> dict[str, Any]:
    """Processor, core count and library versions, as the results JSON records them."""
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = None
    return {
        "processor": platform.processor(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch_version,
        "numpy": np.__version__,
    }


def command_line() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
