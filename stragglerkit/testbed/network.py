"""The emulated network: namespaces, the bridge, each host's veth link and the shapers on it.

:func:`build_network` makes an :class:`~stragglerkit.testbed.netns.EmulatedCluster`'s namespaces
(the bridge's first, with the probe endpoint's address), one veth pair per host whose other end is
a port of the bridge, the per-namespace settings and name service (:func:`add_namespace`), and
shapes every host's link in both directions (:func:`shape_link` on the two ends that
:func:`link_shapers` names; under a netem delay where the cluster adds latency:
:func:`require_netem`). The module docstring of :mod:`stragglerkit.testbed.netns` says why the
network is built this way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stragglerkit.testbed.iproute import TestbedError, command, netem_missing, shaper_commands, write_name_service

if TYPE_CHECKING:
    from stragglerkit.testbed.netns import EmulatedCluster

__all__ = ["BRIDGE", "add_namespace", "build_network", "link_shapers", "require_netem", "shape_link"]

BRIDGE = "skbr"
"""The bridge device in the bridge namespace."""


def build_network(cluster: EmulatedCluster) -> None:
    """The bridge namespace and bridge, then each host's namespace, veth pair, settings and shapers."""
    br = cluster.bridge_namespace
    add_namespace(cluster, br, cluster._probe_address)
    command(["ip", "-n", br, "link", "set", "lo", "up"])
    command(["ip", "-n", br, "link", "add", BRIDGE, "type", "bridge"])
    command(["ip", "-n", br, "link", "set", BRIDGE, "addrgenmode", "none"])
    command(["ip", "-n", br, "link", "set", BRIDGE, "mtu", str(cluster.config.mtu), "up"])
    command(["ip", "-n", br, "addr", "add", f"{cluster._probe_address}/{cluster._prefix_len}", "dev", BRIDGE])
    if cluster.config.latency > 0:
        require_netem(cluster)
    for host in range(cluster.hosts):
        ns, port = cluster.namespace(host), f"h{host}"
        add_namespace(cluster, ns, cluster.address(host))
        command(["ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name", cluster.interface, "netns", ns])
        for namespace, device in ((br, port), (ns, cluster.interface)):
            command(["ip", "-n", namespace, "link", "set", device, "addrgenmode", "none"])
        command(["ip", "-n", br, "link", "set", port, "mtu", str(cluster.config.mtu), "master", BRIDGE, "up"])
        command(["ip", "-n", ns, "link", "set", "lo", "up"])
        command(["ip", "-n", ns, "link", "set", cluster.interface, "mtu", str(cluster.config.mtu), "up"])
        command(
            ["ip", "-n", ns, "addr", "add", f"{cluster.address(host)}/{cluster._prefix_len}", "dev", cluster.interface]
        )
        if cluster.config.tcp_slow_start_after_idle is not None:
            value = int(cluster.config.tcp_slow_start_after_idle)
            setting = f"net.ipv4.tcp_slow_start_after_idle={value}"
            command(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", setting])
        if cluster.config.tcp_send_buffer is not None:
            most = cluster.config.tcp_send_buffer
            setting = f"net.ipv4.tcp_wmem=4096 {min(16384, most)} {most}"  # per namespace
            command(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", setting])
        shape_link(cluster, host, replace=False)


def add_namespace(cluster: EmulatedCluster, namespace: str, own_address: str) -> None:
    """A namespace of the cluster, with its congestion control and name service."""
    cluster._created.append(namespace)  # first, so that a half-made namespace is cleaned up too
    command(["ip", "netns", "add", namespace])
    if cluster.config.tcp_congestion_control is not None:  # the probe end's too: it sends in the probes
        setting = f"net.ipv4.tcp_congestion_control={cluster.config.tcp_congestion_control}"
        command(["ip", "netns", "exec", namespace, "sysctl", "-q", "-w", setting])
    names = {address: f"skh{h}" for h, address in enumerate(cluster._addresses)}
    write_name_service(namespace, {**names, cluster._probe_address: "skprobe"}, own_address)


def require_netem(cluster: EmulatedCluster) -> None:
    """Raise :class:`TestbedError` where the netem queueing discipline is missing."""
    missing = netem_missing(cluster.bridge_namespace)
    if missing:
        raise TestbedError(missing)


def link_shapers(cluster: EmulatedCluster, host: int) -> list[tuple[str, str]]:
    """(namespace, device) of the two shapers of ``host``: its send side and its receive side."""
    return [(cluster.namespace(host), cluster.interface), (cluster.bridge_namespace, f"h{host}")]


def shape_link(cluster: EmulatedCluster, host: int, *, replace: bool) -> None:
    """Shape both ends of ``host``'s link to its rate (``replace``: reshape a shaped link)."""
    for ns, dev in link_shapers(cluster, host):
        parent = None
        if cluster.config.latency > 0:
            half = f"{cluster.config.latency / 2 * 1e6:.0f}us"
            verb = "replace" if replace else "add"
            command(["tc", "-n", ns, "qdisc", verb, "dev", dev, "root", "handle", "1:", "netem", "delay", half])
            parent = "1:1"
        peers = [a for h, a in enumerate(cluster._addresses) if h != host] if cluster.config.fair_queueing else []
        match = "dst" if ns == cluster.namespace(host) else "src"
        rate = cluster.link_rate(host)
        for argv in shaper_commands(ns, dev, rate, parent, change=replace, peers=peers, match=match):
            command(argv)
