"""Chunk boundaries and pieces: where a schedule's chunks fall in a real bucket, and how they are cut.

Steps 1 and 2 of the lowering (:mod:`stragglerkit.planner.lowering`): :func:`chunk_bounds` turns the
schedule's relative chunk weights into element offsets (64-byte aligned where the bucket is large
enough: :func:`element_bounds`); :func:`choose_pieces` says how many pieces a chunk is cut into,
and :func:`refine` cuts every chunk and every op into that many, keeping a round schedule's round
order piece by piece and every other extra dependency between all pieces.
"""

from __future__ import annotations

from collections.abc import Sequence

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules.ir import Op, Schedule, ScheduleBuilder

__all__ = [
    "ALIGN_BYTES",
    "MAX_PIECES",
    "PIECE_TARGET_BYTES",
    "choose_pieces",
    "chunk_bounds",
    "element_bounds",
    "refine",
]

ALIGN_BYTES = 64
PIECE_TARGET_BYTES = 1 << 20
"""Pieces are cut so that a message is about this large (1 MiB) ..."""
MAX_PIECES = 16
"""... but a chunk is cut into at most this many pieces."""


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


def _piece_bounds(bounds: list[int], pieces: int) -> list[int]:
    out = [0]
    for c in range(len(bounds) - 1):
        lo, hi = bounds[c], bounds[c + 1]
        for j in range(1, pieces + 1):
            out.append(lo + (hi - lo) * j // pieces)
    return out


def element_bounds(schedule: Schedule, numel: int, element_size: int, pieces: int) -> list[int]:
    """Element offsets of every piece of every chunk: 64-byte aligned cuts unless the bucket is
    too small for them (module docstring, step 1)."""
    align = max(1, ALIGN_BYTES // element_size)
    if numel < align * schedule.num_chunks * pieces * 4:
        align = 1
    return _piece_bounds(chunk_bounds(schedule.chunk_weights(), numel, align), pieces)
