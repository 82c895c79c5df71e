"""Thin wrappers over iproute2 (`ip`, `tc`) for the emulated cluster, and clean-up of leftovers.

Everything here is bounded: every command has a time limit (COMMAND_TIMEOUT), every wait for a
process to end has one (PROCESS_GRACE), and loops run over finite lists.

Namespace names follow ``{prefix}{pid}-{k}-{role}``: the prefix marks them as ours, the pid says
which process created them, so leftovers of a crashed run can be told from a cluster that another
process is using right now.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from stragglerkit.errors import StragglerKitError

__all__ = [
    "COMMAND_TIMEOUT",
    "DEFAULT_PREFIX",
    "PROCESS_GRACE",
    "TestbedError",
    "command",
    "delete_namespace",
    "find_leftovers",
    "list_namespaces",
    "namespace_etc",
    "namespace_refusal",
    "netem_missing",
    "next_instance",
    "process_alive",
    "remove_leftovers",
    "shaper_commands",
    "tbf_arguments",
    "write_name_service",
]

DEFAULT_PREFIX = "sk-"
_instances = itertools.count()
NETNS_ETC = Path("/etc/netns")
COMMAND_TIMEOUT = 10.0
"""Seconds any single ip/tc command may take."""
PROCESS_GRACE = 2.0
"""Seconds a process gets between SIGTERM and SIGKILL at tear-down."""


class TestbedError(StragglerKitError):
    """The emulated cluster could not be built, used or torn down."""

    __test__ = False  # not a pytest test class despite the name


def next_instance() -> int:
    """A number unique in this process for the ``k`` of ``{prefix}{pid}-{k}-{role}``."""
    return next(_instances)


def command(argv: Sequence[str], *, check: bool = True, timeout: float = COMMAND_TIMEOUT) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from exc
    if check and done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def list_namespaces() -> list[str]:
    """Names of all network namespaces (``ip netns list``)."""
    out = command(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _namespace_owner(name: str, prefix: str) -> int | None:
    match = re.fullmatch(re.escape(prefix) + r"(\d+)-\d+-(?:br|h\d+)", name)
    return int(match.group(1)) if match else None


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which has ended but not been reaped, does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def find_leftovers(prefix: str = DEFAULT_PREFIX, *, include_live: bool = False) -> list[str]:
    """Namespaces named ``{prefix}{pid}-{k}-{role}`` whose process ``pid`` is gone (all of them if
    include_live).

    Names that merely start with the prefix but do not follow the pattern are left alone: they
    may belong to another tool, or to a cluster with a longer prefix (``sk-`` vs ``sk-x-``).
    """
    leftovers = []
    for name in list_namespaces():
        owner = _namespace_owner(name, prefix)
        if owner is not None and (include_live or not process_alive(owner)):
            leftovers.append(name)
    return leftovers


def _kill_namespace_processes(namespace: str) -> None:
    """Ends the processes still running inside one of our namespaces (they were started there by us)."""
    out = command(["ip", "netns", "pids", namespace], check=False)
    pids = [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in pids if process_alive(p)]
        for pid in alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + PROCESS_GRACE
        while alive and time.monotonic() < deadline:
            time.sleep(0.02)
            alive = [p for p in alive if process_alive(p)]
        if not alive:
            return


def namespace_etc(namespace: str) -> Path:
    """Files here replace those of /etc for processes started with ``ip netns exec NAMESPACE``."""
    return NETNS_ETC / namespace


def write_name_service(namespace: str, hosts: Mapping[str, str], own_address: str) -> None:
    """Gives ``namespace`` its own /etc/hosts and a resolver that asks only the namespace's own
    loopback, so that name look-ups (c10d looks up its own and its peers' names) are answered from
    the file and no DNS query is ever sent out of the cluster.

    ``hosts`` maps address -> name; the machine's host name (shared by all namespaces) resolves to
    ``own_address``, the namespace's own address.
    """
    directory = namespace_etc(namespace)
    directory.mkdir(parents=True, exist_ok=True)
    machine = socket.gethostname()
    lines = ["127.0.0.1 localhost"]
    for address, name in hosts.items():
        names = f"{name} {machine}" if address == own_address else name
        # c10d's store listens on an IPv6 socket and sees peers as IPv4-mapped addresses
        lines += [f"{address} {names}", f"::ffff:{address} {names}"]
    (directory / "hosts").write_text("\n".join(lines) + "\n")
    (directory / "resolv.conf").write_text(
        "# emulated cluster: no DNS\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
    )


def delete_namespace(namespace: str) -> None:
    """Ends the processes inside ``namespace``, deletes it (with its links) and its /etc/netns files."""
    _kill_namespace_processes(namespace)
    command(["ip", "netns", "delete", namespace], check=False)
    directory = namespace_etc(namespace)
    if directory.is_dir():
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only if nothing else is left there


def remove_leftovers(prefix: str = DEFAULT_PREFIX, *, include_live: bool = False) -> list[str]:
    """Deletes the namespaces that :func:`find_leftovers` finds; returns their names.

    Deleting a namespace deletes the veth ends and the bridge inside it. ``include_live=True``
    also removes clusters whose creating process still runs (use only when nothing else uses the
    prefix).
    """
    leftovers = find_leftovers(prefix, include_live=include_live)
    for name in leftovers:
        delete_namespace(name)
    # /etc/netns files of a run that died between writing them and creating its namespace
    existing = set(list_namespaces())
    stray = sorted(NETNS_ETC.glob(f"{glob.escape(prefix)}*")) if NETNS_ETC.is_dir() else []
    for directory in stray:
        owner = _namespace_owner(directory.name, prefix)
        if directory.name not in existing and owner is not None and (include_live or not process_alive(owner)):
            delete_namespace(directory.name)
    remaining = set(list_namespaces()) & set(leftovers)
    if remaining:
        raise TestbedError(f"could not delete namespaces {sorted(remaining)}; delete them with `ip netns delete NAME`")
    return leftovers


def tbf_arguments(rate: float) -> list[str]:
    """tbf parameters for ``rate`` bytes/s.

    The bucket holds at least 96 KiB so that a 64 KiB GSO frame passes whole: a smaller bucket
    makes tbf cut every frame into MTU-sized packets, which costs enough CPU to become the
    bottleneck at 1 Gbit/s on a small machine. 96 KiB at 1 Gbit/s is 0.8 ms of line rate.

    The queue is deep (16 MiB, or 100 ms of traffic if more) so that the shaper does not drop:
    a drop at the receive-side shaper is a real loss to TCP, and the retransmissions (with
    timeouts of 200 ms and more) then dominate the timings. With a 256 KiB queue, 1 MiB
    transfers at 100 Mbit/s measured between -40% and +40% of the shaped rate; with a deep queue
    they measure within 1%. A sender's own NIC never drops either (it pushes back on the
    socket); the deep receive queue stands for the buffer of a switch port.
    """
    burst = max(96 * 1024, int(rate * 0.0005))
    limit = max(16 << 20, int(rate * 0.1))
    return ["rate", f"{int(rate)}bps", "burst", str(burst), "limit", str(limit)]


@functools.cache
def namespace_refusal() -> str | None:
    """None if this process can create (and delete) a network namespace, else the error; tried once."""
    namespace = f"{DEFAULT_PREFIX}{os.getpid()}-{next_instance()}-br"
    try:
        command(["ip", "netns", "add", namespace])
    except TestbedError as exc:
        return str(exc)
    finally:
        delete_namespace(namespace)
    return None


def netem_missing(namespace: str) -> str | None:
    """None if a netem qdisc can be added in ``namespace`` (tried on its loopback), else why not."""
    probe = ["tc", "-n", namespace, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    if done.returncode != 0:
        return (
            f"added latency needs the netem queueing discipline, which this kernel lacks ({done.stderr.strip()}); "
            "load it with `modprobe sch_netem` (kernel option CONFIG_NET_SCH_NETEM) or set latency=0"
        )
    command(["tc", "-n", namespace, "qdisc", "del", "dev", "lo", "root"])
    return None


SMALL_PACKET_BYTES = 128
"""IP packets shorter than this (TCP ACKs, gloo's small control messages) take the shaper's
priority class (:func:`shaper_commands`)."""


def shaper_commands(
    namespace: str,
    device: str,
    rate: float,
    parent: str | None,
    *,
    change: bool,
    peers: Sequence[str] = (),
    match: str = "dst",
) -> list[list[str]]:
    """tc commands that shape ``device`` to ``rate`` bytes/s, with small packets first.

    An htb tree: class 10:1 at ``rate`` (bucket and queue as in :func:`tbf_arguments`), two leaves
    that may each use all of it: 10:10 (priority 0) for IP packets under ``SMALL_PACKET_BYTES``
    and 10:20 (priority 1, the default) for the rest. A host's egress carries the data it sends
    *and* the ACKs of the data it receives; behind a single deep FIFO those ACKs wait for the
    queued data (up to a whole message: 9 ms at 0.5 Gbit/s), the sender's round trip grows by as
    much and its transfer stalls. A real NIC's queue is short (byte queue limits) and the host's
    default qdisc schedules flows fairly, so ACKs pass; the priority class gives the emulated link
    the same property without giving up the deep, drop-free queue. ``parent`` is the handle the
    tree hangs from (None: the root); ``change`` re-rates an existing tree.

    With ``peers`` (IPv4 addresses) the data of each peer gets a leaf of its own, 10:101, 10:102, ...
    (priority 1, equal assured rates, each allowed the whole rate), chosen by the packet's
    destination (``match="dst"``: the shaper of what a host sends) or source (``"src"``: of what it
    receives); 10:20 keeps what matches no peer. htb serves the busy leaves in turn, a quantum of
    bytes each, so two transfers on one link get half of it each, and a lone one all of it: the
    max-min share a host's fair-queueing qdisc gives its flows and that TCP's congestion control
    converges to at a shared switch port. Without ``peers`` the data shares one FIFO, where each
    transfer gets as much of the link as it has bytes queued (its window), not an even share.
    """
    if match not in ("dst", "src"):
        raise ValueError(f"match must be 'dst' or 'src', got {match!r}")
    tbf = tbf_arguments(rate)
    burst, limit = tbf[tbf.index("burst") + 1], tbf[tbf.index("limit") + 1]
    bps = f"{int(rate)}bps"
    tc = ["tc", "-n", namespace]
    verb = "change" if change else "add"

    def htb_class(parent_id: str, class_id: str, assured: str, extra: list[str]) -> list[str]:
        options = ["rate", assured, "ceil", bps, "burst", burst, "cburst", burst, *extra]
        return [*tc, "class", verb, "dev", device, "parent", parent_id, "classid", class_id, "htb", *options]

    leaf = ["quantum", "60000"]
    data_rate = rate - rate / 20
    data_leaves = ["10:20", *(f"10:{101 + i}" for i in range(len(peers)))]
    assured = f"{max(int(data_rate / len(data_leaves)), 1000)}bps"
    classes = [
        htb_class("10:", "10:1", bps, []),
        htb_class("10:1", "10:10", f"{max(int(rate / 20), 1000)}bps", ["prio", "0", *leaf]),
        *(htb_class("10:1", class_id, assured, ["prio", "1", *leaf]) for class_id in data_leaves),
    ]
    if change:
        return classes
    where = ["root"] if parent is None else ["parent", parent]

    def rule(prio: str, *selector: str) -> list[str]:
        return [*tc, "filter", "add", "dev", device, "parent", "10:", "protocol", "ip", "prio", prio, "u32", *selector]

    small_packets = ["match", "u16", "0", f"{0x10000 - SMALL_PACKET_BYTES:#x}", "at", "2", "flowid", "10:10"]
    queues = [
        [*tc, "qdisc", "add", "dev", device, "parent", class_id, "handle", f"{11 + i}:", "bfifo", "limit", limit]
        for i, class_id in enumerate(["10:10", *data_leaves])
    ]
    by_peer = [
        rule("2", "match", "ip", match, f"{address}/32", "flowid", class_id)
        for address, class_id in zip(peers, data_leaves[1:])
    ]
    return [
        [*tc, "qdisc", "add", "dev", device, *where, "handle", "10:", "htb", "default", "20"],
        *classes,
        *queues,
        rule("1", *small_packets),
        *by_peer,
    ]
