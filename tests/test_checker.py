"""The symbolic checker accepts correct schedules and rejects each kind of broken one."""

from __future__ import annotations

import pytest

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules import Op, OpKind, Schedule, ScheduleBuilder, check, direct, rhd, ring

S, R, RR, RED, CP = OpKind.SEND, OpKind.RECV, OpKind.RECV_REDUCE, OpKind.REDUCE, OpKind.COPY


def two_rank_exchange() -> list[list[Op]]:
    """A correct 2-rank, 1-chunk AllReduce: swap buffers into scratch, then add."""
    return [
        [
            Op(S, (0, 1), peer=1, round=0),
            Op(R, (0, 1), peer=1, scratch=0, round=0),
            Op(RED, (0, 1), scratch=0, depends=(0, 1)),
        ],
        [
            Op(S, (0, 1), peer=0, round=0),
            Op(R, (0, 1), peer=0, scratch=0, round=0),
            Op(RED, (0, 1), scratch=0, depends=(0, 1)),
        ],
    ]


def sched(ops: list[list[Op]], num_chunks: int = 1, **kw: object) -> Schedule:
    return Schedule(algorithm="test", world_size=len(ops), num_chunks=num_chunks, ops=ops, **kw)  # type: ignore[arg-type]


def test_minimal_exchange_is_correct() -> None:
    report = check(sched(two_rank_exchange()))
    assert report.num_messages == 2 and report.rounds == 1


@pytest.mark.parametrize("n", [*range(2, 17), 24, 31, 32, 63, 64])
@pytest.mark.parametrize("generator", [ring, rhd, direct])
def test_generators_pass(generator, n: int) -> None:  # type: ignore[no-untyped-def]
    report = check(generator(n))
    assert report.world_size == n


@pytest.mark.parametrize("n", [128, 256])
def test_generators_pass_large(n: int) -> None:
    for generator in (ring, rhd, direct):
        check(generator(n))


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_ring_and_rhd_round_counts(n: int) -> None:
    assert ring(n).rounds() == 2 * (n - 1)
    p = 1 << (n.bit_length() - 1)
    extra_rounds = 0 if p == n else 2
    assert rhd(n).rounds() == 2 * (p.bit_length() - 1) + extra_rounds


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 16])
def test_direct_broadcast_rounds(n: int) -> None:
    assert direct(n).rounds() == (n - 1).bit_length()  # ceil(log2 n)


def test_double_counting_rejected() -> None:
    ops = two_rank_exchange()
    ops[1].append(Op(S, (0, 1), peer=0, depends=(2,)))
    ops[0].append(Op(RR, (0, 1), peer=1, depends=(2,)))
    with pytest.raises(ScheduleError, match=r"double counting: rank 0 op 3 .*chunk 0"):
        check(sched(ops))


def test_missing_contribution_rejected() -> None:
    # rank 1 only receives rank 0's data (overwrite): it loses its own contribution.
    ops = [[Op(S, (0, 1), peer=1)], [Op(R, (0, 1), peer=0)]]
    with pytest.raises(ScheduleError, match=r"incomplete: at the end rank 0 chunk 0 lacks .*\{1\}"):
        check(sched(ops))


def test_send_of_data_not_yet_held_rejected() -> None:
    # rank 1 forwards chunk 0 to rank 2 without waiting for the receive that brings rank 0's part.
    b = ScheduleBuilder(3, 1, auto_depends=False)
    b.send(0, 1, (0, 1))
    b.recv_reduce(1, 0, (0, 1))
    b.send(1, 2, (0, 1))  # no depends on op 0
    with pytest.raises(ScheduleError, match=r"rank 1 op 1 \(send chunk 0 to 2\).*not yet held.*add 0 to depends"):
        check(b.build("broken"))


def test_write_while_reading_rejected() -> None:
    # the reduce writes chunk 0 while the send may still read it (no dependency on the send).
    ops = two_rank_exchange()
    ops[0][2] = Op(RED, (0, 1), scratch=0, depends=(1,))
    with pytest.raises(ScheduleError, match=r"rank 0 op 2 .*writes chunk 0 while op 0 .*may still be reading"):
        check(sched(ops))


