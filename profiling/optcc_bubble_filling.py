"""When OptCC's bubble filling pays: the plan with fills against the same plan without them.

For ``l < 2`` OptCC fills the straggler's idle link time with extra *fill* chunks (optcc.txt §4.2);
the fills need a body of fill uploads before the first section and a download after the last.
This script simulates (flow level, max-min fair; ``--alpha`` per message, default 0) one degraded
rank with and without fills (``optcc(..., bubble_filling=False)`` keeps the ``l >= 2`` timetable)
and reports their ratio, the fault-free ring for scale, and what the runtime picks
(``stragglerkit.runtime.api.optcc_bubble_filling``, which decides at alpha = 0). Every schedule
passes the symbolic checker first.

    PYTHONPATH=$PWD python profiling/optcc_bubble_filling.py --json profiling/results/optcc_bubble_filling.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import write_record

from stragglerkit.runtime.api import optcc_bubble_filling
from stragglerkit.schedules import ring
from stragglerkit.schedules.check import check
from stragglerkit.schedules.optcc import optcc
from stragglerkit.sim.simulator import Network, simulate


def row(p: int, slowdown: float, k: int, size: float, alpha: float, bandwidth: float) -> dict[str, Any]:
    straggler = p // 2
    network = Network.uniform(p, alpha=alpha, bandwidth=bandwidth, slowdowns={straggler: slowdown})
    times = {}
    for fill in (True, False):
        schedule = optcc(p, {straggler: slowdown}, segments=k, bubble_filling=fill)
        check(schedule)
        times[fill] = simulate(schedule, size, network).time_from_last_arrival
    healthy = simulate(ring(p), size, Network.uniform(p, alpha=alpha, bandwidth=bandwidth)).time_from_last_arrival
    return {
        "p": p,
        "slowdown": round(slowdown, 6),
        "segments": k,
        "with_fills_s": round(times[True], 6),
        "without_fills_s": round(times[False], 6),
        "fills_over_none": round(times[True] / times[False], 4),
        "fault_free_ring_s": round(healthy, 6),
        "runtime_fills": optcc_bubble_filling(p, {straggler: slowdown}, k),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--segments", type=int, nargs="+", default=[3, 6, 9, 18, 36, 64])
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[1.97, 1.8, 1.5, 8 / 7])
    parser.add_argument("--bytes", type=float, default=32 * 2**20, help="buffer size (default 32 MiB)")
    parser.add_argument("--alpha", type=float, default=0.0, help="seconds per message (default 0)")
    parser.add_argument("--bandwidth", type=float, default=125e6, help="healthy NIC, bytes/s (default 1 Gbit/s)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for p in args.sizes:
        for k in args.segments:
            for slowdown in args.slowdowns:
                r = row(p, slowdown, k, args.bytes, args.alpha, args.bandwidth)
                rows.append(r)
                print(
                    f"p={p:3d} k={k:3d} l={slowdown:.3f}: with fills {r['with_fills_s'] * 1e3:8.2f} ms, without "
                    f"{r['without_fills_s'] * 1e3:8.2f} ms ({r['fills_over_none']:.3f}); runtime fills: "
                    f"{r['runtime_fills']}",
                    flush=True,
                )
    if args.json:
        units = f"seconds for {args.bytes:.0f} bytes at {args.bandwidth:.3g} B/s per NIC, alpha {args.alpha} s"
        write_record(args.json, {"units": units, "rows": rows})


if __name__ == "__main__":
    main()
