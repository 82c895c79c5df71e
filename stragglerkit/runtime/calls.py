"""An AllReduce call as the runtime takes it: its arguments, their checks, and what it returns.

:class:`AllReduceCall` is one call (every rank passes the same, but the tensor);
:func:`validate_tensor` and :func:`group_arguments` check it on this rank before anything moves
(``ValueError``: :class:`~stragglerkit.errors.ConfigError`). A call returns a :class:`RunRecord`,
or, queued, an :class:`AllReduceHandle` that gives one; a requested algorithm that does not apply
is reported with a :class:`FallbackWarning`. :class:`~stragglerkit.runtime.runtime.Runtime` runs
the calls.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from stragglerkit.errors import ConfigError
from stragglerkit.planner.tables import OpColumn, RankPlan
from stragglerkit.runtime.executor import OpTiming, OpTimings, native
from stragglerkit.schedules.group_ring import validate_groups

__all__ = [
    "OPS",
    "SUPPORTED_DTYPES",
    "AllReduceCall",
    "AllReduceHandle",
    "FallbackWarning",
    "RunRecord",
    "group_arguments",
    "validate_tensor",
]

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64)
OPS = ("sum", "avg")


class FallbackWarning(UserWarning):
    """The requested algorithm does not apply; another one runs instead (said once per reason)."""


@dataclass(slots=True, frozen=True)
class RunRecord:
    """What one call did."""

    requested: str
    algorithm: str
    """The algorithm that ran (``"none"`` for a one-rank group)."""
    timings: OpTimings
    """Per-op timings of this rank (peer, bytes, post and completion times)."""
    plan: RankPlan | None = None
    """The lowered plan that ran (``None`` for a one-rank group)."""

    def labelled_timings(self) -> list[tuple[str, OpTiming]]:
        """``(phase/round label, timing)`` of every message, in completion order."""
        if self.plan is None:
            return []
        labels = self.plan.labels
        label_of = self.plan.ops[:, OpColumn.LABEL].tolist()
        return [(labels[label_of[t.op]], t) for t in self.timings.records()]


@dataclass(slots=True, frozen=True)
class AllReduceCall:
    """One in-place AllReduce as the runtime takes it (every rank passes the same, but the tensor)."""

    tensor: torch.Tensor
    algorithm: str = "auto"
    """``"auto"`` or a registered name; one that does not apply falls back with a warning."""
    op: str = "sum"
    """``"sum"`` or ``"avg"``."""
    straggler: int | None = None
    """Group rank known to arrive late."""
    slowdowns: Mapping[int, float] | None = None
    """Group rank -> NIC slowdown ``l`` (1 = healthy)."""
    rank_map: Sequence[int] | None = None
    """``ranks[logical] = group rank`` for this call (default: the runtime's, the identity)."""
    groups: Sequence[Sequence[int]] | None = None
    """A group AllReduce: disjoint lists of group ranks, each summing among its own members (a
    ring per group, all at once); ranks in no list keep their tensor. ``None``: all ranks. Takes
    ``op="sum"`` and no straggler or slowdowns; ``algorithm`` is ``"auto"`` or ``"group_ring"``."""
    weights: Sequence[Sequence[float]] | None = None
    """With ``groups``: per group, one finite factor per member (in the group's order) that the
    member multiplies its tensor by before the sum, so each group ends with ``sum_i w_i x_i``
    (a floating-point tensor); ``None``: factors 1, the plain sum."""


def validate_tensor(tensor: object, op: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(f"all_reduce takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout is not torch.strided:
        raise ConfigError(
            f"all_reduce needs a dense tensor, got layout {tensor.layout}; convert it with tensor.to_dense()"
        )
    if not tensor.is_contiguous():
        raise ConfigError(
            "all_reduce needs a contiguous tensor (it reduces in place); pass t = tensor.contiguous() and copy "
            "the result back with tensor.copy_(t)"
        )
    if tensor.dtype not in SUPPORTED_DTYPES:
        supported = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise ConfigError(f"all_reduce does not support dtype {tensor.dtype}; supported: {supported}")
    if op not in OPS:
        raise ConfigError(
            f"stragglerkit.all_reduce cannot reduce with {op!r}; its algorithms do ReduceOp.SUM and "
            "ReduceOp.AVG (use torch.distributed.all_reduce for the others)"
        )
    if op == "avg" and not tensor.is_floating_point():
        raise ConfigError(f"op 'avg' needs a floating-point tensor, got {tensor.dtype}; use op='sum' and divide")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ConfigError(f"all_reduce takes CPU or CUDA tensors, got one on {tensor.device}")
    if tensor.device.type == "cuda" and not native().cuda_kernel:
        raise ConfigError(
            f"this stragglerkit build has no CUDA reduction kernel, so it cannot reduce a tensor on {tensor.device}: "
            "reinstall it where torch is a CUDA build and nvcc is found (CUDA_HOME), e.g. pip install -e . "
            "(scripts/gpu_check.sh builds and checks it on a GPU machine)"
        )


def group_arguments(
    call: AllReduceCall, world_size: int, rank: int
) -> tuple[tuple[tuple[int, ...], ...], float, dict[int, float]]:
    """A group call's groups (checked, sorted: :func:`validate_groups`), this rank's factor and
    every member's factor (empty without weights)."""
    if call.groups is None:
        raise ConfigError("weights are given without groups: give groups=[[ranks], ...] with one weight per member")
    if call.op != "sum":
        raise ConfigError(
            f"a group AllReduce sums (op='sum'), got op={call.op!r}; for an average give weights that sum to 1"
        )
    if call.algorithm not in ("auto", "group_ring"):
        raise ConfigError(f"a group AllReduce runs 'group_ring', not {call.algorithm!r}; leave algorithm='auto'")
    if call.straggler is not None or call.slowdowns:
        raise ConfigError("a group AllReduce takes no straggler or slowdowns (each group runs a ring)")
    groups = validate_groups(call.groups, world_size)
    factors: dict[int, float] = {}
    if call.weights is not None:
        given = call.weights
        if isinstance(given, str | bytes) or not isinstance(given, Sequence) or len(given) != len(call.groups):
            raise ConfigError(
                f"weights must hold one list per group ({len(call.groups)} groups), in the groups' order; got {given!r}"
            )
        for index, (group, row) in enumerate(zip(call.groups, given)):
            if isinstance(row, str | bytes) or not isinstance(row, Sequence) or len(row) != len(group):
                raise ConfigError(
                    f"weights[{index}] must hold one weight per member of group {index} ({list(group)}), got {row!r}"
                )
            for member, weight in zip(group, row):
                if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
                    raise ConfigError(
                        f"the weight of rank {member} in group {index} must be a finite number, got {weight!r}"
                    )
                factors[member] = float(weight)
        if not call.tensor.is_floating_point():
            raise ConfigError(f"weights need a floating-point tensor, got {call.tensor.dtype}")
    return groups, factors.get(rank, 1.0), factors


class AllReduceHandle:
    """A queued call (:meth:`Runtime.start`): ``wait()`` returns the :class:`RunRecord` or raises;
    ``future`` is a ``torch.futures.Future`` holding the tensor (for DDP comm hooks)."""

    __slots__ = ("_done", "future")

    def __init__(self, tensor: torch.Tensor, done: concurrent.futures.Future[RunRecord]) -> None:
        self._done = done
        self.future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

        def finish(result: concurrent.futures.Future[RunRecord]) -> None:
            error = result.exception()
            if error is None:
                self.future.set_result(tensor)
            else:
                self.future.set_exception(error)  # type: ignore[arg-type]

        done.add_done_callback(finish)

    def wait(self, timeout: float | None = None) -> RunRecord:
        return self._done.result(timeout)

    def is_completed(self) -> bool:
        return self._done.done()

    def exception(self) -> BaseException | None:
        """The call's error (waits for it to finish)."""
        return self._done.exception()
