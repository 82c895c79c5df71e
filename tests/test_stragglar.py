"""StragglAR generator: every schedule proved by the symbolic checker, round counts against the paper."""

from __future__ import annotations

import math
from functools import cache

import pytest

from stragglerkit.errors import NotApplicableError, ScheduleError
from stragglerkit.schedules import Schedule, check
from stragglerkit.schedules.ir import OpKind
from stragglerkit.schedules.registry import Situation, generate
from stragglerkit.schedules.stragglar import MATCHING_PHASE, PRE_PHASE, Transfer, stragglar, stragglar_plan

EVEN_SIZES = list(range(4, 65, 2))
POWERS_OF_TWO = [4, 8, 16, 32, 64, 128, 256]
# Reference generator's round counts for even n that are not powers of two (docs/stragglar.md).
REFERENCE_ROUNDS = {6: 7, 10: 12, 12: 15, 14: 17, 24: 27}


@cache
def built(n: int) -> Schedule:
    """Each size is built once per test session; the non-power-of-two matchings take a while."""
    return stragglar(n)


def exchanges(sched: Schedule, phase: str) -> dict[int, set[tuple[int, int]]]:
    """round -> {(sender, receiver)} of the messages tagged with ``phase``."""
    rounds: dict[int, set[tuple[int, int]]] = {}
    for rank, _, op in sched.iter_ops():
        if op.kind is OpKind.SEND and op.phase == phase:
            assert op.round is not None and op.peer is not None
            rounds.setdefault(op.round, set()).add((rank, op.peer))
    return rounds


@pytest.mark.parametrize("n", EVEN_SIZES)
def test_checker_proves_every_even_size(n: int) -> None:
    sched = built(n)
    report = check(sched)
    assert report.world_size == n and report.num_chunks == n - 1
    assert report.rounds == len(stragglar_plan(n)) == sched.params["rounds"]
    assert sched.phases() == [PRE_PHASE, MATCHING_PHASE]


@pytest.mark.parametrize("n", [128, 256])
def test_checker_proves_large_powers_of_two(n: int) -> None:
    check(built(n))


@pytest.mark.parametrize("n", POWERS_OF_TWO)
def test_power_of_two_rounds_are_exactly_n_plus_log2_n_minus_2(n: int) -> None:
    assert built(n).rounds() == n + int(math.log2(n)) - 2


def test_power_of_two_round_counts_match_the_paper() -> None:
    assert {n: built(n).rounds() for n in POWERS_OF_TWO} == {
        4: 4,
        8: 9,
        16: 18,
        32: 35,
        64: 68,
        128: 133,
        256: 262,
    }


@pytest.mark.parametrize("n", sorted(REFERENCE_ROUNDS))
def test_non_power_of_two_is_no_worse_than_the_reference(n: int) -> None:
    assert built(n).rounds() <= REFERENCE_ROUNDS[n]


@pytest.mark.parametrize("n", EVEN_SIZES)
def test_rounds_meet_the_lower_bound(n: int) -> None:
    # c_{n-2} is fully reduced in round n-2 on two ranks and needs ceil(log2(n/2)) more doublings,
    # so no schedule of this form is shorter; the generator reaches the bound for every n <= 64
    lower_bound = n + math.ceil(math.log2(n)) - 2
    assert built(n).rounds() == lower_bound


@pytest.mark.parametrize("n", [4, 6, 8, 10, 16, 24, 64])
def test_rank_r_pairs_with_the_straggler_in_round_r(n: int) -> None:
    straggler = n - 1
    rounds = exchanges(built(n), MATCHING_PHASE)
    for r in range(n - 1):
        assert (r, straggler) in rounds[r] and (straggler, r) in rounds[r]
    for r in range(n - 1, max(rounds) + 1):  # afterwards the straggler only gives
        assert all(receiver != straggler for _, receiver in rounds[r])


