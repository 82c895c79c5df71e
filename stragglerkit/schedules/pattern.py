"""Pattern proofs: a round schedule proved from its closed-form rounds, without its op list.

The full checker (``check.py``) executes every op of every rank on contribution sets: ``O(k p^2)``
ops for the ring family, minutes at ``p = 1,024``. The round schedules here (ring, recursive
halving/doubling, the direct baseline, StragglAR) are closed-form functions of ``(round, rank)``:
:func:`round_flows` yields each round as a few numpy arrays (who sends which chunk range to whom,
and whether the receiver adds it or stores it), built in ``O(p)`` per round without any ``Op``.
:func:`prove` executes those rounds on contribution sets, vectorised per round:

* every rank's chunk starts holding ``{rank}`` (a bitset of ``p`` bits per rank and chunk);
* per round, each rank sends at most one message and receives at most one (the round rule),
  never to itself, and no chunk of a rank is written twice in one round;
* a message carries what its sender held at the start of the round (what the generated schedule
  does: within a round a rank's send comes first in program order and its write waits for it);
* an adding receive must not overlap what the receiver holds (double counting), a storing one
  overwrites;
* at the end every rank holds every chunk with all ``p`` contributions.

Chunks never mix (every message names the same range on both sides), so the chunks are proved in
blocks that keep the bitsets under :data:`BLOCK_BYTES`; memory is ``O(p)`` per chunk held.

The balanced ring runs the ring once per slice on its own chunks (:func:`balanced_ring_flows`);
:func:`prove_slices` checks that structure and proves the ring, which proves every slice.

What links the closed form to the generator is the test suite (tests/test_pattern.py): for every
``p`` up to a bound, the messages of ``round_flows`` are exactly those of the generated schedule,
and the full checker proves that schedule. docs/schedules.md ("What is proven at which size")
says what the command line runs at which size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from stragglerkit.errors import ScheduleError

__all__ = [
    "BLOCK_BYTES",
    "FULL_CHECK_MAX_RANKS",
    "PATTERNS",
    "PatternReport",
    "RoundFlows",
    "balanced_ring_flows",
    "expand_chunks",
    "prove",
    "prove_balanced_ring",
    "prove_rounds",
    "prove_slices",
    "round_flows",
]

BLOCK_BYTES = 128 << 20
"""Most memory the contribution bitsets of one block of chunks may take."""

FULL_CHECK_MAX_RANKS = 64
"""Up to this world size ``stragglerkit schedule`` runs the full checker on the generated op list
(well under a second for these algorithms); above it, the pattern proof where there is one."""


@dataclass(slots=True)
class RoundFlows:
    """One round's messages as parallel arrays (one entry per message)."""

    phase: str
    round: int
    src: np.ndarray
    dst: np.ndarray
    start: np.ndarray
    """First chunk of each message's range."""
    stop: np.ndarray
    """One past the last chunk."""
    adds: np.ndarray
    """Bool: the receiver adds the data in (``recv_reduce`` or receive + ``reduce``), else stores it."""


@dataclass(slots=True, frozen=True)
class PatternReport:
    """What :func:`prove` executed."""

    algorithm: str
    world_size: int
    num_chunks: int
    num_messages: int
    rounds: int
    """Distinct round tags of the headline phase (``Schedule.rounds()`` of the generated schedule)."""


def _flows(
    phase: str, rnd: int, src: np.ndarray, dst: np.ndarray, start: np.ndarray, width: int | np.ndarray, adds: bool
) -> RoundFlows:
    stop = start + width
    return RoundFlows(phase, rnd, src, dst, start, stop, np.full(len(src), adds))


def _ring_rounds(
    members: np.ndarray, phase_rs: str, phase_ag: str | None, ag_first_round: int = -1
) -> Iterator[RoundFlows]:
    """``ring.add_ring_reduce_scatter`` (and the all-gather) among ``members``, owned chunk = member index."""
    m = len(members)
    i = np.arange(m)
    nxt = members[(i + 1) % m]
    for step in range(m - 1):
        yield _flows(phase_rs, step, members, nxt, (i - 1 - step) % m, 1, True)
    if phase_ag is not None:
        first = m - 1 if ag_first_round < 0 else ag_first_round
        for step in range(m - 1):
            yield _flows(phase_ag, first + step, members, nxt, (i - step) % m, 1, False)


def _ring(n: int) -> tuple[int, str | None, Iterator[RoundFlows]]:
    return n, None, _ring_rounds(np.arange(n), "reduce_scatter", "allgather")


