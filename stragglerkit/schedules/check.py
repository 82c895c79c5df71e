"""Symbolic verifier: proves a schedule is a correct AllReduce before it ever runs.

The checker executes the schedule on *contribution sets* instead of numbers: every rank's chunk
starts holding ``{rank}``, a reduction forms the union of two sets, and at the end every rank must
hold every chunk with all ``n`` contributions. It rejects, with a :class:`ScheduleError` that names
the rank, the op and the chunk:

* malformed ops (bad peer, chunk range, scratch slot or dependency index);
* races: two ops of a rank touching the same chunk or scratch slot (one writing) that are not
  ordered by ``depends`` -- this is also how *sending data not yet held* shows up (a send of a chunk
  that does not depend on the receive that brings it);
* double counting (a reduction adding a contribution the chunk already has);
* send/recv mismatches (counts, chunk ranges or round tags differ between the k-th send from a to b
  and the k-th receive on b from a);
* deadlock, under the executor's rules (an op starts when its dependencies completed; sends and
  receives on one peer pair are posted in program order; a message moves when both sides posted);
* for round schedules, more than one send or more than one receive by a rank in one round;
* a chunk that lacks contributions at the end.

It returns a :class:`CheckReport` with counts that tests and the CLI print.

Group AllReduces (schedules/group_ring.py) declare disjoint groups of ranks in
``params["groups"]``; for them "every rank holds all ``n`` contributions" becomes, per group:

* every member ends holding every chunk with exactly its group's contributions, each counted once
  (so, on buffers that each member scaled by its weight beforehand, the weighted sum over exactly
  that group): a contribution from outside the group, or one missing, is rejected;
* every member of a group ends with the same value of every chunk: the checker also tracks each
  chunk's *expression* (which two values each reduction added; addition commutes but does not
  associate), and two members whose sums were added up in different orders are rejected, since
  their bits could differ;
* no message crosses a group's boundary, and a rank in no group has no ops (its buffer is
  untouched and it sends nothing).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules.ir import GROUPS_PARAM, Op, OpKind, Schedule

__all__ = ["CheckReport", "check", "completing_reductions", "format_ranks"]


@dataclass(slots=True, frozen=True)
class CheckReport:
    """What the checker saw in a correct schedule."""

    algorithm: str
    world_size: int
    num_chunks: int
    num_ops: int
    num_messages: int
    rounds: int


def format_ranks(mask: int, limit: int = 12) -> str:
    """``0b1011`` -> ``{0, 1, 3}`` (truncated after ``limit`` ranks)."""
    ranks = [i for i in range(mask.bit_length()) if (mask >> i) & 1]
    shown = ", ".join(str(r) for r in ranks[:limit])
    more = f", ... ({len(ranks)} ranks)" if len(ranks) > limit else ""
    return "{" + shown + more + "}"


def _where(rank: int, index: int, op: Op) -> str:
    return f"rank {rank} op {index} ({op.describe()})"


def _validate_structure(sched: Schedule) -> None:
    n, num_chunks = sched.world_size, sched.num_chunks
    if n < 1:
        raise ScheduleError(f"world_size must be at least 1, got {n}")
    if num_chunks < 1:
        raise ScheduleError(f"num_chunks must be at least 1, got {num_chunks}")
    if len(sched.ops) != n:
        raise ScheduleError(f"schedule has {len(sched.ops)} rank op lists for world_size {n}")
    if sched.chunk_sizes is not None:
        if len(sched.chunk_sizes) != num_chunks:
            raise ScheduleError(f"chunk_sizes has {len(sched.chunk_sizes)} entries for {num_chunks} chunks")
        bad = [i for i, s in enumerate(sched.chunk_sizes) if s <= 0]
        if bad:
            raise ScheduleError(f"chunk_sizes must be positive; chunk {bad[0]} has size {sched.chunk_sizes[bad[0]]}")
    for rank, rank_ops in enumerate(sched.ops):
        for index, op in enumerate(rank_ops):
            start, stop = op.chunks
            if not 0 <= start < stop <= num_chunks:
                raise ScheduleError(
                    f"{_where(rank, index, op)}: chunk range {op.chunks} is empty or outside 0..{num_chunks}"
                )
            if op.is_comm:
                if op.peer is None or not 0 <= op.peer < n:
                    raise ScheduleError(f"{_where(rank, index, op)}: peer {op.peer} is not a rank of 0..{n - 1}")
                if op.peer == rank:
                    raise ScheduleError(f"{_where(rank, index, op)}: a rank cannot send to or receive from itself")
            elif op.peer is not None:
                raise ScheduleError(f"{_where(rank, index, op)}: a {op.kind.value} op takes no peer")
            if op.kind in (OpKind.REDUCE, OpKind.COPY) and op.scratch is None:
                raise ScheduleError(f"{_where(rank, index, op)}: {op.kind.value} needs a scratch slot")
            if op.kind in (OpKind.SEND, OpKind.RECV_REDUCE) and op.scratch is not None:
                raise ScheduleError(f"{_where(rank, index, op)}: {op.kind.value} takes no scratch slot")
            if op.scratch is not None and op.scratch < 0:
                raise ScheduleError(f"{_where(rank, index, op)}: scratch slot must be >= 0")
            for dep in op.depends:
                if not 0 <= dep < index:
                    raise ScheduleError(
                        f"{_where(rank, index, op)}: depends on op {dep}, but an op may only depend on "
                        f"earlier ops of its rank (0..{index - 1})"
                    )


def _check_ordering(sched: Schedule) -> None:
    """Every conflicting pair of ops of one rank must be ordered by dependencies."""
    for rank, rank_ops in enumerate(sched.ops):
        ancestors: list[int] = []
        last_writer: dict[int, int] = {}
        readers: dict[int, list[int]] = {}
        scratch_writer: dict[int, int] = {}
        scratch_range: dict[int, tuple[int, int]] = {}
        scratch_readers: dict[int, list[int]] = {}

        for index, op in enumerate(rank_ops):
            anc = 0
            for dep in op.depends:
                anc |= ancestors[dep] | (1 << dep)
            ancestors.append(anc)

            def ordered(earlier: int, anc: int = anc) -> bool:
                return bool((anc >> earlier) & 1)

            kind = op.kind
            reads_buffer = kind in (OpKind.SEND, OpKind.RECV_REDUCE, OpKind.REDUCE)
            writes_buffer = kind is not OpKind.SEND and not (kind is OpKind.RECV and op.scratch is not None)

            # scratch slot accesses
            if kind in (OpKind.REDUCE, OpKind.COPY):
                slot = op.scratch
                assert slot is not None
                writer = scratch_writer.get(slot)
                if writer is None:
                    raise ScheduleError(
                        f"{_where(rank, index, op)}: reads scratch slot {slot} before any op received into it"
                    )
                if not ordered(writer):
                    raise ScheduleError(
                        f"{_where(rank, index, op)}: uses scratch slot {slot} filled by op {writer} "
                        f"({rank_ops[writer].describe()}) without depending on it; add {writer} to depends"
                    )
                if scratch_range[slot] != op.chunks:
                    raise ScheduleError(
                        f"{_where(rank, index, op)}: scratch slot {slot} holds chunks {scratch_range[slot]}, "
                        f"not {op.chunks}"
                    )
                scratch_readers.setdefault(slot, []).append(index)
            elif kind is OpKind.RECV and op.scratch is not None:
                slot = op.scratch
                writer = scratch_writer.get(slot)
                if writer is not None and not ordered(writer):
                    raise ScheduleError(
                        f"{_where(rank, index, op)}: overwrites scratch slot {slot} while op {writer} may "
                        f"still be writing it; add {writer} to depends"
                    )
                for reader in scratch_readers.get(slot, ()):
                    if not ordered(reader):
                        raise ScheduleError(
                            f"{_where(rank, index, op)}: overwrites scratch slot {slot} before op {reader} "
                            f"({rank_ops[reader].describe()}) has used it; add {reader} to depends"
                        )
                scratch_writer[slot] = index
                scratch_range[slot] = op.chunks
                scratch_readers[slot] = []

            # buffer chunk accesses
            for chunk in range(op.chunks[0], op.chunks[1]):
                writer = last_writer.get(chunk)
                if writer is not None and not ordered(writer):
                    what = "sends" if kind is OpKind.SEND else "touches"
                    raise ScheduleError(
                        f"{_where(rank, index, op)}: {what} chunk {chunk} which op {writer} "
                        f"({rank_ops[writer].describe()}) writes, without depending on it: the data is not "
                        f"yet held; add {writer} to depends"
                    )
                if writes_buffer:
                    for reader in readers.get(chunk, ()):
                        if reader != index and not ordered(reader):
                            raise ScheduleError(
                                f"{_where(rank, index, op)}: writes chunk {chunk} while op {reader} "
                                f"({rank_ops[reader].describe()}) may still be reading it; add {reader} to depends"
                            )
                    last_writer[chunk] = index
                    readers[chunk] = []
                elif reads_buffer:
                    readers.setdefault(chunk, []).append(index)


def _declared_groups(sched: Schedule) -> list[int] | None:
    """A group AllReduce's declared groups as each rank's group index (-1: in no group), or
    ``None`` for an AllReduce over all ranks."""
    n = sched.world_size
    groups = sched.params.get(GROUPS_PARAM)
    if groups is None:
        return None
    if not isinstance(groups, list | tuple) or not groups:
        raise ScheduleError(f"params[{GROUPS_PARAM!r}] must be a non-empty list of groups of ranks, got {groups!r}")
    group_of = [-1] * n
    for index, group in enumerate(groups):
        if not isinstance(group, list | tuple) or not group:
            raise ScheduleError(f"declared group {index} must be a non-empty list of ranks, got {group!r}")
        for rank in group:
            if type(rank) is not int or not 0 <= rank < n:
                raise ScheduleError(f"declared group {index} names {rank!r}, which is not a rank of 0..{n - 1}")
            if group_of[rank] >= 0:
                raise ScheduleError(
                    f"rank {rank} is declared in group {group_of[rank]} and in group {index}: groups must be disjoint"
                )
            group_of[rank] = index
    return group_of


def _check_group_traffic(sched: Schedule, group_of: list[int]) -> None:
    """Ranks in no group have no ops; every message stays within its group."""
    for rank, rank_ops in enumerate(sched.ops):
        for index, op in enumerate(rank_ops):
            if group_of[rank] < 0:
                raise ScheduleError(
                    f"{_where(rank, index, op)}: rank {rank} is in no group, so its buffer must stay untouched "
                    "and it takes no part: it may have no ops"
                )
            if op.peer is not None and group_of[op.peer] != group_of[rank]:
                other = "no group" if group_of[op.peer] < 0 else f"group {group_of[op.peer]}"
                raise ScheduleError(
                    f"{_where(rank, index, op)}: rank {rank} is in group {group_of[rank]} but rank {op.peer} is in "
                    f"{other}: a group AllReduce keeps every message within its group"
                )


def _check_rounds(sched: Schedule) -> None:
    for rank, rank_ops in enumerate(sched.ops):
        sends: dict[tuple[str, int], int] = {}
        recvs: dict[tuple[str, int], int] = {}
        for index, op in enumerate(rank_ops):
            if op.round is None or not op.is_comm:
                continue
            key = (op.phase, op.round)
            seen = sends if op.kind is OpKind.SEND else recvs
            if key in seen:
                other = seen[key]
                verb = "sends" if op.kind is OpKind.SEND else "receives"
                raise ScheduleError(
                    f"{_where(rank, index, op)}: rank {rank} {verb} twice in {op.phase or 'round'} {op.round} "
                    f"(also op {other}: {rank_ops[other].describe()})"
                )
            seen[key] = index


def _add_in(buf: list[int], chunk: int, data: int, rank: int, index: int, op: Op, full: int) -> bool:
    """Add the contributions ``data`` to ``rank``'s ``chunk`` (op ``index`` does); does the chunk hold
    every contribution it should end with (``full``) now? Raises on double counting."""
    if buf[chunk] & data:
        raise ScheduleError(
            f"double counting: {_where(rank, index, op)} adds contributions {format_ranks(data)} to chunk "
            f"{chunk}, which already holds {format_ranks(buf[chunk])} (overlap {format_ranks(buf[chunk] & data)})"
        )
    buf[chunk] |= data
    return buf[chunk] == full


def _channels(sched: Schedule) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], list[int]]]:
    """Per channel ``(src, dst)``: the sender's send ops and the receiver's receive ops, in program order."""
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    for rank, rank_ops in enumerate(sched.ops):
        for index, op in enumerate(rank_ops):
            if op.kind is OpKind.SEND:
                assert op.peer is not None
                sends.setdefault((rank, op.peer), []).append(index)
            elif op.is_receive:
                assert op.peer is not None
                recvs.setdefault((op.peer, rank), []).append(index)
    return sends, recvs


def _match_messages(sched: Schedule) -> None:
    """Pair the k-th send a->b with the k-th receive on b from a and compare them."""
    sends, recvs = _channels(sched)
    for channel in sorted(set(sends) | set(recvs)):
        src, dst = channel
        s_list, r_list = sends.get(channel, []), recvs.get(channel, [])
        for k in range(max(len(s_list), len(r_list))):
            if k >= len(r_list):
                op = sched.ops[src][s_list[k]]
                raise ScheduleError(
                    f"{_where(src, s_list[k], op)}: rank {dst} never receives it (rank {src} sends "
                    f"{len(s_list)} messages to {dst}, rank {dst} receives {len(r_list)})"
                )
            if k >= len(s_list):
                op = sched.ops[dst][r_list[k]]
                raise ScheduleError(
                    f"{_where(dst, r_list[k], op)}: rank {src} never sends it (rank {src} sends "
                    f"{len(s_list)} messages to {dst}, rank {dst} receives {len(r_list)})"
                )
            send_op = sched.ops[src][s_list[k]]
            recv_op = sched.ops[dst][r_list[k]]
            if send_op.chunks != recv_op.chunks:
                raise ScheduleError(
                    f"send/recv mismatch: message {k} from rank {src} to rank {dst} is sent as "
                    f"{_where(src, s_list[k], send_op)} but received as {_where(dst, r_list[k], recv_op)}"
                )
            if send_op.round != recv_op.round or send_op.phase != recv_op.phase:
                raise ScheduleError(
                    f"send/recv mismatch: message {k} from rank {src} to rank {dst} is sent in "
                    f"{send_op.phase} round {send_op.round} but received in {recv_op.phase} round {recv_op.round}"
                )


def _execute(sched: Schedule, completed: list[list[int]] | None = None, group_of: list[int] | None = None) -> int:
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
    chan_sends, chan_recvs = _channels(sched)
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
            lines.append(f"{_where(rank, index, op)} {waits}")
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


def check(sched: Schedule) -> CheckReport:
    """Prove ``sched`` is a correct in-place AllReduce (over all ranks, or per declared group: see
    the module docstring); raise :class:`ScheduleError` otherwise.

    Example::

        from stragglerkit.schedules import check, ring
        report = check(ring(8))
        assert report.rounds == 14
    """
    return _check(sched)


def _check(sched: Schedule, completed: list[list[int]] | None = None) -> CheckReport:
    """:func:`check`, with ``completed`` filled as :func:`_execute` describes."""
    _validate_structure(sched)
    group_of = _declared_groups(sched)
    if group_of is not None:
        _check_group_traffic(sched, group_of)
    _check_ordering(sched)
    _check_rounds(sched)
    _match_messages(sched)
    messages = _execute(sched, completed, group_of)
    return CheckReport(
        algorithm=sched.algorithm,
        world_size=sched.world_size,
        num_chunks=sched.num_chunks,
        num_ops=sched.num_ops(),
        num_messages=messages,
        rounds=sched.rounds(),
    )


def completing_reductions(sched: Schedule) -> list[list[bool]] | None:
    """Per rank and op: does this reduction leave its whole chunk range holding all contributions?

    These are the ops after which a chunk's sum is final on that rank; every other rank gets that
    chunk's final value either from such an op of its own or by a copy of one (a ``recv`` into the
    buffer, possibly via scratch and ``copy``). An averaging AllReduce can therefore divide inside
    exactly these reductions (``dst = (dst + src) / n``) instead of dividing the whole buffer
    after the run: every final value is divided once, by the op that made it final. Returns
    ``None`` when some reduction completes only part of its range (then the division cannot be
    fused op by op). Raises :class:`ScheduleError` if ``sched`` is not a correct AllReduce.

    Example::

        flags = completing_reductions(ring(4))
        assert sum(map(sum, flags)) == 4  # each chunk is completed once, on its owner
    """
    completed = [[0] * len(rank_ops) for rank_ops in sched.ops]
    _check(sched, completed)
    flags: list[list[bool]] = []
    for rank, rank_ops in enumerate(sched.ops):
        row = []
        for index, op in enumerate(rank_ops):
            count = completed[rank][index]
            if 0 < count < op.num_chunks:
                return None
            row.append(count > 0)
        flags.append(row)
    return flags
