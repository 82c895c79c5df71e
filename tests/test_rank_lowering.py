"""One rank's plan from its closed form (planner/rank_lowering.py) against the whole lowering."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from stragglerkit.planner.lowering import LoweredKind, OpColumn, RankPlan, lower, lower_one_rank, rank_plan
from stragglerkit.planner.ordering import in_round_order
from stragglerkit.planner.rank_lowering import one_rank_schedule
from stragglerkit.schedules.registry import Situation, generate

CASES = [
    ("ring", {}, None),
    ("rhd", {}, None),
    ("direct", {}, 2),
    ("stragglar", {}, 1),
    ("optcc", {2: 2.0}, None),
    ("optcc", {0: 1.25}, None),
    ("balanced_ring", {1: 8 / 7}, None),
]
WORLD_SIZES = [3, 4, 5, 6, 7, 8, 11, 12, 16, 24]
NUMELS = [0, 1, 7, 1000, 3 << 20]  # the last one is cut into pieces (1 MiB messages)


def _situation(algorithm: str, n: int, slowdowns: dict[int, float], straggler: int | None) -> Situation | None:
    situation = Situation(
        world_size=n,
        straggler=None if straggler is None else straggler % n,
        slowdowns={r % n: slow for r, slow in slowdowns.items()},
        segments=3,
    )
    if algorithm == "stragglar" and (n % 2 or n < 4):
        return None
    return situation


def _same_tables(fast: RankPlan, full: RankPlan) -> None:
    for name in ("ops", "dep_count", "child_ptr", "child_idx", "peers"):
        assert torch.equal(getattr(fast, name), getattr(full, name)), name
    assert (fast.labels, fast.scratch_numel, fast.pieces, fast.divides) == (
        full.labels,
        full.scratch_numel,
        full.pieces,
        full.divides,
    )
    assert sorted(fast.wait_order.tolist()) == sorted(full.wait_order.tolist())


@pytest.mark.parametrize(("algorithm", "slowdowns", "straggler"), CASES)
def test_one_ranks_plan_equals_the_whole_lowerings(
    algorithm: str, slowdowns: dict[int, float], straggler: int | None
) -> None:
    """Every rank, every table but the wait order equal to lower()'s; the wait orders of all
    ranks together run without deadlock under the executor's rules."""
    checked = 0
    for n in WORLD_SIZES:
        situation = _situation(algorithm, n, slowdowns, straggler)
        if situation is None:
            continue
        schedule = in_round_order(generate(algorithm, situation))
        for numel in NUMELS:
            for divide_by in (0, n):
                full = lower(schedule, numel, 4, straggler=situation.straggler, divide_by=divide_by)
                fast = []
                for rank in range(n):
                    part = one_rank_schedule(algorithm, situation, rank)
                    assert part is not None, (algorithm, n)
                    fast.append(lower_one_rank(part, numel, 4, divide_by))
                    _same_tables(fast[-1], full[rank])
                _runs_without_deadlock(fast)
                checked += 1
    assert checked >= 20


def _runs_without_deadlock(plans: list[RankPlan]) -> None:
    """Post every op once its dependencies completed, match messages per pair in posting order,
    and let each rank complete its messages only in its wait order: all ops must complete."""
    n = len(plans)
    tables = [plan.ops.tolist() for plan in plans]
    children = [
        [plan.child_idx[plan.child_ptr[i] : plan.child_ptr[i + 1]].tolist() for i in range(len(table))]
        for plan, table in zip(plans, tables, strict=True)
    ]
    pending = [plan.dep_count.tolist() for plan in plans]
    posted: list[set[int]] = [set() for _ in range(n)]
    done: list[set[int]] = [set() for _ in range(n)]
    channel_ops: dict[tuple[int, int, bool], list[int]] = {}
    position: dict[tuple[int, int], int] = {}
    for rank, table in enumerate(tables):
        for index, row in enumerate(table):
            kind = row[OpColumn.KIND]
            if kind in (LoweredKind.SEND, LoweredKind.RECV, LoweredKind.RECV_REDUCE):
                is_send = kind == LoweredKind.SEND
                src, dst = (rank, row[OpColumn.PEER]) if is_send else (row[OpColumn.PEER], rank)
                ops = channel_ops.setdefault((src, dst, is_send), [])
                position[(rank, index)] = len(ops)
                ops.append(index)
    ready: deque[tuple[int, int]] = deque(
        (rank, index) for rank in range(n) for index in range(len(tables[rank])) if pending[rank][index] == 0
    )
    cursor = [0] * n

    def complete(rank: int, index: int) -> None:
        done[rank].add(index)
        for child in children[rank][index]:
            child = child if child >= 0 else -child - 1  # posted-early edges: stricter here
            pending[rank][child] -= 1
            if pending[rank][child] == 0:
                ready.append((rank, child))

    def counterpart(rank: int, index: int) -> tuple[int, int]:
        row = tables[rank][index]
        is_send = row[OpColumn.KIND] == LoweredKind.SEND
        peer = row[OpColumn.PEER]
        key = (rank, peer, False) if is_send else (peer, rank, True)
        return peer, channel_ops[key][position[(rank, index)]]

    progress = True
    while progress:
        progress = False
        while ready:
            rank, index = ready.popleft()
            if tables[rank][index][OpColumn.KIND] in (LoweredKind.SEND, LoweredKind.RECV, LoweredKind.RECV_REDUCE):
                posted[rank].add(index)
            else:
                complete(rank, index)
            progress = True
        for rank in range(n):
            order = plans[rank].wait_order.tolist()
            while cursor[rank] < len(order):
                index = order[cursor[rank]]
                peer, other = counterpart(rank, index)
                if index not in posted[rank] or other not in posted[peer]:
                    break
                complete(rank, index)
                cursor[rank] += 1
                progress = True
    stuck = [rank for rank in range(n) if cursor[rank] < plans[rank].wait_order.numel()]
    assert not stuck, f"ranks {stuck} wait forever"


def test_rank_plan_takes_the_closed_form_above_64_ranks() -> None:
    plan = rank_plan("ring", Situation(world_size=100), numel=100 * 1000, element_size=4, rank=7, divide_by=100)
    assert plan.num_messages() == 4 * 99 and plan.divides  # a send and a receive in 2(p-1) rounds
    optcc = Situation(world_size=100, slowdowns={3: 2.0}, segments=2)
    assert rank_plan("optcc", optcc, numel=1 << 20, element_size=4, rank=3).num_messages() > 0


def test_no_closed_form_for_several_degraded_ranks() -> None:
    assert one_rank_schedule("optcc", Situation(world_size=8, slowdowns={1: 2.0, 5: 1.5}), 0) is None
    assert one_rank_schedule("stragglar", Situation(world_size=7), 0) is None  # odd: does not apply
