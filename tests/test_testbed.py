"""The emulated cluster (network namespaces + tc shaping) and the fault injectors.

Tests that build namespaces need root and iproute2 and are skipped with the reason otherwise
(they fail instead under CI=true).
Every namespace they make carries the prefix ``sktest-`` and the pid of the process that made it;
the fixtures delete them in ``finally`` even when a test fails. All traffic goes between the
namespaces' 198.18.0.0/24 addresses.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _require import needs

from stragglerkit.testbed import iproute
from stragglerkit.testbed.inject import (
    AutoDelay,
    CombinedInjector,
    DrawnDelay,
    FixedDelay,
    JitterInjector,
    NicDegradation,
    StragglerInjector,
    parse_delay,
    sleep_precisely,
)
from stragglerkit.testbed.netns import EmulatedCluster, ShapingError, TestbedError, allowed_congestion_controls
from stragglerkit.testbed.signals import SignalGuard
from stragglerkit.units import parse_bandwidth

PREFIX = "sktest-"
ROOT = Path(__file__).resolve().parents[1]
AVAILABLE, REASON = EmulatedCluster.available()
needs_netns = needs("the emulated cluster", not AVAILABLE, REASON)


def _namespaces_of(pid: int) -> list[str]:
    return [n for n in iproute.list_namespaces() if n.startswith(f"{PREFIX}{pid}-")]


def _delete_namespaces_of(pid: int) -> None:
    for name in _namespaces_of(pid):
        iproute.delete_namespace(name)


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., EmulatedCluster]]:
    made: list[EmulatedCluster] = []

    def make(**config: Any) -> EmulatedCluster:
        cluster = EmulatedCluster(EmulatedCluster.Config(prefix=PREFIX, **config))
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()
        _delete_namespaces_of(os.getpid())


# --------------------------------------------------------------------------- without root


def test_config_rejects_addresses_outside_the_benchmark_range() -> None:
    with pytest.raises(ValueError, match=r"outside 198\.18\.0\.0/15"):
        EmulatedCluster(EmulatedCluster.Config(network="10.0.0.0/24"))
    with pytest.raises(ValueError, match="room for 5 hosts"):
        EmulatedCluster(EmulatedCluster.Config(hosts=6, network="198.19.0.0/29"))
    cluster = EmulatedCluster(EmulatedCluster.Config(hosts=3, network="198.19.4.0/24"))
    assert cluster.addresses == ["198.19.4.1", "198.19.4.2", "198.19.4.3"]
    assert cluster.probe_address == "198.19.4.254"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"hosts": 1}, "hosts must be an integer >= 2"),
        ({"bandwidth": 0}, "bandwidth must be positive"),
        ({"slowdowns": {1: 0.5}}, "slowdown l must be >= 1"),
        ({"slowdowns": {9: 2.0}}, r"host must be an integer in 0\.\.3"),
        ({"prefix": "bad prefix"}, "prefix must be"),
        ({"interface": "much-too-long-name"}, "interface must be"),
        ({"latency": -1.0}, "latency must be >= 0"),
        ({"tcp_send_buffer": 100}, "tcp_send_buffer must be a number of bytes >= 8192"),
        ({"tcp_congestion_control": "no-such-control"}, "'no-such-control' is not available to the hosts' namespaces"),
    ],
)
def test_config_errors_say_what_is_wrong(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EmulatedCluster(EmulatedCluster.Config(**config))


def test_available_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ok, reason = EmulatedCluster.available()
    assert not ok and "needs root" in reason and "loopback" in reason
    monkeypatch.setattr("shutil.which", lambda tool: None)
    ok, reason = EmulatedCluster.available()
    assert not ok and "apt-get install iproute2" in reason


def test_torch_env_points_every_rank_at_host_zero() -> None:
    cluster = EmulatedCluster(EmulatedCluster.Config(hosts=4))
    env = cluster.torch_env(2, port=29600)
    assert env == {
        "MASTER_ADDR": "198.18.0.1",
        "MASTER_PORT": "29600",
        "RANK": "2",
        "WORLD_SIZE": "4",
        "GLOO_SOCKET_IFNAME": "sknic",
    }


def test_shaper_sends_small_packets_first() -> None:
    argvs = iproute.shaper_commands("ns", "dev0", 62.5e6, None, change=False)
    assert argvs[0][-6:] == ["root", "handle", "10:", "htb", "default", "20"]
    top = next(a for a in argvs if "10:1" in a and "classid" in a and a[a.index("classid") + 1] == "10:1")
    assert top[top.index("rate") + 1] == "62500000bps" and top[top.index("ceil") + 1] == "62500000bps"
    small = next(a for a in argvs if "classid" in a and a[a.index("classid") + 1] == "10:10")
    assert small[small.index("prio") + 1] == "0" and small[small.index("ceil") + 1] == "62500000bps"
    rule = next(a for a in argvs if "filter" in a)
    # IP total length (offset 2) with every bit from 128 up clear: packets under 128 bytes
    assert rule[rule.index("u16") + 1 : rule.index("u16") + 5] == ["0", "0xff80", "at", "2"]
    assert rule[-1] == "10:10"
    changes = iproute.shaper_commands("ns", "dev0", 125e6, "1:1", change=True)
    assert all(a[3] == "class" and a[4] == "change" for a in changes) and len(changes) == 3
    assert iproute.shaper_commands("ns", "dev0", 125e6, "1:1", change=False)[0][7:9] == ["parent", "1:1"]


def test_shaper_gives_each_peer_a_queue_of_its_own() -> None:
    peers = ["198.18.0.2", "198.18.0.3", "198.18.0.4"]
    argvs = iproute.shaper_commands("ns", "dev0", 125e6, None, change=False, peers=peers, match="dst")

    def leaf(class_id: str) -> list[str]:
        return next(a for a in argvs if "classid" in a and a[a.index("classid") + 1] == class_id)

    data = [leaf(c) for c in ("10:20", "10:101", "10:102", "10:103")]
    assured = {a[a.index("rate") + 1] for a in data}
    assert len(assured) == 1  # equal shares
    assert int(assured.pop().removesuffix("bps")) * 4 <= 125e6 - 125e6 / 20
    assert all(a[a.index("ceil") + 1] == "125000000bps" and a[a.index("prio") + 1] == "1" for a in data)
    queues = [a for a in argvs if "bfifo" in a]
    assert sorted(a[a.index("parent") + 1] for a in queues) == ["10:10", "10:101", "10:102", "10:103", "10:20"]
    assert len({a[a.index("handle") + 1] for a in queues}) == 5
    filters = [a for a in argvs if "filter" in a]
    assert filters[0][filters[0].index("prio") + 1] == "1" and filters[0][-1] == "10:10"  # small packets first
    by_peer = {a[a.index("dst") + 1]: a[-1] for a in filters[1:]}
    assert by_peer == {"198.18.0.2/32": "10:101", "198.18.0.3/32": "10:102", "198.18.0.4/32": "10:103"}
    assert all(a[a.index("prio") + 1] == "2" for a in filters[1:])
    received = iproute.shaper_commands("ns", "h0", 125e6, None, change=False, peers=peers, match="src")
    assert ["ip", "src", "198.18.0.3/32", "flowid", "10:102"] == [a for a in received if "filter" in a][2][-5:]
    changes = iproute.shaper_commands("ns", "dev0", 62.5e6, None, change=True, peers=peers)
    assert len(changes) == 6 and all(a[4] == "change" and a[a.index("ceil") + 1] == "62500000bps" for a in changes)
    with pytest.raises(ValueError, match="match must be 'dst' or 'src'"):
        iproute.shaper_commands("ns", "dev0", 125e6, None, change=False, peers=peers, match="to")


def test_shaper_bucket_passes_a_whole_gso_frame() -> None:
    for rate in (1e6, 25e6, 125e6, 1.25e9):
        args = iproute.tbf_arguments(rate)
        burst = int(args[args.index("burst") + 1])
        assert burst >= 64 * 1024 + 1500
        assert args[args.index("rate") + 1] == f"{int(rate)}bps"


def test_leftover_names_carry_their_owner() -> None:
    assert iproute._namespace_owner("sk-1234-0-h3", "sk-") == 1234
    assert iproute._namespace_owner("sk-oops", "sk-") is None
    assert iproute._namespace_owner("sk-x-12-0-h0", "sk-") is None  # another prefix's cluster
    assert iproute._namespace_owner("sk-12-0-h0-extra", "sk-") is None
    assert iproute._namespace_owner("sktest-77-2-br", "sktest-") == 77


# --------------------------------------------------------------------------- injectors


def test_fixed_straggler_delays_only_its_rank() -> None:
    injector = StragglerInjector(rank=3, delay="5ms")
    assert injector.delay_for(0, 3) == pytest.approx(5e-3)
    assert injector.delay_for(17, 3) == pytest.approx(5e-3)
    assert [injector.delay_for(4, r) for r in (0, 1, 2)] == [0.0, 0.0, 0.0]
    assert StragglerInjector(rank=[1, 2], delay=0.01).delay_for(9, 2) == 0.01


def test_drawn_delays_are_seeded_and_have_the_asked_mean() -> None:
    injector = StragglerInjector(rank=0, delay="exp:4ms", seed=11)
    draws = [injector.delay_for(step, 0) for step in range(4000)]
    assert draws == [StragglerInjector(rank=0, delay="exp:4ms", seed=11).delay_for(s, 0) for s in range(4000)]
    assert draws != [StragglerInjector(rank=0, delay="exp:4ms", seed=12).delay_for(s, 0) for s in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(4e-3, rel=0.08)
    uniform = [StragglerInjector(rank=0, delay="uniform:2ms:6ms").delay_for(s, 0) for s in range(2000)]
    assert min(uniform) >= 2e-3 and max(uniform) <= 6e-3
    assert sum(uniform) / len(uniform) == pytest.approx(4e-3, rel=0.05)
    normal = [DrawnDelay("normal", 1e-3, 2e-3, seed=3).sample(s, 0, None) for s in range(2000)]
    assert min(normal) == 0.0  # negative draws are clipped


def test_auto_delay_uses_the_measured_time() -> None:
    injector = StragglerInjector(rank=1, delay="auto:1.5")
    with pytest.raises(ValueError, match="needs the measured time"):
        injector.delay_for(0, 1)
    assert injector.delay_for(0, 1, measured=0.002) == pytest.approx(0.003)
    injector.calibrate(0.004)
    assert injector.delay_for(5, 1) == pytest.approx(0.006)
    assert injector.delay_for(5, 0) == 0.0


def test_jitter_is_seeded_bounded_and_differs_by_rank() -> None:
    jitter = JitterInjector(max_delay="2ms", seed=7)
    delays = [[jitter.delay_for(step, rank) for rank in range(8)] for step in range(200)]
    flat = [d for row in delays for d in row]
    assert all(0.0 <= d <= 2e-3 for d in flat)
    assert sum(flat) / len(flat) == pytest.approx(1e-3, rel=0.1)
    assert len({max(range(8), key=row.__getitem__) for row in delays}) == 8  # the last rank changes
    assert JitterInjector(max_delay=2e-3, seed=7).delay_for(3, 4) == delays[3][4]


def test_before_allreduce_sleeps_the_delay() -> None:
    injector = CombinedInjector([StragglerInjector(rank=0, delay="20ms"), JitterInjector(max_delay=0.0)])
    slept = injector.before_allreduce(0, 0)
    assert 0.020 <= slept < 0.5
    assert injector.before_allreduce(0, 1) == 0.0
    assert sleep_precisely(-1.0) == 0.0


@pytest.mark.parametrize(
    ("spec", "model"),
    [
        ("5ms", FixedDelay(5e-3)),
        (0.25, FixedDelay(0.25)),
        ("uniform:1ms:3ms", DrawnDelay("uniform", 1e-3, 3e-3)),
        ("exp:2ms", DrawnDelay("exp", 2e-3)),
        ("normal:5ms:1ms", DrawnDelay("normal", 5e-3, 1e-3)),
        ("auto", AutoDelay(1.0)),
        ("auto:2", AutoDelay(2.0)),
    ],
)
def test_parse_delay(spec: str | float, model: object) -> None:
    parsed = parse_delay(spec)
    assert type(parsed) is type(model)
    assert parsed == pytest.approx(model) if isinstance(model, FixedDelay) else parsed == model


@pytest.mark.parametrize("spec", ["fast", "uniform:3ms", "uniform:5ms:1ms", "exp:-1ms", "poisson:1ms"])
def test_parse_delay_rejects_nonsense(spec: str) -> None:
    with pytest.raises(ValueError, match="delay"):
        parse_delay(spec)


class _FakeCluster:
    def __init__(self, hosts: int) -> None:
        self.hosts = hosts
        self.current = dict.fromkeys(range(hosts), 1.0)
        self.calls: list[tuple[int, float]] = []

    def slowdown(self, host: int) -> float:
        return self.current[host]

    def set_slowdown(self, host: int, slowdown: float, *, verify: bool = False) -> object:
        self.calls.append((host, slowdown))
        self.current[host] = slowdown
        return None


def test_nic_degradation_reshapes_and_restores() -> None:
    degradation = NicDegradation.parse("3:2, 1:1.5")
    assert degradation.slowdowns == {3: 2.0, 1: 1.5}
    cluster = _FakeCluster(4)
    with degradation.applied(cluster):
        assert cluster.current == {0: 1.0, 1: 1.5, 2: 1.0, 3: 2.0}
    assert cluster.current == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    with pytest.raises(ValueError, match="does not exist"):
        NicDegradation({7: 2.0}).apply(cluster)
    for bad in ("3", "3:0.5", "x:2", "1:2,1:3"):
        with pytest.raises(ValueError, match=r"degraded|slowdown"):
            NicDegradation.parse(bad)


# --------------------------------------------------------------------------- with namespaces


def _link_names_in_root() -> list[str]:
    out = iproute.command(["ip", "-o", "link", "show"])
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def _assert_gone(names: list[str]) -> None:
    assert names, "the cluster should have created namespaces"
    remaining = set(iproute.list_namespaces()) & set(names)
    assert not remaining, f"namespaces left behind: {sorted(remaining)}"
    assert not [n for n in names if iproute.namespace_etc(n).exists()], "/etc/netns files left behind"
    assert not [n for n in _link_names_in_root() if n.startswith(("sk", PREFIX))]


@needs_netns
@pytest.mark.parametrize("bandwidth", ["200Mbit", "1Gbit"])
def test_shaping_is_effective_in_both_directions(make_cluster: Callable[..., EmulatedCluster], bandwidth: str) -> None:
    rate = parse_bandwidth(bandwidth)
    with make_cluster(hosts=2, bandwidth=rate) as cluster:
        report = cluster.shaping
        assert report is not None and report.ok, report.describe() if report else "no report"
        assert {(link.host, link.direction) for link in report.links} == {
            (h, d) for h in (0, 1) for d in ("send", "recv", "ring")
        }
        for link in report.links:
            assert link.configured == rate
            assert abs(link.measured / link.expected - 1) <= 0.15, report.describe()
        qdiscs = iproute.command(["tc", "-n", cluster.bridge_namespace, "qdisc", "show", "dev", "h1"])
        assert "htb" in qdiscs
        classes = iproute.command(["tc", "-n", cluster.bridge_namespace, "class", "show", "dev", "h1"])
        assert "10:10" in classes and "prio 0" in classes  # small packets (ACKs) first
        filters = iproute.command(["tc", "-n", cluster.bridge_namespace, "filter", "show", "dev", "h1"])
        assert "flowid 10:10" in filters
        described = cluster.describe()
        assert described["shaping"] == report.to_dict() and described["bandwidth_Bps"] == rate
        assert described["tcp_congestion_control"]  # e.g. "cubic" or "bbr"
        json.dumps(described)


@needs_netns
def test_verification_fails_when_a_link_is_not_shaped(make_cluster: Callable[..., EmulatedCluster]) -> None:
    with make_cluster(hosts=2, bandwidth=parse_bandwidth("200Mbit"), verify=False) as cluster:
        iproute.command(["tc", "-n", cluster.namespace(0), "qdisc", "del", "dev", cluster.interface, "root"])
        with pytest.raises(ShapingError, match="faster than shaped") as caught:
            cluster.verify(hosts=[0])
        send = caught.value.report.rate(0, "send")
        assert send.measured > 1.15 * send.expected and send.attempts == tuple(send.attempts)
        assert caught.value.report.rate(0, "recv").within(0.15)


@needs_netns
def test_degraded_host_gets_half_the_rate(make_cluster: Callable[..., EmulatedCluster]) -> None:
    with make_cluster(hosts=2, bandwidth=parse_bandwidth("400Mbit"), slowdowns={1: 2.0}) as cluster:
        report = cluster.shaping
        assert report is not None
        for direction in ("send", "recv"):
            ratio = report.rate(1, direction).measured / report.rate(0, direction).measured
            assert ratio == pytest.approx(0.5, rel=0.15), report.describe()
        rates = cluster.set_slowdown(0, 2.0, verify=True)
        assert rates is not None
        for link in rates:
            assert link.measured == pytest.approx(parse_bandwidth("200Mbit") * 1448 / 1514, rel=0.15)
        cluster.set_slowdown(0, 1.0)
        assert cluster.link_rate(0) == parse_bandwidth("400Mbit")


def _class_bytes(namespace: str, device: str) -> dict[str, int]:
    """Bytes sent per htb class of ``device`` (``tc -s class show``)."""
    out = iproute.command(["tc", "-n", namespace, "-s", "class", "show", "dev", device])
    counted: dict[str, int] = {}
    current = ""
    for line in out.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            current = words[2]
        elif words[:1] == ["Sent"] and current:
            counted[current] = int(words[1])
    return counted


@needs_netns
def test_fair_queueing_puts_each_peer_in_its_queue_and_shares_evenly(
    make_cluster: Callable[..., EmulatedCluster],
) -> None:
    with make_cluster(hosts=3, bandwidth=parse_bandwidth("200Mbit"), fair_queueing=True) as cluster:
        assert cluster.describe()["fair_queueing"] is True
        sent_before = _class_bytes(cluster.namespace(0), cluster.interface)
        received_before = _class_bytes(cluster.bridge_namespace, "h1")
        to_1, to_2 = cluster.measure_fan_out(0, [1, 2])
        sent = {k: v - sent_before.get(k, 0) for k, v in _class_bytes(cluster.namespace(0), cluster.interface).items()}
        received = {k: v - received_before.get(k, 0) for k, v in _class_bytes(cluster.bridge_namespace, "h1").items()}
        # host 0's send link: the data to host 1 in 10:101 and to host 2 in 10:102, about as much each
        assert sent["10:101"] > 1 << 20 and sent["10:102"] > 1 << 20
        assert 0.5 < sent["10:101"] / sent["10:102"] < 2
        # host 1's receive link: what host 0 sent in the class of host 0 (its first peer), not the default
        assert received["10:101"] > 1 << 20 and received.get("10:20", 0) < 1 << 16
        for rate in (to_1, to_2):  # half of the link each
            assert rate.within(0.15), f"{rate.direction}: {rate.measured:.3g} B/s, expected {rate.expected:.3g}"
    with pytest.raises(ValueError, match="distinct hosts other than 0"):
        EmulatedCluster(EmulatedCluster.Config(hosts=3, prefix=PREFIX, verify=False)).measure_fan_out(0, [0, 1])


@needs_netns
def test_two_hosts_ping_pong_over_tcp(make_cluster: Callable[..., EmulatedCluster]) -> None:
    with make_cluster(hosts=2, verify=False) as cluster:
        rtts = cluster.ping(0, 1, rounds=20, size=1000)
        assert len(rtts) == 20 and all(0 < t < 1.0 for t in rtts)
        back = cluster.ping(1, 0, rounds=3)
        assert len(back) == 3
        # Nothing can leave: the only route is the cluster's own subnet.
        routes = cluster.run(0, ["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
        assert routes.split("\n")[0].startswith("198.18.0.0/24 dev sknic") and "default" not in routes


@needs_netns
def test_processes_run_inside_the_host_namespace(make_cluster: Callable[..., EmulatedCluster]) -> None:
    with make_cluster(hosts=2, verify=False) as cluster:
        out = cluster.run(1, ["ip", "-4", "-o", "addr", "show", "dev", "$IFACE"], check=False, capture_output=True)
        assert out.returncode != 0  # argv is not run through a shell
        script = "import os; print(os.environ['GLOO_SOCKET_IFNAME'], os.environ['RANK'])"
        done = cluster.run(1, [sys.executable, "-c", script], env=cluster.torch_env(1), capture_output=True, text=True)
        assert done.stdout.split() == ["sknic", "1"]
        addr = cluster.run(1, ["ip", "-4", "-o", "addr", "show", "dev", "sknic"], capture_output=True, text=True)
        assert "198.18.0.2/24" in addr.stdout
        sleeper = cluster.popen(0, ["sleep", "60"])
    assert sleeper.poll() is not None  # ended at tear-down


@needs_netns
def test_tcp_send_buffer_is_set_in_every_host_namespace_only(make_cluster: Callable[..., EmulatedCluster]) -> None:
    def largest_send_buffer(argv_prefix: list[str]) -> int:
        out = subprocess.run([*argv_prefix, "sysctl", "-n", "net.ipv4.tcp_wmem"], capture_output=True, text=True)
        return int(out.stdout.split()[-1])

    outside = largest_send_buffer([])
    with make_cluster(hosts=2, verify=False, tcp_send_buffer=256 * 1024) as cluster:
        for host in range(2):
            inside = cluster.run(host, ["sysctl", "-n", "net.ipv4.tcp_wmem"], capture_output=True, text=True)
            assert inside.stdout.split() == ["4096", "16384", str(256 * 1024)]
        assert cluster.describe()["tcp_send_buffer"] == 256 * 1024
        assert largest_send_buffer([]) == outside  # this machine's own setting is untouched


@needs_netns
@pytest.mark.parametrize("restart", [False, True])
def test_slow_start_after_idle_is_set_in_every_host_namespace_only(
    make_cluster: Callable[..., EmulatedCluster], restart: bool
) -> None:
    path = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"
    outside = Path(path).read_text().strip()
    with make_cluster(hosts=2, verify=False, tcp_slow_start_after_idle=restart) as cluster:
        for host in range(2):
            inside = cluster.run(host, ["cat", path], capture_output=True, text=True, timeout=10)
            assert inside.stdout.strip() == str(int(restart))
        assert cluster.describe()["tcp_slow_start_after_idle"] is restart
    assert Path(path).read_text().strip() == outside  # this machine's own setting is untouched


@needs_netns
def test_congestion_control_is_set_in_every_namespace_only(make_cluster: Callable[..., EmulatedCluster]) -> None:
    path = "/proc/sys/net/ipv4/tcp_congestion_control"
    with open(path, encoding="ascii") as current:
        outside = current.read().strip()
    choices = [name for name in allowed_congestion_controls() if name != outside]
    if not choices:
        pytest.skip(f"this kernel offers no TCP congestion control besides {outside!r} to set")
    chosen = choices[0]
    with make_cluster(hosts=2, verify=False, tcp_congestion_control=chosen) as cluster:
        for namespace in [cluster.namespace(0), cluster.namespace(1), cluster.bridge_namespace]:
            inside = subprocess.run(["ip", "netns", "exec", namespace, "cat", path], capture_output=True, text=True)
            assert inside.stdout.strip() == chosen, namespace
        assert cluster.describe()["tcp_congestion_control"] == chosen
    with open(path, encoding="ascii") as current:
        assert current.read().strip() == outside  # this machine's own setting is untouched


@needs_netns
def test_added_latency_needs_netem(make_cluster: Callable[..., EmulatedCluster]) -> None:
    netem, why = EmulatedCluster.netem_available(PREFIX)
    assert not _namespaces_of(os.getpid())  # the check's namespace is gone
    cluster = make_cluster(hosts=2, latency=0.004, verify=False)
    try:
        cluster.__enter__()
    except TestbedError as exc:
        assert not netem and why == str(exc)
        assert "sch_netem" in str(exc) and "latency=0" in str(exc)
        assert not _namespaces_of(os.getpid())  # a failed start cleans up too
        return
    assert netem, why
    try:
        rtts = cluster.ping(0, 1, rounds=5)
        assert min(rtts) >= 2 * 0.004 * 0.9
    finally:
        cluster.close()


@needs_netns
def test_teardown_after_normal_exit_and_after_an_exception(make_cluster: Callable[..., EmulatedCluster]) -> None:
    with make_cluster(hosts=3, verify=False) as cluster:
        names = _namespaces_of(os.getpid())
        assert sorted(names) == sorted([cluster.bridge_namespace, *(cluster.namespace(h) for h in range(3))])
    _assert_gone(names)

    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="boom"), make_cluster(hosts=2, verify=False):
        names = _namespaces_of(os.getpid())
        assert signal.getsignal(signal.SIGTERM) is not handler  # tear-down handler installed
        raise RuntimeError("boom")
    _assert_gone(names)
    assert signal.getsignal(signal.SIGTERM) is handler  # and restored


_SIGNALLED_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from stragglerkit.testbed.netns import EmulatedCluster
    with EmulatedCluster(EmulatedCluster.Config(hosts=2, prefix=sys.argv[1], verify=False)) as cluster:
        sleeper = cluster.popen(1, ["sleep", "60"])
        names = [cluster.bridge_namespace, cluster.namespace(0), cluster.namespace(1)]
        print(json.dumps({"names": names, "sleeper": sleeper.pid}), flush=True)
        time.sleep(60)
    """
)


