"""Schedule generation and simulation speed: StragglAR, OptCC and the flow-level simulator.

Three parts, each timed as the median of repeats on one core (wall-clock and, where the shared
machine makes wall-clock noisy, CPU time of this process; the load average is recorded):

* ``stragglar``: ``stragglar(n)`` for n = 8..256 including the lowering to the IR, plus the full
  ``gc.collect()`` that follows each call (the generator pauses the cyclic collector while it
  allocates; this bounds the deferred cost). Target: n = 256 within the paper's 1.04 s
  (StragglAR, §3.2). Also the matching-phase rounds of every even n in 4..64 plus 96, 128 and 256,
  each schedule proved by the symbolic checker, next to ``n + log2(n) - 2`` (powers of two) and
  the lower bound ``n + ceil(log2 n) - 2``.
* ``optcc``: ``optcc_plan`` (the closed-form plan every flow is a function of; budget 100 ms at
  p = 1024, k = 64, for the online re-plan when a NIC degrades), one rank's flows in one window,
  one rank's whole op list, and every rank's op list at p = 64.
* ``simulator``: ring and StragglAR at n = 1024 (alpha 3 us, 450 GB/s, 1 GiB; the straggler at
  ``auto_delay``): generation once, flattening into the task graph, and a whole ``simulate`` call.
  Target: both simulations in at most 10 s together.

Overwrites ``profiling/results/bench_schedules.json`` (``--out``). About 4 minutes on a 2-core
machine; ``--quick`` (n = 256 for the simulator, fewer sizes and repeats) in under a minute.

Example::

    python profiling/bench_schedules.py
    python profiling/bench_schedules.py --quick --parts stragglar,optcc --out /tmp/schedules.json
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, ROOT, write_summary

sys.path.insert(0, str(ROOT))

PARTS = ("stragglar", "optcc", "simulator")
ALPHA, BANDWIDTH, SIZE = 3e-6, 450e9, 2**30
PAPER_SECONDS_256 = 1.04
ROUND_SIZES = [*range(4, 65, 2), 96, 128, 256]  # 96: e.g. 12 servers of 8 GPUs
OPTCC_CASES = ((1024, 2.0), (1024, 8 / 7), (256, 1.5), (64, 3.0))
OPTCC_BUDGET_MS = 100.0


def _timed(action: Callable[[], object], repeats: int) -> tuple[float, float, list[float]]:
    """Median wall seconds, median CPU seconds of this process, and every wall time."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        action()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu), wall


def stragglar_part(sizes: list[int], repeats: int, round_sizes: list[int]) -> dict[str, Any]:
    from stragglerkit.schedules.check import check
    from stragglerkit.schedules.stragglar import stragglar

    timings = []
    for n in sizes:
        wall, cpu, collect = [], [], []
        rounds = num_ops = 0
        for _ in range(repeats):
            gc.collect()
            start, start_cpu = time.perf_counter(), time.process_time()
            schedule = stragglar(n)
            cpu.append(time.process_time() - start_cpu)
            wall.append(time.perf_counter() - start)
            start = time.perf_counter()
            gc.collect()
            collect.append(time.perf_counter() - start)
            rounds, num_ops = schedule.rounds(), schedule.num_ops()
            del schedule  # freed outside the timed region
        row = {
            "n": n,
            "rounds": rounds,
            "num_ops": num_ops,
            "wall_s_median": round(statistics.median(wall), 5),
            "cpu_s_median": round(statistics.median(cpu), 5),
            "collect_after_s_median": round(statistics.median(collect), 5),
        }
        print(f"stragglar n={n}: {row}", flush=True)
        timings.append(row)
    rounds_rows = []
    for n in round_sizes:
        schedule = stragglar(n)
        check(schedule)
        log_n = math.log2(n)
        rounds_rows.append(
            {
                "n": n,
                "rounds": schedule.rounds(),
                "checked": True,
                "n_plus_log2n_minus_2": n + int(log_n) - 2 if n & (n - 1) == 0 else None,
                "lower_bound": n + math.ceil(log_n) - 2,
            }
        )
    print("stragglar rounds: " + ", ".join(f"{r['n']}->{r['rounds']}" for r in rounds_rows), flush=True)
    return {
        "repeats": repeats,
        "paper_seconds_n256": PAPER_SECONDS_256,
        "generation": timings,
        "rounds": rounds_rows,
    }


