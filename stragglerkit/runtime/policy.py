"""Deprecated alias of :mod:`stragglerkit.planner.policy` (and ``choose_algorithm`` of
:mod:`stragglerkit.planner.choice`), kept for one release: import from there instead."""

from __future__ import annotations

import warnings

from stragglerkit.planner.choice import choose_algorithm
from stragglerkit.planner.policy import *  # noqa: F403
from stragglerkit.planner.policy import __all__ as _policy_all

__all__ = [*_policy_all, "choose_algorithm"]

warnings.warn(
    "stragglerkit.runtime.policy is deprecated and goes in the next release: "
    "import stragglerkit.planner.policy (choose_algorithm: stragglerkit.planner.choice) instead",
    DeprecationWarning,
    stacklevel=2,
)
