"""The global message order: step 3 of the lowering (:mod:`stragglerkit.planner.lowering`).

:func:`message_order` simulates a run of a refined schedule and records, per rank, the order in
which it observes its messages; every rank waits on its messages in that order, which is one valid
interleaving of the whole run and so cannot deadlock (csrc/executor.cpp).
"""

from __future__ import annotations

from collections import deque

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules.ir import OpKind, Schedule

__all__ = ["message_order"]


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
