"""The summary of bench_train_selective.sh: selective reduce against partial reduce and all-reduce
on real ranks, per run and as medians.

Reads the ``--json`` files of ``stragglerkit bench --mode train --sync selective`` and overwrites
one summary (default ``profiling/results/train_selective.json``): per method, the median over the
runs of average sync time, average sync scale, total syncs, total iterations, mean wait and
held-out loss; selective's ratios to partial reduce per run and their medians, next to the paper's
ranges; each run's NIC rates; and a coarse loss-against-time curve per method (run 1's).
Prints a Markdown table for docs/results.md.

Example::

    python profiling/_selective_train_summary.py /tmp/selective/run*.json --command "..."
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

PAPER = {
    "sync_time_partial_over_selective": "1.89-2.55x",
    "sync_scale_selective_over_partial": "1.19-1.25x",
    "iterations_selective_over_partial": "1.10-1.17x",
}
"""The paper's ranges (Section IV-B-1, simulated clusters of 40-200 workers)."""
FIGURES = ("avg_sync_time_s", "avg_sync_scale", "total_sync", "total_iterations", "mean_wait_s", "holds", "test_loss")


def _median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    methods = list(runs[0]["methods"])
    per_method = {
        method: {figure: _median([run["methods"][method][figure] for run in runs]) for figure in FIGURES}
        for method in methods
    }
    ratios = {
        name: {
            "runs": [run["ratios"].get(name) for run in runs],
            "median": _median([run["ratios"].get(name) for run in runs]),
            "paper": PAPER[name],
        }
        for name in PAPER
    }
    first = runs[0]
    return {
        "setting": {
            key: first["config"][key] for key in ("world_size", "bandwidth", "duration", "compute", "model_bytes")
        },
        "p": first["p"],
        "runs": len(runs),
        "methods": per_method,
        "ratios": ratios,
        "rates_Mbit": [{rank: round(float(v) * 8 / 1e6) for rank, v in run["rates_Bps"].items()} for run in runs],
        "loss_vs_time_run1": {
            method: [[round(p["t_s"], 1), round(p["loss"], 5)] for p in first["methods"][method]["loss_vs_time"][::5]]
            for method in methods
        },
    }


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| method | avg sync time (s) | avg sync scale | syncs | iterations | wait ready->sync (s) | BPAWR holds "
        "| held-out loss |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method, m in summary["methods"].items():
        cells = [
            f"{m['avg_sync_time_s']:.3f}",
            f"{m['avg_sync_scale']:.2f}",
            f"{m['total_sync']:.0f}",
            f"{m['total_iterations']:.0f}",
            f"{m['mean_wait_s']:.3f}",
            f"{m['holds']:.0f}",
            f"{m['test_loss']:.4g}",
        ]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "| selective against partial reduce | runs | median | paper |", "| --- | --- | --- | --- |"]
    for name, r in summary["ratios"].items():
        runs = ", ".join("-" if v is None else f"{v:.2f}" for v in r["runs"])
        median = "-" if r["median"] is None else f"{r['median']:.2f}x"
        lines.append(f"| {name.replace('_', ' ')} | {runs} | {median} | {r['paper']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="the bench's --json files")
    parser.add_argument("--out", default=str(RESULTS / "train_selective.json"))
    parser.add_argument("--command", default=None)
    parser.add_argument(
        "--plot",
        default=str(RESULTS.parent.parent / "docs" / "images" / "train_selective_loss.png"),
        help="run 1's loss against wall-clock time per method (default docs/images/train_selective_loss.png)",
    )
    args = parser.parse_args()
    runs = [json.loads(Path(path).read_text(encoding="utf-8")) for path in args.runs]
    summary = summarise(runs)
    write_summary(args.out, "train_selective", summary, args.command)
    if args.plot:
        from profiling.lab.train_selective import plot

        plot(runs[0], args.plot)
        print(f"wrote {args.plot}")
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
