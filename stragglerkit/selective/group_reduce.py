"""The weighted AllReduce that selective and partial reduce launch: each group averages its models.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Sections II-C and III: a group ``g`` of ready workers replaces each member's model ``x_i`` by the
weighted average ``sum_{i in g} w_i x_i`` with weights from the members' relative iteration counts
(:func:`~stragglerkit.selective.workers.iteration_weights`), over a ring AllReduce among the group
(the paper's Eq. (2) prices that ring). Several groups may synchronise at once.

How it runs. One call on every rank of the process group carries all the groups that synchronise
now: the runtime builds one schedule with a ring per group (schedules/group_ring.py, proven by the
checker: each member ends with exactly its group's weighted contributions, every member the same
bits, ranks in no group untouched), and the C++ executor runs it over the group's existing
point-to-point connections: no communicator per group. Each member first multiplies its tensor by
its weight, so the ring's sum is the weighted average. Ranks in no group take no part in the
exchange and return at once with their tensor unchanged; they make the call so that every rank's
calls on the group stay numbered alike, as with any collective.

Weights are relative: per group they are divided by their sum (:func:`group_shares`), so iteration
counts, :class:`~stragglerkit.selective.workers.Sync` weights (which already sum to 1) or ``None``
(equal shares: the plain average) all work. A group of one keeps its own value.

Example::

    stragglerkit.init()                                    # every rank, once
    # ranks 0, 2, 5 and ranks 1, 4 synchronise (weights: their iteration counts); 3 keeps its model
    weighted_group_all_reduce(flat_params, [[0, 2, 5], [1, 4]], [[3, 3, 2], [5, 4]])
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from stragglerkit import session as _session
from stragglerkit.api import Work
from stragglerkit.errors import ConfigError
from stragglerkit.grouping.workers import iteration_weights
from stragglerkit.runtime.calls import AllReduceCall
from stragglerkit.runtime.executor import notify_local_failure
from stragglerkit.schedules.group_ring import validate_groups

__all__ = ["group_shares", "weighted_group_all_reduce"]


def group_shares(
    groups: Sequence[Sequence[int]], weights: Sequence[Sequence[float]] | None, world_size: int
) -> tuple[tuple[float, ...], ...]:
    """Per group, each member's share of the average: its weight divided by its group's total
    (:func:`iteration_weights`; all zero: equal shares), in the order of ``groups``.

    Raises :class:`ConfigError` for bad groups (:func:`~stragglerkit.schedules.group_ring.validate_groups`)
    and for weights that do not match the groups member for member, or that are negative or not
    finite.

    Example::

        group_shares([[0, 2], [1]], [[3, 1], [7]], 4)     # ((0.75, 0.25), (1.0,))
    """
    validate_groups(groups, world_size)
    if weights is None:
        return tuple(tuple(1.0 / len(group) for _ in group) for group in groups)
    if isinstance(weights, str | bytes) or not isinstance(weights, Sequence) or len(weights) != len(groups):
        raise ConfigError(
            f"weights must hold one list per group ({len(groups)} groups), in the groups' order; got {weights!r}"
        )
    shares: list[tuple[float, ...]] = []
    for index, (group, row) in enumerate(zip(groups, weights)):
        if isinstance(row, str | bytes) or not isinstance(row, Sequence) or len(row) != len(group):
            raise ConfigError(
                f"weights[{index}] must hold one weight per member of group {index} ({list(group)}), got {row!r}"
            )
        for member, weight in zip(group, row):
            number = not isinstance(weight, bool) and isinstance(weight, int | float)
            if not number or not math.isfinite(weight) or weight < 0:
                raise ConfigError(
                    f"the weight of rank {member} in group {index} must be a finite number >= 0 (e.g. its iteration "
                    f"count), got {weight!r}"
                )
        shares.append(iteration_weights([float(weight) for weight in row]))
    return tuple(shares)


def weighted_group_all_reduce(
    tensor: torch.Tensor,
    groups: Sequence[Sequence[int]],
    weights: Sequence[Sequence[float]] | None = None,
    process_group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """In place: each group's members end with their group's weighted average of ``tensor``.

    ``groups``: disjoint lists of ranks of ``process_group`` (default: the default group, on which
    :func:`stragglerkit.init` must have been called). ``weights``: per group, one relative weight
    per member in the same order (e.g. iteration counts); each group's are divided by their sum;
    ``None``: equal weights. Every rank of ``process_group`` calls this with the same groups and
    weights and a floating-point tensor (members: of the same size and dtype); ranks in no group
    return at once with ``tensor`` unchanged, a group of one keeps its value. The result is
    bit-identical on the members of a group. ``async_op``: return a :class:`~stragglerkit.Work`
    at once instead of blocking.

    Bad arguments raise :class:`ConfigError` on this rank and :class:`~stragglerkit.PeerError`
    naming it on the ranks that would exchange data with it; members whose tensors differ in size
    or dtype, or that were given other groups' or weights, raise :class:`~stragglerkit.PeerError`
    before any data moves.

    Example::

        weighted_group_all_reduce(params, [[0, 3], [1, 2]], [[10, 8], [9, 9]])
        # ranks 0 and 3 hold (10 x0 + 8 x3) / 18, ranks 1 and 2 hold (x1 + x2) / 2
    """
    runtime = _session.session_for(process_group).runtime
    group = runtime.group
    try:
        shares = group_shares(groups, weights, group.size())
        if isinstance(tensor, torch.Tensor) and not tensor.is_floating_point():
            raise ConfigError(f"a weighted average needs a floating-point tensor, got {tensor.dtype}")
    except ConfigError:
        if group.size() > 1:  # the ranks of this call would wait for this one: tell them
            device = tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")
            notify_local_failure(runtime.data_group, device, "group_ring")
        raise
    call = AllReduceCall(tensor, groups=groups, weights=shares)
    if async_op:
        return Work(runtime.start(call))
    runtime.run(call)
    return None
