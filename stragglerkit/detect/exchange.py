"""The periodic stats exchange: each rank's fixed-size float64 vector to rank 0, rank 0's decision to all.

What it carries and why this way. Every ``K`` steps each rank contributes its figures for the
last ``K`` steps (per step: the summed AllReduce span, each bucket's span and the messages of
its largest ring bucket on this rank's two ring links), its NIC speed from sysfs and a host id;
``K`` is the exchange interval in force (``Config.detection.exchange_every``, or
``quiet_exchange_every`` while all is quiet), the same on every rank: rank 0's decisions set it.
rank 0 adds its latest decision (plan, event kinds, the probe and exchange intervals). The
vector's size follows from ``K``, the bucket limit ``B``, ``n`` and ``M``, all known to every rank,
so no size negotiation is needed. Only rank 0 decides, so the
figures go to rank 0 alone (one gather) and rank 0's decision, the vector's head, goes to
everyone (one broadcast): two collectives of about ``2(n-1)`` messages in all, where an
all-gather (a ring in gloo) takes ``n(n-1)`` messages and hands every rank every vector: on
hosts short of cores the all-gather was most of what the exchange cost (docs/results.md, "Hook
overhead"). Both run asynchronously on a separate gloo
group over CPU tensors (also next to NCCL), issued once a step's first bucket was handed to its
AllReduce and waited when the next step begins: by then every rank has contributed, so the wait
costs nothing on the critical path. Rank 0's decision therefore reaches
every rank at the same step, where all of them switch.

Layout (floats): ``[version, rank, first_step, steps, host, speed, seq, apply_step, straggler,
default, probe_every, exchange_every]`` + rank 0's fitted cost model (``MODEL_FIELDS``; NaN before
its first fit: every rank's ``all_reduce(algorithm="auto")`` chooses with it, docs/architecture.md)
+ ``E`` event codes + ``n`` slowdowns + ``B`` bucket algorithms + ``K``
totals + ``K·B`` bucket spans + ``K·(3 + 4M)`` ring-link figures (the run's start, the successor
and the predecessor, then ``M`` send posts, receive posts, receive completions and receive
sizes; :mod:`stragglerkit.detect.nic_health`, ``M`` = ``LINK_MESSAGES``) + ``K`` wall-clock
arrivals (first bucket handed over) + ``K`` wall-clock finishes (last bucket done) + ``K`` idle
times (within the step's AllReduce time, none of the rank's buckets in an AllReduce). Times of day
are wall-clock seconds; rank 0 makes them comparable with the start-up clock offsets (the
float64's resolution, ~0.2 us, is ample). With ``K`` = 2, ``B`` = 32, ``n`` = 8 the vector is
about 3 KB (about 8 KB at ``K`` = 6).

Example::

    exchange = StatsExchange(side_group, world_size=4, rank=r, buckets=32)
    pending = exchange.start(exchange.pack(first_step, arrivals_of_the_last_k_steps, ...), first_step)
    rows = exchange.wait(pending)           # rank 0: one row per rank; elsewhere rank 0's head
"""

from __future__ import annotations

import math
import os
import socket
import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from stragglerkit.detect.arrival import ClockOffsets, StepArrival, wall_clock_lateness
from stragglerkit.detect.nic_health import LINK_MESSAGES, RingLinkMessages, message_link_rates
from stragglerkit.plans import ALGORITHM_CODES, EVENT_KINDS, Decision, Plan, WindowStats
from stragglerkit.sim.cost_model import CostModelParams

__all__ = ["PendingExchange", "StatsExchange", "host_id"]

_VERSION = 7.0
MODEL_FIELDS = ("alpha", "beta", "gamma", "delta", "epsilon", "incast_threshold")
"""The cost-model parameters in the head, in this order (all of them: every rank predicts alike)."""
_HEADER = 12 + len(MODEL_FIELDS)
_EVENTS = 6
_LINK_FIELDS = 3 + 4 * LINK_MESSAGES


def host_id(hostname: str | None = None) -> int:
    """A stable number for the server this process runs on, to tell which ranks share its NICs.

    The host name plus the network namespace (``/proc/self/ns/net``): processes in different
    namespaces have different NICs even on one machine (the emulated cluster), so they count as
    different servers.
    """
    name = hostname if hostname is not None else socket.gethostname()
    try:
        name += f"/netns:{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        pass
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


@dataclass(slots=True)
class PendingExchange:
    works: list[dist.Work]
    """The gather (figures to rank 0) and the broadcast (rank 0's decision head to every rank)."""
    rows: list[torch.Tensor]
    """On rank 0: every rank's vector, by group rank. Elsewhere: one vector holding rank 0's head."""
    first_step: int


