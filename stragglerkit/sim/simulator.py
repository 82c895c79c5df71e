"""Flow-level simulator of a Schedule on a network of per-rank NICs.

The model (one paragraph per rule; :mod:`stragglerkit.sim.graph` derives the constraints):

* Each rank starts at its *arrival* time (default 0 for all). An op starts when its dependencies
  are done and its rank has arrived.
* Sends and receives on one ordered rank pair are posted in program order (the executor's rule,
  see ``check.py``) and travel over one connection, one message after another.
* By default (``sync_rounds=True``) a rank runs the sends and receives of a round only after those
  of its previous round completed, as the round-by-round implementations of these algorithms do
  (and as the alpha-beta analysis assumes); ``sync_rounds=False`` gives pure dataflow.
* A message starts when both sides are posted (and its connection is free), pays ``alpha``, then
  moves its bytes as a *flow* through the sender's transmit NIC and the receiver's receive NIC.
  Concurrent flows share every NIC direction max-min fairly (progressive filling), so a degraded
  rank (its NIC at ``bandwidth / l``) and an incast (several flows into one rank) slow things down.
* Servers (``gpus_per_server = g``, OptCC paper, App. E): ranks ``v·g .. v·g+g-1`` are the GPUs of
  server ``v``. A flow between two GPUs of one server goes over NVLink: it uses the sender's NVLink
  transmit port and the receiver's NVLink receive port (``nvlink_bandwidth`` each, by default
  ``g-1`` times the healthy NIC, the paper's assumption), never a NIC. A flow between servers uses
  the sender's own NIC and the receiver's own NIC: every GPU has a dedicated NIC (App. E, Fig. 13),
  not a share of a pooled server NIC; a degraded server is modelled by giving each of its GPUs'
  NICs the slowdown ``l`` (PXN spreads the loss evenly). NVLink ports are shared max-min fairly
  like NICs, and NVLink and NIC ports of one GPU are independent. ``g = 1`` is the plain model.
* Local ``reduce``/``copy`` ops take ``gamma`` seconds per byte reduced plus ``delta`` seconds per
  byte of memory traffic (both 0 by default: instantaneous); a ``recv_reduce`` pays the same after
  its transfer.

Two engines give the same answer where both apply:

* *contention-free* (vectorised): the earliest-start times of the task graph when every flow gets
  its whole path bandwidth ``min(tx[src], rx[dst])``. If in that timeline no two flows overlap on a
  NIC direction, it *is* the max-min fair timeline (a lone flow gets the full rate), and the
  simulator returns it. Round schedules with ``sync_rounds`` (at most one send and one receive per
  rank and round) are always in this case, so the overlap check is skipped for them; this is what
  makes n = 1024 affordable.
* *max-min events*: an event loop over message starts and flow completions; when a flow starts or
  ends, rates are recomputed by progressive filling only among the flows connected to it through
  shared NICs. Used when the contention-free timeline has sharing (or when asked for).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules.ir import Schedule
from stragglerkit.sim.graph import FloatArray, IntArray, TaskGraph, build_task_graph, longest_path
from stragglerkit.sim.network import Network
from stragglerkit.sim.ports import Ports, ports_shared

__all__ = ["Flow", "Network", "SimResult", "auto_delay", "simulate"]

_ENGINES = ("auto", "contention-free", "events")
_RECEIVE_CODES = (1, 2)
_RECV_REDUCE_CODE = 2


@dataclass(slots=True, frozen=True)
class Flow:
    """One message's transfer: bytes move from ``start`` (after alpha) to ``end``.

    Example::

        flow = simulate(ring(2), 1e6, net, record_flows=True).flows[0]   # Flow(src=0, dst=1, ...)
    """

    src: int
    dst: int
    start: float
    end: float
    bytes: float
    phase: str


@dataclass(slots=True, kw_only=True)
class SimResult:
    """What :func:`simulate` measured (times in seconds from time 0).

    Example::

        res = simulate(ring(4), 2**30, Network.uniform(4, alpha=3e-6, bandwidth=450e9), record_flows=True)
        res.makespan, res.completion[2], res.tx_busy[0], res.phase_done["allgather"], res.flows[0].end
    """

    completion: FloatArray
    """Per rank: when its last op completed (its arrival if it has none; inf if it never ran)."""
    arrivals: FloatArray
    first_arrival: float
    """Earliest arrival (ranks that never arrive are ignored)."""
    last_arrival: float
    """Latest finite arrival."""
    time_from_last_arrival: float
    """max(completion) - last arrival: the view of the StragglAR paper's Table 1 (inf if a rank never arrives)."""
    time_from_first_arrival: float
    """max(completion) - first arrival: what the punctual ranks wait in total."""
    tx_busy: FloatArray
    """Per rank: time its transmit NIC carried at least one flow."""
    rx_busy: FloatArray
    """Per rank: time its receive NIC carried at least one flow."""
    nvlink_tx_busy: FloatArray
    """Per rank: time its NVLink transmit port carried at least one flow (zeros when ``g = 1``)."""
    nvlink_rx_busy: FloatArray
    """Per rank: time its NVLink receive port carried at least one flow (zeros when ``g = 1``)."""
    phase_done: dict[str, float]
    """Per phase label: when its last op completed."""
    engine: str
    """``contention-free`` or ``events`` (see the module docstring)."""
    flows: list[Flow] | None = field(default=None)
    """The flow timeline (only with ``record_flows=True``), ordered by start time."""

    @property
    def makespan(self) -> float:
        return float(self.completion.max())


