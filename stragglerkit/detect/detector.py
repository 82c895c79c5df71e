"""Decides, with evidence, whether there is a persistent straggler, degraded ranks, or nothing.

What it decides and why.

* **Persistent straggler.** Over the last ``W`` steps (``detection.window``), the clock-free
  last arriver of each step (:func:`stragglerkit.detect.arrival.last_arrivers`: the rank with the
  smallest time in the step's AllReduces) is counted per rank. A rank that is last in at least a
  fraction ``q`` of the window, with a median delay (second-last minus last span, over the steps
  it was last) of at least the *critical delay* -- the delay at which the cost model predicts that
  a straggler-aware plan pays, supplied by the caller -- is a candidate. StragglAR pays only when
  the straggler is late *every* step (the punctual ranks' pre-phase must be hidden in its delay),
  so a fraction rather than an average delay: random jitter spread over all ranks makes each rank
  last in about ``1/n`` of the steps and is never acted on.
* **Late because of compute, not because of the previous AllReduce.** A rank that finished the
  previous step's AllReduce late arrives late at this one even if it computes no longer than the
  others: gloo's own AllReduce ends tens of milliseconds apart over the ranks when one NIC is
  slow, and a probe
  step's ring ends in another order than the steps around it. So where the caller supplies each
  rank's *gap* -- from the end of its previous AllReduce to this step's first hand-over, on its
  own clock (no clock offsets needed) -- a step counts as the last arriver's only when that rank
  also had the longest gap, and its delay is the smaller of the span delay and the gap delay
  (longest minus second-longest gap). A step whose last arriver did not compute longest counts
  for nobody (``inherited_steps`` in the evidence; ``median_gaps_s`` has each rank's median
  gap). A rank that sleeps or computes longer before its hand-over has both the smallest span
  and the longest gap, so a real straggler is unaffected.
* **Degraded ranks.** ``l_i`` (:mod:`stragglerkit.detect.nic_health`) is estimated once per stats
  exchange that has a ring run's link figures (with the ``allreduce`` baseline: a probe
  step's). A rank is degraded when, over the
  estimates of the last ``W`` steps, the median and at least a fraction ``q`` of them are at least
  ``degraded_threshold``; the figure reported is the median. Exchanges without an estimate
  (e.g. while OptCC runs) leave the belief as it is.
* **Hysteresis.** Entering needs the condition in ``confirm`` consecutive evaluations (windows
  overlap, so one burst of noise does not suffice); leaving needs a clearly weaker condition
  (straggler: last in fewer than ``clear_fraction`` of the steps, or a median delay below
  ``clear_delay_ratio`` times the critical delay; degraded: median ``l`` below
  ``clear_degraded_threshold``) for ``confirm`` consecutive evaluations. A straggler that moves is
  a new candidate; once confirmed it replaces the old one (one ``detected_straggler`` finding).

The detector is pure bookkeeping on numbers (no communication): the controller feeds it the
gathered statistics on rank 0, and tests feed it synthetic streams.

Example::

    detector = Detector(Settings.of(window=16, late_fraction=0.75))
    findings = detector.update(steps, spans, slowdowns, critical_delay=lambda rank: 0.004)
    for f in findings:
        print(f.kind, f.ranks, f.evidence)
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stragglerkit.detect import legacy
from stragglerkit.detect.arrival import last_arrivers
from stragglerkit.detect.settings import Settings

__all__ = ["Detector", "Finding"]

DetectorConfig = legacy.DetectorConfig
"""Kept only so that checkpoints of earlier versions, which pickled it here, unpickle."""


@dataclass(slots=True, frozen=True)
class Finding:
    """A change of what the detector believes."""

    kind: str
    """``detected_straggler``, ``detected_degraded`` or ``cleared``."""
    ranks: dict[int, float]
    """Straggler: {rank: median delay s}; degraded: {rank: l}; cleared: what was cleared."""
    evidence: dict[str, Any] = field(default_factory=dict)


def _tally(rows: list[np.ndarray], gap_rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Per step of ``rows`` (each ``[rank]`` spans) the last arriver and its delay, per rank how many
    steps it was last in, and how many steps' last arrivers were late only by inheritance.

    ``gap_rows`` (same steps; all-NaN where unknown): a step whose gaps are all known counts for its
    last arriver only if that rank also had the longest gap; the delay is then the smaller of the
    span delay and the gap delay (see the module docstring).
    """
    last, delays = last_arrivers(np.stack(rows))
    gaps = np.stack(gap_rows)
    known = np.flatnonzero(~np.isnan(gaps).any(axis=1) & (last >= 0))
    order = np.argsort(-gaps[known], axis=1, kind="stable")
    top_two = np.take_along_axis(gaps[known], order[:, :2], axis=1)
    agrees = order[:, 0] == last[known]
    inherited, counted = known[~agrees], known[agrees]
    last[inherited] = -1
    delays[inherited] = np.nan
    delays[counted] = np.minimum(delays[counted], top_two[agrees, 0] - top_two[agrees, 1])
    return last, delays, np.bincount(last[last >= 0], minlength=rows[0].size), int(inherited.size)


