"""How fast each rank's network really is: a slowdown ``l_i`` per rank and per server.

What this decides. OptCC needs to know which ranks have a degraded NIC and by how much (``l``:
the NIC runs at ``1/l`` of the healthy bandwidth). Two sources:

* **Achieved bytes/s per link**, from the executor's own per-op timings (no extra traffic): every
  completed *send* of at least ``min_bytes`` gives ``bytes / (completion - post)`` for the link
  ``me -> peer``. The transports move a message only once the receiver is ready (gloo's pairs wait
  for the ready notice, NCCL's send is a rendezvous), so a send's time is mostly its transfer.
  Per link the median over a window is kept; all ranks' rows form a ``[src, dst]`` matrix.
* **Link state and speed from sysfs** where it exists: ``/sys/class/net/IF/{operstate,speed}``
  (Mbit/s) and ``/sys/class/infiniband/DEV/ports/P/{state,rate}``. A NIC that negotiated a lower
  speed than its peers' (a 100G port at 50G) shows here before any traffic.

Attribution. A transfer is as slow as the slower end of its link, so a slow link blames both
ends; but a degraded rank makes *every* link it touches slow, while its healthy neighbour has
other, fast links. Hence ``l_i = min`` over the links incident to rank i of
``healthy / rate(link)``. ``healthy`` is the median over ranks of each rank's *fastest* incident
link: a healthy rank has at least one fast link even next to a degraded one, so this holds while
fewer than half of the ranks are degraded (OptCC's own condition), also in a 3- or 4-rank ring
where most observed links touch the degraded rank. ``l_i`` is at least 1. Ranks that share a server (and so
its NICs) get the server's figure: the largest ``l`` among its ranks, as OptCC's server plan does.

Example::

    rates = LinkRates(world_size=4, me=rank)
    rates.add(record.timings.records())
    row = rates.row()                      # bytes/s to each peer (NaN: no sample), for the exchange
    l = slowdowns_from_links(np.stack(all_rows))
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stragglerkit.runtime.executor import OpTiming

__all__ = [
    "LinkRates",
    "SysfsLink",
    "local_link_speed",
    "server_slowdowns",
    "slowdowns_from_links",
    "slowdowns_from_speeds",
    "sysfs_links",
]


class LinkRates:
    """Achieved send rates of this rank to each peer, over the sends added since :meth:`clear`.

    Example::

        rates = LinkRates(world_size=8, me=3, min_bytes=32 * 1024)
        rates.add(record.timings.records())
        rates.row()[4]                      # median bytes/s of 3 -> 4 (NaN without a sample)
    """

    __slots__ = ("_samples", "me", "min_bytes", "world_size")

    def __init__(self, world_size: int, me: int, min_bytes: int = 32 * 1024) -> None:
        if not 0 <= me < world_size:
            raise ValueError(f"rank {me} is not a rank of a {world_size}-rank group")
        if min_bytes < 1:
            raise ValueError(f"min_bytes must be at least 1, got {min_bytes}")
        self.world_size = world_size
        self.me = me
        self.min_bytes = min_bytes
        self._samples: list[list[float]] = [[] for _ in range(world_size)]

    def add(self, timings: Iterable[OpTiming]) -> None:
        """Add the completed sends of one run (receives are skipped: they include waiting)."""
        for t in timings:
            if t.kind != "send" or t.nbytes < self.min_bytes or t.end_ns <= t.start_ns:
                continue
            if 0 <= t.peer < self.world_size and t.peer != self.me:
                self._samples[t.peer].append(t.nbytes / t.seconds)

    def row(self) -> np.ndarray:
        """Median bytes/s to each peer (NaN where there is no sample)."""
        return np.array([float(np.median(s)) if s else math.nan for s in self._samples])

    def clear(self) -> None:
        for samples in self._samples:
            samples.clear()


def slowdowns_from_links(rates: np.ndarray) -> np.ndarray:
    """``l_i`` per rank from a ``[src, dst]`` matrix of bytes/s (NaN: not observed); see the module docstring.

    Ranks without an observed link get NaN.

    Example::

        r = np.full((3, 3), np.nan); r[0, 1] = 100.0; r[1, 2] = r[2, 0] = 50.0
        slowdowns_from_links(r)    # rank 2's links are both slow (into and out of it): [1, 1, 2]
    """
    matrix = np.asarray(rates, dtype=np.float64)
    n = matrix.shape[0]
    if matrix.shape != (n, n):
        raise ValueError(f"rates must be a square [src, dst] matrix, got shape {matrix.shape}")
    observed = np.isfinite(matrix) & (matrix > 0)
    np.fill_diagonal(observed, False)
    out = np.full(n, np.nan)
    if not observed.any():
        return out
    masked = np.where(observed, matrix, 0.0)
    fastest = np.maximum(masked.max(axis=1), masked.max(axis=0))  # per rank: its fastest incident link
    healthy = float(np.median(fastest[fastest > 0]))
    link_slowdown = np.where(observed, healthy / np.where(observed, matrix, 1.0), np.inf)
    incident = np.minimum(link_slowdown.min(axis=1), link_slowdown.min(axis=0))
    known = np.isfinite(incident)
    out[known] = np.maximum(incident[known], 1.0)
    return out


def slowdowns_from_speeds(speeds: Sequence[float] | np.ndarray) -> np.ndarray:
    """``l_i`` from each rank's negotiated NIC speed (NaN: unknown): fastest speed / own speed.

    Example::

        slowdowns_from_speeds([100e9, 50e9, float("nan")])   # [1, 2, nan]
    """
    values = np.asarray(speeds, dtype=np.float64)
    known = np.isfinite(values) & (values > 0)
    out = np.full(values.shape, np.nan)
    if known.any():
        out[known] = values[known].max() / values[known]
    return out


def server_slowdowns(slowdowns: Sequence[float], hosts: Sequence[int]) -> dict[int, float]:
    """Per server (host id -> l): the largest ``l`` of the ranks that share it (NaN ignored).

    Example::

        server_slowdowns([1.0, 2.0, 1.0, 1.0], hosts=[0, 0, 1, 1])   # {0: 2.0, 1: 1.0}
    """
    if len(slowdowns) != len(hosts):
        raise ValueError(f"{len(slowdowns)} slowdowns for {len(hosts)} ranks; give one host id per rank")
    out: dict[int, float] = {}
    for value, host in zip(slowdowns, hosts):
        if math.isfinite(value):
            out[host] = max(out.get(host, 1.0), float(value))
        else:
            out.setdefault(host, 1.0)
    return out


@dataclass(slots=True, frozen=True)
class SysfsLink:
    """One network port as the kernel describes it."""

    name: str
    """``eth0`` or ``mlx5_0/1`` (InfiniBand device/port)."""
    kind: str
    """``net`` or ``infiniband``."""
    up: bool
    speed: float
    """Negotiated rate in bytes/s (NaN when the driver does not say, e.g. virtual interfaces)."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def sysfs_links(root: str | os.PathLike[str] = "/sys") -> list[SysfsLink]:
    """Every port under ``root``/class/net and ``root``/class/infiniband (empty where absent).

    Example::

        [link for link in sysfs_links() if link.up]
    """
    base = Path(root)
    links: list[SysfsLink] = []
    net = base / "class" / "net"
    if net.is_dir():
        for interface in sorted(net.iterdir()):
            state = _read(interface / "operstate")
            speed_text = _read(interface / "speed")
            try:
                mbits = float(speed_text) if speed_text is not None else math.nan
            except ValueError:
                mbits = math.nan
            speed = mbits * 1e6 / 8 if mbits > 0 else math.nan
            links.append(SysfsLink(interface.name, "net", state in ("up", "unknown"), speed))
    infiniband = base / "class" / "infiniband"
    if infiniband.is_dir():
        for device in sorted(infiniband.iterdir()):
            ports = device / "ports"
            if not ports.is_dir():
                continue
            for port in sorted(ports.iterdir()):
                state = _read(port / "state") or ""
                rate = re.match(r"\s*([\d.]+)\s*Gb", _read(port / "rate") or "")
                speed = float(rate.group(1)) * 1e9 / 8 if rate else math.nan
                links.append(SysfsLink(f"{device.name}/{port.name}", "infiniband", "ACTIVE" in state, speed))
    return links


def local_link_speed(root: str | os.PathLike[str] = "/sys", interface: str | None = None) -> float:
    """This host's NIC speed in bytes/s (NaN when unknown).

    The interface is ``interface``, else ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME``, else the
    fastest port that is up (InfiniBand ports count; loopback does not).

    Example::

        local_link_speed()     # 12.5e9 for a 100 Gbit/s port
    """
    name = interface or os.environ.get("NCCL_SOCKET_IFNAME") or os.environ.get("GLOO_SOCKET_IFNAME")
    links = [link for link in sysfs_links(root) if link.up and link.name != "lo"]
    if name:
        links = [link for link in links if link.name == name.split(",")[0]]
    speeds = [link.speed for link in links if math.isfinite(link.speed)]
    return max(speeds) if speeds else math.nan