def simulate(
    schedule: Schedule,
    size_bytes: float,
    network: Network,
    arrivals: list[float] | tuple[float, ...] | FloatArray | None = None,
    record_flows: bool = False,
    *,
    sync_rounds: bool = True,
    engine: str = "auto",
) -> SimResult:
    """Simulate ``schedule`` on an AllReduce buffer of ``size_bytes`` over ``network``.

    ``arrivals[r]`` is when rank r enters the AllReduce (``math.inf``: never, e.g. to see how far the
    others get without it). ``engine``: ``auto`` (default), ``contention-free`` (trust the vectorised
    timeline even if flows share a NIC; an approximation then) or ``events`` (always the max-min
    event loop).

    Example::

        from stragglerkit.schedules import ring
        net = Network.uniform(4, alpha=3e-6, bandwidth=450e9)
        res = simulate(ring(4), 2**30, net, arrivals=[0, 0, 0, 1e-3])
        print(res.time_from_last_arrival)
    """
    graph = build_task_graph(schedule, sync_rounds=sync_rounds)
    return simulate_graph(graph, size_bytes, network, arrivals, record_flows, engine=engine)


def simulate_graph(
    graph: TaskGraph,
    size_bytes: float,
    network: Network,
    arrivals: list[float] | tuple[float, ...] | FloatArray | None = None,
    record_flows: bool = False,
    *,
    engine: str = "auto",
) -> SimResult:
    """:func:`simulate` on an already flattened schedule (reuse one graph for many runs).

    Example::

        graph = build_task_graph(ring(8))
        for size in (2**20, 2**30):
            simulate_graph(graph, size, Network.uniform(8, alpha=3e-6, bandwidth=450e9))
    """
    n = graph.world_size
    if network.world_size != n:
        raise ValueError(f"the network has {network.world_size} ranks but the schedule has {n}; build it for {n}")
    if not (size_bytes >= 0 and math.isfinite(size_bytes)):
        raise ValueError(f"size_bytes = {size_bytes!r} must be a finite number >= 0")
    if engine not in _ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {', '.join(_ENGINES)}")
    arrival = _arrivals(arrivals, n)

    m = graph.num_messages
    task_bytes = graph.task_bytes(size_bytes)
    msg_bytes = task_bytes[:m]
    src, dst = graph.task_src[:m], graph.task_dst[:m]
    ports = Ports(network, src, dst)
    transfer = msg_bytes / ports.path_bandwidth()
    op_extra = _local_seconds(graph, size_bytes, network)
    is_receive = np.isin(graph.op_kind, _RECEIVE_CODES)
    recv_extra = np.where(graph.op_kind == _RECV_REDUCE_CODE, op_extra, 0.0)
    duration = np.concatenate([network.alpha + transfer, op_extra[graph.task_op[m:]]])
    release = np.concatenate([np.maximum(arrival[src], arrival[dst]), arrival[graph.task_src[m:]]])

    done = longest_path(graph, release, duration, recv_extra)
    xfer_start = done[:m] - transfer
    used = "contention-free"
    happened = np.where(np.isfinite(done[:m]), transfer, 0.0)
    busy = (
        np.bincount(ports.tx, weights=happened, minlength=ports.count)
        + np.bincount(ports.rx, weights=happened, minlength=ports.count)
    ).astype(np.float64)
    shared = not graph.one_flow_per_nic and ports_shared(ports.tx, ports.rx, xfer_start, done[:m], msg_bytes)
    if engine == "events" or (engine == "auto" and shared):
        done, xfer_start, busy = _EventEngine(
            graph, msg_bytes, release, duration, recv_extra, network.alpha, ports
        ).run()
        used = "events"
    port_busy = busy.astype(np.float64).reshape(-1, n)  # rows: NIC tx, NIC rx (, NVLink tx, NVLink rx)
    nvlink_busy = port_busy[2:] if port_busy.shape[0] == 4 else np.zeros((2, n))

    op_done = done[graph.op_task] + np.where(is_receive, recv_extra, 0.0)
    completion = _per_rank_max(op_done, graph.rank_offsets, arrival)
    phase_done = np.full(len(graph.phases), -np.inf)
    np.maximum.at(phase_done, graph.op_phase, op_done)
    finite_arrivals = arrival[np.isfinite(arrival)]
    first, last = float(finite_arrivals.min()), float(finite_arrivals.max())
    end = float(completion.max())
    if math.isinf(end) and finite_arrivals.size == n:
        stuck = int(np.argmax(np.isinf(completion)))
        raise ScheduleError(f"deadlock: rank {stuck} never completes although every rank arrived")
    flows = None
    if record_flows:
        flows = _flow_list(graph, msg_bytes, xfer_start, done[:m])
    return SimResult(
        completion=completion,
        arrivals=arrival,
        first_arrival=first,
        last_arrival=last,
        time_from_last_arrival=end - last,
        time_from_first_arrival=end - first,
        tx_busy=port_busy[0],
        rx_busy=port_busy[1],
        nvlink_tx_busy=nvlink_busy[0],
        nvlink_rx_busy=nvlink_busy[1],
        phase_done={name: float(phase_done[i]) for i, name in enumerate(graph.phases)},
        engine=used,
        flows=flows,
    )


