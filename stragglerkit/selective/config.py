"""Deprecated alias of :mod:`stragglerkit.grouping.config`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.grouping.config import *  # noqa: F403
from stragglerkit.grouping.config import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.selective.config is deprecated and goes in the next release: "
    "import stragglerkit.grouping.config instead",
    DeprecationWarning,
    stacklevel=2,
)
