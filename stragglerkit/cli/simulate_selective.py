"""``stragglerkit simulate --selective``: the selective-reduce paper's experiment (selective reduce,
partial reduce, all-reduce on n workers with random compute times and bandwidths).

The simulation is :mod:`stragglerkit.sim.selective`; this module reads the options, runs the table
for each workload, prints it (median [min, max] over the trials) next to the paper's ratios, and
writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import Any

__all__ = ["cmd_simulate_selective", "selective_record", "workload_list"]

DEFAULT_WORLD_SIZES = [40, 80, 120, 160, 200]
"""The paper's n: 40 to 200 in steps of 40."""


def workload_list(text: str) -> list[str]:
    """``--workloads``: comma-separated names of compute-time distributions."""
    from stragglerkit.sim.selective import WORKLOADS

    chosen = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
    return chosen


def selective_record(args: argparse.Namespace, progress_out: Any = sys.stderr) -> dict[str, Any]:
    """Run the table for every workload of ``args``; the JSON record (settings, rows, paper ratios)."""
    from stragglerkit.sim.selective import PAPER_RATIOS, WORKLOADS, SimSetting, run_table

    world_sizes = args.world_sizes or DEFAULT_WORLD_SIZES
    record: dict[str, Any] = {"paper_ratios": {k: list(v) for k, v in PAPER_RATIOS.items()}, "workloads": {}}
    started = time.perf_counter()
    for workload in args.workloads:
        base = SimSetting(
            world_size=max(world_sizes),
            workload=workload,
            compute_scale=args.compute_scale,
            p_fraction=args.p_fraction,
            eta=args.eta,
            theta=args.theta,
            dt=args.dt,
            alpha=1e-3 if args.alpha is None else args.alpha,
            model_bytes=500e6 if args.size is None else args.size,
            max_gbit=20.0 if args.bandwidth is None else args.bandwidth * 8 / 1e9,
            duration=args.duration,
            seed=args.seed,
            progress=args.progress,
        )
        for n in world_sizes:  # every n checked before the long work starts
            SimSetting(**{**asdict(base), "world_size": n})
        if progress_out is not None:
            print(f"{workload}: n = {world_sizes}, {args.trials} trials", file=progress_out, flush=True)
        setting = {k: v for k, v in asdict(base).items() if k != "world_size"}
        record["workloads"][workload] = {
            "distribution": WORKLOADS[workload][1],
            "setting": setting,
            "rows": run_table(world_sizes, args.trials, base, progress_out=progress_out),
        }
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record


def _cell(spread: dict[str, float], fmt: str) -> str:
    return f"{spread['median']:{fmt}} [{spread['min']:{fmt}}, {spread['max']:{fmt}}]"


def print_selective_table(record: dict[str, Any]) -> None:
    """The record as text: per workload, each metric's median [min, max] per n and method."""
    paper = record["paper_ratios"]
    for workload, entry in record["workloads"].items():
        s = entry["setting"]
        print(
            f"{workload}: compute {entry['distribution']} (x{s['compute_scale']:g}); p = {s['p_fraction']:g} n, "
            f"eta {s['eta']:g}, theta {s['theta']:g}, dt {s['dt'] * 1e3:g} ms, alpha {s['alpha'] * 1e3:g} ms, "
            f"v {s['model_bytes'] / 1e6:g} MB, {s['duration']:g} s, Eq. (4) {s['progress']}; median [min, max]"
        )
        print(
            f"{'n':>4} {'method':<10} {'sync time (s)':>22} {'sync scale':>24} {'total sync':>18} "
            f"{'total iterations':>24} {'wasted wait/worker (ms)':>24}"
        )
        for row in entry["rows"]:
            for method, m in row["methods"].items():
                wasted = {k: v * 1e3 for k, v in m["wasted_wait"].items()}
                print(
                    f"{row['world_size']:>4} {method:<10} {_cell(m['avg_sync_time'], '.3f'):>22} "
                    f"{_cell(m['avg_sync_scale'], '.1f'):>24} {_cell(m['total_sync'], '.0f'):>18} "
                    f"{_cell(m['total_iterations'], '.0f'):>24} {_cell(wasted, '.2f'):>24}"
                )
        print("selective : partial, paired per trial, median [min, max]   (paper, both traces, n = 40..200)")
        for row in entry["rows"]:
            ratios = row["ratios"]
            if not ratios:
                continue
            print(
                f"{row['world_size']:>4} sync time {_cell(ratios['avg_sync_time'], '.2f')}x  "
                f"scale {_cell(ratios['avg_sync_scale'], '.2f')}x  "
                f"iterations {_cell(ratios['total_iterations'], '.2f')}x"
            )
        print(
            f"     paper: sync time {paper['avg_sync_time'][0]}-{paper['avg_sync_time'][1]}x  "
            f"scale {paper['avg_sync_scale'][0]}-{paper['avg_sync_scale'][1]}x  "
            f"iterations {paper['total_iterations'][0]}-{paper['total_iterations'][1]}x"
        )
        print()


def _refuse_other_options(args: argparse.Namespace) -> None:
    given = {
        "--straggler": args.straggler is not None,
        "--degrade": bool(args.degrade),
        "--delay": args.delay is not None,
        "--segments": args.segments is not None,
        "--gpus-per-server": args.gpus_per_server != 1,
        "--plot": args.plot is not None,
    }
    wrong = [name for name, set_ in given.items() if set_]
    if wrong:
        raise ValueError(
            f"{', '.join(wrong)} do(es) not apply with --selective (random bandwidths, no single straggler); "
            "drop them, or run simulate without --selective"
        )


def cmd_simulate_selective(args: argparse.Namespace) -> int:
    _refuse_other_options(args)
    quiet = args.json == "-"
    record = selective_record(args, progress_out=sys.stderr)
    if quiet:
        print(json.dumps(record))
        return 0
    print_selective_table(record)
    print(f"simulated in {record['seconds']:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
        print(f"wrote {args.json}")
    return 0