def _rhd(n: int) -> tuple[int, str | None, Iterator[RoundFlows]]:
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    log_p = p.bit_length() - 1

    def rounds() -> Iterator[RoundFlows]:
        nxt = 0
        if extra:
            i = np.arange(extra)
            yield _flows("fold_in", 0, 2 * i, 2 * i + 1, np.zeros(extra, np.int64), p, True)
            nxt = 1
        v = np.arange(p)
        real = np.where(v < extra, 2 * v + 1, v + extra)
        lo, hi = np.zeros(p, np.int64), np.full(p, p, np.int64)
        history = []
        for j in range(log_p):
            dist = p >> (j + 1)
            mid = (lo + hi) // 2
            upper = (v & dist) != 0
            keep_lo, keep_hi = np.where(upper, mid, lo), np.where(upper, hi, mid)
            give_lo, give_hi = np.where(upper, lo, mid), np.where(upper, mid, hi)
            yield RoundFlows("reduce_scatter", nxt + j, real, real[v ^ dist], give_lo, give_hi, np.ones(p, bool))
            history.append((keep_lo, keep_hi, dist))
            lo, hi = keep_lo, keep_hi
        nxt += log_p
        for j in range(log_p):
            keep_lo, keep_hi, dist = history[log_p - 1 - j]
            yield RoundFlows("allgather", nxt + j, real, real[v ^ dist], keep_lo, keep_hi, np.zeros(p, bool))
        nxt += log_p
        if extra:
            i = np.arange(extra)
            yield _flows("fold_out", nxt, 2 * i + 1, 2 * i, np.zeros(extra, np.int64), p, False)

    return p, None, rounds()


def _direct(n: int) -> tuple[int, str | None, Iterator[RoundFlows]]:
    chunks = max(n - 1, 1)
    straggler = n - 1

    def rounds() -> Iterator[RoundFlows]:
        if n - 1 >= 2:
            yield from _ring_rounds(np.arange(n - 1), "pre_allreduce", "pre_allreduce")
        zero = np.zeros(2, np.int64)
        yield _flows("broadcast", 0, np.array([0, straggler]), np.array([straggler, 0]), zero, chunks, True)
        holders = [0, straggler]
        waiting = list(range(1, n - 1))
        rnd = 1
        while waiting:
            receivers, waiting = waiting[: len(holders)], waiting[len(holders) :]
            src = np.array(holders[: len(receivers)])
            yield _flows("broadcast", rnd, src, np.array(receivers), np.zeros(len(src), np.int64), chunks, False)
            holders = holders + receivers
            rnd += 1

    return chunks, "broadcast", rounds()


def _stragglar(n: int) -> tuple[int, str | None, Iterator[RoundFlows]]:
    from stragglerkit.schedules.stragglar import MATCHING_PHASE, PRE_PHASE, plan_arrays

    offsets, senders, receivers, chunks = plan_arrays(n)
    straggler = n - 1

    def rounds() -> Iterator[RoundFlows]:
        yield from _ring_rounds(np.arange(n - 1), PRE_PHASE, None)
        for rnd in range(len(offsets) - 1):
            moves = slice(offsets[rnd], offsets[rnd + 1])
            src, dst, chunk = senders[moves], receivers[moves], chunks[moves]
            adds = np.zeros(len(src), bool)
            if rnd < straggler:  # the swap of chunk rnd between rank rnd and the straggler
                src = np.concatenate(([rnd, straggler], src))
                dst = np.concatenate(([straggler, rnd], dst))
                chunk = np.concatenate(([rnd, rnd], chunk))
                adds = np.concatenate(([True, True], adds))
            start = chunk.astype(np.int64)
            yield RoundFlows(MATCHING_PHASE, rnd, src.astype(np.int64), dst.astype(np.int64), start, start + 1, adds)

    return n - 1, MATCHING_PHASE, rounds()


PATTERNS = {"ring": _ring, "rhd": _rhd, "direct": _direct, "stragglar": _stragglar}
"""Algorithms with a closed-form round pattern: name -> ``n -> (num_chunks, round_phase, rounds)``."""


def round_flows(
    algorithm: str, world_size: int, relabel: list[int] | None = None
) -> tuple[int, str | None, Iterator[RoundFlows]]:
    """``(num_chunks, round_phase, rounds)`` of ``algorithm`` at ``world_size``; ``relabel`` renames
    rank ``r`` to ``relabel[r]`` (as :meth:`Schedule.relabel`)."""
    try:
        build = PATTERNS[algorithm]
    except KeyError:
        raise ScheduleError(f"{algorithm} has no closed-form round pattern; use the full checker") from None
    num_chunks, phase, rounds = build(world_size)
    if relabel is None:
        return num_chunks, phase, rounds
    perm = np.asarray(relabel, np.int64)

    def renamed() -> Iterator[RoundFlows]:
        for flows in rounds:
            yield RoundFlows(
                flows.phase, flows.round, perm[flows.src], perm[flows.dst], flows.start, flows.stop, flows.adds
            )

    return num_chunks, phase, renamed()


