"""``stragglerkit.all_reduce``: an in-place AllReduce that runs any checked schedule.

Policy and validation live here; the C++ executor only runs a checked plan.

* **Choosing.** ``algorithm="auto"`` follows a simple documented rule until the cost model takes
  over: ``stragglar`` when a straggler is given and StragglAR applies, else ``optcc`` when
  slowdowns are given and OptCC applies, else ``rhd`` for buckets with fewer elements than ranks
  (latency-bound: fewest rounds), else ``ring``. An explicitly named algorithm that does not apply
  (e.g. StragglAR with an odd world size) falls back to what ``auto`` picks for the situation, with
  one :class:`FallbackWarning` per (algorithm, reason) saying which and why. Every plan works for
  any bucket size, ``0`` and fewer elements than chunks included.
* **Plans** are generated through :func:`stragglerkit.schedules.registry.generate`, proven by
  :func:`stragglerkit.schedules.check`, lowered (:mod:`stragglerkit.runtime.plan`) and cached per
  (algorithm, world size, numel, dtype, device type, rank map, straggler, slowdowns, op).
* **Validation** before anything moves: a dense, contiguous tensor of a supported dtype and a
  supported op, checked locally (``ValueError``; the other ranks are told and raise
  :class:`StragglerKitError` instead of waiting). Size or dtype differences *between* ranks are
  caught by the executor's header exchange, on every rank, before data moves between the pair.
* **Results** are bit-identical on every rank: each chunk is reduced along one tree and then
  copied. ``avg`` on CPU divides inside the reductions that finish a chunk's sum (no extra pass
  over the tensor; the bits are those of the sum followed by ``div_(n)``); on CUDA it divides the
  finished sum once on every rank.

Example::

    import stragglerkit
    stragglerkit.all_reduce(grad)                                  # ring
    stragglerkit.all_reduce(grad, algorithm="stragglar", straggler=3)
    handle = stragglerkit.all_reduce_async(grad, op="avg")
    handle.wait()
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import threading
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from stragglerkit.errors import StragglerKitError
from stragglerkit.report import nvtx
from stragglerkit.runtime import settings
from stragglerkit.runtime.executor import (
    OpTiming,
    OpTimings,
    concurrent_waits,
    duplex_group,
    is_default_gloo_group,
    notify_local_failure,
    run_plan,
)
from stragglerkit.runtime.ordering import in_round_order
from stragglerkit.runtime.plan import RankPlan, lower, plan_id
from stragglerkit.runtime.remap import RankMap
from stragglerkit.runtime.send_buffer import (
    BoundedConnections,
    new_group_with_send_buffer,
    optcc_send_buffer_from_env,
    send_buffer_from_env,
)
from stragglerkit.schedules import Schedule, check
from stragglerkit.schedules.registry import Situation, generate, names, why_not
from stragglerkit.units import parse_size, parse_switch

__all__ = [
    "OPS",
    "SUPPORTED_DTYPES",
    "AllReduceHandle",
    "FallbackWarning",
    "RunRecord",
    "Runtime",
    "all_reduce",
    "all_reduce_async",
    "choose_algorithm",
    "optcc_bubble_filling",
    "optcc_segments",
    "optcc_situation",
    "optcc_sizing",
    "runtime_for",
    "slow_nic_algorithm",
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
        label_of = self.plan.ops[:, 5].tolist()
        return [(labels[label_of[t.op]], t) for t in self.timings.records()]


def choose_algorithm(requested: str, situation: Situation, numel: int, element_size: int = 4) -> tuple[str, str | None]:
    """Return ``(algorithm, why_fallback)``; ``why_fallback`` is ``None`` when ``requested`` runs.

    ``auto``: StragglAR for a straggler (where it applies), for degraded NICs the faster of OptCC
    and the balanced ring (:func:`slow_nic_algorithm`), rhd for tensors of fewer elements than
    ranks, else ring.

    Example::

        choose_algorithm("stragglar", Situation(world_size=5, straggler=1), 1000)
        # -> ("ring", "stragglar does not apply: it needs an even world size ...; running ring instead")
    """
    if requested == "auto":
        return _auto(situation, numel, element_size), None
    if requested not in names():
        raise ValueError(f"unknown algorithm {requested!r}; choose 'auto' or one of {', '.join(names())}")
    reason = why_not(requested, situation)
    if reason is None:
        return requested, None
    fallback = _auto(situation, numel, element_size)
    return fallback, f"{requested} does not apply: it {reason}; running {fallback} instead"


OPTCC_MESSAGE_BYTES = 512 * 1024
"""OptCC's pipeline segments are chosen so that its messages are about this large (or larger)."""


