"""An emulated cluster on one machine: one network namespace per host, real shaped NICs.

How it works
------------
For a cluster of n hosts with prefix ``sk-`` created by process PID (instance k of that process)::

      namespace sk-PID-k-h0          namespace sk-PID-k-br             namespace sk-PID-k-h1
    ┌─────────────────────┐   ┌─────────────────────────────────┐   ┌─────────────────────┐
    │ sknic 198.18.0.1/24 │───│ h0 ─┐   skbr (bridge)      ┌─ h1 │───│ sknic 198.18.0.2/24 │
    │ htb: what h0 sends  │   │ htb: what h0 receives     htb   │   │ htb: what h1 sends  │
    └─────────────────────┘   │     198.18.0.254 (probe end)    │   └─────────────────────┘
                              └─────────────────────────────────┘

- Every host is a namespace with one veth interface (``Config.interface``, default ``sknic``)
  whose peer end is a port of one bridge. The bridge lives in a namespace of its own, so nothing
  in the root namespace's networking is touched: no interface, route or address is added there.
- Addresses come from ``Config.network`` (default 198.18.0.0/24), which must lie inside
  198.18.0.0/15, the range reserved for benchmarking networks (RFC 2544). Host i gets the
  (i+1)-th address; the bridge namespace holds the last usable address (the *probe endpoint*).
  The namespaces have no default route, so traffic can reach only these addresses, and no IPv6
  link-local addresses (``addrgenmode none``), so the links carry IPv4 to these addresses only.
- Each host's link is shaped in both directions with an htb tree (iproute.shaper_commands) whose
  priority class lets small packets (TCP ACKs) pass the queued data:
  on the host's end of the veth (what the host sends) and on the bridge's end (what the host
  receives). A degraded host (slowdown l) gets bandwidth / l in both directions.
- Added latency needs the ``netem`` queueing discipline (kernel module sch_netem); when it is
  present, half of ``Config.latency`` is added on each of the two shapers a packet crosses, so
  host-to-host one-way latency is ``Config.latency``. Without sch_netem a non-zero latency is
  refused with a message saying so.
- The shapers' queues are deep (see iproute.tbf_arguments) so that they never drop: a drop is
  a TCP loss, and retransmission timeouts would swamp the timings.
- Each namespace has its own /etc/hosts and resolver (iproute.write_name_service), so that the
  name look-ups of c10d and gloo never send a DNS query out of the cluster.
- The shaping is verified with short TCP transfers (probe.py, bounded in bytes and time) between
  each host and the probe endpoint, one direction at a time, so every measurement sees exactly
  one shaper; then with every host sending to the next at once (the load of a ring AllReduce,
  where a small machine's CPU gives out first).
- The tbf rate counts whole Ethernet frames, so the expected TCP payload rate is
  ``bandwidth * (mtu - 52) / (mtu + 14)`` (IPv4 + TCP with timestamps, Ethernet header); the
  measured payload rate is compared with that.

Clean-up
--------
Namespaces are named ``{prefix}{pid}-{k}-{role}``. Leaving the context manager (normally, on an
exception, on Ctrl-C or on SIGTERM, for which handlers are installed while the cluster is up)
kills the processes started in the namespaces and deletes the namespaces, which deletes the veth
pairs and the bridge inside them. A run that was killed outright (SIGKILL, power loss) leaves
namespaces behind; the next cluster started with the same prefix finds them by name and deletes
those whose creating process no longer exists (:func:`remove_leftovers`).

Parts
-----
The cluster's construction and shaping are in :mod:`stragglerkit.testbed.network`, the
verification transfers in :mod:`stragglerkit.testbed.measurement`, the processes it starts in
:mod:`stragglerkit.testbed.processes`.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from stragglerkit.testbed import measurement
from stragglerkit.testbed.cluster_config import (
    BENCHMARK_NETWORK,
    ClusterConfig,
    allowed_congestion_controls,
    check_slowdown,
)
from stragglerkit.testbed.iproute import (
    DEFAULT_PREFIX,
    TestbedError,
    command,
    delete_namespace,
    find_leftovers,
    list_namespaces,
    namespace_refusal,
    netem_missing,
    next_instance,
    remove_leftovers,
)
from stragglerkit.testbed.measurement import shaping_error
from stragglerkit.testbed.network import build_network, shape_link
from stragglerkit.testbed.probing import Pair, ProbeRunner
from stragglerkit.testbed.processes import environment, exec_argv, stop_processes
from stragglerkit.testbed.shaping import LinkRate, ShapingError, ShapingReport
from stragglerkit.testbed.signals import SignalGuard

__all__ = [
    "BENCHMARK_NETWORK",
    "DEFAULT_PREFIX",
    "EmulatedCluster",
    "LinkRate",
    "ShapingError",
    "ShapingReport",
    "TestbedError",
    "allowed_congestion_controls",
    "find_leftovers",
    "list_namespaces",
    "remove_leftovers",
]


class EmulatedCluster:
    """N emulated hosts with shaped NICs; a context manager that always tears them down.

    Example::

        ok, reason = EmulatedCluster.available()
        if not ok:
            raise SystemExit(reason)          # or fall back to loopback
        config = EmulatedCluster.Config(hosts=4, bandwidth=parse_bandwidth("1Gbit"), slowdowns={3: 2.0})
        with EmulatedCluster(config) as cluster:
            print(cluster.shaping.describe())  # measured at start-up; ShapingError if off
            procs = [cluster.popen(h, [sys.executable, "train.py"], env=cluster.torch_env(h, port=29500))
                     for h in range(cluster.hosts)]
            for p in procs:
                p.wait(timeout=600)
    """

    Config = ClusterConfig
    """The cluster's configuration (:class:`~stragglerkit.testbed.cluster_config.ClusterConfig`)."""

    @staticmethod
    def available() -> tuple[bool, str]:
        """Whether this process can build an emulated cluster, and if not, what is missing."""
        if sys.platform != "linux":
            return False, f"the emulated cluster needs Linux network namespaces; this is {sys.platform}"
        missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
        if missing:
            return False, (
                f"{' and '.join(missing)} not found: install iproute2 (`apt-get install iproute2`); "
                "or benchmark over loopback instead"
            )
        if os.geteuid() != 0:
            return False, (
                "creating network namespaces needs root (euid is "
                f"{os.geteuid()}): run as root (e.g. with sudo) or benchmark over loopback instead"
            )
        refused = namespace_refusal()
        if refused:
            return False, (
                f"this root process may not create network namespaces ({refused}): it needs CAP_SYS_ADMIN and "
                "CAP_NET_ADMIN (in a container: --cap-add SYS_ADMIN --cap-add NET_ADMIN, or --privileged); "
                "or benchmark over loopback instead"
            )
        return True, "root and iproute2 present, network namespaces can be created"

    def __init__(self, config: ClusterConfig | None = None) -> None:
        self.config = config if config is not None else EmulatedCluster.Config()
        self.config.validate()
        network = ipaddress.IPv4Network(self.config.network)
        usable = list(itertools.islice(network.hosts(), self.config.hosts))
        self._addresses = [str(a) for a in usable]
        self._probe_address = str(network.broadcast_address - 1)
        self._prefix_len = network.prefixlen
        self._tag = f"{self.config.prefix}{os.getpid()}-{next_instance()}"
        self._slowdowns = {h: float(self.config.slowdowns.get(h, 1.0)) for h in range(self.config.hosts)}
        self._processes: list[subprocess.Popen[Any]] = []
        self._created: list[str] = []
        self._active = False
        self._signals = SignalGuard()
        self.shaping: ShapingReport | None = None
        """The last verification's measurements (set at start when Config.verify)."""
        self.removed_leftovers: list[str] = []
        """Namespaces of crashed earlier runs removed at start."""

    def _check_host(self, host: int) -> None:
        if not isinstance(host, int) or not 0 <= host < self.config.hosts:
            raise ValueError(f"host must be an integer in 0..{self.config.hosts - 1}, got {host!r}")

    # ----------------------------------------------------------------- names and addresses

    @property
    def hosts(self) -> int:
        return self.config.hosts

    @property
    def interface(self) -> str:
        """The host interface name inside every host namespace (for GLOO_SOCKET_IFNAME)."""
        return self.config.interface

    def namespace(self, host: int) -> str:
        self._check_host(host)
        return f"{self._tag}-h{host}"

    @property
    def bridge_namespace(self) -> str:
        return f"{self._tag}-br"

    def address(self, host: int) -> str:
        self._check_host(host)
        return self._addresses[host]

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    @property
    def probe_address(self) -> str:
        """Address of the bridge namespace, the far end of every verification transfer."""
        return self._probe_address

    def slowdown(self, host: int) -> float:
        self._check_host(host)
        return self._slowdowns[host]

    def link_rate(self, host: int) -> float:
        """The configured shaper rate of ``host`` in bytes/s (bandwidth / slowdown)."""
        return self.config.bandwidth / self.slowdown(host)

    def expected_payload_rate(self, host: int) -> float:
        """TCP payload bytes/s that the shaper of ``host`` lets through (headers take the rest)."""
        mtu = self.config.mtu
        return self.link_rate(host) * (mtu - 52) / (mtu + 14)

    def torch_env(self, host: int, *, port: int = 29500, world_size: int | None = None) -> dict[str, str]:
        """Environment for one torch.distributed rank per host (rank = host) with gloo on the host NIC."""
        self._check_host(host)
        return {
            "MASTER_ADDR": self.address(0),
            "MASTER_PORT": str(port),
            "RANK": str(host),
            "WORLD_SIZE": str(world_size if world_size is not None else self.hosts),
            "GLOO_SOCKET_IFNAME": self.interface,
        }

    def describe(self) -> dict[str, Any]:
        """What a benchmark records about the cluster: configuration, addresses, TCP congestion
        control inside the hosts, and the last shaping measurements (None if never measured)."""
        c = self.config
        congestion = None
        if self._active:
            path = "/proc/sys/net/ipv4/tcp_congestion_control"
            congestion = self.run(0, ["cat", path], capture_output=True, text=True, timeout=10).stdout.strip()
        return {
            "hosts": c.hosts,
            "bandwidth_Bps": c.bandwidth,
            "slowdowns": {str(h): s for h, s in self._slowdowns.items() if s != 1.0},
            "latency_s": c.latency,
            "mtu": c.mtu,
            "tcp_send_buffer": c.tcp_send_buffer,
            "fair_queueing": c.fair_queueing,
            "tcp_slow_start_after_idle": c.tcp_slow_start_after_idle,
            "network": c.network,
            "addresses": self.addresses,
            "interface": c.interface,
            "expected_payload_Bps": [self.expected_payload_rate(h) for h in range(c.hosts)],
            "tcp_congestion_control": congestion,
            "shaping": self.shaping.to_dict() if self.shaping is not None else None,
        }

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> EmulatedCluster:
        self._signals.install()
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        """Removes leftovers, builds and shapes the cluster, and verifies it (Config.verify).

        Prefer ``with EmulatedCluster(config) as cluster:``; start() alone installs no signal
        handlers, and the caller must call close() (in a ``finally``).
        """
        ok, reason = EmulatedCluster.available()
        if not ok:
            raise TestbedError(reason)
        if self._active:
            raise TestbedError("the cluster is already started")
        self._active = True
        self.removed_leftovers = remove_leftovers(self.config.prefix)
        build_network(self)
        if self.config.verify:
            self.verify()

    def close(self) -> None:
        """Ends the processes started in the cluster and deletes every namespace; safe to call twice."""
        held = self._signals.hold()
        try:
            stop_processes(self._processes)
            for namespace in reversed(self._created):
                delete_namespace(namespace)
            self._created.clear()
            self._active = False
        finally:
            # Handlers first, then unblock: a signal that came during the clean-up is then
            # delivered to the handler the program had before the cluster started.
            self._signals.restore()
            self._signals.release(held)

    @staticmethod
    def netem_available(prefix: str = DEFAULT_PREFIX) -> tuple[bool, str]:
        """Whether added latency (Config.latency > 0) works here; checked in a throw-away namespace."""
        ok, reason = EmulatedCluster.available()
        if not ok:
            return False, reason
        namespace = f"{prefix}{os.getpid()}-{next_instance()}-br"
        try:
            command(["ip", "netns", "add", namespace])
            missing = netem_missing(namespace)
        finally:
            delete_namespace(namespace)
        return (False, missing) if missing else (True, "the netem queueing discipline is available")

    def set_slowdown(self, host: int, slowdown: float, *, verify: bool = False) -> tuple[LinkRate, LinkRate] | None:
        """Reshapes ``host``'s link to bandwidth / slowdown in both directions (1 restores it).

        With ``verify`` the link is measured afterwards and ShapingError raised if it is off;
        returns the (send, recv) measurements then, else None.
        """
        self._check_host(host)
        check_slowdown(slowdown)
        self._require_active()
        self._slowdowns[host] = float(slowdown)
        shape_link(self, host, replace=True)
        if not verify:
            return None
        report = self.verify(hosts=[host], ring=False)
        return report.rate(host, "send"), report.rate(host, "recv")

    def _require_active(self) -> None:
        if not self._active:
            raise TestbedError("the cluster is not running; use it inside `with EmulatedCluster(config) as cluster:`")

    # ----------------------------------------------------------------- processes

    def popen(
        self, host: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Starts ``argv`` inside ``host``'s namespace; ``env`` is added to the current environment.

        The process is ended (SIGTERM, then SIGKILL) when the cluster closes, if still running.
        Other keyword arguments go to subprocess.Popen.
        """
        self._require_active()
        process = subprocess.Popen(exec_argv(self, host, argv), env=environment(env), **kwargs)
        self._processes.append(process)
        return process

    def popen_on_bridge(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Starts ``argv`` in the bridge namespace, which every host reaches at :attr:`probe_address`
        as it would a launcher machine on the same switch (e.g. a job's rendezvous server).

        Ended when the cluster closes, like :meth:`popen`'s processes."""
        self._require_active()
        if isinstance(argv, str | bytes) or not argv:
            raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
        argv = ["ip", "netns", "exec", self.bridge_namespace, *map(str, argv)]
        process = subprocess.Popen(argv, env=environment(env), **kwargs)
        self._processes.append(process)
        return process

    def run(
        self,
        host: int,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        check: bool = True,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[Any]:
        """Runs ``argv`` inside ``host``'s namespace to completion (killed after ``timeout`` s)."""
        self._require_active()
        return subprocess.run(exec_argv(self, host, argv), env=environment(env), timeout=timeout, check=check, **kwargs)

    def ping(self, source: int, target: int, *, rounds: int = 10, size: int = 64, timeout: float = 10.0) -> list[float]:
        """Round-trip times in seconds of ``rounds`` TCP messages from ``source`` to ``target``.

        Raises TestbedError if an echoed message differs from what was sent.
        """
        self._check_host(source)
        self._check_host(target)
        self._require_active()
        if not 1 <= rounds <= 10_000 or not 1 <= size <= 1 << 20:
            raise ValueError(f"rounds must be in 1..10000 and size in 1..1MiB, got {rounds}, {size}")
        pair = Pair(self.namespace(target), self.namespace(source), self.address(target))
        result = ProbeRunner(self._processes).ping(pair, rounds, size, timeout)
        if not result["intact"]:
            raise TestbedError(f"host {target} echoed different bytes than host {source} sent")
        return [float(t) for t in result["rtts"]]

    # ----------------------------------------------------------------- verification

    def measure_link(self, host: int, direction: str) -> LinkRate:
        """Measures one direction of ``host``'s link alone ("send" or "recv")."""
        return measurement.measure_link(self, host, direction)

    def measure_ring(self) -> tuple[LinkRate, ...]:
        """Every host sends to the next one at the same time, as in a ring AllReduce.

        Host i's flow crosses its send shaper and host i+1's receive shaper, so it should get the
        smaller of the two rates. This is the load at which a small machine's CPU gives out first.
        """
        return measurement.measure_ring(self)

    def measure_fan_out(self, host: int, peers: Sequence[int]) -> tuple[LinkRate, ...]:
        """``host`` sends to every one of ``peers`` at the same time, one transfer each.

        The transfers share ``host``'s send link; with ``Config.fair_queueing`` each should get an
        even share of it (the expected rate of each is the link's divided by the number of peers,
        or the peer's own rate where that is lower).
        """
        return measurement.measure_fan_out(self, host, peers)

    def measure(self, hosts: Sequence[int] | None = None, *, ring: bool = True) -> ShapingReport:
        """Measures both directions of each host's link alone (all hosts by default) and, with
        ``ring``, all hosts sending at once (measure_ring); raises nothing."""
        chosen = list(range(self.hosts)) if hosts is None else list(hosts)
        links = [self.measure_link(h, d) for h in chosen for d in ("send", "recv")]
        if ring:
            links.extend(self.measure_ring())
        return ShapingReport(tuple(links), self.config.tolerance)

    def verify(self, hosts: Sequence[int] | None = None, *, ring: bool = True) -> ShapingReport:
        """Like measure(), but raises ShapingError when a link is more than the tolerance off.

        The report is also kept in ``self.shaping`` so that a benchmark can record it.
        """
        report = self.measure(hosts, ring=ring)
        self.shaping = report
        if not report.ok:
            raise shaping_error(report)
        return report
