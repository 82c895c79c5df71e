"""Lowering: chunk boundaries, refinement into pieces, wait order, tables; bit-identity by construction."""

from __future__ import annotations

import pytest
import torch

from stragglerkit.errors import ScheduleError
from stragglerkit.planner.lowering import LoweredKind, OpColumn, chunk_bounds, lower, message_order, refine
from stragglerkit.planner.ordering import in_round_order
from stragglerkit.planner.remap import RankMap
from stragglerkit.schedules import check, ring
from stragglerkit.schedules.check import completing_reductions
from stragglerkit.schedules.ir import Op, OpKind, Schedule, ScheduleBuilder
from stragglerkit.schedules.registry import Situation, applicable, generate


def situation_for(n: int) -> Situation:
    return Situation(world_size=n, straggler=n // 2, slowdowns={1: 3.0}, segments=4)


DIVIDED = -1
"""Key tag of an interned ``tree / n`` in :func:`reduction_trees`."""


def reduction_trees(schedule: Schedule, divides: list[list[bool]] | None = None) -> list[list[int]]:
    """Run the schedule on interned expression trees; return, per rank and chunk, the final tree id.

    A leaf is a rank's own contribution; ``a + b`` is interned under the unordered pair {a, b}
    (floating-point addition is commutative, not associative), so equal ids mean bit-identical
    results for any input data. ``divides`` (per rank and op): that reduction's result is divided
    by n, interned as ``(DIVIDED, tree)``; it must hold every rank's contribution, and no
    reduction may add a divided value (the average would be divided twice or summed after).
    """
    n, num_chunks = schedule.world_size, schedule.num_chunks
    interned: dict[tuple[int, int], int] = {}
    masks = {rank: 1 << rank for rank in range(n)}
    divided: set[int] = set()
    current = (0, 0)  # the (rank, op) being simulated

    def add(a: int, b: int) -> int:
        assert a not in divided and b not in divided, f"rank {current[0]} op {current[1]} adds to an average"
        key = (min(a, b), max(a, b))
        tree = interned.setdefault(key, n + len(interned))
        masks[tree] = masks[a] | masks[b]
        if divides is None or not divides[current[0]][current[1]]:
            return tree
        assert masks[tree] == (1 << n) - 1, f"rank {current[0]} op {current[1]} divides a partial sum"
        quotient = interned.setdefault((DIVIDED, tree), n + len(interned))
        divided.add(quotient)
        return quotient

    buffers = [[rank] * num_chunks for rank in range(n)]
    scratch: list[dict[int, list[int]]] = [{} for _ in range(n)]
    channels: dict[tuple[int, int], list[list[int]]] = {}
    send_order: dict[tuple[int, int], list[int]] = {}
    recv_order: dict[tuple[int, int], list[int]] = {}
    for rank, ops in enumerate(schedule.ops):
        for index, op in enumerate(ops):
            if op.kind is OpKind.SEND:
                send_order.setdefault((rank, op.peer or 0), []).append(index)
            elif op.is_receive:
                recv_order.setdefault((op.peer or 0, rank), []).append(index)
    done = [[False] * len(ops) for ops in schedule.ops]
    progress = True
    while progress:
        progress = False
        for rank, ops in enumerate(schedule.ops):
            for index, op in enumerate(ops):
                if done[rank][index] or not all(done[rank][d] for d in op.depends):
                    continue
                current = (rank, index)
                lo, hi = op.chunks
                if op.kind is OpKind.SEND:
                    if send_order[(rank, op.peer or 0)][0] != index:
                        continue  # messages of a pair leave in program order
                    send_order[(rank, op.peer or 0)].pop(0)
                    channels.setdefault((rank, op.peer or 0), []).append(buffers[rank][lo:hi])
                elif op.is_receive:
                    queue = channels.get((op.peer or 0, rank), [])
                    if not queue or recv_order[(op.peer or 0, rank)][0] != index:
                        continue  # ... and are received in program order
                    recv_order[(op.peer or 0, rank)].pop(0)
                    data = queue.pop(0)
                    if op.kind is OpKind.RECV_REDUCE:
                        buffers[rank][lo:hi] = [add(a, b) for a, b in zip(buffers[rank][lo:hi], data)]
                    elif op.scratch is not None:
                        scratch[rank][op.scratch] = data
                    else:
                        buffers[rank][lo:hi] = data
                else:
                    assert op.scratch is not None
                    data = scratch[rank][op.scratch]
                    if op.kind is OpKind.REDUCE:
                        buffers[rank][lo:hi] = [add(a, b) for a, b in zip(buffers[rank][lo:hi], data)]
                    else:
                        buffers[rank][lo:hi] = data
                done[rank][index] = True
                progress = True
    assert all(all(d) for d in done), "simulation stuck"
    if divides is not None:
        for rank in range(n):
            for chunk, tree in enumerate(buffers[rank]):
                assert tree in divided, f"rank {rank} chunk {chunk} ends with a sum that no reduction divided"
    return buffers


def test_chunk_bounds_proportional_and_complete() -> None:
    assert chunk_bounds([1, 1, 2], 8) == [0, 2, 4, 8]
    assert chunk_bounds([1] * 4, 0) == [0, 0, 0, 0, 0]
    assert chunk_bounds([1] * 4, 1) == [0, 0, 1, 1, 1]
    bounds = chunk_bounds([3, 1, 5], 1001, align=16)
    assert bounds[0] == 0 and bounds[-1] == 1001
    assert all(b % 16 == 0 for b in bounds[1:-1]) and bounds == sorted(bounds)
    with pytest.raises(ScheduleError):
        chunk_bounds([1, 0], 10)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 12, 16])
