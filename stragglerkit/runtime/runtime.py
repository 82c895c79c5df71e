"""The runtime: runs in-place AllReduces of any checked schedule on one process group.

The choice and the plans are the planner's (:mod:`stragglerkit.planner`), the public functions
are in :mod:`stragglerkit.api`; this module validates a call, asks the planner which algorithm runs
and for its compiled plan, and hands that to the C++ executor.

* **The choice**: :func:`stragglerkit.planner.choose` with :attr:`Runtime.model`, the cost model
  the loop fitted once one was adopted (:meth:`Runtime.adopt_model`), else the default model: the
  same rule and the same model as the closed loop's controller.
* **Plans** are compiled by :func:`stragglerkit.planner.compile_plan` (generated, proven by the
  checker, lowered) and cached here per (algorithm, situation, numel, dtype, device type, rank
  map, op); the runtime compiles nothing itself.
* **Validation** before anything moves: a dense, contiguous tensor of a supported dtype and a
  supported op, checked locally (``ValueError``; the other ranks are told and raise
  :class:`~stragglerkit.errors.PeerError` naming this rank instead of waiting). Size or dtype
  differences *between* ranks are caught by the executor's header exchange, on every rank, before
  data moves between the pair.
* **Results** are bit-identical on every rank: each chunk is reduced along one tree and then
  copied. ``avg`` on CPU divides inside the reductions that finish a chunk's sum (no extra pass
  over the tensor; the bits are those of the sum followed by ``div_(n)``); on CUDA it divides the
  finished sum once on every rank.
* **Order**: calls run one at a time in call order; asynchronous ones on one worker thread, which
  records in the caller's torch.profiler while one runs on the calling thread (runtime/hooks.py).
* **Group calls** (``AllReduceCall.groups``): disjoint groups of ranks each sum among themselves,
  all at once, over the same group's point-to-point messages (schedules/group_ring.py); each
  member first multiplies its tensor by its weight, ranks in no group keep theirs. Every rank of
  the group makes the call (ranks in no group return at once), so calls stay numbered alike.

A call's arguments, their checks and what it returns are in :mod:`stragglerkit.runtime.calls`
(importable from here too).

Example::

    runtime = Runtime(group=None, config=Config())
    runtime.all_reduce(tensor, algorithm="ring")
"""

from __future__ import annotations

import concurrent.futures
import threading
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from stragglerkit.config import Config
from stragglerkit.errors import ConfigError, NotInitializedError
from stragglerkit.planner.choice import auto_baseline, choose, choose_algorithm
from stragglerkit.planner.compiled import CompiledPlan, compile_group_plan, compile_plan
from stragglerkit.planner.model import CostModelLike, Predictor
from stragglerkit.planner.policy import optcc_situation
from stragglerkit.planner.remap import RankMap
from stragglerkit.planner.tables import RankPlan
from stragglerkit.runtime import hooks
from stragglerkit.runtime.calls import (
    OPS,
    SUPPORTED_DTYPES,
    AllReduceCall,
    AllReduceHandle,
    FallbackWarning,
    RunRecord,
    group_arguments,
    validate_tensor,
)
from stragglerkit.runtime.executor import (
    OpTimings,
    concurrent_waits,
    duplex_group,
    is_gloo_group,
    notify_local_failure,
    run_plan,
)
from stragglerkit.runtime.send_buffer import BoundedConnections, new_group_with_send_buffer
from stragglerkit.schedules.registry import Situation
from stragglerkit.sim.cost_model import CostModelParams

__all__ = ["OPS", "SUPPORTED_DTYPES", "AllReduceCall", "AllReduceHandle", "FallbackWarning", "RunRecord", "Runtime"]


