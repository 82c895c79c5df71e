"""The checker's symbolic run: a schedule executed on contribution sets instead of numbers.

Every rank's chunk starts holding ``{rank}`` (a bit mask of ranks), a reduction forms the union of
two sets and an overwrite replaces one; :func:`execute` follows the executor's rules (an op starts
when its dependencies completed; sends and receives on one pair are posted in program order; a
message moves when both sides posted it) and rejects double counting, deadlock, an incomplete
result and, in a group AllReduce, members whose sums were added up in different orders.
:func:`format_ranks` writes a set of ranks for its error messages.
"""

from __future__ import annotations

from collections import deque

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules.ops import Op, OpKind
from stragglerkit.schedules.schedule import Schedule
from stragglerkit.schedules.static_checks import channels, locate

__all__ = ["execute", "format_ranks"]


def format_ranks(mask: int, limit: int = 12) -> str:
    """``0b1011`` -> ``{0, 1, 3}`` (truncated after ``limit`` ranks)."""
    ranks = [i for i in range(mask.bit_length()) if (mask >> i) & 1]
    shown = ", ".join(str(r) for r in ranks[:limit])
    more = f", ... ({len(ranks)} ranks)" if len(ranks) > limit else ""
    return "{" + shown + more + "}"


def _add_in(buf: list[int], chunk: int, data: int, rank: int, index: int, op: Op, full: int) -> bool:
    """Add the contributions ``data`` to ``rank``'s ``chunk`` (op ``index`` does); does the chunk hold
    every contribution it should end with (``full``) now? Raises on double counting."""
    if buf[chunk] & data:
        raise ScheduleError(
            f"double counting: {locate(rank, index, op)} adds contributions {format_ranks(data)} to chunk "
            f"{chunk}, which already holds {format_ranks(buf[chunk])} (overlap {format_ranks(buf[chunk] & data)})"
        )
    buf[chunk] |= data
    return buf[chunk] == full


