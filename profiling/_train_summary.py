"""The training summary: stragglerkit against the plain framework in bench_train*.sh's runs.

Reads ``stragglerkit bench --mode train --json`` files named ``<scenario>_run<i>.json`` (scenario:
``no_fault``, ``straggler``, ``degraded``, ``jitter``) and overwrites one summary (default
``profiling/results/bench_train.json``, with ``--framework horovod`` or ``megatron``
``profiling/results/bench_train_<framework>.json``): per scenario, the plain framework's steady step
over stragglerkit's (median and every run, by step and by total time), the same ratio of the
plain copy over its identical second copy (the A/A control; its spread is the launch's noise), the
target, when the fault
was detected and switched, what stragglerkit switched to and ran at the end, and whether its model
matched the plain one's (within 1e-5 of the largest parameter, identical on every rank).

Example::

    python profiling/_train_summary.py /tmp/train/*.json --command "bash profiling/bench_train.sh"
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, write_summary


class Target(NamedTuple):
    description: str
    text: str
    lowest: float | None
    """The lowest plain/stragglerkit steady step ratio that meets it (None: no speed target)."""
    switched_by: int | None = None
    """The step by which the median run must have switched (None: no such target)."""
    never_switches: bool = False
    """No run may switch (jitter alone is no fault to act on)."""


TARGETS = {
    "ddp": {
        "no_fault": Target("no fault: the hook costs at most 1 % of plain DDP's step", ">= 0.99x", 0.99),
        "straggler": Target("rank 7 late by 2x its pre-phase from step 20", ">= 1.1x", 1.1),
        "degraded": Target("rank 3's NIC at 1/2 from step 20", ">= 1.2x", 1.2),
    },
    "horovod": {
        "no_fault": Target("no fault: within 1 % of plain Horovod's step", ">= 0.99x", 0.99),
        "straggler": Target(
            "rank 7 late by 2x its pre-phase from step 20", "switched by step 40, >= 1.1x", 1.1, switched_by=40
        ),
        "degraded": Target("rank 3's NIC at 1/2 from step 20", "switched by step 50, >= 1.2x", 1.2, switched_by=50),
        "jitter": Target("every rank late by uniform[0, 20 ms] from step 20", "no switch", None, never_switches=True),
    },
    "megatron": {
        "no_fault": Target("no fault: within 1 % of plain megatron-core's step", ">= 0.99x", 0.99),
        "straggler": Target("rank 7 late by 2x its pre-phase from step 20", ">= 1.1x", 1.1),
        "degraded": Target("rank 3's NIC at 1/2 from step 20", ">= 1.2x", 1.2),
        "jitter": Target("every rank late by uniform[0, 20 ms] from step 20", "no switch", None, never_switches=True),
    },
}
SETTING = {
    "ddp": "8 ranks, emulated cluster, 1 Gbit/s; plain DDP, a second plain DDP copy (the A/A control) and the "
    "hook in turns of 10 steps",
    "horovod": "8 ranks, emulated cluster, 1 Gbit/s, horovodrun-style Gloo launch; hvd.DistributedOptimizer twice (the "
    "second copy is the A/A control) and stragglerkit.straggler_aware in turns of 10 steps",
    "megatron": "8 ranks, emulated cluster, 1 Gbit/s; a 2-layer GPT on megatron-core's DistributedDataParallel "
    "(overlap_grad_reduce, its schedule and SGD), twice without (the second copy is the A/A control) and once with "
    "stragglerkit.megatron.install, in turns of 10 steps",
}
PARAMETER_TOLERANCE = 1e-5
"""Largest |plain - stragglerkit| parameter difference, relative to the largest parameter."""


def _scenario(path: Path, targets: dict[str, Target]) -> str:
    stem = path.stem.rsplit("_run", 1)[0]
    for name in targets:
        if stem.startswith(name):
            return name
    raise SystemExit(f"{path}: not a <scenario>_run<i>.json of {', '.join(targets)}")


def _met(target: Target, median: float, runs: list[dict[str, Any]]) -> bool:
    switched = [r["switched_step"] for r in runs]
    same_parameters = all(
        r["max_param_diff"] <= PARAMETER_TOLERANCE * max(r["param_scale"], 1.0) and r["hooked_identical_on_all_ranks"]
        for r in runs
    )
    speed = target.lowest is None or median >= target.lowest
    if target.switched_by is not None:
        steps = sorted(s if s is not None else 10**9 for s in switched)
        speed = speed and statistics.median(steps) <= target.switched_by
    if target.never_switches:
        speed = speed and all(s is None for s in switched)
    return speed and same_parameters


def _one_machine(scenario: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The machine of a scenario's runs; step times of two CPU models are not one figure."""
    models = {r["header"].get("machine", {}).get("cpu_model") for r in runs}
    if len(models) > 1:
        raise SystemExit(f"{scenario}: the runs ran on different CPU models {sorted(map(str, models))}")
    return dict(runs[0]["header"].get("machine", {}))


