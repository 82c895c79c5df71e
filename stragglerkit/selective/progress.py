"""Deprecated alias of :mod:`stragglerkit.grouping.progress`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.grouping.progress import *  # noqa: F403
from stragglerkit.grouping.progress import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.selective.progress is deprecated and goes in the next release: "
    "import stragglerkit.grouping.progress instead",
    DeprecationWarning,
    stacklevel=2,
)
