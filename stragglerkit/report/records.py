"""Deprecated alias of :mod:`stragglerkit.telemetry.records`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.telemetry.records import *  # noqa: F403
from stragglerkit.telemetry.records import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.report.records is deprecated and goes in the next release: "
    "import stragglerkit.telemetry.records instead",
    DeprecationWarning,
    stacklevel=2,
)
