"""Which algorithm runs: predicates say what applies, the cost model ranks it.

One rule, for the closed loop's controller and for ``all_reduce(algorithm="auto")`` alike:

1. **Candidates** are the algorithms built for the situation whose predicate accepts it
   (:func:`candidates`, from :func:`stragglerkit.schedules.registry.why_not`): StragglAR for a
   straggler (even n >= 4), OptCC and the balanced ring for degraded NICs (n >= 3, more healthy
   than degraded ranks).
2. **The baseline** runs unless a candidate is predicted at least ``min_gain`` faster: the loop's
   configured baseline; for ``auto`` the ring, or rhd for tensors of fewer elements than ranks
   (:func:`auto_baseline`: latency-bound, fewest rounds).
3. **Predictions** come from a cost model (:class:`~stragglerkit.planner.model.CostModelLike`):
   the default one (:data:`~stragglerkit.planner.model.DEFAULT_PRIOR`) or the one the loop fitted,
   with the straggler ``delay`` s late. A straggler of unknown delay (``all_reduce`` is told only
   who is late) is taken as late by StragglAR's pre-phase: the delay StragglAR is built to hide.

An explicitly named algorithm runs if its predicate accepts the situation; otherwise what ``auto``
chooses runs, and :attr:`Choice.why_fallback` says why (the runtime warns once per reason).

Example::

    model = Predictor(8)
    choose(Situation(world_size=8, straggler=3), 4 << 20, model).algorithm        # 'stragglar'
    choose(Situation(world_size=5, straggler=1), 4000, model, requested="stragglar").why_fallback
    # 'stragglar does not apply: it needs an even world size ...; running ring instead'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from stragglerkit.config import DetectionConfig
from stragglerkit.errors import ConfigError
from stragglerkit.planner.model import DEFAULT_PRIOR, CostModelLike, Predictor
from stragglerkit.schedules.registry import NIC_ALGORITHMS, Situation, names, why_not

__all__ = ["Choice", "auto_baseline", "candidates", "choose", "choose_algorithm"]


@dataclass(frozen=True, slots=True)
class Choice:
    """What :func:`choose` decided, and from what."""

    algorithm: str
    why_fallback: str | None = None
    """Why the requested algorithm does not run (``None``: it runs, or ``auto`` was asked)."""
    predicted_s: float = math.nan
    """The model's time for ``algorithm`` from the last arrival (NaN: nothing was predicted)."""
    baseline_s: float = math.nan
    """The model's time for the baseline (NaN: nothing was predicted)."""


def candidates(situation: Situation) -> list[str]:
    """The algorithms built for ``situation`` that apply to it, StragglAR first."""
    found = []
    if situation.straggler is not None and why_not("stragglar", situation) is None:
        found.append("stragglar")
    if any(slowdown > 1.0 for slowdown in situation.slowdowns.values()):
        found += [name for name in NIC_ALGORITHMS if why_not(name, situation) is None]
    return found


def auto_baseline(numel: int, world_size: int) -> str:
    """``auto``'s baseline: rhd for tensors of fewer elements than ranks, else the ring."""
    return "rhd" if numel < world_size else "ring"


def choose(
    situation: Situation,
    nbytes: int,
    model: CostModelLike,
    *,
    requested: str = "auto",
    baseline: str = "ring",
    min_gain: float = 0.0,
    min_bytes: int = 0,
    delay: float | None = None,
    blocked: Callable[[str], bool] | None = None,
) -> Choice:
    """The algorithm for a bucket of ``nbytes`` in ``situation`` (see the module docstring).

    ``min_bytes``: smaller buckets keep the baseline. ``delay``: how late the straggler is (s;
    ``None``: by StragglAR's pre-phase). ``blocked(algorithm)``: leave a candidate out (the loop's
    rolled-back plans).
    """
    if requested != "auto":
        if requested not in names():
            raise ConfigError(f"unknown algorithm {requested!r}; choose 'auto' or one of {', '.join(names())}")
        reason = why_not(requested, situation)
        if reason is None:
            return Choice(requested)
        fallback = choose(
            situation, nbytes, model, baseline=baseline, min_gain=min_gain, min_bytes=min_bytes, delay=delay
        )
        return Choice(
            fallback.algorithm,
            f"{requested} does not apply: it {reason}; running {fallback.algorithm} instead",
            fallback.predicted_s,
            fallback.baseline_s,
        )
    found = [name for name in candidates(situation) if blocked is None or not blocked(name)]
    if not found or nbytes < min_bytes:
        return Choice(baseline)
    straggler = situation.straggler
    if delay is None:
        delay = model.pre_phase(straggler, nbytes) if straggler is not None and "stragglar" in found else 0.0
    slowdowns = dict(situation.slowdowns)
    base_time = model.predict(baseline, nbytes, straggler=straggler, delay=delay, slowdowns=slowdowns)
    best, best_time = baseline, base_time
    for algorithm in found:
        predicted = model.predict(algorithm, nbytes, straggler=straggler, delay=delay, slowdowns=slowdowns)
        if predicted <= (1 - min_gain) * base_time and predicted < best_time:
            best, best_time = algorithm, predicted
    return Choice(best, None, best_time, base_time)


def choose_algorithm(
    requested: str, situation: Situation, numel: int, element_size: int = 4, model: CostModelLike | None = None
) -> tuple[str, str | None]:
    """``(algorithm, why_fallback)`` as ``all_reduce`` decides it for a tensor of ``numel``
    elements: :func:`choose` with ``auto``'s baseline, ``Config().detection``'s ``min_gain`` and
    ``model`` (default: the default model).

    Example::

        choose_algorithm("stragglar", Situation(world_size=5, straggler=1), 1000)
        # -> ("ring", "stragglar does not apply: it needs an even world size ...; running ring instead")
    """
    if model is None and situation.world_size >= 2:
        model = _default_model(situation.world_size)
    if model is None:  # one rank: nothing to predict, nothing applies but the baseline
        if requested != "auto" and requested not in names():
            raise ConfigError(f"unknown algorithm {requested!r}; choose 'auto' or one of {', '.join(names())}")
        return (requested if requested != "auto" else auto_baseline(numel, situation.world_size)), None
    chosen = choose(
        situation,
        numel * element_size,
        model,
        requested=requested,
        baseline=auto_baseline(numel, situation.world_size),
        min_gain=DetectionConfig().min_gain,
    )
    return chosen.algorithm, chosen.why_fallback


_DEFAULT_MODELS: dict[int, Predictor] = {}


def _default_model(world_size: int) -> Predictor:
    """The default model for ``world_size`` ranks (kept: its predictions are cached)."""
    model = _DEFAULT_MODELS.get(world_size)
    if model is None:
        model = _DEFAULT_MODELS.setdefault(world_size, Predictor(world_size, DEFAULT_PRIOR))
    return model
