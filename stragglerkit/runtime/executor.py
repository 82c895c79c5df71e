"""Python face of the C++ plan interpreter (stragglerkit._C).

:func:`run_plan` hands one rank's :class:`~stragglerkit.planner.tables.RankPlan` and its buffer to
``_C.execute``, which posts the sends and receives over the group's c10d backend and reduces in
place (csrc/executor.cpp explains the rules). C++ errors come back as
:class:`~stragglerkit.errors.PeerError` or :class:`~stragglerkit.errors.CollectiveError` with the
local and remote rank in the message. Per-op timings come back as :class:`OpTimings`. While a
profiler looks (through the range hooks that telemetry installs: runtime/hooks.py),
:class:`PlanRanges` turns the executor's callbacks into ranges for each phase or round, reduction
and message, named as docs/profiling.md says.
"""

from __future__ import annotations

import atexit
import datetime
import importlib
import re
import warnings
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from stragglerkit.errors import CollectiveError, PeerError
from stragglerkit.planner.remap import RankMap
from stragglerkit.planner.tables import LoweredKind, OpColumn, RankPlan
from stragglerkit.runtime import hooks
from stragglerkit.schedules.stragglar import MATCHING_PHASE, PRE_PHASE

__all__ = [
    "CONCURRENT_WAIT_MIN_BYTES",
    "OpTiming",
    "OpTimings",
    "PlanRanges",
    "concurrent_waits",
    "duplex_group",
    "force_wait_mode",
    "gloo_group_over",
    "is_gloo_group",
    "native",
    "notify_local_failure",
    "phase_range_name",
    "run_plan",
]

CONCURRENT_WAIT_MIN_BYTES = 64 * 1024
"""Buckets from this size on observe message completions with one waiter thread per channel."""

_native = None


def native():  # type: ignore[no-untyped-def]
    """The compiled extension, with a clear error when it has not been built."""
    global _native
    if _native is None:
        try:  # the compiled module, by name: not a Python layer of the package (docs/architecture.md)
            _C = importlib.import_module("stragglerkit._C")
        except ImportError as err:
            raise CollectiveError(
                "stragglerkit's native extension is not built: run `python setup.py build_ext --inplace` "
                f"(or `pip install -e .`) in the source tree ({err})"
            ) from None
        _native = _C
        atexit.register(_C.shutdown_listeners)
    return _native


@dataclass(slots=True, frozen=True)
class OpTiming:
    """One completed send or receive: times are ``time.monotonic_ns()`` values."""

    op: int
    peer: int
    """Physical (group) rank of the peer."""
    nbytes: int
    kind: str
    start_ns: int
    """When the op was posted."""
    end_ns: int
    """When this rank observed its completion."""

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class OpTimings:
    """Per-op timings of one run, kept as the executor's int64 table until asked for."""

    __slots__ = ("table",)
    COLUMNS = ("op", "peer", "nbytes", "kind", "start_ns", "end_ns")

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def __len__(self) -> int:
        return int(self.table.shape[0])

    def records(self) -> list[OpTiming]:
        return [
            OpTiming(op, peer, nbytes, LoweredKind(kind).name.lower(), start, end)
            for op, peer, nbytes, kind, start, end in self.table.tolist()
        ]

    def span_ns(self) -> tuple[int, int]:
        """(first post, last completion), or (0, 0) without messages."""
        if len(self) == 0:
            return (0, 0)
        return int(self.table[:, 4].min()), int(self.table[:, 5].max())


STAGE_NUMBERS = {"optcc": {"reduce_scatter": 1, "upload": 2, "download": 3, "allgather": 4}}
"""Phases named ``stage <n>`` (OptCC's S1..S4; its fill and attach flows keep their own names)."""


