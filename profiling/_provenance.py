"""Where a figure comes from, and whether it still describes the code: the rules the results pages keep.

Every summary under ``profiling/results/`` records the commit it measured, whether the tree was
modified, the date, the machine (CPU model, cores, kernel, load) and the paths whose code it
measures (``measured_paths``). From those, :func:`stamp_of` reads a :class:`Stamp`, and
:func:`staleness` says why a figure no longer describes the checkout, or ``None`` when it does:

- no CPU model recorded: figures of unknown machines do not compare, so they count as stale;
- the commit is not in this history: nobody can re-derive the figure from it;
- ``git diff <commit> -- <measured paths>`` is not empty: the measured code changed since.

:func:`one_machine` refuses a table whose rows come from two known CPU models.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# What each benchmark measures: the code whose change makes its figures stale. Written into every
# summary as ``measured_paths`` when the benchmark runs (profiling/_env.py).
MEASURED_PATHS: dict[str, tuple[str, ...]] = {
    "acceptance": (
        "csrc", "stragglerkit/runtime", "stragglerkit/planner", "stragglerkit/schedules", "stragglerkit/sim",
        "stragglerkit/testbed", "stragglerkit/bench", "profiling/bench_acceptance.sh",
        "profiling/_acceptance_summary.py",
    ),
    "train": ("csrc", "stragglerkit", "profiling/lab", "profiling/_train_summary.py", "profiling/bench_train.sh",
              "profiling/bench_train_horovod.sh", "profiling/bench_train_megatron.sh"),
    "bench_finetune": ("csrc", "stragglerkit", "examples/bert", "examples/llama", "profiling/lab",
                       "profiling/bench_finetune.sh", "profiling/_finetune_summary.py"),
    "no_harm": ("csrc", "stragglerkit", "profiling/lab", "profiling/bench_no_harm.sh", "profiling/_no_harm_summary.py"),
    "hook_overhead": ("csrc", "stragglerkit", "profiling/lab/copies.py", "profiling/bench_hook_overhead.py"),
    "loop_cost": ("csrc", "stragglerkit", "examples/megatron/cpu_shim.py", "profiling/lab/copies.py",
                  "profiling/lab/train_megatron.py", "profiling/bench_loop_cost.py"),
    "link_estimate": ("csrc", "stragglerkit/runtime", "stragglerkit/planner", "stragglerkit/detect/nic_health.py",
                      "stragglerkit/testbed", "profiling/bench_link_estimate.py"),
    "executor_loopback": ("csrc", "stragglerkit/runtime", "stragglerkit/planner", "stragglerkit/schedules",
                          "profiling/bench_executor.py"),
    "schedules": ("stragglerkit/schedules", "stragglerkit/sim", "stragglerkit/planner", "profiling/bench_schedules.py"),
    "scale": ("stragglerkit/schedules", "stragglerkit/sim", "stragglerkit/planner", "stragglerkit/runtime",
              "stragglerkit/detect",
              "stragglerkit/cli", "profiling/bench_scale.py"),
    "selective_sim": ("stragglerkit/selective", "stragglerkit/grouping", "stragglerkit/sim", "stragglerkit/cli",
                      "profiling/bench_selective_sim.sh", "profiling/_selective_summary.py"),
    "train_selective": ("csrc", "stragglerkit/selective", "stragglerkit/grouping", "stragglerkit/runtime",
                        "stragglerkit/planner", "stragglerkit/testbed",
                        "profiling/lab/train_selective.py", "profiling/lab/train.py",
                        "profiling/bench_train_selective.sh", "profiling/_selective_train_summary.py"),
    "calibration": ("csrc", "stragglerkit/runtime", "stragglerkit/planner", "stragglerkit/schedules",
                    "stragglerkit/sim",
                    "stragglerkit/testbed", "stragglerkit/bench/calibrate.py", "stragglerkit/detect/model.py",
                    "stragglerkit/detect/model_comparison.py",
                    "profiling/bench_calibrate.sh", "profiling/_calibrate_summary.py"),
    "bench_cuda_reduce": ("csrc", "profiling/bench_cuda_reduce.py", "scripts/gpu_check.sh"),
    "test_times": ("tests", "scripts/test.sh", "pyproject.toml"),
}

_BARE_ARCH = {"", "x86_64", "amd64", "aarch64", "arm64", "i386", "i686", "unknown"}


@dataclass(frozen=True)
class Stamp:
    """One measurement's provenance, as a results table names it."""

    commit: str | None
    modified: bool | None
    date: str
    cpu_model: str | None
    cores: int | None
    kernel: str | None
    load: float | None
    command: str
    measured_paths: tuple[str, ...]

    @property
    def short_commit(self) -> str:
        return (self.commit or "?")[:7]

    @property
    def cpu(self) -> str:
        """The CPU model without trademarks and filler ("Intel Xeon"), or "unknown CPU"."""
        if not self.cpu_model:
            return "unknown CPU"
        text = re.sub(r"\((R|TM|tm)\)|\bProcessor\b|\bCPU\b|@.*$", "", self.cpu_model)
        return " ".join(text.split())

    @property
    def day(self) -> str:
        return self.date[:10]


