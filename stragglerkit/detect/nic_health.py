"""How fast each rank's network really is: a slowdown ``l_i`` per rank and per server.

What this decides. OptCC needs to know which ranks have a degraded NIC and by how much (``l``:
the NIC runs at ``1/l`` of the healthy bandwidth). Two sources:

* **Achieved bytes/s per link**, from the executor's own per-op timings (no extra traffic). A
  send's completion says little (the kernel's socket buffer swallows it), and in a pipelined ring
  every later message is paced by the slowest link, so the signal is each rank's *first* message
  from each peer in a ring run: every rank sends its first chunk as it enters, so that message's
  transfer starts when the later of the two ranks entered and ends when the receiver has it. Each
  rank reports, per peer, when that first receive completed (relative to its own entry) and the
  entry time itself (wall clock, made comparable by the start-up clock offsets); rank 0 forms a
  ``[src, dst]`` matrix of medians over the window (:func:`link_rates`).
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

    done, nbytes = first_receives(record.timings.records(), enter_ns, world_size)   # each rank, per run
    rates = link_rates(enter, done, nbytes)         # rank 0, over the window: [src, dst] bytes/s
    l = slowdowns_from_links(rates)
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
    "SysfsLink",
    "first_receives",
    "link_rates",
    "local_link_speed",
    "server_slowdowns",
    "slowdowns_from_links",
    "slowdowns_from_speeds",
    "sysfs_links",
]


def first_receives(timings: Iterable[OpTiming], enter_ns: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per peer: when this rank's first message from it completed (s after ``enter_ns``) and its bytes.

    NaN / 0 for peers it received nothing from. ``enter_ns``: when this rank's AllReduce started
    (``time.monotonic_ns()``, as the op timings).

    Example::

        done, nbytes = first_receives(record.timings.records(), timing.start_ns, 4)
    """
    done = np.full(world_size, np.nan)
    nbytes = np.zeros(world_size)
    first_post = np.full(world_size, np.inf)
    for t in timings:
        if t.kind == "send" or not 0 <= t.peer < world_size or t.start_ns >= first_post[t.peer]:
            continue
        first_post[t.peer] = t.start_ns
        done[t.peer] = (t.end_ns - enter_ns) / 1e9
        nbytes[t.peer] = t.nbytes
    return done, nbytes


def link_rates(enter: np.ndarray, done: np.ndarray, nbytes: np.ndarray, min_bytes: int = 32 * 1024) -> np.ndarray:
    """Achieved bytes/s per link ``[src, dst]`` (median over runs; NaN: no sample).

    ``enter[run, rank]``: when each rank entered the run (s, one clock for all ranks: wall clock
    corrected by :class:`~stragglerkit.detect.arrival.ClockOffsets`); ``done[run, dst, src]``: when
    ``dst``'s first message from ``src`` completed, s after ``dst`` entered; ``nbytes[run, dst, src]``
    its size. Only runs whose first messages leave at entry (ring: every rank sends its first chunk
    at once) should be given: a first message's transfer then starts when the later of the two
    ranks entered, and ``transfer = done - max(0, enter[src] - enter[dst])``.

    Example::

        rates = link_rates(enter, done, nbytes)     # then slowdowns_from_links(rates)
    """
    enter = np.asarray(enter, dtype=np.float64)
    done = np.asarray(done, dtype=np.float64)
    nbytes = np.asarray(nbytes, dtype=np.float64)
    runs, n = enter.shape
    if done.shape != (runs, n, n) or nbytes.shape != (runs, n, n):
        raise ValueError(f"done and nbytes must be [run, dst, src] = {(runs, n, n)}, got {done.shape}, {nbytes.shape}")
    late_sender = np.maximum(enter[:, None, :] - enter[:, :, None], 0.0)  # [run, dst, src]
    transfer = done - late_sender
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where((nbytes >= min_bytes) & (transfer > 0), nbytes / transfer, np.nan)
    out = np.full((n, n), np.nan)
    has = np.asarray(~np.isnan(rate).all(axis=0))
    if has.any():
        medians = np.nanmedian(np.where(has[None, :, :], rate, 0.0), axis=0)
        out[has] = medians[has]
    return out.T.copy()  # [src, dst]


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
