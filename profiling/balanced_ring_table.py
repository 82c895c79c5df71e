"""The balanced ring against OptCC and the plain ring, simulated: where each is faster.

For one degraded rank at ``l`` among ``p``, times relative to the fault-free ring (alpha = 0, the
flow-level simulator): the balanced ring with its default slices, its bound ``2T``
(schedules/balanced_ring.py), OptCC at the 9 segments the runtime uses for 32 MiB on 8 ranks and
at 64, and the plain ring. Also the choice ``auto`` makes for a 32 MiB float32 bucket
(``runtime.api.slow_nic_algorithm``).

Example::

    python profiling/balanced_ring_table.py --json profiling/results/balanced_ring_table.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import write_record

from stragglerkit.runtime.api import slow_nic_algorithm
from stragglerkit.schedules.balanced_ring import balanced_ring
from stragglerkit.schedules.optcc import optcc
from stragglerkit.schedules.registry import Situation
from stragglerkit.schedules.ring import ring
from stragglerkit.sim.simulator import Network, simulate

SIZE = 32 * 2**20
BANDWIDTH = 125e6


def row(p: int, slowdown: float) -> dict[str, object]:
    slow = {p // 2: slowdown}
    healthy = simulate(ring(p), SIZE, Network.uniform(p, 0.0, BANDWIDTH)).makespan
    net = Network.uniform(p, 0.0, BANDWIDTH, slow)
    balanced = balanced_ring(p, slow)

    def rel(schedule: object) -> float:
        return round(simulate(schedule, SIZE, net).makespan / healthy, 4)  # type: ignore[arg-type]

    return {
        "p": p,
        "l": round(slowdown, 4),
        "balanced_ring": rel(balanced),
        "balanced_ring_bound": round(2 * float(balanced.params["phase_time"]) * SIZE / BANDWIDTH / healthy, 4),
        "balanced_ring_slices": balanced.params["slices"],
        "optcc_k9": rel(optcc(p, slow, 9)),
        "optcc_k64": rel(optcc(p, slow, 64)),
        "ring": rel(ring(p)),
        "auto_32mib": slow_nic_algorithm(Situation(world_size=p, slowdowns=slow), SIZE),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", default="5,8,16,32", help="comma-separated p")
    parser.add_argument("--slowdowns", default="1.05,1.142857,1.25,1.3,1.4,1.5,2", help="comma-separated l")
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args()
    rows = []
    started = time.perf_counter()
    for p in (int(v) for v in args.worlds.split(",")):
        for slowdown in (float(v) for v in args.slowdowns.split(",")):
            rows.append(row(p, slowdown))
            r = rows[-1]
            print(
                f"p={p:<3} l={slowdown:<8.4g} balanced {r['balanced_ring']:.4f} (bound {r['balanced_ring_bound']:.4f}, "
                f"{r['balanced_ring_slices']} slices)  optcc k=9 {r['optcc_k9']:.4f}  k=64 {r['optcc_k64']:.4f}  "
                f"ring {r['ring']:.4f}  auto: {r['auto_32mib']}",
                flush=True,
            )
    if args.json:
        record = {
            "seconds": round(time.perf_counter() - started, 1),
            "note": "times relative to the fault-free ring; alpha = 0; 32 MiB at 1 Gbit/s (ratios do not depend on it)",
            "rows": rows,
        }
        write_record(Path(args.json), record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
