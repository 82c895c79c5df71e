"""The progress model: how likely a worker still in training is to finish within the next ``dt``.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Section III-D-1 ("The Probability Model") and Eq. (4); cold and warm start from Section IV-B-5.

``T`` is the time one training iteration takes; ``F(x) = P(T <= x)`` its distribution, taken as the
empirical distribution of observed iteration times (the fraction of samples ``<= x``). A worker
that started its iteration ``t`` seconds ago and has not reported finishes within ``dt`` with

    P(T <= t + dt | T > t) = (F(t + dt) - F(t)) / (1 - F(t))

*Where the paper is vague.* Eq. (4) ends with ``= F(t + dt)``, by setting ``P(T > t) = 1`` because
the worker is known to be still running. That equals the conditional probability only while
``F(t) = 0`` (``t`` below every observed time); beyond it ``F(t + dt)`` overstates the chance and
reaches 1 for a worker that has overrun every observed iteration, so BPAWR would keep waiting for a
worker that may never come. The default here, ``formula="conditional"``, is the left-hand side as
written; ``formula="paper"`` gives ``F(t + dt)`` for reproducing the paper's numbers. When no sample
exceeds ``t`` (``1 - F(t) = 0``) the conditional estimate is 0: nothing observed says the worker is
about to finish, so no group is held for it (the controller's ``worker_timeout`` deals with a
worker that never reports). With no samples at all the estimate is 0: a cold controller groups by
bandwidth only until it has seen iterations.

One distribution for all workers (the paper's ``F_Phi``: one per model and setting), fed by every
worker's iteration times. *Cold start*: starts empty and learns online (:meth:`ProgressModel.cold`).
*Warm start*: a known sample of iteration times, fixed unless ``learn=True``
(:meth:`ProgressModel.warm`). ``window`` keeps only the latest samples so a drifting job is tracked.

Example::

    model = ProgressModel.warm([1.0, 2.0, 3.0, 4.0])
    model.finish_within(1.5, 1.0)     # F(2.5)=0.5, F(1.5)=0.25 -> (0.5-0.25)/0.75 = 1/3
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from typing import Literal

from stragglerkit.errors import ConfigError

__all__ = ["ProgressModel"]

Formula = Literal["conditional", "paper"]


class ProgressModel:
    """The empirical distribution of iteration times and the finish-within-``dt`` estimate from it."""

    __slots__ = ("_arrival", "_sorted", "formula", "learn", "window")

    def __init__(
        self,
        samples: Iterable[float] = (),
        *,
        learn: bool = True,
        window: int | None = 10_000,
        formula: Formula = "conditional",
    ) -> None:
        if formula not in ("conditional", "paper"):
            raise ConfigError(f"progress formula must be 'conditional' or 'paper', got {formula!r}")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ConfigError(f"progress window must be a whole number of samples >= 1 or None, got {window!r}")
        self.formula: Formula = formula
        self.learn = bool(learn)
        self.window = window
        self._arrival: deque[float] = deque()
        self._sorted: list[float] = []
        for sample in samples:
            self._add(sample)

    @classmethod
    def cold(cls, *, window: int | None = 10_000, formula: Formula = "conditional") -> ProgressModel:
        """No prior knowledge: learn the distribution from the iterations the controller observes."""
        return cls((), learn=True, window=window, formula=formula)

    @classmethod
    def warm(cls, samples: Iterable[float], *, learn: bool = False, formula: Formula = "conditional") -> ProgressModel:
        """A known distribution, given as a sample of iteration times (seconds); fixed unless ``learn``."""
        model = cls(samples, learn=learn, window=None, formula=formula)
        if not model._sorted:
            raise ConfigError("a warm-start progress model needs at least one iteration time; use cold() for none")
        return model

    def __len__(self) -> int:
        return len(self._sorted)

    def _add(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise ConfigError(f"an iteration time must be finite seconds >= 0, got {seconds!r}")
        if seconds < 0:
            raise ConfigError(f"an iteration time must be finite seconds >= 0, got {seconds!r}")
        value = float(seconds)
        bisect.insort(self._sorted, value)
        self._arrival.append(value)
        if self.window is not None and len(self._arrival) > self.window:
            old = self._arrival.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]

    def observe(self, seconds: float) -> None:
        """Record one finished iteration's time (ignored by a warm model made without ``learn``)."""
        if self.learn:
            self._add(seconds)

    def cdf(self, x: float) -> float:
        """``F(x)``: the fraction of observed iteration times ``<= x`` (0 with no samples)."""
        if not self._sorted:
            return 0.0
        return bisect.bisect_right(self._sorted, x) / len(self._sorted)

    def finish_within(self, elapsed: float, dt: float) -> float:
        """The probability that a worker ``elapsed`` seconds into its iteration finishes within ``dt``.

        ``formula="conditional"``: ``P(T <= elapsed + dt | T > elapsed)``; ``"paper"``: ``F(elapsed + dt)``
        (Eq. (4)'s last line). See the module docstring for the cases without evidence.
        """
        if not self._sorted:
            return 0.0
        later = self.cdf(elapsed + dt)
        if self.formula == "paper":
            return later
        now = self.cdf(elapsed)
        if now >= 1.0:
            return 0.0
        return (later - now) / (1.0 - now)
