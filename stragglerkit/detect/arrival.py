"""When each rank reaches the AllReduce, how long it waits there, and who came last.

What this decides. For every bucket of every step, each rank records three local times: when the
gradient bucket was handed to the AllReduce (the hook call), when its AllReduce could really
start (the hook call, or the end of the previous bucket's AllReduce when that one was still
running: one AllReduce runs at a time per rank) and when it finished. From these:

* **span** = finish - start: the time this rank spent in the AllReduce, waiting included.
* **clock-free last arriver** (StragglAR paper, §2): every rank finishes an AllReduce at nearly the
  same moment, so the rank that arrived last is the one that waited least -- the smallest span.
  The straggler delay is ``T_rest - T_straggler``, the second smallest span minus the smallest:
  the idle time of the second-last rank, a conservative figure that needs no shared clock.
* **wall-clock arrivals** for finer figures (how late every rank is, not only the last): each
  rank's arrival in its own ``time.time_ns()`` clock, corrected by a per-rank offset to rank 0's
  clock that :func:`estimate_clock_offsets` measures once at start-up with ping-pong messages
  (NTP's estimate: the offset at the midpoint of the shortest round trip).

Nothing here synchronises: recording is a few integer stores per bucket (the executor's own per-op
timings are not even needed), and the figures travel in the controller's periodic stats exchange.

Example::

    profiler = ArrivalProfiler()
    token = profiler.begin(step=0, bucket=0, nbytes=4096)
    ...                                   # the AllReduce runs
    profiler.finish(token, "ring")
    spans = profiler.step_spans(0)        # per-bucket spans of step 0 on this rank
    last, delay = last_arrivers(np.array([[0.050, 0.048, 0.010, 0.049]]))   # -> [2], [0.038]
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from stragglerkit.detect.nic_health import RingLinkMessages

__all__ = [
    "ArrivalProfiler",
    "BucketTiming",
    "ClockOffsets",
    "StepArrival",
    "estimate_clock_offsets",
    "last_arrivers",
    "wall_clock_lateness",
]


@dataclass(slots=True)
class BucketTiming:
    """One bucket's AllReduce on this rank (monotonic ns, except ``hook_wall_ns``)."""

    step: int
    bucket: int
    nbytes: int
    hook_ns: int
    """When the bucket was handed over (``time.monotonic_ns()``)."""
    hook_wall_ns: int
    """The same moment in this rank's wall clock (``time.time_ns()``), for cross-rank figures."""
    start_ns: int = 0
    """When its AllReduce could start: the hand-over, or for stragglerkit's queued runs the end of
    the previous queued one if later (see :meth:`ArrivalProfiler.finish`)."""
    finish_ns: int = 0
    algorithm: str = ""
    links: RingLinkMessages | None = None
    """A ring run's messages on this rank's two links, s after ``link_start_ns`` (NIC health)."""
    link_start_ns: int = 0
    """When the run's first message was posted (the executor's entry; 0: not measured)."""

    def wall(self, monotonic_ns: int) -> float:
        """A ``time.monotonic_ns()`` value of this bucket in this rank's wall clock (s)."""
        return (monotonic_ns + self.hook_wall_ns - self.hook_ns) / 1e9

    @property
    def span(self) -> float:
        """Seconds from start to finish: the AllReduce's time on this rank, waiting included."""
        return (self.finish_ns - self.start_ns) / 1e9


@dataclass(slots=True, frozen=True)
class StepArrival:
    """This rank's view of one step."""

    step: int
    total_span: float
    """The step's AllReduce time on this rank (seconds): from the earliest start to the latest
    finish of its buckets. Buckets of the group's own all_reduce may overlap; summing their spans
    would count one straggler's delay once per bucket."""
    arrival_wall: float
    """Wall-clock time (s, this rank's clock) at which the step's first bucket was handed over."""
    bucket_spans: tuple[float, ...]
    """Span of each bucket, by bucket index (NaN where a bucket index did not occur)."""
    bucket_bytes: tuple[int, ...]
    algorithms: tuple[str, ...]
    finish_wall: float = float("nan")
    """Wall-clock time (s, this rank's clock) at which the step's last bucket finished."""
    idle: float = 0.0
    """Seconds of ``total_span`` in which none of this rank's buckets was in an AllReduce: it was
    still computing the gradients of its next bucket (a rank whose whole backward is slow hands
    its buckets over one after the other, each later than the others do). ``total_span - idle``
    is the time this rank spent in the step's AllReduces, waiting included."""
    link_enter_wall: float = float("nan")
    """Start (wall clock, s) of the step's largest bucket with ring-link figures (NaN: none)."""
    links: RingLinkMessages | None = None
    """That bucket's messages on this rank's ring links (s after its start)."""


