"""Deprecated alias of :mod:`stragglerkit.planner.remap`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.planner.remap import *  # noqa: F403
from stragglerkit.planner.remap import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.runtime.remap is deprecated and goes in the next release: "
    "import stragglerkit.planner.remap instead",
    DeprecationWarning,
    stacklevel=2,
)
