"""Exhaustive symbolic check of OptCC schedules (too slow for the unit tests; run once, results kept).

Sweep: p = 3..64, l in {1.14, 1.33, 1.5, 2, 3, 4}, m = 1, 2, 3 degraded servers (wherever they do
not outnumber the healthy ones), g in {1, 2, 4, 8} GPUs per server (wherever g divides p and there are at
least 3 servers), at k = 4 segments; plus k in {8, 16, 64} for one straggler at every p up to 32
and every g; plus the second stage ordering (``orderings=2``) for one straggler at p = 3..16, every
l, k in {4, 8}, g = 1 (and g = 2, 4 where that leaves at least 3 servers); plus the plans without
bubble fills (``bubble_filling=False``, as the runtime runs most ``l < 2`` plans) for one straggler
at p = 3..16, l < 2, k in {4, 8, 9}, g in {1, 2, 4}. Plans without fills and with one ordering have
the ramp (smaller end segments; from k = 4 on). Each schedule goes through
stragglerkit.schedules.check.

    PYTHONPATH=$PWD python profiling/check_optcc_sweep.py

Writes profiling/results/optcc_check_sweep.json (counts, failures, wall time).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import provenance

from stragglerkit.errors import NotApplicableError, ScheduleError
from stragglerkit.schedules import check
from stragglerkit.schedules.optcc import optcc

SLOWDOWNS = (1.14, 1.33, 1.5, 2.0, 3.0, 4.0)


def cases() -> list[tuple[int, int, dict[int, float], int, int, bool]]:
    out = []
    for p in range(3, 65):
        for g in (1, 2, 4, 8):
            servers = p // g
            if p % g or servers < 3:
                continue
            for m in (1, 2, 3):
                if servers - m < m:
                    continue
                for i, slowdown in enumerate(SLOWDOWNS):
                    # degraded servers spread over the ring (one GPU named each), slowdowns rotated
                    degraded = {((j * servers) // m) * g + j % g: SLOWDOWNS[(i + j) % 6] for j in range(m)}
                    assert slowdown in degraded.values()
                    depths = (4, 8, 16, 64) if (m == 1 and p <= 32 and i == 0) else (4,)
                    out.extend((p, g, degraded, k, 1, True) for k in depths)
    for p in range(3, 17):
        for g in (1, 2, 4):
            if p % g or p // g < 3:
                continue
            for slowdown in SLOWDOWNS:
                out.extend((p, g, {p // 2: slowdown}, k, 2, True) for k in (4, 8))
                if slowdown < 2:
                    out.extend((p, g, {p // 2: slowdown}, k, 1, False) for k in (4, 8, 9))
    return out


def main() -> None:
    todo = cases()
    started = time.perf_counter()
    failures: list[dict[str, Any]] = []
    for p, g, degraded, k, orderings, fills in todo:
        try:
            check(optcc(p, degraded, segments=k, gpus_per_server=g, orderings=orderings, bubble_filling=fills))
        except (ScheduleError, NotApplicableError) as err:
            failures.append(
                {
                    "p": p,
                    "g": g,
                    "slowdowns": degraded,
                    "k": k,
                    "orderings": orderings,
                    "bubble_filling": fills,
                    "error": str(err)[:300],
                }
            )
    elapsed = time.perf_counter() - started
    second = sum(1 for case in todo if case[4] == 2)
    out = {
        **provenance(),
        "cases": len(todo),
        "cases_second_ordering": second,
        "cases_without_fills": sum(1 for case in todo if not case[5]),
        "failures": failures,
        "seconds": elapsed,
    }
    path = Path(__file__).resolve().parent / "results" / "optcc_check_sweep.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{len(todo) - len(failures)}/{len(todo)} schedules pass the checker in {elapsed:.0f} s")


if __name__ == "__main__":
    main()