def phase_range_name(algorithm: str, label: str) -> str:
    """The profiler range of a plan label (``"<phase> round <r>"`` or ``"<phase>"``, plan.py):
    ``stragglerkit/<algorithm>/<phase>`` by the naming scheme of docs/profiling.md.

    StragglAR's pre-phase rounds are one range, ``pre-phase``, and its matching rounds ``round <r>``;
    OptCC's four stages are ``stage 1`` .. ``stage 4``; other labels keep their text
    (``stragglerkit/ring/reduce_scatter round 2``).
    """
    phase, _, round_ = label.partition(" round ")
    if algorithm == "stragglar" and phase == PRE_PHASE:
        return "stragglerkit/stragglar/pre-phase"
    if algorithm == "stragglar" and phase == MATCHING_PHASE and round_:
        return f"stragglerkit/stragglar/round {round_}"
    stage = STAGE_NUMBERS.get(algorithm, {}).get(phase)
    if stage is not None:
        return f"stragglerkit/{algorithm}/stage {stage}"
    return f"stragglerkit/{algorithm}/{label}"


class PlanRanges:
    """The executor's range callback for one run: ``(code, begin)`` from csrc/executor.cpp, where
    ``code >= 0`` is a plan label (one at a time), ``-1`` a reduction and ``-(op + 2)`` a message
    from its posting to its observed completion.

    Labels and reductions nest (NVTX thread ranges, record functions opened and closed in order);
    consecutive labels with the same range name (StragglAR's pre-phase rounds) stay one range.
    Messages overlap, so they are started and ended (``hooks.ranges.start``): ``send <peer>`` and
    ``recv <peer>`` with the peer's group rank. All calls come from the thread that runs the plan.
    :meth:`close` ends what a failed run left open.
    """

    __slots__ = ("_deferred", "_failed", "_kinds", "_messages", "_names", "_open", "_peers")

    def __init__(self, plan: RankPlan, rank_map: RankMap) -> None:
        self._names = [phase_range_name(plan.algorithm, label) for label in plan.labels]
        self._kinds = plan.ops[:, OpColumn.KIND].tolist()
        to_physical = rank_map.to_physical
        self._peers = [to_physical[p] if p >= 0 else p for p in plan.ops[:, OpColumn.PEER].tolist()]
        self._open: list[AbstractContextManager[None]] = []
        """The nested ranges open now, innermost last."""
        self._deferred: str | None = None
        """A label range whose end was reported: closed unless the next label has the same name."""
        self._messages: dict[int, object | None] = {}
        self._failed = False

    def __call__(self, code: int, begin: bool) -> None:
        if self._failed:
            return
        try:
            self._record(code, begin)
        except Exception as err:  # a profiler's trouble must not fail the AllReduce
            self._failed = True
            warnings.warn(f"stragglerkit: profiler ranges stopped for this call: {err!r}", RuntimeWarning, stacklevel=1)

    def _record(self, code: int, begin: bool) -> None:
        if code <= -2:
            self._flush()
            self._message(-code - 2, begin)
        elif code == -1:
            self._flush()
            self._nest(hooks.REDUCTION, begin)
        elif begin:
            name = self._names[code]
            if self._deferred == name:  # the same range goes on
                self._deferred = None
                return
            self._flush()
            self._nest(name, True)
        else:
            self._flush()
            self._deferred = self._names[code]

    def _flush(self) -> None:
        if self._deferred is not None:
            self._deferred = None
            self._nest("", False)

    def _nest(self, name: str, begin: bool) -> None:
        if begin:
            opened = hooks.ranges.range(name)
            opened.__enter__()
            self._open.append(opened)
        elif self._open:
            self._open.pop().__exit__(None, None, None)

    def _message(self, op: int, begin: bool) -> None:
        if begin:
            verb = hooks.SEND if self._kinds[op] == LoweredKind.SEND else hooks.RECV
            self._messages[op] = hooks.ranges.start(verb, self._peers[op])
        else:
            hooks.ranges.end(self._messages.pop(op, None))

    def close(self) -> None:
        """End the ranges still open (all of them after a failure; none after a clean run)."""
        self._flush()
        while self._open:
            self._nest("", False)
        for started in self._messages.values():
            hooks.ranges.end(started)
        self._messages.clear()


