"""What the tests that launch ``horovodrun --gloo`` share: where it is, the environment its ranks
get, and a failure message that shows each rank's first error."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOROVODRUN = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))

GLOO_TIMEOUT_S = 300
"""Horovod's own control plane (a Gloo allgather and allreduce every cycle on every rank) gives up
after 30 s by default. With 3 or 4 ranks on 2 cores its cycles stall for seconds at a time, with
Horovod's optimizer as with stragglerkit's (Horovod's ``synchronize()`` spins on ``sched_yield``
and takes the CPU from the ranks' background threads), and a run that would pass dies with
"Horovod has been shut down". The tests' own timeouts still bound every run."""


def horovodrun_env(*paths: Path) -> dict[str, str]:
    """This environment, with the repository (and ``paths``) importable and Horovod's control-plane
    timeout at :data:`GLOO_TIMEOUT_S`."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*map(str, paths), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_S),
    }


_ERROR = re.compile(r"^(?:\[(\d+)\]<std(?:out|err)>:)?(.*(?:Error|Exception|exception|Timed out).*)$")


def rank_errors(output: str, per_rank: int = 3) -> str:
    """The first ``per_rank`` different lines that name an error, per rank, from horovodrun's
    prefixed output (its tail alone can hide the rank that failed first, and why)."""
    seen: dict[str, list[str]] = {}
    for line in output.splitlines():
        match = _ERROR.match(line)
        if match:
            lines = seen.setdefault(match.group(1) or "horovodrun", [])
            what = match.group(2).strip()[:400]
            if len(lines) < per_rank and what not in lines:
                lines.append(what)
    report = [f"  rank {who}: {what}" for who, lines in sorted(seen.items()) for what in lines]
    return "\n".join(report) or "  (no line names an error)"
