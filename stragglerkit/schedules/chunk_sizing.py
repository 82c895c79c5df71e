"""Chunk sizes by linear programming: the best sizes for a schedule whose op order is fixed.

Why. A pipelined schedule such as OptCC fixes *which* chunk each rank sends and receives next, but
not how large each chunk is. Equal chunks leave the pipeline's head and tail idle (OptCC's slow
rank has nothing to send until the first section has climbed the ring), and a hand-made ramp
(small segments at both ends, optcc.py "The ramp") recovers only part of that. For the model the
simulator uses the best sizes can be computed exactly.

The model (bandwidth only, as :func:`stragglerkit.sim.simulator.simulate` with ``alpha = 0``).
Every rank sends one message at a time and receives one at a time: each send depends on the rank's
previous send and each receive on its previous receive (:func:`require_one_flow_per_direction`
checks it). Then no two flows ever share a NIC direction, and a flow from ``a`` to ``b`` carrying
chunks of total size ``w`` (a fraction of the buffer) takes ``w · max(l_a, l_b)`` (in units of
``n`` = the buffer's time on a healthy link). A flow starts when the ops it is made of, the send
at ``a`` and the receive at ``b``, have their dependencies done. The makespan is thus the longest
path through the flows, and each path's length is linear in the chunk sizes. Minimising it is a
linear program over the sizes ``w_c`` and the flows' start times ``t_f``::

    minimise T
    subject to   t_f + dur_f(w) <= t_g     for every dependency of flow g on flow f
                 t_f + dur_f(w) <= T       for every flow f
                 sum_c w_c = 1,   w_c >= floor / num_chunks,   t_f >= 0

:func:`makespan` evaluates the same model for given sizes (a longest path); with the simulator it
agrees to rounding for such schedules (``tests/test_chunk_sizing.py``), and the LP's optimum is
never above the makespan of the schedule's own sizes. ``floor`` (default 1/4) keeps every chunk at
least a quarter of the mean (or its own size, if that is smaller, so that the schedule's own sizes
stay feasible), so that no chunk turns into a message made mostly of per-message cost.

What it gives OptCC: at ``l < 2`` most of the pipeline's head goes (in the simulator, p = 8,
l = 8/7, k = 9: 5.6 % over the fault-free ring against 11.4 % with the closed-form sizes); at
``l >= 2`` the ramp is within 0.5 % of it (docs/optcc.md, "Sizes by linear programming"). The
sizes come out as a smooth ramp: small sections where the pipeline fills and drains, large ones
in its body. ``optcc(...)`` keeps its closed-form sizes unless asked (``sizing="auto"`` or
``"lp"``); the runtime asks for ``"auto"`` (``planner.policy.OPTCC_SIZING``) and bounds OptCC's
send queues (``Config.optcc.send_buffer``), since the model has no socket buffer in which a rank's
messages overlap.

Cost. One LP with ``num_chunks + flows + 1`` variables (HiGHS through scipy): p = 8, k = 9, 1008
flows, about 0.1 s. :data:`MAX_FLOWS` bounds what the generators size this way; larger plans keep
their closed-form sizes.

Determinism. Every rank solves the same LP and must get the same sizes: HiGHS is deterministic for
the same input and build, and the weights are rounded to integers (:data:`WEIGHT_RESOLUTION` per
largest chunk). The runtime puts the sizes into the plan id it exchanges before the first message,
so ranks that disagree (different scipy builds) fail with a mismatch instead of adding wrong bytes.

Example::

    sched = optcc(8, {7: 8 / 7}, segments=9, sizing="closed_form")
    weights = optimal_chunk_weights(sched, {7: 8 / 7})
    sized = dataclasses.replace(sched, chunk_sizes=weights)
    assert makespan(sized, {7: 8 / 7}) <= makespan(sched, {7: 8 / 7})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stragglerkit.schedules.ir import OpKind, Schedule

__all__ = [
    "DEFAULT_FLOOR",
    "MAX_FLOWS",
    "WEIGHT_RESOLUTION",
    "FlowGraph",
    "flow_graph",
    "makespan",
    "optimal_chunk_weights",
    "optimal_shares",
    "require_one_flow_per_direction",
    "to_weights",
]

MAX_FLOWS = 6000
"""The largest schedule (in flows) that the generators size by LP (about 1 s to solve)."""

LP_METHOD = "highs-ipm"
"""HiGHS's interior-point method: 3-5x faster than its simplex here, same optimum to 1e-5."""

