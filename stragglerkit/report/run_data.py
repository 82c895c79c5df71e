"""The report's model of one run: per-step series, NIC rates, decisions, and the figures it leads to.

Whatever was read (event logs, bench JSON, profiler traces; :mod:`.inputs`), the report sees one
:class:`RunData`: per step the ranks' lateness, the AllReduce part and the step time, the
algorithms and the model's prediction; per stats exchange each rank's NIC rate; the loop's
decisions; for the AllReduce bench, measured against predicted per case. Anything unknown is None.

The summary figures (docs/report.md, "The summary"):

* **time lost to stragglers**: the sum over steps of the last rank's lateness -- the time the
  punctual ranks spent waiting for the last one;
* **time saved**, per plan change: the median AllReduce part (and step time, where known) over
  the steps before the switch (from the start of the detector's window when the detection says
  it) against the steps it stayed in force, and that difference times those steps; for the
  training bench, the plain copy's steady-state step time against the hooked copy's, as the bench
  reports it.

Example::

    run = RunData(kind="event log", world_size=4)
    run.steps.append(StepRecord(step=0, lateness_s=[0.0, 0.001, 0.0, 0.03], allreduce_s=0.011))
    lost_to_stragglers(run)      # 0.03
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DETECTIONS",
    "PLAN_CHANGES",
    "Comparison",
    "NicSample",
    "RunData",
    "Saving",
    "StepRecord",
    "last_ranks",
    "lost_to_stragglers",
    "plan_label",
    "savings",
]

PLAN_CHANGES = ("switch", "rollback", "cleared")
DETECTIONS = ("detected_straggler", "detected_degraded")


@dataclass(kw_only=True, slots=True)
class StepRecord:
    """One training step (or one AllReduce of a benchmark)."""

    step: int
    lateness_s: list[float | None] | None = None
    """Per rank: arrival after the step's first arrival."""
    allreduce_s: float | None = None
    """Last arrival to last finish."""
    step_time_s: float | None = None
    """The step as the user sees it (from the previous step's last finish to this one's)."""
    baseline_step_s: float | None = None
    """The same step without stragglerkit (the training bench's plain copy)."""
    algorithm: str | None = None
    """What ran: the plan's algorithms, ``+``-joined when buckets differ."""
    predicted_s: float | None = None
    label: str = ""
    """Group of steps this one belongs to (a bench case), for the figures."""


@dataclass(kw_only=True, slots=True)
class NicSample:
    """Each rank's achieved NIC rate (and the detector's slowdown) at one stats exchange."""

    step: int
    rates_Bps: list[float | None]
    slowdown: list[float | None] | None = None


@dataclass(kw_only=True, slots=True)
class Comparison:
    """One benchmark case: measured against predicted AllReduce time."""

    label: str
    algorithm: str
    measured_s: float
    predicted_s: float | None
    speedup: float | None = None


@dataclass(kw_only=True, slots=True)
class Saving:
    """What one plan change did to the AllReduce part and the step time."""

    step: int
    kind: str
    algorithm: str
    before_steps: tuple[int, int] | None
    after_steps: tuple[int, int] | None
    allreduce_before_s: float | None = None
    allreduce_after_s: float | None = None
    step_before_s: float | None = None
    step_after_s: float | None = None
    saved_s: float | None = None
    """(before - after) x the steps after, by step time where known, else by the AllReduce part."""


@dataclass(kw_only=True, slots=True)
class RunData:
    """Everything the report shows about one run."""

    kind: str
    """What it was read from: "event log", "bench (allreduce)", "bench (train)", "torch.profiler", "nsys"."""
    world_size: int | None = None
    run_id: str | None = None
    framework: str | None = None
    version: str | None = None
    hosts: list[str] | None = None
    started: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    ranks_seen: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    nic: list[NicSample] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    kernels: dict[int, tuple[int, float]] = field(default_factory=dict)
    """Per rank (nsys): number and total seconds of collective kernels."""
    lateness_note: str = ""
    """How lateness was obtained, when not measured directly (shown under its figures)."""
    step_time_note: str = ""
    bench_saving: dict[str, Any] | None = None
    """Training bench: plain against hooked in steady state (the bench's own figures)."""
    notes: list[str] = field(default_factory=list)

    def detections(self) -> list[dict[str, Any]]:
        return [d for d in self.decisions if d["kind"] in DETECTIONS]


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def last_ranks(run: RunData) -> list[tuple[int, int]]:
    """(step, the rank that arrived last) for every step whose lateness is known for two ranks or more."""
    out = []
    for record in run.steps:
        known = [(v, r) for r, v in enumerate(record.lateness_s or []) if v is not None]
        if len(known) >= 2:
            out.append((record.step, max(known)[1]))
    return out


