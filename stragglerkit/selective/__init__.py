"""stragglerkit.selective: selective reduce, progress- and bandwidth-aware partial synchronisation.

Opt-in: a group of ready workers averages its models with weights instead of all ranks summing
gradients, which changes what training computes (docs/selective.md). The controller algorithms
are pure, clock-injected library code in :mod:`stragglerkit.grouping` (below the simulator, which
drives them too); this package re-exports them and adds what runs on the ranks:

* :class:`SelectiveConfig`: the paper's parameters ``p, eta, theta, dt, c, v``;
* :class:`ProgressModel`: ``P(T <= t + dt | T > t)`` from observed iteration times;
* :func:`bag` (Algorithm 1), :func:`bpawr` (Algorithm 2), :class:`SelectiveReduceController`
  (Algorithm 3), and the baseline :class:`PartialReduceController`;
* events :class:`WorkerReady`, :class:`SyncDone`, :class:`Tick`; decisions :class:`Sync`;
* :func:`weighted_group_all_reduce`: the weighted AllReduce of several groups at once, over the
  existing process group (needs :func:`stragglerkit.init`).
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
from stragglerkit.selective.group_reduce import group_shares, weighted_group_all_reduce

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
    "group_shares",
    "iteration_weights",
    "ring_time",
    "weighted_group_all_reduce",
]
