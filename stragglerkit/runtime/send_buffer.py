"""The runtime's own gloo connections with a bounded TCP send buffer (the default).

Why: a gloo send completes once its data is in the socket's send buffer, which the kernel grows to
4 MiB by default (``net.ipv4.tcp_wmem``). In a round schedule a rank starts its next round when
its previous round's sends *completed*, so with a large buffer most of the previous message is
still queued when the next one starts, and TCP shares the rank's link between the two: the earlier
message, which its receiver's chain of rounds waits for, arrives late. The critical path of
StragglAR's bench rows shows it (docs/bench.md, "The critical path, and TCP's send buffer"): with a
256 KiB buffer its rounds ran as the model says (1.30x gloo against 1.20x with the kernel's), and
ring, OptCC and gloo's own all_reduce did not change (``profiling/results/send_buffer/``). In a
training step, where the ranks' compute competes for the cores, 256 KiB cost the hooked step
1-2 % (a sender has to be woken every 2 ms of a 1 Gbit/s link to keep it busy); 1 MiB keeps
StragglAR's gain in the bench (1.25-1.27x) and costs the training step nothing measurable.

A bounded buffer makes a send to a slow peer complete only as that link drains; the executor then
observes every large plan, rings included, with one waiter per channel (``concurrent_waits`` in
runtime/executor.py), so that a receive's recorded end is when it arrived and the NIC-health
estimate (detect/nic_health.py) reads each link as it is. Before that, the degraded rank's ring
predecessor read l = 1.6-2.3 in every probe (``profiling/results/send_buffer/link_estimate_*``).

How: a runtime on the default gloo group creates its own two gloo groups (one per direction, as
:func:`stragglerkit.runtime.executor.duplex_group` does for the reverse one) and sets
``SO_SNDBUF`` on the connections that creating them opened, found as the sockets this process
did not have before. The user's group and any other socket of the process are left alone. Gloo
connects a new group's full mesh while creating it, so every connection is there to set. Linux
doubles what ``setsockopt`` asks for (for its own bookkeeping); half of the size is asked, so
the socket's buffer, as ``getsockopt`` reports it and as ``net.ipv4.tcp_wmem`` counts, is the size.

While an OptCC plan runs the connections hold less, ``STRAGGLERKIT_OPTCC_SEND_BUFFER`` (default
128 KiB; :class:`BoundedConnections` re-bounds them between calls, only when the bound changes).
OptCC's timetable gives each rank one flow per link direction at a time: a rank's ring hop, then
its upload or fill to the slow rank, each send chained behind the one before. A send completes
once its data is in the buffer, so with 1 MiB a rank's next message starts while most of the
previous one is still queued, the two share the link, and the paths the plan balanced (its LP
sizes, its fills) come apart. On the emulated cluster at l = 8/7 (8 ranks, 1 Gbit/s, 32 MiB) the
plan with LP sizes and fills measured 8.0 % over fault-free gloo at 128 KiB against 15-16 % at
1 MiB, side by side; at l = 2 128 KiB cost about 1 % (``profiling/results/optcc_send_buffer_lp/``).

The size is ``STRAGGLERKIT_TCP_SEND_BUFFER`` (the same on every rank): unset or ``on`` is
:data:`DEFAULT_SEND_BUFFER`, 1 MiB; a size asks that size; ``off`` keeps the kernel's buffers (the
runtime then sends over the user's group and one reverse group). 1 MiB holds 8 ms of a 1 Gbit/s
link and keeps a link busy while its bandwidth-delay product is below about 0.5-1 MiB (the kernel
counts its bookkeeping in the buffer): 40 Gbit/s at a 100 us round trip; on links with a larger
one, raise it or turn it off. NCCL groups are never touched.

Example::

    # every rank, before the first stragglerkit call
    os.environ["STRAGGLERKIT_TCP_SEND_BUFFER"] = "4MiB"  # or "off" for the kernel's buffers
"""

from __future__ import annotations

import os
import socket
import stat
import warnings
from collections.abc import Iterator

import torch.distributed as dist

from stragglerkit.units import parse_size

__all__ = [
    "DEFAULT_OPTCC_SEND_BUFFER",
    "DEFAULT_SEND_BUFFER",
    "ENV",
    "OPTCC_ENV",
    "BoundedConnections",
    "new_group_with_send_buffer",
    "optcc_send_buffer_from_env",
    "send_buffer_from_env",
    "socket_inodes",
]

ENV = "STRAGGLERKIT_TCP_SEND_BUFFER"
DEFAULT_SEND_BUFFER = 1024 * 1024
"""Bytes a connection of the runtime's own queues at most unless ``STRAGGLERKIT_TCP_SEND_BUFFER`` says otherwise."""
OPTCC_ENV = "STRAGGLERKIT_OPTCC_SEND_BUFFER"
DEFAULT_OPTCC_SEND_BUFFER = 128 * 1024
"""Bytes those connections queue at most while an OptCC plan runs, unless ``STRAGGLERKIT_OPTCC_SEND_BUFFER``
says otherwise."""
OFF = ("off", "kernel", "0")
"""Values of ``STRAGGLERKIT_TCP_SEND_BUFFER`` that keep the kernel's send buffers."""
_SMALLEST = 8192


