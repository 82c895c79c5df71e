"""The simulated network: one NIC per rank (transmit and receive rates, a slowdown per rank), the
per-message latency, the local reduction costs and, with several GPUs per server, NVLink between
the GPUs of a server. :mod:`stragglerkit.sim.simulator` runs schedules on it."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Network"]


@dataclass(slots=True, kw_only=True, frozen=True)
class Network:
    """Per-message latency and per-rank NIC bandwidths (bytes/s) in each direction.

    Example::

        net = Network.uniform(8, alpha=3e-6, bandwidth=450e9, slowdowns={5: 2.0})
        assert net.tx_bandwidth[5] == 225e9
    """

    alpha: float
    """Latency paid by every message before its bytes move (seconds)."""
    tx_bandwidth: tuple[float, ...]
    """Transmit bandwidth of each rank's NIC (bytes/s)."""
    rx_bandwidth: tuple[float, ...]
    """Receive bandwidth of each rank's NIC (bytes/s)."""
    gamma: float = 0.0
    """Seconds per byte reduced by ``reduce``/``recv_reduce`` (0: reductions are free)."""
    delta: float = 0.0
    """Seconds per byte of local memory traffic of ``reduce``/``copy``/``recv_reduce`` (0: free)."""
    gpus_per_server: int = 1
    """GPUs per server ``g``: ranks ``v·g .. v·g+g-1`` share server ``v`` (NVLink between them)."""
    nvlink_bandwidth: float | None = None
    """Per-GPU NVLink bandwidth in each direction (bytes/s); ``None``: ``g-1`` times the fastest NIC."""

    def __post_init__(self) -> None:
        if len(self.tx_bandwidth) != len(self.rx_bandwidth) or not self.tx_bandwidth:
            raise ValueError(
                f"tx_bandwidth ({len(self.tx_bandwidth)} ranks) and rx_bandwidth ({len(self.rx_bandwidth)} ranks) "
                "must list the same, non-zero number of ranks"
            )
        for name, values in (("tx_bandwidth", self.tx_bandwidth), ("rx_bandwidth", self.rx_bandwidth)):
            bad = [i for i, v in enumerate(values) if not (v > 0 and math.isfinite(v))]
            if bad:
                raise ValueError(f"{name}[{bad[0]}] = {values[bad[0]]!r}: bandwidths must be positive finite bytes/s")
        for name, value in (("alpha", self.alpha), ("gamma", self.gamma), ("delta", self.delta)):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} = {value!r} must be a finite number >= 0 (seconds)")
        g = self.gpus_per_server
        if not (isinstance(g, int) and g >= 1 and self.world_size % g == 0):
            raise ValueError(
                f"gpus_per_server = {g!r} must be a positive integer dividing the {self.world_size} ranks "
                "(ranks v*g .. v*g+g-1 form server v)"
            )
        nvlink = self.nvlink_bandwidth
        if nvlink is not None and not (nvlink > 0 and math.isfinite(nvlink)):
            raise ValueError(f"nvlink_bandwidth = {self.nvlink_bandwidth!r} must be positive finite bytes/s (or None)")

    @property
    def nvlink_rate(self) -> float:
        """The NVLink bandwidth in use: ``nvlink_bandwidth``, or ``(g-1)·`` the fastest NIC (OptCC paper, App. E)."""
        if self.nvlink_bandwidth is not None:
            return self.nvlink_bandwidth
        return max(self.gpus_per_server - 1, 1) * max(max(self.tx_bandwidth), max(self.rx_bandwidth))

    @property
    def world_size(self) -> int:
        return len(self.tx_bandwidth)

    @classmethod
    def uniform(
        cls,
        world_size: int,
        alpha: float,
        bandwidth: float,
        slowdowns: dict[int, float] | None = None,
        gamma: float = 0.0,
        delta: float = 0.0,
        *,
        gpus_per_server: int = 1,
        nvlink_bandwidth: float | None = None,
    ) -> Network:
        """Every NIC at ``bandwidth`` both ways, except rank r at ``bandwidth / slowdowns[r]``.

        With ``gpus_per_server = g > 1`` the ranks are grouped into servers of ``g`` GPUs joined by
        NVLink at ``nvlink_bandwidth`` per GPU and direction (default ``(g-1)·bandwidth``). To model
        a degraded server, give every one of its GPUs the slowdown.

        Example::

            net = Network.uniform(4, alpha=3e-6, bandwidth=450e9)
            servers = Network.uniform(16, 0.0, 50e9, {4: 2.0, 5: 2.0, 6: 2.0, 7: 2.0}, gpus_per_server=4)
        """
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        per_rank = [float(bandwidth)] * world_size
        for rank, slowdown in (slowdowns or {}).items():
            if not 0 <= rank < world_size:
                raise ValueError(f"slowdowns names rank {rank}, which is not a rank of 0..{world_size - 1}")
            if not (slowdown >= 1 and math.isfinite(slowdown)):
                raise ValueError(f"slowdown of rank {rank} is {slowdown!r}; use a finite l >= 1 (1 = healthy)")
            per_rank[rank] = bandwidth / slowdown
        return cls(
            alpha=alpha,
            tx_bandwidth=tuple(per_rank),
            rx_bandwidth=tuple(per_rank),
            gamma=gamma,
            delta=delta,
            gpus_per_server=gpus_per_server,
            nvlink_bandwidth=nvlink_bandwidth,
        )
