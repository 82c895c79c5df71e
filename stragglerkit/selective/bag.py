"""Deprecated alias of :mod:`stragglerkit.grouping.bag`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.grouping.bag import *  # noqa: F403
from stragglerkit.grouping.bag import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.selective.bag is deprecated and goes in the next release: "
    "import stragglerkit.grouping.bag instead",
    DeprecationWarning,
    stacklevel=2,
)
