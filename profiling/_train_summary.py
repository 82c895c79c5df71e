"""The training summary: the DDP hook against plain DDP in bench_train.sh's runs.

Reads ``stragglerkit bench --mode train --json`` files named ``<scenario>_run<i>.json`` (scenario:
``no_fault``, ``straggler``, ``degraded``) and overwrites one summary (default
``profiling/results/bench_train.json``): per scenario, plain DDP's steady step over the hook's
(median and every run, by step and by total time), the target, when the fault was detected, what
the hook switched to and what it ran at the end, and whether the hooked model matched plain DDP's.

Example::

    python profiling/_train_summary.py /tmp/train/*.json --command "bash profiling/bench_train.sh"
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, write_summary

# scenario: (what it is, target text, lowest plain/hooked step ratio that meets it)
TARGETS = {
    "no_fault": ("no fault: the hook costs at most 2 % of plain DDP's step", ">= 0.98x", 0.98),
    "straggler": ("rank 7 late by 2x its pre-phase from step 20", ">= 1.1x", 1.1),
    "degraded": ("rank 3's NIC at 1/2 from step 20", ">= 1.2x", 1.2),
}


def _scenario(path: Path) -> str:
    stem = path.stem.rsplit("_run", 1)[0]
    for name in TARGETS:
        if stem.startswith(name):
            return name
    raise SystemExit(f"{path}: not a <scenario>_run<i>.json of {', '.join(TARGETS)}")


def summarise(paths: list[Path]) -> dict[str, Any]:
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(paths):
        by_scenario.setdefault(_scenario(path), []).append(json.loads(path.read_text(encoding="utf-8")))
    scenarios = []
    first: dict[str, Any] | None = None
    for name, (description, target, lowest) in TARGETS.items():
        runs = by_scenario.get(name)
        if not runs:
            continue
        first = first or runs[0]
        steady = [r["speedup_steady"] for r in runs]
        median = statistics.median(steady)
        scenarios.append(
            {
                "scenario": name,
                "description": description,
                "command": runs[0]["header"]["command"],
                "commit": (runs[0]["header"].get("source") or {}).get("commit"),
                "model": runs[0]["model"]["layers"],
                "gradient_bytes": runs[0]["model"]["gradient_bytes"],
                "target": target,
                "speedup_steady": round(median, 4),
                "met": median >= lowest,
                "runs": [round(v, 4) for v in steady],
                "speedup_total_runs": [round(r["speedup_steady_total"], 4) for r in runs],
                "plain_steady_ms": [round(r["plain_steady_ms"], 1) for r in runs],
                "hooked_steady_ms": [round(r["hooked_steady_ms"], 1) for r in runs],
                "detected_step": [r["detected_step"] for r in runs],
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
        "setting": "8 ranks, emulated cluster, 1 Gbit/s; plain DDP and the hook in turns of 10 steps",
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
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_train.json")
    args = parser.parse_args(argv)
    record = summarise(args.files)
    if args.commit and not (record["source"] or {}).get("commit"):
        record["source"] = {"commit": args.commit, "modified": None}
    for s in record["scenarios"]:
        verdict = "met" if s["met"] else "NOT MET"
        runs = ", ".join(f"{v:.3f}x" for v in s["runs"])
        print(f"{s['scenario']:<10} {s['speedup_steady']:.3f}x ({runs}) target {s['target']}: {verdict}; "
              f"detected at {s['detected_step']}, switched to {s['switched_to']}")  # fmt: skip
    write_summary(args.out, "train", record, command=args.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
