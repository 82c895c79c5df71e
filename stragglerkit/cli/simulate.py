"""``stragglerkit simulate``: predict AllReduce times of several algorithms on a simulated network."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from stragglerkit.cli.options import (
    add_situation_options,
    algorithm_list,
    command_parser,
    int_list,
    situation_from_args,
    unit,
)
from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules.registry import Situation, generate
from stragglerkit.units import format_bytes, format_seconds, parse_bandwidth, parse_size, parse_time

if TYPE_CHECKING:
    from stragglerkit.sim import Network

__all__ = ["add_parser", "cmd_simulate"]


def _simulate_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from stragglerkit.sim import auto_delay, simulate
    from stragglerkit.sim.fast import fast_auto_delay, fast_simulate

    rows: list[dict[str, Any]] = []
    for n in args.world_sizes:
        situation = situation_from_args(args, n, args.size)
        network = _network(situation, args.alpha, args.bandwidth)
        straggler = args.straggler if args.straggler is not None else n - 1
        delay_text = args.delay if args.delay is not None else ("0s" if situation.slowdowns else "auto")
        if delay_text == "auto":
            reference = Situation(world_size=n, straggler=straggler)
            fast_delay = fast_auto_delay(reference, args.size, network)
            if fast_delay is None:  # odd n: hide the pre-phase AllReduce that direct needs
                fast_delay = fast_auto_delay(reference, args.size, network, algorithm="direct")
            if fast_delay is not None:
                delay = fast_delay
            else:
                try:
                    delay = auto_delay(generate("stragglar", reference), args.size, network)
                except NotApplicableError:  # odd n: hide the pre-phase AllReduce that direct needs
                    delay = auto_delay(generate("direct", reference), args.size, network, phase="pre_allreduce")
        else:
            delay = parse_time(delay_text)
        arrivals = [0.0] * n
        arrivals[straggler] = delay
        lower_bound = _optcc_lower_bound(situation, args.size, args.bandwidth) if situation.slowdowns else None
        for algorithm in args.algorithms:
            # ring, balanced ring, StragglAR: exact without building the schedule (stragglerkit.sim.fast)
            result: Any = fast_simulate(algorithm, situation, args.size, network, arrivals)
            if result is None:
                try:
                    sched = generate(algorithm, situation)
                except NotApplicableError as err:
                    print(f"note: skipping {algorithm} at n={n}: {err}", file=sys.stderr)
                    continue
                result = simulate(sched, args.size, network, arrivals=arrivals)
            row: dict[str, Any] = {
                "algorithm": algorithm,
                "world_size": n,
                "size_bytes": args.size,
                "delay_s": delay,
                "time_s": result.time_from_last_arrival,
                "time_from_first_arrival_s": result.time_from_first_arrival,
            }
            if lower_bound is not None:
                row["lower_bound_s"] = lower_bound
            rows.append(row)
    return rows


def _network(situation: Situation, alpha: float, bandwidth: float) -> Network:
    """Per-GPU NICs; with ``--gpus-per-server g > 1`` servers of g GPUs joined by NVLink (default
    ``(g-1)x`` the NIC), and a degraded GPU's whole server at its slowdown (PXN spreads the loss)."""
    from stragglerkit.sim import Network

    n, g = situation.world_size, situation.gpus_per_server
    slowdowns = dict(situation.slowdowns)
    if g == 1:
        return Network.uniform(n, alpha=alpha, bandwidth=bandwidth, slowdowns=slowdowns)
    if g < 1 or n % g:
        raise NotApplicableError(
            f"--gpus-per-server {g} must divide the world size {n} (ranks v*g..v*g+g-1 form a server)"
        )
    for rank, slowdown in situation.slowdowns.items():
        first = rank // g * g
        for peer in range(first, first + g):
            slowdowns[peer] = max(slowdown, slowdowns.get(peer, 1.0))
    return Network.uniform(n, alpha=alpha, bandwidth=bandwidth, slowdowns=slowdowns, gpus_per_server=g)


def _optcc_lower_bound(situation: Situation, size_bytes: int, bandwidth: float) -> float:
    from stragglerkit.sim import optcc_bounds

    return optcc_bounds.lower_bound(
        situation.world_size, situation.slowdowns, size_bytes / bandwidth, gpus_per_server=situation.gpus_per_server
    )


def _print_simulation_table(rows: list[dict[str, Any]]) -> None:
    baseline = {row["world_size"]: row["time_s"] for row in rows if row["algorithm"] == "ring"}
    has_bound = any("lower_bound_s" in row for row in rows)
    header = f"{'algorithm':<13} {'n':>5} {'size':>9} {'delay':>11} {'time':>12} {'from first':>12} {'vs ring':>8}"
    if has_bound:
        header += f" {'lower bound':>12}"
    print(header)
    for row in rows:
        ring_time = baseline.get(row["world_size"])
        speedup = f"{ring_time / row['time_s']:.3f}x" if ring_time and row["time_s"] > 0 else "-"
        line = (
            f"{row['algorithm']:<13} {row['world_size']:>5} {format_bytes(row['size_bytes']):>9} "
            f"{format_seconds(row['delay_s']):>11} {format_seconds(row['time_s']):>12} "
            f"{format_seconds(row['time_from_first_arrival_s']):>12} {speedup:>8}"
        )
        if has_bound:
            bound = row.get("lower_bound_s")
            line += f" {format_seconds(bound) if bound is not None else '-':>12}"
        print(line)
    print("time: from the last (straggler's) arrival to the last completion; 'from first': from the first arrival")


