"""Deprecated alias of :mod:`stragglerkit.grouping.bpawr`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.grouping.bpawr import *  # noqa: F403
from stragglerkit.grouping.bpawr import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.selective.bpawr is deprecated and goes in the next release: "
    "import stragglerkit.grouping.bpawr instead",
    DeprecationWarning,
    stacklevel=2,
)
