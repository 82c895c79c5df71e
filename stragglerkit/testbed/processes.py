"""Processes in the emulated hosts: the command line that runs a program in a host's namespace,
the environment it gets, and how the cluster ends the ones still running when it closes.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stragglerkit.testbed.iproute import PROCESS_GRACE

if TYPE_CHECKING:
    from stragglerkit.testbed.netns import EmulatedCluster

__all__ = ["environment", "exec_argv", "stop_processes"]


def exec_argv(cluster: EmulatedCluster, host: int, argv: Sequence[str]) -> list[str]:
    """The command line that runs ``argv`` in ``host``'s namespace."""
    if isinstance(argv, str | bytes) or not argv:
        raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
    return ["ip", "netns", "exec", cluster.namespace(host), *map(str, argv)]


def environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """The current environment with ``env`` added."""
    merged = dict(os.environ)
    if env:
        merged.update({k: str(v) for k, v in env.items()})
    return merged


def stop_processes(processes: list[subprocess.Popen[Any]]) -> None:
    """End the processes still running (SIGTERM, then SIGKILL after a grace period) and forget them all."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + PROCESS_GRACE
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=PROCESS_GRACE)
    processes.clear()