def test_scratch_read_before_write_rejected() -> None:
    ops = [[Op(RED, (0, 1), scratch=3)], []]
    with pytest.raises(ScheduleError, match="reads scratch slot 3 before any op received into it"):
        check(sched(ops))


def test_unmatched_send_rejected() -> None:
    ops = two_rank_exchange()
    ops[0].append(Op(S, (0, 1), peer=1, depends=(2,)))
    with pytest.raises(ScheduleError, match=r"rank 0 op 3 .*rank 1 never receives it"):
        check(sched(ops))


def test_unmatched_recv_rejected() -> None:
    ops = two_rank_exchange()
    ops[0].append(Op(RR, (0, 1), peer=1, depends=(2,)))
    with pytest.raises(ScheduleError, match=r"rank 0 op 3 .*rank 1 never sends it"):
        check(sched(ops))


def test_chunk_mismatch_rejected() -> None:
    # rank 0 sends chunk 0, rank 1 adds it into chunk 1
    ops = [[Op(S, (0, 1), peer=1)], [Op(RR, (1, 2), peer=0)]]
    with pytest.raises(ScheduleError, match=r"send/recv mismatch: message 0 from rank 0 to rank 1 .*chunk 0.*chunk 1"):
        check(sched(ops, num_chunks=2))


def test_round_mismatch_rejected() -> None:
    ops = two_rank_exchange()
    ops[1][1] = Op(R, (0, 1), peer=0, scratch=0, round=1)
    with pytest.raises(ScheduleError, match="sent in  round 0 but received in  round 1"):
        check(sched(ops))


def test_deadlock_rejected() -> None:
    # both ranks wait to receive before they send
    ops = [
        [
            Op(R, (0, 1), peer=1, scratch=0),
            Op(S, (0, 1), peer=1, depends=(0,)),
            Op(RED, (0, 1), scratch=0, depends=(0, 1)),
        ],
        [
            Op(R, (0, 1), peer=0, scratch=0),
            Op(S, (0, 1), peer=0, depends=(0,)),
            Op(RED, (0, 1), scratch=0, depends=(0, 1)),
        ],
    ]
    with pytest.raises(
        ScheduleError,
        match=r"deadlock: .*rank 0 op 0 \(recv chunk 0 from 1 into scratch 0\) is posted and waits for rank 1 to send",
    ):
        check(sched(ops))


def test_deadlock_from_channel_order_rejected() -> None:
    # rank 0 posts send A then send B to rank 1 in order; rank 1 can only receive B first.
    ops = [
        [Op(S, (0, 1), peer=1), Op(S, (1, 2), peer=1)],
        [Op(R, (1, 2), peer=0), Op(R, (0, 1), peer=0)],
    ]
    with pytest.raises(ScheduleError, match="send/recv mismatch"):
        check(sched(ops, num_chunks=2))


def test_two_sends_in_one_round_rejected() -> None:
    b = ScheduleBuilder(3, 1)
    b.send(0, 1, (0, 1), round=0)
    b.send(0, 2, (0, 1), round=0)
    b.recv_reduce(1, 0, (0, 1), round=0)
    b.recv_reduce(2, 0, (0, 1), round=0)
    with pytest.raises(ScheduleError, match=r"rank 0 op 1 .*sends twice in round 0"):
        check(b.build("broken"))


