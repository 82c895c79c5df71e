"""Deprecated alias of :mod:`stragglerkit.telemetry.wandb`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.telemetry.wandb import *  # noqa: F403
from stragglerkit.telemetry.wandb import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.report.wandb is deprecated and goes in the next release: "
    "import stragglerkit.telemetry.wandb instead",
    DeprecationWarning,
    stacklevel=2,
)
