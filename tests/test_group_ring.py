"""Group AllReduce schedules: the generator's output is proven per group by the checker, for every
way of choosing disjoint groups in small worlds and many in larger ones; the checker rejects
schedules that leak a contribution across a group's boundary, touch a rank in no group, miss a
member, or leave members with sums added up in different orders; bad groups and weights give
clear errors; the lowering (pieces, empty chunks) keeps the group contract."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

import pytest

from stragglerkit.errors import ConfigError, ScheduleError
from stragglerkit.planner.lowering import lower
from stragglerkit.schedules import Op, OpKind, Schedule, ScheduleBuilder, check
from stragglerkit.schedules.check import completing_reductions
from stragglerkit.schedules.group_ring import group_ring, validate_groups
from stragglerkit.selective import group_shares


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every partition of ``items`` into non-empty blocks."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        yield [[first], *partition]
        for i in range(len(partition)):
            yield [*partition[:i], [first, *partition[i]], *partition[i + 1 :]]


def group_choices(n: int) -> Iterator[list[list[int]]]:
    """Every non-empty family of disjoint non-empty groups of ranks 0..n-1 (ranks may be in none)."""
    for k in range(1, n + 1):
        for chosen in itertools.combinations(range(n), k):
            yield from set_partitions(list(chosen))


def assert_group_contract(sched: Schedule, groups: list[list[int]]) -> None:
    n = sched.world_size
    group_of = {rank: i for i, group in enumerate(groups) for rank in group}
    for rank, ops in enumerate(sched.ops):
        if rank not in group_of or len(groups[group_of[rank]]) == 1:
            assert ops == [], f"rank {rank} should have no ops"
        for op in ops:
            assert op.peer is None or group_of[op.peer] == group_of[rank]
    assert sched.num_chunks <= n
    weights = sched.chunk_weights()
    total = sum(weights)
    for group in groups:
        m = len(group)
        if m < 2:
            continue
        # a ring: 2(m-1) sends per member, each of exactly 1/m of the buffer
        for rank in group:
            sends = [op for op in sched.ops[rank] if op.kind is OpKind.SEND]
            assert len(sends) == 2 * (m - 1)
            for op in sends:
                assert sum(weights[op.chunks[0] : op.chunks[1]]) * m == total


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_every_choice_of_groups_is_proven(n: int) -> None:
    count = 0
    for groups in group_choices(n):
        sched = group_ring(n, groups)
        report = check(sched)
        assert report.world_size == n
        assert_group_contract(sched, groups)
        count += 1
    # partitions of subsets of n ranks with at least one group: Bell(n + 1) - 1
    assert count == {1: 1, 2: 4, 3: 14, 4: 51, 5: 202, 6: 876}[n]


@pytest.mark.parametrize("n", [7, 8, 12, 16, 31, 64])
def test_random_groups_are_proven(n: int) -> None:
    rng = random.Random(n)
    for _ in range(40 if n <= 16 else 6):
        ranks = rng.sample(range(n), rng.randint(1, n))
        groups, start = [], 0
        while start < len(ranks):
            size = rng.randint(1, len(ranks) - start)
            groups.append(ranks[start : start + size])
            start += size
        sched = group_ring(n, groups)
        check(sched)
        assert_group_contract(sched, groups)


@pytest.mark.parametrize("n", [2, 3, 5, 7, 8])
def test_one_group_of_each_size(n: int) -> None:
    for m in range(1, n + 1):
        members = list(range(n - 1, n - 1 - m, -1))  # from the top rank down: not starting at 0
        sched = group_ring(n, [members])
        report = check(sched)
        assert report.num_messages == 2 * m * (m - 1)
        assert sched.rounds() == 2 * (m - 1)
        assert sched.params["groups"] == [sorted(members)]
        assert_group_contract(sched, [members])


def test_all_ranks_in_one_group_is_a_ring() -> None:
    sched = group_ring(6, [[0, 1, 2, 3, 4, 5]])
    assert sched.num_chunks == 6 and sched.chunk_sizes is None
    assert check(sched).rounds == 10


def test_several_groups_of_different_sizes_share_a_chunking() -> None:
    sched = group_ring(9, [[0, 1, 2, 3], [4, 5, 6], [7, 8]])
    # cuts at 1/4, 1/3, 1/2, 2/3, 3/4 of the buffer (in twelfths: 3, 4, 6, 8, 9)
    assert sched.chunk_sizes == (3, 1, 2, 2, 1, 3)
    check(sched)


def test_groups_are_canonical_whatever_the_order_given() -> None:
    a = group_ring(5, [[4, 1], [3, 0, 2]])
    b = group_ring(5, [[0, 2, 3], [1, 4]])
    assert a == b and a.params["groups"] == [[0, 2, 3], [1, 4]]


def test_json_round_trip_and_relabel_keep_the_groups() -> None:
    sched = group_ring(6, [[0, 2, 4], [1, 5]])
    again = Schedule.from_json(sched.to_json())
    assert again == sched
    check(again)
    moved = sched.relabel([3, 0, 1, 2, 5, 4])
    assert moved.params["groups"] == [[0, 4], [1, 3, 5]]
    check(moved)


def test_completing_reductions_once_per_owned_range() -> None:
    flags = completing_reductions(group_ring(5, [[0, 1, 2], [3, 4]]))
    assert flags is not None
    assert [sum(row) for row in flags] == [1, 1, 1, 1, 1]


# -- the checker rejects what breaks the group contract ----------------------------------------


def with_extra_message(sched: Schedule, src: int, dst: int, chunks: tuple[int, int], kind: OpKind) -> Schedule:
    """``sched`` plus one message ``src -> dst`` at the end of both ranks' programs (a ``recv``
    overwrites the chunks)."""
    ops = [list(rank_ops) for rank_ops in sched.ops]
    after_src = tuple(range(len(ops[src])))
    after_dst = tuple(range(len(ops[dst])))
    ops[src].append(Op(OpKind.SEND, chunks, peer=dst, depends=after_src))
    ops[dst].append(Op(kind, chunks, peer=src, depends=after_dst))
    return Schedule(sched.algorithm, sched.world_size, sched.num_chunks, ops, sched.chunk_sizes, None, sched.params)


def test_a_rank_in_no_group_may_not_contribute() -> None:
    # rank 2 is in no group; it sends its chunk to member 1, which adds it (a leak into the group)
    sched = with_extra_message(group_ring(3, [[0, 1]]), 2, 1, (0, 1), OpKind.RECV_REDUCE)
    with pytest.raises(ScheduleError, match=r"rank 1 op 4 \(recv_reduce chunk 0 from 2\): .*rank 2 is in no group"):
        check(sched)
    # the same messages as an AllReduce of all ranks are judged by the old rules: incomplete there
    sched.params.pop("groups")
    with pytest.raises(ScheduleError, match="incomplete"):
        check(sched)


def test_a_rank_in_no_group_may_not_be_touched() -> None:
    # member 2 overwrites the buffer of rank 0, which is in no group
    sched = with_extra_message(group_ring(3, [[1, 2]]), 2, 0, (0, 1), OpKind.RECV)
    with pytest.raises(
        ScheduleError, match=r"rank 0 op 0 \(recv chunk 0 from 2\): rank 0 is in no group, so its buffer"
    ):
        check(sched)


def test_a_message_across_groups_is_rejected() -> None:
    sched = with_extra_message(group_ring(4, [[0, 1], [2, 3]]), 2, 1, (0, 1), OpKind.RECV_REDUCE)
    with pytest.raises(ScheduleError, match=r"rank 1 is in group 0 but rank 2 is in group 1: .*within its group"):
        check(sched)


def test_a_group_missing_a_member_is_incomplete() -> None:
    sched = group_ring(3, [[0, 1]])
    sched.params["groups"] = [[0, 1, 2]]  # declares rank 2 a member, but the ring leaves it out
    with pytest.raises(ScheduleError, match=r"incomplete: at the end rank 0 chunk 0 lacks .*\{2\} of its group"):
        check(sched)


def test_double_counting_within_a_group_is_rejected() -> None:
    base = group_ring(4, [[0, 1], [2, 3]])
    last = base.ops[0][-1].chunks  # rank 0 sends its finished chunk to 1 again, which adds it
    sched = with_extra_message(base, 0, 1, last, OpKind.RECV_REDUCE)
    with pytest.raises(ScheduleError, match="double counting: rank 1"):
        check(sched)


def all_pull(n: int) -> Schedule:
    """Every rank receives every other rank's buffer into scratch and adds them, nearest first:
    the same contributions everywhere, added up in different orders."""
    b = ScheduleBuilder(n, 1)
    for rank in range(n):
        for k in range(1, n):
            b.send(rank, (rank + k) % n, (0, 1))
    for rank in range(n):
        for k in range(1, n):
            b.recv(rank, (rank - k) % n, (0, 1), scratch=k)
        for k in range(1, n):
            b.reduce(rank, k, (0, 1))
    return b.build("all_pull")


def test_members_must_end_with_the_same_additions() -> None:
    sched = all_pull(3)
    check(sched)  # as an AllReduce of all ranks it is correct: every rank holds every contribution
    sched.params["groups"] = [[0, 1, 2]]
    with pytest.raises(ScheduleError, match=r"not identical: at the end ranks 0 and 1 of group 0 hold chunk 0"):
        check(sched)
    two = all_pull(2)  # with two members x0 + x1 and x1 + x0 are the same sum (addition commutes)
    two.params["groups"] = [[0, 1]]
    check(two)


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ([[0, 1], [1, 2]], "rank 1 is declared in group 0 and in group 1"),
        ([[0, 3]], "names 3, which is not a rank of 0..2"),
        ([[0], []], "declared group 1 must be a non-empty list"),
        ([], "must be a non-empty list of groups"),
        ("0,1", "must be a non-empty list of groups"),
    ],
)
def test_malformed_declared_groups_are_rejected(declared: object, message: str) -> None:
    sched = group_ring(3, [[0, 1]])
    sched.params["groups"] = declared
    with pytest.raises(ScheduleError, match=message):
        check(sched)


# -- bad groups and weights: clear errors ----------------------------------------------------------


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([[0, 1], [1, 2]], "rank 1 is in group 0 and in group 1: groups must not overlap"),
        ([[0, 4]], "group 0 names rank 4, which is not a rank of this 4-rank group"),
        ([[0, -1]], "names rank -1"),
        ([[0, 1], []], "group 1 is empty"),
        ([], "groups is empty"),
        ([[0, 0]], "group 0 names rank 0 twice"),
        ([[0, 1.0]], "holds 1.0, which is not a rank"),
        ([[True, 2]], "holds True, which is not a rank"),
        ([0, 1], "group 0 must be a list of ranks"),
        ("01", "groups must be a list of groups"),
        (None, "groups must be a list of groups"),
    ],
)
def test_bad_groups(groups: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_groups(groups, 4)
    with pytest.raises(ConfigError, match=message):
        group_ring(4, groups)  # type: ignore[arg-type]


def test_a_group_of_one_keeps_its_value() -> None:
    sched = group_ring(3, [[1]])
    assert sched.ops == [[], [], []]
    check(sched)
    assert group_shares([[1]], [[7]], 3) == ((1.0,),)


def test_group_shares_normalise_per_group() -> None:
    shares = group_shares([[0, 2], [1, 3, 4]], [[3, 1], [2, 2, 4]], 5)
    assert shares == ((0.75, 0.25), (0.25, 0.25, 0.5))
    assert group_shares([[2, 0]], None, 3) == ((0.5, 0.5),)
    assert group_shares([[0, 1]], [[0, 0]], 2) == ((0.5, 0.5),)  # nothing done yet: equal shares
    for row in group_shares([[0, 1, 2]], [[0.1, 0.7, 0.2]], 3):
        assert math.isclose(sum(row), 1.0)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([[1, 1]], r"one list per group \(2 groups\)"),
        ([[1, 1], [1]], r"weights\[1\] must hold one weight per member of group 1 \(\[2, 3\]\)"),
        ([[1, -1], [1, 1]], "the weight of rank 1 in group 0 must be a finite number >= 0"),
        ([[1, 1], [math.nan, 1]], "the weight of rank 2 in group 1 must be a finite number"),
        ([[1, 1], [1, math.inf]], "the weight of rank 3 in group 1 must be a finite number"),
        ([[1, "2"], [1, 1]], "the weight of rank 1 in group 0"),
        ([[True, 1], [1, 1]], "the weight of rank 0 in group 0"),
        ("11", "one list per group"),
    ],
)
def test_bad_weights(weights: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        group_shares([[0, 1], [2, 3]], weights, 4)  # type: ignore[arg-type]


# -- lowering keeps the contract -------------------------------------------------------------------


@pytest.mark.parametrize("numel", [0, 1, 5, 1001, (1 << 23) + 3])
def test_lowering_keeps_the_contract(numel: int) -> None:
    sched = group_ring(7, [[0, 3, 5], [1, 2, 4, 6]])
    plans = lower(sched, numel, 4)  # with pieces > 1 the refined schedule is checked as a group AllReduce
    pieces = plans[0].pieces
    assert pieces > 1 or numel < (1 << 23)
    # per piece of a chunk range: 3 members send and receive 2 + 2 times each, 4 members 3 + 3
    assert sorted({plan.ops.shape[0] for plan in plans}) == [8 * pieces, 12 * pieces]
    for rank, plan in enumerate(plans):
        peers = set(plan.peers.tolist())
        assert peers <= ({0, 3, 5} if rank in (0, 3, 5) else {1, 2, 4, 6}) and rank not in peers
    untouched = lower(group_ring(4, [[0, 1, 2]]), numel, 4)[3]
    assert untouched.ops.shape[0] == 0 and untouched.num_messages() == 0 and untouched.peers.numel() == 0


def test_lowering_in_pieces_is_checked_per_group() -> None:
    from stragglerkit.planner.lowering import refine

    refined, _ = refine(group_ring(5, [[0, 1, 2], [3, 4]]), 3)
    assert refined.params["groups"] == [[0, 1, 2], [3, 4]]
    check(refined)


@pytest.mark.parametrize("n", [4, 5, 8])
def test_every_registered_algorithm_passes_as_one_group_of_all(n: int) -> None:
    """The group rules with one group of every rank are the AllReduce rules plus identical sums;
    every registered generator meets them (each chunk is added up once and then copied)."""
    from stragglerkit.schedules.registry import Situation, applicable, generate

    situation = Situation(world_size=n, straggler=1, slowdowns={2: 3.0})
    for algorithm in applicable(situation):
        sched = generate(algorithm, situation)
        sched.params["groups"] = [list(range(n))]
        check(sched)
