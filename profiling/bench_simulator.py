"""Speed of the flow-level simulator on large schedules (ring and StragglAR at n = 1024 by default).

Times, separately: generating each schedule (once), flattening it into the task graph, and one
whole ``simulate`` call (flattening included: what a caller pays), as the median of ``--repeats``,
both wall-clock and CPU time of this process (the machine is shared: the load average is recorded).
StragglAR runs with its straggler arriving at ``auto_delay`` (computed once, not timed).

    PYTHONPATH=$PWD python profiling/bench_simulator.py            # writes profiling/results/simulator_speed.json
    PYTHONPATH=$PWD python profiling/bench_simulator.py --n 256 --repeats 5 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _env import command_line, machine_info, utc_now

from stragglerkit.schedules import ring
from stragglerkit.schedules.ir import Schedule
from stragglerkit.sim import Network, auto_delay, simulate
from stragglerkit.sim.graph import build_task_graph

ALPHA, BANDWIDTH, SIZE = 3e-6, 450e9, 2**30


def _median_seconds(action: Callable[[], object], repeats: int) -> tuple[float, list[float], float]:
    """Median wall time, all wall times, and median CPU time of this process (less sensitive to other load)."""
    times, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        action()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(times), times, statistics.median(cpu)


def _bench(name: str, generate: Callable[[int], Schedule], n: int, repeats: int, straggler: bool) -> dict[str, Any]:
    start = time.perf_counter()
    sched = generate(n)
    generate_s = time.perf_counter() - start
    net = Network.uniform(n, alpha=ALPHA, bandwidth=BANDWIDTH)
    arrivals = np.zeros(n)
    if straggler:
        arrivals[int(sched.params.get("straggler", n - 1))] = auto_delay(sched, SIZE, net)
    flatten_s, _, flatten_cpu = _median_seconds(lambda: build_task_graph(sched), repeats)
    results: list[Any] = []
    simulate_s, all_s, simulate_cpu = _median_seconds(
        lambda: results.append(simulate(sched, SIZE, net, arrivals=arrivals)), repeats
    )
    res = results[-1]
    row = {
        "algorithm": name,
        "world_size": n,
        "num_ops": sched.num_ops(),
        "generate_s": round(generate_s, 3),
        "flatten_median_s": round(flatten_s, 3),
        "flatten_cpu_median_s": round(flatten_cpu, 3),
        "simulate_median_s": round(simulate_s, 3),
        "simulate_cpu_median_s": round(simulate_cpu, 3),
        "simulate_all_s": [round(t, 3) for t in all_s],
        "engine": res.engine,
        "time_from_last_arrival_s": res.time_from_last_arrival,
    }
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1024, help="world size (default 1024)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement (median reported)")
    parser.add_argument("--out", type=Path, default=Path("profiling/results/simulator_speed.json"))
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (stragglerkit._C needs it; imported here so that no timed run pays for it)

    rows = [_bench("ring", ring, args.n, args.repeats, straggler=False)]
    if importlib.util.find_spec("stragglerkit.schedules.stragglar") is not None:
        from stragglerkit.schedules.stragglar import stragglar

        rows.append(_bench("stragglar", stragglar, args.n, args.repeats, straggler=True))
    total = sum(r["simulate_median_s"] for r in rows)
    total_cpu = sum(r["simulate_cpu_median_s"] for r in rows)
    report = {
        "command": command_line(),
        "date": utc_now(),
        "machine": machine_info(),
        "parameters": {"alpha_s": ALPHA, "bandwidth_Bps": BANDWIDTH, "size_bytes": SIZE},
        "target": "simulate ring + StragglAR at n = 1024 in at most 10 s in total (generation not included)",
        "simulate_total_median_s": round(total, 3),
        "simulate_total_cpu_median_s": round(total_cpu, 3),
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"simulate total (median per algorithm, summed): {total:.2f} s wall, {total_cpu:.2f} s CPU -> {args.out}")


if __name__ == "__main__":
    main()