def test_two_receives_in_one_round_rejected() -> None:
    b = ScheduleBuilder(3, 1)
    b.send(1, 0, (0, 1), round=0)
    b.send(2, 0, (0, 1), round=0)
    b.recv_reduce(0, 1, (0, 1), round=0)
    b.recv_reduce(0, 2, (0, 1), round=0)
    with pytest.raises(ScheduleError, match=r"rank 0 op 1 .*receives twice in round 0"):
        check(b.build("broken"))


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (Op(S, (0, 1), peer=5), "peer 5 is not a rank"),
        (Op(S, (0, 1), peer=0), "cannot send to or receive from itself"),
        (Op(S, (0, 3), peer=1), r"chunk range \(0, 3\) is empty or outside"),
        (Op(S, (1, 1), peer=1), "is empty or outside"),
        (Op(S, (0, 1), peer=1, depends=(0,)), "may only depend on earlier ops"),
        (Op(RED, (0, 1)), "needs a scratch slot"),
        (Op(RR, (0, 1), peer=1, scratch=1), "takes no scratch slot"),
        (Op(RED, (0, 1), peer=1, scratch=0), "takes no peer"),
    ],
)
def test_malformed_ops_rejected(op: Op, message: str) -> None:
    ops: list[list[Op]] = [[op], []]
    with pytest.raises(ScheduleError, match=message):
        check(sched(ops, num_chunks=2))


def test_bad_chunk_sizes_rejected() -> None:
    with pytest.raises(ScheduleError, match="chunk_sizes has 1 entries for 2 chunks"):
        check(sched(two_rank_exchange(), num_chunks=2, chunk_sizes=(1,)))
    with pytest.raises(ScheduleError, match="chunk_sizes must be positive"):
        check(sched(two_rank_exchange(), num_chunks=1, chunk_sizes=(0,)))


def test_copy_from_scratch() -> None:
    # rank 0 reduces, then sends the sum to rank 1, which copies it over its own chunk.
    b = ScheduleBuilder(2, 1)
    b.send(1, 0, (0, 1))
    b.recv_reduce(0, 1, (0, 1))
    b.send(0, 1, (0, 1))
    b.recv(1, 0, (0, 1), scratch=0)
    b.copy(1, 0, (0, 1))
    check(b.build("copy"))


def test_builder_auto_depends_orders_hazards() -> None:
    b = ScheduleBuilder(2, 1)
    send = b.send(0, 1, (0, 1))
    recv = b.recv(0, 1, (0, 1), scratch=0)
    red = b.reduce(0, 0, (0, 1))
    assert b.ops[0][red].depends == (send, recv)
    assert b.ops[0][recv].depends == ()


def test_json_round_trip() -> None:
    for schedule in (ring(5), rhd(6), direct(4)):
        text = schedule.to_json()
        again = Schedule.from_json(text)
        assert again == schedule
        check(again)


def test_json_rejects_other_versions_and_garbage() -> None:
    data = ring(3).to_dict()
    data["version"] = 99
    with pytest.raises(ScheduleError, match="format version 99 is not supported"):
        Schedule.from_dict(data)
    with pytest.raises(ScheduleError, match="does not parse"):
        Schedule.from_json("{not json")
    data = ring(3).to_dict()
    data["ranks"][0][0][0] = "teleport"
    with pytest.raises(ScheduleError, match="unknown op kind 'teleport'"):
        Schedule.from_dict(data)


def test_relabel_keeps_schedule_correct() -> None:
    base = direct(6)
    moved = base.relabel([0, 1, 5, 3, 4, 2])
    check(moved)
    # the straggler's ops (logical 5) now belong to rank 2
    assert len(moved.ops[2]) == len(base.ops[5])
    with pytest.raises(ScheduleError, match="permutation"):
        base.relabel([0, 0, 1, 2, 3, 4])


def test_registry_optcc_predicate_counts_servers() -> None:
    from stragglerkit.schedules.registry import Situation, why_not

    # 16 ranks, 8 per server: only 2 servers, so OptCC does not apply (it needs 3)
    reason = why_not("optcc", Situation(world_size=16, slowdowns={3: 2.0}, gpus_per_server=8))
    assert reason is not None and "at least 3 servers (2 here)" in reason
    assert why_not("optcc", Situation(world_size=12, slowdowns={3: 2.0}, gpus_per_server=4)) is None
    reason = why_not("optcc", Situation(world_size=12, slowdowns={0: 2.0, 5: 2.0}, gpus_per_server=4))
    assert reason is not None and "2 of 3 are degraded" in reason
    reason = why_not("optcc", Situation(world_size=4, slowdowns={}))
    assert reason == "needs at least one degraded rank (slowdown l > 1)"
