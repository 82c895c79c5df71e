"""Deprecated alias of :mod:`stragglerkit.planner.ordering`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.planner.ordering import *  # noqa: F403
from stragglerkit.planner.ordering import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.runtime.ordering is deprecated and goes in the next release: "
    "import stragglerkit.planner.ordering instead",
    DeprecationWarning,
    stacklevel=2,
)
