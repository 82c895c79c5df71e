"""Rounds in order: the executor runs a round schedule's round phase one round at a time per rank.

The executor posts every op as soon as its data dependencies allow. For most schedules that is
what one wants, but in the round phase of a round schedule it can hurt: StragglAR's straggler holds
all of its own chunks from the start, so with pure dataflow it posts its sends of every matching
round at once, they share its NIC, and the first exchange finishes only when all of them do; the
punctual ranks then forward late. The schedule's analysis (and the simulator's default,
``sync_rounds``) assumes that a rank starts round r+1 only after its round r is complete.

:func:`in_round_order` makes that explicit: every send and receive tagged with a round of the
schedule's ``round_phase`` gets an extra dependency on this rank's sends and receives of its previous
round in that phase. The dependencies are ordinary ``depends`` entries, so the checker proves the
result again. When chunks are cut into pieces the lowering keeps them piece by piece: piece ``j``
of a round starts once piece ``j`` of the previous round is complete, so a rank still runs one
round after another while each piece's reduction overlaps the rest of the round (planner/lowering.py,
``refine``; by default round schedules keep whole chunks, see ``choose_pieces``). Other phases
(StragglAR's pre-phase ReduceScatter, rings, OptCC's pipeline) stay dataflow.
"""

from __future__ import annotations

import dataclasses

from stragglerkit.schedules.ir import Op, Schedule

__all__ = ["in_round_order"]


def _ordered_rank(ops: list[Op], phase: str) -> list[Op]:
    out: list[Op] = []
    previous_round: list[int] = []
    current_round: list[int] = []
    current_tag: int | None = None
    for index, op in enumerate(ops):
        if op.is_comm and op.phase == phase and op.round is not None:
            if op.round != current_tag:
                if current_round:
                    previous_round = current_round
                current_round, current_tag = [], op.round
            if previous_round:
                op = dataclasses.replace(op, depends=tuple(sorted(set(op.depends) | set(previous_round))))
            current_round.append(index)
        out.append(op)
    return out


def in_round_order(schedule: Schedule) -> Schedule:
    """``schedule`` with each rank's rounds of ``schedule.round_phase`` run one after another.

    Example::

        from stragglerkit.schedules.stragglar import stragglar
        ordered = in_round_order(stragglar(8))   # check(ordered) passes; same messages, more depends
    """
    phase = schedule.round_phase
    if phase is None:
        return schedule
    return dataclasses.replace(schedule, ops=[_ordered_rank(list(ops), phase) for ops in schedule.ops])
