"""The Schedule IR: an AllReduce algorithm as data.

A schedule describes an in-place AllReduce among ``world_size`` *logical* ranks whose buffer is
cut into ``num_chunks`` chunks. Each rank has an ordered list of :class:`Op`; an op may depend on
earlier ops of the same rank (``depends`` holds their indices in that rank's list). The executor
starts an op as soon as its dependencies have completed, so two ops without a dependency path
between them may run concurrently; the checker (``check.py``) therefore requires every pair of
ops that touch the same chunk (one of them writing) to be ordered by dependencies.

Ops (``chunks`` is a half-open range ``(start, stop)`` of chunk indices):

==============  ===========================================================================
``send``        send ``buffer[chunks]`` to ``peer``
``recv``        receive from ``peer``: into scratch slot ``scratch`` when given, otherwise
                straight into ``buffer[chunks]`` (overwrite; the all-gather step)
``recv_reduce`` receive from ``peer`` and add into ``buffer[chunks]`` (fused)
``reduce``      ``buffer[chunks] += scratch[scratch]``
``copy``        ``buffer[chunks] = scratch[scratch]``
==============  ===========================================================================

Messages between a pair of ranks match in program order: the k-th ``send`` from a to b is the
k-th ``recv``/``recv_reduce`` on b from a, and both name the same chunk range. Round-based
algorithms tag ops with ``round`` (unique per ``phase``); ``phase`` labels also name NVTX ranges.

Chunk sizes are relative integer weights (``chunk_sizes``; ``None`` means all equal); the planner's
lowering (planner/pieces.py) turns them into byte offsets for a real bucket.

A *group AllReduce* (schedules/group_ring.py) declares its groups in ``params["groups"]``
(:data:`GROUPS_PARAM`): disjoint lists of ranks, each of which reduces among its own members only;
ranks in no group keep their buffers. The checker proves a schedule against that declaration.

Schedules serialise to JSON with a format version (:meth:`Schedule.to_json`,
:meth:`Schedule.from_json`); the op list is stored as compact arrays in a documented field order.

The IR lives in three modules, whose public names are importable from here:
:mod:`~stragglerkit.schedules.ops` (:class:`OpKind`, :class:`Op`),
:mod:`~stragglerkit.schedules.schedule` (:class:`Schedule`, its JSON format, :data:`GROUPS_PARAM`)
and :mod:`~stragglerkit.schedules.builder` (:class:`ScheduleBuilder`).
"""

from __future__ import annotations

from stragglerkit.schedules.builder import ScheduleBuilder
from stragglerkit.schedules.ops import Op, OpKind
from stragglerkit.schedules.schedule import FORMAT_NAME, FORMAT_VERSION, GROUPS_PARAM, Schedule

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "GROUPS_PARAM",
    "Op",
    "OpKind",
    "Schedule",
    "ScheduleBuilder",
]
