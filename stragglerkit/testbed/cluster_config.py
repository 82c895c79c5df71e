"""The emulated cluster's configuration (:class:`ClusterConfig`, ``EmulatedCluster.Config``) and
its checks, including the TCP congestion controls this kernel lets a network namespace use."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from stragglerkit.testbed.iproute import DEFAULT_PREFIX

__all__ = ["BENCHMARK_NETWORK", "ClusterConfig", "allowed_congestion_controls", "check_slowdown"]

BENCHMARK_NETWORK = ipaddress.IPv4Network("198.18.0.0/15")


def allowed_congestion_controls() -> list[str]:
    """The TCP congestion controls a new network namespace may use: this kernel's
    ``net.ipv4.tcp_allowed_congestion_control`` (a namespace other than the machine's own may only
    pick one of those, though ``tcp_available_congestion_control`` may list more)."""
    return _sysctl_words("tcp_allowed_congestion_control")


def _sysctl_words(name: str) -> list[str]:
    try:
        with open(f"/proc/sys/net/ipv4/{name}", encoding="ascii") as listing:
            return listing.read().split()
    except OSError:
        return []


def check_slowdown(slowdown: float) -> None:
    """A host's slowdown ``l`` must be at least 1."""
    if not slowdown >= 1.0:
        raise ValueError(
            f"slowdown l must be >= 1 (the host gets bandwidth / l), got {slowdown!r}; "
            "to make every host faster raise Config.bandwidth"
        )


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """An emulated cluster: its hosts, their NICs and TCP, and how the shaping is verified."""

    hosts: int = 4
    """Number of hosts (one namespace each); one rank per host in a benchmark."""
    bandwidth: float = 125e6
    """Each host's NIC rate in bytes/s (whole Ethernet frames), both directions. 1 Gbit/s = 125e6."""
    slowdowns: dict[int, float] = field(default_factory=dict)
    """Degraded hosts: {host: l} gives that host bandwidth / l (l >= 1) in both directions."""
    latency: float = 0.0
    """Added one-way host-to-host latency in seconds (needs sch_netem; 0 adds none)."""
    prefix: str = DEFAULT_PREFIX
    """Start of every namespace name; leftovers with this prefix are removed at start."""
    network: str = "198.18.0.0/24"
    """Address block for the hosts; must lie inside 198.18.0.0/15."""
    interface: str = "sknic"
    """Name of each host's interface (set GLOO_SOCKET_IFNAME to it)."""
    mtu: int = 1500
    """MTU of the emulated links."""
    tcp_send_buffer: int | None = None
    """Largest TCP send buffer of every host in bytes (the maximum of ``net.ipv4.tcp_wmem`` in
    its namespace); None keeps the kernel's (4 MiB by default). A send completes once its last
    byte is in the socket buffer, so with a large buffer a rank's next message starts while
    the previous one is still on its link, and TCP shares the link between the two."""
    tcp_congestion_control: str | None = None
    """TCP congestion control of every host (``net.ipv4.tcp_congestion_control`` in its
    namespace), e.g. ``cubic`` (Linux's default) or ``bbr``; None keeps what a new namespace
    inherits from this machine. It must be one of this kernel's
    ``net.ipv4.tcp_allowed_congestion_control`` (:func:`allowed_congestion_controls`)."""
    tcp_slow_start_after_idle: bool | None = None
    """Whether every host's TCP connections restart from a small congestion window after an idle
    time longer than their retransmission timeout (``net.ipv4.tcp_slow_start_after_idle`` in
    its namespace; the kernel's default is True). None keeps the kernel's. Congestion controls
    with their own pacing model (bbr) are exempt from it; loss-based ones (cubic, reno) restart
    every connection that was idle since the last AllReduce."""
    fair_queueing: bool = False
    """Share each link evenly among the peers whose data is on it: one queue per peer host in
    both directions (iproute.shaper_commands), served in turn, as a host's fair-queueing qdisc
    serves its flows and as TCP's shares settle at a switch port. False: one FIFO per link
    direction, where concurrent transfers share by how much each has queued (its window)."""
    verify: bool = True
    """Measure every shaped link at start and raise ShapingError if one is off."""
    tolerance: float = 0.15
    """Largest accepted relative difference between measured and expected payload rate."""
    measure_seconds: float = 0.03
    """Target duration of one verification transfer (bytes are bounded to 1-8 MiB)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field that is off."""
        c = self
        if not isinstance(c.hosts, int) or c.hosts < 2:
            raise ValueError(f"hosts must be an integer >= 2, got {c.hosts!r}")
        if not c.bandwidth > 0:
            raise ValueError(f"bandwidth must be positive bytes/s (1 Gbit/s = 125e6), got {c.bandwidth!r}")
        for host, slowdown in c.slowdowns.items():
            if not isinstance(host, int) or not 0 <= host < c.hosts:
                raise ValueError(f"host must be an integer in 0..{c.hosts - 1}, got {host!r}")
            check_slowdown(slowdown)
        if c.latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, got {c.latency!r}")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.]*-", c.prefix):
            raise ValueError(f"prefix must be letters/digits ending in '-', e.g. 'sk-', got {c.prefix!r}")
        try:
            network = ipaddress.IPv4Network(c.network)
        except ValueError as exc:
            raise ValueError(f"network {c.network!r} is not an IPv4 network like 198.18.0.0/24: {exc}") from exc
        if not network.subnet_of(BENCHMARK_NETWORK):
            raise ValueError(f"network {c.network} is outside 198.18.0.0/15; use e.g. 198.18.0.0/24")
        if network.num_addresses - 3 < c.hosts:
            raise ValueError(f"network {c.network} has room for {network.num_addresses - 3} hosts, {c.hosts} asked")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,14}", c.interface):
            raise ValueError(f"interface must be 1-15 lower-case letters/digits, got {c.interface!r}")
        if not 576 <= c.mtu <= 65535:
            raise ValueError(f"mtu must be in 576..65535, got {c.mtu}")
        if not 0 < c.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {c.tolerance}")
        if c.tcp_send_buffer is not None and not (isinstance(c.tcp_send_buffer, int) and c.tcp_send_buffer >= 8192):
            raise ValueError(f"tcp_send_buffer must be a number of bytes >= 8192 (8KiB), got {c.tcp_send_buffer!r}")
        if c.tcp_congestion_control is not None:
            allowed, name = allowed_congestion_controls(), c.tcp_congestion_control
            if name not in allowed:
                if name in _sysctl_words("tcp_available_congestion_control"):
                    how = (
                        f"this kernel has it but lets namespaces use only {' '.join(allowed) or 'none'}: as root, "
                        f"sysctl -w net.ipv4.tcp_allowed_congestion_control='{' '.join([*allowed, name])}'"
                    )
                else:
                    available = " ".join(_sysctl_words("tcp_available_congestion_control")) or "none"
                    how = f"this kernel has only {available}; load it with modprobe tcp_{name}"
                raise ValueError(f"tcp_congestion_control {name!r} is not available to the hosts' namespaces: {how}")