def _union_ns(timings: list[BucketTiming]) -> int:
    """Nanoseconds covered by at least one of the ``[start_ns, finish_ns]`` intervals."""
    covered, reach = 0, None
    for timing in sorted(timings, key=lambda t: t.start_ns):
        if reach is None or timing.start_ns > reach:
            covered += timing.finish_ns - timing.start_ns
            reach = timing.finish_ns
        elif timing.finish_ns > reach:
            covered += timing.finish_ns - reach
            reach = timing.finish_ns
    return covered


class ArrivalProfiler:
    """Records :class:`BucketTiming` per bucket; thread-safe (finish runs on the AllReduce thread).

    Only the last ``keep_steps`` steps are kept.

    Example::

        token = profiler.begin(step, bucket.index(), bucket.buffer().numel() * 4)
        future.add_done_callback(lambda _: profiler.finish(token, "ring"))
    """

    __slots__ = ("_last_finish_ns", "_lock", "_steps", "keep_steps")

    def __init__(self, keep_steps: int = 64) -> None:
        if keep_steps < 1:
            raise ValueError(f"keep_steps must be at least 1, got {keep_steps}")
        self.keep_steps = keep_steps
        self._steps: dict[int, list[BucketTiming]] = {}
        self._lock = threading.Lock()
        self._last_finish_ns = 0

    def begin(self, step: int, bucket: int, nbytes: int) -> BucketTiming:
        timing = BucketTiming(step, bucket, nbytes, time.monotonic_ns(), time.time_ns())
        with self._lock:
            self._steps.setdefault(step, []).append(timing)
            for old in [s for s in self._steps if s <= step - self.keep_steps]:
                del self._steps[old]
        return timing

    def finish(
        self,
        timing: BucketTiming,
        algorithm: str,
        finish_ns: int | None = None,
        links: RingLinkMessages | None = None,
        link_start_ns: int | None = None,
        *,
        queued: bool = True,
    ) -> None:
        """Mark ``timing`` done now (or at ``finish_ns``, a ``time.monotonic_ns()`` value).

        ``links``: a ring run's messages from
        :func:`stragglerkit.detect.nic_health.ring_link_messages`, relative to ``link_start_ns``
        (the run's first post; default: the AllReduce's start). ``queued``: the AllReduce ran in
        stragglerkit's one-at-a-time queue, so it started when handed over or when the previous
        queued one ended, whichever was later; ``False`` for the group's own all_reduce, which may
        overlap the others (gloo runs two at once): it starts when handed over.
        """
        timing.links = links
        end = time.monotonic_ns() if finish_ns is None else finish_ns
        with self._lock:
            timing.start_ns = max(timing.hook_ns, self._last_finish_ns) if queued else timing.hook_ns
            if links is not None:
                timing.link_start_ns = timing.start_ns if link_start_ns is None else link_start_ns
            timing.finish_ns = max(end, timing.start_ns)
            timing.algorithm = algorithm
            if queued:
                self._last_finish_ns = timing.finish_ns

    def buckets(self, step: int) -> list[BucketTiming]:
        with self._lock:
            return list(self._steps.get(step, ()))

    def step_arrival(self, step: int, num_buckets: int) -> StepArrival | None:
        """This rank's figures for ``step`` (``None`` if it has no finished bucket)."""
        done = [t for t in self.buckets(step) if t.finish_ns > 0]
        if not done:
            return None
        spans = [float("nan")] * num_buckets
        sizes = [0] * num_buckets
        algorithms = [""] * num_buckets
        for t in done:
            if 0 <= t.bucket < num_buckets:
                spans[t.bucket] = t.span
                sizes[t.bucket] = t.nbytes
                algorithms[t.bucket] = t.algorithm
        first = min(done, key=lambda t: t.hook_ns)
        last = max(done, key=lambda t: t.finish_ns)
        measured = [t for t in done if t.links is not None]
        link = max(measured, key=lambda t: t.nbytes) if measured else None
        extent_ns = last.finish_ns - min(t.start_ns for t in done)
        return StepArrival(
            step=step,
            total_span=extent_ns / 1e9,
            idle=(extent_ns - _union_ns(done)) / 1e9,
            arrival_wall=first.hook_wall_ns / 1e9,
            finish_wall=last.wall(last.finish_ns),
            bucket_spans=tuple(spans),
            bucket_bytes=tuple(sizes),
            algorithms=tuple(algorithms),
            link_enter_wall=link.wall(link.link_start_ns) if link is not None else float("nan"),
            links=link.links if link is not None else None,
        )