def _check_round(flows: RoundFlows, n: int, num_chunks: int) -> None:
    where = f"{flows.phase or 'round'} round {flows.round}"
    for name, ranks in (("sender", flows.src), ("receiver", flows.dst)):
        if len(ranks) and (ranks.min() < 0 or ranks.max() >= n):
            raise ScheduleError(f"{where}: a {name} is not a rank of 0..{n - 1}")
    if np.any(flows.src == flows.dst):
        rank = int(flows.src[flows.src == flows.dst][0])
        raise ScheduleError(f"{where}: rank {rank} sends to itself")
    if len(flows.start) and (
        flows.start.min() < 0 or flows.stop.max() > num_chunks or np.any(flows.stop <= flows.start)
    ):
        raise ScheduleError(f"{where}: a chunk range is empty or outside 0..{num_chunks}")
    for verb, ranks in (("sends", flows.src), ("receives", flows.dst)):
        counts = np.bincount(ranks, minlength=n)
        if counts.max(initial=0) > 1:
            rank = int(np.argmax(counts))
            raise ScheduleError(f"{where}: rank {rank} {verb} {int(counts[rank])} messages in one round")


def expand_chunks(flows: RoundFlows, by_chunk: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One entry per (message, chunk): src, dst, chunk, adds (``by_chunk``: sorted by chunk)."""
    width = flows.stop - flows.start
    if not by_chunk and (width == 1).all():  # one chunk per message (StragglAR, ring reduce-scatters)
        return flows.src.astype(np.int32), flows.dst.astype(np.int32), flows.start.astype(np.int32), flows.adds
    total = int(width.sum())
    owner = np.repeat(np.arange(len(width)), width)
    offset = np.arange(total) - np.repeat(np.cumsum(width) - width, width)
    chunk = (flows.start[owner] + offset).astype(np.int32)
    if by_chunk:
        order = np.argsort(chunk, kind="stable")
        owner, chunk = owner[order], chunk[order]
    return flows.src[owner].astype(np.int32), flows.dst[owner].astype(np.int32), chunk, flows.adds[owner]


def prove(algorithm: str, world_size: int, relabel: list[int] | None = None) -> PatternReport:
    """Prove ``algorithm``'s closed-form rounds at ``world_size`` a correct AllReduce (module
    docstring); raise :class:`ScheduleError` naming the round, ranks and chunk otherwise.

    Example::

        report = prove("ring", 1024)
        assert report.rounds == 2046
    """
    num_chunks, round_phase, rounds = round_flows(algorithm, world_size, relabel)
    return prove_rounds(algorithm, world_size, num_chunks, round_phase, list(rounds))


def balanced_ring_flows(n: int, slices: int) -> Iterator[RoundFlows]:
    """The balanced ring's messages (schedules/balanced_ring.py) in its generator's order: per
    phase and step, the ring's round on slice 0, 1, .., ``slices - 1``, where slice ``s`` is chunks
    ``s·n .. s·n + n - 1``. Its ops carry no rounds (they run as dataflow); ``round`` numbers these
    (phase, step, slice) groups, in which every rank sends once and receives once."""
    index = 0
    for flows in _ring_rounds(np.arange(n), "reduce_scatter", "allgather"):
        for piece in range(slices):
            shift = piece * n
            yield dataclasses.replace(flows, round=index, start=flows.start + shift, stop=flows.stop + shift)
            index += 1


def prove_balanced_ring(n: int, slices: int) -> PatternReport:
    """Prove the balanced ring at ``n`` ranks in ``slices`` slices (:func:`prove_slices` of
    :func:`balanced_ring_flows`). ``num_messages`` counts all slices' messages; ``rounds`` is 0
    (dataflow), as ``Schedule.rounds()`` of the generated schedule.

    Example::

        report = prove_balanced_ring(1024, 3)
        assert report.num_chunks == 3 * 1024
    """
    return prove_slices("balanced_ring", n, slices, balanced_ring_flows(n, slices))


def prove_slices(algorithm: str, n: int, slices: int, schedule_rounds: Iterable[RoundFlows]) -> PatternReport:
    """Prove a schedule that runs the ring once per slice on disjoint chunk ranges.

    Checks that the groups cycle through the slices in order, that every message of slice ``s``
    stays inside chunks ``s·n .. s·n + n - 1``, and that each group, shifted back by ``s·n``, is the
    ring's group of its step, message for message; then proves the ring at ``n`` (:func:`prove_rounds`).
    A message of one slice never touches another slice's chunks, so each slice holds exactly what
    the ring would: the ring's proof is every slice's. Raises :class:`ScheduleError` naming the
    group and slice otherwise. (The proof cost is the ring's, not ``slices²`` times it.)
    """
    if slices < 1:
        raise ScheduleError(f"{algorithm}: slices must be at least 1, got {slices}")
    ring = list(_ring_rounds(np.arange(n), "reduce_scatter", "allgather"))
    expected = len(ring) * slices
    messages = groups = 0
    for index, flows in enumerate(schedule_rounds):  # streamed: memory O(n), not O(n² k)
        groups += 1
        if index >= expected:
            continue
        step, piece = divmod(index, slices)
        shift = piece * n
        where = f"{algorithm}: group {index} (step {step}, slice {piece})"
        if ((flows.start < shift) | (flows.stop > shift + n)).any():
            raise ScheduleError(f"{where}: a message leaves the slice's chunks {shift}..{shift + n - 1}")
        mine = ring[step]
        same = (
            len(flows.src) == len(mine.src)
            and flows.phase == mine.phase
            and (flows.src == mine.src).all()
            and (flows.dst == mine.dst).all()
            and (flows.start - shift == mine.start).all()
            and (flows.stop - shift == mine.stop).all()
            and (flows.adds == mine.adds).all()
        )
        if not same:
            raise ScheduleError(f"{where}: the messages are not the ring's step {step} on this slice")
        messages += len(flows.src)
    if groups != expected:
        raise ScheduleError(
            f"{algorithm}: {groups} groups of messages, expected {expected} "
            f"(the ring's {len(ring)} steps times {slices} slices)"
        )
    prove_rounds("ring", n, n, None, ring)  # prove("ring", n), on the rounds built above
    return PatternReport(algorithm, n, n * slices, messages, 0)


def prove_rounds(
    algorithm: str, world_size: int, num_chunks: int, round_phase: str | None, schedule_rounds: list[RoundFlows]
) -> PatternReport:
    """:func:`prove` for rounds already built (``round_flows``, listed)."""
    n = world_size
    tags = {(f.phase, f.round) for f in schedule_rounds if round_phase is None or f.phase == round_phase}
    messages = 0
    for flows in schedule_rounds:
        _check_round(flows, n, num_chunks)
        messages += len(flows.src)
    words = (n + 63) // 64
    block = max(1, min(num_chunks, BLOCK_BYTES // max(1, n * words * 8)))
    expanded = [expand_chunks(f, by_chunk=block < num_chunks) for f in schedule_rounds]
    ranks = np.arange(n)
    for first in range(0, num_chunks, block):
        last = min(num_chunks, first + block)
        _prove_block(algorithm, n, first, last, block < num_chunks, words, ranks, schedule_rounds, expanded)
    return PatternReport(algorithm, n, num_chunks, messages, len(tags))


def _prove_block(
    algorithm: str,
    n: int,
    first: int,
    last: int,
    blocked: bool,
    words: int,
    ranks: np.ndarray,
    schedule_rounds: list[RoundFlows],
    expanded: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
) -> None:
    width = last - first
    held = np.zeros((n, width, words), np.uint64)
    held[ranks, :, ranks // 64] = (np.uint64(1) << (ranks % 64).astype(np.uint64))[:, None]
    for flows, (src, dst, chunk, adds) in zip(schedule_rounds, expanded, strict=True):
        if blocked:  # the entries are sorted by chunk
            lo, hi = np.searchsorted(chunk, (first, last))
            src, dst, chunk, adds = src[lo:hi], dst[lo:hi], chunk[lo:hi], adds[lo:hi]
        if not len(src):
            continue
        local = chunk - first
        key = dst.astype(np.int64) * width + local
        if len(np.unique(key)) != len(key):
            raise ScheduleError(f"{flows.phase} round {flows.round}: a rank's chunk is written twice in one round")
        data = held[src, local]
        add_dst, add_local, add_data = dst[adds], local[adds], data[adds]
        overlap = held[add_dst, add_local] & add_data
        bad = np.flatnonzero(overlap.any(axis=1))
        if len(bad):
            e = bad[0]
            sender = int(src[adds][e])
            raise ScheduleError(
                f"double counting: {algorithm} {flows.phase} round {flows.round}: rank {sender} adds chunk "
                f"{int(add_local[e]) + first} into rank {int(add_dst[e])}, which already holds some of its "
                "contributions"
            )
        held[add_dst, add_local] |= add_data
        store = ~adds
        held[dst[store], local[store]] = data[store]
    full = np.zeros(words, np.uint64)
    full[: n // 64] = np.uint64(0xFFFFFFFFFFFFFFFF)
    if n % 64:
        full[n // 64] = np.uint64((1 << (n % 64)) - 1)
    short = np.flatnonzero(np.any(held != full, axis=2).ravel())
    if len(short):
        rank, where = divmod(int(short[0]), width)
        raise ScheduleError(
            f"incomplete: at the end rank {rank} chunk {where + first} lacks contributions ({algorithm})"
        )