def _size_from_env(name: str, default: int, off: tuple[str, ...], hint: str) -> int | None:
    """The size ``name`` sets: ``default`` when unset or ``on``, None for a word in ``off``;
    ValueError naming the variable, its value and ``hint`` (what to give) otherwise."""
    text = os.environ.get(name, "").strip()
    if text.lower() in off:
        return None
    if not text or text.lower() == "on":
        return default
    try:
        size = parse_size(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a size; {hint}") from None
    if size < _SMALLEST:
        raise ValueError(f"{name}={text!r} is below 8KiB; {hint}")
    return size


def send_buffer_from_env() -> int | None:
    """``STRAGGLERKIT_TCP_SEND_BUFFER`` in bytes (unset or ``on``: :data:`DEFAULT_SEND_BUFFER`), or
    None for ``off`` (the kernel's buffers); ValueError names a bad value."""
    return _size_from_env(ENV, DEFAULT_SEND_BUFFER, OFF, "give e.g. 1MiB, on, or off for the kernel's buffers")


def optcc_send_buffer_from_env() -> int | None:
    """``STRAGGLERKIT_OPTCC_SEND_BUFFER`` in bytes (unset or ``on``: :data:`DEFAULT_OPTCC_SEND_BUFFER`),
    or None for ``off`` (OptCC runs with the connections' usual bound); ValueError names a bad value."""
    return _size_from_env(OPTCC_ENV, DEFAULT_OPTCC_SEND_BUFFER, ("off",), "give e.g. 128KiB, on, or off")


class BoundedConnections:
    """The connections whose send buffer the runtime set, so that it can set them again.

    Each is kept as (file descriptor, socket inode): a descriptor whose socket is no longer the
    same (gloo closed it and the number was reused) is left alone. :meth:`bound` sets every
    connection's buffer, and does nothing while the bound asked is the one they have.

    Example::

        group, connections = new_group_with_send_buffer(1 << 20)
        connections.bound(128 * 1024)  # before an OptCC plan
        connections.bound(1 << 20)     # before any other
    """

    __slots__ = ("_sockets", "current")

    def __init__(self, sockets: list[tuple[int, int]], current: int) -> None:
        self._sockets = sockets
        self.current = current
        """The bound the connections have now, in bytes."""

    def __len__(self) -> int:
        return len(self._sockets)

    def __add__(self, other: BoundedConnections) -> BoundedConnections:
        if other.current != self.current:
            raise ValueError(f"connections bounded at {self.current} and {other.current} bytes cannot be joined")
        return BoundedConnections(self._sockets + other._sockets, self.current)

    def _same_sockets(self) -> Iterator[int]:
        """The descriptors that still name the socket they named when bounded first."""
        for fd, inode in self._sockets:
            try:
                if os.fstat(fd).st_ino == inode:
                    yield fd
            except OSError:  # closed
                continue

    def sizes(self) -> list[int]:
        """The send buffer every connection that is still the same socket has now (``SO_SNDBUF``)."""
        found = []
        for fd in self._same_sockets():
            try:
                with socket.socket(fileno=os.dup(fd)) as sock:  # closes the duplicate only
                    found.append(int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)))
            except OSError:
                continue
        return found

    def bound(self, nbytes: int) -> None:
        """Every connection queues at most ``nbytes`` from now on (a send may then wait for room)."""
        if nbytes == self.current:
            return
        for fd in self._same_sockets():
            _bound(fd, nbytes)
        self.current = nbytes


def socket_inodes() -> dict[int, int]:
    """This process's sockets: inode -> one file descriptor of it."""
    found: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            info = os.fstat(fd)
        except (ValueError, OSError):
            continue
        if stat.S_ISSOCK(info.st_mode):
            found.setdefault(info.st_ino, fd)
    return found


def _bound(fd: int, nbytes: int) -> int | None:
    """Set ``SO_SNDBUF`` on ``fd`` if it is a connected TCP socket: the buffer it got, or None."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        try:
            sock.getpeername()
        except OSError:  # listening or not connected
            return None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes // 2)  # Linux doubles it
        return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    finally:
        sock.close()  # the duplicate only


def new_group_with_send_buffer(nbytes: int) -> tuple[dist.ProcessGroup, BoundedConnections]:
    """A new gloo group over every rank (collective, like ``dist.new_group``) whose connections
    queue at most ``nbytes`` each; also those connections, to bound again. The kernel caps what a
    process may ask at ``net.core.wmem_max`` (doubled); a smaller buffer than asked is warned of."""
    before = socket_inodes()
    group = dist.new_group(backend="gloo")
    after = socket_inodes()
    bounded = {
        (fd, inode): size
        for inode, fd in after.items()
        if inode not in before and (size := _bound(fd, nbytes)) is not None
    }
    got = list(bounded.values())
    if got and min(got) < nbytes:
        warnings.warn(
            f"stragglerkit: {ENV} asks {nbytes} bytes per connection but the kernel gave {min(got)} "
            "(net.core.wmem_max caps it at twice its value): raise net.core.wmem_max or ask less",
            stacklevel=2,
        )
    return group, BoundedConnections(list(bounded), nbytes)