def lost_to_stragglers(run: RunData) -> float | None:
    """The sum over steps of the last rank's lateness (None without lateness)."""
    total = 0.0
    seen = False
    for record in run.steps:
        known = [v for v in record.lateness_s or [] if v is not None]
        if len(known) >= 2:
            total += max(known)
            seen = True
    return total if seen else None


def _window_start(run: RunData, before: int) -> int | None:
    """The first step of the latest detection's window before step ``before``."""
    for decision in reversed(run.decisions):
        if decision["kind"] in DETECTIONS and decision["step"] <= before:
            window = decision.get("evidence", {}).get("window")
            if isinstance(window, list) and len(window) == 2 and isinstance(window[0], int):
                return int(window[0])
            return None
    return None


_PLAN_KEYS = {"switch": "to", "rollback": "restored", "verified": "kept"}


def plan_label(run: RunData, decision: dict[str, Any]) -> str:
    """What ran under the plan a decision left in force: its buckets' algorithms (``+``-joined) as the
    evidence describes the plan, else as the first step from the decision on ran, else the event's
    ``algorithm`` (the plan's default)."""
    evidence = decision.get("evidence") or {}
    plan = evidence.get(_PLAN_KEYS.get(decision["kind"], "")) or evidence.get("plan")  # "plan": ranks other than 0
    if isinstance(plan, dict) and ("buckets" in plan or "default" in plan):
        buckets = [str(b) for b in plan.get("buckets") or [] if b]
        return "+".join(dict.fromkeys(buckets)) if buckets else str(plan.get("default", "?"))
    after = next((r.algorithm for r in run.steps if r.step >= decision["step"] and r.algorithm), None)
    return after or str(decision.get("algorithm", "?"))


def savings(run: RunData) -> list[Saving]:
    """Per plan change, the AllReduce part and step time before and after (see the module docstring)."""
    changes = [d for d in run.decisions if d["kind"] in PLAN_CHANGES]
    by_step = {r.step: r for r in run.steps}
    steps = sorted(by_step)
    out = []
    for index, change in enumerate(changes):
        at = int(change["step"])
        previous = int(changes[index - 1]["step"]) if index else None
        start = _window_start(run, at)
        lo = max(x for x in (start, previous, steps[0] if steps else None) if x is not None) if steps else None
        end = int(changes[index + 1]["step"]) if index + 1 < len(changes) else None
        before = [s for s in steps if lo is not None and lo <= s < at]
        after = [s for s in steps if s >= at and (end is None or s < end)]
        saving = Saving(
            step=at,
            kind=change["kind"],
            algorithm=plan_label(run, change),
            before_steps=(before[0], before[-1]) if before else None,
            after_steps=(after[0], after[-1]) if after else None,
        )

        def med(chosen: list[int], attr: str) -> float | None:
            return _median([v for s in chosen if (v := getattr(by_step[s], attr)) is not None])

        saving.allreduce_before_s, saving.allreduce_after_s = med(before, "allreduce_s"), med(after, "allreduce_s")
        saving.step_before_s, saving.step_after_s = med(before, "step_time_s"), med(after, "step_time_s")
        pair = (saving.step_before_s, saving.step_after_s)
        if None in pair:
            pair = (saving.allreduce_before_s, saving.allreduce_after_s)
        if pair[0] is not None and pair[1] is not None and after:
            saving.saved_s = (pair[0] - pair[1]) * len(after)
        out.append(saving)
    return out
