"""What every committed benchmark result records about the machine it ran on."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np


def machine_info() -> dict[str, Any]:
    """Processor, core count and library versions, as the results JSON records them."""
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = None
    return {
        "processor": platform.processor() or _cpu_model(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch_version,
        "numpy": np.__version__,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def command_line() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


def settings() -> dict[str, str]:
    """The ``STRAGGLERKIT_*`` environment variables this run has (what it ran with besides its command)."""
    return {name: value for name, value in sorted(os.environ.items()) if name.startswith("STRAGGLERKIT_")}


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def emulated_cluster_ready() -> bool:
    """Whether the emulated cluster can run here; if not, says why on stderr."""
    from stragglerkit.testbed import EmulatedCluster

    ok, reason = EmulatedCluster.available()
    if not ok:
        print(f"needs the emulated cluster: {reason}", file=sys.stderr)
    return ok


def run_on_hosts(cluster: Any, script: str, args: list[str], hosts: int, timeout: float = 600.0) -> Any:
    """Runs ``script args --rank-out FILE`` as one rank on each of the first ``hosts`` hosts of
    ``cluster``, waits for all of them and returns what rank 0 wrote to FILE (JSON). A rank that
    fails ends the benchmark with its exit code (SystemExit: the cluster is torn down on the way)."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rank_out = os.path.join(tmp, "out.json")
        argv = [sys.executable, script, *args, "--rank-out", rank_out]
        procs: list[subprocess.Popen[Any]] = [cluster.popen(h, argv, env=cluster.torch_env(h)) for h in range(hosts)]
        codes = [proc.wait(timeout=timeout) for proc in procs]
        if any(codes):
            raise SystemExit(f"{Path(script).name}: a rank failed (exit codes by rank: {codes})")
        return json.loads(Path(rank_out).read_text())


def write_result(
    path: str | os.PathLike[str], cluster: dict[str, Any], *, indent: int | None = 1, **fields: Any
) -> None:
    """Writes a result file: the command, the ``STRAGGLERKIT_*`` settings it ran with, date, machine
    and cluster, then ``fields``; says where."""
    import json

    result = {
        "command": command_line(),
        "environment": settings(),
        "date": utc_now(),
        "machine": machine_info(),
        "cluster": cluster,
        **fields,
    }
    Path(path).write_text(json.dumps(result, indent=indent))
    print(f"wrote {path}")
