"""Deprecated alias of :mod:`stragglerkit.grouping.workers`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.grouping.workers import *  # noqa: F403
from stragglerkit.grouping.workers import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.selective.workers is deprecated and goes in the next release: "
    "import stragglerkit.grouping.workers instead",
    DeprecationWarning,
    stacklevel=2,
)
