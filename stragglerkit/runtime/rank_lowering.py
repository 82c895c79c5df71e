"""Deprecated alias of :mod:`stragglerkit.planner.rank_lowering`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.planner.rank_lowering import *  # noqa: F403
from stragglerkit.planner.rank_lowering import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.runtime.rank_lowering is deprecated and goes in the next release: "
    "import stragglerkit.planner.rank_lowering instead",
    DeprecationWarning,
    stacklevel=2,
)
