"""OptCC on servers with several GPUs that share the server's NICs (OptCC paper, App. E).

``p = q·g`` ranks on ``q`` servers of ``g`` GPUs (rank ``v·g + c`` is GPU ``c`` of server ``v``).
A degraded server runs all its NICs at ``1/l``. As in the paper, ``g`` copies of the one-GPU-per-server
pipeline (an :class:`~stragglerkit.schedules.optcc_timetable.OptccPlan` on the ``q`` servers) run side by side:
copy ``c`` owns part ``c`` of the buffer (``1/g`` of it) and uses GPU ``c`` of every server, so all
``g`` NICs of a server work at once and each moves ``n/g``. Around the NIC flows, NVLink work:

* local reduce (the paper's N1/N3): before copy ``c`` first touches a *unit* (one segment's
  sections, or one fill chunk) on GPU ``c`` of a server, the other ``g-1`` GPUs of that server add
  their share of the unit into it;
* local broadcast (N2/N4): as soon as GPU ``c`` holds the global sum of a whole unit, it sends the
  unit to the other ``g-1`` GPUs of its server.

A GPU's NVLink sends are chained among themselves, and so are its NVLink receives; the NIC flows
keep their own chains, so NVLink and NIC work overlap. Each exchange with the ``g-1`` siblings goes
in shift order (step ``j``: GPU ``c`` sends to ``c+j``, receives from ``c-j``), a permutation at
every step, so with NVLink at ``g-1`` times the NIC (App. E) a local reduce or broadcast of a unit
takes as long as one NIC flow of it, and each GPU's NVLink carries ``2(g-1)/g`` of the buffer each
way in all: ``2n/g`` time, the NIC time at ``l = 2``. Unlike the paper's eight-phase alternation
(App. E.2) the NVLink steps here move whole segments, not sections: the same NIC timetable, one
segment of extra latency at the head and at the tail.

Chunks: chunk ``c·C + i`` is chunk ``i`` of copy ``c`` (``C`` chunks per copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglerkit.schedules.ir import Op, Schedule, ScheduleBuilder
from stragglerkit.schedules.optcc_timetable import ADDING_STAGES, Flow, OptccPlan

__all__ = ["lower_servers", "nic_projection"]


@dataclass(slots=True)
class _ServerScript:
    """What every GPU of one server does in its copy: the NIC flows, and where the NVLink steps go."""

    flows: list[Flow]
    reduce_before: dict[int, list[int]]
    """Flow index -> units to reduce locally just before it (first touch)."""
    broadcast_after: dict[int, list[int]]
    """Flow index -> units that are final (to broadcast) just after it."""
    reduce_order: list[int]
    broadcast_order: list[int]


def _unit(plan: OptccPlan, chunk: int) -> int:
    sections = plan.segments * plan.q
    return chunk // plan.q if chunk < sections else plan.segments + chunk - sections


def _server_script(plan: OptccPlan, server: int) -> _ServerScript:
    flows = [flow for window in range(plan.num_windows) for flow in plan.rank_flows(server, window)]
    reduce_before: dict[int, list[int]] = {}
    broadcast_after: dict[int, list[int]] = {}
    seen: set[int] = set()
    finals: dict[int, int] = {}
    reduce_order: list[int] = []
    broadcast_order: list[int] = []
    for index, flow in enumerate(flows):
        unit = _unit(plan, flow.chunk)
        if unit not in seen:
            seen.add(unit)
            reduce_before.setdefault(index, []).append(unit)
            reduce_order.append(unit)
        if not plan.brings_a_final(server, flow):
            continue
        finals[unit] = finals.get(unit, 0) + 1
        whole = plan.q if unit < plan.segments or server == plan.straggler else 1
        if finals[unit] == whole:
            broadcast_after.setdefault(index, []).append(unit)
            broadcast_order.append(unit)
    return _ServerScript(flows, reduce_before, broadcast_after, reduce_order, broadcast_order)


def _unit_range(plan: OptccPlan, copy: int, unit: int) -> tuple[int, int]:
    base = copy * plan.num_chunks
    if unit < plan.segments:
        return base + unit * plan.q, base + (unit + 1) * plan.q
    fill = base + plan.segments * plan.q + unit - plan.segments
    return fill, fill + 1


class _Chains:
    """The last op of each chained resource of one rank (NIC send/receive, NVLink send/receive)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: dict[str, int] = {}

    def after(self, resource: str) -> tuple[int, ...]:
        return (self.last[resource],) if resource in self.last else ()

    def put(self, resource: str, index: int) -> None:
        self.last[resource] = index


