"""Symbolic verifier: proves a schedule is a correct AllReduce before it ever runs.

The checker executes the schedule on *contribution sets* instead of numbers: every rank's chunk
starts holding ``{rank}``, a reduction forms the union of two sets, and at the end every rank must
hold every chunk with all ``n`` contributions. It rejects, with a :class:`ScheduleError` that names
the rank, the op and the chunk:

* malformed ops (bad peer, chunk range, scratch slot or dependency index);
* races: two ops of a rank touching the same chunk or scratch slot (one writing) that are not
  ordered by ``depends`` -- this is also how *sending data not yet held* shows up (a send of a chunk
  that does not depend on the receive that brings it);
* double counting (a reduction adding a contribution the chunk already has);
* send/recv mismatches (counts, chunk ranges or round tags differ between the k-th send from a to b
  and the k-th receive on b from a);
* deadlock, under the executor's rules (an op starts when its dependencies completed; sends and
  receives on one peer pair are posted in program order; a message moves when both sides posted);
* for round schedules, more than one send or more than one receive by a rank in one round;
* a chunk that lacks contributions at the end.

It returns a :class:`CheckReport` with counts that tests and the CLI print.

Group AllReduces (schedules/group_ring.py) declare disjoint groups of ranks in
``params["groups"]``; for them "every rank holds all ``n`` contributions" becomes, per group:

* every member ends holding every chunk with exactly its group's contributions, each counted once
  (so, on buffers that each member scaled by its weight beforehand, the weighted sum over exactly
  that group): a contribution from outside the group, or one missing, is rejected;
* every member of a group ends with the same value of every chunk: the checker also tracks each
  chunk's *expression* (which two values each reduction added; addition commutes but does not
  associate), and two members whose sums were added up in different orders are rejected, since
  their bits could differ;
* no message crosses a group's boundary, and a rank in no group has no ops (its buffer is
  untouched and it sends nothing).

The static passes live in :mod:`stragglerkit.schedules.static_checks`, the run on contribution
sets in :mod:`stragglerkit.schedules.symbolic_run`; this module runs them in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglerkit.schedules.schedule import Schedule
from stragglerkit.schedules.static_checks import (
    check_group_traffic,
    check_ordering,
    check_rounds,
    declared_groups,
    match_messages,
    validate_structure,
)
from stragglerkit.schedules.symbolic_run import execute, format_ranks

__all__ = ["CheckReport", "check", "completing_reductions", "format_ranks"]


@dataclass(slots=True, frozen=True)
class CheckReport:
    """What the checker saw in a correct schedule."""

    algorithm: str
    world_size: int
    num_chunks: int
    num_ops: int
    num_messages: int
    rounds: int


def check(sched: Schedule) -> CheckReport:
    """Prove ``sched`` is a correct in-place AllReduce (over all ranks, or per declared group: see
    the module docstring); raise :class:`ScheduleError` otherwise.

    Example::

        from stragglerkit.schedules import check, ring
        report = check(ring(8))
        assert report.rounds == 14
    """
    return _check(sched)


def _check(sched: Schedule, completed: list[list[int]] | None = None) -> CheckReport:
    """:func:`check`, with ``completed`` filled as :func:`execute` describes."""
    validate_structure(sched)
    group_of = declared_groups(sched)
    if group_of is not None:
        check_group_traffic(sched, group_of)
    check_ordering(sched)
    check_rounds(sched)
    match_messages(sched)
    messages = execute(sched, completed, group_of)
    return CheckReport(
        algorithm=sched.algorithm,
        world_size=sched.world_size,
        num_chunks=sched.num_chunks,
        num_ops=sched.num_ops(),
        num_messages=messages,
        rounds=sched.rounds(),
    )


def completing_reductions(sched: Schedule) -> list[list[bool]] | None:
    """Per rank and op: does this reduction leave its whole chunk range holding all contributions?

    These are the ops after which a chunk's sum is final on that rank; every other rank gets that
    chunk's final value either from such an op of its own or by a copy of one (a ``recv`` into the
    buffer, possibly via scratch and ``copy``). An averaging AllReduce can therefore divide inside
    exactly these reductions (``dst = (dst + src) / n``) instead of dividing the whole buffer
    after the run: every final value is divided once, by the op that made it final. Returns
    ``None`` when some reduction completes only part of its range (then the division cannot be
    fused op by op). Raises :class:`ScheduleError` if ``sched`` is not a correct AllReduce.

    Example::

        flags = completing_reductions(ring(4))
        assert sum(map(sum, flags)) == 4  # each chunk is completed once, on its owner
    """
    completed = [[0] * len(rank_ops) for rank_ops in sched.ops]
    _check(sched, completed)
    flags: list[list[bool]] = []
    for rank, rank_ops in enumerate(sched.ops):
        row = []
        for index, op in enumerate(rank_ops):
            count = completed[rank][index]
            if 0 < count < op.num_chunks:
                return None
            row.append(count > 0)
        flags.append(row)
    return flags
