"""Compiled plans: a checked schedule lowered for one rank and one bucket, what the runtime runs.

:func:`compile_plan` takes the algorithm the planner chose, the situation its plan is built for
(:func:`~stragglerkit.planner.policy.optcc_situation` sizes OptCC's), the bucket (elements, element
size), the rank map and this rank, and returns a :class:`CompiledPlan`: frozen and hashable by
its :attr:`~CompiledPlan.key`, with the lowered per-rank ops (:class:`~stragglerkit.planner.tables.RankPlan`)
and the plan id every rank of a run must agree on (the executor compares them before any data
moves). The schedule comes from the planner's one cache (:func:`~stragglerkit.planner.schedules.checked_schedule`:
in round order and proven by the checker); above
:data:`~stragglerkit.planner.rank_lowering.SCALE_FROM_RANKS` ranks only this rank's part is built,
from its closed form. The runtime keeps compiled plans by key and runs them; it compiles nothing
itself.

Example::

    plan = compile_plan("stragglar", Situation(world_size=8, straggler=7), 1 << 20, 4, RankMap.identity(8), 0)
    plan.algorithm, plan.plan.num_messages(), plan.plan_id
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from stragglerkit.planner.lowering import lower, lower_one_rank, plan_id
from stragglerkit.planner.rank_lowering import SCALE_FROM_RANKS, one_rank_schedule
from stragglerkit.planner.remap import RankMap
from stragglerkit.planner.schedules import checked_schedule
from stragglerkit.planner.tables import RankPlan
from stragglerkit.schedules.check import check
from stragglerkit.schedules.group_ring import group_ring
from stragglerkit.schedules.registry import Situation

__all__ = ["CompiledPlan", "compile_group_plan", "compile_plan"]


@dataclass(frozen=True, slots=True, eq=False)
class CompiledPlan:
    """One rank's checked, lowered plan for one bucket; equal and hashed by :attr:`key`."""

    key: tuple[object, ...]
    """(algorithm, situation, numel, element size, rank map, this logical rank, divisor)."""
    algorithm: str
    situation: Situation
    """The situation the plan is built for (logical ranks)."""
    rank_map: tuple[int, ...]
    """``rank_map[logical] = group rank``."""
    rank: int
    """The logical rank whose plan this is."""
    plan: RankPlan = field(repr=False)
    """The lowered ops the executor runs."""
    plan_id: int
    """What every rank of the run must agree on (checked by the executor before data moves)."""

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompiledPlan) and other.key == self.key


def compile_plan(
    algorithm: str,
    situation: Situation,
    numel: int,
    element_size: int,
    ranks: RankMap,
    group_rank: int,
    divide_by: int = 0,
    op: str = "sum",
) -> CompiledPlan:
    """``algorithm``'s plan for ``situation`` (logical ranks), lowered for group rank
    ``group_rank`` and a bucket of ``numel`` elements of ``element_size`` bytes; ``divide_by``:
    the world size for an average the reductions divide (0: a sum); ``op`` goes into the plan id."""
    logical_rank = ranks.logical(group_rank)
    part = one_rank_schedule(algorithm, situation, logical_rank) if situation.world_size > SCALE_FROM_RANKS else None
    if part is not None:
        schedule = part.schedule
        plan = lower_one_rank(part, numel, element_size, divide_by)
    else:
        schedule = checked_schedule(algorithm, situation)
        (plan,) = lower(
            schedule, numel, element_size, straggler=situation.straggler, ranks=[logical_rank], divide_by=divide_by
        )
    slowdowns = tuple(sorted(situation.slowdowns.items()))
    # the chunk sizes too: ranks whose LP solvers disagreed must not exchange bytes
    sizes = zlib.crc32(repr(schedule.chunk_sizes).encode())
    ident = (
        f"{algorithm}|{situation.world_size}|{ranks.to_physical}|{situation.straggler}|{slowdowns}"
        f"|{situation.segments}|{situation.bubble_filling}|{situation.optcc_sizing}|{sizes}|{op}"
    )
    key = (algorithm, situation.key(), numel, element_size, tuple(ranks.to_physical), logical_rank, divide_by, op)
    return CompiledPlan(key, algorithm, situation, tuple(ranks.to_physical), logical_rank, plan, plan_id(ident))


def compile_group_plan(
    groups: Sequence[Sequence[int]], numel: int, element_size: int, ranks: RankMap, group_rank: int
) -> CompiledPlan:
    """The group AllReduce's plan (:func:`stragglerkit.schedules.group_ring.group_ring`) of
    ``groups`` (checked, sorted group ranks) for group rank ``group_rank``."""
    n = len(ranks.to_physical)
    logical = tuple(tuple(ranks.logical(rank) for rank in group) for group in groups)
    schedule = group_ring(n, logical)
    check(schedule)
    logical_rank = ranks.logical(group_rank)
    (plan,) = lower(schedule, numel, element_size, ranks=[logical_rank])
    ident = plan_id(f"group_ring|{n}|{ranks.to_physical}|{tuple(tuple(g) for g in groups)}")
    key = ("group_ring", logical, numel, element_size, tuple(ranks.to_physical), logical_rank)
    return CompiledPlan(key, "group_ring", Situation(world_size=n), tuple(ranks.to_physical), logical_rank, plan, ident)