@needs_netns
@pytest.mark.parametrize(
    ("sig", "exit_status"),
    [
        (signal.SIGTERM, 128 + signal.SIGTERM),  # SystemExit(143) from the cluster's handler
        (signal.SIGINT, -signal.SIGINT),  # Ctrl-C: KeyboardInterrupt, then Python dies of SIGINT
        (signal.SIGHUP, 128 + signal.SIGHUP),
    ],
)
def test_teardown_on_signals(sig: signal.Signals, exit_status: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", _SIGNALLED_SCRIPT, PREFIX], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 30)
        assert ready, "the child did not build its cluster within 30 s"
        started = json.loads(child.stdout.readline())
        assert set(started["names"]) <= set(iproute.list_namespaces())
        child.send_signal(sig)
        assert child.wait(timeout=20) == exit_status
        _assert_gone(started["names"])
        assert not iproute.process_alive(started["sleeper"])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        _delete_namespaces_of(child.pid)


@needs_netns
def test_leftovers_of_a_crashed_run_are_removed_at_the_next_start(
    make_cluster: Callable[..., EmulatedCluster],
) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait(timeout=10)
    dead, live = finished.pid, subprocess.Popen(["sleep", "60"])
    stale = [f"{PREFIX}{dead}-0-br", f"{PREFIX}{dead}-0-h0"]
    in_use = f"{PREFIX}{live.pid}-0-h0"
    orphan: subprocess.Popen[bytes] | None = None
    try:
        for name in [*stale, in_use]:
            iproute.command(["ip", "netns", "add", name])
        iproute.command(
            ["ip", "-n", stale[0], "link", "add", "h0", "type", "veth", "peer", "name", "sknic", "netns", stale[1]]
        )
        orphan = subprocess.Popen(["ip", "netns", "exec", stale[1], "sleep", "60"])
        stray_files = iproute.namespace_etc(f"{PREFIX}{dead}-0-h1")  # its namespace is already gone
        stray_files.mkdir(parents=True)
        (stray_files / "hosts").write_text("198.18.0.2 skh1\n")
        with make_cluster(hosts=2, verify=False) as cluster:
            assert sorted(cluster.removed_leftovers) == sorted(stale)
            present = set(iproute.list_namespaces())
            assert not present & set(stale)
            assert in_use in present  # its creator still runs: not ours to remove
            assert not stray_files.exists()
        assert orphan.wait(timeout=10) != 0  # the process left in the stale namespace was ended
    finally:
        for process in (orphan, live):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        for name in [*stale, in_use]:
            if name in iproute.list_namespaces():
                iproute.delete_namespace(name)
    assert not set(iproute.list_namespaces()) & {*stale, in_use}


_RANK_SCRIPT = textwrap.dedent(
    """
    import datetime, json, time
    import torch
    import torch.distributed as dist
    import stragglerkit

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    stragglerkit.init()
    rank, n = dist.get_rank(), dist.get_world_size()
    numel = (8 << 20) // 4  # 8 MiB of float32

    def contribution(r):  # small integers: every partial sum is exact in float32
        return ((torch.arange(numel, dtype=torch.int64) * (r + 1)) % 97).to(torch.float32)

    expected = sum(contribution(r) for r in range(n))
    seconds = []
    correct = True
    for _ in range(2):  # the first call also sets up gloo's connections
        x = contribution(rank)
        dist.barrier()
        start = time.perf_counter()
        stragglerkit.all_reduce(x, algorithm="ring")
        seconds.append(time.perf_counter() - start)
        correct = correct and torch.equal(x, expected)
    print(json.dumps({"rank": rank, "correct": correct, "seconds": seconds}), flush=True)
    stragglerkit.destroy()
    dist.destroy_process_group()
    """
)


@needs_netns
def test_ring_all_reduce_across_four_emulated_hosts(make_cluster: Callable[..., EmulatedCluster]) -> None:
    import stragglerkit._C  # noqa: F401  (the ranks' executor; scripts/setup.sh builds it)

    bandwidth = parse_bandwidth("1Gbit")
    with make_cluster(hosts=4, bandwidth=bandwidth, verify=False) as cluster:
        env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        ranks = [
            cluster.popen(
                h,
                [sys.executable, "-c", _RANK_SCRIPT],
                env={**env, **cluster.torch_env(h, port=29517)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for h in range(cluster.hosts)
        ]
        outputs = [rank.communicate(timeout=120) for rank in ranks]
        for h, (rank, (_, err)) in enumerate(zip(ranks, outputs)):
            assert rank.returncode == 0, f"rank {h} failed:\n{err}"
        results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
        assert [r["rank"] for r in results] == [0, 1, 2, 3]
        assert all(r["correct"] for r in results)
        # The traffic went through the shaped NICs: a ring moves 2(n-1)/n of the buffer through
        # every NIC, which cannot go faster than the NIC's payload rate.
        slowest = max(r["seconds"][1] for r in results)
        bus_bandwidth = (8 << 20) * 2 * 3 / 4 / slowest
        assert bus_bandwidth <= 1.15 * cluster.expected_payload_rate(0)


@needs_netns
def test_close_from_another_thread_still_tears_down(make_cluster: Callable[..., EmulatedCluster]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    cluster = make_cluster(hosts=2, verify=False).__enter__()
    names = _namespaces_of(os.getpid())
    closer = threading.Thread(target=cluster.close)
    closer.start()
    closer.join(timeout=30)
    assert not closer.is_alive()
    _assert_gone(names)
    assert signal.getsignal(signal.SIGTERM) is SignalGuard.handler  # a thread cannot restore handlers
    cluster.close()  # in the main thread it can
    assert signal.getsignal(signal.SIGTERM) is before