def _lower_gpu(
    builder: ScheduleBuilder, plan: OptccPlan, script: _ServerScript, server: int, copy: int, g: int
) -> None:
    rank = server * g + copy
    # shift order: in step j every GPU c sends to c+j and receives from c-j, so the g GPUs of a
    # server form a permutation at every step and no NVLink port waits for another
    send_to = [server * g + (copy + j) % g for j in range(1, g)]
    recv_from = [server * g + (copy - j) % g for j in range(1, g)]
    chains = _Chains()

    def nvlink_send(peer: int, chunks: tuple[int, int], phase: str) -> None:
        chains.put("nv_send", builder.send(rank, peer, chunks, depends=chains.after("nv_send"), phase=phase))

    def nvlink_recv(peer: int, chunks: tuple[int, int], phase: str, add: bool) -> None:
        op = builder.recv_reduce if add else builder.recv
        chains.put("nv_recv", op(rank, peer, chunks, depends=chains.after("nv_recv"), phase=phase))

    for unit in script.reduce_order:  # my share of the other copies' units, in the order they need them
        for peer in send_to:
            nvlink_send(peer, _unit_range(plan, peer - server * g, unit), "local_reduce")
    for index, flow in enumerate(script.flows):
        for unit in script.reduce_before.get(index, ()):
            for peer in recv_from:
                nvlink_recv(peer, _unit_range(plan, copy, unit), "local_reduce", add=True)
        chunk = copy * plan.num_chunks + flow.chunk
        if flow.src == server:
            dst = flow.dst * g + copy
            chains.put(
                "nic_send",
                builder.send(rank, dst, (chunk, chunk + 1), depends=chains.after("nic_send"), phase=flow.stage),
            )
        else:
            src = flow.src * g + copy
            op = builder.recv_reduce if flow.stage in ADDING_STAGES else builder.recv
            chains.put(
                "nic_recv", op(rank, src, (chunk, chunk + 1), depends=chains.after("nic_recv"), phase=flow.stage)
            )
        for unit in script.broadcast_after.get(index, ()):
            for peer in send_to:
                nvlink_send(peer, _unit_range(plan, copy, unit), "local_broadcast")
    for unit in script.broadcast_order:  # the other copies' sums, in the order their GPUs send them
        for peer in recv_from:
            nvlink_recv(peer, _unit_range(plan, peer - server * g, unit), "local_broadcast", add=False)


def lower_servers(plan: OptccPlan, gpus_per_server: int) -> Schedule:
    """Lower ``plan`` (built on the servers) to the ``q·g`` GPU ranks; see the module docstring.

    Example::

        plan = optcc_plan(4, {1: 2.0}, segments=4)      # 4 servers, server 1 degraded
        sched = lower_servers(plan, gpus_per_server=2)   # 8 GPUs
    """
    g = gpus_per_server
    builder = ScheduleBuilder(plan.world_size * g, g * plan.num_chunks)
    for server in range(plan.world_size):
        script = _server_script(plan, server)
        for copy in range(g):
            _lower_gpu(builder, plan, script, server, copy, g)
    params = {**plan.params(), "gpus_per_server": g, "servers": plan.world_size}
    return builder.build("optcc", chunk_sizes=plan.chunk_sizes() * g, params=params)


def nic_projection(sched: Schedule, gpus_per_server: int) -> Schedule:
    """``sched`` without its intra-server (NVLink) messages: only the NIC flows, for comparison.

    The simulator times NVLink itself (``Network.uniform(..., gpus_per_server=g)``); this projection
    answers "what if NVLink were free": it drops every send/receive between two GPUs of one server,
    and an op that depended on a dropped op inherits that op's dependencies, so the NIC flows keep
    their order. It is *not* an AllReduce: never run or check it.
    """
    g = gpus_per_server
    new_ops = []
    for rank, ops in enumerate(sched.ops):
        kept: list[int | None] = []
        inherited: list[frozenset[int]] = []  # for each op, the kept ops it depends on (transitively)
        rank_ops: list[Op] = []
        for op in ops:
            deps: set[int] = set()
            for dep in op.depends:
                deps |= inherited[dep] if kept[dep] is None else {kept[dep]}  # type: ignore[arg-type]
            local = op.peer is not None and op.peer // g == rank // g
            if local:
                kept.append(None)
                inherited.append(frozenset(deps))
                continue
            kept.append(len(rank_ops))
            inherited.append(frozenset())
            rank_ops.append(Op(op.kind, op.chunks, op.peer, op.scratch, tuple(sorted(deps)), op.round, op.phase))
        new_ops.append(rank_ops)
    return Schedule(
        algorithm=sched.algorithm + "-nic",
        world_size=sched.world_size,
        num_chunks=sched.num_chunks,
        ops=new_ops,
        chunk_sizes=sched.chunk_sizes,
        params=dict(sched.params),
    )
