"""stragglerkit.planner: from a situation to a compiled plan, in one place.

Below the runtime and above the simulator. It owns:

* **which algorithms apply**: :func:`candidates` (the predicates of
  :func:`stragglerkit.schedules.registry.why_not`, pure schedule facts, stay with the schedules);
* **the situation a plan is built for**: :func:`planned_situation`, :func:`optcc_situation`
  (OptCC's segments, bubble filling and sizing for a bucket);
* **the choice**: :func:`choose`, from a cost model (:class:`Predictor` with the default
  parameters, or the loop's fitted :class:`~stragglerkit.detect.model.OnlineModel`); the closed
  loop's controller and ``all_reduce(algorithm="auto")`` both ask it;
* **lowering and checking**: :func:`compile_plan` returns a :class:`CompiledPlan` (frozen,
  hashable) from the one schedule cache (:mod:`stragglerkit.planner.schedules`).

The runtime caches compiled plans and runs them; it compiles nothing itself.

Example::

    from stragglerkit import planner
    situation = planner.Situation(world_size=8, straggler=7)
    choice = planner.choose(situation, 4 << 20, planner.Predictor(8))
    compiled = planner.compile_plan(choice.algorithm, situation, 1 << 20, 4, planner.RankMap.identity(8), 0)
"""

from __future__ import annotations

from stragglerkit.planner.choice import Choice, auto_baseline, candidates, choose, choose_algorithm
from stragglerkit.planner.compiled import CompiledPlan, compile_group_plan, compile_plan
from stragglerkit.planner.lowering import RankPlan, lower
from stragglerkit.planner.model import DEFAULT_PRIOR, CostModelLike, Predictor
from stragglerkit.planner.policy import optcc_situation, planned_situation
from stragglerkit.planner.remap import RankMap
from stragglerkit.schedules.registry import Situation, why_not

__all__ = [
    "DEFAULT_PRIOR",
    "Choice",
    "CompiledPlan",
    "CostModelLike",
    "Predictor",
    "RankMap",
    "RankPlan",
    "Situation",
    "auto_baseline",
    "candidates",
    "choose",
    "choose_algorithm",
    "compile_group_plan",
    "compile_plan",
    "lower",
    "optcc_situation",
    "planned_situation",
    "why_not",
]