def cpu_model_of(machine: dict[str, Any]) -> str | None:
    """The CPU model a summary's ``machine`` records: ``cpu_model``, or ``processor`` where that is a
    model name rather than the bare architecture ``platform.processor()`` often gives."""
    model = machine.get("cpu_model")
    if model:
        return str(model)
    processor = str(machine.get("processor") or "")
    return None if processor.strip().lower() in _BARE_ARCH else processor


def kernel_of(machine: dict[str, Any]) -> str | None:
    if machine.get("kernel"):
        return str(machine["kernel"])
    match = re.match(r"Linux-(.+?)-(x86_64|aarch64)", str(machine.get("platform") or ""))
    return match.group(1) if match else None


def stamp_of(record: dict[str, Any], measured: dict[str, Any] | None = None) -> Stamp:
    """The stamp of a summary, or of one part of it measured by another run (``measured``: that run's
    ``command``, ``source`` or ``commit``, ``date`` and, where recorded, ``machine``)."""
    part = measured or {}
    # a part measured by another launch carries its own machine; one that recorded none is unknown
    machine = record.get("machine", {}) if measured is None else part.get("machine", {})
    source = part.get("source") or ({"commit": part["commit"]} if "commit" in part else record.get("source", {}))
    benchmark = str(record.get("benchmark", ""))
    paths = record.get("measured_paths") or MEASURED_PATHS.get(benchmark, ("stragglerkit", "csrc"))
    load = part.get("load_average_1min", machine.get("load_average_1min"))
    return Stamp(
        commit=source.get("commit"),
        modified=source.get("modified"),
        date=str(part.get("date") or record.get("date") or ""),
        cpu_model=cpu_model_of(machine),
        cores=machine.get("cpu_count"),
        kernel=kernel_of(machine),
        load=None if load is None else float(load),
        command=str(part.get("command") or record.get("command") or ""),
        measured_paths=tuple(paths),
    )


def _git(args: Sequence[str], repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)


@functools.lru_cache(maxsize=512)
def _changed_paths(commit: str, paths: tuple[str, ...], repo: Path) -> tuple[str, ...] | None:
    """The measured files that differ between ``commit`` and the working tree; None: unknown commit."""
    if _git(["cat-file", "-e", f"{commit}^{{commit}}"], repo).returncode != 0:
        return None
    diff = _git(["diff", "--name-only", commit, "--", *paths], repo)
    if diff.returncode != 0:
        return None
    return tuple(sorted(line for line in diff.stdout.splitlines() if line))


def staleness(stamp: Stamp, repo: Path = ROOT) -> str | None:
    """Why the figure no longer describes this checkout, or None if it does."""
    if not stamp.cpu_model:
        return f"stale: `{stamp.short_commit}` recorded no CPU model"
    if not stamp.commit:
        return "stale: no commit recorded"
    changed = _changed_paths(stamp.commit, stamp.measured_paths, repo.resolve())
    if changed is None:
        if _git(["rev-parse", "--is-shallow-repository"], repo).stdout.strip() == "true":
            raise RuntimeError(
                f"commit {stamp.short_commit} is not in this shallow clone, so whether its figures are "
                "stale cannot be told: fetch the whole history (git fetch --unshallow) and render again"
            )
        return f"stale: `{stamp.short_commit}` is not in this history"
    if changed:
        return f"stale since `{stamp.short_commit}`"
    return None


class MixedMachines(ValueError):
    """A table would put figures of two CPU models side by side."""


def one_machine(stamps: Iterable[Stamp], table: str) -> Stamp | None:
    """The table's machine: the one known CPU model among ``stamps`` (None if none is known).
    Raises :class:`MixedMachines` naming the table and the models if there are two."""
    stamps = list(stamps)
    known = {s.cpu_model for s in stamps if s.cpu_model}
    if len(known) > 1:
        raise MixedMachines(
            f"table {table!r} mixes CPU models {sorted(known)}: rerun its rows on one machine "
            "or give the others a table of their own"
        )
    return next((s for s in stamps if s.cpu_model), stamps[0] if stamps else None)
