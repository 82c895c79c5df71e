"""The runtime's own gloo connections with a bounded TCP send buffer (the default).

Why: a gloo send completes once its data is in the socket's send buffer, which the kernel grows to
4 MiB by default (``net.ipv4.tcp_wmem``). In a round schedule a rank starts its next round when
its previous round's sends *completed*, so with a large buffer most of the previous message is
still queued when the next one starts, and TCP shares the rank's link between the two: the earlier
message, which its receiver's chain of rounds waits for, arrives late. A bounded buffer keeps each
round's timing as the schedule has it (StragglAR gains most); 1 MiB does that while waking a
sender rarely enough that it costs a training step nothing measurable, where smaller bounds cost
more than they gained (docs/executor.md, "Connections").

A bounded buffer makes a send to a slow peer complete only as that link drains; the executor then
observes every large plan with one waiter per channel (``concurrent_waits`` in
runtime/executor.py), so that a receive's recorded end is when it arrived and the NIC-health
estimate (detect/nic_health.py) reads each link as it is.

How: a runtime on a gloo group creates its own two gloo groups over its ranks (one per direction) and
sets ``SO_SNDBUF`` on the connections that creating them opened, found as the sockets this process
did not have before. The user's group and any other socket of the process are left alone. Gloo
connects a new group's full mesh while creating it, so every connection is there to set. Linux
doubles what ``setsockopt`` asks for (for its own bookkeeping); half of the size is asked, so the
socket's buffer, as ``getsockopt`` reports it, is the size.

While an OptCC plan runs the connections hold less, ``Config.optcc.send_buffer`` (128 KiB;
:class:`BoundedConnections` re-bounds them between calls, only when the bound changes). OptCC's
timetable gives each rank one flow per link direction at a time, each send chained behind the one
before; with 1 MiB a rank's next message starts while most of the previous one is still queued,
the two share the link, and the paths the plan balanced (its LP sizes, its fills) come apart.

The sizes are ``Config.executor.send_buffer`` and ``Config.optcc.send_buffer`` (the same on every
rank; ``None`` keeps the kernel's buffers and the runtime sends over the user's group and one
reverse group). 1 MiB holds 8 ms of a 1 Gbit/s link and keeps a link busy while its
bandwidth-delay product is below about 0.5-1 MiB: on links with a larger one, raise it or turn it
off. NCCL groups are never touched.

Example::

    config = stragglerkit.Config().replace(executor={"send_buffer": "4MiB"})
    stragglerkit.init(config=config)
"""

from __future__ import annotations

import os
import socket
import stat
import warnings
from collections.abc import Iterator

import torch.distributed as dist

from stragglerkit.runtime.executor import gloo_group_over

__all__ = ["BoundedConnections", "new_group_with_send_buffer", "socket_inodes"]


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


def new_group_with_send_buffer(
    nbytes: int, over: dist.ProcessGroup | None = None
) -> tuple[dist.ProcessGroup, BoundedConnections]:
    """A new gloo group over the ranks of ``over`` (default: every rank; collective over them, see
    :func:`stragglerkit.runtime.executor.gloo_group_over`) whose connections queue at most
    ``nbytes`` each; also those connections, to bound again. The kernel caps what a process may
    ask at ``net.core.wmem_max`` (doubled); a smaller buffer than asked is warned of."""
    before = socket_inodes()
    group = gloo_group_over(over if over is not None else dist.distributed_c10d._get_default_group())
    after = socket_inodes()
    bounded = {
        (fd, inode): size
        for inode, fd in after.items()
        if inode not in before and (size := _bound(fd, nbytes)) is not None
    }
    got = list(bounded.values())
    if got and min(got) < nbytes:
        warnings.warn(
            f"stragglerkit: executor.send_buffer asks {nbytes} bytes per connection but the kernel gave {min(got)} "
            "(net.core.wmem_max caps it at twice its value): raise net.core.wmem_max or ask less",
            stacklevel=2,
        )
    return group, BoundedConnections(list(bounded), nbytes)
