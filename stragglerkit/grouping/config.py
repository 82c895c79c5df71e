"""``SelectiveConfig``: the parameters of selective reduce, as the paper names them.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce" (Luo,
Liu, Rao, Li, Xing), Table II and Section III-E: ``p`` (smallest group), ``eta`` (BAG's bandwidth
tolerance), ``theta`` (BPAWR's wait threshold), ``dt`` (the waiting slot), ``c`` (every ``c``-th
round is a full weighted AllReduce) and ``v`` (the model's size, here ``model_bytes``). The paper's
experiment uses ``p = 0.3 n``, ``eta = 0.3``, ``theta = 1``: :meth:`SelectiveConfig.paper`.

Selective reduce changes what training computes (a weighted average of the models of a subset of
workers instead of an exact gradient sum over all ranks), so nothing here turns it on by itself;
docs/selective.md says what that means for convergence.

Example::

    from stragglerkit.grouping import SelectiveConfig
    config = SelectiveConfig(p=12, eta=0.3, theta=1.0, dt=0.01, c=10, model_bytes=500e6)
    config.check_world(40)           # p must not exceed the number of workers
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stragglerkit.errors import ConfigError

__all__ = ["SelectiveConfig"]


def _positive(name: str, value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"selective.{name} must be positive {what}, got {value!r}")
    return float(value)


@dataclass(kw_only=True, slots=True)
class SelectiveConfig:
    """The paper's parameters of the SELECTIVEREDUCE controller (Algorithm 3), validated on creation."""

    p: int
    """The smallest group that may synchronise (partial reduce's ``p``); at most the number of workers.
    The paper's experiment uses ``0.3 n``."""
    eta: float = 0.3
    """BAG's tolerance, in [0, 1): once a group has ``p`` workers, a further worker joins it when its
    bandwidth is at least ``(1 - eta)`` times that of the group's ``p``-th (slowest) worker. 0: groups
    of exactly ``p``; larger: bigger groups at most ``eta / (1 - eta)`` slower."""
    theta: float = 1.0
    """BPAWR's threshold: a group waits for faster workers only when the synchronisation time this is
    predicted to save exceeds ``theta x dt``. Larger is more conservative (fewer waits)."""
    dt: float = 0.01
    """The waiting slot in seconds (the paper's delta t): how far ahead BPAWR predicts arrivals, and
    how long the controller waits for a new ready worker before it decides again."""
    c: int | None = None
    """Every ``c``-th round of synchronisation (rounds 0, c, 2c, ...) is a full weighted AllReduce of
    all workers; ``None``: never (every round partial). ``c = 1`` is plain AllReduce every round."""
    model_bytes: float
    """The model's size in bytes (the paper's ``v``); with bandwidths in bytes/s, times are seconds."""
    worker_timeout: float = 300.0
    """Seconds a worker may stay in one training iteration before the controller gives up on it and
    raises :class:`~stragglerkit.PeerError` naming it (a worker that never reports would otherwise
    hold a full round forever). Must exceed ``dt``; set it above the slowest iteration you accept."""

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, int) or self.p < 1:
            raise ConfigError(f"selective.p must be a whole number of workers >= 1, got {self.p!r}")
        if isinstance(self.eta, bool) or not isinstance(self.eta, int | float) or not 0 <= self.eta < 1:
            raise ConfigError(f"selective.eta must be in [0, 1) (0.3 in the paper), got {self.eta!r}")
        self.eta = float(self.eta)
        if isinstance(self.theta, bool) or not isinstance(self.theta, int | float) or not 0 <= self.theta < math.inf:
            raise ConfigError(f"selective.theta must be a finite number >= 0 (1 in the paper), got {self.theta!r}")
        self.theta = float(self.theta)
        self.dt = _positive("dt", self.dt, "seconds (the waiting slot)")
        if self.c is not None and (isinstance(self.c, bool) or not isinstance(self.c, int) or self.c < 1):
            raise ConfigError(
                f"selective.c must be a whole number of rounds >= 1, or None for no full rounds, got {self.c!r}"
            )
        self.model_bytes = _positive("model_bytes", self.model_bytes, "bytes (the model's size v)")
        self.worker_timeout = _positive("worker_timeout", self.worker_timeout, "seconds")
        if self.worker_timeout <= self.dt:
            raise ConfigError(
                f"selective.worker_timeout ({self.worker_timeout!r} s) must exceed selective.dt ({self.dt!r} s); "
                "set it above the slowest training iteration you accept"
            )

    def check_world(self, world_size: int) -> None:
        """Raise :class:`~stragglerkit.ConfigError` unless ``1 <= p <= world_size``.

        Example::

            SelectiveConfig(p=12, model_bytes=1e6).check_world(8)   # ConfigError: p = 12 > 8 workers
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"the number of workers must be a whole number >= 1, got {world_size!r}")
        if self.p > world_size:
            raise ConfigError(
                f"selective.p = {self.p} is larger than the number of workers ({world_size}); "
                f"give p <= {world_size} (the paper uses 0.3 x workers = {max(1, round(0.3 * world_size))})"
            )

    @classmethod
    def paper(cls, world_size: int, model_bytes: float, **changes: object) -> SelectiveConfig:
        """The paper's default setting (Section IV-A): ``p = 0.3 n`` (rounded, at least 1), ``eta = 0.3``,
        ``theta = 1``; other fields from ``changes`` or their defaults.

        Example::

            SelectiveConfig.paper(40, 500e6).p     # 12
        """
        fields: dict[str, object] = {"p": max(1, round(0.3 * world_size)), "eta": 0.3, "theta": 1.0}
        fields.update(changes)
        config = cls(model_bytes=model_bytes, **fields)  # type: ignore[arg-type]
        config.check_world(world_size)
        return config
