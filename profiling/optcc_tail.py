"""OptCC's head and tail at few segments: where the time above the paper's closed form goes.

For a small cluster and the segment counts the runtime picks (``optcc_segments``: k = 9 for a
32 MiB bucket on 8 ranks), the pipeline's head and tail matter as much as its body. This script
simulates (bandwidth only, alpha = 0) OptCC with one degraded rank and reports, in units of ``n``
(buffer / healthy bandwidth):

* ``optcc``: the makespan, and ``over_fault_free``: against the fault-free ring ``2(p-1)/p``;
* ``closed_form``: optcc.txt eq. (1)/(2), ``(k+1)/k`` resp. ``(k+l-1)/k`` times the asymptote;
* ``straggler_send_first`` / ``straggler_send_busy`` / ``after_straggler_send``: when S's link
  starts sending, how long it is busy, and how long the others still run after its last send
  (the head is the first figure, the tail the last; the body is S's busy time).

Every schedule passes the symbolic checker first.

    PYTHONPATH=$PWD python profiling/optcc_tail.py --json profiling/results/optcc_tail.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import write_record

from stragglerkit.schedules.check import check
from stragglerkit.schedules.optcc import optcc
from stragglerkit.sim import optcc_bounds as ob
from stragglerkit.sim.simulator import Network, simulate


def row(p: int, slowdown: float, k: int) -> dict[str, Any]:
    straggler = p - 1
    schedule = optcc(p, {straggler: slowdown}, segments=k)
    check(schedule)
    result = simulate(schedule, 1.0, Network.uniform(p, 0.0, 1.0, {straggler: slowdown}), record_flows=True)
    assert result.flows is not None
    sends = [f for f in result.flows if f.src == straggler]
    first, last = min(f.start for f in sends), max(f.end for f in sends)
    fault_free = 2 * (p - 1) / p
    closed = ob.optcc_single_time(p, slowdown, k)
    return {
        "p": p,
        "slowdown": round(slowdown, 6),
        "segments": k,
        "optcc": round(result.makespan, 6),
        "over_fault_free": round(result.makespan / fault_free - 1, 4),
        "closed_form": round(closed, 6),
        "closed_form_over_fault_free": round(closed / fault_free - 1, 4),
        "straggler_send_first": round(first, 6),
        "straggler_send_busy": round(sum(f.end - f.start for f in sends), 6),
        "after_straggler_send": round(result.makespan - last, 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 5, 8, 16])
    parser.add_argument("--segments", type=int, nargs="+", default=[1, 2, 3, 9, 17, 64])
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[8 / 7, 1.5, 2.0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for p in args.sizes:
        for slowdown in args.slowdowns:
            for k in args.segments:
                r = row(p, slowdown, k)
                rows.append(r)
                print(
                    f"p={p:3d} l={slowdown:.3f} k={k:3d}: {r['optcc']:.4f} n ({r['over_fault_free']:+.1%} over the "
                    f"fault-free ring; closed form {r['closed_form_over_fault_free']:+.1%}); S sends from "
                    f"{r['straggler_send_first']:.4f}, busy {r['straggler_send_busy']:.4f}, then "
                    f"{r['after_straggler_send']:.4f} more",
                    flush=True,
                )
    if args.json:
        write_record(args.json, {"units": "n = buffer / healthy bandwidth; alpha = 0", "rows": rows})


if __name__ == "__main__":
    main()