DEFAULT_FLOOR = 0.25
"""Smallest chunk, as a fraction of the mean chunk."""

WEIGHT_RESOLUTION = 4096
"""Integer weight of the largest chunk; the others are rounded in proportion (at least 1)."""


@dataclass(slots=True, frozen=True)
class FlowGraph:
    """The flows of a schedule and what each waits for (indices into ``flows``)."""

    flows: tuple[tuple[int, int, tuple[int, int]], ...]
    """``(src, dst, (first_chunk, stop_chunk))`` per flow."""
    waits_for: tuple[tuple[int, ...], ...]
    """Flows that must end before each flow starts (its send's and its receive's dependencies)."""

    def __len__(self) -> int:
        return len(self.flows)


def require_one_flow_per_direction(schedule: Schedule) -> None:
    """Raise ``ValueError`` unless every rank's sends, and its receives, are chained one after another.

    Only communication ops are allowed (no local reduce or copy ops): the model has no compute.
    """
    for rank, ops in enumerate(schedule.ops):
        last = {True: -1, False: -1}
        for index, op in enumerate(ops):
            if not op.is_comm:
                raise ValueError(
                    f"{schedule.algorithm}: rank {rank} op {index} is a local {op.kind.name.lower()} op; "
                    "LP chunk sizing models communication only"
                )
            sending = op.kind is OpKind.SEND
            previous = last[sending]
            if previous >= 0 and previous not in op.depends:
                what = "send" if sending else "receive"
                raise ValueError(
                    f"{schedule.algorithm}: rank {rank}'s {what} op {index} does not depend on its previous {what} "
                    f"(op {previous}); LP chunk sizing needs one flow per NIC direction at a time"
                )
            last[sending] = index


def flow_graph(schedule: Schedule) -> FlowGraph:
    """Match each send with its receive (the i-th send from a to b with b's i-th receive from a)."""
    require_one_flow_per_direction(schedule)
    sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
    receives: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for rank, ops in enumerate(schedule.ops):
        for index, op in enumerate(ops):
            assert op.peer is not None
            if op.kind is OpKind.SEND:
                sends.setdefault((rank, op.peer), []).append((rank, index))
            else:
                receives.setdefault((op.peer, rank), []).append((rank, index))
    flow_of: dict[tuple[int, int], int] = {}
    flows: list[tuple[int, int, tuple[int, int]]] = []
    ends: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for pair, pair_sends in sorted(sends.items()):
        pair_receives = receives.get(pair, [])
        if len(pair_receives) != len(pair_sends):
            raise ValueError(
                f"{schedule.algorithm}: {len(pair_sends)} sends from rank {pair[0]} to {pair[1]} but "
                f"{len(pair_receives)} receives; run the checker first"
            )
        for send, receive in zip(pair_sends, pair_receives):
            flow_of[send] = flow_of[receive] = len(flows)
            flows.append((pair[0], pair[1], schedule.ops[send[0]][send[1]].chunks))
            ends.append((send, receive))
    waits_for = []
    for send, receive in ends:
        before: set[int] = set()
        for rank, index in (send, receive):
            before.update(flow_of[(rank, d)] for d in schedule.ops[rank][index].depends)
        waits_for.append(tuple(sorted(before)))
    return FlowGraph(tuple(flows), tuple(waits_for))


def _rates(graph: FlowGraph, slowdowns: Mapping[int, float]) -> list[float]:
    return [max(slowdowns.get(src, 1.0), slowdowns.get(dst, 1.0)) for src, dst, _ in graph.flows]


