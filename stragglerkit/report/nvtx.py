"""Deprecated alias of :mod:`stragglerkit.telemetry.nvtx`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.telemetry.nvtx import *  # noqa: F403
from stragglerkit.telemetry.nvtx import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.report.nvtx is deprecated and goes in the next release: "
    "import stragglerkit.telemetry.nvtx instead",
    DeprecationWarning,
    stacklevel=2,
)
