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
        "processor": platform.processor() or _cpu_model(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch_version,
        "numpy": np.__version__,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def command_line() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