def _median_delay(last: np.ndarray, delays: np.ndarray, rank: int) -> float:
    """``rank``'s median delay over the steps it was last in (0 if none)."""
    mine = delays[last == rank]
    return float(np.median(mine)) if mine.size else 0.0


def _rounded(values: Sequence[float] | np.ndarray, digits: int = 6) -> list[float | None]:
    return [None if not math.isfinite(float(v)) else round(float(v), digits) for v in values]


class Detector:
    """Keeps the window and the believed state; :meth:`update` returns what changed.

    Example::

        d = Detector()
        d.update([0, 1], spans=np.array([[0.1, 0.1, 0.02, 0.1]] * 2), slowdowns=np.ones(4),
                 critical_delay=lambda rank: 0.01)
    """

    __slots__ = (
        "_clear_count",
        "_degraded_clear",
        "_degraded_enter",
        "_enter_count",
        "_enter_rank",
        "_gap_rows",
        "_l_history",
        "_l_keep",
        "_last",
        "_span_rows",
        "_steps",
        "degraded",
        "settings",
        "straggler",
    )

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings if settings is not None else Settings()
        """The detection fields (``window``, ``late_fraction``, ``confirm``, ``degraded_threshold``)
        and the clearing thresholds (``clear_*``, :mod:`stragglerkit.defaults`)."""
        window = self.settings.detection.window
        self.straggler: int | None = None
        """The confirmed persistent straggler (group rank), if any."""
        self.degraded: dict[int, float] = {}
        """Confirmed degraded ranks -> l."""
        self._steps: deque[int] = deque(maxlen=window)
        self._span_rows: deque[np.ndarray] = deque(maxlen=window)
        self._gap_rows: deque[np.ndarray] = deque(maxlen=window)
        self._l_history: deque[np.ndarray] = deque()
        self._l_keep = 1
        self._enter_rank = -1
        self._enter_count = 0
        self._clear_count = 0
        self._degraded_enter: dict[int, int] = {}
        self._degraded_clear: dict[int, int] = {}
        self._last: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: Any) -> None:
        slots = legacy.restore_slots(self, state)
        old = slots.pop("config", None)
        if old is not None:  # pickled by an earlier version, with its DetectorConfig
            slots["settings"] = old.settings()
        for name, value in slots.items():
            setattr(self, name, value)

    @property
    def l_window(self) -> np.ndarray | None:
        """The ``l`` estimates the degraded decisions are taken over, ``[estimate, rank]`` (oldest
        first; NaN: not measured), once the window is full; else None."""
        if not self._l_history or len(self._l_history) < self._l_keep:
            return None
        return np.stack(self._l_history)

    @property
    def last_evidence(self) -> dict[str, Any]:
        """The evidence of the latest evaluation (also when nothing changed)."""
        return self._last

    def most_often_last(self, steps: int | None = None) -> tuple[int, float, float] | None:
        """Over the latest ``steps`` steps of the window (default: all it holds): the rank most often
        last, the share of those steps it was last in, and its median delay (s) over them. None
        while the window is empty. Cheap: the window holds at most ``W`` steps."""
        rows = list(self._span_rows)[-steps:] if steps else list(self._span_rows)
        if not rows:
            return None
        last, delays, counts, _ = _tally(rows, list(self._gap_rows)[-len(rows) :])
        rank = int(np.argmax(counts))
        return rank, float(counts[rank]) / len(rows), _median_delay(last, delays, rank)

    def reset_window(self) -> None:
        """Forget the window (e.g. after a plan switch changed what the spans mean)."""
        self._steps.clear()
        self._span_rows.clear()
        self._gap_rows.clear()
        self._enter_count = 0
        self._clear_count = 0

    def update(
        self,
        steps: Sequence[int],
        spans: np.ndarray,
        slowdowns: np.ndarray | None,
        critical_delay: Callable[[int], float],
        steps_per_estimate: int | None = None,
        gaps: np.ndarray | None = None,
    ) -> list[Finding]:
        """Add ``spans[i, rank]`` (total AllReduce seconds of ``steps[i]``) and one ``l`` estimate per rank.

        ``critical_delay(rank)``: the smallest delay (s) at which acting on a straggler at ``rank``
        pays (``math.inf``: never). ``steps_per_estimate``: how many steps one ``l`` estimate stands
        for (default ``len(steps)``; more when links are measured only on probe steps), so that the
        degraded window covers ``W`` steps. ``gaps[i, rank]``: seconds from the end of the rank's
        previous AllReduce to its first hand-over of ``steps[i]``, on its own clock (NaN: unknown;
        ``None``: none known); it tells lateness from compute from lateness inherited from the
        previous AllReduce (module docstring). Returns the findings of this evaluation (usually none).
        """
        table = np.asarray(spans, dtype=np.float64)
        if table.ndim != 2 or table.shape[0] != len(steps):
            raise ValueError(f"spans must have one row per step ({len(steps)}), got shape {table.shape}")
        gap_table = np.full(table.shape, np.nan) if gaps is None else np.asarray(gaps, dtype=np.float64)
        if gap_table.shape != table.shape:
            raise ValueError(f"gaps must have the shape of spans {table.shape}, got {gap_table.shape}")
        for step, row, gap_row in zip(steps, table, gap_table):
            self._steps.append(int(step))
            self._span_rows.append(row)
            self._gap_rows.append(gap_row)
        findings = self._straggler(critical_delay)
        if slowdowns is not None:
            per_estimate = len(steps) if steps_per_estimate is None else steps_per_estimate
            findings += self._degraded(np.asarray(slowdowns, dtype=np.float64), max(1, per_estimate))
        return findings

    # -- persistent straggler -------------------------------------------------------------------
    def _straggler(self, critical_delay: Callable[[int], float]) -> list[Finding]:
        cfg, detection = self.settings, self.settings.detection
        if len(self._span_rows) < detection.window:
            self._last = {"window_filled": len(self._span_rows), "window": detection.window}
            return []
        last, delays, counts, inherited = _tally(list(self._span_rows), list(self._gap_rows))
        candidate = int(np.argmax(counts))
        fraction = counts / detection.window

        def median_delay(rank: int) -> float:
            return _median_delay(last, delays, rank)

        cand_delay = median_delay(candidate)
        cand_critical = float(critical_delay(candidate))
        evidence: dict[str, Any] = {
            "window": [self._steps[0], self._steps[-1]],
            "last_counts": counts.tolist(),
            "candidate": candidate,
            "fraction": round(float(fraction[candidate]), 4),
            "median_delay_s": round(cand_delay, 6),
            "critical_delay_s": None if not math.isfinite(cand_critical) else round(cand_critical, 6),
            "delays_s": _rounded(delays[last == candidate]),
            "inherited_steps": inherited,
        }
        gaps = np.stack(list(self._gap_rows))
        if not np.isnan(gaps).all():
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a rank with no known gap: NaN
                evidence["median_gaps_s"] = _rounded(np.nanmedian(gaps, axis=0))
        self._last = evidence
        persistent = fraction[candidate] >= detection.late_fraction and cand_delay >= cand_critical
        current = self.straggler
        if persistent and candidate != current:
            self._enter_count = self._enter_count + 1 if self._enter_rank == candidate else 1
            self._enter_rank = candidate
            if self._enter_count >= detection.confirm:
                self.straggler = candidate
                self._enter_count = 0
                self._clear_count = 0
                if current is not None:
                    evidence["moved_from"] = current
                return [Finding("detected_straggler", {candidate: cand_delay}, evidence)]
            return []
        if not persistent:
            self._enter_count = 0
        if current is None:
            return []
        cur_delay = median_delay(current)
        cur_critical = float(critical_delay(current))
        weak = fraction[current] < cfg.clear_fraction or cur_delay < cfg.clear_delay_ratio * cur_critical
        self._clear_count = self._clear_count + 1 if weak else 0
        if self._clear_count >= detection.confirm:
            self.straggler = None
            self._clear_count = 0
            cleared = dict(evidence, cleared="straggler", rank=current, rank_fraction=float(fraction[current]))
            return [Finding("cleared", {current: cur_delay}, cleared)]
        return []

    # -- degraded ranks -------------------------------------------------------------------------
    def _degraded(self, estimate: np.ndarray, steps_per_update: int) -> list[Finding]:
        cfg, detection = self.settings, self.settings.detection
        keep = max(1, math.ceil(detection.window / steps_per_update))
        self._l_keep = keep
        if np.isnan(estimate).all():  # nothing measured (no ring run in this exchange): keep the belief
            return []
        self._l_history.append(estimate)
        while len(self._l_history) > keep:
            self._l_history.popleft()
        if len(self._l_history) < keep:
            return []
        history = np.stack(self._l_history)
        filled = np.where(np.isnan(history), 1.0, history)
        median = np.median(filled, axis=0)
        share_above = (filled >= detection.degraded_threshold).mean(axis=0)
        evidence = {"l_estimates": [_rounded(row, 4) for row in history], "l_median": _rounded(median, 4)}
        self._last = dict(self._last, **evidence)
        findings: list[Finding] = []
        newly = {}
        for rank in range(median.size):
            if rank in self.degraded:
                weak = median[rank] < cfg.clear_degraded_threshold
                self._degraded_clear[rank] = self._degraded_clear.get(rank, 0) + 1 if weak else 0
                if self._degraded_clear[rank] >= detection.confirm:
                    del self.degraded[rank]
                    self._degraded_clear[rank] = 0
                    findings.append(Finding("cleared", {rank: float(median[rank])}, dict(evidence, cleared="degraded")))
                else:
                    self.degraded[rank] = float(median[rank])
                continue
            strong = median[rank] >= detection.degraded_threshold and share_above[rank] >= detection.late_fraction
            self._degraded_enter[rank] = self._degraded_enter.get(rank, 0) + 1 if strong else 0
            if self._degraded_enter[rank] >= detection.confirm:
                self._degraded_enter[rank] = 0
                newly[rank] = round(float(median[rank]), 4)
        if newly:
            self.degraded.update(newly)
            findings.append(Finding("detected_degraded", dict(newly), dict(evidence, degraded=dict(self.degraded))))
        return findings
