"""Recursive halving / doubling (Rabenseifner's butterfly) AllReduce.

How it works for a power of two ``p`` (buffer cut into ``p`` chunks):

* Reduce-scatter by recursive halving, steps ``j = 0 .. log2(p)-1`` with distance ``d = p >> (j+1)``:
  rank ``r`` owns a contiguous chunk range (initially all ``p`` chunks); it pairs with ``r XOR d``,
  keeps the half of its range on its own side of bit ``d`` (lower half if the bit is clear), sends the
  other half and adds the partner's copy of the kept half. After ``log2(p)`` steps rank ``r`` owns one
  fully reduced chunk.
* All-gather by recursive doubling: the same pairs in reverse order exchange their owned ranges.

Cost: ``2·log2(p)`` rounds, ``2(p-1)/p·s`` bytes per rank (StragglAR paper, Table 1).

Other ``n`` (the standard treatment, as in MPICH): with ``p`` the largest power of two below ``n``
and ``e = n - p`` extra ranks, each even rank ``2i < 2e`` first sends its whole buffer to ``2i+1``,
which adds it (round 0); the ``p`` remaining ranks (the odd ranks below ``2e`` and every rank from
``2e`` up) run the power-of-two algorithm; finally ``2i+1`` sends the whole result back to ``2i``.
That costs two extra rounds of ``s`` bytes.

Nomenclature: ``vrank`` is a rank's index among the ``p`` participating ranks, ``real[v]`` maps it
back; ``lo, hi`` bound the chunk range a rank currently owns.
"""

from __future__ import annotations

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules.ir import Schedule, ScheduleBuilder

__all__ = ["rhd"]


def rhd(world_size: int) -> Schedule:
    """Recursive halving/doubling AllReduce for ``world_size >= 2``.

    Example::

        sched = rhd(8)
        assert sched.rounds() == 6
    """
    n = world_size
    if n < 2:
        raise NotApplicableError(f"rhd needs at least 2 ranks, got world_size={n}")
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    log_p = p.bit_length() - 1
    builder = ScheduleBuilder(n, p)
    whole = (0, p)
    next_round = 0

    if extra:
        for i in range(extra):
            builder.send(2 * i, 2 * i + 1, whole, round=0, phase="fold_in")
            builder.recv_reduce(2 * i + 1, 2 * i, whole, round=0, phase="fold_in")
        next_round = 1
    real = [2 * v + 1 if v < extra else v + extra for v in range(p)]

    owned = [(0, p) for _ in range(p)]
    history: list[list[tuple[tuple[int, int], tuple[int, int]]]] = [[] for _ in range(p)]
    for j in range(log_p):
        dist = p >> (j + 1)
        for v in range(p):
            lo, hi = owned[v]
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if not v & dist else ((mid, hi), (lo, mid))
            partner = real[v ^ dist]
            builder.send(real[v], partner, give, round=next_round + j, phase="reduce_scatter")
            builder.recv_reduce(real[v], partner, keep, round=next_round + j, phase="reduce_scatter")
            history[v].append((keep, give))
            owned[v] = keep
    next_round += log_p

    for j in range(log_p):
        step = log_p - 1 - j
        dist = p >> (step + 1)
        for v in range(p):
            keep, give = history[v][step]
            partner = real[v ^ dist]
            builder.send(real[v], partner, keep, round=next_round + j, phase="allgather")
            builder.recv(real[v], partner, give, round=next_round + j, phase="allgather")
    next_round += log_p

    if extra:
        for i in range(extra):
            builder.send(2 * i + 1, 2 * i, whole, round=next_round, phase="fold_out")
            builder.recv(2 * i, 2 * i + 1, whole, round=next_round, phase="fold_out")
    return builder.build("rhd", params={"power_of_two_core": p})
