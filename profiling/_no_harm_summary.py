"""The no-harm summary: with nothing wrong, does stragglerkit cost the step anything?

Reads the training bench's ``--json`` files of ``bench_no_harm.sh``, named
``<framework>_<size>_run<i>.json`` (framework: ``ddp``, ``horovod``, ``megatron``; size: the
``--model-size``, e.g. ``8MiB``), and overwrites one summary (default
``profiling/results/bench_no_harm.json``). Every launch trained three copies in turns on a healthy
cluster: the plain framework, a second plain copy (the A/A control) and the framework with
stragglerkit at its defaults. Per cell (framework and size) and launch:

* ``speedup_steady``: plain's median step over stragglerkit's, from the steady state
  (``profiling.lab.train_report``); ``control``: plain's over the control's, the same way;
* ``warmup``: the same two ratios over the hook's warm-up steps (total time; the steps before it
  acts at all, where allocation and plan compilation would show);
* ``switches``: the plan changes stragglerkit made. Nothing is wrong, so any is a false action.

Per cell: the medians, the control's spread (the largest distance of a launch's control from 1),
and the verdicts: ``met`` when the median step ratio is at least :data:`LOWEST` and no launch
switched; ``warmup_met`` when the median warm-up ratio is within :data:`WARMUP_WITHIN` of the
median steady one. The results page reads a cell as noise where any launch's control is further
than 1 % from parity. Each launch keeps its own command, commit, date and CPU model; a cell whose
launches ran on two CPU models is refused.

Example::

    python profiling/_no_harm_summary.py /tmp/no_harm/*_run*.json --command "bash profiling/bench_no_harm.sh"
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, write_summary

LOWEST = 0.99
"""The lowest plain/stragglerkit steady step ratio that meets the target: a cost of at most 1 %."""
WARMUP_WITHIN = 0.01
"""The warm-up steps' ratio must be within this of the steady one."""
NAME = re.compile(r"^(?P<framework>ddp|horovod|megatron)_(?P<size>\w+?)_run(?P<run>\d+)$")

PLAN_CHANGES = ("switch", "rollback", "cleared")


def _warmup(data: dict[str, Any], name: str) -> float | None:
    """Plain's total time over ``name``'s over the hook's warm-up steps; None without them."""
    warmup = int(data["hook_config"]["warmup_steps"])
    steps = data["steps"]
    plain, other = steps.get("plain_s"), steps.get(f"{name}_s")
    if not plain or not other or warmup < 1:
        return None
    total = sum(other[:warmup])
    return sum(plain[:warmup]) / total if total > 0 else None


def one_launch(data: dict[str, Any]) -> dict[str, Any]:
    """The figures of one launch (see the module docstring)."""
    header = data["header"]
    if data.get("control_speedup_steady") is None:
        raise SystemExit(
            f"{header.get('command')}: this launch trained no A/A control copy (run it without --no-control)"
        )
    return {
        "speedup_steady": data["speedup_steady"],
        "control": data["control_speedup_steady"],
        "speedup_steady_total": data["speedup_steady_total"],
        "control_total": data["control_speedup_steady_total"],
        "warmup": _warmup(data, "hooked"),
        "control_warmup": _warmup(data, "control"),
        "plain_steady_ms": data["plain_steady_ms"],
        "switches": [
            {"step": e["step"], "kind": e["kind"], "algorithm": e["algorithm"]}
            for e in data["events"]
            if e["kind"] in PLAN_CHANGES
        ],
        "detected": data["detected"],
        "steady_steps": data["steady_steps"],
        "buckets_bytes": data["model"]["buckets_bytes"],
        "identical_on_all_ranks": all(data[f"{n}_identical_on_all_ranks"] for n in ("plain", "control", "hooked")),
        "cpu_model": header.get("machine", {}).get("cpu_model"),
        "load_average": header.get("load_average"),
        "measured": {
            "command": header.get("command"),
            "commit": (header.get("source") or {}).get("commit"),
            "date": header.get("date"),
        },
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def cell(framework: str, size: str, launches: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell's medians, spread and verdicts from its launches."""
    models = {launch["cpu_model"] for launch in launches}
    if len(models) > 1:
        raise SystemExit(f"{framework}/{size}: the launches ran on different CPU models {sorted(map(str, models))}")
    median = _median([launch["speedup_steady"] for launch in launches])
    warmup = _median([launch["warmup"] for launch in launches])
    controls = [launch["control"] for launch in launches]
    switched = sum(1 for launch in launches if launch["switches"])
    dates = sorted(str(launch["measured"]["date"]) for launch in launches)
    return {
        "framework": framework,
        "model_size": size,
        "median_speedup_steady": median,
        "median_control": _median(controls),
        "control_spread": max(abs(c - 1.0) for c in controls),
        "median_warmup": warmup,
        "median_control_warmup": _median([launch["control_warmup"] for launch in launches]),
        "launches_that_switched": switched,
        "met": median is not None and median >= LOWEST and switched == 0,
        "warmup_met": None if warmup is None or median is None else abs(warmup - median) <= WARMUP_WITHIN,
        "all_checks_passed": all(launch["identical_on_all_ranks"] for launch in launches),
        "launches": launches,
        "measured": {
            "command": (
                f"NO_HARM_RUNS={len(launches)} FRAMEWORKS={framework} SIZES={size} bash profiling/bench_no_harm.sh"
            ),
            "commits": sorted({str(launch["measured"]["commit"]) for launch in launches}),
            "dates": [dates[0], dates[-1]],
        },
    }


def summarize(paths: list[Path]) -> dict[str, Any]:
    """Per ``<framework>/<size>``: the cell of its launches."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in sorted(paths):
        match = NAME.match(path.stem)
        if match is None:
            raise SystemExit(f"{path}: not a <framework>_<size>_run<i>.json of bench_no_harm.sh")
        data = json.loads(path.read_text(encoding="utf-8"))
        groups.setdefault((match["framework"], match["size"]), []).append(one_launch(data))
    if not groups:
        raise SystemExit("no launches given")
    return {f"{framework}/{size}": cell(framework, size, launches) for (framework, size), launches in groups.items()}


def keep_unmeasured(path: Path, results: dict[str, Any]) -> dict[str, Any]:
    """``results`` plus every cell of the summary at ``path`` that ``results`` does not measure."""
    if not path.exists():
        return results
    previous = json.loads(path.read_text(encoding="utf-8")).get("results", {})
    return dict(sorted({**{k: v for k, v in previous.items() if k not in results}, **results}.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--command", default=None, help="the command that made the launches (recorded)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_no_harm.json")
    args = parser.parse_args(argv)
    results = summarize(args.files)
    for key, c in results.items():
        print(
            f"{key:>16}: plain/stragglerkit {c['median_speedup_steady']:.3f}x, A/A control {c['median_control']:.3f}x "
            f"±{c['control_spread']:.1%}, warm-up {c['median_warmup'] or float('nan'):.3f}x; "
            f"{c['launches_that_switched']} of {len(c['launches'])} launches switched; met: {c['met']}"
        )
    note = (
        "cells may come from several launches of the script (KEEP resumes): each cell's 'measured' names the "
        "command that measures it alone and its launches' commits and dates"
    )
    fields = {"lowest": LOWEST, "warmup_within": WARMUP_WITHIN, "note": note,
              "results": keep_unmeasured(args.out, results)}  # fmt: skip
    write_summary(args.out, "no_harm", fields, args.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
