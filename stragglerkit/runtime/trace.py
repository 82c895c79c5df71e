"""One rank's part of an AllReduce's critical path, as plain values.

:func:`rank_trace` turns a run's record (the rank's lowered plan and the executor's per-op timings)
into what :func:`stragglerkit.report.critical_path.critical_path` reads once the ranks' traces are
gathered; :func:`message_dependencies` follows the plan's dependencies from message to message.
They live with the runtime because they read its op table; the analysis itself takes plain data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stragglerkit.planner.tables import LoweredKind, OpColumn, RankPlan

if TYPE_CHECKING:
    from stragglerkit.runtime.calls import RunRecord

__all__ = ["message_dependencies", "rank_trace"]

_MESSAGES = (LoweredKind.SEND, LoweredKind.RECV, LoweredKind.RECV_REDUCE)
_KIND_NAMES = {int(k): k.name.lower() for k in _MESSAGES}


def message_dependencies(plan: RankPlan) -> dict[int, list[int]]:
    """Per message op of ``plan``: the message ops it waits for, through any local ops (reductions,
    copies, empty ops) in between.

    Example::

        deps = message_dependencies(record.plan)    # {op: [earlier message ops], ...}
    """
    kinds = plan.ops[:, OpColumn.KIND].tolist()
    child_ptr, child_idx = plan.child_ptr.tolist(), plan.child_idx.tolist()
    parents: list[list[int]] = [[] for _ in kinds]
    for op in range(len(kinds)):
        for k in range(child_ptr[op], child_ptr[op + 1]):
            if child_idx[k] >= 0:  # -(b + 1): b waits only for this op's posting (planner/lowering.py)
                parents[child_idx[k]].append(op)
    resolved: dict[int, set[int]] = {}

    def through_local(op: int) -> set[int]:
        # the message ops behind ``op``'s parents (ops are topologically ordered: parents come first)
        if op in resolved:
            return resolved[op]
        found: set[int] = set()
        for parent in parents[op]:
            if kinds[parent] in _KIND_NAMES:
                found.add(parent)
            else:
                found |= through_local(parent)
        resolved[op] = found
        return found

    return {op: sorted(through_local(op)) for op, kind in enumerate(kinds) if kind in _KIND_NAMES}


def rank_trace(record: RunRecord, entered_ns: int) -> dict[str, Any]:
    """This rank's part of the critical path: its entry time, its messages ``[op, kind, peer,
    bytes, post_ns, completion_ns, label]`` (``peer`` the physical rank, ``label`` the plan's
    phase/round) and each message's message dependencies (same order). Plain values, for
    ``all_gather_object``."""
    if record.plan is None:
        return {"entered_ns": entered_ns, "messages": [], "deps": []}
    deps = message_dependencies(record.plan)
    timings = sorted(record.timings.records(), key=lambda t: t.op)
    label_of = record.plan.ops[:, OpColumn.LABEL].tolist()
    labels = record.plan.labels
    messages: list[list[Any]] = [
        [t.op, t.kind, t.peer, t.nbytes, t.start_ns, t.end_ns, labels[label_of[t.op]]] for t in timings
    ]
    return {"entered_ns": entered_ns, "messages": messages, "deps": [deps.get(t.op, []) for t in timings]}