def optcc_part(cases: tuple[tuple[int, float], ...], repeats: int) -> dict[str, Any]:
    from stragglerkit.schedules.optcc import optcc, optcc_plan

    rows = []
    k = 64
    for p, slowdown in cases:
        slowdowns = {p // 3: slowdown}
        plan_s, _, _ = _timed(partial(optcc_plan, p, slowdowns, segments=k), 51)
        plan = optcc_plan(p, slowdowns, segments=k)
        rank, window = plan.healthy[5], plan.num_windows // 2
        lookup_s, _, _ = _timed(lambda: list(plan.rank_flows(rank, window)), 2001)  # noqa: B023 (used at once)
        rank_ops_s, _, _ = _timed(partial(plan.rank_ops, rank), repeats)
        row = {
            "p": p,
            "segments": k,
            "slowdown": round(slowdown, 6),
            "plan_ms": round(plan_s * 1e3, 4),
            "window_lookup_us": round(lookup_s * 1e6, 3),
            "rank_ops_s": round(rank_ops_s, 4),
            "rank_num_ops": len(plan.rank_ops(rank)),
            "num_windows": plan.num_windows,
        }
        print(f"optcc: {row}", flush=True)
        rows.append(row)
    whole_s, _, _ = _timed(lambda: optcc(64, {5: 1.5}, segments=64), repeats)
    return {
        "budget_ms": OPTCC_BUDGET_MS,
        "rows": rows,
        "whole_schedule_p64_k64": {"seconds": round(whole_s, 3), "num_ops": optcc(64, {5: 1.5}, segments=64).num_ops()},
        "plan_within_budget": all(r["plan_ms"] <= OPTCC_BUDGET_MS for r in rows),
    }


def simulator_part(n: int, repeats: int) -> dict[str, Any]:
    import numpy as np

    from stragglerkit.schedules import ring
    from stragglerkit.schedules.stragglar import stragglar
    from stragglerkit.sim import Network, auto_delay, simulate
    from stragglerkit.sim.graph import build_task_graph

    rows = []
    for name, generate, straggler in (("ring", ring, False), ("stragglar", stragglar, True)):
        start = time.perf_counter()
        schedule = generate(n)
        generate_s = time.perf_counter() - start
        network = Network.uniform(n, alpha=ALPHA, bandwidth=BANDWIDTH)
        arrivals = np.zeros(n)
        if straggler:
            arrivals[int(schedule.params.get("straggler", n - 1))] = auto_delay(schedule, SIZE, network)
        flatten_s, flatten_cpu, _ = _timed(partial(build_task_graph, schedule), repeats)
        results: list[Any] = []
        simulate_s, simulate_cpu, _ = _timed(
            lambda: results.append(simulate(schedule, SIZE, network, arrivals=arrivals)),  # noqa: B023 (used at once)
            repeats,
        )
        row = {
            "algorithm": name,
            "world_size": n,
            "num_ops": schedule.num_ops(),
            "generate_s": round(generate_s, 3),
            "flatten_median_s": round(flatten_s, 3),
            "flatten_cpu_median_s": round(flatten_cpu, 3),
            "simulate_median_s": round(simulate_s, 3),
            "simulate_cpu_median_s": round(simulate_cpu, 3),
            "engine": results[-1].engine,
            "time_from_last_arrival_s": results[-1].time_from_last_arrival,
        }
        print(f"simulator: {row}", flush=True)
        rows.append(row)
    return {
        "parameters": {"alpha_s": ALPHA, "bandwidth_Bps": BANDWIDTH, "size_bytes": SIZE},
        "target": "simulate ring + StragglAR at n = 1024 in at most 10 s in total (generation not included)",
        "simulate_total_median_s": round(sum(r["simulate_median_s"] for r in rows), 3),
        "simulate_total_cpu_median_s": round(sum(r["simulate_cpu_median_s"] for r in rows), 3),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--n", type=int, default=1024, help="the simulator's world size")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats (median reported; >= 3)")
    parser.add_argument("--quick", action="store_true", help="n = 256, fewer sizes and repeats: checks the script")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_schedules.json")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    if args.repeats < 3:
        parser.error("--repeats must be at least 3 (the median of fewer runs is too noisy)")
    import torch  # noqa: F401  (stragglerkit._C needs it; imported here so that no timed run pays for it)

    repeats = 3 if args.quick else args.repeats
    record: dict[str, Any] = {"quick": args.quick}
    if "stragglar" in parts:
        sizes = [8, 64] if args.quick else [8, 16, 32, 64, 128, 256]
        record["stragglar"] = stragglar_part(sizes, repeats, list(range(4, 33, 2)) if args.quick else ROUND_SIZES)
    if "optcc" in parts:
        record["optcc"] = optcc_part(((256, 2.0), (64, 3.0)) if args.quick else OPTCC_CASES, min(repeats, 3))
    if "simulator" in parts:
        record["simulator"] = simulator_part(256 if args.quick else args.n, min(repeats, 3))
    write_summary(args.out, "schedules", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