def _range_callback(plan: RankPlan, rank_map: RankMap) -> PlanRanges | None:
    """The executor's range callback, or None (no callback: no cost) when no profiler looks."""
    return PlanRanges(plan, rank_map) if hooks.ranges.active() else None


_RANK_MAP_TABLES: dict[tuple[int, ...], torch.Tensor] = {}


def rank_map_table(rank_map: RankMap) -> torch.Tensor:
    """``rank_map`` as the int64 tensor the executor reads (cached)."""
    table = _RANK_MAP_TABLES.get(rank_map.to_physical)
    if table is None:
        table = torch.tensor(rank_map.to_physical, dtype=torch.int64)
        _RANK_MAP_TABLES[rank_map.to_physical] = table
    return table


def run_plan(
    group: dist.ProcessGroup,
    buffer: torch.Tensor,
    scratch: torch.Tensor,
    plan: RankPlan,
    rank_map: RankMap,
    plan_id: int,
    timeout_seconds: float,
    reverse_group: dist.ProcessGroup | None = None,
    concurrent: bool = False,
) -> OpTimings:
    """Run ``plan`` in place on the 1-D contiguous ``buffer``; return the per-op timings.

    ``reverse_group`` (same ranks as ``group``): messages from a higher to a lower rank go over it,
    so that each direction of a pair has its own connection (see :func:`duplex_group`).
    ``concurrent``: observe completions with one waiter thread per (peer, direction) channel
    instead of in the plan's global wait order (see :func:`concurrent_waits`).
    """
    c = native()
    ranges = _range_callback(plan, rank_map)
    try:
        table = c.execute(
            group,
            buffer,
            scratch,
            plan.ops,
            plan.dep_count,
            plan.child_ptr,
            plan.child_idx,
            plan.wait_order,
            plan.peers,
            rank_map_table(rank_map),
            plan.labels,
            plan.algorithm,
            plan.logical_rank,
            plan_id,
            timeout_seconds,
            ranges,
            reverse_group,
            concurrent,
        )
    except RuntimeError as err:
        raise failure_from_native(str(err)) from None
    finally:
        if ranges is not None:
            ranges.close()
    return OpTimings(table)


_BLAMED_PEER = (
    re.compile(r"aborted because rank (\d+) failed"),
    re.compile(r"with rank (\d+) \(logical"),
    re.compile(r"timed out after [^:]*? waiting for rank (\d+) \(logical"),
    re.compile(r": rank (\d+) \(logical \d+\) failed during "),
    re.compile(r"mismatch detected before any data moved: .*?\brank (\d+) \(logical", re.DOTALL),
)


def failure_from_native(text: str) -> CollectiveError:
    """The executor's error as the library's exception: :class:`PeerError` naming the rank the
    message blames (the origin of an abort, the peer of the failed or timed-out message, or the
    peer whose header differs), else
    :class:`CollectiveError`. C++ call-site suffixes (\"Exception raised from ...\") are cut."""
    message = text.split("\nException raised from")[0]
    for pattern in _BLAMED_PEER:
        found = pattern.search(message)
        if found is not None:
            return PeerError(message, int(found.group(1)))
    return CollectiveError(message)


WAIT_MODES = ("auto", "ordered", "concurrent")
_wait_mode = "auto"


def force_wait_mode(mode: str) -> None:
    """Observe completions always ``ordered`` or ``concurrent`` instead of the :func:`concurrent_waits`
    rule (``auto``), in this process: for tests that cover both observers of the executor."""
    global _wait_mode
    if mode not in WAIT_MODES:
        raise ValueError(f"wait mode {mode!r}: give one of {', '.join(WAIT_MODES)}")
    _wait_mode = mode