def last_arrivers(spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Clock-free: per row (step) of ``spans[step, rank]``, the last arriver and its delay.

    The last arriver waits least, so it is the rank with the smallest span; its delay is the second
    smallest span minus the smallest (StragglAR paper, §2: ``T_rest - T_straggler``). Rows with a NaN
    give rank -1 and delay NaN.

    Example::

        last_arrivers(np.array([[0.05, 0.01, 0.049]]))   # (array([1]), array([0.039]))
    """
    table = np.asarray(spans, dtype=np.float64)
    if table.ndim != 2 or table.shape[1] < 2:
        raise ValueError(f"spans must be a [steps, ranks] table with at least 2 ranks, got shape {table.shape}")
    valid = ~np.isnan(table).any(axis=1)
    ranks = np.full(table.shape[0], -1, dtype=np.int64)
    delays = np.full(table.shape[0], np.nan)
    if valid.any():
        rows = table[valid]
        order = np.argsort(rows, axis=1, kind="stable")
        ranks[valid] = order[:, 0]
        ordered = np.take_along_axis(rows, order[:, :2], axis=1)
        delays[valid] = ordered[:, 1] - ordered[:, 0]
    return ranks, delays


@dataclass(slots=True, frozen=True)
class ClockOffsets:
    """``offset_ns[r]``: add it to rank r's ``time.time_ns()`` to get rank 0's clock.

    ``rtt_ns[r]`` is the shortest round trip seen (the offset's uncertainty is at most half of it).
    """

    offset_ns: tuple[int, ...]
    rtt_ns: tuple[int, ...]

    @staticmethod
    def zero(world_size: int) -> ClockOffsets:
        return ClockOffsets((0,) * world_size, (0,) * world_size)

    def to_reference(self, wall_s: np.ndarray) -> np.ndarray:
        """``wall_s[..., rank]``: wall-clock seconds on each rank's clock, as seconds on rank 0's."""
        return np.asarray(wall_s, dtype=np.float64) + np.asarray(self.offset_ns, dtype=np.float64) / 1e9

    def per_host(self, hosts: list[int]) -> dict[int, int]:
        """The offset of each host (id -> ns): the one measured with the shortest round trip."""
        best: dict[int, tuple[int, int]] = {}
        for rank, host in enumerate(hosts):
            candidate = (self.rtt_ns[rank], self.offset_ns[rank])
            if host not in best or candidate < best[host]:
                best[host] = candidate
        return {host: offset for host, (_, offset) in best.items()}


def estimate_clock_offsets(group: dist.ProcessGroup, rounds: int = 8) -> ClockOffsets:
    """Ping-pong with rank 0 (collective over ``group``; call once at start-up on every rank).

    Rank 0 serves each other rank in turn: the rank sends its send time t1, rank 0 answers with
    its receive time t2, and the rank notes its receive time t3. ``offset = t2 - (t1 + t3) / 2``
    from the round with the shortest ``t3 - t1``. Runs on CPU tensors (use a gloo group).

    Example::

        offsets = estimate_clock_offsets(dist.new_group(backend="gloo"))
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    n = group.size()
    me = group.rank()
    message = torch.zeros(1, dtype=torch.int64)
    best = (2**62, 0)
    for other in range(1, n):
        for _ in range(rounds):
            if me == 0:
                group.recv([message], other, 7).wait()
                message[0] = time.time_ns()
                group.send([message], other, 7).wait()
            elif me == other:
                sent = time.time_ns()
                message[0] = sent
                group.send([message], 0, 7).wait()
                group.recv([message], 0, 7).wait()
                received = time.time_ns()
                rtt = received - sent
                offset = int(message[0]) - (sent + received) // 2
                best = min(best, (rtt, offset))
    mine = torch.tensor([best[1] if me else 0, best[0] if me else 0], dtype=torch.int64)
    gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(gathered, mine, group=group)
    return ClockOffsets(tuple(int(g[0]) for g in gathered), tuple(int(g[1]) for g in gathered))


def wall_clock_lateness(arrival_wall: np.ndarray, offsets: ClockOffsets) -> np.ndarray:
    """Per step and rank, seconds after the step's first arrival (``arrival_wall[step, rank]``, s).

    Example::

        lateness = wall_clock_lateness(arrivals, offsets)   # lateness[:, r].mean(): how late r is
    """
    corrected = offsets.to_reference(arrival_wall)
    return corrected - np.nanmin(corrected, axis=1, keepdims=True)
