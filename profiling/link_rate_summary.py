"""Summarise profiling/bench_link_rate_l8_7.sh: OptCC and the balanced ring at l = 8/7 per link rate.

Reads every ``<rate>_<run>.json`` bench file in the folder given and writes ``summary.json`` there:
per rate, per algorithm, the runs' figures over gloo on the fault-free cluster (measured and the
model's), the excess of the measured figure over the model's, how busy the cores were (the
busiest host's busy share, and the ranks' run-queue wait per iteration) and, from the critical path
of each run's last iteration, the post lag (CPU between a message's dependencies completing and its
post) and the wire time above what the messages would take alone on their links. The medians over
the runs per rate are printed as a table.

The plans are the same at every rate (the segment count follows the bucket's bytes, not the rate);
only the CPU work per second of transfer changes. An excess that shrinks with the rate is the
cores', one that stays is the plan's.

Example::

    python profiling/link_rate_summary.py profiling/results/link_rate_l8_7
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ALGORITHMS = ("optcc", "balanced_ring")
_NAME = re.compile(r"^(?P<rate>[0-9]+[A-Za-z]+)_(?P<run>[0-9]+)\.json$")


def _figures(path: Path) -> dict[str, dict[str, Any]]:
    data = json.loads(path.read_text())
    rows = {(r["scenario"], r["algorithm"]): r for r in data["rows"]}
    healthy = rows[("none", "gloo")]
    found: dict[str, dict[str, Any]] = {}
    for algorithm in ALGORITHMS:
        row = rows.get(("degraded", algorithm))
        if row is None:
            continue
        measured = row["time_s"] / healthy["time_s"] - 1.0
        model = row["predicted_s"] / healthy["predicted_s"] - 1.0
        path_ = row.get("critical_path") or {}
        found[algorithm] = {
            "file": path.name,
            "bandwidth_Bps": data["header"]["config"]["bandwidth"],
            "date": data["header"]["date"],
            "time_s": row["time_s"],
            "fault_free_gloo_s": healthy["time_s"],
            "over_fault_free_gloo": measured,
            "model_over_fault_free_gloo": model,
            "excess_over_model": measured - model,
            "cpu_busy": row.get("cpu_busy"),
            "run_queue_wait_s": row.get("run_queue_wait_s"),
            "critical_path_post_lag_s": path_.get("post_lag_s"),
            "critical_path_wire_above_alone_s": (
                path_["wire_s"] - path_["wire_ideal_s"] if path_.get("wire_ideal_s") is not None else None
            ),
            "critical_path_s": path_.get("total_s"),
            "wrong": row["wrong"],
        }
    return found


def summarise(folder: Path) -> dict[str, Any]:
    """``{"rates": {rate: {algorithm: {"runs": [...], "median": {...}}}}}`` for the files in ``folder``."""
    rates: dict[str, dict[str, dict[str, Any]]] = {}
    bandwidth: dict[str, float] = {}
    for path in sorted(folder.glob("*.json")):
        match = _NAME.match(path.name)
        if match is None:
            continue
        for algorithm, figures in _figures(path).items():
            rates.setdefault(match["rate"], {}).setdefault(algorithm, {"runs": []})["runs"].append(figures)
            bandwidth[match["rate"]] = figures["bandwidth_Bps"]
    rates = {rate: rates[rate] for rate in sorted(rates, key=lambda rate: -bandwidth[rate])}
    for per_algorithm in rates.values():
        for entry in per_algorithm.values():
            runs = entry["runs"]
            entry["median"] = {
                key: statistics.median(r[key] for r in runs)
                for key in runs[0]
                if isinstance(runs[0][key], (int, float)) and all(r[key] is not None for r in runs)
            }
    return {"rates": rates}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python profiling/link_rate_summary.py FOLDER", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    summary = summarise(folder)
    if not summary["rates"]:
        print(f"no <rate>_<run>.json bench files in {folder}", file=sys.stderr)
        return 1
    summary["command"] = f"python profiling/link_rate_summary.py {argv[0]}"
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print("rate       algorithm      runs  measured  model   excess  cpu%  wait(ms)  post lag(ms)  wire > alone(ms)")
    for rate, per_algorithm in summary["rates"].items():
        for algorithm, entry in per_algorithm.items():
            m = entry["median"]
            print(
                f"{rate:<10} {algorithm:<14} {len(entry['runs']):>4}  {m['over_fault_free_gloo']:>7.1%}"
                f"  {m['model_over_fault_free_gloo']:>5.1%}  {m['excess_over_model']:>6.1%}"
                f"  {m.get('cpu_busy', float('nan')):>4.0%}  {1e3 * m.get('run_queue_wait_s', float('nan')):>8.1f}"
                f"  {1e3 * m.get('critical_path_post_lag_s', float('nan')):>12.1f}"
                f"  {1e3 * m.get('critical_path_wire_above_alone_s', float('nan')):>16.1f}"
            )
    print(f"wrote {folder / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