def concurrent_waits(
    group: dist.ProcessGroup, buffer: torch.Tensor, plan: RankPlan, bounded_send_buffer: bool = False
) -> bool:
    """Whether the executor should observe completions concurrently for this call.

    Gloo's works cannot be polled, so the executor learns of a completion only by blocking in
    ``wait()``. In the plan's global wait order a pipelined schedule with several streams per rank
    (OptCC's healthy ring, upload and download; StragglAR's swaps) advances one wait at a time, at
    the pace of its slowest stream; one waiter thread per channel observes every completion as it
    happens (csrc/channel_waiters.h). The threads cost tens of microseconds per call, so small
    buckets keep the ordered mode. A rank with at most two peers (a ring) has one stream in and
    one out, which the global order already follows, and there the threads only cost CPU -- as
    long as a send completes when it is posted, which a socket with the kernel's send buffer (up
    to 4 MiB) does for a ring's chunks. Over connections with a bounded send buffer (``bounded_send_buffer``:
    ``executor.send_buffer``, runtime/send_buffer.py) a send to a slow successor completes
    only as its link drains, and in the global order the receive from the predecessor behind it is
    observed that late: its recorded end, which the NIC-health estimate reads as the link's
    delivery, would make the degraded rank's ring predecessor read as degraded too
    (docs/executor.md, "Observing completions"). So with a bounded send buffer every plan of a
    large enough bucket is observed concurrently. NCCL's ``wait()`` does not block
    the host, so CUDA tensors keep the ordered mode too.
    """
    if buffer.device.type != "cpu" or dist.get_backend(group) != "gloo":
        return False
    mode = _wait_mode
    if mode == "ordered":
        return False
    if mode == "concurrent":
        return True
    streams = plan.peers.numel() > 2 or bounded_send_buffer
    return streams and buffer.numel() * buffer.element_size() >= CONCURRENT_WAIT_MIN_BYTES


def duplex_group(group: dist.ProcessGroup) -> dist.ProcessGroup | None:
    """A second gloo group over the ranks of the gloo group ``group``, or None where not needed.

    Gloo keeps one TCP connection per pair of ranks, and it carries one direction at a time: two
    ranks that send each other a chunk at once (StragglAR's swaps, OptCC's upload/download) take
    about twice the time of a one-way transfer. With a second group, each direction gets its own
    connection. NCCL needs none. Creating it is collective over ``group`` (:func:`gloo_group_over`).
    """
    if not is_gloo_group(group):
        return None
    return gloo_group_over(group)


def is_gloo_group(group: dist.ProcessGroup) -> bool:
    """``group`` runs on gloo: the runtime may add gloo groups over the same ranks
    (:func:`duplex_group`, runtime/send_buffer.py)."""
    return dist.get_backend(group) == "gloo"


def gloo_group_over(group: dist.ProcessGroup, timeout: datetime.timedelta | None = None) -> dist.ProcessGroup:
    """A new gloo group over ``group``'s ranks, with the same rank numbering (torch sorts a group's
    ranks). For the default group every rank creates it, as torch asks. For any other group only
    its members do: the group is then named after its ranks (``use_local_synchronization``), so
    ranks outside it keep torch's group numbering, and groups of the same size on other ranks
    (Megatron's data-parallel groups, one per tensor- and pipeline-parallel position, each set up
    by its own members) do not share a name. Every member calls it at the same point."""
    ranks = dist.get_process_group_ranks(group)
    members_only = group is not dist.distributed_c10d._get_default_group()
    return dist.new_group(ranks, backend="gloo", timeout=timeout, use_local_synchronization=members_only)


def notify_local_failure(group: dist.ProcessGroup, device: torch.device, algorithm: str) -> None:
    """Tell the other ranks this rank's call failed on its arguments, so they raise instead of waiting."""
    try:
        native().notify_local_failure(group, str(device), algorithm)
    except RuntimeError:
        pass
