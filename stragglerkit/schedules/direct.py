"""Direct: the straggler-aware broadcast baseline of the StragglAR paper, §4.1 ("Broadcast").

How it works (n ranks, logical rank ``n-1`` is the straggler ``σ``):

* Pre-phase, while the straggler is late: the ``n-1`` punctual ranks run a complete ring AllReduce
  among themselves (buffer cut into ``n-1`` chunks), so each of them holds the sum of all
  contributions but the straggler's.
* Exchange: when the straggler arrives, it and rank 0 swap whole buffers and each adds what it
  received; both now hold the full sum.
* Broadcast by doubling: in each following round every holder of the full sum sends the whole
  buffer to a rank that lacks it, so ``ceil(log2(n))`` rounds after the straggler arrives, every rank
  holds it.

Cost after the straggler's arrival: ``log2(n)·alpha + log2(n)·s·beta`` (StragglAR paper, §4.1), i.e. it
only wins for small buffers or small n, which is why it is a baseline.

Nomenclature: ``holders`` are ranks already holding the full sum, ``waiting`` those still lacking it.
"""

from __future__ import annotations

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules.ir import Schedule, ScheduleBuilder
from stragglerkit.schedules.ring import add_ring_allgather, add_ring_reduce_scatter

__all__ = ["direct"]


def direct(world_size: int) -> Schedule:
    """The broadcast baseline for ``world_size >= 2`` with the straggler at logical rank n-1.

    Example::

        sched = direct(8)
        assert sched.rounds() == 3
    """
    n = world_size
    if n < 2:
        raise NotApplicableError(f"direct needs at least 2 ranks, got world_size={n}")
    straggler = n - 1
    punctual = list(range(n - 1))
    num_chunks = max(n - 1, 1)
    builder = ScheduleBuilder(n, num_chunks)
    if len(punctual) >= 2:
        next_round = add_ring_reduce_scatter(builder, punctual, punctual, phase="pre_allreduce")
        add_ring_allgather(builder, punctual, punctual, phase="pre_allreduce", first_round=next_round)

    whole = (0, num_chunks)
    # exchange: rank 0 and the straggler swap buffers; receive into scratch so the send reads first
    for rank, peer in ((0, straggler), (straggler, 0)):
        builder.send(rank, peer, whole, round=0, phase="broadcast")
        builder.recv(rank, peer, whole, scratch=0, round=0, phase="broadcast")
        builder.reduce(rank, scratch=0, chunks=whole, round=0, phase="broadcast")

    holders = [0, straggler]
    waiting = list(range(1, n - 1))
    rnd = 1
    while waiting:
        receivers, waiting = waiting[: len(holders)], waiting[len(holders) :]
        for sender, receiver in zip(holders, receivers):
            builder.send(sender, receiver, whole, round=rnd, phase="broadcast")
            builder.recv(receiver, sender, whole, round=rnd, phase="broadcast")
        holders = holders + receivers
        rnd += 1
    return builder.build("direct", round_phase="broadcast", params={"straggler": straggler})
