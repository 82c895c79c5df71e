"""Summarise ``bench_selective_sim.sh``'s runs into profiling/results/selective_sim.json and print
the tables of docs/results.md (or, with ``--print``, print them from the existing summary).

Each argument ``NAME=FILE`` is one ``stragglerkit simulate --selective --json FILE`` record; ``paper``
is the paper's setting, the others are sensitivity runs.

Example::

    python profiling/_selective_summary.py paper=p.json compute_x10=c.json --command "bash ..."
    python profiling/_selective_summary.py --print
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from _env import RESULTS, write_summary

SUMMARY = RESULTS / "selective_sim.json"
METHODS = ("selective", "partial", "allreduce")


def _trio(row: dict[str, Any], metric: str, fmt: str, scale: float = 1.0) -> str:
    return " / ".join(f"{row['methods'][m][metric]['median'] * scale:{fmt}}" for m in METHODS if m in row["methods"])


def _ratio(spread: dict[str, float]) -> str:
    return f"**{spread['median']:.2f}x** ({spread['min']:.2f}-{spread['max']:.2f})"


def _over_n(rows: list[dict[str, Any]], metric: str) -> str:
    medians = [row["ratios"][metric]["median"] for row in rows]
    return f"{min(medians):.2f}-{max(medians):.2f}x"


def sensitivity(record: dict[str, Any]) -> list[str]:
    """Markdown: per run and workload, the range over n of the median paired ratios."""
    lines = [
        "| run | workload | Eq. (4) | compute scale | trials | sync time, partial / selective "
        "| sync scale, selective / partial | iterations, selective / partial |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run, result in record["runs"].items():
        for workload, entry in result["workloads"].items():
            s, rows = entry["setting"], entry["rows"]
            lines.append(
                f"| {run} | {workload} | {s['progress']} | x{s['compute_scale']:g} | {rows[0]['trials']} | "
                f"{_over_n(rows, 'avg_sync_time')} | {_over_n(rows, 'avg_sync_scale')} | "
                f"{_over_n(rows, 'total_iterations')} |"
            )
    paper = next(iter(record["runs"].values()))["paper_ratios"]
    lines.append(
        f"| the paper | both | F(t+dt) | - | 20 | {paper['avg_sync_time'][0]}-{paper['avg_sync_time'][1]}x | "
        f"{paper['avg_sync_scale'][0]}-{paper['avg_sync_scale'][1]}x | "
        f"{paper['total_iterations'][0]}-{paper['total_iterations'][1]}x |"
    )
    return lines


def tables(record: dict[str, Any]) -> str:
    """Markdown: for the ``paper`` run, per workload, medians per method and the paired ratios next to
    the paper's; then every run's ratios, ranged over n."""
    commit = (record.get("source") or {}).get("commit", "?")[:7]
    stamp = f"commit `{commit}`, {record['date'][:16].replace('T', ' ')} UTC"
    lines = [f"Measured: {stamp}; `{record['command']}`", ""]
    for run, result in record["runs"].items():
        if run != "paper":
            continue
        paper = result["paper_ratios"]
        for workload, entry in result["workloads"].items():
            s = entry["setting"]
            trials = entry["rows"][0]["trials"]
            lines += [
                f"**{run}, {workload}** (compute {entry['distribution']}, x{s['compute_scale']:g}; Eq. (4) "
                f"{s['progress']}; {trials} trials; medians, selective / partial / all-reduce):",
                "",
                "| n | sync time (s) | sync scale | total sync | total iterations | wasted wait/worker (ms) |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for row in entry["rows"]:
                lines.append(
                    f"| {row['world_size']} | {_trio(row, 'avg_sync_time', '.2f')} | "
                    f"{_trio(row, 'avg_sync_scale', '.1f')} | {_trio(row, 'total_sync', '.0f')} | "
                    f"{_trio(row, 'total_iterations', '.0f')} | {_trio(row, 'wasted_wait', '.2f', 1e3)} |"
                )
            lines += [
                "",
                "| n | sync time, partial / selective | sync scale, selective / partial "
                "| iterations, selective / partial |",
                "| --- | --- | --- | --- |",
            ]
            for row in entry["rows"]:
                r = row["ratios"]
                lines.append(
                    f"| {row['world_size']} | {_ratio(r['avg_sync_time'])} | {_ratio(r['avg_sync_scale'])} | "
                    f"{_ratio(r['total_iterations'])} |"
                )
            lines.append(
                f"| paper (n = 40..200) | {paper['avg_sync_time'][0]}-{paper['avg_sync_time'][1]}x | "
                f"{paper['avg_sync_scale'][0]}-{paper['avg_sync_scale'][1]}x | "
                f"{paper['total_iterations'][0]}-{paper['total_iterations'][1]}x |"
            )
            lines.append("")
    lines += ["Every run, the median ratio's range over n = 40..200:", "", *sensitivity(record)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", metavar="NAME=FILE")
    parser.add_argument("--command", help="the command that produced the runs")
    parser.add_argument("--print", action="store_true", help="only print the tables of the existing summary")
    args = parser.parse_args()
    if not args.print:
        runs = {}
        for item in args.runs:
            name, _, path = item.partition("=")
            runs[name] = json.loads(Path(path).read_text(encoding="utf-8"))
        write_summary(SUMMARY, "selective_sim", {"runs": runs}, command=args.command)
    print(tables(json.loads(SUMMARY.read_text(encoding="utf-8"))))


if __name__ == "__main__":
    main()
