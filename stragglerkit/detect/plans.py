"""Deprecated alias of :mod:`stragglerkit.plans`, kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.plans import *  # noqa: F403
from stragglerkit.plans import __all__  # noqa: F401

warnings.warn(
    "stragglerkit.detect.plans is deprecated and goes in the next release: import stragglerkit.plans instead",
    DeprecationWarning,
    stacklevel=2,
)
