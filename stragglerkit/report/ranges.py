"""Profiler ranges of several ranks on one time axis, and the steps they describe.

torch.profiler traces (:mod:`.torch_trace`) and Nsight Systems exports (:mod:`.nsys`) both give,
per rank, the ``stragglerkit/...`` ranges (docs/report.md, "Range names") on that rank's own clock.
Ranks on different hosts do not share a clock, so before two ranks' times are compared each rank
is shifted onto rank 0's:

* **Alignment.** A collective ends at nearly the same instant on every rank (the last rank's
  data reaches everyone at the end), so the k-th ``stragglerkit/all_reduce`` range of rank r and
  of rank 0 end together. Rank r's offset is the median over k of ``end_r[k] - end_0[k]``; the
  median ignores the odd AllReduce whose end one rank saw late (a descheduled thread). Without
  rank 0 the lowest rank present is the reference. Ranks with different numbers of AllReduce
  ranges are matched on the first ones (and the difference is reported).
* **Steps.** ``stragglerkit/step S`` starts when the rank hands over step S's first bucket: its
  arrival. Every ``stragglerkit/all_reduce`` range belongs to the step whose range started last
  before it on that rank (also the ring inside a ``stragglerkit/probe``: a probe reduces its
  bucket while it measures the links). Per step: the lateness of each rank (its arrival after the first), the
  AllReduce part (last arrival to the last end of the step's AllReduce ranges) and the algorithms
  that ran. Without step ranges (a program that calls ``stragglerkit.all_reduce`` itself) each
  AllReduce is a step of its own, numbered in call order.

Example::

    aligned, offsets, problems = align({0: ranks0, 1: ranks1})
    steps = steps_from_ranges(aligned)       # [TraceStep(step=0, lateness_s=[0.0, 0.012], ...), ...]
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from stragglerkit.errors import StragglerKitError

__all__ = ["InputError", "Range", "RankRanges", "TraceStep", "align", "decisions_from_ranges", "steps_from_ranges"]

PREFIX = "stragglerkit/"
_STEP = re.compile(r"^stragglerkit/step (\d+)$")
_ALLREDUCE = "stragglerkit/all_reduce"
_DECISION = re.compile(r"^stragglerkit/decision (\w+)$")


class InputError(StragglerKitError, ValueError):
    """An input of ``stragglerkit report`` that cannot be read as what it claims to be (the message names it)."""


@dataclass(frozen=True, slots=True)
class Range:
    """One range: its name and start and end in seconds."""

    name: str
    start: float
    end: float


@dataclass(kw_only=True, slots=True)
class RankRanges:
    """One rank's ``stragglerkit/`` ranges (and, from nsys, its collective kernels)."""

    path: str
    rank: int
    world_size: int | None
    ranges: list[Range] = field(default_factory=list)
    kernels: list[Range] = field(default_factory=list)
    """GPU collective kernels (Nsight Systems exports only)."""
    source: str = "torch.profiler"

    def allreduce_ends(self) -> list[float]:
        return [r.end for r in self.ranges if r.name.startswith(_ALLREDUCE)]

    def shifted(self, offset: float) -> RankRanges:
        return RankRanges(
            path=self.path,
            rank=self.rank,
            world_size=self.world_size,
            ranges=[Range(r.name, r.start - offset, r.end - offset) for r in self.ranges],
            kernels=[Range(k.name, k.start - offset, k.end - offset) for k in self.kernels],
            source=self.source,
        )


@dataclass(kw_only=True, slots=True)
class TraceStep:
    """One step as the ranges tell it."""

    step: int
    lateness_s: list[float | None]
    allreduce_s: float | None
    algorithms: list[str]
    end_s: float | None


def align(ranks: dict[int, RankRanges]) -> tuple[dict[int, RankRanges], dict[int, float], list[str]]:
    """Shift every rank onto the reference rank's clock (see the module docstring).

    Returns the shifted ranges, each rank's offset in seconds and problems (ranks that could not be
    aligned are kept unshifted and named).
    """
    if not ranks:
        return {}, {}, []
    reference = min(ranks)
    base = ranks[reference].allreduce_ends()
    problems: list[str] = []
    offsets: dict[int, float] = {reference: 0.0}
    for rank, mine in sorted(ranks.items()):
        if rank == reference:
            continue
        ends = mine.allreduce_ends()
        count = min(len(ends), len(base))
        if count == 0:
            problems.append(
                f"{mine.path}: no stragglerkit/all_reduce ranges to align rank {rank}'s clock with rank {reference}'s; "
                "its times are used as they are"
            )
            offsets[rank] = 0.0
            continue
        if len(ends) != len(base):
            problems.append(
                f"{mine.path}: rank {rank} has {len(ends)} stragglerkit/all_reduce ranges, rank {reference} "
                f"{len(base)}; aligned on the first {count}"
            )
        offsets[rank] = float(statistics.median(e - b for e, b in zip(ends[:count], base[:count])))
    return {rank: r.shifted(offsets[rank]) for rank, r in ranks.items()}, offsets, problems


def _arrivals(ranges: list[Range]) -> list[tuple[int, float]]:
    out = []
    for r in ranges:
        match = _STEP.match(r.name)
        if match:
            out.append((int(match.group(1)), r.start))
    return out


def steps_from_ranges(ranks: dict[int, RankRanges], world_size: int) -> list[TraceStep]:
    """Per step: lateness per rank, the AllReduce part and the algorithms (see the module docstring)."""
    arrival: dict[int, dict[int, float]] = {}
    ends: dict[int, dict[int, float]] = {}
    algorithms: dict[int, dict[str, None]] = {}
    have_steps = any(_arrivals(r.ranges) for r in ranks.values())
    for rank, mine in ranks.items():
        ordered = sorted(mine.ranges, key=lambda r: r.start)
        current: int | None = None
        calls = 0
        for r in ordered:
            match = _STEP.match(r.name)
            if match:
                current = int(match.group(1))
                arrival.setdefault(current, {})[rank] = r.start
                continue
            if not r.name.startswith(_ALLREDUCE):
                continue
            if not have_steps:
                current = calls
                calls += 1
                arrival.setdefault(current, {})[rank] = r.start
            if current is None:
                continue
            ends.setdefault(current, {})
            ends[current][rank] = max(ends[current].get(rank, r.end), r.end)
            algorithm = r.name[len(_ALLREDUCE) :].strip() or "?"
            algorithms.setdefault(current, {})[algorithm] = None
    out = []
    for step in sorted(arrival):
        got = arrival[step]
        first = min(got.values())
        lateness: list[float | None] = [got[r] - first if r in got else None for r in range(world_size)]
        finish = ends.get(step, {})
        allreduce = None
        if finish and len(got) == len(ranks):
            allreduce = max(finish.values()) - max(got.values())
        out.append(
            TraceStep(
                step=step,
                lateness_s=lateness,
                allreduce_s=allreduce,
                algorithms=list(algorithms.get(step, {})),
                end_s=max(finish.values()) if finish else None,
            )
        )
    return out


def decisions_from_ranges(ranks: dict[int, RankRanges]) -> list[tuple[int, str]]:
    """(step, kind) of each ``stragglerkit/decision <kind>`` range on the lowest rank present."""
    if not ranks:
        return []
    mine = sorted(ranks[min(ranks)].ranges, key=lambda r: r.start)
    out: list[tuple[int, str]] = []
    current = 0
    for r in mine:
        step = _STEP.match(r.name)
        if step:
            current = int(step.group(1))
        decision = _DECISION.match(r.name)
        if decision:
            out.append((current, decision.group(1)))
    return out
