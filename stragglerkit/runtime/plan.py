"""Deprecated alias of :mod:`stragglerkit.planner.lowering`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.planner.lowering import *  # noqa: F403
from stragglerkit.planner.lowering import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.runtime.plan is deprecated and goes in the next release: "
    "import stragglerkit.planner.lowering instead",
    DeprecationWarning,
    stacklevel=2,
)
