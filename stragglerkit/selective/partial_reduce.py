"""Deprecated alias of :mod:`stragglerkit.grouping.partial_reduce`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.grouping.partial_reduce import *  # noqa: F403
from stragglerkit.grouping.partial_reduce import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.selective.partial_reduce is deprecated and goes in the next release: "
    "import stragglerkit.grouping.partial_reduce instead",
    DeprecationWarning,
    stacklevel=2,
)