def auto_delay(
    schedule: Schedule,
    size_bytes: float,
    network: Network,
    *,
    straggler: int | None = None,
    phase: str = "reduce_scatter",
    sync_rounds: bool = True,
) -> float:
    """The straggler delay that hides ``phase`` exactly: when the punctual ranks finish it.

    The schedule is simulated with the straggler absent (arrival = inf); the answer is when the
    last op of ``phase`` completes (StragglAR: its ``reduce_scatter`` pre-phase; direct:
    ``pre_allreduce``). The straggler defaults to ``schedule.params["straggler"]``, else rank n-1.

    Example::

        from stragglerkit.schedules.stragglar import stragglar
        sched, net = stragglar(8), Network.uniform(8, alpha=3e-6, bandwidth=450e9)
        delay = auto_delay(sched, 2**30, net)       # the straggler is rank 7 (sched.params["straggler"])
        res = simulate(sched, 2**30, net, arrivals=[0.0] * 7 + [delay])
    """
    n = schedule.world_size
    if straggler is None:
        straggler = int(schedule.params.get("straggler", n - 1))
    if not 0 <= straggler < n:
        raise ValueError(f"straggler rank {straggler} is not a rank of 0..{n - 1}")
    graph = build_task_graph(schedule, sync_rounds=sync_rounds)
    if phase not in graph.phases:
        raise ValueError(
            f"schedule {schedule.algorithm!r} has no phase {phase!r} "
            f"(its phases: {', '.join(graph.phases) or 'none'}); name the phase run before the straggler arrives"
        )
    arrivals = np.zeros(n)
    arrivals[straggler] = math.inf
    done = simulate_graph(graph, size_bytes, network, arrivals).phase_done[phase]
    if not math.isfinite(done):
        raise ValueError(f"phase {phase!r} of {schedule.algorithm!r} cannot finish without rank {straggler}")
    return done