def summarise(paths: list[Path], framework: str = "ddp") -> dict[str, Any]:
    targets = TARGETS[framework]
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(paths):
        by_scenario.setdefault(_scenario(path, targets), []).append(json.loads(path.read_text(encoding="utf-8")))
    scenarios = []
    first: dict[str, Any] | None = None
    for name, target in targets.items():
        runs = by_scenario.get(name)
        if not runs:
            continue
        first = first or runs[0]
        steady = [r["speedup_steady"] for r in runs]
        known = [float(r["control_speedup_steady"]) for r in runs if r.get("control_speedup_steady") is not None]
        controls = known if len(known) == len(runs) else []
        median = statistics.median(steady)
        scenarios.append(
            {
                "scenario": name,
                "description": target.description,
                "command": runs[0]["header"]["command"],
                "commit": (runs[0]["header"].get("source") or {}).get("commit"),
                "machine": _one_machine(name, runs),
                "model": runs[0]["model"]["layers"],
                "gradient_bytes": runs[0]["model"]["gradient_bytes"],
                "target": target.text,
                "speedup_steady": round(median, 4),
                "lowest": target.lowest,
                "met": _met(target, median, runs),
                "runs": [round(v, 4) for v in steady],
                # the A/A control: plain over its identical second copy, per run; its spread is the
                # largest distance from 1 (None: a run without a control copy)
                "control_runs": [round(c, 4) for c in controls] or None,
                "control": round(statistics.median(controls), 4) if controls else None,
                "control_spread": round(max(abs(c - 1.0) for c in controls), 4) if controls else None,
                "speedup_total_runs": [round(r["speedup_steady_total"], 4) for r in runs],
                "plain_steady_ms": [round(r["plain_steady_ms"], 1) for r in runs],
                "hooked_steady_ms": [round(r["hooked_steady_ms"], 1) for r in runs],
                "detected_step": [r["detected_step"] for r in runs],
                "switched_step": [r["switched_step"] for r in runs],
                "switched_to": [r["algorithm"] if r["switched_step"] is not None else None for r in runs],
                "final_buckets": [r["final_plan"]["buckets"] or [r["final_plan"]["default"]] for r in runs],
                "max_param_diff": max(r["max_param_diff"] for r in runs),
                "hooked_identical_on_all_ranks": all(r["hooked_identical_on_all_ranks"] for r in runs),
                "dates": [r["header"]["date"] for r in runs],
            }
        )
    if first is None:
        raise SystemExit("no training results given")
    header = first["header"]
    return {
        "setting": SETTING[framework],
        "framework": framework,
        "environment": header.get("environment", {}),
        "source": header.get("source"),
        "machine": header.get("machine"),
        "date": min(d for s in scenarios for d in s["dates"]),
        "scenarios": scenarios,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--command", help="the command that made the runs (recorded)")
    parser.add_argument("--commit", help="the commit the runs used, where their headers lack it")
    parser.add_argument("--framework", choices=sorted(TARGETS), default="ddp", help="whose targets (default ddp)")
    parser.add_argument("--out", type=Path, help="default profiling/results/bench_train[_<framework>].json")
    args = parser.parse_args(argv)
    default = "bench_train.json" if args.framework == "ddp" else f"bench_train_{args.framework}.json"
    out = args.out or RESULTS / default
    record = summarise(args.files, args.framework)
    if args.commit and not (record["source"] or {}).get("commit"):
        record["source"] = {"commit": args.commit, "modified": None}
    for s in record["scenarios"]:
        verdict = "met" if s["met"] else "NOT MET"
        runs = ", ".join(f"{v:.3f}x" for v in s["runs"])
        control = (
            "no control" if s["control"] is None else f"A/A control {s['control']:.3f}x ±{s['control_spread']:.1%}"
        )
        print(f"{s['scenario']:<10} {s['speedup_steady']:.3f}x ({runs}; {control}) target {s['target']}: {verdict}; "
              f"detected at {s['detected_step']}, switched at {s['switched_step']} to {s['switched_to']}")  # fmt: skip
    write_summary(out, "train", record, command=args.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
