"""The cost model the planner chooses with: predictions of each algorithm's time for a bucket.

A :class:`Predictor` holds one set of cost-model parameters (:class:`CostModelParams`: latency
alpha, seconds per byte beta, reduction costs gamma and delta) and predicts, for a bucket of
``nbytes``, the time from the last rank's arrival of the plan the runtime runs for it
(:func:`~stragglerkit.planner.policy.planned_situation`), with a straggler arriving ``delay`` late
and degraded NICs at ``1/(l·beta)``. It runs the flow-level simulator
(:func:`stragglerkit.sim.simulator.simulate_graph`) on the schedule, or the exact fast paths of
:mod:`stragglerkit.sim.fast` where there is one (ring, the balanced ring, direct, StragglAR on a
uniform network without reduction cost).

Whose parameters: :data:`DEFAULT_PRIOR` (the default model) until the loop has fitted its own;
the loop's :class:`~stragglerkit.detect.model.OnlineModel` fits them from the job's AllReduces and
predicts through a :class:`Predictor` of the fitted parameters. :class:`CostModelLike` is what
:func:`stragglerkit.planner.choose` asks of a model, so both serve it alike.

Example::

    model = Predictor(8, DEFAULT_PRIOR)
    model.predict("stragglar", 4 << 20, straggler=7, delay=0.01)
    model.pre_phase(7, 4 << 20)          # seconds the punctual ranks need for StragglAR's pre-phase
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import numpy as np

from stragglerkit import defaults
from stragglerkit.planner.policy import planned_situation
from stragglerkit.planner.schedules import schedule_for
from stragglerkit.schedules.ir import Schedule
from stragglerkit.sim.cost_model import CostModelParams
from stragglerkit.sim.fast import fast_auto_delay, fast_simulate
from stragglerkit.sim.graph import TaskGraph, build_task_graph
from stragglerkit.sim.simulator import Network, simulate_graph

__all__ = ["DEFAULT_PRIOR", "MODELLED_AS", "CostModelLike", "Predictor"]

DEFAULT_PRIOR = CostModelParams(alpha=defaults.PRIOR_ALPHA, beta=defaults.PRIOR_BETA)
"""The default model: :data:`stragglerkit.defaults.PRIOR_ALPHA` per message (50 us) and
:data:`~stragglerkit.defaults.PRIOR_BETA` per byte (10 Gbit/s), what the loop assumes before it
has fitted anything and what ``all_reduce(algorithm="auto")`` chooses with until a fitted model
is adopted."""
MODELLED_AS = {"allreduce": "ring"}
"""Algorithms predicted as another: the process group's own all_reduce is a ring for the buffers
that matter (gloo's ring and NCCL's ring are bandwidth-optimal like ours)."""


class CostModelLike(Protocol):
    """What the planner asks of a cost model (:class:`Predictor`, the loop's ``OnlineModel``)."""

    @property
    def world_size(self) -> int: ...

    def predict(
        self,
        algorithm: str,
        nbytes: int,
        *,
        straggler: int | None = None,
        delay: float = 0.0,
        slowdowns: dict[int, float] | None = None,
    ) -> float:
        """Predicted seconds from the last arrival; ``straggler`` arrives ``delay`` s late."""
        ...

    def pre_phase(self, straggler: int, nbytes: int) -> float:
        """Seconds the punctual ranks need for StragglAR's pre-phase without ``straggler``."""
        ...


class Predictor:
    """Predictions under one set of parameters, cached per question (see the module docstring).

    Example::

        Predictor(4, CostModelParams(alpha=1e-4, beta=1e-9)).predict("ring", 1 << 20)
    """

    __slots__ = ("_graphs", "_predictions", "config", "world_size")

    def __init__(self, world_size: int, config: CostModelParams = DEFAULT_PRIOR) -> None:
        if world_size < 2:
            raise ValueError(f"the model needs at least 2 ranks, got {world_size}")
        self.world_size = world_size
        self.config = dataclasses.replace(config)
        self._graphs: dict[int, tuple[Schedule, TaskGraph]] = {}
        self._predictions: dict[tuple[object, ...], float] = {}

    def _graph(self, schedule: Schedule) -> TaskGraph:
        """The schedule's task graph (built once per schedule; the schedule is kept with it, so
        that its id is not reused while the graph is cached)."""
        cached = self._graphs.get(id(schedule))
        if cached is None:
            cached = (schedule, build_task_graph(schedule))
            self._graphs[id(schedule)] = cached
        return cached[1]

    def network(self, slowdowns: tuple[tuple[int, float], ...] = ()) -> Network:
        """Per-rank NICs at ``1/beta`` (``1/(l·beta)`` for a degraded rank), latency alpha."""
        c = self.config
        bandwidth = 1.0 / max(c.beta, 1e-15)
        return Network.uniform(
            self.world_size, alpha=c.alpha, bandwidth=bandwidth, gamma=c.gamma, delta=c.delta, slowdowns=dict(slowdowns)
        )

    def predict(
        self,
        algorithm: str,
        nbytes: int,
        *,
        straggler: int | None = None,
        delay: float = 0.0,
        slowdowns: dict[int, float] | None = None,
        planned_slowdowns: dict[int, float] | None = None,
        planned_straggler: int | None = None,
    ) -> float:
        """Predicted seconds from the last arrival; ``straggler`` arrives ``delay`` s after the others.

        ``slowdowns``: the network's degraded ranks; ``planned_slowdowns`` / ``planned_straggler``:
        those the schedule was built for (default: the same), e.g. a plan for a straggler that moved.
        """
        algorithm = MODELLED_AS.get(algorithm, algorithm)
        slow = tuple(sorted((slowdowns or {}).items()))
        planned = slow if planned_slowdowns is None else tuple(sorted(planned_slowdowns.items()))
        delay = max(float(delay), 0.0)
        built_for = straggler if planned_straggler is None else planned_straggler
        key = (algorithm, nbytes, straggler, built_for, float(f"{delay:.3g}"), slow, planned)
        cached = self._predictions.get(key)
        if cached is not None:
            return cached
        arrivals = np.zeros(self.world_size)
        if straggler is not None:
            arrivals[straggler] = delay
        network = self.network(slow)
        situation = planned_situation(algorithm, self.world_size, built_for, dict(planned), nbytes)
        fast = fast_simulate(algorithm, situation, nbytes, network, arrivals)
        if fast is not None:  # ring, balanced ring, direct, StragglAR: exact without building the plan
            seconds = fast.time_from_last_arrival
        else:
            schedule = schedule_for(algorithm, situation)
            seconds = simulate_graph(self._graph(schedule), nbytes, network, arrivals).time_from_last_arrival
        self._predictions[key] = seconds
        return seconds

    def pre_phase(self, straggler: int, nbytes: int) -> float:
        """Seconds the punctual ranks need for StragglAR's pre-phase (its ReduceScatter among the
        others) on ``nbytes``: the delay from which StragglAR's pre-phase is fully hidden."""
        key = ("pre", straggler, nbytes)
        cached = self._predictions.get(key)
        if cached is not None:
            return cached
        situation = planned_situation("stragglar", self.world_size, straggler)
        pre = fast_auto_delay(situation, nbytes, self.network())
        if pre is None:
            absent = np.zeros(self.world_size)
            absent[straggler] = math.inf  # when the punctual ranks finish the pre-phase without it
            graph = self._graph(schedule_for("stragglar", situation))
            pre = simulate_graph(graph, nbytes, self.network(), absent).phase_done["reduce_scatter"]
        self._predictions[key] = float(pre)
        return float(pre)

    def critical_delay(self, straggler: int, nbytes: int, baseline: str, min_gain: float) -> float:
        """Smallest delay (s) from which StragglAR saves ``min_gain`` of ``baseline`` on ``nbytes``.

        With ``T_pre`` the pre-phase and ``T_hidden`` StragglAR's time with it fully hidden, its
        time is about ``T_hidden + max(0, T_pre - d)``, so ``d* = T_pre - ((1 - min_gain)·T_base -
        T_hidden)`` (``inf`` when even a fully hidden pre-phase does not pay)."""
        key = ("critical", straggler, nbytes, baseline, min_gain)
        cached = self._predictions.get(key)
        if cached is not None:
            return cached
        pre = self.pre_phase(straggler, nbytes)
        hidden = self.predict("stragglar", nbytes, straggler=straggler, delay=pre)
        target = (1.0 - min_gain) * self.predict(baseline, nbytes)
        critical = math.inf if hidden > target else max(pre - (target - hidden), 0.0)
        self._predictions[key] = critical
        return critical