# --------------------------------------------------------------------------------------------------
def _arrivals(arrivals: list[float] | tuple[float, ...] | FloatArray | None, n: int) -> FloatArray:
    if arrivals is None:
        return np.zeros(n)
    arr = np.asarray(arrivals, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"arrivals must give one time per rank ({n}), got shape {arr.shape}")
    if np.isnan(arr).any() or np.isneginf(arr).any():
        raise ValueError("arrivals must be real times (seconds) or math.inf for a rank that never arrives")
    if not np.isfinite(arr).any():
        raise ValueError("at least one rank must arrive (all arrivals are inf)")
    return arr


def _local_seconds(graph: TaskGraph, size_bytes: float, network: Network) -> FloatArray:
    if network.gamma == 0 and network.delta == 0:
        return np.zeros(graph.op_kind.size)
    return network.gamma * graph.op_reduced_bytes(size_bytes) + network.delta * graph.op_memory_bytes(size_bytes)


def _per_rank_max(op_done: FloatArray, offsets: IntArray, arrival: FloatArray) -> FloatArray:
    completion = arrival.copy()
    has_ops = offsets[1:] > offsets[:-1]
    if has_ops.any():
        maxima = np.maximum.reduceat(op_done, offsets[:-1][has_ops])
        completion[has_ops] = np.maximum(maxima, arrival[has_ops])
    return completion


def _flow_list(graph: TaskGraph, nbytes: FloatArray, start: FloatArray, end: FloatArray) -> list[Flow]:
    phase_of = graph.op_phase[graph.task_op[: graph.num_messages]]
    order = np.argsort(start, kind="stable")
    return [
        Flow(
            int(graph.task_src[i]),
            int(graph.task_dst[i]),
            float(start[i]),
            float(end[i]),
            float(nbytes[i]),
            graph.phases[phase_of[i]],
        )
        for i in order
        if math.isfinite(end[i])
    ]