def test_every_rank_ends_with_the_same_reduction_tree(n: int) -> None:
    situation = situation_for(n)
    for algorithm in applicable(situation):
        schedule = generate(algorithm, situation)
        for pieces in (1, 2):
            refined, _ = refine(schedule, pieces)
            check(refined)
            trees = reduction_trees(refined)
            for chunk in range(refined.num_chunks):
                held = {trees[rank][chunk] for rank in range(n)}
                assert len(held) == 1, f"{algorithm} n={n} pieces={pieces}: chunk {chunk} differs across ranks"


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 9, 16])
def test_an_averaging_plan_divides_each_final_sum_once(n: int) -> None:
    """Lowered with ``divide_by``, exactly the reductions that finish a chunk divide; every rank ends
    with the same divided tree, and nothing is added to a divided value."""
    situation = situation_for(n)
    for algorithm in applicable(situation):
        schedule = generate(algorithm, situation)
        for pieces in (1, 2):
            plans = lower(schedule, 4096, 4, pieces=pieces, divide_by=n)
            assert all(plan.divides for plan in plans)
            divide_column, kind_column = OpColumn.DIVIDE, OpColumn.KIND
            assert {d for plan in plans for d in plan.ops[:, divide_column].tolist()} <= {0, n}
            refined, _ = refine(schedule, pieces)
            completing = completing_reductions(refined)
            assert completing is not None
            # an op on a chunk of no elements (the balanced ring's smallest chunks in 4096
            # elements) is a no-op and divides nothing: its chunk has nothing to divide
            divides = [
                [
                    divide > 0 or (kind == LoweredKind.NOOP and completing[rank][index])
                    for index, (divide, kind) in enumerate(
                        zip(plan.ops[:, divide_column].tolist(), plan.ops[:, kind_column].tolist())
                    )
                ]
                for rank, plan in enumerate(plans)
            ]
            assert any(d > 0 for plan in plans for d in plan.ops[:, divide_column].tolist()), f"{algorithm} n={n}"
            trees = reduction_trees(refined, divides)
            for chunk in range(refined.num_chunks):
                held = {trees[rank][chunk] for rank in range(n)}
                assert len(held) == 1, f"{algorithm} n={n} pieces={pieces}: chunk {chunk} differs across ranks"
            unmarked = lower(schedule, 4096, 4, pieces=pieces)
            assert not any(plan.divides for plan in unmarked)
            assert all(not plan.ops[:, divide_column].any() for plan in unmarked)


