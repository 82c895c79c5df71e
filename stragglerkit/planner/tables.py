"""The lowered tables: one rank's refined ops as the flat int64 arrays the C++ executor runs.

Step 4 of the lowering (:mod:`stragglerkit.planner.lowering`). :class:`RankPlan` holds the tables:
one row per op in the columns of :class:`OpColumn` (kinds of :class:`LoweredKind`, element and
scratch offsets, channel links, labels, divisors), dependency counts and a CSR list of dependents.
:func:`rank_tables` writes them for one rank, giving scratch regions out and marking the
dependencies that count as met once an op is posted (:func:`_after_post_edges`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch

from stragglerkit.schedules.ir import Op, OpKind, Schedule

__all__ = ["OP_COLUMNS", "LoweredKind", "OpColumn", "RankPlan", "rank_tables"]


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


def rank_tables(
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
