"""Fault injection for benchmarks: late ranks (stragglers, jitter) and degraded NICs.

A benchmark calls ``injector.before_allreduce(step, rank)`` on every rank just before it enters
the AllReduce of that step; the injector sleeps for that rank's delay. Delays are a pure
function of (seed, step, rank), so every rank computes the same figures without talking to the
others and a run can be repeated exactly.

- :class:`StragglerInjector`: a *persistent straggler*. The chosen rank(s) enter every AllReduce
  late, by a fixed delay, a delay drawn from a distribution, or ``"auto"``: a time that the
  caller measured and passes in (for example the others' pre-phase ReduceScatter time, the
  delay StragglAR is built to hide), optionally scaled.
- :class:`JitterInjector`: non-persistent noise. Every rank is late by a random amount in
  [0, max_delay] drawn afresh each step, so the last rank changes from step to step.
- :class:`NicDegradation`: degraded servers. Rank r runs on emulated host r; ``apply(cluster)``
  reshapes those hosts' links to bandwidth / l with the cluster's ``set_slowdown``.

Delay specifications as text (for command lines and configs), times with units:
``"5ms"`` fixed; ``"uniform:2ms:8ms"``; ``"exp:5ms"`` (exponential with that mean);
``"normal:5ms:1ms"`` (mean, standard deviation; negative draws become 0); ``"auto"`` or
``"auto:1.5"`` (the measured time times 1.5).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from stragglerkit.units import parse_time

__all__ = [
    "AutoDelay",
    "CombinedInjector",
    "DelayInjector",
    "DrawnDelay",
    "FixedDelay",
    "JitterInjector",
    "NicDegradation",
    "StragglerInjector",
    "parse_delay",
    "sleep_precisely",
]

_DISTRIBUTIONS = ("uniform", "exp", "normal")
_SPIN_SECONDS = 0.0005  # the last half millisecond of a sleep is spent spinning, for precision


def _rng(seed: int, step: int, rank: int, salt: str) -> random.Random:
    # Seeding with a string hashes it with SHA-512: the same in every process and Python run.
    return random.Random(f"{salt}:{seed}:{step}:{rank}")


def sleep_precisely(seconds: float) -> float:
    """Sleeps ``seconds`` (sleep, then spin for the last 0.5 ms); returns the time actually slept."""
    start = time.perf_counter()
    if seconds <= 0:
        return 0.0
    deadline = start + seconds
    if seconds > _SPIN_SECONDS:
        time.sleep(seconds - _SPIN_SECONDS)
    while time.perf_counter() < deadline:
        pass
    return time.perf_counter() - start


# --------------------------------------------------------------------------- delay models


@dataclass(frozen=True, slots=True)
class FixedDelay:
    """The same delay every step."""

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds >= 0:
            raise ValueError(f"a delay must be >= 0 seconds, got {self.seconds!r}")

    def sample(self, step: int, rank: int, measured: float | None) -> float:
        return self.seconds


@dataclass(frozen=True, slots=True)
class DrawnDelay:
    """A delay drawn each step from a distribution, reproducibly from (seed, step, rank).

    ``uniform``: a = low, b = high. ``exp``: a = mean. ``normal``: a = mean, b = standard
    deviation, negative draws clipped to 0.
    """

    distribution: str
    a: float
    b: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.distribution not in _DISTRIBUTIONS:
            raise ValueError(f"unknown delay distribution {self.distribution!r}; use one of {_DISTRIBUTIONS}")
        if self.a < 0 or self.b < 0:
            raise ValueError(f"delay parameters must be >= 0 seconds, got {self.a!r}, {self.b!r}")
        if self.distribution == "uniform" and self.b < self.a:
            raise ValueError(f"uniform delay needs low <= high, got {self.a!r} > {self.b!r}")

    def sample(self, step: int, rank: int, measured: float | None) -> float:
        rng = _rng(self.seed, step, rank, "straggler")
        if self.distribution == "uniform":
            return rng.uniform(self.a, self.b)
        if self.distribution == "exp":
            return rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        return max(0.0, rng.gauss(self.a, self.b))


@dataclass(frozen=True, slots=True)
class AutoDelay:
    """``scale`` times a time the caller measured (e.g. the others' ReduceScatter time)."""

    scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.scale >= 0:
            raise ValueError(f"auto delay scale must be >= 0, got {self.scale!r}")

    def sample(self, step: int, rank: int, measured: float | None) -> float:
        if measured is None:
            raise ValueError(
                "an 'auto' delay needs the measured time: pass measured=SECONDS to delay_for/before_allreduce "
                "or call calibrate(SECONDS) first"
            )
        if not measured >= 0:
            raise ValueError(f"measured time must be >= 0 seconds, got {measured!r}")
        return self.scale * measured


DelayModel = FixedDelay | DrawnDelay | AutoDelay


def parse_delay(spec: str | float | DelayModel, *, seed: int = 0) -> DelayModel:
    """Turns ``5ms``, ``uniform:2ms:8ms``, ``exp:5ms``, ``normal:5ms:1ms``, ``auto[:SCALE]`` or seconds into a model."""
    if isinstance(spec, FixedDelay | DrawnDelay | AutoDelay):
        return spec
    if isinstance(spec, int | float):
        return FixedDelay(float(spec))
    parts = [p.strip() for p in spec.split(":")]
    kind = parts[0].lower()
    try:
        if kind == "auto" and len(parts) <= 2:
            return AutoDelay(float(parts[1]) if len(parts) == 2 else 1.0)
        if kind == "uniform" and len(parts) == 3:
            return DrawnDelay("uniform", parse_time(parts[1]), parse_time(parts[2]), seed)
        if kind == "exp" and len(parts) == 2:
            return DrawnDelay("exp", parse_time(parts[1]), 0.0, seed)
        if kind == "normal" and len(parts) == 3:
            return DrawnDelay("normal", parse_time(parts[1]), parse_time(parts[2]), seed)
        if len(parts) == 1:
            return FixedDelay(parse_time(parts[0]))
    except ValueError as exc:
        raise ValueError(f"cannot read delay {spec!r}: {exc}") from exc
    raise ValueError(
        f"cannot read delay {spec!r}; write 5ms, uniform:2ms:8ms, exp:5ms, normal:5ms:1ms, auto or auto:1.5"
    )


# --------------------------------------------------------------------------- injectors


class DelayInjector(Protocol):
    """What a benchmark calls before every AllReduce."""

    def delay_for(self, step: int, rank: int, *, measured: float | None = None) -> float: ...

    def before_allreduce(self, step: int, rank: int, *, measured: float | None = None) -> float: ...


def _check_step_rank(step: int, rank: int) -> None:
    if step < 0 or rank < 0:
        raise ValueError(f"step and rank must be >= 0, got step={step}, rank={rank}")


class StragglerInjector:
    """Persistent straggler(s): ``rank`` enters every AllReduce late by ``delay``.

    Example::

        injector = StragglerInjector(rank=3, delay="exp:5ms", seed=1)
        for step in range(steps):
            injector.before_allreduce(step, my_rank)    # sleeps only on rank 3
            stragglerkit.all_reduce(bucket, ...)

        auto = StragglerInjector(rank=3, delay="auto")   # delay = measured pre-phase time
        auto.calibrate(measured_reduce_scatter_seconds)
    """

    __slots__ = ("_measured", "delay", "ranks", "seed")

    def __init__(self, *, rank: int | Sequence[int], delay: str | float | DelayModel, seed: int = 0) -> None:
        ranks = (rank,) if isinstance(rank, int) else tuple(rank)
        if not ranks or any(not isinstance(r, int) or r < 0 for r in ranks):
            raise ValueError(f"rank must be a rank >= 0 or a non-empty list of them, got {rank!r}")
        self.ranks: frozenset[int] = frozenset(ranks)
        self.seed = seed
        self.delay: DelayModel = parse_delay(delay, seed=seed)
        self._measured: float | None = None

    def calibrate(self, measured: float) -> None:
        """Sets the measured time that an ``auto`` delay uses when none is passed per call."""
        if not measured >= 0:
            raise ValueError(f"measured time must be >= 0 seconds, got {measured!r}")
        self._measured = measured

    def delay_for(self, step: int, rank: int, *, measured: float | None = None) -> float:
        """Seconds ``rank`` is late at ``step`` (0 for ranks that are not stragglers)."""
        _check_step_rank(step, rank)
        if rank not in self.ranks:
            return 0.0
        return self.delay.sample(step, rank, measured if measured is not None else self._measured)

    def before_allreduce(self, step: int, rank: int, *, measured: float | None = None) -> float:
        """Sleeps this rank's delay for ``step``; returns the time slept."""
        return sleep_precisely(self.delay_for(step, rank, measured=measured))

    def __repr__(self) -> str:
        return f"StragglerInjector(rank={sorted(self.ranks)}, delay={self.delay!r}, seed={self.seed})"


class JitterInjector:
    """Random non-persistent lateness: every rank is late by uniform[0, max_delay] each step.

    Example::

        jitter = JitterInjector(max_delay=2e-3, seed=7)   # --jitter 2ms
        jitter.before_allreduce(step, my_rank)
    """

    __slots__ = ("max_delay", "seed")

    def __init__(self, *, max_delay: float | str, seed: int = 0) -> None:
        seconds = parse_time(max_delay) if isinstance(max_delay, str) else float(max_delay)
        if not seconds >= 0:
            raise ValueError(f"max_delay must be >= 0 seconds, got {max_delay!r}")
        self.max_delay = seconds
        self.seed = seed

    def delay_for(self, step: int, rank: int, *, measured: float | None = None) -> float:
        _check_step_rank(step, rank)
        return _rng(self.seed, step, rank, "jitter").uniform(0.0, self.max_delay)

    def before_allreduce(self, step: int, rank: int, *, measured: float | None = None) -> float:
        return sleep_precisely(self.delay_for(step, rank))

    def __repr__(self) -> str:
        return f"JitterInjector(max_delay={self.max_delay!r}, seed={self.seed})"


class CombinedInjector:
    """Several injectors at once (e.g. a persistent straggler plus jitter): the delays add up."""

    __slots__ = ("parts",)

    def __init__(self, parts: Iterable[DelayInjector]) -> None:
        self.parts = tuple(parts)

    def delay_for(self, step: int, rank: int, *, measured: float | None = None) -> float:
        return sum(part.delay_for(step, rank, measured=measured) for part in self.parts)

    def before_allreduce(self, step: int, rank: int, *, measured: float | None = None) -> float:
        return sleep_precisely(self.delay_for(step, rank, measured=measured))


# --------------------------------------------------------------------------- degraded NICs


class SlowdownTarget(Protocol):
    """What NicDegradation needs from a cluster (EmulatedCluster provides it)."""

    @property
    def hosts(self) -> int: ...

    def slowdown(self, host: int) -> float: ...

    def set_slowdown(self, host: int, slowdown: float, *, verify: bool = False) -> object: ...


class NicDegradation:
    """Degraded servers: rank r's NIC at 1/l of the bandwidth (one rank per emulated host).

    Example::

        degraded = NicDegradation.parse("3:2,5:1.5")     # --degrade 3:2,5:1.5
        with degraded.applied(cluster, verify=True):
            run_benchmark()
    """

    __slots__ = ("slowdowns",)

    def __init__(self, slowdowns: Mapping[int, float]) -> None:
        for rank, slowdown in slowdowns.items():
            if not isinstance(rank, int) or rank < 0:
                raise ValueError(f"degraded rank must be an integer >= 0, got {rank!r}")
            if not slowdown >= 1.0:
                raise ValueError(f"slowdown l of rank {rank} must be >= 1 (NIC at bandwidth / l), got {slowdown!r}")
        self.slowdowns = dict(slowdowns)

    @classmethod
    def parse(cls, text: str) -> NicDegradation:
        """``"3:2,5:1.5"`` -> rank 3 at half the bandwidth, rank 5 at 1/1.5 of it."""
        slowdowns: dict[int, float] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            rank_text, sep, l_text = item.partition(":")
            try:
                if not sep:
                    raise ValueError("missing ':'")
                rank = int(rank_text)
                if rank in slowdowns:
                    raise ValueError(f"rank {rank} given twice")
                slowdowns[rank] = float(l_text)
            except ValueError as exc:
                raise ValueError(
                    f"cannot read degraded NIC {item!r} in {text!r} ({exc}); write RANK:L, e.g. 3:2"
                ) from exc
        return cls(slowdowns)

    def apply(self, cluster: SlowdownTarget, *, verify: bool = False) -> list[object]:
        """Reshapes each degraded rank's host; with ``verify`` returns the measured (send, recv) rates."""
        for rank in self.slowdowns:
            if rank >= cluster.hosts:
                raise ValueError(f"degraded rank {rank} does not exist: the cluster has {cluster.hosts} hosts")
        return [cluster.set_slowdown(rank, slowdown, verify=verify) for rank, slowdown in self.slowdowns.items()]

    @contextmanager
    def applied(self, cluster: SlowdownTarget, *, verify: bool = False) -> Iterator[list[object]]:
        """Applies the degradation for the duration of a ``with`` block, then restores the old rates."""
        previous = {rank: cluster.slowdown(rank) for rank in self.slowdowns if rank < cluster.hosts}
        try:
            yield self.apply(cluster, verify=verify)
        finally:
            for rank, slowdown in previous.items():
                cluster.set_slowdown(rank, slowdown)

    def __repr__(self) -> str:
        return f"NicDegradation({self.slowdowns!r})"
