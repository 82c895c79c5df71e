"""The checker's static passes: what can be rejected without running the schedule.

:func:`~stragglerkit.schedules.check.check` runs them before the symbolic run
(:mod:`stragglerkit.schedules.symbolic_run`): malformed ops (:func:`validate_structure`), races
between a rank's ops that ``depends`` leaves unordered (:func:`check_ordering`), a group
AllReduce's declaration and traffic (:func:`declared_groups`, :func:`check_group_traffic`), two
sends or receives of a rank in one round (:func:`check_rounds`) and the pairing of the k-th send
with the k-th receive of every channel (:func:`match_messages`). Each raises a
:class:`ScheduleError` that names the rank and the op (:func:`locate`).
"""

from __future__ import annotations

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules.ops import Op, OpKind
from stragglerkit.schedules.schedule import GROUPS_PARAM, Schedule

__all__ = [
    "channels",
    "check_group_traffic",
    "check_ordering",
    "check_rounds",
    "declared_groups",
    "locate",
    "match_messages",
    "validate_structure",
]


def locate(rank: int, index: int, op: Op) -> str:
    return f"rank {rank} op {index} ({op.describe()})"


def validate_structure(sched: Schedule) -> None:
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
                    f"{locate(rank, index, op)}: chunk range {op.chunks} is empty or outside 0..{num_chunks}"
                )
            if op.is_comm:
                if op.peer is None or not 0 <= op.peer < n:
                    raise ScheduleError(f"{locate(rank, index, op)}: peer {op.peer} is not a rank of 0..{n - 1}")
                if op.peer == rank:
                    raise ScheduleError(f"{locate(rank, index, op)}: a rank cannot send to or receive from itself")
            elif op.peer is not None:
                raise ScheduleError(f"{locate(rank, index, op)}: a {op.kind.value} op takes no peer")
            if op.kind in (OpKind.REDUCE, OpKind.COPY) and op.scratch is None:
                raise ScheduleError(f"{locate(rank, index, op)}: {op.kind.value} needs a scratch slot")
            if op.kind in (OpKind.SEND, OpKind.RECV_REDUCE) and op.scratch is not None:
                raise ScheduleError(f"{locate(rank, index, op)}: {op.kind.value} takes no scratch slot")
            if op.scratch is not None and op.scratch < 0:
                raise ScheduleError(f"{locate(rank, index, op)}: scratch slot must be >= 0")
            for dep in op.depends:
                if not 0 <= dep < index:
                    raise ScheduleError(
                        f"{locate(rank, index, op)}: depends on op {dep}, but an op may only depend on "
                        f"earlier ops of its rank (0..{index - 1})"
                    )


def check_ordering(sched: Schedule) -> None:
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
                        f"{locate(rank, index, op)}: reads scratch slot {slot} before any op received into it"
                    )
                if not ordered(writer):
                    raise ScheduleError(
                        f"{locate(rank, index, op)}: uses scratch slot {slot} filled by op {writer} "
                        f"({rank_ops[writer].describe()}) without depending on it; add {writer} to depends"
                    )
                if scratch_range[slot] != op.chunks:
                    raise ScheduleError(
                        f"{locate(rank, index, op)}: scratch slot {slot} holds chunks {scratch_range[slot]}, "
                        f"not {op.chunks}"
                    )
                scratch_readers.setdefault(slot, []).append(index)
            elif kind is OpKind.RECV and op.scratch is not None:
                slot = op.scratch
                writer = scratch_writer.get(slot)
                if writer is not None and not ordered(writer):
                    raise ScheduleError(
                        f"{locate(rank, index, op)}: overwrites scratch slot {slot} while op {writer} may "
                        f"still be writing it; add {writer} to depends"
                    )
                for reader in scratch_readers.get(slot, ()):
                    if not ordered(reader):
                        raise ScheduleError(
                            f"{locate(rank, index, op)}: overwrites scratch slot {slot} before op {reader} "
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
                        f"{locate(rank, index, op)}: {what} chunk {chunk} which op {writer} "
                        f"({rank_ops[writer].describe()}) writes, without depending on it: the data is not "
                        f"yet held; add {writer} to depends"
                    )
                if writes_buffer:
                    for reader in readers.get(chunk, ()):
                        if reader != index and not ordered(reader):
                            raise ScheduleError(
                                f"{locate(rank, index, op)}: writes chunk {chunk} while op {reader} "
                                f"({rank_ops[reader].describe()}) may still be reading it; add {reader} to depends"
                            )
                    last_writer[chunk] = index
                    readers[chunk] = []
                elif reads_buffer:
                    readers.setdefault(chunk, []).append(index)


def declared_groups(sched: Schedule) -> list[int] | None:
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


def check_group_traffic(sched: Schedule, group_of: list[int]) -> None:
    """Ranks in no group have no ops; every message stays within its group."""
    for rank, rank_ops in enumerate(sched.ops):
        for index, op in enumerate(rank_ops):
            if group_of[rank] < 0:
                raise ScheduleError(
                    f"{locate(rank, index, op)}: rank {rank} is in no group, so its buffer must stay untouched "
                    "and it takes no part: it may have no ops"
                )
            if op.peer is not None and group_of[op.peer] != group_of[rank]:
                other = "no group" if group_of[op.peer] < 0 else f"group {group_of[op.peer]}"
                raise ScheduleError(
                    f"{locate(rank, index, op)}: rank {rank} is in group {group_of[rank]} but rank {op.peer} is in "
                    f"{other}: a group AllReduce keeps every message within its group"
                )


def check_rounds(sched: Schedule) -> None:
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
                    f"{locate(rank, index, op)}: rank {rank} {verb} twice in {op.phase or 'round'} {op.round} "
                    f"(also op {other}: {rank_ops[other].describe()})"
                )
            seen[key] = index


def channels(sched: Schedule) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], list[int]]]:
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


def match_messages(sched: Schedule) -> None:
    """Pair the k-th send a->b with the k-th receive on b from a and compare them."""
    sends, recvs = channels(sched)
    for channel in sorted(set(sends) | set(recvs)):
        src, dst = channel
        s_list, r_list = sends.get(channel, []), recvs.get(channel, [])
        for k in range(max(len(s_list), len(r_list))):
            if k >= len(r_list):
                op = sched.ops[src][s_list[k]]
                raise ScheduleError(
                    f"{locate(src, s_list[k], op)}: rank {dst} never receives it (rank {src} sends "
                    f"{len(s_list)} messages to {dst}, rank {dst} receives {len(r_list)})"
                )
            if k >= len(s_list):
                op = sched.ops[dst][r_list[k]]
                raise ScheduleError(
                    f"{locate(dst, r_list[k], op)}: rank {src} never sends it (rank {src} sends "
                    f"{len(s_list)} messages to {dst}, rank {dst} receives {len(r_list)})"
                )
            send_op = sched.ops[src][s_list[k]]
            recv_op = sched.ops[dst][r_list[k]]
            if send_op.chunks != recv_op.chunks:
                raise ScheduleError(
                    f"send/recv mismatch: message {k} from rank {src} to rank {dst} is sent as "
                    f"{locate(src, s_list[k], send_op)} but received as {locate(dst, r_list[k], recv_op)}"
                )
            if send_op.round != recv_op.round or send_op.phase != recv_op.phase:
                raise ScheduleError(
                    f"send/recv mismatch: message {k} from rank {src} to rank {dst} is sent in "
                    f"{send_op.phase} round {send_op.round} but received in {recv_op.phase} round {recv_op.round}"
                )
