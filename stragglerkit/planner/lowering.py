"""Lowering: a checked schedule plus a real bucket becomes the flat tables the C++ executor runs.

Steps (all in Python, once per cache key; the executor only interprets the result). This module
runs them (:func:`lower`, :func:`lower_one_rank`, :func:`rank_plan`); steps 1 and 2 live in
:mod:`~stragglerkit.planner.pieces`, step 3 in :mod:`~stragglerkit.planner.message_order`, step 4
in :mod:`~stragglerkit.planner.tables`, and their public names are importable from here too.

1. **Chunk boundaries.** The schedule's relative chunk weights (``Schedule.chunk_weights()``) are
   turned into element offsets for ``numel`` elements: ``bounds[c] = round(numel·W_c / W)`` where
   ``W_c`` is the weight of chunks ``0..c-1``, rounded to a multiple of ``align`` elements (64 bytes)
   when the bucket is large enough. With ``numel`` smaller than the chunk count (or 0) some chunks are
   empty; ops over empty ranges become no-ops on both sides of every message, consistently.
2. **Pieces.** For large buckets each chunk is cut into ``pieces`` sub-chunks and every op into
   ``pieces`` ops (:func:`refine`), so that a reduction overlaps the next piece's transfer and a
   forward can start before the whole chunk arrived. Data dependencies are re-derived at piece
   granularity by :class:`ScheduleBuilder`; a round schedule's round order (planner/ordering.py)
   is kept piece by piece (piece ``j`` of a round waits for piece ``j`` of the previous round, so
   the rounds pipeline), other extra (non-data) dependencies between all pieces. The refined
   schedule is checked again (:func:`check`).
3. **Wait order.** :func:`message_order` simulates the run (messages move when both sides posted,
   in program order per pair) with a known straggler's ops held back until nothing else can move,
   and records the global order of messages. Every rank waits on its messages in that order; see
   csrc/executor.cpp for why this is deadlock-free for any checked schedule.
4. **Tables.** One rank's ops become an int64 table (columns: ``OpColumn``) with element offsets, scratch
   offsets, channel links and labels, plus dependency counts and a CSR list of dependents. A
   dependent stored as ``-(b + 1)`` counts its dependency as met when the op is *posted*, not
   completed: only between consecutive messages of one connection that nothing but their order
   links (:func:`_after_post_edges`).

Averaging: with ``divide_by = n`` the reductions after which a chunk holds all ``n`` contributions
(:func:`~stragglerkit.schedules.check.completing_reductions`) also divide by ``n``, so an averaging
AllReduce needs no pass of its own over the bucket; the other ranks receive those final values by
copy. (Without a hook DDP divides while it copies gradients into a bucket; a hook that divided the
whole bucket again would pay a pass of its own, a measurable part of a training step on CPU:
docs/detection.md, "Averaging and bucket views".)

Scratch: a schedule's scratch slot ``s`` gets one region (its largest use); every ``recv_reduce``
gets its own region, so reductions never wait for scratch to be free. Scratch therefore needs at
most about one bucket per rank for the algorithms here; it is allocated once per cached plan.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from stragglerkit.planner.message_order import message_order
from stragglerkit.planner.ordering import in_round_order
from stragglerkit.planner.pieces import choose_pieces, chunk_bounds, element_bounds, refine
from stragglerkit.planner.rank_lowering import SCALE_FROM_RANKS, OneRank, one_rank_schedule, wait_order
from stragglerkit.planner.tables import OP_COLUMNS, LoweredKind, OpColumn, RankPlan, rank_tables
from stragglerkit.schedules.check import check, completing_reductions
from stragglerkit.schedules.ir import Schedule
from stragglerkit.schedules.registry import Situation, generate

__all__ = [
    "OP_COLUMNS",
    "LoweredKind",
    "OpColumn",
    "RankPlan",
    "choose_pieces",
    "chunk_bounds",
    "lower",
    "lower_one_rank",
    "message_order",
    "plan_id",
    "rank_plan",
    "refine",
]


def plan_id(key: str) -> int:
    """A stable 31-bit id of a plan key, exchanged in the header to catch mismatched calls."""
    return zlib.crc32(key.encode())


def lower(
    schedule: Schedule,
    numel: int,
    element_size: int,
    straggler: int | None = None,
    pieces: int | None = None,
    ranks: Sequence[int] | None = None,
    divide_by: int = 0,
) -> list[RankPlan]:
    """Lower ``schedule`` for a bucket of ``numel`` elements; return the plans of ``ranks``.

    ``ranks`` are logical ranks (default: all). ``straggler`` (logical) only affects the wait
    order. ``pieces`` defaults to :func:`choose_pieces`. The refined schedule is re-checked when
    ``pieces > 1`` or ``divide_by > 0``. ``divide_by`` (the world size, for an average; 0: a sum): the reductions that
    complete a chunk divide it (module docstring); the plans say so in ``divides``. If some
    reduction completes only part of its chunk range the plans do not divide (``divides`` False)
    and the caller divides after the run.

    Example::

        plans = lower(ring(4), numel=1000, element_size=4)
        assert plans[0].num_messages() == 6
    """
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    if divide_by < 0:
        raise ValueError(f"divide_by must be >= 0 (0: no division), got {divide_by}")
    if pieces is None:
        pieces = choose_pieces(schedule, numel, element_size)
    bounds = element_bounds(schedule, numel, element_size, pieces)
    refined, labels = refine(schedule, pieces)
    completing = None
    if divide_by > 0:
        completing = completing_reductions(refined)  # checks the refined schedule on the way
    elif pieces > 1:
        check(refined)
    empty = [[bounds[op.chunks[1]] == bounds[op.chunks[0]] for op in ops] for ops in refined.ops]
    order = message_order(refined, empty, straggler)
    wanted = range(schedule.world_size) if ranks is None else ranks
    plans = []
    for rank in wanted:
        divides = None if completing is None else [divide_by if flag else 0 for flag in completing[rank]]
        plans.append(
            rank_tables(schedule, refined, rank, bounds, empty[rank], order[rank], labels[rank], pieces, numel, divides)
        )
    return plans


def lower_one_rank(part: OneRank, numel: int, element_size: int, divide_by: int = 0) -> RankPlan:
    """:func:`lower` for one rank from its closed-form part (planner/rank_lowering.py): the same
    chunk bounds, pieces, refinement and tables, the wait order by key, no re-check (the schedule
    is proved per algorithm and world size there) and the completing reductions in closed form
    (``divides`` False where they are unknown: the caller divides after the run)."""
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    schedule, rank = part.schedule, part.rank
    pieces = choose_pieces(schedule, numel, element_size)
    bounds = element_bounds(schedule, numel, element_size, pieces)
    refined, labels = refine(schedule, pieces)
    ops = refined.ops[rank]
    divides = None
    if divide_by > 0 and part.completing is not None:
        divides = [divide_by if part.completing[index // pieces] else 0 for index in range(len(ops))]
    empty = [bounds[op.chunks[1]] == bounds[op.chunks[0]] for op in ops]
    order = wait_order(part, pieces, empty)
    return rank_tables(schedule, refined, rank, bounds, empty, order, labels[rank], pieces, numel, divides)


def rank_plan(
    algorithm: str,
    situation: Situation,
    numel: int,
    element_size: int,
    rank: int,
    divide_by: int = 0,
) -> RankPlan:
    """Logical rank ``rank``'s plan of ``algorithm`` for ``situation`` and a bucket of ``numel``
    elements: what ``Runtime`` runs (the schedule in round order, checked, then lowered). Above
    :data:`~stragglerkit.planner.rank_lowering.SCALE_FROM_RANKS` ranks only this rank's part is
    built, from its closed form (:func:`lower_one_rank`).

    Example::

        plan = rank_plan("ring", Situation(world_size=4), numel=1000, element_size=4, rank=0)
        assert plan.num_messages() == 6
    """
    if situation.world_size > SCALE_FROM_RANKS:
        part = one_rank_schedule(algorithm, situation, rank)
        if part is not None:
            return lower_one_rank(part, numel, element_size, divide_by)
    schedule = in_round_order(generate(algorithm, situation))
    check(schedule)
    (plan,) = lower(schedule, numel, element_size, straggler=situation.straggler, ranks=[rank], divide_by=divide_by)
    return plan
