"""Horovod ranks for ``python -m profiling.lab.train --framework horovod``, started the way
``horovodrun --gloo`` starts them.

``horovodrun --gloo`` on a launcher machine: it starts Horovod's HTTP rendezvous server
(``RendezvousServer``), assigns the ranks to host slots (``get_host_assignments``), and starts every
rank over ssh with the slot's variables (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``,
..., ``HOROVOD_HOSTNAME``: ``create_slot_env_vars``) and the rendezvous's
(``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT``, ``HOROVOD_CONTROLLER=gloo``,
``HOROVOD_CPU_OPERATIONS=gloo``, ``HOROVOD_GLOO_IFACE``: ``create_run_env_vars``).

Here the same functions of Horovod's compute the same variables and the same server serves the
rendezvous; only the places differ, because there is no ssh:

* **emulated cluster**: the server runs in the bridge namespace, the switch every host reaches at
  the probe address, as the hosts would reach a launcher machine; each rank runs in its host's
  namespace (hosts ``skh0``, ``skh1``, ... one slot each) with ``HOROVOD_GLOO_IFACE`` its shaped NIC.
  The torch.distributed group that the straggler-aware optimizer makes from Horovod's ranks then
  meets across these hosts too (:mod:`stragglerkit.horovod`).
* **loopback**: the server and the ranks are local processes on ``localhost`` (``-H localhost:n``).

The server is a process of its own (:func:`main`), which writes its port to a file and serves
until its standard input closes; the launcher ends it with the ranks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from stragglerkit.bench.launch import EnvFor, Starter, _python_env
from stragglerkit.errors import StragglerKitError

__all__ = ["HorovodRendezvous", "horovod_env", "main"]

_START_TIMEOUT_S = 60.0


def horovod_env(hosts: str, world_size: int, server: str, port: int, interface: str) -> list[dict[str, str]]:
    """Every rank's Horovod variables, as ``horovodrun --gloo -np world_size -H hosts`` sets them
    for a rendezvous server at ``server:port`` and the network interface ``interface``.

    Example::

        horovod_env("localhost:2", 2, "127.0.0.1", 4242, "lo")[1]["HOROVOD_RANK"]    # "1"
    """
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

    run = {key: str(value) for key, value in create_run_env_vars(server, [interface], port).items()}
    slots = get_host_assignments(parse_hosts(hosts), world_size)
    return [{**create_slot_env_vars(slot), **run} for slot in sorted(slots, key=lambda s: s.rank)]


class HorovodRendezvous:
    """Horovod's rendezvous server in a process of its own, with the environment of each rank.

    ``start_server(argv, stdin)`` starts the server's process (:func:`main`) where the ranks can
    reach it; leaving the context ends it."""

    def __init__(
        self,
        hosts: str,
        world_size: int,
        server_address: str,
        interface: str,
        workdir: Path,
        start_server: Callable[[list[str], int], subprocess.Popen[Any]],
    ) -> None:
        self.hosts = hosts
        self.world_size = world_size
        self.server_address = server_address
        self.interface = interface
        self._port_file = workdir / "horovod-rendezvous.port"
        self._start_server = start_server
        self._process: subprocess.Popen[Any] | None = None
        self._envs: list[dict[str, str]] = []

    def __enter__(self) -> HorovodRendezvous:
        argv = [sys.executable, "-m", "profiling.lab.horovod_launch", self.hosts, str(self.world_size)]
        self._process = self._start_server([*argv, str(self._port_file)], subprocess.PIPE)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._port_file.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self._stop()
                raise StragglerKitError(
                    "Horovod's rendezvous server did not start (is Horovod installed? bash scripts/install_horovod.sh)"
                )
            time.sleep(0.05)
        port = int(self._port_file.read_text(encoding="utf-8"))
        self._envs = horovod_env(self.hosts, self.world_size, self.server_address, port, self.interface)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()  # the server's signal to stop
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def ranks(self, start: Starter) -> tuple[Starter, EnvFor]:
        """The launcher's (start, env_for) for the ranks: Horovod's variables instead of torch's."""

        def env_for(rank: int) -> dict[str, str]:
            return dict(self._envs[rank])

        return start, env_for


def loopback_rendezvous(world_size: int, workdir: Path) -> tuple[HorovodRendezvous, Starter]:
    """The server and the ranks as local processes on ``localhost``."""

    def start_server(argv: list[str], stdin: int) -> subprocess.Popen[Any]:
        return subprocess.Popen(argv, stdin=stdin, env={**os.environ, **_python_env()})

    def start(rank: int, argv: list[str], env: dict[str, str], stderr: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(argv, env={**os.environ, **env}, stderr=stderr)

    rendezvous = HorovodRendezvous(f"localhost:{world_size}", world_size, "127.0.0.1", "lo", workdir, start_server)
    return rendezvous, start


def cluster_rendezvous(cluster: Any, workdir: Path) -> tuple[HorovodRendezvous, Starter]:
    """The server on the emulated cluster's bridge (the switch), one rank per host."""

    def start_server(argv: list[str], stdin: int) -> subprocess.Popen[Any]:
        process: subprocess.Popen[Any] = cluster.popen_on_bridge(argv, env=_python_env(), stdin=stdin)
        return process

    def start(rank: int, argv: list[str], env: dict[str, str], stderr: Any) -> subprocess.Popen[Any]:
        process: subprocess.Popen[Any] = cluster.popen(rank, argv, env=env, stderr=stderr)
        return process

    hosts = ",".join(f"skh{h}:1" for h in range(cluster.hosts))
    rendezvous = HorovodRendezvous(
        hosts, cluster.hosts, cluster.probe_address, cluster.interface, workdir, start_server
    )
    return rendezvous, start


def serve(hosts: str, world_size: int, port_file: Path, stop: IO[Any]) -> None:
    """Run Horovod's rendezvous server for ``world_size`` ranks on ``hosts`` until ``stop`` closes."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start()
    try:
        server.init(get_host_assignments(parse_hosts(hosts), world_size))
        temporary = port_file.with_suffix(".tmp")
        temporary.write_text(str(port), encoding="utf-8")
        os.replace(temporary, port_file)
        stop.read()  # returns when the launcher closes the pipe (or exits)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m profiling.lab.horovod_launch HOSTS WORLD_SIZE PORT_FILE", file=sys.stderr)
        return 2
    serve(args[0], int(args[1]), Path(args[2]), sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
