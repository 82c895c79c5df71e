"""Pattern proofs (schedules/pattern.py): the closed-form rounds are the generated schedules, and the
proof both accepts them and rejects broken ones."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules import pattern
from stragglerkit.schedules.check import check
from stragglerkit.schedules.ir import OpKind, Schedule
from stragglerkit.schedules.registry import Situation, generate

EXHAUSTIVE_BOUND = 40
"""Every p in 2..EXHAUSTIVE_BOUND (even p from 4 for StragglAR) is compared op list by op list."""


def _sizes(algorithm: str) -> list[int]:
    sizes = [*range(2, EXHAUSTIVE_BOUND + 1), 64]
    if algorithm == "stragglar":
        return [n for n in sizes if n >= 4 and n % 2 == 0]
    return sizes


def _messages(sched: Schedule) -> dict[tuple[str, int], Counter[tuple[int, int, int, int, bool]]]:
    """Per (phase, round): the messages (src, dst, start, stop, adds) of the generated schedule."""
    out: dict[tuple[str, int], Counter[tuple[int, int, int, int, bool]]] = {}
    for rank, ops in enumerate(sched.ops):
        for index, op in enumerate(ops):
            if not op.is_receive:
                continue
            assert op.peer is not None and op.round is not None
            adds = op.kind is OpKind.RECV_REDUCE
            if op.scratch is not None:
                then = next(
                    o for o in ops[index + 1 :] if o.scratch == op.scratch and o.kind in (OpKind.REDUCE, OpKind.COPY)
                )
                adds = then.kind is OpKind.REDUCE
            key = (op.phase, op.round)
            out.setdefault(key, Counter())[(op.peer, rank, op.chunks[0], op.chunks[1], adds)] += 1
    return out


def _pattern_messages(algorithm: str, n: int, relabel: list[int] | None = None) -> tuple[list[tuple[str, int]], dict]:
    _, _, rounds = pattern.round_flows(algorithm, n, relabel)
    order, out = [], {}
    for f in rounds:
        order.append((f.phase, f.round))
        out[(f.phase, f.round)] = Counter(
            zip(f.src.tolist(), f.dst.tolist(), f.start.tolist(), f.stop.tolist(), f.adds.tolist(), strict=True)
        )
    return order, out


@pytest.mark.parametrize("algorithm", sorted(pattern.PATTERNS))
def test_closed_form_rounds_are_the_generated_schedule(algorithm: str) -> None:
    for n in _sizes(algorithm):
        straggler = 1 if algorithm in ("stragglar", "direct") and n > 2 else None
        sched = generate(algorithm, Situation(world_size=n, straggler=straggler))
        relabel = None
        if straggler is not None:
            relabel = list(range(n))
            relabel[n - 1], relabel[straggler] = straggler, n - 1
        order, expected = _pattern_messages(algorithm, n, relabel)
        assert _messages(sched) == expected, (algorithm, n)
        # every rank meets the rounds in the pattern's order
        position = {tag: i for i, tag in enumerate(order)}
        for ops in sched.ops:
            seen = [position[(op.phase, op.round)] for op in ops if op.is_comm]
            assert seen == sorted(seen), (algorithm, n)
        report = pattern.prove(algorithm, n, relabel)
        assert report.rounds == sched.rounds(), (algorithm, n)
        assert report.num_chunks == sched.num_chunks
        check(sched)  # the full checker proves the very same schedule


@pytest.mark.parametrize(
    ("algorithm", "n"), [("ring", 1024), ("rhd", 1000), ("direct", 257), ("stragglar", 256), ("stragglar", 1024)]
)
def test_large_sizes_are_proved(algorithm: str, n: int) -> None:
    report = pattern.prove(algorithm, n)
    log_p = n.bit_length() - 1  # p = 2**log_p, the largest power of two <= n
    expected_rounds = {
        "ring": 2 * (n - 1),
        "rhd": 2 * log_p + (2 if n != 1 << log_p else 0),  # + the two whole-buffer rounds of the rest
        "direct": (n - 1).bit_length(),  # the broadcast from the straggler: ceil(log2(n)) rounds
        "stragglar": n + log_p - 2,  # Algorithm 1's matching rounds (StragglAR, Table 1)
    }[algorithm]
    assert report.world_size == n and report.rounds == expected_rounds


def _broken(algorithm: str, n: int, mutate: object) -> None:
    real = pattern.PATTERNS[algorithm]

    def patched(world_size: int):  # type: ignore[no-untyped-def]
        chunks, phase, rounds = real(world_size)
        return chunks, phase, (mutate(i, f) for i, f in enumerate(rounds))  # type: ignore[operator]

    pattern.PATTERNS[algorithm] = patched
    try:
        pattern.prove(algorithm, n)
    finally:
        pattern.PATTERNS[algorithm] = real


def _shift_one_chunk(target: int):  # type: ignore[no-untyped-def]
    def mutate(i: int, f: pattern.RoundFlows) -> pattern.RoundFlows:
        if i != target:
            return f
        start = f.start.copy()
        start[0] = (start[0] + 1) % (int(f.stop.max()))
        return dataclasses.replace(f, start=start, stop=start + (f.stop - f.start))

    return mutate


@pytest.mark.parametrize("algorithm", sorted(pattern.PATTERNS))
def test_a_mutated_flow_is_rejected(algorithm: str) -> None:
    n = 16
    rounds = len(list(pattern.round_flows(algorithm, n)[2]))
    # (a flow of direct's pre-phase all-gather to a rank other than 0 may well be wrong: the
    # broadcast overwrites those copies, and both checkers accept that)
    for target in (0, 1, rounds - 1):
        with pytest.raises(ScheduleError):
            _broken(algorithm, n, _shift_one_chunk(target))


def test_a_dropped_round_is_incomplete() -> None:
    with pytest.raises(ScheduleError, match="incomplete"):
        _broken(
            "ring",
            33,
            lambda i, f: (
                dataclasses.replace(
                    f, src=f.src[:0], dst=f.dst[:0], start=f.start[:0], stop=f.stop[:0], adds=f.adds[:0]
                )
                if i == 40
                else f
            ),
        )


def test_an_adding_copy_double_counts() -> None:
    with pytest.raises(ScheduleError, match="double counting"):
        _broken("ring", 12, lambda i, f: dataclasses.replace(f, adds=np.ones_like(f.adds)) if i == 11 else f)


def test_two_sends_in_one_round_are_rejected() -> None:
    def mutate(i: int, f: pattern.RoundFlows) -> pattern.RoundFlows:
        if i != 3:
            return f
        src = f.src.copy()
        src[1] = src[0] if src[0] != f.dst[1] else src[2]
        return dataclasses.replace(f, src=src)

    with pytest.raises(ScheduleError):
        _broken("ring", 8, mutate)


def test_blocks_of_chunks_prove_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pattern, "BLOCK_BYTES", 64 * 8 * 3)  # three chunks per block at n = 64
    assert pattern.prove("rhd", 64).rounds == 12
    with pytest.raises(ScheduleError):
        _broken("ring", 64, _shift_one_chunk(70))


BALANCED_SLOWDOWNS = [{}, {1: 8 / 7}, {0: 1.4, 3: 1.1}]
"""Healthy (one slice), one slow NIC (a few slices), two (up to ``MAX_SLICES``)."""


def _flows_per_rank(flows: list[pattern.RoundFlows], n: int) -> list[list[tuple[OpKind, int, tuple[int, int]]]]:
    """Each rank's ops as the flows imply them: per group, its send, then its receive (every rank
    sends once and receives once per group)."""
    ops: list[list[tuple[OpKind, int, tuple[int, int]]]] = [[] for _ in range(n)]
    for f in flows:
        messages = list(zip(f.src.tolist(), f.dst.tolist(), f.start.tolist(), f.stop.tolist(), f.adds.tolist()))
        for src, dst, start, stop, _ in messages:
            ops[src].append((OpKind.SEND, dst, (start, stop)))
        for src, dst, start, stop, adds in messages:
            ops[dst].append((OpKind.RECV_REDUCE if adds else OpKind.RECV, src, (start, stop)))
    return ops


@pytest.mark.parametrize("slowdowns", BALANCED_SLOWDOWNS, ids=["healthy", "one_slow", "two_slow"])
def test_balanced_ring_flows_are_the_generated_schedule(slowdowns: dict[int, float]) -> None:
    """Every rank's op list of the generator, in order, is the slices' ring messages; the full
    checker proves the schedule and the slice proof proves the flows."""
    for n in range(max(slowdowns, default=0) + 2, 25):
        sched = generate("balanced_ring", Situation(world_size=n, slowdowns=slowdowns))
        slices = int(sched.params["slices"])
        flows = list(pattern.balanced_ring_flows(n, slices))
        expected = _flows_per_rank(flows, n)
        for rank, ops in enumerate(sched.ops):
            assert [(op.kind, op.peer, op.chunks) for op in ops] == expected[rank], (n, slices, rank)
        report = pattern.prove_slices("balanced_ring", n, slices, flows)
        assert (report.num_chunks, report.num_messages, report.rounds) == (
            sched.num_chunks,
            sum(map(len, expected)) // 2,
            0,
        )
        check(sched)
    assert slices > 1 or not slowdowns


def test_the_slice_proof_rejects_what_is_not_the_ring_per_slice() -> None:
    n, slices = 6, 3
    good = list(pattern.balanced_ring_flows(n, slices))
    pattern.prove_slices("balanced_ring", n, slices, good)

    def broken(index: int, **change: object) -> list[pattern.RoundFlows]:
        flows = list(good)
        flows[index] = dataclasses.replace(flows[index], **change)  # type: ignore[arg-type]
        return flows

    chunk_out_of_slice = broken(4, start=good[4].start + n, stop=good[4].stop + n)
    with pytest.raises(ScheduleError, match=r"group 4 \(step 1, slice 1\): a message leaves"):
        pattern.prove_slices("balanced_ring", n, slices, chunk_out_of_slice)
    wrong_receiver = broken(7, dst=np.roll(good[7].dst, 1))
    with pytest.raises(ScheduleError, match=r"group 7 \(step 2, slice 1\): the messages are not the ring's step 2"):
        pattern.prove_slices("balanced_ring", n, slices, wrong_receiver)
    stores_instead_of_adding = broken(0, adds=~good[0].adds)
    with pytest.raises(ScheduleError, match="group 0"):
        pattern.prove_slices("balanced_ring", n, slices, stores_instead_of_adding)
    with pytest.raises(ScheduleError, match="expected 30"):
        pattern.prove_slices("balanced_ring", n, slices, good[:-1])
    swapped = list(good)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    with pytest.raises(ScheduleError, match="group 0"):
        pattern.prove_slices("balanced_ring", n, slices, swapped)


def test_balanced_ring_is_proved_at_scale() -> None:
    report = pattern.prove_balanced_ring(1024, 8)
    assert (report.world_size, report.num_chunks, report.rounds) == (1024, 8 * 1024, 0)
    assert report.num_messages == 2 * 1023 * 8 * 1024
