"""Kept only so that checkpoints of earlier versions unpickle: they hold the controller's
configuration as ``stragglerkit.detect.controller_config.ControllerConfig``.

The loop's settings are :class:`stragglerkit.detect.settings.Settings`, built from
``stragglerkit.Config``; nothing constructs a ``ControllerConfig`` any more.
"""

from __future__ import annotations

from stragglerkit.detect.legacy import ControllerConfig

__all__ = ["ControllerConfig"]