def execute(sched: Schedule, completed: list[list[int]] | None = None, group_of: list[int] | None = None) -> int:
    """Run the schedule on contribution sets; return the number of messages.

    ``completed`` (per rank, one entry per op, zeros): filled with how many chunks of its range
    each reduction (``recv_reduce``, ``reduce``) left holding all the contributions it should end
    with. ``group_of`` (a group AllReduce: each rank's group, -1 for none): a rank should end with
    its group's contributions, the same expression on every member, instead of all ``n``.
    """
    n, num_chunks = sched.world_size, sched.num_chunks
    full = (1 << n) - 1
    targets = [full] * n
    """Per rank: the contributions each chunk must end with."""
    exprs: list[list[int]] | None = None
    """Group AllReduces: per rank and chunk, the id of the expression it holds (leaf: the rank)."""
    if group_of is not None:
        masks: dict[int, int] = {}
        for rank, group in enumerate(group_of):
            if group >= 0:
                masks[group] = masks.get(group, 0) | (1 << rank)
        targets = [masks[group] if group >= 0 else 1 << rank for rank, group in enumerate(group_of)]
        exprs = [[rank] * num_chunks for rank in range(n)]
    sums: dict[tuple[int, int], int] = {}

    def added(a: int, b: int) -> int:
        """The id of ``a + b`` (the same for ``b + a``: addition commutes)."""
        return sums.setdefault((a, b) if a < b else (b, a), n + len(sums))

    buffers = [[1 << rank] * num_chunks for rank in range(n)]
    scratch: list[dict[int, list[int]]] = [{} for _ in range(n)]
    expr_scratch: list[dict[int, list[int]]] = [{} for _ in range(n)]

    pending = [[len(op.depends) for op in rank_ops] for rank_ops in sched.ops]
    dependents: list[list[list[int]]] = [[[] for _ in rank_ops] for rank_ops in sched.ops]
    for rank, rank_ops in enumerate(sched.ops):
        for index, op in enumerate(rank_ops):
            for dep in set(op.depends):
                dependents[rank][dep].append(index)
    # duplicate dependency indices count once
    for rank, rank_ops in enumerate(sched.ops):
        for index, op in enumerate(rank_ops):
            pending[rank][index] = len(set(op.depends))

    # per-channel program order of sends and receives, and how many were posted
    chan_sends, chan_recvs = channels(sched)
    posted_sends: dict[tuple[int, int], int] = {c: 0 for c in chan_sends}
    posted_recvs: dict[tuple[int, int], int] = {c: 0 for c in chan_recvs}
    dep_ready_sends: dict[tuple[int, int], set[int]] = {c: set() for c in chan_sends}
    dep_ready_recvs: dict[tuple[int, int], set[int]] = {c: set() for c in chan_recvs}
    snapshots: dict[tuple[int, int], list[int]] = {}
    expr_snapshots: dict[tuple[int, int], list[int]] = {}

    done = [[False] * len(rank_ops) for rank_ops in sched.ops]
    ready: deque[tuple[int, int]] = deque()
    for rank, rank_ops in enumerate(sched.ops):
        for index in range(len(rank_ops)):
            if pending[rank][index] == 0:
                ready.append((rank, index))
    messages = 0

    def complete(rank: int, index: int) -> None:
        done[rank][index] = True
        for child in dependents[rank][index]:
            pending[rank][child] -= 1
            if pending[rank][child] == 0:
                ready.append((rank, child))

    def deliver(src: int, send_index: int, dst: int, recv_index: int) -> None:
        recv_op = sched.ops[dst][recv_index]
        data = snapshots.pop((src, send_index))
        start, stop = recv_op.chunks
        if recv_op.kind is OpKind.RECV_REDUCE:
            buf = buffers[dst]
            for offset, chunk in enumerate(range(start, stop)):
                if _add_in(buf, chunk, data[offset], dst, recv_index, recv_op, targets[dst]) and completed is not None:
                    completed[dst][recv_index] += 1
        elif recv_op.scratch is not None:
            scratch[dst][recv_op.scratch] = data
        else:
            buffers[dst][start:stop] = data
        if exprs is not None:
            values = expr_snapshots.pop((src, send_index))
            if recv_op.kind is OpKind.RECV_REDUCE:
                row = exprs[dst]
                for offset, chunk in enumerate(range(start, stop)):
                    row[chunk] = added(row[chunk], values[offset])
            elif recv_op.scratch is not None:
                expr_scratch[dst][recv_op.scratch] = values
            else:
                exprs[dst][start:stop] = values
        complete(src, send_index)
        complete(dst, recv_index)

    def try_post(channel: tuple[int, int]) -> None:
        nonlocal messages
        src, dst = channel
        s_list, r_list = chan_sends.get(channel, []), chan_recvs.get(channel, [])
        progressed = True
        while progressed:
            progressed = False
            k = posted_sends.get(channel, 0)
            if k < len(s_list) and s_list[k] in dep_ready_sends[channel]:
                op = sched.ops[src][s_list[k]]
                snapshots[(src, s_list[k])] = buffers[src][op.chunks[0] : op.chunks[1]]
                if exprs is not None:
                    expr_snapshots[(src, s_list[k])] = exprs[src][op.chunks[0] : op.chunks[1]]
                posted_sends[channel] = k + 1
                progressed = True
            j = posted_recvs.get(channel, 0)
            if j < len(r_list) and r_list[j] in dep_ready_recvs[channel]:
                posted_recvs[channel] = j + 1
                progressed = True
        # deliver every message whose both sides are posted and not yet delivered
        delivered = delivered_count.get(channel, 0)
        while delivered < min(posted_sends.get(channel, 0), posted_recvs.get(channel, 0)):
            deliver(src, s_list[delivered], dst, r_list[delivered])
            messages += 1
            delivered += 1
        delivered_count[channel] = delivered

    delivered_count: dict[tuple[int, int], int] = {}

    while ready:
        rank, index = ready.popleft()
        op = sched.ops[rank][index]
        if op.kind is OpKind.SEND:
            assert op.peer is not None
            channel = (rank, op.peer)
            dep_ready_sends[channel].add(index)
            try_post(channel)
        elif op.is_receive:
            assert op.peer is not None
            channel = (op.peer, rank)
            dep_ready_recvs[channel].add(index)
            try_post(channel)
        else:
            assert op.scratch is not None
            data = scratch[rank][op.scratch]
            buf = buffers[rank]
            start = op.chunks[0]
            for offset, chunk in enumerate(range(start, op.chunks[1])):
                if op.kind is OpKind.REDUCE:
                    if _add_in(buf, chunk, data[offset], rank, index, op, targets[rank]) and completed is not None:
                        completed[rank][index] += 1
                else:
                    buf[chunk] = data[offset]
            if exprs is not None:
                values, row = expr_scratch[rank][op.scratch], exprs[rank]
                for offset, chunk in enumerate(range(start, op.chunks[1])):
                    row[chunk] = added(row[chunk], values[offset]) if op.kind is OpKind.REDUCE else values[offset]
            complete(rank, index)

    stuck = [(rank, next(i for i, d in enumerate(done[rank]) if not d)) for rank in range(n) if not all(done[rank])]
    if stuck:
        lines = []
        for rank, index in stuck[:6]:
            op = sched.ops[rank][index]
            if pending[rank][index]:
                waits = f"waits for its dependencies {list(op.depends)}"
            elif op.kind is OpKind.SEND:
                waits = f"is posted and waits for rank {op.peer} to receive it"
            elif op.is_comm:
                waits = f"is posted and waits for rank {op.peer} to send"
            else:
                waits = "waits"
            lines.append(f"{locate(rank, index, op)} {waits}")
        more = f" (and {len(stuck) - 6} more ranks)" if len(stuck) > 6 else ""
        raise ScheduleError("deadlock: no op can make progress; " + "; ".join(lines) + more)

    for rank in range(n):
        target = targets[rank]
        of_group = "" if group_of is None else f" of its group {format_ranks(target)}"
        for chunk in range(num_chunks):
            held = buffers[rank][chunk]
            if held != target:  # (never more: contributions only travel within a group)
                raise ScheduleError(
                    f"incomplete: at the end rank {rank} chunk {chunk} lacks the contributions of ranks "
                    f"{format_ranks(target & ~held)}{of_group} (it holds {format_ranks(held)})"
                )
    if exprs is not None and group_of is not None:
        first: dict[int, int] = {}
        for rank, group in enumerate(group_of):
            if group < 0:
                continue  # untouched: it has no ops
            lead = first.setdefault(group, rank)
            for chunk in range(num_chunks):
                if exprs[rank][chunk] != exprs[lead][chunk]:
                    raise ScheduleError(
                        f"not identical: at the end ranks {lead} and {rank} of group {group} hold chunk {chunk} "
                        "with the same contributions added up in different orders, so their values may differ "
                        "in the last bits; reduce each chunk once and copy the sum to the other members"
                    )
    return messages
