"""The controller's cost model, fitted online from the executor's own timings.

What it decides. The controller must predict, for each bucket size, how long each applicable
algorithm takes from the last rank's arrival, given the measured straggler delay and NIC
slowdowns. The parameters come from the job itself:

* **Samples.** Every baseline AllReduce (ring, rhd, direct) of every bucket is a sample: its
  time from the last arrival is, clock-free, the *smallest* span over the ranks (the last
  arriver does not wait). With the process group's own all_reduce as the baseline, the samples
  come from the hook's ring probes (``Config.detection.probe_every``). With the schedule's
  GenModel terms (:func:`stragglerkit.sim.cost_model.cost_terms`) this is one row of
  :func:`stragglerkit.sim.cost_model.fit` (non-negative least squares).
* **Samples on a degraded cluster.** The fit is of the *healthy* NIC: predictions put a degraded
  rank's NIC at ``1/(l·beta)`` themselves. A sample taken while the slowest NIC ran at 1/l (the
  controller passes the detector's confirmed l) is fitted with its bandwidth term times l
  (``add(..., slowest=l)``): a baseline's critical path
  moves its bytes at the slowest NIC's pace (exact for the ring, where every rank sends the same
  bytes each step; first order for rhd and direct). Without it the samples of a degraded
  cluster would be fitted as a slow healthy bandwidth, and every prediction would carry the
  degraded NIC twice. The detector confirms a degraded NIC only after a window of probes that
  saw it slow; the samples of those probes were added before anyone knew, so the controller
  re-tags them once it knows (:meth:`OnlineModel.rescale`, by the step each sample came from).
* **Fitting** alpha and beta needs buckets of at least two sizes (the A/B ratio must vary). A
  model with a single bucket size cannot tell them apart; then only beta is fitted and alpha stays
  at the prior (``defaults.PRIOR_ALPHA``). So it is with fewer than three samples: from the
  first probe on, beta comes from the job (the prior's bandwidth can be ten times off and would
  steer the first decisions); the prior is used as is only before any sample. When
  the bandwidth term comes out as zero (small buckets on a fast link: noise dominates the bytes),
  the model is latency-only (beta = 1e-12 s/B) and says so in ``fit_info``.
* **Which model.** The same samples also fit the richer models of
  :data:`stragglerkit.sim.cost_model.MODELS`: alpha-beta-gamma (a per-byte reduction cost)
  and GenModel (plus memory access and incast, each only where the samples can separate it from
  the others: :func:`~stragglerkit.sim.cost_model.identifiable_params`). Every candidate is
  scored *prequentially*: each new sample is first predicted by the candidates as fitted so far,
  then added. Scored by the median relative error over its last :data:`SCORE_WINDOW` unseen
  samples, a richer candidate drives the predictions only if it beats the simpler one by
  :data:`REQUIRED_GAIN` (alpha-beta until each has :data:`MIN_SCORED` scores); ``fit_info["model"]``
  names it and ``fit_info["model_errors"]`` gives the scores. ``stragglerkit bench --mode
  calibrate`` measured the three on this testbed (docs/results.md, "Cost model"). A sample's
  critical path is traced with a token reduction cost, so that among equally long paths the one
  through the reductions is taken and gamma has terms to be fitted from.
* **Predicting** runs the flow-level simulator (:func:`stragglerkit.sim.simulator.simulate`) on a
  network of per-rank NICs at ``1/beta`` (``1/(l·beta)`` for a degraded rank), latency alpha, the
  straggler arriving ``delay`` late: ``time_from_last_arrival`` is the figure compared. It models
  what GenModel's closed terms cannot: StragglAR's pre-phase overlapping the delay and a slow
  NIC's effect on each algorithm.
  The chosen model's gamma and delta become the simulator's local-op costs (GenModel's epsilon is
  not carried over: the simulator shares a NIC among concurrent flows itself).
  Ring, the balanced ring, direct and StragglAR (uniform network, no reduction cost) are timed by
  the exact fast paths of :mod:`stragglerkit.sim.fast` without building their plans (milliseconds
  at 1,024 ranks); the others, OptCC among them, and every algorithm under a model with a
  reduction cost, by simulating the plan.
* **Critical delay** for StragglAR on a bucket: the delay from which it is predicted to save
  ``min_gain`` of ring's time. With ``T_pre`` the punctual ranks' pre-phase time and ``T_hidden``
  StragglAR's time when the pre-phase is fully hidden, its time is about
  ``T_hidden + max(0, T_pre - d)``, so ``d* = T_pre - ((1 - min_gain)·T_ring - T_hidden)``
  (``inf`` when even a fully hidden pre-phase does not pay).

Example::

    model = OnlineModel(world_size=4, prior=CostModelParams(alpha=50e-6, beta=1 / 1e9))
    model.add("ring", 4 << 20, 0.012)
    model.refit()
    model.predict("stragglar", 4 << 20, straggler=3, delay=0.01)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from typing import Any

import numpy as np

from stragglerkit.planner.model import MODELLED_AS, Predictor
from stragglerkit.planner.policy import planned_situation
from stragglerkit.planner.schedules import schedule_for
from stragglerkit.schedules.ir import Schedule
from stragglerkit.sim.cost_model import (
    MODELS,
    CostModel,
    CostModelParams,
    CostTerms,
    cost_terms,
    fit,
    identifiable_params,
)

__all__ = ["BASELINES", "MODELLED_AS", "OnlineModel"]

UNRESOLVED_BETA = 1e-12
"""Seconds per byte used when the fit finds no bandwidth term (1 TB/s: transfers cost ~nothing)."""
MIN_SCORED = 8
"""Unseen samples each candidate model must have predicted before the loop may leave alpha-beta."""
SCORE_WINDOW = 64
"""The last this many unseen samples score a candidate."""
REQUIRED_GAIN = 0.25
"""A richer candidate replaces a simpler one only if it cuts the simpler one's median error on
unseen samples by this share (and by 0.5 points at least). The calibration (docs/results.md, "Cost
model") found alpha-beta-gamma ahead of alpha-beta by 8 % of its error on one cluster's baseline
probes, yet its decisions among all algorithms measured worse there: an edge on the baselines
alone is not evidence enough."""
BASELINES = ("ring", "rhd", "direct")
"""Algorithms whose runs feed the fit (they do not depend on who is late)."""
class OnlineModel:
    """Samples, the fitted parameters and cached predictions (see the module docstring).

    Example::

        model.add("ring", nbytes, seconds); model.refit(); model.predict("ring", nbytes)
    """

    __slots__ = (
        "_candidates",
        "_fitted_revision",
        "_path_weights",
        "_predictor",
        "_revision",
        "_scores",
        "_terms",
        "config",
        "fit_info",
        "max_samples",
        "samples",
        "world_size",
    )

    def __init__(self, world_size: int, prior: CostModelParams, max_samples: int = 256) -> None:
        if world_size < 2:
            raise ValueError(f"the model needs at least 2 ranks, got {world_size}")
        self.world_size = world_size
        self.config = dataclasses.replace(prior)
        self.max_samples = max_samples
        self.samples: deque[tuple[str, int, float, float, int]] = deque(maxlen=max_samples)
        """(algorithm, bytes, seconds, slowest l, step) per measured baseline AllReduce."""
        self.fit_info: dict[str, Any] = {"fitted": False, "params": "prior"}
        self._terms: dict[tuple[str, int], CostTerms] = {}
        self._predictor = Predictor(world_size, self.config)
        """Predictions under the current parameters (a new one after each fit: its cache is theirs)."""
        self._revision = 0  # counts changes to the samples; a refit of unchanged samples is skipped
        self._fitted_revision = -1
        self._candidates: dict[str, CostModelParams] = {}
        self._scores: dict[str, deque[float]] = {}
        # the critical path of a sample is traced with a token reduction cost, so that among paths
        # of equal length the one through the reductions is taken and gamma can be fitted
        self._path_weights = dataclasses.replace(prior, gamma=prior.beta * 1e-3, delta=0.0, epsilon=0.0)

    # -- checkpoints ----------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__ if name != "_predictor"}

    def __setstate__(self, state: Any) -> None:
        """Also a model pickled by an earlier version (``(None, slots)``, with its own caches of
        schedules, graphs and predictions): its samples and fit are kept, the caches rebuilt."""
        slots = state[1] if isinstance(state, tuple) else state
        for name in self.__slots__:
            if name in slots and name != "_predictor":
                setattr(self, name, slots[name])
        self._predictor = Predictor(self.world_size, self.config)

    # -- fitting --------------------------------------------------------------------------------
    def add(self, algorithm: str, nbytes: int, seconds: float, slowest: float = 1.0, step: int = -1) -> None:
        """One measured AllReduce of a baseline algorithm (time from the last arrival), run at
        ``step`` while the slowest NIC was at ``1/slowest`` of the others (module docstring)."""
        if not (math.isfinite(slowest) and slowest >= 1.0):
            raise ValueError(f"slowest must be a slowdown l >= 1 (1: every NIC healthy), got {slowest}")
        if algorithm in BASELINES and nbytes > 0 and math.isfinite(seconds) and seconds > 0:
            if self._candidates:
                self._score(self._scaled_terms(algorithm, int(nbytes), slowest), float(seconds))
            self.samples.append((algorithm, int(nbytes), float(seconds), float(slowest), int(step)))
            self._revision += 1

    def rescale(self, steps: set[int], slowest: float) -> int:
        """Re-tag the samples of ``steps`` as taken while the slowest NIC ran at ``1/slowest``
        (where they were tagged lower); returns how many changed. Call :meth:`refit` after."""
        if not (math.isfinite(slowest) and slowest >= 1.0):
            raise ValueError(f"slowest must be a slowdown l >= 1 (1: every NIC healthy), got {slowest}")
        changed = 0
        for i, (algorithm, nbytes, seconds, tagged, step) in enumerate(self.samples):
            if step in steps and tagged < slowest:
                self.samples[i] = (algorithm, nbytes, seconds, slowest, step)
                changed += 1
        self._revision += changed
        return changed

    def _sample_terms(self, algorithm: str, nbytes: int) -> CostTerms:
        key = (algorithm, nbytes)
        terms = self._terms.get(key)
        if terms is None:
            terms = cost_terms(self.schedule(algorithm), nbytes, weights=self._path_weights)
            self._terms[key] = terms
        return terms

    def _scaled_terms(self, algorithm: str, nbytes: int, slowest: float) -> CostTerms:
        terms = self._sample_terms(algorithm, nbytes)
        return terms if slowest == 1.0 else dataclasses.replace(terms, B=terms.B * slowest)

    def refit(self) -> dict[str, Any]:
        """Fit every candidate model, keep the one that predicted best; returns ``fit_info``.

        Unchanged samples since the last fit: nothing to do (the cached predictions stay valid;
        the controller calls this every exchange, and most exchanges bring no sample).
        """
        if self._revision == self._fitted_revision:
            return self.fit_info
        self._fitted_revision = self._revision
        rows = [(self._scaled_terms(a, b, slowest), s) for a, b, s, slowest, _ in self.samples]
        if not rows:
            return self.fit_info
        # beta alone from the first sample on: one probe puts the bandwidth within its noise, where
        # the prior can be ten times off (10 Gbit/s against a 1 Gbit/s cluster) and would steer
        # the first decisions; alpha and beta together need three samples of two sizes
        beta_only: str | None = None
        if len(rows) < 3:
            beta_only = f"{len(rows)} sample{'s' if len(rows) > 1 else ''}"
        elif len({(a, b) for a, b, *_ in self.samples}) < 2:
            beta_only = "one bucket size"
        base, described, rms = self._fit_alpha_beta(rows, beta_only)
        fits: dict[str, tuple[CostModelParams, str]] = {"alpha-beta": (base, described)}
        for name, wanted in MODELS.items():
            if name in fits:
                continue
            fits[name] = (base, f"as alpha-beta ({beta_only})") if beta_only else self._fit_more(rows, wanted, base)
        self._candidates = {name: config for name, (config, _) in fits.items()}
        chosen = self._choose()
        config, described = fits[chosen]
        if chosen != "alpha-beta":
            predicted = np.array([CostModel(config).predict_terms(t) for t, _ in rows])
            rms = float(np.sqrt(np.mean((predicted / np.array([s for _, s in rows]) - 1.0) ** 2)))
        self.config = dataclasses.replace(
            self.config, alpha=config.alpha, beta=config.beta, gamma=config.gamma, delta=config.delta
        )
        self._predictor = Predictor(self.world_size, self.config)
        self.fit_info = {
            "fitted": True,
            "params": described,
            "alpha_s": self.config.alpha,
            "bandwidth_Bps": 1.0 / self.config.beta,
            "gamma_s_per_B": self.config.gamma,
            "delta_s_per_B": self.config.delta,
            "relative_rms": round(rms, 4),
            "samples": len(rows),
            "model": chosen,
            "candidates": {name: text for name, (_, text) in fits.items()},
            "model_errors": {
                name: round(statistics.median(abs(e) for e in errors), 4) if errors else None
                for name, errors in self._scores.items()
            },
        }
        return self.fit_info

    def _fit_alpha_beta(
        self, rows: list[tuple[CostTerms, float]], beta_only: str | None
    ) -> tuple[CostModelParams, str, float]:
        """Alpha and beta, or beta alone for the reason ``beta_only`` (fewer than three samples,
        or one bucket size; see the module docstring)."""
        try:
            if beta_only:
                # too few samples, or one bucket size (scaling by l must not pass for a second
                # size: alpha and beta would be told apart by the slowdowns' noise alone)
                raise ValueError(beta_only)
            result = fit(rows, params=("alpha", "beta"))
            alpha, beta, rms = result.config.alpha, result.config.beta, result.relative_rms
            params = "alpha, beta"
        except ValueError:
            alpha = self.config.alpha
            terms = np.array([[t.A, t.B] for t, _ in rows])
            seconds = np.array([s for _, s in rows])
            # least squares on the relative error with alpha held: minimise sum ((A a + B b) / t - 1)^2
            x = terms[:, 1] / seconds
            y = 1.0 - terms[:, 0] * alpha / seconds
            beta = float(max((x @ y) / max(x @ x, 1e-300), 0.0))
            rms = float(np.sqrt(np.mean(((terms @ [alpha, beta]) / seconds - 1.0) ** 2)))
            params = f"beta ({beta_only or 'alpha and beta inseparable'}: alpha held at the prior)"
        if beta <= 0:  # noise hid the bandwidth term (latency-bound buckets): a latency-only model
            beta = UNRESOLVED_BETA
            params += "; bandwidth unresolved, taken as 1 TB/s"
        return CostModelParams(alpha=alpha, beta=beta), params, rms

    @staticmethod
    def _fit_more(
        rows: list[tuple[CostTerms, float]], wanted: tuple[str, ...], base: CostModelParams
    ) -> tuple[CostModelParams, str]:
        """A model with more terms than alpha and beta: the parameters the samples can separate."""
        kept, folded = identifiable_params(rows, wanted)
        if set(kept) <= {"alpha", "beta"}:
            return base, f"as alpha-beta ({', '.join(folded) or 'nothing more'} not separable from its samples)"
        try:
            result = fit(rows, params=kept)
        except ValueError as err:
            return base, f"as alpha-beta ({err})"
        if result.config.beta <= 0:
            return base, "as alpha-beta (bandwidth unresolved)"
        return result.config, ", ".join(kept)

    def _score(self, terms: CostTerms, seconds: float) -> None:
        """Prequential score: each fitted candidate's relative error on a sample it has not seen."""
        for name, config in self._candidates.items():
            predicted = CostModel(config).predict_terms(terms)
            self._scores.setdefault(name, deque(maxlen=SCORE_WINDOW)).append(predicted / seconds - 1.0)

    def _choose(self) -> str:
        """The simplest candidate that no richer one beats by :data:`REQUIRED_GAIN` on unseen
        samples; alpha-beta until each has :data:`MIN_SCORED` scores."""
        scored = {
            name: statistics.median(abs(e) for e in errors)
            for name, errors in self._scores.items()
            if len(errors) >= MIN_SCORED and name in self._candidates
        }
        if len(scored) < len(self._candidates):
            return "alpha-beta"
        chosen = "alpha-beta"
        for name in MODELS:  # simplest first
            error = scored[chosen]
            if scored[name] < min(error * (1.0 - REQUIRED_GAIN), error - 0.005):
                chosen = name
        return chosen

    # -- predicting (the planner's Predictor under the fitted parameters) -------------------------
    @property
    def predictor(self) -> Predictor:
        """The planner's predictions under the current (fitted or prior) parameters."""
        return self._predictor

    def schedule(
        self,
        algorithm: str,
        straggler: int | None = None,
        slowdowns: tuple[tuple[int, float], ...] = (),
        nbytes: int = 0,
    ) -> Schedule:
        """The schedule the runtime runs for a bucket of ``nbytes`` (``planner.policy.planned_situation``:
        OptCC's segments and bubble filling depend on the size), from the planner's one cache."""
        return schedule_for(
            algorithm, planned_situation(algorithm, self.world_size, straggler, dict(slowdowns), nbytes)
        )

    def predict(
        self,
        algorithm: str,
        nbytes: int,
        *,
        straggler: int | None = None,
        delay: float = 0.0,
        slowdowns: dict[int, float] | None = None,
        planned_slowdowns: dict[int, float] | None = None,
        planned_straggler: int | None = None,
    ) -> float:
        """Predicted seconds from the last arrival (:meth:`stragglerkit.planner.model.Predictor.predict`)."""
        return self._predictor.predict(
            algorithm,
            nbytes,
            straggler=straggler,
            delay=delay,
            slowdowns=slowdowns,
            planned_slowdowns=planned_slowdowns,
            planned_straggler=planned_straggler,
        )

    def pre_phase(self, straggler: int, nbytes: int) -> float:
        """Seconds of StragglAR's pre-phase among the punctual ranks (:meth:`Predictor.pre_phase`)."""
        return self._predictor.pre_phase(straggler, nbytes)

    def critical_delay(self, straggler: int, nbytes: int, baseline: str, min_gain: float) -> float:
        """Smallest delay (s) from which StragglAR saves ``min_gain`` of ``baseline`` on ``nbytes``."""
        return self._predictor.critical_delay(straggler, nbytes, baseline, min_gain)