OPTCC_MIN_SEGMENTS = 3
"""... but at least this many segments while messages stay at least ``OPTCC_SMALLEST_MESSAGE_BYTES``."""
OPTCC_SMALLEST_MESSAGE_BYTES = 128 * 1024


def optcc_segments(nbytes: int, world_size: int, most: int = 64) -> int:
    """OptCC's segment count k for a bucket of ``nbytes``: messages of about 512 KiB, 1 <= k <= ``most``.

    More segments shorten the pipeline's fill (time ``l·n·(k+1)/k``) but every segment is a round
    of messages, and each message costs a fixed overhead (latency, a wake-up of the receiving
    rank); at 64 segments a 32 MiB bucket on 8 ranks is cut into 75 KiB messages. With one
    segment the fill doubles the time and OptCC loses to a ring, so a bucket gets at least 3
    segments as long as its messages stay at least 128 KiB (8 ranks, one NIC at 1/2, 6.7 MiB on
    the emulated cluster: 1 segment 282 ms, 2-3 segments 206-210 ms, gloo 207 ms).

    Example::

        optcc_segments(32 * 2**20, 8)   # 9
        optcc_segments(7 * 2**20, 8)    # 3
    """
    message_bytes = optcc_message_bytes()
    per_segment = (world_size - 1) * max(message_bytes, 1)
    floor = min(OPTCC_MIN_SEGMENTS, nbytes // ((world_size - 1) * OPTCC_SMALLEST_MESSAGE_BYTES))
    return max(1, min(most, max(nbytes // per_segment, floor)))


BUBBLE_FILLING_MIN_GAIN = 0.01
"""The least simulated gain (a fraction of the plan's time without fills) for which the runtime
fills. The fills put flows to and from the slow rank on the healthy ranks' links next to their
ring hops, and TCP shares a link less evenly than the simulator's max-min share; measured on the
emulated cluster (8 ranks, l = 8/7, ``profiling/bench_bubble_filling.sh``), fills cost 5 % at
k = 9 where the simulator gave them 0.2 % (against equal segments without fills, before the
ramp; against the ramped plan it gives them nothing there), and at k = 36, 250 Mbit/s, they gained
3.7 % over the ramped plan (7.6 % over fault-free gloo against 11.6 %, two launches each;
``profiling/results/bubble_filling_ramp/``) where the simulator gives them 1.9 %."""

BUBBLE_FILLING_SIMULATED_MAX = 16 * 16 * 64
"""Largest ``p²k`` for which :func:`optcc_bubble_filling` simulates both plans (the simulation's cost
grows about so: 0.4 s at p = 8, k = 9; 1.1 s at p = 16, k = 64; 12 s at p = 64, k = 64 on one core here)."""


def optcc_bubble_filling(
    world_size: int, slowdowns: Mapping[int, float], segments: int, gpus_per_server: int = 1
) -> bool:
    """Does OptCC's bubble filling make this plan faster? The flow-level simulator (no per-message
    cost, which only adds to the fills' cost) times the plan with and without fills on a network
    with these slowdowns; fills are used only where they are faster by at least
    :data:`BUBBLE_FILLING_MIN_GAIN`: deep pipelines with ``l`` well below 2 (schedules/optcc.py,
    "When filling pays"). Plans without a fill to choose (``l >= 2``, several degraded ranks,
    several GPUs per server) keep the default; plans too large to simulate at once (``p²k`` above
    :data:`BUBBLE_FILLING_SIMULATED_MAX`, about 1 s here: p = 16, k = 64) run without fills, which
    at p = 16 gain at most 0.98 % in simulation. Cached per arguments.
    ``STRAGGLERKIT_OPTCC_BUBBLE_FILLING=on`` or ``off`` overrides the decision for every plan
    (``auto``, the default, decides as above).

    Example::

        optcc_bubble_filling(8, {3: 1.97}, segments=9)    # False: the fills' head costs more
        optcc_bubble_filling(8, {3: 8 / 7}, segments=9)   # False: no gain over the plan with its ramp
        optcc_bubble_filling(8, {3: 8 / 7}, segments=18)  # False: they gain 0.7 %, below the 1 % asked
        optcc_bubble_filling(8, {3: 8 / 7}, segments=36)  # True: they gain 1.9 %
    """
    setting = optcc_bubble_filling_setting()
    if setting != "auto":
        return setting == "on"
    degraded = tuple(sorted((rank, float(slowdown)) for rank, slowdown in slowdowns.items() if slowdown > 1.0))
    return _bubble_filling_pays(world_size, degraded, segments, gpus_per_server, optcc_sizing())


def optcc_bubble_filling_setting() -> str:
    """``STRAGGLERKIT_OPTCC_BUBBLE_FILLING``: ``auto`` (unset: the simulator decides), ``on`` or ``off``."""
    text = os.environ.get("STRAGGLERKIT_OPTCC_BUBBLE_FILLING", "").strip().lower()
    if text in ("", "auto"):
        return "auto"
    switch = parse_switch(text)
    if switch is not None:
        return "on" if switch else "off"
    raise StragglerKitError(
        f"STRAGGLERKIT_OPTCC_BUBBLE_FILLING={text!r} is not auto, on or off "
        "(whether OptCC fills the slow rank's idle time with a point-to-point AllReduce; unset: auto)"
    )


@functools.lru_cache(maxsize=256)
def _bubble_filling_pays(
    world_size: int, degraded: tuple[tuple[int, float], ...], segments: int, gpus_per_server: int, sizing: str
) -> bool:
    if len(degraded) != 1 or gpus_per_server != 1 or degraded[0][1] >= 2.0:
        return True
    if world_size * world_size * segments > BUBBLE_FILLING_SIMULATED_MAX:
        # simulating both plans would stall the first call for seconds; at p = 16, the largest
        # simulated, no plan gains the margin (at most 0.98 %, at k = 64; optcc_bubble_filling.json)
        return False
    from stragglerkit.schedules.optcc import optcc

    slowdowns = dict(degraded)
    filled = _bandwidth_only_seconds(optcc(world_size, slowdowns, segments, sizing=sizing), slowdowns)
    unfilled = _bandwidth_only_seconds(
        optcc(world_size, slowdowns, segments, bubble_filling=False, sizing=sizing), slowdowns
    )
    return bool(filled < (1.0 - BUBBLE_FILLING_MIN_GAIN) * unfilled)


def _bandwidth_only_seconds(schedule: Schedule, slowdowns: Mapping[int, float]) -> float:
    """Simulated time from the last arrival without a per-message cost, for comparing two plans:
    the ratio of two such times does not depend on the size or the bandwidth."""
    from stragglerkit.sim.simulator import Network, simulate

    network = Network.uniform(schedule.world_size, alpha=0.0, bandwidth=1e9, slowdowns=dict(slowdowns))
    return simulate(schedule, 1e9, network).time_from_last_arrival


def slow_nic_algorithm(situation: Situation, nbytes: int) -> str:
    """For degraded NICs: ``optcc`` or ``balanced_ring``, whichever the flow-level simulator (no
    per-message cost) finds faster for the plans the runtime would run on a bucket of ``nbytes``.

    The balanced ring wins where ``l`` is near 1 (p = 8: below about 1.3; schedules/balanced_ring.py):
    it loses only what the slow links must carry, while OptCC pays its pipeline's head and tail.
    Not simulated (OptCC, the paper's algorithm, is kept): buckets whose balanced ring would send
    messages under :data:`OPTCC_SMALLEST_MESSAGE_BYTES` (the per-message cost the comparison
    leaves out would decide), several GPUs per server, and plans above
    :data:`BUBBLE_FILLING_SIMULATED_MAX` (``p²k``), where the simulation would stall the first
    call for seconds. Cached per world size, degraded ranks and OptCC's segment count.

    Example::

        slow_nic_algorithm(Situation(world_size=8, slowdowns={3: 8 / 7}), 32 * 2**20)  # 'balanced_ring'
        slow_nic_algorithm(Situation(world_size=8, slowdowns={3: 2.0}), 32 * 2**20)    # 'optcc'
    """
    from stragglerkit.schedules.balanced_ring import balanced_shares, default_slices

    degraded = tuple(sorted((rank, float(slow)) for rank, slow in situation.slowdowns.items() if slow > 1.0))
    if why_not("optcc", situation) is not None:
        return "balanced_ring"
    shares = balanced_shares([situation.slowdowns.get(r, 1.0) for r in range(situation.world_size)])
    if nbytes * min(shares) / default_slices(shares) < OPTCC_SMALLEST_MESSAGE_BYTES:
        return "optcc"  # the per-message cost, which the comparison leaves out, would decide
    optcc_plan = optcc_situation(situation, nbytes)
    return _faster_for_slow_nics(
        situation.world_size,
        degraded,
        optcc_plan.segments,
        optcc_plan.bubble_filling,
        situation.gpus_per_server,
        optcc_plan.optcc_sizing,
    )


@functools.lru_cache(maxsize=256)
def _faster_for_slow_nics(
    world_size: int,
    degraded: tuple[tuple[int, float], ...],
    segments: int,
    bubble_filling: bool,
    gpus_per_server: int,
    sizing: str,
) -> str:
    if gpus_per_server != 1 or world_size * world_size * segments > BUBBLE_FILLING_SIMULATED_MAX:
        return "optcc"
    from stragglerkit.schedules.balanced_ring import balanced_ring
    from stragglerkit.schedules.optcc import optcc

    slowdowns = dict(degraded)
    pipeline = _bandwidth_only_seconds(
        optcc(world_size, slowdowns, segments, bubble_filling=bubble_filling, sizing=sizing), slowdowns
    )
    ring = _bandwidth_only_seconds(balanced_ring(world_size, slowdowns), slowdowns)
    return "balanced_ring" if ring < pipeline else "optcc"


def optcc_situation(situation: Situation, nbytes: int) -> Situation:
    """``situation`` with the OptCC segments, bubble filling and chunk sizing the runtime uses for a
    bucket of ``nbytes`` (:func:`optcc_segments`, :func:`optcc_bubble_filling`, :func:`optcc_sizing`);
    the cost model and the bench build their predictions from the same."""
    segments = optcc_segments(nbytes, situation.world_size)
    filling = optcc_bubble_filling(situation.world_size, situation.slowdowns, segments, situation.gpus_per_server)
    return dataclasses.replace(situation, segments=segments, bubble_filling=filling, optcc_sizing=optcc_sizing())


def optcc_sizing() -> str:
    """``STRAGGLERKIT_OPTCC_SIZING``: how OptCC sizes its chunks (schedules/optcc.py, "Sizes by linear
    programming"): ``auto`` (unset: the LP's sizes where the model says they gain at least
    ``LP_MIN_GAIN``, else the closed form), ``closed_form`` (equal sections, or the ramp) or ``lp``.
    The same on every rank. With OptCC's connections bounded at 128 KiB while it runs
    (``STRAGGLERKIT_OPTCC_SEND_BUFFER``) the LP's sizes with fills measured 8.0 % over fault-free gloo
    at l = 8/7 on the emulated cluster against 14.1 % for the closed form (docs/bench.md)."""
    from stragglerkit.schedules.optcc import SIZINGS

    text = os.environ.get("STRAGGLERKIT_OPTCC_SIZING", "").strip().lower() or "auto"
    if text not in SIZINGS:
        raise StragglerKitError(
            f"STRAGGLERKIT_OPTCC_SIZING={text!r} is not one of {', '.join(SIZINGS)} "
            "(how OptCC sizes its chunks; unset: auto)"
        )
    return text


def optcc_message_bytes() -> int:
    """``STRAGGLERKIT_OPTCC_MESSAGE_BYTES`` (a size, e.g. ``128KiB``), else :data:`OPTCC_MESSAGE_BYTES`."""
    text = os.environ.get("STRAGGLERKIT_OPTCC_MESSAGE_BYTES", "").strip()
    if not text:
        return OPTCC_MESSAGE_BYTES
    try:
        size = parse_size(text)
    except ValueError:
        size = 0
    if size < 1:
        raise StragglerKitError(
            f"STRAGGLERKIT_OPTCC_MESSAGE_BYTES={text!r} is not a positive size; give e.g. 512KiB "
            "(the bytes of one OptCC message; unset for the default)"
        )
    return size


def _auto(situation: Situation, numel: int, element_size: int) -> str:
    if situation.straggler is not None and why_not("stragglar", situation) is None:
        return "stragglar"
    if any(slow > 1.0 for slow in situation.slowdowns.values()) and situation.world_size >= 3:
        return slow_nic_algorithm(situation, numel * element_size)
    if numel < situation.world_size:
        return "rhd"
    return "ring"


def _validate_tensor(tensor: object, op: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"all_reduce takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout is not torch.strided:
        raise ValueError(
            f"all_reduce needs a dense tensor, got layout {tensor.layout}; convert it with tensor.to_dense()"
        )
    if not tensor.is_contiguous():
        raise ValueError(
            "all_reduce needs a contiguous tensor (it reduces in place); pass t = tensor.contiguous() and copy "
            "the result back with tensor.copy_(t)"
        )
    if tensor.dtype not in SUPPORTED_DTYPES:
        supported = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise ValueError(f"all_reduce does not support dtype {tensor.dtype}; supported: {supported}")
    if op not in OPS:
        raise ValueError(f"unsupported op {op!r}; stragglerkit.all_reduce supports {', '.join(OPS)}")
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError(f"op 'avg' needs a floating-point tensor, got {tensor.dtype}; use op='sum' and divide")


@dataclass(slots=True)
class _CachedPlan:
    plan: RankPlan
    plan_id: int
    scratch: dict[torch.device, torch.Tensor] = field(default_factory=dict)

    def scratch_for(self, like: torch.Tensor) -> torch.Tensor:
        scratch = self.scratch.get(like.device)
        if scratch is None or scratch.dtype != like.dtype:
            scratch = torch.empty(self.plan.scratch_numel, dtype=like.dtype, device=like.device)
            self.scratch[like.device] = scratch
        return scratch


class AllReduceHandle:
    """A pending :func:`all_reduce_async`: ``wait()`` returns the :class:`RunRecord` or raises;
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


class Runtime:
    """Runs AllReduces on one process group with a plan cache, a rank map and an in-order queue.

    Example::

        rt = Runtime(group=None, timeout=60.0)
        rt.all_reduce(tensor, algorithm="ring")
    """

    __slots__ = (
        "_cache",
        "_lock",
        "_pending",
        "_schedules",
        "_send_buffer",
        "_worker",
        "cache_size",
        "connections",
        "data_group",
        "group",
        "rank_map",
        "reverse_group",
        "timeout",
        "warned",
    )

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        timeout: float = 300.0,
        rank_map: Sequence[int] | None = None,
        cache_size: int = 64,
    ) -> None:
        if not dist.is_initialized():
            raise StragglerKitError("torch.distributed is not initialised: call dist.init_process_group first")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout}")
        self.group = group if group is not None else dist.distributed_c10d._get_default_group()
        self.timeout = float(timeout)
        self.rank_map = RankMap.from_sequence(rank_map, self.group.size())
        self.cache_size = cache_size
        self.warned: set[str] = set()
        self._cache: OrderedDict[tuple[object, ...], _CachedPlan] = OrderedDict()
        self._schedules: OrderedDict[tuple[object, ...], Schedule] = OrderedDict()
        self._lock = threading.Lock()
        self._pending = 0
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        for name, close in settings.unknown() if self.group.rank() == 0 else ():  # once, not once per rank
            hint = f" (did you mean {close}?)" if close else ""
            warnings.warn(f"{name} is not a stragglerkit setting{hint}; it has no effect", UserWarning, stacklevel=3)
        if self.group.size() > 1 and dist.get_backend(self.group) == "gloo":
            # collective: a rank with a bad or different value is named on every rank, instead of
            # the others waiting for it in a group creation below or a header check later
            settings.check_across_ranks(self.group)
        else:
            settings.check_local()
        duplex = settings.duplex_enabled()
        send_buffer = send_buffer_from_env()
        self._send_buffer = send_buffer or 0
        self.data_group = self.group
        """The group the executor's messages (lower to higher ranks), headers and abort notes use:
        one of the runtime's own with a bounded send buffer (gloo, default group: runtime/send_buffer.py),
        else ``group``."""
        self.reverse_group: dist.ProcessGroup | None = None
        """Second group for messages from higher to lower ranks (gloo, default group; see duplex_group)."""
        self.connections: BoundedConnections | None = None
        """The connections whose send buffer this runtime bounds (None with ``STRAGGLERKIT_TCP_SEND_BUFFER=off``
        or a group other than the default gloo one): at ``send_buffer`` bytes, and at
        ``STRAGGLERKIT_OPTCC_SEND_BUFFER`` while an OptCC plan runs (runtime/send_buffer.py)."""
        if send_buffer is not None and self.group.size() > 1 and is_default_gloo_group(self.group):
            # data travels over two groups of the runtime's own (one per direction), whose
            # connections queue at most ``send_buffer`` bytes each (runtime/send_buffer.py)
            self.data_group, self.connections = new_group_with_send_buffer(send_buffer)
            if duplex:
                self.reverse_group, reverse = new_group_with_send_buffer(send_buffer)
                self.connections += reverse
        elif duplex and self.group.size() > 1:
            self.reverse_group = duplex_group(self.group)

    # -- public ---------------------------------------------------------------------------------
    @property
    def send_buffer_connections(self) -> int:
        """How many connections this runtime bounds (0 with ``STRAGGLERKIT_TCP_SEND_BUFFER=off``)."""
        return len(self.connections) if self.connections is not None else 0

    def set_rank_map(self, ranks: Sequence[int] | None) -> None:
        """Use ``ranks[logical] = group rank`` from the next call on (all ranks must agree)."""
        self.rank_map = RankMap.from_sequence(ranks, self.group.size())

    def all_reduce(
        self,
        tensor: torch.Tensor,
        algorithm: str = "auto",
        op: str = "sum",
        straggler: int | None = None,
        slowdowns: Mapping[int, float] | None = None,
    ) -> RunRecord:
        """In-place AllReduce; see :func:`stragglerkit.all_reduce`."""
        with self._lock:
            queued = self._pending > 0
        if queued:  # keep the call order of earlier asynchronous calls
            return self.all_reduce_async(tensor, algorithm, op, straggler, slowdowns).wait()
        return self._run(tensor, algorithm, op, straggler, slowdowns)

    def all_reduce_async(
        self,
        tensor: torch.Tensor,
        algorithm: str = "auto",
        op: str = "sum",
        straggler: int | None = None,
        slowdowns: Mapping[int, float] | None = None,
    ) -> AllReduceHandle:
        """Queue an in-place AllReduce; calls run one at a time in call order."""
        with self._lock:
            if self._worker is None:
                self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stragglerkit")
            self._pending += 1
        done = self._worker.submit(self._run_queued, tensor, algorithm, op, straggler, slowdowns)
        return AllReduceHandle(tensor, done)

    # -- internals ------------------------------------------------------------------------------
    def _run_queued(
        self,
        tensor: torch.Tensor,
        algorithm: str,
        op: str,
        straggler: int | None,
        slowdowns: Mapping[int, float] | None,
    ) -> RunRecord:
        try:
            return self._run(tensor, algorithm, op, straggler, slowdowns)
        finally:
            with self._lock:
                self._pending -= 1

    def _situation(self, straggler: int | None, slowdowns: Mapping[int, float] | None) -> Situation:
        n = self.group.size()
        logical_straggler = None
        if straggler is not None:
            if not 0 <= straggler < n:
                raise ValueError(f"straggler {straggler} is not a rank of this {n}-rank group")
            logical_straggler = self.rank_map.logical(straggler)
        logical_slowdowns: dict[int, float] = {}
        for rank, slowdown in (slowdowns or {}).items():
            if not 0 <= rank < n:
                raise ValueError(f"slowdowns name rank {rank}, which is not a rank of this {n}-rank group")
            if not slowdown >= 1.0:
                raise ValueError(f"slowdown of rank {rank} must be >= 1 (1 = healthy), got {slowdown}")
            logical_slowdowns[self.rank_map.logical(rank)] = float(slowdown)
        return Situation(world_size=n, straggler=logical_straggler, slowdowns=logical_slowdowns)

    def _run(
        self,
        tensor: torch.Tensor,
        algorithm: str,
        op: str,
        straggler: int | None,
        slowdowns: Mapping[int, float] | None,
    ) -> RunRecord:
        try:
            _validate_tensor(tensor, op)
            settings.check_local()  # a bad STRAGGLERKIT_* value fails here, where every rank hears of it
            situation = self._situation(straggler, slowdowns)
            chosen, why = choose_algorithm(algorithm, situation, tensor.numel(), tensor.element_size())
        except ValueError:
            device = tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")
            if self.group.size() > 1:
                notify_local_failure(self.data_group, device, algorithm)
            raise
        if why is not None and why not in self.warned:
            self.warned.add(why)
            warnings.warn(why, FallbackWarning, stacklevel=3)
        n = self.group.size()
        if n == 1:
            return RunRecord(algorithm, "none", OpTimings(torch.empty(0, 6, dtype=torch.int64)))
        if chosen == "optcc":
            situation = optcc_situation(situation, tensor.numel() * tensor.element_size())
        cached = self._plan(chosen, situation, tensor, op)
        if self.connections is not None:  # OptCC's sends hold their link as its timetable has them
            optcc_bound = optcc_send_buffer_from_env() if chosen == "optcc" else None
            self.connections.bound(optcc_bound or self._send_buffer)
        flat = tensor.view(-1)
        with nvtx.range(f"stragglerkit/all_reduce {chosen}"):
            timings = run_plan(
                self.data_group,
                flat,
                cached.scratch_for(flat),
                cached.plan,
                self.rank_map,
                cached.plan_id,
                self.timeout,
                self.reverse_group,
                concurrent_waits(self.data_group, flat, cached.plan, self.send_buffer_connections > 0),
            )
            if op == "avg" and not cached.plan.divides:
                tensor.div_(n)
        return RunRecord(algorithm, chosen, timings, cached.plan)

    def _plan(self, algorithm: str, situation: Situation, tensor: torch.Tensor, op: str) -> _CachedPlan:
        slowdowns = tuple(sorted(situation.slowdowns.items()))
        key = (
            algorithm,
            situation.world_size,
            tensor.numel(),
            tensor.dtype,
            tensor.device.type,
            self.rank_map.to_physical,
            situation.straggler,
            slowdowns,
            situation.segments,
            situation.bubble_filling,
            situation.optcc_sizing,
            op,
        )
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        schedule = self._schedule(algorithm, situation)
        logical_rank = self.rank_map.logical(self.group.rank())
        # CPU: the final reductions divide (plan.py); CUDA divides after the run, as torch's div_ rounds there
        divide_by = situation.world_size if op == "avg" and tensor.device.type == "cpu" else 0
        (plan,) = lower(
            schedule,
            tensor.numel(),
            tensor.element_size(),
            straggler=situation.straggler,
            ranks=[logical_rank],
            divide_by=divide_by,
        )
        # the chunk sizes too: ranks whose LP solvers disagreed must not exchange bytes
        sizes = zlib.crc32(repr(schedule.chunk_sizes).encode())
        ident = (
            f"{algorithm}|{situation.world_size}|{self.rank_map.to_physical}|{situation.straggler}|{slowdowns}"
            f"|{situation.segments}|{situation.bubble_filling}|{situation.optcc_sizing}|{sizes}|{op}"
        )
        cached = _CachedPlan(plan, plan_id(ident))
        self._cache[key] = cached
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return cached

    def _schedule(self, algorithm: str, situation: Situation) -> Schedule:
        """The generated and checked schedule (cached: it does not depend on the bucket)."""
        key = (
            algorithm,
            situation.world_size,
            situation.straggler,
            tuple(sorted(situation.slowdowns.items())),
            situation.segments,
            situation.bubble_filling,
            situation.optcc_sizing,
        )
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = in_round_order(generate(algorithm, situation))
            check(schedule)
            self._schedules[key] = schedule
            if len(self._schedules) > self.cache_size:
                self._schedules.popitem(last=False)
        else:
            self._schedules.move_to_end(key)
        return schedule


_RUNTIMES: dict[int, Runtime] = {}


def runtime_for(group: dist.ProcessGroup | None = None) -> Runtime:
    """The shared :class:`Runtime` of ``group`` (default: the default group)."""
    resolved = group if group is not None else dist.distributed_c10d._get_default_group()
    runtime = _RUNTIMES.get(id(resolved))
    if runtime is None or runtime.group is not resolved:
        runtime = Runtime(resolved)
        _RUNTIMES[id(resolved)] = runtime
    return runtime


def all_reduce(
    tensor: torch.Tensor,
    algorithm: str = "auto",
    group: dist.ProcessGroup | None = None,
    op: str = "sum",
    straggler: int | None = None,
    slowdowns: Mapping[int, float] | None = None,
) -> RunRecord:
    """In-place AllReduce of ``tensor`` over ``group``, like ``torch.distributed.all_reduce``.

    ``algorithm``: ``"auto"`` or a registered name (ring, rhd, direct, stragglar, optcc).
    ``straggler``: group rank known to arrive late; ``slowdowns``: group rank -> NIC slowdown l.
    Every rank must pass a tensor of the same size and dtype and the same arguments. Raises
    ``ValueError`` on bad arguments and :class:`StragglerKitError` on faults (with rank context).

    Example::

        stragglerkit.all_reduce(grad, algorithm="stragglar", straggler=3, op="avg")
    """
    return runtime_for(group).all_reduce(tensor, algorithm, op, straggler, slowdowns)


def all_reduce_async(
    tensor: torch.Tensor,
    algorithm: str = "auto",
    group: dist.ProcessGroup | None = None,
    op: str = "sum",
    straggler: int | None = None,
    slowdowns: Mapping[int, float] | None = None,
) -> AllReduceHandle:
    """Like :func:`all_reduce` but returns at once with an :class:`AllReduceHandle`.

    Example::

        handle = stragglerkit.all_reduce_async(bucket.buffer())
        return handle.future          # from a DDP comm hook
    """
    return runtime_for(group).all_reduce_async(tensor, algorithm, op, straggler, slowdowns)
