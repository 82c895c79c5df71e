"""Deprecated path: the comparison of cost models moved to :mod:`stragglerkit.detect.model_comparison`
(it compares the loop's online model with the richer ones), and :data:`MODELS` and
:func:`identifiable_params` to :mod:`stragglerkit.sim.cost_model`. Kept for one release.

The simulator imports nothing above itself, so this module re-exports what stayed in the simulator
and hands the rest over by name, on first use, with the same warning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from stragglerkit.sim.cost_model import MODELS, identifiable_params

__all__ = ["MODELS", "identifiable_params"]

_MOVED_UP = "stragglerkit.detect.model_comparison"

warnings.warn(
    "stragglerkit.sim.model_comparison is deprecated and goes in the next release: import "
    "stragglerkit.detect.model_comparison (MODELS, identifiable_params: stragglerkit.sim.cost_model) instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """``compare``, ``fit_model``, ``predict``, ... from their new module."""
    return getattr(importlib.import_module(_MOVED_UP), name)