class _EventEngine:
    """Event loop with max-min fair sharing of ports (NIC/NVLink directions) among concurrent flows."""

    _START, _FLOW, _END, _DONE = range(4)

    def __init__(
        self,
        graph: TaskGraph,
        msg_bytes: FloatArray,
        release: FloatArray,
        duration: FloatArray,
        recv_extra: FloatArray,
        alpha: float,
        ports: Ports,
    ) -> None:
        self.m = graph.num_messages
        self.alpha = alpha
        self.ptr = graph.edge_ptr.tolist()
        self.edge_dst = graph.edge_dst.tolist()
        from_op = graph.edge_from_op
        self.edge_extra = np.where(from_op >= 0, recv_extra[np.maximum(from_op, 0)], 0.0).tolist()
        self.pending = np.bincount(graph.edge_dst, minlength=graph.num_tasks).tolist()
        self.ready = release.tolist()
        self.duration = duration.tolist()
        self.nbytes = msg_bytes.tolist()
        self.nic = list(zip(ports.tx.tolist(), ports.rx.tolist()))
        self.capacity = ports.capacity.tolist()
        self.done = [math.inf] * graph.num_tasks
        self.xfer_start = [math.inf] * self.m
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        # active flows
        self.on_nic: list[set[int]] = [set() for _ in range(ports.count)]
        self.left: dict[int, float] = {}
        self.rate: dict[int, float] = {}
        self.since: dict[int, float] = {}
        self.version: dict[int, int] = {}
        self.busy = [0.0] * ports.count
        self.busy_from = [0.0] * ports.count

    def push(self, time: float, kind: int, task: int, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, kind, task, version))

    def run(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        for task, count in enumerate(self.pending):
            if count == 0 and self.ready[task] < math.inf:
                self.push(self.ready[task], self._START, task)
        while self.heap:
            time, _, kind, task, version = heapq.heappop(self.heap)
            if kind == self._START:
                if task >= self.m:
                    self.push(time + self.duration[task], self._DONE, task)
                elif self.alpha > 0:
                    self.push(time + self.alpha, self._FLOW, task)
                else:
                    self.flow_start(time, task)
            elif kind == self._FLOW:
                self.flow_start(time, task)
            elif kind == self._END:
                if self.version.get(task) == version:
                    self.flow_end(time, task)
            else:
                self.finish(time, task)
        return np.asarray(self.done), np.asarray(self.xfer_start), np.asarray(self.busy)

    def finish(self, time: float, task: int) -> None:
        self.done[task] = time
        ready, pending, edge_dst, edge_extra = self.ready, self.pending, self.edge_dst, self.edge_extra
        for e in range(self.ptr[task], self.ptr[task + 1]):
            child = edge_dst[e]
            when = time + edge_extra[e]
            if when > ready[child]:
                ready[child] = when
            pending[child] -= 1
            if pending[child] == 0 and ready[child] < math.inf:
                self.push(ready[child], self._START, child)

    def flow_start(self, time: float, flow: int) -> None:
        self.xfer_start[flow] = time
        if self.nbytes[flow] <= 0:
            self.finish(time, flow)
            return
        self.left[flow] = self.nbytes[flow]
        self.rate[flow] = 0.0
        self.since[flow] = time
        self.version[flow] = 0
        for nic in self.nic[flow]:
            if not self.on_nic[nic]:
                self.busy_from[nic] = time
            self.on_nic[nic].add(flow)
        self.rebalance(time, [flow])

    def flow_end(self, time: float, flow: int) -> None:
        neighbours: list[int] = []
        for nic in self.nic[flow]:
            users = self.on_nic[nic]
            users.discard(flow)
            if users:
                neighbours.extend(users)
            else:
                self.busy[nic] += time - self.busy_from[nic]
        for table in (self.left, self.rate, self.since, self.version):
            del table[flow]
        self.finish(time, flow)
        if neighbours:
            self.rebalance(time, neighbours)

    def component(self, seeds: list[int]) -> set[int]:
        seen = set(seeds)
        stack = list(seeds)
        while stack:
            flow = stack.pop()
            for nic in self.nic[flow]:
                for other in self.on_nic[nic]:
                    if other not in seen:
                        seen.add(other)
                        stack.append(other)
        return seen

    def rebalance(self, time: float, seeds: list[int]) -> None:
        flows = self.component(seeds)
        for flow in flows:
            self.left[flow] -= self.rate[flow] * (time - self.since[flow])
            self.since[flow] = time
        for flow, rate in self.max_min(flows).items():
            self.rate[flow] = rate
            self.version[flow] += 1
            left = max(self.left[flow], 0.0)
            self.push(time + left / rate, self._END, flow, self.version[flow])

    def max_min(self, flows: set[int]) -> dict[int, float]:
        """Progressive filling: raise all rates together; freeze flows at each saturated NIC."""
        if len(flows) == 1:
            (flow,) = flows
            a, b = self.nic[flow]
            return {flow: min(self.capacity[a], self.capacity[b])}
        users: dict[int, set[int]] = {}
        for flow in flows:
            for nic in self.nic[flow]:
                users.setdefault(nic, set()).add(flow)
        spare = {nic: self.capacity[nic] for nic in users}
        rates: dict[int, float] = {}
        while users:
            nic = min(users, key=lambda k: spare[k] / len(users[k]))
            share = spare[nic] / len(users[nic])
            for flow in list(users[nic]):
                rates[flow] = share
                for other in self.nic[flow]:
                    spare[other] -= share
                    group = users.get(other)
                    if group is not None:
                        group.discard(flow)
                        if not group:
                            del users[other]
        return rates
