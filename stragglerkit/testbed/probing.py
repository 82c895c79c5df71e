"""Running the probe endpoints (probe.py) in pairs between namespaces, one pair or many at once.

A *pair* is a server in one namespace listening on an address there and a client in another
namespace that connects to it. All servers of a batch are started first; each prints
``READY PORT`` once it listens, then the clients start together. Everything is bounded: a
server that does not get ready, or a pair that does not finish, within the timeout raises
TestbedError, and every probe process is killed before ``run`` returns.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stragglerkit.testbed.iproute import PROCESS_GRACE, TestbedError

__all__ = ["PROBE_SCRIPT", "Pair", "ProbeRunner"]

PROBE_SCRIPT = Path(__file__).with_name("probe.py")


@dataclass(frozen=True, slots=True)
class Pair:
    """A probe server in ``server_ns`` listening on ``address``, and a client in ``client_ns``."""

    server_ns: str
    client_ns: str
    address: str


def probe_argv(mode: str, *args: object) -> list[str]:
    # -I -S: no site packages, no user paths; probe.py needs the standard library only.
    return [sys.executable, "-I", "-S", str(PROBE_SCRIPT), mode, *map(str, args)]


def _describe(process: subprocess.Popen[str]) -> str:
    """The probe's mode and arguments, without the `ip netns exec NS python -I -S probe.py` part."""
    args = process.args
    return f"{args[3]}: " + " ".join(map(str, args[8:])) if isinstance(args, list) else str(args)


class ProbeRunner:
    """Runs probe pairs; every process it starts is also appended to ``tracked`` while it runs,
    so that the owner can kill it if the run is interrupted."""

    def __init__(self, tracked: list[subprocess.Popen[Any]]) -> None:
        self._tracked = tracked

    def _start(self, namespace: str, argv: list[str]) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            ["ip", "netns", "exec", namespace, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._tracked.append(process)
        return process

    @staticmethod
    def _port_of(process: subprocess.Popen[str], deadline: float) -> int:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = process.stdout.readline().strip() if ready else ""
        if not line.startswith("READY "):
            process.kill()
            _, err = process.communicate(timeout=PROCESS_GRACE)
            raise TestbedError(f"probe server `{_describe(process)}` did not start: {line!r} {err.strip()}")
        return int(line.split()[1])

    @staticmethod
    def _result(process: subprocess.Popen[str], deadline: float) -> dict[str, Any]:
        try:
            out, err = process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            raise TestbedError(f"probe `{_describe(process)}` did not finish in time") from exc
        if process.returncode != 0:
            raise TestbedError(f"probe `{_describe(process)}` failed (exit {process.returncode}): {err.strip()}")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result

    def run(
        self,
        pairs: Sequence[Pair],
        server: Callable[[Pair], list[str]],
        client: Callable[[Pair, int], list[str]],
        timeout: float,
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Starts every pair's server, then every client (given the server's port); returns the
        (server, client) results in the order of ``pairs``."""
        deadline = time.monotonic() + timeout
        started: list[subprocess.Popen[str]] = []
        try:
            servers = []
            for pair in pairs:
                servers.append(self._start(pair.server_ns, server(pair)))
                started.append(servers[-1])
            ports = [self._port_of(process, deadline) for process in servers]
            clients = []
            for pair, port in zip(pairs, ports):
                clients.append(self._start(pair.client_ns, client(pair, port)))
                started.append(clients[-1])
            return [(self._result(s, deadline), self._result(c, deadline)) for s, c in zip(servers, clients)]
        finally:
            for process in started:
                if process.poll() is None:
                    process.kill()
                    process.wait(timeout=PROCESS_GRACE)
            self._tracked[:] = [p for p in self._tracked if all(p is not s for s in started)]

    def transfer_rates(self, pairs: Sequence[Pair], nbytes: int, skip: int, timeout: float) -> list[float]:
        """Every client sends ``nbytes`` to its server at the same time; the servers' receive rates
        in bytes/s (the first ``skip`` bytes not counted, see probe.py)."""
        results = self.run(
            pairs,
            lambda pair: probe_argv("recv", pair.address, 0, nbytes, skip, timeout),
            lambda pair, port: probe_argv("send", pair.address, port, nbytes, timeout),
            timeout + 5,
        )
        return [float(received["rate"]) for received, _ in results]

    def ping(self, pair: Pair, rounds: int, size: int, timeout: float) -> dict[str, Any]:
        """The client sends ``rounds`` messages of ``size`` bytes and waits for each echo."""
        [(_, result)] = self.run(
            [pair],
            lambda p: probe_argv("echo", p.address, 0, rounds, size, timeout),
            lambda p, port: probe_argv("ping", p.address, port, rounds, size, timeout),
            timeout + 5,
        )
        return result
