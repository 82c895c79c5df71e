"""The summary of bench_calibrate.sh: the cost models' held-out errors, next to the paper's.

Reads the ``--json`` comparison of ``stragglerkit bench --mode calibrate`` and overwrites one
summary (default ``profiling/results/calibration.json``): the provenance, the measurement's own
command and commit, each model's errors overall, per algorithm, per scenario and per network, the
fitted parameters and what was folded, and the decisions. Prints the Markdown table of
docs/results.md.

Example::

    python profiling/_calibrate_summary.py /tmp/comparison.json --command "bash profiling/bench_calibrate.sh"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, write_summary


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def table(summary: dict[str, Any]) -> str:
    """Markdown: median (worst) held-out error per model: overall, per size, algorithm, scenario, network."""
    models = list(summary["models"])
    lines = ["| held-out samples | " + " | ".join(models) + " |", "| --- |" + " --- |" * len(models)]

    def row(label: str, stats: dict[str, Any]) -> None:
        cells = []
        for m in models:
            s = stats.get(m) or {}
            cells.append("-" if s.get("median_abs") is None else f"{_pct(s['median_abs'])} ({_pct(s['worst_abs'])})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row(f"all sizes ({summary['overall'][models[0]]['samples']})", summary["overall"])
    row(f"buffers >= 1 MiB ({summary['large'][models[0]]['samples']})", summary["large"])
    for size in sorted(summary["by_size"][models[0]], key=int):
        label = f"{int(size) >> 20} MiB" if int(size) >= 1 << 20 else f"{int(size) >> 10} KiB"
        row(f"size {label}", {m: summary["by_size"][m].get(size) for m in models})
    for algorithm in sorted(summary["by_algorithm"][models[0]]):
        row(algorithm, {m: summary["by_algorithm"][m].get(algorithm) for m in models})
    for scenario in sorted(summary["by_scenario"][models[0]]):
        row(f"scenario: {scenario}", {m: summary["by_scenario"][m].get(scenario) for m in models})
    for network, entry in summary["networks"].items():
        row(network, {m: e.get("held_out_error") for m, e in entry["models"].items()})
        row(f"{network}, >= 1 MiB", {m: e.get("held_out_error_large") for m, e in entry["models"].items()})
    paper = summary["paper"]
    lines.append(
        "| paper (GenModel's own testbeds) | "
        + " | ".join(_pct(paper.get(m)) if m in paper else "-" for m in models)
        + " |"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("comparison", help="the --json file of stragglerkit bench --mode calibrate")
    parser.add_argument("--command", help="the command to record (default: this one)")
    parser.add_argument("--out", default=str(RESULTS / "calibration.json"))
    args = parser.parse_args()
    summary = json.loads(Path(args.comparison).read_text(encoding="utf-8"))
    summary.pop("samples_file", None)
    write_summary(args.out, "calibration", summary, command=args.command)
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
