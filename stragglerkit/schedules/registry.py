"""Which algorithms exist, when each applies, and one entry point that builds any of them.

Predicates choose algorithms (as in horovod's operation manager): :data:`ALGORITHMS` is an ordered
list of :class:`AlgorithmSpec`, each with an ``applies(situation)`` predicate that returns ``None``
when the algorithm applies and otherwise the reason it does not. The cost model ranks the ones that
apply; :func:`generate` builds one, mapped onto the real straggler's rank when it has one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules.ir import Schedule

__all__ = ["ALGORITHMS", "NIC_ALGORITHMS", "AlgorithmSpec", "Situation", "applicable", "generate", "names", "why_not"]


@dataclass(slots=True, frozen=True, kw_only=True)
class Situation:
    """What a caller knows about the group when choosing or building an algorithm."""

    world_size: int
    """Number of ranks in the group."""
    straggler: int | None = None
    """Rank of the persistent straggler, if one is known."""
    slowdowns: dict[int, float] = field(default_factory=dict)
    """Degraded ranks: rank -> slowdown l (its NIC runs at 1/l of the healthy bandwidth)."""
    segments: int = 64
    """Pipeline segments for OptCC."""
    bubble_filling: bool = True
    """OptCC fills the straggler's idle link time when ``l < 2`` (``optcc(bubble_filling=...)``)."""
    gpus_per_server: int = 1
    """Ranks that share one server's NICs (OptCC appendix E)."""
    optcc_sizing: str = "closed_form"
    """How OptCC sizes its chunks (``optcc(sizing=...)``: ``closed_form``, ``auto`` or ``lp``)."""

    def key(self) -> tuple[object, ...]:
        """Every field as a hashable tuple (slowdowns sorted): the part of a plan cache's key that
        says which situation the plan was built for."""
        return (
            self.world_size,
            self.straggler,
            tuple(sorted(self.slowdowns.items())),
            self.segments,
            self.bubble_filling,
            self.gpus_per_server,
            self.optcc_sizing,
        )


@dataclass(slots=True, frozen=True)
class AlgorithmSpec:
    name: str
    module: str
    """Module under stragglerkit.schedules holding the generator of the same name."""
    applies: Callable[[Situation], str | None]
    """``None`` when the algorithm applies to the situation, else the reason it does not."""
    summary: str


def _needs_two(s: Situation) -> str | None:
    return None if s.world_size >= 2 else f"needs at least 2 ranks (world_size={s.world_size})"


def _stragglar_applies(s: Situation) -> str | None:
    if s.world_size < 4 or s.world_size % 2:
        return f"needs an even world size of at least 4 (world_size={s.world_size})"
    return None


def _optcc_applies(s: Situation) -> str | None:
    g = s.gpus_per_server
    if g < 1 or s.world_size % g:
        return f"needs gpus_per_server ({g}) to divide the world size ({s.world_size})"
    servers = s.world_size // g
    unit = "servers" if g > 1 else "ranks"
    if servers < 3:
        return f"needs at least 3 {unit} ({servers} here)"
    degraded = {rank // g for rank, slow in s.slowdowns.items() if slow > 1.0}
    if not degraded:
        return "needs at least one degraded rank (slowdown l > 1)"
    if len(degraded) * 2 > servers:
        return f"needs at least as many healthy {unit} as degraded ones ({len(degraded)} of {servers} are degraded)"
    return None


ALGORITHMS: list[AlgorithmSpec] = [
    AlgorithmSpec("ring", "ring", _needs_two, "bandwidth-optimal ring (reduce-scatter + all-gather)"),
    AlgorithmSpec("rhd", "rhd", _needs_two, "recursive halving/doubling, 2·log2(n) rounds"),
    AlgorithmSpec("direct", "direct", _needs_two, "straggler-aware broadcast baseline (StragglAR paper, §4.1)"),
    AlgorithmSpec("stragglar", "stragglar", _stragglar_applies, "StragglAR: pre-phase reduce-scatter + matching"),
    AlgorithmSpec("optcc", "optcc", _optcc_applies, "OptCC: four-stage pipeline around degraded NICs"),
    AlgorithmSpec(
        "balanced_ring", "balanced_ring", _needs_two, "ring whose chunks are sized so that slow NICs carry less"
    ),
]
_BY_NAME = {spec.name: spec for spec in ALGORITHMS}

NIC_ALGORITHMS = ("optcc", "balanced_ring")
"""The algorithms built for degraded NICs: they take the ``slowdowns`` (the others ignore them)."""


def names() -> list[str]:
    return [spec.name for spec in ALGORITHMS]


def _spec(algorithm: str) -> AlgorithmSpec:
    try:
        return _BY_NAME[algorithm]
    except KeyError:
        raise NotApplicableError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(names())}") from None


def why_not(algorithm: str, situation: Situation) -> str | None:
    """``None`` if ``algorithm`` applies to ``situation``, else the reason."""
    return _spec(algorithm).applies(situation)


def applicable(situation: Situation) -> list[str]:
    """Names of the algorithms that apply, in registry order."""
    return [spec.name for spec in ALGORITHMS if spec.applies(situation) is None]


def generate(algorithm: str, situation: Situation) -> Schedule:
    """Build ``algorithm`` for ``situation`` (logical ranks = the group's ranks).

    Straggler-aware algorithms are built with the straggler at logical rank n-1 and relabelled
    so that the real straggler plays that part.

    Example::

        sched = generate("stragglar", Situation(world_size=8, straggler=3))
    """
    spec = _spec(algorithm)
    reason = spec.applies(situation)
    if reason is not None:
        others = ", ".join(applicable(situation)) or "none"
        raise NotApplicableError(f"{algorithm} does not apply: it {reason}. Algorithms that apply here: {others}")
    module = importlib.import_module(f"stragglerkit.schedules.{spec.module}")
    generator = getattr(module, spec.name)
    n = situation.world_size
    if spec.name == "optcc":
        sched: Schedule = generator(
            n,
            dict(situation.slowdowns),
            segments=situation.segments,
            gpus_per_server=situation.gpus_per_server,
            bubble_filling=situation.bubble_filling,
            sizing=situation.optcc_sizing,
        )
        return sched
    if spec.name == "balanced_ring":
        ring_sched: Schedule = generator(n, dict(situation.slowdowns))
        return ring_sched
    if spec.name in ("stragglar", "direct"):
        sched = generator(n)
        straggler = situation.straggler if situation.straggler is not None else n - 1
        if not 0 <= straggler < n:
            raise NotApplicableError(f"straggler rank {straggler} is not a rank of 0..{n - 1}")
        if straggler != n - 1:
            perm = list(range(n))
            perm[n - 1], perm[straggler] = straggler, n - 1
            sched = sched.relabel(perm)
        sched.params["straggler"] = straggler
        return sched
    sched = generator(n)
    return sched
