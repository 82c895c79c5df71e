"""stragglerkit.loop: the framework-neutral closed loop that every integration adapts.

:class:`StragglerLoop` takes gradient buckets (tensor, index, last of the step) and returns futures;
the DDP comm hook (:mod:`stragglerkit.integrations.ddp`) is an adapter over it.
"""

from __future__ import annotations

from stragglerkit.loop.loop import StragglerLoop

__all__ = ["StragglerLoop"]
