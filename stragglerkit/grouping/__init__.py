"""stragglerkit.grouping: selective reduce's pure algorithms, below the simulator.

Which ready workers synchronise together, and with what weights: the paper's parameters
(:class:`SelectiveConfig`), the progress model (:class:`ProgressModel`), BAG (:func:`bag`),
BPAWR (:func:`bpawr`), the controllers (:class:`SelectiveReduceController`,
:class:`PartialReduceController`) and their events. Clock-injected library code without torch:
the simulator (:mod:`stragglerkit.sim.selective`) and the training-side coordinator
(:mod:`stragglerkit.selective`, which re-exports all of this) both drive it.
"""

from __future__ import annotations

from stragglerkit.grouping.bag import bag
from stragglerkit.grouping.bpawr import BpawrDecision, Expected, bpawr, ring_time
from stragglerkit.grouping.config import SelectiveConfig
from stragglerkit.grouping.controller import SelectiveReduceController
from stragglerkit.grouping.partial_reduce import PartialReduceController
from stragglerkit.grouping.progress import ProgressModel
from stragglerkit.grouping.workers import (
    Event,
    Sync,
    SyncDone,
    Tick,
    WorkerReady,
    WorkerState,
    iteration_weights,
)

__all__ = [
    "BpawrDecision",
    "Event",
    "Expected",
    "PartialReduceController",
    "ProgressModel",
    "SelectiveConfig",
    "SelectiveReduceController",
    "Sync",
    "SyncDone",
    "Tick",
    "WorkerReady",
    "WorkerState",
    "bag",
    "bpawr",
    "iteration_weights",
    "ring_time",
]
