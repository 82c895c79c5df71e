"""Lowering: a checked schedule plus a real bucket becomes the flat tables the C++ executor runs.

Steps (all in Python, once per cache key; the executor only interprets the result):

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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch

from stragglerkit.errors import ScheduleError
from stragglerkit.planner.ordering import in_round_order
from stragglerkit.planner.rank_lowering import SCALE_FROM_RANKS, OneRank, one_rank_schedule, wait_order
from stragglerkit.schedules.check import check, completing_reductions
from stragglerkit.schedules.ir import Op, OpKind, Schedule, ScheduleBuilder
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


class OpColumn(IntEnum):
    """Columns of :attr:`RankPlan.ops` (csrc/executor.h: ``OpColumn``, ``kColKind`` ...)."""

    KIND = 0
    """:class:`LoweredKind`."""
    PEER = 1
    """Logical peer rank (messages), -1 otherwise."""
    OFFSET = 2
    """Element offset into the buffer."""
    COUNT = 3
    """Element count."""
    SCRATCH = 4
    """Element offset into the scratch tensor (-1: none)."""
    LABEL = 5
    """Index into :attr:`RankPlan.labels` (phase/round)."""
    CHAN_PREV = 6
    """The previous message on the same (peer, direction) connection, -1: the first."""
    CHAN_NEXT = 7
    """The next message on the same connection, -1: the last."""
    DIVIDE = 8
    """Reductions only: divide the result by this (an averaging plan's final sums), 0: no."""


OP_COLUMNS = tuple(column.name.lower() for column in OpColumn)
"""The names of :class:`OpColumn`, in column order."""

ALIGN_BYTES = 64
PIECE_TARGET_BYTES = 1 << 20
"""Pieces are cut so that a message is about this large (1 MiB) ..."""
MAX_PIECES = 16
"""... but a chunk is cut into at most this many pieces."""


class LoweredKind(IntEnum):
    """Op kinds of the lowered table (csrc/executor.h: LoweredKind)."""

    SEND = 0
    RECV = 1
    RECV_REDUCE = 2
    REDUCE = 3
    COPY = 4
    NOOP = 5


_KIND = {
    OpKind.SEND: LoweredKind.SEND,
    OpKind.RECV: LoweredKind.RECV,
    OpKind.RECV_REDUCE: LoweredKind.RECV_REDUCE,
    OpKind.REDUCE: LoweredKind.REDUCE,
    OpKind.COPY: LoweredKind.COPY,
}


@dataclass(slots=True)
class RankPlan:
    """One rank's lowered plan: what :func:`stragglerkit.runtime.executor.run_plan` hands to C++."""

    algorithm: str
    world_size: int
    logical_rank: int
    numel: int
    ops: torch.Tensor
    """int64 ``[num_ops, len(OpColumn)]``: one row per op, the columns of :class:`OpColumn`."""
    dep_count: torch.Tensor
    child_ptr: torch.Tensor
    child_idx: torch.Tensor
    wait_order: torch.Tensor
    """Indices of this rank's non-empty comm ops in the global message order."""
    peers: torch.Tensor
    """Logical ranks this rank talks to in the schedule (header exchange), empty ops included."""
    labels: list[str]
    scratch_numel: int
    pieces: int
    divides: bool = False
    """The plan's final reductions divide by ``world_size`` (lowered with ``divide_by``): the
    buffer ends holding the average, not the sum."""

    def num_messages(self) -> int:
        return int(self.wait_order.numel())


def chunk_bounds(weights: Sequence[int], numel: int, align: int = 1) -> list[int]:
    """Element offsets ``[0, ..., numel]`` of the chunks, proportional to ``weights``.

    Example::

        chunk_bounds([1, 1, 2], 8) == [0, 2, 4, 8]
    """
    total = sum(weights)
    if total <= 0 or any(w <= 0 for w in weights):
        raise ScheduleError(f"chunk weights must be positive, got {list(weights)}")
    bounds = [0]
    acc = 0
    for weight in weights[:-1]:
        acc += weight
        cut = (numel * acc + total // 2) // total
        if align > 1:
            cut = min(numel, (cut + align // 2) // align * align)
        bounds.append(max(cut, bounds[-1]))
    bounds.append(numel)
    return bounds


def choose_pieces(schedule: Schedule, numel: int, element_size: int) -> int:
    """How many pieces to cut each chunk into for a bucket of ``numel`` elements.

    Dataflow schedules (ring, RHD, OptCC): messages of about ``PIECE_TARGET_BYTES`` (1 MiB), at
    most ``MAX_PIECES`` per chunk; they forward piece by piece, which pipelines their steps.

    Round schedules (a ``round_phase``: StragglAR, direct) keep whole chunks. Cut into pieces,
    their rounds pipeline piece by piece (:func:`refine`), which removes the bubble at each round
    boundary but lets the next round's first pieces share the NIC with the current round's last
    ones. On the emulated cluster pieces gained only within the noise where per-round overheads
    matter and lost where the transfers dominate (as did allowing one piece of overlap between
    rounds), so whole chunks stay.
    """
    if schedule.round_phase is not None:
        return 1
    smallest = min(schedule.chunk_weights())
    chunk_bytes = numel * element_size * smallest // max(schedule.total_weight(), 1)
    return max(1, min(MAX_PIECES, chunk_bytes // PIECE_TARGET_BYTES))


def _label(op: Op) -> str:
    if op.round is not None:
        return f"{op.phase or 'round'} round {op.round}"
    return op.phase or op.kind.value


def _untagged(op: Op) -> Op:
    return Op(op.kind, op.chunks, op.peer, op.scratch, op.depends, None, op.phase)


def _explicit_depends(schedule: Schedule) -> list[list[set[int]]]:
    """Per op, the dependencies that are not data dependencies (kept between all pieces)."""
    derived = ScheduleBuilder(schedule.world_size, schedule.num_chunks)
    for rank, rank_ops in enumerate(schedule.ops):
        for op in rank_ops:
            derived.add(rank, Op(op.kind, op.chunks, op.peer, op.scratch, (), op.round, op.phase))
    return [
        [set(op.depends) - set(auto.depends) for op, auto in zip(rank_ops, derived.ops[rank])]
        for rank, rank_ops in enumerate(schedule.ops)
    ]


def _round_order(earlier: Op, later: Op, phase: str | None) -> bool:
    """Is ``later``'s dependency on ``earlier`` the round order of ``phase`` (comm ops of two rounds)?"""
    return (
        phase is not None
        and earlier.is_comm
        and later.is_comm
        and earlier.phase == later.phase == phase
        and earlier.round is not None
        and later.round is not None
        and earlier.round != later.round
    )


def refine(schedule: Schedule, pieces: int) -> tuple[Schedule, list[list[str]]]:
    """Cut every chunk into ``pieces`` sub-chunks and every op into ``pieces`` ops.

    Op ``i`` over chunks ``[a, b)`` becomes ops over sub-chunks ``[a·P + j·(b-a), a·P + (j+1)·(b-a))``
    for ``j < P``, appended in program order. Round tags are dropped (a round now holds ``P``
    messages per rank) and returned as labels instead. Returns the refined schedule and, per rank
    and refined op, the label of its original op.
    """
    labels = [[_label(op) for op in rank_ops] for rank_ops in schedule.ops]
    if pieces == 1:
        plain = Schedule(
            algorithm=schedule.algorithm,
            world_size=schedule.world_size,
            num_chunks=schedule.num_chunks,
            ops=[[op if op.round is None else _untagged(op) for op in ops] for ops in schedule.ops],
            params=dict(schedule.params),
        )
        return plain, labels
    explicit = _explicit_depends(schedule)
    round_phase = schedule.round_phase
    builder = ScheduleBuilder(schedule.world_size, schedule.num_chunks * pieces)
    refined_labels: list[list[str]] = [[] for _ in range(schedule.world_size)]
    for rank, rank_ops in enumerate(schedule.ops):
        new_index: list[list[int]] = []
        for index, op in enumerate(rank_ops):
            start, stop = op.chunks
            width = stop - start
            # a dependency on an op of an earlier round (planner/ordering.py) holds piece j back until
            # piece j of that op is done, so that the rounds pipeline piece by piece; any other
            # extra dependency waits for every piece
            by_piece = [dep for dep in explicit[rank][index] if _round_order(rank_ops[dep], op, round_phase)]
            whole = [dep for dep in explicit[rank][index] if dep not in by_piece]
            extra = sorted(k for dep in whole for k in new_index[dep])
            indices = []
            for j in range(pieces):
                sub = (start * pieces + j * width, start * pieces + (j + 1) * width)
                scratch = None if op.scratch is None else op.scratch * pieces + j
                depends = tuple(sorted({*extra, *(new_index[dep][j] for dep in by_piece)}))
                indices.append(builder.add(rank, Op(op.kind, sub, op.peer, scratch, depends, None, op.phase)))
                refined_labels[rank].append(labels[rank][index])
            new_index.append(indices)
    return builder.build(schedule.algorithm, params=dict(schedule.params)), refined_labels


def message_order(schedule: Schedule, empty: list[list[bool]], straggler: int | None = None) -> list[list[int]]:
    """Per rank, the order in which it observes (waits for) its non-empty comm ops in a simulated run.

    Messages of one pair match in program order and move when both sides have posted them (an op
    is posted once the ops it depends on were observed); ``empty`` ops complete at once on both
    sides. A receive is observed when its message moves; the sender observes a moved send only
    after its own next receive (or when nothing else can move), so that the executor sleeps on the
    receive, by which time the send has long finished, instead of on both. Ops of ``straggler``
    run only when nothing else can, which is the order in which a late rank's messages happen.
    Because the result is one valid interleaving of the whole run, every rank waiting in its order
    cannot deadlock (csrc/executor.cpp).
    """
    n = schedule.world_size
    pending = [[len(set(op.depends)) for op in ops] for ops in schedule.ops]
    children: list[list[list[int]]] = [[[] for _ in ops] for ops in schedule.ops]
    chan_sends: dict[tuple[int, int], list[int]] = {}
    chan_recvs: dict[tuple[int, int], list[int]] = {}
    for rank, ops in enumerate(schedule.ops):
        for index, op in enumerate(ops):
            for dep in set(op.depends):
                children[rank][dep].append(index)
            if op.is_comm and not empty[rank][index]:
                assert op.peer is not None
                key = (rank, op.peer) if op.kind is OpKind.SEND else (op.peer, rank)
                (chan_sends if op.kind is OpKind.SEND else chan_recvs).setdefault(key, []).append(index)
    moved = dict.fromkeys(set(chan_sends) | set(chan_recvs), 0)
    ready_comm: set[tuple[int, int]] = set()
    unobserved_sends: list[deque[int]] = [deque() for _ in range(n)]
    order: list[list[int]] = [[] for _ in range(n)]
    done = 0
    total = schedule.num_ops()
    main: deque[tuple[int, int]] = deque()
    late: deque[tuple[int, int]] = deque()

    def enqueue(rank: int, index: int) -> None:
        (late if rank == straggler else main).append((rank, index))

    def complete(rank: int, index: int) -> None:
        nonlocal done
        done += 1
        for child in children[rank][index]:
            pending[rank][child] -= 1
            if pending[rank][child] == 0:
                enqueue(rank, child)

    def observe_sends(rank: int) -> None:
        while unobserved_sends[rank]:
            index = unobserved_sends[rank].popleft()
            order[rank].append(index)
            complete(rank, index)

    def move(channel: tuple[int, int]) -> None:
        src, dst = channel
        sends, recvs = chan_sends.get(channel, []), chan_recvs.get(channel, [])
        k = moved[channel]
        while k < len(sends) and k < len(recvs) and (src, sends[k]) in ready_comm and (dst, recvs[k]) in ready_comm:
            unobserved_sends[src].append(sends[k])
            order[dst].append(recvs[k])
            complete(dst, recvs[k])
            observe_sends(dst)
            k += 1
        moved[channel] = k

    for rank, ops in enumerate(schedule.ops):
        for index in range(len(ops)):
            if pending[rank][index] == 0:
                enqueue(rank, index)
    while True:
        if main:
            rank, index = main.popleft()
        elif any(unobserved_sends[r] for r in range(n) if r != straggler):
            for r in range(n):
                if r != straggler:
                    observe_sends(r)
            continue
        elif late:
            rank, index = late.popleft()
        elif straggler is not None and unobserved_sends[straggler]:
            observe_sends(straggler)
            continue
        else:
            break
        op = schedule.ops[rank][index]
        if not op.is_comm or empty[rank][index]:
            complete(rank, index)
            continue
        assert op.peer is not None
        ready_comm.add((rank, index))
        move((rank, op.peer) if op.kind is OpKind.SEND else (op.peer, rank))
    if done != total:
        raise ScheduleError(
            f"{schedule.algorithm}: the lowered plan deadlocks ({total - done} ops never run); "
            "this is a bug in the lowering, please report it with the schedule JSON"
        )
    return order


def plan_id(key: str) -> int:
    """A stable 31-bit id of a plan key, exchanged in the header to catch mismatched calls."""
    return zlib.crc32(key.encode())


def _piece_bounds(bounds: list[int], pieces: int) -> list[int]:
    out = [0]
    for c in range(len(bounds) - 1):
        lo, hi = bounds[c], bounds[c + 1]
        for j in range(1, pieces + 1):
            out.append(lo + (hi - lo) * j // pieces)
    return out


def _element_bounds(schedule: Schedule, numel: int, element_size: int, pieces: int) -> list[int]:
    """Element offsets of every piece of every chunk: 64-byte aligned cuts unless the bucket is
    too small for them (module docstring, step 1)."""
    align = max(1, ALIGN_BYTES // element_size)
    if numel < align * schedule.num_chunks * pieces * 4:
        align = 1
    return _piece_bounds(chunk_bounds(schedule.chunk_weights(), numel, align), pieces)


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
    bounds = _element_bounds(schedule, numel, element_size, pieces)
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
            _lower_rank(schedule, refined, rank, bounds, empty[rank], order[rank], labels[rank], pieces, numel, divides)
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
    bounds = _element_bounds(schedule, numel, element_size, pieces)
    refined, labels = refine(schedule, pieces)
    ops = refined.ops[rank]
    divides = None
    if divide_by > 0 and part.completing is not None:
        divides = [divide_by if part.completing[index // pieces] else 0 for index in range(len(ops))]
    empty = [bounds[op.chunks[1]] == bounds[op.chunks[0]] for op in ops]
    order = wait_order(part, pieces, empty)
    return _lower_rank(schedule, refined, rank, bounds, empty, order, labels[rank], pieces, numel, divides)


def _after_post_edges(ops: Sequence[Op], table: list[list[int]]) -> set[tuple[int, int]]:
    """Dependencies ``(a, b)`` that the executor may count as met once ``a`` is *posted*.

    Both are receives, ``a`` is ``b``'s predecessor on its channel (the same peer: one
    connection, which carries and matches its messages in posting order), neither uses a scratch
    slot, and their ranges do not overlap. Then the dependency only orders the two messages, and
    the connection keeps that order anyway: ``b``'s bytes arrive after ``a``'s, and the executor
    observes ``a``'s completion (and does its reduction) before ``b``'s, so whatever waits for
    ``b`` still sees ``a`` done. What changes is that ``b``'s receive is posted before ``a``
    completes, so the ready notice that the sender needs for ``b`` travels while ``a``'s bytes
    do, instead of after them: one round trip and the wake-ups around it less per message on a
    chain of receives over one connection (OptCC's healthy ranks chain their receives so that a
    NIC carries one flow per direction). Sends are left chained: a send completes once its bytes
    are in the socket buffer, so a send posted ahead would complete early and start the rank's
    next send, to another peer, while both still drain: two flows on one NIC, which the chain
    is there to prevent (OptCC with LP sizes ran slower with sends posted ahead too).
    """
    found: set[tuple[int, int]] = set()
    receives = (int(LoweredKind.RECV), int(LoweredKind.RECV_REDUCE))
    kind, prev_col, scratch, offset, count = (
        OpColumn.KIND,
        OpColumn.CHAN_PREV,
        OpColumn.SCRATCH,
        OpColumn.OFFSET,
        OpColumn.COUNT,
    )
    for index, op in enumerate(ops):
        row = table[index]
        prev = row[prev_col]
        if prev < 0 or row[kind] not in receives or prev not in op.depends:
            continue
        before = table[prev]
        if any(r[scratch] >= 0 and r[kind] != int(LoweredKind.RECV_REDUCE) for r in (row, before)):
            continue  # a scratch slot, shared with other ops (a recv_reduce's scratch is its own)
        if row[offset] < before[offset] + before[count] and before[offset] < row[offset] + row[count]:
            continue  # overlapping ranges: b would write what a still writes
        found.add((prev, index))
    return found


def _lower_rank(
    original: Schedule,
    refined: Schedule,
    rank: int,
    bounds: list[int],
    empty: list[bool],
    order: list[int],
    op_labels: list[str],
    pieces: int,
    numel: int,
    divides: list[int] | None,
) -> RankPlan:
    """``divides``: per op, the divisor of its reduction (0: none); ``None``: the plan does not divide."""
    ops = refined.ops[rank]
    label_index: dict[str, int] = {}
    slot_size: dict[int, int] = {}
    for index, op in enumerate(ops):
        if op.scratch is not None and not empty[index]:
            count = bounds[op.chunks[1]] - bounds[op.chunks[0]]
            slot_size[op.scratch] = max(slot_size.get(op.scratch, 0), count)
    slot_offset: dict[int, int] = {}
    scratch_numel = 0
    for slot in sorted(slot_size):
        slot_offset[slot] = scratch_numel
        scratch_numel += slot_size[slot]

    table: list[list[int]] = []
    last_on_channel: dict[tuple[int, bool], int] = {}
    for index, op in enumerate(ops):
        offset = bounds[op.chunks[0]]
        count = bounds[op.chunks[1]] - offset
        kind = LoweredKind.NOOP if empty[index] else _KIND[op.kind]
        scratch = -1
        if kind is LoweredKind.RECV_REDUCE:
            scratch = scratch_numel
            scratch_numel += count
        elif op.scratch is not None and kind is not LoweredKind.NOOP:
            scratch = slot_offset[op.scratch]
        label = label_index.setdefault(op_labels[index], len(label_index))
        divide = divides[index] if divides is not None and kind in (LoweredKind.RECV_REDUCE, LoweredKind.REDUCE) else 0
        row = [
            int(kind),
            -1 if op.peer is None else op.peer,
            offset,
            count,
            scratch,
            label,
            -1,
            -1,
            divide,
        ]  # in OpColumn order
        if kind in (LoweredKind.SEND, LoweredKind.RECV, LoweredKind.RECV_REDUCE):
            assert op.peer is not None
            channel = (op.peer, kind is LoweredKind.SEND)
            prev = last_on_channel.get(channel)
            if prev is not None:
                row[OpColumn.CHAN_PREV] = prev
                table[prev][OpColumn.CHAN_NEXT] = index
            last_on_channel[channel] = index
        table.append(row)

    dep_count = [len(set(op.depends)) for op in ops]
    after_post = _after_post_edges(ops, table)
    children: list[list[int]] = [[] for _ in ops]
    for index, op in enumerate(ops):
        for dep in sorted(set(op.depends)):
            children[dep].append(-(index + 1) if (dep, index) in after_post else index)
    child_ptr = [0]
    child_idx: list[int] = []
    for kids in children:
        child_idx.extend(kids)
        child_ptr.append(len(child_idx))
    peers = sorted({op.peer for op in original.ops[rank] if op.peer is not None})

    def ints(values: Sequence[int]) -> torch.Tensor:  # through numpy: several times faster from a list
        return torch.from_numpy(np.array(values, dtype=np.int64).reshape(-1))

    return RankPlan(
        algorithm=original.algorithm,
        world_size=original.world_size,
        logical_rank=rank,
        numel=numel,
        ops=torch.from_numpy(np.array(table, dtype=np.int64).reshape(len(table), len(OpColumn))),
        dep_count=ints(dep_count),
        child_ptr=ints(child_ptr),
        child_idx=ints(child_idx),
        wait_order=ints(order),
        peers=ints(peers),
        labels=sorted(label_index, key=label_index.__getitem__),
        scratch_numel=scratch_numel,
        pieces=pieces,
        divides=divides is not None,
    )


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