@pytest.mark.parametrize("n", [4, 6, 16, 18])
def test_every_matching_op_is_round_tagged(n: int) -> None:
    # the checker's one-send-one-receive-per-round rule only sees round-tagged ops
    ops = [op for _, _, op in built(n).iter_ops() if op.phase == MATCHING_PHASE]
    assert ops and all(op.round is not None for op in ops)
    assert {op.round for op in ops} == set(range(len(stragglar_plan(n))))


@pytest.mark.parametrize("n", [4, 8, 16, 32])
def test_straggler_only_sends_the_last_chunk_after_its_pairings(n: int) -> None:
    plan = stragglar_plan(n)
    late = [move for moves in plan[n - 1 :] for move in moves if move.sender == n - 1]
    assert late and all(move.chunk == n - 2 for move in late)


@pytest.mark.parametrize("n", [6, 8, 12, 16])
def test_plan_moves_only_chunks_the_sender_holds_and_the_receiver_lacks(n: int) -> None:
    held: list[set[int]] = [set() for _ in range(n)]
    for r, moves in enumerate(stragglar_plan(n)):
        senders = [m.sender for m in moves]
        receivers = [m.receiver for m in moves]
        assert len(set(senders)) == len(senders) and len(set(receivers)) == len(receivers)
        if r < n - 1:
            assert r not in senders + receivers and n - 1 not in senders + receivers
        for move in moves:
            assert move.chunk in held[move.sender] and move.chunk not in held[move.receiver]
        for move in moves:
            held[move.receiver].add(move.chunk)
        if r < n - 1:
            held[r].add(r)
            held[n - 1].add(r)
    assert all(h == set(range(n - 1)) for h in held)


def test_four_rank_example_from_the_module_docstring() -> None:
    assert stragglar_plan(4) == [
        [],
        [Transfer(0, 2, 0)],
        [Transfer(0, 1, 0), Transfer(1, 0, 1)],
        [Transfer(1, 2, 1), Transfer(2, 1, 2), Transfer(3, 0, 2)],
    ]


@pytest.mark.parametrize(("n", "straggler"), [(4, 0), (6, 2), (8, 3), (10, 4), (12, 11), (16, 0), (16, 7)])
def test_registry_relabels_onto_the_real_straggler(n: int, straggler: int) -> None:
    sched = generate("stragglar", Situation(world_size=n, straggler=straggler))
    check(sched)
    assert sched.params["straggler"] == straggler
    assert sched.rounds() == built(n).rounds()
    # the real straggler takes no part in the pre-phase and swaps chunk r with logical rank r
    assert all(op.phase == MATCHING_PHASE for op in sched.ops[straggler])
    rounds = exchanges(sched, MATCHING_PHASE)
    logical_zero = 0 if straggler != 0 else n - 1
    assert (logical_zero, straggler) in rounds[0]


@pytest.mark.parametrize("n", [3, 5, 7, 9, 33])
def test_odd_sizes_are_refused_with_the_alternatives(n: int) -> None:
    with pytest.raises(NotApplicableError, match=r"even world size of at least 4") as info:
        stragglar(n)
    for name in ("ring", "rhd", "direct"):
        assert name in str(info.value)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_small_sizes_are_refused(n: int) -> None:
    with pytest.raises(NotApplicableError, match=r"even world size of at least 4") as info:
        stragglar(n)
    if n == 2:
        assert all(name in str(info.value) for name in ("ring", "rhd", "direct"))


def test_non_integer_world_size_is_refused() -> None:
    with pytest.raises(ValueError, match="must be an int"):
        stragglar(8.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [4, 6, 8, 12])
def test_json_round_trip(n: int) -> None:
    sched = built(n)
    again = Schedule.from_json(sched.to_json())
    assert again == sched
    check(again)


def test_checker_catches_a_broken_stragglar_schedule() -> None:
    """Guards the guard: a rank that skips its last receive must be caught."""
    sched = Schedule.from_json(built(8).to_json())
    rank = next(r for r, ops in enumerate(sched.ops) if ops[-1].kind is OpKind.RECV)
    sched.ops[rank].pop()
    with pytest.raises(ScheduleError, match="never receives"):
        check(sched)
