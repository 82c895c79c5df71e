"""One rank's executor plan at any world size, without the whole schedule.

:func:`~stragglerkit.planner.lowering.lower` builds every rank's plan from the whole schedule: it
generates all ``O(kp²)`` ops, checks them, and simulates the whole run to find the order in which
each rank waits for its messages. At p = 1,024 that is minutes for one rank's plan. Yet a rank
only runs its own ops, and every algorithm here is a closed form per rank:

* ring, rhd, direct, StragglAR: their rounds (:func:`~stragglerkit.schedules.pattern.round_flows`,
  ``O(p)`` numpy per round) give the rank's sends and receives; a round's adding receive is a
  ``recv_reduce``, except in the round phase of StragglAR and direct, where the generator
  receives into scratch and reduces (so that the swap's send reads first);
* OptCC (one degraded rank, one GPU per server): :meth:`OptccPlan.rank_ops`, window by window;
* the balanced ring: its generator, building only this rank's ops.

The rank's ops go through the same :class:`ScheduleBuilder` (its data dependencies are derived per
rank), the same round order (:func:`~stragglerkit.planner.ordering.in_round_order`), the same
refinement into pieces and the same lowering into tables; ``tests/test_rank_lowering.py``
compares every table with :func:`lower`'s for every rank up to p = 24.

What changes is where two things come from:

* The wait order. :func:`lower` simulates the run; here every message gets a *key* that both of
  its ranks compute alike (round schedules: the round's index in the whole run, the piece, the
  sender; OptCC: the window, the stage in the window, the piece, the sender; the balanced ring:
  phase, step and slice, the piece, the sender) and each rank waits in key order. Keys give one
  global order of all messages, and every dependency points to an op with a smaller key (an
  earlier round, window or step; in OptCC's window, a rank's second send after its first); so
  the executor's induction (csrc/executor.cpp: the wait on the k-th message returns once both
  sides waited through the ones before) holds as for the simulated order. The tests run this
  order on every rank of whole schedules with the executor's posting rules and see no deadlock.
* The proof. :func:`lower` re-checks what it lowers with the full checker; here the schedule is
  proved per algorithm and world size, not per plan: by the pattern proof (ring, rhd, direct,
  StragglAR), the window proof (OptCC) or the slice proof (the balanced ring), ``stragglerkit
  schedule ALG --world-size P --summary-json``, and the tests tie this module's ops to the
  generator's up to their bound (docs/schedules.md, "What is proven at which size").

The averaging division (``divide_by``) needs the reductions that complete a chunk: counted per
``(rank, chunk)`` over the rounds (which contributions a message carries is a count once the
schedule is proved), or in closed form (StragglAR: the straggler swaps; OptCC: S's uploads and
each fill's last upload; the balanced ring: the reduce-scatter's last step).

:func:`~stragglerkit.planner.lowering.rank_plan` and the runtime take this path above
:data:`SCALE_FROM_RANKS` ranks; at and below it they keep :func:`lower` with the full checker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from stragglerkit.planner.ordering import in_round_order
from stragglerkit.schedules.ir import OpKind, Schedule, ScheduleBuilder
from stragglerkit.schedules.pattern import FULL_CHECK_MAX_RANKS, PATTERNS, expand_chunks, round_flows
from stragglerkit.schedules.registry import Situation, why_not

__all__ = ["SCALE_FROM_RANKS", "OneRank", "WaitKey", "one_rank_schedule", "wait_order"]

SCALE_FROM_RANKS = FULL_CHECK_MAX_RANKS
"""Above this world size a rank's plan is built from its closed form (at and below it, the whole
schedule is generated, checked and lowered: well under a second there)."""

WaitKey = tuple[int, int, int]
"""``(major, minor, sender)`` of a message: its place in the global wait order (before pieces)."""

_OPTCC_STAGES = {
    stage: position
    for position, stage in enumerate(("reduce_scatter", "allgather", "upload", "fill_up", "download", "fill_down"))
}
"""OptCC's stages in the order a window's ops of one rank depend on each other (its sends: S1
before S4, upload before fill; its receives likewise)."""


@dataclasses.dataclass(slots=True)
class OneRank:
    """One rank's part of a schedule, as :func:`lower` needs it."""

    schedule: Schedule
    """The schedule with only ``rank``'s ops (every other rank's list empty), in round order."""
    rank: int
    keys: list[WaitKey | None]
    """Per op: its message's wait key; ``None`` for local ops."""
    completing: list[bool] | None
    """Per op: does this reduction leave its chunk holding all contributions (``None``: unknown)."""


def one_rank_schedule(algorithm: str, situation: Situation, rank: int) -> OneRank | None:
    """``rank``'s part of ``in_round_order(generate(algorithm, situation))`` with its wait keys and
    completing reductions, or ``None`` where this module has no closed form (module docstring)."""
    if why_not(algorithm, situation) is not None or not 0 <= rank < situation.world_size:
        return None
    if algorithm in PATTERNS:
        return _from_rounds(algorithm, situation, rank)
    if algorithm == "optcc":
        return _optcc(situation, rank)
    if algorithm == "balanced_ring":
        return _balanced_ring(situation, rank)
    return None