def test_a_plan_divides_only_where_a_reduction_finishes_its_whole_range() -> None:
    """An op that finishes some chunks of its range but not others cannot divide op by op: the
    plans then say they do not divide, and the caller divides after the run."""
    good = ScheduleBuilder(2, 2)
    good.add(1, Op(OpKind.SEND, (1, 2), peer=0))
    good.add(0, Op(OpKind.RECV, (1, 2), peer=1, scratch=0))
    good.add(0, Op(OpKind.REDUCE, (1, 2), scratch=0))
    good.add(1, Op(OpKind.SEND, (0, 1), peer=0))
    good.add(0, Op(OpKind.RECV, (0, 1), peer=1, scratch=1))
    good.add(0, Op(OpKind.REDUCE, (0, 1), scratch=1))
    good.add(0, Op(OpKind.SEND, (0, 2), peer=1))
    good.add(1, Op(OpKind.RECV, (0, 2), peer=0))
    schedule = good.build("test")
    assert completing_reductions(schedule) == [[False, True, False, True, False], [False, False, False]]
    assert all(plan.divides for plan in lower(schedule, 10, 4, divide_by=2))

    mixed = ScheduleBuilder(3, 2)
    mixed.add(2, Op(OpKind.SEND, (0, 1), peer=1))
    mixed.add(1, Op(OpKind.RECV_REDUCE, (0, 1), peer=2))  # chunk 0 holds {1, 2}
    mixed.add(0, Op(OpKind.SEND, (0, 2), peer=1))
    mixed.add(1, Op(OpKind.RECV_REDUCE, (0, 2), peer=0))  # finishes chunk 0; chunk 1 holds {0, 1}
    mixed.add(2, Op(OpKind.SEND, (1, 2), peer=1))
    mixed.add(1, Op(OpKind.RECV_REDUCE, (1, 2), peer=2))  # finishes chunk 1
    for peer in (0, 2):
        mixed.add(1, Op(OpKind.SEND, (0, 2), peer=peer))
        mixed.add(peer, Op(OpKind.RECV, (0, 2), peer=1))
    schedule = mixed.build("test")
    check(schedule)
    assert completing_reductions(schedule) is None
    plans = lower(schedule, 10, 4, divide_by=3)
    assert not any(plan.divides for plan in plans)
    assert all(not plan.ops[:, OpColumn.DIVIDE].any() for plan in plans)


def test_reduction_tree_check_can_fail() -> None:
    # Two ranks that each add the other's value, then rank 0 adds a third copy round trip:
    # a schedule where rank 1 re-reduces in a different order is caught.
    b = ScheduleBuilder(3, 1)
    # rank 0 and 1 exchange; rank 2 sends to both; rank 0 computes (0+1)+2, rank 1 computes (1+2)+0
    b.send(0, 1, (0, 1))
    b.send(1, 0, (0, 1))
    b.recv(0, 1, (0, 1), scratch=0)
    b.send(2, 1, (0, 1))
    b.recv(1, 2, (0, 1), scratch=0)
    b.reduce(0, 0, (0, 1))
    b.reduce(1, 0, (0, 1))
    trees = reduction_trees(b.build("bad"))
    assert trees[0][0] != trees[1][0]


def test_refine_keeps_the_schedule_correct_and_splits_messages() -> None:
    sched = ring(4)
    refined, labels = refine(sched, 3)
    check(refined)
    assert refined.num_chunks == 12
    assert refined.num_ops() == 3 * sched.num_ops()
    assert labels[0][0] == "reduce_scatter round 0" and labels[0][-1] == "allgather round 5"


@pytest.mark.parametrize("n", [4, 6, 8])
def test_refined_rounds_pipeline_piece_by_piece(n: int) -> None:
    """StragglAR in round order, cut into 3 pieces: piece j of a round waits for piece j of the
    rank's previous round (not for all of its pieces), so the rounds pipeline; still correct."""
    ordered = in_round_order(generate("stragglar", Situation(world_size=n, straggler=n - 1)))
    pieces = 3
    refined, labels = refine(ordered, pieces)
    check(refined)
    pairs = 0
    for rank, ops in enumerate(ordered.ops):
        rounds = [i for i, op in enumerate(ops) if op.is_comm and op.round is not None and op.phase == "matching"]
        for later in rounds:
            earlier = [d for d in ops[later].depends if d in rounds and ops[d].round != ops[later].round]
            for j in range(pieces):
                depends = set(refined.ops[rank][later * pieces + j].depends)
                # on piece j of each earlier-round op, and on no other piece of it
                for d in earlier:
                    assert d * pieces + j in depends, (rank, later, j, d)
                    others = {d * pieces + k for k in range(pieces)} - {d * pieces + j}
                    assert not depends & others, (rank, later, j, d)
                    pairs += 1
        assert labels[rank][-1].startswith("matching round")
    assert pairs >= n * pieces  # every rank has rounds after its first


@pytest.mark.parametrize("numel", [0, 1, 3, 7, 1000])
def test_lower_tables_cover_the_buffer(numel: int) -> None:
    sched = ring(4)
    plans = lower(sched, numel, element_size=4)
    for rank, plan in enumerate(plans):
        assert plan.ops.shape == (len(sched.ops[rank]), len(OpColumn))
        kinds = plan.ops[:, OpColumn.KIND].tolist()
        counts = plan.ops[:, OpColumn.COUNT].tolist()
        assert all((k == LoweredKind.NOOP) == (c == 0) for k, c in zip(kinds, counts))
        assert plan.peers.tolist() == sorted({(rank + 1) % 4, (rank - 1) % 4})
        # the waited ops are exactly the non-empty comm ops
        comm = [i for i, k in enumerate(kinds) if k in (LoweredKind.SEND, LoweredKind.RECV, LoweredKind.RECV_REDUCE)]
        assert sorted(plan.wait_order.tolist()) == comm
        recv_reduce_elems = sum(c for k, c in zip(kinds, counts) if k == LoweredKind.RECV_REDUCE)
        assert plan.scratch_numel == recv_reduce_elems


