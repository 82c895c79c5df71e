"""Group ring: ring AllReduces among several disjoint groups of ranks at once, in one schedule.

What it is for. Selective reduce (docs/selective.md) synchronises *groups* of ready workers: each
group's members end with the (weighted) sum over that group only, several groups run at the same
time, and the ranks in no group keep their buffers. This is that collective as a schedule of the
existing process group's point-to-point messages: no communicator per group.

How it works (a world of ``n`` ranks; ``groups`` disjoint, each a set of ranks):

* Every group of ``m >= 2`` members runs ring.py's algorithm among its members alone: a
  reduce-scatter ring of ``m-1`` steps, after which member ``i`` holds its *owned* part of the
  buffer summed over the group, then an all-gather ring of ``m-1`` steps that copies each owned
  part to the other members. Messages never leave a group, so the groups run side by side.
* A group of one keeps its own buffer (no ops), as does every rank in no group.
* Weights are not in the schedule: a weighted sum ``sum_i w_i x_i`` is this schedule run on
  buffers that each member scaled by its own ``w_i`` beforehand (the runtime does that,
  runtime.py). Each contribution is counted exactly once, which is what the checker proves.

Chunking. A schedule has one chunking for all ranks, but a group of ``m`` cuts the buffer into
``m`` parts. The chunks are therefore the common refinement of every group's cuts: with ``L`` the
least common multiple of the group sizes, group ``g`` cuts at positions ``k·L/m_g`` of ``L``, and
the chunks lie between consecutive cut positions of all groups, weighted by their lengths
(``chunk_sizes``). Member ``i`` of a group owns the chunk range between its group's cuts ``i`` and
``i+1``, so every message covers ``1/m`` of the buffer as in a plain ring; at most ``n`` chunks.

Cost per group (as ring.py): ``2(m-1)`` rounds of ``s/m`` bytes; the paper's Eq. (2) with ``m``
members: ``2(m-1)·alpha + 2(m-1)/m·s·beta``, paced by the group's slowest link.

The contract travels with the schedule: ``params["groups"]`` lists the groups (sorted ranks, groups
ordered by their first rank), and the checker (check.py) proves against it that each member ends
with exactly its group's contributions, all members of a group hold the same sum (the same
additions, so the same bits), and the ranks in no group have no ops.

Nomenclature: ``members`` is one group's ring order (ascending ranks); ``owned[i]`` is the chunk
range ``(start, stop)`` that member ``i`` holds fully reduced after the reduce-scatter.

It is not in the registry (registry.py): the registry lists AllReduces over the whole group, which
the cost model ranks against each other; a group AllReduce computes something else.

Example::

    sched = group_ring(5, [[0, 2, 4], [1, 3]])   # rank 0, 2, 4 sum among themselves; 1 and 3 too
    check(sched)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from stragglerkit.errors import ConfigError
from stragglerkit.schedules.ir import GROUPS_PARAM, Schedule, ScheduleBuilder

__all__ = ["group_ring", "validate_groups"]

Groups = tuple[tuple[int, ...], ...]


def validate_groups(groups: object, world_size: int) -> Groups:
    """``groups`` checked for a world of ``world_size`` ranks, each group sorted, groups ordered by
    their first rank. Raises :class:`ConfigError` naming what is wrong: not a list of lists of
    ranks, no group at all, an empty group, a rank outside ``0..world_size-1``, a rank twice in
    one group, or a rank in two groups.

    Example::

        validate_groups([[3, 1], [0]], 4)     # ((0,), (1, 3))
    """
    example = "e.g. [[0, 2], [1, 3]]"
    if isinstance(groups, str | bytes) or not isinstance(groups, Sequence):
        raise ConfigError(f"groups must be a list of groups, each a list of ranks ({example}), got {groups!r}")
    if not groups:
        raise ConfigError(f"groups is empty: give at least one group of ranks ({example})")
    owner: dict[int, int] = {}
    out: list[tuple[int, ...]] = []
    for index, group in enumerate(groups):
        if isinstance(group, str | bytes) or not isinstance(group, Sequence):
            raise ConfigError(f"group {index} must be a list of ranks ({example}), got {group!r}")
        if not group:
            raise ConfigError(f"group {index} is empty: every group needs at least one rank")
        for rank in group:
            if isinstance(rank, bool) or not isinstance(rank, int):
                raise ConfigError(f"group {index} holds {rank!r}, which is not a rank (a whole number)")
            if not 0 <= rank < world_size:
                raise ConfigError(
                    f"group {index} names rank {rank}, which is not a rank of this {world_size}-rank group "
                    f"(0..{world_size - 1})"
                )
            if owner.get(rank) == index:
                raise ConfigError(f"group {index} names rank {rank} twice")
            if rank in owner:
                raise ConfigError(
                    f"rank {rank} is in group {owner[rank]} and in group {index}: groups must not overlap "
                    "(a rank takes part in one group per call)"
                )
            owner[rank] = index
        out.append(tuple(sorted(group)))
    return tuple(sorted(out))


def _chunking(world_size: int, groups: Groups) -> tuple[list[int], dict[int, int], int]:
    """The common refinement of the groups' cuts: chunk weights, cut position -> chunk index, ``L``."""
    sizes = [len(group) for group in groups if len(group) > 1]
    whole = math.lcm(*sizes) if sizes else 1
    cuts = {0, whole}
    for m in sizes:
        cuts.update(k * whole // m for k in range(1, m))
    positions = sorted(cuts)
    weights = [b - a for a, b in itertools.pairwise(positions)]
    common = math.gcd(*weights)
    return [w // common for w in weights], {pos: index for index, pos in enumerate(positions)}, whole


def group_ring(world_size: int, groups: Sequence[Sequence[int]]) -> Schedule:
    """Ring AllReduces among the disjoint ``groups`` of a ``world_size``-rank world, all at once.

    Ranks in no group, and groups of one, get no ops. Raises :class:`ConfigError` for bad groups
    (:func:`validate_groups`).

    Example::

        sched = group_ring(8, [[0, 1, 2], [4, 5, 6, 7]])
        assert sched.ops[3] == [] and sched.rounds() == 6
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a whole number >= 1, got {world_size!r}")
    checked = validate_groups(groups, world_size)
    weights, chunk_at, whole = _chunking(world_size, checked)
    builder = ScheduleBuilder(world_size, len(weights))
    for members in checked:
        m = len(members)
        if m < 2:
            continue
        step = whole // m
        owned = [(chunk_at[i * step], chunk_at[(i + 1) * step]) for i in range(m)]
        for s in range(m - 1):  # reduce-scatter: partial sums travel once round the ring
            for i, rank in enumerate(members):
                builder.send(rank, members[(i + 1) % m], owned[(i - 1 - s) % m], round=s, phase="reduce_scatter")
                builder.recv_reduce(rank, members[(i - 1) % m], owned[(i - 2 - s) % m], round=s, phase="reduce_scatter")
        for s in range(m - 1):  # all-gather: the owners' sums travel once round the ring
            rnd = m - 1 + s
            for i, rank in enumerate(members):
                builder.send(rank, members[(i + 1) % m], owned[(i - s) % m], round=rnd, phase="allgather")
                builder.recv(rank, members[(i - 1) % m], owned[(i - 1 - s) % m], round=rnd, phase="allgather")
    uniform = len(set(weights)) == 1
    return builder.build(
        "group_ring",
        chunk_sizes=None if uniform else weights,
        params={GROUPS_PARAM: [list(group) for group in checked]},
    )