def _plot_simulation(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for algorithm in dict.fromkeys(row["algorithm"] for row in rows):
        mine = [row for row in rows if row["algorithm"] == algorithm]
        ax.plot([r["world_size"] for r in mine], [r["time_s"] * 1e3 for r in mine], marker="o", label=algorithm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks (n)")
    ax.set_ylabel("AllReduce time from last arrival (ms)")
    size = format_bytes(rows[0]["size_bytes"]) if rows else ""
    ax.set_title(f"Simulated AllReduce, {size} buffer")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.selective:
        from stragglerkit.cli.simulate_selective import cmd_simulate_selective

        return cmd_simulate_selective(args)
    # --world-sizes, --size and --alpha default differently with --selective (the paper's setting)
    args.world_sizes = args.world_sizes or [8, 16, 256]
    args.size = parse_size("1GiB") if args.size is None else args.size
    args.alpha = parse_time("3us") if args.alpha is None else args.alpha
    args.bandwidth = parse_bandwidth("450GB/s") if args.bandwidth is None else args.bandwidth
    rows = _simulate_rows(args)
    if args.json == "-":
        print(json.dumps(rows))
    else:
        _print_simulation_table(rows)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(rows, handle, indent=1)
            print(f"wrote {args.json}")
    if args.plot:
        _plot_simulation(rows, args.plot)
        if args.json != "-":
            print(f"wrote {args.plot}")
    return 0


HELP = {
    "help": "predict AllReduce times on a simulated network",
    "description": "Simulate algorithms on a network of per-rank NICs (flow level, max-min fair sharing) "
    "with a late straggler and/or degraded NICs, and compare them with ring.",
    "epilog": "example (the StragglAR paper's analytic comparison):\n"
    "  stragglerkit simulate --algorithms ring,rhd,stragglar --world-sizes 8,16,256 "
    "--size 1GiB --alpha 3us --bandwidth 450GB/s\n"
    "example (the selective-reduce paper's experiment, docs/selective.md; a few minutes):\n"
    "  stragglerkit simulate --selective --workloads resnet50,transformer --trials 20 --json out.json",
}
"""The command's help, description and examples."""


def add_parser(sub: Any) -> None:
    """Add ``simulate`` to the subcommands ``sub``."""
    sim = command_parser(sub, "simulate", **HELP)
    sim.add_argument(
        "--algorithms", type=algorithm_list, default=["ring", "rhd", "stragglar"], help="comma-separated list"
    )
    sim.add_argument(
        "--world-sizes", type=int_list, help="comma-separated, e.g. 8,16,256 (default; --selective: 40,80,120,160,200)"
    )
    sim.add_argument("--size", type=unit(parse_size), help="buffer size (default 1GiB; --selective: the model, 500MB)")
    sim.add_argument(
        "--alpha", type=unit(parse_time), help="per-message latency (default 3us; --selective: per ring step, 1ms)"
    )
    sim.add_argument(
        "--bandwidth",
        type=unit(parse_bandwidth),
        help="per-rank NIC bandwidth (default 450GB/s; --selective: the fastest NIC's, 20Gbit)",
    )
    sim.add_argument(
        "--delay",
        metavar="auto|TIME",
        help="straggler delay: 'auto' (arrives as the others finish StragglAR's pre-phase) or a time like 5ms; "
        "default auto, or 0 when --degrade is given",
    )
    add_situation_options(sim)
    sim.add_argument("--json", metavar="FILE|-", help="write the rows as JSON ('-' prints only JSON on stdout)")
    sim.add_argument("--plot", metavar="FILE.png", help="plot time against n")
    _add_selective_options(sim)
    sim.set_defaults(func=cmd_simulate)


def _add_selective_options(sim: argparse.ArgumentParser) -> None:
    from stragglerkit.cli.simulate_selective import workload_list

    group = sim.add_argument_group(
        "selective reduce (--selective)",
        "The selective-reduce paper's experiment: selective reduce, partial reduce and all-reduce on n workers "
        "with random compute times and bandwidths round(20u, 3) Gbit/s, u ~ U[0.05, 1] (stragglerkit.sim.selective).",
    )
    group.add_argument("--selective", action="store_true", help="run the selective-reduce experiment instead")
    group.add_argument(
        "--workloads",
        type=workload_list,
        default=["resnet50", "transformer"],
        help="compute-time distributions, comma-separated (default resnet50,transformer)",
    )
    group.add_argument("--trials", type=int, default=20, help="trials per n (default 20: min / median / max)")
    group.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    group.add_argument("--duration", type=float, default=100.0, help="seconds of training simulated (default 100)")
    group.add_argument(
        "--compute-scale", type=float, default=1.0, help="multiply every compute time (sensitivity; default 1)"
    )
    group.add_argument("--p-fraction", type=float, default=0.3, help="p = this x n (default 0.3)")
    group.add_argument("--eta", type=float, default=0.3, help="BAG's eta in [0, 1) (default 0.3)")
    group.add_argument("--theta", type=float, default=1.0, help="BPAWR's theta (default 1)")
    group.add_argument("--dt", type=float, default=0.01, help="the waiting slot in seconds (default 0.01)")
    group.add_argument(
        "--progress",
        choices=["paper", "conditional"],
        default="paper",
        help="Eq. (4): F(t+dt) as the paper writes it (default), or P(T <= t+dt | T > t)",
    )
