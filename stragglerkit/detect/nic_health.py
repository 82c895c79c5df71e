"""How fast each rank's network really is: a slowdown ``l_i`` per rank and per server.

What this decides. OptCC needs to know which ranks have a degraded NIC and by how much (``l``:
the NIC runs at ``1/l`` of the healthy bandwidth). Two sources:

* **Achieved bytes/s per link**, from the executor's own per-op timings of a ring run (no extra
  traffic). What a message's timings say depends on what it waited for, so each message is
  charged only for the time its link was actually carrying it (its *busy period*): the ``k``-th
  message from ``src`` to ``dst`` can move once ``src`` posted its send, ``dst`` posted its
  receive and the link delivered message ``k-1``; it is on the link from the latest of the three
  to its receive's completion::

      transfer_k = recv_end_k - max(send_post_k, recv_post_k, recv_end_{k-1})

  A message that waited for a late sender (every link after a slow one in a pipelined ring) is
  not charged for the wait; messages queued behind each other on a slow link are each charged
  one message's time on it. The link's rate is the median of ``bytes_k / transfer_k`` over its
  messages and the window's runs (a median, because a message that sat in the receiver's socket
  buffer reads as arbitrarily fast, and one that shared the wire with other traffic as slow). Send
  posts and receive completions are taken on different ranks: the wall clocks are made
  comparable by the start-up clock offsets (:class:`~stragglerkit.detect.arrival.ClockOffsets`),
  whose error must stay well below one message's time (at 1 Gbit/s a 400 KB piece takes 3 ms;
  at 100 Gbit/s 33 us, where sysfs speeds are the better witness). A receive's completion must
  also be *observed* when it happens: over connections with a bounded send buffer (the runtime's
  default) a send to a slow successor completes only as its link drains, and an executor that
  observed the ring in one global order saw the receive behind it that late, which made the slow
  rank's predecessor read l = 1.6-2.3; such rings are observed with one waiter per channel
  (``concurrent_waits`` in runtime/executor.py).

  Each rank reports, per ring run, its messages to its successor (send posts) and from its
  predecessor (receive posts, completions, bytes): :func:`ring_link_messages`. Rank 0 pairs them
  into a ``[src, dst]`` matrix (:func:`message_link_rates`).
* **Link state and speed from sysfs** where it exists: ``/sys/class/net/IF/{operstate,speed}``
  (Mbit/s) and ``/sys/class/infiniband/DEV/ports/P/{state,rate}``. A NIC that negotiated a lower
  speed than its peers' (a 100G port at 50G) shows here before any traffic.

Why the busy period. An estimate from each link's first message alone (every rank sends its
first chunk as it enters) needs no pairing, but that single message carries the connection's
start-up and any other traffic of that moment, so it under-reads a degraded rank and can read a
healthy one as degraded. The busy period charges each message only the time it was on the link
(docs/detection.md, "How it decides"; how well it reads: docs/results.md, "NIC-health estimate",
from ``profiling/bench_link_estimate.py``).

Attribution. A transfer is as slow as the slower end of its link, so a slow link blames both
ends; but a degraded rank makes *every* link it touches slow, while its healthy neighbour has
other, fast links. Hence ``l_i = min`` over the links incident to rank i of
``healthy / rate(link)``. ``healthy`` is the median over ranks of each rank's *fastest* incident
link: a healthy rank has at least one fast link even next to a degraded one, so this holds while
fewer than half of the ranks are degraded (OptCC's own condition), also in a 3- or 4-rank ring
where most observed links touch the degraded rank. ``l_i`` is at least 1. Ranks that share a server (and so
its NICs) get the server's figure: the largest ``l`` among its ranks, as OptCC's server plan does.

Example::

    links = ring_link_messages(record.timings.records(), start_ns)      # each rank, per ring run
    rates = message_link_rates(bases, per_rank_links)                    # rank 0, over the window
    l = slowdowns_from_links(rates)
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

__all__ = [
    "LINK_MESSAGES",
    "MessageTiming",
    "RingLinkMessages",
    "SysfsLink",
    "local_link_speed",
    "message_link_rates",
    "ring_link_messages",
    "server_slowdowns",
    "slowdowns_from_links",
    "slowdowns_from_speeds",
    "sysfs_links",
]

LINK_MESSAGES = 32
"""Messages per link and run that a rank reports (the first ones). A ring on 8 ranks sends 14
chunks over each link, each cut into the executor's pieces (42 messages for a 30 MB bucket): more
than enough for a median."""
_SHORTEST_TRANSFER_S = 1e-6
"""A message delivered from the socket buffer reads as at most this fast (no division by zero)."""


@dataclass(slots=True, frozen=True)
class RingLinkMessages:
    """One rank's messages on its two links of one ring run; times in s after the run's start.

    ``send_peer`` / ``recv_peer`` are -1 when the run sent / received nothing; the arrays then
    are empty. Only the first :data:`LINK_MESSAGES` messages each way are kept.
    """

    send_peer: int
    send_posts: np.ndarray
    """When each send to ``send_peer`` was posted, in posting order."""
    recv_peer: int
    recv_posts: np.ndarray
    """When each receive from ``recv_peer`` was posted, in posting order."""
    recv_ends: np.ndarray
    """When each of those receives completed."""
    recv_bytes: np.ndarray


class MessageTiming(Protocol):
    """One completed message as the executor reports it (:class:`stragglerkit.runtime.executor.OpTiming`)."""

    @property
    def kind(self) -> str: ...
    @property
    def peer(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...


def ring_link_messages(timings: Iterable[MessageTiming], start_ns: int, most: int = LINK_MESSAGES) -> RingLinkMessages:
    """This rank's ring messages (see :class:`RingLinkMessages`), times relative to ``start_ns``.

    ``timings``: the executor's per-op records of one ring run; ``start_ns``: a
    ``time.monotonic_ns()`` value (the run's first post). The successor is the peer this rank sent
    most messages to, the predecessor the one it received most from (a ring has one of each).

    Example::

        links = ring_link_messages(record.timings.records(), record.timings.span_ns()[0])
    """
    sends: dict[int, list[int]] = {}
    receives: dict[int, list[tuple[int, int, int]]] = {}
    for t in timings:
        if t.kind == "send":
            sends.setdefault(t.peer, []).append(t.start_ns)
        else:
            receives.setdefault(t.peer, []).append((t.start_ns, t.end_ns, t.nbytes))
    send_peer = max(sends, key=lambda p: len(sends[p])) if sends else -1
    recv_peer = max(receives, key=lambda p: len(receives[p])) if receives else -1
    posts = sorted(sends.get(send_peer, []))[:most]
    recvs = sorted(receives.get(recv_peer, []))[:most]
    return RingLinkMessages(
        send_peer=send_peer,
        send_posts=_seconds_after(posts, start_ns),
        recv_peer=recv_peer,
        recv_posts=_seconds_after([r[0] for r in recvs], start_ns),
        recv_ends=_seconds_after([r[1] for r in recvs], start_ns),
        recv_bytes=np.asarray([r[2] for r in recvs], dtype=np.float64),
    )


def _seconds_after(times_ns: Sequence[int], start_ns: int) -> np.ndarray:
    return (np.asarray(times_ns, dtype=np.float64) - start_ns) / 1e9


def message_link_rates(
    starts: np.ndarray,
    links: Sequence[Sequence[RingLinkMessages | None]],
    min_bytes: int = 32 * 1024,
) -> np.ndarray:
    """Achieved bytes/s per link ``[src, dst]`` from paired ring messages (NaN: no sample).

    ``starts[run, rank]``: when each rank's run started (s, one clock for all ranks: wall clock
    corrected by the start-up clock offsets); ``links[run][rank]``: that rank's
    :class:`RingLinkMessages` (``None``: not measured). The ``k``-th send of ``src`` to ``dst`` is
    paired with the ``k``-th receive of ``dst`` from ``src`` (a connection delivers in order) and
    charged its busy period (module docstring); messages under ``min_bytes`` (latency-bound) are
    left out. The result is the median over all runs' messages of each link.

    Example::

        rates = message_link_rates(starts, links)     # then slowdowns_from_links(rates)
    """
    starts = np.asarray(starts, dtype=np.float64)
    if starts.ndim != 2 or len(links) != starts.shape[0] or any(len(row) != starts.shape[1] for row in links):
        raise ValueError(
            f"starts must be [run, rank] and links one RingLinkMessages (or None) per run and rank; got "
            f"starts {starts.shape} and links of {len(links)} runs"
        )
    n = starts.shape[1]
    samples: dict[tuple[int, int], list[np.ndarray]] = {}
    for run, row in enumerate(links):
        for dst, receiver in enumerate(row):
            if receiver is None or not 0 <= receiver.recv_peer < n or not math.isfinite(starts[run, dst]):
                continue
            src = receiver.recv_peer
            sender = row[src]
            if sender is None or sender.send_peer != dst or not math.isfinite(starts[run, src]):
                continue
            count = min(sender.send_posts.size, receiver.recv_ends.size)
            if count == 0:
                continue
            send = starts[run, src] + sender.send_posts[:count]
            post = starts[run, dst] + receiver.recv_posts[:count]
            end = starts[run, dst] + receiver.recv_ends[:count]
            previous = np.concatenate(([-np.inf], end[:-1]))
            transfer = np.maximum(end - np.maximum(np.maximum(send, post), previous), _SHORTEST_TRANSFER_S)
            size = receiver.recv_bytes[:count]
            keep = size >= min_bytes
            if keep.any():
                samples.setdefault((src, dst), []).append(size[keep] / transfer[keep])
    out = np.full((n, n), np.nan)
    for (src, dst), parts in samples.items():
        out[src, dst] = float(np.median(np.concatenate(parts)))
    return out


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