def test_message_order_holds_back_the_straggler() -> None:
    sched = generate("direct", Situation(world_size=4, straggler=2))
    empty = [[False] * len(ops) for ops in sched.ops]
    order = message_order(sched, empty, straggler=2)
    for rank in (0, 1, 3):
        phases = [sched.ops[rank][i].phase for i in order[rank]]
        # every pre-phase message of a punctual rank comes before anything that needs the straggler
        assert phases == sorted(phases, key=lambda p: p != "pre_allreduce"), phases
        assert phases.count("pre_allreduce") == 8


def test_message_order_reports_a_deadlock() -> None:
    b = ScheduleBuilder(2, 1)
    b.recv(0, 1, (0, 1), scratch=0)
    b.send(0, 1, (0, 1), depends=[0])
    b.recv(1, 0, (0, 1), scratch=0)
    b.send(1, 0, (0, 1), depends=[0])
    sched = b.build("cycle")
    with pytest.raises(ScheduleError, match="deadlocks"):
        message_order(sched, [[False, False], [False, False]])


def test_rank_map() -> None:
    m = RankMap.from_sequence([2, 0, 1])
    assert m.physical(0) == 2 and m.logical(2) == 0 and not m.is_identity()
    assert RankMap.identity(3).is_identity()
    with pytest.raises(ValueError, match="permutation"):
        RankMap((0, 0, 1))
    with pytest.raises(ValueError, match="group has 4"):
        RankMap.from_sequence([0, 1, 2], world_size=4)
    with pytest.raises(ValueError, match="not a rank"):
        m.logical(5)


def test_lower_rejects_negative_numel() -> None:
    with pytest.raises(ValueError):
        lower(ring(2), -1, 4)
    assert torch.equal(lower(ring(2), 0, 4)[0].wait_order, torch.empty(0, dtype=torch.int64))


def _after_post(plan: object) -> list[tuple[int, int]]:
    """(a, b) for every dependent ``b`` that the lowered ``plan`` marks as met when ``a`` is posted."""
    ptr, idx = plan.child_ptr.tolist(), plan.child_idx.tolist()  # type: ignore[attr-defined]
    return [(a, -idx[k] - 1) for a in range(len(ptr) - 1) for k in range(ptr[a], ptr[a + 1]) if idx[k] < 0]


def test_post_ahead_links_only_consecutive_messages_of_one_connection_over_disjoint_ranges() -> None:
    """OptCC's healthy ranks chain their receives for one flow per NIC direction; where two
    chained receives share a connection and nothing else, the later one may be posted once the
    earlier one is."""
    situation = Situation(world_size=8, slowdowns={3: 8 / 7}, segments=9)
    plans = lower(generate("optcc", situation), 1 << 20, 4)
    healthy = _after_post(plans[0])
    assert len(healthy) > plans[0].num_messages() // 4
    for plan in plans:
        ops = plan.ops.tolist()
        receives = {int(LoweredKind.RECV), int(LoweredKind.RECV_REDUCE)}
        for a, b in _after_post(plan):
            assert ops[b][6] == a  # b's predecessor on its channel: the same peer
            assert ops[a][0] in receives and ops[b][0] in receives  # sends stay chained
            assert ops[a][2] + ops[a][3] <= ops[b][2] or ops[b][2] + ops[b][3] <= ops[a][2]
    # the edge is a dependency of b either way: counted once
    for plan in plans:
        assert sum(plan.dep_count.tolist()) == plan.child_idx.numel()


def test_post_ahead_keeps_waiting_where_ranges_overlap() -> None:
    """Two receives from one peer into the same chunk (a reduction, then the final value): the
    second must wait for the first's completion, whose reduction writes that chunk."""
    builder = ScheduleBuilder(2, 1)
    builder.send(0, 1, (0, 1))
    builder.recv_reduce(1, 0, (0, 1))  # rank 1 holds the sum
    builder.send(1, 0, (0, 1))
    builder.recv(0, 1, (0, 1))  # rank 0 too
    builder.send(0, 1, (0, 1))
    builder.recv(1, 0, (0, 1))  # and rank 1 gets it again over the same connection, into the same chunk
    schedule = builder.build("overlap")
    check(schedule)
    plan = lower(schedule, 64, 4, pieces=1)[1]
    assert plan.ops.tolist()[2][6] == 0  # the second receive's channel predecessor is the first
    assert _after_post(plan) == []