@dataclass(slots=True)
class _CachedPlan:
    compiled: CompiledPlan
    scratch: dict[torch.device, torch.Tensor] = field(default_factory=dict)

    @property
    def plan(self) -> RankPlan:
        return self.compiled.plan

    @property
    def plan_id(self) -> int:
        return self.compiled.plan_id

    def scratch_for(self, like: torch.Tensor) -> torch.Tensor:
        scratch = self.scratch.get(like.device)
        if scratch is None or scratch.dtype != like.dtype:
            scratch = torch.empty(self.plan.scratch_numel, dtype=like.dtype, device=like.device)
            self.scratch[like.device] = scratch
        return scratch


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
        "_send_buffer",
        "_worker",
        "cache_size",
        "config",
        "config",
        "connections",
        "data_group",
        "group",
        "last_run",
        "model",
        "rank_map",
        "reverse_group",
        "timeout",
        "warned",
    )

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        config: Config | None = None,
        rank_map: Sequence[int] | None = None,
        cache_size: int = 64,
    ) -> None:
        if not dist.is_initialized():
            raise NotInitializedError("torch.distributed is not initialised: call dist.init_process_group first")
        if config is not None and not isinstance(config, Config):
            raise ConfigError(f"config must be a stragglerkit.Config, got {type(config).__name__}")
        self.config = config if config is not None else Config()
        self.group = group if group is not None else dist.distributed_c10d._get_default_group()
        self.timeout = self.config.executor.timeout
        self.rank_map = RankMap.from_sequence(rank_map, self.group.size())
        self.cache_size = cache_size
        self.warned: set[str] = set()
        self.last_run: RunRecord | None = None
        """What the last completed call on this rank ran (set before its handle completes)."""
        self._cache: OrderedDict[tuple[object, ...], _CachedPlan] = OrderedDict()
        self.model: CostModelLike | None = None
        """The cost model ``auto`` chooses with: the loop's fitted one once adopted
        (:meth:`adopt_model`), else the default model (:data:`~stragglerkit.planner.model.DEFAULT_PRIOR`)."""
        self._lock = threading.Lock()
        self._pending = 0
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        send_buffer = self.config.executor.send_buffer
        self._send_buffer = send_buffer or 0
        self.data_group = self.group
        """The group the executor's messages (lower to higher ranks), headers and abort notes use:
        one of the runtime's own with a bounded send buffer (gloo: runtime/send_buffer.py),
        else ``group``."""
        self.reverse_group: dist.ProcessGroup | None = None
        """Second group for messages from higher to lower ranks (gloo; see duplex_group)."""
        self.connections: BoundedConnections | None = None
        """The connections whose send buffer this runtime bounds (None with ``executor.send_buffer``
        off or a group that is not gloo): at ``executor.send_buffer`` bytes, and at
        ``optcc.send_buffer`` while an OptCC plan runs (runtime/send_buffer.py)."""
        if send_buffer is not None and self.group.size() > 1 and is_gloo_group(self.group):
            # data travels over two groups of the runtime's own (one per direction), whose
            # connections queue at most ``send_buffer`` bytes each (runtime/send_buffer.py)
            self.data_group, self.connections = new_group_with_send_buffer(send_buffer, self.group)
            self.reverse_group, reverse = new_group_with_send_buffer(send_buffer, self.group)
            self.connections += reverse
        elif self.group.size() > 1:
            self.reverse_group = duplex_group(self.group)

    # -- public ---------------------------------------------------------------------------------
    @property
    def send_buffer_connections(self) -> int:
        """How many connections this runtime bounds (0 with ``executor.send_buffer`` off)."""
        return len(self.connections) if self.connections is not None else 0

    def close(self) -> None:
        """Finish the queued calls and stop the worker thread (the groups stay the user's to destroy)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=True)

    def adopt_model(self, model: CostModelLike | CostModelParams | None) -> None:
        """Choose ``auto``'s algorithms with ``model`` from the next call on: a cost model, or
        fitted parameters (predicted with :class:`~stragglerkit.planner.model.Predictor`); ``None``
        goes back to the default model. Every rank adopts the same model at the same point of its
        calls (ranks that chose differently would run different plans)."""
        if isinstance(model, CostModelParams):
            model = Predictor(self.group.size(), model)
        self.model = model

    def _model(self) -> CostModelLike:
        if self.model is None:
            self.model = Predictor(self.group.size())
        return self.model

    def _rank_map_for(self, ranks: Sequence[int] | None) -> RankMap:
        return self.rank_map if ranks is None else RankMap.from_sequence(ranks, self.group.size())

    def all_reduce(
        self,
        tensor: torch.Tensor,
        algorithm: str = "auto",
        op: str = "sum",
        straggler: int | None = None,
        slowdowns: Mapping[int, float] | None = None,
        rank_map: Sequence[int] | None = None,
    ) -> RunRecord:
        """In-place AllReduce, blocking; see :class:`AllReduceCall` for the arguments."""
        return self.run(AllReduceCall(tensor, algorithm, op, straggler, slowdowns, rank_map))

    def run(self, call: AllReduceCall) -> RunRecord:
        """Run ``call`` on this thread, after the queued calls if there are any (call order is kept)."""
        with self._lock:
            queued = self._pending > 0
        if queued:
            return self.start(call).wait()
        return self._run(call, self._rank_map_for(call.rank_map))

    def start(self, call: AllReduceCall) -> AllReduceHandle:
        """Queue ``call`` and return at once; calls run one at a time in call order, and the rank
        map is fixed when the call is queued."""
        ranks = self._rank_map_for(call.rank_map)
        with self._lock:
            if self._worker is None:
                self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stragglerkit")
            self._pending += 1
        done = self._worker.submit(self._run_queued, call, ranks, hooks.ranges.thread_state())
        return AllReduceHandle(call.tensor, done)

    # -- internals ------------------------------------------------------------------------------
    def _run_queued(self, call: AllReduceCall, ranks: RankMap, profiler_state: object | None) -> RunRecord:
        try:
            if profiler_state is not None:  # the caller's torch.profiler records this call's ranges too
                return hooks.ranges.call_under(profiler_state, lambda: self._run(call, ranks))
            return self._run(call, ranks)
        finally:
            with self._lock:
                self._pending -= 1

    def _situation(self, straggler: int | None, slowdowns: Mapping[int, float] | None, ranks: RankMap) -> Situation:
        n = self.group.size()
        logical_straggler = None
        if straggler is not None:
            if not 0 <= straggler < n:
                raise ConfigError(f"straggler {straggler} is not a rank of this {n}-rank group")
            logical_straggler = ranks.logical(straggler)
        logical_slowdowns: dict[int, float] = {}
        for rank, slowdown in (slowdowns or {}).items():
            if not 0 <= rank < n:
                raise ConfigError(f"slowdowns name rank {rank}, which is not a rank of this {n}-rank group")
            if not slowdown >= 1.0:
                raise ConfigError(f"slowdown of rank {rank} must be >= 1 (1 = healthy), got {slowdown}")
            logical_slowdowns[ranks.logical(rank)] = float(slowdown)
        return Situation(world_size=n, straggler=logical_straggler, slowdowns=logical_slowdowns)

    def _run(self, call: AllReduceCall, ranks: RankMap) -> RunRecord:
        if call.groups is not None or call.weights is not None:
            return self._run_groups(call, ranks)
        tensor, algorithm, op = call.tensor, call.algorithm, call.op
        try:
            validate_tensor(tensor, op)
            situation = self._situation(call.straggler, call.slowdowns, ranks)
            if self.group.size() == 1:  # the name is checked; nothing is chosen for one rank
                chosen, why = choose_algorithm(algorithm, situation, tensor.numel(), tensor.element_size())
            else:
                choice = choose(
                    situation,
                    tensor.numel() * tensor.element_size(),
                    self._model(),
                    requested=algorithm,
                    baseline=auto_baseline(tensor.numel(), self.group.size()),
                    min_gain=self.config.detection.min_gain,
                )
                chosen, why = choice.algorithm, choice.why_fallback
        except ValueError:
            device = tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")
            if self.group.size() > 1:
                notify_local_failure(self.data_group, device, algorithm)
            raise
        n = self.group.size()
        if n == 1:  # nothing to exchange, whatever was asked for: no fallback to warn of
            self.last_run = RunRecord(algorithm, "none", OpTimings(torch.empty(0, 6, dtype=torch.int64)))
            return self.last_run
        if why is not None and why not in self.warned:
            self.warned.add(why)
            warnings.warn(why, FallbackWarning, stacklevel=3)
        if chosen == "optcc":
            situation = optcc_situation(situation, tensor.numel() * tensor.element_size())
        cached = self._plan(chosen, situation, tensor, op, ranks)
        if self.connections is not None:  # OptCC's sends hold their link as its timetable has them
            optcc_bound = self.config.optcc.send_buffer if chosen == "optcc" else None
            self.connections.bound(optcc_bound or self._send_buffer)
        with hooks.ranges.range(hooks.ALL_REDUCE, chosen):
            timings = self._execute(tensor, cached, ranks, cached.plan_id)
            if op == "avg" and not cached.plan.divides:
                tensor.div_(n)
        self.last_run = RunRecord(algorithm, chosen, timings, cached.plan)
        return self.last_run

    def _run_groups(self, call: AllReduceCall, ranks: RankMap) -> RunRecord:
        """A group AllReduce (``call.groups``): validate, scale by this rank's weight, run."""
        tensor, n = call.tensor, self.group.size()
        try:
            validate_tensor(tensor, call.op)
            groups, factor, factors = group_arguments(call, n, self.group.rank())
        except ValueError:
            device = tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")
            if n > 1:
                notify_local_failure(self.data_group, device, "group_ring")
            raise
        if factor != 1.0:
            tensor.mul_(factor)
        if n == 1:
            self.last_run = RunRecord(call.algorithm, "none", OpTimings(torch.empty(0, 6, dtype=torch.int64)))
            return self.last_run
        logical = tuple(tuple(ranks.logical(rank) for rank in group) for group in groups)
        key = ("group_ring", logical, tensor.numel(), tensor.dtype, tensor.device.type, ranks.to_physical)
        cached = self._cached(
            key,
            lambda: _CachedPlan(
                compile_group_plan(groups, tensor.numel(), tensor.element_size(), ranks, self.group.rank())
            ),
        )
        if self.connections is not None:
            self.connections.bound(self._send_buffer)
        # the weights are in the id too: members that were given different weights are told so
        weights = zlib.crc32(repr(sorted(factors.items())).encode())
        with hooks.ranges.range(hooks.ALL_REDUCE, "group_ring"):
            timings = self._execute(tensor, cached, ranks, cached.plan_id ^ weights)
        self.last_run = RunRecord(call.algorithm, "group_ring", timings, cached.plan)
        return self.last_run

    def _plan(self, algorithm: str, situation: Situation, tensor: torch.Tensor, op: str, ranks: RankMap) -> _CachedPlan:
        """The compiled plan for this call (:func:`stragglerkit.planner.compile_plan`), cached."""
        key = (algorithm, situation.key(), tensor.numel(), tensor.dtype, tensor.device.type, ranks.to_physical, op)
        # CPU: the final reductions divide (planner/lowering.py); CUDA divides after the run (torch's div_ rounds there)
        divide_by = situation.world_size if op == "avg" and tensor.device.type == "cpu" else 0
        return self._cached(
            key,
            lambda: _CachedPlan(
                compile_plan(
                    algorithm, situation, tensor.numel(), tensor.element_size(), ranks, self.group.rank(), divide_by, op
                )
            ),
        )

    def _cached(self, key: tuple[object, ...], build: Callable[[], _CachedPlan]) -> _CachedPlan:
        """The plan cached under ``key`` (most recently used now), else ``build()``'s, kept; the
        least recently used plan goes beyond ``cache_size``."""
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        cached = self._cache[key] = build()
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return cached

    def _execute(self, tensor: torch.Tensor, cached: _CachedPlan, ranks: RankMap, ident: int) -> OpTimings:
        """Run ``cached``'s plan on ``tensor`` in place under plan id ``ident``; this rank's timings."""
        flat = tensor.view(-1)
        return run_plan(
            self.data_group,
            flat,
            cached.scratch_for(flat),
            cached.plan,
            ranks,
            ident,
            self.timeout,
            self.reverse_group,
            concurrent_waits(self.data_group, flat, cached.plan, self.send_buffer_connections > 0),
        )
