"""How long OptCC takes to generate, for the online re-plan when a NIC degrades.

What is timed (median of repeats, one CPU core):

* ``plan``: :func:`optcc_plan` -- validation, ring order, section/fill sizes, window count. This is
  the generated schedule: every flow of every rank is a closed-form function of it (O(p + k)).
  Budget: 100 ms for p = 1024, k = 64.
* ``window_lookup``: the flows of one rank in one window (O(1)); what an executor asks as it goes.
* ``rank_ops``: lowering one rank's whole op list (O(k p) ops), for an executor that wants it up front.
* ``whole_schedule``: lowering every rank (O(k p^2) ops) for the checker/simulator, at p = 64.

    PYTHONPATH=$PWD python profiling/bench_optcc_generation.py

Writes profiling/results/optcc_generation.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import provenance

from stragglerkit.schedules.optcc import Flow, OptccPlan, optcc, optcc_plan

RESULTS = Path(__file__).resolve().parent / "results"


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _window_flows(plan: OptccPlan, rank: int, window: int) -> list[Flow]:
    return list(plan.rank_flows(rank, window))


def main() -> None:
    rows: list[dict[str, Any]] = []
    for p, slowdown in ((1024, 2.0), (1024, 8 / 7), (256, 1.5), (64, 3.0)):
        k = 64
        slowdowns = {p // 3: slowdown}
        plan_s = _median_seconds(partial(optcc_plan, p, slowdowns, segments=k), 51)
        plan = optcc_plan(p, slowdowns, segments=k)
        rank = plan.healthy[5]
        mid = plan.num_windows // 2
        lookup_s = _median_seconds(partial(_window_flows, plan, rank, mid), 2001)
        rank_ops_s = _median_seconds(partial(plan.rank_ops, rank), 3)
        rows.append(
            {
                "p": p,
                "segments": k,
                "slowdown": slowdown,
                "plan_ms": plan_s * 1e3,
                "window_lookup_us": lookup_s * 1e6,
                "rank_ops_s": rank_ops_s,
                "rank_num_ops": len(plan.rank_ops(rank)),
                "num_windows": plan.num_windows,
            }
        )
        print(rows[-1], flush=True)
    whole_s = _median_seconds(lambda: optcc(64, {5: 1.5}, segments=64), 3)
    whole_ops = optcc(64, {5: 1.5}, segments=64).num_ops()
    out = {
        **provenance(),
        "budget_ms": 100.0,
        "what_is_timed": __doc__,
        "rows": rows,
        "whole_schedule_p64_k64": {"seconds": whole_s, "num_ops": whole_ops},
        "plan_within_budget_at_p1024": all(r["plan_ms"] <= 100.0 for r in rows if r["p"] == 1024),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "optcc_generation.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["whole_schedule_p64_k64"]), "plan within budget:", out["plan_within_budget_at_p1024"])


if __name__ == "__main__":
    main()