def makespan(schedule: Schedule, slowdowns: Mapping[int, float], graph: FlowGraph | None = None) -> float:
    """The model's completion time for the schedule's own chunk sizes, in units of ``n``."""
    g = graph if graph is not None else flow_graph(schedule)
    sizes = np.asarray(schedule.chunk_weights(), dtype=float)
    prefix = np.concatenate(([0.0], np.cumsum(sizes / sizes.sum())))
    rates = _rates(g, slowdowns)
    order = _topological(g)
    end = [0.0] * len(g)
    for f in order:
        start = max((end[d] for d in g.waits_for[f]), default=0.0)
        c0, c1 = g.flows[f][2]
        end[f] = start + rates[f] * (prefix[c1] - prefix[c0])
    return max(end, default=0.0)


def _topological(graph: FlowGraph) -> list[int]:
    waiting = [len(w) for w in graph.waits_for]
    after: list[list[int]] = [[] for _ in range(len(graph))]
    for f, before in enumerate(graph.waits_for):
        for d in before:
            after[d].append(f)
    ready = [f for f, w in enumerate(waiting) if w == 0]
    order: list[int] = []
    while ready:
        f = ready.pop()
        order.append(f)
        for g in after[f]:
            waiting[g] -= 1
            if waiting[g] == 0:
                ready.append(g)
    if len(order) != len(graph):
        raise ValueError("the flows wait for each other in a cycle (the schedule deadlocks); run the checker first")
    return order


def optimal_shares(
    schedule: Schedule,
    slowdowns: Mapping[int, float],
    floor: float = DEFAULT_FLOOR,
    graph: FlowGraph | None = None,
) -> tuple[list[float], float]:
    """The LP's chunk shares (summing to 1) and its makespan (units of ``n``); see the module docstring."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    if not 0.0 <= floor < 1.0:
        raise ValueError(f"floor is the smallest chunk as a fraction of the mean, in [0, 1); got {floor}")
    g = graph if graph is not None else flow_graph(schedule)
    nc, nf = schedule.num_chunks, len(g)
    t0, makespan_var = nc, nc + nf
    rates = _rates(g, slowdowns)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    row = 0

    def add_duration(f: int) -> None:
        c0, c1 = g.flows[f][2]
        for c in range(c0, c1):
            rows.append(row)
            cols.append(c)
            vals.append(rates[f])

    for later, before in enumerate(g.waits_for):
        for f in before:  # t_f + dur_f - t_later <= 0
            add_duration(f)
            rows.extend((row, row))
            cols.extend((t0 + f, t0 + later))
            vals.extend((1.0, -1.0))
            row += 1
    waited_on = {f for before in g.waits_for for f in before}
    for f in range(nf):  # t_f + dur_f - T <= 0, for the flows nothing waits for
        if f in waited_on:
            continue
        add_duration(f)
        rows.extend((row, row))
        cols.extend((t0 + f, makespan_var))
        vals.extend((1.0, -1.0))
        row += 1
    a_ub = coo_matrix((vals, (rows, cols)), shape=(row, nc + nf + 1)).tocsr()
    a_eq = np.zeros((1, nc + nf + 1))
    a_eq[0, :nc] = 1.0
    cost = np.zeros(nc + nf + 1)
    cost[makespan_var] = 1.0
    own = np.asarray(schedule.chunk_weights(), dtype=float)
    own /= own.sum()
    # at least the floor, or the chunk's own size if smaller: the schedule's sizes stay feasible
    bounds = [(min(floor / nc, float(x)), None) for x in own] + [(0.0, None)] * (nf + 1)
    result = linprog(cost, A_ub=a_ub, b_ub=np.zeros(row), A_eq=a_eq, b_eq=[1.0], bounds=bounds, method=LP_METHOD)
    if result.status != 0:
        raise RuntimeError(f"{schedule.algorithm}: the chunk-sizing LP failed: {result.message}")
    return [float(x) for x in result.x[:nc]], float(result.fun)


def optimal_chunk_weights(
    schedule: Schedule, slowdowns: Mapping[int, float], floor: float = DEFAULT_FLOOR
) -> tuple[int, ...]:
    """Integer chunk weights from :func:`optimal_shares` (largest = :data:`WEIGHT_RESOLUTION`)."""
    shares, _ = optimal_shares(schedule, slowdowns, floor)
    return to_weights(shares)


def to_weights(shares: Sequence[float]) -> tuple[int, ...]:
    largest = max(shares)
    return tuple(max(1, round(s / largest * WEIGHT_RESOLUTION)) for s in shares)
