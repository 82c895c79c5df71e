"""Ring AllReduce: a reduce-scatter ring followed by an all-gather ring.

How it works (n ranks, buffer cut into n chunks; chunk ``c`` is *owned* by rank ``c``):

* Reduce-scatter, steps ``s = 0 .. n-2``: rank ``i`` sends its running partial sum of the chunk
  owned by ``i-1-s`` to ``i+1`` and adds the partial it receives from ``i-1`` (the chunk owned by
  ``i-2-s``) into its buffer. A chunk starts at its owner's successor and travels once round the
  ring, so after ``n-1`` steps rank ``i`` holds the full sum of chunk ``i``.
* All-gather, steps ``s = 0 .. n-2``: rank ``i`` forwards the fully reduced chunk owned by ``i-s`` to
  ``i+1`` and overwrites the chunk owned by ``i-1-s`` with what it receives.

Cost (StragglAR paper, Table 1): ``2(n-1)`` rounds of ``s/n`` bytes, i.e. ``2(n-1)·alpha + 2(n-1)/n·s·beta``.

Nomenclature: *members* is the ordered list of ranks in the ring (all ranks for :func:`ring`, the
``n-1`` punctual ranks for StragglAR's pre-phase); ``owned[i]`` is the chunk that member ``i`` holds
fully reduced after the reduce-scatter. The two phase builders are reused by other generators.
"""

from __future__ import annotations

from collections.abc import Sequence

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules.ir import Schedule, ScheduleBuilder

__all__ = ["add_ring_allgather", "add_ring_reduce_scatter", "ring"]


def add_ring_reduce_scatter(
    builder: ScheduleBuilder,
    members: Sequence[int],
    owned: Sequence[int],
    phase: str = "reduce_scatter",
    first_round: int = 0,
) -> int:
    """Append a ring reduce-scatter among ``members``; return the next free round number.

    After it, ``members[i]`` holds chunk ``owned[i]`` reduced over all members.
    """
    m = len(members)
    for step in range(m - 1):
        for i, rank in enumerate(members):
            send_chunk = owned[(i - 1 - step) % m]
            recv_chunk = owned[(i - 2 - step) % m]
            rnd = first_round + step
            builder.send(rank, members[(i + 1) % m], (send_chunk, send_chunk + 1), round=rnd, phase=phase)
            builder.recv_reduce(rank, members[(i - 1) % m], (recv_chunk, recv_chunk + 1), round=rnd, phase=phase)
    return first_round + max(m - 1, 0)


def add_ring_allgather(
    builder: ScheduleBuilder,
    members: Sequence[int],
    owned: Sequence[int],
    phase: str = "allgather",
    first_round: int = 0,
) -> int:
    """Append a ring all-gather: ``members[i]`` starts with ``owned[i]``, ends with all of them."""
    m = len(members)
    for step in range(m - 1):
        for i, rank in enumerate(members):
            send_chunk = owned[(i - step) % m]
            recv_chunk = owned[(i - 1 - step) % m]
            rnd = first_round + step
            builder.send(rank, members[(i + 1) % m], (send_chunk, send_chunk + 1), round=rnd, phase=phase)
            builder.recv(rank, members[(i - 1) % m], (recv_chunk, recv_chunk + 1), round=rnd, phase=phase)
    return first_round + max(m - 1, 0)


def ring(world_size: int) -> Schedule:
    """Ring AllReduce for ``world_size >= 2`` ranks.

    Example::

        sched = ring(4)
        assert sched.rounds() == 6 and sched.num_chunks == 4
    """
    if world_size < 2:
        raise NotApplicableError(
            f"ring needs at least 2 ranks, got world_size={world_size}; with one rank the AllReduce is a no-op"
        )
    members = list(range(world_size))
    builder = ScheduleBuilder(world_size, world_size)
    next_round = add_ring_reduce_scatter(builder, members, members)
    add_ring_allgather(builder, members, members, first_round=next_round)
    return builder.build("ring")
