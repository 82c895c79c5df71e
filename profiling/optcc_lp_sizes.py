"""OptCC with the LP's chunk sizes against its closed-form sizes (equal sections, or the ramp).

For each cluster size p, slowdown l, segment count k and plan (with or without bubble fills), the
plan's simulated time (flow level, bandwidth only, alpha = 0) with its closed-form sizes and with
the sizes of schedules/chunk_sizing.py, in units of n (buffer / healthy bandwidth), as a fraction
over the fault-free ring 2(p-1)/p and over Theorem 6's lower bound, next to the paper's closed
form (optcc.txt eq. (1)/(2)). ``auto`` is what ``optcc(sizing="auto")`` (the runtime) picks and
``lp_seconds`` the time to lower the plan and solve the LP. Every schedule passes the checker.

    PYTHONPATH=$PWD python profiling/optcc_lp_sizes.py --json profiling/results/optcc_lp_sizes.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import write_record

from stragglerkit.schedules.check import check
from stragglerkit.schedules.optcc import optcc
from stragglerkit.sim import optcc_bounds as ob
from stragglerkit.sim.simulator import Network, simulate


def row(p: int, slowdown: float, k: int, fills: bool) -> dict[str, Any]:
    slowdowns = {p - 1: slowdown}
    network = Network.uniform(p, 0.0, 1.0, slowdowns)
    closed = optcc(p, slowdowns, segments=k, bubble_filling=fills, sizing="closed_form")
    started = time.perf_counter()
    sized = optcc(p, slowdowns, segments=k, bubble_filling=fills, sizing="lp")
    lp_seconds = time.perf_counter() - started
    auto = optcc(p, slowdowns, segments=k, bubble_filling=fills).params["sizing"]
    for schedule in (closed, sized):
        check(schedule)
    closed_time = simulate(closed, 1.0, network).makespan
    lp_time = simulate(sized, 1.0, network).makespan
    fault_free = ob.fault_free_time(p)
    bound = ob.theorem6_bound(p, slowdown)
    paper = ob.optcc_single_time(p, slowdown, k)
    return {
        "p": p,
        "slowdown": round(slowdown, 6),
        "segments": k,
        "bubble_filling": fills and slowdown < 2.0,
        "closed_form": round(closed_time, 6),
        "lp": round(lp_time, 6),
        "paper_closed_form": round(paper, 6),
        "closed_form_over_fault_free": round(closed_time / fault_free - 1, 4),
        "lp_over_fault_free": round(lp_time / fault_free - 1, 4),
        "paper_over_fault_free": round(paper / fault_free - 1, 4),
        "closed_form_over_bound": round(closed_time / bound - 1, 4),
        "lp_over_bound": round(lp_time / bound - 1, 4),
        "auto": auto,
        "lp_seconds": round(lp_seconds, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 5, 8, 16])
    parser.add_argument("--segments", type=int, nargs="+", default=[3, 9, 18])
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[8 / 7, 1.5, 2.0, 4.0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for p in args.sizes:
        for slowdown in args.slowdowns:
            for k in args.segments:
                if p >= 16 and k > 9:
                    continue  # above MAX_FLOWS: the runtime keeps the closed form there
                for fills in (True, False) if slowdown < 2.0 else (True,):
                    r = row(p, slowdown, k, fills)
                    rows.append(r)
                    print(
                        f"p={p:2d} l={slowdown:.3f} k={k:2d} fills={r['bubble_filling']!s:5}: over the fault-free ring "
                        f"closed form {r['closed_form_over_fault_free']:+.1%}, LP {r['lp_over_fault_free']:+.1%} "
                        f"(paper {r['paper_over_fault_free']:+.1%}); over Thm 6 {r['closed_form_over_bound']:+.1%} -> "
                        f"{r['lp_over_bound']:+.1%}; auto: {r['auto']}; LP {r['lp_seconds']:.2f} s",
                        flush=True,
                    )
    if args.json:
        write_record(args.json, {"units": "n = buffer / healthy bandwidth; alpha = 0", "rows": rows})


if __name__ == "__main__":
    main()
