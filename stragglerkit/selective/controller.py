"""Deprecated alias of :mod:`stragglerkit.grouping.controller`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.grouping.controller import *  # noqa: F403
from stragglerkit.grouping.controller import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.selective.controller is deprecated and goes in the next release: "
    "import stragglerkit.grouping.controller instead",
    DeprecationWarning,
    stacklevel=2,
)