class StatsExchange:
    """Packs, gathers and unpacks the stats vector (see the module docstring)."""

    __slots__ = ("buckets", "group", "offsets", "rank", "world_size")

    def __init__(self, group: dist.ProcessGroup, world_size: int, rank: int, buckets: int) -> None:
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self.buckets = buckets
        self.offsets = ClockOffsets.zero(world_size)
        """Clock offsets to rank 0 (set after :func:`~stragglerkit.detect.arrival.estimate_clock_offsets`)."""

    @property
    def _step_size(self) -> int:
        """Floats per step: the total, the bucket spans, the ring-link figures, arrival, finish, idle."""
        return 1 + self.buckets + _LINK_FIELDS + 3

    def size(self, steps: int) -> int:
        """Floats of a vector that carries ``steps`` steps."""
        return self.head_size + steps * self._step_size

    def steps_in(self, size: int) -> int:
        """How many steps a vector of ``size`` floats carries (the inverse of :meth:`size`)."""
        steps, rest = divmod(size - self.head_size, self._step_size)
        if rest or steps < 0:
            raise ValueError(f"a stats vector of {size} floats does not fit this exchange's layout")
        return steps

    def pack(
        self,
        first_step: int,
        arrivals: list[StepArrival | None],
        speed: float,
        host: int,
        decision: Decision | None,
        model: CostModelParams | None = None,
    ) -> torch.Tensor:
        """The vector of ``arrivals`` (one entry per step from ``first_step``; every rank passes as many)."""
        n, k, b = self.world_size, len(arrivals), self.buckets
        vec = np.full(self.size(k), np.nan)
        vec[:12] = [_VERSION, self.rank, first_step, k, host, speed, -1, -1, -1, -1, -1, -1]
        if model is not None:  # rank 0's fitted cost model, for every rank's ``auto``
            vec[12:_HEADER] = [getattr(model, name) for name in MODEL_FIELDS]
        at = _HEADER
        vec[at : at + _EVENTS] = -1
        if decision is not None:
            plan = decision.plan
            vec[6:12] = [
                decision.seq,
                decision.step,
                -1 if plan.straggler is None else plan.straggler,
                ALGORITHM_CODES.index(plan.default),
                -1 if decision.probe_every is None else decision.probe_every,
                -1 if decision.exchange_every is None else decision.exchange_every,
            ]
            kinds = [EVENT_KINDS.index(e["kind"]) for e in decision.events][:_EVENTS]
            vec[at : at + len(kinds)] = kinds
            slow = np.ones(n)
            for rank, slowdown in plan.slowdowns:
                slow[rank] = slowdown
            vec[at + _EVENTS : at + _EVENTS + n] = slow
            codes = [ALGORITHM_CODES.index(a) for a in plan.buckets[:b]]
            vec[at + _EVENTS + n : at + _EVENTS + n + len(codes)] = codes
        at += _EVENTS + n + b
        for i, arrival in enumerate(arrivals):
            if arrival is None:
                continue
            vec[at + i] = arrival.total_span
            spans = np.asarray(arrival.bucket_spans[:b], dtype=np.float64)
            vec[at + k + i * b : at + k + i * b + spans.size] = spans
        at += k + k * b
        m = LINK_MESSAGES
        for i, arrival in enumerate(arrivals):
            if arrival is None or arrival.links is None:
                continue
            links = arrival.links
            base = at + i * _LINK_FIELDS
            vec[base : base + 3] = [arrival.link_enter_wall, links.send_peer, links.recv_peer]
            for j, values in enumerate((links.send_posts, links.recv_posts, links.recv_ends, links.recv_bytes)):
                values = values[:m]
                vec[base + 3 + j * m : base + 3 + j * m + values.size] = values
        at += k * _LINK_FIELDS
        for i, arrival in enumerate(arrivals):
            if arrival is not None:
                vec[at + i] = arrival.arrival_wall
                vec[at + k + i] = arrival.finish_wall
                vec[at + 2 * k + i] = arrival.idle
        return torch.from_numpy(vec)

    @property
    def head_size(self) -> int:
        """Floats of the vector's head: the header, the event codes and rank 0's plan (slowdowns,
        bucket algorithms): what the other ranks need of rank 0's vector."""
        return _HEADER + _EVENTS + self.world_size + self.buckets

    def start(self, payload: torch.Tensor, first_step: int) -> PendingExchange:
        """Issue the gather of ``payload`` to rank 0 and the broadcast of rank 0's head (async)."""
        root = self.rank == 0
        rows = [torch.empty_like(payload) for _ in range(self.world_size)] if root else []
        gathered = dist.gather(payload, rows if root else None, group=self.group, group_dst=0, async_op=True)
        head = payload[: self.head_size].clone() if root else torch.empty(self.head_size, dtype=torch.float64)
        broadcast = dist.broadcast(head, group=self.group, group_src=0, async_op=True)
        assert gathered is not None and broadcast is not None
        if not root:
            rows = [head]
        return PendingExchange([gathered, broadcast], rows, first_step)

    def wait(self, pending: PendingExchange) -> np.ndarray:
        """The exchanged vectors as a [rank, field] array: on rank 0 every rank's; elsewhere one row
        holding rank 0's head, which is all :meth:`decision` reads."""
        for work in pending.works:
            work.wait()
        if self.rank == 0:
            return torch.stack(pending.rows).numpy()
        return pending.rows[0].numpy()[None, :]

    def stats(self, rows: np.ndarray, bucket_bytes: list[int], algorithms: list[list[str]]) -> WindowStats:
        """Rank 0's view of the gathered figures."""
        n, k, b = self.world_size, self.steps_in(rows.shape[1]), self.buckets
        first, count = int(rows[0, 2]), int(rows[0, 3])
        at = _HEADER + _EVENTS + n + b
        totals = rows[:, at : at + count].T.copy()
        spans = rows[:, at + k : at + k + k * b].reshape(n, k, b)[:, :count, :].transpose(1, 0, 2).copy()
        at += k + k * b
        rates = self._link_rates(rows[:, at : at + k * _LINK_FIELDS].reshape(n, k, _LINK_FIELDS)[:, :count, :])
        at += k * _LINK_FIELDS
        arrival_wall = rows[:, at : at + count].T
        finish_wall = rows[:, at + k : at + k + count].T
        idle = rows[:, at + 2 * k : at + 2 * k + count].T
        complete = ~np.isnan(arrival_wall).any(axis=1)
        # from the last arrival to the last finish, on rank 0's clock: the step's AllReduce tail
        on_rank0 = self.offsets.to_reference
        with np.errstate(invalid="ignore"):
            ends = on_rank0(finish_wall).max(axis=1)
            tails = ends - on_rank0(arrival_wall).max(axis=1)
        return WindowStats(
            steps=list(range(first, first + count)),
            totals=totals,
            bucket_spans=spans,
            bucket_bytes=bucket_bytes,
            algorithms=algorithms,
            link_rates=rates,
            speeds=rows[:, 5].copy(),
            hosts=[int(h) for h in rows[:, 4]],
            lateness=wall_clock_lateness(arrival_wall[complete], self.offsets),
            tails=tails,
            ends=ends,
            arrival_wall=arrival_wall.copy(),
            finish_wall=finish_wall.copy(),
            idle=idle.copy(),
        )

    def _link_rates(self, fields: np.ndarray) -> np.ndarray:
        """``[src, dst]`` bytes/s from every rank's ring-link figures ``fields[rank, step, :]``."""
        n, m = self.world_size, LINK_MESSAGES
        # each run's start on rank 0's clock, relative to rank 0's first one (keeps the float64 small)
        offsets = np.asarray(self.offsets.offset_ns, dtype=np.float64) / 1e9
        starts = fields[:, :, 0].T + (offsets - offsets[0])[None, :]
        finite = starts[np.isfinite(starts)]
        if finite.size == 0:
            return np.full((n, n), np.nan)
        starts = starts - finite.min()
        links: list[list[RingLinkMessages | None]] = []
        for step in range(fields.shape[1]):
            row: list[RingLinkMessages | None] = []
            for rank in range(n):
                f = fields[rank, step]
                if not np.isfinite(f[0]):
                    row.append(None)
                    continue
                parts = [f[3 + j * m : 3 + (j + 1) * m] for j in range(4)]
                count = int(min(np.isfinite(parts[0]).sum(), m))
                received = int(np.isfinite(parts[2]).sum())
                row.append(
                    RingLinkMessages(
                        send_peer=int(f[1]),
                        send_posts=parts[0][:count],
                        recv_peer=int(f[2]),
                        recv_posts=parts[1][:received],
                        recv_ends=parts[2][:received],
                        recv_bytes=parts[3][:received],
                    )
                )
            links.append(row)
        return message_link_rates(starts, links)

    def fitted_model(self, rows: np.ndarray) -> CostModelParams | None:
        """Rank 0's fitted cost model as shipped in its head (``None`` before it fitted one)."""
        values = rows[0][12:_HEADER]
        if np.isnan(values).any():
            return None
        return CostModelParams(**{name: float(v) for name, v in zip(MODEL_FIELDS, values, strict=True)})

    def decision(self, rows: np.ndarray) -> Decision | None:
        """Rank 0's decision as the other ranks decode it (events carry the plan as evidence)."""
        head = rows[0]
        if head[6] < 0 or math.isnan(head[6]):
            return None
        n, b = self.world_size, self.buckets
        at = _HEADER
        kinds = [EVENT_KINDS[int(c)] for c in head[at : at + _EVENTS] if c >= 0]
        slow = head[at + _EVENTS : at + _EVENTS + n]
        codes = head[at + _EVENTS + n : at + _EVENTS + n + b]
        buckets = tuple(ALGORITHM_CODES[int(c)] for c in codes if not math.isnan(c))
        straggler = int(head[8])
        plan = Plan(
            default=ALGORITHM_CODES[int(head[9])],
            buckets=buckets,
            straggler=None if straggler < 0 else straggler,
            slowdowns=tuple((r, float(value)) for r, value in enumerate(slow) if value > 1.0),
        )
        plan_evidence = {"decided_by": 0, "plan": plan.describe()}
        events = [{"kind": kind, "evidence": dict(plan_evidence)} for kind in kinds]
        probe_every = None if not head[10] >= 0 else int(head[10])
        exchange_every = None if not head[11] >= 0 else int(head[11])
        return Decision(int(head[6]), int(head[7]), plan, events, probe_every, exchange_every)
