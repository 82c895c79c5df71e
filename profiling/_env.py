"""What every benchmark summary records about its run, and the helpers the benchmarks share.

Each benchmark of the suite overwrites one summary JSON under ``profiling/results/``; it starts
with :func:`provenance` (the benchmark, the command, the ``STRAGGLERKIT_*`` settings, the commit
and whether the tree was modified, the machine with its CPU model, kernel and load, the date, and
the paths whose code the benchmark measures), then the figures. :func:`write_summary` writes it;
``profiling/render_results.py`` turns the summaries into the tables of the results pages.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "profiling" / "results"

__all__ = [
    "RESULTS",
    "ROOT",
    "command_line",
    "emulated_cluster_ready",
    "machine_info",
    "provenance",
    "run_on_hosts",
    "settings",
    "source_revision",
    "utc_now",
    "write_summary",
]


def machine_info() -> dict[str, Any]:
    """CPU model, core count, kernel, load and library versions."""
    from stragglerkit.bench.results import cpu_model

    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = None
    try:
        import numpy as np

        numpy_version: str | None = np.__version__
    except ImportError:  # pragma: no cover - numpy is a dependency
        numpy_version = None
    return {
        "cpu_model": cpu_model(),
        "processor": platform.processor() or cpu_model() or "",
        "machine": platform.machine(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch_version,
        "numpy": numpy_version,
    }


def command_line() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


def settings() -> dict[str, str]:
    """The ``STRAGGLERKIT_*`` environment variables of this run (what it ran with besides its command)."""
    return {name: value for name, value in sorted(os.environ.items()) if name.startswith("STRAGGLERKIT_")}


def source_revision() -> dict[str, Any]:
    """The commit of the checkout and whether the package's sources differ from it (the bench's own)."""
    from stragglerkit.bench.results import source_revision as revision

    return revision()


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def provenance(benchmark: str, command: str | None = None) -> dict[str, Any]:
    """The fields every summary starts with: the benchmark's name, the command, the settings, the
    commit, the machine, the date and the measured paths (``_provenance.MEASURED_PATHS``)."""
    from _provenance import MEASURED_PATHS

    if benchmark not in MEASURED_PATHS:
        raise KeyError(f"benchmark {benchmark!r} names no measured paths: add it to profiling/_provenance.py")
    return {
        "benchmark": benchmark,
        "command": command or command_line(),
        "environment": settings(),
        "source": source_revision(),
        "machine": machine_info(),
        "date": utc_now(),
        "measured_paths": list(MEASURED_PATHS[benchmark]),
    }


def write_summary(
    path: str | os.PathLike[str], benchmark: str, fields: dict[str, Any], command: str | None = None
) -> None:
    """Overwrite ``path`` with the provenance followed by ``fields`` (indented JSON) and say so."""
    record = {**provenance(benchmark, command), **fields}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {target}")


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
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rank_out = os.path.join(tmp, "out.json")
        argv = [sys.executable, script, *args, "--rank-out", rank_out]
        procs: list[subprocess.Popen[Any]] = [cluster.popen(h, argv, env=cluster.torch_env(h)) for h in range(hosts)]
        codes = [proc.wait(timeout=timeout) for proc in procs]
        if any(codes):
            raise SystemExit(f"{Path(script).name}: a rank failed (exit codes by rank: {codes})")
        return json.loads(Path(rank_out).read_text())