def _from_rounds(algorithm: str, situation: Situation, rank: int) -> OneRank:
    n = situation.world_size
    relabel = None
    straggler = situation.straggler if situation.straggler is not None else n - 1
    if algorithm in ("stragglar", "direct") and straggler != n - 1:
        relabel = list(range(n))
        relabel[n - 1], relabel[straggler] = straggler, n - 1
    num_chunks, round_phase, rounds = round_flows(algorithm, n, relabel)
    scratch_swaps = algorithm in ("stragglar", "direct")  # their round phase receives into scratch
    builder = ScheduleBuilder(n, num_chunks)
    keys: list[WaitKey | None] = []  # per op of the rank
    reductions: list[tuple[int, np.ndarray]] = []  # (op, per chunk: complete after it?)
    # StragglAR's swaps are its only complete reductions (the punctual rank's chunk holds the n - 1
    # punctual contributions after the reduce-scatter, the straggler's is the n-th); elsewhere the
    # contributions each rank holds of each chunk are counted round by round
    counted = algorithm != "stragglar"
    held = np.ones((n, num_chunks) if counted else (1, 1), np.int32)
    flat_held = held.reshape(-1)  # indexed by rank * num_chunks + chunk: faster than two index arrays
    for index, flows in enumerate(rounds):
        if counted:  # what every message carries is what its sender held at the start of the round
            src, dst, chunk, adds = expand_chunks(flows)
            carried = flat_held[src * np.int64(num_chunks) + chunk]  # int64: no overflow at any n
            into = dst * np.int64(num_chunks) + chunk
            flat_held[into[adds]] += carried[adds]
            flat_held[into[~adds]] = carried[~adds]
        rnd, phase = flows.round, flows.phase
        # the generators' op order within a round: a rank's send, then its receive (StragglAR's
        # swaps too), except StragglAR's moves, which follow its plan's list
        in_list_order = algorithm == "stragglar" and flows.phase == round_phase
        mine = np.flatnonzero((flows.src == rank) | (flows.dst == rank))
        first = [m for m in mine if not in_list_order or flows.adds[m]]
        first.sort(key=lambda m: flows.src[m] != rank)
        for message in first + [m for m in mine if in_list_order and not flows.adds[m]]:
            span = (int(flows.start[message]), int(flows.stop[message]))
            if flows.src[message] == rank:
                builder.send(rank, int(flows.dst[message]), span, round=rnd, phase=phase)
                keys.append((index, 0, rank))
                continue
            peer = int(flows.src[message])
            keys.append((index, 0, peer))
            if not flows.adds[message]:
                builder.recv(rank, peer, span, round=rnd, phase=phase)
                continue
            if scratch_swaps and flows.phase == round_phase:
                builder.recv(rank, peer, span, scratch=0, round=rnd, phase=phase)
                op = builder.reduce(rank, 0, span, round=rnd, phase=phase)
                keys.append(None)
            else:
                op = builder.recv_reduce(rank, peer, span, round=rnd, phase=phase)
            complete = held[rank, span[0] : span[1]] == n if counted else np.array([flows.phase == round_phase])
            reductions.append((op, complete))
    params = {"straggler": straggler} if algorithm in ("stragglar", "direct") else {}
    schedule = in_round_order(builder.build(algorithm, round_phase=round_phase, params=params))
    return OneRank(schedule, rank, keys, _completing(len(keys), reductions))


def _completing(num_ops: int, reductions: list[tuple[int, np.ndarray]]) -> list[bool] | None:
    flags = [False] * num_ops
    for index, done in reductions:
        if done.any() and not done.all():
            return None  # a reduction that completes only part of its range: no fused division
        flags[index] = bool(done.all())
    return flags


def _optcc(situation: Situation, rank: int) -> OneRank | None:
    from stragglerkit.schedules.optcc import optcc_plan_for

    plan = optcc_plan_for(situation)
    if plan is None:
        return None
    keys: list[WaitKey | None] = []
    completing: list[bool] = []
    q = plan.q
    for window in range(plan.num_windows):
        for flow in plan.rank_flows(rank, window):
            keys.append((window, _OPTCC_STAGES[flow.stage], flow.src))
            last_fill_up = flow.stage == "fill_up" and window % q == q - 1
            completing.append(flow.dst == rank and (flow.stage == "upload" or last_fill_up))
    return OneRank(plan.lower(ranks=(rank,)), rank, keys, completing)


def _balanced_ring(situation: Situation, rank: int) -> OneRank:
    """The generator's ops of ``rank``: a send and a receive per (phase, step, slice), in order,
    so op ``j`` belongs to the ``j // 2``-th of them; the reduce-scatter's last step completes."""
    from stragglerkit.schedules.balanced_ring import balanced_ring

    n = situation.world_size
    schedule = balanced_ring(n, dict(situation.slowdowns), ranks=(rank,))
    slices = int(schedule.params["slices"])
    last_step = range((n - 2) * slices, (n - 1) * slices)  # of the reduce-scatter, whose ops come first
    ops = schedule.ops[rank]
    sender = {OpKind.SEND: rank, OpKind.RECV: (rank - 1) % n, OpKind.RECV_REDUCE: (rank - 1) % n}
    keys: list[WaitKey | None] = [(j // 2, 0, sender[op.kind]) for j, op in enumerate(ops)]
    completing = [op.kind is OpKind.RECV_REDUCE and j // 2 in last_step for j, op in enumerate(ops)]
    return OneRank(schedule, rank, keys, completing)


def wait_order(part: OneRank, pieces: int, empty: Sequence[bool]) -> list[int]:
    """The refined ops' wait order: the non-empty messages sorted by key (module docstring).
    Refined op ``i·P + j`` is piece ``j`` of op ``i``."""
    ranked = []
    for index, key in enumerate(part.keys):
        if key is None:
            continue
        major, minor, sender = key
        for piece in range(pieces):
            refined = index * pieces + piece
            if not empty[refined]:
                ranked.append(((major, minor, piece, sender), refined))
    ranked.sort()
    return [refined for _, refined in ranked]
