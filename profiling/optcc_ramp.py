"""OptCC's ramp: smaller segments at both ends of the pipeline, simulated.

Without fills (``l >= 2``, or ``l < 2`` where the runtime leaves them out) the pipeline's head and
tail are a whole segment's chain each: S has nothing to receive until the first S1 chain (``q-1``
hops) is done, and after S's last download its section still has an S4 chain of ``q-1`` hops
ahead. Both scale with the size of the first and last segments. A ramp makes them smaller:
segment ``σ`` of ``k`` weighs ``min(h+1, σ+1, k-σ)`` (``h`` segments grow at each end).

For each ``p``, ``l`` and ``k`` this script simulates (flow level, bandwidth only, alpha = 0,
``n`` = buffer / healthy bandwidth) the plan with equal segments (``ramp=0``), with the default
ramp (:func:`stragglerkit.schedules.optcc.default_ramp`) and with every ramp ``h < k/2``, and
reports each over the lower bound ``l·n`` (Theorem 1 for one degraded rank with ``l >= 2``) or,
for ``l < 2``, over the fault-free ring ``2(p-1)/p·n``. Every schedule passes the symbolic
checker first.

    PYTHONPATH=$PWD python profiling/optcc_ramp.py --json profiling/results/optcc_ramp.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import provenance

from stragglerkit.schedules.check import check
from stragglerkit.schedules.optcc import default_ramp, optcc
from stragglerkit.sim.simulator import Network, simulate


def makespan(p: int, slowdowns: dict[int, float], k: int, ramp: int) -> float:
    schedule = optcc(p, slowdowns, segments=k, bubble_filling=False, ramp=ramp)
    check(schedule)
    return simulate(schedule, 1.0, Network.uniform(p, 0.0, 1.0, slowdowns)).makespan


def row(p: int, slowdowns: dict[int, float], k: int) -> dict[str, Any]:
    slowest = max(slowdowns.values())
    reference = slowest if slowest >= 2 else 2 * (p - 1) / p
    by_ramp = {h: makespan(p, slowdowns, k, h) for h in range(0, max(1, (k + 1) // 2))}
    best = min(by_ramp, key=lambda h: by_ramp[h])
    chosen = default_ramp(k)
    if chosen not in by_ramp:
        by_ramp[chosen] = makespan(p, slowdowns, k, chosen)
    return {
        "p": p,
        "slowdowns": {str(r): round(v, 6) for r, v in slowdowns.items()},
        "segments": k,
        "reference": "l*n (Theorem 1)" if slowest >= 2 else "fault-free ring 2(p-1)/p*n",
        "flat_over_reference": round(by_ramp[0] / reference - 1, 4),
        "default_ramp": chosen,
        "default_over_reference": round(by_ramp[chosen] / reference - 1, 4),
        "best_ramp": best,
        "best_over_reference": round(by_ramp[best] / reference - 1, 4),
        "default_over_best": round(by_ramp[chosen] / by_ramp[best] - 1, 4),
        "makespan_by_ramp": {str(h): round(t, 6) for h, t in sorted(by_ramp.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 5, 8, 16])
    parser.add_argument("--segments", type=int, nargs="+", default=[3, 4, 9, 18, 36])
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[8 / 7, 2.0, 4.0])
    parser.add_argument("--most", type=int, default=16 * 16 * 18, help="skip cases with p*p*k above this (time)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    rows = []
    cases = [(p, {p - 1: slow}, k) for p in args.sizes for slow in args.slowdowns for k in args.segments]
    cases += [(8, {6: 2.0, 7: 1.5}, k) for k in (9, 18)]  # a second degraded rank attaches
    for p, slowdowns, k in cases:
        if p * p * k > args.most:
            continue
        r = row(p, slowdowns, k)
        rows.append(r)
        print(
            f"p={p:3d} {slowdowns} k={k:3d}: equal segments {r['flat_over_reference']:+.1%}, ramp "
            f"{r['default_ramp']} {r['default_over_reference']:+.1%}, best ramp {r['best_ramp']} "
            f"{r['best_over_reference']:+.1%} over {r['reference']}",
            flush=True,
        )
    # below 4 segments the default is no ramp (default_ramp's docstring); from 4 on, how close is it?
    deep = [r for r in rows if r["segments"] >= 4]
    worst = max(deep, key=lambda r: r["default_over_best"])
    print(
        f"from k = 4: the default ramp is at most {worst['default_over_best']:+.2%} slower than the best "
        f"(p = {worst['p']}, k = {worst['segments']})"
    )
    shallow = [r for r in rows if r["segments"] < 4]
    if args.json:
        result = {
            **provenance(),
            "elapsed_s": round(time.monotonic() - started, 1),
            "model": "flow-level simulator, bandwidth only (alpha = 0), n = buffer / healthy bandwidth",
            "rows": rows,
            "default_at_most_over_best_from_k4": worst["default_over_best"],
            "k3_ramp1_over_equal": {
                f"p={r['p']} {r['slowdowns']}": round(r["makespan_by_ramp"]["1"] / r["makespan_by_ramp"]["0"] - 1, 4)
                for r in shallow
                if "1" in r["makespan_by_ramp"]
            },
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
